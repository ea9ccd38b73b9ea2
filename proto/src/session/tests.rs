//! The engine driven directly, without the simulator: backoff jitter,
//! dial deadlines, the order of messages and events, refused resumes,
//! aborts and encoded batches.

use std::time::Duration;

use super::*;

/// Redial delays are jittered between half the backoff and all of it,
/// and differ between sessions of different messengers (nonces).
#[test]
fn backoff_is_jittered_within_half_and_whole() {
    let now = Instant::now();
    let session = |nonce| {
        let local = LocalIdentity {
            name: EntityName::client(1),
            addr: EntityAddr::tcp(([127, 0, 0, 1], 0).into()).with_nonce(nonce),
            dials: Default::default(),
        };
        let peer = EntityAddr::tcp(([127, 0, 0, 1], 6800).into());
        Session::connect(
            SessionConfig::default(),
            local,
            peer,
            Policy::LosslessClient,
            now,
        )
    };
    let backoff = Duration::from_millis(100);
    let draws = |nonce| {
        let mut s = session(nonce);
        (0..64)
            .map(|_| s.redial.jittered(backoff))
            .collect::<Vec<_>>()
    };
    let a = draws(7);
    assert!(
        a.iter().all(|d| *d >= backoff / 2 && *d <= backoff),
        "{a:?}"
    );
    assert!(a.iter().any(|d| *d < backoff * 3 / 4) && a.iter().any(|d| *d > backoff * 3 / 4));
    assert_ne!(a, draws(8), "another messenger draws other delays");
    // Sessions of one messenger to different peers differ too.
    let to = |port| {
        let local = LocalIdentity {
            name: EntityName::client(1),
            addr: EntityAddr::tcp(([127, 0, 0, 1], 0).into()).with_nonce(7),
            dials: Default::default(),
        };
        let peer = EntityAddr::tcp(([127, 0, 0, 1], port).into());
        let mut s = Session::connect(
            SessionConfig::default(),
            local,
            peer,
            Policy::LosslessClient,
            now,
        );
        (0..8)
            .map(|_| s.redial.jittered(backoff))
            .collect::<Vec<_>>()
    };
    assert_ne!(to(6800), to(6801));
}

/// A dial that never comes up (a peer behind a partition drops the
/// SYNs) is given up after `handshake_timeout`: its link closed, the
/// session redials after its backoff, and the old dial coming up late
/// is closed rather than taken.
#[test]
fn a_dial_that_never_comes_up_is_given_up_and_redialled() {
    let now = Instant::now();
    let local = LocalIdentity {
        name: EntityName::peer(1),
        addr: EntityAddr::tcp(([127, 0, 0, 1], 6801).into()).with_nonce(1),
        dials: Default::default(),
    };
    let peer = EntityAddr::tcp(([127, 0, 0, 1], 6800).into());
    let cfg = SessionConfig::default();
    let timeout = cfg.handshake_timeout;
    let mut s = Session::connect(cfg, local, peer.clone(), Policy::LosslessPeer, now);
    let events = |s: &mut Session| std::iter::from_fn(|| s.poll_event()).collect::<Vec<_>>();
    assert_eq!(events(&mut s), vec![SessionEvent::Connect(peer.clone())]);
    s.dialing(LinkId(1));
    assert_eq!(s.poll_timeout(), Some(now + timeout));
    s.handle_timeout(now + timeout / 2);
    assert_eq!(s.phase(), Phase::Connecting, "not yet");
    s.handle_timeout(now + timeout);
    let ev = events(&mut s);
    assert!(ev.contains(&SessionEvent::CloseLink(LinkId(1))), "{ev:?}");
    assert_eq!(s.last_fault(), Some(&FaultReason::HandshakeTimeout));
    assert_eq!(s.failed_attempts(), 1);
    // The backoff, then a new dial.
    let redial = s.poll_timeout().expect("a redial is due");
    s.handle_timeout(redial);
    assert_eq!(events(&mut s), vec![SessionEvent::Connect(peer)]);
    s.dialing(LinkId(2));
    // The first dial comes up late: closed, the session waits for the second.
    s.link_up(LinkId(1), redial);
    assert_eq!(events(&mut s), vec![SessionEvent::CloseLink(LinkId(1))]);
    assert_eq!(s.phase(), Phase::Connecting);
    s.link_failed(LinkId(1), LinkFailure::Reset("late".into()), redial);
    assert_eq!(
        s.failed_attempts(),
        1,
        "a failure of the given-up dial is not this one's"
    );
    s.link_up(LinkId(2), redial);
    assert_ne!(s.phase(), Phase::Connecting, "the second dial is taken");
}
/// Everything `from` has to send, handed to `to` on `link` as is.
pub(super) fn hand_over(from: &mut Session, to: &mut Session, link: LinkId, now: Instant) {
    while let Some((_, t)) = from.poll_transmit(now) {
        to.handle_inbound(link, t.into(), now)
            .expect("a valid unit");
    }
}

