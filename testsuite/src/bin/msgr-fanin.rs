//! msgr-fanin: thousands of lossless clients into one server process.
//!
//! ```text
//! msgr-fanin --connections 10000 --procs 4 --checkpoint 1000 --idle-secs 10
//! ```
//!
//! Prints the time until every session is up, the server's accounted
//! memory and RSS per idle session at each checkpoint, its CPU while they
//! idle and a ping's round trips meanwhile, beside the bars set for them
//! (`stress::fanin::BAR_*`; a table, or JSON with --json). Exits non-zero
//! when a session did not come up, a ping was lost, or the server kept a
//! session or file descriptor after the clients closed; never on the
//! figures. See docs/STRESS.md "Fan-in".

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use msgr_testsuite::stress::fanin::{child_main, run_fan_in, FanInOptions};

#[derive(Parser, Debug)]
#[command(
    name = "msgr-fanin",
    about = "thousands of lossless clients into one server (docs/STRESS.md)"
)]
struct Args {
    /// Lossless client connections in the end.
    #[arg(long, default_value_t = 10_000)]
    connections: usize,
    /// Client processes sharing them.
    #[arg(long, default_value_t = 4)]
    procs: usize,
    /// Also measure memory at this many sessions (repeatable; each opened
    /// as a burst after the one before).
    #[arg(long = "checkpoint", default_values_t = [1000])]
    checkpoints: Vec<usize>,
    /// Seconds the sessions idle while the server's CPU is read.
    #[arg(long, default_value_t = 10)]
    idle_secs: u64,
    /// Milliseconds between the pinger's calls.
    #[arg(long, default_value_t = 20)]
    ping_interval_ms: u64,
    /// Seconds each burst has to bring every session up.
    #[arg(long, default_value_t = 120)]
    up_deadline_secs: u64,
    /// A configuration key for the server messenger (repeatable).
    #[arg(long = "server-set", value_name = "KEY=VALUE")]
    server_settings: Vec<String>,
    /// A configuration key for every client messenger (repeatable), on top
    /// of busy_poll_us=0.
    #[arg(long = "client-set", value_name = "KEY=VALUE")]
    client_settings: Vec<String>,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    json: bool,
    /// No progress lines.
    #[arg(long)]
    quiet: bool,
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some("--fan-in-child") {
        return ExitCode::from(child_main(&argv[2..]).clamp(0, 255) as u8);
    }
    let args = Args::parse();
    msgr_testsuite::cli::init_logging();
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("msgr-fanin: this program's path: {e}");
            return ExitCode::from(2);
        }
    };
    let mut opts = FanInOptions::new(args.connections.max(1), exe);
    opts.procs = args.procs.max(1);
    opts.checkpoints = args.checkpoints;
    opts.idle = Duration::from_secs(args.idle_secs);
    opts.ping_interval = Duration::from_millis(args.ping_interval_ms);
    opts.up_deadline = Duration::from_secs(args.up_deadline_secs);
    opts.server_settings = args.server_settings;
    opts.client_settings.extend(args.client_settings);
    opts.verbose = !args.quiet;
    match run_fan_in(&opts) {
        Ok(report) => msgr_testsuite::cli::finish(
            &report,
            || report.summary(),
            report.passed(),
            args.json,
            "msgr-fanin: FAILED",
        ),
        Err(e) => {
            eprintln!("msgr-fanin: {e}");
            ExitCode::FAILURE
        }
    }
}
