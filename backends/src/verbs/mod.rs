//! The verbs backend: RC queue pairs connected by an out-of-band TCP exchange
//! (as Ceph's RDMAStack does), eager sends through pre-registered chunks,
//! credit-based flow control, one completion queue per transport.
//!
//! - Setup: the listener is a TCP listener on the address's socket. The
//!   connector sends its [`setup::QpInfo`] (QPN, PSN, GID, LID, MTU, credits,
//!   chunk size); the acceptor answers with its own once its QP is in RTS; the
//!   connector brings its QP to RTS, reports `Connected` and sends one ready
//!   byte, on which the acceptor reports `Accepted`. Each side posts its
//!   receives before it sends its info, so no send ever meets an empty queue.
//!   The TCP socket stays open: EOF or an error on it means the peer is gone.
//! - Data: every unit (banner or encoded frame) is copied into registered send
//!   chunks behind an 8-byte header (kind, more-parts flag, credits granted);
//!   a unit larger than a chunk goes as several sends that the receiver joins.
//!   (Rendezvous with RDMA read for large frames is the next increment.)
//! - Credits: a sender posts a data send only with a credit (a receive the
//!   peer posted); the receiver returns credits in the header of its own sends,
//!   or in a credit-only send that lands in a small per-link reserve of
//!   receives and consumes no credit. Credits never reach the session engine.
//! - Progress: one CQ per transport whose completion channel fd sits in the
//!   worker's mio Poll. `progress` polls the CQ until empty, then arms it and
//!   polls once more (a completion can land between the last poll and the
//!   arm); an armed, empty CQ wakes the worker through the fd.
//! - Faults: a failed work completion fails its link; `inject(Abort)` moves
//!   the QP to ERR for real (its work requests flush with errors).

mod link;
mod pool;
mod setup;

use std::io::{ErrorKind, Read, Write};
use std::net::Shutdown;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use mio::event::Event;
use mio::net::{TcpListener, TcpStream};
use mio::unix::SourceFd;
use mio::{Interest, Registry, Token};
use msgr_addr::{EntityAddr, TransportKind};
use msgr_proto::{Frame, FrameError, FrameLimits, Inbound, LinkId, ProtocolError, Transmit};
use msgr_rdma::{
    InitAttr, QpCaps, QpInit, QueuePair, RdmaError, RecvWr, RtrAttr, RtsAttr, SendOp, SendWr,
    WcOpcode, WorkCompletion,
};
use rustc_hash::FxHashMap;

use crate::wire::ConnectProgress;
use crate::{
    DetachedLink, RealFault, Transport, TransportContext, TransportError, TransportEvent,
    LISTENER_TOKEN_BASE,
};
use link::{header, Kind, Setup, VerbsLink, HDR};
use setup::{Device, QpInfo, INFO_LEN, READY, RX_DEPTH, RX_RESERVE, SQ_DEPTH};

/// Completions reaped per poll call.
const POLL_BATCH: usize = 32;
/// Largest unit a link reassembles from parts (beyond: the link is corrupt).
const MAX_UNIT: usize = 256 << 20;
/// Bits of a work request id that name the chunk.
const CHUNK_BITS: u32 = 23;
/// The work request id bit that marks a send.
const SEND_BIT: u64 = 1 << CHUNK_BITS;
/// Longest a closed link's QP waits for its last sends to complete.
const CLOSE_LINGER: Duration = Duration::from_secs(2);

fn wr_id(link: LinkId, send: bool, chunk: u32) -> u64 {
    (link.0 << (CHUNK_BITS + 1)) | if send { SEND_BIT } else { 0 } | u64::from(chunk)
}

fn wr_parts(id: u64) -> (LinkId, bool, u32) {
    (
        LinkId(id >> (CHUNK_BITS + 1)),
        id & SEND_BIT != 0,
        (id & ((1 << CHUNK_BITS) - 1)) as u32,
    )
}

/// Whether the verbs backend can run here: a device must exist.
pub(crate) fn probe() -> Result<(), String> {
    match msgr_rdma::device_names() {
        Ok(names) if names.is_empty() => Err("no RDMA device: the device list is empty; \
             run RDMA code on an RDMA-capable host or in the test guest (docs/GUEST.md)"
            .into()),
        Ok(_) => Ok(()),
        Err(e) => Err(e.to_string()),
    }
}

fn rdma_err(op: &'static str, e: RdmaError) -> TransportError {
    match e {
        RdmaError::NoDevice(reason) => TransportError::Unavailable {
            kind: TransportKind::Verbs,
            reason: format!("no RDMA device: {reason}"),
        },
        other => TransportError::Io {
            op,
            source: std::io::Error::other(other.to_string()),
        },
    }
}

