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
//!   name, then whether it reads rendezvous units: `rendezvous::caps`);
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
//!   links as an SRQ is. Each link may have [`CREDITS`] data messages
//!   unconsumed at the receiver; the receiver returns credits in every
//!   header it sends and in a `KEEP` message once half are owed. The pool
//!   grows by [`CREDITS`] + [`CONTROL_SLACK`] slots per link (never shrinks),
//!   so a sender never overruns it.
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
//! [`Transport::wake_at`] asks the worker to wake every [`POLL_INTERVAL`]
//! while the transport has endpoints — at once while a link is moving data
//! and its peer answered within [`MOVING_WINDOW`].

use std::collections::VecDeque;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use mio::event::Event;
use mio::{Registry, Token};
use msgr_addr::{EntityAddr, FabricProvider, TransportKind};
use msgr_fabric::{
    Completion, FabricError, Landing, Net, PeerAddr, RdmEp, ReadDone, ReadRegion, RmaOp, Site,
};
use msgr_proto::arena::ByteArena;
use msgr_proto::{FrameLimits, Inbound, LinkId, ProtocolError, Transmit};
use rustc_hash::FxHashMap;

use super::outbox::Outbox;
use super::reassembly::{self, PieceError, Reassembly};
use super::rendezvous::{
    self, Counters, DescError, Exposures, OutUnit, Owed, OwedKinds, Receiving,
};
use super::wait_fd::CqWaitFd;
use super::{
    no_half_close, no_migration, open_net, probe, read_completions, rma_choice, simulate_fault,
    CqParts, NetOptions, OutOfSlot, QueueFailures, CQ_BATCH, SLOT_SIZE,
};
use crate::queue_failure::fail_every_link;
use crate::regcache::RegCache;
use crate::{
    Availability, DetachedLink, RealFault, SimulatedFault, Transport, TransportContext,
    TransportError, TransportEvent, TransportStats,
};

/// Bytes of the header every RDM message starts with.
pub const HEADER_LEN: usize = 24;
/// Data messages a link may have unconsumed at its receiver.
pub const CREDITS: u32 = 16;
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
const CLOSE_GIVE_UP: Duration = Duration::from_secs(1);
/// How often link deadlines are looked at.
const HOUSEKEEPING: Duration = Duration::from_millis(250);
/// Transmit slots per endpoint.
const TX_SLOTS: usize = 64;
/// Receive slots per link (one pool block).
const LINK_BLOCK: usize = CREDITS as usize + CONTROL_SLACK;

pub use super::rendezvous::{RNDV_MAX, RNDV_THRESHOLD};

// Message kinds (first header byte).
const HELLO: u8 = 1;
const WELCOME: u8 = 2;
const DATA_MORE: u8 = 3;
const DATA_LAST: u8 = 4;
const KEEP: u8 = 5;
const CLOSE: u8 = 6;
/// A data piece that describes a unit to fetch with fi_read.
const RNDV: u8 = 7;
/// The unit of a RNDV was read (or written into a grant): its buffer may go.
const RNDV_DONE: u8 = 8;
/// The answer to a RNDV whose unit is held for a write: the buffer to
/// write it into ([`rendezvous::encode_grant`]).
const RNDV_GRANT: u8 = 9;
/// The unit of a RNDV_GRANT was written (posted after the write, which it
/// does not overtake).
const RNDV_WRITTEN: u8 = 10;
/// The epilogue of a RNDV flagged `LATE_EPILOGUE`
/// ([`rendezvous::encode_epilogue`]).
const RNDV_EPILOGUE: u8 = 11;
/// The rendezvous messages besides descriptors, as this wire numbers them.
const OWED_KINDS: OwedKinds = OwedKinds {
    epilogue: RNDV_EPILOGUE,
    grant: RNDV_GRANT,
    written: RNDV_WRITTEN,
    done: RNDV_DONE,
};

/// Bytes of a HELLO body before the name: link id, cookie, name length.
const HELLO_FIXED: usize = 8 + 4 + 2;

/// Why housekeeping fails a link whose rendezvous read is overdue.
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

const RX_BIT: u64 = 1 << 39;
/// Context bit of an fi_read or a granted buffer (the low 32 bits number
/// it within its port).
const READ_BIT: u64 = 1 << 38;
/// Context bit of an fi_write (numbered as reads are).
const WRITE_BIT: u64 = 1 << 37;
const SLOT_MASK: u64 = (1 << 32) - 1;

fn context(port: usize, rx: bool, slot: usize) -> u64 {
    ((port as u64) << 40) | if rx { RX_BIT } else { 0 } | slot as u64
}

fn read_context(port: usize, n: u32) -> u64 {
    ((port as u64) << 40) | READ_BIT | u64::from(n)
}

fn write_context(port: usize, n: u32) -> u64 {
    ((port as u64) << 40) | WRITE_BIT | u64::from(n)
}

fn decode_context(c: u64) -> (usize, bool, usize) {
    (
        (c >> 40) as usize,
        c & RX_BIT != 0,
        (c & SLOT_MASK) as usize,
    )
}

/// The receiving end of a message: a link id and its cookie.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Dest {
    link: u64,
    cookie: u32,
}

struct Header {
    kind: u8,
    credits: u16,
    dest: Dest,
    /// Data pieces: the piece's number on its link (from 0).
    seq: u64,
}

fn write_header(buf: &mut [u8], kind: u8, credits: u16, dest: Dest, seq: u64) {
    buf[0] = kind;
    buf[1] = 0;
    buf[2..4].copy_from_slice(&credits.to_le_bytes());
    buf[4..8].copy_from_slice(&dest.cookie.to_le_bytes());
    buf[8..16].copy_from_slice(&dest.link.to_le_bytes());
    buf[16..24].copy_from_slice(&seq.to_le_bytes());
}

fn read_header(msg: &[u8]) -> Option<Header> {
    let h = msg.get(..HEADER_LEN)?;
    Some(Header {
        kind: h[0],
        credits: u16::from_le_bytes([h[2], h[3]]),
        dest: Dest {
            cookie: u32::from_le_bytes([h[4], h[5], h[6], h[7]]),
            link: u64::from_le_bytes(h[8..16].try_into().ok()?),
        },
        seq: u64::from_le_bytes(h[16..24].try_into().ok()?),
    })
}

/// What a received control message carries after its header, taken out
/// of the receive slot (reposted before the message is handled) and
/// parsed for its kind alone; data pieces stay where they are.
enum Body {
    /// Nothing to take (data pieces, `KEEP`, `CLOSE`).
    Empty,
    /// `HELLO`: the connector's ids, name and capabilities.
    Hello(Vec<u8>),
    /// `WELCOME`: the acceptor's ids and its rendezvous capabilities
    /// (`None`: too short).
    Welcome(Option<(Dest, (Option<RmaOp>, bool))>),
    /// `RNDV_DONE` and `RNDV_WRITTEN`: a unit's id.
    Done(Option<u32>),
    /// `RNDV_GRANT`: a unit's id and the buffer granted it.
    Grant(Option<(u32, Landing)>),
    /// `RNDV_EPILOGUE`: its bytes.
    Epilogue(OutOfSlot<{ rendezvous::EPILOGUE_MSG_MAX }>),
}

impl Body {
    fn of(kind: u8, body: &[u8]) -> Body {
        match kind {
            HELLO => Body::Hello(body.to_vec()),
            WELCOME => Body::Welcome(read_dest(body).map(|d| {
                let caps = body.get(12..).unwrap_or(&[]);
                let caps = (
                    rendezvous::peer_op(caps),
                    rendezvous::peer_late_epilogue(caps),
                );
                (d, caps)
            })),
            RNDV_DONE | RNDV_WRITTEN => Body::Done(rendezvous::decode_done(body)),
            RNDV_GRANT => Body::Grant(rendezvous::decode_grant(body)),
            RNDV_EPILOGUE => Body::Epilogue(OutOfSlot::new(body)),
            _ => Body::Empty,
        }
    }

    /// The unit id of a `Done` body.
    fn done(&self) -> Option<u32> {
        match self {
            Body::Done(id) => *id,
            _ => None,
        }
    }
}

/// (link id, cookie) of a body that starts with them (HELLO, WELCOME).
fn read_dest(body: &[u8]) -> Option<Dest> {
    let b = body.get(..12)?;
    Some(Dest {
        link: u64::from_le_bytes(b[..8].try_into().ok()?),
        cookie: u32::from_le_bytes(b[8..12].try_into().ok()?),
    })
}

fn write_dest(buf: &mut [u8], d: Dest) -> usize {
    buf[..8].copy_from_slice(&d.link.to_le_bytes());
    buf[8..12].copy_from_slice(&d.cookie.to_le_bytes());
    12
}

/// A peer in a port's address vector, shared by its links.
#[derive(Debug)]
struct Peer {
    name: Vec<u8>,
    addr: PeerAddr,
    /// Links (and queued CLOSE messages) that use it.
    users: usize,
    /// Sends to it not yet completed.
    inflight: usize,
    /// It stopped answering or its sends failed: remove it from the address
    /// vector once nothing uses it, so a restarted peer of the same name is
    /// mapped afresh.
    dead: bool,
}

/// One RDM endpoint: the outgoing one, or a listener's.
struct Port {
    ep: RdmEp,
    listener: Option<(Token, SocketAddr)>,
    /// Keeps a name-only address (shm) unique on this host.
    _reservation: Option<TcpListener>,
    peers: Vec<Option<Peer>>,
    peer_ids: FxHashMap<Vec<u8>, usize>,
    free_tx: Vec<usize>,
    /// Per transmit slot: the link it carries (None: a CLOSE) and the peer.
    tx_use: Vec<Option<(Option<LinkId>, usize)>>,
    /// CLOSE messages to send: (peer, the peer's end of the closed link,
    /// when it was queued).
    closes: VecDeque<(usize, Dest, Instant)>,
    /// Receive slots promised to links (plus one block for HELLOs).
    reserved: usize,
    /// Links on this endpoint.
    links: usize,
    /// fi_reads and fi_writes in flight: context -> link.
    reads: FxHashMap<u64, LinkId>,
    /// Numbers the next read, grant or write (see [`read_context`]).
    next_read: u32,
    /// Bytes per message sent, header included (at most the slot size:
    /// see [`RdmTransport::new`]).
    send_limit: usize,
    /// Contexts of sends that went by `fi_inject`: done when posted, they
    /// complete through the same path as the provider's completions, at
    /// the next CQ poll (their slots stay taken until then).
    injected: Vec<u64>,
}

impl Port {
    fn new(
        ep: RdmEp,
        listener: Option<(Token, SocketAddr)>,
        res: Option<TcpListener>,
        send_limit: usize,
    ) -> Self {
        let tx = ep.tx_slots();
        Port {
            send_limit: send_limit.min(ep.slot_size()),
            reserved: ep.rx_slots(),
            ep,
            listener,
            _reservation: res,
            peers: Vec::new(),
            peer_ids: FxHashMap::default(),
            free_tx: (0..tx).rev().collect(),
            tx_use: vec![None; tx],
            closes: VecDeque::new(),
            links: 0,
            reads: FxHashMap::default(),
            next_read: 0,
            injected: Vec::new(),
        }
    }

