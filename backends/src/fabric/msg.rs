//! The libfabric backend (`fabric+<provider>://`) over `FI_EP_MSG`
//! endpoints (tested with the `tcp` provider on loopback and `verbs` on
//! Soft-RoCE in the QEMU guest); `FI_EP_RDM` endpoints are in [`rdm`].
//!
//! This module is that transport, [`FabricTransport`]: its links, slots,
//! header bytes and completion contexts. What it shares with the RDM one is
//! in the parent module, [`super::reassembly`], [`super::rendezvous`] and
//! [`super::wait_fd`].
//!
//! - One [`msgr_fabric::Net`] per worker: fabric, domain, one event queue (all
//!   connection management) and one completion queue shared by every link.
//!   [`Transport::progress`](crate::Transport::progress) reads the queues. The EQ's wait fd sits in the
//!   worker's mio Poll; the CQ's only while the worker sleeps ([`super::wait_fd`]):
//!   before it blocks (a `progress` call that found nothing) the CQ's fd goes
//!   in and `fi_trywait` arms both — if something slipped in meanwhile it
//!   says so and the worker polls again instead of sleeping.
//! - Each link owns `SLOTS` transmit and `SLOTS` receive slots of `SLOT_SIZE`
//!   bytes (registered when the provider wants `FI_MR_LOCAL`). Receives are
//!   pre-posted; a unit is copied into transmit slots and sent eagerly, at most
//!   `SLOTS` sends in flight per link; completions are reaped in batches.
//! - Every message starts with one header byte (the kind):
//!   - [`MORE`] / [`LAST`]: a piece of a unit that continues in the next
//!     message / ends here. Units larger than a slot are split; the
//!     receiver joins the pieces (bounded by the frame limits) and decodes
//!     the whole unit with `Inbound::decode_exact`.
//!   - [`RNDV`] + a 28-byte descriptor (address, length, key, id; little
//!     endian): a unit to fetch with `fi_read`.
//!   - [`RNDV_DONE`] + the 4-byte id of a `RNDV`: its unit was read (or
//!     written into our grant).
//!   - [`RNDV_GRANT`] + the sender's id, an address and a key: the buffer
//!     a unit held for a write goes into ([`rendezvous::encode_grant`]).
//!   - [`RNDV_WRITTEN`] + the 4-byte id: the unit was `fi_write`n (posted
//!     right behind the write, which it does not overtake).
//!   - [`RNDV_EPILOGUE`] + the 4-byte id, a length byte and the unit's
//!     epilogue, between peers that take it late (computed while the unit
//!     moves: [`rendezvous::LATE_EPILOGUE`]).
//!     Grants, "written", epilogues and answers are handled on arrival,
//!     never behind a rendezvous: two ends each waiting for the other's
//!     unit would otherwise each hold the grant the other waits for.
//! - Rendezvous ([`rendezvous`], shared with the RDM transport): where the
//!   provider offers `FI_RMA` with reads (`tcp`, `verbs`; decided once per
//!   worker's Net, reported as `rendezvous_enabled`), a unit larger than
//!   [`rendezvous::RNDV_THRESHOLD`] (64 KiB) at a unit boundary is not
//!   copied through slots: the sender registers it where it lies
//!   (`fi_mr_reg` with `FI_REMOTE_READ`, honouring the provider's
//!   `mr_mode`) and sends `RNDV`; the receiver checks the descriptor (a
//!   length of 0, above the frame limit, a short one, or one inside a
//!   multi-piece unit fails the link), `fi_read`s the unit from the
//!   connected peer (no address needed) into its own buffer, hands it up in
//!   order — later messages wait behind the read — and answers
//!   `RNDV_DONE`, upon which the sender deregisters and frees it. At most
//!   [`rendezvous::RNDV_MAX`] units per link are exposed at once; a read not
//!   complete within the read timeout (`rdma_read_timeout_ms`) fails the
//!   link (`read_timeouts`); a unit whose registration fails goes eagerly
//!   (`rendezvous_fallbacks`). A link's exposed buffers and read go with
//!   its endpoint. Each end tells the other in its connection data
//!   (`fi_connect` / `fi_accept`, [`rendezvous::caps`]) whether it reads
//!   rendezvous units; a unit goes by rendezvous only to a peer that does
//!   (the reads may be withheld in the peer's libfabric:
//!   [`msgr_fabric::rma_withheld`], `fabric_rendezvous`). Where they are
//!   withheld and the provider checks keys (`tcp` on libfabric 1.17) the
//!   endpoints write instead ([`RmaOp::Write`](msgr_proto::rma::RmaOp::Write)): the sender holds the unit
//!   and sends the same descriptor flagged, the receiver grants a zeroed
//!   buffer registered for remote writes (`RNDV_GRANT`), the sender
//!   `fi_write`s the unit into it and says `RNDV_WRITTEN`, and the
//!   receiver hands the unit up and answers `RNDV_DONE`.
//! - Applications' regions (`msgr::rma`, [`super::user_rma`]): where the
//!   endpoint reads rendezvous units, a region the owner's messenger opens
//!   on a link ([`Transport::rma_expose`](crate::Transport::rma_expose)) is registered in place on the
//!   link's endpoint, and the peer reads ranges of it with `fi_read`
//!   ([`Transport::rma_read`](crate::Transport::rma_read)), many in flight, completed as
//!   [`TransportEvent::RmaRead`].
//! - `simulate(SimulatedFault::HungRead)` ignores the completion of the
//!   link's next read (a fake: `tcp` never leaves a read hanging, see
//!   [`rendezvous`]); the read's buffer is freed when the completion comes
//!   anyway, or with the endpoint. Without rendezvous (no `FI_RMA`) it is
//!   refused.
//! - Faults from the provider (error completions, `FI_SHUTDOWN`, EQ errors)
//!   fail the link. A completion queue that cannot be read (`fi_cq_read`
//!   failing with anything but `-FI_EAGAIN`) fails every link on it
//!   (`cq_failures`; [`QueueFailures`](super::QueueFailures), shared with the RDM transport):
//!   their operations' fates are unknown; so does an event queue that
//!   cannot be read (`eq_failures`), whose connection events may be lost.
//!   `simulate(SimulatedFault::CqReadError)` fakes a CQ failure, since no
//!   provider here fails a queue read on demand. Links do not migrate
//!   between workers ([`Transport::detach`](crate::Transport::detach) returns `None`).

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use mio::event::Event;
use mio::unix::SourceFd;
use mio::{Interest, Registry, Token};
use msgr_addr::{EntityAddr, FabricProvider, TransportKind};
use msgr_fabric::{
    CmEvent, Completion, ConnReq, Ep, Exposed, FabricError, Landing, Net, PassiveEp, ReadRegion,
    RmaBuffers, SendSlots, Site,
};
use msgr_proto::{Inbound, LinkFailure, LinkId, ProtocolError, Transmit};
use rustc_hash::FxHashMap;

