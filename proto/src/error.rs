//! The decode errors of the bottom layer, shared by the layers above it:
//! a frame's bytes ([`FrameError`]: frame, message, stream and the record
//! layer return it) and a well-formed frame's payload ([`Malformed`]:
//! message and control). Each layer's own error lives beside it
//! (`BannerError` in banner, `BatchError` in batch, `AuthError` and
//! `RecordError` in auth); the session's `ProtocolError` wraps them all.

use thiserror::Error;

/// A frame could not be decoded. Any of these ends the transport connection.
#[derive(Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum FrameError {
    /// The preamble's own checksum does not match: its lengths cannot be trusted.
    #[error("preamble crc mismatch: wire {expected:#010x}, computed {actual:#010x}")]
    PreambleCrc {
        /// CRC carried on the wire.
        expected: u32,
        /// CRC computed over the received bytes.
        actual: u32,
    },
    /// A segment's checksum does not match.
    #[error("segment {index} crc mismatch: wire {expected:#010x}, computed {actual:#010x}")]
    SegmentCrc {
        /// Which segment.
        index: usize,
        /// CRC carried on the wire.
        expected: u32,
        /// CRC computed over the received bytes.
        actual: u32,
    },
    /// The tag byte names no known frame type.
    #[error("unknown frame tag {0}")]
    UnknownTag(u8),
    /// More segments than `MAX_SEGMENTS`.
    #[error("frame claims {0} segments")]
    TooManySegments(u8),
    /// A segment is longer than its configured limit.
    #[error("segment {index} claims {len} bytes, limit is {max}")]
    SegmentTooLarge {
        /// Which segment.
        index: usize,
        /// Claimed length.
        len: u32,
        /// Configured limit.
        max: u32,
    },
    /// The whole frame is longer than the configured limit.
    #[error("frame claims {len} bytes, limit is {max}")]
    FrameTooLarge {
        /// Claimed length.
        len: u64,
        /// Configured limit.
        max: u64,
    },
    /// Reserved bytes are not zero (a newer or broken peer).
    #[error("reserved bits set (preamble or message header)")]
    ReservedBitsSet,
    /// A whole-frame buffer ended before the frame did.
    #[error("truncated frame: have {have} bytes, need {need}")]
    Truncated {
        /// Bytes received.
        have: usize,
        /// Bytes the frame needs.
        need: usize,
    },
    /// A whole-frame buffer holds more than one frame.
    #[error("{0} bytes after the end of the frame")]
    TrailingBytes(usize),
    /// The first bytes of a connection are not the msgr magic: another
    /// protocol (HTTP, TLS...) is talking. Caught from the first byte that
    /// differs, without waiting for a whole banner.
    #[error("the peer speaks another protocol (its first bytes are not msgr's magic)")]
    ForeignProtocol,
}

msgr_addr::debug_is_display!(FrameError);

/// A well-formed frame's payload does not parse (a message frame's
/// segments, a control payload). The session reports it as
/// `ProtocolError::Malformed`.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("malformed {what}: {detail}")]
pub struct Malformed {
    /// Which payload.
    pub what: &'static str,
    /// Why.
    pub detail: String,
}
