//! How a link is (or is being) set up, below the two ways of doing it:
//! the out-of-band TCP exchange of `oob` (verbs) and the rdma_cm ids of
//! `cm` (rdmacm). A link holds one [`Conn`]; the modules that drive them
//! are above `link`.

use mio::net::TcpStream;
use msgr_addr::TransportKind;
use msgr_rdma::CmId;

use super::rdma_err;
use crate::TransportError;

/// How the link was (or is being) set up.
pub(crate) enum Conn {
    /// verbs: QP numbers exchanged over a TCP socket that stays open.
    Oob(OobConn),
    /// rdmacm: rdma_cm connected the QP; its events say when the peer goes.
    Cm(CmConn),
}

/// Where rdma_cm's setup of a link stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CmStep {
    ResolvingAddr,
    ResolvingRoute,
    /// Connector: `rdma_connect` sent, waiting for `Established`.
    Connecting,
    /// Acceptor: `rdma_accept` sent, waiting for `Established` (or a receive).
    Accepting,
    Up,
}

/// The rdma_cm side of an rdmacm link.
pub(crate) struct CmConn {
    pub(crate) id: CmId,
    pub(crate) step: CmStep,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OobStep {
    /// Connecting side: TCP connect in progress.
    TcpConnecting,
    /// Waiting for the peer's QP info (both sides).
    AwaitInfo,
    /// Accepting side: our QP is in RTS; waiting for the connector's ready byte.
    AwaitReady,
    /// Both QPs in RTS; the socket only tells of the peer's death.
    Up,
}

/// The out-of-band side of a verbs link.
pub(crate) struct OobConn {
    pub(crate) stream: TcpStream,
    pub(crate) step: OobStep,
    /// Bytes of the peer's info received so far.
    pub(crate) buf: Vec<u8>,
    pub(crate) psn: u32,
}

/// An rdma_cm error as a transport error.
pub(super) fn cm_err(op: &'static str, e: msgr_rdma::RdmaError) -> TransportError {
    rdma_err(TransportKind::RdmaCm, op, e)
}
