//! Server restarts on the same port (new nonce), seen from a lossless client.
//!
//! `lossless_connect_to_a_stale_incarnation_ends` guards against a messenger
//! bug (now fixed) found by the stress suite (seed 1, `msgr-stress --duration 10 --faults off
//! --no-real-faults --seed 1`): a lossless connection dialled to a server's
//! address with the nonce of an incarnation that has since restarted on the
//! same port retries forever. Every attempt ends in a protocol error
//! (WrongPeer: the new incarnation's nonce differs), the connection stays
//! `Connecting`, nothing is delivered and no callback tells the application,
//! so its queue stays full for good. Expected: the session adopts the new
//! incarnation (as it does after a SessionReset), or ends with on_reset.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use msgr::{Connection, Dispatcher, EntityName, Message, Messenger, Policy};

#[derive(Default)]
struct Count {
    messages: AtomicU64,
    resets: AtomicU64,
    remote_resets: AtomicU64,
}

impl Dispatcher for Count {
    fn on_message(&self, _c: &Connection, _m: Message) {
        self.messages.fetch_add(1, Ordering::Relaxed);
    }
    fn on_reset(&self, _c: &Connection, _r: &msgr::FaultReason) {
        self.resets.fetch_add(1, Ordering::Relaxed);
    }
    fn on_remote_reset(&self, _c: &Connection) {
        self.remote_resets.fetch_add(1, Ordering::Relaxed);
    }
}

fn wait(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    f()
}

fn server(addr: &str, d: Arc<Count>) -> Messenger {
    let mut cfg = msgr_testsuite::stress::default_messenger_config();
    cfg.faults = None;
    Messenger::builder(EntityName::server(1))
        .config(cfg)
        .bind(addr.parse().unwrap())
        .start(d)
        .unwrap()
}

/// The server restarts while the client's link is frozen: the session hears
/// the new incarnation (remote reset) and goes on. Passes; kept as a guard.
#[test]
fn lossless_session_recovers_after_server_restart_on_same_port() {
    let first = Arc::new(Count::default());
    let mut srv = server("tcp://127.0.0.1:0", first.clone());
    let port = srv.addr().expect("bound").socket.port();
    let events = Arc::new(Count::default());
    let mut cfg = msgr_testsuite::stress::default_messenger_config();
    cfg.faults = None;
    let mut cli = Messenger::builder(EntityName::client(1))
        .config(cfg)
        .start(events.clone())
        .unwrap();
    let conn = cli
        .connect_with(srv.addr().expect("bound"), Policy::LosslessClient)
        .unwrap();
    for _ in 0..10 {
        conn.send(Message::new(1, vec![1u8; 8], vec![])).unwrap();
    }
    assert!(wait(Duration::from_secs(10), || first
        .messages
        .load(Ordering::Relaxed)
        == 10));
    assert!(wait(Duration::from_secs(10), || conn.queued() == (0, 0)));

    // The client's link is frozen when the server goes away, so the client
    // never hears the server's close (as with a crash or a network cut).
    conn.inject_fault(msgr::RealFault::Freeze);
    std::thread::sleep(Duration::from_millis(50));
    srv.shutdown(Duration::from_secs(2));
    let second = Arc::new(Count::default());
    let mut srv2 = server(&format!("tcp://127.0.0.1:{port}"), second.clone());
    // The session notices the new incarnation (remote reset) or ends (reset).
    let noticed = wait(Duration::from_secs(15), || {
        events.remote_resets.load(Ordering::Relaxed) > 0
            || events.resets.load(Ordering::Relaxed) > 0
    });
    let mut recovered = noticed && events.resets.load(Ordering::Relaxed) > 0;
    if noticed && !recovered {
        // Continued as a new session: what is sent now must arrive.
        for _ in 0..10 {
            conn.send(Message::new(1, vec![2u8; 8], vec![]))
                .expect("a lossless connection is still open");
        }
        recovered = wait(Duration::from_secs(15), || {
            second.messages.load(Ordering::Relaxed) == 10
        });
    }
    let state = conn.state();
    let (remote, resets, got) = (
        events.remote_resets.load(Ordering::Relaxed),
        events.resets.load(Ordering::Relaxed),
        second.messages.load(Ordering::Relaxed),
    );
    let errors = Counters_get(&cli);
    cli.shutdown(Duration::from_secs(1));
    srv2.shutdown(Duration::from_secs(1));
    assert!(
        recovered,
        "after the server restarted on port {port}: state {state:?}, remote resets {remote}, resets {resets}, messages at the new server {got}, client protocol errors {errors}"
    );
}

#[allow(non_snake_case)]
fn Counters_get(m: &Messenger) -> u64 {
    msgr::Counters::get(&m.counters().protocol_errors)
}

/// A lossless connect to a server address whose incarnation (nonce) is gone,
/// while a new incarnation listens on the same port: the connection must not
/// retry forever in silence.
#[test]
fn lossless_connect_to_a_stale_incarnation_ends() {
    let mut old = server("tcp://127.0.0.1:0", Arc::new(Count::default()));
    let stale = old.addr().expect("bound").clone();
    let port = stale.socket.port();
    old.shutdown(Duration::from_secs(1));
    let fresh = Arc::new(Count::default());
    let mut srv = server(&format!("tcp://127.0.0.1:{port}"), fresh.clone());
    let events = Arc::new(Count::default());
    let mut cfg = msgr_testsuite::stress::default_messenger_config();
    cfg.faults = None;
    let mut cli = Messenger::builder(EntityName::client(1))
        .config(cfg)
        .start(events.clone())
        .unwrap();
    let conn = cli.connect_with(&stale, Policy::LosslessClient).unwrap();
    for _ in 0..10 {
        let _ = conn.send(Message::new(1, vec![3u8; 8], vec![]));
    }
    let settled = wait(Duration::from_secs(10), || {
        fresh.messages.load(Ordering::Relaxed) == 10 || events.resets.load(Ordering::Relaxed) > 0
    });
    let state = conn.state();
    let errors = Counters_get(&cli);
    cli.shutdown(Duration::from_secs(1));
    srv.shutdown(Duration::from_secs(1));
    assert!(
        settled,
        "connection to stale {stale} (new incarnation {} on the same port): state {state:?} after 10 s, delivered {}, resets {}, remote resets {}, client protocol errors {errors}",
        srv.addr().expect("bound"),
        fresh.messages.load(Ordering::Relaxed),
        events.resets.load(Ordering::Relaxed),
        events.remote_resets.load(Ordering::Relaxed),
    );
}
