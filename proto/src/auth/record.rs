//! The secure mode's record layer: every frame after the handshake sealed
//! with AES-256-GCM (ring), one key per direction per link.
//!
//! A sealed frame is a `Tag::Sealed` frame whose segments mirror the
//! inner frame's: segment 0 seals the inner preamble (tag, flags, segment
//! lengths) with the inner segment 0; each further non-empty segment is
//! sealed on its own (an empty one stays empty: the sealed preamble says
//! it is). A large data segment thus stays a segment of its own, so the
//! RDMA transports still move it by rendezvous — as ciphertext, sealed
//! before it is registered. Each sealed piece carries a 16-byte tag.
//!
//! Nonces: 4 zero bytes and a 64-bit counter of pieces sealed under the
//! current key, little-endian. Keys come fresh from each link's handshake
//! (a reconnect's new link has new keys, so no nonce repeats across
//! reconnects), and both directions move to a new key after
//! [`REKEY_AFTER_BYTES`] or [`REKEY_AFTER_PIECES`], whichever comes first:
//! `next = HKDF-SHA256(ikm = current, info = "msgr rekey v1")`. Both ends
//! count the same pieces, so no message announces it.
//!
//! The outer frame's segment CRCs after the first are not computed
//! (`FLAG_UNCHECKED_PAYLOAD`): the AEAD tag checks every byte.
//!
//! Copies: a piece is sealed in a buffer of this layer's pool (the
//! session keeps the plaintext for replay); a received piece is opened
//! where it lies when the frame alone holds its buffer, and otherwise
//! copied into a pool buffer first (a transport's shared or pooled receive
//! buffer is not ours to write).

use bytes::Bytes;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use zeroize::Zeroizing;

use super::handshake::LinkKeys;
use super::keys::KEY_LEN;
use crate::frame::{
    Frame, FrameLimits, Preamble, Segments, Tag, FLAG_UNCHECKED_PAYLOAD, PREAMBLE_LEN, SEAL_TAG_LEN,
};
use crate::pool::BufferPool;
use crate::stream::{Inbound, Transmit};

/// A key is replaced after sealing this many plaintext bytes (1 GiB).
pub const REKEY_AFTER_BYTES: u64 = 1 << 30;
/// ...or this many pieces (2^24), whichever comes first.
pub const REKEY_AFTER_PIECES: u64 = 1 << 24;

/// A sealed frame that does not open.
#[derive(Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RecordError {
    /// A frame arrived in the clear on a link in secure mode.
    #[error("a {0:?} frame in the clear on a secure link")]
    Plaintext(Tag),
    /// A sealed piece is shorter than its tag, or its segments do not
    /// match the lengths its sealed preamble states.
    #[error("sealed frame malformed: {0}")]
    Malformed(&'static str),
    /// A piece failed authentication: altered, truncated, replayed,
    /// reordered, or sealed under another key.
    #[error("sealed frame failed authentication")]
    Decrypt,
    /// The frame inside does not decode.
    #[error("the sealed frame's inner frame: {0}")]
    Inner(crate::error::FrameError),
}

msgr_addr::debug_is_display!(RecordError);

/// When keys are replaced. The protocol's values are
/// [`RekeyPolicy::PROTOCOL`]; tests use small ones to exercise rekeying.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RekeyPolicy {
    /// Plaintext bytes under one key.
    pub bytes: u64,
    /// Pieces under one key.
    pub pieces: u64,
}

impl RekeyPolicy {
    /// What every msgr peer uses.
    pub const PROTOCOL: RekeyPolicy = RekeyPolicy {
        bytes: REKEY_AFTER_BYTES,
        pieces: REKEY_AFTER_PIECES,
    };
}

/// One direction's key, its raw secret (for the next rekey) and counters.
struct DirectionKey {
    secret: Zeroizing<[u8; KEY_LEN]>,
    key: LessSafeKey,
    /// Pieces under this key: the next nonce.
    counter: u64,
    bytes: u64,
    /// Keys used so far in this direction (1 = the handshake's).
    generation: u64,
    policy: RekeyPolicy,
}