/// A lossless client whose dial is up (link 1) and the server's session
/// for the accepted link (2), nothing exchanged yet.
fn client_and_server(now: Instant) -> (Session, Session) {
    client_and_server_with(SessionConfig::default(), SessionConfig::default(), now)
}

/// As [`client_and_server`], with the client's and the server's settings.
fn client_and_server_with(
    client: SessionConfig,
    server: SessionConfig,
    now: Instant,
) -> (Session, Session) {
    let addr =
        |port: u16| EntityAddr::tcp(([127, 0, 0, 1], port).into()).with_nonce(u64::from(port));
    let local = |name, port| LocalIdentity {
        name,
        addr: addr(port),
        dials: Default::default(),
    };
    let mut c = Session::connect(
        client,
        local(EntityName::client(1), 1),
        addr(2),
        Policy::LosslessClient,
        now,
    );
    c.link_up(LinkId(1), now);
    let s = Session::accept(server, local(EntityName::server(1), 2), LinkId(2), now);
    (c, s)
}

/// A client (on link 1) and the server session it opened (on link
/// 2), both open; the client's events are not taken yet.
fn open_pair(now: Instant) -> (Session, Session) {
    open_pair_with(SessionConfig::default(), SessionConfig::default(), now)
}

/// As [`open_pair`], with the client's and the server's settings.
pub(super) fn open_pair_with(
    client: SessionConfig,
    server: SessionConfig,
    now: Instant,
) -> (Session, Session) {
    let (mut c, mut s) = client_and_server_with(client, server, now);
    for _ in 0..4 {
        hand_over(&mut c, &mut s, LinkId(2), now);
        while let Some(ev) = s.poll_event() {
            if matches!(ev, SessionEvent::Identified(_)) {
                s.accept_new(7, now);
            }
        }
        hand_over(&mut s, &mut c, LinkId(1), now);
        if c.is_open() && s.is_open() {
            return (c, s);
        }
    }
    panic!("the handshake did not finish");
}

fn numbered(i: u8) -> Message {
    Message::new(1, vec![i], bytes::Bytes::new())
}

