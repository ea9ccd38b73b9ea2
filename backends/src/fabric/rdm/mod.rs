//! The libfabric backend over `FI_EP_RDM` endpoints
//! (`fabric+PROV://IP:PORT?ep=rdm`): tested with `tcp` (libfabric stacks
//! `ofi_rxm` on it: `tcp;ofi_rxm`) and `shm`.
//!
//! # Naming endpoints
//!
//! An RDM endpoint has a provider-specific name (`fi_getname`). The
//! `EntityAddr` socket is turned into that name by `fi_getinfo` itself, so no
//! side channel is needed:
//! - `tcp;ofi_rxm`: the name is the socket address the endpoint listens on.
//!   A listener bound to port 0 reads the port the OS chose from its name.
//! - `shm`: an endpoint opened with `FI_SOURCE` and node `IP`, service `PORT`
//!   is named `fi_ns://IP:PORT` (a shared-memory region of that name), and
//!   the connector resolves the same address to the same name. The port is
//!   only part of a name, so a listener keeps a loopback TCP socket bound to
//!   it for its lifetime: that makes the name unique on the host, and port 0
//!   picks a free one.
//!
//! Connecting links leave from one anonymous endpoint per transport; each
//! listener has its own endpoint. All endpoints share the worker's CQ.
//!
//! # Links over a connectionless endpoint
//!
//! A link is (a peer in the endpoint's address vector, the link ids and
//! cookies of both ends). Every message starts with a [`HEADER_LEN`]-byte
//! header: kind, credits returned, and the receiving link's id and cookie (a
//! random number per link, so a stale message for a reused id is dropped).
//! - Connect: the connector sends `HELLO` (its link id, cookie and endpoint
//!   name, then whether it reads rendezvous units: `rendezvous::caps`).
//!   The listener answers a first HELLO with `CHALLENGE` alone, sent to the
//!   name the HELLO claims, and allocates nothing; the connector sends its
//!   HELLO again with the challenge's token, which proves it receives at
//!   that name (`challenge`: no link state in another endpoint's name, a
//!   replayed HELLO admits nothing). Then
//!   the listener inserts the name in its address vector (once per
//!   peer, reference-counted, removed when no link or send uses it, so a
//!   restarted peer of the same name is mapped afresh), reports `Accepted`
//!   and answers `WELCOME` (its id and cookie, then its own capabilities);
//!   the connector reports `Connected`.
//! - Data: units are split into pieces of at most a slot (`DATA_MORE` ...
//!   `DATA_LAST`) and joined by the receiver as on MSG endpoints. Each piece
//!   carries its number on the link: even with send-after-send ordering
//!   (asked in the hints), receive *completions* can come out of order — a
//!   small message sent after a large one completes first when the large one
//!   goes by the provider's rendezvous protocol (`ofi_rxm` above 16 KiB) —
//!   so the receiver holds early pieces (at most the link's credits) and
//!   hands them up in order; a piece that overtook the `WELCOME` waits for it.
//! - Flow control: receives come from one pool per endpoint, shared by its
//!   links as an SRQ is. Each end of a link takes a window of data
//!   messages unconsumed — [`WINDOW_BYTES`] of slots, at least [`CREDITS`]
//!   and at most [`MAX_WINDOW`]: 16 of 64 KiB over `tcp;ofi_rxm`, 64 of
//!   `shm`'s 4 KiB — and says so in its HELLO or WELCOME (an msgr from
//!   before says nothing and takes [`CREDITS`]); a sender holds at most
//!   its peer's window in credits. The receiver returns credits in every
//!   header it sends and in a `KEEP` message once half its window (at most
//!   32) is owed — within the poll where pieces came in bulk, before the
//!   worker delivers them, so sender and receiver work at once. The pool
//!   grows by the window + [`CONTROL_SLACK`] slots per link (never
//!   shrinks), so a sender never overruns it.
//! - Liveness: a link that has sent nothing for [`KEEP_AFTER`] sends `KEEP`;
//!   a link that has heard nothing for [`LINK_DEADLINE`] (including a
//!   connect never welcomed) fails. A receiver that paused reading still
//!   answers, so only a dead or hung peer trips the deadline. A connect
//!   whose HELLO could not be posted all that time (-FI_EAGAIN) moves
//!   later connects to a new outgoing endpoint
//!   (`RdmTransport::replace_out_port`).
//! - Close: `CLOSE` tells the peer, whose link then fails as on
//!   `FI_SHUTDOWN`; an injected abort does the same without flushing.
//!
//! # Rendezvous for large units
//!
//! Where the provider offers `FI_RMA` with reads (`tcp;ofi_rxm`, `shm`),
//! a unit larger than
//! [`RNDV_THRESHOLD`] goes by the `fi_read` rendezvous of
//! `super::rendezvous` (shared with MSG endpoints): its descriptor is a
//! `RNDV` data piece in the link's ordered stream (later pieces wait for
//! the read), answered by `RNDV_DONE`. At most [`RNDV_MAX`] units per link
//! are exposed at once; a read that does not complete within the read
//! timeout (`rdma_read_timeout_ms`) fails the link (`read_timeouts`).
//! The endpoint outlives its links, so a read still in flight when its
//! link goes keeps its buffer in the endpoint until it completes. Where
//! the reads are withheld (`tcp;ofi_rxm` on libfabric 1.17) the units go
//! by `fi_write` into a buffer the receiver grants (`RNDV_GRANT`, then
//! `RNDV_WRITTEN` right behind the write; both control messages, handled
//! on arrival); a granted buffer whose link goes before "written" stays
//! with the endpoint until it closes, since a write may still land in it.
//! Between peers that take it, a unit's epilogue follows its descriptor in
//! a control message of its own (`RNDV_EPILOGUE`), computed while the unit
//! moves (see `super::rendezvous`).
//!
//! `simulate(SimulatedFault::HungRead)` ignores the completion of the
//! link's next read (a fake: `tcp;ofi_rxm` never leaves a read hanging, see
//! `super::rendezvous`); the buffer is freed when the completion comes
//! anyway. A transport without rendezvous refuses it: there is no read
//! to hang, and `simulated_hung_reads` stays 0. A completion queue that
//! cannot be read fails every link, their peers' entries with them
//! (`cq_failures`, as on MSG endpoints; `SimulatedFault::CqReadError`).
//!
//! On `shm` a read is a `process_vm_readv` of the peer's memory, done by
//! the reader alone and with the key unchecked: a read of a buffer the
//! peer withdrew (its link dropped) would return whatever lies there now.
//! The check word every exposed buffer ends in (`msgr_fabric::CHECK_LEN`)
//! turns that into a failed read. A dropped `shm` transport leaks its
//! endpoints with their exposed buffers, so reads of those still return
//! the unit (the peer's link fails by CLOSE or deadline anyway).
//!
//! `shm` endpoints are never closed (they are leaked when dropped, see
//! `msgr_fabric`): libfabric 1.17's `shm` crashes when an endpoint of this
//! process that a peer talked to goes first.
//!
//! `shm` has no wait objects in libfabric 1.17: its CQ is polled, and
//! [`crate::Transport::wake_at`] asks the worker to wake every [`POLL_INTERVAL`]
//! while the transport has endpoints — at once while a link is moving data
//! and its peer answered within [`MOVING_WINDOW`] — unless the peers ring
//! it: an `shm` transport has a doorbell (`doorbell`), announced in HELLO
//! and WELCOME, which a peer rings after posting while the worker says it
//! sleeps. While every link's peer rings, the worker sleeps in epoll as a
//! TCP one does, at most [`BELL_BACKSTOP`].
//!
//! # Where each part lives
//!
//! - this module: [`RdmTransport`] — connect, listen, receive and hand up,
//!   flush within credits, housekeeping (keepalives, deadlines, CLOSEs);
//! - `wire`: the messages' kinds, the header, control bodies (HELLO,
//!   WELCOME);
//! - `challenge`: the tokens that admit a HELLO;
//! - `doorbell`: what wakes a sleeping `shm` worker;
//! - `context`: what an operation's completion context says (port, slot,
//!   receive, read or write);
//! - `port`: an endpoint the links share, its address-vector peers and
//!   receive pool;
//! - `link`: one link's state — credits, sequence numbers, pieces held
//!   until their turn;
//! - `tests` (tests only).
//!
//! # Layers
//!
//! Bottom first (`tests/layering.rs`):
//!
//! 1. `wire`, `context`, `doorbell`
//! 2. `challenge`, `port`
//! 3. `link`
//! 4. `arrival`: what arrives (an `impl RdmTransport` of its own)

