//! Test support behind the `sim` feature: an in-memory simulator of sessions
//! over byte-stream links ([`Sim`]), and the fuzz target bodies ([`fuzz`]).
//!
//! The simulator plays the part of the transports and of the session owner
//! (the messenger) for a few nodes:
//!
//! - links are byte streams: a [`Transmit`] is encoded with
//!   [`Banner::encode`] / [`Frame::encode_to_vec`](crate::Frame::encode_to_vec), written into a pipe in
//!   random pieces, and read back with a [`StreamDecoder`] — exactly what a
//!   TCP backend does;
//! - time is virtual: nothing waits, [`Sim::run_for`] jumps from one due
//!   instant (delivery, timer, connect) to the next;
//! - faults: cut a link (both directions, in-flight bytes lost, both ends
//!   told, like a reset socket) at a given instant or at a given byte of the
//!   global stream ([`Sim::cut_at_bytes`]); drop, corrupt or cut at random per
//!   piece ([`FaultRates`]); add delay between two nodes; black-hole links
//!   (bytes vanish, nobody is told); freeze a node (a hung process); restart a
//!   node (state lost, new nonce);
//! - routing of accepted links follows the owner's rule: on
//!   [`SessionEvent::Identified`] look up an existing session for the peer's
//!   address ([`peer_key`]: nonce ignored for listening peers, so a restarted
//!   peer is recognised) and [`Session::take_link`]; else, if the hello asks to resume
//!   (`cookie != 0`), answer [`Session::reject_unknown`] and close; else
//!   [`Session::accept_new`] with a fresh random non-zero cookie.
//!
//! Everything random comes from one seeded [`StdRng`]; maps are ordered, so a
//! seed replays the same run.

pub mod fuzz;

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use msgr_addr::{EntityAddr, EntityName};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::banner::Banner;
use crate::link_failure::LinkFailure;
use crate::message::Message;
use crate::rma::RMA_BIT;
use crate::session::{
    EncodedBatch, LinkId, LocalIdentity, Policy, SendError, Session, SessionConfig, SessionEvent,
    Takeover,
};
use crate::stream::{StreamDecoder, Transmit};

/// Index of a node in the simulation.
pub type NodeId = usize;

/// Names a session in the simulation (unique across nodes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SessionId(pub u64);

/// Random faults applied to every piece of bytes written on a link.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FaultRates {
    /// Probability that a piece is lost (the stream goes on without it).
    pub drop: f64,
    /// Probability that one bit of a piece is flipped.
    pub corrupt: f64,
    /// Probability that the link is cut right after the piece is delivered.
    pub cut: f64,
}

/// Simulator settings.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Configuration of every session.
    pub session: SessionConfig,
    /// One-way latency of every link.
    pub latency: Duration,
    /// Up to this much extra latency per piece (order within a direction kept).
    pub jitter: Duration,
    /// Time from a connect request to the link being up (or refused).
    pub connect_latency: Duration,
    /// Writes are split into pieces of at most this many bytes.
    pub max_piece: usize,
    /// Random faults.
    pub faults: FaultRates,
}

impl Default for SimConfig {
    /// A LAN-like network, short timers, no random faults.
    fn default() -> Self {
        SimConfig {
            session: SessionConfig {
                keepalive_interval: Duration::from_millis(200),
                keepalive_timeout: Duration::from_millis(1000),
                handshake_timeout: Duration::from_millis(500),
                backoff_min: Duration::from_millis(2),
                backoff_max: Duration::from_millis(50),
                wait_retry: Duration::from_millis(100),
                ..SessionConfig::default()
            },
            latency: Duration::from_micros(100),
            jitter: Duration::from_micros(50),
            connect_latency: Duration::from_micros(200),
            max_piece: 64,
            faults: FaultRates::default(),
        }
    }
}

/// An event a session produced, with when and where.
#[derive(Clone, Debug, PartialEq)]
pub struct Logged {
    /// Virtual time since the simulation started.
    pub at: Duration,
    /// The node.
    pub node: NodeId,
    /// The session.
    pub session: SessionId,
    /// The event.
    pub event: SessionEvent,
}

/// A message a session delivered, with when and where.
#[derive(Clone, Debug, PartialEq)]
pub struct Received {
    /// Virtual time since the simulation started.
    pub at: Duration,
    /// The node.
    pub node: NodeId,
    /// The session.
    pub session: SessionId,
    /// The message.
    pub msg: Message,
}

/// What the owner took from a session, in the order the session gave it.
enum Taken {
    Message(Message),
    Event(SessionEvent),
}

