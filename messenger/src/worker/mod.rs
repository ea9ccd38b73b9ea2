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
//!
//! # Layers
//!
//! This file holds the loop and the state every part shares ([`Worker`],
//! its sessions' slots and link table); each part below adds the code of
//! one concern and owns its fields. Bottom first:
//!
//! 1. `admission`, `spin`: policies with no worker state — which accepted
//!    link gets a handshake slot; when to spin, yield or sleep.
//! 2. `transmit`, `timers`: the way out through the fault plan; deadlines.
//! 3. `rma_owner`: the owner's side of one-sided operations.
//! 4. `native_rma`: the requester's side, over a transport's own reads.
//! 5. `deliver`: messages and session events to the application.
//! 6. `drive`: each touched session's arrivals, output and figures.
//! 7. `events`: what the transports report.
//! 8. `accept`: accepted links until their session is known.
//! 9. `command`: what handles and callbacks ask of the worker.

mod accept;
mod admission;
mod command;
mod deliver;
mod drive;
mod events;
mod native_rma;
mod rma_owner;
mod spin;
mod timers;
mod transmit;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use mio::{Events, Poll, Token, Waker};
use msgr_addr::EntityAddr;
use msgr_backends::{open_transport, AnyTransport, Transport, TransportError};
use msgr_proto::{Phase, Session, SessionStats};
use rustc_hash::FxHashMap;

use accept::Handshakes;
use command::CommandInbox;
use drive::Driving;
use events::Net;
use timers::Timers;
#[cfg(feature = "fault-injection")]
use transmit::FaultPath;

use crate::affinity::OnCpu;
use crate::connection::Connection;
use crate::counters::Counters;
use crate::dispatcher::Dispatcher;
use crate::state::{Command, LocalWorker, Shared, WorkerHandle, LOCAL_WORKER};

/// Stop pulling frames from a session while its link holds this much unsent.
const TX_HIGH_WATER: usize = 4 << 20;
/// ... and continue once it is below this.
const TX_LOW_WATER: usize = 1 << 20;

/// The token of each worker's waker.
pub(crate) const WAKER_TOKEN: Token = Token(usize::MAX);

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

struct Slot {
    session: Session,
    conn: Connection,
    transport: usize,
    accepted: bool,
    seen: SessionStats,
    /// The phase last published to the connection's status.
    seen_phase: Option<Phase>,
    /// Keys of the peer's regions for native reads ([`native_rma`]).
    rma_keys: native_rma::RegionKeys,
    /// Messages and bytes the application queued that left as native
    /// reads, not through the session: released as the session's are.
    bypassed: [u64; 2],
    /// The deadline of this session's live entry in the worker's
    /// `session_timers`, if it has one.
    armed: Option<Instant>,
    /// In `driving.touched` already: touching is O(1), not a scan of the
    /// list (a turn over 1,000 sparse sessions touched each one).
    touched: bool,
}