use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use mio::{Registry, Token};
use msgr_addr::{EntityAddr, FabricProvider};
use msgr_fabric::{
    BellId, Completion, FabricError, Landing, PeerBell, RdmEp, ReadRegion, RmaBuffers, RmaOp,
    SendSlots, Site,
};
use msgr_proto::{FrameLimits, Inbound, LinkFailure, LinkId, ProtocolError, Transmit};
use rustc_hash::FxHashMap;

use self::challenge::{HelloChallenges, Verdict};
use super::common::Shared;
use super::endpoint_kind::{self, EndpointKind, UserRead};
use super::queueing::{queueing_parts, Links, Outgoing, Queueing};
use super::reassembly::{self, PieceError};
use super::rendezvous::{self, Counters};
use super::user_rma::UserExposures;
use super::wait_fd::CqWaitFd;
use super::{
    completion_failure, open_net, open_worker, post_failure, read_completions, rma_choice,
    OutOfSlot, CQ_BATCH, SLOT_SIZE,
};
use crate::queue_failure::fail_every_link;
use crate::regcache::RegCache;
use crate::{TransportContext, TransportError, TransportEvent};
use context::{
    context, decode_context, is_user_read, read_context, user_read_context, write_context,
    READ_BIT, WRITE_BIT,
};
use doorbell::Bells;
pub use doorbell::BELL_BACKSTOP;
use link::RdmLink;
use port::Port;
use wire::{
    read_dest, read_header, write_dest, write_header, write_window, Body, Dest, CHALLENGE, CLOSE,
    DATA_LAST, DATA_MORE, HELLO, HELLO_FIXED, KEEP, RNDV, RNDV_DONE, RNDV_EPILOGUE, RNDV_GRANT,
    RNDV_WRITTEN, WELCOME,
};

mod arrival;
mod challenge;
mod context;
mod doorbell;
mod link;
mod port;
#[cfg(test)]
mod tests;
mod wire;

pub use wire::HEADER_LEN;

/// Data messages a link may have unconsumed at its receiver where slots are
/// large (64 KiB), and at a peer that does not say its window (an msgr from
/// before [`WINDOW_BYTES`]).
pub const CREDITS: u32 = 16;
/// The bytes of data pieces a link takes unconsumed: its window in pieces
/// is this over the slot size, at least [`CREDITS`] and at most
/// [`MAX_WINDOW`] — 64 pieces of `shm`'s 4 KiB. With 16 of them (64 KiB
/// in flight) a stream ran in turns on a loaded machine: whichever end was
/// descheduled stopped the other within 64 KiB, where a TCP socket's
/// buffers take megabytes (docs/BENCHMARKS.md, the shm section).
pub const WINDOW_BYTES: usize = 256 << 10;
/// The largest window a link takes or grants, in pieces: the transmit
/// slots of an endpoint, as a larger one could not be filled between two
/// polls anyway.
pub const MAX_WINDOW: u32 = TX_SLOTS as u32;
/// Receive slots per link beyond its credits, for control messages.
pub const CONTROL_SLACK: usize = 4;
/// A link that has sent nothing for this long sends `KEEP`.
pub const KEEP_AFTER: Duration = Duration::from_secs(1);
/// A link that has heard nothing for this long fails.
pub const LINK_DEADLINE: Duration = Duration::from_secs(10);
/// How often a transport whose CQ has no wait fd is polled when idle.
pub const POLL_INTERVAL: Duration = Duration::from_millis(1);
/// A transport without a wait fd keeps polling without a pause while one of
/// its links moves data and has heard from its peer within this window.
pub const MOVING_WINDOW: Duration = Duration::from_millis(5);
/// How soon a send the provider refused (-FI_EAGAIN) or that found no free
/// slot is tried again.
const RETRY_AFTER: Duration = Duration::from_micros(100);
/// How long a CLOSE is retried before the peer is left to its deadline.
pub(super) const CLOSE_GIVE_UP: Duration = Duration::from_secs(1);
/// How often link deadlines are looked at.
const HOUSEKEEPING: Duration = Duration::from_millis(250);
/// Transmit slots per endpoint.
const TX_SLOTS: usize = 64;
/// Data pieces handled in one poll from which their slots are reposted and
/// their credits returned within that poll, before the worker delivers the
/// units (else at the pass's flush, after it did: a ping-pong's reply then
/// goes before the repost). A stream that fills the window otherwise runs
/// in turns — the sender waits while the receiver delivers a window's
/// messages, the receiver while the sender refills it — which held
/// `fabric+shm` at about half TCP's 64 B rate (docs/BENCHMARKS.md).
const RETURN_AT_ONCE: usize = 4;

pub use super::rendezvous::{RNDV_MAX, RNDV_THRESHOLD};

/// Housekeeping's mark of a link whose rendezvous read is overdue (why it
/// fails: [`Counters::read_timed_out`]).
const STUCK_READ: &str = "rendezvous unit not complete";
/// Why housekeeping fails a connecting link whose HELLO could never be
/// posted (see [`RdmTransport::replace_out_port`]).
const REFUSED_HELLO: &str = "HELLO never posted (-FI_EAGAIN or no free transmit slot)";
/// At most this many times in a transport's life is the outgoing endpoint
/// replaced: each old one stays open (see `retired`), so this bounds the
/// memory a peer that never answers can cost.
const MAX_OUT_PORT_REPLACEMENTS: u64 = 8;
/// Bytes of granted buffers an endpoint keeps for links that went before
/// their peer's write was announced (`RmaBuffers::abandon`: a write under
/// way may still land, and the endpoint outlives its links) before it
/// grants no more: its links then fail a write descriptor, and new links
/// are told it takes no writes (their large units go eagerly). Bounds what
/// peers that offer units and never write them can pin.
const ABANDONED_MAX: usize = 64 << 20;

