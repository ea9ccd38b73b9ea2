//! Property tests of fragment frames and their reassembly: random messages
//! of random classes, cut and interleaved across classes, come back equal
//! and in order per class; arbitrary bytes never panic the decoder or the
//! reassembler; a cut fragment frame asks for more.

use bytes::{Bytes, BytesMut};
use msgr_proto::fragment::{Fragment, FragmentError, Fragmenter, MessageHead, Reassembler};
use msgr_proto::frame::MAX_SEGMENTS;
use msgr_proto::sim::fuzz::{by_class, number_per_class};
use msgr_proto::{Frame, FrameDecoder, FrameLimits, Message, Priority, Tag};
use proptest::prelude::*;

/// An application message of a random class: priority byte, sizes and
/// contents random, half of them calls.
fn message() -> impl Strategy<Value = Message> {
    (
        any::<u16>(),
        any::<u8>(),
        any::<u8>(),
        proptest::collection::vec(any::<u8>(), 0..300),
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..64),
            proptest::collection::vec(any::<u8>(), 0..3000),
        ],
        prop_oneof![Just(0u64), any::<u64>()],
    )
        .prop_map(|(t, priority, flags, front, data, call)| {
            let mut m = Message::new(t, front, data);
            m.priority = priority;
            m.flags = flags;
            m.call = call;
            m
        })
}

/// Every message's fragments, interleaved across classes as `picks`
/// chooses, in order within each class (one message after the other).
fn interleave(msgs: &[Message], max_fragment: usize, picks: &[u8]) -> Vec<Fragment> {
    let mut lanes: Vec<Vec<Fragment>> = vec![Vec::new(); Priority::COUNT];
    for (i, m) in msgs.iter().enumerate() {
        let frags = Fragmenter::new(m.clone(), i as u64, max_fragment).expect("a valid message");
        lanes[m.class().index()].extend(frags);
    }
    for lane in &mut lanes {
        lane.reverse();
    }
    let mut out = Vec::new();
    let mut pick = picks.iter().cycle();
    while lanes.iter().any(|l| !l.is_empty()) {
        let ready: Vec<usize> = (0..lanes.len()).filter(|&i| !lanes[i].is_empty()).collect();
        let i = ready[usize::from(*pick.next().unwrap_or(&0)) % ready.len()];
        out.extend(lanes[i].pop());
    }
    out
}

/// Decodes a byte stream of frames.
fn decode_stream(bytes: &[u8]) -> Vec<Frame> {
    let mut dec = FrameDecoder::new(FrameLimits::default());
    let mut buf = BytesMut::from(bytes);
    let mut out = Vec::new();
    while let Some(f) = dec.decode(&mut buf).expect("a stream of good frames") {
        out.push(f);
    }
    assert!(buf.is_empty());
    out
}

