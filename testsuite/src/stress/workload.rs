//! The workload: server slots (restartable), client threads, the chaos
//! thread, the final drain and the checks.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use msgr::{
    ConnectionState, Counters, EntityAddr, EntityName, Messenger, MessengerConfig, Policy,
    RealFault, SendError, SendRejected, SimulatedFault, TransportKind,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::report::{
    blocked_threads, rss_kib, secs, tcp_listeners, thread_count, Progress, StressReport,
};
use super::rma::{self, Exposed, RmaState, Shadow};
use super::seed::mix;
use super::verify::{
    ClientEvents, EpochRecord, Pattern, Probe, ServerDispatcher, Verifier, Violations,
};
use super::StressConfig;

const ROLE_CLIENT: u64 = 1;
const ROLE_SERVER: u64 = 2;
const ROLE_CHAOS: u64 = 3;
const ROLE_FAULTS: u64 = 4;

/// Counter totals of messengers that were shut down (restarted servers).
#[derive(Default, Clone, Copy)]
struct Totals {
    injected_faults: u64,
    reconnects: u64,
    replayed_messages: u64,
    link_faults: u64,
    protocol_errors: u64,
    keepalive_timeouts: u64,
    duplicates_dropped: u64,
    send_queue_full: u64,
    transport_changes: u64,
}

impl Totals {
    fn add(&mut self, c: &Counters) {
        let g = Counters::get;
        self.injected_faults += g(&c.injected_faults);
        self.reconnects += g(&c.reconnects);
        self.replayed_messages += g(&c.replayed_messages);
        self.link_faults += g(&c.link_faults);
        self.protocol_errors += g(&c.protocol_errors);
        self.keepalive_timeouts += g(&c.keepalive_timeouts);
        self.duplicates_dropped += g(&c.duplicates_dropped);
        self.transport_changes += g(&c.transport_changes);
        self.send_queue_full += g(&c.send_queue_full);
    }
}

struct ServerSlot {
    index: u32,
    bind: EntityAddr,
    /// The second address it listens on (`StressConfig::transport_change`).
    bind2: Option<EntityAddr>,
    messenger: Mutex<Option<Messenger>>,
    addr: RwLock<EntityAddr>,
    /// Every address it listens on now, for clients' address vectors.
    addrs: RwLock<msgr::AddrVec>,
    /// Bumped before a shutdown and after the restart: odd while one is under way.
    generation: AtomicU64,
    incarnation: AtomicU64,
    dispatcher: Arc<ServerDispatcher>,
    /// The running incarnation's exposed region (`StressConfig::rma`).
    rma: Mutex<Option<Exposed>>,
    /// When the chaos thread last failed its transport's completion queue
    /// (SIMULATED), for the RMA checks (docs/STRESS.md "RMA").
    cq_failed_at: Mutex<Option<Instant>>,
}

#[derive(Default)]
struct Stats {
    sent: AtomicU64,
    sent_bytes: AtomicU64,
    large: AtomicU64,
    epochs: AtomicU64,
    mark_downs: AtomicU64,
    restarts: AtomicU64,
    real_faults: AtomicU64,
    simulated_faults: AtomicU64,
}

struct Run<'a> {
    cfg: &'a StressConfig,
    stop: AtomicBool,
    servers: Vec<ServerSlot>,
    pattern: Pattern,
    violations: Arc<Violations>,
    verifier: Arc<Verifier>,
    stats: Stats,
    retired: Mutex<Totals>,
    leaked_links: AtomicU64,
    aborted_links: AtomicU64,
    undelivered: AtomicU64,
    rma: RmaState,
    /// Where the configuration asks for `auth` or `secure` without key
    /// files: a key per entity of the run, made at its start, and the
    /// keyring of them all.
    keys: Option<RunKeys>,
}

/// The run's entities' keys (kept across server restarts: a restarted
/// server proves the same identity).
struct RunKeys {
    ring: Arc<msgr::auth::Keyring>,
    keys: std::collections::HashMap<EntityName, msgr::auth::StaticKeypair>,
}

impl RunKeys {
    fn new(servers: usize, clients: usize) -> RunKeys {
        let names = (0..servers as u64)
            .map(EntityName::server)
            .chain((0..clients as u64).map(EntityName::client));
        let keys: std::collections::HashMap<_, _> = names
            .map(|n| (n, msgr::auth::StaticKeypair::generate()))
            .collect();
        let mut ring = msgr::auth::Keyring::new();
        for (n, k) in &keys {
            ring.insert(n.clone(), k.public());
        }
        RunKeys {
            ring: Arc::new(ring),
            keys,
        }
    }

    fn credentials(&self, name: &EntityName) -> Option<Arc<msgr::auth::Credentials>> {
        let k = self.keys.get(name)?;
        Some(Arc::new(msgr::auth::Credentials::new(
            name.clone(),
            k.clone(),
            self.ring.clone(),
        )))
    }
}