/// The window of a transport whose messages are `slot_size` bytes (see
/// [`WINDOW_BYTES`]).
fn window_for(slot_size: usize) -> u32 {
    let pieces = WINDOW_BYTES / slot_size.max(1);
    u32::try_from(pieces)
        .unwrap_or(MAX_WINDOW)
        .clamp(CREDITS, MAX_WINDOW)
}

/// Maps the doorbell `id` of a peer, where this transport has one of its
/// own (a transport without one does not sleep on rings, and polls).
fn open_peer_bell(ours: Option<&Bells>, id: BellId) -> Option<PeerBell> {
    ours?;
    PeerBell::open(id)
        .map_err(|e| tracing::debug!(error = %e, ?id, "a peer's doorbell cannot be mapped; polling its link"))
        .ok()
}

fn io_err(op: &'static str, e: FabricError) -> TransportError {
    TransportError::io(op, std::io::Error::other(e.to_string()))
}

/// How large an RDM transport's messages, windows and receive blocks
/// are, decided when it opens (see [`RdmTransport::new`]).
#[derive(Clone, Copy, Debug)]
struct Sizes {
    /// Bytes per message (header included).
    slot_size: usize,
    /// Data pieces each link takes unconsumed ([`WINDOW_BYTES`]).
    window: u32,
    /// Receive slots per link (one pool block): the window and
    /// [`CONTROL_SLACK`].
    link_block: usize,
    /// Bytes per message sent (header included): the slot size, or less
    /// where larger messages would go by the provider's own reads.
    send_limit: usize,
}

/// libfabric RDM transport of one worker.
///
/// Messages are at most [`SLOT_SIZE`] bytes, or the provider's inject size
/// for `shm` (see [`RdmTransport::new`]).
pub struct RdmTransport {
    // Links and ports first: endpoints close before the Net (which
    // otherwise stays open until they do).
    links: FxHashMap<LinkId, RdmLink>,
    ports: Vec<Option<Port>>,
    /// Ports no longer used, kept open until the transport goes: libfabric
    /// 1.17's `ofi_rxm` crashes in `fi_trywait` on a CQ one of whose
    /// endpoints was closed (a listener unbound while a link still runs).
    /// Their completions name a port index that is empty now: ignored.
    retired: Vec<Port>,
    shared: Shared,
    out: Outgoing,
    /// The port connecting links leave from, once opened.
    out_port: Option<usize>,
    /// Times the outgoing endpoint was replaced (`out_port_replacements`).
    out_port_replacements: u64,
    /// Over `shm` (no wait objects): what peers ring while this worker
    /// sleeps (`doorbell`).
    bells: Option<Bells>,
    /// How large its messages, windows and receive blocks are.
    sizes: Sizes,
    /// A transmit slot came free or a CLOSE was queued: flush every link
    /// with something to send at the next progress.
    retry: bool,
    /// Something could not be sent (no free slot, or the provider said
    /// -FI_EAGAIN): flush again at this time, without spinning meanwhile —
    /// a peer that stopped progressing keeps saying -FI_EAGAIN until its
    /// link's deadline.
    retry_at: Option<Instant>,
    /// Receive slots whose data pieces were handled, reposted (and their
    /// credits owed back) once this pass's sends are posted: see
    /// `repost_handled`.
    handled: Vec<(usize, usize, LinkId)>,
    next_housekeeping: Instant,
    /// Tokens that admit a HELLO (`challenge`).
    challenges: HelloChallenges,
    /// The provider keeps its own state of a peer that sent to us (`shm`):
    /// a live peer's address-vector entry is never removed (removed and
    /// inserted again, its next messages were lost until the link
    /// deadline). Only a peer found silent or failing (`peer_gone`) goes.
    keep_live_peers: bool,
}

impl RdmTransport {
    /// Opens `provider` (RDM) for one worker; its CQ's wait fds (if it has
    /// any) go into `registry` while the worker sleeps.
    pub fn new(
        provider: &FabricProvider,
        registry: &Registry,
        ctx: &TransportContext,
    ) -> Result<Self, TransportError> {
        let worker = open_worker(provider, registry, ctx)?;
        let (_, net_options, net, registry) = &worker;
        let cq_token = Token(ctx.link_ids.fetch_add(1, Ordering::Relaxed) as usize);
        let cq_wait = CqWaitFd::new(!net.cq_polled(), cq_token);
        // Over shm peers are on this host by definition: a doorbell works.
        let bells = if net.cq_polled() && net.provider_name() == "shm" {
            let token = Token(ctx.link_ids.fetch_add(1, Ordering::Relaxed) as usize);
            Bells::open(registry, token)
        } else {
            None
        };
        // A provider whose endpoints are never closed (shm) leaves the
        // endpoints of dropped transports without progress: a send to one
        // must complete without the receiver's help, so messages stay within
        // the inject size (shm: 4 KiB; larger ones wait for the receiver to
        // copy them, and their slots would be held for ever).
        let slot_size = if net.never_closes() {
            net.inject_size().clamp(HEADER_LEN + 1, SLOT_SIZE)
        } else {
            SLOT_SIZE
        };
        // Where the provider reads messages above its eager limit by a
        // rendezvous of its own (`ofi_rxm`) and the core provider's reads
        // have a known bug here (`tcp;ofi_rxm` before libfabric 1.18),
        // messages sent stay within that limit (16 KiB). Receive slots keep
        // their size: a peer without the bug sends whole slots. Decided by
        // the provider opened: `fabric+tcp?ep=rdm` asks for `tcp` and gets
        // `tcp;ofi_rxm`.
        let opened = net.provider_name();
        let send_limit = msgr_fabric::eager_limit(&opened)
            .filter(|_| {
                rma_choice(net_options.rendezvous)
                    .steers_around(&opened)
                    .is_some()
            })
            .map_or(slot_size, |limit| {
                limit.clamp(HEADER_LEN + rendezvous::DESC_MAX + 1, slot_size)
            });
        let challenges = HelloChallenges::new(Instant::now()).map_err(|_| {
            TransportError::io(
                "libfabric RDM: a key for HELLO challenges",
                std::io::Error::other("the system's random number generator failed"),
            )
        })?;
        let window = window_for(slot_size);
        let link_block = window as usize + CONTROL_SLACK;
        // Rendezvous needs RMA (shm too: see the module docs on its reads):
        // `Shared::rndv` is the Net's.
        Ok(RdmTransport {
            keep_live_peers: net.never_closes(),
            sizes: Sizes {
                slot_size,
                window,
                link_block,
                send_limit,
            },
            challenges,
            links: FxHashMap::default(),
            ports: Vec::new(),
            retired: Vec::new(),
            shared: Shared::new(worker, cq_wait, link_block * slot_size, ctx),
            out: Outgoing::default(),
            out_port: None,
            out_port_replacements: 0,
            bells,
            retry: false,
            retry_at: None,
            handled: Vec::new(),
            next_housekeeping: Instant::now() + HOUSEKEEPING,
        })
    }

