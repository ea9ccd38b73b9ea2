//! Property tests of every decoder: round trips, arbitrary bytes never panic,
//! truncated input asks for more, and any single flipped bit is detected.

use std::str::FromStr;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use msgr_addr::{AddrVec, EntityAddr, EntityName};
use msgr_proto::banner::{Banner, BANNER_LEN};
use msgr_proto::control::{
    control_frame, with_dial_number, with_limits, Ack, Close, HelloOk, Keepalive, Limits,
    ReconnectOk,
};
use msgr_proto::frame::{Preamble, FLAG_UNCHECKED_PAYLOAD, MAX_SEGMENTS, PREAMBLE_LEN};
use msgr_proto::message::MessageFrame;
use msgr_proto::session::{Hello, LinkId, LocalIdentity, Policy, Session, SessionConfig};
use msgr_proto::sim::fuzz::{sample_frames, SampleKind, SamplePayload};
use msgr_proto::{
    Bincode, Codec, CodecError, Frame, FrameDecoder, FrameLimits, Inbound, Message, Postcard,
    StreamDecoder, Tag, Transmit,
};
use proptest::prelude::*;

fn tag() -> impl Strategy<Value = Tag> {
    (1u8..=14).prop_map(|t| Tag::from_u8(t).expect("valid tag"))
}

fn frame() -> impl Strategy<Value = Frame> {
    (
        tag(),
        any::<u8>(),
        proptest::collection::vec(
            proptest::collection::vec(any::<u8>(), 0..300),
            0..=MAX_SEGMENTS,
        ),
    )
        .prop_map(|(tag, flags, segs)| {
            let mut f = Frame::new(tag, segs.into_iter().map(Bytes::from));
            f.flags = flags;
            f
        })
}

fn message() -> impl Strategy<Value = (Message, u64)> {
    (
        any::<u16>(),
        any::<u8>(),
        any::<u8>(),
        any::<u64>(),
        proptest::collection::vec(any::<u8>(), 0..200),
        proptest::collection::vec(any::<u8>(), 0..500),
        any::<u64>(),
        prop_oneof![Just(0u64), any::<u64>()],
    )
        .prop_map(|(t, p, f, seq, front, data, ack, call)| {
            let mut m = Message::new(t, front, data);
            m.priority = p;
            m.flags = f;
            m.seq = seq;
            // Half plain messages, half calls (requests or replies).
            m.call = call;
            (m, ack)
        })
}

fn addr() -> impl Strategy<Value = EntityAddr> {
    (any::<[u8; 4]>(), any::<u16>(), any::<u64>())
        .prop_map(|(ip, port, nonce)| EntityAddr::tcp((ip, port).into()).with_nonce(nonce))
}

fn name() -> impl Strategy<Value = EntityName> {
    (0u8..3, any::<u64>()).prop_map(|(k, id)| match k {
        0 => EntityName::client(id),
        1 => EntityName::server(id),
        _ => EntityName::peer(id),
    })
}

fn policy() -> impl Strategy<Value = Policy> {
    prop_oneof![
        Just(Policy::LossyClient),
        Just(Policy::LosslessClient),
        Just(Policy::LosslessPeer),
        Just(Policy::Server)
    ]
}

/// Every control frame type with arbitrary field values.
fn control() -> impl Strategy<Value = Frame> {
    prop_oneof![
        (name(), addr(), addr(), policy(), any::<u64>(), any::<u64>()).prop_map(
            |(name, addr, target, policy, cookie, in_seq)| control_frame(
                Tag::Hello,
                &Hello {
                    name,
                    addr,
                    target,
                    policy,
                    cookie,
                    in_seq,
                    limits: None,
                    dial: None,
                }
            )
        ),
        (name(), addr(), any::<u64>()).prop_map(|(name, addr, cookie)| control_frame(
            Tag::HelloOk,
            &HelloOk { name, addr, cookie }
        )),
        (name(), addr(), any::<u64>()).prop_map(|(name, addr, in_seq)| control_frame(
            Tag::ReconnectOk,
            &ReconnectOk { name, addr, in_seq }
        )),
        Just(control_frame(Tag::SessionReset, &())),
        Just(control_frame(Tag::Wait, &())),
        any::<u64>().prop_map(|seq| control_frame(Tag::Ack, &Ack { seq })),
        any::<u64>().prop_map(|stamp| control_frame(Tag::Keepalive, &Keepalive { stamp })),
        any::<u64>().prop_map(|stamp| control_frame(Tag::KeepaliveAck, &Keepalive { stamp })),
        ".{0,100}".prop_map(|reason| control_frame(Tag::Close, &Close { reason })),
    ]
}

