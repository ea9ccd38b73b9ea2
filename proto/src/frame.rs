//! Frames: the unit every transport moves.
//!
//! A frame is a fixed-size [`Preamble`], up to [`MAX_SEGMENTS`] segments and an
//! epilogue holding one CRC32C per segment. The preamble carries its own CRC so a
//! corrupted length is caught before anything is allocated for it. Byte-stream
//! transports (TCP) feed bytes to a [`FrameDecoder`]; message transports (RDMA,
//! libfabric) hand one received buffer to [`Frame::decode_exact`].
//!
//! Layout (all integers little-endian), documented in docs/PROTOCOL.md:
//!
//! ```text
//! preamble (32 B): tag u8 | flags u8 | segment count u8 | reserved u8
//!                  | 4 x segment length u32 | reserved 8 B | crc32c(bytes 0..28) u32
//! segments:        segment 0 .. segment n-1, back to back
//! epilogue:        n x crc32c(segment i) u32
//! ```
//!
//! One flag bit belongs to the frame layer rather than to the tag:
//! [`FLAG_UNCHECKED_PAYLOAD`] — segments after the first carry no CRC (their
//! epilogue words are 0), used only where both ends agreed to it in the
//! banner (`features::UNCHECKED_PAYLOAD`). The preamble and the first
//! segment (a message's header: sequence numbers, lengths) are always checked.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use smallvec::SmallVec;

use crate::checksum::{CrcMemo, CRC_MEMO_MIN};
use crate::error::FrameError;

/// Size of the fixed preamble that starts every frame.
pub const PREAMBLE_LEN: usize = 32;
/// Most segments a frame may carry (header, front, data and one spare).
pub const MAX_SEGMENTS: usize = 4;
/// Bytes an AEAD tag adds to each piece the secure mode's record layer
/// seals (`auth::record`).
pub const SEAL_TAG_LEN: usize = 16;
/// What sealing adds to each segment of a frame, by index: segment 0
/// also carries the inner preamble. A `Tag::Sealed` frame's limits are
/// the inner frame's plus these.
pub const SEAL_OVERHEAD: [u32; MAX_SEGMENTS] = [
    (PREAMBLE_LEN + SEAL_TAG_LEN) as u32,
    SEAL_TAG_LEN as u32,
    SEAL_TAG_LEN as u32,
    SEAL_TAG_LEN as u32,
];
/// Bytes of the preamble covered by its CRC.
const PREAMBLE_CRC_OFFSET: usize = 28;
/// Frame flag: segments after the first are not checksummed (epilogue words
/// 0). Whether a peer may send it is negotiated; the decoder only honours it.
pub const FLAG_UNCHECKED_PAYLOAD: u8 = 1 << 7;

/// What a frame is. Unknown tags are a protocol error, never ignored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Tag {
    /// Connector's identity and session request (new session or reconnect).
    Hello = 1,
    /// Acceptor's identity for a new session, with the session cookie.
    HelloOk = 2,
    /// Acceptor resumes an existing session; carries its receive position.
    ReconnectOk = 3,
    /// The session the connector asked for does not exist (any more): start afresh.
    SessionReset = 4,
    /// Both sides connected at once and the acceptor's own attempt wins: stand by.
    Wait = 5,
    /// An application message (header, front, data segments).
    Message = 6,
    /// Cumulative acknowledgement of received messages.
    Ack = 7,
    /// Liveness probe.
    Keepalive = 8,
    /// Answer to a [`Tag::Keepalive`].
    KeepaliveAck = 9,
    /// Receive credits granted by an RDMA receiver.
    CreditGrant = 10,
    /// Rendezvous: the data segment waits in the sender's registered memory.
    RendezvousRequest = 11,
    /// Rendezvous: the receiver has pulled the data; the sender may release it.
    RendezvousFinish = 12,
    /// Orderly end of the session; carries a reason.
    Close = 13,
    /// Many small application messages: one segment, the batch body
    /// ([`crate::batch`]); sent only where both banners offered
    /// [`crate::banner::features::BATCH`].
    MessageBatch = 14,
    /// One Noise handshake message ([`crate::auth::handshake`]): one
    /// segment, sent between the banners and the hello where both sides
    /// chose `auth` or `secure`.
    Auth = 15,
    /// A frame sealed by the secure mode's record layer
    /// ([`crate::auth::record`]): its segments are the inner frame's,
    /// each encrypted and tagged.
    Sealed = 16,
    /// One bounded piece of a large message of a priority class
    /// ([`crate::fragment`]): three segments, the fragment header, the
    /// message header (first fragment only, else empty) and the piece.
    /// Defined for [`crate::banner::features::LANES`], which no build
    /// offers yet: a session refuses it as unexpected.
    Fragment = 17,
}

impl Tag {
    /// Maps a wire byte to a tag.
    pub fn from_u8(v: u8) -> Option<Tag> {
        Some(match v {
            1 => Tag::Hello,
            2 => Tag::HelloOk,
            3 => Tag::ReconnectOk,
            4 => Tag::SessionReset,
            5 => Tag::Wait,
            6 => Tag::Message,
            7 => Tag::Ack,
            8 => Tag::Keepalive,
            9 => Tag::KeepaliveAck,
            10 => Tag::CreditGrant,
            11 => Tag::RendezvousRequest,
            12 => Tag::RendezvousFinish,
            13 => Tag::Close,
            14 => Tag::MessageBatch,
            15 => Tag::Auth,
            16 => Tag::Sealed,
            17 => Tag::Fragment,
            _ => return None,
        })
    }
}

