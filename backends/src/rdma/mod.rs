//! The RDMA backends: `verbs` (connection setup over an out-of-band TCP
//! exchange, as Ceph's RDMAStack does — `oob.rs`) and `rdmacm` (setup by
//! rdma_cm, for RoCE and iWARP — `cm.rs`), sharing one data path.
//!
//! - Device (`device.rs`): one protection domain, one completion queue whose
//!   channel fd sits in the worker's mio Poll, one shared receive queue and
//!   two registered chunk pools per transport, sized from configuration
//!   ([`crate::RdmaPoolConfig`]) and checked against the device's limits and
//!   RLIMIT_MEMLOCK before anything is registered.
//! - Eager path: a unit (banner or encoded frame) up to the rendezvous
//!   threshold is copied into registered send chunks behind an 8-byte header
//!   (kind, more-parts flag, credits granted), a frame of 4 KiB or more
//!   gathered from its segments (`link::Part`); a unit larger than a chunk
//!   goes as several sends that the receiver joins.
//! - Rendezvous: a larger frame's largest segment is registered where it
//!   lies, read-only (`msgr_rdma::ReadOnlyRegion`), and announced with a
//!   `link::ReadDesc` followed by the rest of the frame (`crate::split`;
//!   a frame whose rest does not fit is encoded into one buffer and
//!   registered whole); the receiver RDMA-reads it into the gap of a buffer
//!   of its own (in pieces, a bounded number in flight), then answers
//!   `ReadDone`, on which the sender releases it. On RoCE the receiver's
//!   buffer (a read sink) stays registered when the message is delivered
//!   and goes back to a shelf (`crate::shelf`) when the application drops
//!   it, so the next read needs no allocation or registration; iWARP sinks
//!   are remotely writable and are deregistered before delivery. Later units of the link
//!   wait behind the read, so delivery keeps the sender's order. A read that
//!   has not completed by its deadline (`rdma_read_timeout_ms`,
//!   [`crate::RdmaPoolConfig::read_timeout`]; `wake_at` reports it) fails
//!   the link, counted in `read_timeouts`.
//! - Credits: every link is promised a share of the shared receive queue
//!   (`Device::take_share`): its peer's data credits plus one slot
//!   for a credit-only message. A sender posts a data send only with a
//!   credit; the receiver reposts the chunk once it has copied it out and
//!   returns the credit in the header of its own sends, or in a credit-only
//!   send when it has nothing to say. Credits never reach the session engine.
//! - Progress: `progress` polls the CQ until empty without arming it (the
//!   worker's busy-poll window calls it in a loop); `arm`, called right
//!   before the worker blocks, arms the CQ and polls once more (a completion
//!   can land between the last poll and the arm); an armed, empty CQ wakes
//!   the worker through the channel fd. Received chunks lent to the
//!   application come back through `RxReturns`, which wakes the worker.
//! - Faults: a failed work completion, the peer's disconnect (EOF on the
//!   setup socket, rdma_cm's `Disconnected`) or a late read fails the link;
//!   `inject(Abort)` moves the QP to ERR for real (its work requests flush).
//!   A read that never completes cannot be had for real (an RC QP ends an
//!   unanswered read with an error completion), so
//!   `simulate(SimulatedFault::HungRead)` imitates one: the completion of
//!   the link's next read is ignored (counted in `simulated_hung_reads`), its
//!   buffer stays with the link until the QP is destroyed, and the deadline
//!   must fail the link. The guest test `guest_verbs` drives it. A CQ
//!   that cannot be polled (`ibv_poll_cq` failing) fails every link
//!   (`cq_failures`); `simulate(SimulatedFault::CqReadError)` fakes one,
//!   as no device here fails a poll on demand.
//!
//! # Layers
//!
//! Bottom first (`tests/layering.rs`):
//!
//! 1. `pool`, `wr`, `user_rma`
//! 2. `device`
//! 3. `conn`: how a link is set up, below the two ways of doing it
//! 4. `listen`
//! 5. `link`
//! 6. `oob`, `cm`
//! 7. `completion`: what completes (an `impl RdmaTransport` of its own)

mod cm;
mod completion;
mod conn;
mod device;
mod link;
mod listen;
mod oob;
mod pool;
mod user_rma;
mod wr;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use mio::event::Event;
use mio::unix::SourceFd;
use mio::{Interest, Registry, Token};
use msgr_addr::{EntityAddr, TransportKind};
use msgr_proto::arena::ByteArena;
use msgr_proto::frame::EncodedFrame;
use msgr_proto::{FrameError, FrameLimits, Inbound, LinkFailure, LinkId, ProtocolError, Transmit};
use msgr_rdma::{
    Access, MemoryRegion, QueuePair, RdmaError, ReadOnlyRegion, RemoteAddr, SendOp, SendWr,
    WcOpcode, WorkCompletion,
};
use rustc_hash::FxHashMap;
use smallvec::SmallVec;

use crate::queue_failure::{fail_every_link, failed_read};
use crate::regcache::RegCache;
use crate::shelf::{Shelf, Shelvable};
use crate::split;
use crate::{
    Availability, DetachedLink, RdmaPoolConfig, Transport, TransportContext, TransportError,
    TransportEvent, TransportStats,
};
#[cfg(feature = "fault-injection")]
use crate::{RealFault, SimulatedFault};
use cm::CmState;
use conn::Conn;
use device::{Device, MAX_READS, SQ_DEPTH};
use link::{
    header, next_send, Kind, NextSend, RdmaLink, RdvState, ReadDesc, ReadOp, RxItem, SendState,
    UserOp, HDR,
};
use oob::OobListener;
use pool::RxReturns;
use wr::WrKind;

/// Most bytes of idle read sinks a transport keeps registered for reuse.
const SINK_SHELF_BYTES: usize = 4 << 20;

impl Shelvable for MemoryRegion<Vec<u8>> {
    fn room(&self) -> usize {
        self.len()
    }
    fn bytes(&self) -> &[u8] {
        self
    }
}

