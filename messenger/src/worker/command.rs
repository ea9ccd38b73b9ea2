use std::time::Instant;

use msgr_addr::TransportKind;
use msgr_backends::{DetachedLink, RealFault, SimulatedFault, TransportStats};
use msgr_proto::{session::Hello, LinkId, Session};

use crate::Connection;

/// What other threads (and callbacks) ask of a worker.
pub(crate) enum Command {
    /// Open a session for this new handle.
    Connect { conn: Connection },
    /// Time out call `id` of session `key` at `at` (an async call's
    /// deadline; a blocking call keeps its own).
    CallDeadline { key: u64, id: u64, at: Instant },
    /// Stop listening (`token`, worker 0) and close every link over the
    /// transport `kind` (every worker): `Messenger::unbind`.
    Unbind {
        token: Option<mio::Token>,
        kind: TransportKind,
    },
    /// Take what `Connection::send` queued on this connection (one
    /// command per batch: later sends add to what it takes).
    Flush { conn: Connection },
    /// End a session now.
    MarkDown { key: u64 },
    /// End a session after draining.
    Close { key: u64 },
    /// Produce (or imitate) a fault on a session's link.
    Inject { key: u64, fault: LinkFault },
    /// Take over an accepted link whose session lives here. Boxed: rare,
    /// and five times the size of a `Send`, which every command would pay.
    Adopt(Box<Adoption>),
    /// Close every registration of an exposed region (it was revoked or
    /// dropped: `crate::rma`).
    RmaRevoke { region: u64 },
    /// Report the backends' own counters and the sessions' memory.
    Stats {
        reply: std::sync::mpsc::Sender<WorkerStats>,
    },
    /// Stop listening, close sessions, stop by the deadline.
    Shutdown { deadline: Instant },
}

/// What a worker reports for [`Command::Stats`].
pub(crate) struct WorkerStats {
    /// Each of its transports' own counters and gauges.
    pub(crate) transports: Vec<TransportStats>,
    /// Sessions it owns, and those whose handshake is under way.
    pub(crate) sessions: usize,
    /// Bytes their state holds: engines, queues' capacity, the worker's
    /// per-session slot and the connection handle's shared part.
    pub(crate) session_bytes: usize,
}

/// An accepted, identified link on its way to the worker that owns its
/// session.
pub(crate) struct Adoption {
    pub(crate) link: LinkId,
    pub(crate) detached: DetachedLink,
    pub(crate) session: Session,
    pub(crate) hello: Hello,
    pub(crate) transport: TransportKind,
}

/// A fault asked of a session's link: one the backend produces for real, or
/// one it can only imitate.
pub(crate) enum LinkFault {
    Real(RealFault),
    Simulated(SimulatedFault),
}