/// The wire bytes of a message frame's [`Frame`] (`Message::to_frame`
/// with the frame's flags): the reference the straight encoder must match.
fn via_frame(m: &MessageFrame) -> Vec<u8> {
    let mut f = m.msg.to_frame(m.ack);
    f.flags = m.flags;
    f.encode_to_vec().unwrap()
}

/// `p` encoded with `codec` into a message, through its frame, and back.
fn through_a_frame<C: Codec>(codec: &C, p: &SamplePayload) -> Result<SamplePayload, CodecError> {
    let m = Message::encode_with(codec, 9, p)?;
    let (back, _) = Message::from_frame(m.to_frame(0)).expect("a message frame");
    back.decode_with(codec)
}

fn decode_stream(bytes: &[u8]) -> Result<Vec<Frame>, msgr_proto::FrameError> {
    let mut dec = FrameDecoder::new(FrameLimits::default());
    let mut buf = BytesMut::from(bytes);
    let mut out = Vec::new();
    while let Some(f) = dec.decode(&mut buf)? {
        out.push(f);
    }
    assert!(buf.len() < dec.needed());
    Ok(out)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, .. ProptestConfig::default() })]

    #[test]
    fn any_frame_round_trips_through_both_decoders(f in frame()) {
        let enc = f.encode_to_vec().unwrap();
        prop_assert_eq!(enc.len(), f.encoded_len());
        prop_assert_eq!(Frame::decode_exact(Bytes::from(enc.clone()), &FrameLimits::default()), Ok(f.clone()));
        prop_assert_eq!(decode_stream(&enc), Ok(vec![f.clone()]));
        // The preamble alone round-trips too.
        let pre = f.preamble().unwrap();
        let mut raw = [0u8; PREAMBLE_LEN];
        raw.copy_from_slice(&enc[..PREAMBLE_LEN]);
        prop_assert_eq!(Preamble::decode(&raw, &FrameLimits::default()), Ok(pre));
        prop_assert_eq!(pre.frame_len(), enc.len() as u64);
    }

    #[test]
    fn every_control_frame_round_trips(f in control()) {
        let enc = f.encode_to_vec().unwrap();
        prop_assert_eq!(Frame::decode_exact(Bytes::from(enc), &FrameLimits::default()), Ok(f));
    }

    #[test]
    fn a_sequence_of_frames_splits_back_at_any_chunking(
        frames in proptest::collection::vec(frame(), 1..6),
        chunks in proptest::collection::vec(1usize..80, 1..50),
    ) {
        // What each frame is received as where it arrives whole (a
        // message-shaped frame whose header is refused is left out).
        let mut want = Vec::new();
        let mut stream = Banner::default().encode().to_vec();
        for f in &frames {
            let enc = f.encode_to_vec().unwrap();
            if let Ok(unit) = Inbound::decode_exact(Bytes::from(enc.clone()), &FrameLimits::default()) {
                want.push(unit);
                stream.extend(enc);
            }
        }
        let mut dec = StreamDecoder::new(FrameLimits::default());
        let mut buf = BytesMut::new();
        let mut got = Vec::new();
        let mut pos = 0;
        let mut i = 0;
        while pos < stream.len() {
            let n = chunks[i % chunks.len()].min(stream.len() - pos);
            i += 1;
            buf.extend_from_slice(&stream[pos..pos + n]);
            pos += n;
            while let Some(u) = dec.decode(&mut buf).unwrap() {
                got.push(u);
            }
        }
        prop_assert_eq!(got.len(), want.len() + 1);
        prop_assert_eq!(&got[0], &Inbound::Banner(Banner::default().encode()));
        prop_assert_eq!(&got[1..], &want[..]);
        prop_assert!(buf.is_empty());
    }

    #[test]
    fn every_message_round_trips((m, ack) in message()) {
        let f = m.to_frame(ack);
        let enc = f.encode_to_vec().unwrap();
        let back = Frame::decode_exact(Bytes::from(enc), &FrameLimits::default()).unwrap();
        prop_assert_eq!(Message::from_frame(back), Ok((m, ack)));
    }

    /// A message written straight ([`MessageFrame`]) is the frame of that
    /// message, byte for byte, and decodes straight back to it.
    #[test]
    fn message_frames_go_straight_as_through_a_frame((m, ack) in message(), unchecked in any::<bool>()) {
        let flags = if unchecked { FLAG_UNCHECKED_PAYLOAD } else { 0 };
        let straight = MessageFrame { msg: m.clone(), ack, flags };
        let wire = Transmit::Message(straight.clone()).encode_to_vec().unwrap();
        prop_assert_eq!(wire.len(), straight.encoded_len());
        prop_assert_eq!(&wire, &via_frame(&straight));
        let back = Inbound::decode_exact(Bytes::from(wire), &FrameLimits::default());
        prop_assert_eq!(back, Ok(Inbound::Message(straight)));
    }

    /// Any message-shaped frame — whatever its header holds — gets the same
    /// verdict, and the same message, from the straight decoder as from a
    /// [`Frame`] and [`Message::from_frame`].
    #[test]
    fn both_paths_give_the_same_verdict(
        header in proptest::collection::vec(prop_oneof![3 => Just(0u8), 1 => any::<u8>()], 32),
        front in proptest::collection::vec(any::<u8>(), 0..100),
        data in proptest::collection::vec(any::<u8>(), 0..100),
        flags in prop_oneof![Just(0u8), Just(FLAG_UNCHECKED_PAYLOAD), any::<u8>()],
    ) {
        let mut f = Frame::new(Tag::Message, [Bytes::from(header), Bytes::from(front), Bytes::from(data)]);
        f.flags = flags;
        let wire = Bytes::from(f.encode_to_vec().unwrap());
        let limits = FrameLimits::default();
        let straight = match Inbound::decode_exact(wire.clone(), &limits) {
            Ok(Inbound::Message(m)) => Some((m.msg, m.ack)),
            Ok(other) => return Err(TestCaseError::fail(format!("a message frame as {other:?}"))),
            Err(_) => None,
        };
        let through = Frame::decode_exact(wire, &limits).ok().and_then(|f| Message::from_frame(f).ok());
        prop_assert_eq!(straight, through);
    }

    /// Any flipped bit of a message frame is caught by the straight decoder.
    #[test]
    fn a_flipped_bit_in_any_message_is_detected((m, ack) in message(), pos in any::<prop::sample::Index>(), bit in 0u8..8) {
        let mut wire = via_frame(&MessageFrame::new(m, ack));
        let i = pos.index(wire.len());
        wire[i] ^= 1 << bit;
        let r = Inbound::decode_exact(Bytes::from(wire), &FrameLimits::default());
        prop_assert!(r.is_err(), "flip at byte {} bit {} decoded as {:?}", i, bit, r);
    }

    #[test]
    fn typed_payloads_round_trip(
        id in any::<u32>(), nm in ".{0,40}", tags in proptest::collection::vec(any::<u16>(), 0..20),
        offset in any::<Option<i64>>(), blob in proptest::collection::vec(any::<u8>(), 0..64),
        kind in 0u8..3, n in any::<u64>(), who in name(), a in proptest::option::of(addr()),
    ) {
        let kind = match kind {
            0 => SampleKind::Ping,
            1 => SampleKind::Data(n),
            _ => SampleKind::Named { name: who, flag: n % 2 == 0 },
        };
        let p = SamplePayload { id, name: nm, tags, offset, kind, blob, addr: a };
        let m = Message::encode(9, &p).unwrap();
        let (back, _) = Message::from_frame(m.to_frame(0)).unwrap();
        prop_assert_eq!(back.decode::<SamplePayload>(), Ok(p.clone()));
        prop_assert_eq!(through_a_frame(&Postcard, &p), Ok(p.clone()));
        prop_assert_eq!(through_a_frame(&Bincode, &p), Ok(p));
    }

    #[test]
    fn banner_round_trips(version in any::<u16>(), supported in any::<u64>(), required in any::<u64>()) {
        let b = Banner { version, supported, required };
        prop_assert_eq!(Banner::decode(&b.encode()), Ok(b));
    }

    #[test]
    fn arbitrary_bytes_never_panic_any_decoder(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        let limits = FrameLimits::default();
        let _ = decode_stream(&bytes);
        let _ = Frame::decode_exact(Bytes::from(bytes.clone()), &limits);
        let mut sd = StreamDecoder::new(limits);
        let mut buf = BytesMut::from(&bytes[..]);
        while let Ok(Some(_)) = sd.decode(&mut buf) {}
        if bytes.len() >= BANNER_LEN {
            let mut raw = [0u8; BANNER_LEN];
            raw.copy_from_slice(&bytes[..BANNER_LEN]);
            let _ = Banner::decode(&raw);
            let mut pre = [0u8; PREAMBLE_LEN];
            pre.copy_from_slice(&bytes[..PREAMBLE_LEN]);
            let _ = Preamble::decode(&pre, &limits);
        }
        // Message::from_frame on arbitrary segment shapes and contents.
        for n in 0..=MAX_SEGMENTS {
            let segs = bytes.chunks(bytes.len() / (n + 1) + 1).take(n).map(Bytes::copy_from_slice);
            let _ = Message::from_frame(Frame::new(Tag::Message, segs));
        }
        if let Ok(s) = std::str::from_utf8(&bytes) {
            let _ = EntityAddr::from_str(s);
            let _ = AddrVec::from_str(s);
            let _ = EntityName::from_str(s);
        }
        let _ = Postcard.decode::<SamplePayload>(&bytes);
        let _ = Bincode.decode::<SamplePayload>(&bytes);
    }

    #[test]
    fn address_strings_never_panic_and_round_trip(s in "[a-z+;:/\\[\\]0-9.?=&%_,-]{0,80}") {
        if let Ok(a) = EntityAddr::from_str(&s) {
            prop_assert_eq!(a.to_string().parse::<EntityAddr>(), Ok(a));
        }
        if let Ok(v) = AddrVec::from_str(&s) {
            prop_assert_eq!(v.to_string().parse::<AddrVec>(), Ok(v));
        }
    }

    /// Control payload parsing through the engine: arbitrary segments on every
    /// tag, in each handshake state, must give an error or a transition,
    /// never a panic.
    #[test]
    fn arbitrary_control_payloads_never_panic_the_engine(
        t in tag(),
        segs in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..120), 0..3),
        acceptor in any::<bool>(),
        open in any::<bool>(),
    ) {
        let now = Instant::now();
        let local = LocalIdentity { name: EntityName::peer(1), addr: EntityAddr::tcp(([10, 0, 0, 1], 6800).into()), dials: Default::default() };
        let peer = EntityAddr::tcp(([10, 0, 0, 2], 6800).into());
        let l = LinkId(1);
        let mut s = if acceptor {
            Session::accept(SessionConfig::default(), local, l, now)
        } else {
            let mut s = Session::connect(SessionConfig::default(), local, peer.clone(), Policy::LosslessClient, now);
            s.link_up(l, now);
            s
        };
        s.handle_inbound(l, Inbound::Banner(Banner::default().encode()), now).unwrap();
        if open && !acceptor {
            let ok = control_frame(Tag::HelloOk, &HelloOk { name: EntityName::peer(2), addr: peer, cookie: 5 });
            let ok = with_dial_number(with_limits(ok, &Limits::of(&FrameLimits::default())), 1);
            s.handle_inbound(l, Inbound::Frame(ok), now).unwrap();
            prop_assert!(s.is_open());
        }
        let f = Frame::new(t, segs.into_iter().map(Bytes::from));
        let _ = s.handle_inbound(l, Inbound::Frame(f), now);
        while s.poll_transmit(now).is_some() {}
        while s.poll_event().is_some() {}
    }
}

