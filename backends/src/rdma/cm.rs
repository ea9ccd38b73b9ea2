//! The rdmacm backend's connection setup: rdma_cm resolves the address and
//! the route, moves the QP through its states on connect/accept, and reports
//! the peer's disconnect; its event channel fd sits in the worker's mio Poll
//! beside the completion channel.
//!
//! The connect request and the accept carry [`LinkParams`] as private data
//! (credits, chunk size, read depth). Works over RoCE (rxe) and iWARP (siw):
//! no immediate data is used, and on iWARP the accepting side holds its
//! sends until the connector's first message has arrived (MPA lets only the
//! active side speak first).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::unix::SourceFd;
use mio::{Interest, Token};
use msgr_addr::{EntityAddr, TransportKind};
use msgr_proto::{LinkFailure, LinkId};
use msgr_rdma::{CmEvent, CmEventKind, CmId, ConnParam, Context, EventChannel, PortSpace};
use rustc_hash::FxHashMap;

use super::conn::{cm_err, CmConn, CmStep, Conn};
use super::device::Device;
use super::link::RdmaLink;
use super::listen::Listeners;
use super::{LinkParams, RdmaTransport};
use crate::{TransportError, TransportEvent};

/// Bound on address and route resolution.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(2);

/// The transport's rdma_cm state: one event channel for every id.
pub(crate) struct CmState {
    channel: Arc<EventChannel>,
    token: Token,
    /// Listening ids, with the worker's listener tokens.
    pub(super) listeners: Listeners,
    /// Connection ids by handle.
    links: FxHashMap<usize, LinkId>,
    /// Ids of released links whose connect or accept had no answer yet,
    /// with when they were parked: destroyed on their next event, or after
    /// [`PARK_GRACE`]. The kernel's iWARP CM makes `rdma_destroy_id` sleep
    /// while a connect or accept downcall is outstanding (until the MPA
    /// exchange ends), and a worker asleep there stalls all its sessions.
    parked: FxHashMap<usize, (CmId, Instant)>,
}

/// How long a parked id waits for its event before it is destroyed anyway.
const PARK_GRACE: Duration = Duration::from_secs(30);

impl CmState {
    pub(crate) fn token(&self) -> Token {
        self.token
    }

    pub(crate) fn owns_listener(&self, token: Token) -> bool {
        self.listeners.owns(token)
    }

    pub(super) fn channel(&self) -> Arc<EventChannel> {
        self.channel.clone()
    }

    pub(crate) fn forget(&mut self, handle: usize) {
        self.links.remove(&handle);
    }

    pub(crate) fn fd(&self) -> std::os::fd::RawFd {
        self.channel.fd()
    }
}

fn cm(l: &mut RdmaLink) -> Option<&mut CmConn> {
    match &mut l.conn {
        Conn::Cm(c) => Some(c),
        Conn::Oob(_) => None,
    }
}

impl RdmaTransport {
    /// The event channel, created and registered at first use.
    pub(super) fn cm_state(&mut self) -> Result<&mut CmState, TransportError> {
        if self.setup.cm.is_none() {
            let channel =
                EventChannel::new().map_err(|e| cm_err("rdma_create_event_channel", e))?;
            channel
                .set_nonblocking()
                .map_err(|e| cm_err("rdma_cm channel", e))?;
            let token = Token(self.link_ids.fetch_add(1, Ordering::Relaxed) as usize);
            self.registry
                .register(&mut SourceFd(&channel.fd()), token, Interest::READABLE)
                .map_err(|e| TransportError::io("register rdma_cm channel", e))?;
            self.setup.cm = Some(CmState {
                channel,
                token,
                listeners: Listeners::default(),
                links: FxHashMap::default(),
                parked: FxHashMap::default(),
            });
        }
        Ok(self.setup.cm.as_mut().expect("just made"))
    }

    /// Opens the transport's device from the one rdma_cm picked for `id`.
    pub(super) fn cm_device(&mut self, id: &CmId) -> Result<(), TransportError> {
        let Some(ctx) = id.context() else {
            return Err(TransportError::Unavailable {
                kind: TransportKind::RdmaCm,
                reason: "rdma_cm bound no RDMA device to this address".into(),
            });
        };
        match &self.dev {
            Some(d) if d.ctx.name() != ctx.name() => Err(TransportError::Unavailable {
                kind: TransportKind::RdmaCm,
                reason: format!(
                    "this worker's rdmacm transport uses {}, the address routes to {}: \
                     one device per transport",
                    d.ctx.name(),
                    ctx.name()
                ),
            }),
            Some(_) => Ok(()),
            None => {
                let ctx = self.cm_anchor(id, &ctx).unwrap_or(ctx);
                let d = Device::with_context(ctx, id.port_num(), &self.params.pools)
                    .map_err(|e| cm_err("open rdma_cm device", e))?;
                self.install_device(d)
            }
        }
    }