use super::common::{LinkCommon, Shared};
use super::endpoint_kind::{self, EndpointKind, UserRead};
use super::queueing::{queueing_parts, Links, Outgoing, QueuedLink, Queueing};
use super::reassembly::{report_unit, PieceError};
use super::rendezvous::{self, Counters, Owed, OwedKinds, PeerRma, Posted};
use super::user_rma::{UserExposures, UserReads};
use super::wait_fd::CqWaitFd;
use super::{
    completion_failure, fab_err, open_net, open_worker, post_failure, rdm, read_completions,
    OutOfSlot, SLOT_SIZE,
};
use crate::queue_failure::fail_every_link;
use crate::regcache::RegCache;
use crate::{TransportContext, TransportError, TransportEvent};

/// Slots per direction per link: also the bound on sends in flight.
pub const SLOTS: usize = 32;
/// Header byte: the unit continues in the next message.
pub const MORE: u8 = 1;
/// Header byte: the unit ends in this message.
pub const LAST: u8 = 0;
/// Header byte: the unit is to be fetched with `fi_read`; a rendezvous
/// descriptor (`rendezvous::DESC_LEN` bytes and the unit's inline ones,
/// see `rendezvous::encode`) follows.
pub const RNDV: u8 = 2;
/// Header byte: the unit of a `RNDV` was read (or written into a granted
/// buffer); its id (`rendezvous::DONE_LEN` bytes) follows, and its
/// buffer may go.
pub const RNDV_DONE: u8 = 3;
/// Header byte: the answer to a `RNDV` whose unit is held for a write: a
/// buffer to write it into (`rendezvous::encode_grant`).
pub const RNDV_GRANT: u8 = 4;
/// Header byte: the unit of a `RNDV_GRANT` was written into its buffer
/// (posted after the write, which it does not overtake); its id follows.
pub const RNDV_WRITTEN: u8 = 5;
/// Header byte: the epilogue of a `RNDV` flagged
/// `rendezvous::LATE_EPILOGUE` (`rendezvous::encode_epilogue`).
pub const RNDV_EPILOGUE: u8 = 6;
/// The rendezvous messages besides descriptors, as this wire numbers them.
const OWED_KINDS: OwedKinds = OwedKinds {
    epilogue: RNDV_EPILOGUE,
    grant: RNDV_GRANT,
    written: RNDV_WRITTEN,
    done: RNDV_DONE,
};
/// Bytes of messages a link keeps behind one rendezvous read before it
/// fails (a peer that floods while a read is in flight).
const BEHIND_READ_MAX: usize = 64 << 20;

const RX_BIT: u64 = 1 << 16;
/// Context bit of a link's fi_read or granted buffer (one at a time per
/// link).
const READ_BIT: u64 = 1 << 15;
/// Context bit of a link's fi_write (the low bits: its unit's id).
const WRITE_BIT: u64 = 1 << 14;
const SLOT_MASK: u64 = WRITE_BIT - 1;
/// An endpoint that is not connected (no `FI_CONNECTED`) after this long
/// goes. An accepted one is dropped silently: until then it belongs to no
/// session, so nothing else would ever close it (a peer that gave up
/// mid-connect). An outgoing one fails: a listener that never answers (its
/// messenger went between our request and its accept, and libfabric does
/// not reject a request that is merely dropped) would otherwise leave the
/// session `Connecting` for ever.
const SETUP_TIMEOUT: Duration = Duration::from_secs(10);

/// How often a busy-polling worker reads the event queue while no link is
/// being set up and its wait fd has not woken the worker. The EQ carries
/// connection requests and set-up and shutdown events only, yet reading it
/// is a system call over `tcp` (and rdma_cm's channel over `verbs`): read
/// on every pass, it doubled the cost of a pass beside the completion queue
/// a message is noticed on. A connection request waits at most this long to
/// be accepted, a peer's shutdown to be heard (its link's receives fail
/// anyway).
const EQ_READ_EVERY: Duration = Duration::from_millis(1);

fn context(link: LinkId, rx: bool, slot: usize) -> u64 {
    (link.0 << 17) | if rx { RX_BIT } else { 0 } | slot as u64
}

fn read_context(link: LinkId) -> u64 {
    (link.0 << 17) | READ_BIT
}

fn decode_context(c: u64) -> (LinkId, bool, usize) {
    (LinkId(c >> 17), c & RX_BIT != 0, (c & SLOT_MASK) as usize)
}

fn write_context(link: LinkId, unit: u32) -> u64 {
    (link.0 << 17) | WRITE_BIT | (u64::from(unit) & SLOT_MASK)
}

fn is_read(c: u64) -> bool {
    c & READ_BIT != 0
}

/// Context of an application's one-sided read on `link` (both the read
/// and the write bit: see [`is_user_read`]), numbered by `n`.
fn user_read_context(link: LinkId, n: u64) -> u64 {
    (link.0 << 17) | READ_BIT | WRITE_BIT | (n & SLOT_MASK)
}

fn is_user_read(c: u64) -> bool {
    c & (READ_BIT | WRITE_BIT) == READ_BIT | WRITE_BIT
}

fn is_write(c: u64) -> bool {
    c & WRITE_BIT != 0
}

/// Whether a received message is a grant, a "written" or an answer: about
/// rendezvous units, never waiting behind one or behind a pause.
fn is_control(msg: &[u8]) -> bool {
    matches!(
        msg.first(),
        Some(&(RNDV_GRANT | RNDV_WRITTEN | RNDV_DONE | RNDV_EPILOGUE))
    )
}

/// A received message: in its receive slot, or copied out of it.
enum Message {
    Slot(usize, usize),
    Copy(Vec<u8>),
}

#[derive(Debug)]
pub(super) struct FabricLink {
    ep: Ep,
    common: LinkCommon,
    /// Accepted (the listener's token and the peer) or outgoing (`None`).
    accepted: Option<(Token, SocketAddr)>,
    connected: bool,
    free_tx: Vec<usize>,
    /// Receives completed while reading was paused (and no read was in
    /// flight) or the link frozen: (slot, len). Their slots stay taken,
    /// which stops the peer (backpressure).
    held: VecDeque<(usize, usize)>,
    /// Messages that came while a rendezvous read was in flight, copied out
    /// so their slots go back at once: the provider may deliver the read's
    /// data only after them (tcp: the same stream), so holding slots could
    /// stall the read. Handed up after the read's unit.
    behind_read: VecDeque<Vec<u8>>,
    behind_read_bytes: usize,
    /// Applications' regions this link's endpoint has open to the peer's
    /// reads ([`Transport::rma_expose`](crate::Transport::rma_expose)).
    user: UserExposures,
}

