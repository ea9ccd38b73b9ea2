//! `msgr`: serve, ping (latency), stream (bandwidth / message rate), rma
//! (one-sided reads and writes of a region serve exposes) and bench over
//! any msgr backend — `rping`, `ib_send_lat` and `fi_pingpong` in one.
//!
//! # Layers
//!
//! The modules import in one direction (`tests/layering.rs` checks it),
//! bottom first:
//!
//! 1. `machine`, `progress`, `error`: the leaves — what machine this is, the progress bar, the tool's errors and exit codes.
//! 2. `output`: printing to a stdout that may close under us.
//! 3. `stats`: latency and rate figures, and how they print.
//! 4. `net`, `reference`: msgr's ping, stream and serve; the plain references the benchmarks compare with.
//! 5. `rma`, `bench`: one-sided reads and writes of a served region; the benchmarks.

mod bench;
mod error;
mod machine;
mod net;
mod output;
mod progress;
mod reference;
mod rma;
mod stats;

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use msgr::{
    availability, rendezvous_withheld, Availability, EntityName, Messenger, MessengerConfig,
    TransportKind,
};
use msgr_addr::{FabricEndpoint, FabricProvider};
use serde::Serialize;

use crate::error::{parse_addr, ToolError};
use crate::net::{Driver, Limit, PingOpts, Reply, Responder, StreamOpts};
use crate::output::{outln, write_stdout};
use crate::progress::Progress;

