//! The session's error: a well-formed frame broke the session protocol,
//! or a lower layer's decode error on the way to it.

use thiserror::Error;

use crate::auth::{AuthError, RecordError};
use crate::banner::BannerError;
use crate::batch::BatchError;
use crate::error::{FrameError, Malformed};
use crate::fragment::ReassemblyError;
use crate::frame::Tag;

/// A well-formed frame broke the session protocol.
#[derive(Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ProtocolError {
    /// Bad frame bytes.
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// Bad banner.
    #[error(transparent)]
    Banner(#[from] BannerError),
    /// A batch frame's body does not parse.
    #[error(transparent)]
    Batch(#[from] BatchError),
    /// Authentication failed (`crate::auth`).
    #[error(transparent)]
    Auth(#[from] AuthError),
    /// A frame on a secure link did not open (`crate::auth::record`).
    #[error(transparent)]
    Record(#[from] RecordError),
    /// A fragment frame is malformed or does not continue its class
    /// (`crate::fragment`).
    #[error(transparent)]
    Fragment(#[from] ReassemblyError),
    /// A frame arrived in a state where it is not allowed.
    #[error("unexpected {tag:?} frame while {state}")]
    Unexpected {
        /// The frame's tag.
        tag: Tag,
        /// The session state, as text.
        state: &'static str,
    },
    /// A frame's payload does not parse (a lower layer's [`Malformed`], or
    /// the session's own checks).
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

msgr_addr::debug_is_display!(ProtocolError);

impl From<Malformed> for ProtocolError {
    fn from(e: Malformed) -> ProtocolError {
        ProtocolError::Malformed {
            what: e.what,
            detail: e.detail,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Message;

    #[test]
    fn a_lower_malformed_payload_is_the_sessions_malformed_variant() {
        let mut frame = Message::new(3, &b"front"[..], &b"data"[..]).to_frame(0);
        frame.segments.pop();
        let lower = Message::from_frame(frame).expect_err("two segments");
        let session = ProtocolError::from(lower.clone());
        assert_eq!(session.to_string(), lower.to_string());
        assert!(
            matches!(&session, ProtocolError::Malformed { what: "message frame", detail }
                if *detail == lower.detail),
            "{session:?}"
        );
    }
}