impl DirectionKey {
    fn new(secret: &[u8; KEY_LEN], policy: RekeyPolicy) -> DirectionKey {
        DirectionKey {
            secret: Zeroizing::new(*secret),
            key: aead_key(secret),
            counter: 0,
            bytes: 0,
            generation: 1,
            policy,
        }
    }

    /// The nonce for the next piece; moves the counters, and the key when
    /// the policy says so (after the piece).
    fn next(&mut self, len: usize) -> (Nonce, bool) {
        let mut n = [0u8; NONCE_LEN];
        n[4..].copy_from_slice(&self.counter.to_le_bytes());
        self.counter += 1;
        self.bytes += len as u64;
        let rekey = self.counter >= self.policy.pieces || self.bytes >= self.policy.bytes;
        (Nonce::assume_unique_for_key(n), rekey)
    }

    fn rekey(&mut self) {
        let prk = ring::hkdf::Salt::new(ring::hkdf::HKDF_SHA256, &[]).extract(&self.secret[..]);
        let okm = prk
            .expand(&[b"msgr rekey v1"], ring::hkdf::HKDF_SHA256)
            .expect("32 bytes is a valid HKDF-SHA256 length");
        let mut next = Zeroizing::new([0u8; KEY_LEN]);
        okm.fill(&mut next[..]).expect("32 bytes");
        self.key = aead_key(&next);
        self.secret = next;
        self.counter = 0;
        self.bytes = 0;
        self.generation += 1;
    }

    /// Seals `plain` in place and appends its tag.
    fn seal(&mut self, plain: &mut Vec<u8>) {
        let (nonce, rekey) = self.next(plain.len());
        let tag = self
            .key
            .seal_in_place_separate_tag(nonce, Aad::empty(), plain)
            .expect("pieces are far below AES-GCM's length limit");
        plain.extend_from_slice(tag.as_ref());
        if rekey {
            self.rekey();
        }
    }

    /// Opens `sealed` in place; the plaintext is its first `len - 16`
    /// bytes (returned).
    fn open(&mut self, sealed: &mut [u8]) -> Result<usize, RecordError> {
        if sealed.len() < SEAL_TAG_LEN {
            return Err(RecordError::Malformed("a piece shorter than its tag"));
        }
        let (nonce, rekey) = self.next(sealed.len() - SEAL_TAG_LEN);
        let n = self
            .key
            .open_in_place(nonce, Aad::empty(), sealed)
            .map_err(|_| RecordError::Decrypt)?
            .len();
        if rekey {
            self.rekey();
        }
        Ok(n)
    }
}

fn aead_key(secret: &[u8; KEY_LEN]) -> LessSafeKey {
    LessSafeKey::new(UnboundKey::new(&AES_256_GCM, secret).expect("a 32-byte AES-256 key"))
}

/// Seals what one side of a link sends and opens what it receives. See
/// the [module docs](self).
pub struct RecordLayer {
    send: DirectionKey,
    recv: DirectionKey,
    pool: BufferPool,
}

impl std::fmt::Debug for RecordLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordLayer")
            .field("sent_pieces", &self.send.counter)
            .field("send_generation", &self.send.generation)
            .field("received_pieces", &self.recv.counter)
            .field("recv_generation", &self.recv.generation)
            .finish_non_exhaustive()
    }
}

impl RecordLayer {
    /// The record layer of a link whose handshake gave `keys`.
    pub fn new(keys: &LinkKeys) -> RecordLayer {
        RecordLayer::with_policy(keys, RekeyPolicy::PROTOCOL)
    }

