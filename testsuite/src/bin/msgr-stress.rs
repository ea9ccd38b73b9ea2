//! msgr-stress: the shared stress workload for soak runs.
//!
//! ```text
//! msgr-stress --duration 60 --backend tcp --servers 4 --clients 16 \
//!     --faults seed=1,fail=20000,corrupt=20000,delay=2000,handshake=50
//! ```
//!
//! Prints a live progress line on stderr, the seed and a summary at the end
//! (or JSON with --json), and exits non-zero on any violation. See
//! docs/STRESS.md.

use std::io::Write as _;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use msgr::{EntityAddr, FaultPlan};
use msgr_testsuite::stress::{
    available_backends, backend_by_name, candidates, cluster, run, run_cluster, run_in_netns,
    Backend, ClusterOptions, NetnsOptions, StressConfig, StressReport, DEFAULT_FAULTS,
};

#[derive(Parser, Debug)]
#[command(
    name = "msgr-stress",
    about = "msgr's shared stress workload (docs/STRESS.md)"
)]
struct Args {
    /// Seconds of workload per backend.
    #[arg(long, default_value_t = 60)]
    duration: u64,
    /// Backend: a name from --list-backends, or `all` (every available one).
    #[arg(long, default_value = "all")]
    backend: String,
    /// Server messengers.
    #[arg(long, default_value_t = 4)]
    servers: usize,
    /// Client messengers (one thread each).
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// Fault plan (`off` for none), e.g. seed=1,fail=20000,corrupt=20000,delay=2000,handshake=50.
    #[arg(long, default_value = DEFAULT_FAULTS)]
    faults: String,
    /// The run's seed (random if not given; always printed).
    #[arg(long)]
    seed: Option<u64>,
    /// Every k-th client is lossy (0 = all lossless).
    #[arg(long, default_value_t = 4)]
    lossy_every: usize,
    /// Mean milliseconds between server restarts (0 = never).
    #[arg(long, default_value_t = 3000)]
    restart_every_ms: u64,
    /// No real transport faults (inject_fault) from clients and the chaos thread.
    #[arg(long)]
    no_real_faults: bool,
    /// Servers also listen on TCP and clients dial an address vector of
    /// both: every link fault moves a session between the two transports.
    #[arg(long)]
    transport_change: bool,
    /// No mark_down operations.
    #[arg(long)]
    no_mark_down: bool,
    /// RMA too: every server exposes a 1 MiB region, clients write and
    /// read back random ranges of their own slice of it (docs/STRESS.md).
    #[arg(long)]
    rma: bool,
    /// Largest message, bytes.
    #[arg(long, default_value_t = 4 << 20)]
    max_message: usize,
    /// Server bind address (repeatable; server i uses the i-th modulo their
    /// number), e.g. tcp://198.51.100.1:0 inside the QEMU guest. Default:
    /// the backend's loopback template.
    #[arg(long)]
    bind: Vec<String>,
    /// Run servers and clients in two network namespaces joined by a veth
    /// pair with nftables drops/resets and link flaps (TCP; needs root, ip, nft).
    #[arg(long)]
    netns: bool,
    /// A messenger configuration key for every messenger of the run, on top
    /// of the suite's short timers (repeatable), e.g.
    /// `--set fabric_cq_wait=poll`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    settings: Vec<String>,
    /// Print the final report as JSON on stdout.
    #[arg(long)]
    json: bool,
    /// No progress line.
    #[arg(long)]
    quiet: bool,
    /// List the backends and whether they are available, then exit.
    #[arg(long)]
    list_backends: bool,
    /// A cluster of N node processes, each in its own network namespace on
    /// a bridge, lossless-peer sessions between all, faults scheduled by the
    /// seed for --duration seconds (TCP; needs root, ip, nft; docs/STRESS.md).
    #[arg(long, value_name = "N")]
    cluster: Option<usize>,
    /// One-way messages per second per cluster node.
    #[arg(long, default_value_t = 500)]
    cluster_rate: u32,
    /// Each cluster call's deadline, ms.
    #[arg(long, default_value_t = 2000)]
    cluster_call_deadline_ms: u64,
    /// Plant a bug in a cluster run (node 0 sends one message twice): the
    /// run must fail with a duplicate.
    #[arg(long)]
    cluster_plant_duplicate: bool,
    /// (Internal) run as node K of a cluster; the parent starts these.
    #[arg(long, hide = true)]
    cluster_node: Option<u32>,
    /// (Internal) the node's incarnation.
    #[arg(long, hide = true, default_value_t = 1)]
    cluster_incarnation: u32,
    /// (Internal) every node's address, comma-separated.
    #[arg(long, hide = true, default_value = "")]
    cluster_addrs: String,
}

/// `--cluster-node`: one node of a cluster run, until its parent says exit.
fn cluster_node(args: &Args, node: u32) -> ExitCode {
    let addrs: Result<Vec<std::net::Ipv4Addr>, _> =
        args.cluster_addrs.split(',').map(str::parse).collect();
    let Ok(addrs) = addrs else {
        eprintln!("msgr-stress: bad --cluster-addrs {}", args.cluster_addrs);
        return ExitCode::from(2);
    };
    if node as usize >= addrs.len() {
        eprintln!(
            "msgr-stress: --cluster-node {node} of {} nodes",
            addrs.len()
        );
        return ExitCode::from(2);
    }
    let node_args = cluster::node::NodeArgs {
        node,
        inc: args.cluster_incarnation,
        addrs,
        port: cluster::NODE_PORT,
        seed: args.seed.unwrap_or(0),
        rate: args.cluster_rate,
        call_deadline: Duration::from_millis(args.cluster_call_deadline_ms),
        plant_duplicate: args.cluster_plant_duplicate,
    };
    let code = cluster::node::run_node(node_args, cluster::cluster_messenger_config());
    ExitCode::from(code.clamp(0, 255) as u8)
}

