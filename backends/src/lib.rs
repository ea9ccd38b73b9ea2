//! Transport backends for msgr.
//!
//! A backend moves [`Transmit`] units (banners and frames) over links and reports
//! what it received; it knows nothing of sessions, sequence numbers or policies
//! (those live in `msgr-proto`'s session engine, shared by every backend).
//!
//! - [`Transport`]: the trait every backend implements — frame-oriented and
//!   completion-based, so an RDMA backend posts a frame as one or a few work
//!   requests instead of emulating a byte stream.
//! - [`AnyTransport`]: the enum over the backends compiled in; calls are
//!   dispatched statically with `enum_dispatch`.
//! - One module per backend, behind a cargo feature: [`tcp`] (default),
//!   `rdma` (RC queue pairs over libibverbs, one data path for the `verbs`
//!   and `rdmacm` features), `fabric` (libfabric; feature `fabric`).
//! - With the cargo feature `fault-injection` (tests and the stress suite
//!   only): a second trait, of the transport methods that make real and
//!   imitated faults and corrupted units, apart from [`Transport`].
//!
//! All transports of a worker register their file descriptors (sockets,
//! completion channels, event channels, wait fds) in the worker's one
//! [`mio::Poll`]; the worker routes readiness back by token.
//!
//! # Layers
//!
//! Each module imports only from the layers below its own
//! (`tests/layering.rs`). Bottom first:
//!
//! 1. `error`, `event`, `dirty`, `regcache`, `queue_failure`, `split`, `shelf`, `region`, `sys`
//! 2. `wire`, `context`, `fault_injection`: what the backends share above
//!    the leaves (the last, the test hooks, only with the cargo feature
//!    `fault-injection`).
//! 3. `fabric`, `rdma`, `tcp`: the backends.
//! 4. `select`: which backend an address opens.

#![warn(missing_docs)]
// The socket helpers (`wire`, `sys`, `dirty`) serve TCP and the backends'
// out-of-band setup; a build without `tcp` leaves some unused. Dead code is
// still caught by the default and the every-feature builds.
#![cfg_attr(not(feature = "tcp"), allow(dead_code))]

// A messenger with no backend can open no link: say so once, rather than
// as a page of errors from the modules that need one.
#[cfg(not(any(
    feature = "tcp",
    feature = "verbs",
    feature = "rdmacm",
    feature = "fabric"
)))]
compile_error!(
    "msgr needs at least one backend: enable the cargo feature `tcp` (the default), \
     `fabric`, `verbs` or `rdmacm`"
);

#[cfg(any(
    feature = "tcp",
    feature = "verbs",
    feature = "rdmacm",
    feature = "fabric"
))]
mod context;
mod dirty;
mod error;
mod event;
#[cfg(feature = "fabric")]
pub mod fabric;
#[cfg(feature = "fault-injection")]
mod fault_injection;
#[cfg(any(feature = "verbs", feature = "rdmacm", feature = "fabric"))]
mod queue_failure;
#[cfg(any(feature = "verbs", feature = "rdmacm"))]
pub mod rdma;
#[cfg(any(feature = "verbs", feature = "rdmacm", feature = "fabric"))]
mod regcache;
mod region;
mod select;
#[cfg(any(feature = "tcp", feature = "verbs", feature = "rdmacm"))]
mod shelf;
#[cfg(any(feature = "verbs", feature = "rdmacm", feature = "fabric"))]
mod split;
mod sys;
#[cfg(feature = "tcp")]
pub mod tcp;
mod wire;

use std::time::Instant;

use enum_dispatch::enum_dispatch;
use mio::event::Event;
use mio::Token;

pub use context::{Availability, FabricCqWait, FabricRendezvous, RdmaPoolConfig, TransportContext};
pub use error::TransportError;
pub use event::{RmaFailure, TransportEvent};
#[cfg(feature = "fault-injection")]
pub use fault_injection::{FaultInjection, RealFault, SimulatedFault};
pub use msgr_proto::{Inbound, LinkId, Transmit};
pub use region::{RegionMemory, RegionRead, RegionWrite};
pub use select::{availability, open_transport, rendezvous_withheld};

use msgr_addr::{EntityAddr, TransportKind};

/// What every backend does. Methods never block.
///
/// The calls a worker makes on every pass of its loop ([`Transport::flush`],
/// [`Transport::ready`], [`Transport::progress`]) carry the pass's clock,
/// `now`, read once by the worker: deadlines and liveness stamps use it
/// instead of reading the clock per message. (Under the QEMU guest's TCG a
/// clock read costs about a microsecond; the RDMA backend read it three
/// times per pass.)
///
/// Link ids are chosen by the caller (the worker) and double as mio tokens for
/// backends whose links own a file descriptor, so they must be below
/// [`LISTENER_TOKEN_BASE`].
#[enum_dispatch]
pub trait Transport {
    /// Which transport this is.
    fn kind(&self) -> TransportKind;

