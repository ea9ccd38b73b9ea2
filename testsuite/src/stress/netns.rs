//! Real network faults for TCP, outside the messenger: two network namespaces
//! joined by a veth pair (both ends inside them, none in the root namespace),
//! addresses from 198.51.100.0/24 (TEST-NET-2, unreachable from the root
//! namespace), nftables rules that drop random packets and answer some with
//! TCP resets, and link flaps (`ip link set … down/up`) during the run.
//!
//! Servers are created on a thread that entered the server namespace with
//! `setns` ([`NsExec`]); their worker threads inherit it. Clients likewise in
//! the other namespace. The verifier stays in this process.
//!
//! The namespaces are removed by [`NetnsPair`]'s `Drop`, even when the test
//! fails; stale ones from killed runs (their pid is gone) are removed at start.

use std::fmt;
use std::fs::File;
use std::io::Write as _;
use std::net::Ipv4Addr;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::sched::{setns, CloneFlags};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::report::StressReport;
use super::{Placement, StressConfig};

/// Prefix of every namespace this module creates: `msgr-stress-<pid>-<n>-{s,c}`.
pub const NS_PREFIX: &str = "msgr-stress-";
/// The server side's address.
pub const SERVER_IP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 1);
/// The client side's address.
pub const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 2);

/// Why the namespace environment could not be set up.
#[derive(Debug)]
pub enum NetnsError {
    /// Not root, or `ip` / `nft` missing: the test cannot run here.
    Prerequisite(String),
    /// A command failed.
    Command {
        /// The command line.
        cmd: String,
        /// What it printed.
        output: String,
    },
    /// Entering a namespace failed.
    Setns(String),
    /// SIGINT, SIGTERM or SIGHUP ended the run (after cleaning up).
    Interrupted,
}

impl fmt::Display for NetnsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NetnsError::Prerequisite(why) => write!(
                f,
                "the network-namespace stress test cannot run: {why} (it needs root, iproute2 and nftables: `apt-get install iproute2 nftables`; scripts/test.sh installs them)"
            ),
            NetnsError::Command { cmd, output } => write!(f, "`{cmd}` failed: {output}"),
            NetnsError::Setns(why) => write!(f, "setns: {why}"),
            NetnsError::Interrupted => write!(f, "interrupted by a signal (namespaces and nodes removed)"),
        }
    }
}

impl std::error::Error for NetnsError {}

/// Runs a command; its output, or what went wrong.
pub(crate) fn sh(args: &[&str], stdin: Option<&str>) -> Result<String, NetnsError> {
    let cmd = args.join(" ");
    let mut child = Command::new(args[0])
        .args(&args[1..])
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| NetnsError::Command {
            cmd: cmd.clone(),
            output: e.to_string(),
        })?;
    if let Some(text) = stdin {
        let mut pipe = child.stdin.take().expect("piped stdin");
        pipe.write_all(text.as_bytes())
            .map_err(|e| NetnsError::Command {
                cmd: cmd.clone(),
                output: e.to_string(),
            })?;
    }
    let out = child.wait_with_output().map_err(|e| NetnsError::Command {
        cmd: cmd.clone(),
        output: e.to_string(),
    })?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(text)
    } else {
        Err(NetnsError::Command {
            cmd,
            output: format!("{}: {}", out.status, text.trim()),
        })
    }
}

/// Checks root, `ip` and `nft`; says precisely what is missing.
pub fn check_prerequisites() -> Result<(), NetnsError> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let euid = status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .and_then(|l| l.split_whitespace().nth(2))
        .unwrap_or("?");
    if euid != "0" {
        return Err(NetnsError::Prerequisite(format!(
            "not running as root (effective uid {euid})"
        )));
    }
    for (tool, arg) in [("ip", "-V"), ("nft", "--version")] {
        if sh(&[tool, arg], None).is_err() {
            return Err(NetnsError::Prerequisite(format!(
                "`{tool}` is not installed"
            )));
        }
    }
    Ok(())
}

