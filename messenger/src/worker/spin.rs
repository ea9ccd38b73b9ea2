//! How a busy-polling worker spins: how long it keeps polling after
//! activity before it blocks ([`BusyWindow`]), and which passes spend
//! system calls ([`SpinPacer`]).
//!
//! # The window
//!
//! After activity a worker polls without blocking for `busy_poll_us`: a
//! blocking wake-up costs ~25 µs each way on an idle machine of this kind,
//! and a transport without wait objects is only polled every millisecond
//! while the worker sleeps (libfabric's `shm` towards a peer without the
//! doorbell, `msgr_fabric::bell`; with it, the peer wakes the worker). A fixed window fails traffic
//! whose gaps are a little longer: a 1 MiB ping-pong can leave each side
//! idle for longer than the window per round trip, so both sleep between
//! messages — over `shm` that made whole rounds stall for up to a
//! millisecond per message (p99 720–810 µs against ~170–210 µs with the
//! window below; docs/BENCHMARKS.md). So the window follows the traffic: an idle
//! gap that ended in activity within `busy_poll_max_us` makes the next
//! window twice that gap (at least `busy_poll_us`, at most the maximum); a
//! gap longer than the maximum (the worker slept and traffic is sparse)
//! takes it back to `busy_poll_us`. Gaps within the window change nothing,
//! so a window widened by a burst of large messages stays until traffic
//! stops, and costs one widened spin then.
//!
//! # System calls
//!
//! `epoll_wait` and `sched_yield` (`busy_poll_syscall_every`). While it
//! spins, a worker polls its transports' queues every pass. Two system
//! calls per pass took a third of a spinning worker's time on a 64 B shm
//! ping-pong (docs/BENCHMARKS.md), and they delay the pass that finds the
//! next message:
//! - `epoll_wait` is needed every pass only where data arrives as fd
//!   readiness (TCP sockets, unless the TCP transport reads its one or two
//!   links itself: [`msgr_backends::Transport::ready_every_pass`]);
//!   elsewhere listeners, connection set-up and the waker can wait a few
//!   microseconds.
//! - `sched_yield` on an idle pass lets a thread that shares the core run —
//!   on an oversubscribed machine (a soft RDMA device's kernel threads in a
//!   two-vCPU guest, say) it may be the one the worker waits for. Where no
//!   one else wants the core, it is a system call for nothing.
//!
//! The default ([`SpinPacer::adaptive`]) gates each call twice:
//! - by passes: `epoll_wait` on one pass in [`EPOLL_EVERY`] (every pass
//!   only for transports that need it); `sched_yield` on every idle pass
//!   while yields give the core away — a yield that takes markedly longer
//!   than the quickest one seen found someone to run — and, while they
//!   find no one, twice as many idle passes later each time (up to
//!   [`MAX_YIELD_EVERY`]);
//! - by price: the worker times the calls, and after one the next waits
//!   [`CALL_SHARE`] times the quickest such call seen (at most
//!   [`MAX_CALL_GAP`]), so fruitless calls take at most about
//!   1/[`CALL_SHARE`] of a spinning worker's time. What a pass and a
//!   system call cost differs between machines: on the Firecracker guest
//!   of docs/BENCHMARKS.md (2026-12-04) `epoll_wait` took 185 ns and a
//!   yield that found no one 612 ns, and the pass gate alone spent them on
//!   nearly every round trip of a 64 B shm ping-pong.
//!
//! A fixed setting ([`SpinPacer::every`]) does both on one pass in N.
//!
//! # A CPU shared with a busy thread
//!
//! A worker that may run on one CPU only (`worker_cpus`, or a process
//! under `taskset -c N`) cannot be moved off a CPU that another busy thread
//! also wants. Spinning there hands that thread whole time slices — each
//! yield, and each time the worker's own slice ends — while the worker's
//! peer waits: a 64 B round trip measured ~2 ms pinned against 15–60 µs
//! placed by the scheduler (docs/BENCHMARKS.md, 2026-12-04). A yield that
//! took [`WHOLE_SLICE`] or more is such a hand-over (a slice is 0.75 ms
//! and up; a short helper — a soft RDMA device's kernel thread — gives the
//! core back sooner), or a moment the hypervisor took the whole virtual
//! CPU away, which a VM sees now and then on a quiet machine. Two of them
//! within [`SHARED_CPU_EVIDENCE`] are a busy thread (it takes about every
//! other yield), and a worker confined to one CPU then stops spinning for
//! [`SHARED_CPU_PAUSE`] ([`SharedCpu`]): it sleeps on its wait fds, and a
//! thread woken from sleep preempts a busy one within microseconds where
//! a spinning one waits its turn. Not where a transport has no wait
//! objects (polled CQs: `Transport::wakes_the_worker`; libfabric's `shm`
//! towards a peer without the doorbell): asleep it is polled once a
//! millisecond, and a ping-pong over such shm with a busy thread on each
//! end's CPU went from a median of ~2 µs (a mean of 0.5–0.7 ms) spinning to
//! ~550 µs (the same mean) sleeping.