impl Slot {
    fn new(session: Session, conn: Connection, transport: usize, accepted: bool) -> Box<Slot> {
        Box::new(Slot {
            session,
            conn,
            transport,
            accepted,
            seen: SessionStats::default(),
            seen_phase: None,
            rma_keys: Default::default(),
            bypassed: [0; 2],
            armed: None,
            touched: false,
        })
    }
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

/// A worker's state, by concern: each part's fields and code live in
/// the module named beside it.
pub(crate) struct Worker {
    idx: usize,
    shared: Arc<Shared>,
    /// Where messages and connection events go.
    dispatcher: Arc<dyn Dispatcher>,
    poll: Poll,
    /// Commands from handles and callbacks (`command`).
    inbox: CommandInbox,
    /// Transports, listeners and links (`events`).
    net: Net,
    /// Boxed: a slot is ~1.8 KB and a table keeps an eighth or more of
    /// its buckets empty (up to half after it grows): 16 B each, not a
    /// slot's size (issue 52: 10,000 sessions).
    sessions: FxHashMap<u64, Box<Slot>>,
    /// Keyed by what peers say about themselves: keep std's DoS-resistant hash.
    by_peer: std::collections::HashMap<EntityAddr, u64>,
    /// Accepted links whose session is not known yet (`accept`).
    handshakes: Handshakes,
    /// Deadlines (`timers`).
    timers: Timers,
    /// Sessions to drive and their output's bookkeeping (`drive`).
    driving: Driving,
    /// The fault plan on the way out (`transmit`).
    #[cfg(feature = "fault-injection")]
    faults: FaultPath,
    /// Native reads and writes of peers' regions in flight, by call id
    /// (`native_rma`).
    native_ops: FxHashMap<u64, native_rma::NativeOp>,
    /// The loop's clock: read once per pass (after the poll returns, and
    /// before computing how long to block), not per step. A pass takes
    /// microseconds, far below any timer's resolution, and a clock read is
    /// not free everywhere (a system call where the clocksource has no vDSO
    /// path, as HPET in a TCG guest).
    now: Instant,
    report: WorkerReport,
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
            WorkerHandle::new(tx, waker, sleeping.clone()),
            rx,
            sleeping,
        ))
    }

    /// A worker over what [`Worker::prepare`] made (its poll, channel and
    /// sleeping flag), delivering to `dispatcher`.
    pub(crate) fn new(
        idx: usize,
        shared: Arc<Shared>,
        dispatcher: Arc<dyn Dispatcher>,
        (poll, rx, sleeping): (Poll, Receiver<Command>, Arc<AtomicBool>),
        transports: Vec<AnyTransport>,
        listeners: Vec<(usize, Token)>,
    ) -> Worker {
        #[cfg(feature = "fault-injection")]
        let faults = FaultPath::new(shared.cfg.faults.clone(), idx);
        Worker {
            idx,
            shared,
            dispatcher,
            poll,
            inbox: CommandInbox::new(rx, sleeping),
            net: Net::new(transports, listeners),
            sessions: FxHashMap::default(),
            by_peer: std::collections::HashMap::new(),
            handshakes: Handshakes::new(),
            timers: Timers::default(),
            driving: Driving::default(),
            #[cfg(feature = "fault-injection")]
            faults,
            native_ops: FxHashMap::default(),
            now: Instant::now(),
            report: WorkerReport::default(),
        }
    }

    /// The transport serving `addr`, opened on first use (a backend that
    /// cannot run here says why).
    fn transport_for(&mut self, addr: &EntityAddr) -> Result<usize, TransportError> {
        if let Some(t) = self
            .net
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
        self.net.transports.push(t);
        Ok(self.net.transports.len() - 1)
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
        let mut shared_cpu = spin::SharedCpu::new(crate::affinity::allowed_cpus().len() == 1);
        self.now = Instant::now();
        let mut last_activity = self.now;
        let mut pass: u32 = 0;
        // Counted as a thread that wants a CPU, asleep or not (it may wake
        // at any moment to bring a reply): a caller spins on its reply only
        // on a CPU left spare beside every worker.
        let _on_cpu = OnCpu::worker();
        loop {
            pass = pass.wrapping_add(1);
            self.handshakes.passes += 1;
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
                    self.yield_while_spinning(&mut pacer, &mut shared_cpu);
                }
                Some(Duration::ZERO)
            } else {
                self.block_timeout()
            };
            // While spinning, epoll paced by its price unless a transport
            // needs it every pass (see `Transport::ready_every_pass`).
            let needed = !spinning || self.net.transports.iter().any(|t| t.ready_every_pass());
            let ask_poll = needed || pacer.poll_now(self.now, pass);
            // A paced call is timed: its price sets the pace.
            let paced_since = (!needed && ask_poll && pacer.adapts()).then(Instant::now);
            if ask_poll && timeout != Some(Duration::ZERO) {
                Counters::add(&self.shared.counters.worker_sleeps, 1);
            }
            if !ask_poll {
                events.clear();
            } else if let Err(e) = self.poll.poll(&mut events, timeout) {
                if e.kind() != std::io::ErrorKind::Interrupted {
                    tracing::error!(error = %e, "poll failed; worker stops");
                    break;
                }
            }
            self.inbox.sleeping.store(false, Ordering::SeqCst);
            self.now = Instant::now();
            if let Some(since) = paced_since {
                pacer.polled(self.now - since, self.now);
            }
            for ev in events.iter() {
                if ev.token() == WAKER_TOKEN {
                    continue;
                }
                active = true;
                if let Some(t) = self.net.transports.iter_mut().find(|t| t.owns(ev.token())) {
                    t.ready(ev, self.now, &mut self.net.events);
                }
            }
            active |= self.progress_transports();
            active |= !self.net.events.is_empty();
            self.handle_transport_events();
            self.fire_timers(self.now);
            self.admit_waiting(self.now);
            #[cfg(feature = "fault-injection")]
            self.release_held(self.now);
            self.drive_touched();
            self.flush_transports();
            self.check_throttle();
            if active {
                Counters::add(&self.shared.counters.worker_turns, 1);
            }
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

    /// Spinning without work: lets a thread that shares our core run (on
    /// an oversubscribed machine it may be the one we are waiting for).
    fn yield_while_spinning(&self, pacer: &mut spin::SpinPacer, shared_cpu: &mut spin::SharedCpu) {
        let before = Instant::now();
        std::thread::yield_now();
        let after = Instant::now();
        pacer.yielded(after - before, after);
        // Sleeping is prompt only where every transport's
        // arrivals wake the worker; a polled one keeps spinning.
        let can_sleep = self.net.transports.iter().all(|t| t.wakes_the_worker());
        if can_sleep && shared_cpu.yielded(after - before, after) {
            Counters::add(&self.shared.counters.spin_pauses, 1);
            tracing::debug!(
                worker = self.idx,
                yield_us = (after - before).as_micros() as u64,
                "a busy thread shares this worker's only CPU: sleeping, not spinning, for a while"
            );
        }
    }

    /// How long the poll may block. About to block: announce it, then look
    /// once more for work that arrived meanwhile (the "poll again after
    /// arming" rule), so a command or completion is never stranded while
    /// we sleep.
    fn block_timeout(&mut self) -> Option<Duration> {
        self.inbox.sleeping.store(true, Ordering::SeqCst);
        std::sync::atomic::fence(Ordering::SeqCst);
        if !self.inbox.rx.is_empty()
            || self.progress_transports()
            || !self.driving.touched.is_empty()
            || !self.arm_transports()
        {
            Some(Duration::ZERO)
        } else {
            // Clock read after `wake_at`: a transport that asks to
            // be polled "now" read the clock itself, later than any
            // earlier reading here, and a positive remainder of a few
            // nanoseconds would become a whole millisecond in epoll.
            let wake = self.net.transports.iter().filter_map(|t| t.wake_at()).min();
            self.now = Instant::now();
            let until = match (self.timers.next, wake) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            until.map(|t| t.saturating_duration_since(self.now))
        }
    }

    /// Messages this messenger sent and received so far.
    fn messages_moved(&self) -> u64 {
        let c = &self.shared.counters;
        Counters::get(&c.tx_messages) + Counters::get(&c.rx_messages)
    }

    /// Shut down, and nothing left to wait for: no session, no pending
    /// link, and no link still writing its last output after its session
    /// closed it with a flush (a Close frame, what a marked-down session
    /// had handed over) — or the deadline has passed.
    fn finished(&self, now: Instant) -> bool {
        match self.timers.shutdown {
            Some(deadline) => {
                now >= deadline
                    || (self.sessions.is_empty()
                        && self.handshakes.pending.is_empty()
                        && self.net.transports.iter().all(|t| t.closing_links() == 0))
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
                    phase = %s.session.phase(),
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
        for (link, _) in self.handshakes.pending.drain() {
            if let Some(e) = self.net.links.get(&link) {
                self.net.transports[e.transport].close(link, false);
            }
        }
        for (link, e) in self.net.links.drain() {
            self.net.transports[e.transport].close(link, false);
        }
        // Links still closing after a flush: those whose peer did not take
        // their last output by the deadline, and those the forced sessions
        // above just closed. Aborted and counted, so that none outlives the
        // worker unseen.
        self.report.aborted_links = self
            .net
            .transports
            .iter_mut()
            .map(|t| t.abort_closing())
            .sum();
        if self.report.aborted_links > 0 {
            tracing::info!(
                worker = self.idx,
                links = self.report.aborted_links,
                "links still closing at the shutdown deadline aborted"
            );
        }
        for (t, token) in std::mem::take(&mut self.net.listeners) {
            self.net.transports[t].unlisten(token);
        }
        self.report.leaked_links = self.net.transports.iter().map(|t| t.link_count()).sum();
        LOCAL_WORKER.with(|l| *l.borrow_mut() = None);
        self.report
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
