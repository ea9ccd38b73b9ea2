//! Fan-in: thousands of lossless clients into one server process
//! (docs/STRESS.md "Fan-in").
//!
//! The driver (this process) runs the server messenger and spawns the same
//! binary as K client processes and one pinger process, talking to them over
//! their stdin and stdout, one line per step. A messenger holds one session
//! per peer, so a client process holds its share of the connections as one
//! messenger per connection (one worker thread each). The API binds no
//! source address for a dial, so every client dials from 127.0.0.1.
//!
//! At each checkpoint (say 1,000 and then 10,000 sessions) every client
//! process starts its share of the new messengers, then dials all their
//! connections at once; the driver times from the dial until all are up (the clients say so and the server counts them), lets
//! them settle and reads the server's [`Messenger::memory`] and RSS. Then
//! the sessions idle while the server's CPU time is read; the pinger's calls
//! run through all of it on a connection of their own. At the end the
//! clients shut down and the server must be back to its sessions and file
//! descriptors before them. Figures are reported beside their bars, never
//! failed on; what fails a run is a session not up, a ping lost, a session
//! or file descriptor left over, or a child that broke its protocol.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use msgr::{
    Connection, Counters, Dispatcher, EntityAddr, EntityName, Message, Messenger, MessengerConfig,
    NullDispatcher, Policy,
};
use serde::{Deserialize, Serialize};

use super::report::rss_kib;

/// The bars for 10,000 idle sessions: accounted memory per session, bytes.
pub const BAR_ACCOUNTED_PER_SESSION: usize = 8 << 10;
/// RSS per idle session, bytes.
pub const BAR_RSS_PER_SESSION: usize = 16 << 10;
/// Server CPU while they idle, percent of one core.
pub const BAR_IDLE_CPU_PCT: f64 = 5.0;

/// The pinger's message type; the server echoes it.
const PING_TYPE: u16 = 0x5049;
/// A ping not answered by then is lost.
const PING_DEADLINE: Duration = Duration::from_secs(30);
/// Clock ticks per second of `/proc/self/stat` times (`USER_HZ`).
const TICKS_PER_SECOND: u64 = 100;

/// What a fan-in run does.
#[derive(Clone, Debug)]
pub struct FanInOptions {
    /// Lossless client connections in the end.
    pub connections: usize,
    /// Client processes sharing them.
    pub procs: usize,
    /// Session counts at which memory is measured, besides `connections`
    /// (each opened as one burst after the one before it).
    pub checkpoints: Vec<usize>,
    /// How long the sessions idle while the server's CPU time is read.
    pub idle: Duration,
    /// Pause between the pinger's calls.
    pub ping_interval: Duration,
    /// Bound of each burst: every session up by then.
    pub up_deadline: Duration,
    /// Bound of the end: clients shut down, the server back to where it was.
    pub close_deadline: Duration,
    /// The binary to run as clients and pinger (it must call
    /// [`child_main`] when given `--fan-in-child`).
    pub exe: PathBuf,
    /// Configuration keys for the server messenger, on its defaults.
    pub server_settings: Vec<String>,
    /// Configuration keys for each client and the pinger's messenger, on
    /// the defaults.
    pub client_settings: Vec<String>,
    /// Progress lines on stderr.
    pub verbose: bool,
}

impl FanInOptions {
    /// `connections` over 4 client processes, memory also at 1,000 when
    /// more, 10 s of idling. Clients do not busy-poll (`busy_poll_us=0`):
    /// thousands of spinning client workers would take the cores the
    /// server is measured on.
    pub fn new(connections: usize, exe: PathBuf) -> Self {
        FanInOptions {
            connections,
            procs: 4,
            checkpoints: vec![1000],
            idle: Duration::from_secs(10),
            ping_interval: Duration::from_millis(20),
            up_deadline: Duration::from_secs(120),
            close_deadline: Duration::from_secs(60),
            exe,
            server_settings: Vec::new(),
            client_settings: vec!["busy_poll_us=0".into()],
            verbose: false,
        }
    }

    /// The run's hard bound: a child outliving it exits by itself.
    fn life(&self) -> Duration {
        let bursts = self.checkpoints.len() as u32 + 1;
        self.up_deadline * bursts + self.idle + self.close_deadline * 2 + Duration::from_secs(60)
    }
}

/// The server at one checkpoint, the sessions idle.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Checkpoint {
    /// Client sessions up.
    pub sessions: usize,
    /// Milliseconds from the burst's start until every one was up.
    pub up_ms: u64,
    /// [`msgr::MemoryUse::per_session`]: accounted bytes per session.
    pub accounted_per_session: usize,
    /// Accounted bytes more than before the clients, per client session.
    pub accounted_delta_per_session: usize,
    /// Of `accounted_per_session`: session state (engine, queues, slot).
    pub session_bytes_per_session: usize,
    /// Of `accounted_per_session`: the link's buffers and structure.
    pub link_bytes_per_session: usize,
    /// Server RSS, KiB.
    pub rss_kib: u64,
    /// RSS bytes more than before the clients, per client session.
    pub rss_delta_per_session: usize,
    /// Open file descriptors of the server process.
    pub fds: usize,
}

