//! Payloads of the session's control frames, encoded with postcard.

use msgr_addr::{EntityAddr, EntityName};
use serde::{de::DeserializeOwned, Deserialize, Serialize};

use crate::codec::{Codec, Postcard};
use crate::error::ProtocolError;
use crate::frame::{Frame, Tag};
use crate::session::Policy;

/// Sent by the connecting side once banners are exchanged.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// The connector's entity name.
    pub name: EntityName,
    /// The connector's own address (port 0 if it does not listen).
    pub addr: EntityAddr,
    /// The address the connector dialled.
    pub target: EntityAddr,
    /// The connector's policy for this session.
    pub policy: Policy,
    /// 0 for a new session, else the cookie of the session to resume.
    pub cookie: u64,
    /// Highest sequence number the connector has received in that session.
    pub in_seq: u64,
}

/// The acceptor's answer to a [`Hello`] that starts a new session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HelloOk {
    /// The acceptor's entity name.
    pub name: EntityName,
    /// The acceptor's address.
    pub addr: EntityAddr,
    /// The new session's cookie.
    pub cookie: u64,
}

/// The acceptor resumes the session: replay what I have not received.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReconnectOk {
    /// The acceptor's entity name.
    pub name: EntityName,
    /// The acceptor's address.
    pub addr: EntityAddr,
    /// Highest sequence number the acceptor has received.
    pub in_seq: u64,
}

/// Cumulative acknowledgement.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ack {
    /// Every message up to and including this sequence number has arrived.
    pub seq: u64,
}

/// Keepalive probe or its answer; the stamp is echoed for round-trip measurement.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Keepalive {
    /// Sender's opaque stamp (microseconds on its clock).
    pub stamp: u64,
}

/// Orderly end of a session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Close {
    /// Why the sender ends the session.
    pub reason: String,
}

/// Encodes a control payload into a single-segment frame.
pub fn control_frame<T: Serialize>(tag: Tag, payload: &T) -> Frame {
    // Control payloads are plain structs of integers and strings: postcard
    // cannot fail on them, short of running out of memory.
    let bytes = Postcard.encode(payload).unwrap_or_default();
    Frame::single(tag, bytes)
}

/// Decodes the single segment of a control frame.
pub fn parse_control<T: DeserializeOwned>(
    frame: &Frame,
    what: &'static str,
) -> Result<T, ProtocolError> {
    let [seg] = frame.segments.as_slice() else {
        return Err(ProtocolError::Malformed {
            what,
            detail: "expected one segment".into(),
        });
    };
    Postcard.decode(seg).map_err(|e| ProtocolError::Malformed {
        what,
        detail: e.detail,
    })
}
