//! A cluster on one machine (`msgr-stress --cluster N`, docs/STRESS.md):
//! N node processes, each in its own network namespace on a bridge
//! ([`NetnsCluster`]), each a messenger with a lossless-peer session to every
//! other node, one-way streams and calls with deadlines between them, and
//! faults scheduled by a seed: kill -9 and restart, partitions healed later,
//! a slow node, SIGSTOP/SIGCONT beyond the keepalive timeout, a rolling
//! graceful restart. The nodes report on their stdout ([`node`]); this
//! process checks their logs ([`check`]), measures reconvergence and
//! reconnect rates, samples RSS and descriptors, and reports.
//!
//! # Layers
//!
//! 1. `check`: the checks on the nodes' logs.
//! 2. `node`: one node process, which writes those logs.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead as _, BufReader, Write as _};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;

pub mod check;
pub mod node;

use crate::stress::netns::{NetnsCluster, NetnsError};
use check::IncarnationRecord;
use node::{NodeFinal, NodeStats};

/// The port every node listens on (each in its own namespace).
pub const NODE_PORT: u16 = 7400;

/// What a cluster run does.
#[derive(Clone, Debug)]
pub struct ClusterOptions {
    /// Nodes.
    pub nodes: usize,
    /// The run's seed.
    pub seed: u64,
    /// How long faults are scheduled (the drain and checks come after).
    pub duration: Duration,
    /// One-way messages per second per node.
    pub rate: u32,
    /// Each call's deadline.
    pub call_deadline: Duration,
    /// Print events on stderr as they happen.
    pub verbose: bool,
    /// Plant a bug (node 0's first incarnation sends one message twice),
    /// to see the run fail.
    pub plant_duplicate: bool,
    /// The msgr-stress binary the nodes run (`--cluster-node`); None: this
    /// process's own.
    pub node_program: Option<std::path::PathBuf>,
}

impl ClusterOptions {
    /// Defaults: `nodes` nodes, 60 s, a random seed, 500 messages/s per node.
    pub fn new(nodes: usize) -> Self {
        ClusterOptions {
            nodes,
            seed: rand::random(),
            duration: Duration::from_secs(60),
            rate: 500,
            call_deadline: Duration::from_secs(2),
            verbose: false,
            plant_duplicate: false,
            node_program: None,
        }
    }
}

/// The messenger configuration of every node: short timers (a keepalive
/// timeout of 1.5 s), a backoff from 50 ms to 1 s, one worker that does not
/// spin (N nodes share the machine).
pub fn cluster_messenger_config() -> msgr::MessengerConfig {
    let mut cfg = crate::stress::default_messenger_config();
    cfg.workers = 1;
    cfg.busy_poll = Duration::ZERO;
    cfg.busy_poll_max = Duration::ZERO;
    cfg.session.keepalive_interval = Duration::from_millis(200);
    cfg.session.keepalive_timeout = Duration::from_millis(1500);
    cfg.session.handshake_timeout = Duration::from_secs(1);
    cfg.session.backoff_min = Duration::from_millis(50);
    cfg.session.backoff_max = Duration::from_secs(1);
    cfg
}

/// One fault (or the start), as it happened.
#[derive(Clone, Debug, Serialize)]
pub struct FaultEvent {
    /// Seconds since the start.
    pub at_s: f64,
    /// What was done.
    pub what: String,
    /// Milliseconds from its end (the heal, the restart, the SIGCONT) until
    /// every node had every session open again; None: not by the deadline.
    pub reconverge_ms: Option<u64>,
    /// Redials per second per node, the peak of the 1-s windows in the 3 s
    /// after its end.
    pub peak_redials_per_s_per_node: f64,
    /// For a partition: redials per second per node in its last 2 s (the
    /// backoff at its ceiling): the steady rate the peak is compared with.
    pub steady_redials_per_s_per_node: Option<f64>,
}

/// Per node, over all its incarnations.
#[derive(Clone, Debug, Default, Serialize)]
pub struct NodeSummary {
    /// Node.
    pub node: u32,
    /// Incarnations (1 + restarts).
    pub incarnations: u32,
    /// Largest RSS seen, KiB.
    pub max_rss_kib: u64,
    /// RSS at the end, KiB.
    pub end_rss_kib: u64,
    /// Most open descriptors seen.
    pub max_fds: u64,
    /// Descriptors at the end.
    pub end_fds: u64,
}

