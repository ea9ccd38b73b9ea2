//! Acknowledgements in the engine, driven directly: a stream's acks
//! wait for a message to carry them, or for `ack_delay`; a lone arrival
//! and a quarter of the in-flight window are acknowledged at once.

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