    /// Moves this worker's Net onto the domain that serves `site` while no
    /// endpoint is open on it (see `FabricTransport::settle_domain`: verbs
    /// has one domain per device).
    fn settle_domain(&mut self, site: Site) -> Result<(), TransportError> {
        if self.ports.iter().any(Option::is_some) || self.shared.net.serves(site) {
            return Ok(());
        }
        let net = open_net(&self.shared.kind, Some(site), self.shared.net_options)?;
        self.shared
            .cq_wait
            .replace(!net.cq_polled(), &self.shared.registry);
        tracing::debug!(from = %self.shared.net.domain(), to = %net.domain(), %site, "fabric RDM worker moves to the domain of its first address");
        // Kept registrations belong to the old domain: out before it closes.
        self.shared.reg_cache.clear();
        self.shared.net = net;
        Ok(())
    }

    fn open_port(
        &mut self,
        bind: Option<SocketAddr>,
        listener: Option<(Token, SocketAddr)>,
        reservation: Option<TcpListener>,
    ) -> Result<usize, FabricError> {
        let ep = self.shared.net.rdm_endpoint(
            bind,
            TX_SLOTS,
            self.sizes.link_block,
            self.sizes.slot_size,
        )?;
        // Port indices are never reused: completions of a closed port's
        // endpoint could still be in the CQ.
        let idx = self.ports.len();
        let mut port = Port::new(ep, listener, reservation, self.sizes.send_limit);
        for slot in 0..port.ep.rx_slots() {
            port.ep.post_recv(slot, context(idx, true, slot))?;
        }
        self.ports.push(Some(port));
        Ok(idx)
    }

    fn out_port(&mut self) -> Result<usize, FabricError> {
        if let Some(p) = self.out_port {
            return Ok(p);
        }
        let p = self.open_port(None, None, None)?;
        self.out_port = Some(p);
        Ok(p)
    }

    /// Connects from now on leave from a new outgoing endpoint, because
    /// `id`'s HELLO could not be posted until the link deadline (the
    /// provider said -FI_EAGAIN, or no transmit slot came free): `ofi_rxm` (1.17) can keep its connection to a name that
    /// restarted in a state that refuses every send, and removing the name
    /// from the address vector and inserting it again does not reset it
    /// (seen in the stress suite: a client dialling a restarted server for
    /// good while other clients reached it). A new endpoint has no
    /// connection state. The old one keeps its other links and is retired
    /// with the last of them. Bounded by [`MAX_OUT_PORT_REPLACEMENTS`]; past
    /// it such links just fail by the deadline.
    fn replace_out_port(&mut self, id: LinkId) {
        let Some(link) = self.links.get(&id) else {
            return;
        };
        if self.out_port != Some(link.port) {
            return;
        }
        if self.out_port_replacements >= MAX_OUT_PORT_REPLACEMENTS {
            tracing::warn!(
                replacements = self.out_port_replacements,
                "libfabric RDM: a HELLO refused until the deadline; the outgoing endpoint was replaced too often to replace again"
            );
            return;
        }
        self.out_port_replacements += 1;
        tracing::debug!(link = id.0, "libfabric RDM: HELLO refused until the deadline; a new outgoing endpoint for later connects");
        // `drop_link` retires the old endpoint with its last link.
        self.out_port = None;
    }

    /// Fails `id` because its peer is gone (silent past the deadline, or a
    /// send to it failed): the peer's entry goes when unused.
    fn peer_gone(&mut self, id: LinkId, why: LinkFailure, events: &mut Vec<TransportEvent>) {
        if let Some(l) = self.links.get(&id) {
            let (pidx, peer) = (l.port, l.peer);
            if let Some(p) = self
                .ports
                .get_mut(pidx)
                .and_then(Option::as_mut)
                .and_then(|port| port.peers.get_mut(peer))
            {
                p.dead = true;
            }
        }
        self.fail(id, why, events);
    }

    fn fail(&mut self, id: LinkId, why: LinkFailure, events: &mut Vec<TransportEvent>) {
        if self.drop_link(id).is_some() {
            events.push(TransportEvent::Failed(id, why));
        }
    }

    /// Reads completions in batches. Returns whether there were any.
    fn drain_cq(&mut self, events: &mut Vec<TransportEvent>) -> bool {
        let mut any = false;
        for pidx in 0..self.ports.len() {
            let Some(port) = self.ports.get_mut(pidx).and_then(Option::as_mut) else {
                continue;
            };
            if port.tx.injected.is_empty() {
                continue;
            }
            any = true;
            let mut done = std::mem::take(&mut port.tx.injected);
            for &context in &done {
                let c = Completion {
                    context,
                    len: 0,
                    recv: false,
                    error: None,
                };
                self.complete(&c, events);
            }
            done.clear();
            // Keep the vector's memory (sends injected meanwhile stay queued).
            if let Some(port) = self.ports.get_mut(pidx).and_then(Option::as_mut) {
                done.append(&mut port.tx.injected);
                port.tx.injected = done;
            }
        }
        match read_completions(self, |t, c| t.complete(c, events)) {
            Ok(read) => any || read,
            Err((read, why)) => {
                // As `FabricTransport::fail_all`, the peers' entries too —
                // not where live peers' entries must stay (`shm`): our queue
                // failed, not they.
                let ids = self.links.keys().copied().collect();
                let keep = self.keep_live_peers;
                let failed = fail_every_link(ids, &why, |id, why| {
                    if keep {
                        self.fail(id, why, events)
                    } else {
                        self.peer_gone(id, why, events)
                    }
                });
                any || read || failed
            }
        }
    }

    fn complete(&mut self, c: &Completion, events: &mut Vec<TransportEvent>) {
        let (pidx, rx, slot) = decode_context(c.context);
        let Some(port) = self.ports.get_mut(pidx).and_then(Option::as_mut) else {
            return;
        };
        if is_user_read(c.context) {
            return port
                .user_reads
                .done(port.ep.rma(), c.context, c.error, events);
        }
        if c.context & READ_BIT != 0 {
            return self.read_complete(pidx, c, events);
        }
        if c.context & WRITE_BIT != 0 {
            return self.write_complete(pidx, c, events);
        }
        if rx {
            if let Some((code, what)) = c.error {
                // A receive is not tied to a peer: repost and go on.
                tracing::debug!(code, what, "libfabric RDM receive error");
                port.ep.recv_done(slot, 0);
                if let Err(e) = port.ep.post_recv(slot, context(pidx, true, slot)) {
                    tracing::warn!(error = %e, "repost after a receive error failed");
                }
                return;
            }
            self.receive(pidx, slot, c.len, events);
            return;
        }
        port.ep.send_done(slot);
        let Some((link, peer)) = port.tx.done(slot) else {
            return;
        };
        port.release_peer(peer, false);
        // A slot came free: whatever waited for one may go now.
        self.retry = true;
        let Some(id) = link else {
            return;
        };
        let Some(l) = self.links.get_mut(&id) else {
            return;
        };
        l.inflight = l.inflight.saturating_sub(1);
        if let Some(error) = c.error {
            self.peer_gone(id, completion_failure("send", error), events);
            return;
        }
        if l.common.close_after_flush && l.idle() {
            self.drop_link(id);
        }
    }