    /// The device context of `id` (`found`), taken instead from an id of
    /// the transport's own bound to the same address. A context keeps the
    /// id it came from alive for as long as the device is open, and the
    /// listener or link that happened to find the device must stay free to
    /// go: a listener siw lost has to be destroyed before its port can be
    /// listened on again (`listen`). `None`: keep `found`.
    fn cm_anchor(&mut self, id: &CmId, found: &Context) -> Option<Arc<Context>> {
        let ip = id.local_addr()?.ip();
        let channel = self.cm_state().ok()?.channel();
        let anchor = CmId::new(&channel, PortSpace::Tcp).ok()?;
        anchor.bind_addr(std::net::SocketAddr::new(ip, 0)).ok()?;
        anchor.context().filter(|c| c.name() == found.name())
    }

    /// A QP for `id` on the shared CQ and receive queue, and the link's share.
    fn cm_qp(&mut self, id: &CmId) -> Result<(msgr_rdma::QueuePair, u32), TransportError> {
        let dev = self.dev.as_mut().expect("device opened");
        let share = dev
            .take_share()
            .ok_or_else(|| self.counters.share_refused(&TransportKind::RdmaCm))?;
        let pd = dev.pd.clone();
        match dev.create_qp(|init| id.create_qp(&pd, init)) {
            Ok(qp) => Ok((qp, share)),
            Err(e) => {
                dev.return_share(share);
                Err(cm_err("rdma_create_qp", e))
            }
        }
    }

    fn conn_param(&self, l: &RdmaLink, peer_depth: Option<(u8, u8)>) -> ConnParam {
        let rd = self.dev.as_ref().map_or(1, |d| d.rd_atomic);
        let (resp, init) = match peer_depth {
            // Accept: answer the requester's initiator depth with at most as
            // many responder resources, and vice versa.
            Some((peer_init, peer_resp)) => (peer_init.min(rd), peer_resp.min(rd)),
            None => (rd, rd),
        };
        ConnParam {
            private_data: self.my_params(l).encode().to_vec(),
            responder_resources: resp,
            initiator_depth: init,
            retry_count: self.params.pools.retry_count,
            ..ConnParam::default()
        }
    }

    pub(super) fn cm_listen(
        &mut self,
        addr: &EntityAddr,
        token: Token,
    ) -> Result<EntityAddr, TransportError> {
        let mut bound = addr.clone();
        bound.socket = self.cm_listen_at(addr.socket, token)?;
        Ok(bound)
    }

    pub(super) fn cm_unlisten(&mut self, token: Token) {
        if let Some(cm) = self.setup.cm.as_mut() {
            cm.listeners.remove_token(token);
        }
    }

    pub(super) fn cm_connect(
        &mut self,
        link: LinkId,
        addr: &EntityAddr,
    ) -> Result<(), TransportError> {
        let channel = self.cm_state()?.channel.clone();
        let id = CmId::new(&channel, PortSpace::Tcp).map_err(|e| cm_err("rdma_create_id", e))?;
        id.resolve_addr(None, addr.socket, RESOLVE_TIMEOUT)
            .map_err(|e| cm_err("rdma_resolve_addr", e))?;
        let handle = id.handle();
        let l = RdmaLink::new(
            Conn::Cm(CmConn {
                id,
                step: CmStep::ResolvingAddr,
            }),
            true,
            None,
            0,
        );
        self.insert_link(link, l);
        self.setup
            .cm
            .as_mut()
            .expect("made above")
            .links
            .insert(handle, link);
        Ok(())
    }

    /// Reads every pending rdma_cm event.
    pub(super) fn cm_ready(&mut self, events: &mut Vec<TransportEvent>) {
        loop {
            let Some(cm) = self.setup.cm.as_ref() else {
                return;
            };
            match cm.channel.get_event() {
                Ok(Some(ev)) => self.on_cm_event(ev, events),
                Ok(None) => return,
                Err(e) => {
                    tracing::error!(error = %e, "rdma_get_cm_event failed");
                    return;
                }
            }
        }
    }