/// Counters of a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SimStats {
    /// Links established.
    pub links: u64,
    /// Links cut by a fault.
    pub cuts: u64,
    /// Pieces dropped by a fault.
    pub drops: u64,
    /// Pieces corrupted by a fault.
    pub corruptions: u64,
    /// Bytes delivered to a reader.
    pub bytes: u64,
    /// Accepted links refused (reset or wait).
    pub rejected: u64,
    /// Connects refused (nobody listening).
    pub refused: u64,
}

struct Node {
    name: EntityName,
    addr: EntityAddr,
    listening: bool,
    frozen: bool,
    echo: bool,
    /// Numbers the node's dials (a restart starts a new count).
    dials: crate::session::DialAttempts,
    /// Routed sessions (dialled, or accepted and routed).
    sessions: BTreeMap<SessionId, Session>,
    /// Accepted sessions waiting for their hello to be routed.
    pending: BTreeMap<SessionId, Session>,
    /// The node's own security settings, in place of the shared config's.
    security: Option<crate::auth::Security>,
}

struct Pipe {
    /// (delivery instant, bytes), in order.
    pieces: VecDeque<(Instant, Bytes)>,
    /// The writer closed: EOF after the pieces.
    fin: bool,
    rx: BytesMut,
    dec: StreamDecoder,
    /// Delivery instant of the last piece (keeps the stream in order).
    last_at: Instant,
}

struct End {
    node: NodeId,
    session: Option<SessionId>,
    /// The socket is unusable (closed here, EOF or reset seen).
    dead: bool,
    /// The owning session knows (it closed the link or was told).
    notified: bool,
}

struct Link {
    /// [dialer, acceptor].
    ends: [End; 2],
    /// `pipes[i]` carries what end i writes, to end 1 - i.
    pipes: [Pipe; 2],
    blackhole: bool,
}

struct PendingConnect {
    at: Instant,
    node: NodeId,
    session: SessionId,
    target: EntityAddr,
}

/// The simulator. See the [module docs](self).
pub struct Sim {
    cfg: SimConfig,
    rng: StdRng,
    start: Instant,
    now: Instant,
    nodes: Vec<Node>,
    links: BTreeMap<u64, Link>,
    next_link: u64,
    next_session: u64,
    connects: Vec<PendingConnect>,
    /// Latency and cuts the test scheduled.
    planned: Planned,
    log: Vec<Logged>,
    received: Vec<Received>,
    stats: SimStats,
    /// The first [`WIRE_RECORD`] bytes written on any link, for tests that
    /// look at what an eavesdropper would see.
    wire: Vec<u8>,
}

/// The impairments a test scheduled (beyond `SimConfig`'s random faults).
#[derive(Default)]
struct Planned {
    /// Extra one-way latency from one node to another ([`Sim::delay`]).
    delays: BTreeMap<(NodeId, NodeId), Duration>,
    /// Positions of the delivered-byte count to cut at, in order
    /// ([`Sim::cut_at_bytes`]).
    byte_cuts: VecDeque<u64>,
    /// When to cut the links between two nodes ([`Sim::cut_at_times`]).
    time_cuts: Vec<(Instant, NodeId, NodeId)>,
}

/// How many written bytes [`Sim::wire_bytes`] keeps.
const WIRE_RECORD: usize = 1 << 20;

impl Sim {
    /// A simulation whose randomness all comes from `seed`.
    pub fn new(seed: u64, cfg: SimConfig) -> Sim {
        let now = Instant::now();
        Sim {
            cfg,
            rng: StdRng::seed_from_u64(seed),
            start: now,
            now,
            nodes: Vec::new(),
            links: BTreeMap::new(),
            next_link: 1,
            next_session: 1,
            connects: Vec::new(),
            planned: Planned::default(),
            log: Vec::new(),
            received: Vec::new(),
            stats: SimStats::default(),
            wire: Vec::new(),
        }
    }

    /// Adds a node. A listening node accepts links on `10.0.0.<n>:6800`; a
    /// non-listening one has port 0 (it can only dial). Its nonce is random.
    pub fn add_node(&mut self, name: EntityName, listening: bool) -> NodeId {
        let id = self.nodes.len();
        let ip = [10, 0, (id / 250) as u8, (id % 250 + 1) as u8];
        let port = if listening { 6800 } else { 0 };
        let nonce = self.rng.random_range(1..u64::MAX);
        self.nodes.push(Node {
            name,
            addr: EntityAddr::tcp((ip, port).into()).with_nonce(nonce),
            listening,
            frozen: false,
            echo: false,
            dials: crate::session::DialAttempts::new(),
            sessions: BTreeMap::new(),
            pending: BTreeMap::new(),
            security: None,
        });
        id
    }

