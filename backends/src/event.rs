use std::net::SocketAddr;

use bytes::Bytes;
use msgr_proto::{Inbound, LinkId, ProtocolError};

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
    Failed(LinkId, String),
    /// A one-sided read of a peer's region ([`crate::Transport::rma_read`])
    /// completed on `link`: the bytes, or why not (the link stays up:
    /// the caller can ask the owner another way).
    RmaRead {
        /// The link it was posted on.
        link: LinkId,
        /// The caller's token.
        token: u64,
        /// The bytes read, or why the read failed.
        result: Result<Bytes, String>,
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
        result: Result<(), String>,
    },
}
