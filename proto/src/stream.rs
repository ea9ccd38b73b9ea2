//! The units a transport moves, and the decoder that splits a byte stream into them.
//!
//! Every transport connection starts with one banner in each direction, then
//! carries frames. Message transports send each [`Transmit`] as one unit;
//! byte-stream transports concatenate them and use [`StreamDecoder`] to split.

use bytes::{BufMut, Bytes, BytesMut};

use crate::banner::{BANNER_LEN, MAGIC};
use crate::error::FrameError;
use crate::frame::{
    exact_preamble, frame_body, handing_over, split_off_front, Frame, FrameDecoder, FrameLimits,
    Preamble,
};
use crate::message::MessageFrame;

/// Something the session engine wants sent on its transport link.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Transmit {
    /// The connection's opening banner.
    Banner([u8; BANNER_LEN]),
    /// A frame.
    Frame(Frame),
    /// An application message: a [`crate::Tag::Message`] frame written
    /// straight from the message.
    Message(MessageFrame),
}

impl Transmit {
    /// Bytes the unit occupies on the wire.
    pub fn encoded_len(&self) -> usize {
        match self {
            Transmit::Banner(b) => b.len(),
            Transmit::Frame(f) => f.encoded_len(),
            Transmit::Message(m) => m.encoded_len(),
        }
    }

    /// The length of the unit's longest segment (a banner's own): a
    /// transport copies a unit whose segments are all short and references
    /// long ones.
    pub fn largest_segment(&self) -> usize {
        match self {
            Transmit::Banner(b) => b.len(),
            Transmit::Frame(f) => f.segments.iter().map(Bytes::len).max().unwrap_or(0),
            Transmit::Message(m) => m
                .msg
                .front
                .len()
                .max(m.msg.data.len())
                .max(crate::message::MESSAGE_HEADER_LEN),
        }
    }

    /// The unit with its lengths checked (what can fail, fails here), ready
    /// to be written into a buffer of the caller's with
    /// [`CheckedUnit::write`].
    ///
    /// ```
    /// use msgr_proto::message::MessageFrame;
    /// use msgr_proto::{Message, Transmit};
    ///
    /// let unit = Transmit::Message(MessageFrame::new(Message::new(1, &b"hi"[..], &b""[..]), 0));
    /// let checked = unit.checked().unwrap();
    /// let mut slot = Vec::new();
    /// checked.write(&mut slot);
    /// assert_eq!(slot.len(), unit.encoded_len());
    /// ```
    pub fn checked(&self) -> Result<CheckedUnit<'_>, FrameError> {
        Ok(match self {
            Transmit::Banner(b) => CheckedUnit::Banner(b),
            Transmit::Frame(f) => CheckedUnit::Frame(f, f.preamble()?),
            Transmit::Message(m) => CheckedUnit::Message(m, m.preamble()?),
        })
    }

    /// The unit encoded into one buffer (tests, fault injection).
    pub fn encode_to_vec(&self) -> Result<Vec<u8>, FrameError> {
        let checked = self.checked()?;
        let mut out = Vec::with_capacity(self.encoded_len());
        checked.write(&mut out);
        Ok(out)
    }

    /// The unit as a [`Frame`] (a message's header copied into a segment
    /// of its own), for a transport that moves the segments apart; a
    /// banner, which is no frame, comes back as the error.
    pub fn into_frame(self) -> Result<Frame, [u8; BANNER_LEN]> {
        match self {
            Transmit::Banner(b) => Err(b),
            Transmit::Frame(f) => Ok(f),
            Transmit::Message(m) => Ok(m.into_frame()),
        }
    }
}

impl From<Transmit> for Inbound {
    /// The unit as the receiving side takes it when handed over in memory
    /// as is (no encoding, no CRC: the engine's tests and benches).
    fn from(unit: Transmit) -> Inbound {
        match unit {
            Transmit::Banner(b) => Inbound::Banner(b),
            Transmit::Frame(f) => Inbound::Frame(f),
            Transmit::Message(m) => Inbound::Message(m),
        }
    }
}

/// A [`Transmit`] whose lengths are checked: writes it whole, nothing
/// left to fail ([`Transmit::checked`]).
#[derive(Debug)]
pub enum CheckedUnit<'a> {
    /// A banner.
    Banner(&'a [u8; BANNER_LEN]),
    /// A frame and its preamble.
    Frame(&'a Frame, Preamble),
    /// A message frame and its preamble.
    Message(&'a MessageFrame, Preamble),
}

impl CheckedUnit<'_> {
    /// Appends the encoded unit ([`Transmit::encoded_len`] bytes) to `out`.
    pub fn write(&self, out: &mut impl BufMut) {
        match self {
            CheckedUnit::Banner(b) => out.put_slice(&b[..]),
            CheckedUnit::Frame(f, pre) => f.write_encoded(pre, out),
            CheckedUnit::Message(m, pre) => m.write_encoded(pre, out),
        }
    }
}

/// Something a transport link received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Inbound {
    /// The peer's banner (raw; the engine validates it).
    Banner([u8; BANNER_LEN]),
    /// A decoded, CRC-checked frame (a message frame where a transport
    /// assembled it from pieces).
    Frame(Frame),
    /// A decoded, CRC-checked message frame.
    Message(MessageFrame),
}