/// `--cluster N`: the parent of a cluster run.
fn cluster_parent(args: &Args, nodes: usize) -> ExitCode {
    let mut opts = ClusterOptions::new(nodes);
    if let Some(seed) = args.seed {
        opts.seed = seed;
    }
    opts.duration = Duration::from_secs(args.duration);
    opts.rate = args.cluster_rate;
    opts.call_deadline = Duration::from_millis(args.cluster_call_deadline_ms);
    opts.verbose = !args.quiet;
    opts.plant_duplicate = args.cluster_plant_duplicate;
    eprintln!(
        "msgr-stress: cluster of {nodes} nodes, seed {} duration {} s",
        opts.seed, args.duration
    );
    match run_cluster(&opts) {
        Ok(report) => msgr_testsuite::cli::finish(
            &report,
            || report.summary(),
            report.passed(),
            args.json,
            &format!("msgr-stress: FAILED (seed {})", opts.seed),
        ),
        Err(e) => {
            eprintln!("msgr-stress: {e}");
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    msgr_testsuite::cli::init_logging();
    if let Some(node) = args.cluster_node {
        return cluster_node(&args, node);
    }
    if let Some(nodes) = args.cluster {
        return cluster_parent(&args, nodes);
    }
    if args.list_backends {
        for b in candidates() {
            println!(
                "{:<12} {:<28} {:?}",
                b.name,
                b.bind_template,
                b.availability()
            );
        }
        return ExitCode::SUCCESS;
    }
    let backends: Vec<Backend> = if args.backend == "all" {
        available_backends()
    } else {
        match backend_by_name(&args.backend) {
            Some(b) => vec![b],
            None => {
                eprintln!(
                    "msgr-stress: unknown backend {} (see --list-backends)",
                    args.backend
                );
                return ExitCode::from(2);
            }
        }
    };
    let faults: Option<FaultPlan> = if args.faults == "off" || args.faults.is_empty() {
        None
    } else {
        match args.faults.parse() {
            Ok(p) => Some(p),
            Err(e) => {
                eprintln!("msgr-stress: {e}");
                return ExitCode::from(2);
            }
        }
    };
    let mut bind = Vec::new();
    for b in &args.bind {
        match b.parse::<EntityAddr>() {
            Ok(a) => bind.push(a),
            Err(e) => {
                eprintln!("msgr-stress: bad --bind {b}: {e}");
                return ExitCode::from(2);
            }
        }
    }
    let seed = args.seed.unwrap_or_else(rand::random);
    let mut failed = false;
    let mut reports: Vec<StressReport> = Vec::new();
    for backend in backends {
        if let msgr::Availability::Unavailable(why) = backend.availability() {
            eprintln!(
                "msgr-stress: backend {} is not available: {why}",
                backend.name
            );
            failed = true;
            continue;
        }
        let mut cfg = StressConfig::new(backend.clone());
        cfg.seed = seed;
        cfg.duration = Duration::from_secs(args.duration);
        cfg.servers = args.servers.max(1);
        cfg.clients = args.clients.max(1);
        cfg.faults = faults.clone();
        cfg.lossy_every = args.lossy_every;
        cfg.restart_every = Duration::from_millis(args.restart_every_ms);
        cfg.real_faults = !args.no_real_faults;
        cfg.transport_change = args.transport_change;
        cfg.mark_downs = !args.no_mark_down;
        cfg.rma = args.rma;
        cfg.max_message = args.max_message.max(1);
        cfg.bind = bind.clone();
        for setting in &args.settings {
            let applied = match setting.split_once('=') {
                Some((key, value)) => cfg
                    .messenger
                    .set(key.trim(), value)
                    .map_err(|e| e.to_string()),
                None => Err("want KEY=VALUE".to_string()),
            };
            if let Err(e) = applied {
                eprintln!("msgr-stress: --set {setting}: {e}");
                return ExitCode::from(2);
            }
        }
        if !args.quiet {
            cfg.progress = Some(Arc::new(|p| {
                let rss = std::fs::read_to_string("/proc/self/status")
                    .ok()
                    .and_then(|s| {
                        s.lines()
                            .find(|l| l.starts_with("VmRSS:"))
                            .map(|l| l.split_whitespace().nth(1).unwrap_or("?").to_string())
                    })
                    .unwrap_or_default();
                eprint!("\r{} rss {rss} KiB   ", p.line());
                let _ = std::io::stderr().flush();
            }));
        }
        eprintln!(
            "msgr-stress: seed {seed} backend {} servers {} clients {} duration {} s faults {}{}{}{}",
            backend.name,
            cfg.servers,
            cfg.clients,
            args.duration,
            faults.as_ref().map_or("off".to_string(), |p| p.to_string()),
            args.settings
                .iter()
                .map(|s| format!(" --set {s}"))
                .collect::<String>(),
            if args.netns {
                " (network namespaces)"
            } else {
                ""
            },
            if args.rma { " rma" } else { "" }
        );
        let report = if args.netns {
            match run_in_netns(&cfg, &NetnsOptions::default()) {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("msgr-stress: {e}");
                    failed = true;
                    continue;
                }
            }
        } else {
            run(&cfg)
        };
        if !args.quiet {
            eprintln!();
        }
        if !args.json {
            print!("{}", report.summary());
        }
        failed |= !report.passed();
        reports.push(report);
    }
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&reports).expect("reports serialize")
        );
    }
    if failed {
        eprintln!("msgr-stress: FAILED (seed {seed})");
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