/// The pinger's round trips in one phase.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct PingStats {
    /// Calls answered.
    pub answered: usize,
    /// Calls that failed or came back wrong.
    pub lost: usize,
    /// Median round trip, µs.
    pub p50_us: u64,
    /// 99th percentile, µs.
    pub p99_us: u64,
    /// Slowest, µs.
    pub max_us: u64,
    /// The first failure, if any.
    pub first_error: Option<String>,
}

/// What client processes' sessions went through until the close, and how
/// the close went, summed.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ClientClose {
    /// Link faults (a link ended under an open session).
    pub link_faults: u64,
    /// Links ended for silence.
    pub keepalive_timeouts: u64,
    /// Sessions resumed on a new link.
    pub reconnects: u64,
    /// Connections not open when the close began.
    pub not_open: u64,
    /// Messages not delivered at the close.
    pub undelivered: u64,
    /// Sessions still open at the shutdown deadline, closed forcibly
    /// (the server is not told: its lossless session lingers).
    pub forced_sessions: u64,
    /// Links still closing at the deadline, aborted.
    pub aborted_links: u64,
}

impl ClientClose {
    fn add(&mut self, o: &ClientClose) {
        self.link_faults += o.link_faults;
        self.keepalive_timeouts += o.keepalive_timeouts;
        self.reconnects += o.reconnects;
        self.not_open += o.not_open;
        self.undelivered += o.undelivered;
        self.forced_sessions += o.forced_sessions;
        self.aborted_links += o.aborted_links;
    }
}

/// What a fan-in run measured and found.
#[derive(Clone, Debug, Default, Serialize)]
pub struct FanInReport {
    /// Client connections asked for.
    pub connections: usize,
    /// Client processes.
    pub procs: usize,
    /// Where the clients dialed from.
    pub source: String,
    /// The server at each checkpoint.
    pub checkpoints: Vec<Checkpoint>,
    /// Seconds the sessions idled.
    pub idle_secs: f64,
    /// Server CPU while they idled, percent of one core.
    pub idle_cpu_pct: f64,
    /// 1-minute load average after the idle phase (what else ran).
    pub loadavg: f64,
    /// Pings while the bursts connected.
    pub ping_connecting: PingStats,
    /// Pings while the sessions idled.
    pub ping_idle: PingStats,
    /// Server counters: handshakes closed to make room / refused / that
    /// waited for a slot (a burst beyond the per-source share).
    pub handshakes_evicted: u64,
    /// See `handshakes_evicted`.
    pub handshakes_refused: u64,
    /// See `handshakes_evicted`.
    pub handshakes_waited: u64,
    /// Keepalives that timed out on the server.
    pub keepalive_timeouts: u64,
    /// Server file descriptors before the clients and after they closed.
    pub fds_before: usize,
    /// See `fds_before`.
    pub fds_after: usize,
    /// Server sessions left after the clients closed.
    pub sessions_after: usize,
    /// Milliseconds from the clients' close until the server was back.
    pub close_ms: u64,
    /// What the client processes' sessions went through, and their close.
    pub clients: ClientClose,
    /// What went wrong; empty when the run passed.
    pub violations: Vec<String>,
}

impl FanInReport {
    /// No violations.
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }

    /// A table of the figures with their bars, and the violations.
    pub fn summary(&self) -> String {
        let mut s = format!(
            "fan-in: {} lossless connections from {} processes (source {})\n",
            self.connections, self.procs, self.source
        );
        s += "sessions    up ms   accounted B/session (delta)   RSS delta B/session   RSS KiB     fds\n";
        for c in &self.checkpoints {
            s += &format!(
                "{:>8} {:>8}   {:>9} ({:>9})             {:>10}   {:>10} {:>7}\n",
                c.sessions,
                c.up_ms,
                c.accounted_per_session,
                c.accounted_delta_per_session,
                c.rss_delta_per_session,
                c.rss_kib,
                c.fds
            );
        }
        if let Some(last) = self.checkpoints.last() {
            s += &format!(
                "bars at {}: accounted {} (session {} + link {}) <= {} B {}, RSS {} <= {} B {}\n",
                last.sessions,
                last.accounted_per_session,
                last.session_bytes_per_session,
                last.link_bytes_per_session,
                BAR_ACCOUNTED_PER_SESSION,
                verdict(last.accounted_per_session <= BAR_ACCOUNTED_PER_SESSION),
                last.rss_delta_per_session,
                BAR_RSS_PER_SESSION,
                verdict(last.rss_delta_per_session <= BAR_RSS_PER_SESSION),
            );
        }
        s += &format!(
            "idle {:.0} s: server CPU {:.1}% of a core (bar {BAR_IDLE_CPU_PCT}%: {}), load average {:.2}\n",
            self.idle_secs,
            self.idle_cpu_pct,
            verdict(self.idle_cpu_pct <= BAR_IDLE_CPU_PCT),
            self.loadavg
        );
        for (phase, p) in [
            ("connecting", &self.ping_connecting),
            ("idle", &self.ping_idle),
        ] {
            s += &format!(
                "ping while {phase:<10}: {} answered, {} lost, p50 {} us, p99 {} us, max {} us\n",
                p.answered, p.lost, p.p50_us, p.p99_us, p.max_us
            );
        }
        s += &format!(
            "handshakes evicted {} refused {} waited {}, keepalive timeouts {}; closed in {} ms: sessions left {}, fds {} -> {}\n",
            self.handshakes_evicted,
            self.handshakes_refused,
            self.handshakes_waited,
            self.keepalive_timeouts,
            self.close_ms,
            self.sessions_after,
            self.fds_before,
            self.fds_after
        );
        let c = &self.clients;
        s += &format!(
            "clients: link faults {}, keepalive timeouts {}, reconnects {}, not open at the close {}; closed forcibly {}, links aborted {}\n",
            c.link_faults, c.keepalive_timeouts, c.reconnects, c.not_open, c.forced_sessions, c.aborted_links
        );
        for v in &self.violations {
            s += &format!("VIOLATION: {v}\n");
        }
        s
    }
}