/// A lossless client session with `cfg`, open on link 1 with a peer whose
/// banner is `theirs` (the hello-ok carries limits and a dial number, as
/// the default banners agree).
fn open_session(cfg: SessionConfig, theirs: Banner, now: Instant) -> (Session, LinkId) {
    let local = LocalIdentity {
        name: EntityName::peer(1),
        addr: EntityAddr::tcp(([10, 0, 0, 1], 6800).into()),
        dials: Default::default(),
    };
    let peer = EntityAddr::tcp(([10, 0, 0, 2], 6800).into());
    let l = LinkId(1);
    let mut s = Session::connect(cfg, local, peer.clone(), Policy::LosslessClient, now);
    s.link_up(l, now);
    s.handle_inbound(l, Inbound::Banner(theirs.encode()), now)
        .unwrap();
    let ok = control_frame(
        Tag::HelloOk,
        &HelloOk {
            name: EntityName::peer(2),
            addr: peer,
            cookie: 5,
        },
    );
    let ok = with_dial_number(with_limits(ok, &Limits::of(&FrameLimits::default())), 1);
    s.handle_inbound(l, Inbound::Frame(ok), now).unwrap();
    assert!(s.is_open());
    (s, l)
}

/// A peer that sends a message with an unchecked payload on a link where
/// payload CRCs were not agreed (its banner did not offer it, or ours did
/// not) is refused with a protocol error, not believed.
#[test]
fn unchecked_payload_without_agreement_is_a_protocol_error() {
    for (ours, theirs) in [(true, true), (true, false), (false, true)] {
        let now = Instant::now();
        let cfg = SessionConfig {
            payload_crc: ours,
            ..SessionConfig::default()
        };
        let (mut s, l) = open_session(cfg, Banner::with_payload_crc(theirs), now);
        let mut f = Message::new(1, &b"front"[..], &b"data"[..]).to_frame(0);
        f.flags |= FLAG_UNCHECKED_PAYLOAD;
        let f = Frame::decode_exact(
            Bytes::from(f.encode_to_vec().unwrap()),
            &FrameLimits::default(),
        )
        .unwrap();
        let r = s.handle_inbound(l, Inbound::Frame(f), now);
        assert!(
            matches!(r, Err(msgr_proto::ProtocolError::Malformed { .. })),
            "ours {ours} theirs {theirs}: {r:?}"
        );
    }
}