/// Removes namespaces left by runs whose process is gone.
pub fn cleanup_stale() -> Vec<String> {
    let mut removed = Vec::new();
    let Ok(list) = sh(&["ip", "netns", "list"], None) else {
        return removed;
    };
    for line in list.lines() {
        let Some(name) = line.split_whitespace().next() else {
            continue;
        };
        let Some(rest) = name.strip_prefix(NS_PREFIX) else {
            continue;
        };
        let pid = rest.split('-').next().unwrap_or("");
        if pid.parse::<u32>().is_ok()
            && !std::path::Path::new(&format!("/proc/{pid}")).exists()
            && sh(&["ip", "netns", "del", name], None).is_ok()
        {
            removed.push(name.to_string());
        }
    }
    removed
}

/// Loads an nftables script into namespace `ns`.
pub fn nft_load(ns: &str, script: &str) -> Result<String, NetnsError> {
    sh(&["ip", "netns", "exec", ns, "nft", "-f", "-"], Some(script))
}

/// The namespaces process `pid` created that still exist (a run's Drop
/// guards remove them: a test checks with this that they did).
pub fn namespaces_left(pid: u32) -> Result<Vec<String>, NetnsError> {
    let mine = format!("{NS_PREFIX}{pid}-");
    Ok(sh(&["ip", "netns", "list"], None)?
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| name.starts_with(&mine))
        .map(str::to_string)
        .collect())
}

static PAIRS: AtomicU32 = AtomicU32::new(0);

/// Two namespaces joined by a veth pair; removed on drop.
pub struct NetnsPair {
    /// Server namespace name.
    pub server_ns: String,
    /// Client namespace name.
    pub client_ns: String,
    /// The veth end in the server namespace.
    pub server_if: String,
    /// The veth end in the client namespace.
    pub client_if: String,
}

impl NetnsPair {
    /// Creates the namespaces, the veth pair inside them, addresses and links up.
    pub fn create() -> Result<NetnsPair, NetnsError> {
        check_prerequisites()?;
        cleanup_stale();
        let pid = std::process::id();
        let n = PAIRS.fetch_add(1, Ordering::Relaxed);
        let pair = NetnsPair {
            server_ns: format!("{NS_PREFIX}{pid}-{n}-s"),
            client_ns: format!("{NS_PREFIX}{pid}-{n}-c"),
            server_if: format!("ms{pid:x}x{n}s"),
            client_if: format!("ms{pid:x}x{n}c"),
        };
        // From here on, Drop removes whatever was created.
        let (s, c) = (pair.server_ns.as_str(), pair.client_ns.as_str());
        let (si, ci) = (pair.server_if.as_str(), pair.client_if.as_str());
        sh(&["ip", "netns", "add", s], None)?;
        sh(&["ip", "netns", "add", c], None)?;
        // Created inside the server namespace with its peer placed straight
        // into the client namespace: no end ever exists in the root namespace.
        sh(
            &[
                "ip", "-n", s, "link", "add", si, "type", "veth", "peer", "name", ci, "netns", c,
            ],
            None,
        )?;
        sh(
            &[
                "ip",
                "-n",
                s,
                "addr",
                "add",
                &format!("{SERVER_IP}/24"),
                "dev",
                si,
            ],
            None,
        )?;
        sh(
            &[
                "ip",
                "-n",
                c,
                "addr",
                "add",
                &format!("{CLIENT_IP}/24"),
                "dev",
                ci,
            ],
            None,
        )?;
        for (ns, dev) in [(s, "lo"), (s, si), (c, "lo"), (c, ci)] {
            sh(&["ip", "-n", ns, "link", "set", dev, "up"], None)?;
        }
        if sh(&["ip", "link", "show", si], None).is_ok()
            || sh(&["ip", "link", "show", ci], None).is_ok()
        {
            return Err(NetnsError::Command {
                cmd: "ip link show".into(),
                output: "a veth end is visible in the root namespace".into(),
            });
        }
        Ok(pair)
    }