    /// The peer named `name`, inserted into the address vector on first use.
    fn peer(&mut self, name: &[u8]) -> Result<usize, FabricError> {
        if let Some(&i) = self.peer_ids.get(name) {
            if let Some(p) = self.peers[i].as_mut() {
                p.users += 1;
            }
            return Ok(i);
        }
        let addr = self.ep.insert(name)?;
        let peer = Peer {
            name: name.to_vec(),
            addr,
            users: 1,
            inflight: 0,
            dead: false,
        };
        let i = match self.peers.iter().position(Option::is_none) {
            Some(i) => {
                self.peers[i] = Some(peer);
                i
            }
            None => {
                self.peers.push(Some(peer));
                self.peers.len() - 1
            }
        };
        self.peer_ids.insert(name.to_vec(), i);
        Ok(i)
    }

    /// Drops a use (`user`) or an in-flight send of peer `i`; removes a dead
    /// peer from the address vector when nothing uses it any more. A live
    /// peer stays: `shm` keeps its own state of a peer that sent to us in the
    /// address vector's map, and removing it under a peer that still sends
    /// crashes the provider.
    fn release_peer(&mut self, i: usize, user: bool) {
        let Some(p) = self.peers.get_mut(i).and_then(Option::as_mut) else {
            return;
        };
        if user {
            p.users = p.users.saturating_sub(1);
        } else {
            p.inflight = p.inflight.saturating_sub(1);
        }
        if p.dead && p.users == 0 && p.inflight == 0 {
            let addr = p.addr;
            self.peer_ids.remove(&p.name);
            self.peers[i] = None;
            if let Err(e) = self.ep.remove(addr) {
                // Harmless: the entry stays until the endpoint closes.
                tracing::debug!(error = %e, "libfabric RDM: peer address not removed");
            }
        }
    }

    /// Counts a new link on this endpoint and grows the receive pool to cover
    /// its `slots`; on failure nothing is counted (the slots already posted
    /// stay in the pool).
    fn reserve(&mut self, port: usize, slots: usize) -> Result<(), FabricError> {
        while self.ep.rx_slots() < self.reserved + slots {
            for slot in self.ep.grow_rx()? {
                self.ep.post_recv(slot, context(port, true, slot))?;
            }
        }
        self.reserved += slots;
        self.links += 1;
        Ok(())
    }

    /// Fills a free transmit slot with `fill` (which returns the length) and
    /// sends it to `peer`. `Ok(false)`: no slot or the provider said
    /// -FI_EAGAIN; try again later.
    fn post(
        &mut self,
        port: usize,
        peer: usize,
        link: Option<LinkId>,
        fill: impl FnOnce(&mut [u8]) -> usize,
    ) -> Result<bool, FabricError> {
        self.post_with(port, peer, link, fill, None)
    }

    /// [`Port::post`], and with `body` the slot's bytes are followed by
    /// `body`, sent from where it is ([`RdmEp::send_in_place`]).
    fn post_with(
        &mut self,
        port: usize,
        peer: usize,
        link: Option<LinkId>,
        fill: impl FnOnce(&mut [u8]) -> usize,
        body: Option<Bytes>,
    ) -> Result<bool, FabricError> {
        let Some(&slot) = self.free_tx.last() else {
            return Ok(false);
        };
        let Some(p) = self.peers.get_mut(peer).and_then(Option::as_mut) else {
            return Err(FabricError::Slot(peer));
        };
        let to = p.addr;
        let Some(buf) = self.ep.tx_slot(slot) else {
            return Err(FabricError::Slot(slot));
        };
        let len = fill(buf);
        let ctx = context(port, false, slot);
        let posted = if let Some(body) = body {
            self.ep.send_in_place(slot, len, body, to, ctx)
        } else if len <= self.ep.inject_size() {
            self.ep
                .inject(slot, len, to)
                .map(|()| self.injected.push(ctx))
        } else {
            self.ep.send(slot, len, to, ctx)
        };
        match posted {
            Ok(()) => {
                self.free_tx.pop();
                self.tx_use[slot] = Some((link, peer));
                p.inflight += 1;
                Ok(true)
            }
            Err(e) if msgr_fabric::is_again(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }
}

#[derive(Debug)]
struct RdmLink {
    port: usize,
    peer: usize,
    cookie: u32,
    /// The peer's end; known once welcomed (connector) or from the HELLO.
    remote: Option<Dest>,
    /// Accepted (the listener's token and the peer) or outgoing (`None`).
    accepted: Option<(Token, SocketAddr)>,
    need_hello: bool,
    /// How the peer moves rendezvous units (its HELLO or WELCOME said so,
    /// see [`rendezvous::caps`]); known before any data is sent.
    peer_rndv: Option<RmaOp>,
    /// The peer takes a unit's epilogue after its descriptor
    /// ([`rendezvous::peer_late_epilogue`]).
    peer_late: bool,
    need_welcome: bool,
    need_keep: bool,
    credits: u32,
    to_return: u32,
    outbox: Outbox,
    /// Transmit slots in flight for this link.
    inflight: usize,
    reasm: Reassembly,
    paused: bool,
    frozen: bool,
    /// Data pieces received and not yet handed up, by number: reading is
    /// paused, or they overtook earlier ones (a provider completes a small
    /// message sent after a large one first when the large one goes by its
    /// rendezvous protocol). At most the link's credits.
    held: HeldPieces,
    /// Number of the next data piece to hand up / to send.
    rx_seq: u64,
    tx_seq: u64,
    close_after_flush: bool,
    last_heard: Instant,
    last_sent: Instant,
    /// Rendezvous, sending side: units exposed for the peer to read.
    exposures: Exposures,
    /// Rendezvous, receiving side: the fi_read in flight (later pieces
    /// wait for it) and the RNDV_DONE answers owed.
    receiving: Receiving,
}

/// A link's received data pieces not yet handed up, by number (receive
/// slot and length). A piece is at most [`CREDITS`] ahead of the next one
/// handed up (the sender's credits bound it; the receiver checks), so a
/// ring of that many entries holds them: nothing is allocated per piece, as
/// an ordered map did for every message.
#[derive(Debug, Default)]
struct HeldPieces {
    ring: [Option<(usize, usize)>; CREDITS as usize],
    count: usize,
}

impl HeldPieces {
    fn at(seq: u64) -> usize {
        (seq % u64::from(CREDITS)) as usize
    }

    /// Whether piece `seq` (within the window) is held already.
    fn contains(&self, seq: u64) -> bool {
        self.ring[Self::at(seq)].is_some()
    }

    /// Holds piece `seq`, which must be within the window and not held.
    fn insert(&mut self, seq: u64, piece: (usize, usize)) {
        let entry = &mut self.ring[Self::at(seq)];
        debug_assert!(entry.is_none(), "piece {seq} held twice");
        self.count += usize::from(entry.is_none());
        *entry = Some(piece);
    }

    /// Takes piece `seq` if it is held.
    fn take(&mut self, seq: u64) -> Option<(usize, usize)> {
        let piece = self.ring[Self::at(seq)].take();
        self.count -= usize::from(piece.is_some());
        piece
    }

    fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Takes every held piece.
    fn drain(&mut self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.count = 0;
        self.ring.iter_mut().filter_map(Option::take)
    }
}

impl RdmLink {
    fn new(port: usize, peer: usize, accepted: Option<(Token, SocketAddr)>) -> Self {
        let now = Instant::now();
        RdmLink {
            port,
            peer,
            cookie: rand_cookie(),
            remote: None,
            accepted,
            need_hello: false,
            peer_rndv: None,
            peer_late: false,
            need_welcome: false,
            need_keep: false,
            credits: 0,
            to_return: 0,
            outbox: Outbox::default(),
            inflight: 0,
            reasm: Reassembly::default(),
            paused: false,
            frozen: false,
            held: HeldPieces::default(),
            rx_seq: 0,
            tx_seq: 0,
            close_after_flush: false,
            last_heard: now,
            last_sent: now,
            exposures: Exposures::default(),
            receiving: Receiving::default(),
        }
    }

    fn idle(&self) -> bool {
        self.outbox.is_empty() && self.inflight == 0 && self.exposures.is_idle()
    }

    /// Whether the link has something to post once a slot or credit frees:
    /// handshake, a keepalive, queued units, or control and a staged
    /// descriptor that wait outside the queue.
    fn has_output(&self) -> bool {
        self.need_hello
            || self.need_welcome
            || self.need_keep
            || !self.outbox.is_empty()
            || self.exposures.owes_posts()
            || self.receiving.owes_posts()
    }

    fn dest(&self, id: LinkId) -> Dest {
        Dest {
            link: id.0,
            cookie: self.cookie,
        }
    }

    /// Sends a control message of `kind` with `body` to the peer's end,
    /// returning the credits owed in its header. `Ok(false)`: not sent now
    /// (see [`Port::post`]), or the peer's end is not known yet; the
    /// credits stay owed.
    fn post_control(
        &mut self,
        id: LinkId,
        pidx: usize,
        port: &mut Port,
        kind: u8,
        body: &[u8],
        now: Instant,
    ) -> Result<bool, FabricError> {
        let Some(remote) = self.remote else {
            return Ok(false);
        };
        let credits = self.take_credits();
        let sent = port.post(pidx, self.peer, Some(id), |buf| {
            write_header(buf, kind, credits, remote, 0);
            buf[HEADER_LEN..HEADER_LEN + body.len()].copy_from_slice(body);
            HEADER_LEN + body.len()
        })?;
        if sent {
            self.inflight += 1;
            self.last_sent = now;
        } else {
            self.to_return += u32::from(credits);
        }
        Ok(sent)
    }

    /// Sends what the link owes its peer besides data ([`Owed`]); false
    /// if one could not go yet.
    fn post_owed(
        &mut self,
        id: LinkId,
        pidx: usize,
        port: &mut Port,
        now: Instant,
    ) -> Result<bool, FabricError> {
        while let Some(owed) = Owed::next(&self.exposures, &self.receiving) {
            let mut body = [0u8; rendezvous::OWED_MAX];
            let n = owed.encode(&mut body);
            if !self.post_control(id, pidx, port, owed.kind(&OWED_KINDS), &body[..n], now)? {
                return Ok(false);
            }
            owed.posted(&mut self.exposures, &mut self.receiving);
        }
        Ok(true)
    }

    /// Posts the link's next data piece (`kind`: `DATA_MORE`, `DATA_LAST`
    /// or `RNDV`) through `port` (index and port): the header, then the
    /// body `fill` writes into the rest of the slot (returning its length)
    /// or, with `body`, bytes sent from where they lie. It spends a credit
    /// and a sequence number and returns the credits owed to the peer.
    /// `Ok(false)`: no slot or -FI_EAGAIN; nothing is spent.
    #[allow(clippy::too_many_arguments)] // the post's: link, port, peer, piece
    fn post_data(
        &mut self,
        id: LinkId,
        (pidx, port): (usize, &mut Port),
        remote: Dest,
        kind: u8,
        fill: impl FnOnce(&mut [u8]) -> usize,
        body: Option<Bytes>,
        now: Instant,
    ) -> Result<bool, FabricError> {
        let credits = self.take_credits();
        let seq = self.tx_seq;
        let header = |buf: &mut [u8]| {
            write_header(buf, kind, credits, remote, seq);
            HEADER_LEN + fill(&mut buf[HEADER_LEN..])
        };
        let sent = port.post_with(pidx, self.peer, Some(id), header, body);
        if !matches!(sent, Ok(true)) {
            self.to_return += u32::from(credits);
            return sent;
        }
        self.inflight += 1;
        self.credits -= 1;
        self.tx_seq += 1;
        self.last_sent = now;
        Ok(true)
    }

    /// Credits to return in the next header (all owed, as a u16).
    fn take_credits(&mut self) -> u16 {
        let n = self.to_return.min(u32::from(u16::MAX));
        self.to_return -= n;
        n as u16
    }
}

/// A per-link random number: a message for a link id of an earlier
/// incarnation (of this process or the peer) does not match it.
fn rand_cookie() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(SEQ.fetch_add(1, Ordering::Relaxed));
    h.finish() as u32
}

fn io_err(op: &'static str, e: FabricError) -> TransportError {
    TransportError::io(op, std::io::Error::other(e.to_string()))
}

/// libfabric RDM transport of one worker.
///
/// Messages are at most [`SLOT_SIZE`] bytes, or the provider's inject size
/// for `shm` (see [`RdmTransport::new`]).
pub struct RdmTransport {
    // Links and ports first: endpoints must close before the Net.
    links: FxHashMap<LinkId, RdmLink>,
    ports: Vec<Option<Port>>,
    /// Ports no longer used, kept open until the transport goes: libfabric
    /// 1.17's `ofi_rxm` crashes in `fi_trywait` on a CQ one of whose
    /// endpoints was closed (a listener unbound while a link still runs).
    /// Their completions name a port index that is empty now: ignored.
    retired: Vec<Port>,
    /// The port connecting links leave from, once opened.
    out_port: Option<usize>,
    /// Times the outgoing endpoint was replaced (`out_port_replacements`).
    out_port_replacements: u64,
    queue_failures: QueueFailures,
    net: Net,
    kind: TransportKind,
    registry: Registry,
    limits: FrameLimits,
    link_ids: Arc<AtomicU64>,
    /// The CQ's wait fds (none over `shm`), in the Poll only while the
    /// worker sleeps.
    cq_wait: CqWaitFd,
    /// Bytes per message (header included), see [`RdmTransport::new`].
    slot_size: usize,
    /// Bytes per message sent (header included): the slot size, or less
    /// where larger messages would go by the provider's own reads.
    send_limit: usize,
    /// How large units go by rendezvous (see [`RNDV_THRESHOLD`]), if they
    /// do.
    rndv: Option<RmaOp>,
    /// Rendezvous units received (for tests and counters).
    rndv_counters: Counters,
    /// Registrations of payloads exposed in place, kept for their next
    /// send where the provider checks keys (`rdma_reg_cache_bytes`; must
    /// go before the Net, see `Drop`).
    reg_cache: RegCache<ReadRegion>,
    /// A rendezvous read in flight longer than this fails its link.
    read_timeout: Duration,
    /// What the configuration asked of the Net (to reopen it).
    net_options: NetOptions,
    dirty: crate::dirty::DirtyLinks,
    /// The clock of the worker's current pass (set by `flush`, `ready` and
    /// `progress`): liveness stamps and deadlines read it, not the clock.
    now: Instant,
    /// A transmit slot came free or a CLOSE was queued: flush every link
    /// with something to send at the next progress.
    retry: bool,
    /// Something could not be sent (no free slot, or the provider said
    /// -FI_EAGAIN): flush again at this time, without spinning meanwhile —
    /// a peer that stopped progressing keeps saying -FI_EAGAIN until its
    /// link's deadline.
    retry_at: Option<Instant>,
    resumed: Vec<LinkId>,
    /// Events found outside a poll (an injected abort, a failed send
    /// posted by `send` itself), reported by the next one.
    deferred_events: Vec<TransportEvent>,
    /// Receive slots whose data pieces were handled, reposted (and their
    /// credits owed back) once this pass's sends are posted: see
    /// `repost_handled`.
    handled: Vec<(usize, usize, LinkId)>,
    next_housekeeping: Instant,
    completions: Vec<Completion>,
    /// Where small frames are encoded ([`OutUnit::Small`]).
    tx_arena: ByteArena,
}

impl std::fmt::Debug for RdmTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmTransport")
            .field("kind", &self.kind)
            .field("links", &self.links.len())
            .finish()
    }
}