fn verdict(met: bool) -> &'static str {
    if met {
        "met"
    } else {
        "NOT met"
    }
}

/// Why a fan-in run could not run at all.
#[derive(Debug, thiserror::Error)]
pub enum FanInError {
    /// The server messenger did not start.
    #[error("server: {0}")]
    Server(#[from] msgr::MessengerError),
    /// A configuration key was refused.
    #[error("--set {0}")]
    Setting(String),
    /// A child process could not be started.
    #[error("spawning {0}: {1}")]
    Spawn(PathBuf, std::io::Error),
}

/// Why the driver gave up on a run midway (reported as a violation).
#[derive(Debug, thiserror::Error)]
enum DriveError {
    /// A command could not be written to a child.
    #[error("child {child}: {source}")]
    Tell {
        child: usize,
        source: std::io::Error,
    },
    /// Not every child answered by the deadline.
    #[error("{said} of {of} children said `{word}` in time")]
    Late {
        said: usize,
        of: usize,
        word: String,
    },
    /// Every child's stdout closed.
    #[error("every child's output closed")]
    OutputClosed,
    /// A child answered something else.
    #[error("child {child} said `{line}`, not `{word}`")]
    Unexpected {
        child: usize,
        line: String,
        word: String,
    },
    /// The sessions of a checkpoint did not all come up.
    #[error("{up} of {target} sessions up on the server after {up_ms} ms")]
    NotUp {
        up: usize,
        target: usize,
        up_ms: u64,
    },
    /// Sessions went down while idling.
    #[error("{up} of {target} sessions still up after idling")]
    DroppedIdling { up: usize, target: usize },
    /// The pinger's figures did not parse.
    #[error("the pinger's figures: {0}")]
    PingFigures(serde_json::Error),
    /// A client process's close figures did not parse.
    #[error("client process {child}'s close: {source}")]
    CloseFigures {
        child: usize,
        source: serde_json::Error,
    },
    /// Sessions outlived the clients' close.
    #[error("{sessions} sessions left on the server after the clients closed: {left}; the clients: {clients:?}")]
    Lingering {
        sessions: usize,
        /// A few of them, with their phase and last fault.
        left: String,
        clients: ClientClose,
    },
}

/// Why a child process failed (printed to the driver and to stderr).
#[derive(Debug, thiserror::Error)]
enum ChildError {
    /// No role argument.
    #[error("no role")]
    NoRole,
    /// An option without its value.
    #[error("{0} without a value")]
    NoValue(String),
    /// A number that did not parse.
    #[error("{key} {value}: {source}")]
    Number {
        key: String,
        value: String,
        source: std::num::ParseIntError,
    },
    /// The server's address did not parse.
    #[error("--server {value}: {source}")]
    Server {
        value: String,
        source: msgr::AddrParseError,
    },
    /// An argument not known.
    #[error("unknown argument {0}")]
    UnknownArgument(String),
    /// A role not known.
    #[error("unknown role {0}")]
    UnknownRole(String),
    /// The driver said nothing more before the child's life ended.
    #[error("no word from the driver within its life")]
    Silent,
    /// The pinger got no `stop` before its life ended.
    #[error("no `stop` from the driver within its life")]
    NoStop,
    /// The driver closed the child's stdin.
    #[error("the driver closed its side")]
    DriverGone,
    /// A command not known.
    #[error("unknown command `{0}`")]
    UnknownCommand(String),
    /// Writing to the driver failed.
    #[error("stdout: {0}")]
    Stdout(std::io::Error),
    /// `start M` with a bad count.
    #[error("start {value}: {source}")]
    Start {
        value: String,
        source: std::num::ParseIntError,
    },
    /// A client messenger did not start.
    #[error("messenger {id}: {source}")]
    ClientMessenger {
        id: u64,
        source: msgr::MessengerError,
    },
    /// The pinger's messenger did not start.
    #[error("messenger: {0}")]
    PingerMessenger(msgr::MessengerError),
    /// Dialling the server failed.
    #[error("connect: {0}")]
    Dial(msgr::MessengerError),
    /// The pinger's connection did not come up.
    #[error("connect: {0}")]
    PingerConnect(msgr::ConnectError),
    /// A client connection did not come up.
    #[error("connection {n} of {of}: {source}")]
    Connect {
        n: usize,
        of: usize,
        source: msgr::ConnectError,
    },
    /// The figures did not serialize.
    #[error("figures: {0}")]
    Figures(serde_json::Error),
}

/// A messenger configuration: the defaults with `settings` (`KEY=VALUE`)
/// on top.
fn configured(settings: &[String]) -> Result<MessengerConfig, FanInError> {
    let mut cfg = MessengerConfig::default();
    for s in settings {
        let (k, v) = s
            .split_once('=')
            .ok_or_else(|| FanInError::Setting(format!("{s}: want KEY=VALUE")))?;
        cfg.set(k.trim(), v)
            .map_err(|e| FanInError::Setting(format!("{s}: {e}")))?;
    }
    Ok(cfg)
}

/// Raises this process's soft open-file limit to `want` (or its hard
/// limit, if lower); the limit it has now.
pub fn raise_nofile(want: u64) -> u64 {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return 0;
    };
    let target = want.min(hard);
    if soft >= target || setrlimit(Resource::RLIMIT_NOFILE, target, hard).is_err() {
        return soft;
    }
    target
}

