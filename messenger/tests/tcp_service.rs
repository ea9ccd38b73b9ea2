//! Typed services over loopback TCP: `msgr::serve` (handler on the
//! workers) and `msgr::serve_async` (handler in tasks) answer
//! `ServiceClient`'s blocking and async calls; whatever the server cannot
//! answer (a request that does not decode, a panicking handler, a reply too
//! large) comes back as a typed fault at once, never as a timeout, and the
//! connection serves on.

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use msgr::{
    CallError, Connection, Dispatcher, Inbox, Message, Messenger, NullDispatcher, ServiceClient,
    ServiceError, ServiceFault, TypedError,
};
use serde::{Deserialize, Serialize};

/// Long enough never to be the reason a test passes: a fault must come
/// well before it.
const T: Duration = Duration::from_secs(10);

#[derive(Serialize, Deserialize, Debug, PartialEq)]
enum Op {
    Add(u64, u64),
    Echo(String),
    Panic,
    Big(usize),
}

#[derive(Serialize, Deserialize, Debug, PartialEq)]
enum Answer {
    Sum(u64),
    Text(String),
}

fn handle(op: Op) -> Answer {
    match op {
        Op::Add(a, b) => Answer::Sum(a + b),
        Op::Echo(s) => Answer::Text(s),
        Op::Panic => panic!("asked to panic"),
        Op::Big(n) => Answer::Text("x".repeat(n)),
    }
}

async fn handle_async(op: Op) -> Answer {
    tokio::task::yield_now().await; // a handler that really awaits
    handle(op)
}

fn client_of(n: u64, server: &Messenger) -> (Messenger, Connection) {
    let m = client_named(n, fast_config(), Arc::new(NullDispatcher));
    let conn = m.connect(server.addr().expect("bound")).expect("connect");
    (m, conn)
}

fn ops(conn: &Connection) -> ServiceClient<Op, Answer> {
    ServiceClient::new(conn.clone())
}

/// The blocking server (`serve`) and an async one (`serve_async`, two
/// tasks on one inbox), each behind a messenger, the tests run on both.
enum Server {
    Blocking(Messenger),
    Async {
        messenger: Messenger,
        rt: tokio::runtime::Runtime,
        serving: Vec<tokio::task::JoinHandle<u64>>,
    },
}

impl Server {
    fn blocking() -> Server {
        Server::Blocking(server(fast_config(), msgr::serve(handle)))
    }

    fn tasks() -> Server {
        let inbox = Inbox::new();
        let messenger = server(fast_config(), inbox.dispatcher());
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let serving = (0..2)
            .map(|_| {
                let inbox = inbox.clone();
                rt.spawn(async move { msgr::serve_async(&inbox, handle_async).await })
            })
            .collect();
        Server::Async {
            messenger,
            rt,
            serving,
        }
    }

    fn both() -> [Server; 2] {
        [Server::blocking(), Server::tasks()]
    }

    fn messenger(&self) -> &Messenger {
        match self {
            Server::Blocking(m) => m,
            Server::Async { messenger, .. } => messenger,
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Server::Blocking(_) => "serve",
            Server::Async { .. } => "serve_async",
        }
    }

    /// Shuts the server down; an async server's tasks end, and say how
    /// many requests they answered together.
    fn finish(self) -> Option<u64> {
        match self {
            Server::Blocking(mut m) => {
                m.shutdown(Duration::from_secs(1));
                None
            }
            Server::Async {
                mut messenger,
                rt,
                serving,
            } => {
                messenger.shutdown(Duration::from_secs(1));
                rt.block_on(async {
                    let mut answered = 0;
                    for task in serving {
                        answered += tokio::time::timeout(T, task)
                            .await
                            .expect("serving ends at shutdown")
                            .expect("serving task");
                    }
                    Some(answered)
                })
            }
        }
    }
}

#[test]
fn blocking_calls_round_trip_on_both_servers() {
    for srv in Server::both() {
        let (_c, conn) = client_of(1, srv.messenger());
        let svc = ops(&conn);
        for n in 0..100u64 {
            assert_eq!(svc.call(&Op::Add(n, 1), T).unwrap(), Answer::Sum(n + 1));
        }
        let text = "é".repeat(1000);
        assert_eq!(
            svc.call(&Op::Echo(text.clone()), T).unwrap(),
            Answer::Text(text)
        );
        let name = srv.name();
        assert_eq!(srv.finish().unwrap_or(101), 101, "{name}");
    }
}

