//! A worker: one thread, one mio event loop, the sessions it owns and the
//! transports that carry them.
//!
//! Each turn: take commands, poll readiness (busy-polling for a window after
//! activity, then blocking until the next timer), feed transport events to the
//! session engines, fire timers, drive the engines (transmit, deliver), flush.
//! Sessions are sharded over workers by peer address; a link accepted by one
//! worker moves to the owner of its session once the peer said hello.
//!
//! # What each message still costs, and why
//!
//! Small messages travel in batch frames (`msgr_proto::batch`): the
//! preamble, CRC32C calls, transport unit and receive-throttle guard are
//! paid per batch. Per message there remain:
//! - sending (`Connection::send`, on the application's thread or a
//!   callback's): the limit check, the connection's pending lock, the
//!   queue admission — from a room credit: what the worker released and
//!   the bounds are looked at when the credit runs out, about once per
//!   batch — and the message's encoding right there, as an entry of the
//!   batch the connection keeps open (`msgr_proto::session::EncodedBatch`:
//!   the entry head and a copy of the payload; the `Message` is dropped
//!   on the sender's thread). The first send after the worker took the
//!   connection's queue hands it one `Command::Flush` (on this worker's
//!   thread a push to the thread-local command list, else the channel and
//!   at most one wake-up); later sends only add to what it takes. The
//!   worker gives the session each batch whole (`Session::send_encoded`,
//!   which numbers its entries: a batch's sequence numbers are its base
//!   and their order), so no command, move or session call per message;
//! - in the session: nothing per message. The encoded batches are what
//!   is transmitted and what is kept for replay until acknowledged
//!   (Zenoh's `WBatch`); a window, a partial acknowledgement or the
//!   peer's limits cut a batch by walking its entries' heads, which the
//!   common path never does. Its share of the CRC32C pass;
//! - receiving: the entry's parse, a view of the received buffer for its
//!   payload (one reference count), the sequence check, and
//!   [`deliver`]'s call of `Dispatcher::on_message` from [`Worker::drive`]'s
//!   loop (messages come out of `Session::poll_message`, apart from the
//!   session's events).
//!
//! By callgrind (`BURST=64 scripts/instructions.sh tcp`, 64 B, LTO off,
//! docs/BENCHMARKS.md) the sender's 536 instructions a message (935
//! before the encoding moved to `Connection::send`) go: ~125 to the
//! entry (`append_entry`: the head, the room and capacity checks, two
//! appends) and ~40 to `memcpy` (the payload's copy), ~70 to
//! `Connection::send` itself (the closed check, the lock, the
//! admission), ~50 to `Pending::encode` (is it batchable, the same
//! limits, room), ~30 to dropping the `Message`, ~25 to the limit check
//! and the unlock, ~110 to the measuring tool's own message
//! construction, and ~90 to CRC32C and what is paid per batch (the
//! write, the worker's turn, the session's `send_encoded`). The next
//! steps below 400: a send that borrows its message (no `Message` to
//! build, move or drop per send), and an entry writer that checks the
//! batch's room once instead of `BytesMut`'s capacity per append.
//!
//! No allocation or channel per message; one uncontended lock per send
//! (the connection's pending queue, shared by senders on any thread, which
//! also orders them: a callback's sends and another thread's cannot
//! overtake one another).

mod admission;
pub(crate) mod affinity;
mod command;
mod native_rma;
mod spin;

use std::collections::VecDeque;
use std::net::IpAddr;

use rustc_hash::{FxHashMap, FxHashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use mio::{Events, Poll, Token, Waker};
use msgr_addr::EntityAddr;
use msgr_backends::{
    open_transport, AnyTransport, RealFault, Transport, TransportError, TransportEvent,
};
use msgr_proto::{
    message::REPLY_BIT, rma::RMA_BIT, session::Hello, Banner, FaultReason, Inbound, LinkFailure,
    LinkId, Message, Session, SessionEvent, SessionStats, Tag, Takeover, Transmit,
};
use rand::{rngs::StdRng, Rng, SeedableRng};

use admission::{admit, Admit, PendingLink, WaitingLink, WaitingLinks, WAITING_PER_SLOT};
use command::Adoption;
pub(crate) use command::{Command, LinkFault, WorkerStats};

use crate::connection::{Connection, ConnectionState, LocalWorker, Outgoing, LOCAL_WORKER};
use crate::counters::Counters;
use crate::dispatcher::{guarded, Panicked};
use crate::faults::{FaultAction, FaultInjector};
use crate::messenger::Shared;

/// Stop pulling frames from a session while its link holds this much unsent.
const TX_HIGH_WATER: usize = 4 << 20;
/// ... and continue once it is below this.
const TX_LOW_WATER: usize = 1 << 20;

/// The token of each worker's waker.
pub(crate) const WAKER_TOKEN: Token = Token(usize::MAX);

/// How other threads reach a worker.
pub(crate) struct WorkerHandle {
    tx: Sender<Command>,
    waker: Arc<Waker>,
    sleeping: Arc<AtomicBool>,
    /// Set if the worker's thread died of a panic (a bug in msgr or a
    /// backend): its sessions are gone, and sends to them fail.
    dead: Arc<AtomicBool>,
}

impl WorkerHandle {
    /// Queues a command and wakes the worker if it is blocked.
    pub(crate) fn submit(&self, cmd: Command) {
        let sent = self.tx.send(cmd).is_ok();
        // Pairs with the fence in the worker's loop: either it sees our
        // command, or we see it asleep (the channel's own orderings are weaker).
        std::sync::atomic::fence(Ordering::SeqCst);
        if sent && self.sleeping.load(Ordering::SeqCst) {
            let _ = self.waker.wake();
        }
    }

    /// Whether no command is waiting in the channel.
    pub(crate) fn is_idle(&self) -> bool {
        self.tx.is_empty()
    }

    /// Whether the worker's thread died ([`run_guarded`]).
    pub(crate) fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    pub(crate) fn dead_flag(&self) -> Arc<AtomicBool> {
        self.dead.clone()
    }

    pub(crate) fn waker(&self) -> Arc<Waker> {
        self.waker.clone()
    }
}

/// What a worker reports when it stops.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct WorkerReport {
    pub(crate) undelivered: u64,
    pub(crate) forced: usize,
    pub(crate) leaked_links: usize,
    /// Links still closing (writing their last output after their session
    /// had ended) at the deadline, aborted.
    pub(crate) aborted_links: usize,
    /// The worker's thread died of a panic ([`run_guarded`]).
    pub(crate) died: bool,
}

/// Runs a worker's loop, catching a panic that escapes it (a bug: the
/// dispatcher's own panics are caught per callback): the worker is marked
/// dead so that sends to its sessions fail with
/// `SendError::WorkerStopped`, the death is counted (`worker_deaths`) and
/// logged, and the shutdown report says so. Its sessions are lost with it.
pub(crate) fn run_guarded(
    idx: usize,
    dead: &AtomicBool,
    deaths: &std::sync::atomic::AtomicU64,
    on_death: impl FnOnce(),
    run: impl FnOnce() -> WorkerReport,
) -> WorkerReport {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)) {
        Ok(report) => report,
        Err(payload) => {
            dead.store(true, Ordering::Release);
            on_death();
            deaths.fetch_add(1, Ordering::Relaxed);
            let why = crate::dispatcher::panic_message(payload.as_ref());
            tracing::error!(worker = idx, panic = %why, "a messenger worker thread died; its sessions are lost");
            LOCAL_WORKER.with(|l| *l.borrow_mut() = None);
            WorkerReport {
                died: true,
                ..WorkerReport::default()
            }
        }
    }
}

/// Which peer a session belongs to, for routing: the address without its nonce
/// (a restarted peer is the same peer), unless it does not listen (port 0),
/// where only the nonce tells clients apart.
pub(crate) fn peer_key(addr: &EntityAddr) -> EntityAddr {
    if addr.socket.port() == 0 {
        addr.clone()
    } else {
        addr.clone().with_nonce(0)
    }
}

/// The worker that owns sessions with `key`.
pub(crate) fn owner_of(key: &EntityAddr, workers: usize) -> usize {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut h);
    (h.finish() % workers as u64) as usize
}

struct Slot {
    session: Session,
    conn: Connection,
    transport: usize,
    accepted: bool,
    seen: SessionStats,
    /// The phase last published to the connection's status.
    seen_phase: &'static str,
    /// Keys of the peer's regions for native reads ([`native_rma`]).
    rma_keys: native_rma::RegionKeys,
    /// Messages and bytes the application queued that left as native
    /// reads, not through the session: released as the session's are.
    bypassed: [u64; 2],
    /// The deadline of this session's live entry in the worker's
    /// `session_timers`, if it has one.
    armed: Option<Instant>,
}

#[derive(Clone, Copy)]
enum Owner {
    Session(u64),
    Pending,
    /// Waiting, unread, for a handshake slot (admission module).
    Waiting,
}

struct LinkEntry {
    transport: usize,
    owner: Owner,
}

