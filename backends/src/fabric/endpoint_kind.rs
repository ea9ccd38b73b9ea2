//! One implementation of [`Transport`] over either endpoint kind, as
//! `user_rma` is for reads: [`EndpointKind`] says what differs between
//! `FI_EP_MSG` (`msg`: one connected endpoint per link) and `FI_EP_RDM`
//! (`rdm`: endpoints the links share) — how links are set up and listened
//! for, how the queues are polled, armed and woken for, and where a link's
//! endpoint is; the rest is here once.

use std::sync::Arc;
use std::time::Instant;

use mio::event::Event;
use mio::Token;
use msgr_addr::{EntityAddr, TransportKind};
use msgr_fabric::RmaBuffers;
use msgr_proto::{LinkFailure, LinkId, Transmit};

use super::no_migration;
use super::queueing::{QueuedLink, Queueing};
use super::user_rma::UserExposures;
#[cfg(feature = "fault-injection")]
use super::{no_half_close, simulate_fault};
use crate::{DetachedLink, Transport, TransportError, TransportEvent, TransportStats};
#[cfg(feature = "fault-injection")]
use crate::{RealFault, SimulatedFault};

/// A read of a peer's region ([`Transport::rma_read`]): the link, the
/// region's key, the range (offset, length) and the caller's token.
pub(super) type UserRead<'a> = (LinkId, &'a [u8], (u64, u64), u64);

/// What one endpoint kind's transport does its own way.
pub(super) trait EndpointKind: Queueing {
    /// Why a link fails that [`Transport::abort`] dropped.
    const ABORTED: &'static str;