    /// A HELLO with the challenge token `proof` on port `pidx`: accept the link if the port
    /// listens and the token is good, else challenge the name it claims
    /// (`challenge`).
    fn hello(&mut self, pidx: usize, body: &[u8], proof: u64, events: &mut Vec<TransportEvent>) {
        let Some(port) = self.ports.get_mut(pidx).and_then(Option::as_mut) else {
            return;
        };
        let Some((token, _)) = port.listener else {
            tracing::debug!("HELLO on a port that does not listen, dropped");
            return;
        };
        let Some(remote) = read_dest(body) else {
            tracing::debug!("short HELLO dropped");
            return;
        };
        let name_len = body
            .get(12..HELLO_FIXED)
            .map_or(0, |b| u16::from_le_bytes([b[0], b[1]]) as usize);
        let Some(name) = body.get(HELLO_FIXED..HELLO_FIXED + name_len) else {
            tracing::debug!("HELLO with a truncated name dropped");
            return;
        };
        // The connector's capabilities follow its name.
        let caps = &body[HELLO_FIXED + name_len..];
        let (peer_rndv, peer_late, peer_window, peer_bell) = (
            rendezvous::peer_op(caps),
            rendezvous::peer_late_epilogue(caps),
            wire::peer_window(caps),
            wire::peer_bell(caps),
        );
        if !self.shared.link_budget.admits(self.links.len()) {
            // The connector's link fails by its deadline, never welcomed.
            tracing::debug!("HELLO dropped: fabric_link_bytes reached");
            return;
        }
        if self.challenges.judge(self.shared.now, name, remote, proof) == Verdict::Challenge {
            let Some(token) = self.challenges.issue(self.shared.now, name, remote) else {
                return;
            };
            port.challenge(pidx, name, remote, token, !self.keep_live_peers);
            // A challenge queued for a slot goes at the next progress.
            self.retry |= !port.closes.is_empty();
            return;
        }
        let peer = match port.peer(name) {
            Ok(p) => p,
            Err(e) => {
                tracing::debug!(error = %e, "HELLO from an unusable name dropped");
                return;
            }
        };
        if let Err(e) = port.reserve(pidx, self.sizes.link_block) {
            tracing::warn!(error = %e, "no receive buffers for a new RDM link; HELLO dropped");
            port.release_peer(peer, true);
            return;
        }
        let peer_addr = RdmEp::name_as_socket(name).unwrap_or(SocketAddr::from(([0, 0, 0, 0], 0)));
        let id = LinkId(self.shared.link_ids.fetch_add(1, Ordering::Relaxed));
        let mut link = RdmLink::new(pidx, peer, Some((token, peer_addr)), self.sizes.window);
        link.remote = Some(remote);
        link.common.peer_rndv = peer_rndv;
        link.common.peer_late = peer_late;
        link.flow.peer_window = peer_window;
        link.flow.credits = peer_window;
        link.peer_bell = self.open_peer_bell(peer_bell);
        link.setup.need_welcome = true;
        self.links.insert(id, link);
        self.out.dirty.push(id);
        events.push(TransportEvent::Accepted {
            link: id,
            peer: peer_addr,
            listener: token,
        });
    }

    /// Returns whether everything sendable went (else: out of slots or
    /// -FI_EAGAIN). `ours`: how this end moves rendezvous units (it offers
    /// them to a peer that moves them the same way).
    fn flush_into(
        id: LinkId,
        link: &mut RdmLink,
        (pidx, port): (usize, &mut Port),
        (ours, bell): (Option<RmaOp>, Option<BellId>),
        counters: &mut Counters,
        reg_cache: &mut RegCache<ReadRegion>,
        now: Instant,
    ) -> Result<bool, FabricError> {
        let me = link.dest(id);
        let rndv = rendezvous::link_op(ours, link.common.peer_rndv).is_some();
        if link.setup.need_hello {
            let name = port.ep.name().to_vec();
            let caps = rendezvous::caps(ours);
            let (token, window) = (link.setup.token, link.flow.window);
            let sent = port.post(pidx, link.peer, Some(id), |buf| {
                write_header(buf, HELLO, 0, Dest { link: 0, cookie: 0 }, token);
                let mut n = HEADER_LEN + write_dest(&mut buf[HEADER_LEN..], me);
                buf[n..n + 2].copy_from_slice(&(name.len() as u16).to_le_bytes());
                n += 2;
                buf[n..n + name.len()].copy_from_slice(&name);
                n += name.len();
                buf[n..n + caps.len()].copy_from_slice(&caps);
                n += caps.len();
                n += write_window(&mut buf[n..], window);
                n + wire::write_bell(&mut buf[n..], bell)
            })?;
            if !sent {
                return Ok(false);
            }
            link.setup.need_hello = false;
            link.inflight += 1;
            link.last_sent = now;
        }
        let Some(remote) = link.remote else {
            return Ok(true); // waiting for WELCOME
        };
        if link.setup.need_welcome {
            let mut body = [0u8; 12 + rendezvous::CAPS_LEN + wire::WINDOW_LEN + BellId::LEN];
            let mut n = write_dest(&mut body, me);
            let caps = rendezvous::caps(ours);
            body[n..n + caps.len()].copy_from_slice(&caps);
            n += caps.len();
            n += write_window(&mut body[n..], link.flow.window);
            n += wire::write_bell(&mut body[n..], bell);
            if !link.post_control(id, pidx, port, WELCOME, &body[..n], now)? {
                return Ok(false);
            }
            link.setup.need_welcome = false;
        }
        if !link.post_owed(id, pidx, port, now)? {
            return Ok(false);
        }
        // A large unit at a unit boundary goes by rendezvous: exposed here,
        // its descriptor sent as the next data piece.
        while let Some(x) =
            link.common
                .exposures
                .stage(rndv, &mut link.common.outbox, counters, |unit| {
                    let room = port.send_limit - HEADER_LEN;
                    rendezvous::expose(port.ep.rma(), reg_cache, unit, room)
                })
        {
            if link.flow.credits == 0 {
                // Not a return: credits owed to the peer still go (KEEP,
                // below), or two links out of credits both ways would wait
                // on each other until the keepalive timeout.
                break;
            }
            let fill = |body: &mut [u8]| rendezvous::encode(body, &x);
            if !link.post_data(id, (pidx, port), remote, RNDV, fill, None, now)? {
                return Ok(false);
            }
            link.common.exposures.sent(counters);
            if !link.post_owed(id, pidx, port, now)? {
                return Ok(false); // its late epilogue
            }
        }
        let (max, in_place) = (port.send_limit - HEADER_LEN, port.ep.sends_in_place());
        while link.flow.credits > 0 {
            let Some(mut piece) =
                link.common
                    .outbox
                    .next_piece(&link.common.exposures, rndv, max, in_place)
            else {
                break;
            };
            // Out of the link while its piece is posted (the post takes
            // the link).
            let outbox = std::mem::take(&mut link.common.outbox);
            let shared = piece.shared.take();
            let from_slot = shared.is_none();
            let kind = if piece.last { DATA_LAST } else { DATA_MORE };
            let fill = |body: &mut [u8]| {
                if !from_slot {
                    return 0;
                }
                outbox.copy_out(&piece, body);
                piece.len
            };
            let sent = link.post_data(id, (pidx, port), remote, kind, fill, shared, now);
            link.common.outbox = outbox;
            if !sent? {
                return Ok(false);
            }
            counters.pieces_in_place += u64::from(!from_slot);
            link.common
                .outbox
                .piece_sent(&piece, &mut link.common.exposures);
        }
        if link.flow.need_keep || link.keep_due() {
            if !link.post_control(id, pidx, port, KEEP, &[], now)? {
                return Ok(false);
            }
            link.flow.need_keep = false;
        }
        Ok(true)
    }