pub(crate) struct Worker {
    idx: usize,
    shared: Arc<Shared>,
    poll: Poll,
    rx: Receiver<Command>,
    sleeping: Arc<AtomicBool>,
    transports: Vec<AnyTransport>,
    listeners: Vec<(usize, Token)>,
    /// Boxed: a slot is ~1.8 KB and a table keeps an eighth or more of
    /// its buckets empty (up to half after it grows): 16 B each, not a
    /// slot's size (issue 52: 10,000 sessions).
    sessions: FxHashMap<u64, Box<Slot>>,
    /// Keyed by what peers say about themselves: keep std's DoS-resistant hash.
    by_peer: std::collections::HashMap<EntityAddr, u64>,
    links: FxHashMap<LinkId, LinkEntry>,
    pending: FxHashMap<LinkId, PendingLink>,
    /// Accepted links waiting for room in `pending`.
    waiting: WaitingLinks,
    /// Passes of the event loop so far (handshake admission counts them).
    passes: u64,
    tevents: Vec<TransportEvent>,
    touched: Vec<u64>,
    /// Emptied vectors kept for their memory: the sessions being driven
    /// and the dispatcher callbacks' commands being handled swap with
    /// these, so a message does not allocate for the bookkeeping.
    touched_spare: Vec<u64>,
    commands_spare: Vec<Command>,
    rng: StdRng,
    next_timer: Option<Instant>,
    /// Sessions' timer deadlines, earliest first: (when, session key). An
    /// entry is live while its slot's `armed` holds its time; one left
    /// behind when a session's deadline moved earlier is skipped when it
    /// comes up. Firing timers looks at the sessions due, not at every
    /// session: 10,000 idle ones fire a keepalive each every 2 s, and a
    /// scan of all of them per firing took 60% of a core (issue 52).
    session_timers: std::collections::BinaryHeap<std::cmp::Reverse<(Instant, u64)>>,
    /// The loop's clock: read once per pass (after the poll returns, and
    /// before computing how long to block), not per step. A pass takes
    /// microseconds, far below any timer's resolution, and a clock read is
    /// not free everywhere (a system call where the clocksource has no vDSO
    /// path, as HPET in a TCG guest).
    now: Instant,
    shutdown: Option<Instant>,
    rx_paused: bool,
    report: WorkerReport,
    faults: Option<FaultInjector>,
    /// Units held back by an injected delay, per link, in order.
    held: FxHashMap<LinkId, (Instant, VecDeque<(Transmit, FaultAction)>)>,
    outbox: Vec<(LinkId, Transmit)>,
    /// Async calls' deadlines: (when, session key, call id), earliest first.
    call_deadlines: std::collections::BinaryHeap<std::cmp::Reverse<(Instant, u64, u64)>>,
    /// Sessions with output waiting for their link to drain.
    blocked: FxHashSet<u64>,
    /// Native reads and writes of peers' regions in flight, by call id.
    native_ops: FxHashMap<u64, native_rma::NativeOp>,
    /// An emptied list of what sends queued, for the next connection's
    /// turn ([`Worker::take_pending`]): no allocation per batch.
    spare_outgoing: Vec<Outgoing>,
}