impl FabricLink {
    fn new(ep: Ep, accepted: Option<(Token, SocketAddr)>) -> Self {
        FabricLink {
            common: LinkCommon::new(Instant::now()),
            free_tx: (0..ep.slots()).rev().collect(),
            ep,
            accepted,
            connected: false,
            held: VecDeque::new(),
            behind_read: VecDeque::new(),
            behind_read_bytes: 0,
            user: UserExposures::default(),
        }
    }

    /// Whether the link is moving data that a polled CQ should be looked
    /// at again for at once: output queued or in flight, or a unit half
    /// received, with the peer heard from lately (not a silent one).
    fn moving(&self, now: Instant) -> bool {
        (!self.idle() || !self.common.reasm.is_idle())
            && now.saturating_duration_since(self.common.last_heard) < rdm::MOVING_WINDOW
    }

    /// Nothing left to send, in flight, or exposed for the peer.
    fn idle(&self) -> bool {
        self.common.outbox.is_empty()
            && self.free_tx.len() == self.ep.slots()
            && self.common.exposures.is_idle()
            && self.common.receiving.need_done.is_empty()
            && self.common.receiving.need_grant.is_empty()
    }

    /// Sends what the link owes its peer besides data ([`Owed`]); false
    /// if one could not go yet.
    fn post_owed(&mut self, id: LinkId) -> Result<bool, FabricError> {
        while let Some(owed) = Owed::next(&self.common.exposures, &self.common.receiving) {
            let kind = owed.kind(&OWED_KINDS);
            if !self.post(id, |buf| {
                buf[0] = kind;
                1 + owed.encode(&mut buf[1..])
            })? {
                return Ok(false);
            }
            owed.posted(&mut self.common.exposures, &mut self.common.receiving);
        }
        Ok(true)
    }

    /// Whether the link has something to post: queued units, or control
    /// and a staged descriptor that wait outside the queue for a slot.
    fn has_output(&self) -> bool {
        !self.common.outbox.is_empty()
            || self.common.exposures.owes_posts()
            || self.common.receiving.owes_posts()
    }

    /// Whether received messages wait instead of being handled.
    fn holding(&self) -> bool {
        self.common.paused || self.common.frozen
    }

    /// Whether a received message must wait behind a rendezvous read.
    fn behind_a_read(&self) -> bool {
        self.common.receiving.reading.is_some() || !self.behind_read.is_empty()
    }

    /// Sends one message that `fill` writes into a free transmit slot
    /// (returning its length). `Ok(false)`: no free slot now.
    fn post(
        &mut self,
        id: LinkId,
        fill: impl FnOnce(&mut [u8]) -> usize,
    ) -> Result<bool, FabricError> {
        let Some(&slot) = self.free_tx.last() else {
            return Ok(false);
        };
        let Some(buf) = self.ep.tx_slot(slot) else {
            // In flight after all: not free.
            self.free_tx.pop();
            return Ok(false);
        };
        let n = fill(buf);
        self.ep.send(slot, n, context(id, false, slot))?;
        self.free_tx.pop();
        Ok(true)
    }
}

/// A connected endpoint is aimed at its link's peer already.
impl PeerRma for Ep {
    fn rma(&mut self) -> &mut RmaBuffers {
        Ep::rma(self)
    }

    fn read(&mut self, x: &Exposed, context: u64, around: &[u8], at: usize) -> Posted {
        Ep::read(self, x, context, around, at)
    }

    fn write(&mut self, id: u32, landing: Landing, context: u64) -> Posted {
        Ep::write(self, id, landing, context)
    }
}

/// A MSG transport's event queue (connection management).
#[derive(Debug)]
struct EventQueue {
    token: Token,
    /// Its wait fd, in the worker's Poll for good (connection events are
    /// rare; the CQ's fd may be the same one). None only after a move to
    /// another domain failed to register the new one.
    fd: Option<RawFd>,
    /// It is read on the next pass: its wait fd woke the worker, or the
    /// worker is about to block ([`EQ_READ_EVERY`]).
    due: bool,
    next_read: Instant,
}

/// libfabric transport of one worker.
pub struct FabricTransport {
    // Links and listeners come first: fields drop in order, and endpoints
    // close before the Net (which otherwise stays open until they do).
    links: FxHashMap<LinkId, FabricLink>,
    listeners: FxHashMap<Token, PassiveEp>,
    /// Accepted endpoints not yet connected (FI_CONNECTED pending).
    by_key: FxHashMap<usize, LinkId>,
    shared: Shared,
    out: Outgoing,
    /// The event queue (connection management): its wait fd and when it
    /// is read.
    eq: EventQueue,
    /// Links that hit -FI_EAGAIN on send, retried on the next progress.
    retry: Vec<LinkId>,
    /// Receive slots whose messages were handled, reposted once this pass's
    /// sends are posted (`repost_handled`).
    handled: Vec<(LinkId, usize)>,
    /// Links with their set-up deadline, oldest first (entries of
    /// links that connected or went are skipped when they reach the front).
    half_open: VecDeque<(Instant, LinkId)>,
    /// Links with a rendezvous read in flight, and when their deadlines
    /// are looked at next.
    reads: usize,
    next_read_check: Instant,
    /// Applications' one-sided reads of peers' regions in flight
    /// ([`Transport::rma_read`](crate::Transport::rma_read)), and the number of the next one.
    user_reads: UserReads,
    next_user_read: u64,
}

impl FabricTransport {
    /// Opens `provider` for one worker and registers its EQ's wait fd in
    /// `registry` (the CQ's goes in while the worker sleeps).
    pub fn new(
        provider: &FabricProvider,
        registry: &Registry,
        ctx: &TransportContext,
    ) -> Result<Self, TransportError> {
        let opened = open_worker(provider, registry, ctx)?;
        // Tokens from the worker's link-id allocator: unique among its links.
        let eq_token = Token(ctx.link_ids.fetch_add(1, Ordering::Relaxed) as usize);
        let cq_token = Token(ctx.link_ids.fetch_add(1, Ordering::Relaxed) as usize);
        let (kind, _, net, registry) = &opened;
        let (eq_fd, cq_wait) = Self::register_wait_fds(kind, net, registry, eq_token, cq_token)?;
        let eq_fd = Some(eq_fd);
        Ok(FabricTransport {
            links: FxHashMap::default(),
            listeners: FxHashMap::default(),
            by_key: FxHashMap::default(),
            shared: Shared::new(opened, cq_wait, 2 * SLOTS * SLOT_SIZE, ctx),
            out: Outgoing::default(),
            eq: EventQueue {
                token: eq_token,
                fd: eq_fd,
                due: true,
                next_read: Instant::now(),
            },
            retry: Vec::new(),
            handled: Vec::new(),
            half_open: VecDeque::new(),
            reads: 0,
            next_read_check: Instant::now(),
            user_reads: UserReads::default(),
            next_user_read: 0,
        })
    }

