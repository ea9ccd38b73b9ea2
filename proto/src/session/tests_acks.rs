//! What an arrival makes the engine send, driven directly: a stream's
//! acks wait for a message to carry them, or for `ack_delay`; a lone
//! arrival and a quarter of the in-flight window are acknowledged at
//! once; a paced keepalive takes this side's along when it is due soon.

use std::time::Duration;

use super::tests::open_pair_with;
use super::*;

/// A small message numbered `i`.
fn msg(i: u8) -> Message {
    Message::new(1, vec![i], bytes::Bytes::new())
}

/// `s` sends `m`, handed to `c` at `now`.
fn arrive(s: &mut Session, c: &mut Session, m: Message, now: Instant) {
    s.send(m).expect("room");
    while let Some((_, t)) = s.poll_transmit(now) {
        c.handle_inbound(LinkId(1), t.into(), now)
            .expect("a valid unit");
    }
}

/// What `c` transmits at `now`: the tag of each unit and the ack it
/// carries (an `Ack` frame's, or a message batch's).
fn acks_out(c: &mut Session, now: Instant) -> Vec<(Tag, u64)> {
    std::iter::from_fn(|| c.poll_transmit(now))
        .map(|(_, t)| match t {
            Transmit::Frame(f) if f.tag == Tag::Ack => {
                let a: crate::control::Ack =
                    crate::control::parse_control(&f, "ack").expect("an ack");
                (Tag::Ack, a.seq)
            }
            Transmit::Frame(f) if f.tag == Tag::MessageBatch => {
                let b = crate::batch::BatchReader::new(f.segments[0].clone()).expect("a batch");
                (Tag::MessageBatch, b.ack())
            }
            Transmit::Message(m) => (Tag::Message, m.ack),
            Transmit::Frame(f) => (f.tag, 0),
            Transmit::Banner(_) => panic!("no banner on an open link"),
        })
        .collect()
}

#[test]
fn a_streams_acks_ride_on_a_reply_or_go_after_the_delay() {
    let t0 = Instant::now();
    let delay = Duration::from_millis(1);
    let cfg = SessionConfig {
        ack_delay: delay,
        ..SessionConfig::default()
    };
    let (mut c, mut s) = open_pair_with(cfg.clone(), cfg, t0);
    while c.poll_event().is_some() {}
    // A lone arrival is acknowledged at once, as before.
    let t = t0 + Duration::from_secs(1);
    arrive(&mut s, &mut c, msg(1), t);
    assert_eq!(acks_out(&mut c, t), [(Tag::Ack, 1)]);
    // The next within the delay is a stream: its ack waits.
    let t = t + Duration::from_micros(10);
    arrive(&mut s, &mut c, msg(2), t);
    assert!(!c.wants_transmit());
    assert_eq!(acks_out(&mut c, t), []);
    assert_eq!(c.poll_timeout(), Some(t + delay), "the ack's deadline");
    // A message from this side carries it.
    c.send(msg(9)).expect("room");
    assert_eq!(acks_out(&mut c, t), [(Tag::MessageBatch, 2)]);
    // Without one, it goes alone once the delay is over.
    let t = t + Duration::from_micros(10);
    arrive(&mut s, &mut c, msg(3), t);
    assert_eq!(acks_out(&mut c, t + delay / 2), []);
    assert_eq!(acks_out(&mut c, t + delay), [(Tag::Ack, 3)]);
    assert_eq!(c.stats().acks, 2);
}

#[test]
fn a_quarter_of_the_window_is_acknowledged_at_once() {
    let t0 = Instant::now();
    let cfg = SessionConfig {
        ack_delay: Duration::from_secs(1),
        max_in_flight_messages: 8,
        ..SessionConfig::default()
    };
    let (mut c, mut s) = open_pair_with(cfg.clone(), cfg, t0);
    let t = t0 + Duration::from_secs(5);
    arrive(&mut s, &mut c, msg(1), t);
    assert_eq!(acks_out(&mut c, t), [(Tag::Ack, 1)]);
    arrive(&mut s, &mut c, msg(2), t);
    assert_eq!(acks_out(&mut c, t), [], "one of a window of 8 waits");
    arrive(&mut s, &mut c, msg(3), t);
    assert!(c.wants_transmit());
    assert_eq!(acks_out(&mut c, t), [(Tag::Ack, 3)], "two of 8 do not");
}

#[test]
fn no_delay_acknowledges_every_arrival() {
    let t0 = Instant::now();
    let cfg = SessionConfig {
        ack_delay: Duration::ZERO,
        ..SessionConfig::default()
    };
    let (mut c, mut s) = open_pair_with(cfg.clone(), cfg, t0);
    let t = t0 + Duration::from_secs(5);
    for i in 1..=3 {
        arrive(&mut s, &mut c, msg(i), t);
        assert_eq!(acks_out(&mut c, t), [(Tag::Ack, u64::from(i))]);
    }
}

#[test]
fn a_paced_keepalive_takes_this_sides_along_when_due_within_half_a_pace() {
    let t0 = Instant::now();
    let (mut c, mut s) = open_pair_with(SessionConfig::default(), SessionConfig::default(), t0);
    let keepalives = |from: &mut Session, now| {
        std::iter::from_fn(|| from.poll_transmit(now))
            .filter(|(_, t)| matches!(t, Transmit::Frame(f) if f.tag == Tag::Keepalive))
            .map(|(_, t)| t)
            .collect::<Vec<_>>()
    };
    let hand = |to: &mut Session, link, units: Vec<Transmit>, now| {
        for u in units {
            to.handle_inbound(link, u.into(), now).expect("valid");
        }
    };
    // The first ones, each after its interval of silence: each side
    // learns the other's timeout.
    let t1 = c.poll_timeout().expect("a keepalive is due");
    c.handle_timeout(t1);
    s.handle_timeout(t1);
    let (from_c, from_s) = (keepalives(&mut c, t1), keepalives(&mut s, t1));
    assert_eq!((from_c.len(), from_s.len()), (1, 1));
    hand(&mut s, LinkId(2), from_c, t1);
    hand(&mut c, LinkId(1), from_s, t1);
    // Paced now, a third of the 15 s timeout apart: the client's next
    // comes as the server's own is due; the server sends its own with it.
    let pace = SessionConfig::default().keepalive_timeout / 3;
    let t2 = c.poll_timeout().expect("a keepalive is due");
    assert_eq!(t2, t1 + pace);
    c.handle_timeout(t2);
    let from_c = keepalives(&mut c, t2);
    assert_eq!(from_c.len(), 1);
    let early = t2 - pace / 4;
    hand(&mut s, LinkId(2), from_c, early);
    let along = keepalives(&mut s, early);
    assert_eq!(along.len(), 1, "the server's keepalive goes along");
    assert_eq!(
        s.poll_timeout(),
        Some(early + pace),
        "its timer starts again"
    );
    // The client sent a moment ago: the server's brings none back.
    hand(&mut c, LinkId(1), along, early);
    assert!(keepalives(&mut c, early).is_empty(), "no ping-pong");
}
