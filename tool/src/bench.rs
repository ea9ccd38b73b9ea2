//! `msgr bench`: server and client in one process on loopback, each msgr
//! figure next to a plain `std::net` reference measured in the same run.
//!
//! # Layers
//!
//! 1. `load`, `server_cpu`: a bulk load beside the measured traffic; the server's own CPU.
//! 2. `hol`: a small call behind bulk on one connection.
//! 3. `mixed`: many clients mixing calls, heartbeats and bulk.

use std::sync::Arc;
use std::time::{Duration, Instant};

use msgr::{EntityName, Messenger, MessengerConfig};
use serde::Serialize;

use crate::error::{parse_addr, ToolError};
use crate::machine::{MachineState, Watch, QUIET_OTHER_CORES};
use crate::net::{self, Driver, Limit, PingOpts, Reply, Responder, StreamOpts};
use crate::output::outln;
use crate::progress::Progress;
use crate::reference;
use crate::stats::{PingResult, StreamResult};

mod hol;
mod load;
mod mixed;
mod server_cpu;

use server_cpu::{ServerCounts, ServerCpu, ServerThreads};

/// Target: msgr 64 B one-way p50 ≤ this × std's.
pub const LATENCY_TARGET: f64 = 1.15;
/// Target: msgr 1 MiB bandwidth ≥ this × std's.
pub const BANDWIDTH_TARGET: f64 = 0.90;
/// Target: msgr 64 B message rate ≥ this × the raw framed stream's.
pub const RATE_TARGET: f64 = 0.50;

/// Which comparisons to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Part {
    /// 64 B ping-pong vs blocking std::net ping-pong.
    Latency,
    /// 1 MiB streaming vs std::net 1 MiB writes.
    Bandwidth,
    /// 64 B one-way message rate vs a raw length-prefixed std::net stream.
    Rate,
    /// The secure mode (every frame sealed) against the crc mode, in the
    /// same run: 1 MiB streaming and the 64 B message rate.
    Secure,
    /// 64 B blocking calls (`Connection::call` from an application thread,
    /// round trip p50) against msgr's worker-driven ping-pong in the same
    /// run: what waiting for a reply in a thread costs.
    Call,
    /// One-sided RMA: 1 MiB reads and writes of a region the server
    /// exposed, [`RMA_IN_FLIGHT`] at a time, against msgr's 1 MiB message
    /// stream in the same run; over libfabric's `shm` and `tcp` also each
    /// of [`RMA_SIZES`] against a raw `fi_read`/`fi_write` loop.
    Rma,
    /// The aggregate 64 B one-way rate of each of `--connections` client
    /// connections into the one server, against one connection's in the
    /// same round, each beside the server's own CPU per message against
    /// one connection's.
    Conns,
    /// Head-of-line blocking: 64 B calls at the highest priority, then at
    /// the default, on a connection streaming 1 MiB and 64 MiB messages,
    /// against the same calls on it idle.
    Hol,
    /// A mixed workload: several clients each doing calls, heartbeats and
    /// bulk messages at once; each class's p50/p99 against an idle
    /// connection's and the bulk's throughput against the bulk alone.
    Mixed,
}

/// Target: the aggregate 64 B rate of many connections into one server
/// ≥ this × one connection's (at 256 connections).
pub const CONNS_TARGET: f64 = 0.70;
/// The connection counts `--only conns` measures unless told.
pub const CONNECTIONS: [usize; 4] = [1, 16, 256, 1000];
/// Target: the server's CPU per message with many connections ≤ this ×
/// with one (at 256 and 1,000).
pub const CONNS_CPU_TARGET: f64 = 1.5;
/// Open files a connection of the `conns` part may take, both ends
/// together (a client messenger's poller, wake-ups and socket, the
/// server's socket: about 5 were seen at 1,000 over tcp, 2026-12-07, and
/// one to spare): the soft limit is raised to cover them.
const FDS_PER_CONNECTION: u64 = 6;

/// Target: a blocking call's round trip ≤ this × the worker ping-pong's.
pub const CALL_TARGET: f64 = 1.5;

/// 64 B blocking calls from this thread to `target`, on a client messenger
/// of `cfg`: their round trips.
fn call_round_trips(
    cfg: &MessengerConfig,
    target: &msgr::EntityAddr,
    (warmup, count): (u64, u64),
    timeout: Duration,
) -> Result<PingResult, ToolError> {
    let mut client = Messenger::builder(EntityName::client(8))
        .config(cfg.clone())
        .start(Arc::new(msgr::NullDispatcher))?;
    let conn = client.connect(target)?;
    let ping = msgr::Message::new(net::PING, bytes::Bytes::new(), vec![0xa5u8; 64]);
    let mut rtt_ns = Vec::with_capacity(count as usize);
    let started = Instant::now();
    let mut timed_from = started;
    for i in 0..warmup + count {
        if i == warmup {
            timed_from = Instant::now();
        }
        let t0 = Instant::now();
        conn.call(ping.clone(), timeout)
            .map_err(|e| ToolError::BadReply {
                peer: target.to_string(),
                what: format!("call: {e}"),
            })?;
        if i >= warmup {
            rtt_ns.push(t0.elapsed().as_nanos() as u64);
        }
    }
    let elapsed = timed_from.elapsed().as_secs_f64();
    client.shutdown(Duration::from_secs(2));
    Ok(PingResult::new(64, warmup, rtt_ns, elapsed))
}

/// RMA operations the bench keeps in flight (one blocking caller each).
pub const RMA_IN_FLIGHT: usize = 8;
/// Target: 1 MiB RMA reads (and writes) ≥ this × the 1 MiB message
/// stream's bandwidth, where the owner's messenger serves them.
pub const RMA_TARGET: f64 = 0.80;
/// Operation sizes msgr's RMA is measured at against the raw libfabric
/// loop (where there is one: [`reference::RawRma`]).
pub const RMA_SIZES: [usize; 4] = [4 << 10, 64 << 10, 1 << 20, 4 << 20];
/// Target: msgr's RMA ≥ this × the raw `fi_read`/`fi_write` loop with as
/// many operations in flight. The issue names none; this is the bar of a
/// one-sided path that adds little to the provider's own.
pub const RMA_RAW_TARGET: f64 = 0.80;

