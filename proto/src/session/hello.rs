//! The connector's first control frame: who it is, whom it dialled and
//! the session it opens or resumes. Beside the session because it
//! carries the session's [`Policy`]; encoded like every control payload
//! ([`crate::control`]).

use msgr_addr::{EntityAddr, EntityName};
use serde::{Deserialize, Serialize};

use super::Policy;
use crate::control::Limits;

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
    /// The connector's receive limits, where both banners offered
    /// `features::LIMITS`: not in the postcard payload but in the frame's
    /// second segment ([`crate::control::with_limits`],
    /// [`crate::control::parse_handshake`]).
    #[serde(skip)]
    pub limits: Option<Limits>,
    /// The number of this dial among the connector's, where both banners
    /// offered `features::DIAL_NUMBERS`: in a last segment
    /// ([`crate::control::with_dial_number`]).
    #[serde(skip)]
    pub dial: Option<u64>,
}