#[derive(Parser, Debug)]
#[command(
    name = "msgr",
    version,
    about = "msgr messenger tool: serve, ping (latency), stream (bandwidth, message rate), rma (one-sided reads and writes), bench",
    after_help = "Configuration: defaults, then --config FILE, then MSGR_CONFIG / MSGR_<KEY> \
                  environment variables, then --workers / --busy-poll-us / --set KEY=VALUE."
)]
struct Cli {
    /// TOML file of flat `key = value` messenger settings.
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Event-loop worker threads per messenger (config key `workers`).
    #[arg(long, global = true, value_name = "N")]
    workers: Option<String>,
    /// Busy-poll window in µs before a worker blocks (config key `busy_poll_us`).
    #[arg(long, global = true, value_name = "US")]
    busy_poll_us: Option<String>,
    /// Any configuration key, e.g. `--set policy=lossy-client` (repeatable).
    #[arg(long = "set", global = true, value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// This process's entity name (default server.PID or client.PID):
    /// with --key-file, the name the key was made for.
    #[arg(long, global = true, value_name = "NAME")]
    name: Option<EntityName>,
    /// Security modes allowed: crc, auth, secure, or a list (config key
    /// `security`); auth and secure need --key-file and --keyring.
    #[arg(long, global = true, value_name = "MODES")]
    security: Option<String>,
    /// This entity's private key file, from `msgr keygen` (config key `key_file`).
    #[arg(long, global = true, value_name = "FILE")]
    key_file: Option<PathBuf>,
    /// The keyring: entity names and their public keys (config key `keyring`).
    #[arg(long, global = true, value_name = "FILE")]
    keyring: Option<PathBuf>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Run a responder: echoes pings, counts streams. Prints `listening on
    /// ADDR` for every bound address, then `entity NAME` (what `--peer`
    /// pins), and its counters at the end, the backends' own among them.
    Serve {
        /// Address to bind, e.g. tcp://127.0.0.1:6800 (port 0 picks one),
        /// or several (`A,B` or `[A,B]`), each accepting; default: the
        /// configuration's `bind` (--config FILE, MSGR_BIND).
        addr: Option<String>,
        /// Stop after this many seconds (default: until Ctrl-C).
        #[arg(long, value_name = "SECS", value_parser = seconds)]
        duration: Option<Duration>,
        /// Expose a read-write region of SIZE bytes (`4096`, `64K`, `1M`;
        /// byte i is i % 251) for `msgr rma`: its handle is printed as
        /// `region HANDLE` after the `listening on` lines.
        #[arg(long, value_name = "SIZE[K|M]", value_parser = expose_size)]
        expose: Option<usize>,
        /// Expose the region read-only from bytes the program keeps
        /// (`Messenger::expose_shared`): each read is answered with a
        /// slice of them, so the counter `rma_bytes_copied` stays 0;
        /// writes are refused.
        #[arg(long, requires = "expose")]
        shared: bool,
    },
    /// Read or write a region that `msgr serve --expose` exposes, one-sided
    /// (no dispatcher of the server's runs): prints the bytes read as hex,
    /// or `wrote N bytes`.
    #[command(
        group(clap::ArgGroup::new("op").required(true).args(["read", "write"])),
        group(clap::ArgGroup::new("source").args(["data", "from"])),
        after_help = "Exit status: 0 done, 1 failed (timeout, reset, checksum), 2 bad input, \
                      3 the owner refused the handle (wrong capability or peer), 4 the region \
                      was revoked (or never existed), 5 the range is outside the region, \
                      6 the region's rights do not allow the operation."
    )]
    Rma {
        /// The server's address (or an address vector, as for ping).
        addr: String,
        /// The region's handle: the text after `region` in serve's output.
        #[arg(long, value_name = "HANDLE", value_parser = rma::parse_handle)]
        handle: msgr::RmaHandle,
        /// Read LEN bytes at OFFSET.
        #[arg(long, value_name = "OFFSET:LEN", value_parser = rma::parse_range)]
        read: Option<(u64, u64)>,
        /// Write the bytes read to FILE instead of printing them as hex.
        #[arg(long, value_name = "FILE", requires = "read")]
        out: Option<PathBuf>,
        /// Write at OFFSET the bytes of --data or --from.
        #[arg(long, value_name = "OFFSET", requires = "source")]
        write: Option<u64>,
        /// The bytes to write, as hex digits.
        #[arg(long, value_name = "HEX", value_parser = rma::from_hex, requires = "write")]
        // One value, not a list of them: clap takes a bare `Vec` as a list.
        data: Option<std::vec::Vec<u8>>,
        /// Write the bytes of FILE.
        #[arg(long, value_name = "FILE", requires = "write")]
        from: Option<PathBuf>,
        /// Only this entity may answer (see `ping --peer`).
        #[arg(long, value_name = "NAME")]
        peer: Option<String>,
        /// Send a CRC32C of the bytes moved with them, checked where they
        /// land (`RmaOptions::checksum`).
        #[arg(long)]
        checksum: bool,
        /// Do the operation this many times on the one connection, then
        /// print the rate and how many went natively (RDMA READ/WRITE or
        /// fi_read, no CPU of the owner's): a load generator, and the
        /// figure `scripts/instructions.sh --rma` divides by.
        #[arg(long, default_value = "1", value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
        repeat: u64,
        /// Move the range (or the bytes written) as N equal ranges in
        /// flight together with one completion (`Connection::read_many`,
        /// `write_many`): scatter-gather in one call.
        #[arg(long, default_value = "1", value_name = "N", value_parser = clap::value_parser!(u64).range(1..=4096))]
        ranges: u64,
        /// Give up after this many seconds (connecting, then each operation).
        #[arg(long, default_value = "30", value_name = "SECS", value_parser = seconds)]
        timeout: Duration,
    },
    /// Ping-pong latency against `msgr serve`: one-way and round-trip percentiles.
    Ping {
        /// The server's address, e.g. tcp://127.0.0.1:6800, or an address
        /// vector (`A,B` or `[A,B]`): the next address after each fault.
        addr: String,
        /// Only this entity may answer (e.g. server.1): anyone else at the
        /// address is refused (with `--security auth|secure`, by the key
        /// it proves).
        #[arg(long, value_name = "NAME")]
        peer: Option<String>,
        /// Payload bytes per message (at most the configured `max_data_bytes`).
        #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(0..=MAX_SIZE))]
        size: u64,
        /// Timed round trips (each keeps an 8-byte sample).
        #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=MAX_PING_COUNT))]
        count: u64,
        /// Untimed round trips first.
        #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(0..=MAX_PING_COUNT))]
        warmup: u64,
        /// What the server answers with: `own`, as many bytes from its own
        /// buffer (as fi_pingpong and ib_send_lat do), or `echo`, the bytes it got.
        #[arg(long, value_enum, default_value_t = Reply::Own)]
        reply: Reply,
        /// Checksum the payload once and reuse the checksum on every send
        /// (`Message::with_data_checksum`), as an application sending the
        /// same bytes again would, and have the server answer likewise;
        /// `false`: both ends checksum every payload they send, as for
        /// fresh data.
        #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
        seal: bool,
        /// Give up after this many seconds (up to a day).
        #[arg(long, default_value = "60", value_name = "SECS", value_parser = seconds)]
        timeout: Duration,
        /// Write every timed round trip's time to FILE, in the order they
        /// ran (nanoseconds, one a line): whether the slow ones come alone
        /// or in stretches, which percentiles do not say.
        #[arg(long, value_name = "FILE")]
        samples: Option<std::path::PathBuf>,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// One-way streaming to `msgr serve`: bandwidth and message rate.
    Stream {
        /// The server's address, e.g. tcp://127.0.0.1:6800, or an address
        /// vector (`A,B` or `[A,B]`): the next address after each fault.
        addr: String,
        /// Only this entity may answer (see `ping --peer`).
        #[arg(long, value_name = "NAME")]
        peer: Option<String>,
        /// Payload bytes per message (at most the configured `max_data_bytes`).
        #[arg(long, default_value_t = 1 << 20, value_parser = clap::value_parser!(u64).range(1..=MAX_SIZE))]
        size: u64,
        /// Messages to send.
        #[arg(long, conflicts_with = "duration", value_parser = clap::value_parser!(u64).range(1..=MAX_STREAM_COUNT))]
        count: Option<u64>,
        /// Send for this many seconds (default 3 unless --count; below --timeout).
        #[arg(long, value_name = "SECS", value_parser = seconds)]
        duration: Option<Duration>,
        /// Who sends: the main thread, or the dispatcher's callbacks paced by credits.
        #[arg(long, value_enum, default_value_t = Driver::Callback)]
        driver: Driver,
        /// Checksum the payload once and reuse the checksum on every send
        /// (`Message::with_data_checksum`): the stream sends one buffer
        /// again and again; `false`: every send checksums it, as for fresh
        /// data. The server checks every byte either way.
        #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
        seal: bool,
        /// Give up after this many seconds (up to a day).
        #[arg(long, default_value = "120", value_name = "SECS", value_parser = seconds)]
        timeout: Duration,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Server and client in one process on loopback, against std::net references.
    Bench {
        /// Transport scheme (tcp, verbs, rdmacm, fabric+PROVIDER), with the
        /// address's options after `?` where it needs them (fabric+shm?ep=rdm).
        #[arg(long, default_value = "tcp")]
        transport: String,
        /// A short run (for tests and smoke checks).
        #[arg(long)]
        quick: bool,
        /// Rounds; each reports msgr and its reference (default 3, quick 1).
        #[arg(long)]
        rounds: Option<u32>,
        /// Run only these parts (repeatable / comma-separated).
        #[arg(long, value_enum, value_delimiter = ',')]
        only: Vec<bench::Part>,
        /// Run the one-sided RMA part too (reads and writes of an exposed
        /// region against the message stream); with --only, as `--only rma`.
        #[arg(long)]
        rma: bool,
        /// Who sends msgr's streams.
        #[arg(long, value_enum, default_value_t = Driver::Callback)]
        driver: Driver,
        /// Pin the server's worker to one CPU and the client's to another
        /// (with two CPUs or more, one worker each, no `worker_cpus` set and
        /// the machine quiet before the run); `false` leaves their
        /// placement to the scheduler.
        #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
        pin: bool,
        /// Connection counts of the `conns` part (comma-separated; one
        /// connection, the reference, is always measured).
        #[arg(long, value_delimiter = ',', default_values_t = bench::CONNECTIONS.map(|c| c as u64),
              value_parser = clap::value_parser!(u64).range(1..=4096))]
        connections: Vec<u64>,
        /// Messages a credit for every connection of the `conns` part, one
        /// included (default: one connection's 4,096 shared among the
        /// connections, at least 16 each, so many connections are sparse):
        /// compares the counts at equal per-connection windows.
        #[arg(long, value_name = "MESSAGES",
              value_parser = clap::value_parser!(u64).range(1..=65536))]
        conns_window: Option<u64>,
        /// Print one JSON object instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// Make a key pair for an entity: writes its private key file (mode
    /// 0600, never over an existing file) and appends its public key to a
    /// keyring; prints the keyring line.
    Keygen {
        /// The entity the key is for, e.g. server.1.
        entity: EntityName,
        /// Where to write the private key.
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
        /// The keyring to append the public key to (created if missing).
        #[arg(long = "add-to", value_name = "FILE")]
        add_to: Option<PathBuf>,
    },
    /// List every transport kind and whether it can be used here.
    Backends {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// The largest `--size`: 1 GiB (a message must also fit the configured
/// `max_data_bytes`, checked once the configuration is known).
const MAX_SIZE: u64 = 1 << 30;
/// The most timed round trips of a ping (each keeps an 8-byte sample).
const MAX_PING_COUNT: u64 = 100_000_000;
/// The most messages of a stream.
const MAX_STREAM_COUNT: u64 = 1 << 40;

/// Seconds, from a millisecond to a day: what `--timeout` and
/// `--duration` take (a larger value would overflow the clock's
/// arithmetic or wait for ever).
fn seconds(s: &str) -> Result<Duration, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a number of seconds"))?;
    if !(0.001..=86_400.0).contains(&v) {
        return Err(format!("{v} is outside 0.001..=86400 seconds"));
    }
    Ok(Duration::from_secs_f64(v))
}