/// The result of a cluster run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ClusterReport {
    /// Seed.
    pub seed: u64,
    /// Nodes.
    pub nodes: usize,
    /// Seconds from the first start to the end of the checks.
    pub elapsed_s: f64,
    /// Violations (the first ones).
    pub violations: Vec<String>,
    /// How many.
    pub violation_count: u64,
    /// Faults and their measures.
    pub events: Vec<FaultEvent>,
    /// One-way messages delivered.
    pub delivered: u64,
    /// Delivered per second of the run.
    pub messages_per_s: f64,
    /// Messages of restarted receivers' old sessions, reported by the
    /// senders' resets and never delivered to the new incarnation.
    pub dropped_by_restarts: u64,
    /// The `messages_dropped` counters of the incarnations that drained:
    /// what their sessions' resets reported dropped (at least the above,
    /// where no receiver was killed just after a delivery its last report
    /// missed).
    pub reported_dropped: u64,
    /// Calls answered correctly.
    pub calls_ok: u64,
    /// Calls failed, by reason.
    pub calls_failed: BTreeMap<String, u64>,
    /// Median latency of answered calls, µs.
    pub call_p50_us: u64,
    /// 99th percentile, µs.
    pub call_p99_us: u64,
    /// The longest any call took (answered or failed), ms.
    pub slowest_call_ms: u64,
    /// Calls that returned more than 3 s after their deadline (reported:
    /// a loaded machine delays threads; over 30 s is a violation).
    pub late_calls: u64,
    /// The first of them: ms taken, how they ended.
    pub late_call_examples: Vec<(u64, String)>,
    /// Per node.
    pub node_summaries: Vec<NodeSummary>,
    /// Longest reconvergence after a heal, ms, and the bar (2 × backoff_max).
    pub worst_heal_reconverge_ms: Option<u64>,
    /// 2 × backoff_max, ms.
    pub reconverge_bar_ms: u64,
    /// Highest peak/steady redial ratio after a heal (bar: under 2).
    pub worst_heal_redial_ratio: Option<f64>,
    /// What the slow node got (netem, or nftables loss where no netem).
    pub slow_link: String,
}

impl ClusterReport {
    /// No violation.
    pub fn passed(&self) -> bool {
        self.violation_count == 0
    }

    /// The human-readable table.
    pub fn summary(&self) -> String {
        let mut s = String::new();
        use std::fmt::Write as _;
        let _ = writeln!(
            s,
            "cluster of {} nodes, seed {}: {} in {:.1} s, {} violations",
            self.nodes,
            self.seed,
            if self.passed() { "PASSED" } else { "FAILED" },
            self.elapsed_s,
            self.violation_count
        );
        let _ = writeln!(
            s,
            "messages delivered {} ({:.0}/s), dropped with restarted peers' old sessions {} (the resets reported {} dropped)",
            self.delivered, self.messages_per_s, self.dropped_by_restarts, self.reported_dropped
        );
        let _ = writeln!(
            s,
            "calls ok {} (p50 {} µs, p99 {} µs), failed {:?}; the slowest took {} ms, {} ended over 3 s past their deadline {:?}",
            self.calls_ok,
            self.call_p50_us,
            self.call_p99_us,
            self.calls_failed,
            self.slowest_call_ms,
            self.late_calls,
            self.late_call_examples
        );
        let _ = writeln!(
            s,
            "{:>7}  {:<44} {:>12} {:>14} {:>14}",
            "at s", "fault", "reconverge", "peak redial/s", "steady/s"
        );
        for e in &self.events {
            let _ = writeln!(
                s,
                "{:>7.1}  {:<44} {:>12} {:>14.2} {:>14}",
                e.at_s,
                e.what,
                e.reconverge_ms
                    .map_or("NOT".to_string(), |ms| format!("{ms} ms")),
                e.peak_redials_per_s_per_node,
                e.steady_redials_per_s_per_node
                    .map_or(String::new(), |r| format!("{r:.2}"))
            );
        }
        let _ = writeln!(
            s,
            "after heals: worst reconvergence {} (bar {} ms), worst peak/steady redials {} (bar 2)",
            self.worst_heal_reconverge_ms
                .map_or("-".to_string(), |ms| format!("{ms} ms")),
            self.reconverge_bar_ms,
            self.worst_heal_redial_ratio
                .map_or("-".to_string(), |r| format!("{r:.2}"))
        );
        let _ = writeln!(s, "slow link: {}", self.slow_link);
        let _ = writeln!(
            s,
            "{:>5} {:>5} {:>12} {:>12} {:>8} {:>8}",
            "node", "incs", "max RSS KiB", "end RSS KiB", "max fds", "end fds"
        );
        for n in &self.node_summaries {
            let _ = writeln!(
                s,
                "{:>5} {:>5} {:>12} {:>12} {:>8} {:>8}",
                n.node, n.incarnations, n.max_rss_kib, n.end_rss_kib, n.max_fds, n.end_fds
            );
        }
        for v in &self.violations {
            let _ = writeln!(s, "VIOLATION: {v}");
        }
        s
    }
}