/// Messages and events come out apart but in the order they
/// happened: no message before the `Established` that came first, no
/// event that came after messages before them.
#[test]
fn messages_and_events_keep_their_order() {
    let now = Instant::now();
    let (mut c, mut s) = open_pair(now);
    for i in 1..=2 {
        s.send(numbered(i)).expect("room");
    }
    hand_over(&mut s, &mut c, LinkId(1), now);
    assert_eq!(c.poll_message(), None, "Connect and Established came first");
    assert!(matches!(c.poll_event(), Some(SessionEvent::Connect(_))));
    assert_eq!(c.poll_message(), None, "Established came first");
    assert!(matches!(c.poll_event(), Some(SessionEvent::Established(_))));
    let fronts: Vec<_> = std::iter::from_fn(|| c.poll_message())
        .map(|m| m.front)
        .collect();
    assert_eq!(fronts, [vec![1u8], vec![2]]);
    assert_eq!(c.poll_event(), None);
    // A message, then a fault: its CloseLink waits for the message.
    s.send(numbered(3)).expect("room");
    hand_over(&mut s, &mut c, LinkId(1), now);
    let bad = ProtocolError::Malformed {
        what: "test",
        detail: "a fault after a message".into(),
    };
    c.handle_decode_error(LinkId(1), bad, now);
    assert_eq!(c.poll_event(), None, "the message came first");
    assert_eq!(c.poll_message().map(|m| m.front), Some(vec![3u8].into()));
    assert_eq!(c.poll_event(), Some(SessionEvent::CloseLink(LinkId(1))));
    assert_eq!(c.poll_message(), None);
}

/// A hello that asks to resume from a restarted peer (another nonce)
/// is refused and leaves the session as it was: no remote reset of a
/// session that goes on over its link.
#[test]
fn a_refused_resume_leaves_the_session_alone() {
    let now = Instant::now();
    let (c, mut s) = open_pair(now);
    while s.poll_event().is_some() {}
    let peer = c.local.addr.clone();
    let hello = Hello {
        name: EntityName::client(1),
        addr: peer.clone().with_nonce(peer.nonce + 1),
        target: s.local.addr.clone(),
        policy: Policy::LosslessClient,
        cookie: 7,
        in_seq: 0,
        limits: None,
        dial: None,
    };
    let mut pending = Session::accept(SessionConfig::default(), s.local.clone(), LinkId(3), now);
    let t = s.take_link(LinkId(3), &hello, &mut pending, 9, now);
    assert!(matches!(t, Takeover::Rejected(_)), "{t:?}");
    assert_eq!(s.poll_event(), None, "no remote reset");
    assert!(s.is_open());
    assert_eq!(s.link(), Some(LinkId(2)));
}

/// An aborted session delivers nothing more: the messages not taken
/// are dropped, and the events they held back (the reset) follow.
#[test]
fn abort_drops_the_messages_not_taken() {
    let now = Instant::now();
    let (mut c, mut s) = open_pair(now);
    while c.poll_event().is_some() {}
    for i in 1..=3 {
        s.send(numbered(i)).expect("room");
    }
    hand_over(&mut s, &mut c, LinkId(1), now);
    assert_eq!(c.poll_message().map(|m| m.front), Some(vec![1u8].into()));
    c.abort(FaultReason::HandlerPanicked("test".into()));
    assert_eq!(c.poll_message(), None);
    let events: Vec<_> = std::iter::from_fn(|| c.poll_event()).collect();
    assert!(
        matches!(
            events.last(),
            Some(SessionEvent::Reset {
                reason: FaultReason::HandlerPanicked(_),
                ..
            })
        ),
        "{events:?}"
    );
    assert_eq!(c.poll_message(), None, "nothing after the end");
}

/// Messages `numbered(from..=to)` encoded as one batch elsewhere.
fn encoded(s: &Session, from: u8, to: u8) -> EncodedBatch {
    let max = s.cfg.batch_max_bytes;
    let mut buf = bytes::BytesMut::new();
    let mut b = EncodedBatch::open(&mut buf, 1, max, s.send_limits());
    for i in from..=to {
        assert!(b.push(&numbered(i), max));
    }
    b.close(&mut buf);
    b
}

