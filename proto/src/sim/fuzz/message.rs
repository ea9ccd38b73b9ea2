//! The `message_decode` and `batch_decode` targets: message frames,
//! control payloads and batch bodies from arbitrary bytes.

use bytes::{Bytes, BytesMut};
use msgr_addr::{EntityAddr, EntityName};
use serde::{Deserialize, Serialize};

use crate::batch::{BatchReader, BatchWriter};
use crate::codec::{Codec, Postcard};
use crate::control::{Ack, Close, HelloOk, Keepalive, ReconnectOk};
use crate::frame::{Frame, FrameLimits, Tag, MAX_SEGMENTS};
use crate::message::{Message, MessageFrame};
use crate::session::Hello;
use crate::stream::{Inbound, Transmit};

use super::frame::message_of;
use super::Reader;

/// The typed payload `message_decode` decodes with postcard.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SamplePayload {
    /// An integer.
    pub id: u32,
    /// A string.
    pub name: String,
    /// A sequence.
    pub tags: Vec<u16>,
    /// An option.
    pub offset: Option<i64>,
    /// An enum.
    pub kind: SampleKind,
    /// Raw bytes.
    pub blob: Vec<u8>,
    /// An address (its serde form is its string syntax).
    pub addr: Option<EntityAddr>,
}

/// An enum inside [`SamplePayload`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum SampleKind {
    /// Unit variant.
    Ping,
    /// Tuple variant.
    Data(u64),
    /// Struct variant.
    Named {
        /// A name.
        name: EntityName,
        /// A flag.
        flag: bool,
    },
}

/// Builds a frame from structured input: tag byte, segment count, then each
/// segment as a u16 length + bytes.
pub(super) fn read_frame(r: &mut Reader<'_>) -> Frame {
    let tag = Tag::from_u8(r.u8() % 14).unwrap_or(Tag::Message);
    let flags = r.u8();
    let count = usize::from(r.u8()) % (MAX_SEGMENTS + 1);
    let mut segments = crate::frame::Segments::new();
    for _ in 0..count {
        let len = usize::from(r.u16() % 2048);
        segments.push(Bytes::copy_from_slice(r.bytes(len)));
    }
    let mut frame = Frame::new(tag, segments);
    frame.flags = flags;
    frame
}

pub(super) fn write_frame(f: &Frame, out: &mut Vec<u8>) {
    out.push(f.tag as u8);
    out.push(f.flags);
    out.push(f.segments.len() as u8);
    for s in &f.segments {
        out.extend_from_slice(&(s.len() as u16).to_le_bytes());
        out.extend_from_slice(s);
    }
}

/// `message_decode`: [`Message::from_frame`] and the typed decode of a
/// [`SamplePayload`] from a frame built from the input (so CRCs never stand
/// in the way). Round trips must hold: frame bytes, message fields, payload.
pub fn message_decode(data: &[u8]) {
    let mut r = Reader::new(data);
    let frame = read_frame(&mut r);
    // The frame itself round-trips through the wire encoding.
    let enc = Bytes::from(frame.encode_to_vec().expect("small frame encodes"));
    let back = Frame::decode_exact(enc.clone(), &FrameLimits::default());
    assert_eq!(back.as_ref(), Ok(&frame));
    // Decoded straight as a message, the same bytes give the same verdict.
    let direct = message_of(Inbound::decode_exact(enc, &FrameLimits::default()));
    let flags = frame.flags;
    let via_frame = Message::from_frame(frame);
    assert_eq!(
        direct,
        via_frame.clone().ok(),
        "the two message decoders disagree"
    );
    if let Ok((msg, ack)) = via_frame {
        let again = Message::from_frame(msg.to_frame(ack)).expect("re-encoded message decodes");
        assert_eq!(again, (msg.clone(), ack));
        // Written straight from the message, it is the same frame.
        let straight = MessageFrame {
            msg: msg.clone(),
            ack,
            flags,
        };
        let mut as_frame = msg.to_frame(ack);
        as_frame.flags = flags;
        assert_eq!(
            Transmit::Message(straight).encode_to_vec(),
            as_frame.encode_to_vec(),
            "a message's two encoders disagree"
        );
        if let Ok(p) = msg.decode::<SamplePayload>() {
            let m2 = Message::encode(msg.msg_type, &p).expect("payload encodes");
            assert_eq!(m2.decode::<SamplePayload>().as_ref(), Ok(&p));
        }
    }
    // The rest of the input as a bare postcard payload.
    let rest = r.rest();
    if let Ok(p) = Postcard.decode::<SamplePayload>(rest) {
        let bytes = Postcard.encode(&p).expect("payload encodes");
        assert_eq!(Postcard.decode::<SamplePayload>(&bytes).as_ref(), Ok(&p));
    }
    for what in [0u8, 1, 2, 3, 4, 5] {
        control_payload(what, rest);
    }
}