impl Inbound {
    /// Decodes exactly one frame occupying all of `buf`, as
    /// [`Frame::decode_exact`] does: a message frame as
    /// [`Inbound::Message`] (no [`Frame`] in between), any other as
    /// [`Inbound::Frame`]. Front and data share `buf`'s memory.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use msgr_proto::{FrameLimits, Inbound, Message};
    ///
    /// let wire = Bytes::from(Message::new(4, &b"front"[..], &b"data"[..]).to_frame(9).encode_to_vec().unwrap());
    /// let Inbound::Message(m) = Inbound::decode_exact(wire, &FrameLimits::default()).unwrap() else {
    ///     panic!("a message frame")
    /// };
    /// assert_eq!((m.msg.msg_type, &m.msg.front[..], m.ack), (4, &b"front"[..], 9));
    /// ```
    pub fn decode_exact(buf: Bytes, limits: &FrameLimits) -> Result<Inbound, FrameError> {
        let pre = exact_preamble(&buf, limits)?;
        frame_unit(&pre, buf)
    }

    /// Bytes the unit occupied on the wire.
    pub fn encoded_len(&self) -> usize {
        match self {
            Inbound::Banner(b) => b.len(),
            Inbound::Frame(f) => f.encoded_len(),
            Inbound::Message(m) => m.encoded_len(),
        }
    }

    /// The received frame (a message's rebuilt as [`MessageFrame::into_frame`]
    /// gives it), or `None` for a banner: for code that handles frames
    /// generically.
    pub fn into_frame(self) -> Option<Frame> {
        match self {
            Inbound::Banner(_) => None,
            Inbound::Frame(f) => Some(f),
            Inbound::Message(m) => Some(m.into_frame()),
        }
    }
}

/// The unit of a whole frame (`pre` checked, `whole` exactly its length).
fn frame_unit(pre: &Preamble, whole: Bytes) -> Result<Inbound, FrameError> {
    if MessageFrame::fits(pre) {
        MessageFrame::decode_body(pre, whole).map(Inbound::Message)
    } else {
        frame_body(pre, whole).map(Inbound::Frame)
    }
}

/// Splits a byte stream into the peer's banner and then frames.
#[derive(Debug)]
pub struct StreamDecoder {
    banner_seen: bool,
    frames: FrameDecoder,
}

impl StreamDecoder {
    /// A decoder for a fresh connection.
    pub fn new(limits: FrameLimits) -> Self {
        StreamDecoder {
            banner_seen: false,
            frames: FrameDecoder::new(limits),
        }
    }

    /// Bytes the buffer must hold for the next unit to be complete.
    pub fn needed(&self) -> usize {
        if self.banner_seen {
            self.frames.needed()
        } else {
            BANNER_LEN
        }
    }

    /// Takes the next complete unit off `buf`, or `Ok(None)` for "need more".
    /// A frame is split off `buf`, which keeps its allocation (see
    /// [`FrameDecoder::decode`]).
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Inbound>, FrameError> {
        match self.take_banner(buf)? {
            Some(unit) => Ok(unit),
            None => self.frames.next_frame(buf, split_off_front, frame_unit),
        }
    }

    /// As [`StreamDecoder::decode`], with a frame's bytes turned into
    /// [`Bytes`] by `freeze` (see [`FrameDecoder::decode_with`]).
    pub fn decode_with(
        &mut self,
        buf: &mut BytesMut,
        freeze: impl FnOnce(BytesMut) -> Bytes,
    ) -> Result<Option<Inbound>, FrameError> {
        match self.take_banner(buf)? {
            Some(unit) => Ok(unit),
            None => self
                .frames
                .next_frame(buf, handing_over(freeze), frame_unit),
        }
    }

    /// Before the banner: `Some` of the banner, or of `None` for "need
    /// more" (an error if the bytes so far are not the magic's start).
    /// After it: `None` (frames follow).
    fn take_banner(&mut self, buf: &mut BytesMut) -> Result<Option<Option<Inbound>>, FrameError> {
        if self.banner_seen {
            return Ok(None);
        }
        if buf.len() < BANNER_LEN {
            // A foreign protocol (`GET / HTTP/1.1`) shows in its first
            // bytes: refuse it now rather than wait for 32 of them.
            let n = buf.len().min(MAGIC.len());
            if buf[..n] != MAGIC[..n] {
                return Err(FrameError::ForeignProtocol);
            }
            return Ok(Some(None));
        }
        let mut raw = [0u8; BANNER_LEN];
        raw.copy_from_slice(&buf.split_to(BANNER_LEN));
        self.banner_seen = true;
        Ok(Some(Some(Inbound::Banner(raw))))
    }
}
