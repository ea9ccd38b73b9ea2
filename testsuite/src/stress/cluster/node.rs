//! One cluster node: a process inside its own network namespace, started by
//! the parent as `msgr-stress --cluster-node K ...`. A messenger bound to the
//! namespace's address with a lossless-peer session to every other node,
//! one-way streams and calls to random peers, reports on stdout (a `STATS`
//! line every 100 ms, `DRAINED` and `FINAL` at the end), commands on stdin
//! (`stop`: stop the workload and drain; `exit`: shut down gracefully,
//! report `FINAL` and exit; end of input: exit at once).

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead as _, Write as _};
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use msgr::{
    CallError, Connection, Counters, Dispatcher, EntityAddr, EntityName, FaultReason, Message,
    Messenger, Policy,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use super::check::{IncarnationRecord, ReceiveLog, StreamId};
use crate::stress::verify::{Pattern, Probe, PROBE_TYPE};

/// Requests of the workload's calls (the reply echoes them).
const CALL_TYPE: u16 = 0x5158;
/// Replies to them.
const REPLY_TYPE: u16 = 0x5159;
/// Largest one-way message.
pub(super) const MAX_MESSAGE: usize = 64 << 10;
/// Latencies kept per node for the percentiles.
const KEEP_LATENCIES: usize = 50_000;

/// How a node is started (its command line).
#[derive(Clone, Debug)]
pub struct NodeArgs {
    /// This node.
    pub node: u32,
    /// This incarnation (from 1).
    pub inc: u32,
    /// Every node's address, by index.
    pub addrs: Vec<Ipv4Addr>,
    /// The port every node listens on.
    pub port: u16,
    /// The run's seed.
    pub seed: u64,
    /// One-way messages per second this node sends (over all peers).
    pub rate: u32,
    /// Each call's deadline.
    pub call_deadline: Duration,
    /// A planted bug, to see the checks catch it: the 100th message to
    /// the first peer that gets that far goes out twice.
    pub plant_duplicate: bool,
}

/// A periodic report.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct NodeStats {
    /// Node.
    pub node: u32,
    /// Incarnation.
    pub inc: u32,
    /// Peers whose session is open.
    pub open_peers: u32,
    /// Resets of each peer's session seen so far (by node index).
    pub resets_by_peer: Vec<u64>,
    /// `redials` counter.
    pub redials: u64,
    /// `reconnects` counter.
    pub reconnects: u64,
    /// `link_faults` counter.
    pub link_faults: u64,
    /// Messages sent.
    pub sent: u64,
    /// Messages delivered.
    pub delivered: u64,
    /// The receive log and the sent counts (every fifth report).
    pub record: Option<IncarnationRecord>,
}

/// What a node's calls came to.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct CallStats {
    /// Answered correctly.
    pub ok: u64,
    /// Failed, by reason.
    pub failed: BTreeMap<String, u64>,
    /// Returned (answered or failed) later than the deadline plus a grace.
    pub late: u64,
    /// The first late ones: how long they took, ms, and how they ended.
    pub late_examples: Vec<(u64, String)>,
    /// The longest any call took, ms.
    pub slowest_ms: u64,
    /// Answered with something else than the request's echo.
    pub bad_replies: u64,
    /// Latencies of answered calls, microseconds (the first ones).
    pub latencies_us: Vec<u32>,
}

/// The last report of an incarnation that drained.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct NodeFinal {
    /// Its record.
    pub record: IncarnationRecord,
    /// Its calls.
    pub calls: CallStats,
    /// Its messenger's counters.
    pub counters: Vec<(String, u64)>,
    /// Sends refused (queue full), skipped by the workload.
    pub send_refused: u64,
}

struct PeerSlot {
    conn: Connection,
    epoch: u32,
    sent: u64,
}

struct NodeState {
    args: NodeArgs,
    pattern: Pattern,
    peers: Vec<Mutex<Option<PeerSlot>>>,
    resets: Vec<AtomicU64>,
    /// Connection id → peer.
    by_conn: Mutex<HashMap<u64, u32>>,
    /// Epochs that ended: (stream, messages sent).
    ended: Mutex<Vec<(StreamId, u64)>>,
    log: Mutex<ReceiveLog>,
    sent: AtomicU64,
    delivered: AtomicU64,
    send_refused: AtomicU64,
    calls: Mutex<CallStats>,
}

impl NodeState {
    fn addr(&self, peer: u32) -> EntityAddr {
        format!(
            "tcp://{}:{}",
            self.args.addrs[peer as usize], self.args.port
        )
        .parse()
        .expect("node address")
    }

