//! Why a link failed, as a transport reports it ([`LinkFailure`]): what
//! kind of failure, with what the transport said of it. The transports
//! (`msgr-backends`) report it, the session engine carries it in
//! [`crate::FaultReason::Transport`], and the application reads it there,
//! so it lives here, below both.

use std::io::ErrorKind;

/// Why a link failed. Each kind carries what the transport said of it,
/// which [`Display`](std::fmt::Display) shows as it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LinkFailure {
    /// The peer closed the link in order (end of stream, `FI_SHUTDOWN`,
    /// an RDM `CLOSE`, an rdma_cm disconnect).
    ClosedByPeer(String),
    /// The peer or the path reset it (a connection reset, a session the
    /// peer reset).
    Reset(String),
    /// The link could not be set up: the connection was refused, the
    /// address not resolved, the set-up exchange failed.
    Setup(String),
    /// An I/O call on the link failed with `kind`.
    Io {
        /// The kind of the operating system's error.
        kind: ErrorKind,
        /// What failed, and how.
        detail: String,
    },
    /// An operation posted on the link completed with an error: a verbs
    /// work completion or a libfabric completion-queue error entry.
    Completion {
        /// The provider's status code (a verbs `ibv_wc_status`, a
        /// libfabric errno).
        status: i32,
        /// What failed, and how.
        detail: String,
    },
    /// The queue the link's completions or events come from could not be
    /// read: every link on it fails.
    QueueUnreadable(String),
    /// A deadline passed: the link's set-up, a rendezvous read, the
    /// peer's liveness.
    Timeout(String),
    /// The peer broke the transport's own framing or handshake.
    Protocol(String),
    /// This end dropped the link: an injected fault, the messenger
    /// shutting down.
    Local(String),
    /// The link failed this way while the session was authenticating: a
    /// peer that refuses our name or key says nothing, it closes the link.
    WhileAuthenticating(Box<LinkFailure>),
}

impl LinkFailure {
    /// An I/O error `e` of the operation `op` ("write", "connect"...).
    pub fn io(op: &str, e: &std::io::Error) -> Self {
        LinkFailure::Io {
            kind: e.kind(),
            detail: format!("{op}: {e}"),
        }
    }
}

impl std::fmt::Display for LinkFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LinkFailure::ClosedByPeer(d)
            | LinkFailure::Reset(d)
            | LinkFailure::Setup(d)
            | LinkFailure::QueueUnreadable(d)
            | LinkFailure::Timeout(d)
            | LinkFailure::Protocol(d)
            | LinkFailure::Local(d)
            | LinkFailure::Io { detail: d, .. }
            | LinkFailure::Completion { detail: d, .. } => f.write_str(d),
            LinkFailure::WhileAuthenticating(inner) => write!(
                f,
                "{inner}, while authenticating: the peer may not accept our name or key"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shows_what_the_transport_said() {
        let e = std::io::Error::new(ErrorKind::ConnectionReset, "reset by peer");
        let io = LinkFailure::io("write", &e);
        assert_eq!(io.to_string(), "write: reset by peer");
        assert!(matches!(
            io,
            LinkFailure::Io {
                kind: ErrorKind::ConnectionReset,
                ..
            }
        ));
        let auth = LinkFailure::WhileAuthenticating(Box::new(LinkFailure::ClosedByPeer(
            "connection closed by peer".into(),
        )));
        assert_eq!(
            auth.to_string(),
            "connection closed by peer, while authenticating: the peer may not accept our name or key"
        );
    }
}
