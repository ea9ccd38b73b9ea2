//! Runs the built `msgr` binary: every subprocess is bounded by a timeout and
//! killed if the test fails. No performance numbers are asserted here.
//! The tests are grouped by what they exercise; the helpers that run the
//! binary are here.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

mod bench;
mod errors;
mod rma;
mod serve;

const MSGR: &str = env!("CARGO_BIN_EXE_msgr");

/// Kills the child when dropped (a failing assertion must not leak servers).
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct Output {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

fn reader(mut r: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = r.read_to_string(&mut s);
        let _ = tx.send(s);
    });
    rx
}

/// `msgr ARGS` started with its output piped (killed when dropped).
fn spawn(args: &[&str]) -> Guard {
    Guard(
        Command::new(MSGR)
            .args(args)
            .env_remove("MSGR_CONFIG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn msgr"),
    )
}

/// Waits for `child` (`msgr ARGS`) to exit within `timeout`, or panics.
fn exit_within(child: &mut Guard, args: &[&str], timeout: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(s) = child.0.try_wait().expect("try_wait") {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "msgr {args:?} did not finish within {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs `msgr ARGS` to completion within `timeout`, or kills it and panics.
fn run(args: &[&str], timeout: Duration) -> Output {
    let mut child = spawn(args);
    let out = reader(child.0.stdout.take().expect("stdout"));
    let err = reader(child.0.stderr.take().expect("stderr"));
    let status = exit_within(&mut child, args, timeout);
    let stdout = out.recv_timeout(Duration::from_secs(5)).unwrap_or_default();
    let stderr = err.recv_timeout(Duration::from_secs(5)).unwrap_or_default();
    Output {
        status,
        stdout,
        stderr,
    }
}

/// Starts `msgr serve BIND` for at most a minute: the server, its stdout
/// lines as they come, and the address it says it listens on.
fn serve(bind: &str) -> (Guard, mpsc::Receiver<String>, String) {
    serve_with(bind, &[])
}

/// `msgr serve BIND` with more arguments (global options).
fn serve_with(bind: &str, extra: &[&str]) -> (Guard, mpsc::Receiver<String>, String) {
    let s = serve_args(&[&["serve", bind, "--duration", "60"], extra].concat());
    (s.guard, s.lines, s.addr)
}

/// A running `msgr serve`.
struct Served {
    guard: Guard,
    /// Its stdout lines after the first, as they come.
    lines: mpsc::Receiver<String>,
    /// The address of its first line, `listening on ADDR`.
    addr: String,
    /// All its stderr, once it has exited (read by the fault-plan test).
    #[cfg_attr(not(feature = "fault-injection"), allow(dead_code))]
    stderr: mpsc::Receiver<String>,
}

/// `msgr ARGS` (a `serve` command) started and its first line read.
fn serve_args(args: &[&str]) -> Served {
    let mut guard = spawn(args);
    let stderr = reader(guard.0.stderr.take().expect("stderr"));
    let lines = lines_of(guard.0.stdout.take().expect("stdout"));
    let first = lines
        .recv_timeout(Duration::from_secs(20))
        .expect("serve prints its address");
    let addr = first
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {first:?}"))
        .to_owned();
    Served {
        guard,
        lines,
        addr,
        stderr,
    }
}

/// Stops a server with SIGINT and returns its exit status and the lines
/// it printed since (its counters).
fn stop(server: &mut Guard, lines: &mpsc::Receiver<String>) -> (ExitStatus, Vec<String>) {
    stop_with(server, lines, libc::SIGINT)
}

/// [`stop`] with signal `sig`.
fn stop_with(
    server: &mut Guard,
    lines: &mpsc::Receiver<String>,
    sig: libc::c_int,
) -> (ExitStatus, Vec<String>) {
    let pid = server.0.id() as libc::pid_t;
    // SAFETY: signalling our own child.
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
    let status = exit_within(server, &["serve"], Duration::from_secs(20));
    // Its last lines may still be in the pipe when it has exited (the
    // reader thread not yet run, on a busy machine): read to the end,
    // which the reader marks by hanging up at EOF.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut rest = Vec::new();
    while let Ok(l) = lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        rest.push(l);
    }
    (status, rest)
}

/// A short ping of `addr` that must succeed.
fn ping_ok(addr: &str) {
    let o = run(
        &[
            "ping",
            addr,
            "--count",
            "20",
            "--warmup",
            "0",
            "--timeout",
            "30",
        ],
        Duration::from_secs(60),
    );
    assert!(o.status.success(), "ping {addr}: {}", o.stderr);
}

/// `r`'s lines as they come.
fn lines_of(r: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(r).lines() {
            let Ok(l) = l else { break };
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    rx
}

/// The first of `lines` with `needle` that comes within `within`, if any.
fn line_with(lines: &mpsc::Receiver<String>, needle: &str, within: Duration) -> Option<String> {
    let deadline = Instant::now() + within;
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match lines.recv_timeout(left) {
            Ok(l) if l.contains(needle) => return Some(l),
            Ok(_) => {}
            Err(_) => return None,
        }
    }
    None
}
