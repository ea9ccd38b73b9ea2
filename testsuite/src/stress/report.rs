//! What a run reports: live progress and the final summary.

use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;

/// A snapshot for progress lines.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Progress {
    /// Seconds since the workload started.
    pub elapsed_s: f64,
    /// The run's total workload time.
    pub duration_s: f64,
    /// Messages accepted by `send`.
    pub sent: u64,
    /// Messages delivered to servers.
    pub delivered: u64,
    /// Payload bytes delivered.
    pub delivered_bytes: u64,
    /// Faults injected by fault plans.
    pub injected_faults: u64,
    /// Sessions resumed after faults.
    pub reconnects: u64,
    /// Server restarts.
    pub server_restarts: u64,
    /// Violations so far.
    pub violations: u64,
}

impl Progress {
    /// One line, e.g. for a terminal's status line.
    pub fn line(&self) -> String {
        format!(
            "[{:>5.0}/{:.0} s] sent {} delivered {} ({:.1} MiB) faults {} reconnects {} restarts {} violations {}",
            self.elapsed_s,
            self.duration_s,
            self.sent,
            self.delivered,
            self.delivered_bytes as f64 / (1 << 20) as f64,
            self.injected_faults,
            self.reconnects,
            self.server_restarts,
            self.violations
        )
    }
}

/// The result of a run. Plain data and flat on purpose: each field is a
/// key of `msgr-stress --json`'s output.
#[derive(Clone, Debug, Default, Serialize)]
pub struct StressReport {
    /// The seed: rerun with it to reproduce.
    pub seed: u64,
    /// Backend name.
    pub backend: String,
    /// Server messengers.
    pub servers: usize,
    /// Client messengers.
    pub clients: usize,
    /// The fault plan (before per-messenger seeding), if any.
    pub faults: Option<String>,
    /// Workload phase, seconds.
    pub workload_s: f64,
    /// Whole run including drain, checks and shutdown, seconds.
    pub total_s: f64,
    /// Seconds per phase of the run, in order: `setup` (messengers
    /// started), `workload`, `stop` (client and chaos threads joined: a
    /// restart under way finishes), `drain`, `verify`, `rx_held` (received
    /// buffers returned), `client_shutdown`, `server_shutdown`, `threads`
    /// (worker threads gone).
    pub phases: Vec<(String, f64)>,
    /// The longest single messenger shutdown at the end, seconds.
    pub slowest_shutdown_s: f64,
    /// Messages accepted by `send`.
    pub sent_messages: u64,
    /// Payload bytes accepted by `send`.
    pub sent_bytes: u64,
    /// Messages delivered to servers.
    pub delivered_messages: u64,
    /// Payload bytes delivered to servers.
    pub delivered_bytes: u64,
    /// Delivered messages per second of workload.
    pub msgs_per_s: f64,
    /// Delivered MiB per second of workload.
    pub mib_per_s: f64,
    /// Messages of 64 KiB and more sent.
    pub large_messages: u64,
    /// Epochs (client, server, connection stretches) in all.
    pub epochs: u64,
    /// Lossless epochs checked for exactly 1..=sent at the end.
    pub exact_epochs: u64,
    /// Epochs checked only for order and no duplicates (disturbed lossless).
    pub disturbed_epochs: u64,
    /// Lossy epochs checked at the end.
    pub lossy_epochs: u64,
    /// Faults injected by the fault plans (all messengers).
    pub injected_faults: u64,
    /// Real transport faults injected (`inject_fault`).
    pub real_faults: u64,
    /// Faults no backend here produces for real, imitated
    /// (`simulate_fault`): completion-queue read failures (libfabric, RDMA).
    pub simulated_faults: u64,
    /// Link faults of any kind.
    pub link_faults: u64,
    /// Links closed for undecodable input (corruption caught by CRC).
    pub protocol_errors: u64,
    /// Links faulted by keepalive timeouts.
    pub keepalive_timeouts: u64,
    /// Sessions resumed after a fault.
    pub reconnects: u64,
    /// Messages sent again after reconnects.
    pub replayed_messages: u64,
    /// Sessions that moved to another of their server's addresses
    /// (`--transport-change`).
    pub transport_changes: u64,
    /// Duplicates dropped by receivers.
    pub duplicates_dropped: u64,
    /// on_reset heard by clients.
    pub client_resets: u64,
    /// on_remote_reset heard by clients.
    pub remote_resets: u64,
    /// on_reset heard by servers.
    pub server_resets: u64,
    /// mark_down operations.
    pub mark_downs: u64,
    /// Server shutdown + restart events.
    pub server_restarts: u64,
    /// Connections marked down at the end of the workload because they
    /// still dialled a restarted server's old address.
    pub stale_marked_down: u64,
    /// Sends refused for a full queue (then retried).
    pub queue_full: u64,
    /// Messages reported undelivered by the final shutdowns.
    pub shutdown_undelivered: u64,
    /// Links left open after the workers stopped (must be 0).
    pub leaked_links: usize,
    /// Links still closing (writing a finished session's last output) at a
    /// shutdown's deadline, aborted: counted, not leaked.
    pub aborted_links: usize,
    /// Largest `rx_held` seen at the end (must be (0, 0)).
    pub rx_held_end: (usize, usize),
    /// Threads before the run.
    pub threads_before: usize,
    /// Threads after the run.
    pub threads_after: usize,
    /// Resident memory at start and end, KiB.
    pub rss_kib: (u64, u64),
    /// Violations found (all are counted; the first ones are listed).
    pub violation_count: u64,
    /// The first violations.
    pub violations: Vec<String>,
    /// Backend- or environment-specific figures (e.g. link flaps).
    pub extra: Vec<(String, String)>,
    /// The RMA figures (`--rma`), if the run did RMA.
    pub rma: Option<super::RmaReport>,
}