    /// As [`RecordLayer::new`] with another rekey policy (tests; both
    /// ends must use the same).
    pub fn with_policy(keys: &LinkKeys, policy: RekeyPolicy) -> RecordLayer {
        RecordLayer {
            send: DirectionKey::new(&keys.send, policy),
            recv: DirectionKey::new(&keys.recv, policy),
            pool: BufferPool::default(),
        }
    }

    /// Keys used so far in each direction (sending, receiving): 1 until the
    /// first rekey.
    pub fn generations(&self) -> (u64, u64) {
        (self.send.generation, self.recv.generation)
    }

    /// Seals one unit (not a banner: those go before the handshake).
    pub fn seal(&mut self, unit: Transmit) -> Frame {
        let inner = match unit.into_frame() {
            Ok(f) => f,
            Err(banner) => {
                debug_assert!(false, "banners are never sealed");
                Frame::single(Tag::Sealed, Bytes::copy_from_slice(&banner))
            }
        };
        // A frame the session built always has a valid preamble.
        let pre = inner
            .preamble()
            .expect("a frame the session built has a valid preamble");
        let mut segments = Segments::default();
        for (i, seg) in inner.segments.iter().enumerate() {
            if i > 0 && seg.is_empty() {
                segments.push(Bytes::new());
                continue;
            }
            let extra = if i == 0 { PREAMBLE_LEN } else { 0 };
            let mut buf = self.pool.take(extra + seg.len() + SEAL_TAG_LEN);
            if i == 0 {
                buf.extend_from_slice(&pre.encode());
            }
            buf.extend_from_slice(seg);
            self.send.seal(&mut buf);
            segments.push(self.pool.share(buf));
        }
        if inner.segments.is_empty() {
            let mut buf = Vec::with_capacity(PREAMBLE_LEN + SEAL_TAG_LEN);
            buf.extend_from_slice(&pre.encode());
            self.send.seal(&mut buf);
            segments.push(Bytes::from(buf));
        }
        let mut frame = Frame::new(Tag::Sealed, segments);
        frame.flags = FLAG_UNCHECKED_PAYLOAD;
        frame
    }

    /// One received piece, opened where it lies when nothing else holds
    /// its bytes (a buffer the transport handed over whole), otherwise
    /// copied into a buffer of the record layer's and opened there (the
    /// transport's receive buffer is shared, or goes back to its pool, and
    /// is not ours to write).
    fn open_piece(&mut self, sealed: Bytes) -> Result<Bytes, RecordError> {
        match sealed.try_into_mut() {
            Ok(mut own) => {
                let n = self.recv.open(&mut own)?;
                own.truncate(n);
                Ok(own.freeze())
            }
            Err(shared) => {
                let mut buf = self.pool.take(shared.len());
                buf.extend_from_slice(&shared);
                drop(shared);
                let n = self.recv.open(&mut buf)?;
                buf.truncate(n);
                Ok(self.pool.share(buf))
            }
        }
    }