/// Completions reaped per poll call.
const POLL_BATCH: usize = 32;
/// Largest unit a link reassembles from eager parts (beyond: the link is corrupt).
const MAX_UNIT: usize = 256 << 20;
/// Longest a closed link's QP waits for its last sends to complete.
const CLOSE_LINGER: Duration = Duration::from_secs(2);
/// Received units at least this large (and fitting one chunk) are lent to
/// the application instead of copied.
const LEND_MIN: usize = 4 << 10;
/// Sends one flush of a link keeps inline (more spill to the heap).
const POST_BATCH: usize = 8;
/// Frames smaller than this are encoded into one buffer before they are cut
/// into parts; larger ones are gathered from their segments straight into
/// the send chunks, saving a copy of the payload.
const GATHER_MIN: usize = 4 << 10;
/// Chunks the small frames are encoded into (a buffer each cost an
/// allocation per message).
const TX_ARENA: usize = 4 * GATHER_MIN;
/// Longest an accepted link may take to finish its setup. Until it does,
/// only this transport knows it (the worker hears `Accepted` at the end), so
/// without a deadline a peer that stops mid-setup would pin its QP and its
/// share of the receive queue.
const SETUP_TIMEOUT: Duration = Duration::from_secs(10);
/// Bytes per RDMA read work request of a rendezvous.
const READ_PIECE: u64 = 4 << 20;

/// Whether the verbs backend can run here: a device must exist.
pub(crate) fn probe() -> Availability {
    match msgr_rdma::device_names() {
        Ok(names) if names.is_empty() => Availability::Unavailable(
            "no RDMA device: the device list is empty; \
             run RDMA code on an RDMA-capable host or in the test guest (docs/GUEST.md)"
                .into(),
        ),
        Ok(_) => Availability::Available,
        Err(e) => Availability::Unavailable(e.to_string()),
    }
}

/// Whether the rdmacm backend can run here: a device and the rdma_cm device file.
pub(crate) fn probe_cm() -> Availability {
    if let Availability::Unavailable(why) = probe() {
        return Availability::Unavailable(why);
    }
    match msgr_rdma::EventChannel::new() {
        Ok(_) => Availability::Available,
        Err(e) => Availability::Unavailable(format!("rdma_cm unavailable: {e}")),
    }
}

fn rdma_err(kind: TransportKind, op: &'static str, e: RdmaError) -> TransportError {
    match e {
        RdmaError::NoDevice(reason) => TransportError::Unavailable {
            kind,
            reason: format!("no RDMA device: {reason}"),
        },
        other => TransportError::Io {
            op,
            source: std::io::Error::other(other.to_string()),
        },
    }
}

/// What both ends of a link tell each other at setup (in the verbs backend's
/// [`oob::QpInfo`], and as rdma_cm private data).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LinkParams {
    /// Data credits the sender of this struct grants.
    pub(crate) credits: u32,
    /// Its chunk size (both ends must agree).
    pub(crate) chunk: u32,
    /// RDMA reads it may have outstanding / serve (min of both is used).
    pub(crate) rd_atomic: u8,
}

impl LinkParams {
    const MAGIC: [u8; 4] = *b"MRL1";
    pub(crate) const LEN: usize = 16;

    pub(crate) fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[..4].copy_from_slice(&Self::MAGIC);
        b[4..8].copy_from_slice(&self.credits.to_le_bytes());
        b[8..12].copy_from_slice(&self.chunk.to_le_bytes());
        b[12] = self.rd_atomic;
        b
    }

    /// Decodes the peer's parameters; `chunk` is ours (they must match). Extra
    /// trailing bytes are ignored (iWARP pads private data).
    pub(crate) fn decode(b: &[u8], chunk: usize) -> Result<Self, LinkFailure> {
        if b.len() < Self::LEN || b[..4] != Self::MAGIC {
            let why = "the peer is not a msgr RDMA endpoint (bad link parameters)";
            return Err(LinkFailure::Setup(why.into()));
        }
        let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let p = LinkParams {
            credits: u32_at(4),
            chunk: u32_at(8),
            rd_atomic: b[12].max(1),
        };
        if p.credits == 0 || p.chunk as usize != chunk {
            return Err(LinkFailure::Setup(format!(
                "unsupported RDMA link parameters from the peer (credits {}, chunk {} \
                 where ours is {chunk}: both ends need the same rdma_chunk_size)",
                p.credits, p.chunk
            )));
        }
        Ok(p)
    }
}

/// The backend's counters (DESIGN §1); read through [`Transport::stats`].
#[derive(Clone, Debug, Default)]
struct RdmaCounters {
    sends_posted: u64,
    /// `ibv_poll_cq` calls that returned completions (what a batch frame
    /// amortises: DESIGN §7 asks for at most one per batch).
    cq_polls: u64,
    recvs: u64,
    credit_only_sends: u64,
    /// Times a link had data queued but no credit.
    credit_stalls: u64,
    /// Times a link had data and credit but the send pool was empty.
    tx_pool_empty: u64,
    /// Links refused because the receive queue was fully promised.
    share_refused: u64,
    failed_completions: u64,
    rendezvous_sent: u64,
    /// Of those, payloads registered where they lay (not copied).
    rendezvous_in_place: u64,
    rendezvous_read: u64,
    rendezvous_read_bytes: u64,
    /// Applications' one-sided reads of peers' regions completed here
    /// (`Transport::rma_read`), and their bytes.
    user_reads: u64,
    user_read_bytes: u64,
    /// Applications' one-sided writes into peers' regions, and their bytes.
    user_writes: u64,
    user_write_bytes: u64,
    /// Regions this transport opened to peers' reads (`rma_expose`).
    user_regions_exposed: u64,
    /// Of the reads, those into a sink back from the application (not
    /// allocated and registered afresh).
    read_sinks_reused: u64,
    /// Received units handed to the application without a copy.
    rx_lent_total: u64,
    /// Rendezvous frames sent eagerly because registering them failed.
    rendezvous_fallbacks: u64,
    read_timeouts: u64,
    qp_errors_injected: u64,
    /// rdma_cm ids of released links kept until their connect or accept
    /// was answered (`cm::CmState::parked`).
    cm_ids_parked: u64,
    /// Reads whose completion was ignored (`SimulatedFault::HungRead`).
    simulated_hung_reads: u64,
    /// Times polling the CQ failed (every link failed with it).
    cq_failures: u64,
    /// Connection requests heard by the listener (rdma_cm or out of band).
    connect_requests: u64,
    /// Of those, refused or failed before the link was up.
    accepts_failed: u64,
    /// Outgoing links that failed before they were up.
    connects_failed: u64,
    /// rdma_cm listeners created again after siw lost their socket
    /// (`listen`).
    listeners_restored: u64,
}

impl RdmaCounters {
    fn share_refused(&mut self, kind: &TransportKind) -> TransportError {
        self.share_refused += 1;
        TransportError::Unavailable {
            kind: kind.clone(),
            reason: "every shared-receive-queue slot is promised to a link: raise \
                     rdma_rx_chunks for more connections per worker"
                .into(),
        }
    }
}

