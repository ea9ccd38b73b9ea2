//! The state the MSG and RDM transports share, as data: a worker's
//! libfabric state ([`Shared`]) and a link's ([`LinkCommon`]). What they
//! do with it in common is `endpoint_kind`'s.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::Registry;
use msgr_addr::TransportKind;
use msgr_fabric::{Completion, Net, ReadRegion, RmaBuffers, RmaOp};
use msgr_proto::FrameLimits;

use super::outbox::Outbox;
use super::reassembly::Reassembly;

use super::rendezvous::{self, Counters, Exposures, Landed, Receiving};
use super::wait_fd::CqWaitFd;
use super::{LinkBudget, NetOptions, QueueFailures, CQ_BATCH};
use crate::regcache::RegCache;
use crate::{TransportContext, TransportError};

/// A worker's libfabric state, the same on both endpoint kinds.
pub(super) struct Shared {
    pub(super) net: Net,
    pub(super) kind: TransportKind,
    pub(super) registry: Registry,
    pub(super) limits: FrameLimits,
    pub(super) link_ids: Arc<AtomicU64>,
    /// What the configuration asked of the Net (to reopen it).
    pub(super) net_options: NetOptions,
    pub(super) queue_failures: QueueFailures,
    /// The bound on the links' buffers (`fabric_link_bytes`).
    pub(super) link_budget: LinkBudget,
    /// The CQ's wait fds, in the Poll only while the worker sleeps.
    pub(super) cq_wait: CqWaitFd,
    /// The batch `fi_cq_read` fills, kept between reads.
    pub(super) completions: Vec<Completion>,
    /// The clock of the worker's current pass: liveness stamps and
    /// deadlines read it, not the clock.
    pub(super) now: Instant,
    /// How large units go by rendezvous (the endpoints have FI_RMA with
    /// reads or writes), if they do.
    pub(super) rndv: Option<RmaOp>,
    /// Rendezvous units moved (for tests and counters).
    pub(super) rndv_counters: Counters,
    /// Registrations of payloads exposed in place, kept for their next
    /// send where the provider checks keys (`rdma_reg_cache_bytes`;
    /// cleared with the transport, see each transport's `Drop`).
    pub(super) reg_cache: RegCache<ReadRegion>,
    /// A rendezvous read in flight longer than this fails its link.
    pub(super) read_timeout: Duration,
}

impl Shared {
    /// The state of a worker that opened `net` (by `open_worker`), whose
    /// links each hold `per_link` bytes of buffers.
    pub(super) fn new(
        (kind, net_options, net, registry): (TransportKind, NetOptions, Net, Registry),
        cq_wait: CqWaitFd,
        per_link: usize,
        ctx: &TransportContext,
    ) -> Self {
        Shared {
            rndv: net.rma(),
            net,
            kind,
            registry,
            limits: ctx.limits,
            link_ids: ctx.link_ids.clone(),
            net_options,
            queue_failures: QueueFailures::default(),
            link_budget: LinkBudget::new(per_link, ctx.rdma.fabric_link_bytes),
            cq_wait,
            completions: Vec::with_capacity(CQ_BATCH),
            now: Instant::now(),
            rndv_counters: Counters::default(),
            reg_cache: RegCache::new(ctx.rdma.reg_cache_bytes),
            read_timeout: ctx.rdma.read_timeout,
        }
    }

    /// A rendezvous unit of `link` (`None`: the link went) under `context`
    /// landed in `rma` ([`rendezvous::landed`], with this worker's limits
    /// and counters).
    pub(super) fn landed(
        &mut self,
        link: Option<&mut LinkCommon>,
        rma: &mut RmaBuffers,
        context: u64,
        error: Option<(i32, &'static str)>,
    ) -> Landed {
        let link = link.map(|l| (&mut l.receiving, &mut l.reasm));
        let (limits, counters) = (&self.limits, &mut self.rndv_counters);
        rendezvous::landed(link, rma, context, error, limits, counters)
    }

    /// What a call on a transport that cannot do it fails with.
    pub(super) fn unavailable(&self, reason: impl Into<String>) -> TransportError {
        TransportError::Unavailable {
            kind: self.kind.clone(),
            reason: reason.into(),
        }
    }
}

/// A link's state, the same on both endpoint kinds.
#[derive(Debug)]
pub(super) struct LinkCommon {
    /// Encoded units waiting for a transmit slot.
    pub(super) outbox: Outbox,
    /// Pieces of a unit split over several messages.
    pub(super) reasm: Reassembly,
    pub(super) paused: bool,
    pub(super) frozen: bool,
    pub(super) close_after_flush: bool,
    /// Rendezvous, sending side: units exposed for the peer to read.
    pub(super) exposures: Exposures,
    /// Rendezvous, receiving side: the fi_read in flight (later messages
    /// wait for it) and the RNDV_DONE answers owed.
    pub(super) receiving: Receiving,
    /// When the peer was last heard from: a polled CQ is looked at at
    /// once only for links heard from lately.
    pub(super) last_heard: Instant,
    /// How the peer moves rendezvous units (its connection data, HELLO or
    /// WELCOME said so, see [`super::rendezvous::caps`]); known before
    /// any data is sent.
    pub(super) peer_rndv: Option<RmaOp>,
    /// The peer takes a unit's epilogue after its descriptor
    /// ([`super::rendezvous::peer_late_epilogue`]).
    pub(super) peer_late: bool,
}

impl LinkCommon {
    pub(super) fn new(now: Instant) -> Self {
        LinkCommon {
            outbox: Outbox::default(),
            reasm: Reassembly::default(),
            paused: false,
            frozen: false,
            close_after_flush: false,
            exposures: Exposures::default(),
            receiving: Receiving::default(),
            last_heard: now,
            peer_rndv: None,
            peer_late: false,
        }
    }
}
