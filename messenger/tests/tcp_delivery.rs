//! Delivery guarantees over real loopback TCP sockets.

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use msgr::{ConnectionState, Policy, RealFault};
use rand::{Rng, SeedableRng};

/// 100k messages, most 0 B–4 KiB and a few hundred up to 4 MiB, arrive in
/// order with intact bytes.
#[test]
fn ordering_and_integrity_100k_mixed_sizes() {
    let seed: u64 = rand::random();
    println!("seed {seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let rec = Recorder::new();
    let mut srv = server(fast_config(), rec.clone());
    let mut cli = client(fast_config(), Arc::new(msgr::NullDispatcher));
    let conn = cli.connect(srv.addr().expect("bound")).unwrap();
    const N: u64 = 100_000;
    let mut big = 0;
    for n in 1..=N {
        let len = if rng.random_ratio(3, 1000) {
            big += 1;
            rng.random_range(4096..=4 << 20)
        } else {
            rng.random_range(0..=4096)
        };
        send(&conn, probe_message(1, n, len));
    }
    assert!(
        wait_until(Duration::from_secs(120), || rec.delivered(1) == N),
        "delivered {} of {N}",
        rec.delivered(1)
    );
    rec.assert_clean();
    println!("{big} large messages");
    assert!(
        big > 100,
        "the mix must include a few hundred large messages"
    );
    assert!(
        wait_until(Duration::from_secs(10), || conn.queued() == (0, 0)),
        "acks drain the queue"
    );
    // The counters agree with what went and came: on a clean link nothing
    // is sent twice, so the client's tx figures are the server's rx ones
    // (which the worker adds once it is done with a batch: soon after the
    // dispatcher saw the last message).
    let (c, s) = (cli.counters(), srv.counters());
    let counted = wait_until(Duration::from_secs(10), || {
        s.rx_messages.load(Ordering::Relaxed) == N
    });
    assert!(
        counted,
        "server counted {} of {N}",
        s.rx_messages.load(Ordering::Relaxed)
    );
    assert_eq!(c.tx_messages.load(Ordering::Relaxed), N);
    assert_eq!(
        s.rx_bytes.load(Ordering::Relaxed),
        c.tx_bytes.load(Ordering::Relaxed),
        "payload bytes received = sent"
    );
    // Every frame left intact: a CRC error would mean the sender scrambled
    // its own output (the CRC makes the session recover, hiding it otherwise).
    for (who, m) in [("client", &cli), ("server", &srv)] {
        let errors = m.counters().protocol_errors.load(Ordering::Relaxed);
        assert_eq!(
            errors, 0,
            "{who} saw {errors} protocol errors on a clean link"
        );
    }
    let r = cli.shutdown(Duration::from_secs(5));
    assert_eq!(r.undelivered, 0);
    assert_eq!(r.leaked_links, 0);
    srv.shutdown(Duration::from_secs(5));
    assert_eq!(srv.rx_held(), (0, 0), "every delivered buffer was returned");
}

/// Connections are cut from outside the session engine (abortive close of the
/// socket) hundreds of times while a stream flows; every message arrives
/// exactly once, in order.
#[test]
fn lossless_exactly_once_across_hundreds_of_cuts() {
    init_tracing();
    let rec = Recorder::new();
    let mut srv = server(fast_config(), rec.clone());
    let mut cli = client(fast_config(), Arc::new(msgr::NullDispatcher));
    let conn = cli
        .connect_with(srv.addr().expect("bound"), Policy::LosslessClient)
        .unwrap();
    const N: u64 = 200_000;
    const CUTS: u64 = 300;
    let seed: u64 = rand::random();
    println!("seed {seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let sender = {
        let conn = conn.clone();
        std::thread::spawn(move || {
            for n in 1..=N {
                send(&conn, probe_message(1, n, (n % 700) as usize));
            }
        })
    };
    // Cuts start once the session exists: a cut during the very first handshake
    // is a failed connect, not a resumed session.
    assert!(wait_until(Duration::from_secs(10), || conn.state()
        == ConnectionState::Open));
    let mut cuts = 0;
    for i in 0..CUTS {
        let before = cli.counters().reconnects.load(Ordering::Relaxed);
        std::thread::sleep(Duration::from_micros(rng.random_range(0..3000)));
        // Alternate sides: the client's socket and the server's.
        if i % 2 == 0 {
            conn.inject_fault(RealFault::Abort);
        } else if let Some(c) = srv.connections().first() {
            c.inject_fault(RealFault::Abort);
        }
        cuts += 1;
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
    let injected = cli.counters().injected_faults.load(Ordering::Relaxed)
        + srv.counters().injected_faults.load(Ordering::Relaxed);
    let replayed = cli.counters().replayed_messages.load(Ordering::Relaxed);
    println!(
        "cuts {cuts}, injected {injected}, client reconnects {reconnects}, replayed {replayed}"
    );
    assert!(
        injected >= CUTS * 9 / 10,
        "faults were injected ({injected})"
    );
    assert!(
        reconnects >= CUTS * 9 / 10,
        "sessions resumed after the cuts ({reconnects})"
    );
    // Cuts are the only faults: the replays after them arrive intact (a
    // scrambled replay is caught by its CRC and costs another reconnect).
    let errors = srv.counters().protocol_errors.load(Ordering::Relaxed);
    assert_eq!(
        errors, 0,
        "replays reached the server corrupted {errors} times"
    );
    assert!(
        rec.resets.lock().unwrap().is_empty(),
        "lossless sessions never reset"
    );
    cli.shutdown(Duration::from_secs(5));
    srv.shutdown(Duration::from_secs(5));
}

/// Sealed payloads (`Message::with_data_checksum`: the checksum computed
/// once, then taken by every send of the message, replays after cuts
/// included) arrive intact and in order, and a large message arrives
/// knowing its checksum, checked on the way in; small ones do not keep it.
#[test]
fn sealed_payloads_arrive_intact_across_cuts() {
    let rec = Recorder::new();
    let mut srv = server(fast_config(), rec.clone());
    let mut cli = client(fast_config(), Arc::new(msgr::NullDispatcher));
    let conn = cli
        .connect_with(srv.addr().expect("bound"), Policy::LosslessClient)
        .unwrap();
    assert!(wait_until(Duration::from_secs(10), || conn.state()
        == ConnectionState::Open));
    const N: u64 = 400;
    let large = |n: u64| n.is_multiple_of(2);
    for n in 1..=N {
        let len = if large(n) { 200_000 } else { 1000 };
        send(&conn, probe_message(1, n, len).with_data_checksum());
        if n.is_multiple_of(40) {
            conn.inject_fault(RealFault::Abort);
        }
    }
    assert!(
        wait_until(Duration::from_secs(60), || rec.delivered(1) == N),
        "delivered {} of {N}",
        rec.delivered(1)
    );
    rec.assert_clean();
    let known = rec.streams.lock().unwrap()[&1].checksum_known;
    assert_eq!(
        known,
        N / 2,
        "large messages know their checksum, small not"
    );
    assert!(cli.counters().injected_faults.load(Ordering::Relaxed) >= 5);
    let errors = srv.counters().protocol_errors.load(Ordering::Relaxed);
    assert_eq!(errors, 0, "a sealed checksum did not match its data");
    cli.shutdown(Duration::from_secs(5));
    srv.shutdown(Duration::from_secs(5));
}

/// A lossy connection: a fault resets it, the dispatcher hears on_reset, and
/// nothing is delivered twice.
#[test]
fn lossy_fault_resets_and_never_duplicates() {
    let rec = Recorder::new();
    let cli_rec = Recorder::new();
    let mut srv = server(fast_config(), rec.clone());
    let mut cli = client(fast_config(), cli_rec.clone());
    let conn = cli
        .connect_with(srv.addr().expect("bound"), Policy::LossyClient)
        .unwrap();
    for n in 1..=2000 {
        send(&conn, probe_message(1, n, 100));
    }
    assert!(wait_until(Duration::from_secs(20), || rec.delivered(1) == 2000));
    conn.inject_fault(RealFault::Abort);
    assert!(
        wait_until(Duration::from_secs(10), || conn.state()
            == ConnectionState::Closed),
        "a lossy connection ends on a fault"
    );
    assert!(
        wait_until(Duration::from_secs(5), || !cli_rec
            .resets
            .lock()
            .unwrap()
            .is_empty()),
        "client heard on_reset"
    );
    assert!(
        wait_until(Duration::from_secs(5), || !rec
            .resets
            .lock()
            .unwrap()
            .is_empty()),
        "server heard on_reset"
    );
    assert!(
        conn.send(probe_message(1, 2001, 1)).is_err(),
        "a reset connection refuses sends"
    );
    // A new connection is a new session; the old stream is never redelivered.
    let conn2 = cli
        .connect_with(srv.addr().expect("bound"), Policy::LossyClient)
        .unwrap();
    assert_ne!(conn2.id(), conn.id());
    for n in 2001..=3000 {
        send(&conn2, probe_message(1, n, 100));
    }
    assert!(wait_until(Duration::from_secs(20), || rec.last(1) == 3000));
    rec.assert_clean();
    cli.shutdown(Duration::from_secs(5));
    srv.shutdown(Duration::from_secs(5));
}

/// A connect made right after `mark_down` gets a new session, not the
/// handle of the one being torn down (which would end, with what was sent
/// on it, once the worker got to it). The stress suite met that under
/// load: the handle it reconnected with was reset "marked down".
#[test]
fn connect_after_mark_down_is_a_new_session() {
    init_tracing();
    let rec = Recorder::new();
    let cli_rec = Recorder::new();
    let mut srv = server(fast_config(), rec.clone());
    let mut cli = client(fast_config(), cli_rec.clone());
    for round in 0..20u32 {
        let old = cli.connect(srv.addr().expect("bound")).unwrap();
        for n in 1..=5 {
            send(&old, probe_message(1000 + round, n, 10));
        }
        old.mark_down();
        let new = cli.connect(srv.addr().expect("bound")).unwrap();
        assert_ne!(
            new.id(),
            old.id(),
            "round {round}: the ending session again"
        );
        for n in 1..=5 {
            send(&new, probe_message(round, n, 10));
        }
        assert!(
            wait_until(Duration::from_secs(10), || rec.delivered(round) == 5),
            "round {round}: the new session delivered {} of 5 ({:?})",
            rec.delivered(round),
            new.state()
        );
        assert_ne!(new.state(), ConnectionState::Closed, "round {round}");
        let resets = cli_rec.resets.lock().unwrap().clone();
        assert!(
            resets.iter().all(|(id, _)| *id != new.id()),
            "round {round}: the new session was reset: {resets:?}"
        );
        new.mark_down();
    }
    rec.assert_clean();
    cli.shutdown(Duration::from_secs(5));
    srv.shutdown(Duration::from_secs(5));
}

/// Two lossless peers connect to each other at the same moment: one session
/// survives, no message is lost or duplicated.
#[test]
fn simultaneous_connect_keeps_one_session() {
    for round in 0..10 {
        let rec_a = Recorder::new();
        let rec_b = Recorder::new();
        let mut a = msgr::Messenger::builder(msgr::EntityName::peer(1))
            .config(fast_config())
            .bind("tcp://127.0.0.1:0".parse().unwrap())
            .start(rec_a.clone())
            .unwrap();
        let mut b = msgr::Messenger::builder(msgr::EntityName::peer(2))
            .config(fast_config())
            .bind("tcp://127.0.0.1:0".parse().unwrap())
            .start(rec_b.clone())
            .unwrap();
        let (addr_a, addr_b) = (
            a.addr().expect("bound").clone(),
            b.addr().expect("bound").clone(),
        );
        let barrier = std::sync::Barrier::new(2);
        let (ca, cb) = std::thread::scope(|s| {
            let ta = s.spawn(|| {
                barrier.wait();
                a.connect_with(&addr_b, Policy::LosslessPeer).unwrap()
            });
            let tb = s.spawn(|| {
                barrier.wait();
                b.connect_with(&addr_a, Policy::LosslessPeer).unwrap()
            });
            (ta.join().unwrap(), tb.join().unwrap())
        });
        for n in 1..=500 {
            send(&ca, probe_message(1, n, 64));
            send(&cb, probe_message(2, n, 64));
        }
        assert!(
            wait_until(Duration::from_secs(20), || rec_b.delivered(1) == 500
                && rec_a.delivered(2) == 500),
            "round {round}: a->b {} b->a {}",
            rec_b.delivered(1),
            rec_a.delivered(2)
        );
        rec_a.assert_clean();
        rec_b.assert_clean();
        assert_eq!(a.connections().len(), 1, "round {round}: one session at a");
        assert_eq!(b.connections().len(), 1, "round {round}: one session at b");
        assert!(rec_a.resets.lock().unwrap().is_empty() && rec_b.resets.lock().unwrap().is_empty());
        a.shutdown(Duration::from_secs(5));
        b.shutdown(Duration::from_secs(5));
    }
}

/// A peer that stops answering is detected by the keepalive timeout.
#[test]
fn silent_peer_is_detected_by_keepalive_timeout() {
    // A raw listener that completes the TCP handshake, then never says a word.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let hold = std::thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        std::thread::sleep(Duration::from_secs(6));
        drop(s);
    });
    let rec = Recorder::new();
    let mut cfg = fast_config();
    cfg.session.handshake_timeout = Duration::from_millis(800);
    let mut cli = client(cfg, rec.clone());
    let conn = cli
        .connect_with(
            &format!("tcp://127.0.0.1:{port}").parse().unwrap(),
            Policy::LossyClient,
        )
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(5), || conn.state()
            == ConnectionState::Closed),
        "silent peer detected"
    );
    let resets = rec.resets.lock().unwrap().clone();
    assert!(
        resets.iter().any(|(_, r)| r.contains("timeout")),
        "{resets:?}"
    );

    // Once open, a peer that hangs (reads and writes nothing) trips the keepalive timeout.
    let srv_rec = Recorder::new();
    let mut srv = server(fast_config(), srv_rec.clone());
    let conn = cli
        .connect_with(srv.addr().expect("bound"), Policy::LossyClient)
        .unwrap();
    assert!(wait_until(Duration::from_secs(5), || conn.state()
        == ConnectionState::Open));
    srv.connections()[0].inject_fault(RealFault::Freeze);
    assert!(
        wait_until(Duration::from_secs(10), || conn.state()
            == ConnectionState::Closed),
        "keepalive timeout fired"
    );
    assert!(cli.counters().keepalive_timeouts.load(Ordering::Relaxed) >= 1);
    cli.shutdown(Duration::from_secs(2));
    srv.shutdown(Duration::from_secs(2));
    hold.join().unwrap();
}