/// How a transport polls its completion queue: the channel's token and
/// whether it is armed, completions found while arming, the batch buffer,
/// and simulated failures still to come.
struct CqPolling {
    /// The completion channel's token.
    token: Token,
    /// Whether the CQ is armed (its channel will fire at the next completion).
    armed: bool,
    /// Completions `arm` found after arming, handled by the next poll.
    stashed: Vec<WorkCompletion>,
    /// Where `ibv_poll_cq` writes, kept between polls: an array on the stack
    /// was zeroed on every poll (1.5 KiB a busy-poll pass).
    polled: Box<[WorkCompletion; POLL_BATCH]>,
    /// CQ polls still to fail (`SimulatedFault::CqReadError`).
    simulated_failures: u32,
}

/// The verbs or rdmacm transport of one worker.
pub struct RdmaTransport {
    kind: TransportKind,
    registry: Registry,
    link_ids: Arc<AtomicU64>,
    /// Frame limits and pool sizes, from the transport context.
    params: Params,
    /// Opened at the first listen or connect (on the device the address names
    /// or rdma_cm resolves).
    dev: Option<Box<Device>>,
    /// The completion queue's polling state.
    cq: CqPolling,
    /// How links are set up: rdma_cm's channel or verbs' TCP listeners.
    setup: SetupChannels,
    links: FxHashMap<LinkId, RdmaLink>,
    /// Receive completions name a QP number, not a link.
    qpn_links: FxHashMap<u32, LinkId>,
    /// Links with something to do next, and events produced outside a poll.
    backlog: Backlog,
    /// Links closed with `flush` whose last sends have not completed yet: no
    /// longer links to the worker, their QPs linger (as a TCP socket's unsent
    /// data does) until the sends complete or [`CLOSE_LINGER`] passes.
    closing: FxHashMap<LinkId, (RdmaLink, Instant)>,
    /// Memory the sends and rendezvous reuse.
    rdv_memory: RdvMemory,
    /// Receive chunks lent to the application.
    loans: Loans,
    /// Applications' regions open to peers' reads (`Transport::rma_expose`).
    user_regions: user_rma::UserExposures,
    counters: RdmaCounters,
}

/// What a transport was built with.
struct Params {
    limits: FrameLimits,
    pools: RdmaPoolConfig,
}

/// How a transport's links are set up.
struct SetupChannels {
    /// rdmacm: the event channel and listening ids.
    cm: Option<CmState>,
    /// verbs: out-of-band TCP listeners.
    oob_listeners: FxHashMap<Token, OobListener>,
}

/// Links a transport comes back to, and events waiting to be handed up.
struct Backlog {
    /// Links with queued output or credits to return.
    dirty: crate::dirty::DirtyLinks,
    /// Links that found the send pool empty: flushed again when a chunk frees.
    tx_waiting: Vec<LinkId>,
    /// Events produced outside `ready`/`flush`/`progress` (fault injection).
    pending: Vec<TransportEvent>,
    /// Links resumed with held units to deliver.
    resumed: Vec<LinkId>,
}

/// Memory kept for reuse by sends and rendezvous.
struct RdvMemory {
    /// Where frames below [`GATHER_MIN`] are encoded.
    tx_arena: ByteArena,
    /// Rendezvous read sinks, registered, back from the application.
    sinks: Arc<Shelf<MemoryRegion<Vec<u8>>>>,
    /// Registrations of segments exposed by rendezvous, kept for the next
    /// send of the same bytes (`crate::regcache`).
    reg_cache: RegCache<ReadOnlyRegion>,
}

/// Receive chunks lent to the application.
struct Loans {
    /// Those given back.
    returns: Arc<RxReturns>,
    /// How many are out now.
    lent: u64,
}

impl std::fmt::Debug for RdmaTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaTransport")
            .field("kind", &self.kind)
            .field("dev", &self.dev)
            .field("links", &self.links.len())
            .finish()
    }
}

impl RdmaTransport {
    /// A verbs (`TransportKind::Verbs`) or rdmacm (`TransportKind::RdmaCm`)
    /// transport registering its fds in `registry`. Fails (as unavailable)
    /// when the machine has no RDMA device, or no rdma_cm for rdmacm.
    pub fn new(
        kind: TransportKind,
        registry: &Registry,
        ctx: &TransportContext,
    ) -> Result<Self, TransportError> {
        let probed = match kind {
            TransportKind::RdmaCm => probe_cm(),
            _ => probe(),
        };
        if let Availability::Unavailable(reason) = probed {
            return Err(TransportError::Unavailable {
                kind: kind.clone(),
                reason,
            });
        }
        Ok(RdmaTransport {
            kind,
            registry: registry
                .try_clone()
                .map_err(|e| TransportError::io("clone mio registry", e))?,
            params: Params {
                limits: ctx.limits,
                pools: ctx.rdma,
            },
            cq: CqPolling {
                token: Token(ctx.link_ids.fetch_add(1, Ordering::Relaxed) as usize),
                armed: false,
                stashed: Vec::new(),
                polled: Box::new([WorkCompletion::default(); POLL_BATCH]),
                simulated_failures: 0,
            },
            link_ids: ctx.link_ids.clone(),
            dev: None,
            setup: SetupChannels {
                cm: None,
                oob_listeners: FxHashMap::default(),
            },
            links: FxHashMap::default(),
            qpn_links: FxHashMap::default(),
            backlog: Backlog {
                dirty: Default::default(),
                tx_waiting: Vec::new(),
                pending: Vec::new(),
                resumed: Vec::new(),
            },
            closing: FxHashMap::default(),
            rdv_memory: RdvMemory {
                tx_arena: ByteArena::new(TX_ARENA),
                sinks: Arc::new(Shelf::new(SINK_SHELF_BYTES)),
                reg_cache: RegCache::new(ctx.rdma.reg_cache_bytes),
            },
            loans: Loans {
                returns: RxReturns::new(ctx.waker.clone()),
                lent: 0,
            },
            user_regions: user_rma::UserExposures::default(),
            counters: RdmaCounters::default(),
        })
    }

    /// Makes `d` this transport's device: its completion channel joins the Poll.
    fn install_device(&mut self, d: Device) -> Result<(), TransportError> {
        let fd = d.channel.fd();
        self.registry
            .register(&mut SourceFd(&fd), self.cq.token, Interest::READABLE)
            .map_err(|e| TransportError::io("register completion channel", e))?;
        tracing::debug!(device = ?d, "RDMA device open");
        self.dev = Some(Box::new(d));
        Ok(())
    }