    fn on_cm_event(&mut self, ev: CmEvent, events: &mut Vec<TransportEvent>) {
        let cm = self
            .setup
            .cm
            .as_mut()
            .expect("events come from the channel");
        if ev.kind == CmEventKind::ConnectRequest {
            let token = cm.listeners.token_of(ev.listen_handle);
            if let (Some(token), Some(new_id)) = (token, ev.new_id) {
                self.counters.connect_requests += 1;
                let depth = (ev.initiator_depth, ev.responder_resources);
                if let Err(why) = self.cm_accept(token, new_id, &ev.private_data, depth) {
                    self.counters.accepts_failed += 1;
                    tracing::warn!(%why, "refused an rdma_cm connection");
                }
            }
            return;
        }
        let Some(&id) = cm.links.get(&ev.id_handle) else {
            // A listener's or a released link's event; a parked id's
            // connect or accept has its answer: it may go now.
            cm.parked.remove(&ev.id_handle);
            return;
        };
        if let Err(why) = self.on_link_cm_event(id, &ev, events) {
            self.poll_cq(events);
            self.fail(id, why, events);
        }
    }

    fn on_link_cm_event(
        &mut self,
        id: LinkId,
        ev: &CmEvent,
        events: &mut Vec<TransportEvent>,
    ) -> Result<(), LinkFailure> {
        let failed = || LinkFailure::Setup(format!("rdma_cm: {} (status {})", ev.name, ev.status));
        if ev.status != 0 && ev.kind != CmEventKind::Disconnected {
            return Err(failed());
        }
        let chunk = self.params.pools.chunk_size;
        let gone = || LinkFailure::Local("link gone".into());
        let l = self.links.get_mut(&id).ok_or_else(gone)?;
        let c = cm(l).ok_or_else(|| LinkFailure::Local("not an rdma_cm link".into()))?;
        match (ev.kind, c.step) {
            (CmEventKind::AddrResolved, CmStep::ResolvingAddr) => {
                c.step = CmStep::ResolvingRoute;
                self.with_cm_id(id, |t, cmid| t.cm_device(cmid))?;
                let c = cm(self.links.get_mut(&id).expect("present")).expect("cm");
                c.id.resolve_route(RESOLVE_TIMEOUT)
                    .map_err(|e| LinkFailure::Setup(format!("rdma_resolve_route: {e}")))?;
            }
            (CmEventKind::RouteResolved, CmStep::ResolvingRoute) => {
                let (qp, share) = self.with_cm_id(id, |t, cmid| t.cm_qp(cmid))?;
                self.register_qp(id, &qp);
                let l = self.links.get_mut(&id).expect("present");
                l.qp = Some(qp);
                l.share = share;
                l.flow.peer_credits = l.initial_credits();
                let param = self.conn_param(self.links.get(&id).expect("present"), None);
                let ack_timeout = self.params.pools.ack_timeout;
                let c = cm(self.links.get_mut(&id).expect("present")).expect("cm");
                set_ack_timeout(&c.id, ack_timeout);
                c.id.connect(&param)
                    .map_err(|e| LinkFailure::Setup(format!("rdma_connect: {e}")))?;
                c.step = CmStep::Connecting;
            }
            (CmEventKind::Established, CmStep::Connecting) => {
                let peer = LinkParams::decode(&ev.private_data, chunk)?;
                c.step = CmStep::Up;
                l.flow.credits = peer.credits;
                self.mark_up(id, events);
            }
            (CmEventKind::Established, CmStep::Accepting) => {
                c.step = CmStep::Up;
                self.mark_up(id, events);
            }
            // The acceptor may have come up on its first receive already.
            (CmEventKind::Established, CmStep::Up) => {}
            (CmEventKind::TimewaitExit | CmEventKind::AddrChange, _) => {}
            (CmEventKind::Disconnected, _) => {
                let why = "peer disconnected (rdma_cm)";
                return Err(LinkFailure::ClosedByPeer(why.into()));
            }
            _ => return Err(failed()),
        }
        Ok(())
    }

    /// Runs `f` with link `id`'s rdma_cm id (the link is out of the map meanwhile).
    fn with_cm_id<T>(
        &mut self,
        id: LinkId,
        f: impl FnOnce(&mut Self, &CmId) -> Result<T, TransportError>,
    ) -> Result<T, LinkFailure> {
        let l = self
            .links
            .remove(&id)
            .ok_or(LinkFailure::Local("link gone".into()))?;
        let res = match &l.conn {
            Conn::Cm(c) => f(self, &c.id).map_err(|e| LinkFailure::Setup(e.to_string())),
            Conn::Oob(_) => Err(LinkFailure::Local("not an rdma_cm link".into())),
        };
        self.links.insert(id, l);
        res
    }