/// Hard limits a decoder enforces before it allocates anything.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameLimits {
    /// Largest accepted length of each segment, by segment index.
    pub max_segment: [u32; MAX_SEGMENTS],
    /// Largest accepted frame (preamble + segments + epilogue).
    pub max_frame: u64,
}

impl Default for FrameLimits {
    /// Header segments are small; front up to 16 MiB; data up to 128 MiB.
    fn default() -> Self {
        FrameLimits {
            max_segment: [64 << 10, 16 << 20, 128 << 20, 64 << 10],
            max_frame: (160 << 20) as u64,
        }
    }
}

/// The decoded fixed-size start of a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Preamble {
    /// What the frame is.
    pub tag: Tag,
    /// Per-tag flags.
    pub flags: u8,
    /// How many segments follow.
    pub segment_count: u8,
    /// Length of each segment; unused entries are 0.
    pub segment_lens: [u32; MAX_SEGMENTS],
}

impl Preamble {
    /// Bytes of segments and epilogue that follow the preamble.
    pub fn body_len(&self) -> u64 {
        let segs: u64 = self.segment_lens.iter().map(|&l| u64::from(l)).sum();
        segs + 4 * u64::from(self.segment_count)
    }

    /// Total frame length including the preamble.
    pub fn frame_len(&self) -> u64 {
        PREAMBLE_LEN as u64 + self.body_len()
    }

    /// Encodes the preamble with its CRC.
    pub fn encode(&self) -> [u8; PREAMBLE_LEN] {
        let mut out = [0u8; PREAMBLE_LEN];
        out[0] = self.tag as u8;
        out[1] = self.flags;
        out[2] = self.segment_count;
        for (i, len) in self.segment_lens.iter().enumerate() {
            out[4 + 4 * i..8 + 4 * i].copy_from_slice(&len.to_le_bytes());
        }
        let crc = crate::checksum::crc32c(&out[..PREAMBLE_CRC_OFFSET]);
        out[PREAMBLE_CRC_OFFSET..].copy_from_slice(&crc.to_le_bytes());
        out
    }

    /// Decodes and validates a preamble: CRC first, then tag, counts and limits,
    /// so nothing derived from a corrupted or hostile length is ever trusted.
    pub fn decode(raw: &[u8; PREAMBLE_LEN], limits: &FrameLimits) -> Result<Preamble, FrameError> {
        let mut crc_bytes = [0u8; 4];
        crc_bytes.copy_from_slice(&raw[PREAMBLE_CRC_OFFSET..]);
        let wire_crc = u32::from_le_bytes(crc_bytes);
        let crc = crate::checksum::crc32c(&raw[..PREAMBLE_CRC_OFFSET]);
        if crc != wire_crc {
            return Err(FrameError::PreambleCrc {
                expected: wire_crc,
                actual: crc,
            });
        }
        let tag = Tag::from_u8(raw[0]).ok_or(FrameError::UnknownTag(raw[0]))?;
        let segment_count = raw[2];
        if usize::from(segment_count) > MAX_SEGMENTS {
            return Err(FrameError::TooManySegments(segment_count));
        }
        if raw[3] != 0 || raw[20..PREAMBLE_CRC_OFFSET].iter().any(|&b| b != 0) {
            return Err(FrameError::ReservedBitsSet);
        }
        let mut segment_lens = [0u32; MAX_SEGMENTS];
        for (i, len) in segment_lens.iter_mut().enumerate() {
            let mut b = [0u8; 4];
            b.copy_from_slice(&raw[4 + 4 * i..8 + 4 * i]);
            *len = u32::from_le_bytes(b);
            if i >= usize::from(segment_count) && *len != 0 {
                return Err(FrameError::ReservedBitsSet);
            }
            // A sealed frame's segments are the inner frame's plus tags
            // (segment 0 also the inner preamble); the inner frame is
            // checked against the limits themselves once opened.
            let max = if tag == Tag::Sealed {
                limits.max_segment[i].saturating_add(SEAL_OVERHEAD[i])
            } else {
                limits.max_segment[i]
            };
            if *len > max {
                return Err(FrameError::SegmentTooLarge {
                    index: i,
                    len: *len,
                    max,
                });
            }
        }
        let pre = Preamble {
            tag,
            flags: raw[1],
            segment_count,
            segment_lens,
        };
        let max_frame = if tag == Tag::Sealed {
            // Saturating: a limit near u64::MAX (a fuzzer's) must not wrap.
            limits
                .max_frame
                .saturating_add(SEAL_OVERHEAD.iter().map(|&o| u64::from(o)).sum::<u64>())
        } else {
            limits.max_frame
        };
        if pre.frame_len() > max_frame {
            return Err(FrameError::FrameTooLarge {
                len: pre.frame_len(),
                max: max_frame,
            });
        }
        Ok(pre)
    }
}

/// A frame's segments, held inline: a message's three (header, front, data)
/// cost no allocation (every message frame, sent or received, used to
/// allocate its segment list); a fourth, which no frame built here has,
/// would spill to the heap. Room for four made a [`Frame`] 144 bytes, past
/// the 128 that x86-64 moves with inline stores: each of the dozen moves
/// of a frame between decoder, transport, worker and session became a
/// `memcpy` call (~7% of a 64 B echo's instructions).
pub type Segments = SmallVec<[Bytes; INLINE_SEGMENTS]>;