impl RdmTransport {
    /// Opens `provider` (RDM) for one worker; its CQ's wait fds (if it has
    /// any) go into `registry` while the worker sleeps.
    pub fn new(
        provider: &FabricProvider,
        registry: &Registry,
        ctx: &TransportContext,
    ) -> Result<Self, TransportError> {
        let kind = TransportKind::Fabric(provider.clone());
        if let Availability::Unavailable(reason) = probe(provider) {
            return Err(TransportError::Unavailable { kind, reason });
        }
        let net_options = NetOptions::of(ctx);
        let net = open_net(&kind, None, net_options)?;
        let cq_token = Token(ctx.link_ids.fetch_add(1, Ordering::Relaxed) as usize);
        let cq_wait = CqWaitFd::new(!net.cq_polled(), cq_token);
        let registry = registry
            .try_clone()
            .map_err(|e| TransportError::io("clone mio registry", e))?;
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
        // Rendezvous needs RMA (shm too: see the module docs on its reads).
        let rndv = net.rma();
        Ok(RdmTransport {
            slot_size,
            send_limit,
            rndv,
            rndv_counters: Counters::default(),
            reg_cache: RegCache::new(ctx.rdma.reg_cache_bytes),
            read_timeout: ctx.rdma.read_timeout,
            net_options,
            links: FxHashMap::default(),
            ports: Vec::new(),
            retired: Vec::new(),
            out_port: None,
            out_port_replacements: 0,
            queue_failures: QueueFailures::default(),
            net,
            kind,
            registry,
            limits: ctx.limits,
            link_ids: ctx.link_ids.clone(),
            cq_wait,
            dirty: Default::default(),
            retry: false,
            retry_at: None,
            resumed: Vec::new(),
            deferred_events: Vec::new(),
            handled: Vec::new(),
            now: Instant::now(),
            next_housekeeping: Instant::now() + HOUSEKEEPING,
            completions: Vec::with_capacity(CQ_BATCH),
            tx_arena: ByteArena::new(rendezvous::SMALL_ARENA),
        })
    }

    /// Moves this worker's Net onto the domain that serves `site` while no
    /// endpoint is open on it (see `FabricTransport::settle_domain`: verbs
    /// has one domain per device).
    fn settle_domain(&mut self, site: Site) -> Result<(), TransportError> {
        if self.ports.iter().any(Option::is_some) || self.net.serves(site) {
            return Ok(());
        }
        let net = open_net(&self.kind, Some(site), self.net_options)?;
        self.cq_wait.replace(!net.cq_polled(), &self.registry);
        tracing::debug!(from = %self.net.domain(), to = %net.domain(), %site, "fabric RDM worker moves to the domain of its first address");
        // Kept registrations belong to the old domain: out before it closes.
        self.reg_cache.clear();
        self.net = net;
        Ok(())
    }

    fn open_port(
        &mut self,
        bind: Option<SocketAddr>,
        listener: Option<(Token, SocketAddr)>,
        reservation: Option<TcpListener>,
    ) -> Result<usize, FabricError> {
        let ep = self
            .net
            .rdm_endpoint(bind, TX_SLOTS, LINK_BLOCK, self.slot_size)?;
        // Port indices are never reused: completions of a closed port's
        // endpoint could still be in the CQ.
        let idx = self.ports.len();
        let mut port = Port::new(ep, listener, reservation, self.send_limit);
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

    /// Removes a link; a peer that knows its end hears `CLOSE`.
    fn drop_link(&mut self, id: LinkId) -> Option<RdmLink> {
        let mut link = self.links.remove(&id)?;
        let Some(port) = self.ports.get_mut(link.port).and_then(Option::as_mut) else {
            return Some(link);
        };
        port.reserved = port.reserved.saturating_sub(LINK_BLOCK);
        port.links = port.links.saturating_sub(1);
        // Exposed units go (a peer still reading gets an error); a read in
        // flight keeps its buffer in the endpoint until it completes; a
        // buffer granted to the peer's write stays with the endpoint, closed
        // to new writes (one under way may still land).
        for id in link.exposures.drain() {
            port.ep.rma().unexpose(id);
        }
        if let Some(granted) = link.receiving.reading.and_then(|r| r.granted) {
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
                port.closes.push_back((link.peer, remote, Instant::now()));
                self.retry = true;
            }
            None => port.release_peer(link.peer, true),
        }
        if port.links == 0 && port.listener.is_none() && self.out_port != Some(link.port) {
            // An endpoint that stopped listening goes with its last link.
            self.retire(link.port);
        }
        Some(link)
    }

    /// Fails `id` because its peer is gone (silent past the deadline, or a
    /// send to it failed): the peer's entry goes when unused.
    fn peer_gone(&mut self, id: LinkId, why: String, events: &mut Vec<TransportEvent>) {
        if let Some(l) = self.links.get(&id) {
            let (pidx, peer) = (l.port, l.peer);
            if let Some(p) = self
                .ports
                .get_mut(pidx)
                .and_then(Option::as_mut)
                .and_then(|port| port.peers.get_mut(peer))
                .and_then(Option::as_mut)
            {
                p.dead = true;
            }
        }
        self.fail(id, why, events);
    }

