//! A poison message — larger than the peer accepts — is refused at `send`
//! once the peer's limits are known (they come with the handshake), and a
//! session that queued one before ends with the reason instead of sending
//! it: zero reconnects, zero frames refused by the peer, the other
//! sessions untouched. (Before, the peer refused the frame, the lossless
//! session reconnected and replayed it into the same refusal for ever.)

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use msgr::{ConnectionState, FaultReason, Messenger, Segment, SendError, TooLarge};

const PEER_MAX_DATA: u32 = 1024;

fn named_client(n: u64, rec: std::sync::Arc<Recorder>) -> Messenger {
    client_named(n, fast_config(), rec)
}

#[test]
fn a_message_too_large_for_the_peer_is_refused_at_send_and_never_replayed() {
    let mut scfg = fast_config();
    scfg.set("max_data_bytes", &PEER_MAX_DATA.to_string())
        .unwrap();
    let srv_rec = Recorder::new();
    let mut srv = server(scfg, srv_rec.clone());

    // Open first: the peer's limit is known, the send is refused at once.
    let rec = Recorder::new();
    let mut cli = named_client(1, rec.clone());
    let conn = cli.connect(srv.addr().expect("bound")).unwrap();
    assert!(wait_until(Duration::from_secs(10), || conn.state()
        == ConnectionState::Open));
    send(&conn, probe_message(1, 1, 100));
    let big = probe_message(1, 2, 2048);
    let refused = conn.send(big.clone()).expect_err("too large");
    assert_eq!(
        refused.error,
        SendError::TooLarge(TooLarge {
            segment: Segment::Data,
            len: 2048,
            max: PEER_MAX_DATA
        })
    );
    assert_eq!(refused.message, big, "the message comes back unchanged");
    send(&conn, probe_message(1, 2, 1000));
    assert!(wait_until(Duration::from_secs(10), || srv_rec.delivered(1) == 2));
    assert_eq!(cli.counters().messages_too_large.load(Ordering::Relaxed), 1);

    // Queued before the handshake told the limit: the session ends with the
    // reason when it would send it, and nothing reaches the wire.
    let connect = |attempt| {
        let rec2 = Recorder::new();
        let cli2 = named_client(2 + 100 * attempt, rec2.clone());
        let conn2 = cli2.connect(srv.addr().expect("bound")).unwrap();
        ((cli2, rec2), conn2)
    };
    let big = probe_message(2, 1, 4096);
    let ((mut cli2, rec2), conn2) = queue_before_handshake(connect, &big, PEER_MAX_DATA);
    assert!(
        wait_until(Duration::from_secs(10), || !rec2
            .resets
            .lock()
            .unwrap()
            .is_empty()),
        "the session ended"
    );
    let resets = rec2.resets.lock().unwrap().clone();
    let want = FaultReason::TooLarge(TooLarge {
        segment: Segment::Data,
        len: 4096,
        max: PEER_MAX_DATA,
    });
    assert_eq!(resets[0].1, want.to_string(), "{resets:?}");
    assert_eq!(conn2.state(), ConnectionState::Closed);

    // Nothing was replayed or refused anywhere, and the first session goes on.
    send(&conn, probe_message(1, 3, 10));
    assert!(wait_until(Duration::from_secs(10), || srv_rec.delivered(1) == 3));
    srv_rec.assert_clean();
    for m in [&cli, &cli2, &srv] {
        let c = m.counters();
        assert_eq!(c.reconnects.load(Ordering::Relaxed), 0);
        assert_eq!(c.protocol_errors.load(Ordering::Relaxed), 0);
    }
    assert_eq!(srv_rec.delivered(2), 0);
    cli.shutdown(Duration::from_secs(2));
    cli2.shutdown(Duration::from_secs(2));
    srv.shutdown(Duration::from_secs(2));
}

/// Several sessions stream while another carries a poison message: only
/// that one ends (with the reason), the others deliver everything, in
/// order, with no reconnect. (A rate comparison is a benchmark's job, not
/// a test's: the sessions never interact, by construction.)
#[test]
fn a_poisoned_session_fails_alone_while_others_stream() {
    let mut scfg = fast_config();
    scfg.set("max_data_bytes", &PEER_MAX_DATA.to_string())
        .unwrap();
    let srv_rec = Recorder::new();
    let mut srv = server(scfg, srv_rec.clone());
    const N: u64 = 3000;
    let good: Vec<(Messenger, msgr::Connection)> = (10..13)
        .map(|i| {
            let m = named_client(i, Recorder::new());
            let c = m.connect(srv.addr().expect("bound")).unwrap();
            (m, c)
        })
        .collect();
    let poisoned_rec = Recorder::new();
    let mut poisoned = named_client(20, poisoned_rec.clone());
    let pconn = poisoned.connect(srv.addr().expect("bound")).unwrap();
    send(&pconn, probe_message(99, 1, 100));
    // Small enough to share a batch frame with the first, too large for
    // the peer: the batch stops before it.
    send(&pconn, probe_message(99, 2, 2048));
    let started = std::time::Instant::now();
    for n in 1..=N {
        for (i, (_, c)) in good.iter().enumerate() {
            send(c, probe_message(i as u32, n, 100));
        }
    }
    assert!(
        wait_until(Duration::from_secs(60), || (0..3)
            .all(|i| srv_rec.delivered(i) == N)),
        "the streaming sessions delivered everything"
    );
    println!(
        "3 x {N} messages beside a poisoned session in {:?}",
        started.elapsed()
    );
    srv_rec.assert_clean();
    assert!(wait_until(Duration::from_secs(10), || !poisoned_rec
        .resets
        .lock()
        .unwrap()
        .is_empty()));
    assert!(poisoned_rec.resets.lock().unwrap()[0]
        .1
        .contains("more than the peer takes"));
    assert!(
        wait_until(Duration::from_secs(10), || srv_rec.delivered(99) == 1),
        "the message before it arrived"
    );
    assert_eq!(srv_rec.last(99), 1, "and not it");
    for (m, _) in &good {
        assert_eq!(m.counters().reconnects.load(Ordering::Relaxed), 0);
        assert!(m.counters().session_resets.load(Ordering::Relaxed) == 0);
    }
    for (mut m, _) in good {
        m.shutdown(Duration::from_secs(2));
    }
    poisoned.shutdown(Duration::from_secs(2));
    srv.shutdown(Duration::from_secs(2));
}
