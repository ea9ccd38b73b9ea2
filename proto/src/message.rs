//! Application messages and their frame encoding.
//!
//! A message is a small fixed header plus two byte segments: `front` (typically
//! the encoded typed payload) and `data` (bulk bytes that RDMA transports may move
//! by rendezvous). On the wire it is a [`Tag::Message`] frame whose segments are
//! the 32-byte header, front and data; a [`MessageFrame`] writes that frame
//! straight from the message, with no [`Frame`] in between.

use bytes::{BufMut, Bytes};
use serde::{de::DeserializeOwned, Serialize};

use crate::checksum::CrcMemo;
use crate::codec::{Codec, CodecError, Postcard, TypedError, TypedMessage};
use crate::error::{FrameError, Malformed};
use crate::frame::{checked_segments, segment_crc, Frame, Preamble, Segments, Tag};
use crate::priority::Priority;

/// Length of the encoded message header segment.
pub const MESSAGE_HEADER_LEN: usize = 32;

/// An application message.
///
/// Build one from raw segments with [`Message::new`] or from a typed value with
/// [`Message::encode`]; read a typed value back with [`Message::decode`].
///
/// ```
/// # use msgr_proto::Message;
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
    /// Request/response correlation (header bytes 24..32; see
    /// [`Message::call_id`]): 0 for a plain message; a request's call id
    /// (bit 63 clear), or `REPLY_BIT` with the id of the request a reply
    /// answers. Set by `Connection::call` and `Connection::reply`; carried
    /// only between peers that agreed `features::CALLS`.
    pub call: u64,
    /// The CRC32C of `data`, if known already: sealed
    /// ([`Message::with_data_checksum`]) or checked on receipt.
    data_crc: CrcMemo,
}