    /// Gives `node` its own security modes and credentials (each node
    /// proves its own name), for the sessions it opens or accepts from now.
    pub fn set_security(&mut self, node: NodeId, security: crate::auth::Security) {
        self.nodes[node].security = Some(security);
    }

    /// The nodes' private keys in hex (as a key file writes them), for
    /// tests that check no output shows them.
    pub fn private_keys_for_tests(&self) -> Vec<String> {
        self.nodes
            .iter()
            .filter_map(|n| n.security.as_ref()?.credentials.clone())
            .map(|c| {
                c.keypair
                    .private_bytes()
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect()
            })
            .collect()
    }

    /// The session configuration of `node`'s new sessions.
    fn session_config(&self, node: NodeId) -> SessionConfig {
        let mut cfg = self.cfg.session.clone();
        if let Some(sec) = &self.nodes[node].security {
            cfg.security = sec.clone();
        }
        cfg
    }

    /// The node's current address (with its nonce).
    pub fn addr(&self, node: NodeId) -> EntityAddr {
        self.nodes[node].addr.clone()
    }

    /// Makes `node` send every message it receives straight back.
    pub fn set_echo(&mut self, node: NodeId, echo: bool) {
        self.nodes[node].echo = echo;
    }

    /// Opens a session from `from` to node `to`'s current address.
    pub fn connect(&mut self, from: NodeId, to: NodeId, policy: Policy) -> SessionId {
        let addr = self.addr(to);
        self.connect_addr(from, addr, policy)
    }

    /// Opens a session from `from` to `addr`.
    pub fn connect_addr(&mut self, from: NodeId, addr: EntityAddr, policy: Policy) -> SessionId {
        let id = self.new_session_id();
        let cfg = self.session_config(from);
        let node = &mut self.nodes[from];
        let local = LocalIdentity {
            name: node.name.clone(),
            addr: node.addr.clone(),
            dials: node.dials.clone(),
        };
        let s = Session::connect(cfg, local, addr, policy, self.now);
        node.sessions.insert(id, s);
        id
    }

    /// Queues a message on a session.
    pub fn send(&mut self, node: NodeId, id: SessionId, msg: Message) -> Result<u64, SendError> {
        match self.nodes[node].sessions.get_mut(&id) {
            Some(s) => s.send(msg),
            None => Err(SendError::Closed),
        }
    }

    /// Queues `msgs` on a session as `msgr::Connection::send` does: small
    /// ones encoded into batches before they reach the session
    /// ([`Session::send_encoded`]), others one by one, in order.
    pub fn send_encoded(
        &mut self,
        node: NodeId,
        id: SessionId,
        msgs: impl IntoIterator<Item = Message>,
    ) -> Result<(), SendError> {
        let max = self.session_config(node).batch_max_bytes;
        let Some(s) = self.nodes[node].sessions.get_mut(&id) else {
            return Err(SendError::Closed);
        };
        let limits = s.send_limits();
        let mut spare = BytesMut::new();
        let mut open: Option<EncodedBatch> = None;
        let flush = |s: &mut Session, open: &mut Option<EncodedBatch>, spare: &mut BytesMut| {
            open.take().map_or(Ok(0), |mut b| {
                b.close(spare);
                s.send_encoded(b)
            })
        };
        for msg in msgs {
            if msg.call & RMA_BIT != 0 || !EncodedBatch::batchable(msg.payload_len(), max) {
                flush(s, &mut open, &mut spare)?;
                s.send(msg)?;
                continue;
            }
            if open.as_mut().is_some_and(|b| b.push(&msg, max)) {
                continue;
            }
            flush(s, &mut open, &mut spare)?;
            let alloc = EncodedBatch::SHARED_BATCHES * max;
            let mut b = EncodedBatch::open(&mut spare, msg.payload_len(), alloc, limits);
            let fits = b.push(&msg, max);
            assert!(fits, "an entry of a batchable message fits an empty batch");
            open = Some(b);
        }
        flush(s, &mut open, &mut spare).map(drop)
    }

    /// Graceful close of a session.
    pub fn close(&mut self, node: NodeId, id: SessionId) {
        let now = self.now;
        if let Some(s) = self.nodes[node].sessions.get_mut(&id) {
            s.close(now);
        }
    }

    /// Mark down a session.
    pub fn mark_down(&mut self, node: NodeId, id: SessionId) {
        let now = self.now;
        if let Some(s) = self.nodes[node].sessions.get_mut(&id) {
            s.mark_down(now);
        }
    }

    /// A routed session of `node`.
    pub fn session(&self, node: NodeId, id: SessionId) -> Option<&Session> {
        self.nodes[node].sessions.get(&id)
    }