    /// Loads an nftables script into namespace `ns`.
    pub fn nft(&self, ns: &str, script: &str) -> Result<String, NetnsError> {
        nft_load(ns, script)
    }

    /// Lists namespace `ns`'s ruleset.
    pub fn nft_list(&self, ns: &str) -> Result<String, NetnsError> {
        sh(&["ip", "netns", "exec", ns, "nft", "list", "ruleset"], None)
    }

    /// Sets the server-side veth end up or down (the peer loses carrier).
    pub fn set_link(&self, up: bool) -> Result<(), NetnsError> {
        let state = if up { "up" } else { "down" };
        sh(
            &[
                "ip",
                "-n",
                &self.server_ns,
                "link",
                "set",
                &self.server_if,
                state,
            ],
            None,
        )
        .map(|_| ())
    }
}

impl Drop for NetnsPair {
    fn drop(&mut self) {
        for ns in [&self.server_ns, &self.client_ns] {
            let _ = sh(&["ip", "netns", "del", ns], None);
        }
    }
}

type Job = Box<dyn FnOnce() + Send>;

/// A thread inside a network namespace that runs closures for others
/// (threads it spawns, such as messenger workers, inherit the namespace).
pub struct NsExec {
    tx: Mutex<Option<mpsc::Sender<Job>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl NsExec {
    /// Starts a thread that enters namespace `ns` (by name, /run/netns/NAME).
    pub fn enter(ns: &str) -> Result<Arc<NsExec>, NetnsError> {
        let path = format!("/run/netns/{ns}");
        let (tx, rx) = mpsc::channel::<Job>();
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(), NetnsError>>();
        let thread = std::thread::Builder::new()
            .name(format!("netns-{ns}"))
            .spawn(move || {
                let entered = File::open(&path)
                    .map_err(|e| NetnsError::Setns(format!("{path}: {e}")))
                    .and_then(|f| {
                        setns(&f, CloneFlags::CLONE_NEWNET)
                            .map_err(|e| NetnsError::Setns(format!("{path}: {e}")))
                    });
                let ok = entered.is_ok();
                let _ = ready_tx.send(entered);
                if ok {
                    for job in rx {
                        job();
                    }
                }
            })
            .map_err(|e| NetnsError::Setns(e.to_string()))?;
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(Arc::new(NsExec {
                tx: Mutex::new(Some(tx)),
                thread: Mutex::new(Some(thread)),
            })),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => Err(NetnsError::Setns("namespace thread died".into())),
        }
    }

    /// Runs `f` on the namespace's thread and returns its result.
    pub fn run<R: Send + 'static>(&self, f: impl FnOnce() -> R + Send + 'static) -> R {
        let (rtx, rrx) = mpsc::channel();
        let job: Job = Box::new(move || {
            let _ = rtx.send(f());
        });
        self.tx
            .lock()
            .expect("ns exec lock")
            .as_ref()
            .expect("ns exec running")
            .send(job)
            .expect("namespace thread alive");
        rrx.recv().expect("namespace job finished (did it panic?)")
    }
}

impl Drop for NsExec {
    fn drop(&mut self) {
        self.tx.lock().expect("ns exec lock").take();
        if let Some(t) = self.thread.lock().expect("ns exec lock").take() {
            let _ = t.join();
        }
    }
}

/// The network chaos of a namespace run.
#[derive(Clone, Debug)]
pub struct NetnsOptions {
    /// Drop this many TCP packets per 1000, in each namespace's input.
    pub drop_per_mille: u32,
    /// Answer this many non-SYN TCP packets per 100 000 with a TCP reset
    /// (server input).
    pub reset_per_100k: u32,
    /// Mean time between link flaps; zero = none.
    pub flap_every: Duration,
    /// Longest time a flapped link stays down.
    pub flap_down_max: Duration,
}