/// `--expose SIZE[K|M]`, up to the largest `--size`.
fn expose_size(text: &str) -> Result<usize, rma::ArgError> {
    rma::parse_size(text, MAX_SIZE)
}

/// `size` bytes of `flag` (e.g. `--size`), refused above what the peer
/// accepts in one data segment (`max_data_bytes`, configured the same on
/// both sides by default): such a message would be refused by the peer's
/// decoder.
fn payload_size(flag: &str, size: u64, cfg: &MessengerConfig) -> Result<usize, ToolError> {
    let max = u64::from(cfg.session.limits.max_segment[2]);
    if size > max {
        return Err(ToolError::Usage(format!(
            "{flag} {size} is more than max_data_bytes ({max}); raise it on both sides with --set max_data_bytes=N"
        )));
    }
    Ok(size as usize)
}

fn build_config(cli: &Cli) -> Result<MessengerConfig, ToolError> {
    let mut cfg = match &cli.config {
        Some(p) => MessengerConfig::from_file(p)?,
        None => MessengerConfig::default(),
    };
    cfg.apply_env()?;
    if let Some(w) = &cli.workers {
        cfg.set("workers", w)?;
    }
    if let Some(b) = &cli.busy_poll_us {
        cfg.set("busy_poll_us", b)?;
    }
    if let Some(m) = &cli.security {
        cfg.set("security", m)?;
    }
    for (key, path) in [("key_file", &cli.key_file), ("keyring", &cli.keyring)] {
        if let Some(p) = path {
            let p = p.to_str().ok_or_else(|| {
                ToolError::Usage(format!(
                    "--{}: the path is not UTF-8",
                    key.replace('_', "-")
                ))
            })?;
            cfg.set(key, p)?;
        }
    }
    for kv in &cli.set {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| ToolError::Usage(format!("--set `{kv}`: expected KEY=VALUE")))?;
        cfg.set(k.trim(), v)?;
    }
    Ok(cfg)
}