/// Open file descriptors of this process.
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

/// CPU time (user + system) this process used, in clock ticks.
fn cpu_ticks() -> u64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0;
    };
    // The command name may hold spaces: count fields after its ')'.
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
    // utime and stime: fields 14 and 15 of the line, 12 and 13 after ')'.
    field(11).unwrap_or(0) + field(12).unwrap_or(0)
}

/// The server's dispatcher: answers each ping with its own bytes.
struct Echo;

impl Dispatcher for Echo {
    fn on_message(&self, conn: &Connection, msg: Message) {
        if msg.msg_type == PING_TYPE {
            let _ = conn.reply(&msg, Message::new(PING_TYPE, msg.front.clone(), Vec::new()));
        }
    }
}

/// The driver's view of its children: their stdin, and one channel of
/// their stdout lines.
struct Children {
    procs: Vec<Child>,
    stdins: Vec<ChildStdin>,
    lines: Receiver<(usize, String)>,
}

impl Children {
    fn spawn(opts: &FanInOptions, args: &[Vec<String>]) -> Result<Children, FanInError> {
        let (tx, lines) = mpsc::channel();
        let mut procs = Vec::new();
        let mut stdins = Vec::new();
        for (i, a) in args.iter().enumerate() {
            let mut child = Command::new(&opts.exe)
                .args(a)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .map_err(|e| FanInError::Spawn(opts.exe.clone(), e))?;
            stdins.push(child.stdin.take().expect("piped stdin"));
            let out = child.stdout.take().expect("piped stdout");
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    if tx.send((i, line)).is_err() {
                        break;
                    }
                }
            });
            procs.push(child);
        }
        Ok(Children {
            procs,
            stdins,
            lines,
        })
    }

    /// Sends `line` to child `i`.
    fn tell(&mut self, i: usize, line: &str) -> Result<(), DriveError> {
        writeln!(self.stdins[i], "{line}")
            .and_then(|_| self.stdins[i].flush())
            .map_err(|source| DriveError::Tell { child: i, source })
    }

    /// One line from each child in `from`, each starting with `word`, by
    /// `deadline`: the rest of each line, by child.
    fn answers(
        &self,
        from: &[usize],
        word: &str,
        deadline: Instant,
    ) -> Result<Vec<(usize, String)>, DriveError> {
        let mut got: Vec<(usize, String)> = Vec::new();
        while got.len() < from.len() {
            let left = deadline.saturating_duration_since(Instant::now());
            let (i, line) = match self.lines.recv_timeout(left) {
                Ok(l) => l,
                Err(RecvTimeoutError::Timeout) => {
                    return Err(DriveError::Late {
                        said: got.len(),
                        of: from.len(),
                        word: word.into(),
                    })
                }
                Err(RecvTimeoutError::Disconnected) => return Err(DriveError::OutputClosed),
            };
            match line.split_once(' ') {
                Some((w, rest)) if w == word && from.contains(&i) => got.push((i, rest.into())),
                _ if line == word && from.contains(&i) => got.push((i, String::new())),
                _ => {
                    return Err(DriveError::Unexpected {
                        child: i,
                        line,
                        word: word.into(),
                    })
                }
            }
        }
        Ok(got)
    }

    /// Waits for every child to exit by `deadline`, then kills the rest:
    /// the children that did not exit cleanly.
    fn reap(&mut self, deadline: Instant) -> Vec<String> {
        self.stdins.clear();
        let mut bad = Vec::new();
        for (i, c) in self.procs.iter_mut().enumerate() {
            loop {
                match c.try_wait() {
                    Ok(Some(st)) if st.success() => break,
                    Ok(Some(st)) => {
                        bad.push(format!("child {i} exited with {st}"));
                        break;
                    }
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(20))
                    }
                    _ => {
                        let _ = c.kill();
                        let _ = c.wait();
                        bad.push(format!("child {i} did not exit: killed"));
                        break;
                    }
                }
            }
        }
        bad
    }
}