impl Default for NetnsOptions {
    fn default() -> Self {
        NetnsOptions {
            drop_per_mille: 5,
            reset_per_100k: 5,
            flap_every: Duration::from_secs(4),
            flap_down_max: Duration::from_millis(1200),
        }
    }
}

fn rules(opts: &NetnsOptions, resets: bool) -> String {
    let reset = if resets && opts.reset_per_100k > 0 {
        format!(
            "    meta l4proto tcp tcp flags & (syn | rst) == 0 numgen random mod 100000 < {} counter reject with tcp reset\n",
            opts.reset_per_100k
        )
    } else {
        String::new()
    };
    format!(
        "table inet msgr_stress {{\n  chain input {{\n    type filter hook input priority 0; policy accept;\n{reset}    meta l4proto tcp numgen random mod 1000 < {} counter drop\n  }}\n}}\n",
        opts.drop_per_mille
    )
}

/// Sums the `counter packets N` of rules whose line contains `verdict`.
fn counted(ruleset: &str, verdict: &str) -> u64 {
    ruleset
        .lines()
        .filter(|l| l.contains(verdict))
        .filter_map(|l| {
            let mut it = l.split_whitespace().skip_while(|w| *w != "packets");
            it.next()?;
            it.next()?.parse::<u64>().ok()
        })
        .sum()
}

/// Runs the workload with servers and clients in two namespaces joined by a
/// faulty veth link (TCP only). `cfg.bind` and `cfg.placement` are replaced.
pub fn run_in_netns(cfg: &StressConfig, opts: &NetnsOptions) -> Result<StressReport, NetnsError> {
    if cfg.backend.name != "tcp" {
        return Err(NetnsError::Prerequisite(format!(
            "the namespace run is for TCP; backend {} was asked",
            cfg.backend.name
        )));
    }
    let pair = NetnsPair::create()?;
    pair.nft(&pair.server_ns, &rules(opts, true))?;
    pair.nft(&pair.client_ns, &rules(opts, false))?;
    let servers = NsExec::enter(&pair.server_ns)?;
    let clients = NsExec::enter(&pair.client_ns)?;
    let mut cfg = cfg.clone();
    cfg.bind = vec![format!("tcp://{SERVER_IP}:0")
        .parse()
        .expect("netns bind address")];
    cfg.placement = Placement::namespaces(servers.clone(), clients.clone());
    let stop = AtomicBool::new(false);
    let flaps = AtomicU64::new(0);
    let flap_errors = Mutex::new(Vec::new());
    let report = std::thread::scope(|scope| {
        let flapper = (!opts.flap_every.is_zero()).then(|| {
            let (pair, stop, flaps, errs) = (&pair, &stop, &flaps, &flap_errors);
            let mut rng = StdRng::seed_from_u64(cfg.seed ^ 0x666c_6170);
            let mean = opts.flap_every.as_millis() as u64;
            let down_max = opts.flap_down_max.as_millis().max(2) as u64;
            scope.spawn(move || {
                let sleep_until = |t: Instant| {
                    while Instant::now() < t && !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                };
                while !stop.load(Ordering::Relaxed) {
                    sleep_until(
                        Instant::now()
                            + Duration::from_millis(rng.random_range(mean / 2..=mean * 3 / 2)),
                    );
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    if let Err(e) = pair.set_link(false) {
                        errs.lock().expect("errs").push(e.to_string());
                    }
                    flaps.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(rng.random_range(1..down_max)));
                    if let Err(e) = pair.set_link(true) {
                        errs.lock().expect("errs").push(e.to_string());
                    }
                }
            })
        });
        // The workload stops its clients at cfg.duration; stop flapping then
        // too, so that the drain happens on a healthy (if lossy) link.
        let stopper = scope.spawn(|| {
            let end = Instant::now() + cfg.duration;
            while Instant::now() < end && !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(20));
            }
            stop.store(true, Ordering::Relaxed);
        });
        let report = super::run(&cfg);
        stop.store(true, Ordering::Relaxed);
        if let Some(f) = flapper {
            let _ = f.join();
        }
        let _ = stopper.join();
        report
    });
    let mut report = report;
    let _ = pair.set_link(true);
    let srv = pair.nft_list(&pair.server_ns).unwrap_or_default();
    let cli = pair.nft_list(&pair.client_ns).unwrap_or_default();
    report.extra.push((
        "netns".into(),
        format!(
            "{} <-> {} ({SERVER_IP} / {CLIENT_IP}); link flaps {}, packets dropped {}, tcp resets sent {}",
            pair.server_ns,
            pair.client_ns,
            flaps.load(Ordering::Relaxed),
            counted(&srv, "drop") + counted(&cli, "drop"),
            counted(&srv, "reject")
        ),
    ));
    for e in flap_errors.into_inner().expect("errs") {
        report.violation_count += 1;
        report.violations.push(format!("link flap failed: {e}"));
    }
    drop(cfg);
    drop(servers);
    drop(clients);
    drop(pair);
    Ok(report)
}