/// A batch encoded before it reached the session takes the next
/// sequence numbers, in order with messages sent one by one.
#[test]
fn encoded_batches_take_their_place_in_the_sequence() {
    let now = Instant::now();
    let (mut c, mut s) = open_pair(now);
    while c.poll_event().is_some() {}
    assert_eq!(s.send(numbered(1)), Ok(1));
    assert_eq!(s.send_encoded(encoded(&s, 2, 4)), Ok(4));
    assert_eq!(s.send(numbered(5)), Ok(5));
    hand_over(&mut s, &mut c, LinkId(1), now);
    let got: Vec<(u64, Vec<u8>)> = std::iter::from_fn(|| c.poll_message())
        .map(|m| (m.seq, m.front.to_vec()))
        .collect();
    let want: Vec<(u64, Vec<u8>)> = (1..=5u8).map(|i| (u64::from(i), vec![i])).collect();
    assert_eq!(got, want);
}

/// For a peer that reads no batches, a batch is split into messages;
/// one whose entries do not parse (a bug in an encoding) ends the
/// session with a protocol error instead of losing messages.
#[test]
fn an_unparsable_batch_for_a_peer_without_batches_ends_the_session() {
    let now = Instant::now();
    let (mut c, mut s) = open_pair(now);
    while c.poll_event().is_some() {}
    while s.poll_event().is_some() {}
    s.remote.features &= !features::BATCH;
    s.send_encoded(encoded(&s, 1, 2)).expect("room");
    let mut bad = encoded(&s, 3, 4);
    bad.body_mut().extend_from_slice(&[0xff]);
    s.send_encoded(bad).expect("room");
    hand_over(&mut s, &mut c, LinkId(1), now);
    let fronts: Vec<_> = std::iter::from_fn(|| c.poll_message())
        .map(|m| m.front.to_vec())
        .collect();
    assert_eq!(fronts, [vec![1u8], vec![2]], "the good batch, one by one");
    let events: Vec<_> = std::iter::from_fn(|| s.poll_event()).collect();
    assert!(
        events.iter().any(|e| matches!(
            e,
            SessionEvent::Reset {
                reason: FaultReason::Protocol(ProtocolError::Batch(_)),
                ..
            }
        )),
        "{events:?}"
    );
    assert_eq!(s.queued_messages(), 0, "the rest is dropped and reported");
}

/// As [`hand_over`], with `strip` taken out of the banner's feature bits
/// (a peer of an older build).
fn hand_over_without(from: &mut Session, to: &mut Session, link: LinkId, strip: u64, now: Instant) {
    while let Some((_, t)) = from.poll_transmit(now) {
        let t = match t {
            Transmit::Banner(raw) => {
                let mut b = crate::banner::Banner::decode(&raw).expect("our banner");
                b.supported &= !strip;
                Transmit::Banner(b.encode())
            }
            t => t,
        };
        to.handle_inbound(link, t.into(), now)
            .expect("a valid unit");
    }
}

/// A lossless client's dial on link 1 opened a session at the server
/// (link 2), which queued a message in it, but the hello-ok never
/// reached the client: its handshake timed out. `redialler` makes the
/// session that dials again from the client (given the one that gave
/// up); its hello comes on link 4 and is routed to the server's
/// session. Returns both sessions, the server's events since it opened
/// and the messages the redialler got.
fn redial_unanswered(
    strip: u64,
    redialler: impl FnOnce(Session) -> Session,
) -> (Session, Session, Vec<SessionEvent>, Vec<Message>) {
    let now = Instant::now();
    let cfg = SessionConfig::default();
    let (mut c, mut s) = client_and_server(now);
    for _ in 0..4 {
        hand_over_without(&mut c, &mut s, LinkId(2), strip, now);
        while let Some(ev) = s.poll_event() {
            if matches!(ev, SessionEvent::Identified(_)) {
                s.accept_new(7, now);
            }
        }
        if s.is_open() {
            break;
        }
        hand_over_without(&mut s, &mut c, LinkId(1), strip, now);
    }
    assert!(s.is_open(), "{}", s.phase());
    while s.poll_event().is_some() {}
    s.send(numbered(1)).expect("room");
    // The hello-ok and the message are on their way when the client gives up.
    let later = now + cfg.handshake_timeout;
    c.handle_timeout(later);
    assert!(!c.is_open() && c.link().is_none(), "{}", c.phase());
    let mut c = redialler(c);
    let redial = c.poll_timeout().expect("a redial");
    c.handle_timeout(redial);
    c.link_up(LinkId(3), redial);
    let mut pending = Session::accept(cfg, s.local.clone(), LinkId(4), redial);
    let mut routed = false;
    for _ in 0..4 {
        hand_over_without(&mut c, &mut pending, LinkId(4), strip, redial);
        while let Some(ev) = pending.poll_event() {
            if let SessionEvent::Identified(hello) = ev {
                let t = s.take_link(LinkId(4), &hello, &mut pending, 9, redial);
                assert!(matches!(t, Takeover::Accepted), "{t:?}");
                routed = true;
            }
        }
        if routed {
            break;
        }
        hand_over_without(&mut pending, &mut c, LinkId(3), strip, redial);
    }
    assert!(routed, "the redial's hello never came");
    hand_over_without(&mut s, &mut c, LinkId(3), strip, redial);
    assert!(c.is_open() && s.is_open(), "{} / {}", c.phase(), s.phase());
    let events = std::iter::from_fn(|| s.poll_event()).collect();
    while c.poll_event().is_some() {}
    let got = std::iter::from_fn(|| c.poll_message()).collect();
    (c, s, events, got)
}