use std::time::{Duration, Instant};

/// While no transport needs it every pass, a spinning worker asks epoll on
/// at most one pass in this many.
const EPOLL_EVERY: u32 = 16;
/// The longest run of idle passes between yields that found no one to run.
const MAX_YIELD_EVERY: u32 = 64;
/// A paced system call waits this many times its quickest run before it
/// is made again: at most about 1/64 of a spinning worker's time goes to it.
const CALL_SHARE: u32 = 64;
/// The longest the price gate holds a call back, whatever the price (the
/// pass gate may hold it longer, as it always did).
const MAX_CALL_GAP: Duration = Duration::from_micros(50);
/// A yield that took this much longer than the quickest one seen (and more
/// than [`GAVE_FACTOR`] times it) gave the core to someone.
const GAVE_MARGIN: Duration = Duration::from_micros(2);
const GAVE_FACTOR: u32 = 4;
/// A yield that took this long handed a whole time slice to a thread that
/// wanted the CPU for itself (module docs).
const WHOLE_SLICE: Duration = Duration::from_micros(500);
/// Two yields of a whole slice this close together show a busy thread on
/// the CPU, not the hypervisor's rare hiccup.
const SHARED_CPU_EVIDENCE: Duration = Duration::from_millis(20);
/// How long a worker confined to one CPU sleeps instead of spinning once
/// it found a busy thread there; then it spins again, and finds out.
const SHARED_CPU_PAUSE: Duration = Duration::from_millis(50);

/// Whether a worker confined to one CPU should stop spinning because a
/// busy thread shares that CPU (module docs).
#[derive(Debug)]
pub(crate) struct SharedCpu {
    /// The worker may run on one CPU only; otherwise it never pauses.
    confined: bool,
    /// When the last yield of a whole slice ended, if it is the only one
    /// lately.
    last_whole_slice: Option<Instant>,
    /// Spinning is paused until then.
    paused_until: Option<Instant>,
}

impl SharedCpu {
    /// For a worker that may run on one CPU only (`confined`) or not.
    pub(crate) fn new(confined: bool) -> Self {
        SharedCpu {
            confined,
            last_whole_slice: None,
            paused_until: None,
        }
    }

    /// Whether spinning is paused at `now` (the worker sleeps instead).
    pub(crate) fn paused(&self, now: Instant) -> bool {
        self.paused_until.is_some_and(|until| now < until)
    }

    /// A yield took `took` and ended at `end`; true if that starts a pause.
    pub(crate) fn yielded(&mut self, took: Duration, end: Instant) -> bool {
        if !self.confined || took < WHOLE_SLICE {
            return false;
        }
        let again = self
            .last_whole_slice
            .is_some_and(|last| end.saturating_duration_since(last) <= SHARED_CPU_EVIDENCE);
        if !again {
            self.last_whole_slice = Some(end);
            return false;
        }
        self.last_whole_slice = None;
        self.paused_until = Some(end + SHARED_CPU_PAUSE);
        true
    }
}

/// How long a worker keeps polling after activity before it blocks
/// (module docs).
#[derive(Debug)]
pub(crate) struct BusyWindow {
    /// `busy_poll_us`: the window after isolated activity (0: never spin).
    base: Duration,
    /// `busy_poll_max_us`: the widest window traffic can ask for.
    max: Duration,
    /// The window now.
    window: Duration,
}

impl BusyWindow {
    /// From the `busy_poll_us` and `busy_poll_max_us` settings; a maximum
    /// below the base is the base (no widening).
    pub(crate) fn new(base: Duration, max: Duration) -> Self {
        BusyWindow {
            base,
            max: max.max(base),
            window: base,
        }
    }

    /// The window now: how long after the last activity the worker spins.
    pub(crate) fn get(&self) -> Duration {
        self.window
    }