/// The cluster's addresses: 10.213.77.0/24, node k at .k+1. They exist
/// only on the node namespaces' veth ends (never in the root namespace).
pub const CLUSTER_NET: [u8; 3] = [10, 213, 77];
/// The name of each node's veth end, inside its own namespace.
pub const CLUSTER_NODE_IF: &str = "eth0";

/// N network namespaces, each with a veth pair whose other end is on a
/// bridge in a hub namespace: a LAN of N machines, none of it in the root
/// namespace. Removed on drop.
pub struct NetnsCluster {
    /// The namespace holding the bridge.
    pub hub: String,
    /// Node k's namespace.
    pub nodes: Vec<String>,
    /// Node k's address.
    pub addrs: Vec<Ipv4Addr>,
}

impl NetnsCluster {
    /// Creates the hub with its bridge and `n` node namespaces joined to it.
    pub fn create(n: usize) -> Result<NetnsCluster, NetnsError> {
        check_prerequisites()?;
        cleanup_stale();
        if !(2..=250).contains(&n) {
            return Err(NetnsError::Prerequisite(format!(
                "a cluster has 2 to 250 nodes, not {n}"
            )));
        }
        let pid = std::process::id();
        let run = PAIRS.fetch_add(1, Ordering::Relaxed);
        let [a, b, c] = CLUSTER_NET;
        let cluster = NetnsCluster {
            hub: format!("{NS_PREFIX}{pid}-{run}-hub"),
            nodes: (0..n)
                .map(|k| format!("{NS_PREFIX}{pid}-{run}-n{k}"))
                .collect(),
            addrs: (0..n)
                .map(|k| Ipv4Addr::new(a, b, c, k as u8 + 1))
                .collect(),
        };
        // From here on, Drop removes whatever was created.
        let hub = cluster.hub.as_str();
        sh(&["ip", "netns", "add", hub], None)?;
        sh(
            &["ip", "-n", hub, "link", "add", "br0", "type", "bridge"],
            None,
        )?;
        sh(&["ip", "-n", hub, "link", "set", "br0", "up"], None)?;
        for (k, (ns, ip)) in cluster.nodes.iter().zip(&cluster.addrs).enumerate() {
            let port = format!("v{k}");
            sh(&["ip", "netns", "add", ns], None)?;
            // Both ends are created inside namespaces (the hub's, and the
            // node's by `netns`): no interface ever exists in the root one.
            sh(
                &[
                    "ip",
                    "-n",
                    hub,
                    "link",
                    "add",
                    &port,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    CLUSTER_NODE_IF,
                    "netns",
                    ns,
                ],
                None,
            )?;
            sh(
                &["ip", "-n", hub, "link", "set", &port, "master", "br0", "up"],
                None,
            )?;
            sh(
                &[
                    "ip",
                    "-n",
                    ns,
                    "addr",
                    "add",
                    &format!("{ip}/24"),
                    "dev",
                    CLUSTER_NODE_IF,
                ],
                None,
            )?;
            for dev in ["lo", CLUSTER_NODE_IF] {
                sh(&["ip", "-n", ns, "link", "set", dev, "up"], None)?;
            }
        }
        Ok(cluster)
    }