    /// Sends queued CLOSE messages of every port.
    fn flush_closes(&mut self) -> bool {
        let mut done = true;
        if self.ports.iter().flatten().all(|p| p.closes.is_empty()) {
            return done;
        }
        for (pidx, port) in self.ports.iter_mut().enumerate() {
            if let Some(port) = port.as_mut() {
                done &= port.flush_closes(pidx, self.shared.now);
            }
        }
        done
    }

    /// Fails links that heard nothing within the deadline; asks quiet ones
    /// to send `KEEP`.
    fn housekeeping(&mut self, now: Instant, events: &mut Vec<TransportEvent>) {
        if now < self.next_housekeeping {
            return;
        }
        self.next_housekeeping = now + HOUSEKEEPING;
        let mut dead = Vec::new();
        for (&id, l) in &mut self.links {
            if l.common.frozen || l.common.close_after_flush {
                continue;
            }
            let stuck_read = l.common.receiving.overdue(now, self.shared.read_timeout);
            // Exposed units are not timed on the sending side: a receiver
            // that paused reading fetches them late, and a dead one trips
            // `last_heard`.
            if now.duration_since(l.common.last_heard) > LINK_DEADLINE {
                // A HELLO never posted is the endpoint's fault, not the peer's.
                dead.push((
                    id,
                    if l.setup.need_hello {
                        REFUSED_HELLO
                    } else {
                        "peer silent"
                    },
                ));
            } else if stuck_read {
                dead.push((id, STUCK_READ));
            } else if l.remote.is_some() && now.duration_since(l.last_sent) > KEEP_AFTER {
                l.flow.need_keep = true;
                self.out.dirty.push(id);
            }
        }
        for (id, what) in dead {
            let why = if what == STUCK_READ {
                self.shared
                    .rndv_counters
                    .read_timed_out(self.shared.read_timeout)
            } else if what == REFUSED_HELLO {
                self.replace_out_port(id);
                format!("{what} for {LINK_DEADLINE:?}")
            } else {
                format!("{what} for {LINK_DEADLINE:?} (peer dead or unreachable)")
            };
            self.peer_gone(id, LinkFailure::Timeout(why), events);
        }
    }

    /// Says "awake" to the peers (see `doorbell`) and handles the
    /// completions found by the last look before sleeping. Returns whether
    /// there were any.
    fn take_early(&mut self, events: &mut Vec<TransportEvent>) -> bool {
        let Some(bells) = self.bells.as_mut() else {
            return false;
        };
        bells.woke();
        if bells.early.is_empty() {
            return false;
        }
        let mut early = std::mem::take(&mut bells.early);
        for c in &early {
            self.complete(c, events);
        }
        early.clear();
        if let Some(bells) = self.bells.as_mut() {
            bells.early = early;
        }
        true
    }

    /// The doorbell a peer announced, mapped (`None` if this end has none
    /// or it cannot be mapped: the link is polled as without one).
    fn open_peer_bell(&self, id: Option<BellId>) -> Option<PeerBell> {
        open_peer_bell(self.bells.as_ref(), id?)
    }

    /// Whether this transport has a doorbell and every link's peer rings
    /// it (a link still being set up has no peer bell yet: polled).
    fn rung_for_all(&self) -> bool {
        self.bells.is_some() && self.links.values().all(|l| l.peer_bell.is_some())
    }

    /// Sends what the links marked dirty have to send, and the closes.
    fn flush_dirty(&mut self, events: &mut Vec<TransportEvent>) {
        if !self.flush_closes() {
            self.retry_later();
        }
        let flush = |t: &mut Self, id| t.flush_link(id, events);
        crate::dirty::DirtyLinks::flush_each(self, |t| &mut t.out.dirty, flush);
    }

    /// Takes port `pidx` out of use (see `retired`).
    fn retire(&mut self, pidx: usize) {
        if let Some(mut port) = self.ports.get_mut(pidx).and_then(Option::take) {
            // Its last links' CLOSEs go now: a retired port is never
            // flushed again, and a peer not told waits out its deadline
            // (an unbound listener's peers took 1.5 s to fail over).
            if !port.flush_closes(pidx, self.shared.now) {
                tracing::debug!(
                    left = port.closes.len(),
                    "libfabric RDM: CLOSEs of a retired endpoint not sent (no free slot); peers learn by their deadline"
                );
            }
            self.retired.push(port);
        }
    }

    fn retry_later(&mut self) {
        self.retry_at.get_or_insert(self.shared.now + RETRY_AFTER);
    }
}

impl Queueing for RdmTransport {
    type Link = RdmLink;

    queueing_parts!(RdmLink);

    /// Sends what `id` has to send: handshake, data within its credits,
    /// credits owed and keepalives.
    fn flush_link(&mut self, id: LinkId, events: &mut Vec<TransportEvent>) {
        let Some(link) = self.links.get_mut(&id) else {
            return;
        };
        if link.common.frozen {
            return;
        }
        let pidx = link.port;
        let Some(port) = self.ports.get_mut(pidx).and_then(Option::as_mut) else {
            return;
        };
        // No more writes offered or taken once too many grants were
        // abandoned here (see ABANDONED_MAX).
        let ours = self
            .shared
            .rndv
            .filter(|&op| op != RmaOp::Write || port.ep.rma().abandoned_bytes() < ABANDONED_MAX);
        let (hello, sent_before) = (link.setup.need_hello, link.last_sent);
        let result = Self::flush_into(
            id,
            link,
            (pidx, port),
            (ours, self.bells.as_ref().map(Bells::id)),
            &mut self.shared.rndv_counters,
            &mut self.shared.reg_cache,
            self.shared.now,
        );
        if let Some(bells) = self.bells.as_mut() {
            // After the HELLO went; and when it could not go yet, once:
            // `shm` refuses a first post to a listener whose progress has
            // not taken the connection request that post left it, and a
            // sleeping listener would take it only at its backstop.
            let setup = &mut link.setup;
            let ring = hello && (!setup.need_hello || !setup.rang_before_hello);
            if let Some(listen) = setup.hello_to.filter(|_| ring) {
                setup.rang_before_hello = true;
                bells.ring_listener(listen);
            }
            if let Some(peer) = link
                .peer_bell
                .as_ref()
                .filter(|_| link.last_sent != sent_before)
            {
                bells.ring(peer);
            }
        }
        let closed = link.common.close_after_flush && link.idle();
        match result {
            Ok(done) => {
                if !done {
                    self.retry_later();
                }
                if closed {
                    self.drop_link(id);
                }
            }
            Err(e) => self.fail(id, post_failure("fi_send", &e), events),
        }
    }