impl Run<'_> {
    fn messenger_config(&self, role: u64, index: u64, incarnation: u64) -> MessengerConfig {
        let mut m = self.cfg.messenger.clone();
        if let Some(keys) = &self.keys {
            let name = if role == ROLE_SERVER {
                EntityName::server(index)
            } else {
                EntityName::client(index)
            };
            m.session.security.credentials = keys.credentials(&name);
        }
        if let Some(plan) = &self.cfg.faults {
            let mut plan = plan.clone();
            plan.seed = mix(
                self.cfg.seed ^ plan.seed,
                ROLE_FAULTS,
                mix(role, index, incarnation),
            );
            m.faults = Some(plan);
        } else {
            m.faults = None;
        }
        m
    }

    fn start_server(
        &self,
        slot: &ServerSlot,
        bind: EntityAddr,
        bind2: Option<EntityAddr>,
    ) -> Result<Messenger, msgr::MessengerError> {
        let inc = slot.incarnation.fetch_add(1, Ordering::SeqCst);
        let cfg = self.messenger_config(ROLE_SERVER, u64::from(slot.index), inc);
        let disp: Arc<dyn msgr::Dispatcher> = slot.dispatcher.clone();
        let name = EntityName::server(u64::from(slot.index));
        self.cfg.placement.on_server(move || {
            let mut b = Messenger::builder(name).config(cfg).bind(bind);
            if let Some(second) = bind2 {
                b = b.bind(second);
            }
            b.start(disp)
        })
    }

    /// Records where a (re)started server listens; exposes its region.
    fn server_started(&self, slot: &ServerSlot, m: Messenger) {
        *slot.addr.write().expect("addr lock") = m.addr().expect("bound").clone();
        *slot.addrs.write().expect("addrs lock") = m.addrs();
        if self.cfg.rma {
            let region = m.expose(vec![0u8; rma::REGION_LEN], msgr::Access::ReadWrite);
            *slot.rma.lock().expect("rma lock") = Some(Exposed {
                incarnation: slot.incarnation.load(Ordering::SeqCst),
                handle: region.handle(),
                region,
            });
        }
        *slot.messenger.lock().expect("slot lock") = Some(m);
    }

    /// Shuts a server incarnation down; `exposed` is its region, revoked
    /// first (operations still arriving are refused as revoked), and its
    /// served writes are recorded once the shutdown has finished.
    fn retire(&self, slot: &ServerSlot, mut m: Messenger, exposed: Option<Exposed>) {
        let incarnation = exposed.map(|e| e.incarnation);
        let r = m.shutdown(Duration::from_secs(5));
        if let Some(inc) = incarnation {
            let c = m.counters();
            self.rma.retired(
                slot.index,
                inc,
                Counters::get(&c.rma_writes_served),
                Counters::get(&c.rma_refused),
            );
        }
        self.retired.lock().expect("retired lock").add(m.counters());
        if r.leaked_links != 0 {
            self.violations.push(format!(
                "server shutdown leaked {} link(s): {r:?}",
                r.leaked_links
            ));
        }
        self.leaked_links
            .fetch_add(r.leaked_links as u64, Ordering::Relaxed);
        self.aborted_links
            .fetch_add(r.aborted_links as u64, Ordering::Relaxed);
        self.undelivered.fetch_add(r.undelivered, Ordering::Relaxed);
        let held = m.rx_held();
        if held != (0, 0) {
            self.violations.push(format!(
                "a shut-down server still holds rx buffers {held:?}"
            ));
        }
    }

    /// Shuts a server down and starts it again, on the same port if it can.
    fn restart_server(&self, slot: &ServerSlot, downtime: Duration) {
        slot.generation.fetch_add(1, Ordering::SeqCst);
        let old = slot.messenger.lock().expect("slot lock").take();
        let exposed = slot.rma.lock().expect("rma lock").take();
        if let Some(m) = old {
            self.retire(slot, m, exposed);
        }
        std::thread::sleep(downtime);
        let port = slot.addr.read().expect("addr lock").socket.port();
        let same = slot.bind.clone().with_port(port);
        let same2 = {
            let addrs = slot.addrs.read().expect("addrs lock");
            match (&slot.bind2, addrs.0.get(1)) {
                (Some(b), Some(a)) => Some(b.clone().with_port(a.socket.port())),
                (b, _) => b.clone(),
            }
        };
        let started = self
            .start_server(slot, same, same2)
            .or_else(|_| self.start_server(slot, slot.bind.clone(), slot.bind2.clone()));
        match started {
            Ok(m) => self.server_started(slot, m),
            Err(e) => self
                .violations
                .push(format!("server {} could not restart: {e}", slot.index)),
        }
        slot.generation.fetch_add(1, Ordering::SeqCst);
        self.stats.restarts.fetch_add(1, Ordering::Relaxed);
    }

    fn progress(&self, clients: &[Messenger], started: Instant) -> (Progress, Totals) {
        let mut t = *self.retired.lock().expect("retired lock");
        for m in clients {
            t.add(m.counters());
        }
        for s in &self.servers {
            if let Some(m) = &*s.messenger.lock().expect("slot lock") {
                t.add(m.counters());
            }
        }
        let p = Progress {
            elapsed_s: secs(started.elapsed()),
            duration_s: secs(self.cfg.duration),
            sent: self.stats.sent.load(Ordering::Relaxed),
            delivered: self.verifier.delivered.load(Ordering::Relaxed),
            delivered_bytes: self.verifier.delivered_bytes.load(Ordering::Relaxed),
            injected_faults: t.injected_faults,
            reconnects: t.reconnects,
            server_restarts: self.stats.restarts.load(Ordering::Relaxed),
            violations: self.violations.count(),
        };
        (p, t)
    }
}

/// One client's current stretch of sends to one server.
struct Link {
    rec: Arc<EpochRecord>,
    next_n: u64,
    /// The n last sent in each class (`Probe::prev` of the next).
    last_in_class: [u64; msgr::Priority::COUNT],
    /// The server slot's generation when this connection object was obtained.
    conn_generation: u64,
}

struct Client<'r, 'a> {
    run: &'r Run<'a>,
    index: u32,
    messenger: &'r Messenger,
    events: &'r ClientEvents,
    policy: Policy,
    rng: StdRng,
    links: Vec<Option<Link>>,
    epochs: Vec<u32>,
    /// Per server: what this client knows of its slice of the region.
    shadows: Vec<Shadow>,
    /// Writes so far (the seed of each write's bytes).
    rma_seq: u64,
}

impl Client<'_, '_> {
    fn disturbed_by_remote(&self, rec: &EpochRecord) -> bool {
        self.events.remote_resets_of(rec.conn.id()) != rec.remote_resets_at_start
    }

    fn new_epoch(&mut self, s: usize, conn: msgr::Connection, conn_generation: u64) {
        let slot = &self.run.servers[s];
        self.epochs[s] += 1;
        let rec = Arc::new(EpochRecord {
            key: (self.index, s as u32, self.epochs[s]),
            policy: self.policy,
            remote_resets_at_start: self.events.remote_resets_of(conn.id()),
            generation_at_start: slot.generation.load(Ordering::SeqCst),
            conn,
            sent: AtomicU64::new(0),
            marked_down: AtomicBool::new(false),
            ended_disturbed: AtomicBool::new(false),
        });
        self.run.stats.epochs.fetch_add(1, Ordering::Relaxed);
        self.links[s] = Some(Link {
            rec,
            next_n: 1,
            last_in_class: [0; msgr::Priority::COUNT],
            conn_generation,
        });
    }

    fn connect(&mut self, s: usize) -> bool {
        let slot = &self.run.servers[s];
        let generation = slot.generation.load(Ordering::SeqCst);
        let addr = slot.addr.read().expect("addr lock").clone();
        let addrs = slot.addrs.read().expect("addrs lock").clone();
        let opened = if addrs.len() > 1 {
            // Each fault moves the session to the server's other backend.
            self.messenger.connect_any(&addrs, self.policy)
        } else {
            self.messenger.connect_with(&addr, self.policy)
        };
        match opened {
            Ok(conn) => {
                self.new_epoch(s, conn, generation);
                true
            }
            Err(e) => {
                self.run.violations.push(format!(
                    "client {} could not connect to server {s} at {addr}: {e}",
                    self.index
                ));
                false
            }
        }
    }

