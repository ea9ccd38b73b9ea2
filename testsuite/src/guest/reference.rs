//! Reference peers measured inside the guest: perftest's `ib_send_lat -R` and
//! `ib_write_bw -R`, and rdma-core's `rping`, each with client and server in
//! the same guest over rdma_cm, on Soft-RoCE (rxe1) and soft-iWARP (siw0).
//!
//! TCG figures mean nothing on their own: benchmarks of msgr's RDMA backends
//! report ratios against these, measured in the same guest boot.

use super::{FiguresError, GuestCommand, GuestOutcome, RXE_CM_ADDR, SIW_CM_ADDR};
use std::fmt;
use std::time::Duration;

/// An RDMA device of the guest reachable through rdma_cm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmFabric {
    /// Soft-RoCE `rxe1` on 198.51.100.1.
    Rxe,
    /// Soft-iWARP `siw0` on 198.51.100.2.
    Siw,
}

impl CmFabric {
    /// Both fabrics, in the order reports list them.
    pub const ALL: [CmFabric; 2] = [CmFabric::Rxe, CmFabric::Siw];

    /// The device's name, as perftest's `-d` takes it.
    pub fn device(self) -> &'static str {
        match self {
            CmFabric::Rxe => "rxe1",
            CmFabric::Siw => "siw0",
        }
    }

    /// The IPv4 address rdma_cm reaches the device at.
    pub fn addr(self) -> &'static str {
        match self {
            CmFabric::Rxe => RXE_CM_ADDR,
            CmFabric::Siw => SIW_CM_ADDR,
        }
    }

    fn label(self) -> &'static str {
        match self {
            CmFabric::Rxe => "rxe",
            CmFabric::Siw => "siw",
        }
    }
}

/// Sizes and counts of the reference runs.
#[derive(Clone, Debug)]
pub struct ReferenceParams {
    /// Message size of `ib_send_lat`, in bytes.
    pub lat_bytes: u32,
    /// Iterations of `ib_send_lat`.
    pub lat_iters: u32,
    /// Message size of `ib_write_bw`, in bytes.
    pub bw_bytes: u32,
    /// Iterations of `ib_write_bw`.
    pub bw_iters: u32,
    /// Ping data size of `rping` (`-S`), in bytes.
    pub rping_bytes: u32,
    /// Pings `rping` runs (`-C`).
    pub rping_count: u32,
}

impl Default for ReferenceParams {
    fn default() -> Self {
        ReferenceParams {
            lat_bytes: 64,
            lat_iters: 1000,
            bw_bytes: 65536,
            bw_iters: 500,
            rping_bytes: 64,
            rping_count: 100,
        }
    }
}

/// `ib_send_lat` client figures (µs).
#[derive(Clone, Debug, PartialEq)]
pub struct Latency {
    /// Message size.
    pub bytes: u64,
    /// Iterations measured.
    pub iterations: u64,
    /// Lowest latency.
    pub t_min_us: f64,
    /// Typical (median) latency.
    pub t_typical_us: f64,
    /// Mean latency.
    pub t_avg_us: f64,
    /// 99th percentile latency.
    pub p99_us: f64,
}

/// `ib_write_bw` client figures.
#[derive(Clone, Debug, PartialEq)]
pub struct Bandwidth {
    /// Message size.
    pub bytes: u64,
    /// Iterations measured.
    pub iterations: u64,
    /// Peak bandwidth, in MB/s as perftest reports it.
    pub bw_peak_mb_s: f64,
    /// Average bandwidth, in MB/s.
    pub bw_avg_mb_s: f64,
    /// Message rate, in millions of messages per second.
    pub msg_rate_mpps: f64,
}

/// `rping` client run, timed from the outside (rping prints no figures).
#[derive(Clone, Debug, PartialEq)]
pub struct Rping {
    /// Ping data size.
    pub bytes: u32,
    /// Pings run.
    pub count: u32,
    /// Wall time of the whole client run.
    pub elapsed: Duration,
}

impl Rping {
    /// Wall time per ping (each is a send, an RDMA read, a send, an RDMA
    /// write, with the server's acknowledgements), connection set-up included.
    pub fn per_ping_us(&self) -> f64 {
        self.elapsed.as_secs_f64() * 1e6 / f64::from(self.count.max(1))
    }
}