/// `4 KiB`, `1 MiB`: a power-of-two size as the tables name it.
fn size_name(size: usize) -> String {
    match size {
        s if s >= 1 << 30 && s % (1 << 30) == 0 => format!("{} GiB", s >> 30),
        s if s >= 1 << 20 && s % (1 << 20) == 0 => format!("{} MiB", s >> 20),
        s if s >= 1 << 10 && s % (1 << 10) == 0 => format!("{} KiB", s >> 10),
        s => format!("{s} B"),
    }
}

/// The address a bench server binds: `transport` on 127.0.0.1 with a port
/// the kernel picks, its options (`?ep=rdm`) after the address.
///
/// `fabric+shm?ep=rdm` becomes `fabric+shm://127.0.0.1:0?ep=rdm`.
pub fn loopback_addr(transport: &str) -> String {
    match transport.split_once('?') {
        Some((scheme, query)) => format!("{scheme}://127.0.0.1:0?{query}"),
        None => format!("{transport}://127.0.0.1:0"),
    }
}

/// Options of a bench run.
#[derive(Clone, Debug)]
pub struct BenchOpts {
    /// Transport scheme, e.g. `tcp`, with the address's options after `?`
    /// (`fabric+shm?ep=rdm`); see [`loopback_addr`].
    pub transport: String,
    /// Short run for tests.
    pub quick: bool,
    /// Rounds (each part runs msgr then its reference once per round).
    pub rounds: u32,
    /// Parts to run.
    pub parts: Vec<Part>,
    /// Who sends msgr's streams.
    pub driver: Driver,
    /// Whether to pin the two messengers' workers ([`Placement`]).
    pub pin: bool,
    /// Connection counts of the `conns` part (1, the reference, is
    /// measured whether listed or not).
    pub connections: Vec<usize>,
    /// Messages a credit for every connection of the `conns` part; `None`:
    /// one connection's window shared among them ([`net::stream_many`]).
    pub conns_window: Option<u64>,
    /// JSON output.
    pub json: bool,
}

/// One comparison: per-round figures, medians and the ratio against the target.
#[derive(Debug, Serialize)]
pub struct Comparison<T: Serialize> {
    /// What is compared.
    pub metric: String,
    /// Unit of `msgr` and `reference`.
    pub unit: &'static str,
    /// Median over rounds of msgr's figure.
    pub msgr: f64,
    /// Median over rounds of the reference's figure.
    pub reference: f64,
    /// Which reference.
    pub reference_name: String,
    /// msgr / reference (of the medians).
    pub ratio: f64,
    /// Smallest and largest per-round ratio.
    pub ratio_spread: [f64; 2],
    /// "max" (ratio must be ≤ target), "min" (≥ target) or "none" (a
    /// figure for the record: no target).
    pub target_kind: &'static str,
    /// The target ratio (NaN, null in JSON, where there is none).
    pub target: f64,
    /// Whether the median ratio meets the target (null where there is
    /// none).
    pub met: Option<bool>,
    /// Every round's msgr and reference results.
    pub rounds: Vec<Round<T>>,
}

/// One round of a comparison.
#[derive(Debug, Serialize)]
pub struct Round<T: Serialize> {
    /// msgr's result.
    pub msgr: T,
    /// The reference's result.
    pub reference: T,
}

/// The whole bench result (`--json` prints it).
#[derive(Debug, Serialize)]
pub struct BenchReport {
    /// Transport under test.
    pub transport: String,
    /// `--quick` run.
    pub quick: bool,
    /// Rounds.
    pub rounds: u32,
    /// Stream sender.
    pub driver: Driver,
    /// Worker threads per messenger.
    pub workers: usize,
    /// Busy-poll window, µs.
    pub busy_poll_us: u64,
    /// The CPUs the server's and the client's workers were pinned to, if
    /// msgr bench pinned them ([`Placement`]).
    pub pinned: Option<[usize; 2]>,
    /// Why they were or were not pinned.
    pub placement: String,
    /// How busy the machine was.
    pub machine: MachineState,
    /// Wall time, seconds.
    pub elapsed_s: f64,
    /// 64 B ping-pong.
    pub latency: Option<Comparison<PingResult>>,
    /// 64 B blocking calls against the worker ping-pong.
    pub call: Option<Comparison<PingResult>>,
    /// 1 MiB streaming.
    pub bandwidth: Option<Comparison<StreamResult>>,
    /// 64 B message rate.
    pub message_rate: Option<Comparison<StreamResult>>,
    /// 1 MiB streaming in secure mode against crc mode.
    pub secure_bandwidth: Option<Comparison<StreamResult>>,
    /// 64 B message rate in secure mode against crc mode.
    pub secure_rate: Option<Comparison<StreamResult>>,
    /// 1 MiB RMA reads against the 1 MiB message stream.
    pub rma_read: Option<Comparison<StreamResult>>,
    /// 1 MiB RMA writes against the 1 MiB message stream.
    pub rma_write: Option<Comparison<StreamResult>>,
    /// A [`RMA_HUGE`] read, then write ([`RMA_HUGE_QUICK`] in a quick
    /// run), against 1 MiB ones (8 in flight).
    pub rma_huge: Vec<Comparison<StreamResult>>,
    /// RMA reads, then writes, of each of [`RMA_SIZES`] against the raw
    /// libfabric loop (`fabric+shm`, `fabric+tcp`; empty elsewhere).
    pub rma_vs_raw: Vec<Comparison<StreamResult>>,
    /// The aggregate 64 B rate of each connection count above 1 against
    /// one connection's.
    pub conns: Vec<Comparison<StreamResult>>,
    /// The server's own CPU per message at each connection count above 1
    /// against one connection's (beside `conns`' rates).
    pub conns_server_cpu: Vec<Comparison<ServerCpu>>,
    /// Messages a credit of every `conns` connection, if set
    /// (`--conns-window`); else one connection's window was shared.
    pub conns_window: Option<u64>,
    /// Head-of-line blocking: per bulk size and call priority, the calls'
    /// p50 and p99 round trips against the idle connection's.
    pub hol: Vec<Comparison<PingResult>>,
    /// Per bulk size, the bulk's rate beside highest-priority calls against
    /// beside default-priority ones.
    pub hol_bulk: Vec<Comparison<StreamResult>>,
    /// The mixed workload: calls' and heartbeats' p50 and p99 against an
    /// idle connection's.
    pub mixed: Vec<Comparison<PingResult>>,
    /// The mixed workload's bulk throughput against the bulk alone.
    pub mixed_bulk: Option<Comparison<StreamResult>>,
}

