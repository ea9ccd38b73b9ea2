//! Typed errors for everything that reads peer input.

use thiserror::Error;

/// A frame could not be decoded. Any of these ends the transport connection.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
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

/// A well-formed frame broke the session protocol.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ProtocolError {
    /// Bad frame bytes.
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// Bad banner.
    #[error(transparent)]
    Banner(#[from] crate::banner::BannerError),
    /// A batch frame's body does not parse.
    #[error(transparent)]
    Batch(#[from] crate::batch::BatchError),
    /// Authentication failed (`crate::auth`).
    #[error(transparent)]
    Auth(#[from] crate::auth::AuthError),
    /// A frame on a secure link did not open (`crate::auth::record`).
    #[error(transparent)]
    Record(#[from] crate::auth::RecordError),
    /// A frame arrived in a state where it is not allowed.
    #[error("unexpected {tag:?} frame while {state}")]
    Unexpected {
        /// The frame's tag.
        tag: crate::frame::Tag,
        /// The session state, as text.
        state: &'static str,
    },
    /// A frame's payload does not parse.
    #[error("malformed {what}: {detail}")]
    Malformed {
        /// Which payload.
        what: &'static str,
        /// Why.
        detail: String,
    },
    /// A message arrived out of sequence (a gap: messages were lost).
    #[error("message seq {got} after {last}: gap in the stream")]
    SequenceGap {
        /// Last delivered sequence number.
        last: u64,
        /// Sequence number received.
        got: u64,
    },
    /// The peer acknowledged messages that were never sent.
    #[error("peer acked seq {acked} but only {sent} were sent")]
    AckBeyondSent {
        /// Claimed acknowledgement.
        acked: u64,
        /// Highest sequence number sent.
        sent: u64,
    },
    /// The peer is not who we connected to.
    #[error("connected to {expected} but peer says it is {actual}")]
    WrongPeer {
        /// Who we dialled.
        expected: String,
        /// Who answered.
        actual: String,
    },
}