impl StressReport {
    /// No violation.
    pub fn passed(&self) -> bool {
        self.violation_count == 0
    }

    /// The report as JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("report serializes")
    }

    /// A human-readable summary, seed first.
    pub fn summary(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "msgr-stress seed={} backend={} servers={} clients={} faults={}",
            self.seed,
            self.backend,
            self.servers,
            self.clients,
            self.faults.as_deref().unwrap_or("off")
        );
        let _ = writeln!(
            s,
            "  duration      {:.1} s workload, {:.1} s in all",
            self.workload_s, self.total_s
        );
        if !self.phases.is_empty() {
            let phases: Vec<String> = self
                .phases
                .iter()
                .map(|(name, t)| format!("{name} {t:.2}"))
                .collect();
            let _ = writeln!(
                s,
                "  phases (s)    {}; slowest shutdown {:.2}",
                phases.join(", "),
                self.slowest_shutdown_s
            );
        }
        let _ = writeln!(
            s,
            "  messages      sent {} ({:.1} MiB), delivered {} ({:.1} MiB), {} large",
            self.sent_messages,
            self.sent_bytes as f64 / (1 << 20) as f64,
            self.delivered_messages,
            self.delivered_bytes as f64 / (1 << 20) as f64,
            self.large_messages
        );
        let _ = writeln!(
            s,
            "  throughput    {:.0} msg/s, {:.1} MiB/s",
            self.msgs_per_s, self.mib_per_s
        );
        let _ = writeln!(
            s,
            "  faults        injected {}, real {}, simulated {}, link faults {}, crc/protocol {}, keepalive {}",
            self.injected_faults,
            self.real_faults,
            self.simulated_faults,
            self.link_faults,
            self.protocol_errors,
            self.keepalive_timeouts
        );
        let _ = writeln!(
            s,
            "  recovery      reconnects {}, replayed {}, duplicates dropped {}, transport changes {}",
            self.reconnects, self.replayed_messages, self.duplicates_dropped, self.transport_changes
        );
        let _ = writeln!(
            s,
            "  churn         restarts {}, mark_downs {} (+{} stale at the end), resets client/server/remote {}/{}/{}, queue-full retries {}",
            self.server_restarts,
            self.mark_downs,
            self.stale_marked_down,
            self.client_resets,
            self.server_resets,
            self.remote_resets,
            self.queue_full
        );
        let _ = writeln!(
            s,
            "  epochs        {} ({} exact lossless, {} disturbed, {} lossy)",
            self.epochs, self.exact_epochs, self.disturbed_epochs, self.lossy_epochs
        );
        let _ = writeln!(
            s,
            "  leaks         rx_held {:?}, leaked links {} (closing ones aborted {}), threads {} -> {}, rss {} -> {} KiB",
            self.rx_held_end,
            self.leaked_links,
            self.aborted_links,
            self.threads_before,
            self.threads_after,
            self.rss_kib.0,
            self.rss_kib.1
        );
        if let Some(r) = &self.rma {
            let failed: Vec<String> = r.failed.iter().map(|(k, v)| format!("{k} {v}")).collect();
            let _ = writeln!(
                s,
                "  rma           writes {} ({:.1} MiB), reads {} ({:.1} MiB), {:.1} MiB checked, {} slices checked by owners at the end; op {:.2} ms mean, {:.0} ms max",
                r.writes,
                r.bytes_written as f64 / (1 << 20) as f64,
                r.reads,
                r.bytes_read as f64 / (1 << 20) as f64,
                r.bytes_checked as f64 / (1 << 20) as f64,
                r.slices_checked_at_end,
                r.op_ms_mean,
                r.op_ms_max
            );
            let _ = writeln!(
                s,
                "  rma outcomes  failed (expected) [{}]; ambiguous writes {}; owners served {} writes, refused {} ({} incarnations accounted); violations lost {}, corrupted {}, twice {}",
                failed.join(", "),
                r.ambiguous_writes,
                r.served_writes,
                r.refused,
                r.incarnations_accounted,
                r.lost,
                r.corrupted,
                r.twice
            );
        }
        for (k, v) in &self.extra {
            let _ = writeln!(s, "  {k:<13} {v}");
        }
        if self.passed() {
            let _ = writeln!(s, "  result        PASS");
        } else {
            let _ = writeln!(
                s,
                "  result        FAIL: {} violation(s); reproduce with seed {}",
                self.violation_count, self.seed
            );
            for v in &self.violations {
                let _ = writeln!(s, "    - {v}");
            }
        }
        s
    }
}

