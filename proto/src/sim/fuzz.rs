//! The bodies of the cargo-fuzz targets in `fuzz/`, as plain functions.
//!
//! Each target is `fn(&[u8])` and panics only when it finds a bug (a decoder
//! panicking, a round trip that does not hold, an engine invariant broken).
//! Keeping them here, not in the fuzz crate, lets a normal `cargo test`
//! replay every committed corpus and regression input without a fuzzer
//! (`tests/fuzz_corpus_replay.rs`). [`seed_corpus`] writes the seeds.
//!
//! Inputs of the structure-aware targets (`session_engine`, `message_decode`,
//! `frame_decode` in its structured modes) are read with a tiny [`Reader`]:
//! every byte string is a valid input, short inputs read as zeros.

use std::str::FromStr;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use msgr_addr::{AddrVec, EntityAddr, EntityName};
use serde::{Deserialize, Serialize};

use crate::banner::{Banner, BANNER_LEN};
use crate::batch::{BatchReader, BatchWriter};
use crate::codec::{Codec, Postcard};
use crate::control::{
    control_frame, with_dial_number, with_limits, Ack, Close, HelloOk, Keepalive, Limits,
    ReconnectOk,
};
use crate::error::FrameError;
use crate::frame::{Frame, FrameDecoder, FrameLimits, Preamble, Tag, MAX_SEGMENTS, PREAMBLE_LEN};
use crate::link_failure::LinkFailure;
use crate::message::{Message, MessageFrame};
use crate::session::{
    Hello, LinkId, LocalIdentity, Policy, Session, SessionConfig, SessionEvent, Takeover,
};
use crate::stream::{Inbound, StreamDecoder, Transmit};

/// Names of all targets, as in `fuzz/Cargo.toml` and `fuzz/corpus/<name>/`.
pub const TARGETS: &[&str] = &[
    "frame_preamble",
    "frame_decode",
    "banner",
    "session_engine",
    "message_decode",
    "addr_parse",
    "batch_decode",
    "auth_handshake",
    "sealed_decode",
    "rma_decode",
];

/// Runs the target called `name` on `data`. Returns false for an unknown name.
pub fn run(name: &str, data: &[u8]) -> bool {
    match name {
        "frame_preamble" => frame_preamble(data),
        "frame_decode" => frame_decode(data),
        "banner" => banner(data),
        "session_engine" => session_engine(data),
        "message_decode" => message_decode(data),
        "addr_parse" => addr_parse(data),
        "batch_decode" => batch_decode(data),
        "auth_handshake" => auth_handshake(data),
        "sealed_decode" => sealed_decode(data),
        "rma_decode" => rma_decode(data),
        _ => return false,
    }
    true
}

/// Reads fuzz input; past the end it yields zeros, so every input is valid.
#[derive(Debug)]
pub struct Reader<'a> {
    data: &'a [u8],
}

impl<'a> Reader<'a> {
    /// Reads `data` from the start.
    pub fn new(data: &'a [u8]) -> Self {
        Reader { data }
    }

    /// Whether all input was read.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// One byte (0 past the end).
    pub fn u8(&mut self) -> u8 {
        match self.data.split_first() {
            Some((b, rest)) => {
                self.data = rest;
                *b
            }
            None => 0,
        }
    }

    /// A little-endian u16.
    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    /// A little-endian u32.
    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }

    /// A little-endian u64.
    pub fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | (u64::from(self.u32()) << 32)
    }

    /// Up to `n` bytes (fewer at the end of input).
    pub fn bytes(&mut self, n: usize) -> &'a [u8] {
        let n = n.min(self.data.len());
        let (head, rest) = self.data.split_at(n);
        self.data = rest;
        head
    }

    /// A length-prefixed byte string (one length byte).
    pub fn short_bytes(&mut self) -> &'a [u8] {
        let n = usize::from(self.u8());
        self.bytes(n)
    }

    /// Everything left.
    pub fn rest(&mut self) -> &'a [u8] {
        self.bytes(self.data.len())
    }
}

// ---- auth_handshake --------------------------------------------------------

/// Fixed credentials for the fuzz targets: `client.1` and `server.1` with
/// keys from fixed bytes, both in one keyring (the fuzzer needs no RNG for
/// them; snow's ephemeral keys still come from its own).
pub fn fuzz_credentials() -> (crate::auth::Credentials, crate::auth::Credentials) {
    use crate::auth::{Credentials, Keyring, StaticKeypair};
    let (c, s) = (
        StaticKeypair::from_private([0x11; 32]),
        StaticKeypair::from_private([0x22; 32]),
    );
    let mut ring = Keyring::new();
    ring.insert(EntityName::client(1), c.public());
    ring.insert(EntityName::server(1), s.public());
    let ring = std::sync::Arc::new(ring);
    (
        Credentials::new(EntityName::client(1), c, ring.clone()),
        Credentials::new(EntityName::server(1), s, ring),
    )
}

/// `auth_handshake`: the Noise handshake fed hostile messages.
///
/// Input: mode byte, then message bytes (u16-length-prefixed pieces).
/// Mode 0: a responder reads the first piece as the first message, answers,
/// reads the second as the third. Mode 1: an initiator writes the first
/// message and reads the first piece as the answer. Mode 2: an honest
/// handshake whose messages get the input XORed in: it may only succeed
/// when nothing was changed, and then both sides must agree on who is who
/// and on the keys. Never a panic; an error is always typed.
pub fn auth_handshake(data: &[u8]) {
    use crate::auth::{Handshake, Role};
    let mut r = Reader::new(data);
    let (client, server) = fuzz_credentials();
    let banner = Banner::default().encode();
    let piece = |r: &mut Reader| {
        let n = usize::from(r.u16());
        r.bytes(n).to_vec()
    };
    match r.u8() % 3 {
        0 => {
            let mut hs = Handshake::new(Role::Responder, &server, &banner, &banner)
                .expect("handshake starts");
            if hs.read_message(&piece(&mut r)).is_err() {
                return;
            }
            let _ = hs
                .write_message()
                .expect("our turn after the first message");
            if hs.read_message(&piece(&mut r)).is_ok() {
                // Only a peer holding client.1's key gets this far.
                let done = hs.finish().expect("finished after three messages");
                assert_eq!(done.peer_name, EntityName::client(1));
            }
        }
        1 => {
            let mut hs = Handshake::new(Role::Initiator, &client, &banner, &banner)
                .expect("handshake starts");
            let _ = hs.write_message().expect("the initiator writes first");
            if hs.read_message(&piece(&mut r)).is_ok() {
                assert!(hs.is_my_turn());
            }
        }
        _ => {
            let mut i = Handshake::new(Role::Initiator, &client, &banner, &banner)
                .expect("handshake starts");
            let mut s = Handshake::new(Role::Responder, &server, &banner, &banner)
                .expect("handshake starts");
            let mut changed = false;
            let mut mangle = |m: Vec<u8>, r: &mut Reader| {
                let x = piece(r);
                let mut m = m;
                for (b, k) in m.iter_mut().zip(&x) {
                    changed |= *k != 0;
                    *b ^= k;
                }
                m
            };
            let m1 = mangle(i.write_message().expect("first"), &mut r);
            if s.read_message(&m1).is_err() {
                return;
            }
            let m2 = mangle(s.write_message().expect("second"), &mut r);
            if i.read_message(&m2).is_err() {
                return;
            }
            let m3 = mangle(i.write_message().expect("third"), &mut r);
            let ok = s.read_message(&m3).is_ok();
            if !ok {
                return;
            }
            // Noise authenticates everything but the first message's
            // ephemeral key: a changed one can only fail later.
            let (a, b) = (i.finish().expect("done"), s.finish().expect("done"));
            assert_eq!(a.peer_name, EntityName::server(1));
            assert_eq!(b.peer_name, EntityName::client(1));
            let (mut ra, mut rb) = (
                crate::auth::RecordLayer::new(&a.keys),
                crate::auth::RecordLayer::new(&b.keys),
            );
            let probe = Transmit::Frame(Frame::single(Tag::Ack, Bytes::from_static(b"x")));
            let opened = rb.open(ra.seal(probe), &FrameLimits::default());
            assert!(
                opened.is_ok() || changed,
                "an untouched handshake gives both ends the same keys"
            );
        }
    }
}