    /// Registers the Net's EQ wait fd under its token and returns it, with
    /// the CQ's wait fd to register while the worker sleeps (none if the
    /// queues share one, or the CQ is polled).
    fn register_wait_fds(
        kind: &TransportKind,
        net: &Net,
        registry: &Registry,
        eq_token: Token,
        cq_token: Token,
    ) -> Result<(RawFd, CqWaitFd), TransportError> {
        let eq_fd = net.eq_fd().map_err(|e| fab_err(kind, e))?;
        let cq_fd = net.cq_fd().map_err(|e| fab_err(kind, e))?;
        let Some(eq_fd) = eq_fd else {
            return Err(TransportError::Unavailable {
                kind: kind.clone(),
                reason: "no wait fd for its event queue".into(),
            });
        };
        registry
            .register(&mut SourceFd(&eq_fd), eq_token, Interest::READABLE)
            .map_err(|e| TransportError::io("register libfabric wait fd", e))?;
        // A polled CQ (`fabric_cq_wait = poll`) has none: `wake_at` says
        // when to look at it.
        let wakes = !net.cq_polled() && cq_fd != Some(eq_fd);
        Ok((eq_fd, CqWaitFd::new(wakes, cq_token)))
    }

    /// Moves this worker's Net onto the domain that serves `site` while
    /// nothing is open on it yet. Providers such as `verbs` have one domain
    /// per RDMA device and open an endpoint only on the domain owning its
    /// address, which is unknown until the first listen or connect (the Net
    /// opened in [`FabricTransport::new`] sits on the provider's first
    /// domain). Later addresses of another domain fail in [`Net::listen`] /
    /// [`Net::connect`] with [`FabricError::OtherDomain`].
    fn settle_domain(&mut self, site: Site) -> Result<(), TransportError> {
        if !self.links.is_empty() || !self.listeners.is_empty() || self.shared.net.serves(site) {
            return Ok(());
        }
        let net = open_net(&self.shared.kind, Some(site), self.shared.net_options)?;
        // Out with the old queues' fds before they close: a number reused
        // later must not be taken for theirs.
        if let Some(fd) = self.eq.fd.take() {
            let _ = self.shared.registry.deregister(&mut SourceFd(&fd));
        }
        self.shared.cq_wait.replace(false, &self.shared.registry);
        tracing::debug!(from = %self.shared.net.domain(), to = %net.domain(), %site, "fabric worker moves to the domain of its first address");
        // Kept registrations belong to the old domain: out before it closes.
        self.shared.reg_cache.clear();
        self.shared.net = net;
        self.shared.rndv = self.shared.net.rma();
        let (eq_fd, cq_wait) = Self::register_wait_fds(
            &self.shared.kind,
            &self.shared.net,
            &self.shared.registry,
            self.eq.token,
            self.shared.cq_wait.token(),
        )?;
        self.eq.fd = Some(eq_fd);
        self.shared.cq_wait = cq_wait;
        Ok(())
    }

    fn fail(&mut self, id: LinkId, why: LinkFailure, events: &mut Vec<TransportEvent>) {
        if self.drop_link(id).is_some() {
            events.push(TransportEvent::Failed(id, why));
        }
    }

    /// Fails every link: a queue they all depend on cannot be read
    /// ([`fail_every_link`]).
    fn fail_all(&mut self, why: LinkFailure, events: &mut Vec<TransportEvent>) -> bool {
        let ids = self.links.keys().copied().collect();
        fail_every_link(ids, &why, |id, why| self.fail(id, why, events))
    }

    fn post_recvs(ep: &mut Ep, id: LinkId) -> Result<(), FabricError> {
        for slot in 0..ep.slots() {
            ep.post_recv(slot, context(id, true, slot))?;
        }
        Ok(())
    }

    /// Reads connection-management events. Returns whether there were any.
    fn drain_eq(&mut self, events: &mut Vec<TransportEvent>) -> bool {
        let mut any = false;
        loop {
            let ev = match self.shared.queue_failures.read_eq(&mut self.shared.net) {
                Ok(Some(ev)) => ev,
                Ok(None) => break,
                Err(why) => return self.fail_all(why, events) || any,
            };
            any = true;
            match ev {
                CmEvent::ConnReq(req) => self.accept(req),
                CmEvent::Connected(key, caps) => {
                    let Some(&id) = self.by_key.get(&key) else {
                        continue;
                    };
                    let Some(link) = self.links.get_mut(&id) else {
                        continue;
                    };
                    link.connected = true;
                    if link.accepted.is_none() {
                        link.common.peer_rndv = rendezvous::peer_op(&caps);
                        link.common.peer_late = rendezvous::peer_late_epilogue(&caps);
                    }
                    match link.accepted {
                        Some((listener, peer)) => events.push(TransportEvent::Accepted {
                            link: id,
                            peer,
                            listener,
                        }),
                        None => events.push(TransportEvent::Connected(id)),
                    }
                    if !link.common.outbox.is_empty() {
                        self.out.dirty.push(id);
                    }
                }
                CmEvent::Shutdown(key) => {
                    if let Some(&id) = self.by_key.get(&key) {
                        let why = "connection closed by peer (FI_SHUTDOWN)";
                        self.fail(id, LinkFailure::ClosedByPeer(why.into()), events);
                    }
                }
                CmEvent::Error(key, why) => match self.by_key.get(&key) {
                    Some(&id) => {
                        self.fail(id, LinkFailure::Reset(format!("connection: {why}")), events)
                    }
                    None => tracing::debug!(%why, "libfabric EQ error for no link"),
                },
            }
        }
        any
    }