    /// Ends the current epoch with server `s` (the connection is dropped
    /// unless `keep`); returns the connection if kept.
    fn end_epoch(&mut self, s: usize, keep: bool) -> Option<(msgr::Connection, u64)> {
        let link = self.links[s].take()?;
        link.rec.ended_disturbed.store(true, Ordering::Relaxed);
        if keep {
            Some((link.rec.conn.clone(), link.conn_generation))
        } else {
            self.events.forget(link.rec.conn.id());
            None
        }
    }

    /// Brings the link to server `s` up to date with what happened to it;
    /// opens one if there is none. Returns false if none could be opened.
    fn refresh(&mut self, s: usize) -> bool {
        let slot = &self.run.servers[s];
        if let Some(link) = &self.links[s] {
            let rec = &link.rec;
            let id = rec.conn.id();
            let generation = slot.generation.load(Ordering::SeqCst);
            let reset = self.events.reset_of(id);
            if reset.is_some() || rec.conn.state() == ConnectionState::Closed {
                let marked = rec.marked_down.load(Ordering::Relaxed);
                // An odd generation is a restart under way: the connection may
                // have been dialled to the old incarnation's address while the
                // new one already listens on its port (WrongPeer), which is the
                // restart's doing, not the messenger's.
                let restart_under_way = generation % 2 == 1;
                if self.policy != Policy::LossyClient
                    && !marked
                    && generation == link.conn_generation
                    && !restart_under_way
                {
                    self.run.violations.push(format!(
                        "lossless connection of client {} to server {s} was reset ({}) with no mark_down or server restart (epoch {:?}, sent {})",
                        self.index,
                        reset.unwrap_or_else(|| "closed".into()),
                        rec.key,
                        rec.sent.load(Ordering::Relaxed)
                    ));
                }
                self.end_epoch(s, false);
            } else if self.disturbed_by_remote(rec) {
                if let Some((conn, g)) = self.end_epoch(s, true) {
                    self.new_epoch(s, conn, g);
                }
            } else if generation != rec.generation_at_start {
                let new_port = slot.addr.read().expect("addr lock").socket.port();
                if new_port != rec.conn.target().socket.port() {
                    rec.conn.mark_down();
                    rec.marked_down.store(true, Ordering::Relaxed);
                    self.wait_closed(&rec.conn.clone());
                    self.end_epoch(s, false);
                } else if let Some((conn, g)) = self.end_epoch(s, true) {
                    self.new_epoch(s, conn, g);
                }
            }
        }
        if self.links[s].is_none() {
            return self.connect(s);
        }
        true
    }

    fn wait_closed(&self, conn: &msgr::Connection) {
        let deadline = Instant::now() + Duration::from_secs(2);
        while conn.state() != ConnectionState::Closed && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn pick_len(&mut self) -> u32 {
        let cfg = self.run.cfg;
        let max = cfg.max_message.max(1) as u32;
        if cfg.large_one_in > 0 && self.rng.random_ratio(1, cfg.large_one_in) && max > 65536 {
            return self.rng.random_range(65537..=max);
        }
        match self.rng.random_range(0..100) {
            0..5 => 0,
            5..88 => self.rng.random_range(1..=4096.min(max)),
            _ => self.rng.random_range(1..=65536.min(max)),
        }
    }

    /// A message's class: mostly the default, one in 8 interactive, one
    /// in 4 background, whatever its size (a small urgent message then
    /// overtakes a fragmented large one, and a large one goes first).
    fn pick_class(&mut self) -> u8 {
        let class = match self.rng.random_range(0..8) {
            0 => msgr::Priority::Interactive,
            1 | 2 => msgr::Priority::Background,
            _ => msgr::Priority::Data,
        };
        class.index() as u8
    }

    /// Sends one message to server `s`, retrying while the queue is full
    /// (bounded by the stall timeout).
    fn send_one(&mut self, s: usize, len: u32) {
        let class = self.pick_class();
        let started = Instant::now();
        let mut pause = Duration::from_micros(50);
        let mut closed_retries = 0;
        loop {
            if !self.refresh(s) {
                return;
            }
            let link = self.links[s].as_mut().expect("refreshed link");
            let p = Probe {
                client: link.rec.key.0,
                server: link.rec.key.1,
                epoch: link.rec.key.2,
                n: link.next_n,
                len,
                class,
                prev: link.last_in_class[usize::from(class)],
            };
            match link.rec.conn.send(self.run.pattern.message(&p)) {
                Ok(()) => {
                    link.last_in_class[usize::from(class)] = link.next_n;
                    link.next_n += 1;
                    link.rec.sent.fetch_add(1, Ordering::Relaxed);
                    let st = &self.run.stats;
                    st.sent.fetch_add(1, Ordering::Relaxed);
                    st.sent_bytes.fetch_add(u64::from(len), Ordering::Relaxed);
                    if len > 65536 {
                        st.large.fetch_add(1, Ordering::Relaxed);
                    }
                    return;
                }
                Err(SendRejected {
                    error: SendError::QueueFull { messages, bytes },
                    ..
                }) => {
                    if started.elapsed() > self.run.cfg.stall_timeout {
                        self.run.violations.push(format!(
                            "no progress: client {} -> server {s} send queue full ({messages} msgs, {bytes} B) for {:?} (epoch {:?}, state {:?})",
                            self.index,
                            self.run.cfg.stall_timeout,
                            link.rec.key,
                            link.rec.conn.state()
                        ));
                        return;
                    }
                    if self.run.stop.load(Ordering::Relaxed) {
                        return;
                    }
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(5));
                }
                Err(SendRejected {
                    error: SendError::Closed,
                    ..
                }) => {
                    closed_retries += 1;
                    // The next refresh sees the closed state and decides.
                    if closed_retries > 3 {
                        return;
                    }
                }
                Err(e) => {
                    self.run.violations.push(format!(
                        "client {} -> server {s}: unexpected send error {e}",
                        self.index
                    ));
                    return;
                }
            }
        }
    }

    fn mark_down(&mut self, s: usize) {
        if let Some(link) = &self.links[s] {
            let conn = link.rec.conn.clone();
            link.rec.marked_down.store(true, Ordering::Relaxed);
            conn.mark_down();
            self.run.stats.mark_downs.fetch_add(1, Ordering::Relaxed);
            self.wait_closed(&conn);
            self.end_epoch(s, false);
        }
    }