/// A fragment from arbitrary field values (mostly malformed).
fn any_fragment() -> impl Strategy<Value = Fragment> {
    (
        0u8..4,
        prop_oneof![0u64..4, any::<u64>()],
        prop_oneof![0u32..64, any::<u32>()],
        prop_oneof![0u64..256, any::<u64>()],
        prop_oneof![0u64..256, any::<u64>()],
        proptest::option::of((any::<u16>(), any::<u8>(), any::<u64>())),
        proptest::collection::vec(any::<u8>(), 0..128),
    )
        .prop_map(
            |(class, class_seq, front_len, offset, total, head, piece)| Fragment {
                class: Priority::from_wire(class).expect("a class"),
                class_seq,
                front_len,
                offset,
                total,
                head: head.map(|(msg_type, priority, call)| MessageHead {
                    msg_type,
                    priority,
                    call,
                    ..MessageHead::default()
                }),
                piece: Bytes::from(piece),
                seq: class_seq.wrapping_mul(3),
                ack: offset,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]

    /// Cut, interleaved across classes, put through the wire and put back
    /// together: every message comes back equal, with its ack, in its
    /// class's order; memory stays within the limit times the classes.
    #[test]
    fn interleaved_fragments_reassemble_in_order_per_class(
        mut msgs in proptest::collection::vec(message(), 1..24),
        max_fragment in prop_oneof![1usize..16, 16usize..1024, Just(64usize << 10)],
        picks in proptest::collection::vec(any::<u8>(), 1..64),
    ) {
        number_per_class(&mut msgs);
        let frags = interleave(&msgs, max_fragment, &picks);
        let mut wire = Vec::new();
        for f in &frags {
            prop_assert!(f.piece.len() <= max_fragment);
            wire.extend(f.clone().into_frame().encode_to_vec().expect("a small frame"));
        }
        let max_message = 300 + 3000;
        let mut r = Reassembler::new(max_message);
        let mut got: Vec<Vec<(Message, u64)>> = vec![Vec::new(); Priority::COUNT];
        for frame in decode_stream(&wire) {
            let f = Fragment::from_frame(frame).expect("a fragment as written");
            let class = f.class;
            if let Some(done) = r.push(f).expect("in order within its class") {
                prop_assert_eq!(done.0.class(), class);
                got[class.index()].push(done);
            }
            prop_assert!(r.reserved() <= max_message * Priority::COUNT);
        }
        prop_assert_eq!(r.reserved(), 0);
        let want = by_class(&msgs);
        prop_assert_eq!(&got, &want);
        for class in Priority::ALL {
            prop_assert_eq!(r.next_seq(class), want[class.index()].len() as u64 + 1);
        }
    }

    /// Arbitrary bytes as a stream, and as the segments of a fragment
    /// frame, never panic the decoder; whatever decodes, the reassembler
    /// takes or refuses without panicking.
    #[test]
    fn arbitrary_bytes_never_panic_the_fragment_decoder(
        bytes in proptest::collection::vec(any::<u8>(), 0..600),
    ) {
        let mut r = Reassembler::new(1024);
        let mut dec = FrameDecoder::new(FrameLimits::default());
        let mut buf = BytesMut::from(&bytes[..]);
        while let Ok(Some(f)) = dec.decode(&mut buf) {
            if let Ok(f) = Fragment::from_frame(f) {
                let _ = r.push(f);
            }
        }
        for n in 0..=MAX_SEGMENTS {
            let segs = bytes.chunks(bytes.len() / (n + 1) + 1).take(n).map(Bytes::copy_from_slice);
            if let Ok(f) = Fragment::from_frame(Frame::new(Tag::Fragment, segs)) {
                let _ = r.push(f);
            }
        }
        // Headers of the right lengths, so the decoder reads the fields.
        let mut segs = bytes.chunks(32).map(Bytes::copy_from_slice);
        let (h, head) = (segs.next().unwrap_or_default(), segs.next().unwrap_or_default());
        let piece = Bytes::copy_from_slice(bytes.get(64..).unwrap_or_default());
        for head in [head, Bytes::new()] {
            if let Ok(f) = Fragment::from_frame(Frame::new(Tag::Fragment, [h.clone(), head, piece.clone()])) {
                prop_assert_eq!(f.check(), Ok(()));
                let _ = r.push(f);
            }
        }
        prop_assert!(r.reserved() <= 1024 * Priority::COUNT);
    }

    /// Fragments with arbitrary fields, in any order: the reassembler
    /// returns messages or typed errors, never panics, and never holds
    /// more than its limit per class.
    #[test]
    fn arbitrary_fragments_never_panic_the_reassembler(
        frags in proptest::collection::vec(any_fragment(), 0..48),
    ) {
        let mut r = Reassembler::new(200);
        for f in frags {
            let checked = f.check();
            match r.push(f) {
                Ok(Some((m, _))) => prop_assert!(m.payload_len() <= 200),
                Ok(None) => {}
                Err(e) => {
                    if let Err(c) = checked {
                        prop_assert_eq!(e, c.into());
                    }
                }
            }
            prop_assert!(r.reserved() <= 200 * Priority::COUNT);
        }
    }

    /// Every strict prefix of a fragment frame asks for more, consuming
    /// nothing; the rest completes it and it decodes as written.
    #[test]
    fn a_cut_fragment_frame_asks_for_more(
        mut m in message(),
        max_fragment in 1usize..512,
        which in any::<prop::sample::Index>(),
        cut in any::<prop::sample::Index>(),
    ) {
        m.seq = 1;
        let frags: Vec<Fragment> = Fragmenter::new(m, 0, max_fragment).expect("valid").collect();
        let f = which.get(&frags).clone();
        let enc = f.clone().into_frame().encode_to_vec().expect("a small frame");
        let cut = cut.index(enc.len());
        let mut dec = FrameDecoder::new(FrameLimits::default());
        let mut buf = BytesMut::from(&enc[..cut]);
        prop_assert_eq!(dec.decode(&mut buf), Ok(None));
        prop_assert_eq!(buf.len(), cut, "bytes consumed while asking for more");
        prop_assert!(dec.needed() > cut);
        buf.extend_from_slice(&enc[cut..]);
        let frame = dec.decode(&mut buf).expect("whole").expect("a frame");
        prop_assert_eq!(Fragment::from_frame(frame), Ok(f));
    }

    /// A flipped bit anywhere in a fragment frame is caught by the frame
    /// layer's CRCs (or the preamble's checks), never read as another
    /// fragment.
    #[test]
    fn a_flipped_bit_in_a_fragment_frame_is_detected(
        mut m in message(),
        pos in any::<prop::sample::Index>(),
        bit in 0u8..8,
    ) {
        m.seq = 3;
        let f = Fragmenter::new(m, 0, 256).expect("valid").next().expect("one at least");
        let mut enc = f.clone().into_frame().encode_to_vec().expect("a small frame");
        let at = pos.index(enc.len());
        enc[at] ^= 1 << bit;
        let back = Frame::decode_exact(Bytes::from(enc), &FrameLimits::default());
        if let Ok(frame) = back {
            prop_assert_ne!(Fragment::from_frame(frame), Ok(f));
        }
    }
}

/// A message with no payload is one empty fragment, first and last; its
/// front cannot claim a byte.
#[test]
fn an_empty_message_is_one_fragment_first_and_last() {
    let mut m = Message::default();
    m.seq = 1;
    let f = Fragmenter::new(m, 0, 64)
        .expect("valid")
        .next()
        .expect("one");
    assert_eq!(f.total, 0);
    assert!(f.is_first() && f.is_last());
    let mut bad = f.clone();
    bad.front_len = 1;
    assert!(matches!(bad.check(), Err(FragmentError::Lengths { .. })));
}