/// What the nodes' reports say, gathered by one reader thread per node
/// incarnation.
#[derive(Default)]
struct Gathered {
    /// Latest stats per node (and when it came).
    latest: HashMap<u32, (Instant, NodeStats)>,
    /// Latest record per (node, incarnation).
    records: HashMap<(u32, u32), IncarnationRecord>,
    finals: HashMap<(u32, u32), NodeFinal>,
    drained: HashMap<(u32, u32), bool>,
    /// Latest resets per peer, by (node, incarnation).
    resets: HashMap<(u32, u32), Vec<u64>>,
    /// Redials per 100 ms slot since the start, over the cluster.
    redials: Vec<u64>,
    last_redials: HashMap<(u32, u32), u64>,
}

struct NodeProc {
    child: Child,
    stdin: ChildStdin,
    inc: u32,
    reader: Option<std::thread::JoinHandle<()>>,
}

struct Cluster {
    net: NetnsCluster,
    opts: ClusterOptions,
    procs: Vec<Option<NodeProc>>,
    gathered: Arc<Mutex<Gathered>>,
    start: Instant,
    violations: Vec<String>,
    summaries: Vec<NodeSummary>,
    /// (observer, its incarnation, restarted node, observer's resets of it before).
    expect_reset: Vec<(u32, u32, u32, u64)>,
}

const SLOT: Duration = Duration::from_millis(100);

/// Set once SIGINT, SIGTERM or SIGHUP came: the run stops, cleaning up.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Blocks SIGINT, SIGTERM and SIGHUP in this thread (and so in the threads
/// and node processes it starts after) and reads them from a signalfd on a
/// thread of its own, which sets [`INTERRUPTED`]: a run stopped by a signal
/// still kills its nodes and removes its namespaces. Without it (the mask
/// or the signalfd refused) a signal ends the run at once, and the next
/// run's stale cleanup removes what it left.
fn watch_signals() {
    use nix::sys::signal::{SigSet, Signal};
    use nix::sys::signalfd::SignalFd;
    let mut set = SigSet::empty();
    for sig in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        set.add(sig);
    }
    let Ok(fd) = SignalFd::new(&set) else { return };
    if set.thread_block().is_err() {
        return;
    }
    let _ = std::thread::Builder::new()
        .name("cluster-signals".into())
        .spawn(move || {
            if let Ok(Some(_)) = fd.read_signal() {
                INTERRUPTED.store(true, Ordering::Relaxed);
            }
        });
}

fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::Relaxed)
}
/// A call that ends this long after its deadline did not keep it (no
/// scheduling delay of a loaded machine comes near).
const CALL_HANG_MS: u64 = 30_000;