// ---- sealed_decode ---------------------------------------------------------

/// `sealed_decode`: the secure mode's record layer opening hostile frames.
///
/// Input: mode byte, then data. Mode 0: a frame built from the input
/// (tag, flags, up to four segments) is opened: never a panic, and what
/// opens is a frame within the limits. Mode 1: a message built from the
/// input is sealed, then bytes of the sealed segments are XORed with the
/// input's rest: it opens only when nothing changed, and then to the
/// message itself.
pub fn sealed_decode(data: &[u8]) {
    use crate::auth::handshake::LinkKeys;
    use crate::auth::RecordLayer;
    let mut r = Reader::new(data);
    let keys = LinkKeys::from_secrets([3; 32], [4; 32]);
    let mut tx = RecordLayer::new(&keys);
    let mut rx = RecordLayer::new(&keys.mirrored());
    let limits = fuzz_limits();
    if r.u8() & 1 == 0 {
        let tag = Tag::from_u8(r.u8()).unwrap_or(Tag::Sealed);
        let flags = r.u8();
        let n = usize::from(r.u8()) % (MAX_SEGMENTS + 1);
        let segments: Vec<Bytes> = (0..n)
            .map(|_| Bytes::copy_from_slice(r.short_bytes()))
            .collect();
        let mut f = Frame::new(tag, segments);
        f.flags = flags;
        if let Ok(Inbound::Frame(inner)) = rx.open(f, &limits) {
            assert!(inner.tag != Tag::Sealed && inner.tag != Tag::Auth);
            for (i, seg) in inner.segments.iter().enumerate() {
                assert!(seg.len() <= limits.max_segment[i] as usize);
            }
        }
        return;
    }
    let mut m = Message::new(r.u16(), r.short_bytes().to_vec(), r.short_bytes().to_vec());
    m.seq = 1;
    let want = Transmit::Message(MessageFrame::new(m, 0))
        .into_frame()
        .expect("a frame");
    let mut sealed = tx.seal(Transmit::Frame(want.clone()));
    let mut changed = false;
    for seg in sealed.segments.iter_mut() {
        let mut b = seg.to_vec();
        for byte in b.iter_mut() {
            let k = r.u8();
            changed |= k != 0;
            *byte ^= k;
        }
        *seg = Bytes::from(b);
    }
    match rx.open(sealed, &FrameLimits::default()) {
        Ok(Inbound::Frame(got)) => {
            assert!(!changed, "a changed sealed frame opened");
            assert_eq!(
                (got.tag, got.flags, &got.segments),
                (want.tag, want.flags, &want.segments)
            );
        }
        Ok(other) => panic!("opened to {other:?}"),
        Err(_) => assert!(changed, "an untouched sealed frame failed to open"),
    }
}

// ---- frame_preamble --------------------------------------------------------

/// `frame_preamble`: [`Preamble::decode`] on 32 arbitrary bytes.
///
/// Input: mode byte, 32 preamble bytes, 4 x u32 segment limits + u64 frame
/// limit (zeros mean the defaults). Odd modes fix up the preamble CRC first so
/// the fuzzer reaches the checks behind it. A decoded preamble must re-encode
/// to the same bytes and respect the limits.
pub fn frame_preamble(data: &[u8]) {
    let mut r = Reader::new(data);
    let mode = r.u8();
    let mut raw = [0u8; PREAMBLE_LEN];
    raw.copy_from_slice(&pad::<PREAMBLE_LEN>(r.bytes(PREAMBLE_LEN)));
    if mode & 1 == 1 {
        let crc = crc32c::crc32c(&raw[..28]);
        raw[28..].copy_from_slice(&crc.to_le_bytes());
    }
    let mut limits = FrameLimits::default();
    for m in limits.max_segment.iter_mut() {
        let v = r.u32();
        if v != 0 {
            *m = v;
        }
    }
    let mf = r.u64();
    if mf != 0 {
        limits.max_frame = mf;
    }
    if let Ok(p) = Preamble::decode(&raw, &limits) {
        assert_eq!(p.encode(), raw, "preamble does not re-encode to its bytes");
        // A sealed frame may exceed the limits by its sealing overhead
        // (its inner frame is held to them once opened).
        let overhead = |i: usize| {
            if p.tag == Tag::Sealed {
                crate::frame::SEAL_OVERHEAD[i]
            } else {
                0
            }
        };
        let frame_overhead: u64 = (0..MAX_SEGMENTS).map(|i| u64::from(overhead(i))).sum();
        assert!(p.frame_len() <= limits.max_frame.saturating_add(frame_overhead));
        assert!(usize::from(p.segment_count) <= MAX_SEGMENTS);
        for (i, &l) in p.segment_lens.iter().enumerate() {
            assert!(l <= limits.max_segment[i].saturating_add(overhead(i)));
            assert!(i < usize::from(p.segment_count) || l == 0);
        }
    }
}

fn pad<const N: usize>(b: &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    out[..b.len()].copy_from_slice(b);
    out
}

// ---- frame_decode ----------------------------------------------------------

/// Small limits so hostile lengths are exercised without big allocations.
fn fuzz_limits() -> FrameLimits {
    FrameLimits {
        max_segment: [4096, 65536, 65536, 4096],
        max_frame: 1 << 17,
    }
}