    /// All routed sessions of `node`, in id order.
    pub fn sessions(&self, node: NodeId) -> impl Iterator<Item = (SessionId, &Session)> {
        self.nodes[node].sessions.iter().map(|(k, v)| (*k, v))
    }

    /// Every event of every session so far, in order.
    pub fn log(&self) -> &[Logged] {
        &self.log
    }

    /// Every message every session delivered so far, in order.
    pub fn received(&self) -> &[Received] {
        &self.received
    }

    /// The messages `node` received, in delivery order, with their session.
    pub fn delivered(&self, node: NodeId) -> Vec<(SessionId, Message)> {
        self.received
            .iter()
            .filter(|r| r.node == node)
            .map(|r| (r.session, r.msg.clone()))
            .collect()
    }

    /// Counters so far.
    pub fn stats(&self) -> SimStats {
        self.stats
    }

    /// The first mebibyte written on the links, in writing order: what an
    /// eavesdropper on every link would have seen.
    pub fn wire_bytes(&self) -> &[u8] {
        &self.wire
    }

    /// Virtual time since the start.
    pub fn elapsed(&self) -> Duration {
        self.now - self.start
    }

    /// The current virtual instant (what the sessions see as `now`).
    pub fn now(&self) -> Instant {
        self.now
    }

    /// The random generator, for tests that want seeded choices of their own.
    pub fn rng(&mut self) -> &mut StdRng {
        &mut self.rng
    }

    /// Changes the random fault rates.
    pub fn set_faults(&mut self, faults: FaultRates) {
        self.cfg.faults = faults;
    }

    // ---- faults ------------------------------------------------------------

    /// Cuts every live link between `a` and `b` now (both directions; bytes in
    /// flight are lost; both ends are told, like a reset connection).
    pub fn cut_between(&mut self, a: NodeId, b: NodeId) -> usize {
        let ids: Vec<u64> = self
            .links
            .iter()
            .filter(|(_, l)| {
                let n = [l.ends[0].node, l.ends[1].node];
                (n == [a, b] || n == [b, a]) && !(l.ends[0].dead && l.ends[1].dead)
            })
            .map(|(k, _)| *k)
            .collect();
        for id in &ids {
            self.abort(*id);
        }
        ids.len()
    }

    /// Cuts the links between `a` and `b` at the given instants (from now).
    pub fn cut_at_times(&mut self, a: NodeId, b: NodeId, after: &[Duration]) {
        for d in after {
            self.planned.time_cuts.push((self.now + *d, a, b));
        }
    }

    /// Cuts whichever link carries the byte at each of these positions of the
    /// global delivered-byte count (so cuts land mid-frame, mid-handshake,
    /// mid-replay...). Positions are absolute; past ones are ignored.
    pub fn cut_at_bytes(&mut self, positions: &[u64]) {
        let mut v: Vec<u64> = self
            .planned
            .byte_cuts
            .iter()
            .copied()
            .chain(positions.iter().copied())
            .collect();
        v.sort_unstable();
        v.dedup();
        self.planned.byte_cuts = v.into();
    }

    /// Adds `extra` one-way latency to bytes written from `a` to `b` from now on.
    pub fn delay(&mut self, a: NodeId, b: NodeId, extra: Duration) {
        self.planned.delays.insert((a, b), extra);
    }

    /// Makes the live links between `a` and `b` swallow everything silently.
    pub fn blackhole_between(&mut self, a: NodeId, b: NodeId) {
        for l in self.links.values_mut() {
            let n = [l.ends[0].node, l.ends[1].node];
            if n == [a, b] || n == [b, a] {
                l.blackhole = true;
                for p in &mut l.pipes {
                    p.pieces.clear();
                }
            }
        }
    }

    /// Freezes a node (a hung process: no timers, no reads, no writes; its
    /// kernel still accepts connections) or thaws it.
    pub fn freeze(&mut self, node: NodeId, frozen: bool) {
        self.nodes[node].frozen = frozen;
    }

    /// Restarts a node: every session is lost, every link is reset, and it
    /// comes back at the same endpoint with a new nonce.
    pub fn restart(&mut self, node: NodeId) {
        let ids: Vec<u64> = self
            .links
            .iter()
            .filter(|(_, l)| l.ends.iter().any(|e| e.node == node))
            .map(|(k, _)| *k)
            .collect();
        for id in ids {
            self.abort(id);
            if let Some(l) = self.links.get_mut(&id) {
                for e in l.ends.iter_mut().filter(|e| e.node == node) {
                    e.notified = true;
                }
            }
        }
        self.connects.retain(|c| c.node != node);
        let nonce = self.rng.random_range(1..u64::MAX);
        let n = &mut self.nodes[node];
        n.sessions.clear();
        n.pending.clear();
        n.dials = crate::session::DialAttempts::new();
        n.addr = n.addr.clone().with_nonce(nonce);
    }

