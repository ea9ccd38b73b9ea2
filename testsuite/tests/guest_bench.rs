//! The `msgr` tool over the verbs backend against perftest, in one guest
//! boot, in three rounds (medians and spreads are reported): `ib_send_lat` (2 B, 64 B) and `ib_write_bw` (64 KiB) on rxe0 as the
//! reference peers (polling), then `msgr ping` (2 B, 64 B) and `msgr stream` (64 KiB
//! messages) over `verbs://127.0.0.1:PORT?dev=rxe0`, and the same msgr runs
//! over TCP for context; beside them, the same ping-pong over the backend's
//! `Transport` alone (`transport_ping`: wire format and backend, no session
//! engine, worker or dispatcher), which says which layer a gap is in. Prints
//! a table of msgr / reference ratios. One-sided RMA too: `ib_read_bw` and
//! `ib_write_bw` at 1 MiB on rxe0 beside `msgr bench --only rma` over the
//! verbs backend (msgr's 1 MiB reads and writes of an exposed region).
//!
//!     cargo test --release -p msgr-testsuite --features rdma --test guest_bench -- --nocapture
//!
//! The ratios are reported, not asserted: TCG timings swing with host load,
//! and performance claims come from benchmark runs, not from timed tests
//! (docs/BENCHMARKS.md). The test fails when any msgr run fails or its output does
//! not parse, or when a polling reference gave no figure in any round (one
//! that failed in some rounds is reported; the others give its figure).
#![cfg(feature = "rdma")]

use msgr_testsuite::guest::reference::{
    cm_send_lat, cm_write_bw, loopback_bw, loopback_send_lat, parse_send_lat, parse_write_bw,
    Bandwidth, BwTool, CmFabric, CqWait, Latency, LOOPBACK_DEVICE,
};
use msgr_testsuite::guest::tool::{
    bench_rma, parse_bench_rma, parse_ping, parse_stream, parse_transport_ping, serve_and_run,
    transport_ping_runs, ClientRun, PingFigures, RmaFigures, StreamFigures,
};
use msgr_testsuite::guest::{
    build_programs, FiguresError, GuestCommand, GuestOutcome, GuestRunner,
};
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
/// Small messages streamed, in batch frames: their rate and the work
/// requests and completion-queue polls they took per message.
const SMALL_SIZE: u32 = 64;
/// Seconds the small-message stream sends.
const SMALL_STREAM_SECS: u32 = 1;
/// One-sided operation size: `ib_read_bw`/`ib_write_bw` and
/// `msgr bench --only rma` (whose RMA part is 1 MiB).
const RMA_SIZE: u32 = 1 << 20;
/// perftest's 1 MiB reads and writes: 100 MiB each, a second or two under
/// TCG (the RMA additions stay within ~30 s over the three rounds).
const RMA_ITERS: u32 = 100;
/// Rounds in the boot by default: TCG timings swing between runs, so each
/// figure is taken this many times, alternating msgr and its references.
/// `MSGR_GUEST_BENCH_ROUNDS` overrides it (the test command uses 2 to stay
/// within its time; a median of 3 or more is steadier for a report).
const ROUNDS: u16 = 3;

fn rounds() -> u16 {
    match std::env::var("MSGR_GUEST_BENCH_ROUNDS") {
        Ok(v) => v.parse().ok().filter(|&n| n >= 1).unwrap_or_else(|| {
            panic!("MSGR_GUEST_BENCH_ROUNDS={v:?}: expected a count of 1 or more")
        }),
        Err(_) => ROUNDS,
    }
}
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

/// backends/examples/transport_ping.rs, built like [`msgr_tool`].
fn transport_ping() -> PathBuf {
    let path = build_programs(&[
        "-p",
        "msgr-backends",
        "--features",
        "verbs,rdmacm",
        "--example",
        "transport_ping",
    ])
    .join("examples/transport_ping");
    assert!(path.exists(), "{} missing", path.display());
    path
}

fn send_lat_name(round: u16, size: u32, wait: CqWait) -> String {
    match wait {
        CqWait::Poll => format!("r{round}-ref-ib_send_lat-{size}"),
        CqWait::Events => format!("r{round}-ref-ib_send_lat-{size}-events"),
    }
}

fn write_bw_name(round: u16) -> String {
    format!("r{round}-ref-ib_write_bw-{BW_SIZE}")
}