/// Segments a [`Frame`] holds without allocating.
const INLINE_SEGMENTS: usize = 3;

/// A frame: tag, flags and segments. Segments are [`Bytes`], so a frame built from
/// received memory borrows it without copying.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// What the frame is.
    pub tag: Tag,
    /// Per-tag flags.
    pub flags: u8,
    /// Up to `MAX_SEGMENTS` segments.
    pub segments: Segments,
    /// The CRC32C of one large segment, if known already (checked on
    /// receipt, or a sealed message's data): the epilogue takes it instead
    /// of reading the segment again.
    pub(crate) crc_memo: CrcMemo,
}

impl Frame {
    /// Builds a frame. Panics in debug builds if more than `MAX_SEGMENTS`
    /// segments are given: that is a bug in the caller, not wire input.
    ///
    /// ```
    /// use bytes::Bytes;
    /// # use msgr_proto::{Frame, Tag};
    ///
    /// let f = Frame::new(Tag::Message, [Bytes::from_static(b"h"), Bytes::new(), Bytes::new()]);
    /// assert_eq!(f.segments.len(), 3);
    /// ```
    pub fn new(tag: Tag, segments: impl IntoIterator<Item = Bytes>) -> Frame {
        let segments: Segments = segments.into_iter().collect();
        debug_assert!(segments.len() <= MAX_SEGMENTS);
        Frame {
            tag,
            flags: 0,
            segments,
            crc_memo: CrcMemo::NONE,
        }
    }

    /// This frame with the CRC32C of segment `index` computed now and kept,
    /// so that encoding it and its clones takes it instead of reading the
    /// segment again: for a frame sent more than once. What
    /// [`crate::Message::with_data_checksum`] does for a message's data,
    /// which says when not to; as there, a segment shorter than
    /// `CRC_MEMO_MIN` keeps none. No segment `index`: the frame as it was.
    ///
    /// ```
    /// use bytes::Bytes;
    /// # use msgr_proto::{Frame, Tag};
    ///
    /// let f = Frame::new(Tag::Message, [Bytes::from(vec![1u8; 1 << 16])]).with_segment_checksum(0);
    /// # use msgr_proto::checksum::crc32c;
    /// assert_eq!(f.known_crc(0), Some(crc32c(&f.segments[0])));
    /// let small = Frame::new(Tag::Message, [Bytes::from(vec![1u8; 64])]).with_segment_checksum(0);
    /// assert_eq!(small.known_crc(0), None);
    /// ```
    pub fn with_segment_checksum(mut self, index: usize) -> Frame {
        if let Some(seg) = self.segments.get(index) {
            self.crc_memo = CrcMemo::sealed(index, seg);
        }
        self
    }

    /// Whether the epilogue can be had without a pass over a large
    /// segment: every checked segment of `CRC_MEMO_MIN` bytes or more
    /// has its CRC32C known ([`Frame::known_crc`]): then a sender has no
    /// reason to compute the epilogue late, while the segments travel.
    ///
    /// ```
    /// use bytes::Bytes;
    /// # use msgr_proto::{Frame, Tag};
    ///
    /// let f = Frame::new(Tag::Message, [Bytes::from_static(b"h"), Bytes::from(vec![1u8; 1 << 20])]);
    /// assert!(!f.checksums_known());
    /// assert!(f.with_segment_checksum(1).checksums_known());
    /// ```
    pub fn checksums_known(&self) -> bool {
        let checked = checked_segments(self.flags);
        self.segments
            .iter()
            .enumerate()
            .take(checked)
            .all(|(i, s)| s.len() < CRC_MEMO_MIN || self.crc_memo.get(i, s).is_some())
    }

    /// The CRC32C of segment `index` if it is known already (checked when
    /// the frame was received, or computed when its message was sealed:
    /// [`crate::Message::with_data_checksum`]), without reading it.
    ///
    /// ```
    /// use bytes::Bytes;
    /// # use msgr_proto::{Frame, FrameLimits, Tag};
    ///
    /// let data = Bytes::from(vec![7u8; 1 << 20]);
    /// let sent = Frame::new(Tag::Message, [Bytes::from_static(b"h"), data.clone()]);
    /// assert_eq!(sent.known_crc(1), None);
    /// let wire = Bytes::from(sent.encode_to_vec().unwrap());
    /// let got = Frame::decode_exact(wire, &FrameLimits::default()).unwrap();
    /// # use msgr_proto::checksum::crc32c;
    /// assert_eq!(got.known_crc(1), Some(crc32c(&data)));
    /// ```
    pub fn known_crc(&self, index: usize) -> Option<u32> {
        self.crc_memo.get(index, self.segments.get(index)?)
    }

    /// A frame with a single segment.
    pub fn single(tag: Tag, payload: impl Into<Bytes>) -> Frame {
        Frame::new(tag, [payload.into()])
    }

    /// The preamble this frame encodes to. Fails if a segment does not fit a u32
    /// length or the frame has too many segments.
    pub fn preamble(&self) -> Result<Preamble, FrameError> {
        if self.segments.len() > MAX_SEGMENTS {
            return Err(FrameError::TooManySegments(
                self.segments.len().min(255) as u8
            ));
        }
        let mut segment_lens = [0u32; MAX_SEGMENTS];
        for (i, s) in self.segments.iter().enumerate() {
            segment_lens[i] = u32::try_from(s.len()).map_err(|_| FrameError::SegmentTooLarge {
                index: i,
                len: u32::MAX,
                max: u32::MAX,
            })?;
        }
        Ok(Preamble {
            tag: self.tag,
            flags: self.flags,
            segment_count: self.segments.len() as u8,
            segment_lens,
        })
    }