impl Worker {
    /// Creates a worker's poll, channel and waker; the loop runs in [`Worker::run`].
    pub(crate) fn prepare(
    ) -> std::io::Result<(Poll, WorkerHandle, Receiver<Command>, Arc<AtomicBool>)> {
        let poll = Poll::new()?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER_TOKEN)?);
        let (tx, rx) = crossbeam_channel::unbounded();
        let sleeping = Arc::new(AtomicBool::new(false));
        Ok((
            poll,
            WorkerHandle {
                tx,
                waker,
                dead: Arc::new(AtomicBool::new(false)),
                sleeping: sleeping.clone(),
            },
            rx,
            sleeping,
        ))
    }

    pub(crate) fn new(
        idx: usize,
        shared: Arc<Shared>,
        poll: Poll,
        rx: Receiver<Command>,
        sleeping: Arc<AtomicBool>,
        transports: Vec<AnyTransport>,
        listeners: Vec<(usize, Token)>,
    ) -> Worker {
        let faults_plan = shared.cfg.faults.clone();
        Worker {
            idx,
            shared,
            poll,
            rx,
            sleeping,
            transports,
            listeners,
            sessions: FxHashMap::default(),
            by_peer: std::collections::HashMap::new(),
            links: FxHashMap::default(),
            pending: FxHashMap::default(),
            waiting: WaitingLinks::default(),
            passes: 0,
            tevents: Vec::new(),
            touched: Vec::new(),
            touched_spare: Vec::new(),
            commands_spare: Vec::new(),
            rng: StdRng::from_os_rng(),
            next_timer: None,
            session_timers: Default::default(),
            now: Instant::now(),
            shutdown: None,
            rx_paused: false,
            report: WorkerReport::default(),
            faults: faults_plan.map(|p| FaultInjector::new(p, idx)),
            held: FxHashMap::default(),
            outbox: Vec::new(),
            call_deadlines: Default::default(),
            blocked: FxHashSet::default(),
            native_ops: FxHashMap::default(),
            spare_outgoing: Vec::new(),
        }
    }

    /// The transport serving `addr`, opened on first use (a backend that
    /// cannot run here says why).
    fn transport_for(&mut self, addr: &EntityAddr) -> Result<usize, TransportError> {
        if let Some(t) = self
            .transports
            .iter()
            .position(|t| t.kind() == addr.transport)
        {
            return Ok(t);
        }
        let ctx = msgr_backends::TransportContext {
            waker: Some(self.shared.workers[self.idx].waker()),
            ..self.shared.transport_ctx.clone()
        };
        let t = open_transport(&addr.transport, self.poll.registry(), &ctx)?;
        self.transports.push(t);
        Ok(self.transports.len() - 1)
    }

    /// The event loop; returns when shut down and drained (or past the deadline).
    pub(crate) fn run(mut self) -> WorkerReport {
        LOCAL_WORKER.with(|l| *l.borrow_mut() = Some(LocalWorker::new(self.shared.id, self.idx)));
        let mut events = Events::with_capacity(1024);
        let mut busy =
            spin::BusyWindow::new(self.shared.cfg.busy_poll, self.shared.cfg.busy_poll_max);
        // Which spinning passes call `epoll_wait` and `sched_yield`.
        let mut pacer = spin::SpinPacer::from_setting(self.shared.cfg.busy_poll_syscall_every);
        // Pinned (or run under `taskset -c N`), the scheduler cannot move
        // this thread off a CPU a busy thread shares (spin module docs).
        let mut shared_cpu = spin::SharedCpu::new(affinity::allowed_cpus().len() == 1);
        self.now = Instant::now();
        let mut last_activity = self.now;
        let mut pass: u32 = 0;
        loop {
            pass = pass.wrapping_add(1);
            self.passes += 1;
            let mut active = self.take_commands();
            let commanded = active;
            let moved_before = self.messages_moved();
            if active {
                // Commands touch sessions: do that work before any blocking poll.
                self.drive_touched();
                self.flush_transports();
            }
            if self.finished(self.now) {
                break;
            }
            let spinning =
                self.now.duration_since(last_activity) < busy.get() && !shared_cpu.paused(self.now);
            let timeout = if spinning {
                if !active && pacer.yield_now(self.now, pass) {
                    // Spinning without work: let a thread that shares our
                    // core run (on an oversubscribed machine it may be the
                    // one we are waiting for).
                    let before = Instant::now();
                    std::thread::yield_now();
                    let after = Instant::now();
                    pacer.yielded(after - before, after);
                    // Sleeping is prompt only where every transport's
                    // arrivals wake the worker; a polled one keeps spinning.
                    let can_sleep = self.transports.iter().all(|t| t.wakes_the_worker());
                    if can_sleep && shared_cpu.yielded(after - before, after) {
                        Counters::add(&self.shared.counters.spin_pauses, 1);
                        tracing::debug!(
                            worker = self.idx,
                            yield_us = (after - before).as_micros() as u64,
                            "a busy thread shares this worker's only CPU: sleeping, not spinning, for a while"
                        );
                    }
                }
                Some(Duration::ZERO)
            } else {
                // About to block: announce it, then look once more for work that
                // arrived meanwhile (the "poll again after arming" rule), so a
                // command or completion is never stranded while we sleep.
                self.sleeping.store(true, Ordering::SeqCst);
                std::sync::atomic::fence(Ordering::SeqCst);
                if !self.rx.is_empty()
                    || self.progress_transports()
                    || !self.touched.is_empty()
                    || !self.arm_transports()
                {
                    Some(Duration::ZERO)
                } else {
                    // Clock read after `wake_at`: a transport that asks to
                    // be polled "now" read the clock itself, later than any
                    // earlier reading here, and a positive remainder of a few
                    // nanoseconds would become a whole millisecond in epoll.
                    let wake = self.transports.iter().filter_map(|t| t.wake_at()).min();
                    self.now = Instant::now();
                    let until = match (self.next_timer, wake) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                    until.map(|t| t.saturating_duration_since(self.now))
                }
            };
            // While spinning, epoll paced by its price unless a transport
            // needs it every pass (see `Transport::ready_every_pass`).
            let needed = !spinning || self.transports.iter().any(|t| t.ready_every_pass());
            let ask_poll = needed || pacer.poll_now(self.now, pass);
            // A paced call is timed: its price sets the pace.
            let paced_since = (!needed && ask_poll && pacer.adapts()).then(Instant::now);
            if !ask_poll {
                events.clear();
            } else if let Err(e) = self.poll.poll(&mut events, timeout) {
                if e.kind() != std::io::ErrorKind::Interrupted {
                    tracing::error!(error = %e, "poll failed; worker stops");
                    break;
                }
            }
            self.sleeping.store(false, Ordering::SeqCst);
            self.now = Instant::now();
            if let Some(since) = paced_since {
                pacer.polled(self.now - since, self.now);
            }
            for ev in events.iter() {
                if ev.token() == WAKER_TOKEN {
                    continue;
                }
                active = true;
                if let Some(t) = self.transports.iter_mut().find(|t| t.owns(ev.token())) {
                    t.ready(ev, self.now, &mut self.tevents);
                }
            }
            active |= self.progress_transports();
            active |= !self.tevents.is_empty();
            self.handle_transport_events();
            self.fire_timers(self.now);
            self.admit_waiting(self.now);
            self.release_held(self.now);
            self.drive_touched();
            self.flush_transports();
            self.check_throttle();
            // Only traffic the application sees opens the busy window: a
            // keepalive or an ack has no reply coming soon to spin for, and
            // 10,000 idle sessions' keepalives (5,000 a second) kept a
            // server's worker spinning half the time (issue 52).
            if active && (commanded || self.messages_moved() != moved_before) {
                busy.activity_after(self.now.saturating_duration_since(last_activity));
                last_activity = self.now;
            }
        }
        self.stop()
    }

    /// Messages this messenger sent and received so far.
    fn messages_moved(&self) -> u64 {
        let c = &self.shared.counters;
        Counters::get(&c.tx_messages) + Counters::get(&c.rx_messages)
    }

    fn progress_transports(&mut self) -> bool {
        let mut any = false;
        for t in &mut self.transports {
            any |= t.progress(self.now, &mut self.tevents);
        }
        if any {
            self.handle_transport_events();
        }
        any
    }

    /// Arms every transport's wait objects before blocking; false as soon as
    /// one has something pending already (the worker will not block, and
    /// arms the rest next time).
    fn arm_transports(&mut self) -> bool {
        self.transports.iter_mut().all(|t| t.arm())
    }

    fn flush_transports(&mut self) {
        loop {
            for t in &mut self.transports {
                t.flush(self.now, &mut self.tevents);
            }
            let unblocked = self.unblock_sessions();
            if self.tevents.is_empty() && !unblocked {
                return;
            }
            self.handle_transport_events();
            self.drive_touched();
        }
    }

    /// Sessions held back by a backed-up link continue once it has drained
    /// below the low-water mark. Returns whether any did.
    fn unblock_sessions(&mut self) -> bool {
        if self.blocked.is_empty() {
            return false;
        }
        let mut any = false;
        let keys: Vec<u64> = self.blocked.iter().copied().collect();
        for key in keys {
            let backlog = match self.sessions.get(&key) {
                Some(slot) => match slot.session.link() {
                    Some(l) => self.transports[slot.transport].backlog(l),
                    None => 0,
                },
                None => 0,
            };
            if backlog < TX_LOW_WATER {
                self.blocked.remove(&key);
                self.touch(key);
                any = true;
            }
        }
        any
    }

    /// Shut down, and nothing left to wait for: no session, no pending
    /// link, and no link still writing its last output after its session
    /// closed it with a flush (a Close frame, what a marked-down session
    /// had handed over) — or the deadline has passed.
    fn finished(&self, now: Instant) -> bool {
        match self.shutdown {
            Some(deadline) => {
                now >= deadline
                    || (self.sessions.is_empty()
                        && self.pending.is_empty()
                        && self.transports.iter().all(|t| t.closing_links() == 0))
            }
            None => false,
        }
    }

    fn stop(mut self) -> WorkerReport {
        let now = Instant::now();
        let keys: Vec<u64> = self.sessions.keys().copied().collect();
        self.report.forced = keys.len();
        for k in keys {
            if let Some(s) = self.sessions.get_mut(&k) {
                // Why it did not end in time: what it was doing, and what
                // it still held.
                tracing::info!(
                    worker = self.idx,
                    peer = %s.conn.inner.target,
                    phase = s.session.phase(),
                    queued = s.session.queued_messages(),
                    attempts = s.session.failed_attempts(),
                    last_fault = %s.session.last_fault().map_or_else(String::new, |f| f.to_string()),
                    "session still open at the shutdown deadline: marked down"
                );
                s.session.mark_down(now);
            }
            self.touch(k);
        }
        self.drive_touched();
        for (link, _) in self.pending.drain() {
            if let Some(e) = self.links.get(&link) {
                self.transports[e.transport].close(link, false);
            }
        }
        for (link, e) in self.links.drain() {
            self.transports[e.transport].close(link, false);
        }
        // Links still closing after a flush: those whose peer did not take
        // their last output by the deadline, and those the forced sessions
        // above just closed. Aborted and counted, so that none outlives the
        // worker unseen.
        self.report.aborted_links = self.transports.iter_mut().map(|t| t.abort_closing()).sum();
        if self.report.aborted_links > 0 {
            tracing::info!(
                worker = self.idx,
                links = self.report.aborted_links,
                "links still closing at the shutdown deadline aborted"
            );
        }
        for (t, token) in std::mem::take(&mut self.listeners) {
            self.transports[t].unlisten(token);
        }
        self.report.leaked_links = self.transports.iter().map(|t| t.link_count()).sum();
        LOCAL_WORKER.with(|l| *l.borrow_mut() = None);
        self.report
    }

    // ---- commands -----------------------------------------------------------

    fn take_commands(&mut self) -> bool {
        let mut any = false;
        let now = self.now;
        while let Ok(cmd) = self.rx.try_recv() {
            any = true;
            self.handle_command(cmd, now);
        }
        any | self.take_local_commands()
    }

    /// Commands issued by dispatcher callbacks on this thread.
    fn take_local_commands(&mut self) -> bool {
        let mut any = false;
        loop {
            // Looked at several times per message and mostly empty: a
            // glance first, the swap only when there is something.
            let queued =
                LOCAL_WORKER.with(|l| l.borrow().as_ref().is_some_and(|w| !w.commands.is_empty()));
            if !queued {
                return any;
            }
            let spare = std::mem::take(&mut self.commands_spare);
            let mut cmds = LOCAL_WORKER.with(|l| match &mut *l.borrow_mut() {
                Some(w) => std::mem::replace(&mut w.commands, spare),
                None => spare,
            });
            if cmds.is_empty() {
                self.commands_spare = cmds;
                return any;
            }
            any = true;
            let now = self.now;
            for c in cmds.drain(..) {
                self.handle_command(c, now);
            }
            self.commands_spare = cmds;
        }
    }

    fn handle_command(&mut self, cmd: Command, now: Instant) {
        match cmd {
            Command::Connect { conn } => self.start_connect(conn, now),
            Command::Unbind { token, kind } => {
                if let Some(token) = token {
                    if let Some(i) = self.listeners.iter().position(|(_, tok)| *tok == token) {
                        let (t, token) = self.listeners.remove(i);
                        self.transports[t].unlisten(token);
                    }
                }
                let gone: Vec<(LinkId, usize)> = self
                    .links
                    .iter()
                    .filter(|(_, e)| self.transports[e.transport].kind() == kind)
                    .map(|(l, e)| (*l, e.transport))
                    .collect();
                for (link, t) in gone {
                    if let Err(e) = self.transports[t].inject(link, RealFault::Abort) {
                        tracing::debug!(error = %e, "closing a link of an unbound transport");
                    }
                }
            }
            Command::CallDeadline { key, id, at } => {
                self.call_deadlines.push(std::cmp::Reverse((at, key, id)));
                self.next_timer = Some(self.next_timer.map_or(at, |n| n.min(at)));
            }
            Command::Flush { conn } => self.take_pending(&conn),
            Command::MarkDown { key } => {
                if let Some(slot) = self.sessions.get_mut(&key) {
                    slot.session.mark_down(now);
                    self.touch(key);
                }
            }
            Command::Close { key } => {
                if let Some(slot) = self.sessions.get_mut(&key) {
                    slot.session.close(now);
                    self.touch(key);
                }
            }
            Command::Inject { key, fault } => {
                if let Some(link) = self.sessions.get(&key).and_then(|s| s.session.link()) {
                    if let Some(e) = self.links.get(&link) {
                        Counters::add(&self.shared.counters.injected_faults, 1);
                        let transport = &mut self.transports[e.transport];
                        let done = match fault {
                            LinkFault::Real(f) => transport.inject(link, f),
                            LinkFault::Simulated(f) => transport.simulate(link, f),
                        };
                        if let Err(err) = done {
                            tracing::debug!(error = %err, "fault injection failed");
                        }
                    }
                }
            }
            Command::RmaRevoke { region } => {
                for t in &mut self.transports {
                    t.rma_unexpose(region);
                }
            }
            Command::Stats { reply } => {
                // The session engine lives in its slot: `memory_bytes`
                // counts its size too, so it is taken off here.
                let slots = self.sessions.values().map(|s| {
                    std::mem::size_of::<Slot>() - std::mem::size_of::<Session>()
                        + crate::connection::handle_bytes()
                        + s.conn.inner.pending.lock().memory_bytes()
                        + s.session.memory_bytes()
                });
                let table = self.sessions.capacity() * std::mem::size_of::<(u64, Box<Slot>)>();
                let pending = self.pending.values().map(|p| p.session.memory_bytes());
                let timers = self.session_timers.capacity()
                    * std::mem::size_of::<std::cmp::Reverse<(Instant, u64)>>();
                let _ = reply.send(WorkerStats {
                    transports: self.transports.iter().map(|t| t.stats()).collect(),
                    sessions: self.sessions.len() + self.pending.len(),
                    session_bytes: table + timers + slots.chain(pending).sum::<usize>(),
                });
            }
            Command::Adopt(adoption) => {
                let Adoption {
                    link,
                    detached,
                    session,
                    hello,
                    transport,
                } = *adoption;
                let Some(t) = self.transports.iter().position(|x| x.kind() == transport) else {
                    return;
                };
                if self.transports[t].attach(link, detached).is_ok() {
                    self.links.insert(
                        link,
                        LinkEntry {
                            transport: t,
                            owner: Owner::Pending,
                        },
                    );
                    self.route_local(link, t, session, hello, now);
                }
            }
            Command::Shutdown { deadline } => {
                for (t, token) in std::mem::take(&mut self.listeners) {
                    self.transports[t].unlisten(token);
                }
                let keys: Vec<u64> = self.sessions.keys().copied().collect();
                for k in keys {
                    if let Some(s) = self.sessions.get_mut(&k) {
                        s.session.close(now);
                    }
                    self.touch(k);
                }
                let waiting: Vec<LinkId> = self.waiting.drain().map(|(l, _)| l).collect();
                for link in self.pending.drain().map(|(l, _)| l).chain(waiting) {
                    if let Some(e) = self.links.remove(&link) {
                        self.transports[e.transport].close(link, false);
                    }
                }
                self.shutdown = Some(deadline);
                self.next_timer = Some(self.next_timer.map_or(deadline, |t| t.min(deadline)));
            }
        }
    }

    /// Hands what `Connection::send` queued on `conn` to its session:
    /// encoded batches whole, other messages as [`Worker::queue_messages`]
    /// does.
    fn take_pending(&mut self, conn: &Connection) {
        let mut items = std::mem::take(&mut self.spare_outgoing);
        conn.inner.pending.lock().take(&mut items);
        let key = conn.inner.key;
        for item in items.drain(..) {
            match item {
                Outgoing::Batch(batch) => {
                    let n = u64::from(batch.count());
                    let sent = match self.sessions.get_mut(&key) {
                        Some(slot) => slot.session.send_encoded(batch).map(drop),
                        None => Err(msgr_proto::SendError::Closed),
                    };
                    if let Err(e) = sent {
                        // The handle's own bound makes this unreachable
                        // unless the session closed meanwhile.
                        tracing::debug!(error = %e, "send refused by session");
                        Counters::add(&self.shared.counters.messages_dropped, n);
                    }
                }
                Outgoing::Message(msg) => self.queue_messages(key, std::iter::once(msg)),
            }
        }
        self.spare_outgoing = items;
        self.touch(key);
    }

    /// Hands application messages to their session.
    fn queue_messages(&mut self, key: u64, msgs: impl IntoIterator<Item = Message>) {
        let Some(slot) = self.sessions.get_mut(&key) else {
            let n = msgs.into_iter().count() as u64;
            Counters::add(&self.shared.counters.messages_dropped, n);
            return;
        };
        for msg in msgs {
            let msg = if msg.call & RMA_BIT != 0 {
                let (transports, links) = (&mut self.transports, &self.links);
                let native = &mut self.native_ops;
                match native_rma::try_native((key, &mut *slot), msg, transports, links, native) {
                    Ok(()) => continue,
                    Err(msg) => msg,
                }
            } else {
                msg
            };
            match slot.session.send(msg) {
                Ok(_) => {}
                // The handle checked the limits it knew; the peer's came
                // with the handshake in between. Not a silent drop: the
                // session ends and on_reset says why.
                Err(msgr_proto::SendError::TooLarge(t)) => {
                    slot.session.abort(FaultReason::TooLarge(t));
                    Counters::add(&self.shared.counters.messages_dropped, 1);
                }
                Err(e) => {
                    // The handle's own bound makes this unreachable unless
                    // the session closed meanwhile; account for the message.
                    tracing::debug!(error = %e, "send refused by session");
                    Counters::add(&self.shared.counters.messages_dropped, 1);
                }
            }
        }
        self.touch(key);
    }

    fn start_connect(&mut self, conn: Connection, now: Instant) {
        let key = conn.inner.key;
        if self.sessions.contains_key(&key) {
            return;
        }
        let t = match self.transport_for(&conn.inner.target) {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(error = %e, target = %conn.inner.target, "cannot connect");
                conn.set_state(ConnectionState::Closed);
                let reason = FaultReason::Transport(e.link_failure());
                let _ = self.callback(&conn, || "on_reset".into(), |d, c| d.on_reset(c, &reason));
                return;
            }
        };
        let mut session = Session::connect(
            self.shared.cfg.session.clone(),
            self.shared.local.clone(),
            conn.inner.target.clone(),
            conn.inner.policy,
            now,
        );
        if let Some(name) = &conn.inner.expected {
            session.expect_peer(name.clone());
        }
        let alternates = conn.inner.alternates.lock().clone();
        if !alternates.is_empty() {
            session.set_alternates(alternates);
        }
        self.by_peer.insert(peer_key(&conn.inner.target), key);
        Counters::add(&self.shared.counters.sessions_active, 1);
        self.sessions.insert(
            key,
            Box::new(Slot {
                session,
                conn,
                transport: t,
                accepted: false,
                seen: SessionStats::default(),
                seen_phase: "",
                rma_keys: Default::default(),
                bypassed: [0; 2],
                armed: None,
            }),
        );
        self.touch(key);
    }

    // ---- transport events ---------------------------------------------------

    fn handle_transport_events(&mut self) {
        // Every pass asks, and most have nothing: no swap of the buffers then.
        if self.tevents.is_empty() {
            return;
        }
        let now = self.now;
        let mut evs = std::mem::take(&mut self.tevents);
        // Links whose protocol error this batch has counted. One bad
        // connection is one error, but it can be reported twice in a
        // batch: a transport decodes all it read before the worker sees
        // any of it, so the 32 bytes of a bad banner come as a unit the
        // session refuses and the bytes after them as `Corrupt` (and a
        // session may refuse one unit, then another). Nothing for a link
        // follows its `Corrupt`, nor a later batch its refusal (the
        // session closes the link first), so a batch's list suffices; it
        // allocates only when something was bad.
        let mut erred: Vec<LinkId> = Vec::new();
        let mut first_error = |link: LinkId| {
            let first = !erred.contains(&link);
            if first {
                erred.push(link);
            }
            first
        };
        for ev in evs.drain(..) {
            tracing::trace!(worker = self.idx, event = ?ev, "transport event");
            match ev {
                TransportEvent::Accepted {
                    link,
                    listener,
                    peer,
                } => {
                    let Some(&(t, _)) = self.listeners.iter().find(|(_, tok)| *tok == listener)
                    else {
                        self.transports
                            .iter_mut()
                            .for_each(|x| x.close(link, false));
                        continue;
                    };
                    // Bounded handshake state (admission module): an idle
                    // pending link gives way, or the new one waits for a
                    // slot or is refused.
                    let shared = self.shared.clone();
                    let cfg = &shared.cfg;
                    match admit(
                        &self.pending,
                        peer.ip(),
                        self.passes,
                        cfg.max_handshakes,
                        cfg.max_handshakes_per_source,
                    ) {
                        Admit::Yes => {}
                        Admit::Evict(old) => {
                            Counters::add(&self.shared.counters.handshakes_evicted, 1);
                            self.drop_pending(old);
                        }
                        Admit::Refuse if self.waiting_room(peer.ip()) => {
                            // A burst: wait, unread, for a slot. The banner
                            // goes now: the peer's banner timer (2 s) is
                            // shorter than a burst's wait.
                            Counters::add(&self.shared.counters.handshakes_waited, 1);
                            Counters::add(&self.shared.counters.links_active, 1);
                            self.transports[t].pause_reading(link, true);
                            let banner = Banner::for_session(
                                cfg.session.payload_crc,
                                cfg.session.security.modes,
                            );
                            self.links.insert(
                                link,
                                LinkEntry {
                                    transport: t,
                                    owner: Owner::Waiting,
                                },
                            );
                            let deadline = now + cfg.session.handshake_timeout;
                            self.waiting.push(
                                link,
                                WaitingLink {
                                    source: peer.ip(),
                                    transport: t,
                                    deadline,
                                    early: Vec::new(),
                                },
                            );
                            self.next_timer =
                                Some(self.next_timer.map_or(deadline, |n| n.min(deadline)));
                            self.transmit(t, link, Transmit::Banner(banner.encode()), now);
                            continue;
                        }
                        Admit::Refuse => {
                            Counters::add(&self.shared.counters.handshakes_refused, 1);
                            self.transports[t].close(link, false);
                            continue;
                        }
                    }
                    Counters::add(&self.shared.counters.links_active, 1);
                    self.links.insert(
                        link,
                        LinkEntry {
                            transport: t,
                            owner: Owner::Pending,
                        },
                    );
                    self.start_pending(link, peer.ip(), None, now);
                }
                TransportEvent::Connected(link) => {
                    if let Some(Owner::Session(k)) = self.links.get(&link).map(|e| e.owner) {
                        if let Some(s) = self.sessions.get_mut(&k) {
                            s.session.link_up(link, now);
                        }
                        self.touch(k);
                    }
                }
                TransportEvent::Received(link, unit) => {
                    match self.links.get(&link).map(|e| e.owner) {
                        Some(Owner::Session(k)) => {
                            if let Some(s) = self.sessions.get_mut(&k) {
                                let throttle = &self.shared.throttle;
                                let r = s.session.handle_inbound_with(link, unit, now, |u| {
                                    throttle.charge_unit(u)
                                });
                                if let Err(e) = r {
                                    if first_error(link) {
                                        count_protocol_error(&self.shared.counters, &e);
                                    }
                                }
                            }
                            self.touch(k);
                        }
                        Some(Owner::Pending) => {
                            if let Some(p) = self.pending.get_mut(&link) {
                                if let Err(e) = p.session.handle_inbound(link, unit, now) {
                                    if first_error(link) {
                                        count_protocol_error(&self.shared.counters, &e);
                                    }
                                }
                            }
                            self.drive_pending(link, now);
                        }
                        Some(Owner::Waiting) if !self.waiting.keep_early(link, unit) => {
                            self.drop_waiting(link);
                        }
                        Some(Owner::Waiting) | None => {}
                    }
                }
                TransportEvent::Corrupt(link, err) => {
                    tracing::debug!(link = link.0, error = %err, "link received bytes that do not decode");
                    if first_error(link) {
                        count_protocol_error(&self.shared.counters, &err);
                    }
                    self.link_gone(link, |s, now| s.handle_decode_error(link, err, now), now);
                }
                TransportEvent::Failed(link, why) => {
                    tracing::debug!(link = link.0, %why, "link failed");
                    self.link_gone(link, |s, now| s.link_failed(link, why, now), now);
                }
                TransportEvent::RmaRead { token, result, .. } => {
                    self.native_op_done(token, result.map_err(|e| e.to_string()));
                }
                TransportEvent::RmaWrite { token, result, .. } => {
                    let result = result.map(|()| bytes::Bytes::new());
                    self.native_op_done(token, result.map_err(|e| e.to_string()));
                }
            }
        }
        // Keep the allocation.
        if self.tevents.is_empty() {
            self.tevents = evs;
        }
    }

    /// A link closed underneath us: tell its session.
    fn link_gone(&mut self, link: LinkId, tell: impl FnOnce(&mut Session, Instant), now: Instant) {
        // Native operations on it are asked of the owner, over the next
        // link (a write that may have landed lands again: RMA writes are
        // idempotent).
        let stranded: Vec<u64> = (self.native_ops.iter())
            .filter(|(_, r)| r.link == link)
            .map(|(&t, _)| t)
            .collect();
        for token in stranded {
            self.native_op_done(token, Err("the link went".into()));
        }
        let Some(e) = self.forget_link(link) else {
            return;
        };
        Counters::add(&self.shared.counters.link_faults, 1);
        match e.owner {
            Owner::Session(k) => {
                if let Some(s) = self.sessions.get_mut(&k) {
                    tell(&mut s.session, now);
                }
                self.touch(k);
            }
            Owner::Pending => {
                if let Some(mut p) = self.pending.remove(&link) {
                    tell(&mut p.session, now);
                }
            }
            Owner::Waiting => {
                self.waiting.remove(link);
            }
        }
    }

    /// A native read or write completed: the caller gets the owner's
    /// reply it stands for (a read's bytes); a failed one is asked of the
    /// owner.
    fn native_op_done(&mut self, token: u64, result: Result<bytes::Bytes, String>) {
        let Some(op) = self.native_ops.remove(&token) else {
            return; // its session went, or it was given up already
        };
        let key = op.session;
        let Some(slot) = self.sessions.get_mut(&key) else {
            return;
        };
        let counters = &self.shared.counters;
        match result {
            Ok(bytes) => {
                let done = if op.request.data.is_empty() {
                    &counters.rma_native_reads
                } else {
                    &counters.rma_native_writes
                };
                Counters::add(done, 1);
                route_reply(&slot.conn, native_rma::reply(token, bytes), counters);
            }
            Err(why) => {
                tracing::debug!(%why, "a native operation failed: asked of the owner");
                Counters::add(&counters.rma_native_fallbacks, 1);
                let request = native_rma::give_up(slot, op);
                self.queue_messages(key, std::iter::once(request));
            }
        }
    }

    // ---- driving sessions ---------------------------------------------------

    fn touch(&mut self, key: u64) {
        if !self.touched.contains(&key) {
            self.touched.push(key);
        }
    }

    fn drive_touched(&mut self) {
        while !self.touched.is_empty() {
            let now = self.now;
            let spare = std::mem::take(&mut self.touched_spare);
            let mut keys = std::mem::replace(&mut self.touched, spare);
            for key in keys.drain(..) {
                self.drive(key, now);
            }
            self.touched_spare = keys;
            self.take_local_commands();
        }
    }

    /// Moves a session's output to its transport and its events to the application.
    fn drive(&mut self, key: u64, now: Instant) {
        // One span per session: its life-cycle events below nest in it.
        let _span = tracing::debug_span!("session", worker = self.idx, id = key).entered();
        loop {
            // Deliver what arrived first, then take the sends its callbacks
            // made: a reply then carries the ack (messages piggyback it)
            // instead of following a standalone Ack frame — one unit per
            // request/reply exchange on the wire, not two.
            loop {
                let Some(slot) = self.sessions.get_mut(&key) else {
                    return;
                };
                // Messages, the hot case (every entry of a batch), are
                // delivered with the slot in hand: no second lookup, no
                // event dispatch.
                while let Some(msg) = slot.session.poll_message() {
                    deliver(slot, msg, &self.shared, &mut self.transports, &self.links);
                }
                // An event, or none once both are drained (an event held
                // back by messages came out after them above).
                let Some(ev) = slot.session.poll_event() else {
                    break;
                };
                self.handle_session_event(key, ev, now);
            }
            self.take_local_commands();
            let Some(slot) = self.sessions.get_mut(&key) else {
                return;
            };
            let t = slot.transport;
            let mut out = std::mem::take(&mut self.outbox);
            let link = slot.session.link();
            let mut room = match link {
                Some(l) => TX_HIGH_WATER.saturating_sub(self.transports[t].backlog(l)),
                None => 0,
            };
            while room > 0 {
                let Some(tx) = slot.session.poll_transmit(now) else {
                    break;
                };
                room = room.saturating_sub(Transmit::encoded_len(&tx.1));
                out.push(tx);
            }
            if room == 0 && link.is_some() && slot.session.wants_transmit() {
                // The link is backed up: resume when it drains (flush_transports).
                self.blocked.insert(key);
            }
            for (link, unit) in out.drain(..) {
                self.transmit(t, link, unit, now);
            }
            self.outbox = out;
            let Some(slot) = self.sessions.get_mut(&key) else {
                return;
            };
            let Some(ev) = slot.session.poll_event() else {
                break;
            };
            self.handle_session_event(key, ev, now);
        }
        let Some(slot) = self.sessions.get_mut(&key) else {
            return;
        };
        // Account: what left the queue, what was counted.
        let st = slot.session.stats();
        let c = &self.shared.counters;
        Counters::add(&c.tx_messages, st.tx_messages - slot.seen.tx_messages);
        Counters::add(&c.tx_bytes, st.tx_bytes - slot.seen.tx_bytes);
        Counters::add(&c.tx_batches, st.tx_batches - slot.seen.tx_batches);
        Counters::add(&c.rx_batches, st.rx_batches - slot.seen.rx_batches);
        Counters::add(&c.rx_messages, st.rx_messages - slot.seen.rx_messages);
        Counters::add(&c.rx_bytes, st.rx_bytes - slot.seen.rx_bytes);
        Counters::add(&c.duplicates_dropped, st.duplicates - slot.seen.duplicates);
        let phase = slot.session.phase();
        if st.faults != slot.seen.faults || phase != slot.seen_phase {
            slot.seen_phase = phase;
            slot.conn.publish_status(&slot.session);
        }
        slot.seen = st;
        slot.conn.set_state(if slot.session.is_open() {
            ConnectionState::Open
        } else if slot.session.is_closed() {
            ConnectionState::Closed
        } else {
            ConnectionState::Connecting
        });
        let inner = &slot.conn.inner;
        let [bypassed, bypassed_bytes] = slot.bypassed;
        inner.released[0].store(st.released_messages + bypassed, Ordering::Release);
        inner.released[1].store(st.released_bytes + bypassed_bytes, Ordering::Release);
        inner.room.released();
        if let Some(t) = slot.session.poll_timeout() {
            // A later deadline keeps the earlier entry: when it comes up,
            // `fire_timers` files the session under its deadline then.
            if slot.armed.is_none_or(|a| t < a) {
                slot.armed = Some(t);
                self.session_timers.push(std::cmp::Reverse((t, key)));
                self.next_timer = Some(self.next_timer.map_or(t, |n| n.min(t)));
            }
        }
        if slot.session.is_closed() {
            self.remove_session(key);
        }
    }

    fn handle_session_event(&mut self, key: u64, ev: SessionEvent, now: Instant) {
        match &ev {
            SessionEvent::Established(p) => {
                tracing::info!(peer = %p.addr, name = %p.name, "session established")
            }
            SessionEvent::Reset {
                reason,
                undelivered,
            } => {
                tracing::info!(%reason, undelivered, "session reset")
            }
            SessionEvent::RemoteReset { dropped } => {
                tracing::info!(dropped, "peer reset the session")
            }
            other => tracing::debug!(event = ?other, "session event"),
        }
        let Some(slot) = self.sessions.get_mut(&key) else {
            return;
        };
        let conn = slot.conn.clone();
        let c = &self.shared.counters;
        match ev {
            SessionEvent::Connect(addr) => {
                if slot.session.failed_attempts() > 0 {
                    Counters::add(&self.shared.counters.redials, 1);
                }
                let link = LinkId(self.shared.link_ids.fetch_add(1, Ordering::Relaxed));
                // An address vector may name another transport than the
                // last attempt's.
                let t = match self.transport_for(&addr) {
                    Ok(t) => t,
                    Err(e) => {
                        if let Some(slot) = self.sessions.get_mut(&key) {
                            slot.session.link_failed(link, e.link_failure(), now);
                        }
                        return;
                    }
                };
                let Some(slot) = self.sessions.get_mut(&key) else {
                    return;
                };
                slot.transport = t;
                match self.transports[t].connect(link, &addr) {
                    Ok(()) => {
                        slot.session.dialing(link);
                        Counters::add(&self.shared.counters.links_active, 1);
                        self.links.insert(
                            link,
                            LinkEntry {
                                transport: t,
                                owner: Owner::Session(key),
                            },
                        );
                    }
                    Err(e) => slot.session.link_failed(link, e.link_failure(), now),
                }
            }
            SessionEvent::CloseLink(link) => {
                if let Some(e) = self.forget_link(link) {
                    self.transports[e.transport].close(link, true);
                }
            }
            SessionEvent::Identified(_) => {}
            SessionEvent::ConnectFailed { reason } => {
                Counters::add(&c.connect_failures, 1);
                tracing::info!(target = %conn.target(), %reason, "connection attempt failed");
                let r = self.callback(
                    &conn,
                    || "on_connect_failed".into(),
                    |d, c| d.on_connect_failed(c, &reason),
                );
                self.abort_on_panic(key, r);
            }
            SessionEvent::Established(peer) => {
                conn.publish_send_limits(slot.session.send_limits());
                *conn.inner.peer.lock() = Some(peer);
                conn.set_state(ConnectionState::Open);
                let r = if slot.accepted {
                    Counters::add(&c.sessions_accepted, 1);
                    self.callback(&conn, || "on_accept".into(), |d, c| d.on_accept(c))
                } else {
                    Counters::add(&c.sessions_connected, 1);
                    self.callback(&conn, || "on_connect".into(), |d, c| d.on_connect(c))
                };
                self.abort_on_panic(key, r);
            }
            SessionEvent::Moved { from, to, reason } => {
                Counters::add(&c.transport_changes, 1);
                let why = reason.map_or_else(String::new, |r| r.to_string());
                tracing::info!(
                    peer = %conn.target(),
                    %from,
                    %to,
                    reason = %why,
                    queued = slot.session.queued_messages(),
                    "session moved to another transport"
                );
            }
            SessionEvent::Resumed { replayed } => {
                conn.publish_send_limits(slot.session.send_limits());
                conn.set_state(ConnectionState::Open);
                Counters::add(&c.reconnects, 1);
                Counters::add(&c.replayed_messages, replayed);
            }
            SessionEvent::Reset {
                reason,
                undelivered,
            } => {
                // Why, before the state says Closed: a waiter that sees the
                // state reads the reason next (`Connection::wait_connected`).
                conn.publish_status(&slot.session);
                conn.set_state(ConnectionState::Closed);
                Counters::add(&c.session_resets, 1);
                Counters::add(&c.messages_dropped, undelivered);
                if reason == FaultReason::KeepaliveTimeout {
                    Counters::add(&c.keepalive_timeouts, 1);
                }
                if matches!(reason, FaultReason::TooLarge(_)) {
                    Counters::add(&c.messages_too_large, 1);
                }
                self.report.undelivered += undelivered;
                conn.inner.calls.fail_all(&reason);
                // The session has ended: a panic here is logged and counted.
                let _ = self.callback(&conn, || "on_reset".into(), |d, c| d.on_reset(c, &reason));
            }
            SessionEvent::RemoteReset { dropped } => {
                // The peer's session is gone, and with it any request it
                // had not answered.
                conn.inner
                    .calls
                    .fail_all(&FaultReason::Transport(LinkFailure::Reset(
                        "the peer reset the session".into(),
                    )));
                Counters::add(&c.remote_resets, 1);
                Counters::add(&c.messages_dropped, dropped);
                let r = self.callback(
                    &conn,
                    || "on_remote_reset".into(),
                    |d, c| d.on_remote_reset(c),
                );
                self.abort_on_panic(key, r);
            }
            SessionEvent::Closed => conn.set_state(ConnectionState::Closed),
        }
    }

    /// Runs one dispatcher callback for `conn` under the configured panic
    /// policy (`crate::dispatcher::guarded`); `what` names what it was
    /// given, for the log.
    fn callback(
        &self,
        conn: &Connection,
        what: impl FnOnce() -> String,
        f: impl FnOnce(&dyn crate::Dispatcher, &Connection),
    ) -> Result<(), Panicked> {
        let shared = &self.shared;
        guarded(
            shared.cfg.handler_panic,
            &shared.counters.handler_panics,
            conn,
            what,
            || f(&*shared.dispatcher, conn),
        )
    }

    /// Ends session `key` if its handler panicked: `on_reset` follows with
    /// the panic's message.
    fn abort_on_panic(&mut self, key: u64, r: Result<(), Panicked>) {
        if let Err(Panicked(why)) = r {
            if let Some(slot) = self.sessions.get_mut(&key) {
                slot.session.abort(FaultReason::HandlerPanicked(why));
                self.touch(key);
            }
        }
    }

    fn remove_session(&mut self, key: u64) {
        let Some(slot) = self.sessions.remove(&key) else {
            return;
        };
        self.shared
            .counters
            .sessions_active
            .fetch_sub(1, Ordering::Relaxed);
        slot.conn.set_state(ConnectionState::Closed);
        let target = &slot.conn.inner.target;
        for addr in [slot.session.peer_addr().unwrap_or(target), target] {
            let k = peer_key(addr);
            if self.by_peer.get(&k) == Some(&key) {
                self.by_peer.remove(&k);
            }
            self.shared.unregister(key, addr);
        }
        // Any link still registered to it goes too.
        let stale: Vec<LinkId> = self
            .links
            .iter()
            .filter(|(_, e)| matches!(e.owner, Owner::Session(k) if k == key))
            .map(|(l, _)| *l)
            .collect();
        for l in stale {
            if let Some(e) = self.forget_link(l) {
                self.transports[e.transport].close(l, true);
            }
        }
    }

    /// Gives an accepted link its acceptor session and starts its
    /// handshake; one that waited for its slot brings the units that came
    /// before its reading paused, and sent its banner already.
    fn start_pending(
        &mut self,
        link: LinkId,
        source: IpAddr,
        waited: Option<Vec<Inbound>>,
        now: Instant,
    ) {
        let mut session = Session::accept(
            self.shared.cfg.session.clone(),
            self.shared.local.clone(),
            link,
            now,
        );
        let early = match waited {
            Some(early) => {
                // The session's first transmit is its banner, the one sent
                // when the link started waiting (same configuration).
                let banner = session.poll_transmit(now);
                debug_assert!(matches!(banner, Some((_, Transmit::Banner(_)))));
                early
            }
            None => Vec::new(),
        };
        for unit in early {
            if let Err(e) = session.handle_inbound(link, unit, now) {
                count_protocol_error(&self.shared.counters, &e);
                break;
            }
        }
        self.pending.insert(
            link,
            PendingLink {
                session,
                source,
                since: now,
                since_pass: self.passes,
            },
        );
        self.drive_pending(link, now);
    }

    /// Closes the links that waited for a handshake slot too long, and
    /// starts the handshakes of those that have one now (admission).
    fn admit_waiting(&mut self, now: Instant) {
        if self.waiting.is_empty() {
            return;
        }
        for (link, _) in self.waiting.expired(now) {
            self.close_waiting(link);
        }
        let cfg = &self.shared.cfg;
        let (total, per_source) = (cfg.max_handshakes, cfg.max_handshakes_per_source);
        for (link, w) in self.waiting.admissible(&self.pending, total, per_source) {
            if let Some(e) = self.links.get_mut(&link) {
                e.owner = Owner::Pending;
            }
            self.transports[w.transport].pause_reading(link, false);
            self.start_pending(link, w.source, Some(w.early), now);
        }
        if let Some(d) = self.waiting.next_deadline() {
            self.next_timer = Some(self.next_timer.map_or(d, |n| n.min(d)));
        }
    }

    /// Whether a link from `source` may wait for a handshake slot: there
    /// is room, or a source with more waiting gave a link up for it.
    fn waiting_room(&mut self, source: IpAddr) -> bool {
        if self.waiting.len() < WAITING_PER_SLOT * self.shared.cfg.max_handshakes {
            return true;
        }
        let Some((link, _)) = self.waiting.make_room_for(source) else {
            return false;
        };
        self.close_waiting(link);
        true
    }

    /// Closes a waiting link (admission): it brought more than one may.
    fn drop_waiting(&mut self, link: LinkId) {
        self.waiting.remove(link);
        self.close_waiting(link);
    }

    /// Closes a link taken out of the waiting queue, counted refused.
    fn close_waiting(&mut self, link: LinkId) {
        if let Some(e) = self.forget_link(link) {
            Counters::add(&self.shared.counters.handshakes_refused, 1);
            self.transports[e.transport].close(link, false);
        }
    }

    /// Closes a pending link to make room for another (admission).
    fn drop_pending(&mut self, link: LinkId) {
        self.pending.remove(&link);
        if let Some(e) = self.forget_link(link) {
            self.transports[e.transport].close(link, false);
        }
    }

    /// Forgets `link` (if this worker still has it) and counts it closed;
    /// closing it on its transport is the caller's (flushed or not, or
    /// already closed underneath).
    fn forget_link(&mut self, link: LinkId) -> Option<LinkEntry> {
        let e = self.links.remove(&link)?;
        self.shared
            .counters
            .links_active
            .fetch_sub(1, Ordering::Relaxed);
        Some(e)
    }

    /// Drives a not-yet-routed accepted link's session.
    fn drive_pending(&mut self, link: LinkId, now: Instant) {
        let Some(t) = self.links.get(&link).map(|e| e.transport) else {
            return;
        };
        loop {
            let Some(p) = self.pending.get_mut(&link) else {
                return;
            };
            let mut out = std::mem::take(&mut self.outbox);
            while let Some(tx) = p.session.poll_transmit(now) {
                out.push(tx);
            }
            for (l, unit) in out.drain(..) {
                self.transmit(t, l, unit, now);
            }
            self.outbox = out;
            let Some(p) = self.pending.get_mut(&link) else {
                return;
            };
            let ev = p.session.poll_event();
            tracing::debug!(worker = self.idx, ?link, event = ?ev, "pending link event");
            match ev {
                Some(SessionEvent::Identified(hello)) => {
                    let Some(p) = self.pending.remove(&link) else {
                        return;
                    };
                    self.route(link, t, p.session, hello, now);
                    return;
                }
                Some(SessionEvent::CloseLink(l)) => {
                    self.forget_link(l);
                    self.transports[t].close(l, true);
                }
                Some(_) => {}
                None => break,
            }
        }
        if self
            .pending
            .get(&link)
            .is_some_and(|p| p.session.is_closed())
        {
            self.pending.remove(&link);
        } else if let Some(tm) = self
            .pending
            .get(&link)
            .and_then(|p| p.session.poll_timeout())
        {
            self.next_timer = Some(self.next_timer.map_or(tm, |n| n.min(tm)));
        }
    }

    /// An accepted link's peer said hello: hand it to the worker that owns its session.
    fn route(&mut self, link: LinkId, t: usize, session: Session, hello: Hello, now: Instant) {
        let owner = owner_of(&peer_key(&hello.addr), self.shared.workers.len());
        if owner == self.idx {
            self.route_local(link, t, session, hello, now);
            return;
        }
        match self.transports[t].detach(link) {
            Some(detached) => {
                self.links.remove(&link);
                let transport = self.transports[t].kind();
                self.shared.workers[owner].submit(Command::Adopt(Box::new(Adoption {
                    link,
                    detached,
                    session,
                    hello,
                    transport,
                })));
            }
            // A backend whose links cannot move: the session lives here.
            None => self.route_local(link, t, session, hello, now),
        }
    }

    /// Attaches an identified link to its session here: resume, race, or new.
    fn route_local(
        &mut self,
        link: LinkId,
        t: usize,
        mut session: Session,
        hello: Hello,
        now: Instant,
    ) {
        let pk = peer_key(&hello.addr);
        let cookie = self.rng.random::<u64>() | 1;
        if let Some(&key) = self.by_peer.get(&pk) {
            if let Some(slot) = self.sessions.get_mut(&key) {
                match slot
                    .session
                    .take_link(link, &hello, &mut session, cookie, now)
                {
                    Takeover::Accepted => {
                        if let Some(e) = self.links.get_mut(&link) {
                            e.owner = Owner::Session(key);
                        }
                        if slot.transport != t {
                            // The peer resumed its session over another
                            // transport (an address vector on its side).
                            Counters::add(&self.shared.counters.transport_changes, 1);
                            tracing::info!(
                                peer = %hello.addr,
                                from = ?self.transports[slot.transport].kind(),
                                to = ?self.transports[t].kind(),
                                "session resumed over another transport"
                            );
                        }
                        slot.transport = t;
                        self.touch(key);
                        return;
                    }
                    Takeover::Rejected(frame) => {
                        self.refuse(link, t, session.refusal(frame));
                        return;
                    }
                    Takeover::Impostor { frame, why } => {
                        Counters::add(&self.shared.counters.impostors_refused, 1);
                        tracing::warn!(
                            worker = self.idx,
                            claimed = %hello.name,
                            addr = %hello.addr,
                            %why,
                            "refused a link that claims an authenticated session"
                        );
                        self.refuse(link, t, session.refusal(frame));
                        return;
                    }
                    Takeover::Ending => {
                        // A new session begins below and takes the peer's
                        // routing and registry entries; the old one ends
                        // on its own.
                        self.by_peer.remove(&pk);
                        self.shared.unregister(key, &hello.addr);
                    }
                }
            }
        }
        if hello.cookie != 0 {
            let refusal = session.refusal(Session::reject_unknown());
            self.refuse(link, t, refusal);
            return;
        }
        session.accept_new(cookie, now);
        let key = self.shared.next_session_key();
        let conn = {
            let mut reg = self.shared.registry.lock();
            reg.entry(pk.clone())
                .or_insert_with(|| {
                    Connection::new(
                        self.shared.clone(),
                        key,
                        self.idx,
                        hello.addr.clone(),
                        session.policy(),
                        None,
                    )
                })
                .clone()
        };
        let key = conn.inner.key;
        if let Some(e) = self.links.get_mut(&link) {
            e.owner = Owner::Session(key);
        }
        self.by_peer.insert(pk, key);
        Counters::add(&self.shared.counters.sessions_active, 1);
        self.sessions.insert(
            key,
            Box::new(Slot {
                session,
                conn,
                transport: t,
                accepted: true,
                seen: SessionStats::default(),
                seen_phase: "",
                rma_keys: Default::default(),
                bypassed: [0; 2],
                armed: None,
            }),
        );
        self.touch(key);
    }
    /// Hands one unit to its transport, through the fault plan if one is set.
    fn transmit(&mut self, t: usize, link: LinkId, unit: Transmit, now: Instant) {
        let action = match &mut self.faults {
            Some(f) => f.decide(is_handshake(&unit)),
            None => FaultAction::Pass,
        };
        if action != FaultAction::Pass {
            Counters::add(&self.shared.counters.injected_faults, 1);
        }
        if let Some((_, q)) = self.held.get_mut(&link) {
            // Something earlier on this link is delayed: keep the order.
            q.push_back((unit, action));
            return;
        }
        if let FaultAction::Delay(d) = action {
            let at = now + d;
            self.held
                .insert(link, (at, VecDeque::from([(unit, FaultAction::Pass)])));
            self.next_timer = Some(self.next_timer.map_or(at, |n| n.min(at)));
            return;
        }
        self.apply(t, link, unit, action);
    }

    /// Sends a unit as the fault plan decided.
    fn apply(&mut self, t: usize, link: LinkId, unit: Transmit, action: FaultAction) {
        let res = match action {
            FaultAction::Pass | FaultAction::Delay(_) => self.transports[t].send(link, unit),
            FaultAction::FailLink => self.transports[t].inject(link, RealFault::Abort),
            FaultAction::Corrupt(bit) => {
                Counters::add(&self.shared.counters.corruptions_injected, 1);
                self.transports[t].send_corrupted(link, unit, bit)
            }
        };
        if let Err(e) = res {
            tracing::debug!(error = %e, ?link, "transmit on a link that is gone");
        }
    }

    /// Sends units whose injected delay is over.
    fn release_held(&mut self, now: Instant) {
        if self.held.is_empty() {
            return;
        }
        let due: Vec<LinkId> = self
            .held
            .iter()
            .filter(|(_, (at, _))| *at <= now)
            .map(|(l, _)| *l)
            .collect();
        for link in due {
            let Some((_, q)) = self.held.remove(&link) else {
                continue;
            };
            let Some(t) = self.links.get(&link).map(|e| e.transport) else {
                continue;
            };
            for (unit, action) in q {
                self.apply(t, link, unit, action);
            }
        }
        for (at, _) in self.held.values() {
            self.next_timer = Some(self.next_timer.map_or(*at, |n| n.min(*at)));
        }
    }

    /// Sends `refusal` (from the link's own session: sealed on a secure
    /// link) and closes the link.
    fn refuse(&mut self, link: LinkId, t: usize, refusal: Transmit) {
        self.transmit(t, link, refusal, self.now);
        self.forget_link(link);
        self.transports[t].close(link, true);
    }

    // ---- timers and throttling ---------------------------------------------

    fn fire_timers(&mut self, now: Instant) {
        match self.next_timer {
            Some(t) if t <= now => {}
            _ => return,
        }
        let mut next: Option<Instant> = self.shutdown;
        while let Some(&std::cmp::Reverse((at, key))) = self.session_timers.peek() {
            if at > now {
                next = Some(next.map_or(at, |n| n.min(at)));
                break;
            }
            self.session_timers.pop();
            let Some(s) = self.sessions.get_mut(&key) else {
                continue;
            };
            if s.armed != Some(at) {
                continue;
            }
            s.armed = None;
            match s.session.poll_timeout() {
                // Driven next, which files it under its next deadline.
                Some(t) if t <= now => {
                    s.session.handle_timeout(now);
                    self.touch(key);
                }
                // Its deadline moved later since this entry was made.
                Some(t) => {
                    s.armed = Some(t);
                    self.session_timers.push(std::cmp::Reverse((t, key)));
                }
                None => {}
            }
        }
        let links: Vec<LinkId> = self.pending.keys().copied().collect();
        for l in links {
            let Some(p) = self.pending.get_mut(&l) else {
                continue;
            };
            if p.session.poll_timeout().is_some_and(|t| t <= now) {
                p.session.handle_timeout(now);
                self.drive_pending(l, now);
            }
            if let Some(t) = self.pending.get(&l).and_then(|p| p.session.poll_timeout()) {
                next = Some(next.map_or(t, |n| n.min(t)));
            }
        }
        while let Some(std::cmp::Reverse((at, key, id))) = self.call_deadlines.peek().copied() {
            if at > now {
                next = Some(next.map_or(at, |n| n.min(at)));
                break;
            }
            self.call_deadlines.pop();
            if let Some(s) = self.sessions.get(&key) {
                s.conn.expire_call(id);
            }
        }
        self.next_timer = next;
    }

    fn check_throttle(&mut self) {
        let th = &self.shared.throttle;
        let mut full = th.full();
        if full && !self.rx_paused {
            th.set_paused();
            // A release may have slipped in before set_paused: look again.
            full = th.full();
        }
        if full == self.rx_paused {
            return;
        }
        if full {
            Counters::add(&self.shared.counters.rx_throttle_pauses, 1);
        }
        self.rx_paused = full;
        let now = Instant::now();
        for (link, e) in &self.links {
            self.transports[e.transport].pause_reading(*link, full);
        }
        for s in self.sessions.values_mut() {
            s.session.set_rx_paused(full, now);
        }
    }
}