    fn fail(&mut self, id: LinkId, why: String, events: &mut Vec<TransportEvent>) {
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
            if port.injected.is_empty() {
                continue;
            }
            any = true;
            let mut done = std::mem::take(&mut port.injected);
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
                done.append(&mut port.injected);
                port.injected = done;
            }
        }
        let cq: CqParts<Self> = |t| (&mut t.queue_failures, &mut t.net, &mut t.completions);
        match read_completions(self, cq, |t, c| t.complete(c, events)) {
            Ok(read) => any || read,
            Err((read, why)) => {
                // As `FabricTransport::fail_all`, the peers' entries too.
                let ids = self.links.keys().copied().collect();
                let failed = fail_every_link(ids, &why, |id, why| self.peer_gone(id, why, events));
                any || read || failed
            }
        }
    }

    fn complete(&mut self, c: &Completion, events: &mut Vec<TransportEvent>) {
        let (pidx, rx, slot) = decode_context(c.context);
        let Some(port) = self.ports.get_mut(pidx).and_then(Option::as_mut) else {
            return;
        };
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
        port.free_tx.push(slot);
        let Some((link, peer)) = port.tx_use.get_mut(slot).and_then(Option::take) else {
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
        if let Some((code, what)) = c.error {
            let why = format!(
                "libfabric send {what}: {}",
                std::io::Error::from_raw_os_error(code)
            );
            self.peer_gone(id, why, events);
            return;
        }
        if l.close_after_flush && l.idle() {
            self.drop_link(id);
        }
    }

    /// Handles one received message in slot `slot` of port `pidx`.
    fn receive(&mut self, pidx: usize, slot: usize, len: usize, events: &mut Vec<TransportEvent>) {
        let Some(port) = self.ports.get_mut(pidx).and_then(Option::as_mut) else {
            return;
        };
        let msg = port.ep.recv_done(slot, len);
        let Some(h) = read_header(msg) else {
            tracing::debug!(len, "RDM message shorter than its header, dropped");
            return self.repost(pidx, slot);
        };
        let body = Body::of(h.kind, msg.get(HEADER_LEN..).unwrap_or(&[]));
        if let Body::Hello(body) = body {
            self.repost(pidx, slot);
            return self.hello(pidx, &body, events);
        }
        let id = LinkId(h.dest.link);
        let Some(link) = self.links.get_mut(&id) else {
            tracing::debug!(
                link = id.0,
                kind = h.kind,
                "RDM message for no link, dropped"
            );
            return self.repost(pidx, slot);
        };
        if link.port != pidx || link.cookie != h.dest.cookie {
            tracing::debug!(
                link = id.0,
                "RDM message for an earlier link of this id, dropped"
            );
            return self.repost(pidx, slot);
        }
        link.last_heard = self.now;
        link.credits = link
            .credits
            .saturating_add(u32::from(h.credits))
            .min(CREDITS);
        if h.credits > 0 && link.has_output() {
            self.dirty.push(id);
        }
        match h.kind {
            WELCOME => {
                let remote = match body {
                    Body::Welcome(w) => w,
                    _ => None,
                };
                self.repost(pidx, slot);
                let Some(link) = self.links.get_mut(&id) else {
                    return;
                };
                match remote {
                    Some((r, (op, late))) if link.remote.is_none() && link.accepted.is_none() => {
                        link.remote = Some(r);
                        link.peer_rndv = op;
                        link.peer_late = late;
                        link.credits = CREDITS;
                        events.push(TransportEvent::Connected(id));
                        self.dirty.push(id);
                        // Data that overtook the WELCOME.
                        self.hand_up(id, events);
                    }
                    _ => self.fail(id, "unexpected or short WELCOME".into(), events),
                }
            }
            DATA_MORE | DATA_LAST | RNDV => {
                if h.seq < link.rx_seq
                    || h.seq - link.rx_seq >= u64::from(CREDITS)
                    || link.held.contains(h.seq)
                {
                    let why = format!(
                        "data piece {} outside the window {}..{}",
                        h.seq,
                        link.rx_seq,
                        link.rx_seq + u64::from(CREDITS)
                    );
                    self.repost(pidx, slot);
                    return self.fail(id, why, events);
                }
                link.held.insert(h.seq, (slot, len));
                self.hand_up(id, events);
            }
            KEEP => self.repost(pidx, slot),
            RNDV_DONE => {
                self.repost(pidx, slot);
                let id_done = body.done();
                let (Some(link), Some(port)) = (
                    self.links.get_mut(&id),
                    self.ports.get_mut(pidx).and_then(Option::as_mut),
                ) else {
                    return;
                };
                match id_done.filter(|&d| link.exposures.done(d)) {
                    Some(d) => {
                        port.ep.rma().unexpose(d);
                        self.dirty.push(id);
                    }
                    None => {
                        let why = DescError::UnknownDone(id_done).to_string();
                        self.fail(id, why, events)
                    }
                }
            }
            RNDV_GRANT => {
                self.repost(pidx, slot);
                let grant = match body {
                    Body::Grant(g) => g,
                    _ => None,
                };
                self.grant_received(id, grant, events);
            }
            RNDV_WRITTEN => {
                self.repost(pidx, slot);
                let written = self
                    .links
                    .get(&id)
                    .map(|l| l.receiving.written(body.done()));
                match written {
                    Some(Ok(context)) => self.rendezvous_arrived(pidx, id, context, None, events),
                    Some(Err(e)) => self.fail(id, e.to_string(), events),
                    None => {}
                }
            }
            RNDV_EPILOGUE => {
                self.repost(pidx, slot);
                let Some(link) = self.links.get_mut(&id) else {
                    return;
                };
                let words = match &body {
                    Body::Epilogue(words) => words.bytes(),
                    _ => &[],
                };
                let unit = link.receiving.epilogue_arrived(
                    words,
                    &mut link.reasm,
                    &self.limits,
                    &mut self.rndv_counters,
                );
                match unit {
                    Ok(None) => {}
                    Ok(Some(unit)) => self.unit_arrived(id, unit, events),
                    Err(e) => self.unit_arrived(id, Err(e), events),
                }
            }
            CLOSE => {
                self.repost(pidx, slot);
                if let Some(l) = self.links.get_mut(&id) {
                    // The peer's end is gone: no CLOSE back.
                    l.remote = None;
                }
                self.fail(id, "link closed by peer (CLOSE)".into(), events);
            }
            other => {
                self.repost(pidx, slot);
                self.fail(id, format!("unknown RDM message kind {other}"), events);
            }
        }
    }

    /// Hands up `id`'s held data pieces that are next in order, unless
    /// reading is paused or the link is not set up yet.
    fn hand_up(&mut self, id: LinkId, events: &mut Vec<TransportEvent>) -> bool {
        let mut any = false;
        while let Some(link) = self.links.get_mut(&id) {
            if link.paused
                || link.frozen
                || link.remote.is_none()
                || link.receiving.reading.is_some()
            {
                break;
            }
            let Some((slot, len)) = link.held.take(link.rx_seq) else {
                break;
            };
            link.rx_seq += 1;
            any = true;
            self.data(id, slot, len, events);
        }
        any
    }

    fn repost(&mut self, pidx: usize, slot: usize) {
        if let Some(port) = self.ports.get_mut(pidx).and_then(Option::as_mut) {
            if let Err(e) = port.ep.post_recv(slot, context(pidx, true, slot)) {
                tracing::warn!(error = %e, "repost of an RDM receive failed");
            }
        }
    }

    /// Reposts the receive slots of the data pieces handled since the last
    /// call and owes their credits back. Deferred from `data` to the pass's
    /// flush (and the next poll): the receive a 64 B request frees is not
    /// needed before the reply to it is posted, which then goes ~50 ns
    /// sooner. A credit is owed only for a slot posted again, so the peer
    /// never sends into one that is not.
    fn repost_handled(&mut self) {
        if self.handled.is_empty() {
            return; // every idle pass of a spinning worker comes here
        }
        // Drained, not dropped: its memory serves the next pass.
        let mut handled = std::mem::take(&mut self.handled);
        for (pidx, slot, id) in handled.drain(..) {
            self.repost(pidx, slot);
            let Some(link) = self.links.get_mut(&id) else {
                continue;
            };
            link.to_return += 1;
            if link.to_return >= CREDITS / 2 {
                link.need_keep = true;
                self.dirty.push(id);
            }
        }
        handled.append(&mut self.handled);
        self.handled = handled;
    }

    /// A data piece for `id` in `slot`: joined and handed up; the slot is
    /// reposted and its credit owed back by `repost_handled`.
    fn data(&mut self, id: LinkId, slot: usize, len: usize, events: &mut Vec<TransportEvent>) {
        let Some(link) = self.links.get_mut(&id) else {
            return;
        };
        let pidx = link.port;
        let Some(port) = self.ports.get_mut(pidx).and_then(Option::as_mut) else {
            return;
        };
        let abandoned = port.ep.rma().abandoned_bytes();
        let msg = port.ep.recv_done(slot, len);
        let kind = msg.first().copied();
        let body = msg.get(HEADER_LEN..).unwrap_or(&[]);
        let outcome = if kind == Some(RNDV) {
            // The unit comes by fi_read or by the peer's write into a grant;
            // later pieces wait for it (hand_up).
            let decoded = rendezvous::decode(body, self.limits.max_frame, !link.reasm.is_idle());
            let wrong_op = |d: &rendezvous::Offered<'_>| {
                let offered = if d.x.write { RmaOp::Write } else { RmaOp::Read };
                (self.rndv != Some(offered)).then_some(DescError::WrongOp {
                    offered,
                    ours: self.rndv,
                })
            };
            match decoded.and_then(|d| wrong_op(&d).map_or(Ok(d), Err)) {
                Err(e) => Err(PieceError::Malformed(e.to_string())),
                Ok(d) if d.x.write && abandoned >= ABANDONED_MAX => {
                    Err(PieceError::Malformed(format!(
                        "rendezvous write refused: {abandoned} bytes of grants abandoned on this endpoint"
                    )))
                }
                Ok(d) if d.x.write => {
                    // Out of the slot: the grant borrows the endpoint.
                    let (x, at, inline, late) = (d.x, d.at, d.inline.to_vec(), d.late_room());
                    let ctx = read_context(pidx, port.next_read);
                    port.next_read = port.next_read.wrapping_add(1);
                    match port.ep.rma().grant(&x, ctx, &inline, at) {
                        Ok(landing) => {
                            link.receiving.need_grant.push((x.id, landing));
                            link.receiving
                                .started(x.id, Some(ctx), late, &mut self.rndv_counters);
                            self.dirty.push(id);
                            Ok(None)
                        }
                        Err(e) => Err(PieceError::Malformed(format!("rendezvous grant: {e}"))),
                    }
                }
                Ok(d) => {
                    // Out of the slot: the read borrows the endpoint.
                    let (x, at, inline, late) = (d.x, d.at, d.inline.to_vec(), d.late_room());
                    let ctx = read_context(pidx, port.next_read);
                    port.next_read = port.next_read.wrapping_add(1);
                    let from = port
                        .peers
                        .get(link.peer)
                        .and_then(Option::as_ref)
                        .map(|p| p.addr);
                    match from.map(|from| port.ep.read(&x, from, ctx, &inline, at)) {
                        Some(Ok(())) => {
                            port.reads.insert(ctx, id);
                            let counters = &mut self.rndv_counters;
                            link.receiving.started(x.id, None, late, counters);
                            Ok(None)
                        }
                        Some(Err(e)) => Err(PieceError::Malformed(format!("fi_read: {e}"))),
                        None => Err(PieceError::Malformed("rendezvous from no peer".into())),
                    }
                }
            }
        } else {
            link.reasm.push(kind == Some(DATA_LAST), body, &self.limits)
        };
        self.handled.push((pidx, slot, id));
        match outcome {
            Ok(Some(unit)) => events.push(TransportEvent::Received(id, unit)),
            Ok(None) => {}
            Err(PieceError::Corrupt(e)) => {
                self.drop_link(id);
                events.push(TransportEvent::Corrupt(id, ProtocolError::Frame(e)));
            }
            Err(PieceError::Malformed(why)) => {
                self.fail(id, format!("malformed message: {why}"), events)
            }
        }
    }

    /// An fi_read completed: the rendezvous unit is handed up, the sender
    /// told (RNDV_DONE), and the pieces that waited for it follow.
    fn read_complete(&mut self, pidx: usize, c: &Completion, events: &mut Vec<TransportEvent>) {
        let Some(port) = self.ports.get_mut(pidx).and_then(Option::as_mut) else {
            return;
        };
        match port.reads.get(&c.context) {
            Some(&id) => self.rendezvous_arrived(pidx, id, c.context, c.error, events),
            None => drop(port.ep.rma().read_done(c.context, false)),
        }
    }

    /// The unit of link `id`'s rendezvous under `context` on port `pidx`
    /// arrived (its read completed, with `error` if it failed, or the peer
    /// said it wrote it into our grant): it is handed up, the sender told
    /// (RNDV_DONE), and the pieces that waited for it follow.
    fn rendezvous_arrived(
        &mut self,
        pidx: usize,
        id: LinkId,
        context: u64,
        error: Option<(i32, &'static str)>,
        events: &mut Vec<TransportEvent>,
    ) {
        let Some(port) = self.ports.get_mut(pidx).and_then(Option::as_mut) else {
            return;
        };
        let placed = match self.links.get_mut(&id) {
            Some(link) => link.receiving.place_epilogue(port.ep.rma(), context),
            None => Ok(()),
        };
        // Freed here even if the completion is then ignored (a simulated
        // hang) or its link went: the provider is done with the buffer. Its
        // check word may be read next, apart: then the read completes again.
        let buf = match port.ep.rma().read_done(context, error.is_none()) {
            // A placement that failed fails the link now; the word's read
            // completes later, with the link gone, and frees the buffer.
            Some(ReadDone::WordNext) => {
                if let Err(e) = placed {
                    self.unit_arrived(id, Err(e), events);
                }
                return;
            }
            done => done.and_then(ReadDone::finished),
        };
        port.reads.remove(&context);
        if let Err(e) = placed {
            return self.unit_arrived(id, Err(e), events);
        }
        let Some(link) = self.links.get_mut(&id) else {
            return; // the link went while its read was in flight
        };
        let Some(unit) = link.receiving.finish(
            error,
            buf,
            &mut link.reasm,
            &self.limits,
            &mut self.rndv_counters,
        ) else {
            return;
        };
        self.unit_arrived(id, unit, events);
    }

    /// Link `id`'s rendezvous unit is whole (read or written, its epilogue
    /// in place): handed up, its answer sent, and the pieces that waited
    /// for it follow; or the link fails.
    fn unit_arrived(
        &mut self,
        id: LinkId,
        unit: Result<Inbound, PieceError>,
        events: &mut Vec<TransportEvent>,
    ) {
        if !reassembly::report_unit(id, unit, events) {
            self.drop_link(id);
            return;
        }
        self.dirty.push(id);
        self.hand_up(id, events);
    }

    /// The peer granted a buffer for our unit (`grant`, from a RNDV_GRANT):
    /// the unit is written into it, and the peer told so right behind the
    /// write (RNDV_WRITTEN).
    fn grant_received(
        &mut self,
        id: LinkId,
        grant: Option<(u32, Landing)>,
        events: &mut Vec<TransportEvent>,
    ) {
        let Some(link) = self.links.get_mut(&id) else {
            return;
        };
        let pidx = link.port;
        let Some(port) = self.ports.get_mut(pidx).and_then(Option::as_mut) else {
            return;
        };
        let Some((unit, landing)) = grant.filter(|&(unit, _)| link.exposures.granted(unit)) else {
            let why = DescError::UnknownGrant(grant.map(|(unit, _)| unit)).to_string();
            return self.fail(id, why, events);
        };
        let to = port
            .peers
            .get(link.peer)
            .and_then(Option::as_ref)
            .map(|p| p.addr);
        let ctx = write_context(pidx, port.next_read);
        port.next_read = port.next_read.wrapping_add(1);
        match to.map(|to| port.ep.write(unit, to, landing, ctx)) {
            Some(Ok(())) => {
                port.reads.insert(ctx, id);
                self.rndv_counters.writes += 1;
                link.exposures.write_posted(unit, &mut self.rndv_counters);
                self.dirty.push(id);
            }
            Some(Err(e)) => self.fail(id, format!("fi_write: {e}"), events),
            None => self.fail(id, "rendezvous grant from no peer".into(), events),
        }
    }

    /// One of our writes completed: its unit may go once the peer answers
    /// (RNDV_DONE), or now if its link went; a failed write fails the link.
    fn write_complete(&mut self, pidx: usize, c: &Completion, events: &mut Vec<TransportEvent>) {
        let Some(port) = self.ports.get_mut(pidx).and_then(Option::as_mut) else {
            return;
        };
        port.ep.rma().write_done(c.context);
        let id = port.reads.remove(&c.context);
        if let (Some(id), Some((code, what))) = (id, c.error) {
            let why = format!(
                "libfabric fi_write {what}: {}",
                std::io::Error::from_raw_os_error(code)
            );
            self.fail(id, why, events);
        }
    }

    /// A HELLO on port `pidx`: accept the link if the port listens.
    fn hello(&mut self, pidx: usize, body: &[u8], events: &mut Vec<TransportEvent>) {
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
        let (peer_rndv, peer_late) = (
            rendezvous::peer_op(caps),
            rendezvous::peer_late_epilogue(caps),
        );
        let peer = match port.peer(name) {
            Ok(p) => p,
            Err(e) => {
                tracing::debug!(error = %e, "HELLO from an unusable name dropped");
                return;
            }
        };
        if let Err(e) = port.reserve(pidx, LINK_BLOCK) {
            tracing::warn!(error = %e, "no receive buffers for a new RDM link; HELLO dropped");
            port.release_peer(peer, true);
            return;
        }
        let peer_addr = RdmEp::name_as_socket(name).unwrap_or(SocketAddr::from(([0, 0, 0, 0], 0)));
        let id = LinkId(self.link_ids.fetch_add(1, Ordering::Relaxed));
        let mut link = RdmLink::new(pidx, peer, Some((token, peer_addr)));
        link.remote = Some(remote);
        link.peer_rndv = peer_rndv;
        link.peer_late = peer_late;
        link.credits = CREDITS;
        link.need_welcome = true;
        self.links.insert(id, link);
        self.dirty.push(id);
        events.push(TransportEvent::Accepted {
            link: id,
            peer: peer_addr,
            listener: token,
        });
    }

    /// Sends what `id` has to send: handshake, data within its credits,
    /// credits owed and keepalives.
    fn flush_link(&mut self, id: LinkId, events: &mut Vec<TransportEvent>) {
        let Some(link) = self.links.get_mut(&id) else {
            return;
        };
        if link.frozen {
            return;
        }
        let pidx = link.port;
        let Some(port) = self.ports.get_mut(pidx).and_then(Option::as_mut) else {
            return;
        };
        // No more writes offered or taken once too many grants were
        // abandoned here (see ABANDONED_MAX).
        let ours = self
            .rndv
            .filter(|&op| op != RmaOp::Write || port.ep.rma().abandoned_bytes() < ABANDONED_MAX);
        let result = Self::flush_into(
            id,
            link,
            (pidx, port),
            ours,
            &mut self.rndv_counters,
            &mut self.reg_cache,
            self.now,
        );
        let closed = link.close_after_flush && link.idle();
        match result {
            Ok(done) => {
                if !done {
                    self.retry_later();
                }
                if closed {
                    self.drop_link(id);
                }
            }
            Err(e) => self.fail(id, format!("fi_send: {e}"), events),
        }
    }

    /// Returns whether everything sendable went (else: out of slots or
    /// -FI_EAGAIN). `ours`: how this end moves rendezvous units (it offers
    /// them to a peer that moves them the same way).
    fn flush_into(
        id: LinkId,
        link: &mut RdmLink,
        (pidx, port): (usize, &mut Port),
        ours: Option<RmaOp>,
        counters: &mut Counters,
        reg_cache: &mut RegCache<ReadRegion>,
        now: Instant,
    ) -> Result<bool, FabricError> {
        let me = link.dest(id);
        let rndv = rendezvous::link_op(ours, link.peer_rndv).is_some();
        if link.need_hello {
            let name = port.ep.name().to_vec();
            let caps = rendezvous::caps(ours);
            let sent = port.post(pidx, link.peer, Some(id), |buf| {
                write_header(buf, HELLO, 0, Dest { link: 0, cookie: 0 }, 0);
                let mut n = HEADER_LEN + write_dest(&mut buf[HEADER_LEN..], me);
                buf[n..n + 2].copy_from_slice(&(name.len() as u16).to_le_bytes());
                n += 2;
                buf[n..n + name.len()].copy_from_slice(&name);
                n += name.len();
                buf[n..n + caps.len()].copy_from_slice(&caps);
                n + caps.len()
            })?;
            if !sent {
                return Ok(false);
            }
            link.need_hello = false;
            link.inflight += 1;
            link.last_sent = now;
        }
        let Some(remote) = link.remote else {
            return Ok(true); // waiting for WELCOME
        };
        if link.need_welcome {
            let mut body = [0u8; 12 + rendezvous::CAPS_LEN];
            let n = write_dest(&mut body, me);
            body[n..].copy_from_slice(&rendezvous::caps(ours));
            if !link.post_control(id, pidx, port, WELCOME, &body, now)? {
                return Ok(false);
            }
            link.need_welcome = false;
        }
        if !link.post_owed(id, pidx, port, now)? {
            return Ok(false);
        }
        // A large unit at a unit boundary goes by rendezvous: exposed here,
        // its descriptor sent as the next data piece.
        while let Some(x) = link
            .exposures
            .stage(rndv, &mut link.outbox, counters, |unit| {
                let room = port.send_limit - HEADER_LEN;
                rendezvous::expose(port.ep.rma(), reg_cache, unit, room)
            })
        {
            if link.credits == 0 {
                // Not a return: credits owed to the peer still go (KEEP,
                // below), or two links out of credits both ways would wait
                // on each other until the keepalive timeout.
                break;
            }
            let fill = |body: &mut [u8]| rendezvous::encode(body, &x);
            if !link.post_data(id, (pidx, port), remote, RNDV, fill, None, now)? {
                return Ok(false);
            }
            link.exposures.sent(counters);
            if !link.post_owed(id, pidx, port, now)? {
                return Ok(false); // its late epilogue
            }
        }
        let (max, in_place) = (port.send_limit - HEADER_LEN, port.ep.sends_in_place());
        while link.credits > 0 {
            let Some(mut piece) = link.outbox.next_piece(&link.exposures, rndv, max, in_place)
            else {
                break;
            };
            // Out of the link while its piece is posted (the post takes
            // the link).
            let outbox = std::mem::take(&mut link.outbox);
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
            link.outbox = outbox;
            if !sent? {
                return Ok(false);
            }
            counters.pieces_in_place += u64::from(!from_slot);
            link.outbox.piece_sent(&piece, &mut link.exposures);
        }
        if link.need_keep || link.to_return >= CREDITS / 2 {
            if !link.post_control(id, pidx, port, KEEP, &[], now)? {
                return Ok(false);
            }
            link.need_keep = false;
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
            let Some(port) = port.as_mut() else {
                continue;
            };
            while let Some(&(peer, remote, queued)) = port.closes.front() {
                if self.now.saturating_duration_since(queued) > CLOSE_GIVE_UP {
                    // The peer does not take messages: its deadline tells it.
                    port.closes.pop_front();
                    port.release_peer(peer, true);
                    continue;
                }
                match port.post(pidx, peer, None, |buf| {
                    write_header(buf, CLOSE, 0, remote, 0);
                    HEADER_LEN
                }) {
                    Ok(true) => {
                        port.closes.pop_front();
                        port.release_peer(peer, true);
                    }
                    Ok(false) => {
                        done = false;
                        break;
                    }
                    Err(e) => {
                        // The peer learns by its deadline instead.
                        tracing::debug!(error = %e, "CLOSE not sent");
                        port.closes.pop_front();
                        port.release_peer(peer, true);
                    }
                }
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
            if l.frozen || l.close_after_flush {
                continue;
            }
            let stuck_read = l
                .receiving
                .reading
                .is_some_and(|r| rendezvous::overdue(r.since, now, self.read_timeout));
            // Exposed units are not timed on the sending side: a receiver
            // that paused reading fetches them late, and a dead one trips
            // `last_heard`.
            if now.duration_since(l.last_heard) > LINK_DEADLINE {
                // A HELLO never posted is the endpoint's fault, not the peer's.
                dead.push((
                    id,
                    if l.need_hello {
                        REFUSED_HELLO
                    } else {
                        "peer silent"
                    },
                ));
            } else if stuck_read {
                dead.push((id, STUCK_READ));
            } else if l.remote.is_some() && now.duration_since(l.last_sent) > KEEP_AFTER {
                l.need_keep = true;
                self.dirty.push(id);
            }
        }
        for (id, what) in dead {
            let why = if what == STUCK_READ {
                self.rndv_counters.read_timeouts += 1;
                format!(
                    "{what} within {:?} (rdma_read_timeout_ms)",
                    self.read_timeout
                )
            } else if what == REFUSED_HELLO {
                self.replace_out_port(id);
                format!("{what} for {LINK_DEADLINE:?}")
            } else {
                format!("{what} for {LINK_DEADLINE:?} (peer dead or unreachable)")
            };
            self.peer_gone(id, why, events);
        }
    }

    fn poll_all(&mut self, now: Instant, events: &mut Vec<TransportEvent>) -> bool {
        self.now = now;
        self.cq_wait.disarm(&self.registry);
        let mut any = !self.deferred_events.is_empty();
        events.append(&mut self.deferred_events);
        self.repost_handled();
        any |= self.drain_cq(events);
        for id in std::mem::take(&mut self.resumed) {
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
            self.dirty.extend(ids);
            // Not `flush`: the slots handled in this poll are posted again
            // after the worker has answered them.
            self.flush_dirty(events);
        }
        any
    }

    /// Sends what the links marked dirty have to send, and the closes.
    fn flush_dirty(&mut self, events: &mut Vec<TransportEvent>) {
        if !self.flush_closes() {
            self.retry_later();
        }
        let flush = |t: &mut Self, id| t.flush_link(id, events);
        crate::dirty::DirtyLinks::flush_each(self, |t| &mut t.dirty, flush);
    }

    /// Takes port `pidx` out of use (see `retired`).
    fn retire(&mut self, pidx: usize) {
        if let Some(port) = self.ports.get_mut(pidx).and_then(Option::take) {
            self.retired.push(port);
        }
    }

    /// Posts what `id` has queued now rather than at the pass's flush, for
    /// a unit `send` queued behind nothing: a reply then leaves before the
    /// rest of the worker's pass (~0.1 µs of a 64 B shm one-way). Each unit
    /// is its own post on these endpoints, so nothing is lost by not
    /// waiting for more. A failure is reported at the next poll.
    fn flush_now(&mut self, id: LinkId) {
        let mut events = Vec::new();
        self.flush_link(id, &mut events);
        self.deferred_events.append(&mut events);
    }

    fn retry_later(&mut self) {
        self.retry_at.get_or_insert(self.now + RETRY_AFTER);
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
        if link.frozen
            || link.close_after_flush
            || link.credits == 0
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
        match link.post_data(id, (pidx, port), remote, DATA_LAST, fill, None, self.now) {
            Ok(true) => Ok(None),
            Ok(false) | Err(_) => Ok(Some(f)),
        }
    }

    /// Queues `unit` on `link`: one queued behind nothing is posted at once
    /// ([`RdmTransport::flush_now`]); the link is marked for the pass's
    /// flush only if something is left to post.
    fn queue(&mut self, link: LinkId, unit: OutUnit) -> Result<(), TransportError> {
        let l = self
            .links
            .get_mut(&link)
            .ok_or(TransportError::NoSuchLink(link.0))?;
        l.outbox.push(unit);
        if l.outbox.len() == 1 {
            self.flush_now(link);
        }
        if self.links.get(&link).is_some_and(RdmLink::has_output) {
            self.dirty.push(link);
        }
        Ok(())
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
        self.cq_wait.disarm(&self.registry);
        // Before the Net (declared after the ports, dropped after them).
        self.reg_cache.clear();
    }
}

impl Transport for RdmTransport {
    fn kind(&self) -> TransportKind {
        self.kind.clone()
    }

    fn listen(&mut self, addr: &EntityAddr, token: Token) -> Result<EntityAddr, TransportError> {
        let (bind, reservation) = if self.net.socket_names() {
            (addr.socket, None)
        } else {
            // A name-only provider: a TCP port of our own makes the name unique.
            let r = TcpListener::bind(addr.socket)
                .map_err(|e| TransportError::io("reserve the port of an RDM name", e))?;
            let a = r
                .local_addr()
                .map_err(|e| TransportError::io("reserved port", e))?;
            if self.net.never_closes() {
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
        if let Some(p) = self.ports[pidx].as_mut() {
            p.listener = Some((token, SocketAddr::new(bind.ip(), port_no)));
        }
        Ok(addr.clone().with_port(port_no))
    }

    fn unlisten(&mut self, token: Token) {
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
            p.listener = None;
            if p.links == 0 {
                self.retire(pidx);
            }
        }
    }

    fn connect(&mut self, link: LinkId, addr: &EntityAddr) -> Result<(), TransportError> {
        let name = self
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
        if let Err(e) = port.reserve(pidx, LINK_BLOCK) {
            port.release_peer(peer, true);
            return Err(TransportError::io(
                "RDM receive pool",
                std::io::Error::other(e.to_string()),
            ));
        }
        let mut l = RdmLink::new(pidx, peer, None);
        l.need_hello = true;
        self.links.insert(link, l);
        self.dirty.push(link);
        Ok(())
    }

    fn send(&mut self, link: LinkId, unit: Transmit) -> Result<(), TransportError> {
        let unit = match unit {
            Transmit::Banner(b) => OutUnit::Flat(b.to_vec()),
            unit => {
                let Some(f) = self.post_small(link, unit)? else {
                    return Ok(());
                };
                let in_place = self.net.rma().is_some();
                // Looked up for rendezvous units only: not per small message.
                let late = f.encoded_len() > rendezvous::RNDV_THRESHOLD
                    && self.links.get(&link).is_some_and(|l| l.peer_late);
                rendezvous::encode_unit(f, in_place, late, &mut self.tx_arena)?
            }
        };
        self.queue(link, unit)
    }

    fn flush(&mut self, now: Instant, events: &mut Vec<TransportEvent>) {
        self.now = now;
        self.repost_handled();
        self.flush_dirty(events);
    }

    fn ready(&mut self, _event: &Event, now: Instant, events: &mut Vec<TransportEvent>) {
        self.poll_all(now, events);
    }

    fn progress(&mut self, now: Instant, events: &mut Vec<TransportEvent>) -> bool {
        self.poll_all(now, events)
    }

    /// The CQ's wait fds into the Poll and `fi_trywait` on the CQ. A CQ
    /// without a wait object (shm) cannot be armed: the worker blocks until
    /// [`Transport::wake_at`] and polls it then.
    fn arm(&mut self) -> bool {
        if self.net.cq_polled() {
            return true;
        }
        self.cq_wait.arm(&self.registry, &mut self.net);
        self.net.try_wait()
    }

    /// Not where the CQ has no wait object (`shm`, `fabric_cq_wait = poll`)
    /// or its wait fd could not be registered.
    fn wakes_the_worker(&self) -> bool {
        !(self.net.cq_polled() || self.cq_wait.failed())
    }

    fn wake_at(&self) -> Option<Instant> {
        if self.ports.iter().all(Option::is_none) {
            return None;
        }
        let poll = if self.net.cq_polled() || self.cq_wait.failed() {
            // No wait fd: while a link is moving data (output queued or in
            // flight, a unit half received) and heard from its peer lately,
            // poll again at once — a 1 MiB unit in 4 KiB pieces otherwise
            // waited POLL_INTERVAL per credit round trip (29 ms one-way).
            // Idle, or waiting on a silent peer: every POLL_INTERVAL.
            let now = Instant::now();
            let moving = self.links.values().any(|l| {
                (!l.idle() || !l.reasm.is_idle())
                    && now.saturating_duration_since(l.last_heard) < MOVING_WINDOW
            });
            Some(if moving { now } else { now + POLL_INTERVAL })
        } else {
            None
        };
        let keep = (!self.links.is_empty()).then_some(self.next_housekeeping);
        [poll, keep, self.retry_at].into_iter().flatten().min()
    }

    fn close(&mut self, link: LinkId, flush: bool) {
        let Some(l) = self.links.get_mut(&link) else {
            return;
        };
        if flush && l.remote.is_some() && !l.frozen && !l.idle() {
            l.close_after_flush = true;
            self.dirty.push(link);
        } else {
            self.drop_link(link);
        }
    }

    fn pause_reading(&mut self, link: LinkId, paused: bool) {
        if let Some(l) = self.links.get_mut(&link) {
            if l.frozen {
                return;
            }
            l.paused = paused;
            if !paused && !l.held.is_empty() {
                self.resumed.push(link);
            }
        }
    }

    fn backlog(&self, link: LinkId) -> usize {
        self.links.get(&link).map_or(0, |l| l.outbox.backlog())
    }

    fn owns(&self, token: Token) -> bool {
        token == self.cq_wait.token()
            || self
                .ports
                .iter()
                .flatten()
                .any(|p| p.listener.map(|l| l.0) == Some(token))
    }

    /// Links closed with `flush` whose last sends are in flight are not
    /// counted (see the MSG backend).
    /// `progress` reads the CQ itself.
    fn ready_every_pass(&self) -> bool {
        false
    }

    fn link_count(&self) -> usize {
        self.links.values().filter(|l| !l.close_after_flush).count()
    }

    fn inject(&mut self, link: LinkId, fault: RealFault) -> Result<(), TransportError> {
        let l = self
            .links
            .get_mut(&link)
            .ok_or(TransportError::NoSuchLink(link.0))?;
        match fault {
            RealFault::Abort => {
                // The peer hears CLOSE at once (an RDM endpoint has no
                // connection to reset); nothing queued is sent.
                self.drop_link(link);
                let why = "injected abortive close (link dropped)".into();
                self.deferred_events.push(TransportEvent::Failed(link, why));
            }
            RealFault::HalfClose => return Err(no_half_close(&self.kind)),
            RealFault::StopReading => l.paused = true,
            RealFault::Freeze => l.frozen = true,
        }
        Ok(())
    }

    /// As on both endpoint types (`simulate_fault`).
    fn simulate(&mut self, link: LinkId, fault: SimulatedFault) -> Result<(), TransportError> {
        let receiving = self.links.get_mut(&link).map(|l| &mut l.receiving);
        let (rndv, kind) = (self.rndv, &self.kind);
        simulate_fault(
            receiving,
            link,
            fault,
            rndv.is_some(),
            kind,
            &mut self.queue_failures,
        )
    }

    fn send_corrupted(
        &mut self,
        link: LinkId,
        unit: Transmit,
        bit: u64,
    ) -> Result<(), TransportError> {
        let bytes = crate::wire::corrupted(unit, bit)?;
        self.queue(link, OutUnit::Flat(bytes))
    }

    fn detach(&mut self, _link: LinkId) -> Option<DetachedLink> {
        None
    }

    fn stats(&self) -> TransportStats {
        let mut values = self
            .rndv_counters
            .values(self.rndv.is_some(), self.net.rma_in_use());
        values.push(("out_port_replacements", self.out_port_replacements));
        values.extend(self.queue_failures.values());
        values.extend(self.reg_cache.values());
        TransportStats {
            kind: self.kind.clone(),
            values,
        }
    }

    fn attach(&mut self, link: LinkId, detached: DetachedLink) -> Result<(), TransportError> {
        let _ = (link, detached);
        Err(no_migration(&self.kind))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::tests::{
        accepted, drive, in_order, progress_until_events, send_small_frames,
        staged_descriptor_goes_when_a_slot_frees, stat,
    };
    use crate::FabricRendezvous;
    use bytes::Bytes;
    use msgr_addr::FabricEndpoint;
    use msgr_proto::banner::BANNER_LEN;
    use msgr_proto::{Frame, Inbound};

    /// Pieces that overtook earlier ones wait in the ring and come out in
    /// order, across the ring's wrap, each once.
    #[test]
    fn held_pieces_come_out_in_order() {
        let mut held = HeldPieces::default();
        let mut next = 0u64;
        let mut out = Vec::new();
        // Windows of CREDITS pieces, each arriving last-to-first.
        for window in 0..3u64 {
            let base = window * u64::from(CREDITS);
            for seq in (base..base + u64::from(CREDITS)).rev() {
                assert!(!held.contains(seq));
                held.insert(seq, (seq as usize, 1));
                assert!(held.contains(seq));
                while let Some((slot, _)) = held.take(next) {
                    out.push(slot as u64);
                    next += 1;
                }
            }
            assert!(held.is_empty());
        }
        assert_eq!(out, (0..3 * u64::from(CREDITS)).collect::<Vec<_>>());
        held.insert(next + 2, (7, 1));
        held.insert(next + 5, (9, 1));
        let mut drained: Vec<_> = held.drain().collect();
        drained.sort_unstable();
        assert_eq!(drained, vec![(7, 1), (9, 1)]);
        assert!(held.is_empty());
    }

    /// With the rendezvous reads even where `Auto` withholds them
    /// ([`msgr_fabric::rma_withheld`]): no test here closes an endpoint
    /// while a read's response is arriving.
    fn open(provider: &str, poll: &mio::Poll) -> RdmTransport {
        open_with(provider, poll, FabricRendezvous::On)
    }

    fn open_with(provider: &str, poll: &mio::Poll, rendezvous: FabricRendezvous) -> RdmTransport {
        let mut ctx = TransportContext::new(FrameLimits::default());
        ctx.rdma.fabric_rendezvous = rendezvous;
        let p = FabricProvider::new(provider).with_endpoint(FabricEndpoint::Rdm);
        RdmTransport::new(&p, poll.registry(), &ctx).unwrap()
    }

    /// Over `tcp;ofi_rxm`, where this libfabric's reads have the known bug,
    /// `auto` keeps messages sent within ofi_rxm's eager limit (its own
    /// rendezvous reads with them) and receives whole slots; `on` sends
    /// whole slots. The same when RDM is asked of `tcp` by the core's name
    /// (`fabric+tcp?ep=rdm`, which opens `tcp;ofi_rxm`): deciding by the
    /// name asked for once let 64 KiB messages take ofi_rxm's reads there,
    /// and the stress suite crashed closing endpoints.
    #[test]
    fn tcp_rxm_messages_stay_eager_where_reads_are_withheld() {
        let poll = mio::Poll::new().unwrap();
        let withheld = msgr_fabric::rma_withheld("tcp;ofi_rxm").is_some();
        for name in ["tcp;ofi_rxm", "tcp"] {
            let auto = open_with(name, &poll, FabricRendezvous::Auto);
            assert_eq!(auto.net.provider_name(), "tcp;ofi_rxm");
            let want = if withheld { 16 << 10 } else { SLOT_SIZE };
            assert_eq!(
                (auto.send_limit, auto.slot_size),
                (want, SLOT_SIZE),
                "{name}: withheld: {withheld}"
            );
            // Where the reads are withheld, the writes stand in (`tcp`
            // checks keys).
            let op = if withheld { RmaOp::Write } else { RmaOp::Read };
            assert_eq!(auto.rndv, Some(op), "{name}");
            let on = open_with(name, &poll, FabricRendezvous::On);
            let want = (SLOT_SIZE, Some(RmaOp::Read));
            assert_eq!((on.send_limit, on.rndv), want, "{name}");
        }
    }

    /// Over `tcp;ofi_rxm` (keys checked) a payload sent again keeps its
    /// registration; over `shm` (keys not checked: every exposure has its
    /// own check word) nothing is kept.
    #[test]
    fn a_payload_sent_again_is_registered_once() {
        let mut poll = mio::Poll::new().unwrap();
        for (provider, kept) in [("tcp;ofi_rxm", true), ("shm", false)] {
            let t = open(provider, &poll);
            assert_eq!(t.rndv, Some(RmaOp::Read), "{provider}");
            crate::fabric::tests::a_payload_sent_again_is_registered_once(
                t,
                &mut poll,
                &format!("fabric+{provider}://127.0.0.1:0?ep=rdm"),
                kept,
            );
        }
    }

    /// HELLO and WELCOME carry whether their end reads rendezvous units
    /// (see the MSG test this runs).
    fn large_units_to_a_peer_that_does_not_read(provider: &str, in_place: bool) {
        let poll = mio::Poll::new().unwrap();
        crate::fabric::tests::large_units_to_a_peer_that_does_not_read(
            |r| open_with(provider, &poll, r),
            &format!("fabric+{provider}://127.0.0.1:0?ep=rdm"),
            in_place,
        );
    }

    /// Over `tcp;ofi_rxm` too (`shm` has no wait fd).
    #[test]
    fn tcp_rxm_cq_fd_is_in_the_poll_only_while_the_worker_sleeps() {
        crate::fabric::tests::cq_fd_in_the_poll_only_while_asleep(
            |poll| open("tcp;ofi_rxm", poll),
            |t| t.cq_wait.token(),
            "fabric+tcp;ofi_rxm://127.0.0.1:0?ep=rdm",
        );
    }

    #[test]
    fn tcp_rxm_large_units_to_a_peer_that_does_not_read_go_through_the_slots() {
        large_units_to_a_peer_that_does_not_read("tcp;ofi_rxm", true);
    }

    #[test]
    fn shm_large_units_to_a_peer_that_does_not_read_go_through_the_slots() {
        large_units_to_a_peer_that_does_not_read("shm", false);
    }

    /// A transport listening on a loopback port of `provider` with link 1000
    /// dialled to itself and its HELLO flushed; the listener's address.
    fn listening_and_dialled(provider: &str) -> (mio::Poll, RdmTransport, EntityAddr) {
        let poll = mio::Poll::new().unwrap();
        let mut t = open(provider, &poll);
        let any: EntityAddr = format!("fabric+{provider}://127.0.0.1:0?ep=rdm")
            .parse()
            .unwrap();
        let bound = t.listen(&any, Token(crate::LISTENER_TOKEN_BASE)).unwrap();
        t.connect(LinkId(1000), &bound).unwrap();
        t.flush(Instant::now(), &mut Vec::new());
        (poll, t, bound)
    }

    #[test]
    fn header_and_context_round_trip() {
        let mut buf = [0u8; HEADER_LEN];
        let d = Dest {
            link: (1 << 40) - 3,
            cookie: 0xdead_beef,
        };
        write_header(&mut buf, DATA_LAST, 513, d, u64::MAX - 1);
        let h = read_header(&buf).unwrap();
        assert_eq!(
            (h.kind, h.credits, h.dest, h.seq),
            (DATA_LAST, 513, d, u64::MAX - 1)
        );
        assert!(read_header(&buf[..HEADER_LEN - 1]).is_none());
        assert_eq!(decode_context(context(3, true, 77)), (3, true, 77));
        assert_eq!(decode_context(context(0, false, 0)), (0, false, 0));
    }

    /// One link over a real provider: handshake, units far beyond one
    /// link's credits arrive whole and in order (credits come back), then an
    /// abort is reported on both ends and nothing is left.
    fn link_units_and_abort(provider: &str) {
        let (mut poll, mut t, bound) = listening_and_dialled(provider);
        assert_ne!(bound.socket.port(), 0);
        let events = drive(&mut t, &mut poll, |e| e.len() >= 2);
        let server =
            accepted(&events).unwrap_or_else(|| panic!("{provider}: no Accepted in {events:?}"));
        assert!(events
            .iter()
            .any(|e| matches!(e, TransportEvent::Connected(LinkId(1000)))));
        // A hung read needs a read to hang: refused without rendezvous.
        match t.simulate(server, SimulatedFault::HungRead) {
            Ok(()) => assert!(
                t.rndv.is_some(),
                "{provider}: hung read accepted without rendezvous"
            ),
            Err(TransportError::Unavailable { reason, .. }) => {
                assert!(
                    t.rndv.is_none() && reason.contains("rendezvous"),
                    "{provider}: {reason}"
                );
            }
            Err(e) => panic!("{provider}: {e}"),
        }
        // Undone where accepted, so every unit below is read.
        if let Some(l) = t.links.get_mut(&server) {
            l.receiving.reads_to_hang = 0;
        }
        t.send(LinkId(1000), Transmit::Banner([7; BANNER_LEN]))
            .unwrap();
        // 6 units of 5 pieces each: 30 messages, twice a link's credits.
        let frames: Vec<Frame> = (0..6u8)
            .map(|i| {
                Frame::new(
                    msgr_proto::Tag::Message,
                    vec![
                        Bytes::from_static(b"header"),
                        Bytes::new(),
                        Bytes::from(vec![i; 300_000]),
                    ],
                )
            })
            .collect();
        for f in &frames {
            t.send(LinkId(1000), Transmit::Frame(f.clone())).unwrap();
        }
        t.flush(Instant::now(), &mut Vec::new());
        let events = drive(&mut t, &mut poll, |e| e.len() > frames.len());
        assert!(
            matches!(&events[0], TransportEvent::Received(l, Inbound::Banner(b)) if *l == server && b[0] == 7),
            "{events:?}"
        );
        for (f, e) in frames.iter().zip(&events[1..]) {
            match e {
                TransportEvent::Received(l, Inbound::Frame(got)) => {
                    assert_eq!(*l, server);
                    assert_eq!(got.encode_to_vec().unwrap(), f.encode_to_vec().unwrap());
                }
                other => panic!("{other:?}"),
            }
        }
        // Every frame is above the threshold: fetched by fi_read (both
        // providers have RMA).
        assert!(t.rndv.is_some(), "{provider}: rendezvous enabled");
        let expect = frames.len() as u64;
        assert_eq!(t.rndv_counters.read, expect, "{provider}: rendezvous reads");
        assert_eq!(t.rndv_counters.sent, expect, "{provider}: rendezvous sent");
        assert_eq!(
            t.rndv_counters.late_epilogues, expect,
            "{provider}: epilogues after their descriptors"
        );
        t.inject(LinkId(1000), RealFault::Abort).unwrap();
        let events = drive(&mut t, &mut poll, |e| e.len() >= 2);
        for id in [server, LinkId(1000)] {
            assert!(
                events
                    .iter()
                    .any(|e| matches!(e, TransportEvent::Failed(l, _) if *l == id)),
                "{id:?} {events:?}"
            );
        }
        assert_eq!(t.link_count(), 0);
    }

    /// A unit sent to a link with nothing queued is posted by `send` itself,
    /// units sent behind queued ones wait their turn (three links' worth of
    /// credits without a poll in between: all arrive, in order), and a
    /// received piece's slot is posted again and its credit owed only by
    /// the flush after it.
    fn units_leave_from_send(provider: &str) {
        let (mut poll, mut t, _) = listening_and_dialled(provider);
        let events = drive(&mut t, &mut poll, |e| e.len() >= 2);
        let server =
            accepted(&events).unwrap_or_else(|| panic!("{provider}: no Accepted in {events:?}"));
        t.send(LinkId(1000), Transmit::Banner([7; BANNER_LEN]))
            .unwrap();
        assert!(
            t.links[&LinkId(1000)].outbox.is_empty(),
            "{provider}: not posted by send"
        );
        let n = 3 * CREDITS as usize;
        send_small_frames(&mut t, LinkId(1000), n);
        assert!(
            !t.links[&LinkId(1000)].outbox.is_empty(),
            "{provider}: beyond the credits, queued"
        );
        // The first pieces' slots are not posted again, nor their credits
        // owed, before a flush; without that, the units beyond the credits
        // would never come.
        let owed = t.links[&server].to_return;
        let mut events = progress_until_events(&mut t);
        let l = t
            .links
            .get(&server)
            .unwrap_or_else(|| panic!("{provider}: {events:?}"));
        assert_eq!(l.to_return, owed, "{provider}");
        assert_eq!(t.handled.len(), events.len(), "{provider}: {events:?}");
        t.flush(Instant::now(), &mut Vec::new());
        assert!(t.handled.is_empty());
        let got = events.len();
        events.extend(drive(&mut t, &mut poll, |e| got + e.len() > n));
        in_order(&events, server, n);
    }

    /// See [`staged_descriptor_goes_when_a_slot_frees`]: here the banner
    /// and the small frames take every credit of the link.
    fn staged_descriptor_goes_when_credits_return(provider: &str) {
        let (mut poll, mut t, _) = listening_and_dialled(provider);
        let events = drive(&mut t, &mut poll, |e| e.len() >= 2);
        let server =
            accepted(&events).unwrap_or_else(|| panic!("{provider}: no Accepted in {events:?}"));
        staged_descriptor_goes_when_a_slot_frees(
            &mut t,
            &mut poll,
            (LinkId(1000), server),
            CREDITS as usize - 1,
            |t| {
                let l = &t.links[&LinkId(1000)];
                l.credits == 0 && l.outbox.is_empty() && l.exposures.owes_posts()
            },
        );
    }

    #[test]
    fn shm_staged_descriptor_goes_when_credits_return() {
        staged_descriptor_goes_when_credits_return("shm");
    }

    #[test]
    fn tcp_rxm_staged_descriptor_goes_when_credits_return() {
        staged_descriptor_goes_when_credits_return("tcp;ofi_rxm");
    }

    #[test]
    fn shm_units_leave_from_send() {
        units_leave_from_send("shm");
    }

    #[test]
    fn tcp_rxm_units_leave_from_send() {
        units_leave_from_send("tcp;ofi_rxm");
    }

    /// An endpoint that keeps more than [`ABANDONED_MAX`] bytes of grants
    /// given up by links that went takes no more writes: a new link hears
    /// so at set-up, and its large units go eagerly, both ways, intact.
    #[test]
    fn tcp_rxm_abandoned_grants_stop_the_writes() {
        let poll = mio::Poll::new().unwrap();
        let mut t = open_with("tcp", &poll, FabricRendezvous::Write);
        assert_eq!(t.rndv, Some(RmaOp::Write));
        let any: EntityAddr = "fabric+tcp://127.0.0.1:0?ep=rdm".parse().unwrap();
        let bound = t.listen(&any, Token(crate::LISTENER_TOKEN_BASE)).unwrap();
        // The listener's endpoint gives up a grant as large as the bound
        // (zeroed memory: not touched until written).
        let port = t
            .ports
            .iter_mut()
            .flatten()
            .next()
            .expect("the listener's endpoint");
        let offered = msgr_fabric::Exposed {
            id: 0,
            addr: 0,
            len: ABANDONED_MAX as u64,
            key: 0,
            check: 0,
            word: None,
            write: true,
        };
        port.ep.rma().grant(&offered, 1, &[], 0).unwrap();
        port.ep.rma().abandon(1);
        assert!(port.ep.rma().abandoned_bytes() >= ABANDONED_MAX);
        t.connect(LinkId(1000), &bound).unwrap();
        t.flush(Instant::now(), &mut Vec::new());
        let mut poll = poll;
        let events = drive(&mut t, &mut poll, |e| e.len() >= 2);
        let server = accepted(&events).unwrap_or_else(|| panic!("no Accepted in {events:?}"));
        let big = Frame::new(
            msgr_proto::Tag::Message,
            vec![
                Bytes::from_static(b"header"),
                Bytes::from(vec![3u8; 300_000]),
            ],
        );
        // A link's first unit is its banner.
        for from in [LinkId(1000), server] {
            t.send(from, Transmit::Banner([7; BANNER_LEN])).unwrap();
            t.send(from, Transmit::Frame(big.clone())).unwrap();
        }
        t.flush(Instant::now(), &mut Vec::new());
        let events = drive(&mut t, &mut poll, |e| e.len() >= 4);
        for to in [server, LinkId(1000)] {
            let got = events.iter().find_map(|e| match e {
                TransportEvent::Received(l, Inbound::Frame(f)) if *l == to => Some(f),
                _ => None,
            });
            let got = got.unwrap_or_else(|| panic!("nothing for {to:?}: {events:?}"));
            assert_eq!(got.encode_to_vec().unwrap(), big.encode_to_vec().unwrap());
        }
        assert_eq!(
            (t.rndv_counters.sent, t.rndv_counters.writes),
            (0, 0),
            "no unit offered by rendezvous"
        );
    }

    #[test]
    fn tcp_rxm_link_units_and_abort() {
        link_units_and_abort("tcp");
    }

    #[test]
    fn shm_link_units_and_abort() {
        link_units_and_abort("shm");
    }

    /// An established link whose peer stops answering (frozen: no data, no
    /// keepalives, as a hung or vanished process) fails within the link
    /// deadline, not earlier than it and not never.
    fn silent_peer_fails_by_the_deadline(provider: &str) {
        let (mut poll, mut t, _) = listening_and_dialled(provider);
        let events = drive(&mut t, &mut poll, |e| e.len() >= 2);
        let server =
            accepted(&events).unwrap_or_else(|| panic!("{provider}: no Accepted in {events:?}"));
        t.inject(LinkId(1000), RealFault::Freeze).unwrap();
        let frozen_at = Instant::now();
        let events = drive(&mut t, &mut poll, |e| {
            e.iter()
                .any(|e| matches!(e, TransportEvent::Failed(l, _) if *l == server))
        });
        let took = frozen_at.elapsed();
        println!("{provider}: silent peer failed after {took:?}: {events:?}");
        assert!(
            took >= LINK_DEADLINE - KEEP_AFTER,
            "{provider}: failed too early ({took:?})"
        );
        assert!(
            took <= LINK_DEADLINE + KEEP_AFTER + HOUSEKEEPING,
            "{provider}: failed too late ({took:?})"
        );
    }

    #[test]
    fn tcp_rxm_silent_peer_fails_by_the_deadline() {
        silent_peer_fails_by_the_deadline("tcp");
    }

    #[test]
    fn shm_silent_peer_fails_by_the_deadline() {
        silent_peer_fails_by_the_deadline("shm");
    }

    /// Nobody at the address: the connect fails (at once or as an event
    /// within the link deadline), never hangs.
    fn connect_to_nobody_fails(provider: &str) {
        let mut poll = mio::Poll::new().unwrap();
        let mut t = open(provider, &poll);
        // A port just released: nothing listens there.
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dead: EntityAddr = format!("fabric+{provider}://127.0.0.1:{port}?ep=rdm")
            .parse()
            .unwrap();
        if let Err(e) = t.connect(LinkId(1000), &dead) {
            println!("{provider}: connect refused at once: {e}");
            return;
        }
        t.flush(Instant::now(), &mut Vec::new());
        let events = drive(&mut t, &mut poll, |e| !e.is_empty());
        assert!(
            matches!(&events[0], TransportEvent::Failed(LinkId(1000), _)),
            "{events:?}"
        );
        println!("{provider}: {events:?}");
        assert_eq!(t.link_count(), 0);
    }

    /// A HELLO the provider refuses until the link deadline moves later
    /// connects to a new outgoing endpoint, while the old endpoint's other
    /// links go on. SIMULATED trigger: the refusal is `ofi_rxm`'s wedged
    /// connection to a restarted name, which the stress suite meets only
    /// now and then, so the link is made to look as if its HELLO waited
    /// past the deadline (its clock set back before the first flush).
    fn refused_hello_moves_connects_to_a_new_endpoint(provider: &str) {
        let (mut poll, mut t, bound) = listening_and_dialled(provider);
        drive(&mut t, &mut poll, |e| {
            e.iter()
                .any(|e| matches!(e, TransportEvent::Connected(LinkId(1000))))
        });
        let first = t.links[&LinkId(1000)].port;
        t.connect(LinkId(1001), &bound).unwrap();
        let now = Instant::now();
        let stale = t.links.get_mut(&LinkId(1001)).unwrap();
        assert_eq!(stale.port, first, "{provider}: connects share one endpoint");
        stale.last_heard = now - LINK_DEADLINE - HOUSEKEEPING;
        t.next_housekeeping = now;
        let mut events = Vec::new();
        t.progress(now, &mut events);
        assert!(
            events.iter().any(
                |e| matches!(e, TransportEvent::Failed(LinkId(1001), why) if why.contains(REFUSED_HELLO))
            ),
            "{provider}: {events:?}"
        );
        assert_eq!(stat(&t, "out_port_replacements"), 1);
        t.connect(LinkId(1002), &bound).unwrap();
        t.flush(Instant::now(), &mut Vec::new());
        drive(&mut t, &mut poll, |e| {
            e.iter()
                .any(|e| matches!(e, TransportEvent::Connected(LinkId(1002))))
        });
        assert_ne!(
            t.links[&LinkId(1002)].port,
            first,
            "{provider}: a new endpoint"
        );
        // The old endpoint's link still carries units.
        t.send(LinkId(1000), Transmit::Banner([9; BANNER_LEN]))
            .unwrap();
        t.flush(Instant::now(), &mut Vec::new());
        let events = drive(&mut t, &mut poll, |e| {
            e.iter().any(|e| matches!(e, TransportEvent::Received(..)))
        });
        assert!(
            !events
                .iter()
                .any(|e| matches!(e, TransportEvent::Failed(..))),
            "{provider}: {events:?}"
        );
    }

    #[test]
    fn tcp_rxm_refused_hello_moves_connects_to_a_new_endpoint() {
        refused_hello_moves_connects_to_a_new_endpoint("tcp");
    }

    #[test]
    fn shm_refused_hello_moves_connects_to_a_new_endpoint() {
        refused_hello_moves_connects_to_a_new_endpoint("shm");
    }

    #[test]
    fn tcp_rxm_connect_to_nobody_fails() {
        connect_to_nobody_fails("tcp");
    }

    #[test]
    fn shm_connect_to_nobody_fails() {
        connect_to_nobody_fails("shm");
    }
}