    /// Total encoded length.
    pub fn encoded_len(&self) -> usize {
        PREAMBLE_LEN + self.segments.iter().map(|s| s.len() + 4).sum::<usize>()
    }

    /// Encodes the frame for a vectored write: the preamble, the segments as they
    /// are (no copy) and the epilogue.
    pub fn encode(&self) -> Result<EncodedFrame, FrameError> {
        self.clone().into_encoded()
    }

    /// Like [`Frame::encode`], consuming the frame (its segments move into the
    /// result: no reference counts touched).
    pub fn into_encoded(self) -> Result<EncodedFrame, FrameError> {
        let preamble = self.preamble()?.encode();
        let (epilogue, epilogue_len) = self.epilogue_bytes();
        Ok(EncodedFrame {
            preamble,
            segments: self.segments,
            epilogue,
            epilogue_len,
        })
    }

    /// Like [`Frame::into_encoded`], with the epilogue's words left zero:
    /// for a sender that moves a large segment first and checksums it while
    /// the peer receives (the libfabric rendezvous), computing the words
    /// later with [`Frame::epilogue_bytes`] on a clone of the frame (whose
    /// segments are shared, not copied).
    ///
    /// ```
    /// use bytes::Bytes;
    /// # use msgr_proto::{Frame, Tag};
    ///
    /// let f = Frame::new(Tag::Message, [Bytes::from_static(b"data")]);
    /// let late = f.clone().into_encoded_without_epilogue().unwrap();
    /// assert_eq!(late.epilogue(), &[0; 4]);
    /// assert_eq!(late.epilogue().len(), f.epilogue_bytes().1);
    /// ```
    pub fn into_encoded_without_epilogue(self) -> Result<EncodedFrame, FrameError> {
        let preamble = self.preamble()?.encode();
        let epilogue_len = 4 * self.segments.len();
        Ok(EncodedFrame {
            preamble,
            segments: self.segments,
            epilogue: [0; 4 * MAX_SEGMENTS],
            epilogue_len,
        })
    }

    /// Encodes the frame into one contiguous buffer (for small frames and
    /// tests); the frame is left as it is, nothing of it cloned.
    pub fn encode_to_vec(&self) -> Result<Vec<u8>, FrameError> {
        let preamble = self.preamble()?;
        let mut out = Vec::with_capacity(self.encoded_len());
        self.write_encoded(&preamble, &mut out);
        Ok(out)
    }

    /// The encoded frame as one [`Bytes`] cut from `arena`: how the
    /// message-oriented transports send a small frame (one copy into a
    /// shared chunk, no `EncodedFrame` in between).
    pub fn encode_in(&self, arena: &mut crate::arena::ByteArena) -> Result<Bytes, FrameError> {
        let preamble = self.preamble()?;
        Ok(arena.fill(self.encoded_len(), |b| self.write_encoded(&preamble, b)))
    }

    /// Appends the encoded frame ([`Frame::encoded_len`] bytes) to `out`,
    /// with `preamble` from [`Frame::preamble`] (which bounds what can go
    /// wrong: nothing fails here). For a small frame encoded straight into
    /// a buffer of the caller's, without an `EncodedFrame` in between.
    pub fn write_encoded(&self, preamble: &Preamble, out: &mut impl BufMut) {
        out.put_slice(&preamble.encode());
        for s in &self.segments {
            out.put_slice(s);
        }
        let (epilogue, len) = self.epilogue_bytes();
        out.put_slice(&epilogue[..len]);
    }

    /// The epilogue as it goes on the wire after the segments: its bytes
    /// and how many of them count (4 per segment). For a writer that sends
    /// the segments first and checksums them while they travel. Call after
    /// [`Frame::preamble`] has bounded the segment count.
    ///
    /// ```
    /// use bytes::Bytes;
    /// # use msgr_proto::{Frame, Tag};
    ///
    /// let f = Frame::new(Tag::Message, [Bytes::from_static(b"h"), Bytes::from_static(b"data")]);
    /// let (words, len) = f.epilogue_bytes();
    /// let wire = f.encode_to_vec().unwrap();
    /// assert_eq!(&wire[wire.len() - len..], &words[..len]);
    /// ```
    pub fn epilogue_bytes(&self) -> ([u8; 4 * MAX_SEGMENTS], usize) {
        (self.epilogue(), 4 * self.segments.len().min(MAX_SEGMENTS))
    }

    /// How many bytes the epilogue checksums: every segment's, or with
    /// `FLAG_UNCHECKED_PAYLOAD` the first segment's only.
    ///
    /// ```
    /// use bytes::Bytes;
    /// # use msgr_proto::frame::FLAG_UNCHECKED_PAYLOAD;
    /// # use msgr_proto::{Frame, Tag};
    ///
    /// let mut f = Frame::new(Tag::Message, [Bytes::from_static(b"head"), Bytes::from_static(b"data")]);
    /// assert_eq!(f.checked_bytes(), 8);
    /// f.flags = FLAG_UNCHECKED_PAYLOAD;
    /// assert_eq!(f.checked_bytes(), 4);
    /// ```
    pub fn checked_bytes(&self) -> usize {
        let checked = checked_segments(self.flags);
        self.segments.iter().take(checked).map(|s| s.len()).sum()
    }