    /// Accepts a connection request on the listener it came to. One that
    /// cannot be accepted before an endpoint takes it is rejected, so the
    /// connector fails at once (`FI_ECONNREFUSED`) rather than by its set-up
    /// deadline; after that, dropping the endpoint tells the connector.
    fn accept(&mut self, req: ConnReq) {
        let Some((&listener, pep)) = self
            .listeners
            .iter_mut()
            .find(|(_, pep)| pep.key() == req.listener())
        else {
            // Its listener is closed: nothing left to reject it with.
            tracing::debug!("fabric connection request for a closed listener, dropped");
            return;
        };
        if !self.shared.link_budget.admits(self.links.len()) {
            tracing::debug!("fabric connection refused: fabric_link_bytes reached");
            if let Err(e) = pep.reject(req) {
                tracing::warn!(error = %e, "fi_reject failed");
            }
            return;
        }
        let peer = req
            .peer()
            .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)));
        let id = LinkId(self.shared.link_ids.fetch_add(1, Ordering::Relaxed));
        let (peer_rndv, peer_late) = (
            rendezvous::peer_op(req.data()),
            rendezvous::peer_late_epilogue(req.data()),
        );
        match self
            .shared
            .net
            .accept(req, SLOTS, SLOT_SIZE, &rendezvous::caps(self.shared.rndv))
        {
            Ok(mut ep) => {
                if let Err(e) = Self::post_recvs(&mut ep, id) {
                    tracing::warn!(error = %e, "dropping accepted fabric connection");
                    return;
                }
                self.by_key.insert(ep.key(), id);
                let mut link = FabricLink::new(ep, Some((listener, peer)));
                link.common.peer_rndv = peer_rndv;
                link.common.peer_late = peer_late;
                self.links.insert(id, link);
                self.half_open
                    .push_back((Instant::now() + SETUP_TIMEOUT, id));
            }
            Err((e, req)) => {
                tracing::warn!(error = %e, "fi_accept failed");
                let rejected = req.zip(self.listeners.get_mut(&listener));
                if let Some(Err(e)) = rejected.map(|(req, pep)| pep.reject(req)) {
                    tracing::warn!(error = %e, "fi_reject failed");
                }
            }
        }
    }

    /// Reads completions in batches. Returns whether there were any.
    fn drain_cq(&mut self, events: &mut Vec<TransportEvent>) -> bool {
        match read_completions(self, |t, c| t.complete(c, events)) {
            Ok(any) => any,
            Err((any, why)) => self.fail_all(why, events) || any,
        }
    }

    fn complete(&mut self, c: &Completion, events: &mut Vec<TransportEvent>) {
        if is_user_read(c.context) {
            let (id, _, _) = decode_context(c.context);
            if let Some(link) = self.links.get_mut(&id) {
                self.user_reads
                    .done(link.ep.rma(), c.context, c.error, events);
            }
            return;
        }
        if is_read(c.context) {
            return self.read_complete(c, events);
        }
        if is_write(c.context) {
            return self.write_complete(c, events);
        }
        let (id, rx, slot) = decode_context(c.context);
        let Some(link) = self.links.get_mut(&id) else {
            return; // a closed link's flushed operation
        };
        if let Some(error) = c.error {
            let op = if rx { "receive" } else { "send" };
            self.fail(id, completion_failure(op, error), events);
            return;
        }
        if !rx {
            link.ep.send_done(slot);
            link.free_tx.push(slot);
            if link.common.close_after_flush && link.idle() {
                self.drop_link(id);
            } else if link.has_output() {
                self.out.dirty.push(id);
            }
            return;
        }
        link.common.last_heard = self.shared.now;
        // A paused link keeps its slots (backpressure), except while a read
        // is in flight (its data may come behind them) and for grants,
        // "written" and answers: a pause stops what comes in, not what
        // this end sends.
        if link.common.frozen
            || (link.common.paused
                && link.common.receiving.reading.is_none()
                && !is_control(link.ep.recv_done(slot, c.len)))
        {
            link.held.push_back((slot, c.len));
            return;
        }
        self.receive(id, slot, c.len, events);
    }

    /// A rendezvous fi_read completed: the unit goes up, the sender is told
    /// (RNDV_DONE), and the messages that waited behind it follow.
    fn read_complete(&mut self, c: &Completion, events: &mut Vec<TransportEvent>) {
        let (id, _, _) = decode_context(c.context);
        self.rendezvous_arrived(id, c.context, c.error, events);
    }

    /// The unit of link `id`'s rendezvous under `context` arrived (its read
    /// completed, with `error` if it failed, or the peer said it wrote it
    /// into our grant): it goes up, the sender is told (RNDV_DONE), and the
    /// messages that waited behind it follow.
    fn rendezvous_arrived(
        &mut self,
        id: LinkId,
        context: u64,
        error: Option<(i32, &'static str)>,
        events: &mut Vec<TransportEvent>,
    ) {
        let Some(link) = self.links.get_mut(&id) else {
            return; // the link went while its read was in flight
        };
        let rma = link.ep.rma();
        let landed = self
            .shared
            .landed(Some(&mut link.common), rma, context, error);
        if let Some(unit) = landed.unit {
            self.unit_arrived(id, unit, events);
        }
    }

    /// Link `id`'s rendezvous unit is whole (read or written, its epilogue
    /// in place): it goes up, its answer is sent, and the messages that
    /// waited behind it follow; or the link fails.
    fn unit_arrived(
        &mut self,
        id: LinkId,
        unit: Result<Inbound, PieceError>,
        events: &mut Vec<TransportEvent>,
    ) {
        // Its read is over, unless the link fails with it still in flight
        // (an epilogue that did not fit): `drop_link` counts that one.
        if self
            .links
            .get(&id)
            .is_some_and(|l| l.common.receiving.reading.is_none())
        {
            self.reads -= 1;
        }
        if !report_unit(id, unit, events) {
            self.drop_link(id);
            return;
        }
        let Some(link) = self.links.get(&id) else {
            return;
        };
        self.out.dirty.push(id);
        if !link.held.is_empty() || !link.behind_read.is_empty() {
            self.out.resumed.push(id);
        }
    }

    /// The late epilogue of a unit of `id`'s came: the unit goes up if it
    /// is there already (see [`Receiving::epilogue_arrived`](super::rendezvous::Receiving::epilogue_arrived)).
    fn epilogue_arrived(
        &mut self,
        id: LinkId,
        body: &[u8],
        events: &mut Vec<TransportEvent>,
    ) -> Result<Option<Inbound>, PieceError> {
        let Some(link) = self.links.get_mut(&id) else {
            return Ok(None);
        };
        let unit = link.common.receiving.epilogue_arrived(
            body,
            &mut link.common.reasm,
            &self.shared.limits,
            &mut self.shared.rndv_counters,
        )?;
        if let Some(unit) = unit {
            self.unit_arrived(id, unit, events);
        }
        Ok(None)
    }

    /// Starts the fi_read a RNDV message describes, or grants the buffer
    /// its unit is to be written into.
    fn start_read(&mut self, id: LinkId, body: &[u8]) -> Result<Option<Inbound>, PieceError> {
        let Some(link) = self.links.get_mut(&id) else {
            return Ok(None);
        };
        let mid_unit = !link.common.reasm.is_idle();
        let d = rendezvous::check_offer(
            body,
            self.shared.limits.max_frame,
            mid_unit,
            self.shared.rndv,
        )?;
        let counters = &mut self.shared.rndv_counters;
        if link
            .common
            .receiving
            .take_offer(&d, &mut link.ep, read_context(id), counters)?
        {
            self.out.dirty.push(id);
        }
        if self.reads == 0 {
            self.next_read_check = Instant::now() + self.shared.read_timeout;
        }
        self.reads += 1;
        Ok(None)
    }

    /// The peer read unit `their` of ours: it goes.
    fn read_by_peer(&mut self, id: LinkId, body: &[u8]) -> Result<Option<Inbound>, PieceError> {
        let Some(link) = self.links.get_mut(&id) else {
            return Ok(None);
        };
        let done = rendezvous::decode_done(body);
        link.common
            .exposures
            .answered(done, link.ep.rma())
            .map_err(|e| PieceError::Malformed(e.to_string()))?;
        self.out.dirty.push(id);
        Ok(None)
    }

    /// The peer granted a buffer for our unit `body` names: the unit is
    /// written into it, and the peer told so right behind the write.
    fn grant_received(&mut self, id: LinkId, body: &[u8]) -> Result<Option<Inbound>, PieceError> {
        let Some(link) = self.links.get_mut(&id) else {
            return Ok(None);
        };
        let grant = rendezvous::decode_grant(body);
        let context = |unit| write_context(id, unit);
        link.common
            .exposures
            .write_granted(grant, &mut link.ep, context, &mut self.shared.rndv_counters)
            .map_err(PieceError::Failed)?;
        self.out.dirty.push(id);
        Ok(None)
    }

    /// The peer says it wrote the unit this link waits for into our grant.
    fn written_by_peer(
        &mut self,
        id: LinkId,
        body: &[u8],
        events: &mut Vec<TransportEvent>,
    ) -> Result<Option<Inbound>, PieceError> {
        let Some(link) = self.links.get_mut(&id) else {
            return Ok(None);
        };
        let context = link
            .common
            .receiving
            .written(rendezvous::decode_done(body))
            .map_err(|e| PieceError::Malformed(e.to_string()))?;
        self.rendezvous_arrived(id, context, None, events);
        Ok(None)
    }

    /// One of our writes completed: its unit may go once the peer answers
    /// (RNDV_DONE); a failed write fails the link.
    fn write_complete(&mut self, c: &Completion, events: &mut Vec<TransportEvent>) {
        let (id, _, _) = decode_context(c.context);
        let Some(link) = self.links.get_mut(&id) else {
            return; // its endpoint closed, and its buffers went with it
        };
        link.ep.rma().write_done(c.context);
        if let Some(error) = c.error {
            self.fail(id, completion_failure("fi_write", error), events);
        }
    }

    /// Fails links whose rendezvous read missed its deadline; looked at no
    /// more often than the deadline's tenth while reads are in flight.
    fn check_reads(&mut self, now: Instant, events: &mut Vec<TransportEvent>) {
        if self.reads == 0 {
            return;
        }
        if now < self.next_read_check {
            return;
        }
        self.next_read_check = now + self.shared.read_timeout / 10;
        let overdue: Vec<LinkId> = self
            .links
            .iter()
            .filter(|(_, l)| l.common.receiving.overdue(now, self.shared.read_timeout))
            .map(|(&id, _)| id)
            .collect();
        for id in overdue {
            let why = self
                .shared
                .rndv_counters
                .read_timed_out(self.shared.read_timeout);
            self.fail(id, LinkFailure::Timeout(why), events);
        }
    }

    /// Handles one received message on `id` and reposts its slot.
    fn receive(&mut self, id: LinkId, slot: usize, len: usize, events: &mut Vec<TransportEvent>) {
        let Some(link) = self.links.get_mut(&id) else {
            return;
        };
        // Grants, "written" and answers go at once: the unit a read waits
        // for may be the one a grant asks us to write, or the one "written"
        // announces.
        if link.behind_a_read() && !is_control(link.ep.recv_done(slot, len)) {
            let copy = link.ep.recv_done(slot, len).to_vec();
            link.behind_read_bytes += copy.len();
            link.behind_read.push_back(copy);
            let too_much = link.behind_read_bytes > BEHIND_READ_MAX;
            if let Err(e) = link.ep.post_recv(slot, context(id, true, slot)) {
                self.fail(id, post_failure("repost receive", &e), events);
            } else if too_much {
                let why = format!("more than {BEHIND_READ_MAX} bytes behind a rendezvous read");
                self.fail(id, LinkFailure::Protocol(why), events);
            }
            return;
        }
        self.handle(id, Message::Slot(slot, len), events);
    }

    /// Reposts the receive slots of the messages handled since the last
    /// call. Deferred from `handle` to the pass's flush (and the next poll):
    /// the receive a 64 B request frees is not needed before the reply to
    /// it is posted, which then goes sooner.
    fn repost_handled(&mut self, events: &mut Vec<TransportEvent>) {
        if self.handled.is_empty() {
            return; // every idle pass of a spinning worker comes here
        }
        // Drained, not dropped: its memory serves the next pass.
        let mut handled = std::mem::take(&mut self.handled);
        for (id, slot) in handled.drain(..) {
            let Some(link) = self.links.get_mut(&id) else {
                continue; // its endpoint and slots went with it
            };
            if let Err(e) = link.ep.post_recv(slot, context(id, true, slot)) {
                self.fail(id, post_failure("repost receive", &e), events);
            }
        }
        handled.append(&mut self.handled);
        self.handled = handled;
    }

    /// Handles a message of `id` that waited for nothing else (its slot is
    /// reposted by `repost_handled`).
    fn handle(&mut self, id: LinkId, msg: Message, events: &mut Vec<TransportEvent>) {
        let Some(link) = self.links.get_mut(&id) else {
            return;
        };
        let data = match &msg {
            Message::Slot(slot, len) => link.ep.recv_done(*slot, *len),
            Message::Copy(bytes) => &bytes[..],
        };
        let outcome = match data.split_first() {
            None => Err(PieceError::Malformed("empty message".into())),
            Some((&hdr, body)) if hdr == MORE || hdr == LAST => {
                link.common
                    .reasm
                    .push(hdr == LAST, body, &self.shared.limits)
            }
            // Bodies are copied out of the slot, which is reposted below.
            Some((&RNDV, body)) => {
                let desc = OutOfSlot::<{ rendezvous::DESC_MAX }>::new(body);
                self.start_read(id, desc.bytes())
            }
            Some((&RNDV_DONE, body)) => {
                let done = OutOfSlot::<{ rendezvous::DONE_LEN }>::new(body);
                self.read_by_peer(id, done.bytes())
            }
            Some((&RNDV_GRANT, body)) => {
                let grant = OutOfSlot::<{ rendezvous::GRANT_LEN }>::new(body);
                self.grant_received(id, grant.bytes())
            }
            Some((&RNDV_WRITTEN, body)) => {
                let written = OutOfSlot::<{ rendezvous::DONE_LEN }>::new(body);
                self.written_by_peer(id, written.bytes(), events)
            }
            Some((&RNDV_EPILOGUE, body)) => {
                let epilogue = OutOfSlot::<{ rendezvous::EPILOGUE_MSG_MAX }>::new(body);
                self.epilogue_arrived(id, epilogue.bytes(), events)
            }
            Some((&hdr, _)) => Err(PieceError::Malformed(format!(
                "bad message header {hdr:#x}"
            ))),
        };
        if !self.links.contains_key(&id) {
            return; // its endpoint and slots went with it
        }
        match outcome {
            Ok(unit) => {
                if let Some(unit) = unit {
                    events.push(TransportEvent::Received(id, unit));
                }
                if let Message::Slot(slot, _) = msg {
                    self.handled.push((id, slot));
                }
            }
            Err(PieceError::Corrupt(e)) => {
                self.drop_link(id);
                events.push(TransportEvent::Corrupt(id, ProtocolError::Frame(e)));
            }
            Err(PieceError::Malformed(why)) => {
                tracing::debug!(link = id.0, %why, "malformed fabric message");
                self.fail(
                    id,
                    LinkFailure::Protocol(format!("malformed message: {why}")),
                    events,
                );
            }
            Err(PieceError::Failed(why)) => self.fail(id, why, events),
        }
    }

    fn flush_into(
        id: LinkId,
        link: &mut FabricLink,
        rndv: bool,
        counters: &mut Counters,
        reg_cache: &mut RegCache<ReadRegion>,
    ) -> Result<(), FabricError> {
        loop {
            if !link.post_owed(id)? {
                return Ok(());
            }
            let staged =
                link.common
                    .exposures
                    .stage(rndv, &mut link.common.outbox, counters, |unit| {
                        rendezvous::expose(link.ep.rma(), reg_cache, unit, SLOT_SIZE - 1)
                    });
            if let Some(d) = staged {
                if !link.post(id, |buf| {
                    buf[0] = RNDV;
                    1 + rendezvous::encode(&mut buf[1..], &d)
                })? {
                    return Ok(());
                }
                link.common.exposures.sent(counters);
                continue; // its late epilogue (owed now) goes next
            }
            let in_place = link.ep.sends_in_place();
            let Some(mut piece) = link.common.outbox.next_piece(
                &link.common.exposures,
                rndv,
                SLOT_SIZE - 1,
                in_place,
            ) else {
                return Ok(());
            };
            let Some(&slot) = link.free_tx.last() else {
                return Ok(());
            };
            let Some(buf) = link.ep.tx_slot(slot) else {
                link.free_tx.pop();
                continue;
            };
            buf[0] = if piece.last { LAST } else { MORE };
            match piece.shared.take() {
                Some(body) => {
                    link.ep
                        .send_in_place(slot, 1, body, context(id, false, slot))?;
                    counters.pieces_in_place += 1;
                }
                None => {
                    link.common.outbox.copy_out(&piece, &mut buf[1..]);
                    link.ep
                        .send(slot, piece.len + 1, context(id, false, slot))?;
                }
            }
            link.free_tx.pop();
            link.common
                .outbox
                .piece_sent(&piece, &mut link.common.exposures);
        }
    }

    /// Drops links whose set-up deadline passed unconnected (outgoing ones
    /// are reported failed); pops entries of links that connected or went.
    fn reap_half_open(&mut self, now: Instant) {
        while let Some(&(deadline, id)) = self.half_open.front() {
            match self.links.get(&id) {
                Some(l) if !l.connected => {
                    if deadline > now {
                        break;
                    }
                    let accepted = l.accepted.is_some();
                    tracing::debug!(
                        ?id,
                        accepted,
                        "fabric link not connected within {SETUP_TIMEOUT:?}"
                    );
                    self.drop_link(id);
                    if !accepted {
                        let why =
                            LinkFailure::Timeout(format!("not connected within {SETUP_TIMEOUT:?}"));
                        self.out
                            .deferred_events
                            .push(TransportEvent::Failed(id, why));
                    }
                }
                _ => {}
            }
            self.half_open.pop_front();
        }
    }

    /// Handles `id`'s messages that waited — behind a finished read first,
    /// then those held while paused — until reading pauses or another read
    /// starts (held slots are then copied behind it). Returns whether any.
    fn hand_up_waiting(&mut self, id: LinkId, events: &mut Vec<TransportEvent>) -> bool {
        let mut any = false;
        while let Some(link) = self.links.get_mut(&id) {
            if link.holding() {
                break;
            }
            if link.common.receiving.reading.is_none() {
                if let Some(copy) = link.behind_read.pop_front() {
                    link.behind_read_bytes -= copy.len();
                    any = true;
                    self.handle(id, Message::Copy(copy), events);
                    continue;
                }
            }
            let Some((slot, len)) = link.held.pop_front() else {
                break;
            };
            any = true;
            self.receive(id, slot, len, events);
        }
        any
    }
}

