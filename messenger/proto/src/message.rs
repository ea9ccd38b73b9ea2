//! Application messages and their frame encoding.
//!
//! A message is a small fixed header plus two byte segments: `front` (typically
//! the encoded typed payload) and `data` (bulk bytes that RDMA transports may move
//! by rendezvous). On the wire it is a [`Tag::Message`] frame whose segments are
//! the 32-byte header, front and data.

use bytes::Bytes;
use serde::{de::DeserializeOwned, Serialize};

use crate::arena::ByteArena;
use crate::checksum::CrcMemo;
use crate::codec::{Codec, CodecError, Postcard};
use crate::error::ProtocolError;
use crate::frame::{Frame, Tag};

/// Length of the encoded message header segment.
pub const MESSAGE_HEADER_LEN: usize = 32;
/// Bytes of each chunk of the arena [`Message::to_frame_in`] copies headers into.
pub const HEADER_ARENA: usize = 4096;

/// An application message.
///
/// Build one from raw segments with [`Message::new`] or from a typed value with
/// [`Message::encode`]; read a typed value back with [`Message::decode`].
///
/// ```
/// use msgr_proto::Message;
/// #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
/// struct Ping { n: u32 }
/// let m = Message::encode(7, &Ping { n: 3 }).unwrap();
/// assert_eq!(m.msg_type, 7);
/// assert_eq!(m.decode::<Ping>().unwrap(), Ping { n: 3 });
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Message {
    /// Application-defined message type.
    pub msg_type: u16,
    /// Priority (higher first where a backend has priority queues; otherwise informative).
    pub priority: u8,
    /// Application-defined flags.
    pub flags: u8,
    /// The front segment: small, typically the encoded payload.
    pub front: Bytes,
    /// The data segment: bulk bytes.
    pub data: Bytes,
    /// Sequence number in its session, assigned when sent (0 until then).
    pub seq: u64,
    /// The CRC32C of `data`, if known already: sealed
    /// ([`Message::with_data_checksum`]) or checked on receipt.
    data_crc: CrcMemo,
}

/// The index of a message frame's data segment (after header and front).
const DATA_SEGMENT: usize = 2;

impl Message {
    /// A message with the given type and segments.
    pub fn new(msg_type: u16, front: impl Into<Bytes>, data: impl Into<Bytes>) -> Message {
        Message {
            msg_type,
            front: front.into(),
            data: data.into(),
            ..Message::default()
        }
    }

    /// A message whose front segment is `value` encoded with the default codec (postcard).
    pub fn encode<T: Serialize>(msg_type: u16, value: &T) -> Result<Message, CodecError> {
        Message::encode_with(&Postcard, msg_type, value)
    }

    /// Like [`Message::encode`] with a chosen codec.
    pub fn encode_with<C: Codec, T: Serialize>(
        codec: &C,
        msg_type: u16,
        value: &T,
    ) -> Result<Message, CodecError> {
        Ok(Message::new(msg_type, codec.encode(value)?, Bytes::new()))
    }

    /// Decodes the front segment with the default codec (postcard).
    pub fn decode<T: DeserializeOwned>(&self) -> Result<T, CodecError> {
        self.decode_with(&Postcard)
    }

    /// Like [`Message::decode`] with a chosen codec.
    pub fn decode_with<C: Codec, T: DeserializeOwned>(&self, codec: &C) -> Result<T, CodecError> {
        codec.decode(&self.front)
    }

    /// This message with the CRC32C of its data computed now and kept:
    /// each send of it or of its clones — to several peers, again after a
    /// reconnect's replay — puts that checksum in the frame's epilogue
    /// instead of reading the data again. Use it for a payload sent more
    /// than once; a message as received already knows its data's checksum
    /// (checked on the way in, for data of [`crate::frame::CRC_MEMO_MIN`]
    /// bytes or more), so forwarding it unchanged costs no second pass.
    ///
    /// Data shorter than [`crate::frame::CRC_MEMO_MIN`] keeps no checksum:
    /// reading it again costs less than carrying the memo, whose shared
    /// handle every clone and every frame of the message would count up
    /// and down (~14 ns of a 64 B message's turn-around, measured).
    ///
    /// The checksum vouches for the bytes `data` holds now: replacing
    /// `data` later drops it (the next send computes one again). Memory
    /// that changes under a [`Bytes`] (an owner that is not immutable,
    /// e.g. a shared file mapping) must not be sealed: the peer would find
    /// the data corrupt, and every resend of it would fail the same way.
    ///
    /// ```
    /// use msgr_proto::Message;
    ///
    /// let m = Message::new(1, &b""[..], vec![7u8; 1 << 20]).with_data_checksum();
    /// assert_eq!(m.data_checksum(), Some(msgr_proto::checksum::crc32c(&m.data)));
    /// let mut other = m.clone();
    /// other.data = vec![8u8; 16].into();
    /// assert_eq!(other.data_checksum(), None);
    /// let small = Message::new(1, &b""[..], vec![7u8; 64]).with_data_checksum();
    /// assert_eq!(small.data_checksum(), None, "read again: cheaper than the memo");
    /// ```
    pub fn with_data_checksum(mut self) -> Message {
        self.data_crc = CrcMemo::sealed(DATA_SEGMENT, &self.data);
        self
    }

    /// The CRC32C of `data` if it is known without reading it: sealed by
    /// [`Message::with_data_checksum`], or checked when the message was
    /// received.
    pub fn data_checksum(&self) -> Option<u32> {
        self.data_crc.get(DATA_SEGMENT, &self.data)
    }