    // ---- running -----------------------------------------------------------

    /// Runs the simulation for `d` of virtual time.
    pub fn run_for(&mut self, d: Duration) {
        let deadline = self.now + d;
        self.run_until(deadline, |_| false);
    }

    /// Runs until `pred` holds (checked whenever the simulation is settled)
    /// or `max` of virtual time passed. Returns whether `pred` held.
    pub fn run_until_pred(&mut self, max: Duration, pred: impl FnMut(&Sim) -> bool) -> bool {
        let deadline = self.now + max;
        self.run_until(deadline, pred)
    }

    fn run_until(&mut self, deadline: Instant, mut pred: impl FnMut(&Sim) -> bool) -> bool {
        loop {
            self.settle();
            if pred(self) {
                return true;
            }
            match self.next_wakeup() {
                Some(t) if t <= deadline => {
                    // Never stand still: a timer due now was handled by settle().
                    self.now = t.max(self.now + Duration::from_micros(1));
                }
                _ => {
                    self.now = deadline;
                    self.settle();
                    return pred(self);
                }
            }
        }
    }

    fn next_wakeup(&self) -> Option<Instant> {
        let mut next: Option<Instant> = None;
        let mut consider = |t: Instant| next = Some(next.map_or(t, |n: Instant| n.min(t)));
        for n in self.nodes.iter().filter(|n| !n.frozen) {
            for s in n.sessions.values().chain(n.pending.values()) {
                if let Some(t) = s.poll_timeout() {
                    consider(t);
                }
            }
        }
        for c in &self.connects {
            consider(c.at);
        }
        for (t, _, _) in &self.planned.time_cuts {
            consider(*t);
        }
        for l in self.links.values() {
            for (i, p) in l.pipes.iter().enumerate() {
                let reader = &l.ends[1 - i];
                if self.nodes[reader.node].frozen {
                    continue;
                }
                if let Some((t, _)) = p.pieces.front() {
                    consider(*t);
                }
            }
        }
        next
    }

    /// Processes everything due at the current instant until nothing moves.
    fn settle(&mut self) {
        for _ in 0..1_000_000 {
            let mut progress = false;
            progress |= self.fire_time_cuts();
            progress |= self.resolve_connects();
            progress |= self.notify_dead_ends();
            for node in 0..self.nodes.len() {
                if self.nodes[node].frozen {
                    continue;
                }
                let ids: Vec<(SessionId, bool)> = {
                    let n = &self.nodes[node];
                    n.sessions
                        .keys()
                        .map(|k| (*k, false))
                        .chain(n.pending.keys().map(|k| (*k, true)))
                        .collect()
                };
                for (id, pending) in ids {
                    progress |= self.drive_session(node, id, pending);
                }
            }
            progress |= self.deliver_due();
            if !progress {
                return;
            }
        }
        panic!("simulation does not settle at {:?}", self.elapsed());
    }

    fn session_mut(&mut self, node: NodeId, id: SessionId, pending: bool) -> Option<&mut Session> {
        let n = &mut self.nodes[node];
        if pending {
            n.pending.get_mut(&id)
        } else {
            n.sessions.get_mut(&id)
        }
    }

    /// Timers, transmits and events of one session. Returns whether anything moved.
    fn drive_session(&mut self, node: NodeId, id: SessionId, pending: bool) -> bool {
        let now = self.now;
        let mut out = Vec::new();
        let mut taken = Vec::new();
        {
            let Some(s) = self.session_mut(node, id, pending) else {
                return false;
            };
            if s.poll_timeout().is_some_and(|t| t <= now) {
                s.handle_timeout(now);
            }
            while let Some(t) = s.poll_transmit(now) {
                out.push(t);
            }
            loop {
                while let Some(m) = s.poll_message() {
                    taken.push(Taken::Message(m));
                }
                let Some(e) = s.poll_event() else {
                    break;
                };
                taken.push(Taken::Event(e));
            }
        }
        let progress = !out.is_empty() || !taken.is_empty();
        for (link, t) in out {
            self.write(node, link, encode(&t));
        }
        for t in taken {
            match t {
                Taken::Message(m) => self.deliver(node, id, pending, m),
                Taken::Event(e) => self.handle_event(node, id, e),
            }
        }
        progress
    }