/// With several workers, accepted links move to the worker that owns their
/// peer's session; delivery is unaffected, and so are cuts.
#[test]
fn multi_worker_routing_and_cuts() {
    let rec = Recorder::new();
    let mut scfg = fast_config();
    scfg.workers = 3;
    let mut srv = server(scfg, rec.clone());
    let mut clients = Vec::new();
    for c in 0..6u32 {
        let mut ccfg = fast_config();
        ccfg.workers = 2;
        let m = client(ccfg, Arc::new(msgr::NullDispatcher));
        let conn = m
            .connect_with(srv.addr().expect("bound"), Policy::LosslessClient)
            .unwrap();
        clients.push((c, m, conn));
    }
    for round in 0..4u64 {
        for (c, _, conn) in &clients {
            for i in 1..=500u64 {
                send(conn, probe_message(*c, round * 500 + i, (i % 300) as usize));
            }
            if round == 1 {
                conn.inject_fault(RealFault::Abort);
            }
        }
    }
    for (c, _, _) in &clients {
        assert!(
            wait_until(Duration::from_secs(30), || rec.delivered(*c) == 2000),
            "client {c}: {} of 2000",
            rec.delivered(*c)
        );
    }
    rec.assert_clean();
    assert_eq!(
        srv.connections().len(),
        clients.len(),
        "one session per client"
    );
    for (_, mut m, _) in clients {
        assert_eq!(m.shutdown(Duration::from_secs(5)).leaked_links, 0);
    }
    assert_eq!(srv.shutdown(Duration::from_secs(5)).leaked_links, 0);
}

