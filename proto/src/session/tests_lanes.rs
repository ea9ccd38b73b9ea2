//! Priority lanes in the engine, driven directly: a more urgent class
//! goes between the fragments of a large message, each class keeps its
//! order, and a peer without lanes gets no fragment frames.

use bytes::Bytes;

use super::tests::{hand_over, open_pair_with};
use super::*;
use crate::priority::Priority;

/// Fragments of 64 KiB (as Zenoh's batches; the default is larger).
const FRAGMENT: usize = 64 << 10;

/// Settings with fragments of [`FRAGMENT`] bytes.
fn lanes_of_64k() -> SessionConfig {
    SessionConfig {
        max_fragment: FRAGMENT,
        ..SessionConfig::default()
    }
}

/// Message `t` of `class` with `data` payload bytes (each `t`).
fn of(t: u16, class: Priority, data: usize) -> Message {
    Message::new(t, Bytes::new(), vec![t as u8; data]).with_class(class)
}

/// Both sessions open, their events taken.
fn open(client: SessionConfig, server: SessionConfig, now: Instant) -> (Session, Session) {
    let (mut c, mut s) = open_pair_with(client, server, now);
    while c.poll_event().is_some() {}
    while s.poll_event().is_some() {}
    (c, s)
}

fn tag(t: &Transmit) -> Option<Tag> {
    match t {
        Transmit::Frame(f) => Some(f.tag),
        Transmit::Message(_) => Some(Tag::Message),
        Transmit::Banner(_) => None,
    }
}

/// What the server sends next, handed to the client; its tag.
fn step(s: &mut Session, c: &mut Session, now: Instant) -> Option<Tag> {
    let (_, t) = s.poll_transmit(now)?;
    let tag = tag(&t);
    c.handle_inbound(LinkId(1), t.into(), now)
        .expect("a valid unit");
    tag
}

fn taken(c: &mut Session) -> Vec<(u16, Priority, usize)> {
    std::iter::from_fn(|| c.poll_message())
        .map(|m| {
            assert!(
                m.data.iter().all(|b| *b == m.msg_type as u8),
                "payload intact"
            );
            (m.msg_type, m.class(), m.payload_len())
        })
        .collect()
}

/// A call queued while a 1 MiB message is going out waits for one
/// fragment, not for the rest of it.
#[test]
fn a_more_urgent_message_goes_between_the_fragments_of_a_large_one() {
    let now = Instant::now();
    let cfg = lanes_of_64k();
    let (mut c, mut s) = open(cfg.clone(), cfg, now);
    s.send(of(1, Priority::Data, 1 << 20)).expect("room");
    assert_eq!(step(&mut s, &mut c, now), Some(Tag::Fragment));
    assert_eq!(taken(&mut c), [], "not whole yet");
    s.send(of(2, Priority::Interactive, 10)).expect("room");
    assert_eq!(step(&mut s, &mut c, now), Some(Tag::MessageBatch));
    assert_eq!(taken(&mut c), [(2, Priority::Interactive, 10)]);
    hand_over(&mut s, &mut c, LinkId(1), now);
    assert_eq!(taken(&mut c), [(1, Priority::Data, 1 << 20)]);
    let pieces = ((1 << 20) / FRAGMENT) as u64;
    assert_eq!(s.stats().tx_fragments, pieces);
    assert_eq!(c.stats().rx_fragments, pieces);
    // Everything acknowledged is released, fragments included (the ack
    // goes alone once its delay is over: the client sends nothing).
    hand_over(&mut c, &mut s, LinkId(2), now + DEFAULT_ACK_DELAY);
    assert_eq!((s.queued_messages(), s.queued_bytes()), (0, 0));
}

/// Messages of three classes, large and small, queued together: the
/// most urgent class goes first, and each class arrives in the order it
/// was sent, whole.
#[test]
fn each_class_keeps_its_order_and_the_most_urgent_goes_first() {
    let now = Instant::now();
    let cfg = lanes_of_64k();
    let (mut c, mut s) = open(cfg.clone(), cfg, now);
    let (d, b, i) = (Priority::Data, Priority::Background, Priority::Interactive);
    let sent = [
        (1, d, 200_000),
        (2, b, 150_000),
        (3, d, 30),
        (4, i, 20),
        (5, d, 70_000),
        (6, b, 5),
        (7, i, 100_000),
    ];
    for (t, class, len) in sent {
        s.send(of(t, class, len)).expect("room");
    }
    hand_over(&mut s, &mut c, LinkId(1), now);
    let got = taken(&mut c);
    let order: Vec<u16> = got.iter().map(|m| m.0).collect();
    assert_eq!(order, [4, 7, 1, 3, 5, 2, 6]);
    for class in [d, b, i] {
        let want: Vec<_> = sent.iter().filter(|m| m.1 == class).copied().collect();
        let got: Vec<_> = got.iter().filter(|m| m.1 == class).copied().collect();
        assert_eq!(got, want, "{class}");
    }
}

/// A peer that does not offer lanes (`max_fragment = 0`) gets what it
/// got before: no fragment frame, one class, one order.
#[test]
fn a_peer_without_lanes_gets_no_fragments_and_one_order() {
    let now = Instant::now();
    let without = SessionConfig {
        max_fragment: 0,
        ..SessionConfig::default()
    };
    for (client, server) in [
        (lanes_of_64k(), without.clone()),
        (without.clone(), lanes_of_64k()),
    ] {
        let (mut c, mut s) = open(client, server, now);
        assert_eq!(s.features() & features::LANES, 0);
        s.send(of(1, Priority::Background, 1 << 20)).expect("room");
        s.send(of(2, Priority::Interactive, 10)).expect("room");
        let mut tags = Vec::new();
        while let Some(t) = step(&mut s, &mut c, now) {
            tags.push(t);
        }
        assert_eq!(tags, [Tag::Message, Tag::MessageBatch]);
        assert_eq!(
            taken(&mut c),
            [
                (1, Priority::Background, 1 << 20),
                (2, Priority::Interactive, 10)
            ]
        );
        assert_eq!(s.stats().tx_fragments, 0);
    }
}
