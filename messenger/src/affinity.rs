//! Which CPU a worker thread runs on (`worker_cpus`).
//!
//! A busy-polling worker wants a CPU of its own. The scheduler places a new
//! thread, and a thread woken by a peer, where it sees fit; two
//! busy-polling threads it puts on one CPU (this worker and a peer's, in a
//! ping-pong on one host) each get half of it until its load balancer moves
//! one. Measured on a 2-vCPU VM (docs/BENCHMARKS.md, 2026-12-03): a 1 MiB
//! one-way over libfabric's `shm` took twice as long for the first 10–20 ms
//! of about half the runs, and for a whole run now and then; with each end
//! pinned to a CPU of its own, in none of 14. Pinning the workers
//! (`worker_cpus`, as Ceph's `ms_async_affinity_cores` does) takes the
//! placement out of the scheduler's hands.
//!
//! Which of this process's threads want a CPU ([`OnCpu`]): its workers,
//! asleep or not (a sleeping one wakes to bring a reply, and must find a
//! CPU then), and callers spinning on a reply. A caller spins only where
//! they leave a CPU spare, and one more beside it for the threads msgr
//! cannot see (a peer process's worker on the same host, the
//! application's): a third spinning thread on two CPUs takes one from a
//! thread that brings the reply — a 64 B call's p50 went from ~32 µs
//! parked to ~120 µs spinning with two busy-polling workers on 2 CPUs, and
//! from ~50–70 µs to ~120 µs beside one busy-polling worker and one that
//! sleeps between messages (docs/HISTORY.md).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
use nix::unistd::Pid;

/// Threads of this process counted by an [`OnCpu`] now.
static ON_CPU: AtomicUsize = AtomicUsize::new(0);

/// The CPUs this process may use, as its first thread to ask saw them (at
/// least 1).
fn cpus() -> usize {
    static CPUS: OnceLock<usize> = OnceLock::new();
    *CPUS.get_or_init(|| allowed_cpus().len().max(1))
}

/// A thread of this process counted as holding a CPU (module docs) while
/// this lives.
#[derive(Debug)]
pub(crate) struct OnCpu(&'static AtomicUsize);

impl OnCpu {
    /// A worker thread, for its lifetime: counted whatever the count.
    pub(crate) fn worker() -> OnCpu {
        ON_CPU.fetch_add(1, Ordering::Relaxed);
        OnCpu(&ON_CPU)
    }

    /// A caller about to spin: counted only if, with it, the threads
    /// counted still leave one CPU spare (module docs), else `None` (it
    /// parks at once).
    pub(crate) fn spare() -> Option<OnCpu> {
        Self::spare_of(&ON_CPU, cpus())
    }

    /// [`OnCpu::spare`] against `count` and `cpus`.
    fn spare_of(count: &'static AtomicUsize, cpus: usize) -> Option<OnCpu> {
        count
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n + 2 <= cpus).then_some(n + 1)
            })
            .ok()
            .map(|_| OnCpu(count))
    }
}

impl Drop for OnCpu {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The CPUs the calling thread may run on now (its affinity mask, as
/// `taskset` set it), in ascending order: what [`crate::MessengerConfig`]'s
/// `worker_cpus` may name. Empty if the kernel would not say.
///
/// Use it to give each busy-polling messenger of one process a CPU of its
/// own — a server and a client in one benchmark, say:
///
/// ```
/// let cpus = msgr::allowed_cpus();
/// let mut cfg = msgr::MessengerConfig::default();
/// if let Some(&cpu) = cpus.first() {
///     cfg.set("worker_cpus", &cpu.to_string()).unwrap();
/// }
/// ```
pub fn allowed_cpus() -> Vec<usize> {
    // Pid 0: the calling thread.
    let Ok(set) = sched_getaffinity(Pid::from_raw(0)) else {
        return Vec::new();
    };
    (0..CpuSet::count())
        .filter(|&c| set.is_set(c).unwrap_or(false))
        .collect()
}

/// Pins the calling thread to `cpu`.
pub(crate) fn pin_current_thread(cpu: usize) -> nix::Result<()> {
    let mut set = CpuSet::new();
    set.set(cpu)?;
    sched_setaffinity(Pid::from_raw(0), &set)
}

/// Why a CPU list does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum CpuListError {
    #[error("`{0}` is not a CPU number")]
    NotANumber(String),
    #[error("range `{0}` runs backwards")]
    Backwards(String),
}

/// Parses a CPU list as `taskset -c` and the kernel write them — `2`,
/// `0,2`, `0-3,8` — into CPU numbers in the order given.
pub(crate) fn parse_cpu_list(text: &str) -> Result<Vec<usize>, CpuListError> {
    let mut cpus = Vec::new();
    for part in text.split(',').map(str::trim) {
        let num = |s: &str| {
            s.trim()
                .parse::<usize>()
                .map_err(|_| CpuListError::NotANumber(s.trim().into()))
        };
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (num(a)?, num(b)?);
                if a > b {
                    return Err(CpuListError::Backwards(part.into()));
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(num(part)?),
        }
    }
    Ok(cpus)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A spinning caller is admitted only while a CPU is spare beside it
    /// and the threads counted, and its CPU is spare again once it stops.
    #[test]
    fn a_caller_spins_only_on_a_spare_cpu() {
        static COUNT: AtomicUsize = AtomicUsize::new(0);
        // Four CPUs, two workers: one caller may spin, not two.
        COUNT.store(2, Ordering::Relaxed);
        let first = OnCpu::spare_of(&COUNT, 4).expect("a spare CPU");
        assert!(OnCpu::spare_of(&COUNT, 4).is_none());
        drop(first);
        assert_eq!(COUNT.load(Ordering::Relaxed), 2);
        // Two CPUs and one worker: none (no CPU would be left spare).
        COUNT.store(1, Ordering::Relaxed);
        assert!(OnCpu::spare_of(&COUNT, 2).is_none());
        assert_eq!(COUNT.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn cpu_lists_parse_as_taskset_writes_them() {
        assert_eq!(parse_cpu_list("2"), Ok(vec![2]));
        assert_eq!(parse_cpu_list("1, 0"), Ok(vec![1, 0]));
        assert_eq!(parse_cpu_list("0-2,7"), Ok(vec![0, 1, 2, 7]));
        assert!(parse_cpu_list("3-1").is_err());
        assert!(parse_cpu_list("x").is_err());
        assert!(parse_cpu_list("1,").is_err());
    }

    #[test]
    fn a_thread_pinned_to_an_allowed_cpu_runs_only_there() {
        let cpu = *allowed_cpus()
            .last()
            .expect("this process may run somewhere");
        let after = std::thread::spawn(move || {
            pin_current_thread(cpu).expect("pin");
            allowed_cpus()
        })
        .join()
        .unwrap();
        assert_eq!(after, vec![cpu]);
    }
}
