//! Was the machine quiet? /proc/loadavg and /proc/stat, minus our own CPU time.
//!
//! On this kind of VM a blocking wake-up costs ~25 µs when the machine is idle
//! and almost nothing when other processes keep the cores awake, so every
//! latency figure must say which it was.

use std::time::Duration;

use serde::Serialize;

/// Other processes may use at most this many cores (on average) for the
/// machine to count as quiet.
pub const QUIET_OTHER_CORES: f64 = 0.2;

#[derive(Clone, Copy, Debug)]
struct CpuSample {
    /// Jiffies the whole machine spent busy / in total (all cores).
    busy: u64,
    total: u64,
    /// Jiffies this process spent (user + system, all threads).
    own: u64,
}

fn read_cpu() -> Option<CpuSample> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .take(8)
        .filter_map(|x| x.parse().ok())
        .collect();
    if v.len() < 5 {
        return None;
    }
    let total: u64 = v.iter().sum();
    let idle = v[3] + v[4]; // idle + iowait
    let own = std::fs::read_to_string("/proc/self/stat").ok()?;
    let after = own.rsplit_once(')')?.1;
    let f: Vec<&str> = after.split_whitespace().collect();
    // After the command name: state(3) ... utime(14) stime(15) → indices 11, 12.
    let own = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    Some(CpuSample {
        busy: total - idle,
        total,
        own,
    })
}

fn loadavg() -> [f64; 3] {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let mut out = [f64::NAN; 3];
    for (o, v) in out.iter_mut().zip(text.split_whitespace()) {
        *o = v.parse().unwrap_or(f64::NAN);
    }
    out
}

/// Cores busy with other processes between two samples.
fn other_cores(a: &CpuSample, b: &CpuSample, cores: f64) -> f64 {
    let total = b.total.saturating_sub(a.total) as f64;
    if total <= 0.0 {
        return 0.0;
    }
    let others = other_jiffies(a, b) as f64;
    (others / total * cores).max(0.0)
}

/// Jiffies other processes spent between two samples.
fn other_jiffies(a: &CpuSample, b: &CpuSample) -> u64 {
    b.busy
        .saturating_sub(a.busy)
        .saturating_sub(b.own.saturating_sub(a.own))
}

/// Whether other processes' CPU time over a window counts as load: at
/// least [`QUIET_OTHER_CORES`] on average, and more than one jiffy — the
/// counters' resolution (10 ms of CPU), which over a latency run of a
/// tenth of a second alone would read as 0.17 cores of "others" (the
/// kernel's accounting of a tick, not another process).
fn loaded(cores_used: f64, jiffies: u64) -> bool {
    jiffies > 1 && cores_used >= QUIET_OTHER_CORES
}

/// Starts watching; [`Watch::finish`] says what happened meanwhile.
pub struct Watch {
    cores: usize,
    load_before: [f64; 3],
    idle_before: Option<f64>,
    start: Option<CpuSample>,
}

/// How busy the machine was, recorded with every benchmark.
#[derive(Clone, Debug, Serialize)]
pub struct MachineState {
    /// Online CPUs.
    pub cores: usize,
    /// /proc/loadavg before the run (1, 5, 15 min).
    pub loadavg_before: [f64; 3],
    /// /proc/loadavg after the run.
    pub loadavg_after: [f64; 3],
    /// Cores other processes kept busy in a short sample before the run.
    pub other_cores_before: Option<f64>,
    /// Cores other processes kept busy during the run (machine busy time
    /// minus this process's CPU time).
    pub other_cores_during: Option<f64>,
    /// Cores this process used during the run.
    pub own_cores_during: Option<f64>,
    /// Other processes used less than [`QUIET_OTHER_CORES`] before and during.
    pub quiet: bool,
}

impl Watch {
    /// Samples the machine for `pre` (nothing of ours running), then starts.
    pub fn start(pre: Duration) -> Watch {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let load_before = loadavg();
        let idle_before = read_cpu().and_then(|a| {
            std::thread::sleep(pre);
            read_cpu().map(|b| other_cores(&a, &b, cores as f64))
        });
        Watch {
            cores,
            load_before,
            idle_before,
            start: read_cpu(),
        }
    }

    /// Cores other processes kept busy in the sample before the start
    /// (None if /proc could not be read).
    pub fn others_before(&self) -> Option<f64> {
        self.idle_before
    }

    /// What the machine did since [`Watch::start`].
    pub fn finish(&self) -> MachineState {
        let end = read_cpu();
        let (others, own, load_during) = match (&self.start, &end) {
            (Some(a), Some(b)) => {
                let total = b.total.saturating_sub(a.total).max(1) as f64;
                let own = (b.own - a.own) as f64 / total * self.cores as f64;
                let others = other_cores(a, b, self.cores as f64);
                let load = loaded(others, other_jiffies(a, b));
                (Some(others), Some(own), load)
            }
            _ => (None, None, true),
        };
        let quiet = self.idle_before.unwrap_or(f64::INFINITY) < QUIET_OTHER_CORES && !load_during;
        MachineState {
            cores: self.cores,
            loadavg_before: self.load_before,
            loadavg_after: loadavg(),
            other_cores_before: self.idle_before,
            other_cores_during: others,
            own_cores_during: own,
            quiet,
        }
    }
}

impl MachineState {
    /// One line: "quiet" or "LOADED" and why.
    pub fn describe(&self) -> String {
        let f = |v: Option<f64>| v.map_or("?".to_owned(), |v| format!("{v:.2}"));
        format!(
            "machine {}: other processes used {} of {} cores before and {} during the run \
             (this run: {}); loadavg {:.2} {:.2} {:.2} before, {:.2} after",
            if self.quiet { "quiet" } else { "LOADED" },
            f(self.other_cores_before),
            self.cores,
            f(self.other_cores_during),
            f(self.own_cores_during),
            self.loadavg_before[0],
            self.loadavg_before[1],
            self.loadavg_before[2],
            self.loadavg_after[0],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_jiffy_of_others_is_resolution_not_load() {
        assert!(!loaded(0.17, 1), "a tick over a short run");
        assert!(loaded(0.3, 2));
        assert!(!loaded(0.1, 50), "little, over a long run");
    }
}