    /// Posts a small frame from `send` straight into a transmit slot,
    /// encoded there — no copy into the arena first, no queue — when `id`
    /// is up with nothing queued or owed and a credit and a slot are free:
    /// what a reply in a ping-pong finds. Gives the frame back where it
    /// must go the queue's way (which also retries a failed post and
    /// reports the failure).
    fn post_small(&mut self, id: LinkId, f: Transmit) -> Result<Option<Transmit>, TransportError> {
        let Some(link) = self.links.get_mut(&id) else {
            return Ok(Some(f));
        };
        let Some(remote) = link.remote else {
            return Ok(Some(f));
        };
        let pidx = link.port;
        let Some(port) = self.ports.get_mut(pidx).and_then(Option::as_mut) else {
            return Ok(Some(f));
        };
        let len = f.encoded_len();
        if link.common.frozen
            || link.common.close_after_flush
            || link.flow.credits == 0
            || link.has_output()
            || len >= rendezvous::SMALL_UNIT
            || HEADER_LEN + len > port.send_limit
        {
            return Ok(Some(f));
        }
        let unit = f.checked()?;
        let fill = |mut body: &mut [u8]| {
            unit.write(&mut body);
            len
        };
        match link.post_data(
            id,
            (pidx, port),
            remote,
            DATA_LAST,
            fill,
            None,
            self.shared.now,
        ) {
            Ok(true) => {
                if let (Some(bells), Some(peer)) = (self.bells.as_mut(), link.peer_bell.as_ref()) {
                    bells.ring(peer);
                }
                Ok(None)
            }
            Ok(false) | Err(_) => Ok(Some(f)),
        }
    }
}

/// Its kind and number of links (see `endpoint_kind::debug`).
impl std::fmt::Debug for RdmTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        endpoint_kind::debug(self, "RdmTransport", f)
    }
}

impl Drop for RdmTransport {
    fn drop(&mut self) {
        // Peers hear CLOSE now rather than at their deadline (best effort).
        let ids: Vec<LinkId> = self.links.keys().copied().collect();
        for id in ids {
            self.drop_link(id);
        }
        self.flush_closes();
        self.shared.cq_wait.disarm(&self.shared.registry);
        // With the transport, not after the Net (declared after the ports;
        // each would hold its domain open).
        self.shared.reg_cache.clear();
    }
}

impl EndpointKind for RdmTransport {
    /// The peer hears CLOSE at once (an RDM endpoint has no connection to
    /// reset); nothing queued is sent.
    const ABORTED: &'static str = "injected abortive close (link dropped)";

    /// Removes a link; a peer that knows its end hears `CLOSE`.
    fn drop_link(&mut self, id: LinkId) -> Option<RdmLink> {
        let mut link = self.links.remove(&id)?;
        let Some(port) = self.ports.get_mut(link.port).and_then(Option::as_mut) else {
            return Some(link);
        };
        port.reserved = port.reserved.saturating_sub(self.sizes.link_block);
        port.links = port.links.saturating_sub(1);
        // Exposed units go (a peer still reading gets an error); a read in
        // flight keeps its buffer in the endpoint until it completes; a
        // buffer granted to the peer's write stays with the endpoint, closed
        // to new writes (one under way may still land).
        for id in link.common.exposures.drain() {
            port.ep.rma().unexpose(id);
        }
        if let Some(granted) = link.common.receiving.reading.and_then(|r| r.granted) {
            port.ep.rma().abandon(granted);
        }
        // Held receives go back to the pool.
        for (slot, _) in link.held.drain() {
            port.ep.recv_done(slot, 0);
            let _ = port.ep.post_recv(slot, context(link.port, true, slot));
        }
        match link.remote {
            // The CLOSE keeps the peer's address-vector entry in use until sent.
            Some(remote) => {
                port.closes
                    .push_back((link.peer, remote, CLOSE, 0, Instant::now()));
                self.retry = true;
            }
            None => {
                // A connect never welcomed: the name may be a listener that
                // went (and may come back under the same name). Its entry
                // is mapped afresh for the next connect, as after the link
                // deadline (`peer_gone`), not reused stale — except where
                // the provider keeps its own state of the peer (`shm`):
                // there a live peer's entry removed and inserted again lost
                // the next answers until the 10 s deadline (stress --rma).
                if link.accepted.is_none() && !self.keep_live_peers {
                    if let Some(p) = port.peers.get_mut(link.peer) {
                        p.dead = true;
                    }
                }
                port.release_peer(link.peer, true);
            }
        }
        if port.links == 0 && port.listener.is_none() && self.out_port != Some(link.port) {
            // An endpoint that stopped listening goes with its last link.
            self.retire(link.port);
        }
        Some(link)
    }

    fn poll_all(&mut self, now: Instant, events: &mut Vec<TransportEvent>) -> bool {
        self.shared.now = now;
        self.shared.cq_wait.disarm(&self.shared.registry);
        let mut any = !self.out.deferred_events.is_empty();
        events.append(&mut self.out.deferred_events);
        self.repost_handled();
        any |= self.take_early(events);
        any |= self.drain_cq(events);
        if self.handled.len() >= RETURN_AT_ONCE {
            // A stream's pieces arrived in bulk: their bytes are in the
            // links' reassembly (or held), so the slots go back and the
            // credits with them now — a KEEP before the worker decodes
            // and delivers them, so the sender fills the window while
            // this side works, not after (see RETURN_AT_ONCE).
            self.repost_handled();
            self.flush_dirty(events);
        }
        for id in std::mem::take(&mut self.out.resumed) {
            any |= self.hand_up(id, events);
        }
        self.housekeeping(now, events);
        let again = self.retry_at.is_some_and(|t| t <= now);
        any |= self.retry;
        if std::mem::take(&mut self.retry) || again {
            self.retry_at = None;
            let ids: Vec<LinkId> = self
                .links
                .iter()
                .filter(|(_, l)| l.has_output())
                .map(|(&id, _)| id)
                .collect();
            self.out.dirty.extend(ids);
            // Not `flush`: the slots handled in this poll are posted again
            // after the worker has answered them.
            self.flush_dirty(events);
        }
        any
    }

    fn flush_pass(&mut self, now: Instant, events: &mut Vec<TransportEvent>) {
        self.shared.now = now;
        self.repost_handled();
        self.flush_dirty(events);
    }