/// Polls `done` every 10 ms until it holds or `deadline` passes.
fn wait_until(deadline: Instant, mut done: impl FnMut() -> bool) -> bool {
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Runs a fan-in: see the module docs. Errors only when it cannot start;
/// everything found wrong later is a violation in the report.
pub fn run_fan_in(opts: &FanInOptions) -> Result<FanInReport, FanInError> {
    let n = opts.connections;
    let procs = opts.procs.clamp(1, n.max(1));
    // Each session: a socket here; a socket, an epoll and an eventfd there.
    raise_nofile((n + 1024) as u64);
    let mut server = Messenger::builder(EntityName::server(1))
        .config(configured(&opts.server_settings)?)
        .bind("tcp://127.0.0.1:0".parse().expect("an address"))
        .start(Arc::new(Echo))?;
    let addr = server.addr().expect("bound").to_string();
    let mut report = FanInReport {
        connections: n,
        procs,
        source: "127.0.0.1 (the API binds no source address for a dial)".into(),
        fds_before: open_fds(),
        ..FanInReport::default()
    };
    let life = opts.life().as_secs().to_string();
    let settings: Vec<String> = opts
        .client_settings
        .iter()
        .flat_map(|s| ["--set".to_string(), s.clone()])
        .collect();
    let child_args = |role: &str, first_id: usize| -> Vec<String> {
        let mut a = vec![
            "--fan-in-child".to_string(),
            role.to_string(),
            "--server".into(),
            addr.clone(),
            "--first-id".into(),
            first_id.to_string(),
            "--life-secs".into(),
            life.clone(),
            "--ping-interval-ms".into(),
            opts.ping_interval.as_millis().to_string(),
        ];
        a.extend(settings.iter().cloned());
        a
    };
    // Clients 0..procs, the pinger last; client ids never overlap.
    let mut args: Vec<Vec<String>> = (0..procs)
        .map(|p| child_args("client", 1 + p * n))
        .collect();
    args.push(child_args("pinger", 0));
    let pinger = procs;
    let clients: Vec<usize> = (0..procs).collect();
    let mut kids = Children::spawn(opts, &args)?;
    let say = |what: &str| {
        if opts.verbose {
            eprintln!("msgr-fanin: {what}");
        }
    };
    let result = drive(
        opts,
        &mut server,
        &mut kids,
        &clients,
        pinger,
        &mut report,
        &say,
    );
    if let Err(v) = result {
        report.violations.push(v.to_string());
    }
    let end = Instant::now() + opts.close_deadline;
    report.violations.extend(kids.reap(end));
    drop(kids);
    // Back to where it was: no session, no descriptor left from them.
    let fds_before = report.fds_before;
    let back = wait_until(end, || {
        server.memory().sessions == 0 && open_fds() <= fds_before
    });
    report.sessions_after = server.memory().sessions;
    report.fds_after = open_fds();
    if !back {
        report.violations.push(format!(
            "after the clients closed the server holds {} sessions and {} file descriptors ({} before them)",
            report.sessions_after, report.fds_after, report.fds_before
        ));
    }
    let c = server.counters();
    report.handshakes_evicted = Counters::get(&c.handshakes_evicted);
    report.handshakes_refused = Counters::get(&c.handshakes_refused);
    report.handshakes_waited = Counters::get(&c.handshakes_waited);
    report.keepalive_timeouts = Counters::get(&c.keepalive_timeouts);
    server.shutdown(Duration::from_secs(5));
    Ok(report)
}

/// The run's steps between spawning the children and reaping them; the
/// first step that breaks ends it.
fn drive(
    opts: &FanInOptions,
    server: &mut Messenger,
    kids: &mut Children,
    clients: &[usize],
    pinger: usize,
    report: &mut FanInReport,
    say: &dyn Fn(&str),
) -> Result<(), DriveError> {
    kids.answers(&[pinger], "ready", Instant::now() + opts.up_deadline)?;
    kids.tell(pinger, "phase connecting")?;
    // The baseline: the pinger's session alone.
    std::thread::sleep(Duration::from_millis(200));
    let base_mem = server.memory();
    let base_accounted = base_mem.session_bytes + base_mem.link_buffer_bytes;
    let base_rss = rss_kib();
    let mut targets: Vec<usize> = opts
        .checkpoints
        .iter()
        .copied()
        .filter(|&c| c > 0 && c < opts.connections)
        .collect();
    targets.sort_unstable();
    targets.dedup();
    targets.push(opts.connections);
    let mut opened = 0;
    for &target in &targets {
        let burst = target - opened;
        for (k, &c) in clients.iter().enumerate() {
            // An even share; the first processes take the remainder.
            let share = burst / clients.len() + usize::from(k < burst % clients.len());
            kids.tell(c, &format!("start {share}"))?;
        }
        // Their messengers (a thread each) first, not timed.
        kids.answers(clients, "started", Instant::now() + opts.up_deadline)?;
        say(&format!(
            "dialing {burst} connections at once ({target} in all)"
        ));
        let started = Instant::now();
        let deadline = started + opts.up_deadline;
        for &c in clients {
            kids.tell(c, "dial")?;
        }
        kids.answers(clients, "up", deadline)?;
        // The pinger's session and the clients'.
        let all_up = wait_until(deadline, || server.memory().sessions == target + 1);
        let up_ms = started.elapsed().as_millis() as u64;
        if !all_up {
            return Err(DriveError::NotUp {
                up: server.memory().sessions.saturating_sub(1),
                target,
                up_ms,
            });
        }
        opened = target;
        // Handshake buffers given back, the allocator settled.
        std::thread::sleep(Duration::from_secs(1));
        let mem = server.memory();
        let rss = rss_kib();
        let accounted = mem.session_bytes + mem.link_buffer_bytes;
        let cp = Checkpoint {
            sessions: target,
            up_ms,
            accounted_per_session: mem.per_session(),
            accounted_delta_per_session: accounted.saturating_sub(base_accounted) / target,
            session_bytes_per_session: mem.session_bytes / mem.sessions.max(1),
            link_bytes_per_session: mem.link_buffer_bytes / mem.sessions.max(1),
            rss_kib: rss,
            rss_delta_per_session: (rss.saturating_sub(base_rss) as usize * 1024) / target,
            fds: open_fds(),
        };
        say(&format!(
            "{target} up in {up_ms} ms: {} B accounted, {} B RSS per session",
            cp.accounted_per_session, cp.rss_delta_per_session
        ));
        report.checkpoints.push(cp);
    }
    kids.tell(pinger, "phase idle")?;
    say(&format!("idling {} s", opts.idle.as_secs_f64()));
    let (t0, ticks0) = (Instant::now(), cpu_ticks());
    std::thread::sleep(opts.idle);
    let (secs, ticks) = (t0.elapsed().as_secs_f64(), cpu_ticks() - ticks0);
    report.idle_secs = secs;
    report.idle_cpu_pct = ticks as f64 * 100.0 / TICKS_PER_SECOND as f64 / secs;
    report.loadavg = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN);
    if server.memory().sessions != opts.connections + 1 {
        return Err(DriveError::DroppedIdling {
            up: server.memory().sessions.saturating_sub(1),
            target: opts.connections,
        });
    }
    kids.tell(pinger, "stop")?;
    let pings = kids.answers(&[pinger], "pings", Instant::now() + PING_DEADLINE * 2)?;
    let (connecting, idle): (PingStats, PingStats) =
        serde_json::from_str(&pings[0].1).map_err(DriveError::PingFigures)?;
    for (phase, p) in [("connecting", &connecting), ("idle", &idle)] {
        if p.lost > 0 || p.answered == 0 {
            report.violations.push(format!(
                "pings while {phase}: {} lost of {} ({})",
                p.lost,
                p.lost + p.answered,
                p.first_error.as_deref().unwrap_or("none answered")
            ));
        }
    }
    (report.ping_connecting, report.ping_idle) = (connecting, idle);
    say("closing");
    let closing = Instant::now();
    for &c in clients {
        kids.tell(c, "close")?;
    }
    for (i, line) in kids.answers(clients, "closed", closing + opts.close_deadline)? {
        let c: ClientClose = serde_json::from_str(&line)
            .map_err(|source| DriveError::CloseFigures { child: i, source })?;
        if c.undelivered > 0 {
            report.violations.push(format!(
                "client process {i}: {} messages undelivered",
                c.undelivered
            ));
        }
        report.clients.add(&c);
    }
    let closed = wait_until(closing + opts.close_deadline, || {
        server.memory().sessions == 0
    });
    report.close_ms = closing.elapsed().as_millis() as u64;
    if !closed {
        // Which, and in what state: a lossless server session whose
        // client left without closing it waits `server_linger` for it.
        let left: Vec<String> = server
            .connections()
            .iter()
            .take(8)
            .map(|c| {
                let st = c.status();
                format!("{} {} ({:?})", c.target(), st.phase, st.last_fault)
            })
            .collect();
        return Err(DriveError::Lingering {
            sessions: server.memory().sessions,
            left: left.join(", "),
            clients: report.clients.clone(),
        });
    }
    Ok(())
}