/// The index of a message frame's data segment (after header and front).
pub(crate) const DATA_SEGMENT: usize = 2;

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

    /// A message as read off the wire with its sequence number (a batch
    /// entry), built in one go.
    pub(crate) fn received(
        msg_type: u16,
        priority: u8,
        flags: u8,
        seq: u64,
        front: Bytes,
        data: Bytes,
    ) -> Message {
        Message {
            msg_type,
            priority,
            flags,
            front,
            data,
            seq,
            call: 0,
            data_crc: CrcMemo::NONE,
        }
    }

    /// Remembers the CRC32C of `data` as checked on the way in (a
    /// message put back together from fragments).
    pub(crate) fn set_data_crc(&mut self, memo: CrcMemo) {
        self.data_crc = memo;
    }

    /// The call this message belongs to: `Some((id, is_reply))` for a
    /// request or a reply, `None` for a plain message.
    ///
    /// ```
    /// # use msgr_proto::Message;
    /// let mut req = Message::new(1, &b"get"[..], &b""[..]);
    /// req.call = 7;
    /// let rep = Message::new(2, &b"value"[..], &b""[..]).replying_to(&req);
    /// assert_eq!(req.call_id(), Some((7, false)));
    /// assert_eq!(rep.call_id(), Some((7, true)));
    /// ```
    pub fn call_id(&self) -> Option<(u64, bool)> {
        match self.call & !REPLY_BIT {
            0 => None,
            id => Some((id, self.call & REPLY_BIT != 0)),
        }
    }

    /// This message as the reply to `request` (its call id, marked
    /// reply). A reply whose priority byte was left at 0 (the default)
    /// takes the request's, so it travels in the request's class
    /// ([`Message::class`]): a call made at `Interactive` is answered at
    /// `Interactive`.
    ///
    /// ```
    /// # use msgr_proto::{Message, Priority};
    /// let mut req = Message::new(1, &b"get"[..], &b""[..]).with_class(Priority::Interactive);
    /// req.call = 7;
    /// let rep = Message::new(2, &b"value"[..], &b""[..]).replying_to(&req);
    /// assert_eq!(rep.class(), Priority::Interactive);
    /// // A reply given a class of its own keeps it.
    /// let bulk = Message::new(2, &b""[..], vec![0u8; 100]).with_class(Priority::Background);
    /// assert_eq!(bulk.replying_to(&req).class(), Priority::Background);
    /// ```
    pub fn replying_to(mut self, request: &Message) -> Message {
        self.call = (request.call & !REPLY_BIT) | REPLY_BIT;
        if self.priority == 0 {
            self.priority = request.priority;
        }
        self
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

    /// A message of `value`'s [`TypedMessage::TYPE`], its front segment
    /// `value` encoded with the default codec (postcard). Read it back with
    /// [`Message::decode_typed`], which checks the type.
    pub fn typed<T: TypedMessage>(value: &T) -> Result<Message, CodecError> {
        Message::encode(T::TYPE, value)
    }

    /// Decodes the front segment as a `T` if the message is of `T`'s type:
    /// a message of another type is [`TypedError::WrongType`] (see
    /// [`TypedMessage`]).
    pub fn decode_typed<T: TypedMessage>(&self) -> Result<T, TypedError> {
        if self.msg_type != T::TYPE {
            return Err(TypedError::WrongType {
                expected: T::TYPE,
                actual: self.msg_type,
                name: std::any::type_name::<T>(),
            });
        }
        Ok(self.decode()?)
    }

    /// Decodes the front segment with the default codec (postcard),
    /// whatever the message's type (see [`Message::decode_typed`] for the
    /// checked way).
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
    /// (checked on the way in, for data of `CRC_MEMO_MIN`
    /// bytes or more), so forwarding it unchanged costs no second pass.
    ///
    /// Data shorter than `CRC_MEMO_MIN` keeps no checksum:
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
    /// # use msgr_proto::Message;
    /// let m = Message::new(1, &b""[..], vec![7u8; 1 << 20]).with_data_checksum();
    /// # use msgr_proto::checksum::crc32c;
    /// assert_eq!(m.data_checksum(), Some(crc32c(&m.data)));
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

    /// The class this message travels in: [`Priority::from_legacy`] of its
    /// priority byte (0, the default, is [`Priority::Data`]).
    pub fn class(&self) -> Priority {
        Priority::from_legacy(self.priority)
    }

    /// This message in class `class`: its priority byte set to
    /// [`Priority::to_legacy`] (a class's own byte; `Data` is 0).
    ///
    /// ```
    /// # use msgr_proto::Message;
    /// use msgr_proto::priority::Priority;
    /// let m = Message::new(1, &b"ping"[..], &b""[..]).with_class(Priority::Interactive);
    /// assert_eq!(m.class(), Priority::Interactive);
    /// assert_eq!(Message::default().with_class(Priority::Data), Message::default());
    /// ```
    pub fn with_class(mut self, class: Priority) -> Message {
        self.priority = class.to_legacy();
        self
    }

    /// Bytes of payload (front + data), the unit throttles count.
    pub fn payload_len(&self) -> usize {
        self.front.len() + self.data.len()
    }

    /// Encodes the message as a frame, piggybacking `ack_seq`: for code
    /// that handles frames generically (tests, tools). The session sends a
    /// `MessageFrame`, which skips the [`Frame`].
    pub fn to_frame(&self, ack_seq: u64) -> Frame {
        MessageFrame::new(self.clone(), ack_seq).into_frame()
    }

    /// The header segment: type, priority, flags, sequence number, the
    /// piggybacked `ack_seq` and the call (bytes 4..8 reserved, zero).
    pub(crate) fn header(&self, ack_seq: u64) -> [u8; MESSAGE_HEADER_LEN] {
        let mut h = [0u8; MESSAGE_HEADER_LEN];
        h[0..2].copy_from_slice(&self.msg_type.to_le_bytes());
        h[2] = self.priority;
        h[3] = self.flags;
        h[8..16].copy_from_slice(&self.seq.to_le_bytes());
        h[16..24].copy_from_slice(&ack_seq.to_le_bytes());
        h[24..32].copy_from_slice(&self.call.to_le_bytes());
        h
    }

    /// Decodes a `Tag::Message` frame into the message and its piggybacked ack.
    pub fn from_frame(frame: Frame) -> Result<(Message, u64), Malformed> {
        let malformed = |detail: &str| Malformed {
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
        let Ok(h) = <&[u8; MESSAGE_HEADER_LEN]>::try_from(&h[..]) else {
            return Err(malformed("header segment is not 32 bytes"));
        };
        if !reserved_clear(h) {
            return Err(malformed("reserved header bytes set"));
        }
        let m = MessageFrame::from_parts(h, 0, front, data, data_crc);
        Ok((m.msg, m.ack))
    }
}

/// A message as it goes on the wire: the message, the acknowledgement it
/// carries and the frame's flags. Encodes to, and decodes from, exactly
/// the bytes of the [`Tag::Message`] frame [`Message::to_frame`] gives,
/// without building that [`Frame`]: no header segment allocated or
/// shared, no segment list filled and emptied (a 64 B message's encode
/// took 96 ns through a frame).
///
/// The session engine sends messages as these
/// ([`crate::Transmit::Message`]); message transports decode a received
/// message frame into one ([`crate::Inbound::Message`]). A transport
/// that must handle segments apart (a vectored write, a rendezvous)
/// takes [`MessageFrame::into_frame`].
///
/// ```
/// use msgr_proto::message::MessageFrame;
/// use msgr_proto::Message;
///
/// let m = MessageFrame::new(Message::new(7, &b"front"[..], &b"data"[..]), 3);
/// let pre = m.preamble().unwrap();
/// let mut wire = Vec::new();
/// m.write_encoded(&pre, &mut wire);
/// assert_eq!(wire.len(), m.encoded_len());
/// assert_eq!(wire, m.clone().into_frame().encode_to_vec().unwrap());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MessageFrame {
    /// The message (its `seq` is the one on the wire).
    pub msg: Message,
    /// The highest sequence number received from the peer, acknowledged.
    pub ack: u64,
    /// The frame's flags ([`crate::frame::FLAG_UNCHECKED_PAYLOAD`] or 0).
    pub flags: u8,
}