    /// A message `node`'s session `id` delivered: logged, and echoed if the
    /// node echoes.
    fn deliver(&mut self, node: NodeId, id: SessionId, pending: bool, m: Message) {
        if self.nodes[node].echo && !pending {
            let mut back = Message::new(m.msg_type, m.front.clone(), m.data.clone());
            // In its class: a reply travels in its request's lane.
            back.priority = m.priority;
            let _ = self.send(node, id, back);
        }
        self.received.push(Received {
            at: self.elapsed(),
            node,
            session: id,
            msg: m,
        });
    }

    fn handle_event(&mut self, node: NodeId, id: SessionId, e: SessionEvent) {
        self.log.push(Logged {
            at: self.elapsed(),
            node,
            session: id,
            event: e.clone(),
        });
        match e {
            SessionEvent::Connect(target) => self.connects.push(PendingConnect {
                at: self.now + self.cfg.connect_latency,
                node,
                session: id,
                target,
            }),
            SessionEvent::CloseLink(link) => self.close_end(node, link, true),
            SessionEvent::Identified(hello) => self.route(node, id, &hello),
            _ => {}
        }
    }

    /// The owner's routing rule for an accepted link (see the module docs).
    fn route(&mut self, node: NodeId, pid: SessionId, hello: &crate::session::Hello) {
        let now = self.now;
        let Some(mut p) = self.nodes[node].pending.remove(&pid) else {
            return;
        };
        let Some(link) = p.link() else {
            return;
        };
        // Anything the pending session still wants to say goes first.
        let mut first = Vec::new();
        while let Some((_, t)) = p.poll_transmit(now) {
            first.push(t);
        }
        for t in first {
            self.write(node, link, encode(&t));
        }
        let key = peer_key(&hello.addr);
        let existing = self.nodes[node]
            .sessions
            .iter()
            .filter(|(_, s)| s.peer_addr().map(peer_key).as_ref() == Some(&key))
            // As in the messenger, a session that ended is still there until
            // its owner drops it, and may have a successor beside it.
            .min_by_key(|(_, s)| s.is_ending())
            .map(|(k, _)| *k);
        let cookie = self.rng.random_range(1..u64::MAX);
        let taken = existing.map(|eid| {
            let s = self.nodes[node]
                .sessions
                .get_mut(&eid)
                .expect("found above");
            (eid, s.take_link(link, hello, &mut p, cookie, now))
        });
        match taken {
            Some((eid, Takeover::Accepted)) => self.set_owner(node, link, Some(eid)),
            Some((_, Takeover::Rejected(frame) | Takeover::Impostor { frame, .. })) => {
                self.stats.rejected += 1;
                let refusal = p.refusal(frame);
                self.write(node, link, encode(&refusal));
                self.close_end(node, link, true);
            }
            // No session with the peer, or one that is ending.
            None | Some((_, Takeover::Ending)) if hello.cookie != 0 => {
                self.stats.rejected += 1;
                let refusal = p.refusal(Session::reject_unknown());
                self.write(node, link, encode(&refusal));
                self.close_end(node, link, true);
            }
            None | Some((_, Takeover::Ending)) => {
                p.accept_new(cookie, now);
                self.nodes[node].sessions.insert(pid, p);
            }
        }
    }

    fn set_owner(&mut self, node: NodeId, link: LinkId, owner: Option<SessionId>) {
        if let Some(l) = self.links.get_mut(&link.0) {
            for e in l.ends.iter_mut().filter(|e| e.node == node) {
                e.session = owner;
            }
        }
    }

    fn new_session_id(&mut self) -> SessionId {
        let id = SessionId(self.next_session);
        self.next_session += 1;
        id
    }

    fn fire_time_cuts(&mut self) -> bool {
        let now = self.now;
        let due: Vec<(NodeId, NodeId)> = self
            .planned
            .time_cuts
            .iter()
            .filter(|(t, _, _)| *t <= now)
            .map(|(_, a, b)| (*a, *b))
            .collect();
        self.planned.time_cuts.retain(|(t, _, _)| *t > now);
        for (a, b) in &due {
            self.cut_between(*a, *b);
        }
        !due.is_empty()
    }