    fn cm_accept(
        &mut self,
        token: Token,
        new_id: CmId,
        private_data: &[u8],
        depth: (u8, u8),
    ) -> Result<(), LinkFailure> {
        let peer = match LinkParams::decode(private_data, self.params.pools.chunk_size) {
            Ok(p) => p,
            Err(why) => {
                let _ = new_id.reject(b"msgr: bad link parameters");
                return Err(why);
            }
        };
        let qp_share = self.cm_device(&new_id).and_then(|()| self.cm_qp(&new_id));
        let (qp, share) = match qp_share {
            Ok(x) => x,
            Err(e) => {
                let _ = new_id.reject(b"msgr: no resources");
                return Err(LinkFailure::Setup(e.to_string()));
            }
        };
        let link = LinkId(self.link_ids.fetch_add(1, Ordering::Relaxed));
        let handle = new_id.handle();
        let iwarp = self.dev.as_ref().is_some_and(|d| d.ctx.is_iwarp());
        self.register_qp(link, &qp);
        let mut l = RdmaLink::new(
            Conn::Cm(CmConn {
                id: new_id,
                step: CmStep::Accepting,
            }),
            false,
            Some(qp),
            share,
        );
        l.flow.credits = peer.credits;
        l.listener = Some(token);
        l.hold_tx = iwarp;
        let param = self.conn_param(&l, Some(depth));
        self.insert_link(link, l);
        self.setup
            .cm
            .as_mut()
            .expect("present")
            .links
            .insert(handle, link);
        let ack_timeout = self.params.pools.ack_timeout;
        let c = cm(self.links.get_mut(&link).expect("present")).expect("cm");
        set_ack_timeout(&c.id, ack_timeout);
        if let Err(e) = c.id.accept(&param) {
            let why = LinkFailure::Setup(format!("rdma_accept: {e}"));
            self.drop_link(link);
            return Err(why);
        }
        Ok(())
    }

    /// Whether an acceptor's first receive may stand for `Established` (the
    /// event can come after the connector's first send has landed).
    pub(super) fn cm_may_accept_on_recv(l: &mut RdmaLink) -> bool {
        match cm(l) {
            Some(c) if c.step == CmStep::Accepting => {
                c.step = CmStep::Up;
                true
            }
            _ => false,
        }
    }

    /// Tears down an rdma_cm link's connection (the peer gets `Disconnected`).
    pub(super) fn cm_release(&mut self, c: &CmConn) {
        if c.step == CmStep::Up || c.step == CmStep::Accepting || c.step == CmStep::Connecting {
            let _ = c.id.disconnect();
        }
        if let Some(cm) = self.setup.cm.as_mut() {
            cm.forget(c.id.handle());
        }
    }

    /// The last step of releasing an rdma_cm link, after its QP went: its
    /// id is destroyed now, or parked (see [`CmState::parked`]) while its
    /// connect or accept may still be outstanding.
    pub(super) fn cm_destroy(&mut self, c: CmConn) {
        let pending = matches!(c.step, CmStep::Connecting | CmStep::Accepting);
        match self.setup.cm.as_mut() {
            Some(cm) if pending => {
                cm.parked.insert(c.id.handle(), (c.id, Instant::now()));
                self.counters.cm_ids_parked += 1;
            }
            _ => drop(c),
        }
    }

    /// Destroys parked ids that waited [`PARK_GRACE`] for their event.
    pub(super) fn reap_parked(&mut self, now: Instant) {
        if let Some(cm) = self.setup.cm.as_mut() {
            cm.parked
                .retain(|_, (_, since)| now.saturating_duration_since(*since) < PARK_GRACE);
        }
    }

    /// The peer address of an accepted rdma_cm link.
    pub(super) fn cm_peer(c: &CmConn) -> Option<std::net::SocketAddr> {
        c.id.peer_addr()
    }
}

/// Gives `id` the configured ACK timeout, if one is (`rdma_ack_timeout`).
/// Best effort: a device that refuses it (iWARP's transport retransmits on
/// its own) keeps rdma_cm's, and the link goes on.
fn set_ack_timeout(id: &CmId, code: Option<u8>) {
    if let Some(code) = code {
        if let Err(e) = id.set_ack_timeout(code) {
            tracing::debug!(code, error = %e, "ACK timeout not set; rdma_cm's stays");
        }
    }
}
