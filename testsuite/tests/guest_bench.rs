//! The `msgr` tool over the verbs backend against perftest, in one guest
//! boot: `ib_send_lat` (2 B, 64 B) and `ib_write_bw` (64 KiB) on rxe0 as the
//! reference peers (polling), then `msgr ping` (2 B, 64 B) and `msgr stream` (64 KiB
//! messages) over `verbs://127.0.0.1:PORT?dev=rxe0`, and the same msgr runs
//! over TCP for context. Prints a table of msgr / reference ratios.
//!
//!     cargo test --release -p msgr-testsuite --features rdma --test guest_bench -- --nocapture
//!
//! The ratios are reported, not asserted: TCG timings swing with host load,
//! and performance claims come from benchmark runs, not from timed tests
//! (docs/BENCHMARKS.md). The test fails when any run fails or its output does
//! not parse.
#![cfg(feature = "rdma")]

use msgr_testsuite::guest::reference::{
    cm_send_lat, cm_write_bw, loopback_send_lat, loopback_write_bw, parse_send_lat, parse_write_bw,
    Bandwidth, CmFabric, CqWait, Latency, LOOPBACK_DEVICE,
};
use msgr_testsuite::guest::tool::{
    parse_ping, parse_stream, serve_and_run, ClientRun, PingFigures, StreamFigures,
};
use msgr_testsuite::guest::{build_programs, GuestCommand, GuestOutcome, GuestRunner};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

/// Ping-pong payload sizes.
const LAT_SIZES: [u32; 2] = [2, 64];
/// Streaming message size.
const BW_SIZE: u32 = 64 << 10;
/// Timed round trips of every latency run (msgr and perftest alike).
const LAT_ITERS: u32 = 2000;
/// msgr's untimed round trips first (perftest warms up on its own).
const LAT_WARMUP: u32 = 200;
/// `ib_write_bw` iterations.
const BW_ITERS: u32 = 1000;
/// Seconds `msgr stream` sends.
const STREAM_SECS: u32 = 3;
/// Issue targets (DESIGN §7), printed beside the ratios.
const LATENCY_TARGET: f64 = 1.3;
const BANDWIDTH_TARGET: f64 = 0.8;

/// The `msgr` tool built with the verbs backend, with this test's profile
/// and target directory.
fn msgr_tool() -> PathBuf {
    let path = build_programs(&[
        "-p",
        "msgr-tool",
        "--features",
        "verbs,rdmacm",
        "--bin",
        "msgr",
    ])
    .join("msgr");
    assert!(path.exists(), "{} missing", path.display());
    path
}

fn send_lat_name(size: u32, wait: CqWait) -> String {
    match wait {
        CqWait::Poll => format!("ref-ib_send_lat-{size}"),
        CqWait::Events => format!("ref-ib_send_lat-{size}-events"),
    }
}

fn write_bw_name() -> String {
    format!("ref-ib_write_bw-{BW_SIZE}")
}

fn siw_lat_name(size: u32) -> String {
    format!("ref-ib_send_lat-R-siw0-{size}")
}

fn siw_bw_name() -> String {
    format!("ref-ib_write_bw-R-siw0-{BW_SIZE}")
}

