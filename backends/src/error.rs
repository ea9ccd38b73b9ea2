use msgr_addr::TransportKind;
use msgr_proto::LinkFailure;
use thiserror::Error;

/// A backend could not do what was asked.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum TransportError {
    /// The backend is not compiled in, or cannot run here; the reason says why
    /// (missing feature, no RDMA device, missing provider...).
    #[error("transport {scheme} is unavailable: {reason}", scheme = kind.scheme())]
    Unavailable {
        /// Which transport.
        kind: TransportKind,
        /// Why, in words an operator can act on.
        reason: String,
    },
    /// An OS call failed.
    #[error("{op}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Listening at an address failed (in use, not this host's, not
    /// permitted): the address is in the message.
    #[error("bind {addr}: {source}")]
    Bind {
        /// Where (its nonce aside).
        addr: msgr_addr::EntityAddr,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The link does not exist (closed or never opened).
    #[error("no such link {0}")]
    NoSuchLink(u64),
    /// A frame could not be encoded.
    #[error("encode: {0}")]
    Encode(#[from] msgr_proto::FrameError),
}

impl TransportError {
    pub(crate) fn io(op: &'static str, source: std::io::Error) -> Self {
        TransportError::Io { op, source }
    }

    /// What a link that this error kept from being opened failed with.
    pub fn link_failure(&self) -> LinkFailure {
        match self {
            TransportError::Io { source, .. } => LinkFailure::Io {
                kind: source.kind(),
                detail: self.to_string(),
            },
            _ => LinkFailure::Setup(self.to_string()),
        }
    }
}
