//! Calls over real sockets: replies routed to their callers, timeouts and
//! late replies, resets failing pending calls, exactly-once across
//! reconnects, and the async side (send_async waiting for room, inbox
//! streams, broadcast).

mod common;

use std::collections::HashMap;
use std::future::poll_fn;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use common::*;
use futures_core::Stream;
use msgr::{
    CallError, Connection, ConnectionEvent, Dispatcher, EntityName, Inbox, Message, Messenger,
    Policy, RealFault,
};

/// Answers type-1 requests with the request's front, counts each call id
/// it saw, and holds type-2 requests until the test opens `gate`: a reply
/// that must come late comes when the test says, not after a sleep that a
/// busy machine can outlast.
#[derive(Default)]
struct Answerer {
    seen: Mutex<HashMap<u64, u32>>,
    gate: Gate,
}

/// Shut until opened (waits on it give up after 30 s, so none hangs).
#[derive(Default)]
struct Gate(Mutex<bool>, Condvar);

impl Gate {
    fn open(&self) {
        *self.0.lock().unwrap() = true;
        self.1.notify_all();
    }

    fn wait(&self) {
        let shut = self.0.lock().unwrap();
        let _ = self
            .1
            .wait_timeout_while(shut, Duration::from_secs(30), |open| !*open);
    }
}

impl Dispatcher for Answerer {
    fn on_message(&self, conn: &Connection, req: Message) {
        let Some((id, false)) = req.call_id() else {
            return;
        };
        *self.seen.lock().unwrap().entry(id).or_default() += 1;
        if req.msg_type == 2 {
            self.gate.wait();
        }
        let _ = conn.reply(&req, Message::new(9, req.front.clone(), req.data.clone()));
    }
}

fn pair(d: Arc<dyn Dispatcher>) -> (Messenger, Messenger, Connection) {
    let srv = server(fast_config(), d);
    let cli = client(fast_config(), Recorder::new());
    let conn = cli
        .connect_with(srv.addr().expect("bound"), Policy::LosslessClient)
        .unwrap();
    conn.wait_connected(Duration::from_secs(10)).unwrap();
    (srv, cli, conn)
}