/// A child's arguments (`--fan-in-child ROLE ...`, from the driver).
#[derive(Debug)]
struct ChildArgs {
    role: String,
    server: EntityAddr,
    first_id: u64,
    life: Duration,
    ping_interval: Duration,
    settings: Vec<String>,
}

fn parse_child(args: &[String]) -> Result<ChildArgs, ChildError> {
    let mut it = args.iter();
    let mut c = ChildArgs {
        role: it.next().cloned().ok_or(ChildError::NoRole)?,
        server: EntityAddr::tcp(([127, 0, 0, 1], 0).into()),
        first_id: 0,
        life: Duration::from_secs(600),
        ping_interval: Duration::from_millis(20),
        settings: Vec::new(),
    };
    while let Some(k) = it.next() {
        let v = it.next().ok_or_else(|| ChildError::NoValue(k.clone()))?;
        let num = || {
            v.parse::<u64>().map_err(|source| ChildError::Number {
                key: k.clone(),
                value: v.clone(),
                source,
            })
        };
        match k.as_str() {
            "--server" => {
                c.server = v.parse().map_err(|source| ChildError::Server {
                    value: v.clone(),
                    source,
                })?
            }
            "--first-id" => c.first_id = num()?,
            "--life-secs" => c.life = Duration::from_secs(num()?),
            "--ping-interval-ms" => c.ping_interval = Duration::from_millis(num()?),
            "--set" => c.settings.push(v.clone()),
            _ => return Err(ChildError::UnknownArgument(k.clone())),
        }
    }
    Ok(c)
}