/// `ib_read_bw` or `ib_write_bw` at [`RMA_SIZE`].
fn rma_bw_name(round: u16, tool: BwTool) -> String {
    format!("r{round}-ref-{}-{RMA_SIZE}", tool.program())
}

fn siw_lat_name(round: u16, size: u32) -> String {
    format!("r{round}-ref-ib_send_lat-R-siw0-{size}")
}

fn siw_bw_name(round: u16) -> String {
    format!("r{round}-ref-ib_write_bw-R-siw0-{BW_SIZE}")
}

fn msgr_name(round: u16, transport: &str) -> String {
    format!("r{round}-msgr-{transport}")
}

/// The transports msgr runs over, in table order: (label, address with
/// `{port}` and `{siw}` to fill in, port in round 0, global tool options).
/// The `-nocrc` runs set `payload_crc=false` on both sides (perftest checks
/// no data; RoCE's ICRC and siw's transport do), the `-sys1` runs make the
/// busy-poll loop's system calls on every pass (`busy_poll_syscall_every=1`;
/// the default adapts, see the messenger's `worker::spin`), the others run
/// defaults.
const MSGR_RUNS: [(&str, &str, u16, &[&str]); 7] = [
    ("verbs", "verbs://127.0.0.1:{port}?dev=rxe0", 18830, &[]),
    (
        "verbs-sys1",
        "verbs://127.0.0.1:{port}?dev=rxe0",
        18835,
        SYSCALL_EVERY_PASS,
    ),
    (
        "verbs-nocrc",
        "verbs://127.0.0.1:{port}?dev=rxe0",
        18833,
        NO_CRC,
    ),
    ("tcp", "tcp://127.0.0.1:{port}", 18831, &[]),
    ("rdmacm", "rdmacm://{siw}:{port}", 18832, &[]),
    ("rdmacm-nocrc", "rdmacm://{siw}:{port}", 18834, NO_CRC),
    (
        "rdmacm-sys1",
        "rdmacm://{siw}:{port}",
        18836,
        SYSCALL_EVERY_PASS,
    ),
];
const NO_CRC: &[&str] = &["--set", "payload_crc=false"];
/// The ping-pongs over a backend's `Transport` alone: (label, address with
/// `{port}` and `{siw}` to fill in, first port in round 0; one port per
/// [`LAT_SIZES`] entry).
const TRANSPORT_RUNS: [(&str, &str, u16); 2] = [
    (
        "verbs-transport",
        "verbs://127.0.0.1:{port}?dev=rxe0",
        18840,
    ),
    ("rdmacm-transport", "rdmacm://{siw}:{port}", 18850),
];
/// `epoll_wait` and `sched_yield` on every busy-poll pass (the default
/// before the adaptive one).
const SYSCALL_EVERY_PASS: &[&str] = &["--set", "busy_poll_syscall_every=1"];

fn commands(tool: &std::path::Path, tping: &std::path::Path) -> Vec<GuestCommand> {
    let mut cmds = vec![GuestCommand::shell(
        "rxe0-gids",
        // Context for the report: the GIDs perftest and msgr pick from.
        format!("ibv_devinfo -v -d {LOOPBACK_DEVICE} | grep -E 'GID|state|active_mtu'"),
    )];
    for round in 0..rounds() {
        cmds.extend(round_commands(tool, tping, round));
    }
    cmds
}

