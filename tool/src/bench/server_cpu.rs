//! The bench server's own CPU time, for `--only conns`' CPU per message
//! (issue 58 item 2).
//!
//! Server and clients share this process, and 256 or 1,000 client
//! messengers are as many worker threads on a few cores: the process's
//! rusage (RUSAGE_SELF) would be mostly theirs. What counts is the CPU of
//! the server's own threads — what getrusage(RUSAGE_THREAD) would say in
//! each of them. Linux keeps that clock per thread and shows it to the
//! whole process in /proc/self/task/TID/schedstat (the scheduler's
//! `sum_exec_runtime`, user and system time together, in ns: the clock
//! RUSAGE_THREAD's times are cut from), readable from outside the thread
//! and without a system call the tool would need `unsafe` for. Time a
//! thread spent waiting for a core is not in it, so the clients crowding
//! the cores neither hide nor inflate the server's figure. (A server in a
//! process of its own would give the same number at the price of a child
//! process to drive.)

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

/// Where the process's threads are listed.
const TASKS: &str = "/proc/self/task";
/// How often the window sampler looks at the server.
const SAMPLE_EVERY: Duration = Duration::from_millis(2);
/// `USER_HZ`: the clock ticks of /proc's `stat` times, the fallback where
/// a kernel has no schedstat.
const TICKS_PER_SECOND: u64 = 100;