/// The client's redial goes on with the attempt the server opened the
/// session for: the server resumes it, the client adopts its cookie, and
/// the queued message arrives.
#[test]
fn a_redial_that_never_saw_hello_ok_resumes_the_session() {
    let (c, s, events, got) = redial_unanswered(0, |c| c);
    assert!(
        matches!(
            events[..],
            [
                SessionEvent::CloseLink(_),
                SessionEvent::Resumed { replayed: 1 }
            ]
        ),
        "{events:?}"
    );
    assert_eq!(
        got.iter().map(|m| m.front.clone()).collect::<Vec<_>>(),
        [vec![1u8]]
    );
    assert_eq!(c.remote.cookie, 7, "the session the server holds");
    assert_eq!(s.remote.cookie, 7);
}

/// Without `FIRST_DIAL` (an older peer) the redial starts over, as
/// before: the server's session is reset and its queue dropped, reported.
#[test]
fn without_first_dial_a_redial_resets_as_before() {
    let (_, s, events, got) = redial_unanswered(crate::banner::features::FIRST_DIAL, |c| c);
    assert!(
        events
            .iter()
            .any(|e| matches!(e, SessionEvent::RemoteReset { dropped } if *dropped == 1)),
        "{events:?}"
    );
    assert!(got.is_empty());
    assert_eq!(s.remote.cookie, 9, "a new session, its new cookie");
}

/// A new session of the same incarnation (the application dialled again
/// after a mark-down) or of a restarted client is a new attempt: the
/// server resets the one it holds.
#[test]
fn a_new_attempt_or_incarnation_resets_the_session() {
    let fresh = |nonce_step: u64| {
        move |old: Session| {
            let mut local = old.local.clone();
            if nonce_step != 0 {
                local.addr = local.addr.clone().with_nonce(local.addr.nonce + nonce_step);
                local.dials = DialAttempts::new();
            }
            let peer = old.remote.addr.clone().expect("dialled");
            let mut s = Session::connect(
                old.cfg.clone(),
                local,
                peer,
                Policy::LosslessClient,
                Instant::now(),
            );
            while s.poll_event().is_some() {}
            // Its first dial failed: the driver redials.
            s.fault(FaultReason::HandshakeTimeout, Instant::now());
            s
        }
    };
    for step in [0, 1] {
        let (_, _, events, got) = redial_unanswered(0, fresh(step));
        assert!(
            events
                .iter()
                .any(|e| matches!(e, SessionEvent::RemoteReset { .. })),
            "nonce step {step}: {events:?}"
        );
        assert!(got.is_empty(), "nonce step {step}");
    }
}