#[test]
fn async_calls_round_trip_on_both_servers_many_in_flight() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    for srv in Server::both() {
        let (_c, conn) = client_of(1, srv.messenger());
        let svc = ops(&conn);
        let calls: Vec<_> = (0..200u64)
            .map(|n| svc.call_async(&Op::Add(n, n), T))
            .collect();
        rt.block_on(async {
            for (n, call) in (0..200u64).zip(calls) {
                assert_eq!(call.await.unwrap(), Answer::Sum(2 * n), "{}", srv.name());
            }
        });
        // Spawned: the future owns what it needs.
        let spawned = rt.spawn(svc.call_async(&Op::Echo("spawned".into()), T));
        assert_eq!(
            rt.block_on(spawned).unwrap().unwrap(),
            Answer::Text("spawned".into())
        );
        srv.finish();
    }
}

#[test]
fn a_request_that_does_not_decode_gets_a_typed_fault_at_once() {
    for srv in Server::both() {
        let (_c, conn) = client_of(1, srv.messenger());
        // The wrong request type for this service.
        let wrong: ServiceClient<(String, bool), Answer> = ServiceClient::new(conn.clone());
        let started = Instant::now();
        let err = wrong.call(&("not an op".into(), true), T).unwrap_err();
        assert!(
            matches!(err, ServiceError::Fault(ServiceFault::BadRequest(_))),
            "{}: {err:?}",
            srv.name()
        );
        assert!(err.to_string().contains("did not decode"), "{err}");
        // A plain call of another message type: told so, with the types.
        let reply = conn
            .call(Message::new(7, &b"raw"[..], &b""[..]), T)
            .expect("answered");
        assert_eq!(reply.msg_type, msgr::service::FAULT);
        let fault: ServiceFault = reply.decode().unwrap();
        assert!(
            matches!(&fault, ServiceFault::BadRequest(why) if why.contains("message type 7")),
            "{fault:?}"
        );
        let rt = tokio::runtime::Runtime::new().unwrap();
        let err = rt
            .block_on(wrong.call_async(&("async".into(), false), T))
            .unwrap_err();
        assert!(matches!(
            err,
            ServiceError::Fault(ServiceFault::BadRequest(_))
        ));
        assert!(started.elapsed() < T / 2, "faults come at once");
        // The connection serves on.
        assert_eq!(ops(&conn).call(&Op::Add(2, 2), T).unwrap(), Answer::Sum(4));
        // A message that is not a call has no one to answer: dropped,
        // and the service goes on.
        conn.send(Message::new(msgr::service::REQUEST, &b"\xff"[..], &b""[..]))
            .unwrap();
        assert_eq!(ops(&conn).call(&Op::Add(3, 3), T).unwrap(), Answer::Sum(6));
        srv.finish();
    }
}

#[test]
fn concurrent_callers_each_get_their_own_replies() {
    for srv in Server::both() {
        let addr = srv.messenger().addr().expect("bound").clone();
        let shared_client = client_named(100, fast_config(), Arc::new(NullDispatcher));
        let shared = ops(&shared_client.connect(&addr).expect("connect"));
        std::thread::scope(|s| {
            for t in 0..8u64 {
                let shared = shared.clone();
                let addr = addr.clone();
                s.spawn(move || {
                    // Half the threads share one connection, half have their own.
                    let own_messenger;
                    let svc = if t % 2 == 0 {
                        shared
                    } else {
                        own_messenger =
                            client_named(t + 1, fast_config(), Arc::new(NullDispatcher));
                        ops(&own_messenger.connect(&addr).expect("connect"))
                    };
                    for n in 0..200u64 {
                        let key = t * 1_000_000 + n;
                        assert_eq!(svc.call(&Op::Add(key, t), T).unwrap(), Answer::Sum(key + t));
                    }
                });
            }
        });
        let name = srv.name();
        assert_eq!(srv.finish().unwrap_or(1600), 1600, "{name}");
    }
}