    fn stream(&self, peer: u32, epoch: u32) -> StreamId {
        StreamId {
            sender: self.args.node,
            sender_inc: self.args.inc,
            receiver: peer,
            epoch,
        }
    }

    /// The session with the peer of `conn` was reset: its epoch ends.
    fn reset(&self, conn: &Connection) {
        let Some(peer) = self.by_conn.lock().expect("lock").get(&conn.id()).copied() else {
            return;
        };
        self.resets[peer as usize].fetch_add(1, Ordering::Relaxed);
        let mut slot = self.peers[peer as usize].lock().expect("lock");
        if let Some(s) = slot.as_mut() {
            self.ended
                .lock()
                .expect("lock")
                .push((self.stream(peer, s.epoch), s.sent));
            s.epoch += 1;
            s.sent = 0;
        }
    }

    /// The peer's connection: a new session if the last one ended.
    fn connect(&self, messenger: &Messenger, peer: u32) -> Option<Connection> {
        let current = self.peers[peer as usize]
            .lock()
            .expect("lock")
            .as_ref()
            .map(|s| s.conn.clone());
        if let Some(c) = current.filter(|c| c.state() != msgr::ConnectionState::Closed) {
            return Some(c);
        }
        // Outside the slot's lock: the worker may be in `reset` for it.
        let conn = messenger
            .connect_with(&self.addr(peer), Policy::LosslessPeer)
            .ok()?;
        self.by_conn.lock().expect("lock").insert(conn.id(), peer);
        let mut slot = self.peers[peer as usize].lock().expect("lock");
        match slot.as_mut() {
            Some(s) => s.conn = conn.clone(),
            None => {
                *slot = Some(PeerSlot {
                    conn: conn.clone(),
                    epoch: 1,
                    sent: 0,
                })
            }
        }
        Some(conn)
    }

    fn record(&self, drained: bool) -> IncarnationRecord {
        let mut sent = self.ended.lock().expect("lock").clone();
        for (k, slot) in self.peers.iter().enumerate() {
            if let Some(s) = slot.lock().expect("lock").as_ref() {
                sent.push((self.stream(k as u32, s.epoch), s.sent));
            }
        }
        IncarnationRecord {
            node: self.args.node,
            inc: self.args.inc,
            log: self.log.lock().expect("lock").clone(),
            sent,
            drained,
        }
    }
}

struct NodeDispatcher(Arc<NodeState>);

impl Dispatcher for NodeDispatcher {
    fn on_message(&self, conn: &Connection, msg: Message) {
        let st = &self.0;
        match msg.msg_type {
            PROBE_TYPE => {
                let mut log = st.log.lock().expect("lock");
                match Probe::decode(&msg.front) {
                    Some(p) => {
                        let id = StreamId {
                            sender: p.client >> 16,
                            sender_inc: p.client & 0xffff,
                            receiver: p.server,
                            epoch: p.epoch,
                        };
                        let intact = p.server == st.args.node && st.pattern.intact(&p, &msg.data);
                        log.record(id, p.n, intact);
                    }
                    None => log.record(
                        StreamId {
                            sender: u32::MAX,
                            sender_inc: 0,
                            receiver: st.args.node,
                            epoch: 0,
                        },
                        0,
                        false,
                    ),
                }
                st.delivered.fetch_add(1, Ordering::Relaxed);
            }
            CALL_TYPE => {
                let reply = Message::new(REPLY_TYPE, msg.front.clone(), msg.data.clone());
                // A refused reply (queue full) fails the call by its deadline.
                let _ = conn.reply(&msg, reply);
            }
            _ => {}
        }
    }

    fn on_reset(&self, conn: &Connection, _reason: &FaultReason) {
        self.0.reset(conn);
    }

    fn on_remote_reset(&self, conn: &Connection) {
        self.0.reset(conn);
    }
}