    fn open_listener(
        &mut self,
        addr: &EntityAddr,
        token: Token,
    ) -> Result<EntityAddr, TransportError> {
        let (bind, reservation) = if self.shared.net.socket_names() {
            (addr.socket, None)
        } else {
            // A name-only provider: a TCP port of our own makes the name unique.
            let r = TcpListener::bind(addr.socket)
                .map_err(|e| TransportError::io("reserve the port of an RDM name", e))?;
            let a = r
                .local_addr()
                .map_err(|e| TransportError::io("reserved port", e))?;
            if self.shared.net.never_closes() {
                // The endpoint outlives this transport (shm), and so does its
                // name in the provider's list of this process's endpoints: the
                // port stays reserved until the process ends, so no later
                // endpoint of this process takes the same name.
                std::mem::forget(r);
                (a, None)
            } else {
                (a, Some(r))
            }
        };
        self.settle_domain(Site::Local(bind))?;
        let pidx = self
            .open_port(Some(bind), Some((token, bind)), reservation)
            .map_err(|e| io_err("open RDM endpoint", e))?;
        let port_no = match self.ports[pidx].as_ref() {
            Some(p) => RdmEp::name_as_socket(p.ep.name()).map_or(bind.port(), |s| s.port()),
            None => bind.port(),
        };
        let listen = SocketAddr::new(bind.ip(), port_no);
        if let Some(p) = self.ports[pidx].as_mut() {
            p.listener = Some((token, listen));
        }
        if let Some(bells) = self.bells.as_mut() {
            bells.listen(&self.shared.registry, listen);
        }
        Ok(addr.clone().with_port(port_no))
    }

    fn close_listener(&mut self, token: Token) {
        let found = self
            .ports
            .iter()
            .position(|p| p.as_ref().and_then(|p| p.listener).map(|l| l.0) == Some(token));
        let Some(pidx) = found else {
            return;
        };
        // Accepted links live on the listener's endpoint: they keep it open
        // (it just stops accepting) until the last one goes.
        if let Some(p) = self.ports[pidx].as_mut() {
            if let (Some(bells), Some((_, listen))) = (self.bells.as_mut(), p.listener) {
                bells.unlisten(listen);
            }
            p.listener = None;
            if p.links == 0 {
                self.retire(pidx);
            }
        }
    }

    fn dial(&mut self, link: LinkId, addr: &EntityAddr) -> Result<(), TransportError> {
        let name = self
            .shared
            .net
            .resolve(addr.socket)
            .map_err(|e| io_err("resolve RDM name", e))?;
        let pidx = self
            .out_port()
            .map_err(|e| io_err("open RDM endpoint", e))?;
        let Some(port) = self.ports[pidx].as_mut() else {
            return Err(TransportError::NoSuchLink(link.0));
        };
        let peer = port.peer(&name).map_err(|e| {
            TransportError::io("fi_av_insert", std::io::Error::other(e.to_string()))
        })?;
        if let Err(e) = port.reserve(pidx, self.sizes.link_block) {
            port.release_peer(peer, true);
            return Err(TransportError::io(
                "RDM receive pool",
                std::io::Error::other(e.to_string()),
            ));
        }
        let mut l = RdmLink::new(pidx, peer, None, self.sizes.window);
        l.setup.need_hello = true;
        l.setup.hello_to = Some(addr.socket);
        self.links.insert(link, l);
        self.out.dirty.push(link);
        Ok(())
    }

    /// The CQ's wait fds into the Poll and `fi_trywait` on the CQ. A CQ
    /// without a wait object (shm) cannot be armed: the worker blocks until
    /// [`Transport::wake_at`](crate::Transport::wake_at) and polls it then.
    fn arm_wait(&mut self) -> bool {
        if self.shared.net.cq_polled() {
            let Some(bells) = self.bells.as_mut() else {
                return true;
            };
            // Sends completed by injection free their slots at the next
            // poll: not worth a sleep.
            if self.retry
                || self
                    .ports
                    .iter()
                    .flatten()
                    .any(|p| !p.tx.injected.is_empty())
            {
                return false;
            }
            return bells.sleep(&mut self.shared.net, CQ_BATCH);
        }
        self.shared
            .cq_wait
            .arm(&self.shared.registry, &mut self.shared.net);
        self.shared.net.try_wait()
    }

    /// Doorbells wake it where every link's peer rings.
    fn wakes_otherwise(&self) -> bool {
        self.rung_for_all()
    }

    fn next_wake(&self) -> Option<Instant> {
        if self.ports.iter().all(Option::is_none) {
            return None;
        }
        let poll = if self.shared.net.cq_polled() || self.shared.cq_wait.failed() {
            // No wait fd: while a link is moving data (output queued or in
            // flight, a unit half received) and heard from its peer lately,
            // poll again at once — a 1 MiB unit in 4 KiB pieces otherwise
            // waited POLL_INTERVAL per credit round trip (29 ms one-way).
            // Idle, or waiting on a silent peer: every POLL_INTERVAL.
            // A link whose peer rings (`doorbell`) is not polled for
            // what that peer sends, only for a read of ours in flight.
            let now = Instant::now();
            let rung = self.bells.is_some();
            let moving = self.links.values().any(|l| {
                let polled = !rung || l.peer_bell.is_none() || l.common.receiving.reading.is_some();
                polled
                    && (!l.idle() || !l.common.reasm.is_idle())
                    && now.saturating_duration_since(l.common.last_heard) < MOVING_WINDOW
            });
            let idle = if self.rung_for_all() {
                BELL_BACKSTOP
            } else {
                POLL_INTERVAL
            };
            Some(if moving { now } else { now + idle })
        } else {
            None
        };
        let keep = (!self.links.is_empty()).then_some(self.next_housekeeping);
        [poll, keep, self.retry_at].into_iter().flatten().min()
    }

    fn owns_token(&self, token: Token) -> bool {
        self.bells.as_ref().is_some_and(|b| b.token() == token)
            || self
                .ports
                .iter()
                .flatten()
                .any(|p| p.listener.map(|l| l.0) == Some(token))
    }

    fn user_exposures(&mut self, link: LinkId) -> Option<(&mut UserExposures, &mut RmaBuffers)> {
        let pidx = self.links.get(&link)?.port;
        let port = self.ports.get_mut(pidx).and_then(Option::as_mut)?;
        Some((&mut port.user, port.ep.rma()))
    }

    fn unexpose_everywhere(&mut self, region: u64) {
        let open = self.ports.iter_mut().flatten();
        for port in open.chain(self.retired.iter_mut()) {
            port.user.unexpose(port.ep.rma(), region);
        }
    }

    fn start_user_read(&mut self, read: UserRead<'_>) -> Result<(), TransportError> {
        let (link, key, range, token) = read;
        let l = self
            .links
            .get(&link)
            .ok_or(TransportError::NoSuchLink(link.0))?;
        let (pidx, peer) = (l.port, l.peer);
        let unavailable = |reason: String| TransportError::Unavailable {
            kind: self.shared.kind.clone(),
            reason,
        };
        let Some(port) = self.ports.get_mut(pidx).and_then(Option::as_mut) else {
            return Err(unavailable("the link's endpoint is closed".into()));
        };
        let Some(to) = port.peers.get(peer).map(|p| p.addr) else {
            return Err(unavailable("the link's peer is gone".into()));
        };
        let context = user_read_context(pidx, port.next_read);
        port.next_read = port.next_read.wrapping_add(1);
        let ep = &mut port.ep;
        port.user_reads
            .start((link, token, context), key, range, |x| {
                ep.read(x, to, context, &[], 0)
            })
            .map_err(|reason| unavailable(reason.to_string()))
    }

    fn more_stats(&self, values: &mut Vec<(&'static str, u64)>) {
        values.push(("out_port_replacements", self.out_port_replacements));
        values.extend(self.challenges.values());
        if let Some(bells) = &self.bells {
            values.extend(bells.values());
        }
    }
}