/// Parses `bytes` as one of the control payloads; a parsed one must round-trip.
fn control_payload(what: u8, bytes: &[u8]) {
    fn rt<T: Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug>(b: &[u8]) {
        if let Ok(v) = Postcard.decode::<T>(b) {
            let e = Postcard.encode(&v).expect("control payload encodes");
            assert_eq!(Postcard.decode::<T>(&e).as_ref(), Ok(&v));
        }
    }
    match what {
        0 => rt::<Hello>(bytes),
        1 => rt::<HelloOk>(bytes),
        2 => rt::<ReconnectOk>(bytes),
        3 => rt::<Ack>(bytes),
        4 => rt::<Keepalive>(bytes),
        _ => rt::<Close>(bytes),
    }
}

/// `batch_decode`: batch frame bodies ([`crate::batch`]). Mode bit 0
/// clear: the rest of the input is a body; reading it never panics, and
/// a body that reads whole writes back to the same bytes (one encoding
/// per batch: varints are minimal, reserved bits zero). Set: messages
/// built from the input are written with a bound from the input, and
/// read back equal, with consecutive sequence numbers.
pub fn batch_decode(data: &[u8]) {
    let mut r = Reader::new(data);
    if r.u8() & 1 == 0 {
        let body = Bytes::copy_from_slice(r.rest());
        let Ok(reader) = BatchReader::new(body.clone()) else {
            return;
        };
        let (base, ack) = (reader.base_seq(), reader.ack());
        let Ok(msgs) = reader.collect::<Result<Vec<_>, _>>() else {
            return;
        };
        assert!(!msgs.is_empty(), "a batch that reads has entries");
        let mut buf = BytesMut::new();
        let mut w = BatchWriter::begin(&mut buf, base, ack, body.len());
        for (i, m) in msgs.iter().enumerate() {
            assert_eq!(m.seq, base + i as u64, "entry seqs follow the base");
            assert!(w.push(m), "a read entry fits where it was read from");
        }
        assert_eq!(w.finish(), body, "a batch reads and writes back the same");
        return;
    }
    let base = r.u64().clamp(1, u64::MAX / 2);
    let ack = r.u64();
    let max = usize::from(r.u16()).max(crate::batch::BATCH_HEADER_LEN);
    let mut buf = BytesMut::new();
    let mut w = BatchWriter::begin(&mut buf, base, ack, max);
    let mut sent = Vec::new();
    while !r.is_empty() && sent.len() < 256 {
        let mut m = Message::new(r.u16(), r.short_bytes().to_vec(), r.short_bytes().to_vec());
        m.priority = r.u8();
        m.flags = r.u8();
        if !w.push(&m) {
            break;
        }
        m.seq = base + sent.len() as u64;
        sent.push(m);
    }
    if sent.is_empty() {
        return;
    }
    let body = w.finish();
    assert!(body.len() <= max, "a batch stays within its bound");
    let back: Vec<Message> = BatchReader::new(body)
        .expect("a written batch has a good header")
        .collect::<Result<_, _>>()
        .expect("a written batch reads back");
    assert_eq!(back, sent);
}