/// The figures of one fabric; `Err` holds why a tool failed or could not be parsed.
#[derive(Clone, Debug)]
pub struct FabricFigures {
    /// The fabric measured.
    pub fabric: CmFabric,
    /// `ib_send_lat` figures.
    pub send_lat: Result<Latency, FiguresError>,
    /// `ib_write_bw` figures.
    pub write_bw: Result<Bandwidth, FiguresError>,
    /// `rping` timing.
    pub rping: Result<Rping, FiguresError>,
}

impl FabricFigures {
    /// Every tool ran and its output parsed.
    pub fn all_ok(&self) -> bool {
        self.send_lat.is_ok() && self.write_bw.is_ok() && self.rping.is_ok()
    }
}

/// Figures of every reference peer from one guest boot.
#[derive(Clone, Debug)]
pub struct ReferenceFigures {
    /// One entry per fabric, in [`CmFabric::ALL`] order.
    pub fabrics: Vec<FabricFigures>,
}

impl ReferenceFigures {
    /// Every tool on every fabric ran and its output parsed.
    pub fn all_ok(&self) -> bool {
        self.fabrics.iter().all(FabricFigures::all_ok)
    }

    /// The figures of `fabric`.
    pub fn get(&self, fabric: CmFabric) -> Option<&FabricFigures> {
        self.fabrics.iter().find(|f| f.fabric == fabric)
    }
}

fn cmd_name(tool: &str, fabric: CmFabric) -> String {
    format!("ref-{tool}-{}", fabric.label())
}

// Each tool gets its own port: on iWARP the connections are real TCP
// connections, and a listener on a port in TIME_WAIT would not come up.
fn port(tool_index: u16, fabric: CmFabric) -> u16 {
    18515 + tool_index * 2 + u16::from(fabric == CmFabric::Siw)
}

/// Seconds one attempt of a reference pair may take (server and each client
/// run alike); a normal one takes a few. Three attempts and their kill grace
/// fit the pair commands' 150 s timeout.
const ATTEMPT_SECS: u32 = 40;

/// A client/server pair in one shell: server in the background, client in the
/// foreground; prints the client's output, then the server's after a
/// separator line. Both use port `$PORT`; `client` is a script of its own
/// (it ends with `exit`, not `return`).
///
/// Under TCG on a loaded host the tools are flaky in three known ways: the
/// server needs a moment to listen (every exec is slow), perftest's CPU
/// clock calibration can fail ("Correlation coefficient r^2 < 0.9"), which
/// makes it print `inf`, and, rarely, an rdma_cm pair on siw0 never finishes
/// (seen once in CI: a whole command timeout gone on one attempt). So a
/// client that fails while the server still runs is retried, every server
/// and client runs under `timeout` ([`ATTEMPT_SECS`]; `timeout` kills the
/// whole process group, so no busy-polling perftest outlives its attempt),
/// and a whole pair that fails, hangs or prints non-finite figures is run
/// again (up to 3 times) on a fresh port (siw connections are real TCP
/// connections: a port in TIME_WAIT would not listen again at once).
fn pair_script(base_port: u16, server: &str, client: &str) -> String {
    pair_script_within(base_port, server, client, ATTEMPT_SECS)
}