/// Banner and hello traffic: what the plan's handshake faults target.
fn is_handshake(unit: &Transmit) -> bool {
    match unit {
        Transmit::Banner(_) => true,
        Transmit::Frame(f) => matches!(
            f.tag,
            Tag::Hello | Tag::HelloOk | Tag::ReconnectOk | Tag::SessionReset | Tag::Wait
        ),
        Transmit::Message(_) => false,
    }
}

/// A message `slot`'s session delivered, by its call field: a reply to
/// the call that waits for it, an RMA request to the region it names,
/// anything else to the application's dispatcher (or inbox). A handler
/// that panics ends the session (`on_reset` follows).
///
/// Borrows the connection rather than cloning it (an atomic count up and
/// down per message). Counted with the session's other figures once it is
/// driven (`Worker::drive`), not by atomic additions per message; charged
/// to the receive throttle when its unit arrived (`RxThrottle::charge_unit`).
fn deliver(
    slot: &mut Slot,
    msg: Message,
    shared: &Shared,
    transports: &mut [AnyTransport],
    links: &FxHashMap<LinkId, LinkEntry>,
) {
    if msg.call & REPLY_BIT != 0 {
        native_rma::note_key(slot, &msg);
        route_reply(&slot.conn, msg, &shared.counters);
        return;
    }
    if msg.call & RMA_BIT != 0 {
        native_rma::serve(slot, msg, transports, links, &shared.counters);
        return;
    }
    let conn = &slot.conn;
    let ty = msg.msg_type;
    if let Err(Panicked(why)) = guarded(
        shared.cfg.handler_panic,
        &shared.counters.handler_panics,
        conn,
        || format!("a message of type {ty}"),
        || shared.dispatcher.on_message(conn, msg),
    ) {
        slot.session.abort(FaultReason::HandlerPanicked(why));
    }
}