/// Set by SIGINT, SIGTERM or SIGHUP: `serve` prints its counters and stops.
static STOP: AtomicBool = AtomicBool::new(false);

/// SIGINT, SIGTERM and SIGHUP set [`STOP`]. Their handlers replace any a
/// library installed when it was loaded (libfabric's PSM provider, through
/// libinfinipath, installs ones that `exit(1)`), so that the counters are
/// printed; ctrlc's handler only wakes a thread of its own, which sets the flag.
fn install_signal_handlers() -> Result<(), ToolError> {
    ctrlc::set_handler(|| STOP.store(true, Ordering::SeqCst)).map_err(|e| {
        ToolError::io(
            "installing the SIGINT/SIGTERM handler",
            std::io::Error::other(e),
        )
    })
}

fn serve(
    cfg: &MessengerConfig,
    addr: Option<&str>,
    duration: Option<Duration>,
    (expose, shared): (Option<usize>, bool),
) -> Result<(), ToolError> {
    // Without addresses the builder binds the configuration's.
    let binds = match addr {
        Some(text) => parse_addrs(text)?.0,
        None if cfg.bind.is_empty() => {
            return Err(ToolError::Usage(
                "serve needs an address: an argument (tcp://127.0.0.1:6800), or `bind` in \
                 --config FILE or MSGR_BIND"
                    .into(),
            ))
        }
        None => Vec::new(),
    };
    install_signal_handlers()?;
    let responder = Arc::new(Responder::default());
    let mut m = binds
        .into_iter()
        .fold(
            Messenger::builder(net::server_name()).config(cfg.clone()),
            |b, a| b.bind(a),
        )
        .start(responder.clone())?;
    // Reachable by whoever holds the handle printed below, until the end.
    let region = expose.map(|len| rma::ServedRegion::expose(&m, len, shared));
    let region_line = region
        .as_ref()
        .map(|r| rma::handle_text(&r.handle()))
        .transpose()?;
    // Without their nonce: clients may connect to any incarnation at these
    // addresses. One line each, the messenger's own first; the region's
    // handle after them.
    let addrs: Vec<_> = m.addrs().0.into_iter().map(|a| a.with_nonce(0)).collect();
    write_stdout(|out| {
        for a in &addrs {
            writeln!(out, "listening on {a}")?;
        }
        if let Some(h) = &region_line {
            writeln!(out, "region {h}")?;
        }
        // The name a client pins with `--peer` (and a keyring lists).
        writeln!(out, "entity {}", net::server_name())
    })?;
    if let (Some(r), Some(a)) = (&region, addrs.first()) {
        eprintln!(
            "exposing {} bytes {} (byte i is i % 251): msgr rma {a} --handle HANDLE --read 0:16",
            r.len(),
            r.describe()
        );
    }
    eprintln!(
        "serving{}; Ctrl-C prints counters and stops",
        duration.map_or(String::new(), |d| format!(" for {:.1} s", d.as_secs_f64()))
    );
    let start = Instant::now();
    while !STOP.load(Ordering::SeqCst) && duration.is_none_or(|d| start.elapsed() < d) {
        std::thread::sleep(Duration::from_millis(50));
    }
    // The backends' own counters (fabric's `hello_challenges`, RDMA's
    // credits...), asked of the workers while they still run.
    let transport = msgr::Counters::transport_prometheus(&m.transport_stats());
    let report = m.shutdown(Duration::from_secs(2));
    drop(region);
    let t = responder.totals();
    write_stdout(|out| {
        writeln!(
            out,
            "# msgr serve: {:.1} s, {} connections accepted, {} pings echoed, {} stream messages ({} bytes), {} links closed for checksum mismatches, shutdown {:?}",
            start.elapsed().as_secs_f64(),
            responder.accepted.load(Ordering::Relaxed),
            t.pings,
            t.stream_messages,
            t.stream_bytes,
            msgr::Counters::get(&m.counters().checksum_failures),
            report
        )?;
        write!(out, "{}{transport}", m.counters().prometheus())
    })
}