/// A child process: `args` are what followed `--fan-in-child`. Returns the
/// exit code.
pub fn child_main(args: &[String]) -> i32 {
    let c = match parse_child(args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("msgr-fanin child: {e}");
            return 2;
        }
    };
    let cfg = match configured(&c.settings) {
        Ok(cfg) => cfg,
        Err(e) => {
            eprintln!("msgr-fanin child: {e}");
            return 2;
        }
    };
    // The driver's commands, one a line; a closed stdin ends the child.
    let (tx, commands) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + c.life;
    // Owned here, so that a failure can exit without dropping them: each
    // drop is a shutdown with a deadline of its own, thousands in a row.
    let mut held = Vec::new();
    let outcome = match c.role.as_str() {
        "client" => client(&c, cfg, &commands, deadline, &mut held),
        "pinger" => pinger(&c, cfg, &commands, deadline),
        other => Err(ChildError::UnknownRole(other.into())),
    };
    match outcome {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("msgr-fanin {} {}: {e}", c.role, c.first_id);
            println!("failed {e}");
            std::process::exit(1);
        }
    }
}

/// The next command by `deadline`.
fn next_command(commands: &Receiver<String>, deadline: Instant) -> Result<String, ChildError> {
    match commands.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        Ok(line) => Ok(line),
        Err(RecvTimeoutError::Timeout) => Err(ChildError::Silent),
        Err(RecvTimeoutError::Disconnected) => Err(ChildError::DriverGone),
    }
}

/// Prints one line to the driver.
fn answer(line: &str) -> Result<(), ChildError> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")
        .and_then(|_| out.flush())
        .map_err(ChildError::Stdout)
}

/// A client process: `start M` starts M more messengers; `dial` opens a
/// lossless connection from each of them, all dialed before any is waited
/// for; `close` shuts them all down.
fn client(
    c: &ChildArgs,
    cfg: MessengerConfig,
    commands: &Receiver<String>,
    deadline: Instant,
    held: &mut Vec<(Messenger, Connection)>,
) -> Result<(), ChildError> {
    raise_nofile(1 << 20);
    let mut fresh: Vec<Messenger> = Vec::new();
    loop {
        let line = next_command(commands, deadline)?;
        if let Some(m) = line.strip_prefix("start ") {
            let m: usize = m.parse().map_err(|source| ChildError::Start {
                value: m.into(),
                source,
            })?;
            for _ in 0..m {
                let id = c.first_id + (held.len() + fresh.len()) as u64;
                let msgr = Messenger::builder(EntityName::client(id))
                    .config(cfg.clone())
                    .start(Arc::new(NullDispatcher))
                    .map_err(|source| ChildError::ClientMessenger { id, source })?;
                fresh.push(msgr);
            }
            answer("started")?;
        } else if line == "dial" {
            let first = held.len();
            let started = Instant::now();
            for msgr in fresh.drain(..) {
                let conn = msgr
                    .connect_with(&c.server, Policy::LosslessClient)
                    .map_err(ChildError::Dial)?;
                held.push((msgr, conn));
            }
            for (i, (_, conn)) in held[first..].iter().enumerate() {
                conn.wait_connected(deadline.saturating_duration_since(Instant::now()))
                    .map_err(|source| ChildError::Connect {
                        n: i + 1,
                        of: held.len() - first,
                        source,
                    })?;
            }
            answer(&format!("up {}", started.elapsed().as_millis()))?;
        } else if line == "close" {
            // What the sessions went through before the close, then the
            // close itself, on a few threads: each shutdown joins a worker.
            let mut sum = ClientClose::default();
            for (msgr, conn) in held.iter() {
                let c = msgr.counters();
                sum.link_faults += Counters::get(&c.link_faults);
                sum.keepalive_timeouts += Counters::get(&c.keepalive_timeouts);
                sum.reconnects += Counters::get(&c.reconnects);
                sum.not_open += u64::from(conn.state() != msgr::ConnectionState::Open);
            }
            let per = held.len().div_ceil(8).max(1);
            let reports = std::sync::Mutex::new(Vec::new());
            std::thread::scope(|s| {
                for part in held.chunks_mut(per) {
                    let reports = &reports;
                    s.spawn(move || {
                        for (msgr, _) in part {
                            let r = msgr.shutdown(Duration::from_secs(5));
                            reports.lock().expect("no panic holds it").push(r);
                        }
                    });
                }
            });
            for r in reports.into_inner().expect("no panic held it") {
                sum.undelivered += r.undelivered;
                sum.forced_sessions += r.forced_sessions as u64;
                sum.aborted_links += r.aborted_links as u64;
            }
            let line = serde_json::to_string(&sum).map_err(ChildError::Figures)?;
            return answer(&format!("closed {line}"));
        } else {
            return Err(ChildError::UnknownCommand(line));
        }
    }
}

