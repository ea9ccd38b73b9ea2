//! The fault plan at the transport boundary: failed links, corrupted frames,
//! delays and handshake failures, on both sides; lossless delivery holds and
//! every corruption is caught by the CRCs.

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use msgr::{FaultPlan, Policy};

#[test]
fn lossless_delivery_holds_under_a_fault_plan() {
    let seed: u64 = rand::random();
    println!("seed {seed}");
    // One-in-N operations of the transport: a unit sent is one, and
    // these messages travel about ten to a batch frame.
    let plan = |s: u64| -> FaultPlan {
        format!("seed={s},fail=400,corrupt=300,delay=40,delay_max_ms=3,handshake=8")
            .parse()
            .unwrap()
    };
    let mut scfg = fast_config();
    scfg.faults = Some(plan(seed));
    let mut ccfg = fast_config();
    ccfg.faults = Some(plan(seed.wrapping_add(1)));
    let rec = Recorder::new();
    let mut srv = server(scfg, rec.clone());
    let mut cli = client(ccfg, Arc::new(msgr::NullDispatcher));
    let conn = cli
        .connect_with(srv.addr().expect("bound"), Policy::LosslessClient)
        .unwrap();
    const N: u64 = 30_000;
    for n in 1..=N {
        send(&conn, probe_message(1, n, (n as usize * 7) % 3000));
    }
    assert!(
        wait_until(Duration::from_secs(120), || rec.delivered(1) == N),
        "seed {seed}: delivered {} of {N}",
        rec.delivered(1)
    );
    rec.assert_clean();
    assert!(
        rec.resets.lock().unwrap().is_empty(),
        "seed {seed}: lossless never resets"
    );
    let c = cli.counters();
    let s = srv.counters();
    let injected =
        c.injected_faults.load(Ordering::Relaxed) + s.injected_faults.load(Ordering::Relaxed);
    let caught =
        c.protocol_errors.load(Ordering::Relaxed) + s.protocol_errors.load(Ordering::Relaxed);
    let reconnects = c.reconnects.load(Ordering::Relaxed);
    println!(
        "injected {injected}, protocol errors {caught}, reconnects {reconnects}, tx {} / {}",
        c.tx_messages.load(Ordering::Relaxed),
        s.tx_messages.load(Ordering::Relaxed)
    );
    assert!(injected > 50, "faults were injected ({injected})");
    assert!(
        caught >= 2,
        "corrupted frames were caught by CRC and turned into link faults ({caught})"
    );
    assert!(
        reconnects > 20,
        "the session resumed many times ({reconnects})"
    );
    cli.shutdown(Duration::from_secs(5));
    srv.shutdown(Duration::from_secs(5));
}

/// A connection that cannot reach its peer says why: its phase, its fault
/// count and the transport's error, until the peer is there.
#[test]
fn status_tells_why_a_connection_is_not_open() {
    // A port nobody listens on (bound, read, released).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let target: msgr::EntityAddr = format!("tcp://127.0.0.1:{port}").parse().unwrap();
    let cli = client(fast_config(), Arc::new(msgr::NullDispatcher));
    let conn = cli.connect_with(&target, Policy::LosslessClient).unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || conn.status().faults >= 2),
        "redials fail: {:?}",
        conn.status()
    );
    let st = conn.status();
    assert_eq!(st.state, msgr::ConnectionState::Connecting, "{st:?}");
    assert!(
        [msgr::Phase::Connecting, msgr::Phase::StandingBy].contains(&st.phase),
        "{st:?}"
    );
    match &st.last_fault {
        Some(msgr::FaultReason::Transport(why)) => {
            assert!(why.to_string().to_lowercase().contains("refused"), "{st:?}")
        }
        other => panic!("a transport fault, not {other:?}"),
    }

    // Open: the phase follows, the history stays.
    let srv = server(fast_config(), Recorder::new());
    let conn = cli
        .connect_with(srv.addr().expect("bound"), Policy::LosslessClient)
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || conn.state()
            == msgr::ConnectionState::Open),
        "{:?}",
        conn.status()
    );
    let st = conn.status();
    assert_eq!(
        (st.phase, st.faults, st.last_fault),
        (msgr::Phase::Open, 0, None)
    );
}

/// A lossless stream to a server listening on two addresses (an address
/// vector on the client's side): the first is taken out of service
/// mid-stream (`unbind`: its listener closed, its links aborted) and the
/// session goes on over the second — every message exactly once, in
/// order — reporting how long from the fault to the session moving.
#[test]
fn a_session_moves_to_the_next_address_when_its_listener_goes() {
    let rec = Recorder::new();
    let mut srv = msgr::Messenger::builder(msgr::EntityName::server(1))
        .config(fast_config())
        .bind("tcp://127.0.0.1:0".parse().unwrap())
        .bind("tcp://[::1]:0".parse().unwrap())
        .start(rec.clone())
        .unwrap();
    let addrs = srv.addrs();
    assert_eq!(addrs.len(), 2);
    let mut cli = client(fast_config(), Arc::new(msgr::NullDispatcher));
    let conn = cli.connect_any(&addrs, Policy::LosslessClient).unwrap();
    const N: u64 = 20_000;
    // The fault comes from another thread while this one streams, so
    // messages are in flight (and unacknowledged) when it strikes.
    let took = std::thread::scope(|scope| {
        let faulter = scope.spawn(|| {
            assert!(wait_until(Duration::from_secs(20), || rec.delivered(1) >= N / 4));
            let fault = std::time::Instant::now();
            assert!(srv.unbind(&addrs.0[0]));
            // Polled at 2 ms: an upper bound.
            let moved = wait_until(Duration::from_secs(30), || {
                cli.counters().transport_changes.load(Ordering::Relaxed) >= 1
            });
            assert!(moved, "the session moved to the second address");
            fault.elapsed()
        });
        for n in 1..=N {
            send(&conn, probe_message(1, n, (n as usize * 37) % 9000));
        }
        faulter.join().expect("faulter")
    });
    assert!(
        wait_until(Duration::from_secs(60), || rec.delivered(1) == N),
        "delivered {} of {N}",
        rec.delivered(1)
    );
    rec.assert_clean();
    assert!(rec.resets.lock().unwrap().is_empty());
    println!(
        "moved within {took:?} of the fault (polled: an upper bound; reconnect delay configured \
         {:?}..{:?}); reconnects {}, replayed {}",
        fast_config().session.backoff_min,
        fast_config().session.backoff_max,
        cli.counters().reconnects.load(Ordering::Relaxed),
        cli.counters().replayed_messages.load(Ordering::Relaxed),
    );
    assert_eq!(
        srv.addrs().len(),
        1,
        "the first address is no longer listened on"
    );
    cli.shutdown(Duration::from_secs(5));
    srv.shutdown(Duration::from_secs(5));
}