    /// Starts listening on `addr`; returns the address actually bound (port 0
    /// is replaced by the chosen port). `token` is the listener's mio token.
    fn listen(&mut self, addr: &EntityAddr, token: Token) -> Result<EntityAddr, TransportError>;

    /// Stops listening on the listener registered with `token`.
    fn unlisten(&mut self, token: Token);

    /// Starts connecting `link` to `addr`; completion is reported as
    /// [`TransportEvent::Connected`] or [`TransportEvent::Failed`].
    fn connect(&mut self, link: LinkId, addr: &EntityAddr) -> Result<(), TransportError>;

    /// Queues a unit on `link`. Nothing is written until [`Transport::flush`],
    /// so many small frames go out in one system call or work-request batch.
    fn send(&mut self, link: LinkId, unit: Transmit) -> Result<(), TransportError>;

    /// Writes what is queued on every link with pending output. Errors are
    /// reported as [`TransportEvent::Failed`].
    fn flush(&mut self, now: Instant, events: &mut Vec<TransportEvent>);

    /// Handles readiness for one of this transport's tokens.
    fn ready(&mut self, event: &Event, now: Instant, events: &mut Vec<TransportEvent>);

    /// Makes progress without readiness (busy-poll window): poll completion
    /// queues, continue reads that were cut short, read a TCP transport's
    /// one or two links. Returns whether anything happened.
    fn progress(&mut self, now: Instant, events: &mut Vec<TransportEvent>) -> bool;

    /// Whether the busy-poll window must ask the worker's Poll on every
    /// pass for this transport's links to move: true where data arrives
    /// only as fd readiness (TCP sockets, unless the transport reads them in
    /// `progress`, see the `tcp` module). Transports that poll their
    /// completion queues in [`Transport::progress`] say false, and while
    /// every transport does, a spinning worker calls `epoll_wait` only every
    /// few passes (listeners, connection set-up and the waker can wait): on
    /// a 64 B shm ping-pong the system call, with the `sched_yield` of every
    /// idle pass, took a third of the spinning worker's time. Default: true.
    fn ready_every_pass(&self) -> bool {
        true
    }

    /// Called when the worker is about to block on its Poll after
    /// [`Transport::progress`] found nothing: arm wait objects that need it
    /// (`fi_trywait`). Returns false if something is pending already, and
    /// the worker polls again instead of blocking. Kept out of `progress`,
    /// which the busy-poll window calls in a tight loop. Default: true.
    fn arm(&mut self) -> bool {
        true
    }

    /// Whether data arriving for this transport wakes a sleeping worker (its
    /// wait objects, or a doorbell its peers ring, are in the worker's
    /// Poll). False for a provider without wait objects (libfabric's `shm`
    /// with a peer that does not ring, CQs opened without one), which is
    /// polled every millisecond or so while the worker sleeps: a worker
    /// with such a transport does not trade spinning for sleep when a busy
    /// thread shares its CPU (the worker's `spin` module). Default: true.
    fn wakes_the_worker(&self) -> bool {
        true
    }

    /// When this transport needs [`Transport::progress`] even if none of its
    /// fds becomes ready: a provider without wait objects must be polled, and
    /// a backend that keeps its own link deadlines must look at them. The
    /// worker never blocks past it. `None` (the default): fds say it all.
    fn wake_at(&self) -> Option<Instant> {
        None
    }

    /// Closes `link`. With `flush`, queued output is written first.
    fn close(&mut self, link: LinkId, flush: bool);

    /// Drops `link` abortively, as a broken connection would end: the peer
    /// sees a reset where the transport has one (TCP: `SO_LINGER` 0; RDMA:
    /// the QP to error), queued output is lost, and the link's failure
    /// is reported as [`TransportEvent::Failed`], unlike
    /// [`Transport::close`], so that its session reacts as to any fault.
    /// (An RDMA link still being set up has no QP yet and is left to its
    /// set-up.)
    fn abort(&mut self, link: LinkId) -> Result<(), TransportError>;

    /// Links closed with `flush` that this transport still holds, writing
    /// their last output, and counts in [`Transport::link_count`]. A
    /// worker that shuts down waits for them (to its deadline), then
    /// aborts the rest ([`Transport::abort_closing`]). Default: none (a
    /// backend that does not count such links as its own, or keeps none).
    fn closing_links(&self) -> usize {
        0
    }

    /// Closes every link still closing after a flush at once, as
    /// `close(link, false)` would, dropping what it had not written.
    /// Returns how many there were. Default: none.
    fn abort_closing(&mut self) -> usize {
        0
    }

    /// Stops (or resumes) reading `link` — receive throttling.
    fn pause_reading(&mut self, link: LinkId, paused: bool);

    /// Bytes queued on `link` and not yet handed to the network. The worker
    /// stops pulling frames from a session while this is high, so a full send
    /// queue stays in the session (once) instead of being copied here.
    fn backlog(&self, link: LinkId) -> usize;