/// Resident set size of this process, KiB.
pub(crate) fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// Threads of this process.
pub(crate) fn thread_count() -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Each thread of this process that is blocked in the kernel other than in
/// an ordinary wait (epoll, futex, sleep): its name, state, wait channel
/// and the top of its kernel stack (root only) — what a worker stuck in a
/// system call looks like (a drain failure prints it).
pub(crate) fn blocked_threads() -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    let read = |p: std::path::PathBuf| std::fs::read_to_string(p).unwrap_or_default();
    let mut out = Vec::new();
    for task in dir.flatten() {
        let path = task.path();
        let comm = read(path.join("comm"));
        let stat = read(path.join("stat"));
        // The state follows the parenthesised name.
        let state = stat
            .rsplit(')')
            .next()
            .and_then(|r| r.split_whitespace().next());
        let wchan = read(path.join("wchan"));
        // Waits are named differently across kernel versions.
        let ordinary = [
            "ep_poll",
            "do_epoll_wait",
            "futex_wait",
            "futex_do_wait",
            "hrtimer_nanosleep",
            "do_nanosleep",
        ]
        .iter()
        .any(|w| wchan.starts_with(w));
        if state == Some("R") || ordinary {
            continue;
        }
        let stack: Vec<String> = read(path.join("stack"))
            .lines()
            .take(8)
            .map(|l| l.split_whitespace().nth(1).unwrap_or(l).to_string())
            .collect();
        out.push(format!(
            "thread {} {} state {} wchan {} stack [{}]",
            task.file_name().to_string_lossy(),
            comm.trim(),
            state.unwrap_or("?"),
            if wchan.is_empty() { "?" } else { wchan.trim() },
            stack.join(" < ")
        ));
    }
    out
}

/// The TCP sockets listening in this network namespace, as `addr:port`
/// (from /proc/net/tcp and tcp6). Over iWARP they include siw's own
/// listeners (one per rdma_cm listening id): a drain failure prints them,
/// so a server that rdma_cm calls listening but that refuses connections
/// shows which it is.
pub(crate) fn tcp_listeners() -> Vec<String> {
    let mut out = Vec::new();
    for file in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        for line in text.lines().skip(1) {
            let mut f = line.split_whitespace();
            let (Some(local), Some(state)) = (f.nth(1), f.nth(1)) else {
                continue;
            };
            if state == "0A" {
                out.push(proc_net_addr(local).unwrap_or_else(|| local.to_string()));
            }
        }
    }
    out
}

/// `0100007F:1F90` (IPv4, or 32 hex digits of IPv6, in host-order words)
/// as `127.0.0.1:8080`.
fn proc_net_addr(s: &str) -> Option<String> {
    let (ip, port) = s.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let words: Option<Vec<u32>> = (0..ip.len() / 8)
        .map(|i| u32::from_str_radix(ip.get(i * 8..i * 8 + 8)?, 16).ok())
        .collect();
    let bytes: Vec<u8> = words?.iter().flat_map(|w| w.to_ne_bytes()).collect();
    let ip: std::net::IpAddr = match bytes.len() {
        4 => <[u8; 4]>::try_from(bytes).ok()?.into(),
        16 => <[u8; 16]>::try_from(bytes).ok()?.into(),
        _ => return None,
    };
    Some(std::net::SocketAddr::new(ip, port).to_string())
}

pub(crate) fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

#[cfg(test)]
mod blocked_tests {
    use super::*;
    use std::io::Read;
    use std::time::Instant;

    #[test]
    fn listeners_are_read_from_proc() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let me = l.local_addr().unwrap().to_string();
        assert!(
            tcp_listeners().contains(&me),
            "{me} in {:?}",
            tcp_listeners()
        );
        assert_eq!(
            proc_net_addr("0100007F:1F90").as_deref(),
            Some("127.0.0.1:8080")
        );
        assert_eq!(
            proc_net_addr("00000000000000000000000001000000:0016").as_deref(),
            Some("[::1]:22")
        );
        assert_eq!(proc_net_addr("zz:1"), None);
    }

    #[test]
    fn a_thread_blocked_in_a_read_is_listed() {
        let (mut rx, tx) = std::io::pipe().expect("pipe");
        let h = std::thread::Builder::new()
            .name("blocked-probe".into())
            .spawn(move || {
                let mut b = [0u8; 1];
                let _ = rx.read(&mut b);
            })
            .expect("spawn");
        let deadline = Instant::now() + Duration::from_secs(10);
        let found = loop {
            let found = blocked_threads()
                .into_iter()
                .find(|t| t.contains("blocked-probe"));
            if found.is_some() || Instant::now() >= deadline {
                break found;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        drop(tx);
        h.join().expect("probe thread");
        let t = found.expect("the blocked thread is listed");
        println!("{t}");
        assert!(t.contains("state S"), "{t}");
    }
}