#[derive(Serialize)]
struct BackendRow {
    kind: String,
    example: String,
    available: bool,
    reason: Option<String>,
}

fn backends(json: bool) -> Result<(), ToolError> {
    let rdm = |name: &str| {
        TransportKind::Fabric(FabricProvider::new(name).with_endpoint(FabricEndpoint::Rdm))
    };
    let kinds = [
        TransportKind::Tcp,
        TransportKind::Verbs,
        TransportKind::RdmaCm,
        TransportKind::Fabric(FabricProvider::new("tcp")),
        rdm("tcp"),
        // shm has only RDM endpoints: its MSG row says so and names the query.
        TransportKind::Fabric(FabricProvider::new("shm")),
        rdm("shm"),
        TransportKind::Fabric(FabricProvider::new("verbs")),
        rdm("verbs;ofi_rxm"),
        rdm("efa"),
    ];
    let rows: Vec<BackendRow> = kinds
        .iter()
        .map(|k| {
            let (available, reason) = match availability(k) {
                Availability::Available => (
                    true,
                    rendezvous_withheld(k)
                        .map(|why| format!("rendezvous by fi_write, reads withheld: {why}")),
                ),
                Availability::Unavailable(r) => (false, Some(r)),
            };
            // The query as in the address: fabric+tcp and fabric+tcp?ep=rdm
            // are different transports.
            let query = match k {
                TransportKind::Fabric(p) if p.endpoint == FabricEndpoint::Rdm => "?ep=rdm",
                _ => "",
            };
            BackendRow {
                kind: format!("{}{query}", k.scheme()),
                example: format!("{}://127.0.0.1:6800{query}", k.scheme()),
                available,
                reason,
            }
        })
        .collect();
    if json {
        return outln!(
            "{}",
            serde_json::to_string_pretty(&rows).unwrap_or_default()
        );
    }
    outln!("{:<28} {:<12} reason", "transport", "status")?;
    for r in &rows {
        outln!(
            "{:<28} {:<12} {}",
            r.kind,
            if r.available {
                "available"
            } else {
                "unavailable"
            },
            r.reason.as_deref().unwrap_or("")
        )?;
    }
    Ok(())
}