/// One round: every reference peer, then msgr over each transport. Ports
/// move by 1000 a round so no round waits for the last one's sockets.
fn round_commands(
    tool: &std::path::Path,
    tping: &std::path::Path,
    round: u16,
) -> Vec<GuestCommand> {
    let shift = 1000 * round;
    let mut cmds = Vec::new();
    // Each perftest pair takes base_port, +100, +200 (retries).
    let mut port = 18810 + shift;
    for size in LAT_SIZES {
        cmds.push(loopback_send_lat(
            send_lat_name(round, size, CqWait::Poll),
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
            send_lat_name(round, 64, CqWait::Events),
            64,
            LAT_ITERS,
            CqWait::Events,
            port,
        )
        .timeout(Duration::from_secs(60)),
    );
    cmds.push(loopback_bw(
        write_bw_name(round),
        BwTool::Write,
        BW_SIZE,
        BW_ITERS,
        port + 1,
    ));
    // One-sided: perftest's 1 MiB reads and writes, then msgr's over the
    // verbs backend (`msgr bench`: server and client in one process).
    for (tool, port) in [(BwTool::Read, port + 2), (BwTool::Write, port + 3)] {
        cmds.push(loopback_bw(
            rma_bw_name(round, tool),
            tool,
            RMA_SIZE,
            RMA_ITERS,
            port,
        ));
    }
    cmds.push(bench_rma(
        msgr_name(round, "verbs-rma"),
        tool,
        &format!("verbs?dev={LOOPBACK_DEVICE}"),
        &[],
    ));
    // soft-iWARP through rdma_cm: perftest's rdma_cm mode against msgr's
    // rdmacm backend (siw enforces RLIMIT_MEMLOCK even for root: raised, as
    // a deployment would).
    let siw = CmFabric::Siw;
    for (i, size) in LAT_SIZES.into_iter().enumerate() {
        cmds.push(cm_send_lat(
            siw_lat_name(round, size),
            siw,
            size,
            LAT_ITERS,
            19110 + shift + i as u16,
        ));
    }
    cmds.push(cm_write_bw(
        siw_bw_name(round),
        siw,
        BW_SIZE,
        BW_ITERS,
        19120 + shift,
    ));
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
    runs.push(ClientRun::Stream {
        size: SMALL_SIZE,
        secs: SMALL_STREAM_SECS,
    });
    for (transport, addr, port, global) in MSGR_RUNS {
        let addr = addr
            .replace("{port}", &(port + shift).to_string())
            .replace("{siw}", siw.addr());
        let mut cmd = serve_and_run(msgr_name(round, transport), tool, &addr, global, &runs);
        if transport.starts_with("rdmacm") {
            cmd.script = format!("ulimit -l unlimited\n{}", cmd.script);
        }
        cmds.push(cmd);
    }
    for (label, addr, port) in TRANSPORT_RUNS {
        let addr = addr.replace("{siw}", siw.addr());
        let mut cmd = transport_ping_runs(
            msgr_name(round, label),
            tping,
            &addr,
            port + shift,
            &LAT_SIZES,
            LAT_ITERS,
            LAT_WARMUP,
        );
        if label.starts_with("rdmacm") {
            cmd.script = format!("ulimit -l unlimited\n{}", cmd.script);
        }
        cmds.push(cmd);
    }
    cmds
}

/// Every figure of one round; `errors` lists what failed or did not parse.
struct Figures {
    send_lat: Vec<(u32, CqWait, Result<Latency, String>)>,
    write_bw: Result<Bandwidth, String>,
    /// perftest over rdma_cm on siw0, one per [`LAT_SIZES`] entry.
    siw_lat: Vec<Result<Latency, String>>,
    siw_bw: Result<Bandwidth, String>,
    /// `ib_read_bw` and `ib_write_bw` at [`RMA_SIZE`].
    read_bw_rma: Result<Bandwidth, String>,
    write_bw_rma: Result<Bandwidth, String>,
    /// `msgr bench --only rma` over verbs.
    rma: Result<RmaFigures, String>,
    /// One per [`MSGR_RUNS`] entry.
    msgr: Vec<MsgrFigures>,
    /// One per [`TRANSPORT_RUNS`] entry: its label and one ping per
    /// [`LAT_SIZES`] entry.
    alone: Vec<(&'static str, Vec<Result<PingFigures, String>>)>,
}

/// msgr's figures over one transport.
struct MsgrFigures {
    transport: &'static str,
    /// One per [`LAT_SIZES`] entry.
    pings: Vec<Result<PingFigures, String>>,
    stream: Result<StreamFigures, String>,
    /// The [`SMALL_SIZE`] stream.
    small: Result<StreamFigures, String>,
}

/// A parser's error as the text these figures keep.
fn text(e: FiguresError) -> String {
    e.to_string()
}

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

fn parse(out: &GuestOutcome, round: u16) -> Figures {
    let mut send_lat = Vec::new();
    for (size, wait) in LAT_SIZES
        .iter()
        .map(|&s| (s, CqWait::Poll))
        .chain([(64, CqWait::Events)])
    {
        let l = output(out, &send_lat_name(round, size, wait))
            .and_then(|o| parse_send_lat(o).map_err(text));
        send_lat.push((size, wait, l));
    }
    let write_bw = output(out, &write_bw_name(round)).and_then(|o| parse_write_bw(o).map_err(text));
    let siw_lat = LAT_SIZES
        .iter()
        .map(|&s| {
            output(out, &siw_lat_name(round, s)).and_then(|o| parse_send_lat(o).map_err(text))
        })
        .collect();
    let siw_bw = output(out, &siw_bw_name(round)).and_then(|o| parse_write_bw(o).map_err(text));
    let read_bw_rma = output(out, &rma_bw_name(round, BwTool::Read))
        .and_then(|o| parse_write_bw(o).map_err(text));
    let write_bw_rma = output(out, &rma_bw_name(round, BwTool::Write))
        .and_then(|o| parse_write_bw(o).map_err(text));
    let rma =
        output(out, &msgr_name(round, "verbs-rma")).and_then(|o| parse_bench_rma(o).map_err(text));
    let msgr = MSGR_RUNS
        .iter()
        .map(|&(transport, _, _, _)| {
            let o = output(out, &msgr_name(round, transport));
            let pings = LAT_SIZES
                .iter()
                .map(|&s| o.clone().and_then(|o| parse_ping(o, s).map_err(text)))
                .collect();
            let stream = o
                .clone()
                .and_then(|o| parse_stream(o, BW_SIZE).map_err(text));
            let small = o.and_then(|o| parse_stream(o, SMALL_SIZE).map_err(text));
            MsgrFigures {
                transport,
                pings,
                stream,
                small,
            }
        })
        .collect();
    let alone = TRANSPORT_RUNS
        .iter()
        .map(|&(label, _, _)| {
            let o = output(out, &msgr_name(round, label));
            let pings = LAT_SIZES
                .iter()
                .map(|&s| {
                    o.clone()
                        .and_then(|o| parse_transport_ping(o, s).map_err(text))
                })
                .collect();
            (label, pings)
        })
        .collect();
    Figures {
        send_lat,
        write_bw,
        siw_lat,
        siw_bw,
        read_bw_rma,
        write_bw_rma,
        rma,
        msgr,
        alone,
    }
}

/// A latency statistic: its name, perftest's column, how to read it from
/// perftest's figures and from msgr's.
type LatencyStat = (
    &'static str,
    &'static str,
    fn(&Latency) -> f64,
    fn(&PingFigures) -> f64,
);

/// One line of the table: a reference figure and msgr's over some of the
/// transports, from one round.
struct Row {
    measure: String,
    reference: String,
    unit: &'static str,
    reference_value: Option<f64>,
    /// (transport, figure), in [`MSGR_RUNS`] order.
    msgr: Vec<(&'static str, Option<f64>)>,
    target: String,
}

impl Figures {
    /// What failed among msgr's runs.
    fn msgr_errors(&self) -> Vec<String> {
        let mut e = Vec::new();
        for m in &self.msgr {
            let t = m.transport;
            for p in &m.pings {
                e.extend(p.as_ref().err().map(|x| format!("{t}: {x}")));
            }
            e.extend(m.stream.as_ref().err().map(|x| format!("{t}: {x}")));
            e.extend(m.small.as_ref().err().map(|x| format!("{t}: {x}")));
        }
        for (t, pings) in &self.alone {
            for p in pings {
                e.extend(p.as_ref().err().map(|x| format!("{t}: {x}")));
            }
        }
        e.extend(self.rma.as_ref().err().map(|x| format!("verbs-rma: {x}")));
        e
    }

    /// Every polling reference of the round, in a fixed order: its name
    /// without the round, and why it failed if it did.
    fn reference_outcomes(&self) -> Vec<(String, Option<String>)> {
        let mut r = Vec::new();
        for (size, wait, l) in &self.send_lat {
            if *wait == CqWait::Poll {
                r.push((
                    format!("rxe0 ib_send_lat {size} B"),
                    l.as_ref().err().cloned(),
                ));
            }
        }
        r.push((
            "rxe0 ib_write_bw".into(),
            self.write_bw.as_ref().err().cloned(),
        ));
        for (size, l) in LAT_SIZES.iter().zip(&self.siw_lat) {
            r.push((
                format!("siw0 ib_send_lat -R {size} B"),
                l.as_ref().err().cloned(),
            ));
        }
        r.push((
            "siw0 ib_write_bw -R".into(),
            self.siw_bw.as_ref().err().cloned(),
        ));
        for (tool, b) in [
            ("ib_read_bw", &self.read_bw_rma),
            ("ib_write_bw", &self.write_bw_rma),
        ] {
            r.push((
                format!("rxe0 {tool} {} MiB", RMA_SIZE >> 20),
                b.as_ref().err().cloned(),
            ));
        }
        r
    }

    fn ping(&self, transport: &str, size: u32) -> Option<&PingFigures> {
        let i = LAT_SIZES.iter().position(|&x| x == size)?;
        let pings = match self.msgr.iter().find(|m| m.transport == transport) {
            Some(m) => &m.pings,
            None => &self.alone.iter().find(|(t, _)| *t == transport)?.1,
        };
        pings[i].as_ref().ok()
    }

    fn stream(&self, transport: &str) -> Option<f64> {
        let m = self.msgr.iter().find(|m| m.transport == transport)?;
        m.stream.as_ref().ok().map(|s| s.mib_per_s)
    }

    /// The rows of this round: rxe0 (msgr over verbs and, for context, TCP)
    /// against perftest, then siw0 (msgr over rdmacm) against perftest -R.
    fn rows(&self) -> Vec<Row> {
        let stats: [LatencyStat; 2] = [
            (
                "one-way p50",
                "t_typical",
                |l| l.t_typical_us,
                |p| p.one_way_p50_us,
            ),
            (
                "one-way mean",
                "t_avg",
                |l| l.t_avg_us,
                |p| p.one_way_mean_us,
            ),
        ];
        let lat_target = format!("<= {LATENCY_TARGET}x");
        let bw_target = format!(">= {BANDWIDTH_TARGET}x");
        let mut rows = Vec::new();
        for (size, wait, l) in &self.send_lat {
            for (what, col, reference, pick) in stats {
                let (reference_name, target) = match wait {
                    CqWait::Poll => (format!("rxe0 ib_send_lat {col}"), lat_target.clone()),
                    CqWait::Events => (format!("rxe0 ib_send_lat -e {col}"), "context".into()),
                };
                rows.push(Row {
                    measure: format!("{size} B {what}"),
                    reference: reference_name,
                    unit: "us",
                    reference_value: l.as_ref().ok().map(reference),
                    msgr: [
                        "verbs",
                        "verbs-nocrc",
                        "verbs-sys1",
                        "verbs-transport",
                        "tcp",
                    ]
                    .into_iter()
                    .map(|t| (t, self.ping(t, *size).map(pick)))
                    .collect(),
                    target,
                });
            }
        }
        rows.push(Row {
            measure: format!("{} KiB bandwidth", BW_SIZE >> 10),
            reference: "rxe0 ib_write_bw BW average".into(),
            unit: "MiB/s",
            reference_value: self.write_bw.as_ref().ok().map(|b| b.bw_avg_mb_s),
            msgr: ["verbs", "verbs-nocrc", "verbs-sys1", "tcp"]
                .into_iter()
                .map(|t| (t, self.stream(t)))
                .collect(),
            target: bw_target.clone(),
        });
        let rma = self.rma.as_ref().ok();
        for (what, tool, reference, figure) in [
            (
                "read",
                "ib_read_bw",
                &self.read_bw_rma,
                rma.map(|r| r.read_mib_per_s),
            ),
            (
                "write",
                "ib_write_bw",
                &self.write_bw_rma,
                rma.map(|r| r.write_mib_per_s),
            ),
        ] {
            rows.push(Row {
                measure: format!("{} MiB RMA {what}", RMA_SIZE >> 20),
                reference: format!("rxe0 {tool} BW average"),
                unit: "MiB/s",
                reference_value: reference.as_ref().ok().map(|b| b.bw_avg_mb_s),
                msgr: vec![("verbs", figure)],
                target: bw_target.clone(),
            });
        }
        for (i, size) in LAT_SIZES.iter().enumerate() {
            for (what, col, reference, pick) in stats {
                rows.push(Row {
                    measure: format!("{size} B {what}"),
                    reference: format!("siw0 ib_send_lat -R {col}"),
                    unit: "us",
                    reference_value: self.siw_lat[i].as_ref().ok().map(reference),
                    msgr: ["rdmacm", "rdmacm-nocrc", "rdmacm-sys1", "rdmacm-transport"]
                        .into_iter()
                        .map(|t| (t, self.ping(t, *size).map(pick)))
                        .collect(),
                    target: lat_target.clone(),
                });
            }
        }
        rows.push(Row {
            measure: format!("{} KiB bandwidth", BW_SIZE >> 10),
            reference: "siw0 ib_write_bw -R BW average".into(),
            unit: "MiB/s",
            reference_value: self.siw_bw.as_ref().ok().map(|b| b.bw_avg_mb_s),
            msgr: ["rdmacm", "rdmacm-nocrc", "rdmacm-sys1"]
                .into_iter()
                .map(|t| (t, self.stream(t)))
                .collect(),
            target: bw_target,
        });
        rows
    }
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// The table over all rounds: per row the median reference and msgr
/// figures, and the median of the per-round ratios with their spread (each
/// ratio pairs msgr with the reference of the same round).
fn table(rounds: &[Figures]) -> String {
    let per_round: Vec<Vec<Row>> = rounds.iter().map(Figures::rows).collect();
    let mut s = String::new();
    let _ = writeln!(
        s,
        "msgr vs perftest, one TCG guest boot, {} rounds (compare ratios only); msgr default \
         config (1 worker, busy-poll 200 µs), lossless; ratio = median of per-round \
         msgr/reference [min-max]; -nocrc: payload_crc=false on both sides; -sys1: \
         busy_poll_syscall_every=1 (epoll_wait and sched_yield on every busy-poll pass; the \
         default adapts); -transport: the backend's Transport alone (transport_ping: no \
         session engine, worker or dispatcher); RMA: msgr bench --only rma --quick (1 MiB \
         reads and writes of an exposed region, 8 in flight)",
        rounds.len()
    );
    let _ = writeln!(
        s,
        "{:<18} {:<32} {:>14} {:<14} {:>14} {:>22} {:>8}",
        "measure", "reference", "reference", "msgr", "msgr", "ratio [spread]", "target"
    );
    let Some(first) = per_round.first() else {
        return s;
    };
    for (i, row) in first.iter().enumerate() {
        let reference = median(
            per_round
                .iter()
                .filter_map(|r| r[i].reference_value)
                .collect(),
        );
        for (j, (transport, _)) in row.msgr.iter().enumerate() {
            let values: Vec<f64> = per_round.iter().filter_map(|r| r[i].msgr[j].1).collect();
            let mut ratios: Vec<f64> = per_round
                .iter()
                .filter_map(|r| match (r[i].msgr[j].1, r[i].reference_value) {
                    (Some(m), Some(x)) if x > 0.0 => Some(m / x),
                    _ => None,
                })
                .collect();
            ratios.sort_by(f64::total_cmp);
            let ratio = match (median(ratios.clone()), ratios.first(), ratios.last()) {
                (Some(m), Some(lo), Some(hi)) => format!("{m:.2}x [{lo:.2}-{hi:.2}]"),
                _ => "-".into(),
            };
            let fmt = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.2} {}", row.unit));
            let _ = writeln!(
                s,
                "{:<18} {:<32} {:>14} {:<14} {:>14} {:>22} {:>8}",
                row.measure,
                row.reference,
                fmt(reference),
                transport,
                fmt(median(values)),
                ratio,
                row.target
            );
        }
    }
    s
}

/// The [`SMALL_SIZE`] streams: rate, and per message the sender's send
/// work requests and completion-queue polls (DESIGN §7: at most one WR and
/// one poll per batch, so far below one per message), medians over rounds.
fn small_message_table(rounds: &[Figures]) -> String {
    let mut s = format!(
        "\n{SMALL_SIZE} B stream ({SMALL_STREAM_SECS} s, batch frames), median of rounds:\n\
         {:<14} {:>12} {:>16} {:>16}\n",
        "transport", "msg/s", "send WRs / msg", "CQ polls / msg"
    );
    for (transport, ..) in MSGR_RUNS {
        let figures: Vec<&StreamFigures> = rounds
            .iter()
            .filter_map(|r| r.msgr.iter().find(|m| m.transport == transport))
            .filter_map(|m| m.small.as_ref().ok())
            .collect();
        let med = |f: fn(&StreamFigures) -> Option<f64>| {
            let v: Vec<f64> = figures.iter().filter_map(|x| f(x)).collect();
            median(v).map_or("-".to_string(), |m| format!("{m:.4}"))
        };
        let _ = writeln!(
            s,
            "{transport:<14} {:>12} {:>16} {:>16}",
            med(|f| Some(f.msgs_per_s.round())),
            med(|f| f.send_wrs_per_message),
            med(|f| f.cq_polls_per_message)
        );
    }
    s
}

/// One boot, [`ROUNDS`] rounds (or `MSGR_GUEST_BENCH_ROUNDS`) of reference peers and msgr over verbs, TCP
/// and rdmacm; a table of median ratios. Fails if any msgr run fails or its
/// output does not parse, or if a polling reference gave no figure in any
/// round.
#[test]
fn msgr_tool_against_perftest_in_the_guest() {
    let tool = msgr_tool();
    let tping = transport_ping();
    let runner = GuestRunner::from_env()
        .unwrap_or_else(|e| panic!("the RDMA test guest is unavailable: {e}"));
    let out = runner
        .run(&commands(&tool, &tping), Duration::from_secs(1200))
        .expect("guest run");
    println!("{out}");
    let rounds: Vec<Figures> = (0..rounds()).map(|r| parse(&out, r)).collect();
    println!("{}", table(&rounds));
    println!("{}", small_message_table(&rounds));
    let errors: Vec<String> = rounds.iter().flat_map(Figures::msgr_errors).collect();
    assert!(
        errors.is_empty(),
        "msgr runs failed or did not parse:\n  {}\n{out}",
        errors.join("\n  ")
    );
    let outcomes: Vec<_> = rounds.iter().map(Figures::reference_outcomes).collect();
    let (lost, partly) = judge_references(&outcomes);
    for w in &partly {
        eprintln!("WARNING: reference {w}");
    }
    assert!(
        lost.is_empty(),
        "reference peers failed in every round:\n  {}\n{out}",
        lost.join("\n  ")
    );
    // Every other command (the set-up report, msgr's runs) must succeed;
    // the references were judged above.
    for c in out.commands.iter().filter(|c| !c.name.contains("-ref-")) {
        assert!(c.success(), "{} failed:\n{out}", c.name);
    }
}

/// A reference peer's trouble is not msgr's: given each round's
/// [`Figures::reference_outcomes`], the references that failed in every
/// round (their rows would compare with nothing: the test fails) and, as
/// warnings, those that failed in some rounds (their rows use the others).
fn judge_references(rounds: &[Vec<(String, Option<String>)>]) -> (Vec<String>, Vec<String>) {
    let (mut lost, mut partly) = (Vec::new(), Vec::new());
    let Some(first) = rounds.first() else {
        return (lost, partly);
    };
    for (i, (name, _)) in first.iter().enumerate() {
        let failed: Vec<String> = rounds
            .iter()
            .enumerate()
            .filter_map(|(r, o)| o[i].1.as_ref().map(|e| format!("round {r}: {e}")))
            .collect();
        if failed.len() == rounds.len() {
            lost.push(format!("{name}: {}", failed.join("; ")));
        } else if !failed.is_empty() {
            partly.push(format!(
                "{name} failed in {} of {} rounds (its rows use the others): {}",
                failed.len(),
                rounds.len(),
                failed.join("; ")
            ));
        }
    }
    (lost, partly)
}

#[test]
fn a_reference_fails_the_test_only_when_every_round_lost_it() {
    let round = |a: Option<&str>, b: Option<&str>| {
        vec![
            ("ref a".to_string(), a.map(String::from)),
            ("ref b".to_string(), b.map(String::from)),
        ]
    };
    let rounds = [
        round(None, Some("exit 124 (timed out)")),
        round(Some("no result row"), Some("exit 1")),
        round(None, Some("exit 1")),
    ];
    let (lost, partly) = judge_references(&rounds);
    assert_eq!(lost.len(), 1, "{lost:?}");
    assert!(lost[0].starts_with("ref b: round 0: exit 124"), "{lost:?}");
    assert_eq!(partly.len(), 1, "{partly:?}");
    assert!(
        partly[0].starts_with("ref a failed in 1 of 3 rounds"),
        "{partly:?}"
    );
    let (lost, partly) = judge_references(&[round(None, None), round(None, None)]);
    assert!(lost.is_empty() && partly.is_empty());
}

#[test]
fn commands_are_valid_sh_and_stay_on_loopback() {
    let cmds = commands(
        std::path::Path::new("/nonexistent/msgr"),
        std::path::Path::new("/nonexistent/transport_ping"),
    );
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