/// A `size`-byte region `server` exposes, a client messenger of `cfg`
/// connected to `target`, and `size` bytes to write.
fn rma_setup(
    cfg: &MessengerConfig,
    (server, target): (&Messenger, &msgr::EntityAddr),
    size: usize,
) -> Result<(msgr::RmaRegion, Messenger, msgr::Connection, bytes::Bytes), ToolError> {
    let region = server.expose(vec![0x5a; size], msgr::Access::ReadWrite);
    let client = Messenger::builder(EntityName::client(9))
        .config(cfg.clone())
        .start(Arc::new(msgr::NullDispatcher))?;
    let conn = client.connect(target)?;
    Ok((region, client, conn, bytes::Bytes::from(vec![0xa5; size])))
}

/// `size`-byte RMA operations (`op`) on a region `server` exposes, from a
/// client messenger of `cfg` connected to `target`, [`RMA_IN_FLIGHT`] at a
/// time for `secs`: operations done, as a stream result.
fn rma_stream(
    cfg: &MessengerConfig,
    (server, target): (&Messenger, &msgr::EntityAddr),
    op: msgr::RmaOp,
    size: usize,
    secs: Duration,
) -> Result<StreamResult, ToolError> {
    let (region, mut client, conn, payload) = rma_setup(cfg, (server, target), size)?;
    let h = region.handle();
    let timeout = Duration::from_secs(60);
    // One operation before the clock: its reply brings the region's key
    // where the link moves it natively, so the figure is the steady path
    // (RDMA READ/WRITE, fi_read), not the callers racing the first reply.
    let warm = match op {
        msgr::RmaOp::Read => conn.read(&h, 0, size as u64, timeout).map(drop),
        msgr::RmaOp::Write => conn.write(&h, 0, payload.clone(), timeout),
    };
    let failed = |e: msgr::RmaError| ToolError::BadReply {
        peer: target.to_string(),
        what: format!("RMA {op:?}: {e}"),
    };
    warm.map_err(failed)?;
    let started = Instant::now();
    let outcome: Result<Vec<u64>, msgr::RmaError> = std::thread::scope(|s| {
        let callers: Vec<_> = (0..RMA_IN_FLIGHT)
            .map(|_| {
                let (conn, h, payload) = (&conn, &h, payload.clone());
                s.spawn(move || {
                    let mut done = 0u64;
                    while started.elapsed() < secs {
                        match op {
                            msgr::RmaOp::Read => drop(conn.read(h, 0, size as u64, timeout)?),
                            msgr::RmaOp::Write => conn.write(h, 0, payload.clone(), timeout)?,
                        }
                        done += 1;
                    }
                    Ok(done)
                })
            })
            .collect();
        callers
            .into_iter()
            .map(|c| c.join().expect("RMA caller"))
            .collect()
    });
    let elapsed = started.elapsed().as_secs_f64();
    client.shutdown(Duration::from_secs(2));
    let ops = outcome.map_err(failed)?;
    Ok(StreamResult::new(size, ops.iter().sum(), elapsed))
}

/// The length of the bench's one large RMA operation (moved in parts).
pub const RMA_HUGE: usize = 1 << 30;
/// [`RMA_HUGE`] in a `--quick` run.
pub const RMA_HUGE_QUICK: usize = 64 << 20;

/// A [`RMA_HUGE`] operation's rate against 1 MiB operations' (8 in flight).
pub const RMA_HUGE_TARGET: f64 = 0.80;

/// [`RMA_HUGE`]-byte operations (`op`; reads with `read_into`), one at a time, on a region
/// `server` exposes, from a client of `cfg`, for at least `secs` (and at
/// least one after a first, untimed): as a stream result.
fn rma_huge(
    cfg: &MessengerConfig,
    (server, target): (&Messenger, &msgr::EntityAddr),
    (op, size): (msgr::RmaOp, usize),
    secs: Duration,
) -> Result<StreamResult, ToolError> {
    let (region, mut client, conn, payload) = rma_setup(cfg, (server, target), size)?;
    let h = region.handle();
    // Reads land in one buffer, reused as the 1 MiB figure's are: a fresh
    // GiB per read is paged in at about the rate the bytes arrive.
    let mut landing = vec![0u8; if op == msgr::RmaOp::Read { size } else { 0 }];
    let timeout = Duration::from_secs(120);
    let mut once = || match op {
        msgr::RmaOp::Read => conn.read_into(&h, 0, &mut landing, timeout),
        msgr::RmaOp::Write => conn.write(&h, 0, payload.clone(), timeout),
    };
    let failed = |e: msgr::RmaError| ToolError::BadReply {
        peer: target.to_string(),
        what: format!("RMA {} {op:?}: {e}", size_name(size)),
    };
    once().map_err(failed)?;
    let started = Instant::now();
    let mut done = 0u64;
    while done == 0 || started.elapsed() < secs {
        once().map_err(failed)?;
        done += 1;
    }
    let elapsed = started.elapsed().as_secs_f64();
    client.shutdown(Duration::from_secs(2));
    Ok(StreamResult::new(size, done, elapsed))
}

