//! The session engine end to end, over the in-memory simulator (`sim` feature):
//! byte-stream links, virtual time, injected faults.

use std::time::Duration;

use bytes::Bytes;
use msgr_addr::EntityName;
use msgr_proto::auth::{Credentials, Keyring, ModeSet, Security, StaticKeypair};
use msgr_proto::session::{FaultReason, Policy, SendError, SessionConfig, SessionEvent};
use msgr_proto::sim::{FaultRates, NodeId, SessionId, Sim, SimConfig};
use msgr_proto::Message;
use proptest::prelude::*;
use rand::Rng;
use std::sync::Arc;

fn msg(from: &str, i: u64) -> Message {
    Message::new(
        1,
        format!("{from}:{i}").into_bytes(),
        Bytes::from(vec![i as u8; (i % 7) as usize]),
    )
}

/// The counters of the messages `node` received from `from`, in delivery order.
fn received(sim: &Sim, node: NodeId, from: &str) -> Vec<u64> {
    sim.delivered(node)
        .into_iter()
        .filter_map(|(_, m)| {
            let s = String::from_utf8(m.front.to_vec()).expect("utf8 front");
            let (who, n) = s.split_once(':').expect("tagged front");
            (who == from).then(|| n.parse().expect("counter"))
        })
        .collect()
}

fn events_of(sim: &Sim, node: NodeId) -> Vec<SessionEvent> {
    sim.log()
        .iter()
        .filter(|l| l.node == node)
        .map(|l| l.event.clone())
        .collect()
}

fn count(sim: &Sim, node: NodeId, pred: impl Fn(&SessionEvent) -> bool) -> usize {
    events_of(sim, node).iter().filter(|e| pred(e)).count()
}

fn client_server(seed: u64, cfg: SimConfig) -> (Sim, NodeId, NodeId) {
    let mut sim = Sim::new(seed, cfg);
    let c = sim.add_node(EntityName::client(1), false);
    let s = sim.add_node(EntityName::server(1), true);
    (sim, c, s)
}

fn send_all(sim: &mut Sim, node: NodeId, id: SessionId, tag: &str, range: std::ops::Range<u64>) {
    for i in range {
        sim.send(node, id, msg(tag, i)).expect("queue has room");
    }
}