impl QueuedLink for FabricLink {
    fn common(&self) -> &LinkCommon {
        &self.common
    }

    fn common_mut(&mut self) -> &mut LinkCommon {
        &mut self.common
    }

    fn has_output(&self) -> bool {
        FabricLink::has_output(self)
    }

    fn up(&self) -> bool {
        self.connected
    }

    fn idle(&self) -> bool {
        FabricLink::idle(self)
    }

    fn holds_received(&self) -> bool {
        !self.held.is_empty() || !self.behind_read.is_empty()
    }
}

impl Queueing for FabricTransport {
    type Link = FabricLink;

    queueing_parts!(FabricLink);

    /// Sends what a link has to send, in free transmit slots: RNDV_DONE
    /// answers first, then queued units in order — a large one at a unit
    /// boundary as a RNDV descriptor (exposed here), others copied in pieces.
    fn flush_link(&mut self, id: LinkId, events: &mut Vec<TransportEvent>) {
        let Some(link) = self.links.get_mut(&id) else {
            return;
        };
        if !link.connected || link.common.frozen {
            return;
        }
        let rndv = rendezvous::link_op(self.shared.rndv, link.common.peer_rndv).is_some();
        match Self::flush_into(
            id,
            link,
            rndv,
            &mut self.shared.rndv_counters,
            &mut self.shared.reg_cache,
        ) {
            Ok(()) => {}
            Err(e) if msgr_fabric::is_again(&e) => self.retry.push(id),
            Err(e) => self.fail(id, post_failure("fi_send", &e), events),
        }
    }