    /// Opens a frame received on the link: a sealed frame gives the frame
    /// inside (checked against `limits`); anything else is refused.
    pub fn open(&mut self, frame: Frame, limits: &FrameLimits) -> Result<Inbound, RecordError> {
        if frame.tag != Tag::Sealed {
            return Err(RecordError::Plaintext(frame.tag));
        }
        let mut outer = frame.segments.into_iter();
        let Some(first) = outer.next() else {
            return Err(RecordError::Malformed("no segments"));
        };
        // Each outer piece is dropped once opened, so a later one may be
        // the only holder of a buffer the transport handed over.
        let mut head = self.open_piece(first)?;
        if head.len() < PREAMBLE_LEN {
            return Err(RecordError::Malformed("no inner preamble"));
        }
        let raw: [u8; PREAMBLE_LEN] = head[..PREAMBLE_LEN].try_into().expect("PREAMBLE_LEN bytes");
        let pre = Preamble::decode(&raw, limits).map_err(RecordError::Inner)?;
        if matches!(pre.tag, Tag::Sealed | Tag::Auth) {
            return Err(RecordError::Malformed(
                "a sealed frame inside a sealed frame",
            ));
        }
        let count = usize::from(pre.segment_count).max(1);
        let _ = head.split_to(PREAMBLE_LEN);
        let mut segments = Segments::default();
        if pre.segment_count > 0 {
            if head.len() != pre.segment_lens[0] as usize {
                return Err(RecordError::Malformed("segment 0 length"));
            }
            segments.push(head);
        } else if !head.is_empty() {
            return Err(RecordError::Malformed(
                "bytes after an empty frame's preamble",
            ));
        }
        for i in 1..count {
            let Some(seg) = outer.next() else {
                return Err(RecordError::Malformed("fewer segments than sealed"));
            };
            let want = pre.segment_lens[i] as usize;
            if want == 0 {
                if !seg.is_empty() {
                    return Err(RecordError::Malformed("an empty segment is not empty"));
                }
                segments.push(Bytes::new());
                continue;
            }
            let plain = self.open_piece(seg)?;
            if plain.len() != want {
                return Err(RecordError::Malformed("segment length"));
            }
            segments.push(plain);
        }
        if outer.next().is_some() {
            return Err(RecordError::Malformed("more segments than sealed"));
        }
        let mut inner = Frame::new(pre.tag, segments);
        inner.flags = pre.flags;
        Ok(Inbound::Frame(inner))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{Message, MessageFrame};

    fn keys() -> (LinkKeys, LinkKeys) {
        let (a, b) = ([7u8; KEY_LEN], [9u8; KEY_LEN]);
        (
            LinkKeys {
                send: Zeroizing::new(a),
                recv: Zeroizing::new(b),
            },
            LinkKeys {
                send: Zeroizing::new(b),
                recv: Zeroizing::new(a),
            },
        )
    }

    fn message(front: usize, data: usize) -> Transmit {
        Transmit::Message(MessageFrame::new(
            Message::new(3, vec![1u8; front], vec![2u8; data]),
            5,
        ))
    }

    #[test]
    fn sealed_frames_open_to_what_was_sealed() {
        let (a, b) = keys();
        let (mut tx, mut rx) = (RecordLayer::new(&a), RecordLayer::new(&b));
        for unit in [
            message(0, 0),
            message(10, 0),
            message(0, 1 << 20),
            message(5, 7),
        ] {
            let want = unit.clone().into_frame().unwrap();
            let sealed = tx.seal(unit);
            assert!(sealed.segments[0].len() >= PREAMBLE_LEN + SEAL_TAG_LEN);
            let Inbound::Frame(got) = rx.open(sealed, &FrameLimits::default()).unwrap() else {
                panic!("a frame")
            };
            assert_eq!((got.tag, got.flags), (want.tag, want.flags));
            assert_eq!(got.segments, want.segments);
        }
    }

    #[test]
    fn altered_truncated_replayed_or_clear_frames_are_refused() {
        let (a, b) = keys();
        let limits = FrameLimits::default();
        let (mut tx, mut rx) = (RecordLayer::new(&a), RecordLayer::new(&b));
        let first = tx.seal(message(4, 100));
        let second = tx.seal(message(4, 100));
        // A bit flipped in the data segment.
        let mut bad = second.clone();
        let mut data = bad.segments[2].to_vec();
        data[3] ^= 1;
        bad.segments[2] = Bytes::from(data);
        // Out of order: the second first.
        let mut rx2 = RecordLayer::new(&b);
        assert_eq!(rx2.open(second.clone(), &limits), Err(RecordError::Decrypt));
        rx.open(first.clone(), &limits).unwrap();
        assert_eq!(rx.open(bad, &limits), Err(RecordError::Decrypt));
        // Replayed.
        let mut rx3 = RecordLayer::new(&b);
        rx3.open(first.clone(), &limits).unwrap();
        assert_eq!(rx3.open(first.clone(), &limits), Err(RecordError::Decrypt));
        // Truncated: a tag cut short.
        let mut rx4 = RecordLayer::new(&b);
        let mut cut = first.clone();
        cut.segments[0] = cut.segments[0].slice(..10);
        assert!(rx4.open(cut, &limits).is_err());
        // In the clear.
        let plain = message(1, 1).into_frame().unwrap();
        assert_eq!(
            RecordLayer::new(&b).open(plain, &limits),
            Err(RecordError::Plaintext(Tag::Message))
        );
        // Sealed under the other direction's key.
        let mut wrong = RecordLayer::new(&a);
        assert_eq!(wrong.open(first, &limits), Err(RecordError::Decrypt));
    }

    /// A piece nothing else holds is opened where it lies: the plaintext
    /// is the received buffer's own bytes, not a copy. A shared one is
    /// copied first and left as it was.
    #[test]
    fn a_piece_held_only_by_the_frame_opens_in_place() {
        let (a, b) = keys();
        let (mut tx, mut rx) = (RecordLayer::new(&a), RecordLayer::new(&b));
        let want = message(3, 100_000).into_frame().unwrap();
        let mut sealed = tx.seal(message(3, 100_000));
        sealed.segments[2] = Bytes::from(sealed.segments[2].to_vec());
        let at = sealed.segments[2].as_ptr();
        let Inbound::Frame(got) = rx.open(sealed, &FrameLimits::default()).unwrap() else {
            panic!("a frame")
        };
        assert_eq!(got.segments, want.segments);
        assert_eq!(got.segments[2].as_ptr(), at, "opened in place");

        let sealed = tx.seal(message(3, 100_000));
        let kept = sealed.segments[2].clone();
        let Inbound::Frame(got) = rx.open(sealed, &FrameLimits::default()).unwrap() else {
            panic!("a frame")
        };
        assert_eq!(got.segments, want.segments);
        assert_ne!(kept[..64], want.segments[2][..64], "still sealed");
    }

    /// FNV-1a, enough to pin bytes in a test without a hash crate.
    fn fnv(bytes: &[u8]) -> u64 {
        bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
            (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
        })
    }