/// Whether a message header's reserved bytes (4..8) are all 0: a header
/// with one set is refused, as a preamble's is, so that a later version can
/// give them a meaning no older peer silently ignores. (Bytes 24..32 are
/// the call, which the session refuses where `features::CALLS` was not
/// agreed.)
pub(crate) fn reserved_clear(h: &[u8; MESSAGE_HEADER_LEN]) -> bool {
    h[4..8] == [0; 4]
}

/// Bit 63 of [`Message::call`]: the message is a reply.
pub const REPLY_BIT: u64 = 1 << 63;

/// Segments of a message frame: header, front, data.
const MESSAGE_SEGMENTS: u8 = 3;

impl MessageFrame {
    /// `msg` carrying `ack`, with no frame flags.
    pub fn new(msg: Message, ack: u64) -> MessageFrame {
        MessageFrame { msg, ack, flags: 0 }
    }

    /// The preamble this frame encodes to. Fails if the front or the data
    /// does not fit a u32 length.
    pub fn preamble(&self) -> Result<Preamble, FrameError> {
        let len = |index: usize, seg: &Bytes| {
            u32::try_from(seg.len()).map_err(|_| FrameError::SegmentTooLarge {
                index,
                len: u32::MAX,
                max: u32::MAX,
            })
        };
        Ok(Preamble {
            tag: Tag::Message,
            flags: self.flags,
            segment_count: MESSAGE_SEGMENTS,
            segment_lens: [
                MESSAGE_HEADER_LEN as u32,
                len(1, &self.msg.front)?,
                len(DATA_SEGMENT, &self.msg.data)?,
                0,
            ],
        })
    }

    /// Total encoded length.
    pub fn encoded_len(&self) -> usize {
        crate::frame::PREAMBLE_LEN
            + MESSAGE_HEADER_LEN
            + self.msg.payload_len()
            + 4 * usize::from(MESSAGE_SEGMENTS)
    }

    /// Appends the encoded frame ([`MessageFrame::encoded_len`] bytes) to
    /// `out`, with `preamble` from [`MessageFrame::preamble`].
    pub fn write_encoded(&self, preamble: &Preamble, out: &mut impl BufMut) {
        let header = self.msg.header(self.ack);
        out.put_slice(&preamble.encode());
        out.put_slice(&header);
        out.put_slice(&self.msg.front);
        out.put_slice(&self.msg.data);
        // The header is always checked; front and data unless the flags
        // say the payload goes unchecked (then their words are 0).
        let checked = checked_segments(self.flags);
        out.put_u32_le(segment_crc(&header));
        out.put_u32_le(if checked > 1 {
            segment_crc(&self.msg.front)
        } else {
            0
        });
        out.put_u32_le(if checked > DATA_SEGMENT {
            self.msg
                .data_checksum()
                .unwrap_or_else(|| segment_crc(&self.msg.data))
        } else {
            0
        });
    }

    /// The same frame as a [`Frame`] (its header copied into a segment of
    /// its own): for a transport that moves the segments apart.
    pub fn into_frame(self) -> Frame {
        let header = self.msg.header(self.ack);
        Frame {
            tag: Tag::Message,
            flags: self.flags,
            // In place: collecting an array of segments through an iterator
            // moved each twice more.
            segments: Segments::from_buf([
                Bytes::copy_from_slice(&header),
                self.msg.front,
                self.msg.data,
            ]),
            crc_memo: self.msg.data_crc,
        }
    }