/// Priority lanes are offered by default; an open session takes a
/// fragment frame only where both banners offered `LANES`, and refuses
/// it as unexpected otherwise (a protocol error, never a message): a side
/// configured with `max_fragment = 0`, or a peer without the bit.
#[test]
fn fragments_are_taken_only_where_both_offered_lanes() {
    use msgr_proto::banner::features;
    use msgr_proto::fragment::Fragmenter;

    assert_ne!(features::SUPPORTED & features::LANES, 0);
    assert_ne!(Banner::default().supported & features::LANES, 0);
    let now = Instant::now();
    let fragment = || {
        let mut m = Message::new(1, &b"front"[..], Bytes::new());
        m.seq = 1;
        let mut cut = Fragmenter::new(m, 0, 64).unwrap();
        let f = cut.next_numbered(1, 0).unwrap();
        let wire = Bytes::from(f.into_frame().encode_to_vec().unwrap());
        Inbound::decode_exact(wire, &FrameLimits::default()).unwrap()
    };
    let lanes_off = SessionConfig {
        max_fragment: 0,
        ..SessionConfig::default()
    };
    let mut without = Banner::default();
    without.supported &= !features::LANES;
    for (cfg, theirs) in [
        (lanes_off, Banner::default()),
        (SessionConfig::default(), without),
    ] {
        let (mut s, l) = open_session(cfg, theirs, now);
        let r = s.handle_inbound(l, fragment(), now);
        assert!(
            matches!(
                r,
                Err(msgr_proto::ProtocolError::Unexpected {
                    tag: Tag::Fragment,
                    ..
                })
            ),
            "{r:?}"
        );
    }
    let (mut s, l) = open_session(SessionConfig::default(), Banner::default(), now);
    s.handle_inbound(l, fragment(), now).unwrap();
    while s.poll_event().is_some() {}
    let m = s.poll_message().expect("a message of one fragment");
    assert_eq!((&m.front[..], m.data.len()), (&b"front"[..], 0));
}