    /// Removes a link and what it holds.
    fn drop_link(&mut self, id: LinkId) -> Option<Self::Link>;
    /// Reads the queues and hands up what came: whether anything did.
    fn poll_all(&mut self, now: Instant, events: &mut Vec<TransportEvent>) -> bool;
    /// [`Transport::listen`].
    fn open_listener(
        &mut self,
        addr: &EntityAddr,
        token: Token,
    ) -> Result<EntityAddr, TransportError>;
    /// [`Transport::unlisten`].
    fn close_listener(&mut self, token: Token);
    /// [`Transport::connect`], once the link budget admitted the link.
    fn dial(&mut self, link: LinkId, addr: &EntityAddr) -> Result<(), TransportError>;
    /// [`Transport::flush`].
    fn flush_pass(&mut self, now: Instant, events: &mut Vec<TransportEvent>);
    /// What a readiness `event` of one of its tokens says, before the poll.
    fn woken(&mut self, _event: &Event) {}
    /// [`Transport::arm`].
    fn arm_wait(&mut self) -> bool;
    /// Whether something besides the CQ's wait fd wakes the worker.
    fn wakes_otherwise(&self) -> bool {
        false
    }
    /// [`Transport::wake_at`].
    fn next_wake(&self) -> Option<Instant>;
    /// Whether `token` is one of its own, besides the CQ's.
    fn owns_token(&self, token: Token) -> bool;
    /// The regions open on `link`'s endpoint, and its buffers.
    fn user_exposures(&mut self, link: LinkId) -> Option<(&mut UserExposures, &mut RmaBuffers)>;
    /// Closes `region` on every endpoint.
    fn unexpose_everywhere(&mut self, region: u64);
    /// [`Transport::rma_read`] on a link that exists.
    fn start_user_read(&mut self, read: UserRead<'_>) -> Result<(), TransportError>;
    /// Its own counters, after the shared ones.
    fn more_stats(&self, _values: &mut Vec<(&'static str, u64)>) {}
}

/// A transport's `Debug`: its kind and number of links.
pub(super) fn debug<K: EndpointKind>(
    k: &K,
    name: &str,
    f: &mut std::fmt::Formatter<'_>,
) -> std::fmt::Result {
    f.debug_struct(name)
        .field("kind", &k.shared().kind)
        .field("links", &k.links().len())
        .finish()
}

impl<K: EndpointKind> Transport for K {
    fn kind(&self) -> TransportKind {
        self.shared().kind.clone()
    }

    fn listen(&mut self, addr: &EntityAddr, token: Token) -> Result<EntityAddr, TransportError> {
        self.open_listener(addr, token)
    }

    fn unlisten(&mut self, token: Token) {
        self.close_listener(token)
    }

    fn connect(&mut self, link: LinkId, addr: &EntityAddr) -> Result<(), TransportError> {
        let (shared, _, links) = self.parts();
        if !shared.link_budget.admits(links.len()) {
            return Err(shared.link_budget.refusal(links.len()));
        }
        self.dial(link, addr)
    }

    fn send(&mut self, link: LinkId, unit: Transmit) -> Result<(), TransportError> {
        self.send_unit(link, unit)
    }

    fn flush(&mut self, now: Instant, events: &mut Vec<TransportEvent>) {
        self.flush_pass(now, events)
    }

    fn ready(&mut self, event: &Event, now: Instant, events: &mut Vec<TransportEvent>) {
        self.woken(event);
        self.poll_all(now, events);
    }

    fn progress(&mut self, now: Instant, events: &mut Vec<TransportEvent>) -> bool {
        self.poll_all(now, events)
    }

    /// `progress` reads the queues itself.
    fn ready_every_pass(&self) -> bool {
        false
    }

    fn arm(&mut self) -> bool {
        self.arm_wait()
    }

    /// Not with a polled CQ (no wait object, as over `shm`, or
    /// `fabric_cq_wait = poll`) or a wait fd that could not be registered,
    /// unless something else wakes it (RDM's doorbells).
    fn wakes_the_worker(&self) -> bool {
        let shared = self.shared();
        !(shared.net.cq_polled() || shared.cq_wait.failed()) || self.wakes_otherwise()
    }

    fn wake_at(&self) -> Option<Instant> {
        self.next_wake()
    }

    fn close(&mut self, link: LinkId, flush: bool) {
        let (_, out, links) = self.parts();
        let Some(l) = links.get_mut(&link) else {
            return;
        };
        if flush && l.up() && !l.common().frozen && !l.idle() {
            l.common_mut().close_after_flush = true;
            out.dirty.push(link);
        } else {
            self.drop_link(link);
        }
    }

    fn pause_reading(&mut self, link: LinkId, paused: bool) {
        let (_, out, links) = self.parts();
        if let Some(l) = links.get_mut(&link) {
            if l.common().frozen {
                return;
            }
            l.common_mut().paused = paused;
            if !paused && l.holds_received() {
                out.resumed.push(link);
            }
        }
    }

    fn backlog(&self, link: LinkId) -> usize {
        let l = self.links().get(&link);
        l.map_or(0, |l| l.common().outbox.backlog())
    }

    fn owns(&self, token: Token) -> bool {
        token == self.shared().cq_wait.token() || self.owns_token(token)
    }

    /// Links closed with `flush` whose last sends are still in flight are
    /// not counted: they are no longer the worker's (as a closed TCP
    /// socket's unsent bytes belong to the kernel) and go when their sends
    /// complete, or with the transport.
    fn link_count(&self) -> usize {
        let open = self.links().values();
        open.filter(|l| !l.common().close_after_flush).count()
    }

    fn abort(&mut self, link: LinkId) -> Result<(), TransportError> {
        if !self.links().contains_key(&link) {
            return Err(TransportError::NoSuchLink(link.0));
        }
        self.drop_link(link);
        let why = LinkFailure::Local(Self::ABORTED.into());
        self.out()
            .deferred_events
            .push(TransportEvent::Failed(link, why));
        Ok(())
    }

    fn detach(&mut self, _link: LinkId) -> Option<DetachedLink> {
        None
    }

    fn attach(&mut self, link: LinkId, detached: DetachedLink) -> Result<(), TransportError> {
        let _ = (link, detached);
        Err(no_migration(&self.shared().kind))
    }

    fn rma_expose(
        &mut self,
        link: LinkId,
        region: u64,
        mem: &Arc<crate::RegionMemory>,
        access: msgr_proto::rma::Access,
    ) -> Option<Vec<u8>> {
        let (user, rma) = self.user_exposures(link)?;
        user.expose(rma, region, &mem.view(), access)
    }

    fn rma_unexpose(&mut self, region: u64) {
        self.unexpose_everywhere(region)
    }

    fn rma_read(
        &mut self,
        link: LinkId,
        key: &[u8],
        offset: u64,
        len: u64,
        token: u64,
    ) -> Result<(), TransportError> {
        if !self.links().contains_key(&link) {
            return Err(TransportError::NoSuchLink(link.0));
        }
        self.start_user_read((link, key, (offset, len), token))
    }

    fn stats(&self) -> TransportStats {
        let shared = self.shared();
        let mut values = shared
            .rndv_counters
            .values(shared.rndv.is_some(), shared.net.rma_in_use());
        values.extend(shared.queue_failures.values());
        values.extend(shared.reg_cache.values());
        values.extend(shared.link_budget.values());
        self.more_stats(&mut values);
        TransportStats {
            kind: shared.kind.clone(),
            values,
        }
    }
}

#[cfg(feature = "fault-injection")]
impl<K: EndpointKind> crate::FaultInjection for K {
    fn inject(&mut self, link: LinkId, fault: RealFault) -> Result<(), TransportError> {
        let (shared, _, links) = self.parts();
        let l = links
            .get_mut(&link)
            .ok_or(TransportError::NoSuchLink(link.0))?;
        match fault {
            RealFault::Abort => self.abort(link)?,
            RealFault::HalfClose => return Err(no_half_close(&shared.kind)),
            RealFault::StopReading => l.common_mut().paused = true,
            RealFault::Freeze => l.common_mut().frozen = true,
        }
        Ok(())
    }

    /// As on both endpoint types (`simulate_fault`).
    fn simulate(&mut self, link: LinkId, fault: SimulatedFault) -> Result<(), TransportError> {
        let (shared, _, links) = self.parts();
        let receiving = links.get_mut(&link).map(|l| &mut l.common_mut().receiving);
        let (rndv, kind) = (shared.rndv.is_some(), &shared.kind);
        simulate_fault(
            receiving,
            link,
            fault,
            rndv,
            kind,
            &mut shared.queue_failures,
        )
    }

    fn send_corrupted(
        &mut self,
        link: LinkId,
        unit: Transmit,
        bit: u64,
    ) -> Result<(), TransportError> {
        let bytes = crate::wire::corrupted(unit, bit)?;
        self.queue(link, super::rendezvous::OutUnit::Flat(bytes))
    }
}