    /// Whether `token` belongs to this transport.
    fn owns(&self, token: Token) -> bool;

    /// Links currently open (for leak checks).
    fn link_count(&self) -> usize;

    /// Takes `link` out of this transport so another worker can adopt it.
    /// Returns `None` if this backend's links cannot move between workers
    /// (their sessions then live on the accepting worker).
    fn detach(&mut self, link: LinkId) -> Option<DetachedLink>;

    /// Adopts a link detached from another worker's transport, under a new id.
    fn attach(&mut self, link: LinkId, detached: DetachedLink) -> Result<(), TransportError>;

    /// Opens the application memory `mem` of region `region` to one-sided
    /// operations by the peer at the other end of `link` (reads, and
    /// writes where `access` allows them and the backend moves them
    /// natively), on the endpoint that carries it (once per endpoint:
    /// later calls give the same key), and returns the key the peer passes
    /// to [`Transport::rma_read`] and [`Transport::rma_write`]. `None`
    /// where this link's endpoint has no native operations (the caller
    /// serves them itself). `mem` stays held, and registered, until
    /// [`Transport::rma_unexpose`] or the endpoint closes. Default: none.
    fn rma_expose(
        &mut self,
        link: LinkId,
        region: u64,
        mem: &std::sync::Arc<RegionMemory>,
        access: msgr_proto::rma::Access,
    ) -> Option<Vec<u8>> {
        let _ = (link, region, mem, access);
        None
    }

    /// Ends native access to `region` on every endpoint of this transport
    /// ([`Transport::rma_expose`]) and lets its memory go. Default: none.
    fn rma_unexpose(&mut self, region: u64) {
        let _ = region;
    }

    /// Starts a one-sided read of `len` bytes at `offset` of the region
    /// the peer at the other end of `link` exposed under `key`
    /// ([`Transport::rma_expose`] on its side). Completes with
    /// [`TransportEvent::RmaRead`] carrying `token`. Default: refused.
    fn rma_read(
        &mut self,
        link: LinkId,
        key: &[u8],
        offset: u64,
        len: u64,
        token: u64,
    ) -> Result<(), TransportError> {
        let _ = (link, key, offset, len, token);
        Err(TransportError::Unavailable {
            kind: self.kind(),
            reason: "no native one-sided reads on this backend".into(),
        })
    }

    /// Starts a one-sided write of `data` at `offset` of the region the
    /// peer at the other end of `link` exposed under `key`. Completes with
    /// [`TransportEvent::RmaWrite`] carrying `token` once the bytes are in
    /// the peer's memory. Refused where the key does not allow native
    /// writes (the caller asks the owner). Default: refused.
    fn rma_write(
        &mut self,
        link: LinkId,
        key: &[u8],
        offset: u64,
        data: &bytes::Bytes,
        token: u64,
    ) -> Result<(), TransportError> {
        let _ = (link, key, offset, data, token);
        Err(TransportError::Unavailable {
            kind: self.kind(),
            reason: "no native one-sided writes on this backend".into(),
        })
    }

    /// The backend's own counters and gauges (credits, pools, rendezvous...),
    /// for the messenger's metrics. Backends without any report none.
    fn stats(&self) -> TransportStats {
        TransportStats {
            kind: self.kind(),
            values: Vec::new(),
        }
    }
}

/// A backend's counters and gauges at one moment, by name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransportStats {
    /// The backend.
    pub kind: TransportKind,
    /// `(name, value)` pairs; names are snake_case and stable.
    pub values: Vec<(&'static str, u64)>,
}

/// Tokens at or above this value name listeners; below it, links.
pub const LISTENER_TOKEN_BASE: usize = 1 << 40;

/// A link in transit between two workers' transports.
#[derive(Debug)]
pub enum DetachedLink {
    /// A TCP connection and what was read from it but not yet decoded.
    #[cfg(feature = "tcp")]
    Tcp(tcp::DetachedTcp),
}

/// The backends compiled into this build.
// One per backend per worker, created once and never moved on a hot path:
// boxing the larger variants would only add an indirection to every call.
#[allow(clippy::large_enum_variant)]
#[enum_dispatch(Transport)]
#[cfg_attr(feature = "fault-injection", enum_dispatch(FaultInjection))]
pub enum AnyTransport {
    /// TCP.
    #[cfg(feature = "tcp")]
    Tcp(tcp::TcpTransport),
    /// libfabric, FI_EP_MSG endpoints (connected).
    #[cfg(feature = "fabric")]
    Fabric(fabric::FabricTransport),
    /// libfabric, FI_EP_RDM endpoints (links multiplexed on one endpoint).
    #[cfg(feature = "fabric")]
    FabricRdm(fabric::rdm::RdmTransport),
    /// RDMA: verbs (out-of-band setup over TCP) or rdmacm (setup by rdma_cm).
    #[cfg(any(feature = "verbs", feature = "rdmacm"))]
    Rdma(rdma::RdmaTransport),
}