/// `msgr keygen`: a private key file nobody else reads, and its public
/// key appended to a keyring.
fn keygen(
    entity: &EntityName,
    out: &std::path::Path,
    add_to: Option<&std::path::Path>,
) -> Result<(), ToolError> {
    use msgr::auth::{Keyring, StaticKeypair};
    use std::os::unix::fs::OpenOptionsExt;
    let io = |what: String| move |source| ToolError::Io { what, source };
    let kp = StaticKeypair::generate();
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(out)
        .map_err(io(format!(
            "creating {} (never overwritten)",
            out.display()
        )))?;
    f.write_all(kp.to_key_file(entity).as_bytes())
        .map_err(io(format!("writing {}", out.display())))?;
    let line = Keyring::line(entity, &kp.public());
    if let Some(ring) = add_to {
        // The keyring must still parse with the new line (a name listed
        // twice is refused).
        let old = match std::fs::read_to_string(ring) {
            Ok(s) => s,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(io(format!("reading {}", ring.display()))(e)),
        };
        let mut text = old.clone();
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(&line);
        Keyring::parse(&text).map_err(|e| ToolError::Usage(format!("{}: {e}", ring.display())))?;
        std::fs::write(ring, text).map_err(io(format!("writing {}", ring.display())))?;
    }
    write_stdout(|out| out.write_all(line.as_bytes()))
}