/// `frame_decode`: the stream decoder over arbitrary bytes, fed in chunks.
///
/// Input: mode byte, chunking seed byte, then the stream. Mode bit 0: the
/// stream starts with a banner ([`StreamDecoder`]) instead of a frame
/// ([`FrameDecoder`]). Mode bit 1: fix up every CRC along the stream as the
/// preambles describe it, so the decoder's later checks are reached. Every
/// decoded frame must re-encode to exactly the bytes it was decoded from; a
/// stream that is not finished must leave fewer bytes than the decoder needs.
pub fn frame_decode(data: &[u8]) {
    let mut r = Reader::new(data);
    let mode = r.u8();
    let mut chunk_seed = r.u8();
    let mut stream = r.rest().to_vec();
    let with_banner = mode & 1 == 1;
    if mode & 2 == 2 {
        fix_crcs(&mut stream, if with_banner { BANNER_LEN } else { 0 });
    }
    let limits = fuzz_limits();
    let mut sdec = StreamDecoder::new(limits);
    let mut fdec = FrameDecoder::new(limits);
    let mut buf = BytesMut::new();
    let mut consumed = 0usize; // bytes of `stream` taken off `buf` so far
    let mut fed = 0usize;
    'feed: while fed < stream.len() {
        chunk_seed = chunk_seed.wrapping_mul(31).wrapping_add(7);
        let n = (usize::from(chunk_seed % 64) + 1).min(stream.len() - fed);
        buf.extend_from_slice(&stream[fed..fed + n]);
        fed += n;
        loop {
            let before = buf.len();
            let res = if with_banner {
                sdec.decode(&mut buf)
            } else {
                fdec.decode(&mut buf).map(|f| f.map(Inbound::Frame))
            };
            match res {
                Ok(Some(unit)) => {
                    let used = before - buf.len();
                    let original = &stream[consumed..consumed + used];
                    match unit {
                        Inbound::Banner(b) => assert_eq!(&b[..], original),
                        Inbound::Frame(f) => {
                            let enc = f.encode_to_vec().expect("decoded frame re-encodes");
                            assert_eq!(enc, original, "frame re-encodes to other bytes");
                            // Message transports decode the same bytes the same way.
                            let exact =
                                Frame::decode_exact(Bytes::copy_from_slice(original), &limits);
                            assert_eq!(exact.as_ref(), Ok(&f));
                            let direct = message_of(Inbound::decode_exact(
                                Bytes::copy_from_slice(original),
                                &limits,
                            ));
                            assert_eq!(
                                direct,
                                Message::from_frame(f).ok(),
                                "a message decodes alike with and without a Frame"
                            );
                        }
                        Inbound::Message(m) => {
                            let enc = Transmit::Message(m.clone())
                                .encode_to_vec()
                                .expect("decoded message re-encodes");
                            assert_eq!(enc, original, "message re-encodes to other bytes");
                            let exact =
                                Inbound::decode_exact(Bytes::copy_from_slice(original), &limits);
                            assert_eq!(exact.as_ref(), Ok(&Inbound::Message(m.clone())));
                            let via_frame =
                                Frame::decode_exact(Bytes::copy_from_slice(original), &limits)
                                    .ok()
                                    .and_then(|f| Message::from_frame(f).ok());
                            assert_eq!(via_frame, Some((m.msg, m.ack)), "the Frame path disagrees");
                        }
                    }
                    consumed += used;
                }
                Ok(None) => {
                    let needed = if with_banner {
                        sdec.needed()
                    } else {
                        fdec.needed()
                    };
                    assert!(buf.len() < needed, "decoder asks for more but has enough");
                    assert_eq!(before, buf.len(), "Ok(None) consumed bytes");
                    break;
                }
                Err(_) => break 'feed,
            }
        }
    }
    // Whatever is whole, decode_exact must agree on it not panicking either.
    let _ = Inbound::decode_exact(Bytes::copy_from_slice(&stream), &limits);
    let _ = Frame::decode_exact(Bytes::from(stream), &limits);
}

/// The message and ack of a unit decoded as a message, if it was one.
fn message_of(unit: Result<Inbound, FrameError>) -> Option<(Message, u64)> {
    match unit {
        Ok(Inbound::Message(m)) => Some((m.msg, m.ack)),
        _ => None,
    }
}

/// Rewrites the CRCs of the frames laid out in `stream` from `start` on.
fn fix_crcs(stream: &mut [u8], start: usize) {
    let mut pos = start;
    if pos > 0 && stream.len() >= BANNER_LEN {
        let crc = crc32c::crc32c(&stream[..28]);
        stream[28..32].copy_from_slice(&crc.to_le_bytes());
    }
    while stream.len() >= pos + PREAMBLE_LEN {
        let pre = &mut stream[pos..pos + PREAMBLE_LEN];
        let crc = crc32c::crc32c(&pre[..28]);
        pre[28..].copy_from_slice(&crc.to_le_bytes());
        let count = usize::from(pre[2]).min(MAX_SEGMENTS);
        let mut lens = [0usize; MAX_SEGMENTS];
        for (i, l) in lens.iter_mut().enumerate().take(count) {
            *l = u32::from_le_bytes([
                pre[4 + 4 * i],
                pre[5 + 4 * i],
                pre[6 + 4 * i],
                pre[7 + 4 * i],
            ]) as usize;
        }
        let body: usize = lens.iter().sum::<usize>() + 4 * count;
        let Some(end) = (pos + PREAMBLE_LEN).checked_add(body) else {
            return;
        };
        if end > stream.len() {
            return;
        }
        let mut seg = pos + PREAMBLE_LEN;
        let mut epi = seg + lens.iter().sum::<usize>();
        for l in &lens[..count] {
            let crc = crc32c::crc32c(&stream[seg..seg + l]);
            stream[epi..epi + 4].copy_from_slice(&crc.to_le_bytes());
            seg += l;
            epi += 4;
        }
        pos = end;
    }
}

// ---- banner ----------------------------------------------------------------

/// `banner`: [`Banner::decode`] and [`Banner::negotiate`] on arbitrary bytes.
///
/// Input: mode byte, 32 banner bytes. Mode bit 0 writes the magic, bit 1 fixes
/// the CRC. A decoded banner must survive encode→decode; negotiation must be
/// consistent with the feature bits.
pub fn banner(data: &[u8]) {
    let mut r = Reader::new(data);
    let mode = r.u8();
    let mut raw = pad::<BANNER_LEN>(r.bytes(BANNER_LEN));
    if mode & 1 == 1 {
        raw[..8].copy_from_slice(&crate::banner::MAGIC);
    }
    if mode & 2 == 2 {
        let crc = crc32c::crc32c(&raw[..28]);
        raw[28..].copy_from_slice(&crc.to_le_bytes());
    }
    let Ok(b) = Banner::decode(&raw) else {
        return;
    };
    assert_eq!(Banner::decode(&b.encode()), Ok(b));
    let ours = Banner::default();
    if let Ok(f) = ours.negotiate(&b) {
        assert_eq!(f, ours.supported & b.supported);
        assert_eq!(b.required & !ours.supported, 0);
        assert_eq!(ours.required & !b.supported, 0);
        assert_eq!(b.version, ours.version);
    }
    let _ = b.negotiate(&ours);
}