    /// Bytes of payload (front + data), the unit throttles count.
    pub fn payload_len(&self) -> usize {
        self.front.len() + self.data.len()
    }

    /// Encodes the message as a frame, piggybacking `ack_seq`.
    pub fn to_frame(&self, ack_seq: u64) -> Frame {
        self.to_frame_in(ack_seq, &mut ByteArena::new(0))
    }

    /// [`Message::to_frame`], copying the header segment into `headers`,
    /// an arena the caller keeps from frame to frame (of [`HEADER_ARENA`]
    /// bytes: one allocation serves 128 headers instead of one each).
    pub fn to_frame_in(&self, ack_seq: u64, headers: &mut ByteArena) -> Frame {
        let mut h = [0u8; MESSAGE_HEADER_LEN];
        h[0..2].copy_from_slice(&self.msg_type.to_le_bytes());
        h[2] = self.priority;
        h[3] = self.flags;
        h[8..16].copy_from_slice(&self.seq.to_le_bytes());
        h[16..24].copy_from_slice(&ack_seq.to_le_bytes());
        Frame {
            tag: Tag::Message,
            flags: 0,
            // In place: collecting an array of segments through an iterator
            // moved each twice more.
            segments: crate::frame::Segments::from_buf([
                headers.copy(&h),
                self.front.clone(),
                self.data.clone(),
            ]),
            crc_memo: self.data_crc.clone(),
        }
    }

    /// Decodes a [`Tag::Message`] frame into the message and its piggybacked ack.
    pub fn from_frame(frame: Frame) -> Result<(Message, u64), ProtocolError> {
        let malformed = |detail: &str| ProtocolError::Malformed {
            what: "message frame",
            detail: detail.to_string(),
        };
        if frame.tag != Tag::Message {
            return Err(malformed("not a message frame"));
        }
        let data_crc = frame.crc_memo;
        let mut segs = frame.segments.into_iter();
        let (Some(h), Some(front), Some(data), None) =
            (segs.next(), segs.next(), segs.next(), segs.next())
        else {
            return Err(malformed("expected 3 segments"));
        };
        if h.len() != MESSAGE_HEADER_LEN {
            return Err(malformed("header segment is not 32 bytes"));
        }
        let u64_at = |o: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&h[o..o + 8]);
            u64::from_le_bytes(b)
        };
        let msg = Message {
            msg_type: u16::from_le_bytes([h[0], h[1]]),
            priority: h[2],
            flags: h[3],
            seq: u64_at(8),
            front,
            data,
            data_crc,
        };
        Ok((msg, u64_at(16)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::CRC_MEMO_MIN;
    use crate::FrameLimits;

    #[test]
    fn frame_round_trip() {
        let mut m = Message::new(9, &b"front"[..], vec![1u8; 100]);
        m.seq = 42;
        m.priority = 3;
        let (back, ack) = Message::from_frame(m.to_frame(17)).unwrap();
        assert_eq!(back, m);
        assert_eq!(ack, 17);
    }

    #[test]
    fn a_sealed_message_carries_its_checksum_there_and_back() {
        let m = Message::new(9, &b"front"[..], vec![1u8; CRC_MEMO_MIN]).with_data_checksum();
        let crc = crate::checksum::crc32c(&m.data);
        assert_eq!(m.data_checksum(), Some(crc));
        let f = m.to_frame(3);
        assert_eq!(f.known_crc(DATA_SEGMENT), Some(crc));
        let wire = Bytes::from(f.encode_to_vec().unwrap());
        let (back, _) =
            Message::from_frame(Frame::decode_exact(wire, &FrameLimits::default()).unwrap())
                .unwrap();
        assert_eq!(back.data_checksum(), Some(crc), "checked on the way in");
        assert_eq!(back, m, "the checksum is not part of the value");
        assert_eq!(back.clone().data_checksum(), Some(crc));
        // Unsealed and below the size a receiver keeps: read every time.
        let small = Message::new(9, Bytes::new(), vec![1u8; 100]);
        assert_eq!(small.data_checksum(), None);
        let wire = Bytes::from(small.to_frame(0).encode_to_vec().unwrap());
        let f = Frame::decode_exact(wire, &FrameLimits::default()).unwrap();
        assert_eq!(Message::from_frame(f).unwrap().0.data_checksum(), None);
    }

    /// Headers cut from one reused buffer, across several refills, each
    /// stay the header of their own frame.
    #[test]
    fn headers_from_a_shared_buffer_stay_apart() {
        let mut headers = ByteArena::new(HEADER_ARENA);
        let n = 3 * HEADER_ARENA / MESSAGE_HEADER_LEN + 5;
        let frames: Vec<(Message, Frame)> = (0..n as u64)
            .map(|seq| {
                let mut m = Message::new(seq as u16, Bytes::new(), vec![seq as u8; 3]);
                m.seq = seq;
                let f = m.to_frame_in(seq + 1, &mut headers);
                (m, f)
            })
            .collect();
        for (m, f) in frames {
            assert_eq!(f.segments[0].len(), MESSAGE_HEADER_LEN);
            let (back, ack) = Message::from_frame(f).unwrap();
            assert_eq!(back, m);
            assert_eq!(ack, m.seq + 1);
        }
    }

    #[test]
    fn wrong_shapes_are_errors() {
        let f = Frame::new(Tag::Message, vec![Bytes::from_static(b"short")]);
        assert!(Message::from_frame(f).is_err());
        let f = Frame::new(
            Tag::Message,
            vec![Bytes::from_static(b"short"), Bytes::new(), Bytes::new()],
        );
        assert!(Message::from_frame(f).is_err());
    }
}