/// Batches keep their order with single sends, and are all-or-nothing against
/// the queue bound.
#[test]
fn send_batch_orders_and_bounds() {
    let rec = Recorder::new();
    let mut srv = server(fast_config(), rec.clone());
    let mut ccfg = fast_config();
    ccfg.session.max_queued_messages = 1000;
    let mut cli = client(ccfg, Arc::new(msgr::NullDispatcher));
    let conn = cli.connect(srv.addr().expect("bound")).unwrap();
    let mut n = 0u64;
    for round in 0..200 {
        if round % 3 == 0 {
            n += 1;
            send(&conn, probe_message(1, n, 10));
        }
        let batch: Vec<_> = (0..50)
            .map(|_| {
                n += 1;
                probe_message(1, n, 64)
            })
            .collect();
        // A refused batch comes back whole, to be sent again as it is.
        let mut batch = Some(batch);
        assert!(wait_until(Duration::from_secs(10), || {
            match conn.send_batch(batch.take().expect("a batch to send")) {
                Ok(()) => true,
                Err(msgr::SendRejected {
                    error: msgr::SendError::QueueFull { .. },
                    message,
                }) => {
                    batch = Some(message);
                    false
                }
                Err(e) => panic!("{e}"),
            }
        }));
    }
    assert!(
        wait_until(Duration::from_secs(20), || rec.delivered(1) == n),
        "{} of {n}",
        rec.delivered(1)
    );
    rec.assert_clean();
    // A batch larger than the whole bound can never fit: refused, nothing queued.
    let huge: Vec<_> = (0..1001).map(|i| probe_message(2, i + 1, 1)).collect();
    let refused = conn.send_batch(huge.clone()).expect_err("over the bound");
    assert!(
        matches!(refused.error, msgr::SendError::QueueFull { .. }),
        "{refused}"
    );
    assert_eq!(refused.message, huge, "the batch comes back unchanged");
    assert!(wait_until(Duration::from_secs(10), || conn.queued() == (0, 0)));
    assert_eq!(rec.delivered(2), 0);
    cli.shutdown(Duration::from_secs(5));
    srv.shutdown(Duration::from_secs(5));
}