/// [`pair_script`] with `attempt_secs` per attempt.
fn pair_script_within(base_port: u16, server: &str, client: &str, attempt_secs: u32) -> String {
    let t = format!("timeout -k 5 {attempt_secs}");
    format!(
        "cat >$TMPDIR/client.sh <<'MSGR_CLIENT'\n\
         {client}\n\
         MSGR_CLIENT\n\
         attempt() {{\n\
         {t} {server} >$TMPDIR/server.log 2>&1 &\n\
         srv=$!\n\
         n=0\n\
         while :; do\n\
         \x20 sleep 1\n\
         \x20 {t} sh $TMPDIR/client.sh\n\
         \x20 rc=$?\n\
         \x20 n=$((n + 1))\n\
         \x20 if [ $rc -eq 0 ] || ! kill -0 $srv 2>/dev/null || [ $n -ge 5 ]; then break; fi\n\
         \x20 echo \"client attempt $n failed (exit $rc); retrying\"\n\
         done\n\
         wait $srv\n\
         src=$?\n\
         [ $rc -eq 0 ] && rc=$src\n\
         [ $rc -eq 124 ] && echo \"attempt timed out after {attempt_secs} s\"\n\
         echo '--- server ---'\n\
         cat $TMPDIR/server.log\n\
         return $rc\n\
         }}\n\
         for k in 0 1 2; do\n\
         \x20 PORT=$(({base_port} + 100 * k))\n\
         \x20 export PORT\n\
         \x20 attempt >$TMPDIR/attempt.log 2>&1\n\
         \x20 rc=$?\n\
         \x20 if [ $rc -eq 0 ] && ! grep -Eqw 'inf|-?nan' $TMPDIR/attempt.log; then break; fi\n\
         \x20 echo \"=== attempt $k: exit $rc or non-finite figures ===\"\n\
         \x20 cat $TMPDIR/attempt.log\n\
         \x20 echo \"=== end of attempt $k ===\"\n\
         done\n\
         cat $TMPDIR/attempt.log\n\
         exit $rc\n"
    )
}

/// `ib_send_lat -R` (rdma_cm mode) client and server on fabric `f`, with the
/// retries of [`reference_commands`] from `base_port` (`+100`, `+200` must be
/// free too). Parse its output with [`parse_send_lat`].
pub fn cm_send_lat(
    name: impl Into<String>,
    f: CmFabric,
    bytes: u32,
    iters: u32,
    base_port: u16,
) -> GuestCommand {
    cm_perftest(name, "ib_send_lat", f, bytes, iters, base_port)
}

/// `ib_write_bw -R` on fabric `f`, like [`cm_send_lat`]. Parse its output
/// with [`parse_write_bw`].
pub fn cm_write_bw(
    name: impl Into<String>,
    f: CmFabric,
    bytes: u32,
    iters: u32,
    base_port: u16,
) -> GuestCommand {
    cm_perftest(name, "ib_write_bw", f, bytes, iters, base_port)
}

/// A perftest pair in rdma_cm mode on fabric `f`.
fn cm_perftest(
    name: impl Into<String>,
    tool: &str,
    f: CmFabric,
    bytes: u32,
    iters: u32,
    base_port: u16,
) -> GuestCommand {
    let cmd = format!("{tool} -R -d {} -p $PORT -s {bytes} -n {iters}", f.device());
    GuestCommand::shell(
        name,
        pair_script(base_port, &cmd, &format!("{cmd} {}", f.addr())),
    )
    .timeout(Duration::from_secs(150))
}

/// The guest commands that run every reference peer on both fabrics.
pub fn reference_commands(p: &ReferenceParams) -> Vec<GuestCommand> {
    let mut cmds = Vec::new();
    for f in CmFabric::ALL {
        let addr = f.addr();
        cmds.push(cm_send_lat(
            cmd_name("ib_send_lat", f),
            f,
            p.lat_bytes,
            p.lat_iters,
            port(0, f),
        ));
        cmds.push(cm_write_bw(
            cmd_name("ib_write_bw", f),
            f,
            p.bw_bytes,
            p.bw_iters,
            port(1, f),
        ));
        let rping = format!(
            "rping -a {addr} -p $PORT -S {} -C {}",
            p.rping_bytes, p.rping_count
        );
        let client = format!(
            "s=$(date +%s%N)\n{rping} -c\nr=$?\ne=$(date +%s%N)\n\
             echo \"rping_elapsed_ns $((e - s)) count {} bytes {}\"\nexit $r",
            p.rping_count, p.rping_bytes
        );
        cmds.push(
            GuestCommand::shell(
                cmd_name("rping", f),
                pair_script(port(2, f), &format!("{rping} -s"), &client),
            )
            .timeout(Duration::from_secs(150)),
        );
    }
    cmds
}

/// Soft-RoCE on lo: the device msgr's verbs backend uses in the guest, where
/// the peers set their QPs up over their own TCP exchange on 127.0.0.1
/// (rdma_cm cannot resolve loopback addresses).
pub const LOOPBACK_DEVICE: &str = "rxe0";
/// GID index perftest uses on [`LOOPBACK_DEVICE`]: its RoCE v2 GID
/// `::ffff:127.0.0.1` (index 0 is the link-local GID lo has no use for).
pub const LOOPBACK_GID_INDEX: u32 = 1;