    fn resolve_connects(&mut self) -> bool {
        let now = self.now;
        let (due, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut self.connects)
            .into_iter()
            .partition(|c| c.at <= now);
        self.connects = rest;
        let progress = !due.is_empty();
        for c in due {
            let link = LinkId(self.next_link);
            self.next_link += 1;
            let target = self
                .nodes
                .iter()
                .position(|n| n.listening && n.addr.same_endpoint(&c.target));
            let frozen = self.nodes[c.node].frozen;
            let Some(t) = target else {
                self.stats.refused += 1;
                if let Some(s) = self.nodes[c.node].sessions.get_mut(&c.session) {
                    if !frozen {
                        s.link_failed(link, LinkFailure::Setup("connection refused".into()), now);
                    }
                }
                continue;
            };
            self.stats.links += 1;
            let pid = self.new_session_id();
            let mk_pipe = || Pipe {
                pieces: VecDeque::new(),
                fin: false,
                rx: BytesMut::new(),
                dec: StreamDecoder::new(self.cfg.session.limits),
                last_at: now,
            };
            self.links.insert(
                link.0,
                Link {
                    ends: [
                        End {
                            node: c.node,
                            session: Some(c.session),
                            dead: false,
                            notified: false,
                        },
                        End {
                            node: t,
                            session: Some(pid),
                            dead: false,
                            notified: false,
                        },
                    ],
                    pipes: [mk_pipe(), mk_pipe()],
                    blackhole: false,
                },
            );
            let cfg = self.session_config(t);
            let tn = &mut self.nodes[t];
            let local = LocalIdentity {
                name: tn.name.clone(),
                addr: tn.addr.clone(),
                dials: tn.dials.clone(),
            };
            tn.pending
                .insert(pid, Session::accept(cfg, local, link, now));
            match self.nodes[c.node].sessions.get_mut(&c.session) {
                Some(s) => s.link_up(link, now),
                None => self.close_end(c.node, link, true),
            }
        }
        progress
    }

    /// Tells sessions about links that died under them (EOF, reset).
    fn notify_dead_ends(&mut self) -> bool {
        let now = self.now;
        let mut todo = Vec::new();
        for (id, l) in self.links.iter_mut() {
            for e in l.ends.iter_mut() {
                if e.dead && !e.notified && !self.nodes[e.node].frozen {
                    e.notified = true;
                    if let Some(s) = e.session {
                        todo.push((e.node, s, LinkId(*id)));
                    }
                }
            }
        }
        let progress = !todo.is_empty();
        for (node, s, link) in todo {
            let n = &mut self.nodes[node];
            if let Some(s) = n.sessions.get_mut(&s).or(n.pending.get_mut(&s)) {
                s.link_failed(link, LinkFailure::Reset("connection reset".into()), now);
            }
        }
        // Forget links that are dead at both ends and drained.
        self.links
            .retain(|_, l| !(l.ends.iter().all(|e| e.dead && e.notified)));
        progress
    }

    /// Graceful close of `node`'s end of `link`: what was written is still
    /// delivered, then the reader sees EOF.
    fn close_end(&mut self, node: NodeId, link: LinkId, notified: bool) {
        if let Some(l) = self.links.get_mut(&link.0) {
            for i in 0..2 {
                if l.ends[i].node == node && !l.ends[i].dead {
                    l.ends[i].dead = true;
                    l.ends[i].notified |= notified;
                    l.pipes[i].fin = true;
                    l.pipes[1 - i].pieces.clear();
                    l.pipes[1 - i].rx.clear();
                }
            }
        }
    }

    /// Resets a link: bytes in flight are lost, both ends see an error.
    fn abort(&mut self, link: u64) {
        if let Some(l) = self.links.get_mut(&link) {
            self.stats.cuts += 1;
            for p in &mut l.pipes {
                p.pieces.clear();
                p.rx.clear();
                p.fin = false;
            }
            for e in &mut l.ends {
                e.dead = true;
            }
        }
    }

    fn write(&mut self, node: NodeId, link: LinkId, bytes: Bytes) {
        let now = self.now;
        let room = WIRE_RECORD.saturating_sub(self.wire.len());
        self.wire.extend_from_slice(&bytes[..bytes.len().min(room)]);
        let Some(l) = self.links.get_mut(&link.0) else {
            return;
        };
        let Some(i) = (0..2).find(|&i| l.ends[i].node == node) else {
            return;
        };
        if l.ends[i].dead || l.blackhole {
            return;
        }
        let extra = self
            .planned
            .delays
            .get(&(node, l.ends[1 - i].node))
            .copied()
            .unwrap_or_default();
        let mut rest = bytes;
        while !rest.is_empty() {
            let n = self
                .rng
                .random_range(1..=self.cfg.max_piece.max(1))
                .min(rest.len());
            let piece = rest.split_to(n);
            let jitter = self.cfg.jitter.mul_f64(self.rng.random::<f64>());
            let p = &mut l.pipes[i];
            let at = (now + self.cfg.latency + extra + jitter).max(p.last_at);
            p.last_at = at;
            p.pieces.push_back((at, piece));
        }
    }