    /// Activity came `gap` after the previous activity.
    pub(crate) fn activity_after(&mut self, gap: Duration) {
        if self.base.is_zero() {
            return;
        }
        if gap > self.max {
            self.window = self.base;
        } else if gap > self.base {
            self.window = (gap * 2).clamp(self.base, self.max);
        }
    }
}

/// The price gate of one system call of the spin loop (module docs).
#[derive(Debug, Default)]
struct PriceGate {
    /// The quickest run seen: what the call costs when it finds nothing.
    quickest: Option<Duration>,
    /// Not before this; `None`: now.
    next: Option<Instant>,
}

impl PriceGate {
    fn open(&self, now: Instant) -> bool {
        self.next.is_none_or(|next| now >= next)
    }

    /// The call ended at `end` after `took`; `found` says whether it found
    /// something to do (then the gate stays open).
    fn made(&mut self, took: Duration, end: Instant, found: bool) {
        let quickest = self.quickest.map_or(took, |q| q.min(took));
        self.quickest = Some(quickest);
        self.next = if found {
            None
        } else {
            Some(end + (quickest * CALL_SHARE).min(MAX_CALL_GAP))
        };
    }
}

/// Decides, pass by pass, whether a spinning worker calls `epoll_wait` and
/// `sched_yield` (module docs).
#[derive(Debug)]
pub(crate) struct SpinPacer {
    /// `busy_poll_syscall_every` when set: both calls on one pass in this
    /// many, no adapting.
    fixed: Option<u32>,
    /// Idle passes between yields (adaptive).
    yield_every: u32,
    /// Idle passes since the last yield.
    idle: u32,
    epoll_price: PriceGate,
    yield_price: PriceGate,
}

impl SpinPacer {
    /// From the `busy_poll_syscall_every` setting: 0 adapts, N ≥ 1 is fixed.
    pub(crate) fn from_setting(every: u32) -> Self {
        if every == 0 {
            Self::adaptive()
        } else {
            Self::every(every)
        }
    }

    /// Epoll every pass only where a transport needs it; yields while they
    /// give the core away; both no more often than their price allows.
    pub(crate) fn adaptive() -> Self {
        SpinPacer {
            fixed: None,
            yield_every: 1,
            idle: 0,
            epoll_price: PriceGate::default(),
            yield_price: PriceGate::default(),
        }
    }

    /// Both system calls on one pass in `n` (at least 1), whatever happens.
    pub(crate) fn every(n: u32) -> Self {
        SpinPacer {
            fixed: Some(n.max(1)),
            ..Self::adaptive()
        }
    }

    /// Whether the pacer learns the calls' price (not a fixed setting): the
    /// caller times the calls it asks for only then.
    pub(crate) fn adapts(&self) -> bool {
        self.fixed.is_none()
    }

    /// Whether spinning pass number `pass`, at `now`, asks epoll where no
    /// transport needs it every pass; if so, the caller reports the call
    /// with [`SpinPacer::polled`].
    pub(crate) fn poll_now(&self, now: Instant, pass: u32) -> bool {
        match self.fixed {
            Some(n) => pass.is_multiple_of(n),
            None => pass.is_multiple_of(EPOLL_EVERY) && self.epoll_price.open(now),
        }
    }

    /// The paced `epoll_wait` [`SpinPacer::poll_now`] asked for took
    /// `took` and ended at `end`. What it found is handled in this pass;
    /// the next one waits its turn either way (an fd that stays busy —
    /// a `tcp` provider's sockets — would otherwise keep the gate open).
    pub(crate) fn polled(&mut self, took: Duration, end: Instant) {
        if self.fixed.is_none() {
            self.epoll_price.made(took, end, false);
        }
    }

    /// Whether this idle spinning pass (number `pass`, at `now`) yields; if
    /// so, the caller reports how long the yield took with
    /// [`SpinPacer::yielded`].
    pub(crate) fn yield_now(&mut self, now: Instant, pass: u32) -> bool {
        if let Some(n) = self.fixed {
            return pass.is_multiple_of(n);
        }
        self.idle += 1;
        if self.idle < self.yield_every || !self.yield_price.open(now) {
            return false;
        }
        self.idle = 0;
        true
    }