/// How `ib_send_lat` waits for its completions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CqWait {
    /// Spins on `ibv_poll_cq` (perftest's default, and its best figure).
    Poll,
    /// Sleeps on the completion channel (`-e`): arm, block, wake, poll — the
    /// path a messenger that does not spin takes.
    Events,
}

/// `ib_send_lat` client and server on [`LOOPBACK_DEVICE`] (out-of-band
/// exchange on 127.0.0.1), with the retries of [`reference_commands`];
/// `base_port` and `base_port + 100`, `+ 200` must be free. Parse its output
/// with [`parse_send_lat`].
pub fn loopback_send_lat(
    name: impl Into<String>,
    bytes: u32,
    iters: u32,
    wait: CqWait,
    base_port: u16,
) -> GuestCommand {
    let events = match wait {
        CqWait::Poll => "",
        CqWait::Events => " -e",
    };
    let tool = format!(
        "ib_send_lat -d {LOOPBACK_DEVICE} -x {LOOPBACK_GID_INDEX} -p $PORT -s {bytes} -n {iters}{events}"
    );
    GuestCommand::shell(
        name,
        pair_script(base_port, &tool, &format!("{tool} 127.0.0.1")),
    )
    .timeout(Duration::from_secs(150))
}

/// A perftest bandwidth tool: one-sided writes or reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BwTool {
    /// `ib_write_bw`.
    Write,
    /// `ib_read_bw`.
    Read,
}

impl BwTool {
    /// The program's name.
    pub fn program(self) -> &'static str {
        match self {
            BwTool::Write => "ib_write_bw",
            BwTool::Read => "ib_read_bw",
        }
    }
}

/// `ib_write_bw` or `ib_read_bw` client and server on [`LOOPBACK_DEVICE`],
/// like [`loopback_send_lat`]. Both print the same columns: parse the
/// output with [`parse_write_bw`].
pub fn loopback_bw(
    name: impl Into<String>,
    tool: BwTool,
    bytes: u32,
    iters: u32,
    base_port: u16,
) -> GuestCommand {
    let tool = tool.program();
    let tool = format!(
        "{tool} -d {LOOPBACK_DEVICE} -x {LOOPBACK_GID_INDEX} -p $PORT -s {bytes} -n {iters}"
    );
    GuestCommand::shell(
        name,
        pair_script(base_port, &tool, &format!("{tool} 127.0.0.1")),
    )
    .timeout(Duration::from_secs(150))
}

/// Extracts the figures of the commands [`reference_commands`] made.
pub fn parse_reference(outcome: &GuestOutcome) -> ReferenceFigures {
    let output = |name: String| -> Result<&str, FiguresError> {
        let Some(c) = outcome.command(&name) else {
            return Err(FiguresError::NotRun(name));
        };
        if c.success() {
            Ok(c.output.as_str())
        } else {
            Err(FiguresError::Failed {
                name,
                status: c.exit_status,
                timed_out: c.timed_out,
                head: c.output.lines().take(8).collect::<Vec<_>>().join(" | "),
            })
        }
    };
    let fabrics = CmFabric::ALL
        .into_iter()
        .map(|f| FabricFigures {
            fabric: f,
            send_lat: output(cmd_name("ib_send_lat", f)).and_then(parse_send_lat),
            write_bw: output(cmd_name("ib_write_bw", f)).and_then(parse_write_bw),
            rping: output(cmd_name("rping", f)).and_then(parse_rping),
        })
        .collect();
    ReferenceFigures { fabrics }
}

/// The first row of numbers after perftest's `#bytes` header (the client's)
/// of the last attempt; None when there is none or it has non-finite figures
/// (failed clock calibration).
fn perftest_row(out: &str) -> Option<Vec<f64>> {
    let out = out.rsplit("=== end of attempt").next().unwrap_or(out);
    let mut lines = out
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("#bytes"));
    lines.next()?;
    let row: Vec<f64> = lines
        .next()?
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    row.iter().all(|v| v.is_finite()).then_some(row)
}