/// The verbs transport of one worker.
pub struct VerbsTransport {
    registry: Registry,
    limits: FrameLimits,
    link_ids: Arc<AtomicU64>,
    /// Opened at the first listen or connect (on the device the address names).
    dev: Option<Box<Device>>,
    /// The completion channel's token.
    cq_token: Token,
    /// Whether the CQ is armed (its channel will fire at the next completion).
    armed: bool,
    listeners: FxHashMap<Token, (TcpListener, EntityAddr)>,
    links: FxHashMap<LinkId, VerbsLink>,
    /// Links with queued output or credits to return.
    dirty: Vec<LinkId>,
    /// Events produced outside `ready`/`flush`/`progress` (fault injection, resumes).
    pending: Vec<TransportEvent>,
    /// Links resumed with held units to deliver.
    resumed: Vec<LinkId>,
    /// Links closed with `flush` whose last sends have not completed yet: no
    /// longer links to the worker, their QPs linger (as a TCP socket's unsent
    /// data does) until the sends complete or [`CLOSE_LINGER`] passes.
    closing: FxHashMap<LinkId, (VerbsLink, Instant)>,
}

impl std::fmt::Debug for VerbsTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsTransport")
            .field("dev", &self.dev)
            .field("links", &self.links.len())
            .finish()
    }
}

impl VerbsTransport {
    /// A verbs transport registering its fds in `registry`. Fails (as
    /// unavailable) when the machine has no RDMA device.
    pub fn new(registry: &Registry, ctx: &TransportContext) -> Result<Self, TransportError> {
        probe().map_err(|reason| TransportError::Unavailable {
            kind: TransportKind::Verbs,
            reason,
        })?;
        Ok(VerbsTransport {
            registry: registry
                .try_clone()
                .map_err(|e| TransportError::io("clone mio registry", e))?,
            limits: ctx.limits,
            cq_token: Token(ctx.link_ids.fetch_add(1, Ordering::Relaxed) as usize),
            link_ids: ctx.link_ids.clone(),
            dev: None,
            armed: false,
            listeners: FxHashMap::default(),
            links: FxHashMap::default(),
            dirty: Vec::new(),
            pending: Vec::new(),
            resumed: Vec::new(),
            closing: FxHashMap::default(),
        })
    }

    fn device(&mut self, addr: &EntityAddr) -> Result<&mut Device, TransportError> {
        if let Some(d) = &self.dev {
            if let Some(want) = &addr.rdma.device {
                if want != d.ctx.name() {
                    return Err(TransportError::Unavailable {
                        kind: TransportKind::Verbs,
                        reason: format!(
                            "this worker's verbs transport uses {}; one device per messenger for now",
                            d.ctx.name()
                        ),
                    });
                }
            }
        } else {
            let d = Device::open(&addr.rdma).map_err(|e| rdma_err("open verbs device", e))?;
            let fd = d.channel.fd();
            self.registry
                .register(&mut SourceFd(&fd), self.cq_token, Interest::READABLE)
                .map_err(|e| TransportError::io("register completion channel", e))?;
            tracing::debug!(device = ?d, "verbs device open");
            self.dev = Some(Box::new(d));
        }
        Ok(self.dev.as_mut().expect("device just opened"))
    }