    /// The yield [`SpinPacer::yield_now`] asked for took `took` and ended at
    /// `end`.
    pub(crate) fn yielded(&mut self, took: Duration, end: Instant) {
        if self.fixed.is_some() {
            return;
        }
        // Judged against the quickest yield seen before this one: the first
        // cannot be told from the price of a yield here.
        let gave = self
            .yield_price
            .quickest
            .is_some_and(|quickest| took > quickest * GAVE_FACTOR && took > quickest + GAVE_MARGIN);
        self.yield_price.made(took, end, gave);
        self.yield_every = if gave {
            1
        } else {
            (self.yield_every * 2).min(MAX_YIELD_EVERY)
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_whole_slices_close_together_pause_a_confined_worker() {
        let t0 = Instant::now();
        let slice = Duration::from_millis(1);
        let mut c = SharedCpu::new(true);
        // Short yields never count.
        assert!(!c.yielded(Duration::from_micros(100), t0));
        // One whole slice alone: the hypervisor, perhaps.
        assert!(!c.yielded(slice, t0 + slice));
        assert!(!c.paused(t0 + slice));
        // Another within the evidence window: a busy thread.
        let end = t0 + Duration::from_millis(5);
        assert!(c.yielded(slice, end));
        assert!(c.paused(end));
        assert!(c.paused(end + SHARED_CPU_PAUSE - Duration::from_millis(1)));
        assert!(!c.paused(end + SHARED_CPU_PAUSE));
        // Two whole slices far apart do not.
        let later = end + Duration::from_secs(1);
        assert!(!c.yielded(slice, later));
        assert!(!c.yielded(slice, later + SHARED_CPU_EVIDENCE + slice));
        assert!(!c.paused(later + SHARED_CPU_EVIDENCE + slice));
    }

    #[test]
    fn a_worker_free_to_move_never_pauses() {
        let t0 = Instant::now();
        let mut c = SharedCpu::new(false);
        for i in 0..10 {
            assert!(!c.yielded(Duration::from_millis(3), t0 + Duration::from_millis(i)));
        }
        assert!(!c.paused(t0 + Duration::from_millis(10)));
    }

    const QUICK: Duration = Duration::from_nanos(400);
    const GAVE: Duration = Duration::from_micros(50);
    const US: Duration = Duration::from_micros(1);
    /// Far enough apart that no price gate is closed.
    const LATER: Duration = Duration::from_millis(1);

    /// Idle passes until the next yield, `LATER` apart (the price gate
    /// open): the pass gate alone.
    fn passes_to_yield(p: &mut SpinPacer, t: &mut Instant) -> u32 {
        (1..=MAX_YIELD_EVERY + 1)
            .find(|&i| {
                *t += LATER;
                p.yield_now(*t, i)
            })
            .expect("yields within MAX_YIELD_EVERY passes")
    }

    #[test]
    fn yields_back_off_while_no_one_runs_and_return_when_someone_does() {
        let mut t = Instant::now();
        let mut p = SpinPacer::adaptive();
        let mut gaps = Vec::new();
        for _ in 0..9 {
            gaps.push(passes_to_yield(&mut p, &mut t));
            p.yielded(QUICK, t);
        }
        assert_eq!(gaps, [1, 2, 4, 8, 16, 32, 64, 64, 64]);
        // A yield that took long: someone ran, so every idle pass again.
        p.yielded(GAVE, t);
        assert_eq!(passes_to_yield(&mut p, &mut t), 1);
        assert_eq!(passes_to_yield(&mut p, &mut t), 1);
    }

    #[test]
    fn the_quickest_yield_is_the_yardstick() {
        let mut t = Instant::now();
        let mut p = SpinPacer::adaptive();
        // The first yield was slow, but nothing quicker was seen yet: it
        // cannot be told from the cost of a yield here.
        passes_to_yield(&mut p, &mut t);
        p.yielded(GAVE, t);
        assert_eq!(passes_to_yield(&mut p, &mut t), 2);
        // A quick one sets the yardstick lower...
        p.yielded(QUICK, t);
        assert_eq!(passes_to_yield(&mut p, &mut t), 4);
        // ...slightly slower than it is noise, not a hand-over...
        p.yielded(QUICK + Duration::from_nanos(300), t);
        assert_eq!(passes_to_yield(&mut p, &mut t), 8);
        // ...and one as slow as the first now counts as one.
        p.yielded(GAVE, t);
        assert_eq!(passes_to_yield(&mut p, &mut t), 1);
    }

    #[test]
    fn a_yield_that_found_no_one_also_waits_its_price_times_the_share() {
        let t = Instant::now();
        let mut p = SpinPacer::adaptive();
        assert!(p.yield_now(t, 1), "the first idle pass yields");
        p.yielded(QUICK, t);
        // The pass gate opens after two idle passes; the price gate at
        // 64 × 400 ns.
        let gap = QUICK * CALL_SHARE;
        assert!((2..100).all(|pass| !p.yield_now(t + gap - US, pass)));
        assert!(p.yield_now(t + gap, 100));
        // A yield that gave the core away opens both gates.
        p.yielded(GAVE, t + gap);
        assert!(p.yield_now(t + gap, 101));
    }

    #[test]
    fn epoll_waits_for_both_its_pass_and_its_price() {
        let t = Instant::now();
        let mut p = SpinPacer::adaptive();
        assert!(!p.poll_now(t, 1));
        assert!(p.poll_now(t, EPOLL_EVERY));
        let epoll = Duration::from_nanos(185);
        p.polled(epoll, t);
        let gap = epoll * CALL_SHARE; // 11.84 µs
        assert!(!p.poll_now(t + gap - US, 2 * EPOLL_EVERY), "price gate");
        assert!(!p.poll_now(t + gap, 2 * EPOLL_EVERY + 1), "pass gate");
        assert!(p.poll_now(t + gap, 3 * EPOLL_EVERY));
        // A slower call does not move the yardstick.
        p.polled(epoll * 10, t + gap);
        assert!(p.poll_now(t + gap * 2, 4 * EPOLL_EVERY));
    }

    #[test]
    fn the_price_gate_holds_no_call_longer_than_the_longest_gap() {
        let t = Instant::now();
        let mut p = SpinPacer::adaptive();
        let slow = Duration::from_micros(20); // × 64: 1.28 ms
        p.polled(slow, t);
        assert!(!p.poll_now(t + MAX_CALL_GAP - US, EPOLL_EVERY));
        assert!(p.poll_now(t + MAX_CALL_GAP, EPOLL_EVERY));
        assert!(p.yield_now(t, 1));
        p.yielded(slow, t);
        assert!(!p.yield_now(t + MAX_CALL_GAP - US, 2));
        assert!(!p.yield_now(t + MAX_CALL_GAP - US, 3));
        assert!(p.yield_now(t + MAX_CALL_GAP, 4));
    }

    const BASE: Duration = Duration::from_micros(200);
    const MAX: Duration = Duration::from_micros(2000);

    #[test]
    fn the_window_covers_gaps_traffic_showed_and_shrinks_when_it_thins() {
        let mut w = BusyWindow::new(BASE, MAX);
        assert_eq!(w.get(), BASE);
        // Gaps within the window change nothing.
        w.activity_after(Duration::from_micros(3));
        w.activity_after(BASE);
        assert_eq!(w.get(), BASE);
        // A 1 MiB ping-pong's gaps: twice the gap.
        w.activity_after(Duration::from_micros(300));
        assert_eq!(w.get(), Duration::from_micros(600));
        // Back-to-back activity inside a burst keeps it.
        w.activity_after(Duration::from_micros(2));
        assert_eq!(w.get(), Duration::from_micros(600));
        // Never wider than the maximum.
        w.activity_after(Duration::from_micros(1500));
        assert_eq!(w.get(), MAX);
        // Traffic thinned out: the worker slept; back to the base.
        w.activity_after(Duration::from_millis(50));
        assert_eq!(w.get(), BASE);
    }

    #[test]
    fn no_spinning_stays_no_spinning_and_max_below_base_is_base() {
        let mut w = BusyWindow::new(Duration::ZERO, MAX);
        w.activity_after(Duration::from_micros(300));
        assert_eq!(w.get(), Duration::ZERO);
        let mut w = BusyWindow::new(BASE, Duration::from_micros(50));
        w.activity_after(Duration::from_micros(150));
        w.activity_after(Duration::from_micros(300));
        assert_eq!(w.get(), BASE);
    }

    #[test]
    fn a_fixed_setting_does_not_adapt() {
        let t = Instant::now();
        let mut p = SpinPacer::from_setting(1);
        for pass in 1..=10 {
            assert!(p.poll_now(t, pass));
            p.polled(QUICK, t);
            assert!(p.yield_now(t, pass));
            p.yielded(QUICK, t);
        }
        let mut p = SpinPacer::from_setting(4);
        let yields = (1..=16).filter(|&pass| p.yield_now(t, pass)).count();
        assert_eq!(yields, 4);
        assert_eq!((1..=16).filter(|&pass| p.poll_now(t, pass)).count(), 4);
    }
}