    /// The epilogue's words: each checked segment's CRC, 0 for the rest.
    /// Call after [`Frame::preamble`] has bounded the segment count.
    fn epilogue(&self) -> [u8; 4 * MAX_SEGMENTS] {
        let mut epilogue = [0u8; 4 * MAX_SEGMENTS];
        let checked = checked_segments(self.flags);
        for (i, s) in self.segments.iter().enumerate().take(checked) {
            let crc = self.crc_memo.get(i, s).unwrap_or_else(|| segment_crc(s));
            epilogue[4 * i..4 * i + 4].copy_from_slice(&crc.to_le_bytes());
        }
        epilogue
    }

    /// Decodes exactly one frame occupying all of `buf` (message-oriented
    /// transports deliver one frame per receive). The segments are slices of
    /// `buf`: nothing is copied, so a registered receive buffer handed in as
    /// `Bytes` lives on in the frame's segments.
    pub fn decode_exact(buf: Bytes, limits: &FrameLimits) -> Result<Frame, FrameError> {
        let pre = exact_preamble(&buf, limits)?;
        frame_body(&pre, buf)
    }
}

/// The checked preamble of a frame that must fill all of `buf`: truncated
/// or trailing bytes are errors.
pub(crate) fn exact_preamble(buf: &[u8], limits: &FrameLimits) -> Result<Preamble, FrameError> {
    let Some(raw) = buf.first_chunk::<PREAMBLE_LEN>() else {
        return Err(FrameError::Truncated {
            have: buf.len(),
            need: PREAMBLE_LEN,
        });
    };
    let pre = Preamble::decode(raw, limits)?;
    let total = pre.frame_len() as usize;
    match buf.len().cmp(&total) {
        std::cmp::Ordering::Less => Err(FrameError::Truncated {
            have: buf.len(),
            need: total,
        }),
        std::cmp::Ordering::Greater => Err(FrameError::TrailingBytes(buf.len() - total)),
        std::cmp::Ordering::Equal => Ok(pre),
    }
}

/// A segment's CRC32C. An empty segment's is 0 (the CRC of no bytes), and
/// skipping the call for it saves the checksum's fixed cost per call,
/// a quarter of the checksum work of a small message with no data segment.
pub(crate) fn segment_crc(seg: &[u8]) -> u32 {
    if seg.is_empty() {
        0
    } else {
        crate::checksum::crc32c(seg)
    }
}

/// How many leading segments carry a CRC in a frame with these flags.
pub(crate) fn checked_segments(flags: u8) -> usize {
    if flags & FLAG_UNCHECKED_PAYLOAD != 0 {
        1
    } else {
        MAX_SEGMENTS
    }
}

/// Cuts a whole frame (`pre` already checked, `whole` exactly its length)
/// into its segments and checks each one's CRC.
pub(crate) fn frame_body(pre: &Preamble, whole: Bytes) -> Result<Frame, FrameError> {
    let (segments, crc_memo) = checked_body::<MAX_SEGMENTS>(pre, whole)?;
    let count = usize::from(pre.segment_count);
    Ok(Frame {
        tag: pre.tag,
        flags: pre.flags,
        segments: segments.into_iter().take(count).collect(),
        crc_memo,
    })
}

/// The segments of a whole frame (`pre` already checked, `whole` exactly
/// its length), in the first `pre.segment_count` of `N` places (the rest
/// empty), each one's CRC checked (an unchecked segment's epilogue word
/// must be 0), and the checksum kept of a large one. The segments share
/// `whole`'s memory.
///
/// The epilogue is read and cut off first, so the last segment is what is
/// left of `whole`, moved rather than shared: each shared [`Bytes`] costs
/// an atomic count up and one down (~8 ns each here), and a message frame
/// had two more of them than it needs.
pub(crate) fn checked_body<const N: usize>(
    pre: &Preamble,
    mut whole: Bytes,
) -> Result<([Bytes; N], CrcMemo), FrameError> {
    let count = usize::from(pre.segment_count);
    if count > N {
        return Err(FrameError::TooManySegments(pre.segment_count));
    }
    if whole.len() as u64 != pre.frame_len() {
        return Err(FrameError::Truncated {
            have: whole.len(),
            need: pre.frame_len() as usize,
        });
    }
    // The preamble's lengths add up to this (unused ones are 0).
    let segments_len = whole.len() - PREAMBLE_LEN - 4 * count;
    whole.advance(PREAMBLE_LEN);
    let mut words = [0u8; 4 * MAX_SEGMENTS];
    words[..4 * count].copy_from_slice(&whole[segments_len..]);
    whole.truncate(segments_len);
    let mut segments: [Bytes; N] = std::array::from_fn(|_| Bytes::new());
    for (seg, len) in segments.iter_mut().zip(&pre.segment_lens[..count]) {
        // The last split takes all that is left, without sharing.
        *seg = whole.split_to(*len as usize);
    }
    let checked = checked_segments(pre.flags);
    let mut crc_memo = CrcMemo::NONE;
    let mut words = &words[..4 * count];
    for (i, seg) in segments.iter().enumerate().take(count) {
        let wire = words.get_u32_le();
        let actual = if i < checked { segment_crc(seg) } else { 0 };
        if wire != actual {
            return Err(FrameError::SegmentCrc {
                index: i,
                expected: wire,
                actual,
            });
        }
        if i < checked && seg.len() >= CRC_MEMO_MIN {
            // Kept for one segment: a message's data is its only large one.
            crc_memo = CrcMemo::new(i, seg, actual);
        }
    }
    Ok((segments, crc_memo))
}