    /// Posts a small frame from `send` straight into a transmit slot,
    /// encoded there — no copy into the arena first, no queue — when `id`
    /// is connected with nothing queued or owed and a slot is free: what a
    /// reply in a ping-pong finds. Gives the frame back where it must go
    /// the queue's way (which also retries a failed post and reports the
    /// failure).
    fn post_small(&mut self, id: LinkId, f: Transmit) -> Result<Option<Transmit>, TransportError> {
        let Some(link) = self.links.get_mut(&id) else {
            return Ok(Some(f));
        };
        let len = f.encoded_len();
        if !link.connected
            || link.common.frozen
            || link.common.close_after_flush
            || link.has_output()
            || len >= rendezvous::SMALL_UNIT
        {
            return Ok(Some(f));
        }
        let unit = f.checked()?;
        let fill = |buf: &mut [u8]| {
            buf[0] = LAST;
            unit.write(&mut &mut buf[1..]);
            1 + len
        };
        match link.post(id, fill) {
            Ok(true) => Ok(None),
            Ok(false) | Err(_) => Ok(Some(f)),
        }
    }
}

impl Drop for FabricTransport {
    fn drop(&mut self) {
        if let Some(fd) = self.eq.fd {
            let _ = self.shared.registry.deregister(&mut SourceFd(&fd));
        }
        self.shared.cq_wait.disarm(&self.shared.registry);
        // Kept registrations go with the transport, not after the Net
        // (declared after it; each would hold its domain open); those still
        // lent go with their endpoints.
        self.shared.reg_cache.clear();
    }
}