fn run(cli: Cli) -> Result<(), ToolError> {
    if let Cmd::Backends { json } = cli.cmd {
        return backends(json);
    }
    if let Cmd::Keygen {
        entity,
        out,
        add_to,
    } = &cli.cmd
    {
        return keygen(entity, out, add_to.as_deref());
    }
    if let Some(n) = &cli.name {
        let _ = net::ENTITY_NAME.set(n.clone());
    }
    let cfg = build_config(&cli)?;
    match cli.cmd {
        Cmd::Backends { .. } | Cmd::Keygen { .. } => Ok(()),
        Cmd::Serve {
            addr,
            duration,
            expose,
            shared,
        } => serve(&cfg, addr.as_deref(), duration, (expose, shared)),
        Cmd::Rma {
            addr,
            handle,
            read,
            out,
            write,
            data,
            from,
            peer,
            checksum,
            repeat,
            ranges,
            timeout,
        } => {
            let target = parse_target(&addr, peer.as_deref())?;
            let cmd = match (read, write) {
                // Any length: longer than one message carries moves in parts.
                (Some((offset, len)), _) => rma::RmaCommand::Read { offset, len, out },
                (None, Some(offset)) => {
                    let bytes = match (data, from) {
                        (Some(bytes), _) => bytes,
                        (None, Some(path)) => std::fs::read(&path)
                            .map_err(|e| ToolError::io(format!("reading {}", path.display()), e))?,
                        (None, None) => {
                            return Err(ToolError::Usage("--write needs --data or --from".into()))
                        }
                    };
                    rma::RmaCommand::Write { offset, bytes }
                }
                (None, None) => return Err(ToolError::Usage("rma needs --read or --write".into())),
            };
            let bytes = rma::run(
                &cfg,
                &target,
                &handle,
                &cmd,
                rma::RunOptions {
                    checksum,
                    repeat,
                    ranges,
                },
                timeout,
            )?;
            match cmd {
                rma::RmaCommand::Read {
                    out: Some(path), ..
                } => {
                    std::fs::write(&path, &bytes)
                        .map_err(|e| ToolError::io(format!("writing {}", path.display()), e))?;
                    outln!("read {} bytes to {}", bytes.len(), path.display())
                }
                rma::RmaCommand::Read { out: None, .. } => {
                    write_stdout(|out| writeln!(out, "{}", rma::to_hex(&bytes)))
                }
                rma::RmaCommand::Write { offset, bytes } => {
                    outln!("wrote {} bytes at offset {offset}", bytes.len())
                }
            }
        }
        Cmd::Ping {
            addr,
            peer,
            size,
            count,
            warmup,
            reply,
            seal,
            timeout,
            samples,
            json,
        } => {
            let target = parse_target(&addr, peer.as_deref())?;
            let opts = PingOpts {
                size: payload_size("--size", size, &cfg)?,
                reply,
                count,
                warmup,
                timeout,
                // The first connection may wait as long as the run.
                connect_timeout: timeout,
                seal,
                samples_to: samples,
            };
            let mut progress = Progress::new(count + warmup, json);
            let r = net::ping(&cfg, &target, &opts, &mut progress)?;
            progress.finish();
            if json {
                outln!(
                    "{}",
                    serde_json::json!({ "target": target.to_string(), "reply": reply, "ping": r })
                )?;
            } else {
                let reply = match reply {
                    Reply::Own => "answered from the server's own buffer",
                    Reply::Echo => "echoed",
                };
                r.print(&format!("msgr ping {target} ({reply})"))?;
            }
            Ok(())
        }
        Cmd::Stream {
            addr,
            peer,
            size,
            count,
            duration,
            driver,
            seal,
            timeout,
            json,
        } => {
            let target = parse_target(&addr, peer.as_deref())?;
            let size = payload_size("--size", size, &cfg)?;
            let limit = match (count, duration) {
                (Some(n), _) => Limit::Count(n),
                (None, Some(d)) if d >= timeout => {
                    return Err(ToolError::Usage(format!(
                        "--duration {:.3} must be below --timeout {:.3}",
                        d.as_secs_f64(),
                        timeout.as_secs_f64()
                    )))
                }
                (None, Some(d)) => Limit::Time(d),
                (None, None) => Limit::Time(Duration::from_secs(3).min(timeout / 2)),
            };
            let opts = StreamOpts {
                size,
                limit,
                driver,
                timeout,
                // The first connection may wait as long as the run.
                connect_timeout: timeout,
                seal,
            };
            let mut progress = Progress::new(0, json);
            let (r, totals) = net::stream(&cfg, &target, &opts, &mut progress)?;
            progress.finish();
            if json {
                outln!(
                    "{}",
                    serde_json::json!({ "target": target.to_string(), "driver": driver, "stream": r, "server_totals": totals })
                )?;
            } else {
                r.print(&format!("msgr stream {target}"))?;
                outln!(
                    "  server has counted {} stream messages ({} bytes) in total",
                    totals.stream_messages,
                    totals.stream_bytes
                )?;
            }
            Ok(())
        }
        Cmd::Bench {
            transport,
            quick,
            rounds,
            only,
            rma,
            driver,
            pin,
            connections,
            conns_window,
            json,
        } => {
            let kind = parse_addr(&bench::loopback_addr(&transport))?.transport;
            if let Availability::Unavailable(reason) = availability(&kind) {
                return Err(ToolError::Usage(format!(
                    "transport {transport} is not usable here: {reason}"
                )));
            }
            let rounds = rounds.unwrap_or(if quick { 1 } else { 3 });
            if rounds == 0 {
                return Err(ToolError::Usage("--rounds must be at least 1".into()));
            }
            let mut parts = if only.is_empty() {
                vec![
                    bench::Part::Latency,
                    bench::Part::Call,
                    bench::Part::Bandwidth,
                    bench::Part::Rate,
                    bench::Part::Secure,
                ]
            } else {
                only
            };
            if rma && !parts.contains(&bench::Part::Rma) {
                parts.push(bench::Part::Rma);
            }
            let opts = bench::BenchOpts {
                transport,
                quick,
                rounds,
                parts,
                driver,
                pin,
                connections: connections.into_iter().map(|c| c as usize).collect(),
                conns_window,
                json,
            };
            let report = bench::run(&cfg, &opts)?;
            if json {
                outln!(
                    "{}",
                    serde_json::to_string_pretty(&report)
                        .map_err(|e| ToolError::io("JSON", std::io::Error::other(e)))?
                )?;
            } else {
                report.print_table()?;
            }
            Ok(())
        }
    }
}