fn sender_loop(st: &NodeState, messenger: &Messenger, stop: &AtomicBool) {
    let mut rng = StdRng::seed_from_u64(
        st.args.seed ^ u64::from(st.args.node) << 32 ^ u64::from(st.args.inc),
    );
    let n = st.args.addrs.len() as u32;
    let per_tick = (st.args.rate / 100).max(1);
    let mut next = Instant::now();
    let mut planted = !st.args.plant_duplicate;
    while !stop.load(Ordering::Relaxed) {
        next += Duration::from_millis(10);
        for _ in 0..per_tick {
            let peer = (st.args.node + rng.random_range(1..n)) % n;
            if st.connect(messenger, peer).is_none() {
                continue;
            }
            let len = if rng.random_range(0..50) == 0 {
                rng.random_range(0..=MAX_MESSAGE)
            } else {
                rng.random_range(0..4096)
            };
            let mut slot = st.peers[peer as usize].lock().expect("lock");
            let Some(s) = slot.as_mut() else { continue };
            let probe = Probe {
                client: st.args.node << 16 | st.args.inc,
                server: peer,
                epoch: s.epoch,
                n: s.sent + 1,
                len: len as u32,
                // One class: the node's log checks n in sequence.
                class: msgr::Priority::Data.index() as u8,
                prev: s.sent,
            };
            let again = !planted && s.sent == 100;
            let probe = if again {
                planted = true;
                Probe { n: s.sent, ..probe }
            } else {
                probe
            };
            match s.conn.send(st.pattern.message(&probe)) {
                Ok(()) if again => {}
                Ok(()) => {
                    s.sent += 1;
                    st.sent.fetch_add(1, Ordering::Relaxed);
                }
                Err(_) => {
                    st.send_refused.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
        } else {
            next = now;
        }
    }
}

fn call_reason(e: &CallError) -> String {
    match e {
        CallError::Timeout { .. } => "timeout".into(),
        CallError::Reset(r) => format!("reset: {r}"),
        CallError::Send(e) => format!("not sent: {e}"),
        other => other.to_string(),
    }
}

fn caller_loop(st: &NodeState, messenger: &Messenger, stop: &AtomicBool, which: u64) {
    let mut rng = StdRng::seed_from_u64(
        st.args.seed
            ^ 0xca11
            ^ which
            ^ u64::from(st.args.node) << 40
            ^ u64::from(st.args.inc) << 20,
    );
    let n = st.args.addrs.len() as u32;
    let grace = Duration::from_secs(3);
    let mut seq = 0u64;
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(20));
        let peer = (st.args.node + rng.random_range(1..n)) % n;
        let Some(conn) = st.connect(messenger, peer) else {
            continue;
        };
        seq += 1;
        let mut front = Vec::with_capacity(24);
        front.extend_from_slice(&st.args.node.to_le_bytes());
        front.extend_from_slice(&st.args.inc.to_le_bytes());
        front.extend_from_slice(&which.to_le_bytes());
        front.extend_from_slice(&seq.to_le_bytes());
        let mut data = vec![0u8; rng.random_range(0..2048)];
        rng.fill(&mut data[..]);
        let (front, data) = (Bytes::from(front), Bytes::from(data));
        let start = Instant::now();
        let outcome = conn.call(
            Message::new(CALL_TYPE, front.clone(), data.clone()),
            st.args.call_deadline,
        );
        let took = start.elapsed();
        let mut calls = st.calls.lock().expect("lock");
        let took_ms = took.as_millis() as u64;
        calls.slowest_ms = calls.slowest_ms.max(took_ms);
        if took > st.args.call_deadline + grace {
            calls.late += 1;
            if calls.late_examples.len() < 3 {
                let how = match &outcome {
                    Ok(_) => "answered".to_string(),
                    Err(e) => e.to_string(),
                };
                calls.late_examples.push((took_ms, how));
            }
        }
        match outcome {
            Ok(reply)
                if reply.msg_type == REPLY_TYPE && reply.front == front && reply.data == data =>
            {
                calls.ok += 1;
                if calls.latencies_us.len() < KEEP_LATENCIES {
                    calls
                        .latencies_us
                        .push(took.as_micros().min(u32::MAX as u128) as u32);
                }
            }
            Ok(_) => calls.bad_replies += 1,
            Err(e) => *calls.failed.entry(call_reason(&e)).or_default() += 1,
        }
    }
}

