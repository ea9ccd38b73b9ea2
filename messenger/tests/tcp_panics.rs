//! A panicking dispatcher callback ends its connection, loudly, and nothing
//! else: the worker serves the other connections, the listener accepts new
//! ones, the panic is counted and `on_reset` says why. With
//! `on_handler_panic = abort` the process aborts instead (a child process
//! of this test binary does, and the parent checks how it ended).

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use msgr::{Connection, Dispatcher, FaultReason, Message, Messenger, NullDispatcher};

/// The message type this dispatcher cannot take.
const POISON: u16 = 666;

/// Counts good messages; panics on [`POISON`], as a handler's
/// `msg.decode().expect(..)` of the wrong type would.
#[derive(Default)]
struct Fragile {
    good: AtomicU64,
    resets: Mutex<Vec<FaultReason>>,
}

impl Dispatcher for Fragile {
    fn on_message(&self, _conn: &Connection, msg: Message) {
        if msg.msg_type == POISON {
            panic!("cannot decode message type {}", msg.msg_type);
        }
        self.good.fetch_add(1, Ordering::Relaxed);
    }

    fn on_reset(&self, _conn: &Connection, reason: &FaultReason) {
        self.resets.lock().unwrap().push(reason.clone());
    }
}

fn client_of(n: u64) -> Messenger {
    client_named(n, fast_config(), Arc::new(NullDispatcher))
}

#[test]
fn a_panicking_handler_fails_its_connection_and_the_server_serves_on() {
    let d = Arc::new(Fragile::default());
    let mut srv = server(fast_config(), d.clone());
    let mut bad = client_of(1);
    let mut good = client_of(2);
    let bad_conn = bad.connect(srv.addr().expect("bound")).expect("connect");
    let good_conn = good.connect(srv.addr().expect("bound")).expect("connect");
    for _ in 0..10 {
        send(&good_conn, Message::new(1, &b"fine"[..], &b""[..]));
    }
    send(&bad_conn, Message::new(1, &b"fine"[..], &b""[..]));
    send(&bad_conn, Message::new(POISON, &b"boom"[..], &b""[..]));
    assert!(
        wait_until(Duration::from_secs(10), || {
            srv.counters().handler_panics.load(Ordering::Relaxed) == 1
                && !d.resets.lock().unwrap().is_empty()
        }),
        "the panic was counted and the connection reset"
    );
    let resets = d.resets.lock().unwrap().clone();
    assert!(
        matches!(&resets[0], FaultReason::HandlerPanicked(m) if m.contains("cannot decode message type 666")),
        "{resets:?}"
    );
    // The worker lives on: the other connection, and a new one, are served.
    for _ in 0..10 {
        send(&good_conn, Message::new(1, &b"fine"[..], &b""[..]));
    }
    let mut late = client_of(3);
    let late_conn = late.connect(srv.addr().expect("bound")).expect("connect");
    send(&late_conn, Message::new(1, &b"fine"[..], &b""[..]));
    assert!(
        wait_until(Duration::from_secs(10), || d.good.load(Ordering::Relaxed)
            == 22),
        "good messages delivered: {}",
        d.good.load(Ordering::Relaxed)
    );
    assert_eq!(srv.counters().handler_panics.load(Ordering::Relaxed), 1);
    for m in [&mut bad, &mut good, &mut late] {
        m.shutdown(Duration::from_secs(2));
    }
    let r = srv.shutdown(Duration::from_secs(2));
    assert_eq!((r.workers_died, r.leaked_links), (0, 0), "{r:?}");
}

/// Run only as the child of the test below: a server that aborts on a
/// handler's panic, and a client that sends it the poison.
#[test]
#[ignore = "the child process of on_handler_panic_abort_aborts_the_process"]
fn abort_child() {
    if std::env::var_os("MSGR_TEST_PANIC_ABORT_CHILD").is_none() {
        return;
    }
    let mut cfg = fast_config();
    cfg.set("on_handler_panic", "abort").unwrap();
    let srv = server(cfg, Arc::new(Fragile::default()));
    let cli = client_of(1);
    let conn = cli.connect(srv.addr().expect("bound")).expect("connect");
    send(&conn, Message::new(POISON, &b"boom"[..], &b""[..]));
    std::thread::sleep(Duration::from_secs(10));
    eprintln!("still alive after the panic");
    std::process::exit(3);
}

#[test]
fn on_handler_panic_abort_aborts_the_process() {
    use std::os::unix::process::ExitStatusExt;
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["abort_child", "--exact", "--ignored", "--nocapture"])
        .env("MSGR_TEST_PANIC_ABORT_CHILD", "1")
        .output()
        .expect("run the child");
    let stderr = String::from_utf8_lossy(&out.stderr);
    // SIGABRT; a library linked in with every backend feature (libfabric's
    // providers) reports the signal itself and exits 1 instead.
    let aborted = out.status.signal() == Some(libc_sigabrt())
        || (!out.status.success() && stderr.contains("signal 6"));
    assert!(aborted, "{:?}\n{stderr}", out.status);
    assert!(
        stderr.contains("aborting (on_handler_panic = abort)"),
        "{stderr}"
    );
}

/// SIGABRT, without a libc dependency for one constant.
fn libc_sigabrt() -> i32 {
    6
}