/// Round trips of one phase, nanoseconds, and its failures.
#[derive(Default)]
struct Phase {
    rtt_ns: Vec<u64>,
    lost: usize,
    first_error: Option<String>,
}

impl Phase {
    fn stats(mut self) -> PingStats {
        self.rtt_ns.sort_unstable();
        let at = |q: f64| -> u64 {
            let n = self.rtt_ns.len();
            if n == 0 {
                return 0;
            }
            self.rtt_ns[((q * n as f64).ceil() as usize).clamp(1, n) - 1] / 1000
        };
        PingStats {
            answered: self.rtt_ns.len(),
            lost: self.lost,
            p50_us: at(0.50),
            p99_us: at(0.99),
            max_us: at(1.0),
            first_error: self.first_error,
        }
    }
}

/// The pinger process: one lossless connection; a call every interval,
/// its round trip counted in the phase the driver last named
/// (`phase connecting`, `phase idle`); `stop` prints both phases' figures.
fn pinger(
    c: &ChildArgs,
    cfg: MessengerConfig,
    commands: &Receiver<String>,
    deadline: Instant,
) -> Result<(), ChildError> {
    let mut msgr = Messenger::builder(EntityName::client(c.first_id))
        .config(cfg)
        .start(Arc::new(NullDispatcher))
        .map_err(ChildError::PingerMessenger)?;
    let conn = msgr
        .connect_with(&c.server, Policy::LosslessClient)
        .map_err(ChildError::Dial)?;
    conn.wait_connected(deadline.saturating_duration_since(Instant::now()))
        .map_err(ChildError::PingerConnect)?;
    answer("ready")?;
    // Pings before the first phase is named are not counted.
    let mut phases: [Phase; 2] = Default::default();
    let mut current: Option<usize> = None;
    let mut seq: u64 = 0;
    loop {
        if Instant::now() >= deadline {
            return Err(ChildError::NoStop);
        }
        match commands.try_recv() {
            Ok(line) if line == "stop" => break,
            Ok(line) if line == "phase connecting" => current = Some(0),
            Ok(line) if line == "phase idle" => current = Some(1),
            Ok(line) => return Err(ChildError::UnknownCommand(line)),
            Err(mpsc::TryRecvError::Empty) => {}
            Err(mpsc::TryRecvError::Disconnected) => return Err(ChildError::DriverGone),
        }
        seq += 1;
        let sent = Instant::now();
        let outcome = conn.call(
            Message::new(PING_TYPE, seq.to_le_bytes().to_vec(), Vec::new()),
            PING_DEADLINE,
        );
        let rtt = sent.elapsed();
        if let Some(p) = current.map(|i| &mut phases[i]) {
            match outcome {
                Ok(reply) if reply.front[..] == seq.to_le_bytes() => {
                    p.rtt_ns.push(rtt.as_nanos() as u64)
                }
                Ok(_) => {
                    p.lost += 1;
                    p.first_error
                        .get_or_insert_with(|| format!("ping {seq}: another ping's reply"));
                }
                Err(e) => {
                    p.lost += 1;
                    p.first_error
                        .get_or_insert_with(|| format!("ping {seq}: {e}"));
                }
            }
        }
        std::thread::sleep(c.ping_interval);
    }
    let [connecting, idle] = phases;
    let figures =
        serde_json::to_string(&(connecting.stats(), idle.stats())).map_err(ChildError::Figures)?;
    answer(&format!("pings {figures}"))?;
    msgr.shutdown(Duration::from_secs(5));
    Ok(())
}