#[test]
fn a_panicking_handler_fails_its_request_only() {
    for srv in Server::both() {
        let (_c, conn) = client_of(1, srv.messenger());
        let svc = ops(&conn);
        let started = Instant::now();
        let err = svc.call(&Op::Panic, T).unwrap_err();
        assert!(
            matches!(&err, ServiceError::Fault(ServiceFault::Panicked(why)) if why.contains("asked to panic")),
            "{}: {err:?}",
            srv.name()
        );
        assert!(started.elapsed() < T / 2, "the fault comes at once");
        assert_eq!(
            srv.messenger()
                .counters()
                .handler_panics
                .load(Ordering::Relaxed),
            1,
            "counted as any callback's panic"
        );
        // The same connection serves on: no reset, no reconnect.
        assert_eq!(svc.call(&Op::Add(1, 1), T).unwrap(), Answer::Sum(2));
        assert_eq!(
            srv.messenger()
                .counters()
                .session_resets
                .load(Ordering::Relaxed),
            0
        );
        srv.finish();
    }
}

#[test]
fn a_reply_larger_than_the_caller_takes_is_a_fault_not_a_timeout() {
    for srv in Server::both() {
        let mut cfg = fast_config();
        cfg.set("max_front_bytes", "4096").unwrap();
        let client = client_named(1, cfg, Arc::new(NullDispatcher));
        let conn = client
            .connect(srv.messenger().addr().expect("bound"))
            .unwrap();
        let svc = ops(&conn);
        let started = Instant::now();
        let err = svc.call(&Op::Big(10_000), T).unwrap_err();
        assert!(
            matches!(&err, ServiceError::Fault(ServiceFault::BadReply(why)) if why.contains("10")),
            "{}: {err:?}",
            srv.name()
        );
        assert!(started.elapsed() < T / 2, "the fault comes at once");
        assert_eq!(
            svc.call(&Op::Big(100), T).unwrap(),
            Answer::Text("x".repeat(100))
        );
        srv.finish();
    }
}

/// Answers every call with a message of type 9: not a service.
struct NotAService;
impl Dispatcher for NotAService {
    fn on_message(&self, conn: &Connection, msg: Message) {
        let _ = conn.reply(&msg, Message::new(9, &b""[..], &b""[..]));
    }
}

#[test]
fn client_side_errors_are_typed() {
    let mut srv = server(fast_config(), Arc::new(NotAService));
    let (_c, conn) = client_of(1, &srv);
    let err = ops(&conn).call(&Op::Add(1, 2), T).unwrap_err();
    assert!(
        matches!(
            err,
            ServiceError::Decode(TypedError::WrongType {
                expected: msgr::service::REPLY,
                actual: 9,
                ..
            })
        ),
        "{err:?}"
    );

    /// A request that cannot be encoded.
    struct Unencodable;
    impl Serialize for Unencodable {
        fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
            Err(serde::ser::Error::custom("no"))
        }
    }
    let bad: ServiceClient<Unencodable, u8> = ServiceClient::new(conn.clone());
    assert!(matches!(
        bad.call(&Unencodable, T),
        Err(ServiceError::Encode(_))
    ));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut call = bad.call_async(&Unencodable, T);
    assert!(matches!(
        rt.block_on(&mut call),
        Err(ServiceError::Encode(_))
    ));
    // Polled again after it completed: an error, not a panic.
    assert!(matches!(
        rt.block_on(&mut call),
        Err(ServiceError::Call(CallError::Finished))
    ));

    // No server: the call's own timeout, typed.
    srv.shutdown(Duration::from_secs(1));
    let err = ops(&conn)
        .call(&Op::Add(1, 2), Duration::from_millis(200))
        .unwrap_err();
    assert!(matches!(err, ServiceError::Call(_)), "{err:?}");
}

/// The bar of issue 60: the README's typed KV service (examples/kv.rs,
/// which the README quotes) is at most 35 lines, client and server.
#[test]
fn the_kv_example_is_at_most_35_lines() {
    let kv = include_str!("../examples/kv.rs");
    assert!(kv.lines().count() <= 35, "{} lines", kv.lines().count());
    assert!(kv.contains("msgr::serve(") && kv.contains("ServiceClient"));
}