    /// Delivers every piece that is due, decoding and handing units to sessions.
    fn deliver_due(&mut self) -> bool {
        let now = self.now;
        let mut progress = false;
        let ids: Vec<u64> = self.links.keys().copied().collect();
        for id in ids {
            for dir in 0..2 {
                while let Some(l) = self.links.get_mut(&id) {
                    let reader = 1 - dir;
                    let rnode = l.ends[reader].node;
                    if self.nodes[rnode].frozen || l.ends[reader].dead {
                        break;
                    }
                    let p = &mut l.pipes[dir];
                    let piece = match p.pieces.front() {
                        Some((t, _)) if *t <= now => p.pieces.pop_front().map(|(_, b)| b),
                        Some(_) => break,
                        None if p.fin => {
                            // EOF: the reader's socket is done.
                            p.fin = false;
                            l.ends[reader].dead = true;
                            progress = true;
                            break;
                        }
                        None => break,
                    };
                    let Some(mut piece) = piece else { break };
                    progress = true;
                    // Random faults.
                    let f = self.cfg.faults;
                    if f.drop > 0.0 && self.rng.random_bool(f.drop.min(1.0)) {
                        self.stats.drops += 1;
                        continue;
                    }
                    if f.corrupt > 0.0 && self.rng.random_bool(f.corrupt.min(1.0)) {
                        self.stats.corruptions += 1;
                        let mut v = piece.to_vec();
                        let at = self.rng.random_range(0..v.len());
                        v[at] ^= 1 << self.rng.random_range(0..8);
                        piece = v.into();
                    }
                    let mut cut_after = f.cut > 0.0 && self.rng.random_bool(f.cut.min(1.0));
                    // Scheduled byte-position cuts.
                    let before = self.stats.bytes;
                    while self.planned.byte_cuts.front().is_some_and(|&c| c < before) {
                        self.planned.byte_cuts.pop_front();
                    }
                    if let Some(&c) = self.planned.byte_cuts.front() {
                        if c < before + piece.len() as u64 {
                            self.planned.byte_cuts.pop_front();
                            piece.truncate((c - before) as usize);
                            cut_after = true;
                        }
                    }
                    self.stats.bytes += piece.len() as u64;
                    self.feed(id, reader, &piece);
                    if cut_after {
                        self.abort(id);
                        break;
                    }
                }
            }
        }
        progress
    }

    /// Appends bytes to the reader's buffer and hands complete units to its session.
    fn feed(&mut self, id: u64, reader: usize, piece: &[u8]) {
        let now = self.now;
        let link = LinkId(id);
        let mut units = Vec::new();
        let mut error = None;
        let (node, owner) = {
            let Some(l) = self.links.get_mut(&id) else {
                return;
            };
            let p = &mut l.pipes[1 - reader];
            p.rx.extend_from_slice(piece);
            loop {
                match p.dec.decode(&mut p.rx) {
                    Ok(Some(u)) => units.push(u),
                    Ok(None) => break,
                    Err(e) => {
                        error = Some(e);
                        break;
                    }
                }
            }
            (l.ends[reader].node, l.ends[reader].session)
        };
        for u in units {
            // Route by the current owner: a takeover can happen between units.
            let owner = self
                .links
                .get(&id)
                .and_then(|l| l.ends[reader].session)
                .or(owner);
            let Some(sid) = owner else { break };
            let n = &mut self.nodes[node];
            if let Some(s) = n.sessions.get_mut(&sid).or(n.pending.get_mut(&sid)) {
                let _ = s.handle_inbound(link, u, now);
            }
            // Hand events over before the next unit (Identified re-routes).
            let pending = self.nodes[node].pending.contains_key(&sid);
            self.drive_session(node, sid, pending);
        }
        if let Some(e) = error {
            if let Some(sid) = owner {
                let n = &mut self.nodes[node];
                if let Some(s) = n.sessions.get_mut(&sid).or(n.pending.get_mut(&sid)) {
                    s.handle_decode_error(link, e.into(), now);
                }
            }
            // A backend closes a connection whose stream it cannot decode.
            self.close_end(node, link, true);
        }
    }
}

/// The owner's session key for a peer address: a listening peer is known by
/// its endpoint (a restart, i.e. a new nonce, finds the old session, whose
/// `take_link` then sees the new nonce), a peer that does not listen (port 0)
/// by its full address, nonce included. The messenger uses the same rule.
pub fn peer_key(addr: &EntityAddr) -> EntityAddr {
    if addr.socket.port() == 0 {
        addr.clone()
    } else {
        addr.clone().with_nonce(0)
    }
}

fn encode(t: &Transmit) -> Bytes {
    // Units built by the engine always fit their u32 lengths.
    Bytes::from(t.encode_to_vec().expect("engine frames encode"))
}

/// A banner's bytes, for tests that speak to a session directly.
pub fn banner_bytes() -> [u8; crate::banner::BANNER_LEN] {
    Banner::default().encode()
}
