//! The libfabric backend with the real `tcp` provider (FI_EP_MSG) on
//! loopback: two messengers bound to `fabric+tcp://127.0.0.1:0`.

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use msgr::{Availability, ConnectionState, EntityName, Messenger, Policy, RealFault};
use rand::{Rng, SeedableRng};

const ADDR: &str = "fabric+tcp://127.0.0.1:0";

fn fabric_server(d: Arc<dyn msgr::Dispatcher>) -> Messenger {
    Messenger::builder(EntityName::server(1))
        .config(fast_config())
        .bind(ADDR.parse().expect("addr"))
        .start(d)
        .expect("start fabric server")
}

fn fabric_client(d: Arc<dyn msgr::Dispatcher>) -> Messenger {
    Messenger::builder(EntityName::client(1))
        .config(fast_config())
        .bind(ADDR.parse().expect("addr"))
        .start(d)
        .expect("start fabric client")
}

#[test]
fn tcp_provider_is_available_and_a_missing_one_is_named() {
    let tcp: msgr::EntityAddr = ADDR.parse().unwrap();
    assert_eq!(msgr::availability(&tcp.transport), Availability::Available);
    let none: msgr::EntityAddr = "fabric+nosuchprov://127.0.0.1:1".parse().unwrap();
    match msgr::availability(&none.transport) {
        Availability::Unavailable(r) => assert!(r.contains("nosuchprov"), "{r}"),
        Availability::Available => panic!("nosuchprov is not a provider"),
    }
}

/// Thousands of messages, most small and some up to 1 MiB (split over
/// several 64 KiB messages), arrive in order with intact bytes.
#[test]
fn ordering_and_integrity_mixed_sizes() {
    init_tracing();
    let seed: u64 = rand::random();
    println!("seed {seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let rec = Recorder::new();
    let mut srv = fabric_server(rec.clone());
    println!("server bound to {}", srv.addr());
    assert_ne!(srv.addr().socket.port(), 0);
    let mut cli = fabric_client(Arc::new(msgr::NullDispatcher));
    let conn = cli.connect(srv.addr()).unwrap();
    const N: u64 = 5_000;
    let mut big = 0;
    let t0 = std::time::Instant::now();
    for n in 1..=N {
        let len = if rng.random_ratio(1, 100) {
            big += 1;
            rng.random_range(64 << 10..=1 << 20)
        } else {
            rng.random_range(0..=8192)
        };
        send(&conn, probe_message(1, n, len));
    }
    assert!(
        wait_until(Duration::from_secs(120), || rec.delivered(1) == N),
        "delivered {} of {N}",
        rec.delivered(1)
    );
    rec.assert_clean();
    let bytes = rec.streams.lock().unwrap()[&1].bytes;
    println!(
        "{N} messages ({big} of 64 KiB..1 MiB), {bytes} bytes in {:?}",
        t0.elapsed()
    );
    assert!(
        wait_until(Duration::from_secs(10), || conn.queued() == (0, 0)),
        "acks drain the queue"
    );
    let r = cli.shutdown(Duration::from_secs(5));
    assert_eq!(r.undelivered, 0);
    assert_eq!(r.leaked_links, 0);
    srv.shutdown(Duration::from_secs(5));
}

/// Endpoints are closed under the session (injected Abort, alternating
/// sides) while a lossless stream flows: every message arrives exactly once,
/// in order.
#[test]
fn lossless_exactly_once_across_endpoint_aborts() {
    init_tracing();
    let rec = Recorder::new();
    let mut srv = fabric_server(rec.clone());
    let mut cli = fabric_client(Arc::new(msgr::NullDispatcher));
    let conn = cli
        .connect_with(srv.addr(), Policy::LosslessClient)
        .unwrap();
    const N: u64 = 20_000;
    const CUTS: u64 = 20;
    let sender = {
        let conn = conn.clone();
        std::thread::spawn(move || {
            for n in 1..=N {
                send(&conn, probe_message(1, n, (n % 3000) as usize));
            }
        })
    };
    assert!(wait_until(Duration::from_secs(10), || conn.state()
        == ConnectionState::Open));
    for i in 0..CUTS {
        let before = cli.counters().reconnects.load(Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(5));
        if i % 2 == 0 {
            conn.inject_fault(RealFault::Abort);
        } else if let Some(c) = srv.connections().first() {
            c.inject_fault(RealFault::Abort);
        }
        assert!(
            wait_until(Duration::from_secs(10), || cli
                .counters()
                .reconnects
                .load(Ordering::Relaxed)
                > before),
            "session resumed after cut {i} (delivered so far {})",
            rec.delivered(1)
        );
    }
    sender.join().unwrap();
    assert!(
        wait_until(Duration::from_secs(60), || rec.delivered(1) == N),
        "delivered {} of {N}",
        rec.delivered(1)
    );
    rec.assert_clean();
    let reconnects = cli.counters().reconnects.load(Ordering::Relaxed);
    let replayed = cli.counters().replayed_messages.load(Ordering::Relaxed);
    println!("cuts {CUTS}, client reconnects {reconnects}, replayed {replayed}");
    assert!(
        rec.resets.lock().unwrap().is_empty(),
        "lossless sessions never reset"
    );
    cli.shutdown(Duration::from_secs(5));
    srv.shutdown(Duration::from_secs(5));
}