/// `payload_crc = false` is an agreement: with it on both sides payloads go
/// unchecked, with it on one side they stay checked — either way every
/// message arrives intact, in order, with no protocol error (a sender that
/// flagged frames the receiver does not accept would show up as errors and
/// reconnects).
#[test]
fn unchecked_payloads_both_sides_and_one_side() {
    for (client_crc, server_crc) in [(false, false), (false, true), (true, false)] {
        let cfg = |crc: bool| {
            let mut c = fast_config();
            c.session.payload_crc = crc;
            c
        };
        let rec = Recorder::new();
        let mut srv = server(cfg(server_crc), rec.clone());
        let mut cli = client(cfg(client_crc), Arc::new(msgr::NullDispatcher));
        let conn = cli.connect(srv.addr().expect("bound")).unwrap();
        const N: u64 = 3000;
        for n in 1..=N {
            let len = if n % 100 == 0 {
                300_000
            } else {
                (n as usize * 37) % 5000
            };
            send(&conn, probe_message(1, n, len));
        }
        assert!(
            wait_until(Duration::from_secs(60), || rec.delivered(1) == N),
            "client crc {client_crc}, server crc {server_crc}: delivered {} of {N}",
            rec.delivered(1)
        );
        rec.assert_clean();
        for (who, m) in [("client", &cli), ("server", &srv)] {
            let c = m.counters();
            let errors = c.protocol_errors.load(Ordering::Relaxed);
            assert_eq!(errors, 0, "{who}: {errors} protocol errors");
        }
        let r = cli.shutdown(Duration::from_secs(5));
        assert_eq!((r.undelivered, r.leaked_links), (0, 0));
        srv.shutdown(Duration::from_secs(5));
    }
}