/// Parses `ib_send_lat` output (`#bytes #iterations t_min t_max t_typical
/// t_avg t_stdev 99% 99.9%`).
pub fn parse_send_lat(out: &str) -> Result<Latency, FiguresError> {
    match perftest_row(out).as_deref() {
        Some([bytes, iters, t_min, _t_max, t_typ, t_avg, _stdev, p99, ..]) => Ok(Latency {
            bytes: *bytes as u64,
            iterations: *iters as u64,
            t_min_us: *t_min,
            t_typical_us: *t_typ,
            t_avg_us: *t_avg,
            p99_us: *p99,
        }),
        _ => Err(FiguresError::NoRow("ib_send_lat")),
    }
}

/// Parses `ib_write_bw` (or `ib_read_bw`) output (`#bytes #iterations
/// BW-peak BW-average MsgRate`).
pub fn parse_write_bw(out: &str) -> Result<Bandwidth, FiguresError> {
    match perftest_row(out).as_deref() {
        Some([bytes, iters, peak, avg, rate, ..]) => Ok(Bandwidth {
            bytes: *bytes as u64,
            iterations: *iters as u64,
            bw_peak_mb_s: *peak,
            bw_avg_mb_s: *avg,
            msg_rate_mpps: *rate,
        }),
        _ => Err(FiguresError::NoRow("ib_write_bw")),
    }
}

/// Parses the line the rping wrapper prints:
/// `rping_elapsed_ns <ns> count <n> bytes <b>`.
pub fn parse_rping(out: &str) -> Result<Rping, FiguresError> {
    // The last attempt's line (earlier attempts may have failed).
    let line = out
        .lines()
        .rev()
        .find(|l| l.starts_with("rping_elapsed_ns "))
        .ok_or(FiguresError::NoTimingLine)?;
    let f: Vec<&str> = line.split_whitespace().collect();
    match f.as_slice() {
        ["rping_elapsed_ns", ns, "count", n, "bytes", b] => Ok(Rping {
            elapsed: Duration::from_nanos(
                ns.parse().map_err(|_| FiguresError::BadRpingField("ns"))?,
            ),
            count: n
                .parse()
                .map_err(|_| FiguresError::BadRpingField("count"))?,
            bytes: b
                .parse()
                .map_err(|_| FiguresError::BadRpingField("bytes"))?,
        }),
        _ => Err(FiguresError::RpingLine(line.into())),
    }
}