fn commands(tool: &std::path::Path) -> Vec<GuestCommand> {
    let mut cmds = vec![GuestCommand::shell(
        "rxe0-gids",
        // Context for the report: the GIDs perftest and msgr pick from.
        format!("ibv_devinfo -v -d {LOOPBACK_DEVICE} | grep -E 'GID|state|active_mtu'"),
    )];
    // Each perftest pair takes base_port, +100, +200 (retries).
    let mut port = 18810;
    for size in LAT_SIZES {
        cmds.push(loopback_send_lat(
            send_lat_name(size, CqWait::Poll),
            size,
            LAT_ITERS,
            CqWait::Poll,
            port,
        ));
        port += 1;
    }
    // The event-driven reference: what a messenger that blocks pays. Context
    // only: under TCG it once hung a whole command timeout, so its failure
    // is reported, never fatal (a reference peer's trouble is not msgr's).
    cmds.push(
        loopback_send_lat(
            send_lat_name(64, CqWait::Events),
            64,
            LAT_ITERS,
            CqWait::Events,
            port,
        )
        .timeout(Duration::from_secs(60)),
    );
    cmds.push(loopback_write_bw(
        write_bw_name(),
        BW_SIZE,
        BW_ITERS,
        port + 1,
    ));
    // soft-iWARP through rdma_cm: perftest's rdma_cm mode against msgr's
    // rdmacm backend (siw enforces RLIMIT_MEMLOCK even for root: raised, as
    // a deployment would).
    let siw = CmFabric::Siw;
    for (i, size) in LAT_SIZES.into_iter().enumerate() {
        cmds.push(cm_send_lat(
            siw_lat_name(size),
            siw,
            size,
            LAT_ITERS,
            19110 + i as u16,
        ));
    }
    cmds.push(cm_write_bw(siw_bw_name(), siw, BW_SIZE, BW_ITERS, 19120));
    let mut runs: Vec<ClientRun> = LAT_SIZES
        .iter()
        .map(|&size| ClientRun::Ping {
            size,
            count: LAT_ITERS,
            warmup: LAT_WARMUP,
        })
        .collect();
    runs.push(ClientRun::Stream {
        size: BW_SIZE,
        secs: STREAM_SECS,
    });
    cmds.push(serve_and_run(
        "msgr-verbs",
        tool,
        &format!("verbs://127.0.0.1:18830?dev={LOOPBACK_DEVICE}"),
        &[],
        &runs,
    ));
    let mut over_siw = serve_and_run(
        "msgr-rdmacm-siw0",
        tool,
        &format!("rdmacm://{}:18832", siw.addr()),
        &[],
        &runs,
    );
    over_siw.script = format!("ulimit -l unlimited\n{}", over_siw.script);
    cmds.push(over_siw);
    cmds.push(serve_and_run(
        "msgr-tcp",
        tool,
        "tcp://127.0.0.1:18831",
        &[],
        &runs,
    ));
    cmds
}

/// Every figure of the boot; `errors` lists what failed or did not parse.
struct Figures {
    send_lat: Vec<(u32, CqWait, Result<Latency, String>)>,
    write_bw: Result<Bandwidth, String>,
    /// perftest over rdma_cm on siw0, one per [`LAT_SIZES`] entry.
    siw_lat: Vec<Result<Latency, String>>,
    siw_bw: Result<Bandwidth, String>,
    /// Over verbs (rxe0), over TCP, over rdmacm (siw0).
    msgr: Vec<MsgrFigures>,
}

/// msgr's figures over one transport.
struct MsgrFigures {
    transport: &'static str,
    /// One per [`LAT_SIZES`] entry.
    pings: Vec<Result<PingFigures, String>>,
    stream: Result<StreamFigures, String>,
}

/// A latency row: what is compared, perftest's column, its figure, msgr's.
type LatencyRow<'a> = (&'a str, &'a str, Option<f64>, fn(&PingFigures) -> f64);

fn output<'a>(out: &'a GuestOutcome, name: &str) -> Result<&'a str, String> {
    let c = out
        .command(name)
        .ok_or_else(|| format!("{name}: not run"))?;
    if c.success() {
        Ok(&c.output)
    } else {
        Err(format!(
            "{name}: exit {:?}{}",
            c.exit_status,
            if c.timed_out { " (timed out)" } else { "" }
        ))
    }
}