/// The secure mode's 1 MiB streaming bandwidth against the crc mode's
/// (its bar).
pub const SECURE_BANDWIDTH_TARGET: f64 = 0.60;
/// The secure mode's 64 B message rate against the crc mode's.
pub const SECURE_RATE_TARGET: f64 = 0.70;

/// A server configuration and a client one in secure mode, with fresh
/// keys for the bench's two entities (`server`, and the client's name
/// as `net` gives it) in one keyring held in memory.
fn secured(
    server: &MessengerConfig,
    client: &MessengerConfig,
    server_name: &EntityName,
) -> (MessengerConfig, MessengerConfig) {
    use msgr::auth::{Credentials, Keyring, ModeSet, StaticKeypair};
    let client_name = net::client_name();
    let (sk, ck) = (StaticKeypair::generate(), StaticKeypair::generate());
    let mut ring = Keyring::new();
    ring.insert(server_name.clone(), sk.public());
    ring.insert(client_name.clone(), ck.public());
    let ring = Arc::new(ring);
    let with = |cfg: &MessengerConfig, name: &EntityName, key: StaticKeypair| {
        let mut cfg = cfg.clone();
        cfg.session.security = msgr::auth::Security {
            modes: ModeSet::SECURE,
            credentials: Some(Arc::new(Credentials::new(name.clone(), key, ring.clone()))),
        };
        cfg
    };
    (
        with(server, server_name, sk),
        with(client, &client_name, ck),
    )
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

#[allow(clippy::too_many_arguments)]
fn compare<T: Serialize>(
    metric: impl Into<String>,
    unit: &'static str,
    reference_name: impl Into<String>,
    rounds: Vec<Round<T>>,
    value: impl Fn(&T) -> f64,
    target_kind: &'static str,
    target: f64,
) -> Comparison<T> {
    let mut m: Vec<f64> = rounds.iter().map(|r| value(&r.msgr)).collect();
    let mut r: Vec<f64> = rounds.iter().map(|r| value(&r.reference)).collect();
    let per_round: Vec<f64> = m.iter().zip(&r).map(|(a, b)| a / b).collect();
    let lo = per_round.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = per_round.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let (msgr, reference) = (median(&mut m), median(&mut r));
    let ratio = msgr / reference;
    let met = match target_kind {
        "max" => Some(ratio <= target),
        "min" => Some(ratio >= target),
        _ => None,
    };
    Comparison {
        metric: metric.into(),
        unit,
        msgr,
        reference,
        reference_name: reference_name.into(),
        ratio,
        ratio_spread: [lo, hi],
        target_kind,
        target,
        met,
        rounds,
    }
}

/// [`compare`] for a figure recorded without a target.
fn compare_info<T: Serialize>(
    metric: impl Into<String>,
    unit: &'static str,
    reference_name: impl Into<String>,
    rounds: Vec<Round<T>>,
    value: impl Fn(&T) -> f64,
) -> Comparison<T> {
    compare(
        metric,
        unit,
        reference_name,
        rounds,
        value,
        "none",
        f64::NAN,
    )
}

/// Where the server's and the client's workers run. Both busy-poll; two
/// busy pollers the scheduler puts on one CPU each get half of it until its
/// load balancer moves one (`worker_cpus`' documentation), which made the
/// msgr rows of a run depend on where the threads happened to start. With
/// two CPUs or more, one worker each (the default), no `worker_cpus` given
/// and the machine quiet before the run, the server's worker is pinned to
/// the first CPU this process may use and the client's to the second — as
/// `scripts/bench-fabric.sh` pins its servers and clients — unless `--pin
/// false` says not to. On a busy machine a pinned busy poller must wait out
/// whatever else runs on its CPU, slice by slice: a 64 B `fabric+tcp`
/// one-way measured ~2 ms pinned against 15–60 µs placed by the scheduler,
/// with a build on both cores (2026-12-04). So a busy machine keeps the
/// scheduler's placement, and the table says why.
struct Placement {
    server: MessengerConfig,
    client: MessengerConfig,
    pinned: Option<[usize; 2]>,
    /// Why the workers were or were not pinned.
    why: String,
}

impl Placement {
    /// `others_before`: cores other processes kept busy just before the run.
    fn new(cfg: &MessengerConfig, pin: bool, others_before: Option<f64>) -> Placement {
        let cpus = msgr::allowed_cpus();
        let (pinned, why) = match cpus[..] {
            _ if !pin => (None, "--pin false".to_owned()),
            _ if cfg.workers != 1 => (None, format!("{} workers each", cfg.workers)),
            _ if !cfg.worker_cpus.is_empty() => (None, "worker_cpus is set".to_owned()),
            [_] | [] => (None, "one CPU to run on".to_owned()),
            _ if !others_before.is_some_and(|o| o < QUIET_OTHER_CORES) => (
                None,
                format!(
                    "the machine was busy before the run (other processes used {} cores), \
                     where pinned busy pollers wait out the others' time slices",
                    others_before.map_or("?".to_owned(), |o| format!("{o:.2}"))
                ),
            ),
            [a, b, ..] => (
                Some([a, b]),
                format!("the server's to CPU {a}, the client's to CPU {b}"),
            ),
        };
        let (mut server, mut client) = (cfg.clone(), cfg.clone());
        if let Some([a, b]) = pinned {
            server.worker_cpus = vec![a];
            client.worker_cpus = vec![b];
        }
        Placement {
            server,
            client,
            pinned,
            why,
        }
    }
}

/// Runs the benchmark and prints the table (or JSON).
pub fn run(cfg: &MessengerConfig, opts: &BenchOpts) -> Result<BenchReport, ToolError> {
    let bind = parse_addr(&loopback_addr(&opts.transport))?;
    let (ping_count, warmup, secs) = if opts.quick {
        (2_000u64, 200u64, Duration::from_millis(300))
    } else {
        (5_000, 500, Duration::from_secs(1))
    };
    let timeout = Duration::from_secs(60);
    let connect_timeout = Duration::from_secs(10);
    if opts.parts.contains(&Part::Conns) {
        // Each connection is a client messenger of its own: 1,000 take
        // more files than a default soft limit of 1,024 allows.
        let most = opts.connections.iter().copied().max().unwrap_or(1) as u64;
        let want = most * FDS_PER_CONNECTION + 256;
        let have = server_cpu::raise_nofile(want);
        if have < want {
            return Err(ToolError::Usage(format!(
                "{most} connections need about {want} open files; the limit is {have} \
                 (raise the hard limit, or measure fewer --connections)"
            )));
        }
    }
    let watch = Watch::start(Duration::from_millis(if opts.quick { 100 } else { 500 }));
    let place = Placement::new(cfg, opts.pin, watch.others_before());
    let started = Instant::now();
    let before_server = server_cpu::thread_ids();
    let responder = Arc::new(Responder::default());
    let mut server = Messenger::builder(EntityName::server(0))
        .config(place.server.clone())
        .bind(bind.clone())
        .start(responder.clone())?;
    // Its workers' CPU is the server's (`conns`): the workers among the
    // threads started since the list before it.
    let server_threads = ServerThreads::started_since(&before_server, place.server.workers);
    let target = server.addr().expect("bound").clone();
    let secure_name = EntityName::server(1);
    let (secure_server_cfg, secure_client) = secured(&place.server, &place.client, &secure_name);
    let mut secure_server = if opts.parts.contains(&Part::Secure) {
        Some(
            Messenger::builder(secure_name)
                .config(secure_server_cfg)
                .bind(bind.clone())
                .start(Arc::new(Responder::default()))?,
        )
    } else {
        None
    };
    let secure_target = secure_server
        .as_ref()
        .map(|m| m.addr().expect("bound").clone());
    let largest = RMA_SIZES.iter().copied().max().unwrap_or(1 << 20);
    let mut raw_rma = if opts.parts.contains(&Part::Rma) {
        reference::RawRma::for_transport(&bind.transport, RMA_IN_FLIGHT, largest)?
    } else {
        None
    };
    // msgr at each size, each with its raw loop, both ways; or 1 MiB only.
    let rma_sizes: &[usize] = if raw_rma.is_some() {
        &RMA_SIZES
    } else {
        &[1 << 20]
    };
    // One connection first: the others' reference in each round.
    let mut conn_counts = opts.connections.clone();
    conn_counts.retain(|&c| c > 1);
    conn_counts.sort_unstable();
    conn_counts.dedup();
    conn_counts.insert(0, 1);
    // Many client messengers on a few cores: none may spin, and none is
    // pinned; one connection's client is configured the same, so the
    // ratios compare connection counts only.
    let mut conns_client = place.client.clone();
    conns_client.busy_poll = Duration::ZERO;
    conns_client.worker_cpus.clear();
    // Per connection count (after the first): rounds against one connection.
    let mut conns: Vec<Vec<Round<StreamResult>>> =
        conn_counts.iter().skip(1).map(|_| Vec::new()).collect();
    let mut conns_cpu: Vec<Vec<Round<ServerCpu>>> =
        conn_counts.iter().skip(1).map(|_| Vec::new()).collect();
    let server_counts = || {
        let c = server.counters();
        ServerCounts {
            messages: responder.totals().stream_messages,
            frames: msgr::Counters::get(&c.rx_frames),
            turns: msgr::Counters::get(&c.worker_turns),
        }
    };
    let mut hol_rounds = Vec::new();
    let mut mixed_rounds = Vec::new();
    let rma_steps = 3 + 2 * rma_sizes.len() as u64 * (1 + u64::from(raw_rma.is_some()));
    let steps = u64::from(opts.rounds)
        * opts
            .parts
            .iter()
            .map(|p| match p {
                Part::Secure => 4,
                Part::Rma => rma_steps,
                Part::Conns => conn_counts.len() as u64,
                Part::Hol => hol::STEPS,
                Part::Mixed => mixed::STEPS,
                Part::Call => 2,
                _ => 2,
            })
            .sum::<u64>();
    let mut progress = Progress::new(steps, opts.json);
    let mut step_bar = Progress::new(steps, true);
    let mut step = 0u64;
    let mut lat = Vec::new();
    let mut calls = Vec::new();
    let mut bw = Vec::new();
    let mut rate = Vec::new();
    let mut secure_bw = Vec::new();
    let mut secure_rate = Vec::new();
    let mut rma_read = Vec::new();
    let mut rma_write = Vec::new();
    let mut rma_huge_rounds: [Vec<Round<StreamResult>>; 2] = [Vec::new(), Vec::new()];
    let huge_size = if opts.quick { RMA_HUGE_QUICK } else { RMA_HUGE };
    // Per op and size (reads, then writes): rounds against the raw loop.
    let mut rma_raw: Vec<Vec<Round<StreamResult>>> =
        (0..2 * rma_sizes.len()).map(|_| Vec::new()).collect();
    let mut next = |progress: &mut Progress, what: &str| {
        progress.message(what.to_owned());
        progress.set(step);
        step += 1;
    };
    // msgr's streams: fresh data, checksummed on every send — the stricter
    // measure (sealed it is ~4% faster at 1 MiB, 2026-12-03; at 64 B a
    // checksum pass costs nanoseconds either way).
    let stream_opts = |size: usize| StreamOpts {
        size,
        limit: Limit::Time(secs),
        driver: opts.driver,
        timeout,
        connect_timeout,
        seal: false,
    };
    // 64 B pings (a checksum pass costs nanoseconds either way).
    let ping_opts = |reply: Reply| PingOpts {
        size: 64,
        reply,
        count: ping_count,
        warmup,
        timeout,
        connect_timeout,
        seal: false,
        samples_to: None,
    };
    for round in 0..opts.rounds {
        for part in &opts.parts {
            match part {
                Part::Latency => {
                    next(&mut progress, &format!("round {}: msgr ping", round + 1));
                    // The std reference answers from one buffer too.
                    let p = ping_opts(Reply::Own);
                    let m = net::ping(&place.client, &(&target).into(), &p, &mut step_bar)?;
                    next(&mut progress, &format!("round {}: std ping", round + 1));
                    let r = reference::ping(64, warmup, ping_count, timeout)?;
                    lat.push(Round {
                        msgr: m,
                        reference: r,
                    });
                }
                Part::Call => {
                    next(&mut progress, &format!("round {}: msgr calls", round + 1));
                    let m =
                        call_round_trips(&place.client, &target, (warmup, ping_count), timeout)?;
                    next(&mut progress, &format!("round {}: msgr ping", round + 1));
                    // The calls' pings are echoed.
                    let p = ping_opts(Reply::Echo);
                    let r = net::ping(&place.client, &(&target).into(), &p, &mut step_bar)?;
                    calls.push(Round {
                        msgr: m,
                        reference: r,
                    });
                }
                Part::Bandwidth => {
                    next(
                        &mut progress,
                        &format!("round {}: msgr 1 MiB stream", round + 1),
                    );
                    let s = stream_opts(1 << 20);
                    let (m, _) = net::stream(&place.client, &(&target).into(), &s, &mut step_bar)?;
                    next(
                        &mut progress,
                        &format!("round {}: std 1 MiB stream", round + 1),
                    );
                    let r = reference::stream(1 << 20, None, Some(secs))?;
                    bw.push(Round {
                        msgr: m,
                        reference: r,
                    });
                }
                Part::Rate => {
                    next(
                        &mut progress,
                        &format!("round {}: msgr 64 B stream", round + 1),
                    );
                    let s = stream_opts(64);
                    let (m, _) = net::stream(&place.client, &(&target).into(), &s, &mut step_bar)?;
                    next(
                        &mut progress,
                        &format!("round {}: raw 64 B stream", round + 1),
                    );
                    let r = reference::framed_stream(64, None, Some(secs))?;
                    rate.push(Round {
                        msgr: m,
                        reference: r,
                    });
                }
                Part::Rma => {
                    let s = stream_opts(1 << 20);
                    next(&mut progress, &format!("round {}: 1 MiB stream", round + 1));
                    let (r, _) = net::stream(&place.client, &(&target).into(), &s, &mut step_bar)?;
                    let ops = [
                        (msgr::RmaOp::Read, &mut rma_read),
                        (msgr::RmaOp::Write, &mut rma_write),
                    ];
                    for (i, (op, vs_stream)) in ops.into_iter().enumerate() {
                        for (j, &size) in rma_sizes.iter().enumerate() {
                            let name = size_name(size);
                            next(
                                &mut progress,
                                &format!("round {}: RMA {name} {op:?}s", round + 1),
                            );
                            let m = rma_stream(&place.client, (&server, &target), op, size, secs)?;
                            if size == 1 << 20 {
                                vs_stream.push(Round {
                                    msgr: m.clone(),
                                    reference: r.clone(),
                                });
                                next(
                                    &mut progress,
                                    &format!(
                                        "round {}: RMA {} {op:?}s",
                                        round + 1,
                                        size_name(huge_size)
                                    ),
                                );
                                let huge = rma_huge(
                                    &place.client,
                                    (&server, &target),
                                    (op, huge_size),
                                    secs,
                                )?;
                                rma_huge_rounds[i].push(Round {
                                    msgr: huge,
                                    reference: m.clone(),
                                });
                            }
                            if let Some(raw) = raw_rma.as_mut() {
                                next(
                                    &mut progress,
                                    &format!("round {}: raw {name} {op:?}s", round + 1),
                                );
                                let x = raw.run(op, size, secs)?;
                                rma_raw[i * rma_sizes.len() + j].push(Round {
                                    msgr: m,
                                    reference: x,
                                });
                            }
                        }
                    }
                }
                Part::Conns => {
                    let s = stream_opts(64);
                    let mut one = None;
                    for (k, &c) in conn_counts.iter().enumerate() {
                        next(
                            &mut progress,
                            &format!("round {}: 64 B streams, {c} connections", round + 1),
                        );
                        let (r, cpu) =
                            server_cpu::while_receiving(&server_threads, &server_counts, || {
                                net::stream_many(
                                    &conns_client,
                                    &(&target).into(),
                                    &s,
                                    c,
                                    opts.conns_window,
                                )
                            });
                        let (r, cpu) = (
                            r?,
                            cpu.ok_or_else(|| {
                                ToolError::Usage(format!(
                                    "the server's CPU time could not be read \
                                     (/proc/self/task) over {c} connections' streams"
                                ))
                            })?,
                        );
                        match one.clone() {
                            None => one = Some((r, cpu)),
                            Some((rate, cpu_one)) => {
                                conns[k - 1].push(Round {
                                    msgr: r,
                                    reference: rate,
                                });
                                conns_cpu[k - 1].push(Round {
                                    msgr: cpu,
                                    reference: cpu_one,
                                });
                            }
                        }
                    }
                }
                Part::Hol => {
                    let plan = hol::HolPlan {
                        idle: (warmup, ping_count),
                        window: secs,
                        min_loaded_calls: if opts.quick { 2 } else { 3 },
                        connect_timeout,
                        timeout,
                    };
                    let mut step = |what: &str| {
                        next(&mut progress, &format!("round {}: {what}", round + 1));
                    };
                    hol_rounds.push(hol::round(&place.client, &target, &plan, &mut step)?);
                }
                Part::Mixed => {
                    let plan = mixed::MixedPlan {
                        clients: if opts.quick {
                            mixed::QUICK_CLIENTS
                        } else {
                            mixed::CLIENTS
                        },
                        idle_calls: (warmup, ping_count / 2),
                        idle_heartbeats: if opts.quick { 20 } else { 100 },
                        window: secs,
                        connect_timeout,
                        timeout,
                    };
                    let mut step = |what: &str| {
                        next(&mut progress, &format!("round {}: {what}", round + 1));
                    };
                    // Several client messengers: configured as the conns
                    // part's, none spinning or pinned.
                    let r = mixed::round(&conns_client, &target, &plan, &mut step)?;
                    mixed_rounds.push(r);
                }
                Part::Secure => {
                    let secure_target = secure_target.as_ref().expect("started for this part");
                    for (size, out) in [(1usize << 20, &mut secure_bw), (64, &mut secure_rate)] {
                        let s = stream_opts(size);
                        next(
                            &mut progress,
                            &format!("round {}: secure {size} B stream", round + 1),
                        );
                        let (m, _) =
                            net::stream(&secure_client, &secure_target.into(), &s, &mut step_bar)?;
                        next(
                            &mut progress,
                            &format!("round {}: crc {size} B stream", round + 1),
                        );
                        let (r, _) =
                            net::stream(&place.client, &(&target).into(), &s, &mut step_bar)?;
                        out.push(Round {
                            msgr: m,
                            reference: r,
                        });
                    }
                }
            }
        }
    }
    progress.finish();
    server.shutdown(Duration::from_secs(2));
    if let Some(s) = secure_server.as_mut() {
        s.shutdown(Duration::from_secs(2));
    }
    let machine = watch.finish();
    let latency = (!lat.is_empty()).then(|| {
        compare(
            "64 B ping-pong one-way latency, p50",
            "µs",
            "std::net blocking ping-pong",
            lat,
            |r: &PingResult| r.one_way.p50_us,
            "max",
            LATENCY_TARGET,
        )
    });
    let call = (!calls.is_empty()).then(|| {
        compare(
            "64 B blocking call round trip, p50",
            "µs",
            "msgr worker ping-pong round trip, same run",
            calls,
            |r: &PingResult| r.rtt.p50_us,
            "max",
            CALL_TARGET,
        )
    });
    let bandwidth = (!bw.is_empty()).then(|| {
        compare(
            "1 MiB streaming bandwidth",
            "MiB/s",
            "std::net 1 MiB writes",
            bw,
            |r: &StreamResult| r.mib_per_s,
            "min",
            BANDWIDTH_TARGET,
        )
    });
    let message_rate = (!rate.is_empty()).then(|| {
        compare(
            "64 B one-way message rate",
            "msg/s",
            "raw length-prefixed std::net stream",
            rate,
            |r: &StreamResult| r.msgs_per_s,
            "min",
            RATE_TARGET,
        )
    });
    let secure_bandwidth = (!secure_bw.is_empty()).then(|| {
        compare(
            "secure 1 MiB streaming",
            "MiB/s",
            "msgr crc mode, same run",
            secure_bw,
            |r: &StreamResult| r.mib_per_s,
            "min",
            SECURE_BANDWIDTH_TARGET,
        )
    });
    let secure_rate = (!secure_rate.is_empty()).then(|| {
        compare(
            "secure 64 B message rate",
            "msg/s",
            "msgr crc mode, same run",
            secure_rate,
            |r: &StreamResult| r.msgs_per_s,
            "min",
            SECURE_RATE_TARGET,
        )
    });
    let rma = |name, rounds| {
        compare(
            name,
            "MiB/s",
            "msgr 1 MiB message stream, same run",
            rounds,
            |r: &StreamResult| r.mib_per_s,
            "min",
            RMA_TARGET,
        )
    };
    let rma_read = (!rma_read.is_empty()).then(|| rma("RMA 1 MiB reads, 8 in flight", rma_read));
    let rma_write =
        (!rma_write.is_empty()).then(|| rma("RMA 1 MiB writes, 8 in flight", rma_write));
    let rma_huge = (rma_huge_rounds.into_iter().zip(["read", "write"]))
        .filter(|(rounds, _)| !rounds.is_empty())
        .map(|(rounds, op)| {
            compare(
                format!("RMA {} {op}s, one at a time", size_name(huge_size)),
                "MiB/s",
                format!("RMA 1 MiB {op}s, 8 in flight"),
                rounds,
                |r: &StreamResult| r.mib_per_s,
                "min",
                RMA_HUGE_TARGET,
            )
        })
        .collect();
    let rma_vs_raw = match &raw_rma {
        Some(raw) => rma_raw
            .into_iter()
            .enumerate()
            .filter(|(_, rounds)| !rounds.is_empty())
            .map(|(k, rounds)| {
                let (op, size) = match k / rma_sizes.len() {
                    0 => ("read", rma_sizes[k % rma_sizes.len()]),
                    _ => ("write", rma_sizes[k % rma_sizes.len()]),
                };
                compare(
                    format!("RMA {} {op}s vs raw fi_{op}", size_name(size)),
                    "MiB/s",
                    format!(
                        "raw libfabric fi_read/fi_write loop, {} RDM, {RMA_IN_FLIGHT} in flight, same run",
                        raw.provider()
                    ),
                    rounds,
                    |r: &StreamResult| r.mib_per_s,
                    "min",
                    RMA_RAW_TARGET,
                )
            })
            .collect(),
        None => Vec::new(),
    };
    let conns = conn_counts
        .iter()
        .skip(1)
        .zip(conns)
        .filter(|(_, rounds)| !rounds.is_empty())
        .map(|(c, rounds)| {
            compare(
                format!("64 B aggregate rate, {c} connections"),
                "msg/s",
                "msgr, one connection, same run",
                rounds,
                |r: &StreamResult| r.msgs_per_s,
                "min",
                CONNS_TARGET,
            )
        })
        .collect();
    let conns_server_cpu = conn_counts
        .iter()
        .skip(1)
        .zip(conns_cpu)
        .filter(|(_, rounds)| !rounds.is_empty())
        .map(|(c, rounds)| {
            compare(
                format!("server CPU/msg, {c} connections"),
                "ns/msg",
                "the server's CPU per message, one connection, same run",
                rounds,
                |r: &ServerCpu| r.ns_per_message,
                "max",
                CONNS_CPU_TARGET,
            )
        })
        .collect();
    let (hol, hol_bulk) = hol::comparisons(&hol_rounds);
    let (mixed, mixed_bulk) = mixed::comparisons(&mixed_rounds);
    Ok(BenchReport {
        transport: opts.transport.clone(),
        quick: opts.quick,
        rounds: opts.rounds,
        driver: opts.driver,
        workers: cfg.workers,
        busy_poll_us: cfg.busy_poll.as_micros() as u64,
        pinned: place.pinned,
        placement: place.why,
        machine,
        elapsed_s: started.elapsed().as_secs_f64(),
        latency,
        call,
        bandwidth,
        message_rate,
        secure_bandwidth,
        secure_rate,
        rma_read,
        rma_write,
        rma_huge,
        rma_vs_raw,
        conns,
        conns_server_cpu,
        conns_window: opts.conns_window,
        hol,
        hol_bulk,
        mixed,
        mixed_bulk,
    })
}

fn human(v: f64, unit: &str) -> String {
    match unit {
        "µs" if v >= 10_000.0 => format!("{:.1} ms", v / 1e3),
        "msg/s" if v >= 1e6 => format!("{:.2} M msg/s", v / 1e6),
        "msg/s" => format!("{:.0} k msg/s", v / 1e3),
        "MiB/s" => format!("{v:.0} MiB/s"),
        _ => format!("{v:.2} {unit}"),
    }
}

fn row<T: Serialize>(c: &Comparison<T>) -> Result<(), ToolError> {
    let target = match c.target_kind {
        "max" => format!("≤ {:.2}×", c.target),
        "min" => format!("≥ {:.2}×", c.target),
        _ => "—".to_owned(),
    };
    outln!(
        "{:<38} {:>14} {:>14} {:>7.2}× ({:.2}–{:.2}) {:>8}  {}",
        c.metric,
        human(c.msgr, c.unit),
        human(c.reference, c.unit),
        c.ratio,
        c.ratio_spread[0],
        c.ratio_spread[1],
        target,
        match c.met {
            Some(true) => "met",
            Some(false) => "MISSED",
            None => "",
        }
    )
}

impl BenchReport {
    /// The results table.
    pub fn print_table(&self) -> Result<(), ToolError> {
        outln!(
            "msgr bench: transport {}, {} round(s){}, {} worker(s) per messenger, busy-poll {} µs, stream sender: {:?}, {:.1} s",
            self.transport,
            self.rounds,
            if self.quick { " (quick)" } else { "" },
            self.workers,
            self.busy_poll_us,
            self.driver,
            self.elapsed_s
        )?;
        match self.pinned {
            Some(_) => outln!(
                "workers pinned: {} (the std::net references are not)",
                self.placement
            )?,
            None => outln!("workers placed by the scheduler: {}", self.placement)?,
        }
        outln!("{}", self.machine.describe())?;
        outln!()?;
        outln!(
            "{:<38} {:>14} {:>14} {:>24} {:>8}",
            "median over rounds",
            "msgr",
            "reference",
            "ratio (spread)",
            "target"
        )?;
        for c in [&self.latency, &self.call].into_iter().flatten() {
            row(c)?;
        }
        if let Some(c) = &self.bandwidth {
            row(c)?;
        }
        if let Some(c) = &self.message_rate {
            row(c)?;
        }
        for c in [
            &self.secure_bandwidth,
            &self.secure_rate,
            &self.rma_read,
            &self.rma_write,
        ]
        .into_iter()
        .flatten()
        .chain(&self.rma_huge)
        .chain(&self.rma_vs_raw)
        {
            row(c)?;
        }
        // Each count's server CPU beside its rate.
        for (i, c) in self.conns.iter().enumerate() {
            row(c)?;
            if let Some(cpu) = self.conns_server_cpu.get(i) {
                row(cpu)?;
            }
        }
        for c in self.hol.iter().chain(&self.mixed) {
            row(c)?;
        }
        for c in self.hol_bulk.iter().chain(&self.mixed_bulk) {
            row(c)?;
        }
        if let Some(c) = &self.latency {
            outln!()?;
            outln!(
                "64 B ping-pong detail (one-way µs, per round: p50 / p99 / p99.9 / mean / min):"
            )?;
            for (i, r) in c.rounds.iter().enumerate() {
                for (name, p) in [("msgr", &r.msgr), ("std ", &r.reference)] {
                    let s = &p.one_way;
                    outln!(
                        "  round {} {name}  {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>8.2}",
                        i + 1,
                        s.p50_us,
                        s.p99_us,
                        s.p999_us,
                        s.mean_us,
                        s.min_us
                    )?;
                }
            }
        }
        if !self.conns_server_cpu.is_empty() {
            outln!()?;
            outln!(
                "the server's worker turns (per round: frames / messages delivered per turn; \
                 one connection's after the bar), {}:",
                match self.conns_window {
                    Some(n) => format!("{n} messages a credit on every connection"),
                    None => "one connection's window shared among the connections".into(),
                }
            )?;
            for c in &self.conns_server_cpu {
                let per_turn = |r: &ServerCpu| {
                    format!("{:.1} / {:.0}", r.frames_per_turn, r.messages_per_turn)
                };
                let rounds: Vec<String> = (c.rounds.iter())
                    .map(|r| format!("{} | {}", per_turn(&r.msgr), per_turn(&r.reference)))
                    .collect();
                let what = c.metric.trim_start_matches("server CPU/msg, ");
                outln!("  {what:>16}: {}", rounds.join(";  "))?;
            }
        }
        outln!()?;
        outln!("references: {}", {
            let mut v: Vec<&str> = Vec::new();
            for c in [&self.latency, &self.call].into_iter().flatten() {
                v.push(&c.reference_name);
            }
            for c in [&self.bandwidth, &self.message_rate, &self.rma_read]
                .into_iter()
                .flatten()
                .chain(self.rma_vs_raw.first())
                .chain(self.conns.first())
                .chain(self.hol_bulk.first())
                .chain(&self.mixed_bulk)
            {
                v.push(&c.reference_name);
            }
            if let Some(c) = self.conns_server_cpu.first() {
                v.push(&c.reference_name);
            }
            for c in self.hol.first().into_iter().chain(self.mixed.first()) {
                v.push(&c.reference_name);
            }
            v.join("; ")
        })
    }
}