#[test]
fn handshake_and_message_flow() {
    let (mut sim, c, s) = client_server(1, SimConfig::default());
    let id = sim.connect(c, s, Policy::LosslessClient);
    send_all(&mut sim, c, id, "c", 0..20);
    sim.set_echo(s, true);
    assert!(
        sim.run_until_pred(Duration::from_secs(5), |sim| received(sim, c, "c").len()
            == 20)
    );
    assert_eq!(received(&sim, s, "c"), (0..20).collect::<Vec<_>>());
    assert_eq!(received(&sim, c, "c"), (0..20).collect::<Vec<_>>());
    // Each side saw exactly one Established, naming the other.
    let est: Vec<_> = sim
        .log()
        .iter()
        .filter_map(|l| match &l.event {
            SessionEvent::Established(p) => Some((l.node, p.name.clone(), p.addr.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(est.len(), 2, "{est:?}");
    assert!(est.contains(&(c, EntityName::server(1), sim.addr(s))));
    assert!(est.contains(&(s, EntityName::client(1), sim.addr(c))));
    let sess = sim.session(c, id).expect("session");
    assert!(sess.is_open());
    assert_ne!(sess.features(), 0);
    assert_eq!(sess.stats().tx_messages, 20);
    assert_eq!(sess.stats().rx_messages, 20);
    // Everything sent was acknowledged: nothing left queued on either side.
    sim.run_for(Duration::from_millis(50));
    for (_, x) in sim.sessions(c).chain(sim.sessions(s)) {
        assert_eq!(x.queued_messages(), 0);
    }
}

#[test]
fn messages_larger_than_a_piece_and_empty_ones_arrive_intact() {
    let (mut sim, c, s) = client_server(2, SimConfig::default());
    let id = sim.connect(c, s, Policy::LosslessClient);
    let big = Message::new(3, vec![1u8; 5000], vec![2u8; 70_000]);
    let empty = Message::new(4, Bytes::new(), Bytes::new());
    sim.send(c, id, big.clone()).unwrap();
    sim.send(c, id, empty.clone()).unwrap();
    assert!(sim.run_until_pred(Duration::from_secs(5), |sim| sim.delivered(s).len() == 2));
    let got: Vec<Message> = sim.delivered(s).into_iter().map(|(_, m)| m).collect();
    assert_eq!(
        (got[0].msg_type, &got[0].front, &got[0].data),
        (3, &big.front, &big.data)
    );
    assert_eq!((got[1].msg_type, got[1].payload_len()), (4, 0));
}

#[test]
fn unchecked_payloads_when_both_sides_agree() {
    let mut cfg = SimConfig::default();
    cfg.session.payload_crc = false;
    let (mut sim, c, s) = client_server(3, cfg);
    let id = sim.connect(c, s, Policy::LosslessClient);
    let big = Message::new(3, vec![1u8; 5000], vec![2u8; 70_000]);
    sim.send(c, id, big.clone()).unwrap();
    send_all(&mut sim, c, id, "c", 0..20);
    assert!(sim.run_until_pred(Duration::from_secs(5), |sim| sim.delivered(s).len() == 21));
    let got: Vec<Message> = sim.delivered(s).into_iter().map(|(_, m)| m).collect();
    assert_eq!((&got[0].front, &got[0].data), (&big.front, &big.data));
    for (i, m) in got[1..].iter().enumerate() {
        assert_eq!(
            (&m.front, &m.data),
            (&msg("c", i as u64).front, &msg("c", i as u64).data)
        );
    }
    let agreed = sim.session(c, id).expect("session").features();
    assert_ne!(agreed & msgr_proto::banner::features::UNCHECKED_PAYLOAD, 0);
}

/// Lossless client → server with echo, under the given cut schedule: both
/// directions must deliver 0..n exactly once, in order.
fn lossless_run(seed: u64, n: u64, byte_cuts: &[u64], faults: FaultRates) -> Sim {
    lossless_run_with(SimConfig::default(), seed, n, byte_cuts, faults)
}

fn lossless_run_with(
    cfg: SimConfig,
    seed: u64,
    n: u64,
    byte_cuts: &[u64],
    faults: FaultRates,
) -> Sim {
    lossless_run_in(cfg, seed, n, byte_cuts, faults, None, false)
}

/// Client and server with keys of their own in one keyring, allowing
/// `modes`.
fn secure(sim: &mut Sim, nodes: &[(NodeId, EntityName)], modes: &str) {
    let keys: Vec<StaticKeypair> = nodes.iter().map(|_| StaticKeypair::generate()).collect();
    let mut ring = Keyring::new();
    for ((_, name), kp) in nodes.iter().zip(&keys) {
        ring.insert(name.clone(), kp.public());
    }
    let ring = Arc::new(ring);
    for ((node, name), kp) in nodes.iter().zip(keys) {
        let creds = Credentials::new(name.clone(), kp, ring.clone());
        sim.set_security(
            *node,
            Security {
                modes: modes.parse::<ModeSet>().unwrap(),
                credentials: Some(Arc::new(creds)),
            },
        );
    }
}

/// `encoded`: the client hands its messages over in runs of 1–40 encoded
/// before they reach the session (`Sim::send_encoded`, as
/// `msgr::Connection::send` does), not one by one.
fn lossless_run_in(
    cfg: SimConfig,
    seed: u64,
    n: u64,
    byte_cuts: &[u64],
    faults: FaultRates,
    modes: Option<&str>,
    encoded: bool,
) -> Sim {
    let (mut sim, c, s) = client_server(seed, cfg);
    if let Some(modes) = modes {
        secure(
            &mut sim,
            &[(c, EntityName::client(1)), (s, EntityName::server(1))],
            modes,
        );
    }
    sim.set_faults(faults);
    sim.cut_at_bytes(byte_cuts);
    sim.set_echo(s, true);
    let id = sim.connect(c, s, Policy::LosslessClient);
    if encoded {
        let mut next = 0;
        while next < n {
            let end = (next + sim.rng().random_range(1..=40)).min(n);
            let run = (next..end).map(|i| msg("c", i));
            sim.send_encoded(c, id, run).expect("queue has room");
            next = end;
        }
    } else {
        send_all(&mut sim, c, id, "c", 0..n);
    }
    let done = sim.run_until_pred(Duration::from_secs(120), |sim| {
        received(sim, c, "c").len() as u64 >= n
    });
    let want: Vec<u64> = (0..n).collect();
    assert!(
        done,
        "seed {seed}: not finished after {:?}: server got {}, client got {} echoes; stats {:?}",
        sim.elapsed(),
        received(&sim, s, "c").len(),
        received(&sim, c, "c").len(),
        sim.stats()
    );
    assert_eq!(received(&sim, s, "c"), want, "seed {seed}: server side");
    assert_eq!(received(&sim, c, "c"), want, "seed {seed}: client side");
    // Lossless: nobody was told that messages were lost.
    for node in [c, s] {
        for e in events_of(&sim, node) {
            match e {
                SessionEvent::Reset { .. } => panic!("seed {seed}: node {node} reset: {e:?}"),
                SessionEvent::RemoteReset { dropped } => {
                    // Only possible when a HelloOk was lost: the server starts
                    // over a session the client never saw, with nothing queued.
                    assert_eq!((node, dropped), (s, 0), "seed {seed}");
                }
                _ => {}
            }
        }
    }
    // The client kept one session throughout.
    assert_eq!(sim.sessions(c).count(), 1);
    sim
}

#[test]
fn lossless_exactly_once_in_order_across_hundreds_of_random_cuts() {
    let faults = FaultRates {
        cut: 0.05,
        ..FaultRates::default()
    };
    let sim = lossless_run(7, 300, &[], faults);
    assert!(sim.stats().cuts >= 100, "only {} cuts", sim.stats().cuts);
    let c = sim.sessions(0).next().expect("client session").1.stats();
    assert!(c.reconnects >= 50 && c.replayed > 0, "{c:?}");
}

/// Small messages travel in batch frames (a fraction of the bytes of a
/// frame each), and replay after a cut batches again from the first
/// unacknowledged message: a small batch bound and in-flight window make
/// the replayed batches start and end elsewhere than the first ones, and
/// still every message arrives once, in order.
#[test]
fn batched_messages_replay_by_seq_across_cuts() {
    let batched = |batch_max_bytes| {
        let mut cfg = SimConfig::default();
        cfg.session.batch_max_bytes = batch_max_bytes;
        cfg.session.max_in_flight_messages = 7;
        cfg
    };
    let clean = |cfg| lossless_run_with(cfg, 3, 400, &[], FaultRates::default());
    let unbatched = clean(batched(0)).stats().bytes;
    let small = clean(batched(256)).stats().bytes;
    assert!(
        small * 2 < unbatched,
        "batches of 256 B: {small} bytes on the wire, a frame per message: {unbatched}"
    );
    let cuts: Vec<u64> = (1..40).map(|i| 2_000 + i * 377).collect();
    for bound in [256, 1000, 16 << 10] {
        let sim = lossless_run_with(batched(bound), 9, 400, &cuts, FaultRates::default());
        let st = sim.sessions(0).next().expect("client").1.stats();
        assert!(st.replayed > 0 && st.reconnects >= 10, "{bound}: {st:?}");
    }
}

/// Batches encoded before they reach the session (as
/// `msgr::Connection::send` hands them over) take their sequence numbers
/// there, and replay cuts them up like the session's own: across cuts at
/// random and at chosen bytes, with small batch bounds and window, every
/// message arrives once, in order.
#[test]
fn encoded_batches_replay_exactly_once_across_cuts() {
    let cuts = FaultRates {
        cut: 0.05,
        ..FaultRates::default()
    };
    let at: Vec<u64> = (1..40).map(|i| 2_000 + i * 377).collect();
    for (seed, bound, faults, at) in [
        (11, 16 << 10, cuts, &[][..]),
        (12, 256, cuts, &[][..]),
        (13, 1000, FaultRates::default(), &at[..]),
    ] {
        let mut cfg = SimConfig::default();
        cfg.session.batch_max_bytes = bound;
        cfg.session.max_in_flight_messages = 7;
        let sim = lossless_run_in(cfg, seed, 400, at, faults, None, true);
        let st = sim.sessions(0).next().expect("client").1.stats();
        assert!(st.replayed > 0 && st.reconnects >= 10, "{bound}: {st:?}");
        assert!(st.tx_batches > 0, "{bound}: no batch frames: {st:?}");
    }
}

/// Priority lanes across cuts: messages of three classes, a third of
/// them larger than a fragment (cut into up to a dozen), sent while the
/// link is cut at random (mostly in the middle of a fragment, pieces
/// being 64 bytes): each class's messages arrive exactly once and in the
/// order sent, at the server and echoed back in their class at the
/// client, and fragments went out and were replayed.
#[test]
fn lanes_keep_order_and_exactly_once_per_class_across_cuts_mid_fragment() {
    use msgr_proto::Priority;
    let classes = [Priority::Interactive, Priority::Data, Priority::Background];
    for seed in [31, 32, 33] {
        let mut cfg = SimConfig::default();
        cfg.session.max_fragment = 256;
        // Batched messages (up to a quarter of this) are never cut.
        cfg.session.batch_max_bytes = 512;
        cfg.session.max_in_flight_messages = 16;
        let (mut sim, c, s) = client_server(seed, cfg);
        sim.set_faults(FaultRates {
            cut: 0.02,
            ..FaultRates::default()
        });
        sim.set_echo(s, true);
        let id = sim.connect(c, s, Policy::LosslessClient);
        let n = 240u64;
        let mut sent: Vec<Vec<u64>> = vec![Vec::new(); classes.len()];
        for i in 0..n {
            let k = sim.rng().random_range(0..classes.len());
            let len = if sim.rng().random_range(0..3) == 0 {
                sim.rng().random_range(300..3000)
            } else {
                sim.rng().random_range(0..64)
            };
            let m = Message::new(1, format!("c:{i}").into_bytes(), vec![i as u8; len])
                .with_class(classes[k]);
            sim.send(c, id, m).expect("queue has room");
            sent[k].push(i);
        }
        let done = sim.run_until_pred(Duration::from_secs(120), |sim| {
            received(sim, c, "c").len() as u64 >= n
        });
        assert!(done, "seed {seed}: not finished: {:?}", sim.stats());
        for node in [s, c] {
            let got: Vec<(Priority, u64)> = sim
                .delivered(node)
                .into_iter()
                .map(|(_, m)| {
                    let front = String::from_utf8(m.front.to_vec()).expect("utf8");
                    let i: u64 = front[2..].parse().expect("counter");
                    assert!(
                        m.data.iter().all(|b| *b == i as u8),
                        "seed {seed}: {i} intact"
                    );
                    (m.class(), i)
                })
                .collect();
            for (k, class) in classes.iter().enumerate() {
                let of_class: Vec<u64> =
                    got.iter().filter(|m| m.0 == *class).map(|m| m.1).collect();
                assert_eq!(of_class, sent[k], "seed {seed}: node {node}, {class}");
            }
        }
        let st = sim.sessions(0).next().expect("client").1.stats();
        assert!(
            st.tx_fragments > 0 && st.replayed > 0 && st.reconnects >= 5,
            "seed {seed}: {st:?}"
        );
    }
}

#[test]
fn lossless_survives_dropped_and_corrupted_pieces() {
    // A lost or corrupted piece breaks the stream; CRCs and sequence numbers
    // must turn that into a fault and a replay, never a bad delivery.
    let faults = FaultRates {
        drop: 0.01,
        corrupt: 0.01,
        cut: 0.0,
    };
    let sim = lossless_run(11, 200, &[], faults);
    assert!(
        sim.stats().drops + sim.stats().corruptions >= 20,
        "{:?}",
        sim.stats()
    );
}

#[test]
fn lossless_cuts_at_every_byte_of_the_handshake() {
    // The handshake (banners, hello, hello-ok) is a few hundred bytes: cut at
    // each position once, including inside the banner and the first message.
    for pos in 0..400u64 {
        lossless_run(1000 + pos, 5, &[pos], FaultRates::default());
    }
}

#[test]
fn cuts_during_replay_are_survived() {
    // Cut again and again right after reconnecting, while unacked messages
    // are being replayed.
    let mut cuts = Vec::new();
    let mut p = 3000;
    for i in 0..60 {
        p += 150 + (i * 37) % 400;
        cuts.push(p);
    }
    let sim = lossless_run(5, 400, &cuts, FaultRates::default());
    let st = sim.sessions(0).next().unwrap().1.stats();
    assert!(st.replayed > 0 && st.reconnects >= 30, "{st:?}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]

    #[test]
    fn lossless_exactly_once_under_any_cut_schedule(
        seed in any::<u64>(),
        n in 1u64..120,
        cuts in proptest::collection::vec(0u64..20_000, 0..25),
    ) {
        lossless_run(seed, n, &cuts, FaultRates::default());
    }

    #[test]
    fn lossy_never_delivers_twice_or_out_of_order(
        seed in any::<u64>(),
        cuts in proptest::collection::vec(0u64..8_000, 1..6),
    ) {
        let (mut sim, c, s) = client_server(seed, SimConfig::default());
        sim.cut_at_bytes(&cuts);
        let mut next = 0u64;
        let mut sessions = 0;
        // Keep sending on a fresh lossy session each time one resets.
        while sim.elapsed() < Duration::from_secs(5) && next < 300 {
            let id = sim.connect(c, s, Policy::LossyClient);
            sessions += 1;
            for _ in 0..30 {
                sim.send(c, id, msg("c", next)).unwrap();
                next += 1;
            }
            sim.run_until_pred(Duration::from_secs(1), |sim| {
                sim.session(c, id).is_none_or(|x| x.is_closed() || x.queued_messages() == 0)
            });
            sim.run_for(Duration::from_millis(5));
        }
        let got = received(&sim, s, "c");
        prop_assert!(got.windows(2).all(|w| w[0] < w[1]), "duplicate or reorder: {got:?}");
        // A cut ends a lossy session with Reset, on the client at least.
        let resets = count(&sim, c, |e| matches!(e, SessionEvent::Reset { .. }));
        prop_assert!(resets >= sim.stats().cuts.min(1) as usize);
        prop_assert!(resets < sessions + 1);
        prop_assert_eq!(count(&sim, c, |e| matches!(e, SessionEvent::Resumed { .. })), 0);
    }
}

#[test]
fn lossy_cut_yields_reset_on_both_sides() {
    let (mut sim, c, s) = client_server(3, SimConfig::default());
    let id = sim.connect(c, s, Policy::LossyClient);
    send_all(&mut sim, c, id, "c", 0..5);
    assert!(
        sim.run_until_pred(Duration::from_secs(1), |sim| received(sim, s, "c").len()
            == 5)
    );
    assert_eq!(sim.cut_between(c, s), 1);
    sim.run_for(Duration::from_millis(10));
    let client_resets: Vec<_> = events_of(&sim, c)
        .into_iter()
        .filter(|e| {
            matches!(
                e,
                SessionEvent::Reset {
                    reason: FaultReason::Transport(_),
                    ..
                }
            )
        })
        .collect();
    assert_eq!(client_resets.len(), 1);
    assert_eq!(
        count(&sim, s, |e| matches!(e, SessionEvent::Reset { .. })),
        1
    );
    assert!(sim.session(c, id).unwrap().is_closed());
    assert_eq!(sim.send(c, id, msg("c", 9)), Err(SendError::Closed));
    // The lossy client did not reconnect.
    sim.run_for(Duration::from_secs(1));
    assert_eq!(sim.stats().links, 1);
    assert_eq!(received(&sim, s, "c"), vec![0, 1, 2, 3, 4]);
}

/// Two LosslessPeer nodes dial each other at the same instant, each sending `n`.
fn simultaneous(seed: u64, n: u64, delay_ab: Duration, delay_ba: Duration) -> Sim {
    let mut sim = Sim::new(seed, SimConfig::default());
    let a = sim.add_node(EntityName::peer(1), true);
    let b = sim.add_node(EntityName::peer(2), true);
    sim.delay(a, b, delay_ab);
    sim.delay(b, a, delay_ba);
    let sa = sim.connect(a, b, Policy::LosslessPeer);
    let sb = sim.connect(b, a, Policy::LosslessPeer);
    send_all(&mut sim, a, sa, "a", 0..n);
    send_all(&mut sim, b, sb, "b", 0..n);
    let done = sim.run_until_pred(Duration::from_secs(10), |sim| {
        received(sim, a, "b").len() as u64 >= n && received(sim, b, "a").len() as u64 >= n
    });
    sim.run_for(Duration::from_millis(300));
    let want: Vec<u64> = (0..n).collect();
    assert!(
        done,
        "seed {seed}: a got {:?}, b got {:?}",
        received(&sim, a, "b"),
        received(&sim, b, "a")
    );
    assert_eq!(received(&sim, a, "b"), want, "seed {seed}");
    assert_eq!(received(&sim, b, "a"), want, "seed {seed}");
    for node in [a, b] {
        let live: Vec<_> = sim.sessions(node).filter(|(_, s)| !s.is_closed()).collect();
        assert_eq!(
            live.len(),
            1,
            "seed {seed}: node {node} has {} live sessions",
            live.len()
        );
        assert!(live[0].1.is_open(), "seed {seed}");
        for e in events_of(&sim, node) {
            assert!(
                !matches!(
                    e,
                    SessionEvent::Reset { .. } | SessionEvent::RemoteReset { .. }
                ),
                "seed {seed}: {e:?}"
            );
        }
    }
    sim
}

#[test]
fn simultaneous_connect_one_session_survives() {
    for seed in 0..200 {
        simultaneous(seed, 20, Duration::ZERO, Duration::ZERO);
    }
}

#[test]
fn simultaneous_connect_with_one_slow_direction() {
    // One direction much slower than the other: a hello can arrive after the
    // other connection already opened the session.
    for seed in 0..50 {
        for ms in [1, 3, 10] {
            simultaneous(seed, 10, Duration::from_millis(ms), Duration::ZERO);
            simultaneous(seed, 10, Duration::ZERO, Duration::from_millis(ms));
        }
    }
}

#[test]
fn lossless_peers_survive_cuts_and_simultaneous_reconnects() {
    // Both sides may reconnect (LosslessPeer): after each cut both dial at once.
    let mut sim = Sim::new(21, SimConfig::default());
    let a = sim.add_node(EntityName::peer(1), true);
    let b = sim.add_node(EntityName::peer(2), true);
    sim.set_echo(b, true);
    let sa = sim.connect(a, b, Policy::LosslessPeer);
    send_all(&mut sim, a, sa, "a", 0..200);
    // Cuts are per unit on the wire, and batch frames carry many messages
    // per unit: the rate is high enough for a cut every few dozen units.
    sim.set_faults(FaultRates {
        cut: 0.04,
        ..FaultRates::default()
    });
    let done = sim.run_until_pred(Duration::from_secs(60), |sim| {
        received(sim, a, "a").len() >= 200
    });
    assert!(
        done,
        "a got {} echoes, b got {}",
        received(&sim, a, "a").len(),
        received(&sim, b, "a").len()
    );
    assert_eq!(received(&sim, b, "a"), (0..200).collect::<Vec<_>>());
    assert_eq!(received(&sim, a, "a"), (0..200).collect::<Vec<_>>());
    assert!(sim.stats().cuts >= 10, "{:?}", sim.stats());
}

/// A client and a server with a lossy session open between them.
fn lossy_open(seed: u64, cfg: SimConfig) -> (Sim, NodeId, NodeId, SessionId) {
    let (mut sim, c, s) = client_server(seed, cfg);
    let id = sim.connect(c, s, Policy::LossyClient);
    assert!(sim.run_until_pred(Duration::from_secs(1), |sim| sim
        .session(c, id)
        .unwrap()
        .is_open()));
    (sim, c, s, id)
}

#[test]
fn keepalive_timeout_detects_a_hung_peer() {
    let cfg = SimConfig::default();
    let timeout = cfg.session.keepalive_timeout;
    let (mut sim, c, s, id) = lossy_open(4, cfg);
    // Healthy and idle: keepalives keep it open well past the timeout.
    sim.run_for(timeout * 5);
    assert!(sim.session(c, id).unwrap().is_open());
    assert!(sim.session(c, id).unwrap().stats().keepalives >= 5);
    let frozen_at = sim.elapsed();
    sim.freeze(s, true);
    sim.run_for(timeout * 3);
    let reset = sim
        .log()
        .iter()
        .find(|l| l.node == c && matches!(l.event, SessionEvent::Reset { .. }))
        .expect("client reset")
        .clone();
    assert!(
        matches!(
            reset.event,
            SessionEvent::Reset {
                reason: FaultReason::KeepaliveTimeout,
                ..
            }
        ),
        "{reset:?}"
    );
    let after = reset.at - frozen_at;
    assert!(
        after <= timeout + Duration::from_millis(10),
        "detected after {after:?}"
    );
    assert!(
        after >= timeout - sim_cfg_interval(),
        "detected too early: {after:?}"
    );
}

/// Paced keepalives (both sides offer `PACED_KEEPALIVE`): idle, each side
/// sends its own keepalive a third of the peer's timeout apart and none is
/// answered — not a keepalive and its answer every `keepalive_interval`.
/// Both stay open (each hears the other well within its timeout) and a
/// frozen peer is still noticed.
#[test]
fn paced_keepalives_go_a_third_of_the_peers_timeout_apart_unanswered() {
    let mut cfg = SimConfig::default();
    cfg.session.keepalive_interval = Duration::from_millis(200);
    cfg.session.keepalive_timeout = Duration::from_secs(3);
    let (mut sim, c, s, id) = lossy_open(5, cfg);
    let idle = Duration::from_secs(30);
    sim.run_for(idle);
    let client = sim.session(c, id).unwrap();
    assert!(client.is_open());
    let (_, server) = sim.sessions(s).next().expect("the server's session");
    assert!(server.is_open());
    let (sent_c, sent_s) = (client.stats().keepalives, server.stats().keepalives);
    // 1 s apart each (3 s / 3) once the peer's first came (200 ms apart
    // until then, and the sim's links may be cut): ~30 each. The
    // old way sent one every 200 ms (150), each answered.
    let paced = (idle.as_millis() / 1000) as u64;
    for (who, n) in [("client", sent_c), ("server", sent_s)] {
        assert!(
            (paced - 2..=paced + 6).contains(&n),
            "{who} sent {n} keepalives in {idle:?}, paced {paced}"
        );
    }
    let frozen_at = sim.elapsed();
    sim.freeze(s, true);
    sim.run_for(Duration::from_secs(6));
    let reset = sim
        .log()
        .iter()
        .find(|l| l.node == c && matches!(l.event, SessionEvent::Reset { .. }))
        .map(|l| (l.at - frozen_at, format!("{:?}", l.event)));
    let Some((after, event)) = reset else {
        panic!("the client never noticed its frozen peer");
    };
    assert!(event.contains("KeepaliveTimeout"), "{event}");
    assert!(
        after <= Duration::from_millis(3010),
        "noticed after {after:?}"
    );
}

fn sim_cfg_interval() -> Duration {
    SimConfig::default().session.keepalive_interval
}

#[test]
fn keepalive_timeout_detects_a_black_holed_link_and_lossless_reconnects() {
    let (mut sim, c, s) = client_server(5, SimConfig::default());
    let id = sim.connect(c, s, Policy::LosslessClient);
    assert!(sim.run_until_pred(Duration::from_secs(1), |sim| sim
        .session(c, id)
        .unwrap()
        .is_open()));
    sim.blackhole_between(c, s);
    sim.send(c, id, msg("c", 0)).unwrap();
    // Silent link: only the keepalive timeout notices; then the client
    // reconnects on a new link and the message gets through.
    assert!(
        sim.run_until_pred(Duration::from_secs(5), |sim| received(sim, s, "c")
            == vec![0])
    );
    assert!(sim.elapsed() >= SimConfig::default().session.keepalive_timeout);
    assert_eq!(sim.stats().links, 2);
    assert!(sim.session(c, id).unwrap().stats().faults >= 1);
}

#[test]
fn server_restart_gives_remote_reset_and_a_fresh_session() {
    let (mut sim, c, s) = client_server(6, SimConfig::default());
    let id = sim.connect(c, s, Policy::LosslessClient);
    send_all(&mut sim, c, id, "c", 0..5);
    assert!(
        sim.run_until_pred(Duration::from_secs(1), |sim| received(sim, s, "c").len()
            == 5)
    );
    let old = sim.addr(s);
    sim.restart(s);
    assert_ne!(sim.addr(s).nonce, old.nonce);
    send_all(&mut sim, c, id, "c", 5..8);
    let ok = sim.run_until_pred(Duration::from_secs(5), |sim| {
        count(sim, c, |e| matches!(e, SessionEvent::RemoteReset { .. })) == 1
            && count(sim, c, |e| matches!(e, SessionEvent::Established(_))) == 2
    });
    assert!(ok, "client events: {:#?}", events_of(&sim, c));
    // The new server incarnation serves the same client session afresh.
    send_all(&mut sim, c, id, "c", 8..10);
    assert!(
        sim.run_until_pred(Duration::from_secs(5), |sim| received(sim, s, "c")
            .ends_with(&[8, 9]))
    );
    let est = sim
        .log()
        .iter()
        .filter_map(|l| match &l.event {
            SessionEvent::Established(p) if l.node == c => Some(p.addr.clone()),
            _ => None,
        })
        .next_back()
        .unwrap();
    assert_eq!(est, sim.addr(s));
}

#[test]
fn listening_peer_restart_gives_remote_reset_on_the_other_side() {
    // A listening peer is known by its endpoint: when it comes back with a
    // new nonce, its hello reaches the old session, which resets.
    let mut sim = Sim::new(7, SimConfig::default());
    let c = sim.add_node(EntityName::peer(1), true);
    let s = sim.add_node(EntityName::peer(2), true);
    let id = sim.connect(c, s, Policy::LosslessPeer);
    send_all(&mut sim, c, id, "c", 0..3);
    assert!(
        sim.run_until_pred(Duration::from_secs(1), |sim| received(sim, s, "c").len()
            == 3)
    );
    // The other side has something queued for the old incarnation.
    let (sid, _) = sim.sessions(s).next().unwrap();
    sim.freeze(c, true);
    sim.send(s, sid, msg("s", 0)).unwrap();
    sim.run_for(Duration::from_millis(5));
    sim.restart(c);
    sim.freeze(c, false);
    let id2 = sim.connect(c, s, Policy::LosslessPeer);
    send_all(&mut sim, c, id2, "c", 3..5);
    assert!(
        sim.run_until_pred(Duration::from_secs(5), |sim| received(sim, s, "c").len()
            == 5)
    );
    assert_eq!(received(&sim, s, "c"), vec![0, 1, 2, 3, 4]);
    let resets: Vec<_> = events_of(&sim, s)
        .into_iter()
        .filter(|e| matches!(e, SessionEvent::RemoteReset { .. }))
        .collect();
    assert_eq!(resets, vec![SessionEvent::RemoteReset { dropped: 1 }]);
    assert_eq!(
        received(&sim, c, "s"),
        Vec::<u64>::new(),
        "old incarnation's message leaked"
    );
    // Still one session on the other side, serving the new incarnation.
    assert_eq!(sim.sessions(s).filter(|(_, x)| !x.is_closed()).count(), 1);
}

#[test]
fn restarted_client_that_does_not_listen_gets_a_new_session_and_the_old_one_lingers_out() {
    // A client with port 0 is known by its full address (nonce included): a
    // restart is a new peer; the old server session waits server_linger for
    // its peer, then resets.
    let mut cfg = SimConfig::default();
    cfg.session.server_linger = Duration::from_secs(3);
    let (mut sim, c, s) = client_server(17, cfg);
    let id = sim.connect(c, s, Policy::LosslessClient);
    send_all(&mut sim, c, id, "c", 0..3);
    assert!(
        sim.run_until_pred(Duration::from_secs(1), |sim| received(sim, s, "c").len()
            == 3)
    );
    sim.restart(c);
    let id2 = sim.connect(c, s, Policy::LosslessClient);
    send_all(&mut sim, c, id2, "c", 3..5);
    assert!(
        sim.run_until_pred(Duration::from_secs(1), |sim| received(sim, s, "c").len()
            == 5)
    );
    assert_eq!(sim.sessions(s).count(), 2);
    sim.run_for(Duration::from_secs(4));
    let lingered = count(&sim, s, |e| {
        matches!(
            e,
            SessionEvent::Reset {
                reason: FaultReason::LingerExpired,
                ..
            }
        )
    });
    assert_eq!(lingered, 1);
    assert_eq!(sim.sessions(s).filter(|(_, x)| !x.is_closed()).count(), 1);
}

#[test]
fn graceful_close_drains_then_closed() {
    let (mut sim, c, s) = client_server(8, SimConfig::default());
    let id = sim.connect(c, s, Policy::LosslessClient);
    send_all(&mut sim, c, id, "c", 0..50);
    sim.close(c, id);
    assert_eq!(sim.send(c, id, msg("c", 99)), Err(SendError::Closed));
    assert!(sim.run_until_pred(Duration::from_secs(2), |sim| sim
        .session(c, id)
        .unwrap()
        .is_closed()));
    assert_eq!(received(&sim, s, "c"), (0..50).collect::<Vec<_>>());
    let ev = events_of(&sim, c);
    assert_eq!(ev.iter().filter(|e| **e == SessionEvent::Closed).count(), 1);
    assert!(
        !ev.iter().any(|e| matches!(e, SessionEvent::Reset { .. })),
        "{ev:?}"
    );
    sim.run_for(Duration::from_millis(10));
    let server_end: Vec<_> = events_of(&sim, s)
        .into_iter()
        .filter(|e| matches!(e, SessionEvent::Reset { .. } | SessionEvent::Closed))
        .collect();
    assert_eq!(server_end.len(), 1, "{server_end:?}");
    assert!(
        matches!(
            &server_end[0],
            SessionEvent::Reset {
                reason: FaultReason::PeerClosed(_),
                undelivered: 0
            }
        ),
        "{server_end:?}"
    );
}

#[test]
fn graceful_close_drains_across_cuts() {
    let (mut sim, c, s) = client_server(9, SimConfig::default());
    let id = sim.connect(c, s, Policy::LosslessClient);
    send_all(&mut sim, c, id, "c", 0..100);
    sim.close(c, id);
    sim.cut_at_bytes(&[500, 1500, 2600, 4000, 5200]);
    assert!(sim.run_until_pred(Duration::from_secs(10), |sim| sim
        .session(c, id)
        .unwrap()
        .is_closed()));
    assert_eq!(received(&sim, s, "c"), (0..100).collect::<Vec<_>>());
    assert_eq!(count(&sim, c, |e| *e == SessionEvent::Closed), 1);
    assert!(sim.stats().cuts >= 3);
}

#[test]
fn send_queue_bounds_return_queue_full() {
    let mut cfg = SimConfig::default();
    cfg.session = SessionConfig {
        max_queued_messages: 4,
        max_queued_bytes: 100,
        ..cfg.session
    };
    let (mut sim, c, s) = client_server(10, cfg);
    let id = sim.connect(c, s, Policy::LosslessClient);
    for i in 0..4 {
        sim.send(c, id, Message::new(1, vec![0u8; 10], Bytes::new()))
            .unwrap_or_else(|e| panic!("{i}: {e}"));
    }
    assert_eq!(
        sim.send(c, id, Message::new(1, vec![0u8; 10], Bytes::new())),
        Err(SendError::QueueFull {
            messages: 4,
            bytes: 40
        })
    );
    // Once delivered and acknowledged, there is room again.
    assert!(sim.run_until_pred(Duration::from_secs(1), |sim| sim
        .session(c, id)
        .unwrap()
        .queued_messages()
        == 0));
    assert_eq!(sim.delivered(s).len(), 4);
    // The byte bound: 60 + 50 > 100.
    sim.send(c, id, Message::new(1, vec![0u8; 60], Bytes::new()))
        .unwrap();
    assert!(matches!(
        sim.send(c, id, Message::new(1, vec![0u8; 50], Bytes::new())),
        Err(SendError::QueueFull {
            messages: 1,
            bytes: 60
        })
    ));
    // A single message bigger than the byte bound still goes when the queue is empty.
    sim.run_for(Duration::from_millis(50));
    assert!(sim
        .send(c, id, Message::new(1, vec![0u8; 500], Bytes::new()))
        .is_ok());
}

#[test]
fn nobody_listening_lossless_client_keeps_retrying_with_backoff() {
    let mut sim = Sim::new(12, SimConfig::default());
    let c = sim.add_node(EntityName::client(1), false);
    let s = sim.add_node(EntityName::server(1), false); // not listening
    let id = sim.connect(c, s, Policy::LosslessClient);
    sim.send(c, id, msg("c", 0)).unwrap();
    sim.run_for(Duration::from_secs(1));
    let refused = sim.stats().refused;
    // Exponential backoff from 2 ms to 50 ms: about 20 attempts a second, not thousands.
    assert!((10..=60).contains(&refused), "{refused} attempts");
    assert!(!sim.session(c, id).unwrap().is_closed());
    assert_eq!(sim.session(c, id).unwrap().queued_messages(), 1);
}

#[test]
fn runs_are_deterministic_per_seed() {
    let faults = FaultRates {
        drop: 0.005,
        corrupt: 0.005,
        cut: 0.01,
    };
    let a = lossless_run(99, 60, &[100, 900], faults);
    let b = lossless_run(99, 60, &[100, 900], faults);
    assert_eq!(a.log(), b.log());
    assert_eq!(a.received(), b.received());
    assert_eq!(a.stats(), b.stats());
    let c = lossless_run(100, 60, &[100, 900], faults);
    assert_ne!(
        a.log(),
        c.log(),
        "a different seed should give a different run"
    );
}

/// A new session dialled while the previous one with the same server is
/// still ending (right after `close` or `mark_down`): the server starts it
/// beside the ending one instead of refusing it, and nothing queued on the
/// new session is dropped (no remote reset). Each of 20 rounds dials anew
/// at once.
#[test]
fn a_session_dialled_while_the_last_one_ends_keeps_its_queue() {
    for mark in [false, true] {
        let (mut sim, c, s) = client_server(11, SimConfig::default());
        for round in 0..20u64 {
            let old = sim.connect(c, s, Policy::LosslessClient);
            send_all(&mut sim, c, old, "old", 0..3);
            sim.run_for(Duration::from_millis(1));
            if mark {
                sim.mark_down(c, old);
            } else {
                sim.close(c, old);
            }
            let new = sim.connect(c, s, Policy::LosslessClient);
            let tag = format!("new{round}");
            send_all(&mut sim, c, new, &tag, 0..5);
            assert!(
                sim.run_until_pred(Duration::from_secs(5), |sim| received(sim, s, &tag).len()
                    == 5),
                "mark_down {mark}, round {round}: the new session delivered {:?}",
                received(&sim, s, &tag)
            );
            assert_eq!(received(&sim, s, &tag), (0..5).collect::<Vec<_>>());
            // One session per peer at a time, as the messenger keeps it.
            sim.close(c, new);
        }
        assert_eq!(
            count(&sim, c, |e| matches!(e, SessionEvent::RemoteReset { .. })),
            0,
            "mark_down {mark}: a new session's queue was dropped"
        );
    }
}

/// The secure and auth modes under the same faults as crc: cuts anywhere
/// (in the handshake too), dropped and corrupted pieces. Every link does
/// its own handshake; replay after each still delivers exactly once, in
/// order — and a corrupted sealed frame is caught (by the outer CRC or
/// the AEAD tag) like any other.
#[test]
fn secure_and_auth_sessions_replay_exactly_once_across_faults() {
    for modes in ["secure", "auth"] {
        let faults = FaultRates {
            cut: 0.03,
            drop: 0.005,
            corrupt: 0.005,
        };
        let cuts: Vec<u64> = (1..30).map(|i| i * 97).collect();
        let sim = lossless_run_in(
            SimConfig::default(),
            21,
            300,
            &cuts,
            faults,
            Some(modes),
            false,
        );
        let (_, client) = sim.sessions(0).next().expect("client session");
        let st = client.stats();
        assert!(st.reconnects >= 10 && st.replayed > 0, "{modes}: {st:?}");
        let peer = client.peer().expect("peer known");
        assert_eq!(peer.name, EntityName::server(1));
        assert!(peer.key.is_some(), "{modes}: the server's key was proved");
        let want = if modes == "secure" {
            msgr_proto::auth::SecurityMode::Secure
        } else {
            msgr_proto::auth::SecurityMode::Auth
        };
        assert_eq!(client.security_mode(), want);
        // Whatever the session holds (credentials, handshake, record
        // layer), its Debug output shows no private key.
        let shown = format!("{client:?}");
        assert!(shown.contains("<redacted>"), "{modes}: {shown}");
        for kp in sim.private_keys_for_tests() {
            assert!(
                !shown.contains(&kp),
                "{modes}: a private key in Debug output"
            );
        }
    }
}

/// Sealed frames cost a little more on the wire than CRC frames (a tag
/// per piece, the inner preamble), and nothing of the payload shows.
#[test]
fn secure_mode_hides_payloads_on_the_wire() {
    let run = |modes: Option<&str>| {
        let (mut sim, c, s) = client_server(5, SimConfig::default());
        if let Some(m) = modes {
            secure(
                &mut sim,
                &[(c, EntityName::client(1)), (s, EntityName::server(1))],
                m,
            );
        }
        let id = sim.connect(c, s, Policy::LosslessClient);
        let secret = Message::new(1, b"the-secret-front".to_vec(), Bytes::new());
        sim.send(c, id, secret).expect("room");
        assert!(sim.run_until_pred(Duration::from_secs(5), |sim| !sim.delivered(s).is_empty()));
        let wire = sim.wire_bytes();
        (
            wire.windows(16).any(|w| w == b"the-secret-front"),
            wire.len(),
        )
    };
    let (clear_shows, clear_len) = run(None);
    let (sealed_shows, sealed_len) = run(Some("secure"));
    assert!(clear_shows, "the crc run carries the front in the clear");
    assert!(!sealed_shows, "the secure run must not");
    assert!(sealed_len > clear_len);
}

/// Two lossless peers dial each other while what each writes is slow for a
/// while (a loaded node: issue 52's 32-node cluster lost messages this
/// way): one side's hello can arrive after the session opened over the
/// other side's dial, and the side that sent it has long given that dial
/// up. The handshake timeout is longer than any delay here, and nobody
/// restarted or marked anything down, so nothing may be reset, lost or
/// delivered twice.
fn late_hello(seed: u64, slow: Duration, slow_for: Duration, n: u64) -> Result<(), String> {
    let mut cfg = SimConfig::default();
    cfg.session.handshake_timeout = Duration::from_secs(10);
    let mut sim = Sim::new(seed, cfg);
    let a = sim.add_node(EntityName::peer(1), true);
    let b = sim.add_node(EntityName::peer(2), true);
    for (from, to, tag) in [(a, b, "a"), (b, a, "b")] {
        // Everything `from` writes is slow for `slow_for`, then fast again.
        sim.delay(from, to, slow);
        let id = sim.connect(from, to, Policy::LosslessPeer);
        send_all(&mut sim, from, id, tag, 0..n);
        sim.run_for(slow_for);
        sim.delay(from, to, Duration::ZERO);
    }
    let done = sim.run_until_pred(Duration::from_secs(20), |sim| {
        received(sim, a, "b").len() as u64 >= n && received(sim, b, "a").len() as u64 >= n
    });
    sim.run_for(Duration::from_secs(1));
    let want: Vec<u64> = (0..n).collect();
    let (got_a, got_b) = (received(&sim, a, "b"), received(&sim, b, "a"));
    if !done || got_a != want || got_b != want {
        return Err(format!("a got {got_a:?}, b got {got_b:?}"));
    }
    no_resets(&sim, [a, b])
}

/// Runs `run(seed, slow, slow_for)` for seeds 0..3 and every pair of
/// `slow_ms` and `slow_for_ms`; fails with the first failures.
fn sweep_slow(
    slow_ms: [u64; 3],
    slow_for_ms: [u64; 3],
    run: impl Fn(u64, Duration, Duration) -> Result<(), String>,
) {
    let mut failed = Vec::new();
    let mut runs = 0;
    for seed in 0..3 {
        for slow in slow_ms {
            for slow_for in slow_for_ms {
                runs += 1;
                let d = Duration::from_millis;
                if let Err(e) = run(seed, d(slow), d(slow_for)) {
                    failed.push(format!(
                        "seed {seed}, slow {slow} ms for {slow_for} ms: {e}"
                    ));
                }
            }
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {runs} runs failed, the first: {:#?}",
        failed.len(),
        &failed[..failed.len().min(5)]
    );
}

/// `Err` naming the first reset (of either kind) a node of `nodes` logged.
fn no_resets(sim: &Sim, nodes: [NodeId; 2]) -> Result<(), String> {
    for node in nodes {
        for e in events_of(sim, node) {
            if matches!(
                e,
                SessionEvent::Reset { .. } | SessionEvent::RemoteReset { .. }
            ) {
                return Err(format!("node {node}: {e:?}"));
            }
        }
    }
    Ok(())
}

#[test]
fn a_hello_that_outlived_its_dial_resets_nothing() {
    // The second dial goes out before anything could open (the
    // simulator's connect does not look for an accepted session, as an
    // application's dial does): slow for 1 to 30 ms.
    sweep_slow([50, 450, 1200], [1, 10, 30], |seed, slow, slow_for| {
        late_hello(seed, slow, slow_for, 10)
    });
}

/// A lossless client whose hello-ok is slower than its handshake timeout:
/// the server opened the session (and queued for it) but the client gave
/// its dial up and dials again with cookie 0. `slow` is the extra latency
/// from server to client while the first hello-ok and the server's first
/// messages are written (`slow_for`). Nobody restarted: nothing may be
/// reset, lost or delivered twice.
fn slow_hello_ok(seed: u64, slow: Duration, slow_for: Duration, n: u64) -> Result<(), String> {
    let (mut sim, c, s) = client_server(seed, SimConfig::default());
    let id = sim.connect(c, s, Policy::LosslessClient);
    send_all(&mut sim, c, id, "c", 0..n);
    // The banners pass; the hello is on its way when the way back slows.
    let hello_sent = sim.run_until_pred(Duration::from_millis(100), |sim| {
        sim.session(c, id).map(|x| x.phase()) == Some(msgr_proto::Phase::AwaitingHelloAnswer)
    });
    if !hello_sent {
        return Err("the client never sent its hello".into());
    }
    sim.delay(s, c, slow);
    // The server opens the session on the first hello and queues for it.
    let opened = sim.run_until_pred(Duration::from_millis(100), |sim| {
        sim.sessions(s).any(|(_, x)| x.is_open())
    });
    if !opened {
        return Err("the server never opened the session".into());
    }
    let sid = sim
        .sessions(s)
        .find(|(_, x)| x.is_open())
        .map(|(sid, _)| sid)
        .expect("open");
    send_all(&mut sim, s, sid, "s", 0..n);
    sim.run_for(slow_for);
    sim.delay(s, c, Duration::ZERO);
    let done = sim.run_until_pred(Duration::from_secs(20), |sim| {
        received(sim, c, "s").len() as u64 >= n && received(sim, s, "c").len() as u64 >= n
    });
    sim.run_for(Duration::from_secs(1));
    let want: Vec<u64> = (0..n).collect();
    let (got_c, got_s) = (received(&sim, c, "s"), received(&sim, s, "c"));
    if !done || got_c != want || got_s != want {
        return Err(format!("client got {got_c:?}, server got {got_s:?}"));
    }
    no_resets(&sim, [c, s])?;
    // The same session goes on at the server: opened once, resumed.
    let opened = count(&sim, s, |e| matches!(e, SessionEvent::Established(_)));
    let resumed = count(&sim, s, |e| matches!(e, SessionEvent::Resumed { .. }));
    if opened != 1 || resumed == 0 {
        return Err(format!(
            "the server opened {opened} sessions and resumed {resumed} times"
        ));
    }
    let timeouts = count(&sim, c, |e| matches!(e, SessionEvent::ConnectFailed { .. }));
    if timeouts == 0 {
        return Err("the client's handshake never timed out: the test tests nothing".into());
    }
    Ok(())
}

#[test]
fn a_redial_after_a_slow_hello_ok_resumes_the_session() {
    // Past the handshake timeout (500 ms) once, twice, three times.
    sweep_slow([600, 1100, 1600], [1, 10, 600], |seed, slow, slow_for| {
        slow_hello_ok(seed, slow, slow_for, 10)
    });
}
