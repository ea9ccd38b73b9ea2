//! Fault injection, for tests and the stress suite (cargo feature
//! `fault-injection`; a default build has none of it): the faults a
//! backend produces for real ([`RealFault`]) or imitates
//! ([`SimulatedFault`]) on a link, and [`FaultInjection`], the trait of
//! the transport methods that make them, apart from [`Transport`] so that
//! no production path can call them.

use msgr_proto::{LinkId, Transmit};

use crate::{Transport, TransportError};

/// A fault a backend can produce for real on one of its links, for tests and
/// the stress suite's fault plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RealFault {
    /// Abortive close: the peer sees a reset (TCP: SO_LINGER 0; RDMA: QP to error).
    Abort,
    /// Close our sending direction only (TCP half-close).
    HalfClose,
    /// Stop reading from the peer (its sends back up).
    StopReading,
    /// Stop reading and writing, as a hung or frozen peer process would: the
    /// connection stays up but nothing moves.
    Freeze,
}

/// A fault a backend cannot produce for real, imitated inside the backend so
/// that the code meant to handle it runs in tests. It is not the real thing:
/// a test that uses one says so, and a backend that cannot imitate it
/// refuses it (its transport's `simulate` returns an error; a messenger's
/// `Connection::simulate_fault` then leaves the link as it is).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SimulatedFault {
    /// RDMA: the next rendezvous read this end of the link starts never
    /// completes, as if the responder never answered. Each injection hangs
    /// one more read. Only the completion is ignored: the read itself runs,
    /// so its buffer stays registered and owned by the link until the link's
    /// QP is destroyed. The read deadline (`rdma_read_timeout_ms`) must then
    /// fail the link. Real RC transports (rxe, siw, hardware) end an
    /// unanswered read with an error completion once their retries run out,
    /// which is why this cannot be produced for real.
    ///
    /// libfabric (`fabric` MSG and RDM endpoints with the `fi_read`
    /// rendezvous): the same, for the link's next `fi_read`; its buffer is
    /// freed when the ignored completion comes (the provider is done with
    /// it) or with the endpoint. `tcp` and `tcp;ofi_rxm` end a read whose
    /// connection breaks with an error completion, so this is a fake too.
    /// Endpoints without rendezvous (`shm`) refuse it.
    HungRead,
    /// The next read of the completion queue of the transport carrying
    /// the link fails, as `fi_cq_read` (libfabric) or `ibv_poll_cq` (RDMA)
    /// on a broken queue would (`EIO`). Every link on that transport then
    /// fails with the error (counted in `cq_failures`), since the fates of
    /// their posted operations are unknown, and sessions recover per
    /// policy. No provider or device here can be made to fail a queue read
    /// for real, hence the fake. TCP has no such queue and refuses it.
    CqReadError,
}

/// The test hooks of a transport: real and imitated faults on its links,
/// and corrupted units. Every backend implements it, as it does
/// [`Transport`]; [`crate::AnyTransport`] dispatches it the same way.
#[enum_dispatch::enum_dispatch]
pub trait FaultInjection: Transport {
    /// Produces a real fault on `link`.
    fn inject(&mut self, link: LinkId, fault: RealFault) -> Result<(), TransportError>;

    /// Imitates a fault this backend cannot produce for real on `link`.
    /// Default: refused, as unavailable.
    fn simulate(&mut self, link: LinkId, fault: SimulatedFault) -> Result<(), TransportError> {
        let _ = link;
        Err(TransportError::Unavailable {
            kind: self.kind(),
            reason: format!("this backend cannot simulate {fault:?}"),
        })
    }

    /// Queues `unit` with bit `bit` (modulo its encoded length) flipped after
    /// encoding, as line noise would: the receiver's CRC checks must catch it.
    fn send_corrupted(
        &mut self,
        link: LinkId,
        unit: Transmit,
        bit: u64,
    ) -> Result<(), TransportError>;
}
