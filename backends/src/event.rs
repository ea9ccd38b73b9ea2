use std::net::SocketAddr;

use bytes::Bytes;
use msgr_proto::{Inbound, LinkFailure, LinkId, ProtocolError};

/// What a transport reports to its worker.
#[derive(Debug)]
pub enum TransportEvent {
    /// A listener accepted a new link.
    Accepted {
        /// The new link's id (chosen by the transport from the worker's allocator).
        link: LinkId,
        /// The remote socket address.
        peer: SocketAddr,
        /// The listener's token.
        listener: mio::Token,
    },
    /// An outgoing connection is established.
    Connected(LinkId),
    /// A unit arrived on a link.
    Received(LinkId, Inbound),
    /// Received bytes do not decode: the link is unusable (and already closed).
    Corrupt(LinkId, ProtocolError),
    /// The link failed or the peer closed it (and it is already closed).
    Failed(LinkId, LinkFailure),
    /// A one-sided read of a peer's region ([`crate::Transport::rma_read`])
    /// completed on `link`: the bytes, or why not (the link stays up:
    /// the caller can ask the owner another way).
    RmaRead {
        /// The link it was posted on.
        link: LinkId,
        /// The caller's token.
        token: u64,
        /// The bytes read, or why the read failed.
        result: Result<Bytes, RmaFailure>,
    },
    /// A one-sided write into a peer's region ([`crate::Transport::rma_write`])
    /// completed on `link` (the bytes are in the peer's memory), or why not
    /// (the link may have failed with it: the caller asks the owner).
    RmaWrite {
        /// The link it was posted on.
        link: LinkId,
        /// The caller's token.
        token: u64,
        /// Done, or why the write failed.
        result: Result<(), RmaFailure>,
    },
}

/// Why a one-sided operation of the application's ([`TransportEvent::RmaRead`],
/// [`TransportEvent::RmaWrite`]) did not start or did not complete: the
/// caller can still ask the region's owner.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RmaFailure {
    /// The key names no region this transport can reach, or the range is
    /// not inside it.
    #[error("{0}")]
    BadKey(String),
    /// An operation under the same completion context is in flight.
    #[error("a read with this context is in flight")]
    Busy,
    /// The provider refused to post it.
    #[error("{0}")]
    Post(String),
    /// It completed with an error: the provider's status code, and what
    /// went wrong.
    #[error("{detail}")]
    Completion {
        /// The provider's status code (an errno).
        status: i32,
        /// What went wrong.
        detail: String,
    },
    /// The bytes came back, but not as the region's (the owner withdrew it:
    /// its check word no longer matches).
    #[error("{0}")]
    Refused(String),
    /// Its completion named no read in flight.
    #[error("no such read")]
    Unknown,
    /// The link it was posted on failed or closed before it completed
    /// (for the caller to say so as it asks the owner instead).
    #[error("the link went")]
    LinkGone,
}