    /// The wire bytes of sealed frames, pinned: how records are built and
    /// opened may change, what goes on the wire may not (these values were
    /// taken from the record layer that copied each piece before sealing).
    #[test]
    fn sealed_wire_bytes_are_pinned() {
        let (a, b) = keys();
        let (mut tx, mut rx) = (RecordLayer::new(&a), RecordLayer::new(&b));
        let mut got = Vec::new();
        for unit in [message(0, 0), message(5, 7), message(3, 70_000)] {
            let want = unit.clone().into_frame().unwrap();
            let sealed = tx.seal(unit);
            let wire = sealed.encode_to_vec().unwrap();
            got.push((wire.len(), fnv(&wire)));
            let Inbound::Frame(opened) = rx.open(sealed, &FrameLimits::default()).unwrap() else {
                panic!("a frame")
            };
            assert_eq!(opened.segments, want.segments);
        }
        assert_eq!(got, PINNED);
    }

    const PINNED: [(usize, u64); 3] = [
        (124, 8954640500726492533),
        (168, 9684900014185928930),
        (70159, 8505308810170655571),
    ];

    #[test]
    fn both_ends_rekey_at_the_same_piece() {
        let (a, b) = keys();
        let policy = RekeyPolicy {
            bytes: 300,
            pieces: 5,
        };
        let (mut tx, mut rx) = (
            RecordLayer::with_policy(&a, policy),
            RecordLayer::with_policy(&b, policy),
        );
        for i in 0..50 {
            let sealed = tx.seal(message(i % 3, i * 7));
            rx.open(sealed, &FrameLimits::default()).unwrap();
        }
        assert!(tx.generations().0 > 5);
        assert_eq!(tx.generations().0, rx.generations().1);
    }
}