    /// Cuts every node of `side` off from every node of `other`, both ways
    /// (nftables in each namespace of `side`: input from and output to the
    /// other side dropped).
    pub fn partition(&self, side: &[usize], other: &[usize]) -> Result<(), NetnsError> {
        let set = other
            .iter()
            .map(|&k| self.addrs[k].to_string())
            .collect::<Vec<_>>()
            .join(", ");
        let script = format!(
            "table inet msgr_partition {{\n  chain input {{\n    type filter hook input priority 0; policy accept;\n    ip saddr {{ {set} }} counter drop\n  }}\n  chain output {{\n    type filter hook output priority 0; policy accept;\n    ip daddr {{ {set} }} counter drop\n  }}\n}}\n"
        );
        for &k in side {
            nft_load(&self.nodes[k], &script)?;
        }
        Ok(())
    }

    /// Removes every partition rule.
    pub fn heal(&self) -> Result<(), NetnsError> {
        let mut first_error = None;
        for ns in &self.nodes {
            let has = sh(&["ip", "netns", "exec", ns, "nft", "list", "tables"], None)
                .map(|t| t.contains("msgr_partition"))
                .unwrap_or(false);
            if has {
                if let Err(e) = nft_load(ns, "delete table inet msgr_partition\n") {
                    first_error.get_or_insert(e);
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Makes node `k`'s link slow, or normal again: netem delay and loss
    /// where the kernel has netem, else a random 5 % loss by nftables.
    /// Returns what was applied.
    pub fn set_slow(&self, k: usize, slow: bool) -> Result<&'static str, NetnsError> {
        let ns = self.nodes[k].as_str();
        let tc = |args: &[&str]| {
            let mut v = vec!["ip", "netns", "exec", ns, "tc", "qdisc"];
            v.extend_from_slice(args);
            sh(&v, None)
        };
        if slow {
            let netem = tc(&[
                "add",
                "dev",
                CLUSTER_NODE_IF,
                "root",
                "netem",
                "delay",
                "30ms",
                "10ms",
                "loss",
                "2%",
            ]);
            if netem.is_ok() {
                return Ok("netem delay 30±10 ms, loss 2 %");
            }
            nft_load(
                ns,
                "table inet msgr_slow {\n  chain input {\n    type filter hook input priority 0; policy accept;\n    meta l4proto tcp numgen random mod 100 < 5 counter drop\n  }\n}\n",
            )?;
            Ok("nftables loss 5 % (this kernel has no netem)")
        } else {
            let netem = tc(&["del", "dev", CLUSTER_NODE_IF, "root"]);
            let nft = nft_load(ns, "delete table inet msgr_slow\n");
            match (netem, nft) {
                (Err(e), Err(_)) => Err(e),
                _ => Ok("normal"),
            }
        }
    }

    /// `ip netns exec` into node `k`'s namespace: the start of a command line.
    pub fn exec_prefix(&self, k: usize) -> [String; 4] {
        [
            "ip".into(),
            "netns".into(),
            "exec".into(),
            self.nodes[k].clone(),
        ]
    }
}

impl Drop for NetnsCluster {
    fn drop(&mut self) {
        for ns in self.nodes.iter().chain(std::iter::once(&self.hub)) {
            let _ = sh(&["ip", "netns", "del", ns], None);
        }
    }
}
