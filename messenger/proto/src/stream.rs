//! The units a transport moves, and the decoder that splits a byte stream into them.
//!
//! Every transport connection starts with one banner in each direction, then
//! carries frames. Message transports send each [`Transmit`] as one unit;
//! byte-stream transports concatenate them and use [`StreamDecoder`] to split.

use bytes::{Bytes, BytesMut};

use crate::banner::BANNER_LEN;
use crate::error::FrameError;
use crate::frame::{Frame, FrameDecoder, FrameLimits};

/// Something the session engine wants sent on its transport link.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Transmit {
    /// The connection's opening banner.
    Banner([u8; BANNER_LEN]),
    /// A frame.
    Frame(Frame),
}

/// Something a transport link received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Inbound {
    /// The peer's banner (raw; the engine validates it).
    Banner([u8; BANNER_LEN]),
    /// A decoded, CRC-checked frame.
    Frame(Frame),
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
        match self.take_banner(buf) {
            Some(unit) => Ok(unit),
            None => Ok(self.frames.decode(buf)?.map(Inbound::Frame)),
        }
    }

    /// As [`StreamDecoder::decode`], with a frame's bytes turned into
    /// [`Bytes`] by `freeze` (see [`FrameDecoder::decode_with`]).
    pub fn decode_with(
        &mut self,
        buf: &mut BytesMut,
        freeze: impl FnOnce(BytesMut) -> Bytes,
    ) -> Result<Option<Inbound>, FrameError> {
        match self.take_banner(buf) {
            Some(unit) => Ok(unit),
            None => Ok(self.frames.decode_with(buf, freeze)?.map(Inbound::Frame)),
        }
    }

    /// Before the banner: `Some` of the banner, or of `None` for "need
    /// more". After it: `None` (frames follow).
    fn take_banner(&mut self, buf: &mut BytesMut) -> Option<Option<Inbound>> {
        if self.banner_seen {
            return None;
        }
        if buf.len() < BANNER_LEN {
            return Some(None);
        }
        let mut raw = [0u8; BANNER_LEN];
        raw.copy_from_slice(&buf.split_to(BANNER_LEN));
        self.banner_seen = true;
        Some(Some(Inbound::Banner(raw)))
    }
}