    /// Whether a frame with preamble `pre` has a message frame's shape
    /// (tag, three segments, a 32-byte header): only then does
    /// [`MessageFrame::decode_body`] take it.
    pub(crate) fn fits(pre: &Preamble) -> bool {
        pre.tag == Tag::Message
            && pre.segment_count == MESSAGE_SEGMENTS
            && pre.segment_lens[0] == MESSAGE_HEADER_LEN as u32
    }

    /// Decodes the body of a frame that [`MessageFrame::fits`] (`whole`
    /// exactly its length, `pre` checked), checking each segment's CRC as
    /// [`Frame::decode_exact`] does. Front and data share `whole`'s memory;
    /// the header is read in place.
    pub(crate) fn decode_body(pre: &Preamble, whole: Bytes) -> Result<MessageFrame, FrameError> {
        debug_assert!(MessageFrame::fits(pre));
        let (segs, memo) = crate::frame::checked_body(pre, whole)?;
        let [h, front, data] = segs;
        let h: &[u8; MESSAGE_HEADER_LEN] = h[..].try_into().map_err(|_| FrameError::Truncated {
            have: h.len(),
            need: MESSAGE_HEADER_LEN,
        })?;
        if !reserved_clear(h) {
            return Err(FrameError::ReservedBitsSet);
        }
        Ok(MessageFrame::from_parts(h, pre.flags, front, data, memo))
    }

    /// The message frame of a decoded header and its segments.
    pub(crate) fn from_parts(
        h: &[u8; MESSAGE_HEADER_LEN],
        flags: u8,
        front: Bytes,
        data: Bytes,
        data_crc: CrcMemo,
    ) -> MessageFrame {
        let u64_at = |o: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&h[o..o + 8]);
            u64::from_le_bytes(b)
        };
        MessageFrame {
            msg: Message {
                msg_type: u16::from_le_bytes([h[0], h[1]]),
                priority: h[2],
                flags: h[3],
                seq: u64_at(8),
                call: u64_at(24),
                front,
                data,
                data_crc,
            },
            ack: u64_at(16),
            flags,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checksum::CRC_MEMO_MIN;
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

    /// The bytes a message frame writes, in every shape it has (empty
    /// segments, a sealed large data segment, the payload unchecked), are
    /// those of its message's frame, and decode back to it.
    #[test]
    fn a_message_frame_is_its_message_frame() {
        use crate::frame::FLAG_UNCHECKED_PAYLOAD;
        use crate::{Inbound, Transmit};
        let mut sealed = Message::new(3, &b"f"[..], vec![9u8; CRC_MEMO_MIN]).with_data_checksum();
        sealed.seq = 5;
        let messages = [
            Message::default(),
            Message::new(u16::MAX, &b"front"[..], &b""[..]),
            Message::new(1, Bytes::new(), vec![1u8; 100]),
            sealed,
        ];
        for msg in messages {
            for flags in [0, FLAG_UNCHECKED_PAYLOAD] {
                let m = MessageFrame {
                    msg: msg.clone(),
                    ack: 77,
                    flags,
                };
                let mut f = msg.to_frame(77);
                f.flags = flags;
                let wire = Transmit::Message(m.clone()).encode_to_vec().unwrap();
                assert_eq!(wire, f.encode_to_vec().unwrap(), "{msg:?} {flags}");
                assert_eq!(wire.len(), m.encoded_len());
                let back = Inbound::decode_exact(Bytes::from(wire), &FrameLimits::default());
                let Ok(Inbound::Message(back)) = back else {
                    panic!("not a message: {back:?}");
                };
                assert_eq!(back, m);
                let large = msg.data.len() >= CRC_MEMO_MIN && flags == 0;
                assert_eq!(
                    back.msg.data_checksum().is_some(),
                    large,
                    "a large checked data segment keeps its checksum"
                );
            }
        }
    }

    /// A header with a reserved byte set is refused by both decoders.
    #[test]
    fn reserved_header_bytes_are_refused() {
        use crate::{FrameError, Inbound};
        // (Bytes 24..32 are the call: the session checks it.)
        for at in [4, 5, 6, 7] {
            let mut f = Message::new(1, &b"x"[..], &b""[..]).to_frame(0);
            let mut h = f.segments[0].to_vec();
            h[at] = 1;
            f.segments[0] = Bytes::from(h);
            let wire = Bytes::from(f.encode_to_vec().unwrap());
            assert_eq!(
                Inbound::decode_exact(wire.clone(), &FrameLimits::default()),
                Err(FrameError::ReservedBitsSet)
            );
            let f = Frame::decode_exact(wire, &FrameLimits::default()).unwrap();
            assert!(Message::from_frame(f).is_err(), "byte {at}");
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