/// Its kind and number of links (see `endpoint_kind::debug`).
impl std::fmt::Debug for FabricTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        endpoint_kind::debug(self, "FabricTransport", f)
    }
}

impl EndpointKind for FabricTransport {
    const ABORTED: &'static str = "injected abortive close (endpoint closed)";

    /// Removes a link; its endpoint closes with it, and with the endpoint
    /// its exposed buffers and a read in flight.
    fn drop_link(&mut self, id: LinkId) -> Option<FabricLink> {
        let link = self.links.remove(&id)?;
        self.by_key.remove(&link.ep.key());
        self.user_reads.forget_link(id);
        if link.common.receiving.reading.is_some() {
            self.reads -= 1;
        }
        Some(link)
    }

    fn poll_all(&mut self, now: Instant, events: &mut Vec<TransportEvent>) -> bool {
        self.shared.now = now;
        self.shared.cq_wait.disarm(&self.shared.registry);
        self.reap_half_open(now);
        self.check_reads(now, events);
        let mut any = !self.out.deferred_events.is_empty();
        events.append(&mut self.out.deferred_events);
        self.repost_handled(events);
        if self.eq.due || !self.half_open.is_empty() || now >= self.eq.next_read {
            self.eq.due = false;
            self.eq.next_read = now + EQ_READ_EVERY;
            any |= self.drain_eq(events);
        }
        any |= self.drain_cq(events);
        for id in std::mem::take(&mut self.out.resumed) {
            any |= self.hand_up_waiting(id, events);
        }
        if !self.retry.is_empty() {
            any = true;
            let retry = std::mem::take(&mut self.retry);
            for id in retry {
                self.flush_link(id, events);
            }
        }
        any
    }

    fn open_listener(
        &mut self,
        addr: &EntityAddr,
        token: Token,
    ) -> Result<EntityAddr, TransportError> {
        self.settle_domain(Site::Local(addr.socket))?;
        let pep =
            self.shared.net.listen(addr.socket).map_err(|e| {
                TransportError::io("fi_listen", std::io::Error::other(e.to_string()))
            })?;
        let port = pep.addr().port();
        self.listeners.insert(token, pep);
        Ok(addr.clone().with_port(port))
    }

    /// Also drops the listener's accepted links that are not connected yet:
    /// they belong to no session, and a shutting-down messenger would
    /// otherwise find them left over.
    fn close_listener(&mut self, token: Token) {
        self.listeners.remove(&token);
        let half_open: Vec<LinkId> = self
            .links
            .iter()
            .filter(|(_, l)| !l.connected && matches!(l.accepted, Some((t, _)) if t == token))
            .map(|(&id, _)| id)
            .collect();
        for id in half_open {
            self.drop_link(id);
        }
    }

    fn dial(&mut self, link: LinkId, addr: &EntityAddr) -> Result<(), TransportError> {
        self.settle_domain(Site::Peer(addr.socket))?;
        let mut ep = self
            .shared
            .net
            .connect(
                addr.socket,
                SLOTS,
                SLOT_SIZE,
                &rendezvous::caps(self.shared.rndv),
            )
            .map_err(|e| TransportError::io("fi_connect", std::io::Error::other(e.to_string())))?;
        Self::post_recvs(&mut ep, link)
            .map_err(|e| TransportError::io("fi_recv", std::io::Error::other(e.to_string())))?;
        self.by_key.insert(ep.key(), link);
        self.links.insert(link, FabricLink::new(ep, None));
        self.half_open
            .push_back((Instant::now() + SETUP_TIMEOUT, link));
        Ok(())
    }

    fn flush_pass(&mut self, _now: Instant, events: &mut Vec<TransportEvent>) {
        self.repost_handled(events);
        let flush = |t: &mut Self, id| t.flush_link(id, events);
        crate::dirty::DirtyLinks::flush_each(self, |t| &mut t.out.dirty, flush);
    }

    fn woken(&mut self, event: &Event) {
        // One fd may serve both queues (then it is registered as the EQ's).
        self.eq.due |= event.token() == self.eq.token;
    }

    /// The CQ's wait fds into the Poll and `fi_trywait` on the EQ and CQ: if
    /// the provider has something pending already, the worker polls again
    /// instead of blocking.
    fn arm_wait(&mut self) -> bool {
        // An event left unread makes fi_trywait refuse; the pass it sends
        // the worker back to must read it rather than spin until
        // EQ_READ_EVERY.
        self.eq.due = true;
        self.shared
            .cq_wait
            .arm(&self.shared.registry, &mut self.shared.net);
        self.shared.net.try_wait()
    }

    /// With a polled CQ (`fabric_cq_wait = poll`), also when to look at
    /// it: at once while a link is moving data or a rendezvous unit is
    /// under way, else every
    /// [`rdm::POLL_INTERVAL`] (the RDM transport's rule for `shm`).
    fn next_wake(&self) -> Option<Instant> {
        let setup = self.half_open.front().map(|&(deadline, _)| deadline);
        let reads = (self.reads > 0).then_some(self.next_read_check);
        let poll = (self.shared.net.cq_polled() || self.shared.cq_wait.failed()).then(|| {
            let now = Instant::now();
            // A unit being read or written into a grant is moving too.
            let moving = self.reads > 0 || self.links.values().any(|l| l.moving(now));
            if moving {
                now
            } else {
                now + rdm::POLL_INTERVAL
            }
        });
        setup.into_iter().chain(reads).chain(poll).min()
    }

    fn owns_token(&self, token: Token) -> bool {
        token == self.eq.token
            || self.listeners.contains_key(&token)
            || self.links.contains_key(&LinkId(token.0 as u64))
    }

    fn user_exposures(&mut self, link: LinkId) -> Option<(&mut UserExposures, &mut RmaBuffers)> {
        let l = self.links.get_mut(&link)?;
        Some((&mut l.user, l.ep.rma()))
    }

    fn unexpose_everywhere(&mut self, region: u64) {
        for l in self.links.values_mut() {
            l.user.unexpose(l.ep.rma(), region);
        }
    }

    fn start_user_read(&mut self, read: UserRead<'_>) -> Result<(), TransportError> {
        let (link, key, range, token) = read;
        let context = user_read_context(link, self.next_user_read);
        self.next_user_read = self.next_user_read.wrapping_add(1);
        let l = self
            .links
            .get_mut(&link)
            .ok_or(TransportError::NoSuchLink(link.0))?;
        let ep = &mut l.ep;
        self.user_reads
            .start((link, token, context), key, range, |x| {
                ep.read(x, context, &[], 0)
            })
            .map_err(|reason| self.shared.unavailable(reason.to_string()))
    }
}

#[cfg(test)]
mod tests;