    /// One device per transport: an address naming another is refused.
    fn check_device_name(&self, addr: &EntityAddr) -> Result<(), TransportError> {
        if let (Some(d), Some(want)) = (&self.dev, &addr.rdma.device) {
            if want != d.ctx.name() {
                return Err(TransportError::Unavailable {
                    kind: self.kind.clone(),
                    reason: format!(
                        "this worker's transport uses {}; one device per messenger for now",
                        d.ctx.name()
                    ),
                });
            }
        }
        Ok(())
    }

    /// The parameters this end announces for `l`.
    fn my_params(&self, l: &RdmaLink) -> LinkParams {
        LinkParams {
            credits: l.initial_credits(),
            chunk: self.params.pools.chunk_size as u32,
            rd_atomic: self.dev.as_ref().map_or(1, |d| d.rd_atomic),
        }
    }

    fn register_qp(&mut self, id: LinkId, qp: &QueuePair) {
        self.qpn_links.insert(qp.qp_num(), id);
    }

    fn insert_link(&mut self, id: LinkId, l: RdmaLink) {
        if let Some(qp) = &l.qp {
            self.qpn_links.insert(qp.qp_num(), id);
        }
        self.links.insert(id, l);
    }

    /// Setup finished: tells the worker (Connected / Accepted).
    fn mark_up(&mut self, id: LinkId, events: &mut Vec<TransportEvent>) {
        let Some(l) = self.links.get_mut(&id) else {
            return;
        };
        if l.up {
            return;
        }
        l.up = true;
        if l.outgoing {
            events.push(TransportEvent::Connected(id));
        } else {
            let peer = match &l.conn {
                Conn::Oob(o) => o.stream.peer_addr().ok(),
                Conn::Cm(c) => Self::cm_peer(c),
            }
            .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)));
            let listener = l.listener.unwrap_or(Token(crate::LISTENER_TOKEN_BASE));
            events.push(TransportEvent::Accepted {
                link: id,
                peer,
                listener,
            });
        }
        if !l.send.queue.is_empty() || l.flow.to_grant > 0 {
            self.backlog.dirty.push(id);
        }
    }

    /// Removes a link and releases it. Completions of the link still in the
    /// CQ are ignored by id.
    fn drop_link(&mut self, id: LinkId) -> Option<()> {
        let l = self.links.remove(&id)?;
        self.release(l);
        Some(())
    }

    /// Destroys a link's QP (no more DMA into or out of its buffers), ends
    /// its setup channel and returns its chunks and receive-queue share.
    fn release(&mut self, l: RdmaLink) {
        let RdmaLink {
            mut conn,
            qp,
            send:
                SendState {
                    inflight: tx_inflight,
                    ..
                },
            share,
            lent,
            rdv:
                RdvState {
                    reads,
                    out: rdv_out,
                    ..
                },
            ..
        } = l;
        if let Some(qp) = &qp {
            self.qpn_links.remove(&qp.qp_num());
        }
        match &mut conn {
            Conn::Oob(o) => self.oob_release(o),
            Conn::Cm(c) => self.cm_release(c),
        }
        // The QP goes first: only then may the memory it reads and writes go.
        drop(qp);
        drop(reads);
        drop(rdv_out);
        match conn {
            Conn::Cm(c) => self.cm_destroy(c),
            oob => drop(oob),
        }
        if !tx_inflight.is_empty() {
            self.backlog.dirty.extend(self.backlog.tx_waiting.drain(..));
        }
        if let Some(dev) = self.dev.as_mut() {
            for c in tx_inflight {
                dev.tx.put(c);
            }
            // Slots lent out come back with their chunks (take_returns).
            dev.return_share(share - lent);
        }
    }

    /// A completion of a closing link: its sends drain, then it goes.
    fn on_closing_completion(&mut self, id: LinkId, wc: &WorkCompletion) {
        let (_, kind, chunk) = wr::parts(wc.wr_id());
        let Some((l, _)) = self.closing.get_mut(&id) else {
            return;
        };
        if wc.is_success() && kind == WrKind::Send {
            if let Some(pos) = l.send.inflight.iter().position(|&c| c == chunk) {
                l.send.inflight.swap_remove(pos);
                if let Some(dev) = self.dev.as_mut() {
                    dev.tx.put(chunk);
                }
                self.backlog.dirty.extend(self.backlog.tx_waiting.drain(..));
            }
        }
        if !wc.is_success() || l.send.inflight.is_empty() {
            if let Some((l, _)) = self.closing.remove(&id) {
                self.release(l);
            }
        }
    }

    /// Releases closing links past their linger deadline.
    fn reap_closing(&mut self, now: Instant) {
        if self.closing.is_empty() {
            return;
        }
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

    /// Fails links whose rendezvous reads are past their deadline.
    fn reap_late_reads(&mut self, now: Instant, events: &mut Vec<TransportEvent>) {
        let late: Vec<LinkId> = self
            .links
            .iter()
            .filter(|(_, l)| l.rdv.reads.values().any(|r| now >= r.deadline))
            .map(|(id, _)| *id)
            .collect();
        let timeout = self.params.pools.read_timeout;
        for id in late {
            self.counters.read_timeouts += 1;
            self.fail(
                id,
                LinkFailure::Timeout(format!(
                    "rendezvous read not complete after {timeout:?} (rdma_read_timeout_ms)"
                )),
                events,
            );
        }
    }

    fn fail(&mut self, id: LinkId, why: LinkFailure, events: &mut Vec<TransportEvent>) {
        if let Some(l) = self.links.get(&id).filter(|l| !l.up) {
            if l.outgoing {
                self.counters.connects_failed += 1;
            } else {
                self.counters.accepts_failed += 1;
            }
        }
        if self.drop_link(id).is_some() {
            events.push(TransportEvent::Failed(id, why));
        }
    }

    /// Handles the completions [`Transport::arm`] found, then polls the CQ
    /// until it is empty. Returns whether any completion was handled. Does
    /// not arm the CQ: while the worker busy-polls, arming after every
    /// completion would cost a verbs command, a channel event, its read and
    /// an epoll wake-up per completion, for nothing.
    fn poll_cq(&mut self, events: &mut Vec<TransportEvent>) -> bool {
        let mut any = !self.cq.stashed.is_empty();
        if any {
            let stashed = std::mem::take(&mut self.cq.stashed);
            for wc in &stashed {
                self.on_completion(wc, events);
            }
        }
        let Some(dev) = self.dev.as_ref() else {
            return any;
        };
        let cq = dev.cq.clone();
        loop {
            let polled = if self.cq.simulated_failures > 0 {
                self.cq.simulated_failures -= 1;
                Err(RdmaError::Os {
                    op: "ibv_poll_cq (SIMULATED)",
                    source: std::io::Error::from_raw_os_error(libc::EIO),
                })
            } else {
                cq.poll(&mut self.cq.polled[..])
            };
            let n = match polled {
                Ok(n) => n,
                Err(e) => {
                    // The fates of every posted request are unknown: all
                    // links fail (crate::queue_failure).
                    let why = failed_read(&mut self.counters.cq_failures, "ibv_poll_cq", &e);
                    let ids = self.links.keys().copied().collect();
                    let failed = fail_every_link(ids, &why, |id, why| self.fail(id, why, events));
                    return any || failed;
                }
            };
            for i in 0..n {
                let wc = self.cq.polled[i];
                self.on_completion(&wc, events);
            }
            if n == 0 {
                return any;
            }
            self.counters.cq_polls += 1;
            any = true;
        }
    }

    /// Links of one direction (`outgoing` or accepted) still in setup at
    /// `deadline(link)`.
    fn late_setups(
        &self,
        outgoing: bool,
        now: Instant,
        deadline: impl Fn(&RdmaLink) -> Instant,
    ) -> Vec<LinkId> {
        self.links
            .iter()
            .filter(|(_, l)| l.outgoing == outgoing && !l.up && now >= deadline(l))
            .map(|(id, _)| *id)
            .collect()
    }

    /// Drops accepted links whose setup has not finished by `deadline(link)`.
    /// The worker has not heard of them (`Accepted` comes at the end of the
    /// setup), so nothing is reported: the peer sees the connection close
    /// and retries.
    fn reap_half_open(&mut self, now: Instant, deadline: impl Fn(&RdmaLink) -> Instant) {
        for id in self.late_setups(false, now, deadline) {
            tracing::debug!(
                link = id.0,
                "dropping an accepted RDMA link whose setup did not finish"
            );
            self.counters.accepts_failed += 1;
            self.drop_link(id);
        }
    }

    /// Fails outgoing links whose setup has not finished [`SETUP_TIMEOUT`]
    /// after the connect: rdma_cm (siw above all) can leave a connect
    /// without any event when the listener it reached went away meanwhile,
    /// and the session only retries once the transport says the connect
    /// failed (a guest stress run once left two lossless connections
    /// `Connecting` to a restarted server for 90 s).
    fn fail_stalled_connects(&mut self, now: Instant, events: &mut Vec<TransportEvent>) {
        for id in self.late_setups(true, now, |l| l.since + SETUP_TIMEOUT) {
            self.fail(
                id,
                LinkFailure::Timeout(format!(
                    "connection not established within {SETUP_TIMEOUT:?}"
                )),
                events,
            );
        }
    }

    /// Starts an application's read of `len` bytes at `offset` of the
    /// region `key` names, on `id`'s queue pair, into a sink of ours, or
    /// its write of `data` there (from a copy in a sink), under the
    /// rendezvous' read pump and deadline (`ReadOp::user`).
    fn start_user_op(
        &mut self,
        id: LinkId,
        key: &[u8],
        (offset, len): (u64, u64),
        (token, data): (u64, Option<&Bytes>),
    ) -> Result<(), TransportError> {
        let kind = self.kind.clone();
        let unavailable = move |reason: String| TransportError::Unavailable {
            kind: kind.clone(),
            reason,
        };
        let key = user_rma::UserKey::decode(key)
            .ok_or_else(|| unavailable("not an RDMA region key".into()))?;
        if data.is_some() && !key.writable() {
            return Err(unavailable("the region's key takes no writes".into()));
        }
        let remote = key
            .range(offset, len)
            .ok_or_else(|| unavailable(format!("{offset}+{len} is not inside the region")))?;
        let max = self.params.limits.max_frame;
        let n = usize::try_from(len)
            .ok()
            .filter(|_| len <= max)
            .ok_or_else(|| unavailable(format!("{len} bytes is over the frame limit ({max})")))?;
        match self.links.get(&id) {
            None => return Err(TransportError::NoSuchLink(id.0)),
            Some(l) if !l.up || l.qp.is_none() => {
                return Err(unavailable("the link is not up".into()))
            }
            Some(_) => {}
        }
        let mut buf = self.read_sink(n).map_err(|e| {
            unavailable(match e {
                RecvError::Fail(why) => why.to_string(),
                RecvError::Corrupt(fe) => fe.to_string(),
            })
        })?;
        if let Some(data) = data {
            // A copy: the caller's bytes are not registered (a write is
            // one memcpy from done; the rendezvous' registration cache
            // would spare it for large ones).
            buf[..n].copy_from_slice(data);
        }
        let desc = ReadDesc {
            token: 0,
            rkey: remote.rkey,
            addr: remote.addr,
            len,
            at: 0,
        };
        let user = UserOp {
            token,
            write: data.is_some(),
        };
        self.add_read_op(id, buf, (n, desc), Some(user));
        // A failed post fails the link: its event goes out with the next
        // progress.
        let mut events = std::mem::take(&mut self.backlog.pending);
        self.pump_reads(id, &mut events);
        self.backlog.pending = events;
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
        if !l.can_send() {
            return;
        }
        let Some(qp) = l.qp.as_ref() else {
            return;
        };
        // A flush posts a few sends at most (one per 64 B message in a
        // ping-pong): kept inline, not allocated three times per flush.
        let mut posts: SmallVec<[(u32, usize); POST_BATCH]> = SmallVec::new();
        loop {
            let room = (SQ_DEPTH as usize).saturating_sub(l.send.inflight.len() + posts.len());
            if room == 0 {
                break;
            }
            if !l.send.queue.is_empty() && l.flow.credits == 0 {
                self.counters.credit_stalls += 1;
            }
            let data = match next_send(
                !l.send.queue.is_empty(),
                l.flow.credits,
                l.flow.credit_chunk.is_some(),
                l.should_return_credits(),
            ) {
                NextSend::Data => true,
                NextSend::CreditsAlone => false,
                NextSend::Nothing => break,
            };
            let Some(c) = dev.tx.take() else {
                self.counters.tx_pool_empty += 1;
                // Woken by the next send completion (the next free chunk).
                self.backlog.tx_waiting.push(id);
                break;
            };
            let buf = dev.tx.bytes_mut(c);
            let grant = std::mem::take(&mut l.flow.to_grant);
            l.flow.peer_credits += grant;
            let len = if data {
                let p = l.send.queue.pop_front().expect("checked");
                l.flow.credits -= 1;
                l.send.queued_bytes = l.send.queued_bytes.saturating_sub(p.len());
                buf[..HDR].copy_from_slice(&header(p.kind, p.more, grant));
                HDR + p.copy_to(&mut buf[HDR..])
            } else {
                l.flow.credit_chunk = Some(c);
                self.counters.credit_only_sends += 1;
                buf[..HDR].copy_from_slice(&header(Kind::Credit, false, grant));
                HDR
            };
            posts.push((c, len));
        }
        if posts.is_empty() {
            return;
        }
        self.counters.sends_posted += posts.len() as u64;
        let res = (|| -> Result<(), RdmaError> {
            let sges = posts
                .iter()
                .map(|&(c, len)| dev.tx.sge(c, len))
                .collect::<Result<SmallVec<[_; POST_BATCH]>, _>>()?;
            let wrs: SmallVec<[SendWr<'_>; POST_BATCH]> = posts
                .iter()
                .zip(&sges)
                .map(|(&(c, len), s)| SendWr {
                    inline: len <= qp.caps().max_inline_data as usize,
                    ..SendWr::new(
                        wr::of_link(id, WrKind::Send, c),
                        SendOp::Send,
                        std::slice::from_ref(s),
                    )
                })
                .collect();
            qp.post_send(&wrs)
        })();
        l.send.inflight.extend(posts.iter().map(|&(c, _)| c));
        if let Err(e) = res {
            let why = LinkFailure::Io {
                kind: std::io::ErrorKind::Other,
                detail: format!("RDMA: post send: {e}"),
            };
            self.fail(id, why, events);
        }
    }

    fn push_unit(&mut self, link: LinkId, kind: Kind, bytes: Bytes) -> Result<(), TransportError> {
        let max = self.params.pools.chunk_size - HDR;
        let l = self
            .links
            .get_mut(&link)
            .ok_or(TransportError::NoSuchLink(link.0))?;
        l.push(kind, bytes, max);
        self.backlog.dirty.push(link);
        Ok(())
    }

    /// Queues a large frame for the peer to read: its largest segment
    /// registered where it lies, the rest of the frame inline in the read
    /// request when it fits there (`crate::split`), else the whole frame
    /// encoded into one buffer and registered. Falls back to eager sends
    /// when the registration fails (memlock exhausted, say).
    fn push_rendezvous(&mut self, link: LinkId, enc: EncodedFrame) -> Result<(), TransportError> {
        let dev = self.dev.as_ref().expect("links have a device");
        let room = self.params.pools.chunk_size - HDR - ReadDesc::LEN;
        // `in_place`: the body is the application's own segment, which may
        // be sent again (worth keeping registered); else a buffer encoded
        // here for this one send.
        let (body, inline, at, in_place) = match split::split_frame(enc) {
            Ok(s) if s.head.len() + s.tail.len() <= room => {
                let (inline, at) = s.inline();
                (s.body, inline, at, true)
            }
            Ok(s) => (Bytes::from(s.into_vec(0)), Vec::new(), 0, false),
            Err(enc) => {
                let mut v = Vec::with_capacity(enc.len());
                enc.write_into(&mut v);
                (Bytes::from(v), Vec::new(), 0, false)
            }
        };
        let lent = self
            .rdv_memory
            .reg_cache
            .get(body, in_place, |b| ReadOnlyRegion::try_register(&dev.pd, b));
        let lent = match lent {
            Ok(l) => l,
            Err((e, body)) => {
                tracing::debug!(error = %e, "rendezvous registration failed; sending eagerly");
                self.counters.rendezvous_fallbacks += 1;
                let max = self.params.pools.chunk_size - HDR;
                let l = self
                    .links
                    .get_mut(&link)
                    .ok_or(TransportError::NoSuchLink(link.0))?;
                let (head, tail) = inline.split_at(at);
                let pieces = [
                    Bytes::copy_from_slice(head),
                    body,
                    Bytes::copy_from_slice(tail),
                ];
                l.push_pieces(Kind::Frame, pieces, max);
                self.backlog.dirty.push(link);
                return Ok(());
            }
        };
        let l = self
            .links
            .get_mut(&link)
            .ok_or(TransportError::NoSuchLink(link.0))?;
        let token = l.rdv.next_token;
        l.rdv.next_token = l.rdv.next_token.wrapping_add(1);
        let desc = ReadDesc {
            token,
            rkey: lent.region.rkey(),
            addr: lent.body.as_ptr() as u64,
            len: lent.body.len() as u64,
            at: at as u32,
        };
        let mut req = Vec::with_capacity(ReadDesc::LEN + inline.len());
        req.extend_from_slice(&desc.encode());
        req.extend_from_slice(&inline);
        l.rdv.out_bytes += lent.body.len();
        l.rdv.out.insert(token, lent);
        l.send
            .queue
            .push_back(link::Part::whole(Kind::ReadReq, false, Bytes::from(req)));
        self.counters.rendezvous_sent += 1;
        self.counters.rendezvous_in_place += u64::from(!inline.is_empty());
        self.backlog.dirty.push(link);
        Ok(())
    }
}

enum RecvError {
    Corrupt(FrameError),
    Fail(LinkFailure),
}

impl RecvError {
    /// The peer sent what no msgr RDMA peer sends.
    fn protocol(why: impl Into<String>) -> Self {
        RecvError::Fail(LinkFailure::Protocol(why.into()))
    }
}

impl Transport for RdmaTransport {
    fn kind(&self) -> TransportKind {
        self.kind.clone()
    }

    fn listen(&mut self, addr: &EntityAddr, token: Token) -> Result<EntityAddr, TransportError> {
        match self.kind {
            TransportKind::RdmaCm => self.cm_listen(addr, token),
            _ => self.oob_listen(addr, token),
        }
    }

    fn unlisten(&mut self, token: Token) {
        self.oob_unlisten(token);
        self.cm_unlisten(token);
        // Accepted links still in setup were never reported to the worker,
        // which therefore never closes them: they go with the listener (as
        // a closed TCP listener resets connections not yet accepted). One
        // listener per transport, as the messenger binds one address.
        let now = Instant::now();
        self.reap_half_open(now, |_| now);
    }

    fn connect(&mut self, link: LinkId, addr: &EntityAddr) -> Result<(), TransportError> {
        match self.kind {
            TransportKind::RdmaCm => self.cm_connect(link, addr),
            _ => self.oob_connect(link, addr),
        }
    }

    fn send(&mut self, link: LinkId, unit: Transmit) -> Result<(), TransportError> {
        let len = unit.encoded_len();
        let rendezvous = len > self.params.pools.rendezvous_threshold && self.dev.is_some();
        if !rendezvous && len < GATHER_MIN {
            let kind = Kind::of(&unit);
            let checked = unit.checked()?;
            let bytes = self.rdv_memory.tx_arena.fill(len, |b| checked.write(b));
            return self.push_unit(link, kind, bytes);
        }
        match unit.into_frame() {
            Err(banner) => self.push_unit(link, Kind::Banner, Bytes::copy_from_slice(&banner)),
            Ok(f) => {
                if rendezvous {
                    return self.push_rendezvous(link, f.into_encoded()?);
                }
                // Larger: the segments stay where they are until each part
                // is copied into its send chunk (one copy, not two).
                let enc = f.into_encoded()?;
                let max = self.params.pools.chunk_size - HDR;
                let l = self
                    .links
                    .get_mut(&link)
                    .ok_or(TransportError::NoSuchLink(link.0))?;
                let pieces = std::iter::once(Bytes::copy_from_slice(&enc.preamble))
                    .chain(enc.segments.iter().cloned())
                    .chain(std::iter::once(Bytes::copy_from_slice(enc.epilogue())));
                l.push_pieces(Kind::Frame, pieces, max);
                self.backlog.dirty.push(link);
                Ok(())
            }
        }
    }

    fn flush(&mut self, _now: Instant, events: &mut Vec<TransportEvent>) {
        let flush = |t: &mut Self, id| t.flush_link(id, events);
        crate::dirty::DirtyLinks::flush_each(self, |t| &mut t.backlog.dirty, flush);
    }

    fn ready(&mut self, event: &Event, _now: Instant, events: &mut Vec<TransportEvent>) {
        let token = event.token();
        if token == self.cq.token {
            if let Some(dev) = &self.dev {
                // Acknowledge every channel event; the CQ must be re-armed.
                loop {
                    match dev.cq.get_event() {
                        Ok(true) => self.cq.armed = false,
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
        if self.setup.cm.as_ref().is_some_and(|c| c.token() == token) {
            self.cm_ready(events);
            return;
        }
        if self.setup.oob_listeners.contains_key(&token) {
            self.oob_accept_all(token, events);
            return;
        }
        self.oob_ready(LinkId(token.0 as u64), event, events);
    }

    fn progress(&mut self, now: Instant, events: &mut Vec<TransportEvent>) -> bool {
        let mut any = self.take_returns();
        any |= !self.backlog.pending.is_empty();
        events.append(&mut self.backlog.pending);
        for id in std::mem::take(&mut self.backlog.resumed) {
            any |= self.drain_held(id, events);
        }
        any |= self.poll_cq(events);
        self.reap_closing(now);
        self.reap_late_reads(now, events);
        self.reap_half_open(now, |l| l.since + SETUP_TIMEOUT);
        self.fail_stalled_connects(now, events);
        self.reap_parked(now);
        self.check_listeners(now);
        any
    }

    fn arm(&mut self) -> bool {
        let Some(dev) = self.dev.as_ref() else {
            return true;
        };
        let cq = dev.cq.clone();
        if !self.cq.armed {
            if let Err(e) = cq.req_notify(false) {
                tracing::error!(error = %e, "ibv_req_notify_cq failed");
                return false;
            }
            self.cq.armed = true;
        }
        // A completion that landed between the last poll and the arm raises
        // no event: look once more, and keep it for the next poll.
        match cq.poll(&mut self.cq.polled[..]) {
            Ok(0) => true,
            Ok(n) => {
                self.cq.stashed.extend_from_slice(&self.cq.polled[..n]);
                false
            }
            Err(e) => {
                tracing::error!(error = %e, "ibv_poll_cq failed");
                true
            }
        }
    }

    fn wake_at(&self) -> Option<Instant> {
        // The deadlines `progress` enforces: lingering closes, rendezvous
        // reads, links in setup (accepted or connecting), the siw
        // listeners' probe.
        let closing = self.closing.values().map(|(_, t)| *t);
        let reads = self
            .links
            .values()
            .flat_map(|l| l.rdv.reads.values().map(|r| r.deadline));
        let setups = self
            .links
            .values()
            .filter(|l| !l.up)
            .map(|l| l.since + SETUP_TIMEOUT);
        let listeners = self.setup.cm.as_ref().and_then(|c| c.listeners.wake_at());
        closing.chain(reads).chain(setups).chain(listeners).min()
    }

    fn close(&mut self, link: LinkId, flush: bool) {
        let Some(l) = self.links.get_mut(&link) else {
            return;
        };
        if !(flush && l.can_send()) {
            self.drop_link(link);
            return;
        }
        // Post what credits allow now (the Close frame, typically); what the
        // peer has no room for is dropped (the session replays what matters).
        let mut ev = Vec::new();
        self.flush_link(link, &mut ev);
        self.backlog.pending.extend(ev);
        let Some(mut l) = self.links.remove(&link) else {
            return;
        };
        l.send.queue.clear();
        l.send.queued_bytes = 0;
        if l.send.inflight.is_empty() {
            self.release(l);
        } else {
            if let Conn::Oob(o) = &mut l.conn {
                let _ = self.registry.deregister(&mut o.stream);
            }
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
                l.flow.to_grant += std::mem::take(&mut l.flow.withheld);
                self.backlog.dirty.push(link);
                if !l.recv.held.is_empty() {
                    self.backlog.resumed.push(link);
                }
            }
        }
    }

    fn backlog(&self, link: LinkId) -> usize {
        self.links
            .get(&link)
            .map_or(0, |l| l.send.queued_bytes + l.rdv.out_bytes)
    }

    fn owns(&self, token: Token) -> bool {
        token == self.cq.token
            || self
                .setup
                .cm
                .as_ref()
                .is_some_and(|c| c.token() == token || c.owns_listener(token))
            || self.setup.oob_listeners.contains_key(&token)
            || self.links.contains_key(&LinkId(token.0 as u64))
    }

    /// `progress` polls the CQ itself; the set-up sockets and the rdma_cm
    /// channel can wait a few passes.
    fn ready_every_pass(&self) -> bool {
        false
    }

    fn link_count(&self) -> usize {
        self.links.len()
    }

    fn abort(&mut self, link: LinkId) -> Result<(), TransportError> {
        let l = self
            .links
            .get(&link)
            .ok_or(TransportError::NoSuchLink(link.0))?;
        // The QP goes to ERR, its posted work requests flush with errors,
        // and the failed completions fail the link.
        if let Some(qp) = &l.qp {
            qp.to_err()
                .map_err(|e| rdma_err(self.kind.clone(), "qp to ERR", e))?;
            self.counters.qp_errors_injected += 1;
        }
        Ok(())
    }

    fn detach(&mut self, _link: LinkId) -> Option<DetachedLink> {
        // A QP belongs to its worker's CQ: RDMA links do not migrate.
        None
    }

    fn attach(&mut self, _link: LinkId, _detached: DetachedLink) -> Result<(), TransportError> {
        Err(TransportError::Unavailable {
            kind: self.kind.clone(),
            reason: "RDMA links do not move between workers".into(),
        })
    }

    fn rma_expose(
        &mut self,
        link: LinkId,
        region: u64,
        mem: &Arc<crate::RegionMemory>,
        access: msgr_proto::rma::Access,
    ) -> Option<Vec<u8>> {
        // One registration on the transport's protection domain serves
        // every link; the link only has to be ours and up.
        self.links.get(&link).filter(|l| l.up)?;
        let dev = self.dev.as_ref()?;
        let before = self.user_regions.len();
        let key = self.user_regions.expose(&dev.pd, region, mem, access);
        if self.user_regions.len() > before {
            self.counters.user_regions_exposed += 1;
        }
        key
    }

    fn rma_unexpose(&mut self, region: u64) {
        self.user_regions.unexpose(region);
    }

    fn rma_read(
        &mut self,
        link: LinkId,
        key: &[u8],
        offset: u64,
        len: u64,
        token: u64,
    ) -> Result<(), TransportError> {
        self.start_user_op(link, key, (offset, len), (token, None))
    }

    fn rma_write(
        &mut self,
        link: LinkId,
        key: &[u8],
        offset: u64,
        data: &Bytes,
        token: u64,
    ) -> Result<(), TransportError> {
        let len = data.len() as u64;
        self.start_user_op(link, key, (offset, len), (token, Some(data)))
    }

    fn stats(&self) -> TransportStats {
        let c = &self.counters;
        let (tx_free, rx_budget) = self.dev.as_ref().map_or((0, 0), |d| {
            (d.tx.available() as u64, u64::from(d.rx_budget))
        });
        let credits: u64 = self.links.values().map(|l| u64::from(l.flow.credits)).sum();
        let rdv_out: u64 = self.links.values().map(|l| l.rdv.out_bytes as u64).sum();
        let reads: u64 = self.links.values().map(|l| l.rdv.reads.len() as u64).sum();
        let mut values = vec![
            ("sends_posted", c.sends_posted),
            ("cq_polls", c.cq_polls),
            ("recvs", c.recvs),
            ("credit_only_sends", c.credit_only_sends),
            ("credit_stalls", c.credit_stalls),
            ("tx_pool_empty", c.tx_pool_empty),
            ("links_refused_no_rx_share", c.share_refused),
            ("failed_completions", c.failed_completions),
            ("rendezvous_sent", c.rendezvous_sent),
            ("rendezvous_in_place", c.rendezvous_in_place),
            ("rendezvous_read", c.rendezvous_read),
            ("rendezvous_read_bytes", c.rendezvous_read_bytes),
            ("user_reads", c.user_reads),
            ("user_read_bytes", c.user_read_bytes),
            ("user_writes", c.user_writes),
            ("user_write_bytes", c.user_write_bytes),
            ("user_regions_exposed", c.user_regions_exposed),
            ("user_regions_open", self.user_regions.len() as u64),
            ("read_sinks_reused", c.read_sinks_reused),
            ("rendezvous_fallbacks", c.rendezvous_fallbacks),
            ("read_timeouts", c.read_timeouts),
            ("qp_errors_injected", c.qp_errors_injected),
            ("cm_ids_parked", c.cm_ids_parked),
            ("simulated_hung_reads", c.simulated_hung_reads),
            ("cq_failures", c.cq_failures),
            ("connect_requests", c.connect_requests),
            ("accepts_failed", c.accepts_failed),
            ("connects_failed", c.connects_failed),
            ("listeners_restored", c.listeners_restored),
            ("tx_chunks_free", tx_free),
            ("rx_slots_unpromised", rx_budget),
            ("credits_held", credits),
            ("rendezvous_out_bytes", rdv_out),
            ("reads_in_flight", reads),
            ("rx_chunks_lent", self.loans.lent),
            ("rx_chunks_lent_total", c.rx_lent_total),
            ("links", self.links.len() as u64),
        ];
        values.extend(self.rdv_memory.reg_cache.values());
        TransportStats {
            kind: self.kind.clone(),
            values,
        }
    }
}

#[cfg(feature = "fault-injection")]
impl crate::FaultInjection for RdmaTransport {
    fn inject(&mut self, link: LinkId, fault: RealFault) -> Result<(), TransportError> {
        let l = self
            .links
            .get_mut(&link)
            .ok_or(TransportError::NoSuchLink(link.0))?;
        match fault {
            RealFault::Abort => self.abort(link)?,
            RealFault::HalfClose => match &l.conn {
                // No half-close on a QP: the setup channel tells the peer we
                // are gone (EOF on the socket; rdma_cm's Disconnected).
                Conn::Oob(o) => {
                    oob::half_close(o).map_err(|e| TransportError::io("shutdown", e))?
                }
                Conn::Cm(c) => {
                    c.id.disconnect()
                        .map_err(|e| rdma_err(self.kind.clone(), "rdma_disconnect", e))?
                }
            },
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

    fn simulate(&mut self, link: LinkId, fault: SimulatedFault) -> Result<(), TransportError> {
        let l = self
            .links
            .get_mut(&link)
            .ok_or(TransportError::NoSuchLink(link.0))?;
        match fault {
            SimulatedFault::HungRead => l.rdv.reads_to_hang += 1,
            SimulatedFault::CqReadError => self.cq.simulated_failures += 1,
        }
        Ok(())
    }

    fn send_corrupted(
        &mut self,
        link: LinkId,
        unit: Transmit,
        bit: u64,
    ) -> Result<(), TransportError> {
        let kind = Kind::of(&unit);
        let bytes = crate::wire::corrupted(unit, bit)?;
        self.push_unit(link, kind, Bytes::from(bytes))
    }
}

impl Drop for RdmaTransport {
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
        if let Some(cm) = &self.setup.cm {
            let fd = cm.fd();
            let _ = self.registry.deregister(&mut SourceFd(&fd));
        }
    }
}

#[cfg(test)]
mod tests;