impl Cluster {
    fn spawn(&mut self, k: usize, inc: u32) -> Result<(), NetnsError> {
        let exe = match &self.opts.node_program {
            Some(p) => p.clone(),
            None => std::env::current_exe().map_err(|e| NetnsError::Prerequisite(e.to_string()))?,
        };
        let addrs = self
            .net
            .addrs
            .iter()
            .map(|a| a.to_string())
            .collect::<Vec<_>>()
            .join(",");
        let [ip, netns, exec, ns] = self.net.exec_prefix(k);
        let mut child = Command::new(ip)
            .args([netns, exec, ns])
            .arg(exe)
            .args([
                "--cluster-node".to_string(),
                k.to_string(),
                "--cluster-incarnation".into(),
                inc.to_string(),
                "--cluster-addrs".into(),
                addrs,
                "--seed".into(),
                self.opts.seed.to_string(),
                "--cluster-rate".into(),
                self.opts.rate.to_string(),
                "--cluster-call-deadline-ms".into(),
                self.opts.call_deadline.as_millis().to_string(),
            ])
            .args(
                (self.opts.plant_duplicate && k == 0 && inc == 1)
                    .then_some("--cluster-plant-duplicate"),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| NetnsError::Command {
                cmd: "ip netns exec … msgr-stress --cluster-node".into(),
                output: e.to_string(),
            })?;
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = child.stdout.take().expect("piped stdout");
        let gathered = self.gathered.clone();
        let start = self.start;
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let mut g = gathered.lock().expect("gathered");
                if let Some(json) = line.strip_prefix("STATS ") {
                    let Ok(st) = serde_json::from_str::<NodeStats>(json) else {
                        continue;
                    };
                    let key = (st.node, st.inc);
                    let before = g.last_redials.insert(key, st.redials).unwrap_or(0);
                    let slot = (start.elapsed().as_millis() / SLOT.as_millis()) as usize;
                    if g.redials.len() <= slot {
                        g.redials.resize(slot + 1, 0);
                    }
                    g.redials[slot] += st.redials.saturating_sub(before);
                    g.resets.insert(key, st.resets_by_peer.clone());
                    if let Some(r) = st.record.clone() {
                        g.records.insert(key, r);
                    }
                    g.latest.insert(st.node, (Instant::now(), st));
                } else if let Some(json) = line.strip_prefix("FINAL ") {
                    if let Ok(f) = serde_json::from_str::<NodeFinal>(json) {
                        let key = (f.record.node, f.record.inc);
                        g.records.insert(key, f.record.clone());
                        g.finals.insert(key, f);
                    }
                } else if let Some(how) = line.strip_prefix("DRAINED ") {
                    g.drained.insert((k as u32, inc), how == "ok");
                }
            }
        });
        self.procs[k] = Some(NodeProc {
            child,
            stdin,
            inc,
            reader: Some(reader),
        });
        self.summaries[k].incarnations = inc;
        Ok(())
    }

    fn say(&mut self, k: usize, what: &str) {
        if let Some(p) = self.procs[k].as_mut() {
            let _ = writeln!(p.stdin, "{what}");
            let _ = p.stdin.flush();
        }
    }

    fn log(&self, what: &str) {
        if self.opts.verbose {
            eprintln!("[{:7.1} s] {what}", self.start.elapsed().as_secs_f64());
        }
    }

    /// Waits until `done` holds of what was gathered, or the deadline.
    fn wait_for(&self, timeout: Duration, mut done: impl FnMut(&Gathered) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if done(&self.gathered.lock().expect("gathered")) {
                return true;
            }
            if Instant::now() >= deadline || interrupted() {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until every node's current incarnation reports every session
    /// open, in a report that came after `since`; the time it took.
    fn reconverge(&self, since: Instant, timeout: Duration) -> Option<u64> {
        let n = self.opts.nodes as u32;
        let incs: Vec<u32> = self
            .procs
            .iter()
            .map(|p| p.as_ref().map_or(0, |p| p.inc))
            .collect();
        let mut at = None;
        let ok = self.wait_for(timeout, |g| {
            let all = (0..n).all(|k| {
                g.latest.get(&k).is_some_and(|(t, s)| {
                    *t > since && s.inc == incs[k as usize] && s.open_peers == n - 1
                })
            });
            if all {
                at = (0..n)
                    .filter_map(|k| g.latest.get(&k).map(|(t, _)| *t))
                    .max();
            }
            all
        });
        // The moment is the oldest report that made it true: bounded above
        // by the newest, which is what is counted (conservative).
        ok.then(|| at.map_or(0, |t| t.saturating_duration_since(since).as_millis() as u64))
    }

    /// The cluster's redials in each 100-ms slot of [from, to) since the start.
    fn redials_in(&self, from: Duration, to: Duration) -> Vec<u64> {
        let g = self.gathered.lock().expect("gathered");
        let slot = |d: Duration| (d.as_millis() / SLOT.as_millis()) as usize;
        let (a, b) = (slot(from), slot(to).min(g.redials.len()));
        g.redials.get(a..b).unwrap_or_default().to_vec()
    }

    /// Redials per second per node: the peak of the 1-s windows that start
    /// in [from, to).
    fn redial_peak(&self, from: Duration, to: Duration) -> f64 {
        let slots = self.redials_in(from, to + Duration::from_secs(1));
        let per_s = (Duration::from_secs(1).as_millis() / SLOT.as_millis()) as usize;
        let peak = (0..slots.len().max(1))
            .map(|w| slots.iter().skip(w).take(per_s).sum::<u64>())
            .max()
            .unwrap_or(0);
        peak as f64 / self.opts.nodes as f64
    }

    /// Redials per second per node, the mean over [from, to).
    fn redial_mean(&self, from: Duration, to: Duration) -> f64 {
        let sum: u64 = self.redials_in(from, to).iter().sum();
        sum as f64 / (to - from).as_secs_f64().max(0.1) / self.opts.nodes as f64
    }

    /// Every other node that has every session open expects a reset of `k`'s.
    fn expect_reset_of(&mut self, k: usize) {
        let n = self.opts.nodes as u32;
        let g = self.gathered.lock().expect("gathered");
        for (&s, (_, st)) in &g.latest {
            if s as usize != k && st.open_peers == n - 1 {
                let before = st.resets_by_peer.get(k).copied().unwrap_or(0);
                self.expect_reset.push((s, st.inc, k as u32, before));
            }
        }
    }

    fn kill(&mut self, k: usize) {
        if let Some(mut p) = self.procs[k].take() {
            let _ = p.child.kill();
            let _ = p.child.wait();
            if let Some(r) = p.reader.take() {
                let _ = r.join();
            }
        }
    }

    fn signal(&self, k: usize, sig: &str) {
        if let Some(p) = self.procs[k].as_ref() {
            let _ = Command::new("kill")
                .args([sig, &p.child.id().to_string()])
                .status();
        }
    }

    /// Stop, drain, exit (a graceful shutdown, then the report): a graceful
    /// end of node `k`'s incarnation.
    fn graceful_stop(&mut self, k: usize, timeout: Duration) -> bool {
        let Some(inc) = self.procs[k].as_ref().map(|p| p.inc) else {
            return false;
        };
        let key = (k as u32, inc);
        self.say(k, "stop");
        let drained = self.wait_for(timeout, |g| g.drained.contains_key(&key));
        self.say(k, "exit");
        let reported = self.wait_for(Duration::from_secs(15), |g| g.finals.contains_key(&key));
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut exited = false;
        if let Some(p) = self.procs[k].as_mut() {
            while Instant::now() < deadline {
                if let Ok(Some(_)) = p.child.try_wait() {
                    exited = true;
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        self.kill(k);
        drained && reported && exited
    }

    fn sample(&mut self) {
        for (k, p) in self.procs.iter().enumerate() {
            let Some(p) = p else { continue };
            let pid = p.child.id();
            let rss = std::fs::read_to_string(format!("/proc/{pid}/status"))
                .ok()
                .and_then(|s| {
                    s.lines()
                        .find(|l| l.starts_with("VmRSS:"))
                        .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                });
            let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
                .map(|d| d.count() as u64)
                .ok();
            let sum = &mut self.summaries[k];
            if let Some(rss) = rss {
                sum.max_rss_kib = sum.max_rss_kib.max(rss);
                sum.end_rss_kib = rss;
            }
            if let Some(fds) = fds {
                sum.max_fds = sum.max_fds.max(fds);
                sum.end_fds = fds;
            }
        }
    }

    /// Sleeps, sampling the nodes once a second.
    fn pause(&mut self, d: Duration) {
        let end = Instant::now() + d;
        let mut next_sample = Instant::now();
        while Instant::now() < end && !interrupted() {
            if Instant::now() >= next_sample {
                self.sample();
                next_sample += Duration::from_secs(1);
            }
            std::thread::sleep(
                end.saturating_duration_since(Instant::now())
                    .min(Duration::from_millis(100)),
            );
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for k in 0..self.procs.len() {
            self.signal(k, "-CONT");
            self.kill(k);
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Fault {
    Kill,
    Partition,
    Slow,
    Stop,
    Rolling,
}

/// Runs the cluster and checks it.
pub fn run_cluster(opts: &ClusterOptions) -> Result<ClusterReport, NetnsError> {
    watch_signals();
    let n = opts.nodes;
    let net = NetnsCluster::create(n)?;
    let backoff_max = cluster_messenger_config().session.backoff_max;
    let keepalive_timeout = cluster_messenger_config().session.keepalive_timeout;
    let mut c = Cluster {
        net,
        opts: opts.clone(),
        procs: (0..n).map(|_| None).collect(),
        gathered: Arc::new(Mutex::new(Gathered::default())),
        start: Instant::now(),
        violations: Vec::new(),
        summaries: (0..n)
            .map(|k| NodeSummary {
                node: k as u32,
                ..NodeSummary::default()
            })
            .collect(),
        expect_reset: Vec::new(),
    };
    let mut report = ClusterReport {
        seed: opts.seed,
        nodes: n,
        reconverge_bar_ms: 2 * backoff_max.as_millis() as u64,
        ..ClusterReport::default()
    };
    let mut rng = StdRng::seed_from_u64(opts.seed ^ 0xc105_7e12);
    let mut incs = vec![1u32; n];
    for k in 0..n {
        c.spawn(k, 1)?;
    }
    let t0 = Instant::now();
    let first = c.reconverge(t0, Duration::from_secs(60));
    report.events.push(FaultEvent {
        at_s: 0.0,
        what: format!("start {n} nodes"),
        reconverge_ms: first,
        peak_redials_per_s_per_node: 0.0,
        steady_redials_per_s_per_node: None,
    });
    if first.is_none() {
        c.violations
            .push("the cluster never had every session open at the start".into());
    }
    c.pause(Duration::from_secs(2));
    let mut kinds = [
        Fault::Kill,
        Fault::Partition,
        Fault::Slow,
        Fault::Stop,
        Fault::Rolling,
    ];
    kinds.shuffle(&mut rng);
    let mut i = 0usize;
    let rolling_cost = Duration::from_secs(1) * n as u32;
    let end_faults = opts.duration.saturating_sub(Duration::from_secs(5));
    loop {
        let left = end_faults.saturating_sub(c.start.elapsed());
        let mut kind = kinds[i % kinds.len()];
        if matches!(kind, Fault::Rolling) && left < rolling_cost {
            // Not enough time left for a rolling restart: the next kind.
            i += 1;
            kind = kinds[i % kinds.len()];
        }
        if interrupted() {
            return Err(NetnsError::Interrupted);
        }
        if left < Duration::from_secs(8) {
            break;
        }
        i += 1;
        let at = c.start.elapsed();
        let (what, ended, steady) = match kind {
            Fault::Kill => {
                let k = rng.random_range(0..n);
                c.log(&format!("kill -9 node {k}"));
                c.expect_reset_of(k);
                c.kill(k);
                c.pause(Duration::from_millis(rng.random_range(300..1500)));
                incs[k] += 1;
                c.spawn(k, incs[k])?;
                (
                    format!("kill -9 node {k}, restart as incarnation {}", incs[k]),
                    Instant::now(),
                    None,
                )
            }
            Fault::Partition => {
                let mut order: Vec<usize> = (0..n).collect();
                order.shuffle(&mut rng);
                let cut = rng.random_range(1..n);
                let (side, other) = order.split_at(cut);
                c.log(&format!("partition {side:?} | {other:?}"));
                c.net.partition(side, other)?;
                let hold = Duration::from_millis(rng.random_range(3000..8000));
                c.pause(hold);
                let now = c.start.elapsed();
                let steady = c.redial_mean(now.saturating_sub(Duration::from_secs(2)), now);
                c.net.heal()?;
                (
                    format!(
                        "partition {side:?} | {other:?} for {:.1} s",
                        hold.as_secs_f64()
                    ),
                    Instant::now(),
                    Some(steady),
                )
            }
            Fault::Slow => {
                let k = rng.random_range(0..n);
                let how = c.net.set_slow(k, true)?;
                report.slow_link = how.to_string();
                c.log(&format!("slow node {k}: {how}"));
                c.pause(Duration::from_secs(5));
                c.net.set_slow(k, false)?;
                (format!("slow node {k} for 5 s"), Instant::now(), None)
            }
            Fault::Stop => {
                let k = rng.random_range(0..n);
                let hold = keepalive_timeout * 2;
                c.log(&format!("SIGSTOP node {k}"));
                c.signal(k, "-STOP");
                c.pause(hold);
                c.signal(k, "-CONT");
                (
                    format!("SIGSTOP node {k} for {:.1} s", hold.as_secs_f64()),
                    Instant::now(),
                    None,
                )
            }
            Fault::Rolling => {
                for (k, inc) in incs.iter_mut().enumerate() {
                    c.log(&format!("rolling restart: node {k}"));
                    c.expect_reset_of(k);
                    if !c.graceful_stop(k, Duration::from_secs(20)) {
                        c.violations.push(format!(
                            "rolling restart: node {k} incarnation {inc} did not drain, report and exit in time"
                        ));
                    }
                    *inc += 1;
                    c.spawn(k, *inc)?;
                    if c.reconverge(Instant::now(), Duration::from_secs(20))
                        .is_none()
                    {
                        c.violations.push(format!(
                            "rolling restart: sessions not all open 20 s after node {k} restarted"
                        ));
                    }
                }
                (
                    "rolling graceful restart of every node".to_string(),
                    Instant::now(),
                    None,
                )
            }
        };
        let end_at = c.start.elapsed();
        let reconverge_ms = c.reconverge(ended, Duration::from_secs(20));
        if reconverge_ms.is_none() {
            c.violations.push(format!(
                "after \"{what}\": sessions not all open within 20 s"
            ));
        }
        c.pause(Duration::from_secs(3).saturating_sub(ended.elapsed()));
        let peak = c.redial_peak(end_at, end_at + Duration::from_secs(2));
        let (redials, faults) = {
            let g = c.gathered.lock().expect("gathered");
            g.latest
                .values()
                .fold((0, 0), |(r, f), (_, s)| (r + s.redials, f + s.link_faults))
        };
        c.log(&format!(
            "{what}: reconverged in {reconverge_ms:?} ms, peak redials {peak:.2}/s/node (redials {redials}, link faults {faults} in the current incarnations)"
        ));
        report.events.push(FaultEvent {
            at_s: at.as_secs_f64(),
            what,
            reconverge_ms,
            peak_redials_per_s_per_node: peak,
            steady_redials_per_s_per_node: steady,
        });
        c.pause(Duration::from_secs(1));
    }
    c.pause(
        opts.duration
            .saturating_sub(c.start.elapsed())
            .min(Duration::from_secs(5)),
    );
    if interrupted() {
        return Err(NetnsError::Interrupted);
    }
    // The end: every node stops and drains, then all report.
    c.log("stop: draining");
    for k in 0..n {
        c.say(k, "stop");
    }
    let keys: Vec<(u32, u32)> = (0..n).map(|k| (k as u32, incs[k])).collect();
    if !c.wait_for(Duration::from_secs(45), |g| {
        keys.iter().all(|k| g.drained.contains_key(k))
    }) {
        c.violations
            .push("not every node drained within 45 s".into());
    }
    c.sample();
    for k in 0..n {
        c.say(k, "exit");
    }
    if !c.wait_for(Duration::from_secs(20), |g| {
        keys.iter().all(|k| g.finals.contains_key(k))
    }) {
        c.violations
            .push("not every node shut down and reported within 20 s".into());
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    for k in 0..n {
        if let Some(p) = c.procs[k].as_mut() {
            while Instant::now() < deadline && !matches!(p.child.try_wait(), Ok(Some(_))) {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        c.kill(k);
    }
    // The checks.
    let g = std::mem::take(&mut *c.gathered.lock().expect("gathered"));
    if std::env::var_os("MSGR_CLUSTER_DEBUG").is_some() {
        let slots: Vec<String> = g
            .redials
            .iter()
            .enumerate()
            .filter(|(_, r)| **r > 0)
            .map(|(i, r)| format!("{:.1}s:{r}", i as f64 / 10.0))
            .collect();
        eprintln!("redials by 100 ms slot: {}", slots.join(" "));
    }
    for (key, ok) in &g.drained {
        if !ok {
            c.violations.push(format!(
                "node {} incarnation {} did not drain its queues",
                key.0, key.1
            ));
        }
    }
    let records: Vec<IncarnationRecord> = g.records.values().cloned().collect();
    let outcome = check::check(&records);
    report.delivered = outcome.delivered;
    report.dropped_by_restarts = outcome.dropped_by_restarts;
    let mut latencies = Vec::new();
    for f in g.finals.values() {
        report.reported_dropped += f
            .counters
            .iter()
            .find(|(name, _)| name == "messages_dropped")
            .map_or(0, |(_, v)| *v);
        report.calls_ok += f.calls.ok;
        report.slowest_call_ms = report.slowest_call_ms.max(f.calls.slowest_ms);
        for (why, count) in &f.calls.failed {
            *report.calls_failed.entry(why.clone()).or_default() += count;
        }
        // Late under load is reported; a call that overran its deadline
        // by far more than any scheduling delay is a violation (one that
        // never returns stops its node from draining: a violation too).
        report.late_calls += f.calls.late;
        report
            .late_call_examples
            .extend(f.calls.late_examples.iter().cloned());
        let hung = f
            .calls
            .slowest_ms
            .saturating_sub(opts.call_deadline.as_millis() as u64);
        if hung > CALL_HANG_MS {
            c.violations.push(format!(
                "node {} incarnation {}: a call returned {hung} ms after its deadline (first late ones: {:?})",
                f.record.node, f.record.inc, f.calls.late_examples
            ));
        }
        if f.calls.bad_replies > 0 {
            c.violations.push(format!(
                "node {} incarnation {}: {} calls answered with something else than their echo",
                f.record.node, f.record.inc, f.calls.bad_replies
            ));
        }
        latencies.extend_from_slice(&f.calls.latencies_us);
    }
    latencies.sort_unstable();
    let pct = |p: f64| {
        latencies
            .get(((latencies.len() as f64 * p) as usize).min(latencies.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0) as u64
    };
    report.call_p50_us = pct(0.50);
    report.call_p99_us = pct(0.99);
    for &(s, s_inc, r, before) in &c.expect_reset {
        if g.finals.contains_key(&(s, s_inc)) {
            // Its last stats: the stats thread runs until it exits.
            let after = g
                .resets
                .get(&(s, s_inc))
                .and_then(|v| v.get(r as usize).copied())
                .unwrap_or(0);
            if after <= before {
                c.violations.push(format!(
                    "node {s} incarnation {s_inc} never saw a reset of its session with node {r} after node {r} restarted"
                ));
            }
        }
    }
    let fd_bound = 64 + 8 * n as u64;
    for s in &c.summaries {
        if s.max_fds > fd_bound {
            c.violations.push(format!(
                "node {}: {} descriptors open at most (bound {fd_bound})",
                s.node, s.max_fds
            ));
        }
        if s.max_rss_kib > 1 << 20 {
            c.violations.push(format!(
                "node {}: RSS {} KiB (bound 1 GiB)",
                s.node, s.max_rss_kib
            ));
        }
    }
    report.elapsed_s = c.start.elapsed().as_secs_f64();
    report.messages_per_s = report.delivered as f64 / report.elapsed_s.max(0.1);
    report.violation_count = outcome.violation_count + c.violations.len() as u64;
    report.violations = c.violations.clone();
    report.violations.extend(outcome.violations);
    report.node_summaries = c.summaries.clone();
    let heals: Vec<&FaultEvent> = report
        .events
        .iter()
        .filter(|e| e.steady_redials_per_s_per_node.is_some())
        .collect();
    report.worst_heal_reconverge_ms = heals.iter().filter_map(|e| e.reconverge_ms).max();
    // Only where there was a steady rate to compare with: dials into a
    // partition may hang (no redials at all).
    report.worst_heal_redial_ratio = heals
        .iter()
        .filter(|e| e.steady_redials_per_s_per_node.is_some_and(|r| r > 0.0))
        .map(|e| e.peak_redials_per_s_per_node / e.steady_redials_per_s_per_node.unwrap_or(1.0))
        .reduce(f64::max);
    drop(c);
    Ok(report)
}
