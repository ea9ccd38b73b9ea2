//! A peer nobody answers for: every failed attempt reaches the application
//! (`on_connect_failed`, with the reason), `wait_connected` says why it
//! gave up, and `connect_timeout_ms` ends a connection that never opened.

mod common;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use common::*;
use msgr::{
    CallError, ConnectError, Connection, Dispatcher, EntityAddr, FaultReason, Message, Policy,
    SendError,
};

#[derive(Default)]
struct Watcher {
    failed: AtomicU64,
    last_failure: Mutex<Option<FaultReason>>,
    resets: Mutex<Vec<FaultReason>>,
}

impl Dispatcher for Watcher {
    fn on_message(&self, _conn: &Connection, _msg: Message) {}

    fn on_connect_failed(&self, _conn: &Connection, reason: &FaultReason) {
        self.failed.fetch_add(1, Ordering::Relaxed);
        *self.last_failure.lock().unwrap() = Some(reason.clone());
    }

    fn on_reset(&self, _conn: &Connection, reason: &FaultReason) {
        self.resets.lock().unwrap().push(reason.clone());
    }
}

/// An address on loopback where nothing listens (a port bound and released).
fn nobody() -> EntityAddr {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    format!("tcp://127.0.0.1:{port}").parse().unwrap()
}

#[test]
fn failed_attempts_are_reported_and_wait_connected_says_why() {
    let target = nobody();
    let w = Arc::new(Watcher::default());
    let mut m = client(fast_config(), w.clone());
    let conn = m.connect_with(&target, Policy::LosslessClient).unwrap();
    let e = conn.wait_connected(Duration::from_millis(300)).unwrap_err();
    let ConnectError::Timeout {
        last_fault: Some(FaultReason::Transport(why)),
        ..
    } = &e
    else {
        panic!("{e:?}");
    };
    assert!(why.to_string().contains("refused"), "{why}");
    assert!(
        wait_until(Duration::from_secs(5), || w.failed.load(Ordering::Relaxed)
            >= 3),
        "each attempt reported: {}",
        w.failed.load(Ordering::Relaxed)
    );
    assert!(w.resets.lock().unwrap().is_empty(), "lossless keeps trying");
    assert!(m.counters().connect_failures.load(Ordering::Relaxed) >= 3);
    assert!(m.counters().redials.load(Ordering::Relaxed) >= 2);
    let st = conn.status();
    assert!(st.attempts >= 3, "{st:?}");
    assert!(
        st.retry_in.is_none_or(|d| d <= Duration::from_millis(50)),
        "the backoff is capped by backoff_max_ms: {st:?}"
    );
    m.shutdown(Duration::from_secs(1));

    // Lossy: one failed attempt, then the end.
    let w = Arc::new(Watcher::default());
    let mut m = client(fast_config(), w.clone());
    let conn = m.connect_with(&target, Policy::LossyClient).unwrap();
    let e = conn.wait_connected(Duration::from_secs(5)).unwrap_err();
    assert!(
        matches!(e, ConnectError::Closed(Some(FaultReason::Transport(_)))),
        "{e:?}"
    );
    assert_eq!(w.failed.load(Ordering::Relaxed), 1);
    m.shutdown(Duration::from_secs(1));
}

#[test]
fn connect_timeout_ends_a_connection_that_never_opened() {
    let target = nobody();
    let w = Arc::new(Watcher::default());
    let mut cfg = fast_config();
    cfg.set("connect_timeout_ms", "400").unwrap();
    let mut m = client(cfg, w.clone());
    let conn = m.connect_with(&target, Policy::LosslessClient).unwrap();
    send(&conn, Message::new(1, &b"queued"[..], &b""[..]));
    let e = conn.wait_connected(Duration::from_secs(10)).unwrap_err();
    assert_eq!(
        e,
        ConnectError::Closed(Some(FaultReason::ConnectTimeout(Duration::from_millis(
            400
        ))))
    );
    assert!(wait_until(Duration::from_secs(5), || !w
        .resets
        .lock()
        .unwrap()
        .is_empty()));
    assert_eq!(
        w.resets.lock().unwrap()[0],
        FaultReason::ConnectTimeout(Duration::from_millis(400))
    );
    assert!(w.failed.load(Ordering::Relaxed) >= 1);
    assert_eq!(
        m.counters().messages_dropped.load(Ordering::Relaxed),
        1,
        "the queued message is reported"
    );
    m.shutdown(Duration::from_secs(1));
}

/// A send that waits for room and gets none gives its message back (a
/// connection that never opens never releases its queue).
#[test]
fn send_timeout_gives_the_message_back() {
    let mut cfg = fast_config();
    cfg.session.max_queued_messages = 1;
    let mut m = client(cfg, Arc::new(Watcher::default()));
    let conn = m.connect_with(&nobody(), Policy::LosslessClient).unwrap();
    conn.send(Message::new(1, &b"first"[..], &b""[..])).unwrap();
    let second = Message::new(1, &b"second"[..], &b""[..]);
    let wait = Duration::from_millis(50);
    let refused = conn.send_timeout(second.clone(), wait).unwrap_err();
    assert_eq!(refused.error, SendError::Timeout(wait));
    assert_eq!(refused.message, second, "the message comes back unchanged");
    m.shutdown(Duration::from_secs(1));
}

/// A call on a connection that never opened says why when it times out —
/// the link's failure, as `wait_connected` does — sync or async; its
/// future, polled again once it has completed, says it is finished.
#[test]
fn a_call_that_times_out_unconnected_says_why() {
    let mut m = client(fast_config(), Arc::new(Watcher::default()));
    let conn = m.connect_with(&nobody(), Policy::LosslessClient).unwrap();
    // The cause is known before the call starts (no race with the first dial).
    assert!(wait_until(Duration::from_secs(10), || conn
        .status()
        .last_fault
        .is_some()));
    let refused = |e: &CallError| {
        matches!(e, CallError::Timeout {
            last_fault: Some(FaultReason::Transport(why)),
            ..
        } if why.to_string().contains("refused"))
    };
    let request = || Message::new(1, &b"?"[..], &b""[..]);
    let e = conn
        .call(request(), Duration::from_millis(100))
        .unwrap_err();
    assert!(refused(&e), "{e:?}");
    assert!(e.to_string().contains("refused"), "{e}");

    let mut call = conn.call_async(request(), Duration::from_millis(100));
    let mut cx = Context::from_waker(Waker::noop());
    let mut outcome = None;
    assert!(wait_until(Duration::from_secs(10), || {
        match Pin::new(&mut call).poll(&mut cx) {
            Poll::Ready(o) => outcome = Some(o),
            Poll::Pending => {}
        }
        outcome.is_some()
    }));
    let e = outcome.unwrap().unwrap_err();
    assert!(refused(&e), "{e:?}");
    assert_eq!(
        Pin::new(&mut call).poll(&mut cx),
        Poll::Ready(Err(CallError::Finished)),
        "polled again: finished, not a made-up send failure"
    );
    m.shutdown(Duration::from_secs(1));
}