/// A reply (a message whose call has the reply bit): to the call that
/// waits for it, or dropped and counted if none does any more.
fn route_reply(conn: &Connection, msg: Message, counters: &Counters) {
    let id = msg.call & !REPLY_BIT;
    if !conn.inner.calls.complete(id, msg) {
        Counters::add(&counters.late_replies, 1);
    }
}

/// Counts a link closed for what its peer sent, by kind: every one in
/// `protocol_errors`, and failed authentication, sealed frames that did
/// not open and checksum mismatches in their own counters (logged, once
/// per link: who failed, or what corrupts data, is worth a look).
fn count_protocol_error(counters: &Counters, e: &msgr_proto::ProtocolError) {
    Counters::add(&counters.protocol_errors, 1);
    match e {
        msgr_proto::ProtocolError::Auth(why) => {
            Counters::add(&counters.auth_failures, 1);
            tracing::warn!(%why, "authentication failed; link closed");
        }
        msgr_proto::ProtocolError::Record(why) => {
            Counters::add(&counters.sealed_frames_refused, 1);
            tracing::warn!(%why, "a frame on a secure link did not open; link closed");
        }
        // Corruption on the way (or a bug): at the default level, not
        // only in debug output.
        msgr_proto::ProtocolError::Frame(
            msgr_proto::FrameError::PreambleCrc { .. } | msgr_proto::FrameError::SegmentCrc { .. },
        )
        | msgr_proto::ProtocolError::Banner(msgr_proto::BannerError::Crc) => {
            Counters::add(&counters.checksum_failures, 1);
            tracing::warn!(error = %e, "checksum mismatch: link closed");
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A worker loop that panics is caught: marked dead, counted, and its
    /// report says it died (a real one is a bug, so a closure stands in).
    #[test]
    fn a_worker_that_panics_is_reported_dead() {
        let dead = AtomicBool::new(false);
        let deaths = std::sync::atomic::AtomicU64::new(0);
        let ok = run_guarded(
            0,
            &dead,
            &deaths,
            || {},
            || WorkerReport {
                undelivered: 3,
                ..WorkerReport::default()
            },
        );
        assert_eq!(
            (ok.undelivered, ok.died, dead.load(Ordering::Acquire)),
            (3, false, false)
        );
        let told = std::cell::Cell::new(false);
        let r = run_guarded(1, &dead, &deaths, || told.set(true), || panic!("a bug"));
        assert!(told.get(), "its connections are told");
        assert!(r.died);
        assert!(dead.load(Ordering::Acquire));
        assert_eq!(deaths.load(Ordering::Relaxed), 1);
    }
}