fn emit(line: &str) {
    let mut out = std::io::stdout().lock();
    // The parent gone: nothing to report to; stdin's end will stop us.
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Runs one node until told to exit (or its input ends); the exit code.
pub fn run_node(args: NodeArgs, cfg: msgr::MessengerConfig) -> i32 {
    let n = args.addrs.len();
    let st = Arc::new(NodeState {
        pattern: Pattern::new(args.seed, MAX_MESSAGE),
        peers: (0..n).map(|_| Mutex::new(None)).collect(),
        resets: (0..n).map(|_| AtomicU64::new(0)).collect(),
        by_conn: Mutex::new(HashMap::new()),
        ended: Mutex::new(Vec::new()),
        log: Mutex::new(ReceiveLog::default()),
        sent: AtomicU64::new(0),
        delivered: AtomicU64::new(0),
        send_refused: AtomicU64::new(0),
        calls: Mutex::new(CallStats::default()),
        args,
    });
    let me = st.addr(st.args.node);
    let mut messenger = match Messenger::builder(EntityName::peer(u64::from(st.args.node)))
        .without_env()
        .config(cfg)
        .bind(me.clone())
        .start(Arc::new(NodeDispatcher(st.clone())))
    {
        Ok(m) => m,
        Err(e) => {
            eprintln!("cluster node {}: cannot start on {me}: {e}", st.args.node);
            return 2;
        }
    };
    let stop = AtomicBool::new(false);
    let stats_stop = AtomicBool::new(false);
    let drained = std::thread::scope(|scope| {
        let stats = scope.spawn(|| {
            let debug = std::env::var_os("MSGR_CLUSTER_DEBUG").is_some();
            let mut i = 0u64;
            while !stats_stop.load(Ordering::Relaxed) {
                let c = messenger.counters();
                let report = NodeStats {
                    node: st.args.node,
                    inc: st.args.inc,
                    open_peers: st
                        .peers
                        .iter()
                        .filter(|s| {
                            s.lock().expect("lock").as_ref().is_some_and(|s| {
                                s.conn.state() == msgr::ConnectionState::Open
                            })
                        })
                        .count() as u32,
                    resets_by_peer: st.resets.iter().map(|r| r.load(Ordering::Relaxed)).collect(),
                    redials: Counters::get(&c.redials),
                    reconnects: Counters::get(&c.reconnects),
                    link_faults: Counters::get(&c.link_faults),
                    sent: st.sent.load(Ordering::Relaxed),
                    delivered: st.delivered.load(Ordering::Relaxed),
                    record: i.is_multiple_of(5).then(|| st.record(false)),
                };
                if debug && i.is_multiple_of(5) {
                    for (k, slot) in st.peers.iter().enumerate() {
                        if let Some(s) = slot.lock().expect("lock").as_ref() {
                            let status = s.conn.status();
                            if status.state != msgr::ConnectionState::Open {
                                eprintln!(
                                    "node {} -> {k}: {} attempts {} faults {} last {:?} retry in {:?}",
                                    st.args.node, status.phase, status.attempts, status.faults, status.last_fault, status.retry_in
                                );
                            }
                        }
                    }
                }
                emit(&format!(
                    "STATS {}",
                    serde_json::to_string(&report).expect("stats serialize")
                ));
                i += 1;
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        let workers: Vec<_> = (0..3u64)
            .map(|w| {
                let (st, messenger, stop) = (&st, &messenger, &stop);
                scope.spawn(move || {
                    if w == 0 {
                        sender_loop(st, messenger, stop)
                    } else {
                        caller_loop(st, messenger, stop, w)
                    }
                })
            })
            .collect();
        let mut workers = Some(workers);
        let mut drained = false;
        let mut code = 3;
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            match line.trim() {
                "stop" => {
                    stop.store(true, Ordering::Relaxed);
                    for w in workers.take().into_iter().flatten() {
                        let _ = w.join();
                    }
                    let deadline = Instant::now() + Duration::from_secs(30);
                    while Instant::now() < deadline
                        && st.peers.iter().any(|s| {
                            s.lock()
                                .expect("lock")
                                .as_ref()
                                .is_some_and(|s| s.conn.queued().0 > 0)
                        })
                    {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    drained = Instant::now() < deadline;
                    emit(if drained {
                        "DRAINED ok"
                    } else {
                        "DRAINED late"
                    });
                }
                "exit" => {
                    code = 0;
                    break;
                }
                _ => {}
            }
        }
        if code != 0 {
            // The parent is gone (or never said exit): leave at once.
            std::process::exit(code);
        }
        stop.store(true, Ordering::Relaxed);
        for w in workers.take().into_iter().flatten() {
            let _ = w.join();
        }
        stats_stop.store(true, Ordering::Relaxed);
        let _ = stats.join();
        drained
    });
    // The record after the shutdown: what peers delivered until their
    // sessions closed is in it.
    messenger.shutdown(Duration::from_secs(5));
    let report = NodeFinal {
        record: st.record(drained),
        calls: st.calls.lock().expect("lock").clone(),
        counters: messenger
            .counters()
            .snapshot()
            .into_iter()
            .map(|(name, _, v)| (name.to_string(), v))
            .collect(),
        send_refused: st.send_refused.load(Ordering::Relaxed),
    };
    emit(&format!(
        "FINAL {}",
        serde_json::to_string(&report).expect("final serialize")
    ));
    0
}