// ---- message_decode ---------------------------------------------------------

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
fn read_frame(r: &mut Reader<'_>) -> Frame {
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

fn write_frame(f: &Frame, out: &mut Vec<u8>) {
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

// ---- batch_decode ----------------------------------------------------------

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

// ---- addr_parse ------------------------------------------------------------

/// `addr_parse`: the string parsers of `msgr-addr` and the serde (postcard)
/// form of an address. Whatever parses must print back to a string that
/// parses to the same value.
pub fn addr_parse(data: &[u8]) {
    if let Ok(s) = std::str::from_utf8(data) {
        if let Ok(a) = EntityAddr::from_str(s) {
            assert_eq!(
                a.to_string().parse::<EntityAddr>().as_ref(),
                Ok(&a),
                "{s:?}"
            );
            assert!(a.validate().is_ok());
        }
        if let Ok(v) = AddrVec::from_str(s) {
            assert_eq!(v.to_string().parse::<AddrVec>().as_ref(), Ok(&v), "{s:?}");
        }
        if let Ok(n) = EntityName::from_str(s) {
            assert_eq!(
                n.to_string().parse::<EntityName>().as_ref(),
                Ok(&n),
                "{s:?}"
            );
        }
    }
    if let Ok(a) = Postcard.decode::<EntityAddr>(data) {
        let e = Postcard.encode(&a).expect("address encodes");
        assert_eq!(Postcard.decode::<EntityAddr>(&e).as_ref(), Ok(&a));
    }
}

// ---- session_engine --------------------------------------------------------

/// One step of the `session_engine` target. [`Op::read`] decodes any bytes;
/// [`Op::write`] is its inverse, used to build seeds.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// `link_up` (link 0..=3).
    LinkUp(u8),
    /// `link_failed`.
    LinkFailed(u8),
    /// The peer's valid banner arrives on a link.
    GoodBanner(u8),
    /// 32 raw bytes arrive as a banner.
    RawBanner(u8, [u8; BANNER_LEN]),
    /// A control frame with a valid payload built from the fields.
    Control {
        /// Link.
        link: u8,
        /// Which control payload (see [`Op::read`]).
        kind: u8,
        /// Cookie / seq / stamp.
        a: u64,
        /// Second number (in_seq).
        b: u64,
        /// Which address / name / policy variant.
        who: u8,
    },
    /// A message frame.
    Msg {
        /// Link.
        link: u8,
        /// Sequence number.
        seq: u64,
        /// Piggybacked ack.
        ack: u64,
        /// Front length.
        len: u8,
    },
    /// An arbitrary frame.
    RawFrame(u8, Frame),
    /// Raw bytes through a per-link stream decoder.
    Stream(u8, Vec<u8>),
    /// Advance the clock by this many milliseconds and fire timers.
    Advance(u16),
    /// Application send of a message with this many front bytes.
    Send(u8),
    /// Graceful close.
    Close,
    /// Mark down.
    MarkDown,
    /// Route the identified hello into this session with `take_link`.
    TakeLink {
        /// Link.
        link: u8,
        /// Cookie in the hello.
        cookie: u64,
        /// in_seq in the hello.
        in_seq: u64,
        /// Address variant.
        who: u8,
    },
    /// Accept a new session with this cookie.
    AcceptNew(u64),
    /// A decode error on a link.
    DecodeError(u8),
    /// Pause/resume the receive-silence check.
    RxPaused(bool),
    /// Take up to this many units from `poll_transmit` (0: all), as a
    /// transport that can write only so much at a time.
    Drain(u8),
}

impl Op {
    /// Decodes one op.
    pub fn read(r: &mut Reader<'_>) -> Op {
        let code = r.u8();
        let x = r.u8();
        let link = x % 4;
        match code % 17 {
            0 => Op::LinkUp(link),
            1 => Op::LinkFailed(link),
            2 => Op::GoodBanner(link),
            3 => Op::RawBanner(link, pad::<BANNER_LEN>(r.bytes(BANNER_LEN))),
            4 => Op::Control {
                link,
                kind: r.u8(),
                a: small(r.u64()),
                b: small(r.u64()),
                who: r.u8(),
            },
            5 => Op::Msg {
                link,
                seq: small(r.u64()),
                ack: small(r.u64()),
                len: r.u8(),
            },
            6 => Op::RawFrame(link, read_frame(r)),
            7 => Op::Stream(link, r.short_bytes().to_vec()),
            8 => Op::Advance(r.u16()),
            9 => Op::Send(x),
            10 => Op::Close,
            11 => Op::MarkDown,
            12 => Op::TakeLink {
                link,
                cookie: small(r.u64()),
                in_seq: small(r.u64()),
                who: r.u8(),
            },
            13 => Op::AcceptNew(small(r.u64())),
            14 => Op::DecodeError(link),
            15 => Op::RxPaused(link & 1 == 1),
            _ => Op::Drain(x),
        }
    }

    /// Encodes the op so that [`Op::read`] returns it again.
    pub fn write(&self, out: &mut Vec<u8>) {
        let big = |v: u64| v.to_le_bytes();
        match self {
            Op::LinkUp(l) => out.extend([0, *l]),
            Op::LinkFailed(l) => out.extend([1, *l]),
            Op::GoodBanner(l) => out.extend([2, *l]),
            Op::RawBanner(l, b) => {
                out.extend([3, *l]);
                out.extend_from_slice(b);
            }
            Op::Control {
                link,
                kind,
                a,
                b,
                who,
            } => {
                out.extend([4, *link, *kind]);
                out.extend(big(*a));
                out.extend(big(*b));
                out.push(*who);
            }
            Op::Msg {
                link,
                seq,
                ack,
                len,
            } => {
                out.extend([5, *link]);
                out.extend(big(*seq));
                out.extend(big(*ack));
                out.push(*len);
            }
            Op::RawFrame(l, f) => {
                out.extend([6, *l]);
                write_frame(f, out);
            }
            Op::Stream(l, b) => {
                out.extend([7, *l, b.len().min(255) as u8]);
                out.extend_from_slice(&b[..b.len().min(255)]);
            }
            Op::Advance(ms) => {
                out.extend([8, 0]);
                out.extend(ms.to_le_bytes());
            }
            Op::Send(n) => out.extend([9, *n]),
            Op::Close => out.extend([10, 0]),
            Op::MarkDown => out.extend([11, 0]),
            Op::TakeLink {
                link,
                cookie,
                in_seq,
                who,
            } => {
                out.extend([12, *link]);
                out.extend(big(*cookie));
                out.extend(big(*in_seq));
                out.push(*who);
            }
            Op::AcceptNew(c) => {
                out.extend([13, 0]);
                out.extend(big(*c));
            }
            Op::DecodeError(l) => out.extend([14, *l]),
            Op::RxPaused(p) => out.extend([15, u8::from(*p)]),
            Op::Drain(n) => out.extend([16, *n]),
        }
    }
}

/// Keeps most numbers small (so sequence numbers and cookies hit the
/// interesting comparisons) while still allowing any u64.
fn small(v: u64) -> u64 {
    if v >> 63 == 1 {
        v
    } else {
        v % 32
    }
}

/// Identities the `session_engine` target plays with.
fn fuzz_addr(who: u8) -> EntityAddr {
    let port = if who & 4 == 0 { 6800 } else { 0 };
    let ip = if who & 8 == 0 {
        [10, 0, 0, 2]
    } else {
        [10, 0, 0, 1]
    };
    EntityAddr::tcp((ip, port).into()).with_nonce(u64::from(who & 3))
}

fn fuzz_policy(who: u8) -> Policy {
    match (who >> 4) % 4 {
        0 => Policy::LossyClient,
        1 => Policy::LosslessClient,
        2 => Policy::LosslessPeer,
        _ => Policy::Server,
    }
}

fn fuzz_name(who: u8) -> EntityName {
    EntityName::peer(u64::from(who >> 6))
}

/// `session_engine`: one [`Session`] (connector or acceptor, any policy) fed
/// an arbitrary sequence of [`Op`]s: inbound units on several links, timers,
/// application calls and routing decisions. After every step the engine must
/// keep its invariants: bounded queue, transmits that encode and decode back,
/// messages delivered in order without duplicates, nothing after the end.
///
/// Input: a setup byte (bit 0: acceptor; bits 1-2: connector policy; bit 3:
/// unchecked payloads offered; bit 4: no batch frames sent; bit 5: a
/// connect timeout), then ops.
pub fn session_engine(data: &[u8]) {
    let mut r = Reader::new(data);
    let setup = r.u8();
    let t0 = Instant::now();
    let mut now = t0;
    let cfg = SessionConfig {
        limits: fuzz_limits(),
        keepalive_interval: Duration::from_millis(100),
        keepalive_timeout: Duration::from_millis(500),
        handshake_timeout: Duration::from_millis(300),
        banner_timeout: Duration::from_millis(200),
        backoff_min: Duration::from_millis(5),
        backoff_max: Duration::from_millis(80),
        wait_retry: Duration::from_millis(50),
        server_linger: Duration::from_millis(2000),
        max_queued_messages: 8,
        max_queued_bytes: 2048,
        max_in_flight_messages: 4,
        max_in_flight_bytes: 1024,
        payload_crc: setup & 8 == 0,
        batch_max_bytes: if setup & 16 == 0 { 512 } else { 0 },
        // Bit 5: a connect timeout (the fuzzed clock reaches it).
        connect_timeout: (setup & 32 != 0).then(|| Duration::from_millis(700)),
        security: Default::default(),
    };
    let local = LocalIdentity {
        name: EntityName::peer(9),
        addr: EntityAddr::tcp(([10, 0, 0, 3], 6800).into()).with_nonce(5),
        dials: Default::default(),
    };
    let mut s = if setup & 1 == 1 {
        Session::accept(cfg.clone(), local, LinkId(0), now)
    } else {
        let policy = [
            Policy::LossyClient,
            Policy::LosslessClient,
            Policy::LosslessPeer,
            Policy::LosslessClient,
        ][usize::from((setup >> 1) & 3)];
        Session::connect(cfg.clone(), local, fuzz_addr(setup >> 3), policy, now)
    };
    let mut decoders: Vec<(StreamDecoder, BytesMut)> = (0..4)
        .map(|_| (StreamDecoder::new(cfg.limits), BytesMut::new()))
        .collect();
    let mut check = Invariants::default();
    let mut steps = 0;
    while !r.is_empty() && steps < 512 {
        steps += 1;
        let op = Op::read(&mut r);
        if let Op::Drain(n) = op {
            check.transmit(&mut s, &cfg, now, usize::from(n));
        } else {
            apply(&mut s, &op, &mut now, &mut decoders);
        }
        check.events(&mut s, &cfg);
    }
    // Let every timer run out: the engine must settle (no endless timers
    // that do nothing, no transmits after the end).
    for _ in 0..64 {
        match s.poll_timeout() {
            Some(t) => {
                now = now.max(t);
                s.handle_timeout(now);
                check.transmit(&mut s, &cfg, now, 0);
                check.events(&mut s, &cfg);
            }
            None => break,
        }
    }
}

fn apply(s: &mut Session, op: &Op, now: &mut Instant, decoders: &mut [(StreamDecoder, BytesMut)]) {
    let l = |x: &u8| LinkId(u64::from(*x));
    match op {
        Op::LinkUp(x) => s.link_up(l(x), *now),
        Op::LinkFailed(x) => s.link_failed(l(x), LinkFailure::Reset("fuzz".into()), *now),
        Op::GoodBanner(x) => {
            let _ = s.handle_inbound(l(x), Inbound::Banner(Banner::default().encode()), *now);
        }
        Op::RawBanner(x, b) => {
            let _ = s.handle_inbound(l(x), Inbound::Banner(*b), *now);
        }
        Op::Control {
            link,
            kind,
            a,
            b,
            who,
        } => {
            let f = control(*kind, *a, *b, *who);
            let _ = s.handle_inbound(l(link), Inbound::Frame(f), *now);
        }
        Op::Msg {
            link,
            seq,
            ack,
            len,
        } => {
            let mut m = Message::new(1, vec![*len; usize::from(*len)], Bytes::new());
            m.seq = *seq;
            // Every way a message arrives: decoded straight (what every
            // transport's receive path gives), as a frame (assembled), or
            // (length bit 7) in a batch of up to four from `seq` on.
            let unit = if len & 0x80 != 0 {
                let mut buf = BytesMut::new();
                let mut w = BatchWriter::begin(&mut buf, *seq, *ack, 4096);
                for i in 0..=(len & 3) {
                    w.push(&Message::new(
                        1,
                        vec![i; usize::from(len & 0x1f)],
                        Bytes::new(),
                    ));
                }
                Inbound::Frame(Frame::single(Tag::MessageBatch, w.finish()))
            } else if seq % 2 == 0 {
                Inbound::Message(MessageFrame::new(m, *ack))
            } else {
                Inbound::Frame(m.to_frame(*ack))
            };
            let _ = s.handle_inbound(l(link), unit, *now);
        }
        Op::RawFrame(x, f) => {
            let _ = s.handle_inbound(l(x), Inbound::Frame(f.clone()), *now);
        }
        Op::Stream(x, bytes) => {
            let (dec, buf) = &mut decoders[usize::from(*x) % 4];
            buf.extend_from_slice(bytes);
            loop {
                match dec.decode(buf) {
                    Ok(Some(unit)) => {
                        let _ = s.handle_inbound(l(x), unit, *now);
                    }
                    Ok(None) => break,
                    Err(e) => {
                        s.handle_decode_error(l(x), e.into(), *now);
                        buf.clear();
                        *dec = StreamDecoder::new(fuzz_limits());
                        break;
                    }
                }
            }
        }
        Op::Advance(ms) => {
            *now += Duration::from_millis(u64::from(*ms) % 4096);
            s.handle_timeout(*now);
        }
        Op::Send(n) => {
            let _ = s.send(Message::new(
                2,
                vec![0xab; usize::from(*n) * 4],
                Bytes::new(),
            ));
        }
        Op::Close => s.close(*now),
        Op::MarkDown => s.mark_down(*now),
        Op::TakeLink {
            link,
            cookie,
            in_seq,
            who,
        } => {
            let hello = Hello {
                name: fuzz_name(*who),
                addr: fuzz_addr(*who),
                target: fuzz_addr(0),
                policy: fuzz_policy(*who),
                cookie: *cookie,
                in_seq: *in_seq,
                limits: None,
                dial: None,
            };
            // The accepted link's own session, past the banners (crc).
            let local = LocalIdentity {
                name: EntityName::peer(9),
                addr: fuzz_addr(0),
                dials: Default::default(),
            };
            let mut pending = Session::accept(SessionConfig::default(), local, l(link), *now);
            let banner = crate::stream::Inbound::Banner(crate::Banner::default().encode());
            let _ = pending.handle_inbound(l(link), banner, *now);
            let t = s.take_link(l(link), &hello, &mut pending, 77, *now);
            if let Takeover::Rejected(f) | Takeover::Impostor { frame: f, .. } = t {
                assert!(matches!(f.tag, Tag::SessionReset | Tag::Wait), "{f:?}");
            }
        }
        Op::AcceptNew(c) => s.accept_new((*c).max(1), *now),
        Op::DecodeError(x) => {
            s.handle_decode_error(l(x), crate::error::FrameError::UnknownTag(0).into(), *now)
        }
        Op::RxPaused(p) => s.set_rx_paused(*p, *now),
        Op::Drain(_) => {}
    }
}

/// A control frame of kind `kind` with a valid payload (kinds >= 9: an empty
/// or unit payload on an arbitrary tag).
fn control(kind: u8, a: u64, b: u64, who: u8) -> Frame {
    let f = control_payload_frame(kind, a, b, who);
    // Hello, hello-ok and reconnect-ok carry limits and a dial number
    // where the banners agreed (the default banner offers both); bit 5 of
    // `who` leaves them out, so both shapes reach the engine. Small limits
    // (from `b`) make queued messages too large now and then; the dial
    // number (from `a`) is now and then one the session has seen.
    if kind % 12 < 3 && who & 0x20 == 0 {
        let limits = Limits {
            max_front: (b as u32 % 64) * 16,
            max_data: 1 << 20,
        };
        return with_dial_number(with_limits(f, &limits), a % 4);
    }
    f
}

fn control_payload_frame(kind: u8, a: u64, b: u64, who: u8) -> Frame {
    match kind % 12 {
        0 => control_frame(
            Tag::Hello,
            &Hello {
                name: fuzz_name(who),
                addr: fuzz_addr(who),
                target: fuzz_addr(0),
                policy: fuzz_policy(who),
                cookie: a,
                in_seq: b,
                limits: None,
                dial: None,
            },
        ),
        1 => control_frame(
            Tag::HelloOk,
            &HelloOk {
                name: fuzz_name(who),
                addr: fuzz_addr(who),
                cookie: a,
            },
        ),
        2 => control_frame(
            Tag::ReconnectOk,
            &ReconnectOk {
                name: fuzz_name(who),
                addr: fuzz_addr(who),
                in_seq: b,
            },
        ),
        3 => control_frame(Tag::Ack, &Ack { seq: a }),
        4 => control_frame(Tag::Keepalive, &Keepalive { stamp: a }),
        5 => control_frame(Tag::KeepaliveAck, &Keepalive { stamp: a }),
        6 => control_frame(
            Tag::Close,
            &Close {
                reason: "fuzz".into(),
            },
        ),
        7 => control_frame(Tag::SessionReset, &()),
        8 => control_frame(Tag::Wait, &()),
        _ => Frame::single(
            Tag::from_u8((a % 14) as u8 + 1).unwrap_or(Tag::Ack),
            Bytes::new(),
        ),
    }
}

/// What the `session_engine` target checks after every step.
#[derive(Default)]
struct Invariants {
    /// Sequence number of the last delivered message in this session epoch.
    last_delivered: u64,
    /// A terminal event (Reset / Closed) was seen.
    ended: bool,
    /// `Established` was seen (and no `RemoteReset` since): messages may
    /// come.
    established: bool,
}

impl Invariants {
    /// Takes up to `max` transmits (0: all) and checks each.
    fn transmit(&mut self, s: &mut Session, cfg: &SessionConfig, now: Instant, max: usize) {
        let mut n = 0;
        while let Some((_link, t)) = s.poll_transmit(now) {
            n += 1;
            assert!(n < 10_000, "poll_transmit does not run dry");
            assert!(!self.ended, "transmit after the session ended: {t:?}");
            if let Transmit::Frame(f) = t {
                let enc = f.encode_to_vec().expect("engine frame encodes");
                let back = Frame::decode_exact(Bytes::from(enc), &cfg.limits);
                assert_eq!(back.as_ref(), Ok(&f), "engine frame does not decode back");
                if f.tag == Tag::MessageBatch {
                    assert!(cfg.batch_max_bytes > 0, "a batch where batches are off");
                    assert!(f.segments[0].len() <= cfg.batch_max_bytes);
                    let batch = BatchReader::new(f.segments[0].clone()).expect("batch header");
                    let claimed = batch.entry_count() as usize;
                    let entries: Vec<Message> = batch
                        .collect::<Result<_, _>>()
                        .expect("engine batch entries");
                    assert_eq!(claimed, entries.len());
                }
            }
            if n == max {
                break;
            }
        }
    }

    fn events(&mut self, s: &mut Session, cfg: &SessionConfig) {
        assert!(s.queued_messages() <= cfg.max_queued_messages);
        loop {
            while let Some(m) = s.poll_message() {
                assert!(!self.ended, "message after the session ended");
                assert!(self.established, "message before Established");
                assert_eq!(m.seq, self.last_delivered + 1, "delivered out of order");
                self.last_delivered = m.seq;
            }
            let Some(ev) = s.poll_event() else {
                break;
            };
            match ev {
                SessionEvent::Established(_) => {
                    assert!(!self.ended, "Established after the session ended");
                    self.established = true;
                }
                SessionEvent::RemoteReset { .. } => {
                    self.last_delivered = 0;
                    self.established = false;
                }
                SessionEvent::Reset { .. } | SessionEvent::Closed => {
                    assert!(!self.ended, "two terminal events");
                    self.ended = true;
                }
                SessionEvent::CloseLink(_) => {}
                other => assert!(!self.ended, "{other:?} after the session ended"),
            }
        }
        if self.ended {
            assert!(s.is_closed());
        }
    }
}

// ---- seeds -----------------------------------------------------------------

/// Seed inputs for every target, built from valid encodings: `(target, file
/// name, bytes)`. `examples/gen_fuzz_corpus.rs` writes them to `fuzz/corpus/`.
pub fn seed_corpus() -> Vec<(&'static str, String, Vec<u8>)> {
    let mut out = Vec::new();
    // Handshakes: empty and random-looking messages, and an honest run.
    out.push(("auth_handshake", "responder-empty".into(), vec![0]));
    let mut v = vec![0u8, 32, 0];
    v.extend_from_slice(&[0x5a; 32]);
    out.push(("auth_handshake", "responder-32-bytes".into(), v));
    out.push((
        "auth_handshake",
        "initiator-short-answer".into(),
        vec![1, 4, 0, 1, 2, 3, 4],
    ));
    out.push(("auth_handshake", "honest".into(), vec![2]));
    out.push((
        "auth_handshake",
        "flip-third".into(),
        vec![2, 0, 0, 0, 0, 2, 0, 0, 1],
    ));
    // RMA: a read and a checksummed write request, a reply, a handle.
    let req = |op, checksum| crate::rma::RmaRequest {
        op,
        region: 3,
        capability: [7; 16],
        offset: 4096,
        len: 64,
        checksum,
        want_key: false,
    };
    let want_key = crate::rma::RmaRequest {
        want_key: true,
        ..req(crate::rma::RmaOp::Read, None)
    };
    for (name, r) in [
        ("read", req(crate::rma::RmaOp::Read, None)),
        ("read-want-key", want_key),
        ("read-checked", req(crate::rma::RmaOp::Read, Some(0))),
        ("write-checked", req(crate::rma::RmaOp::Write, Some(9))),
    ] {
        out.push((
            "rma_decode",
            format!("request-{name}"),
            [&[0][..], &r.encode()].concat(),
        ));
    }
    let reply = crate::rma::RmaReply {
        status: crate::rma::RmaStatus::OutOfRange,
        checksum: 1,
        key: None,
    };
    let keyed = crate::rma::RmaReply {
        status: crate::rma::RmaStatus::Ok,
        checksum: 0,
        key: Some(crate::rma::RmaKey {
            region: 2,
            key: vec![9; 48],
        }),
    };
    for (name, r) in [("reply", reply), ("reply-keyed", keyed)] {
        out.push(("rma_decode", name.into(), [&[1][..], &r.encode()].concat()));
    }
    let handle = crate::rma::RmaHandle {
        region: 1,
        len: 1 << 20,
        access: crate::rma::Access::ReadWrite,
        capability: [5; 16],
    };
    let h = postcard::to_allocvec(&handle).expect("a handle encodes");
    out.push(("rma_decode", "handle".into(), [&[2][..], &h].concat()));
    // Sealed frames: a plain frame, a garbage sealed one, an honest seal.
    out.push(("sealed_decode", "plain-ack".into(), vec![0, 7, 0, 1, 1, 0]));
    let mut v = vec![0u8, 16, 0x80, 1, 64];
    v.extend_from_slice(&[0xa5; 64]);
    out.push(("sealed_decode", "garbage-sealed".into(), v));
    out.push((
        "sealed_decode",
        "honest".into(),
        vec![1, 3, 0, 4, b'f', b'r', b'n', b't', 2, 1, 2],
    ));
    out.push((
        "sealed_decode",
        "one-bit".into(),
        vec![1, 3, 0, 1, b'x', 0, 0, 0, 0, 1],
    ));
    let frames = sample_frames();

    for (i, f) in frames.iter().enumerate() {
        let mut v = vec![0u8];
        v.extend_from_slice(&f.preamble().expect("sample preamble").encode());
        out.push(("frame_preamble", format!("valid-{i:02}-{:?}", f.tag), v));
    }
    out.push(("frame_preamble", "crc-fixup-zeros".into(), vec![1; 1]));

    let mut all = Vec::new();
    for (i, f) in frames.iter().enumerate() {
        let enc = f.encode_to_vec().expect("sample encodes");
        all.extend_from_slice(&enc);
        let mut v = vec![0u8, i as u8];
        v.extend_from_slice(&enc);
        out.push(("frame_decode", format!("frame-{i:02}-{:?}", f.tag), v));
    }
    let mut v = vec![1u8, 3];
    v.extend_from_slice(&Banner::default().encode());
    v.extend_from_slice(&all);
    out.push(("frame_decode", "banner-then-all-frames".into(), v));
    let mut v = vec![2u8, 5];
    v.extend_from_slice(&all);
    out.push(("frame_decode", "all-frames-crc-fixup".into(), v));

    let mut v = vec![0u8];
    v.extend_from_slice(&Banner::default().encode());
    out.push(("banner", "default".into(), v));
    let odd = Banner {
        version: 2,
        supported: 1 << 40 | 1,
        required: 1 << 41,
    };
    let mut v = vec![0u8];
    v.extend_from_slice(&odd.encode());
    out.push(("banner", "incompatible".into(), v));

    for (i, f) in frames.iter().enumerate() {
        let mut v = Vec::new();
        write_frame(f, &mut v);
        out.push(("message_decode", format!("frame-{i:02}-{:?}", f.tag), v));
    }
    let payload = SamplePayload {
        id: 7,
        name: "osd".into(),
        tags: vec![1, 2, 3],
        offset: Some(-5),
        kind: SampleKind::Named {
            name: EntityName::client(4),
            flag: true,
        },
        blob: vec![0, 255],
        addr: Some(EntityAddr::tcp(([127, 0, 0, 1], 6800).into()).with_nonce(3)),
    };
    let mut m = Message::encode(42, &payload).expect("sample payload");
    m.seq = 3;
    let mut v = Vec::new();
    write_frame(&m.to_frame(2), &mut v);
    v.extend_from_slice(&Postcard.encode(&payload).expect("sample payload"));
    out.push(("message_decode", "typed-payload".into(), v));

    for (i, s) in [
        "tcp://127.0.0.1:6800",
        "tcp://[::1]:6800/42",
        "tcp://[fe80::1%2]:6800",
        "verbs://198.51.100.1:6800/7?dev=rxe0&port=1&gid=1",
        "rdmacm://198.51.100.1:7471",
        "fabric+tcp;ofi_rxm://127.0.0.1:6800?ep=rdm",
        "fabric+verbs;ofi_rxm://10.0.0.1:1?dev=mlx5_0",
        "fabric+shm://127.0.0.1:1",
        "[verbs://198.51.100.1:6800,tcp://198.51.100.1:6801]",
        "[]",
        "client.4123",
        "server.0",
    ]
    .iter()
    .enumerate()
    {
        out.push(("addr_parse", format!("text-{i:02}"), s.as_bytes().to_vec()));
    }
    let a = EntityAddr::tcp(([127, 0, 0, 1], 6800).into()).with_nonce(9);
    out.push((
        "addr_parse",
        "postcard-addr".into(),
        Postcard.encode(&a).expect("addr encodes").to_vec(),
    ));

    let mut buf = BytesMut::new();
    let mut w = BatchWriter::begin(&mut buf, 5, 4, 1 << 12);
    w.push(&m);
    w.push(&Message::new(7, &b"front"[..], &b"data"[..]));
    w.push(&Message::default());
    let mut v = vec![0u8];
    v.extend_from_slice(&w.finish());
    out.push(("batch_decode", "body-three-entries".into(), v));
    let mut v = vec![1u8];
    v.extend(9u64.to_le_bytes());
    v.extend(3u64.to_le_bytes());
    v.extend(600u16.to_le_bytes());
    for i in 0..8u8 {
        v.extend(u16::from(i).pow(5).to_le_bytes());
        v.push(i * 9);
        v.extend(std::iter::repeat_n(i, usize::from(i * 9)));
        v.push(i);
        v.extend(std::iter::repeat_n(!i, usize::from(i)));
        v.extend([i, i * 3]);
    }
    out.push(("batch_decode", "structured-eight".into(), v));

    for (name, setup, ops) in session_scripts() {
        let mut v = vec![setup];
        for op in &ops {
            op.write(&mut v);
            Op::Drain(0).write(&mut v);
        }
        out.push(("session_engine", name.into(), v));
    }
    out
}

/// One sample of every frame type the protocol sends.
pub fn sample_frames() -> Vec<Frame> {
    let a = EntityAddr::tcp(([10, 0, 0, 1], 6800).into()).with_nonce(1);
    let mut m = Message::new(5, &b"front"[..], vec![9u8; 100]);
    m.seq = 1;
    vec![
        control_frame(
            Tag::Hello,
            &Hello {
                name: EntityName::client(1),
                addr: a.clone(),
                target: a.clone(),
                policy: Policy::LosslessClient,
                cookie: 0,
                in_seq: 0,
                limits: None,
                dial: None,
            },
        ),
        control_frame(
            Tag::HelloOk,
            &HelloOk {
                name: EntityName::server(1),
                addr: a.clone(),
                cookie: 99,
            },
        ),
        control_frame(
            Tag::ReconnectOk,
            &ReconnectOk {
                name: EntityName::server(1),
                addr: a,
                in_seq: 4,
            },
        ),
        control_frame(Tag::SessionReset, &()),
        control_frame(Tag::Wait, &()),
        m.to_frame(0),
        control_frame(Tag::Ack, &Ack { seq: 3 }),
        control_frame(Tag::Keepalive, &Keepalive { stamp: 1234 }),
        control_frame(Tag::KeepaliveAck, &Keepalive { stamp: 1234 }),
        Frame::single(Tag::CreditGrant, vec![1, 2, 3, 4]),
        Frame::single(Tag::RendezvousRequest, vec![0; 24]),
        Frame::single(Tag::RendezvousFinish, vec![0; 8]),
        control_frame(
            Tag::Close,
            &Close {
                reason: "bye".into(),
            },
        ),
        Frame::new(Tag::Ack, vec![]),
    ]
}

/// Scripted, meaningful sessions for the `session_engine` seeds.
fn session_scripts() -> Vec<(&'static str, u8, Vec<Op>)> {
    // Connector, LosslessClient, dialling fuzz_addr(0) (who=0: 10.0.0.2:6800 nonce 0).
    let connector = 1 << 1;
    let msg = |seq, ack| Op::Msg {
        link: 1,
        seq,
        ack,
        len: 3,
    };
    let hello_ok = |link| Op::Control {
        link,
        kind: 1,
        a: 7,
        b: 0,
        who: 0,
    };
    vec![
        (
            "connect-open-exchange",
            connector,
            vec![
                Op::Send(2),
                Op::LinkUp(1),
                Op::GoodBanner(1),
                hello_ok(1),
                msg(1, 1),
                msg(2, 1),
                Op::Control {
                    link: 1,
                    kind: 3,
                    a: 1,
                    b: 0,
                    who: 0,
                },
                Op::Advance(150),
                Op::Close,
            ],
        ),
        (
            "connect-open-batches",
            connector,
            vec![
                Op::Send(2),
                Op::Send(3),
                Op::Send(200),
                Op::LinkUp(1),
                Op::GoodBanner(1),
                hello_ok(1),
                // Four messages in a batch, then the last two again (a
                // replay's overlap) with three more.
                Op::Msg {
                    link: 1,
                    seq: 1,
                    ack: 1,
                    len: 0x83,
                },
                Op::Msg {
                    link: 1,
                    seq: 3,
                    ack: 3,
                    len: 0x84,
                },
                Op::Advance(150),
                Op::Close,
            ],
        ),
        (
            "connect-fault-reconnect",
            connector,
            vec![
                Op::Send(1),
                Op::Send(2),
                Op::LinkUp(1),
                Op::GoodBanner(1),
                hello_ok(1),
                Op::LinkFailed(1),
                Op::Advance(10),
                Op::LinkUp(2),
                Op::GoodBanner(2),
                Op::Control {
                    link: 2,
                    kind: 2,
                    a: 0,
                    b: 1,
                    who: 0,
                },
                msg(1, 2),
            ],
        ),
        (
            "accept-new-and-take-link",
            1,
            vec![
                Op::GoodBanner(0),
                Op::Control {
                    link: 0,
                    kind: 0,
                    a: 0,
                    b: 0,
                    who: 0x20,
                },
                Op::AcceptNew(5),
                Op::Msg {
                    link: 0,
                    seq: 1,
                    ack: 0,
                    len: 1,
                },
                Op::Send(1),
                Op::LinkFailed(0),
                Op::TakeLink {
                    link: 3,
                    cookie: 5,
                    in_seq: 0,
                    who: 0x20,
                },
                Op::GoodBanner(3),
                Op::Advance(600),
            ],
        ),
        (
            "stream-bytes",
            connector,
            vec![
                Op::LinkUp(0),
                Op::Stream(0, {
                    let mut v = Banner::default().encode().to_vec();
                    v.extend(
                        control_frame(
                            Tag::HelloOk,
                            &HelloOk {
                                name: EntityName::server(1),
                                addr: fuzz_addr(0),
                                cookie: 3,
                            },
                        )
                        .encode_to_vec()
                        .expect("encodes"),
                    );
                    v
                }),
                Op::Send(1),
                Op::Advance(200),
            ],
        ),
        (
            "simultaneous-wait",
            2 << 1,
            vec![
                Op::LinkUp(1),
                Op::GoodBanner(1),
                Op::TakeLink {
                    link: 2,
                    cookie: 0,
                    in_seq: 0,
                    who: 0x20 | 8,
                },
                Op::Control {
                    link: 1,
                    kind: 8,
                    a: 0,
                    b: 0,
                    who: 0,
                },
                Op::Advance(100),
            ],
        ),
    ]
}

/// RMA requests, replies and handles (`crate::rma`) from arbitrary bytes:
/// mode 0 a request, 1 a reply, 2 a handle (postcard). What decodes
/// encodes back to the same bytes (one encoding per value); nothing
/// panics.
pub fn rma_decode(data: &[u8]) {
    use crate::rma::{RmaHandle, RmaReply, RmaRequest};
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    match mode % 3 {
        0 => {
            if let Ok(r) = RmaRequest::decode(rest) {
                assert_eq!(r.encode(), rest, "a request reads and writes back the same");
            }
        }
        1 => {
            if let Ok(r) = RmaReply::decode(rest) {
                assert_eq!(
                    &r.encode()[..],
                    rest,
                    "a reply reads and writes back the same"
                );
            }
        }
        _ => {
            if let Ok(h) = postcard::from_bytes::<RmaHandle>(rest) {
                let again = postcard::to_allocvec(&h).expect("a handle encodes");
                assert_eq!(postcard::from_bytes::<RmaHandle>(&again).ok(), Some(h));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ops_round_trip_through_bytes() {
        for (_, _, ops) in session_scripts() {
            let mut v = Vec::new();
            for op in &ops {
                op.write(&mut v);
            }
            let mut r = Reader::new(&v);
            let back: Vec<Op> =
                std::iter::from_fn(|| (!r.is_empty()).then(|| Op::read(&mut r))).collect();
            assert_eq!(back, ops);
        }
    }
}