/// One address, or an address vector (`A,B` or `[A,B]`).
fn parse_addrs(text: &str) -> Result<msgr::AddrVec, ToolError> {
    if text.starts_with('[') {
        text.parse::<msgr::AddrVec>()
            .map_err(|source| ToolError::Addr {
                text: text.to_owned(),
                source,
            })
    } else {
        Ok(msgr::AddrVec(
            text.split(',').map(parse_addr).collect::<Result<_, _>>()?,
        ))
    }
}

/// A client's target: its addresses ([`parse_addrs`]), and the entity
/// that must answer there, if named.
fn parse_target(text: &str, peer: Option<&str>) -> Result<net::Target, ToolError> {
    let addrs = parse_addrs(text)?;
    let peer = peer
        .map(|p| {
            p.parse::<msgr::EntityName>()
                .map_err(|e| ToolError::Usage(format!("--peer {p}: {e}")))
        })
        .transpose()?;
    Ok(net::Target { addrs, peer })
}

fn main() {
    // Warnings by default (RUST_LOG chooses otherwise): a checksum
    // mismatch or a failed authentication is news, not debug output.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::builder()
                .with_default_directive(tracing_subscriber::filter::LevelFilter::WARN.into())
                .from_env_lossy(),
        )
        .with_writer(std::io::stderr)
        .try_init();
    let cli = Cli::parse();
    if let Err(e) = run(cli) {
        eprintln!("msgr: error: {e}");
        let mut src = std::error::Error::source(&e);
        while let Some(s) = src {
            // thiserror's transparent/source chains: print causes not already in the message.
            let text = s.to_string();
            if !e.to_string().contains(&text) {
                eprintln!("  caused by: {text}");
            }
            src = s.source();
        }
        std::process::exit(e.exit_code());
    }
}