/// This process's thread ids now.
pub fn thread_ids() -> BTreeSet<u32> {
    std::fs::read_dir(TASKS)
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The server messenger's worker threads.
#[derive(Clone, Debug, Default)]
pub struct ServerThreads {
    tids: Vec<u32>,
}

impl ServerThreads {
    /// The `workers` worker threads among those started since `before`
    /// was listed: call it right after starting the server, before any
    /// other messenger. A new thread names itself once it runs, so this
    /// waits for the names, a second at most (then takes those it found).
    pub fn started_since(before: &BTreeSet<u32>, workers: usize) -> ServerThreads {
        let deadline = Instant::now() + Duration::from_secs(1);
        loop {
            let tids: Vec<u32> = thread_ids()
                .difference(before)
                .copied()
                .filter(|tid| {
                    std::fs::read_to_string(format!("{TASKS}/{tid}/comm"))
                        .is_ok_and(|name| name.starts_with("msgr-worker"))
                })
                .collect();
            if tids.len() >= workers || Instant::now() >= deadline {
                return ServerThreads { tids };
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Whether any was found (and so whether [`ServerThreads::cpu_ns`]
    /// means anything).
    pub fn found(&self) -> bool {
        !self.tids.is_empty()
    }

    /// Their CPU time so far, ns.
    pub fn cpu_ns(&self) -> u64 {
        self.tids.iter().map(|&t| thread_cpu_ns(t)).sum()
    }
}

/// One thread's CPU time so far, ns (0 once it is gone).
fn thread_cpu_ns(tid: u32) -> u64 {
    if let Ok(s) = std::fs::read_to_string(format!("{TASKS}/{tid}/schedstat")) {
        if let Some(ns) = s.split_whitespace().next().and_then(|v| v.parse().ok()) {
            return ns;
        }
    }
    let Ok(stat) = std::fs::read_to_string(format!("{TASKS}/{tid}/stat")) else {
        return 0;
    };
    // The command name may hold spaces: count fields after its ')'.
    // utime and stime: fields 14 and 15 of the line, 12 and 13 after ')'.
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    (ticks(11) + ticks(12)) * (1_000_000_000 / TICKS_PER_SECOND)
}

/// The server's counts the window sampler reads.
#[derive(Clone, Copy, Debug, Default)]
pub struct ServerCounts {
    /// Messages its responder received.
    pub messages: u64,
    /// Units its workers took from their links (`rx_frames`).
    pub frames: u64,
    /// Its workers' loop turns that handled something (`worker_turns`).
    pub turns: u64,
}

/// The server's CPU while it was receiving.
#[derive(Clone, Debug, Serialize)]
pub struct ServerCpu {
    /// Messages the server received in the window.
    pub messages: u64,
    /// From the first sample that saw messages arrive to the last that
    /// saw more, seconds: connecting and closing the clients are outside.
    pub window_s: f64,
    /// CPU time of the server's threads in the window, seconds.
    pub cpu_s: f64,
    /// `cpu_s` per message, ns.
    pub ns_per_message: f64,
    /// `cpu_s / window_s`: the cores the server kept busy.
    pub cores: f64,
    /// Frames (a batch frame each, mostly) its workers took per loop turn
    /// in the window: how many connections' batches one turn served.
    pub frames_per_turn: f64,
    /// Messages delivered per loop turn in the window.
    pub messages_per_turn: f64,
}

/// Runs `run` while sampling the server's `threads` and `counts` (its
/// count of messages received, frames and turns): the server's CPU over
/// the stretch in which the message count grew, or `None` if it never grew
/// twice or no thread was found.
pub fn while_receiving<R>(
    threads: &ServerThreads,
    counts: &(dyn Fn() -> ServerCounts + Sync),
    run: impl FnOnce() -> R,
) -> (R, Option<ServerCpu>) {
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let sampler = s.spawn(|| {
            let mut seen = counts().messages;
            let (mut first, mut last) = (None, None);
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(SAMPLE_EVERY);
                let n = counts();
                if n.messages != seen {
                    seen = n.messages;
                    let sample = (Instant::now(), n, threads.cpu_ns());
                    match first {
                        None => first = Some(sample),
                        Some(_) => last = Some(sample),
                    }
                }
            }
            let ((t0, n0, c0), (t1, n1, c1)) = (first?, last?);
            if !threads.found() {
                return None;
            }
            let messages = n1.messages - n0.messages;
            let turns = n1.turns.saturating_sub(n0.turns).max(1) as f64;
            let cpu_s = c1.saturating_sub(c0) as f64 / 1e9;
            let window_s = t1.duration_since(t0).as_secs_f64();
            Some(ServerCpu {
                messages,
                window_s,
                cpu_s,
                ns_per_message: cpu_s * 1e9 / messages.max(1) as f64,
                cores: cpu_s / window_s.max(1e-9),
                frames_per_turn: n1.frames.saturating_sub(n0.frames) as f64 / turns,
                messages_per_turn: messages as f64 / turns,
            })
        });
        let r = run();
        stop.store(true, Ordering::Relaxed);
        (r, sampler.join().expect("server CPU sampler"))
    })
}

/// Raises this process's soft open-file limit towards `want` (at most
/// its hard limit): the limit it has now.
pub fn raise_nofile(want: u64) -> u64 {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return 0;
    };
    let target = want.min(hard);
    if soft >= target || setrlimit(Resource::RLIMIT_NOFILE, target, hard).is_err() {
        return soft;
    }
    target
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The calling thread's id and CPU time so far, ns.
    fn own_cpu_ns() -> (u32, u64) {
        let link = std::fs::read_link("/proc/thread-self").expect("/proc/thread-self");
        let tid = link
            .file_name()
            .and_then(|t| t.to_str()?.parse().ok())
            .expect("a thread id");
        (tid, thread_cpu_ns(tid))
    }

    #[test]
    fn a_busy_worker_shows_its_cpu_and_other_threads_do_not_count() {
        const SPUN: u64 = 30_000_000;
        let before = thread_ids();
        let (spun_tx, spun) = std::sync::mpsc::channel();
        let (end_tx, end) = std::sync::mpsc::channel::<()>();
        let worker = std::thread::Builder::new()
            .name("msgr-worker-t".into())
            .spawn(move || {
                // CPU, not wall time: on a busy machine a spin of 50 ms
                // may get a fraction of a core.
                let deadline = Instant::now() + Duration::from_secs(20);
                while own_cpu_ns().1 < SPUN && Instant::now() < deadline {
                    std::hint::spin_loop();
                }
                spun_tx.send(own_cpu_ns().0).ok();
                end.recv().ok();
            })
            .expect("spawn");
        let (other_tx, other_tid) = std::sync::mpsc::channel();
        let other = std::thread::spawn(move || {
            other_tx.send(own_cpu_ns().0).ok();
            std::thread::sleep(Duration::from_millis(100));
        });
        let tid = spun
            .recv_timeout(Duration::from_secs(30))
            .expect("worker spun");
        let other_tid = other_tid.recv().expect("other thread");
        let threads = ServerThreads::started_since(&before, 1);
        assert!(threads.tids.contains(&tid), "{tid} not in {threads:?}");
        assert!(!threads.tids.contains(&other_tid), "{threads:?}");
        let ns = thread_cpu_ns(tid);
        assert!(ns >= SPUN, "{SPUN} ns of spinning read as {ns} ns");
        assert!(threads.cpu_ns() >= ns);
        end_tx.send(()).expect("worker");
        worker.join().expect("worker");
        other.join().expect("other");
    }
}