/// A frame ready for a vectored write: preamble, segments, epilogue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EncodedFrame {
    /// The encoded preamble.
    pub preamble: [u8; PREAMBLE_LEN],
    /// The segments, shared with the [`Frame`].
    pub segments: Segments,
    epilogue: [u8; 4 * MAX_SEGMENTS],
    epilogue_len: usize,
}

impl EncodedFrame {
    /// The epilogue bytes (one CRC32C per segment).
    pub fn epilogue(&self) -> &[u8] {
        &self.epilogue[..self.epilogue_len]
    }

    /// Total length on the wire.
    pub fn len(&self) -> usize {
        PREAMBLE_LEN + self.segments.iter().map(Bytes::len).sum::<usize>() + self.epilogue_len
    }

    /// Always false: a frame has at least its preamble.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The frame's bytes in wire order, in the pieces they lie in:
    /// preamble, each segment, epilogue.
    pub fn parts(&self) -> impl Iterator<Item = &[u8]> {
        std::iter::once(&self.preamble[..])
            .chain(self.segments.iter().map(|s| &s[..]))
            .chain(std::iter::once(self.epilogue()))
    }

    /// Appends the whole frame to `out` (copying the segments).
    pub fn write_into(&self, out: &mut impl BufMut) {
        for p in self.parts() {
            out.put_slice(p);
        }
    }
}

/// Incremental decoder for byte-stream transports.
///
/// Feed it a buffer that grows as bytes arrive; it returns whole frames and
/// leaves partial ones in place. Limits are checked on the preamble, so a frame
/// claiming 4 GiB is refused before a byte of it is buffered.
#[derive(Debug)]
pub struct FrameDecoder {
    limits: FrameLimits,
    pending: Option<Preamble>,
}

impl FrameDecoder {
    /// A decoder enforcing `limits`.
    pub fn new(limits: FrameLimits) -> Self {
        FrameDecoder {
            limits,
            pending: None,
        }
    }

    /// How many bytes the buffer must hold before the next call can make
    /// progress (at least the preamble; the whole frame once it is known).
    pub fn needed(&self) -> usize {
        match &self.pending {
            None => PREAMBLE_LEN,
            // Bounded by the limits checked in Preamble::decode.
            Some(p) => p.frame_len() as usize,
        }
    }

    /// Takes one frame off the front of `buf` if it is complete.
    ///
    /// `Ok(None)` means "need more bytes" ([`FrameDecoder::needed`] says how
    /// many). After an error the stream is unusable: close the connection.
    ///
    /// The frame is split off the front even when it is all `buf` holds, so
    /// `buf` keeps its allocation: once the frame drops, the next read
    /// reuses it in place (handing the whole buffer over instead cost a
    /// fresh buffer and its reallocation on every read of a ping-pong).
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
        self.next_frame(buf, split_off_front, frame_body)
    }

    /// As [`FrameDecoder::decode`], with the frame's bytes turned into
    /// [`Bytes`] by `freeze`: for a buffer that should go back to a pool of
    /// the caller's when the frame's last segment drops. Where the frame
    /// fills `buf`, `freeze` gets `buf` itself (not a view split off it), so
    /// a buffer built from a `Vec` converts back into it without a copy.
    pub fn decode_with(
        &mut self,
        buf: &mut BytesMut,
        freeze: impl FnOnce(BytesMut) -> Bytes,
    ) -> Result<Option<Frame>, FrameError> {
        self.next_frame(buf, handing_over(freeze), frame_body)
    }

    /// Checks the preamble once, waits for the whole frame, then lets `cut`
    /// take its `total` bytes off the front of `buf` and `body` decode them.
    pub(crate) fn next_frame<T>(
        &mut self,
        buf: &mut BytesMut,
        cut: impl FnOnce(&mut BytesMut, usize) -> Bytes,
        body: impl FnOnce(&Preamble, Bytes) -> Result<T, FrameError>,
    ) -> Result<Option<T>, FrameError> {
        let pre = match self.pending {
            Some(p) => p,
            None => {
                let Some(raw) = buf.first_chunk::<PREAMBLE_LEN>() else {
                    return Ok(None);
                };
                let p = Preamble::decode(raw, &self.limits)?;
                self.pending = Some(p);
                p
            }
        };
        let total = pre.frame_len() as usize;
        if buf.len() < total {
            return Ok(None);
        }
        self.pending = None;
        body(&pre, cut(buf, total)).map(Some)
    }
}

/// A frame's `total` bytes split off the front of `buf`, even when they
/// are all it holds: `buf` keeps its allocation (see [`FrameDecoder::decode`]).
pub(crate) fn split_off_front(buf: &mut BytesMut, total: usize) -> Bytes {
    buf.split_to(total).freeze()
}

