//! The `frame_preamble`, `frame_decode` and `banner` targets: what
//! starts a stream and the frames that follow, decoded from arbitrary
//! bytes.

use bytes::{Bytes, BytesMut};

use crate::banner::{Banner, BANNER_LEN};
use crate::error::FrameError;
use crate::frame::{Frame, FrameDecoder, FrameLimits, Preamble, Tag, MAX_SEGMENTS, PREAMBLE_LEN};
use crate::message::Message;
use crate::stream::{Inbound, StreamDecoder, Transmit};

use super::Reader;

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

pub(super) fn pad<const N: usize>(b: &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    out[..b.len()].copy_from_slice(b);
    out
}

/// Small limits so hostile lengths are exercised without big allocations.
pub(super) fn fuzz_limits() -> FrameLimits {
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
pub(super) fn message_of(unit: Result<Inbound, FrameError>) -> Option<(Message, u64)> {
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