    /// Creates a QP in INIT with its receives posted.
    fn new_link(
        &mut self,
        id: LinkId,
        stream: TcpStream,
        outgoing: bool,
    ) -> Result<VerbsLink, TransportError> {
        let dev = self.dev.as_mut().expect("device opened before links");
        let depth = RX_DEPTH + RX_RESERVE;
        if dev.rx.available() < depth as usize {
            dev.rx.exhausted += 1;
            return Err(TransportError::Unavailable {
                kind: TransportKind::Verbs,
                reason: format!(
                    "receive chunk pool exhausted ({} free, {depth} needed per link)",
                    dev.rx.available()
                ),
            });
        }
        let mut init = QpInit::new(&dev.cq, &dev.cq);
        init.caps = QpCaps {
            max_send_wr: SQ_DEPTH,
            max_recv_wr: depth,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let qp = QueuePair::new(&dev.pd, init).map_err(|e| rdma_err("ibv_create_qp", e))?;
        qp.to_init(&InitAttr {
            port: dev.port,
            ..InitAttr::default()
        })
        .map_err(|e| rdma_err("qp to INIT", e))?;
        let mut rx_chunks = Vec::with_capacity(depth as usize);
        for _ in 0..depth {
            rx_chunks.push(dev.rx.take().expect("checked above"));
        }
        let posted = (|| -> Result<(), RdmaError> {
            let sges = rx_chunks
                .iter()
                .map(|&c| dev.rx.sge(c, dev.rx.chunk_size()))
                .collect::<Result<Vec<_>, _>>()?;
            let wrs: Vec<RecvWr<'_>> = rx_chunks
                .iter()
                .zip(&sges)
                .map(|(&c, s)| RecvWr {
                    wr_id: wr_id(id, false, c),
                    sges: std::slice::from_ref(s),
                })
                .collect();
            qp.post_recv(&wrs)
        })();
        if let Err(e) = posted {
            for c in rx_chunks {
                dev.rx.put(c);
            }
            return Err(rdma_err("post receives", e));
        }
        Ok(VerbsLink {
            stream,
            outgoing,
            setup: if outgoing {
                Setup::TcpConnecting
            } else {
                Setup::AwaitInfo
            },
            oob: Vec::with_capacity(INFO_LEN),
            qp,
            psn: rand_psn(id),
            rx_chunks,
            tx_inflight: Vec::new(),
            queue: Default::default(),
            queued_bytes: 0,
            credits: 0,
            to_grant: 0,
            withheld: 0,
            credit_chunk: None,
            reasm: Default::default(),
            paused: false,
            frozen: false,
            held: Default::default(),
        })
    }

    fn my_info(&self, l: &VerbsLink) -> QpInfo {
        let dev = self.dev.as_ref().expect("device");
        QpInfo {
            qpn: l.qp.qp_num(),
            psn: l.psn,
            gid: dev.gid,
            lid: dev.lid,
            mtu: setup::mtu_code(dev.mtu),
            credits: RX_DEPTH,
            chunk: dev.rx.chunk_size() as u32,
        }
    }

    /// Brings `l`'s QP to RTR and RTS towards `peer`.
    fn connect_qp(dev: &Device, l: &mut VerbsLink, peer: &QpInfo) -> Result<(), RdmaError> {
        l.qp.to_rtr(&RtrAttr {
            path_mtu: setup::mtu_from_code(peer.mtu, dev.mtu),
            dest_qp_num: peer.qpn,
            rq_psn: peer.psn,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
            port: dev.port,
            dlid: peer.lid,
            dgid: if peer.gid.is_zero() {
                None
            } else {
                Some(peer.gid)
            },
            sgid_index: dev.gid_index,
            hop_limit: 64,
        })?;
        l.qp.to_rts(&RtsAttr {
            sq_psn: l.psn,
            ..RtsAttr::default()
        })?;
        l.credits = peer.credits;
        Ok(())
    }

    /// Removes a link: destroys its QP (no more DMA into its chunks), returns
    /// its chunks and closes the TCP socket (the peer sees EOF). Completions of
    /// the link still in the CQ are ignored by id.
    fn drop_link(&mut self, id: LinkId) -> Option<()> {
        let l = self.links.remove(&id)?;
        self.release(l);
        Some(())
    }

    /// Destroys a link's QP and socket and returns its chunks.
    fn release(&mut self, mut l: VerbsLink) {
        let _ = self.registry.deregister(&mut l.stream);
        let _ = l.stream.shutdown(Shutdown::Both);
        let VerbsLink {
            qp,
            rx_chunks,
            tx_inflight,
            ..
        } = l;
        drop(qp);
        if let Some(dev) = self.dev.as_mut() {
            for c in rx_chunks {
                dev.rx.put(c);
            }
            for c in tx_inflight {
                dev.tx.put(c);
            }
        }
    }

    /// A completion of a closing link: its sends drain, then it goes.
    fn on_closing_completion(&mut self, id: LinkId, wc: &WorkCompletion) {
        let (_, send, chunk) = wr_parts(wc.wr_id());
        let Some((l, _)) = self.closing.get_mut(&id) else {
            return;
        };
        if wc.is_success() && send {
            if let Some(pos) = l.tx_inflight.iter().position(|&c| c == chunk) {
                l.tx_inflight.swap_remove(pos);
                if let Some(dev) = self.dev.as_mut() {
                    dev.tx.put(chunk);
                }
            }
        }
        if !wc.is_success() || l.tx_inflight.is_empty() {
            if let Some((l, _)) = self.closing.remove(&id) {
                self.release(l);
            }
        }
    }

    /// Releases closing links past their linger deadline.
    fn reap_closing(&mut self) {
        if self.closing.is_empty() {
            return;
        }
        let now = Instant::now();
        let late: Vec<LinkId> = self
            .closing
            .iter()
            .filter(|(_, (_, t))| now >= *t)
            .map(|(id, _)| *id)
            .collect();
        for id in late {
            if let Some((l, _)) = self.closing.remove(&id) {
                self.release(l);
            }
        }
    }

    fn fail(&mut self, id: LinkId, why: String, events: &mut Vec<TransportEvent>) {
        if self.drop_link(id).is_some() {
            events.push(TransportEvent::Failed(id, why));
        }
    }

    fn accept_all(&mut self, token: Token, events: &mut Vec<TransportEvent>) {
        loop {
            let Some((listener, _)) = self.listeners.get(&token) else {
                return;
            };
            match listener.accept() {
                Ok((stream, _peer)) => {
                    let _ = stream.set_nodelay(true);
                    let id = LinkId(self.link_ids.fetch_add(1, Ordering::Relaxed));
                    match self.new_link(id, stream, false) {
                        Ok(mut l) => {
                            if let Err(e) = self.registry.register(
                                &mut l.stream,
                                Token(id.0 as usize),
                                Interest::READABLE,
                            ) {
                                tracing::warn!(error = %e, "dropping accepted verbs connection");
                                continue;
                            }
                            self.links.insert(id, l);
                            // The connector's info may already be there.
                            self.read_oob(id, events);
                        }
                        Err(e) => tracing::warn!(error = %e, "dropping accepted verbs connection"),
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    return;
                }
            }
        }
    }

    /// Reads the OOB socket: setup messages, then only EOF/errors matter.
    fn read_oob(&mut self, id: LinkId, events: &mut Vec<TransportEvent>) {
        loop {
            let Some(l) = self.links.get_mut(&id) else {
                return;
            };
            let want = match l.setup {
                Setup::AwaitInfo => INFO_LEN - l.oob.len(),
                Setup::AwaitReady => 1,
                Setup::TcpConnecting => return,
                Setup::Up => 64,
            };
            let mut buf = [0u8; 64];
            match l.stream.read(&mut buf[..want]) {
                Ok(0) => {
                    // Completions that arrived before the peer closed come first.
                    self.poll_cq(events);
                    self.fail(id, "connection closed by peer".into(), events);
                    return;
                }
                Ok(n) => {
                    if let Err(why) = self.on_oob(id, &buf[..n], events) {
                        self.fail(id, why, events);
                        return;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    self.poll_cq(events);
                    self.fail(id, format!("setup socket: {e}"), events);
                    return;
                }
            }
        }
    }

    fn on_oob(
        &mut self,
        id: LinkId,
        bytes: &[u8],
        events: &mut Vec<TransportEvent>,
    ) -> Result<(), String> {
        let dev = self.dev.as_ref().expect("device");
        let l = self.links.get_mut(&id).expect("caller checked");
        match l.setup {
            Setup::AwaitInfo => {
                l.oob.extend_from_slice(bytes);
                if l.oob.len() < INFO_LEN {
                    return Ok(());
                }
                let peer = QpInfo::decode(&l.oob)?;
                Self::connect_qp(dev, l, &peer).map_err(|e| format!("verbs connect: {e}"))?;
                if l.outgoing {
                    write_all(&mut l.stream, &[READY])?;
                    l.setup = Setup::Up;
                    events.push(TransportEvent::Connected(id));
                    if !l.queue.is_empty() {
                        self.dirty.push(id);
                    }
                } else {
                    let info = self.my_info(self.links.get(&id).expect("present"));
                    let l = self.links.get_mut(&id).expect("present");
                    write_all(&mut l.stream, &info.encode())?;
                    l.setup = Setup::AwaitReady;
                }
            }
            Setup::AwaitReady => {
                if bytes != [READY] {
                    return Err("bad ready byte in verbs setup".into());
                }
                self.mark_accepted(id, events)?;
            }
            // Nothing is sent on the socket once up; ignore stray bytes.
            Setup::Up | Setup::TcpConnecting => {}
        }
        Ok(())
    }

    /// The accepting side's link is up: the ready byte arrived, or a send
    /// from the connector did (it sends only once its QP is in RTS, and its
    /// first send may overtake the ready byte).
    fn mark_accepted(
        &mut self,
        id: LinkId,
        events: &mut Vec<TransportEvent>,
    ) -> Result<(), String> {
        let listener = self.listener_of(id);
        let Some(l) = self.links.get_mut(&id) else {
            return Ok(());
        };
        if l.setup != Setup::AwaitReady {
            return Ok(());
        }
        l.setup = Setup::Up;
        let peer = l
            .stream
            .peer_addr()
            .map_err(|e| format!("peer_addr: {e}"))?;
        events.push(TransportEvent::Accepted {
            link: id,
            peer,
            listener,
        });
        if !l.queue.is_empty() || l.to_grant > 0 {
            self.dirty.push(id);
        }
        Ok(())
    }

    fn listener_of(&self, _id: LinkId) -> Token {
        // One listener per transport in practice (the messenger binds one address).
        self.listeners
            .keys()
            .next()
            .copied()
            .unwrap_or(Token(LISTENER_TOKEN_BASE))
    }

    /// Polls the CQ until it is empty; if it then is not armed, arms it and
    /// polls once more. Returns whether any completion was handled.
    fn poll_cq(&mut self, events: &mut Vec<TransportEvent>) -> bool {
        let Some(dev) = self.dev.as_ref() else {
            return false;
        };
        let cq = dev.cq.clone();
        let mut wcs = [WorkCompletion::default(); POLL_BATCH];
        let mut any = false;
        loop {
            let n = match cq.poll(&mut wcs) {
                Ok(n) => n,
                Err(e) => {
                    tracing::error!(error = %e, "ibv_poll_cq failed");
                    return any;
                }
            };
            for wc in &wcs[..n] {
                self.on_completion(wc, events);
            }
            if n > 0 {
                any = true;
                continue;
            }
            if self.armed {
                return any;
            }
            if let Err(e) = cq.req_notify(false) {
                tracing::error!(error = %e, "ibv_req_notify_cq failed");
                return any;
            }
            self.armed = true;
            // ...and poll once more: a completion may have landed before the arm.
        }
    }

    fn on_completion(&mut self, wc: &WorkCompletion, events: &mut Vec<TransportEvent>) {
        let (id, send, chunk) = wr_parts(wc.wr_id());
        if !self.links.contains_key(&id) {
            if self.closing.contains_key(&id) {
                self.on_closing_completion(id, wc);
            }
            // Else a completion of a link already released: its chunks went
            // back then.
            return;
        }
        if !wc.is_success() {
            let why = match wc.ok() {
                Err(e) => e.to_string(),
                Ok(_) => "work completion failed".into(),
            };
            self.fail(id, format!("verbs: {why}"), events);
            return;
        }
        if send {
            self.on_send_done(id, chunk);
        } else if wc.opcode() == WcOpcode::Recv {
            if let Err(e) = self.on_recv(id, chunk, wc.byte_len() as usize, events) {
                match e {
                    RecvError::Corrupt(fe) => {
                        self.drop_link(id);
                        events.push(TransportEvent::Corrupt(id, ProtocolError::Frame(fe)));
                    }
                    RecvError::Fail(why) => self.fail(id, why, events),
                }
            }
        }
    }

    fn on_send_done(&mut self, id: LinkId, chunk: u32) {
        let dev = self.dev.as_mut().expect("device");
        let Some(l) = self.links.get_mut(&id) else {
            return;
        };
        if let Some(pos) = l.tx_inflight.iter().position(|&c| c == chunk) {
            l.tx_inflight.swap_remove(pos);
            dev.tx.put(chunk);
        }
        if l.credit_chunk == Some(chunk) {
            l.credit_chunk = None;
        }
        // A send completion frees a chunk and a send-queue slot: links that
        // waited for either may go on.
        if !l.queue.is_empty() || l.to_grant > 0 {
            self.dirty.push(id);
        }
        for (&other, ol) in &self.links {
            if other != id && !ol.queue.is_empty() {
                self.dirty.push(other);
            }
        }
        self.dirty.sort_unstable();
        self.dirty.dedup();
    }

    fn on_recv(
        &mut self,
        id: LinkId,
        chunk: u32,
        len: usize,
        events: &mut Vec<TransportEvent>,
    ) -> Result<(), RecvError> {
        if self
            .links
            .get(&id)
            .is_some_and(|l| l.setup == Setup::AwaitReady)
        {
            self.mark_accepted(id, events).map_err(RecvError::Fail)?;
        }
        let dev = self.dev.as_mut().expect("device");
        let limits = self.limits;
        let l = self.links.get_mut(&id).expect("caller checked");
        if len < HDR {
            return Err(RecvError::Fail(format!(
                "verbs: runt receive of {len} bytes"
            )));
        }
        let data = dev.rx.bytes(chunk, len);
        let kind = Kind::from_u8(data[0])
            .ok_or_else(|| RecvError::Fail(format!("verbs: unknown send kind {}", data[0])))?;
        let more = data[1] & link::MORE != 0;
        let granted = u32::from_le_bytes([data[4], data[5], data[6], data[7]]);
        l.credits += granted;
        let mut unit = None;
        if kind != Kind::Credit {
            let payload = &data[HDR..];
            if l.reasm.len() + payload.len() > MAX_UNIT {
                return Err(RecvError::Fail(format!(
                    "verbs: unit larger than {MAX_UNIT} bytes"
                )));
            }
            if more || !l.reasm.is_empty() {
                l.reasm.extend_from_slice(payload);
                if !more {
                    unit = Some(l.reasm.split().freeze());
                }
            } else {
                unit = Some(Bytes::copy_from_slice(payload));
            }
        }
        // The chunk is copied out: post it again right away.
        let sge = dev
            .rx
            .sge(chunk, dev.rx.chunk_size())
            .map_err(|e| RecvError::Fail(e.to_string()))?;
        l.qp.post_recv(&[RecvWr {
            wr_id: wr_id(id, false, chunk),
            sges: &[sge],
        }])
        .map_err(|e| RecvError::Fail(format!("verbs: repost receive: {e}")))?;
        if kind != Kind::Credit {
            if l.paused {
                l.withheld += 1;
            } else {
                l.to_grant += 1;
            }
        }
        if granted > 0 || l.to_grant >= RX_DEPTH / 2 {
            self.dirty.push(id);
        }
        let Some(bytes) = unit else {
            return Ok(());
        };
        let inbound = match kind {
            Kind::Banner => {
                let raw: [u8; msgr_proto::banner::BANNER_LEN] =
                    bytes.as_ref().try_into().map_err(|_| {
                        RecvError::Fail(format!("verbs: banner of {} bytes", bytes.len()))
                    })?;
                Inbound::Banner(raw)
            }
            _ => Inbound::Frame(Frame::decode_exact(bytes, &limits).map_err(RecvError::Corrupt)?),
        };
        if l.paused {
            l.held.push_back(inbound);
        } else {
            events.push(TransportEvent::Received(id, inbound));
        }
        Ok(())
    }

    /// Posts what credits, chunks and send-queue room allow on one link.
    fn flush_link(&mut self, id: LinkId, events: &mut Vec<TransportEvent>) {
        let Some(dev) = self.dev.as_mut() else {
            return;
        };
        let Some(l) = self.links.get_mut(&id) else {
            return;
        };
        if l.setup != Setup::Up || l.frozen {
            return;
        }
        let mut posts: Vec<(u32, usize)> = Vec::new();
        loop {
            let room = (SQ_DEPTH as usize).saturating_sub(l.tx_inflight.len() + posts.len());
            if room == 0 {
                break;
            }
            let data = !l.queue.is_empty() && l.credits > 0;
            // A credit-only send when the peer is running low and we have no
            // data to carry the credits (at most one in flight).
            let credit_only = !data
                && l.to_grant >= RX_DEPTH / 2
                && l.credit_chunk.is_none()
                && l.queue.is_empty();
            if !data && !credit_only {
                break;
            }
            let Some(c) = dev.tx.take() else {
                break;
            };
            let buf = dev.tx.bytes_mut(c);
            let grant = std::mem::take(&mut l.to_grant);
            let len = if data {
                let p = l.queue.pop_front().expect("checked");
                l.credits -= 1;
                l.queued_bytes -= p.bytes.len();
                buf[..HDR].copy_from_slice(&header(p.kind, p.more, grant));
                buf[HDR..HDR + p.bytes.len()].copy_from_slice(&p.bytes);
                HDR + p.bytes.len()
            } else {
                l.credit_chunk = Some(c);
                buf[..HDR].copy_from_slice(&header(Kind::Credit, false, grant));
                HDR
            };
            posts.push((c, len));
        }
        if posts.is_empty() {
            return;
        }
        let res = (|| -> Result<(), RdmaError> {
            let sges = posts
                .iter()
                .map(|&(c, len)| dev.tx.sge(c, len))
                .collect::<Result<Vec<_>, _>>()?;
            let wrs: Vec<SendWr<'_>> = posts
                .iter()
                .zip(&sges)
                .map(|(&(c, _), s)| {
                    SendWr::new(wr_id(id, true, c), SendOp::Send, std::slice::from_ref(s))
                })
                .collect();
            l.qp.post_send(&wrs)
        })();
        l.tx_inflight.extend(posts.iter().map(|&(c, _)| c));
        if let Err(e) = res {
            self.fail(id, format!("verbs: post send: {e}"), events);
        }
    }

    fn push_unit(&mut self, link: LinkId, kind: Kind, bytes: Bytes) -> Result<(), TransportError> {
        let max = self
            .dev
            .as_ref()
            .map_or(setup::CHUNK, |d| d.tx.chunk_size())
            - HDR;
        let l = self
            .links
            .get_mut(&link)
            .ok_or(TransportError::NoSuchLink(link.0))?;
        l.push(kind, bytes, max);
        self.dirty.push(link);
        Ok(())
    }
}

enum RecvError {
    Corrupt(FrameError),
    Fail(String),
}

fn write_all(s: &mut TcpStream, b: &[u8]) -> Result<(), String> {
    // A few dozen bytes into a fresh socket's buffer: never short in practice,
    // but a short write is reported rather than spun on.
    match s.write(b) {
        Ok(n) if n == b.len() => Ok(()),
        Ok(n) => Err(format!("verbs setup: short write ({n} of {})", b.len())),
        Err(e) => Err(format!("verbs setup: write: {e}")),
    }
}

/// An initial packet sequence number that differs between links.
fn rand_psn(id: LinkId) -> u32 {
    let x =
        id.0.wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .wrapping_add(std::process::id() as u64);
    ((x >> 20) as u32) & 0x00ff_ffff
}

impl Transport for VerbsTransport {
    fn kind(&self) -> TransportKind {
        TransportKind::Verbs
    }

    fn listen(&mut self, addr: &EntityAddr, token: Token) -> Result<EntityAddr, TransportError> {
        self.device(addr)?;
        let (listener, bound_addr) = crate::wire::bind_listener(addr, &self.registry, token)?;
        self.listeners.insert(token, (listener, bound_addr.clone()));
        Ok(bound_addr)
    }

    fn unlisten(&mut self, token: Token) {
        if let Some((mut l, _)) = self.listeners.remove(&token) {
            let _ = self.registry.deregister(&mut l);
        }
    }

    fn connect(&mut self, link: LinkId, addr: &EntityAddr) -> Result<(), TransportError> {
        self.device(addr)?;
        let stream =
            TcpStream::connect(addr.socket).map_err(|e| TransportError::io("connect", e))?;
        let _ = stream.set_nodelay(true);
        let mut l = self.new_link(link, stream, true)?;
        if let Err(e) = self.registry.register(
            &mut l.stream,
            Token(link.0 as usize),
            Interest::READABLE | Interest::WRITABLE,
        ) {
            let dev = self.dev.as_mut().expect("device");
            for c in l.rx_chunks {
                dev.rx.put(c);
            }
            return Err(TransportError::io("register verbs setup socket", e));
        }
        self.links.insert(link, l);
        Ok(())
    }

    fn send(&mut self, link: LinkId, unit: Transmit) -> Result<(), TransportError> {
        match unit {
            Transmit::Banner(b) => self.push_unit(link, Kind::Banner, Bytes::copy_from_slice(&b)),
            Transmit::Frame(f) => {
                let bytes = Bytes::from(f.encode_to_vec()?);
                self.push_unit(link, Kind::Frame, bytes)
            }
        }
    }

    fn flush(&mut self, events: &mut Vec<TransportEvent>) {
        if self.dirty.is_empty() {
            return;
        }
        let mut dirty = std::mem::take(&mut self.dirty);
        dirty.sort_unstable();
        dirty.dedup();
        for id in dirty {
            self.flush_link(id, events);
        }
    }

    fn ready(&mut self, event: &Event, events: &mut Vec<TransportEvent>) {
        let token = event.token();
        if token.0 >= LISTENER_TOKEN_BASE {
            self.accept_all(token, events);
            return;
        }
        if token == self.cq_token {
            if let Some(dev) = &self.dev {
                // Acknowledge every channel event; the CQ must be re-armed.
                loop {
                    match dev.cq.get_event() {
                        Ok(true) => self.armed = false,
                        Ok(false) => break,
                        Err(e) => {
                            tracing::error!(error = %e, "ibv_get_cq_event failed");
                            break;
                        }
                    }
                }
            }
            self.poll_cq(events);
            return;
        }
        let id = LinkId(token.0 as u64);
        let Some(l) = self.links.get_mut(&id) else {
            return;
        };
        if l.setup == Setup::TcpConnecting {
            match crate::wire::connect_progress(&l.stream, event) {
                ConnectProgress::Pending => return,
                ConnectProgress::Failed(why) => {
                    self.fail(id, why, events);
                    return;
                }
                ConnectProgress::Connected => {
                    let _ = self.registry.reregister(
                        &mut l.stream,
                        Token(id.0 as usize),
                        Interest::READABLE,
                    );
                    l.setup = Setup::AwaitInfo;
                    let info = self.my_info(self.links.get(&id).expect("present"));
                    let l = self.links.get_mut(&id).expect("present");
                    if let Err(why) = write_all(&mut l.stream, &info.encode()) {
                        self.fail(id, why, events);
                        return;
                    }
                }
            }
        }
        if event.is_readable() || event.is_read_closed() || event.is_error() {
            self.read_oob(id, events);
        }
    }

    fn progress(&mut self, events: &mut Vec<TransportEvent>) -> bool {
        let mut any = !self.pending.is_empty();
        events.append(&mut self.pending);
        for id in std::mem::take(&mut self.resumed) {
            if let Some(l) = self.links.get_mut(&id) {
                any |= !l.held.is_empty();
                for u in l.held.drain(..) {
                    events.push(TransportEvent::Received(id, u));
                }
            }
        }
        any |= self.poll_cq(events);
        self.reap_closing();
        any
    }

    fn close(&mut self, link: LinkId, flush: bool) {
        let Some(l) = self.links.get_mut(&link) else {
            return;
        };
        if !(flush && l.setup == Setup::Up && !l.frozen) {
            self.drop_link(link);
            return;
        }
        // Post what credits allow now (the Close frame, typically); what the
        // peer has no room for is dropped (the session replays what matters).
        let mut ev = Vec::new();
        self.flush_link(link, &mut ev);
        self.pending.extend(ev);
        let Some(mut l) = self.links.remove(&link) else {
            return;
        };
        l.queue.clear();
        l.queued_bytes = 0;
        if l.tx_inflight.is_empty() {
            self.release(l);
        } else {
            let _ = self.registry.deregister(&mut l.stream);
            self.closing
                .insert(link, (l, Instant::now() + CLOSE_LINGER));
        }
    }

    fn pause_reading(&mut self, link: LinkId, paused: bool) {
        if let Some(l) = self.links.get_mut(&link) {
            if l.frozen || l.paused == paused {
                return;
            }
            l.paused = paused;
            if !paused {
                l.to_grant += std::mem::take(&mut l.withheld);
                self.dirty.push(link);
                if !l.held.is_empty() {
                    self.resumed.push(link);
                }
            }
        }
    }

    fn backlog(&self, link: LinkId) -> usize {
        self.links.get(&link).map_or(0, |l| l.queued_bytes)
    }

    fn owns(&self, token: Token) -> bool {
        token == self.cq_token
            || self.listeners.contains_key(&token)
            || self.links.contains_key(&LinkId(token.0 as u64))
    }

    fn link_count(&self) -> usize {
        self.links.len()
    }

    fn inject(&mut self, link: LinkId, fault: RealFault) -> Result<(), TransportError> {
        let l = self
            .links
            .get_mut(&link)
            .ok_or(TransportError::NoSuchLink(link.0))?;
        match fault {
            RealFault::Abort => {
                // For real: the QP goes to ERR, its posted work requests flush
                // with errors, and the failed completions fail the link.
                l.qp.to_err().map_err(|e| rdma_err("qp to ERR", e))?;
            }
            RealFault::HalfClose => {
                // No half-close on a QP: closing the setup socket's sending
                // side tells the peer we are gone.
                l.stream
                    .shutdown(Shutdown::Write)
                    .map_err(|e| TransportError::io("shutdown", e))?;
            }
            RealFault::StopReading => {
                l.paused = true;
            }
            RealFault::Freeze => {
                l.paused = true;
                l.frozen = true;
            }
        }
        Ok(())
    }

    fn send_corrupted(
        &mut self,
        link: LinkId,
        unit: Transmit,
        bit: u64,
    ) -> Result<(), TransportError> {
        let kind = match unit {
            Transmit::Banner(_) => Kind::Banner,
            Transmit::Frame(_) => Kind::Frame,
        };
        let bytes = crate::wire::corrupted(unit, bit)?;
        self.push_unit(link, kind, Bytes::from(bytes))
    }

    fn detach(&mut self, _link: LinkId) -> Option<DetachedLink> {
        // A QP belongs to its worker's CQ: verbs links do not migrate.
        None
    }

    fn attach(&mut self, _link: LinkId, _detached: DetachedLink) -> Result<(), TransportError> {
        Err(TransportError::Unavailable {
            kind: TransportKind::Verbs,
            reason: "verbs links do not move between workers".into(),
        })
    }
}

impl Drop for VerbsTransport {
    fn drop(&mut self) {
        let ids: Vec<LinkId> = self.links.keys().copied().collect();
        for id in ids {
            self.drop_link(id);
        }
        for (_, (l, _)) in std::mem::take(&mut self.closing) {
            self.release(l);
        }
        if let Some(dev) = &self.dev {
            let fd = dev.channel.fd();
            let _ = self.registry.deregister(&mut SourceFd(&fd));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a host without RDMA (this project's development machines) the
    /// backend says why it cannot run, in words an operator can act on.
    #[test]
    fn unavailable_without_a_device_says_why() {
        if std::path::Path::new("/dev/infiniband/uverbs0").exists() {
            return; // a machine with a device: nothing to check
        }
        match crate::availability(&TransportKind::Verbs) {
            crate::Availability::Unavailable(reason) => {
                assert!(reason.contains("no RDMA device"), "{reason}")
            }
            crate::Availability::Available => panic!("verbs available without a device"),
        }
        let poll = mio::Poll::new().unwrap();
        let ctx = TransportContext::new(FrameLimits::default());
        match crate::open_transport(&TransportKind::Verbs, poll.registry(), &ctx) {
            Err(TransportError::Unavailable { reason, .. }) => {
                assert!(reason.contains("no RDMA device"), "{reason}")
            }
            Err(e) => panic!("unexpected error: {e}"),
            Ok(_) => panic!("opened verbs without a device"),
        }
    }

    #[test]
    fn wr_ids_round_trip() {
        for (l, s, c) in [(1u64, false, 0u32), (12345, true, 511), (1 << 30, true, 7)] {
            assert_eq!(wr_parts(wr_id(LinkId(l), s, c)), (LinkId(l), s, c));
        }
    }

    #[test]
    fn parts_cover_the_unit() {
        // Pure logic of cutting units into parts (no device needed).
        let b = Bytes::from((0..100_000u32).map(|i| i as u8).collect::<Vec<_>>());
        let max = setup::CHUNK - HDR;
        let n = b.len().div_ceil(max);
        let mut joined = Vec::new();
        let mut rest = b.clone();
        for i in 0..n {
            let part = rest.split_to(rest.len().min(max));
            assert_eq!(i + 1 < n, !rest.is_empty());
            joined.extend_from_slice(&part);
        }
        assert_eq!(joined, b);
    }
}