fn parse(out: &GuestOutcome) -> Figures {
    let mut send_lat = Vec::new();
    for (size, wait) in LAT_SIZES
        .iter()
        .map(|&s| (s, CqWait::Poll))
        .chain([(64, CqWait::Events)])
    {
        let l = output(out, &send_lat_name(size, wait)).and_then(parse_send_lat);
        send_lat.push((size, wait, l));
    }
    let write_bw = output(out, &write_bw_name()).and_then(parse_write_bw);
    let siw_lat = LAT_SIZES
        .iter()
        .map(|&s| output(out, &siw_lat_name(s)).and_then(parse_send_lat))
        .collect();
    let siw_bw = output(out, &siw_bw_name()).and_then(parse_write_bw);
    let msgr = [
        ("verbs", "msgr-verbs"),
        ("tcp", "msgr-tcp"),
        ("rdmacm", "msgr-rdmacm-siw0"),
    ]
    .into_iter()
    .map(|(transport, name)| {
        let o = output(out, name);
        let pings = LAT_SIZES
            .iter()
            .map(|&s| o.clone().and_then(|o| parse_ping(o, s)))
            .collect();
        let stream = o.and_then(|o| parse_stream(o, BW_SIZE));
        MsgrFigures {
            transport,
            pings,
            stream,
        }
    })
    .collect();
    Figures {
        send_lat,
        write_bw,
        siw_lat,
        siw_bw,
        msgr,
    }
}

impl Figures {
    fn errors(&self) -> Vec<String> {
        let mut e = Vec::new();
        for (_, wait, l) in &self.send_lat {
            if *wait == CqWait::Poll {
                e.extend(l.as_ref().err().cloned());
            }
        }
        e.extend(self.write_bw.as_ref().err().cloned());
        for l in &self.siw_lat {
            e.extend(l.as_ref().err().cloned());
        }
        e.extend(self.siw_bw.as_ref().err().cloned());
        for m in &self.msgr {
            let t = m.transport;
            for p in &m.pings {
                e.extend(p.as_ref().err().map(|x| format!("{t}: {x}")));
            }
            e.extend(m.stream.as_ref().err().map(|x| format!("{t}: {x}")));
        }
        e
    }

    fn table(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "msgr vs perftest on {LOOPBACK_DEVICE}, one TCG guest boot (compare ratios only); \
             msgr default config (1 worker, busy-poll 200 µs), lossless"
        );
        let _ = writeln!(
            s,
            "{:<26} {:<34} {:>11} {:>11} {:>8} {:>11} {:>8} {:>8}",
            "measure",
            "reference",
            "reference",
            "msgr verbs",
            "ratio",
            "msgr tcp",
            "ratio",
            "target"
        );
        let msgr_ping = |t: usize, size: u32| {
            let i = LAT_SIZES.iter().position(|&x| x == size)?;
            self.msgr[t].pings[i].as_ref().ok()
        };
        let fmt = |v: Option<f64>, unit: &str| v.map_or("-".into(), |v| format!("{v:.2}{unit}"));
        let ratio = |m: Option<f64>, r: Option<f64>| match (m, r) {
            (Some(m), Some(r)) if r > 0.0 => format!("{:.2}x", m / r),
            _ => "-".into(),
        };
        for (size, wait, l) in &self.send_lat {
            let l = l.as_ref().ok();
            let rows: [LatencyRow<'_>; 2] = [
                ("one-way p50", "t_typical", l.map(|l| l.t_typical_us), |p| {
                    p.one_way_p50_us
                }),
                ("one-way mean", "t_avg", l.map(|l| l.t_avg_us), |p| {
                    p.one_way_mean_us
                }),
            ];
            for (what, col, reference, pick) in rows {
                let v = msgr_ping(0, *size).map(pick);
                let t = msgr_ping(1, *size).map(pick);
                let reference_name = match wait {
                    CqWait::Poll => format!("ib_send_lat {col} (polling)"),
                    CqWait::Events => format!("ib_send_lat -e {col} (events)"),
                };
                let _ = writeln!(
                    s,
                    "{:<26} {:<34} {:>11} {:>11} {:>8} {:>11} {:>8} {:>8}",
                    format!("{size} B {what}"),
                    reference_name,
                    fmt(reference, " us"),
                    fmt(v, " us"),
                    ratio(v, reference),
                    fmt(t, " us"),
                    ratio(t, reference),
                    if *wait == CqWait::Poll {
                        format!("<= {LATENCY_TARGET}x")
                    } else {
                        "context".into()
                    }
                );
            }
        }
        let reference = self.write_bw.as_ref().ok().map(|b| b.bw_avg_mb_s);
        let v = self.msgr[0].stream.as_ref().ok().map(|s| s.mib_per_s);
        let t = self.msgr[1].stream.as_ref().ok().map(|s| s.mib_per_s);
        let _ = writeln!(
            s,
            "{:<26} {:<34} {:>11} {:>11} {:>8} {:>11} {:>8} {:>8}",
            format!("{} KiB bandwidth", BW_SIZE >> 10),
            "ib_write_bw BW average",
            fmt(reference, " MiB/s"),
            fmt(v, " MiB/s"),
            ratio(v, reference),
            fmt(t, " MiB/s"),
            ratio(t, reference),
            format!(">= {BANDWIDTH_TARGET}x")
        );
        let _ = writeln!(
            s,
            "\nmsgr rdmacm vs perftest -R on siw0 (soft-iWARP), same boot\n{:<26} {:<34} {:>11} {:>11} {:>8} {:>8}",
            "measure", "reference", "reference", "msgr rdmacm", "ratio", "target"
        );
        for (i, size) in LAT_SIZES.iter().enumerate() {
            let l = self.siw_lat[i].as_ref().ok();
            let m = self.msgr[2].pings[i].as_ref().ok();
            let rows: [(&str, &str, Option<f64>, Option<f64>); 2] = [
                (
                    "one-way p50",
                    "t_typical",
                    l.map(|l| l.t_typical_us),
                    m.map(|p| p.one_way_p50_us),
                ),
                (
                    "one-way mean",
                    "t_avg",
                    l.map(|l| l.t_avg_us),
                    m.map(|p| p.one_way_mean_us),
                ),
            ];
            for (what, col, reference, v) in rows {
                let _ = writeln!(
                    s,
                    "{:<26} {:<34} {:>11} {:>11} {:>8} {:>8}",
                    format!("{size} B {what}"),
                    format!("ib_send_lat -R {col}"),
                    fmt(reference, " us"),
                    fmt(v, " us"),
                    ratio(v, reference),
                    format!("<= {LATENCY_TARGET}x")
                );
            }
        }
        let reference = self.siw_bw.as_ref().ok().map(|b| b.bw_avg_mb_s);
        let v = self.msgr[2].stream.as_ref().ok().map(|s| s.mib_per_s);
        let _ = writeln!(
            s,
            "{:<26} {:<34} {:>11} {:>11} {:>8} {:>8}",
            format!("{} KiB bandwidth", BW_SIZE >> 10),
            "ib_write_bw -R BW average",
            fmt(reference, " MiB/s"),
            fmt(v, " MiB/s"),
            ratio(v, reference),
            format!(">= {BANDWIDTH_TARGET}x")
        );
        s
    }
}

