//! The tool's errors: typed, printed as one clear line, mapped to exit codes.

use std::time::Duration;

use thiserror::Error;

/// Everything that can make a `msgr` command fail.
#[derive(Debug, Error)]
pub enum ToolError {
    /// An address argument did not parse.
    #[error("bad address `{}`: {source}", msgr_addr::excerpt(text))]
    Addr {
        /// What was given.
        text: String,
        /// Why it is not an address.
        #[source]
        source: msgr_addr::AddrParseError,
    },
    /// A configuration file, variable or flag was not understood.
    #[error("configuration: {0}")]
    Config(#[from] msgr::ConfigError),
    /// The messenger could not start or connect.
    #[error("{0}")]
    Messenger(#[from] msgr::MessengerError),
    /// A send failed.
    #[error("send failed: {0}")]
    Send(#[from] msgr::SendError),
    /// A bad combination of arguments.
    #[error("{0}")]
    Usage(String),
    /// An OS call failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Something did not finish in time.
    #[error("timed out after {:.1} s: {what}", after.as_secs_f64())]
    Timeout {
        /// What was waited for.
        what: String,
        /// How long.
        after: Duration,
    },
    /// The peer answered with something the run did not ask for.
    #[error("{peer} answered wrongly: {what}")]
    BadReply {
        /// The peer.
        peer: String,
        /// What was wrong.
        what: String,
    },
    /// A stream's server counted other than the messages sent.
    #[error("stream to {peer} incomplete: {sent} messages sent, {delivered} delivered")]
    Incomplete {
        /// The peer.
        peer: String,
        /// Messages sent.
        sent: u64,
        /// Messages the server counted on this stream.
        delivered: u64,
    },
    /// A one-sided read or write failed (`msgr rma`).
    #[error("{what}: {source}")]
    Rma {
        /// The operation and where.
        what: String,
        /// Why it failed.
        #[source]
        source: msgr::RmaError,
    },
    /// The server refused this client for good and said why (its keyring
    /// does not vouch for us): the connection ended at once, no retry.
    #[error("{peer} refused {us}: {reason}")]
    Refused {
        /// The server.
        peer: String,
        /// Our entity name.
        us: String,
        /// The server's reason.
        reason: msgr::auth::Refusal,
    },
    /// The connection ended before it ever opened, for a reason no retry
    /// would change (the peer's banner asks for what we do not offer...).
    #[error("could not connect to {peer}: {reason}")]
    NotConnected {
        /// The peer.
        peer: String,
        /// Why.
        reason: String,
    },
    /// The connection ended while a test was running.
    #[error("connection to {peer} was reset: {reason}")]
    Reset {
        /// The peer.
        peer: String,
        /// Why.
        reason: String,
    },
}

/// A refused send: the tool has no use for the message it gives back.
impl<M> From<msgr::SendRejected<M>> for ToolError {
    fn from(r: msgr::SendRejected<M>) -> ToolError {
        ToolError::Send(r.error)
    }
}

impl ToolError {
    /// Exit code: 2 for bad input (like clap's usage errors), 3 to 6 for
    /// an RMA operation the owner or the handle refused
    /// ([`rma_exit_code`]), 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            ToolError::Addr { .. } | ToolError::Config(_) | ToolError::Usage(_) => 2,
            ToolError::Rma { source, .. } => rma_exit_code(source),
            _ => 1,
        }
    }

    /// An I/O error with what was being done.
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        ToolError::Io {
            what: what.into(),
            source,
        }
    }
}

/// Parses an address argument into a typed error naming the text.
pub fn parse_addr(text: &str) -> Result<msgr::EntityAddr, ToolError> {
    text.parse().map_err(|source| ToolError::Addr {
        text: text.to_owned(),
        source,
    })
}

/// The exit code of a refused operation: one per refusal a script may
/// want to tell apart, 1 for the rest (timeouts, resets, corruption).
pub fn rma_exit_code(e: &msgr::RmaError) -> i32 {
    match e {
        msgr::RmaError::Denied => 3,
        msgr::RmaError::Revoked | msgr::RmaError::UnknownRegion => 4,
        msgr::RmaError::OutOfRange { .. } => 5,
        msgr::RmaError::Forbidden(_) => 6,
        // One range or part of a larger operation: its own refusal.
        msgr::RmaError::Part { error, .. } => rma_exit_code(error),
        _ => 1,
    }
}
