use std::net::SocketAddr;

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
}