/// One boot: reference peers, msgr over verbs, msgr over TCP; a table of
/// ratios. Fails if any run fails or its output does not parse.
#[test]
fn msgr_tool_against_perftest_in_the_guest() {
    let tool = msgr_tool();
    let runner = GuestRunner::from_env()
        .unwrap_or_else(|e| panic!("the RDMA test guest is unavailable: {e}"));
    let out = runner
        .run(&commands(&tool), Duration::from_secs(900))
        .expect("guest run");
    println!("{out}");
    let figures = parse(&out);
    println!("{}", figures.table());
    let errors = figures.errors();
    assert!(
        errors.is_empty(),
        "runs failed or did not parse:\n  {}\n{out}",
        errors.join("\n  ")
    );
    // Every command but the events-mode context reference must succeed.
    let context = send_lat_name(64, CqWait::Events);
    for c in out.commands.iter().filter(|c| c.name != context) {
        assert!(c.success(), "{} failed:\n{out}", c.name);
    }
}

#[test]
fn commands_are_valid_sh_and_stay_on_loopback() {
    let cmds = commands(std::path::Path::new("/nonexistent/msgr"));
    for c in &cmds {
        assert!(!c.script.contains("192.0.2."), "{}", c.script);
        let out = std::process::Command::new("sh")
            .args(["-n", "-c", &c.script])
            .output()
            .expect("sh");
        assert!(out.status.success(), "{}: {out:?}\n{}", c.name, c.script);
    }
    let names: Vec<&str> = cmds.iter().map(|c| c.name.as_str()).collect();
    let mut unique = names.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), names.len(), "{names:?}");
}
