//! How a busy-polling worker spins: how long it keeps polling after
//! activity before it blocks ([`BusyWindow`]), and which passes spend
//! system calls ([`SpinPacer`]).
//!
//! # The window
//!
//! After activity a worker polls without blocking for `busy_poll_us`: a
//! blocking wake-up costs ~25 µs each way on an idle machine of this kind,
//! and a transport without wait objects (libfabric's `shm`) is only polled
//! every millisecond while the worker sleeps. A fixed window fails traffic
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
//!   passes.
//! - `sched_yield` on an idle pass lets a thread that shares the core run —
//!   on an oversubscribed machine (a soft RDMA device's kernel threads in a
//!   two-vCPU guest, say) it may be the one the worker waits for. Where no
//!   one else wants the core, it is a system call for nothing.
//!
//! The default ([`SpinPacer::adaptive`]) therefore polls epoll every pass
//! only for transports that need it, and yields on every idle pass only
//! while yielding gives the core away: a yield that returns about as fast
//! as the quickest one seen found no one to run, and the next comes twice
//! as many idle passes later (up to [`MAX_YIELD_EVERY`]); one that took
//! markedly longer found someone, and yields go back to every idle pass. A
//! fixed setting ([`SpinPacer::every`]) does both on one pass in N.

use std::time::Duration;

/// While no transport needs it every pass, a spinning worker asks epoll on
/// one pass in this many.
const EPOLL_EVERY: u32 = 16;
/// The longest run of idle passes between yields that found no one to run.
const MAX_YIELD_EVERY: u32 = 64;
/// A yield that took this much longer than the quickest one seen (and more
/// than [`GAVE_FACTOR`] times it) gave the core to someone.
const GAVE_MARGIN: Duration = Duration::from_micros(2);
const GAVE_FACTOR: u32 = 4;

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
    /// The quickest yield seen: what one costs when no one else runs.
    quickest: Option<Duration>,
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
    /// give the core away.
    pub(crate) fn adaptive() -> Self {
        SpinPacer {
            fixed: None,
            yield_every: 1,
            idle: 0,
            quickest: None,
        }
    }

    /// Both system calls on one pass in `n` (at least 1), whatever happens.
    pub(crate) fn every(n: u32) -> Self {
        SpinPacer {
            fixed: Some(n.max(1)),
            ..Self::adaptive()
        }
    }

    /// Whether spinning pass number `pass` asks epoll; `needed` says whether
    /// a transport needs it every pass.
    pub(crate) fn poll_now(&self, pass: u32, needed: bool) -> bool {
        needed || pass.is_multiple_of(self.fixed.unwrap_or(EPOLL_EVERY))
    }

    /// Whether this idle spinning pass (number `pass`) yields; if so, the
    /// caller reports how long the yield took with [`SpinPacer::yielded`].
    pub(crate) fn yield_now(&mut self, pass: u32) -> bool {
        if let Some(n) = self.fixed {
            return pass.is_multiple_of(n);
        }
        self.idle += 1;
        if self.idle < self.yield_every {
            return false;
        }
        self.idle = 0;
        true
    }

    /// How long the yield [`SpinPacer::yield_now`] asked for took.
    pub(crate) fn yielded(&mut self, took: Duration) {
        if self.fixed.is_some() {
            return;
        }
        let quickest = self.quickest.map_or(took, |q| q.min(took));
        self.quickest = Some(quickest);
        let gave = took > quickest * GAVE_FACTOR && took > quickest + GAVE_MARGIN;
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

    const QUICK: Duration = Duration::from_nanos(400);
    const GAVE: Duration = Duration::from_micros(50);

    /// Idle passes until the next yield.
    fn passes_to_yield(p: &mut SpinPacer) -> u32 {
        (1..=MAX_YIELD_EVERY + 1)
            .find(|&i| p.yield_now(i))
            .expect("yields within MAX_YIELD_EVERY passes")
    }

    #[test]
    fn yields_back_off_while_no_one_runs_and_return_when_someone_does() {
        let mut p = SpinPacer::adaptive();
        let mut gaps = Vec::new();
        for _ in 0..9 {
            gaps.push(passes_to_yield(&mut p));
            p.yielded(QUICK);
        }
        assert_eq!(gaps, [1, 2, 4, 8, 16, 32, 64, 64, 64]);
        // A yield that took long: someone ran, so every idle pass again.
        p.yielded(GAVE);
        assert_eq!(passes_to_yield(&mut p), 1);
        assert_eq!(passes_to_yield(&mut p), 1);
    }

    #[test]
    fn the_quickest_yield_is_the_yardstick() {
        let mut p = SpinPacer::adaptive();
        // The first yield was slow, but nothing quicker was seen yet: it
        // cannot be told from the cost of a yield here.
        passes_to_yield(&mut p);
        p.yielded(GAVE);
        assert_eq!(passes_to_yield(&mut p), 2);
        // A quick one sets the yardstick lower...
        p.yielded(QUICK);
        assert_eq!(passes_to_yield(&mut p), 4);
        // ...slightly slower than it is noise, not a hand-over...
        p.yielded(QUICK + Duration::from_nanos(300));
        assert_eq!(passes_to_yield(&mut p), 8);
        // ...and one as slow as the first now counts as one.
        p.yielded(GAVE);
        assert_eq!(passes_to_yield(&mut p), 1);
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
    fn epoll_every_pass_only_when_a_transport_needs_it() {
        let p = SpinPacer::adaptive();
        assert!((1..=64).all(|pass| p.poll_now(pass, true)));
        let asked = (1..=64).filter(|&pass| p.poll_now(pass, false)).count();
        assert_eq!(asked, 64 / EPOLL_EVERY as usize);
    }

    #[test]
    fn a_fixed_setting_does_not_adapt() {
        let mut p = SpinPacer::from_setting(1);
        assert!((1..=10).all(|pass| p.poll_now(pass, false)));
        for pass in 1..=10 {
            assert!(p.yield_now(pass));
            p.yielded(QUICK);
        }
        let mut p = SpinPacer::from_setting(4);
        let yields = (1..=16).filter(|&pass| p.yield_now(pass)).count();
        assert_eq!(yields, 4);
        assert_eq!((1..=16).filter(|&pass| p.poll_now(pass, false)).count(), 4);
    }
}