/// Every strict prefix of an encoded frame makes the decoders ask for more
/// (`Ok(None)`), never an error or a different frame.
#[test]
fn a_frame_cut_at_any_byte_asks_for_more() {
    for f in sample_frames() {
        let enc = f.encode_to_vec().unwrap();
        for cut in 0..enc.len() {
            let mut dec = FrameDecoder::new(FrameLimits::default());
            let mut buf = BytesMut::from(&enc[..cut]);
            assert_eq!(dec.decode(&mut buf), Ok(None), "{:?} cut at {cut}", f.tag);
            assert_eq!(buf.len(), cut, "bytes consumed while asking for more");
            assert!(dec.needed() > cut);
            // Feeding the rest completes it.
            buf.extend_from_slice(&enc[cut..]);
            assert_eq!(dec.decode(&mut buf), Ok(Some(f.clone())));
            // The stream decoder likewise, banner first.
            let mut sd = StreamDecoder::new(FrameLimits::default());
            let mut stream = Banner::default().encode().to_vec();
            stream.extend_from_slice(&enc[..cut]);
            let mut buf = BytesMut::from(&stream[..]);
            assert!(matches!(sd.decode(&mut buf), Ok(Some(Inbound::Banner(_)))));
            assert_eq!(sd.decode(&mut buf), Ok(None));
            assert!(sd.needed() > buf.len());
        }
        // Banner prefixes too.
        let b = Banner::default().encode();
        for cut in 0..BANNER_LEN {
            let mut sd = StreamDecoder::new(FrameLimits::default());
            let mut buf = BytesMut::from(&b[..cut]);
            assert_eq!(sd.decode(&mut buf), Ok(None));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]

    #[test]
    fn a_cut_frame_asks_for_more(f in frame(), cut in any::<prop::sample::Index>()) {
        let enc = f.encode_to_vec().unwrap();
        let cut = cut.index(enc.len());
        let mut dec = FrameDecoder::new(FrameLimits::default());
        let mut buf = BytesMut::from(&enc[..cut]);
        prop_assert_eq!(dec.decode(&mut buf), Ok(None));
        prop_assert_eq!(
            Frame::decode_exact(Bytes::copy_from_slice(&enc[..cut]), &FrameLimits::default()).is_err(),
            true
        );
    }
}

/// Any single flipped bit of an encoded frame is detected: an error, never a
/// different frame (and never "need more" forever: the stream is complete).
#[test]
fn every_single_bit_flip_of_every_sample_frame_is_detected() {
    let mut checked = 0;
    for f in sample_frames() {
        let enc = f.encode_to_vec().unwrap();
        for bit in 0..enc.len() * 8 {
            let mut bad = enc.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            let r = Frame::decode_exact(Bytes::from(bad.clone()), &FrameLimits::default());
            assert!(
                r.is_err(),
                "{:?}: flipped bit {bit} decoded as {r:?}",
                f.tag
            );
            let r = Inbound::decode_exact(Bytes::from(bad.clone()), &FrameLimits::default());
            assert!(
                r.is_err(),
                "{:?}: flipped bit {bit} decoded straight as {r:?}",
                f.tag
            );
            let mut dec = FrameDecoder::new(FrameLimits::default());
            let mut buf = BytesMut::from(&bad[..]);
            assert!(
                dec.decode(&mut buf).is_err(),
                "{:?}: stream decoder missed bit {bit}",
                f.tag
            );
            checked += 1;
        }
    }
    assert!(checked > 5_000, "{checked}");
    // And the banner.
    let b = Banner::default().encode();
    for bit in 0..BANNER_LEN * 8 {
        let mut bad = b;
        bad[bit / 8] ^= 1 << (bit % 8);
        assert!(Banner::decode(&bad).is_err(), "banner bit {bit}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]

    #[test]
    fn a_flipped_bit_in_any_frame_is_detected(mut f in frame(), pos in any::<prop::sample::Index>(), bit in 0u8..8) {
        f.flags &= !FLAG_UNCHECKED_PAYLOAD; // see the next property
        let mut enc = f.encode_to_vec().unwrap();
        let i = pos.index(enc.len());
        enc[i] ^= 1 << bit;
        let r = Frame::decode_exact(Bytes::from(enc), &FrameLimits::default());
        prop_assert!(r.is_err(), "flip at byte {} bit {} decoded as {:?}", i, bit, r);
    }

    /// With unchecked payloads (negotiated), a flip inside segments 1.. is
    /// delivered as exactly that flip, and any other flip is still detected.
    #[test]
    fn unchecked_payload_flips_are_exactly_the_payload_ones(mut f in frame(), pos in any::<prop::sample::Index>(), bit in 0u8..8) {
        f.flags |= FLAG_UNCHECKED_PAYLOAD;
        let mut enc = f.encode_to_vec().unwrap();
        let i = pos.index(enc.len());
        enc[i] ^= 1 << bit;
        let first = f.segments.first().map_or(0, Bytes::len);
        let payload_end = PREAMBLE_LEN + f.segments.iter().map(Bytes::len).sum::<usize>();
        let r = Frame::decode_exact(Bytes::from(enc), &FrameLimits::default());
        if (PREAMBLE_LEN + first..payload_end).contains(&i) {
            let got = r.expect("payload flips are not checked");
            let mut want: Vec<u8> = f.segments[1..].concat();
            want[i - PREAMBLE_LEN - first] ^= 1 << bit;
            prop_assert_eq!(got.segments[1..].concat(), want);
            prop_assert_eq!(&got.segments[0], &f.segments[0]);
        } else {
            prop_assert!(r.is_err(), "flip at byte {} bit {} decoded as {:?}", i, bit, r);
        }
    }
}

// ---- batch frames ------------------------------------------------------------

/// A batch frame of `msgs` from `base`, as a session writes it.
fn batch_frame(msgs: &[(Message, u64)], base: u64, ack: u64, max: usize) -> (Frame, usize) {
    use msgr_proto::batch::BatchWriter;
    let mut buf = BytesMut::new();
    let mut w = BatchWriter::begin(&mut buf, base, ack, max);
    let taken = msgs.iter().take_while(|(m, _)| w.push(m)).count();
    (Frame::single(Tag::MessageBatch, w.finish()), taken)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]

    /// Whatever fits a batch reads back through the wire and both decoders:
    /// every field, seq = base + index, the ack once.
    #[test]
    fn batches_round_trip_through_the_wire(
        msgs in proptest::collection::vec(message(), 1..40),
        base in 1u64..u64::MAX / 2,
        ack in any::<u64>(),
        max in 24usize..20_000,
    ) {
        use msgr_proto::batch::BatchReader;
        let (f, taken) = batch_frame(&msgs, base, ack, max);
        prop_assert!(f.segments[0].len() <= max.max(24));
        let wire = Bytes::from(f.encode_to_vec().unwrap());
        let Ok(Inbound::Frame(back)) = Inbound::decode_exact(wire.clone(), &FrameLimits::default()) else {
            panic!("a batch frame decodes as a frame");
        };
        prop_assert_eq!(&back, &f);
        prop_assert_eq!(decode_stream(&wire).unwrap(), vec![f]);
        if taken == 0 {
            prop_assert!(BatchReader::new(back.segments[0].clone()).is_err(), "an empty batch is refused");
            return Ok(());
        }
        let r = BatchReader::new(back.segments[0].clone()).unwrap();
        prop_assert_eq!((r.base_seq(), r.ack(), r.entry_count() as usize), (base, ack, taken));
        let got: Vec<Message> = r.collect::<Result<_, _>>().unwrap();
        for (i, (g, (m, _))) in got.iter().zip(&msgs).enumerate() {
            let mut want = m.clone();
            want.seq = base + i as u64;
            prop_assert_eq!(g, &want);
        }
    }

    /// Arbitrary bytes as a batch body never panic; a cut body is refused
    /// (a batch is whole or an error, never fewer messages silently).
    #[test]
    fn arbitrary_and_cut_batch_bodies_are_errors_not_panics(
        bytes in proptest::collection::vec(any::<u8>(), 0..400),
        msgs in proptest::collection::vec(message(), 1..8),
        cut in any::<prop::sample::Index>(),
    ) {
        use msgr_proto::batch::BatchReader;
        if let Ok(r) = BatchReader::new(Bytes::from(bytes)) {
            for m in r {
                let _ = m;
            }
        }
        let (f, _) = batch_frame(&msgs, 1, 0, 1 << 16);
        let body = f.segments[0].clone();
        let at = cut.index(body.len());
        let whole = BatchReader::new(body.slice(..at))
            .and_then(|r| r.collect::<Result<Vec<_>, _>>());
        prop_assert!(whole.is_err(), "a body cut at {} of {} read whole", at, body.len());
    }

    /// One flipped bit anywhere in a batch frame is caught by its CRCs.
    #[test]
    fn a_flipped_bit_in_any_batch_is_detected(
        msgs in proptest::collection::vec(message(), 1..10),
        pos in any::<prop::sample::Index>(),
        bit in 0u8..8,
    ) {
        let (f, _) = batch_frame(&msgs, 5, 4, 1 << 16);
        let mut wire = f.encode_to_vec().unwrap();
        let at = pos.index(wire.len());
        wire[at] ^= 1 << bit;
        prop_assert!(Frame::decode_exact(Bytes::from(wire), &FrameLimits::default()).is_err());
    }
}

mod record_nonces {
    use super::*;
    use msgr_proto::auth::handshake::LinkKeys;
    use msgr_proto::auth::record::RekeyPolicy;
    use msgr_proto::auth::RecordLayer;
    use msgr_proto::message::MessageFrame;
    use msgr_proto::{FrameLimits, Inbound, Message, Transmit};

    fn unit(len: usize) -> Transmit {
        Transmit::Message(MessageFrame::new(
            Message::new(1, vec![7u8; len], Vec::new()),
            0,
        ))
    }

    proptest! {
        /// Under any rekey policy both ends stay in step, and no (key,
        /// nonce) pair is used twice: the same plaintext sealed again and
        /// again never gives the same ciphertext.
        #[test]
        fn nonces_never_repeat_and_both_ends_rekey_together(
            lens in proptest::collection::vec(0usize..300, 1..200),
            bytes in 1u64..2000,
            pieces in 1u64..40,
        ) {
            let keys = LinkKeys::from_secrets([5; 32], [6; 32]);
            let policy = RekeyPolicy { bytes, pieces };
            let mut tx = RecordLayer::with_policy(&keys, policy);
            let mut rx = RecordLayer::with_policy(&keys.mirrored(), policy);
            let mut probe_tx = RecordLayer::with_policy(&keys, policy);
            let mut seen = std::collections::HashSet::new();
            for len in &lens {
                let sealed = tx.seal(unit(*len));
                prop_assert!(rx.open(sealed, &FrameLimits::default()).is_ok());
                // The same plaintext each time, on a twin that seals in step.
                let twin = probe_tx.seal(unit(3));
                prop_assert!(seen.insert(twin.segments[0].clone()), "a ciphertext repeated");
            }
            prop_assert_eq!(tx.generations().0, rx.generations().1);
        }

        /// Dropping, repeating or swapping one sealed frame of a sequence
        /// is caught at that frame.
        #[test]
        fn a_dropped_repeated_or_swapped_frame_fails(
            n in 2usize..30,
            at in 0usize..29,
            what in 0u8..3,
        ) {
            let at = at % (n - 1);
            let keys = LinkKeys::from_secrets([8; 32], [9; 32]);
            let mut tx = RecordLayer::new(&keys);
            let mut rx = RecordLayer::new(&keys.mirrored());
            let mut frames: Vec<_> = (0..n).map(|i| tx.seal(unit(i))).collect();
            match what {
                0 => { frames.remove(at); }
                1 => { let f = frames[at].clone(); frames.insert(at + 1, f); }
                _ => frames.swap(at, at + 1),
            }
            for (i, f) in frames.into_iter().enumerate() {
                let r = rx.open(f, &FrameLimits::default());
                if i < at || (what == 1 && i == at) {
                    prop_assert!(matches!(r, Ok(Inbound::Frame(_))), "frame {} should open", i);
                } else if (what == 1 && i == at + 1) || (what != 1 && i == at) {
                    prop_assert!(r.is_err(), "frame {} should fail", i);
                    break;
                }
            }
        }
    }
}

/// A bincode length prefix that claims more than the input holds is an
/// error, not an allocation of what it claims (bincode allocates first);
/// trailing bytes are an error, as with postcard.
#[test]
fn bincode_refuses_lying_lengths_and_trailing_bytes() {
    for claimed in [1u64 << 20, 1 << 40, u64::MAX] {
        let mut lying = claimed.to_le_bytes().to_vec();
        lying.extend_from_slice(b"short");
        let e = Bincode.decode::<String>(&lying).unwrap_err();
        assert_eq!(e.codec, "bincode");
        assert!(Bincode.decode::<Vec<u8>>(&lying).is_err());
    }
    let mut bytes = Bincode.encode(&String::from("short")).unwrap().to_vec();
    assert_eq!(Bincode.decode::<String>(&bytes).as_deref(), Ok("short"));
    bytes.push(0);
    let e = Bincode.decode::<String>(&bytes).unwrap_err();
    assert!(e.detail.contains("1 trailing"), "{e}");
}

/// The two codecs' formats, as documented: postcard's varints, bincode's
/// fixed-width little-endian integers with u64 lengths.
#[test]
fn codec_layouts_are_as_documented() {
    let v: (u32, Vec<u16>) = (1, vec![2]);
    assert_eq!(Postcard.encode(&v).unwrap()[..], [1, 1, 2]);
    assert_eq!(
        Bincode.encode(&v).unwrap()[..],
        [1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0]
    );
}