    fn real_fault(&mut self, s: usize) {
        if let Some(link) = &self.links[s] {
            if link.rec.conn.state() == ConnectionState::Open {
                let fault = match self.rng.random_range(0..20) {
                    0..14 => RealFault::Abort,
                    14..18 => RealFault::HalfClose,
                    18 => RealFault::StopReading,
                    _ => RealFault::Freeze,
                };
                link.rec.conn.inject_fault(fault);
                self.run.stats.real_faults.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// One RMA operation on server `s`'s region, over the client's
    /// connection to it: a write of a random range of the client's slice
    /// with bytes of its own, read back at once (3 in 4), or a read of a
    /// random range of the slice (1 in 4); every byte read is compared with
    /// what this client last wrote there. The handle is taken anew from the
    /// server's slot each time.
    fn rma_op(&mut self, s: usize) {
        if !self.refresh(s) {
            return;
        }
        let slot = &self.run.servers[s];
        let gen0 = slot.generation.load(Ordering::SeqCst);
        let Some((inc, handle)) = slot
            .rma
            .lock()
            .expect("rma lock")
            .as_ref()
            .map(|e| (e.incarnation, e.handle.clone()))
        else {
            return; // a restart under way
        };
        if gen0 % 2 == 1 {
            return;
        }
        let slice = rma_slice(self.run.cfg);
        let base = (self.index as usize * slice) as u64;
        if self.shadows[s].incarnation != inc {
            self.shadows[s].renew(inc);
        }
        let link = self.links[s].as_ref().expect("refreshed link");
        let conn = link.rec.conn.clone();
        let ctx = RmaCtx {
            s,
            conn_generation: link.conn_generation,
            gen0,
            remote_resets_at_start: link.rec.remote_resets_at_start,
            began: Instant::now(),
        };
        let opts = msgr::RmaOptions::from(rma::RMA_TIMEOUT).checksum();
        let start = self.rng.random_range(0..slice);
        let len = self.pick_rma_len(slice - start);
        let at = base + start as u64;
        let run = self.run;
        let stats = &run.rma;
        if self.rng.random_ratio(1, 4) {
            let t = Instant::now();
            match conn.read(&handle, at, len as u64, opts) {
                Ok(got) => {
                    stats.took(t.elapsed());
                    stats.reads.fetch_add(1, Ordering::Relaxed);
                    stats
                        .bytes_read
                        .fetch_add(got.len() as u64, Ordering::Relaxed);
                    self.rma_check(ctx.s, inc, start, &got, None);
                }
                Err(e) => self.rma_failed(&ctx, &conn, "read", &e),
            }
            return;
        }
        self.rma_seq += 1;
        let data = rma::write_bytes(self.run.cfg.seed, self.index, s as u32, self.rma_seq, len);
        let range = start..start + len;
        let t = Instant::now();
        match conn.write(&handle, at, bytes::Bytes::from(data.clone()), opts) {
            Ok(()) => {
                stats.took(t.elapsed());
                stats.write_outcome(s as u32, inc, true);
                stats.writes.fetch_add(1, Ordering::Relaxed);
                stats.bytes_written.fetch_add(len as u64, Ordering::Relaxed);
                let sh = &mut self.shadows[s];
                let before: Vec<Option<u8>> = range
                    .clone()
                    .map(|i| sh.known[i].then_some(sh.bytes[i]))
                    .collect();
                sh.bytes[range.clone()].copy_from_slice(&data);
                sh.known[range].fill(true);
                let t = Instant::now();
                match conn.read(&handle, at, len as u64, opts) {
                    Ok(got) => {
                        stats.took(t.elapsed());
                        stats.reads.fetch_add(1, Ordering::Relaxed);
                        stats
                            .bytes_read
                            .fetch_add(got.len() as u64, Ordering::Relaxed);
                        self.rma_check(s, inc, start, &got, Some(&before));
                    }
                    Err(e) => self.rma_failed(&ctx, &conn, "read", &e),
                }
            }
            Err(e) => {
                if rma::may_have_landed(&e) {
                    stats.write_outcome(s as u32, inc, false);
                    self.shadows[s].known[range].fill(false);
                }
                self.rma_failed(&ctx, &conn, "write", &e);
            }
        }
    }

    fn pick_rma_len(&mut self, max: usize) -> usize {
        let cap = match self.rng.random_range(0..10) {
            0..5 => 512,
            5..9 => 8192,
            _ => max,
        };
        self.rng.random_range(1..=cap.min(max).max(1))
    }

    /// Compares bytes read at `start` of the slice with the shadow;
    /// `before` is what the range held before a write just acknowledged
    /// (a read-back that still shows it means the write was lost).
    fn rma_check(
        &self,
        s: usize,
        inc: u64,
        start: usize,
        got: &[u8],
        before: Option<&[Option<u8>]>,
    ) {
        let sh = &self.shadows[s];
        let (bad, checked) = sh.mismatch(start, got);
        self.run
            .rma
            .bytes_checked
            .fetch_add(checked, Ordering::Relaxed);
        let Some(at) = bad else { return };
        let stale = before.is_some_and(|b| {
            got.iter()
                .zip(b)
                .all(|(g, was)| was.is_none_or(|w| w == *g))
        });
        let what = if stale {
            self.run.rma.lost.fetch_add(1, Ordering::Relaxed);
            "rma lost: an acknowledged write is not in the region (read back the bytes from before it)"
        } else {
            self.run.rma.corrupted.fetch_add(1, Ordering::Relaxed);
            "rma corrupted: bytes read differ from what their only writer last wrote"
        };
        self.run.violations.push(format!(
            "{what}: client {} server {s} incarnation {inc}, slice byte {at} (range {start}..{}): got {:#04x}, wrote {:#04x}",
            self.index,
            start + got.len(),
            got[at - start],
            sh.bytes[at]
        ));
    }

    /// Counts a failed operation: expected where the connection or the
    /// server was disturbed (as for messages: a server restart since the
    /// connection was dialled, a remote reset, a lossy reset), otherwise a
    /// violation.
    fn rma_failed(&self, ctx: &RmaCtx, conn: &msgr::Connection, op: &str, e: &msgr::RmaError) {
        let kind = rma::kind(e);
        let slot = &self.run.servers[ctx.s];
        let generation = slot.generation.load(Ordering::SeqCst);
        let excuse = if generation != ctx.gen0 || generation != ctx.conn_generation {
            Some("restart")
        } else if self.events.remote_resets_of(conn.id()) != ctx.remote_resets_at_start {
            Some("remote-reset")
        } else if self.policy == Policy::LossyClient
            && (kind == "reset"
                || (kind == "not-sent"
                    && conn.state() == ConnectionState::Closed
                    && conn.status().faults > 0))
        {
            // A lossy connection ends at its first fault; one that ended
            // between the client's refresh and this operation refuses it
            // unsent.
            Some("lossy")
        } else if slot
            .cq_failed_at
            .lock()
            .expect("cq lock")
            .is_some_and(|t| t + CQ_FAILURE_STALL >= ctx.began)
        {
            // A simulated completion-queue failure at the server fails
            // every link on it; over the RDM backends its peers then wait
            // out the backend's 10 s deadline for the old links before
            // they get through again (docs/STRESS.md "RMA"): a stall that
            // heals, which the message checks do not flag either.
            Some("cq-failure")
        } else {
            None
        };
        // Bytes that fail their checksum were corrupted on the way; the
        // frames' own CRC should have caught them first.
        match excuse {
            Some(why) if kind != "checksum" => self.run.rma.failed(&format!("{kind}/{why}")),
            _ => {
                let counter = if kind == "checksum" {
                    &self.run.rma.corrupted
                } else {
                    &self.run.rma.lost
                };
                counter.fetch_add(1, Ordering::Relaxed);
                self.run.rma.failed(&format!("{kind}/none"));
                let st = conn.status();
                self.run.violations.push(format!(
                    "rma {op} by client {} ({:?}) to server {} failed with no restart, remote reset or mark_down: {e} (connection {} {:?} ({}, {} faults, the last: {}) to {}, server now at {}, generation {generation})",
                    self.index,
                    self.policy,
                    ctx.s,
                    conn.id(),
                    st.state,
                    st.phase,
                    st.faults,
                    st.last_fault.map_or_else(|| "none".into(), |f| f.to_string()),
                    conn.target(),
                    slot.addr.read().expect("addr lock"),
                ));
            }
        }
    }

    /// The client's operation loop; returns its current epochs at the end.
    fn run(mut self) -> Vec<Arc<EpochRecord>> {
        let servers = self.run.servers.len();
        let cfg = self.run.cfg;
        while !self.run.stop.load(Ordering::Relaxed) {
            let s = self.rng.random_range(0..servers);
            let op = self.rng.random_range(0..10_000u32);
            match op {
                0..2 if cfg.mark_downs => self.mark_down(s),
                2..5 if cfg.real_faults => self.real_fault(s),
                100..400 if cfg.rma && rma_slice(cfg) > 0 => self.rma_op(s),
                5..60 => {
                    let pause = self.rng.random_range(0..3000);
                    std::thread::sleep(Duration::from_micros(pause));
                }
                60..100 => {
                    self.refresh(s);
                }
                _ => {
                    let burst = self.rng.random_range(1..=16);
                    for _ in 0..burst {
                        let len = self.pick_len();
                        self.send_one(s, len);
                    }
                }
            }
        }
        if cfg.rma {
            let mut finals = self.run.rma.finals.lock().expect("rma finals lock");
            for (s, sh) in self.shadows.drain(..).enumerate() {
                finals.push((self.index, s as u32, sh));
            }
        }
        self.links.into_iter().flatten().map(|l| l.rec).collect()
    }
}

/// What an RMA operation's failure is judged against.
struct RmaCtx {
    s: usize,
    /// The slot's generation when the connection was dialled.
    conn_generation: u64,
    /// The slot's generation when the operation began.
    gen0: u64,
    remote_resets_at_start: u64,
    began: Instant,
}

/// How long after a simulated completion-queue failure at a server an
/// RMA failure on a connection to it is put down to that failure: the RDM
/// backends' 10 s deadline for a peer's old links, and slack.
const CQ_FAILURE_STALL: Duration = Duration::from_secs(12);

/// Bytes of each client's slice of a region (client i owns
/// `i * slice .. (i + 1) * slice`).
fn rma_slice(cfg: &StressConfig) -> usize {
    rma::REGION_LEN / cfg.clients.max(1)
}

/// The owners' check at the end: each server's region, slice by slice,
/// against what its client last wrote there (for a region the client
/// never used: zeros).
fn check_regions_at_end(run: &Run<'_>) {
    let slice = rma_slice(run.cfg);
    let finals = run.rma.finals.lock().expect("rma finals lock");
    for (c, s, sh) in finals.iter() {
        let slot = &run.servers[*s as usize];
        let exposed = slot.rma.lock().expect("rma lock");
        let Some(e) = exposed.as_ref() else { continue };
        let base = *c as usize * slice;
        let bytes = e.region.bytes();
        let mine = &bytes[base..base + slice];
        let (bad, checked) = if sh.incarnation == e.incarnation {
            sh.mismatch(0, mine)
        } else {
            (mine.iter().position(|b| *b != 0), slice as u64)
        };
        run.rma.bytes_checked.fetch_add(checked, Ordering::Relaxed);
        run.rma
            .slices_checked_at_end
            .fetch_add(1, Ordering::Relaxed);
        if let Some(at) = bad {
            run.rma.corrupted.fetch_add(1, Ordering::Relaxed);
            run.violations.push(format!(
                "rma corrupted: at the end, server {s} incarnation {}'s region holds {:#04x} at byte {at} of client {c}'s slice, which its writer did not leave there (client's last incarnation {})",
                e.incarnation, mine[at], sh.incarnation
            ));
        }
    }
}

/// Marks down the connections of the clients' last epochs that still
/// dial a server incarnation that is gone: one that restarted on another
/// port near the end, with no client refreshing after (over `shm` the old
/// port never comes back), as clients do during the run; or on the same
/// port, which such a session learns only when a link reaches the new
/// incarnation and names another nonce (over RDM, after the backend's
/// 10 s deadline for the old one: see docs/STRESS.md). The end must not
/// wait on a peer that is gone. Returns how many.
fn mark_down_stale(run: &Run<'_>, records: &[(usize, Arc<EpochRecord>)]) -> u64 {
    let mut stale = 0;
    for (_, rec) in records {
        let slot = &run.servers[rec.key.1 as usize];
        let target = rec.conn.target();
        let listening = slot
            .addrs
            .read()
            .expect("addrs lock")
            .0
            .iter()
            .any(|a| a.socket.port() == target.socket.port() && a.nonce == target.nonce);
        if !listening && rec.conn.state() != ConnectionState::Closed {
            rec.marked_down.store(true, Ordering::Relaxed);
            rec.conn.mark_down();
            stale += 1;
        }
    }
    stale
}

/// The run's phases and how long each took.
struct Phases {
    last: Instant,
    list: Vec<(String, f64)>,
}

impl Phases {
    fn new(start: Instant) -> Phases {
        Phases {
            last: start,
            list: Vec::new(),
        }
    }

    /// Ends the phase under way, named `name`.
    fn end(&mut self, name: &str) {
        let now = Instant::now();
        self.list.push((name.into(), secs(now - self.last)));
        self.last = now;
    }
}

fn chaos(run: &Run<'_>) {
    let cfg = run.cfg;
    let mut rng = StdRng::seed_from_u64(mix(cfg.seed, ROLE_CHAOS, 0));
    let mean = cfg.restart_every.as_millis() as u64;
    let next_restart = |rng: &mut StdRng| {
        (mean > 0).then(|| {
            Instant::now() + Duration::from_millis(rng.random_range(mean / 2..=mean * 3 / 2))
        })
    };
    let mut restart_at = next_restart(&mut rng);
    let mut fault_at = Instant::now() + Duration::from_millis(rng.random_range(50..500));
    while !run.stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(10));
        let now = Instant::now();
        if restart_at.is_some_and(|t| now >= t) {
            let s = rng.random_range(0..run.servers.len());
            let downtime = Duration::from_millis(rng.random_range(0..300));
            run.restart_server(&run.servers[s], downtime);
            restart_at = next_restart(&mut rng);
        }
        if cfg.real_faults && now >= fault_at {
            // A real fault on a random server-side connection.
            let s = rng.random_range(0..run.servers.len());
            let guard = run.servers[s].messenger.lock().expect("slot lock");
            if let Some(m) = &*guard {
                let conns = m.connections();
                if !conns.is_empty() {
                    let c = &conns[rng.random_range(0..conns.len())];
                    if m.addr().expect("bound").transport != TransportKind::Tcp
                        && rng.random_ratio(1, 20)
                    {
                        // SIMULATED (no provider or device fails a queue
                        // read on demand): every link of the server's
                        // transport that carries `c` fails at once.
                        c.simulate_fault(SimulatedFault::CqReadError);
                        *run.servers[s].cq_failed_at.lock().expect("cq lock") = Some(now);
                        run.stats.simulated_faults.fetch_add(1, Ordering::Relaxed);
                    } else {
                        c.inject_fault(if rng.random_ratio(1, 10) {
                            RealFault::HalfClose
                        } else {
                            RealFault::Abort
                        });
                        run.stats.real_faults.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            fault_at = now + Duration::from_millis(rng.random_range(50..500));
        }
    }
}

/// Whether an epoch saw anything that lets a lossless session lose messages.
fn disturbed(run: &Run<'_>, events: &ClientEvents, rec: &EpochRecord) -> bool {
    let id = rec.conn.id();
    rec.marked_down.load(Ordering::Relaxed)
        || rec.ended_disturbed.load(Ordering::Relaxed)
        || events.reset_of(id).is_some()
        || events.remote_resets_of(id) != rec.remote_resets_at_start
        || run.servers[rec.key.1 as usize]
            .generation
            .load(Ordering::SeqCst)
            != rec.generation_at_start
}

/// Runs the workload once and reports; never hangs (a watchdog ends the
/// process, after printing the seed, if the hard deadline passes).
pub fn run(cfg: &StressConfig) -> StressReport {
    let t0 = Instant::now();
    let rss_start = rss_kib();
    let threads_before = thread_count();
    let mut report = StressReport {
        seed: cfg.seed,
        backend: cfg.backend.name.clone(),
        servers: cfg.servers,
        clients: cfg.clients,
        faults: cfg.faults.as_ref().map(|p| p.to_string()),
        threads_before,
        ..StressReport::default()
    };
    // Watchdog: the whole run has a hard deadline.
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let hard = cfg.duration + cfg.drain_timeout + cfg.hard_deadline_slack;
    let seed = cfg.seed;
    let backend = cfg.backend.name.clone();
    let watchdog = std::thread::Builder::new()
        .name("stress-watchdog".into())
        .spawn(move || {
            if let Err(mpsc::RecvTimeoutError::Timeout) = done_rx.recv_timeout(hard) {
                eprintln!(
                    "\nmsgr-stress: HANG: the run (seed {seed}, backend {backend}) exceeded its hard deadline of {hard:?}; exiting"
                );
                std::process::exit(3);
            }
        })
        .expect("spawn watchdog");

    let violations = Arc::new(Violations::default());
    let pattern = Pattern::new(cfg.seed, cfg.max_message);
    let verifier = Verifier::new(pattern.clone(), violations.clone());
    let binds: Vec<EntityAddr> = if cfg.bind.is_empty() {
        vec![cfg.backend.bind_addr()]
    } else {
        cfg.bind.clone()
    };
    let servers = (0..cfg.servers)
        .map(|i| {
            let bind = binds[i % binds.len()].clone();
            ServerSlot {
                index: i as u32,
                addr: RwLock::new(bind.clone()),
                addrs: RwLock::new(msgr::AddrVec(vec![bind.clone()])),
                bind2: cfg.transport_change.then(|| {
                    let second = if bind.transport == TransportKind::Tcp {
                        "tcp://[::1]:0"
                    } else {
                        "tcp://127.0.0.1:0"
                    };
                    second.parse().expect("a loopback tcp address")
                }),
                bind,
                messenger: Mutex::new(None),
                generation: AtomicU64::new(0),
                incarnation: AtomicU64::new(0),
                dispatcher: Arc::new(ServerDispatcher {
                    index: i as u32,
                    verifier: verifier.clone(),
                }),
                rma: Mutex::new(None),
                cq_failed_at: Mutex::new(None),
            }
        })
        .collect();
    let run = Run {
        cfg,
        stop: AtomicBool::new(false),
        servers,
        pattern,
        violations: violations.clone(),
        verifier: verifier.clone(),
        stats: Stats::default(),
        retired: Mutex::new(Totals::default()),
        leaked_links: AtomicU64::new(0),
        aborted_links: AtomicU64::new(0),
        undelivered: AtomicU64::new(0),
        rma: RmaState::default(),
        keys: (cfg.messenger.session.security.modes.needs_credentials()
            && cfg.messenger.key_file.is_none())
        .then(|| RunKeys::new(cfg.servers, cfg.clients)),
    };
    for slot in &run.servers {
        match run.start_server(slot, slot.bind.clone(), slot.bind2.clone()) {
            Ok(m) => run.server_started(slot, m),
            Err(e) => violations.push(format!(
                "server {} did not start on {}: {e}",
                slot.index, slot.bind
            )),
        }
    }
    let mut client_events = Vec::new();
    let mut clients = Vec::new();
    for i in 0..cfg.clients {
        let events = Arc::new(ClientEvents::default());
        let mcfg = run.messenger_config(ROLE_CLIENT, i as u64, 0);
        let d: Arc<dyn msgr::Dispatcher> = events.clone();
        let started = cfg.placement.on_client(move || {
            Messenger::builder(EntityName::client(i as u64))
                .config(mcfg)
                .start(d)
                .map_err(|e| e.to_string())
        });
        match started {
            Ok(m) => {
                clients.push(m);
                client_events.push(events);
            }
            Err(e) => violations.push(format!("client {i} did not start: {e}")),
        }
    }

    let started = Instant::now();
    let mut phases = Phases::new(t0);
    phases.end("setup");
    let mut records: Vec<(usize, Arc<EpochRecord>)> = Vec::new();
    if violations.count() == 0 {
        std::thread::scope(|scope| {
            let run = &run;
            let mut handles = Vec::new();
            for (i, (m, ev)) in clients.iter().zip(&client_events).enumerate() {
                let policy = if cfg.lossy_every > 0 && i % cfg.lossy_every == cfg.lossy_every - 1 {
                    Policy::LossyClient
                } else {
                    Policy::LosslessClient
                };
                let client = Client {
                    run,
                    index: i as u32,
                    messenger: m,
                    events: ev,
                    policy,
                    rng: StdRng::seed_from_u64(mix(cfg.seed, ROLE_CLIENT, i as u64)),
                    links: (0..cfg.servers).map(|_| None).collect(),
                    epochs: vec![0; cfg.servers],
                    shadows: (0..cfg.servers)
                        .map(|_| Shadow::new(rma_slice(cfg)))
                        .collect(),
                    rma_seq: 0,
                };
                let h = std::thread::Builder::new()
                    .name(format!("stress-client-{i}"))
                    .spawn_scoped(scope, move || client.run())
                    .expect("spawn client");
                handles.push((i, h));
            }
            let chaos_thread = std::thread::Builder::new()
                .name("stress-chaos".into())
                .spawn_scoped(scope, move || chaos(run))
                .expect("spawn chaos");
            let mut next_progress = Instant::now() + cfg.progress_interval;
            while started.elapsed() < cfg.duration {
                std::thread::sleep(Duration::from_millis(20));
                if Instant::now() >= next_progress {
                    next_progress += cfg.progress_interval;
                    if let Some(f) = &cfg.progress {
                        f(&run.progress(&clients, started).0);
                    }
                }
            }
            run.stop.store(true, Ordering::SeqCst);
            phases.end("workload");
            for (i, h) in handles {
                match h.join() {
                    Ok(recs) => records.extend(recs.into_iter().map(|r| (i, r))),
                    Err(_) => violations.push(format!("client thread {i} panicked")),
                }
            }
            if chaos_thread.join().is_err() {
                violations.push("the chaos thread panicked".into());
            }
        });
    }
    let workload = started.elapsed();
    if phases.list.len() < 2 {
        phases.end("workload");
    }
    phases.end("stop");
    report.stale_marked_down = mark_down_stale(&run, &records);

    // Every server is up again (the chaos thread restarts what it stops).
    // Drain: every undisturbed epoch fully delivered (lossless), or fully
    // delivered or reset (lossy), within the drain timeout.
    let drain_deadline = Instant::now() + cfg.drain_timeout;
    let settled = |(c, rec): &(usize, Arc<EpochRecord>)| {
        let ev = &client_events[*c];
        let st = verifier.stream(rec.key);
        let sent = rec.sent.load(Ordering::Relaxed);
        if st.delivered == sent
            && (rec.policy == Policy::LossyClient || rec.conn.queued() == (0, 0))
        {
            return true;
        }
        disturbed(&run, ev, rec)
    };
    loop {
        let pending = records.iter().filter(|r| !settled(r)).count();
        if pending == 0 {
            break;
        }
        if Instant::now() >= drain_deadline {
            violations.push(format!(
                "drain: {pending} epoch(s) still undelivered after {:?}",
                cfg.drain_timeout
            ));
            for (c, rec) in records.iter().filter(|r| !settled(r)).take(5) {
                let slot = &run.servers[rec.key.1 as usize];
                let st = rec.conn.status();
                violations.push(format!(
                    "  undrained epoch {:?}: conn {} {:?} ({}, {} faults, the last: {}) to {} queued {:?}, sent {}, delivered {}; server now at {} (generation {} / epoch began at {}); remote resets {} / {} at start; reset {:?}",
                    rec.key,
                    rec.conn.id(),
                    st.state,
                    st.phase,
                    st.faults,
                    st.last_fault.map_or_else(|| "none".into(), |f| f.to_string()),
                    rec.conn.target(),
                    rec.conn.queued(),
                    rec.sent.load(Ordering::Relaxed),
                    verifier.stream(rec.key).delivered,
                    slot.addr.read().expect("addr lock"),
                    slot.generation.load(Ordering::SeqCst),
                    rec.generation_at_start,
                    client_events[*c].remote_resets_of(rec.conn.id()),
                    rec.remote_resets_at_start,
                    client_events[*c].reset_of(rec.conn.id()),
                ));
            }
            // What the stuck sides' transports say (refused links, setups
            // timed out, connects failed): the state of a link is not
            // visible from the session alone.
            let mut sides: Vec<(String, usize, usize)> = records
                .iter()
                .filter(|r| !settled(r))
                .map(|(c, rec)| (format!("client {c}"), *c, rec.key.1 as usize))
                .collect();
            sides.dedup();
            for (who, c, s) in sides.into_iter().take(3) {
                let client = &clients[c];
                violations.push(format!(
                    "  {who}: reconnects {}, link faults {}; transport: {}",
                    client.counters().reconnects.load(Ordering::Relaxed),
                    client.counters().link_faults.load(Ordering::Relaxed),
                    msgr::Counters::transport_prometheus(&client.transport_stats())
                        .replace('\n', "; ")
                ));
                let server = run.servers[s].messenger.lock().expect("server lock");
                if let Some(m) = server.as_ref() {
                    violations.push(format!(
                        "  server {s}: transport: {}",
                        msgr::Counters::transport_prometheus(&m.transport_stats())
                            .replace('\n', "; ")
                    ));
                }
            }
            // A worker stuck in a system call (an rdma_cm teardown waiting
            // for its peer, say) stalls every session on it.
            for t in blocked_threads() {
                violations.push(format!("  {t}"));
            }
            violations.push(format!("  TCP listeners: {}", tcp_listeners().join(" ")));
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    phases.end("drain");
    // The checks per epoch.
    for (c, rec) in &records {
        let st = verifier.stream(rec.key);
        let sent = rec.sent.load(Ordering::Relaxed);
        let dist = disturbed(&run, &client_events[*c], rec);
        let key = rec.key;
        if st.last > sent {
            violations.push(format!(
                "epoch {key:?}: delivered n={} but only {sent} were sent",
                st.last
            ));
        }
        match rec.policy {
            Policy::LossyClient => {
                report.lossy_epochs += 1;
                if st.gaps > 0 {
                    violations.push(format!(
                        "lossy epoch {key:?}: a message was lost and later ones delivered on the same connection (first gap {:?}); a lossy fault must reset the connection",
                        st.first_gap
                    ));
                }
                if st.delivered < sent && !dist {
                    violations.push(format!(
                        "lossy epoch {key:?}: {} of {sent} delivered and no reset reported",
                        st.delivered
                    ));
                }
            }
            _ if dist => report.disturbed_epochs += 1,
            _ => {
                report.exact_epochs += 1;
                if st.delivered != sent || st.last != sent || st.gaps > 0 {
                    violations.push(format!(
                        "lossless epoch {key:?} (client {c} -> server {}): sent 1..={sent}, delivered {} (last n={}, first gap {:?}) with no mark_down, reset or restart",
                        key.1, st.delivered, st.last, st.first_gap
                    ));
                }
            }
        }
    }
    report.epochs = run.stats.epochs.load(Ordering::Relaxed);
    report.disturbed_epochs += report.epochs.saturating_sub(records.len() as u64);
    drop(records);

    if cfg.rma {
        check_regions_at_end(&run);
    }
    phases.end("verify");
    // Leaks: received buffers returned, links closed, threads gone.
    let (_, totals) = run.progress(&clients, started);
    let all_held = |clients: &[Messenger]| {
        let mut worst = (0, 0);
        for m in clients {
            let h = m.rx_held();
            worst = (worst.0.max(h.0), worst.1.max(h.1));
        }
        for s in &run.servers {
            if let Some(m) = &*s.messenger.lock().expect("slot lock") {
                let h = m.rx_held();
                worst = (worst.0.max(h.0), worst.1.max(h.1));
            }
        }
        worst
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut held = all_held(&clients);
    while held != (0, 0) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
        held = all_held(&clients);
    }
    report.rx_held_end = held;
    phases.end("rx_held");
    if held != (0, 0) {
        violations.push(format!("rx buffers still held at the end: {held:?}"));
    }
    let unexpected: u64 = client_events
        .iter()
        .map(|e| e.unexpected.load(Ordering::Relaxed))
        .sum();
    if unexpected > 0 {
        violations.push(format!(
            "clients received {unexpected} message(s) nobody sent them"
        ));
    }
    report.client_resets = client_events
        .iter()
        .map(|e| e.reset_count.load(Ordering::Relaxed))
        .sum();
    report.remote_resets = client_events
        .iter()
        .map(|e| e.remote_reset_count.load(Ordering::Relaxed))
        .sum();
    // All at once: each has its own 5 s deadline, and one after another
    // a few slow ones would add up.
    let shut: Vec<(msgr::ShutdownReport, Duration)> = std::thread::scope(|scope| {
        let handles: Vec<_> = clients
            .drain(..)
            .map(|mut m| {
                scope.spawn(move || {
                    let one = Instant::now();
                    (m.shutdown(Duration::from_secs(5)), one.elapsed())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("client shutdown thread"))
            .collect()
    });
    let mut slowest = Duration::ZERO;
    for (r, took) in shut {
        slowest = slowest.max(took);
        report.shutdown_undelivered += r.undelivered;
        report.leaked_links += r.leaked_links;
        report.aborted_links += r.aborted_links;
        if r.leaked_links != 0 {
            violations.push(format!("client shutdown leaked {} link(s)", r.leaked_links));
        }
    }
    phases.end("client_shutdown");
    let servers_took: Vec<Duration> = std::thread::scope(|scope| {
        let handles: Vec<_> = run
            .servers
            .iter()
            .filter_map(|s| {
                let m = s.messenger.lock().expect("slot lock").take()?;
                Some((s, m, s.rma.lock().expect("rma lock").take()))
            })
            .map(|(s, m, exposed)| {
                let run = &run;
                scope.spawn(move || {
                    let one = Instant::now();
                    run.retire(s, m, exposed);
                    one.elapsed()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("server shutdown thread"))
            .collect()
    });
    slowest = servers_took.into_iter().fold(slowest, Duration::max);
    phases.end("server_shutdown");
    if cfg.rma {
        let mut r = super::RmaReport::default();
        run.rma.account(&violations, &mut r);
        report.rma = Some(r);
    }
    report.leaked_links += run.leaked_links.load(Ordering::Relaxed) as usize;
    report.aborted_links += run.aborted_links.load(Ordering::Relaxed) as usize;
    report.shutdown_undelivered += run.undelivered.load(Ordering::Relaxed);
    drop(client_events);
    drop(done_tx);
    let _ = watchdog.join();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut threads_after = thread_count();
    while threads_after > threads_before && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        threads_after = thread_count();
    }
    report.threads_after = threads_after;
    phases.end("threads");
    report.phases = phases.list;
    report.slowest_shutdown_s = secs(slowest);
    if threads_after > threads_before {
        violations.push(format!(
            "threads leaked: {threads_before} before the run, {threads_after} after"
        ));
    }

    let st = &run.stats;
    report.workload_s = secs(workload);
    report.sent_messages = st.sent.load(Ordering::Relaxed);
    report.sent_bytes = st.sent_bytes.load(Ordering::Relaxed);
    report.large_messages = st.large.load(Ordering::Relaxed);
    report.delivered_messages = verifier.delivered.load(Ordering::Relaxed);
    report.delivered_bytes = verifier.delivered_bytes.load(Ordering::Relaxed);
    let w = secs(workload).max(1e-3);
    report.msgs_per_s = report.delivered_messages as f64 / w;
    report.mib_per_s = report.delivered_bytes as f64 / (1 << 20) as f64 / w;
    report.injected_faults = totals.injected_faults;
    report.reconnects = totals.reconnects;
    report.replayed_messages = totals.replayed_messages;
    report.transport_changes = totals.transport_changes;
    report.link_faults = totals.link_faults;
    report.protocol_errors = totals.protocol_errors;
    report.keepalive_timeouts = totals.keepalive_timeouts;
    report.duplicates_dropped = totals.duplicates_dropped;
    report.queue_full = totals.send_queue_full;
    report.server_resets = verifier.server_resets.load(Ordering::Relaxed);
    report.mark_downs = st.mark_downs.load(Ordering::Relaxed);
    report.server_restarts = st.restarts.load(Ordering::Relaxed);
    report.real_faults = st.real_faults.load(Ordering::Relaxed);
    report.simulated_faults = st.simulated_faults.load(Ordering::Relaxed);
    report.rss_kib = (rss_start, rss_kib());
    report.total_s = secs(t0.elapsed());
    report.violation_count = violations.count();
    report.violations = violations.list();
    report
}