/// A frame's `total` bytes taken off the front of `buf` and frozen by
/// `freeze`, which gets `buf` itself where the frame fills it (see
/// [`FrameDecoder::decode_with`]).
pub(crate) fn handing_over(
    freeze: impl FnOnce(BytesMut) -> Bytes,
) -> impl FnOnce(&mut BytesMut, usize) -> Bytes {
    move |buf, total| {
        if buf.len() == total {
            freeze(std::mem::take(buf))
        } else {
            freeze(buf.split_to(total))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A frame that fills the buffer reaches `freeze` as that very buffer
    /// (so a pooled buffer can travel with it); one followed by more bytes
    /// as a view split off, leaving the rest in place.
    #[test]
    fn decode_with_hands_over_a_buffer_the_frame_fills() {
        let f = Frame::new(
            Tag::Message,
            [Bytes::from_static(b"hdr"), Bytes::from(vec![5u8; 1000])],
        );
        let wire = f.encode_to_vec().unwrap();
        let mut buf = BytesMut::with_capacity(wire.len());
        buf.extend_from_slice(&wire);
        let start = buf.as_ptr();
        let mut dec = FrameDecoder::new(FrameLimits::default());
        let mut seen = None;
        let got = dec
            .decode_with(&mut buf, |b| {
                seen = Some((b.as_ptr(), b.capacity()));
                b.freeze()
            })
            .unwrap();
        assert_eq!(got, Some(f.clone()));
        assert_eq!(seen, Some((start, wire.len())));
        assert!(buf.is_empty());

        let mut two = BytesMut::new();
        two.extend_from_slice(&wire);
        two.extend_from_slice(&wire);
        let mut lens = Vec::new();
        let first = dec.decode_with(&mut two, |b| {
            lens.push(b.len());
            b.freeze()
        });
        assert_eq!(first.unwrap(), Some(f));
        assert_eq!((lens, two.len()), (vec![wire.len()], wire.len()));
    }

    /// Plain `decode` splits even a frame that fills the buffer off it: the
    /// buffer keeps the rest of its allocation and, once the frame drops,
    /// takes the next read in the same memory without allocating.
    #[test]
    fn decode_leaves_the_buffer_its_allocation() {
        let wire = sample().encode_to_vec().unwrap();
        let mut buf = BytesMut::with_capacity(4 * wire.len());
        buf.extend_from_slice(&wire);
        let start = buf.as_ptr();
        let mut dec = FrameDecoder::new(FrameLimits::default());
        let frame = dec.decode(&mut buf).unwrap().expect("a whole frame");
        assert!(buf.is_empty());
        assert_eq!(buf.capacity(), 3 * wire.len());
        drop(frame);
        buf.reserve(4 * wire.len());
        assert_eq!(buf.as_ptr(), start, "the next read reuses the buffer");
    }

    /// Frames, and the units carrying them, move by inline stores rather
    /// than `memcpy` calls (see [`Segments`]).
    #[test]
    fn a_frame_moves_without_a_memcpy_call() {
        use std::mem::size_of;
        for (what, size) in [
            ("Frame", size_of::<Frame>()),
            ("Inbound", size_of::<crate::Inbound>()),
            ("Transmit", size_of::<crate::Transmit>()),
            ("Message", size_of::<crate::Message>()),
        ] {
            assert!(size <= 128, "{what} is {size} bytes");
        }
    }

    #[test]
    fn an_empty_segment_has_the_crc_of_no_bytes() {
        assert_eq!(segment_crc(&[]), crc32c::crc32c(&[]));
        assert_eq!(segment_crc(b"x"), crc32c::crc32c(b"x"));
    }

    /// A frame with a small header and a data segment of `len` bytes.
    fn with_data(len: usize) -> Frame {
        Frame::new(
            Tag::Message,
            [Bytes::from_static(b"hdr"), Bytes::from(vec![9u8; len])],
        )
    }

    #[test]
    fn a_received_large_segment_keeps_its_checked_crc() {
        let limits = FrameLimits::default();
        let big = with_data(CRC_MEMO_MIN);
        let want = crate::checksum::crc32c(&big.segments[1]);
        let wire = big.encode_to_vec().unwrap();
        let exact = Frame::decode_exact(Bytes::from(wire.clone()), &limits).unwrap();
        assert_eq!(exact.known_crc(1), Some(want));
        assert_eq!(exact.known_crc(0), None, "small segments are not kept");
        let mut buf = BytesMut::from(&wire[..]);
        let streamed = FrameDecoder::new(limits).decode(&mut buf).unwrap().unwrap();
        assert_eq!(streamed.known_crc(1), Some(want));
        let small = with_data(CRC_MEMO_MIN - 1).encode_to_vec().unwrap();
        let small = Frame::decode_exact(Bytes::from(small), &limits).unwrap();
        assert_eq!(small.known_crc(1), None);
    }

    /// The epilogue takes a remembered CRC without reading the segment:
    /// a wrong one goes out as it is, and the receiver catches it.
    #[test]
    fn a_remembered_crc_goes_in_the_epilogue_as_it_is() {
        let mut f = with_data(100);
        let right = crate::checksum::crc32c(&f.segments[1]);
        f.crc_memo = CrcMemo::new(1, &f.segments[1], right ^ 1);
        let (words, _) = f.epilogue_bytes();
        assert_eq!(words[4..8], (right ^ 1).to_le_bytes());
        let wire = Bytes::from(f.encode_to_vec().unwrap());
        assert!(matches!(
            Frame::decode_exact(wire, &FrameLimits::default()),
            Err(FrameError::SegmentCrc { index: 1, .. })
        ));
    }

    /// A memo vouches for the bytes it was made for only: a segment put in
    /// their place (same length, other memory) or another index is read.
    #[test]
    fn a_memo_for_other_bytes_is_not_taken() {
        let mut f = with_data(CRC_MEMO_MIN).with_segment_checksum(1);
        assert!(f.known_crc(1).is_some());
        f.segments[1] = Bytes::from(vec![3u8; CRC_MEMO_MIN]);
        assert_eq!(f.known_crc(1), None);
        let (words, _) = f.epilogue_bytes();
        assert_eq!(
            words[4..8],
            crate::checksum::crc32c(&f.segments[1]).to_le_bytes()
        );
        let moved = with_data(CRC_MEMO_MIN).with_segment_checksum(1);
        let mut f = Frame::new(Tag::Message, [moved.segments[1].clone()]);
        f.crc_memo = moved.crc_memo.clone();
        assert_eq!(f.known_crc(0), None, "the memo names segment 1");
        assert_eq!(with_data(10).with_segment_checksum(5).known_crc(5), None);
    }

    fn sample() -> Frame {
        Frame::new(
            Tag::Message,
            vec![
                Bytes::from_static(b"hdr"),
                Bytes::new(),
                Bytes::from(vec![7u8; 1000]),
            ],
        )
    }

    #[test]
    fn round_trip_via_stream_decoder() {
        let f = sample();
        let enc = f.encode_to_vec().unwrap();
        assert_eq!(enc.len(), f.encoded_len());
        let mut dec = FrameDecoder::new(FrameLimits::default());
        let mut buf = BytesMut::new();
        for (i, b) in enc.iter().enumerate() {
            buf.put_u8(*b);
            let got = dec.decode(&mut buf).unwrap();
            if i + 1 < enc.len() {
                assert!(got.is_none(), "frame returned early at byte {i}");
            } else {
                assert_eq!(got, Some(f.clone()));
            }
        }
        assert!(buf.is_empty());
    }

    #[test]
    fn huge_claimed_length_is_refused_before_buffering() {
        let mut pre = sample().preamble().unwrap();
        pre.segment_lens[2] = u32::MAX;
        let raw = pre.encode();
        let mut dec = FrameDecoder::new(FrameLimits::default());
        let mut buf = BytesMut::from(&raw[..]);
        assert!(matches!(
            dec.decode(&mut buf),
            Err(FrameError::SegmentTooLarge { index: 2, .. })
        ));
    }

    #[test]
    fn corrupted_segment_is_caught() {
        let mut enc = sample().encode_to_vec().unwrap();
        enc[PREAMBLE_LEN + 5] ^= 0x10;
        let r = Frame::decode_exact(Bytes::from(enc), &FrameLimits::default());
        assert!(
            matches!(r, Err(FrameError::SegmentCrc { index: 2, .. })),
            "{r:?}"
        );
    }

    #[test]
    fn unchecked_payload_skips_all_but_the_first_segment() {
        let mut f = sample();
        f.flags = FLAG_UNCHECKED_PAYLOAD;
        let enc = f.encode_to_vec().unwrap();
        let epilogue = &enc[enc.len() - 12..];
        assert_eq!(epilogue[..4], crc32c::crc32c(b"hdr").to_le_bytes());
        assert_eq!(epilogue[4..], [0u8; 8], "payload segments carry no CRC");
        let limits = FrameLimits::default();
        assert_eq!(
            Frame::decode_exact(Bytes::from(enc.clone()), &limits),
            Ok(f)
        );

        // A flipped payload bit passes (that is the point of the flag) ...
        let mut payload_hit = enc.clone();
        payload_hit[PREAMBLE_LEN + 5] ^= 0x10;
        let got = Frame::decode_exact(Bytes::from(payload_hit), &limits).unwrap();
        assert_eq!(got.segments[2][2], 7 ^ 0x10);
        // ... one in the header segment does not ...
        let mut header_hit = enc.clone();
        header_hit[PREAMBLE_LEN] ^= 1;
        let r = Frame::decode_exact(Bytes::from(header_hit), &limits);
        assert!(
            matches!(r, Err(FrameError::SegmentCrc { index: 0, .. })),
            "{r:?}"
        );
        // ... nor a nonzero epilogue word where no CRC is expected ...
        let mut stray = enc.clone();
        let at = stray.len() - 1;
        stray[at] = 1;
        let r = Frame::decode_exact(Bytes::from(stray), &limits);
        assert!(
            matches!(
                r,
                Err(FrameError::SegmentCrc {
                    index: 2,
                    actual: 0,
                    ..
                })
            ),
            "{r:?}"
        );
        // ... nor clearing the flag, which the preamble's CRC covers.
        let mut unflagged = enc;
        unflagged[1] = 0;
        let r = Frame::decode_exact(Bytes::from(unflagged), &limits);
        assert!(matches!(r, Err(FrameError::PreambleCrc { .. })), "{r:?}");
    }

    #[test]
    fn corrupted_preamble_is_caught() {
        let mut enc = sample().encode_to_vec().unwrap();
        enc[4] ^= 1;
        let r = Frame::decode_exact(Bytes::from(enc), &FrameLimits::default());
        assert!(matches!(r, Err(FrameError::PreambleCrc { .. })), "{r:?}");
    }

    #[test]
    fn exact_decode_rejects_trailing_and_truncated() {
        let mut enc = sample().encode_to_vec().unwrap();
        enc.push(0);
        let r = Frame::decode_exact(Bytes::from(enc.clone()), &FrameLimits::default());
        assert_eq!(r, Err(FrameError::TrailingBytes(1)));
        enc.truncate(enc.len() - 3);
        let r = Frame::decode_exact(Bytes::from(enc), &FrameLimits::default());
        assert!(matches!(r, Err(FrameError::Truncated { .. })), "{r:?}");
    }
}