impl fmt::Display for ReferenceFigures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{:<6} {:<12} {:>10} {:>8} {:<52}",
            "fabric", "tool", "bytes", "iters", "figures (TCG guest: compare ratios only)"
        )?;
        for fab in &self.fabrics {
            let name = fab.fabric.label();
            match &fab.send_lat {
                Ok(l) => writeln!(
                    f,
                    "{name:<6} {:<12} {:>10} {:>8} typical {:.2} us, avg {:.2} us, min {:.2} us, p99 {:.2} us",
                    "ib_send_lat", l.bytes, l.iterations, l.t_typical_us, l.t_avg_us, l.t_min_us, l.p99_us
                )?,
                Err(e) => writeln!(f, "{name:<6} {:<12} FAILED: {e}", "ib_send_lat")?,
            }
            match &fab.write_bw {
                Ok(b) => writeln!(
                    f,
                    "{name:<6} {:<12} {:>10} {:>8} avg {:.2} MB/s, peak {:.2} MB/s, {:.6} Mpps",
                    "ib_write_bw",
                    b.bytes,
                    b.iterations,
                    b.bw_avg_mb_s,
                    b.bw_peak_mb_s,
                    b.msg_rate_mpps
                )?,
                Err(e) => writeln!(f, "{name:<6} {:<12} FAILED: {e}", "ib_write_bw")?,
            }
            match &fab.rping {
                Ok(r) => writeln!(
                    f,
                    "{name:<6} {:<12} {:>10} {:>8} {:.1} us per ping ({:.2} s total)",
                    "rping",
                    r.bytes,
                    r.count,
                    r.per_ping_us(),
                    r.elapsed.as_secs_f64()
                )?,
                Err(e) => writeln!(f, "{name:<6} {:<12} FAILED: {e}", "rping")?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LAT: &str = "\
---------------------------------------------------------------------------------------
 #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] 
 64      1000          17.89          17724.01      23.31    \t       992.71      \t2226.23\t\t8160.19 \t\t17724.01
---------------------------------------------------------------------------------------
";
    const BW: &str = "\
 #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]
 65536      1000             47.09              28.45  \t\t   0.000455
";

    #[test]
    fn parses_perftest() {
        let l = parse_send_lat(LAT).unwrap();
        assert_eq!((l.bytes, l.iterations), (64, 1000));
        assert_eq!(
            (l.t_min_us, l.t_typical_us, l.t_avg_us, l.p99_us),
            (17.89, 23.31, 992.71, 8160.19)
        );
        let b = parse_write_bw(BW).unwrap();
        assert_eq!(
            (b.bytes, b.bw_peak_mb_s, b.bw_avg_mb_s),
            (65536, 47.09, 28.45)
        );
        assert!(parse_send_lat("Unable to init the socket connection").is_err());
        let inf = LAT.replace("17.89", "inf");
        assert!(
            parse_send_lat(&inf).is_err(),
            "non-finite figures are a failure"
        );
    }

    #[test]
    fn parses_rping() {
        let r = parse_rping("x\nrping_elapsed_ns 2000000 count 200 bytes 64\n").unwrap();
        assert_eq!(r.count, 200);
        assert!((r.per_ping_us() - 10.0).abs() < 1e-9);
        assert!(parse_rping("nothing").is_err());
    }

    #[test]
    fn loopback_commands_are_valid_sh() {
        let cmds = [
            loopback_send_lat("lat", 2, 100, CqWait::Poll, 19000),
            loopback_send_lat("lat-e", 64, 100, CqWait::Events, 19001),
            loopback_bw("bw", BwTool::Write, 65536, 100, 19002),
            loopback_bw("read-bw", BwTool::Read, 1 << 20, 100, 19003),
        ];
        assert!(cmds[3]
            .script
            .contains("ib_read_bw -d rxe0 -x 1 -p $PORT -s 1048576 -n 100"));
        assert!(cmds[0]
            .script
            .contains("-d rxe0 -x 1 -p $PORT -s 2 -n 100 127.0.0.1"));
        assert!(cmds[1].script.contains(" -e 127.0.0.1"));
        assert!(!cmds[0].script.contains("-n 100 -e"));
        for c in &cmds {
            let out = std::process::Command::new("sh")
                .args(["-n", "-c", &c.script])
                .output()
                .expect("sh");
            assert!(out.status.success(), "{}: {out:?}\n{}", c.name, c.script);
        }
    }

    /// A pair that hangs on its first port is killed, with every process it
    /// started, and run again on the next port.
    #[test]
    fn a_hung_attempt_is_killed_and_retried_on_a_fresh_port() {
        let dir = std::env::temp_dir().join(format!("msgr-pair-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // A marker no other process on the machine runs.
        let hang = "sleep 123.4567";
        let server = format!("sh -c '[ $PORT = 1000 ] && {hang}; echo served $PORT'");
        let client = format!("[ $PORT = 1000 ] && {hang}\necho client $PORT\nexit 0");
        let script = pair_script_within(1000, &server, &client, 2);
        let out = std::process::Command::new("sh")
            .args(["-c", &script])
            .env("TMPDIR", &dir)
            .output()
            .expect("sh");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{out:?}");
        assert!(text.contains("attempt timed out after 2 s"), "{text}");
        assert!(text.contains("=== attempt 0: exit 124"), "{text}");
        let last = text.rsplit("=== end of attempt 0 ===").next().unwrap();
        assert!(
            last.contains("client 1100") && last.contains("served 1100"),
            "{text}"
        );
        let left = std::process::Command::new("pgrep")
            .args(["-f", hang])
            .output()
            .expect("pgrep");
        assert!(left.stdout.is_empty(), "outlived its attempt: {left:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn commands_cover_both_fabrics() {
        let cmds = reference_commands(&ReferenceParams::default());
        assert_eq!(cmds.len(), 6);
        assert!(cmds.iter().any(|c| c.script.contains("-d siw0")));
        assert!(cmds.iter().all(|c| !c.script.contains("192.0.2.")));
        for c in &cmds {
            // Every script is valid sh.
            let out = std::process::Command::new("sh")
                .args(["-n", "-c", &c.script])
                .output()
                .expect("sh");
            assert!(out.status.success(), "{}: {out:?}\n{}", c.name, c.script);
        }
    }
}