#[test]
fn calls_get_their_own_replies_and_others_get_nothing() {
    let ans = Arc::new(Answerer::default());
    let (mut srv, mut cli, conn) = pair(ans.clone());
    let threads: Vec<_> = (0..4u32)
        .map(|t| {
            let conn = conn.clone();
            std::thread::spawn(move || {
                for i in 0..250u32 {
                    let body = format!("{t}:{i}").into_bytes();
                    let m = Message::new(1, body.clone(), vec![t as u8; (i % 5000) as usize]);
                    let r = conn.call(m, Duration::from_secs(10)).expect("reply");
                    assert_eq!(r.front[..], body[..], "each caller gets its own reply");
                    assert_eq!(r.call_id().map(|(_, reply)| reply), Some(true));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(ans.seen.lock().unwrap().len(), 1000);
    assert_eq!(cli.counters().late_replies.load(Ordering::Relaxed), 0);
    // Replies never reach the client's dispatcher.
    let rec = Recorder::new();
    assert_eq!(rec.delivered(0), 0);
    // A message that is not a request cannot be replied to.
    let answer = Message::new(2, &b"answer"[..], &b""[..]);
    let refused = conn
        .reply(&Message::new(1, &b""[..], &b""[..]), answer.clone())
        .expect_err("not a request");
    assert_eq!(refused.error, msgr::SendError::NotARequest);
    assert_eq!(refused.message, answer, "the reply comes back unchanged");
    cli.shutdown(Duration::from_secs(2));
    srv.shutdown(Duration::from_secs(2));
}

#[test]
fn a_slow_reply_times_the_call_out_and_is_dropped_when_it_comes() {
    let ans = Arc::new(Answerer::default());
    let (mut srv, mut cli, conn) = pair(ans.clone());
    let r = conn.call(
        Message::new(2, &b"slow"[..], &b""[..]),
        Duration::from_millis(50),
    );
    assert_eq!(
        r.err(),
        Some(CallError::Timeout {
            after: Duration::from_millis(50),
            last_fault: None
        }),
        "open: no link failure to tell"
    );
    ans.gate.open();
    assert!(wait_until(Duration::from_secs(30), || cli
        .counters()
        .late_replies
        .load(Ordering::Relaxed)
        == 1));
    // The connection goes on.
    let r = conn.call(
        Message::new(1, &b"fast"[..], &b""[..]),
        Duration::from_secs(5),
    );
    assert_eq!(&r.unwrap().front[..], b"fast");
    cli.shutdown(Duration::from_secs(2));
    srv.shutdown(Duration::from_secs(2));
}

#[test]
fn a_reset_fails_the_pending_call() {
    let ans = Arc::new(Answerer::default());
    let (mut srv, mut cli, conn) = pair(ans.clone());
    let c2 = conn.clone();
    let waiting = std::thread::spawn(move || {
        c2.call(
            Message::new(2, &b"never"[..], &b""[..]),
            Duration::from_secs(30),
        )
    });
    // Pending once the server holds the request.
    assert!(wait_until(Duration::from_secs(30), || ans
        .seen
        .lock()
        .unwrap()
        .len()
        == 1));
    conn.mark_down();
    let r = waiting.join().unwrap();
    ans.gate.open();
    assert!(matches!(r, Err(CallError::Reset(_))), "{r:?}");
    cli.shutdown(Duration::from_secs(2));
    srv.shutdown(Duration::from_secs(2));
}

/// Calls on a lossless connection whose link is aborted again and again:
/// every call answered, every request handled exactly once.
#[test]
fn calls_are_exactly_once_across_reconnects() {
    let ans = Arc::new(Answerer::default());
    let (mut srv, mut cli, conn) = pair(ans.clone());
    let c2 = conn.clone();
    let breaker = std::thread::spawn(move || {
        for _ in 0..10 {
            std::thread::sleep(Duration::from_millis(30));
            c2.inject_fault(RealFault::Abort);
        }
    });
    for i in 0..600u32 {
        let m = Message::new(1, i.to_le_bytes().to_vec(), Vec::new());
        let r = conn.call(m, Duration::from_secs(20)).expect("answered");
        assert_eq!(r.front[..], i.to_le_bytes());
    }
    breaker.join().unwrap();
    let seen = ans.seen.lock().unwrap();
    assert_eq!(seen.len(), 600);
    assert!(seen.values().all(|&n| n == 1), "a request handled twice");
    assert!(cli.counters().reconnects.load(Ordering::Relaxed) >= 1);
    cli.shutdown(Duration::from_secs(2));
    srv.shutdown(Duration::from_secs(2));
}

async fn next<S: Stream + Unpin>(s: &mut S) -> Option<S::Item> {
    poll_fn(|cx| Pin::new(&mut *s).poll_next(cx)).await
}

/// The async side under tokio: a sender that outruns a tiny send queue
/// waits for room (no QueueFull, no sleep loop); the inbox streams deliver
/// events and messages, a connection's messages apart; async calls time
/// out by the worker's timer; broadcast reaches every peer; the streams
/// end at shutdown.
#[test]
fn async_send_waits_for_room_and_streams_deliver() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let srv_inbox = Inbox::new();
        let mut scfg = fast_config();
        scfg.rx_throttle_messages = 64;
        let srv = Messenger::builder(EntityName::server(1))
            .config(scfg)
            .bind("tcp://127.0.0.1:0".parse().unwrap())
            .start(srv_inbox.dispatcher())
            .unwrap();
        let mut ccfg = fast_config();
        ccfg.session.max_queued_messages = 8;
        let cli_inbox = Inbox::new();
        let cli = Messenger::builder(EntityName::client(1))
            .config(ccfg)
            .start(cli_inbox.dispatcher())
            .unwrap();
        let conn = cli
            .connect_with(srv.addr().expect("bound"), Policy::LosslessClient)
            .unwrap();
        let mut events = cli_inbox.events();
        assert_eq!(
            next(&mut events).await.unwrap().1,
            ConnectionEvent::Connected
        );
        let (srv_conn, ev) = srv_inbox
            .next_event_timeout(Duration::from_secs(5))
            .unwrap();
        assert_eq!(ev, ConnectionEvent::Accepted);
        let apart = srv_inbox.connection(&srv_conn);

        const N: u32 = 5_000;
        let sender = {
            let conn = conn.clone();
            tokio::spawn(async move {
                for i in 0..N {
                    conn.send_async(Message::new(1, i.to_le_bytes().to_vec(), Vec::new()))
                        .await
                        .expect("sent");
                }
            })
        };
        let mut apart = apart;
        for i in 0..N {
            let m = next(&mut apart).await.expect("message");
            assert_eq!(m.front[..], i.to_le_bytes());
        }
        sender.await.unwrap();
        drop(apart);

        // Async call, answered by nobody: the worker's timer ends it.
        let r = conn
            .call_async(
                Message::new(5, &b"?"[..], &b""[..]),
                Duration::from_millis(100),
            )
            .await;
        assert_eq!(
            r.err(),
            Some(CallError::Timeout {
                after: Duration::from_millis(100),
                last_fault: None
            })
        );
        // The request itself arrived (in the common queue, now).
        let (_, req) = srv_inbox.recv_async().await.unwrap();
        assert_eq!(req.call_id().map(|(_, reply)| reply), Some(false));

        // Broadcast to two more subscribers.
        let mut subs = Vec::new();
        for id in 2..=3 {
            let inbox = Inbox::new();
            let m = Messenger::builder(EntityName::client(id))
                .config(fast_config())
                .start(inbox.dispatcher())
                .unwrap();
            m.connect_with(srv.addr().expect("bound"), Policy::LosslessClient)
                .unwrap()
                .wait_connected(Duration::from_secs(5))
                .unwrap();
            subs.push((m, inbox));
        }
        assert!(wait_until(Duration::from_secs(5), || srv
            .connections()
            .len()
            == 3));
        let b = srv.broadcast(Message::new(8, &b"all"[..], &b""[..]));
        assert_eq!((b.sent, b.refused.len()), (3, 0));
        for inbox in [&cli_inbox, &subs[0].1, &subs[1].1] {
            let (_, m) = inbox
                .recv_timeout(Duration::from_secs(5))
                .expect("broadcast");
            assert_eq!(&m.front[..], b"all");
        }
        for (m, _) in subs {
            m.shutdown_async(Duration::from_secs(1)).await;
        }
        cli.shutdown_async(Duration::from_secs(1)).await;
        let mut msgs = srv_inbox.messages();
        srv.shutdown_async(Duration::from_secs(1)).await;
        assert!(
            next(&mut msgs).await.is_none(),
            "the stream ends at shutdown"
        );
    });
}

/// With a long `call_spin_us`, callers spin on their replies before they
/// park (where a CPU is spare): every caller still gets its own reply, and
/// a reply that does not come (held at the server's gate) still times the
/// call out.
#[test]
fn callers_that_spin_get_their_replies_and_time_out() {
    let ans = Arc::new(Answerer::default());
    let mut cfg = fast_config();
    cfg.set("call_spin_us", "500").unwrap();
    let mut srv = server(fast_config(), ans.clone());
    let mut cli = client(cfg, Recorder::new());
    let conn = cli
        .connect_with(srv.addr().expect("bound"), Policy::LosslessClient)
        .unwrap();
    conn.wait_connected(Duration::from_secs(10)).unwrap();
    let threads: Vec<_> = (0..3u32)
        .map(|t| {
            let conn = conn.clone();
            std::thread::spawn(move || {
                for i in 0..200u32 {
                    let body = format!("{t}:{i}").into_bytes();
                    let r = conn
                        .call(
                            Message::new(1, body.clone(), Vec::new()),
                            Duration::from_secs(10),
                        )
                        .expect("reply");
                    assert_eq!(r.front[..], body[..], "each caller gets its own reply");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(ans.seen.lock().unwrap().len(), 600);
    // Held at the gate: no reply within the window or the timeout.
    let held = conn.call(
        Message::new(2, &b"held"[..], &b""[..]),
        Duration::from_millis(100),
    );
    assert!(
        matches!(held, Err(msgr::CallError::Timeout { .. })),
        "{held:?}"
    );
    ans.gate.open();
    cli.shutdown(Duration::from_secs(2));
    srv.shutdown(Duration::from_secs(2));
}

/// What a callback's blocking call and blocking RMA read on its own
/// connection returned, and how long each took.
type Refusals = (
    Result<Message, CallError>,
    Duration,
    Result<msgr::Bytes, msgr::RmaError>,
    Duration,
);

/// On any message: a blocking call, then a blocking read of `handle`,
/// both back over the connection the message came on, from its worker.
struct CallsBackFromTheCallback {
    handle: Mutex<Option<msgr::RmaHandle>>,
    done: Mutex<Option<std::sync::mpsc::Sender<Refusals>>>,
}

impl Dispatcher for CallsBackFromTheCallback {
    fn on_message(&self, conn: &Connection, _msg: Message) {
        let t = std::time::Instant::now();
        let call = conn.call(
            Message::new(1, &b"back"[..], &b""[..]),
            Duration::from_secs(5),
        );
        let call_took = t.elapsed();
        let handle = self.handle.lock().unwrap().clone().expect("handle");
        let t = std::time::Instant::now();
        let read = conn.read(&handle, 0, 4, Duration::from_secs(5));
        let read_took = t.elapsed();
        if let Some(tx) = self.done.lock().unwrap().take() {
            let _ = tx.send((call, call_took, read, read_took));
        }
    }
}

/// Issue 60: a blocking call (or RMA read) from a dispatcher callback on
/// the worker that owns the connection fails at once with
/// `WouldDeadlock`: that worker would deliver the reply only after the
/// callback returned (it waited its whole timeout).
#[test]
fn a_blocking_call_from_the_owning_callback_fails_at_once() {
    let (tx, rx) = std::sync::mpsc::channel();
    let d = Arc::new(CallsBackFromTheCallback {
        handle: Mutex::new(None),
        done: Mutex::new(Some(tx)),
    });
    let (mut srv, mut cli, conn) = pair(d.clone());
    // Served by the client's messenger, were the read sent.
    let region = cli.expose(b"data".to_vec(), msgr::Access::Read);
    *d.handle.lock().unwrap() = Some(region.handle());
    conn.send(Message::new(3, &b"go"[..], &b""[..])).unwrap();
    let (call, call_took, read, read_took) = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the callback ran");
    assert!(matches!(call, Err(CallError::WouldDeadlock)), "{call:?}");
    assert!(
        matches!(read, Err(msgr::RmaError::Call(CallError::WouldDeadlock))),
        "{read:?}"
    );
    assert!(call_took < Duration::from_secs(1), "{call_took:?}");
    assert!(read_took < Duration::from_secs(1), "{read_took:?}");
    // Another thread's blocking call on the same connection still works.
    assert!(call_answered_elsewhere(&conn));
    cli.shutdown(Duration::from_secs(5));
    srv.shutdown(Duration::from_secs(5));
}

/// A call from this (non-worker) thread on `conn` is not refused.
fn call_answered_elsewhere(conn: &Connection) -> bool {
    !matches!(
        conn.call(
            Message::new(1, &b"x"[..], &b""[..]),
            Duration::from_millis(200)
        ),
        Err(CallError::WouldDeadlock)
    )
}
