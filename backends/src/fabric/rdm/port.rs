//! [`Port`]: an RDM endpoint its links share, with its address-vector [`Peer`]s.

use super::super::user_rma::{UserExposures, UserReads};
use std::collections::VecDeque;
use std::net::{SocketAddr, TcpListener};
use std::time::Instant;

use bytes::Bytes;
use mio::Token;
use msgr_fabric::{Exposed, FabricError, Landing, PeerAddr, RdmEp, RmaBuffers, SendSlots};
use msgr_proto::LinkId;
use rustc_hash::FxHashMap;

use super::context::context;
use super::wire::{write_header, Dest, CHALLENGE, HEADER_LEN};
use super::CLOSE_GIVE_UP;
use crate::fabric::rendezvous::{PeerRma, Posted};

/// Control messages a port queues at most: past it, a challenge that finds
/// no free slot is dropped (its connector tries again after its deadline).
const MAX_QUEUED_CONTROL: usize = 1024;

/// A peer in a port's address vector, shared by its links.
#[derive(Debug)]
pub(super) struct Peer {
    name: Vec<u8>,
    pub(super) addr: PeerAddr,
    /// Links (and queued CLOSE messages) that use it.
    users: usize,
    /// Sends to it not yet completed.
    inflight: usize,
    /// It stopped answering or its sends failed: remove it from the address
    /// vector once nothing uses it, so a restarted peer of the same name is
    /// mapped afresh.
    pub(super) dead: bool,
}

/// One RDM endpoint: the outgoing one, or a listener's.
pub(super) struct Port {
    pub(super) ep: RdmEp,
    pub(super) listener: Option<(Token, SocketAddr)>,
    /// Keeps a name-only address (shm) unique on this host.
    _reservation: Option<TcpListener>,
    /// The address vector's peers its links use.
    pub(super) peers: Peers,
    /// Transmit slots: which are free, and what each in flight carries.
    pub(super) tx: TxSlots,
    /// Control messages waiting for a transmit slot: (peer, the peer's end
    /// of the link, kind — `CLOSE` or `CHALLENGE` —, the header's last field,
    /// when it was queued). Each holds a use of its peer until sent.
    pub(super) closes: VecDeque<(usize, Dest, u8, u64, Instant)>,
    /// Receive slots promised to links (plus one block for HELLOs).
    pub(super) reserved: usize,
    /// Links on this endpoint.
    pub(super) links: usize,
    /// fi_reads and fi_writes in flight: context -> link.
    pub(super) reads: FxHashMap<u64, LinkId>,
    /// Applications' regions this endpoint has open to peers' reads, and
    /// applications' reads of peers' regions in flight on it
    /// ([`super::super::user_rma`]).
    pub(super) user: UserExposures,
    pub(super) user_reads: UserReads,
    /// Numbers the next read, grant or write (see [`read_context`](super::context::read_context)).
    pub(super) next_read: u32,
    /// Bytes per message sent, header included (at most the slot size:
    /// see [`RdmTransport::new`](super::RdmTransport::new)).
    pub(super) send_limit: usize,
}

/// A port's peers by index (a link's `peer`), and the index of each name.
#[derive(Debug, Default)]
pub(super) struct Peers {
    list: Vec<Option<Peer>>,
    ids: FxHashMap<Vec<u8>, usize>,
}

impl Peers {
    pub(super) fn get(&self, i: usize) -> Option<&Peer> {
        self.list.get(i).and_then(Option::as_ref)
    }

    pub(super) fn get_mut(&mut self, i: usize) -> Option<&mut Peer> {
        self.list.get_mut(i).and_then(Option::as_mut)
    }

    /// The peer named `name`, with one more use; inserted into `ep`'s
    /// address vector on first use.
    fn use_named(&mut self, ep: &mut RdmEp, name: &[u8]) -> Result<usize, FabricError> {
        if let Some(&i) = self.ids.get(name) {
            if let Some(p) = self.list[i].as_mut() {
                p.users += 1;
            }
            return Ok(i);
        }
        let addr = ep.insert(name)?;
        let peer = Peer {
            name: name.to_vec(),
            addr,
            users: 1,
            inflight: 0,
            dead: false,
        };
        let i = match self.list.iter().position(Option::is_none) {
            Some(i) => {
                self.list[i] = Some(peer);
                i
            }
            None => {
                self.list.push(Some(peer));
                self.list.len() - 1
            }
        };
        self.ids.insert(name.to_vec(), i);
        Ok(i)
    }

    /// See [`Port::release_peer`].
    fn release(&mut self, ep: &mut RdmEp, i: usize, user: bool) {
        let Some(p) = self.list.get_mut(i).and_then(Option::as_mut) else {
            return;
        };
        if user {
            p.users = p.users.saturating_sub(1);
        } else {
            p.inflight = p.inflight.saturating_sub(1);
        }
        if p.dead && p.users == 0 && p.inflight == 0 {
            let addr = p.addr;
            self.ids.remove(&p.name);
            self.list[i] = None;
            if let Err(e) = ep.remove(addr) {
                // Harmless: the entry stays until the endpoint closes.
                tracing::debug!(error = %e, "libfabric RDM: peer address not removed");
            }
        }
    }
}

/// A port's transmit slots.
#[derive(Debug)]
pub(super) struct TxSlots {
    /// Free slots, the next one to use last.
    pub(super) free: Vec<usize>,
    /// Per slot: the link it carries (None: a CLOSE) and the peer.
    pub(super) carrying: Vec<Option<(Option<LinkId>, usize)>>,
    /// Contexts of sends that went by `fi_inject`: done when posted, they
    /// complete through the same path as the provider's completions, at
    /// the next CQ poll (their slots stay taken until then).
    pub(super) injected: Vec<u64>,
}

impl TxSlots {
    fn new(slots: usize) -> Self {
        TxSlots {
            free: (0..slots).rev().collect(),
            carrying: vec![None; slots],
            injected: Vec::new(),
        }
    }

    /// Slot `slot` was posted carrying `link` to `peer`.
    fn taken(&mut self, slot: usize, link: Option<LinkId>, peer: usize) {
        self.free.pop();
        self.carrying[slot] = Some((link, peer));
    }

    /// Slot `slot` completed: free again; what it carried.
    pub(super) fn done(&mut self, slot: usize) -> Option<(Option<LinkId>, usize)> {
        self.free.push(slot);
        self.carrying.get_mut(slot).and_then(Option::take)
    }
}

impl Port {
    pub(super) fn new(
        ep: RdmEp,
        listener: Option<(Token, SocketAddr)>,
        res: Option<TcpListener>,
        send_limit: usize,
    ) -> Self {
        let tx = TxSlots::new(ep.tx_slots());
        Port {
            send_limit: send_limit.min(ep.slot_size()),
            reserved: ep.rx_slots(),
            ep,
            listener,
            _reservation: res,
            peers: Peers::default(),
            tx,
            closes: VecDeque::new(),
            links: 0,
            reads: FxHashMap::default(),
            user: UserExposures::default(),
            user_reads: UserReads::default(),
            next_read: 0,
        }
    }

    /// The peer named `name`, inserted into the address vector on first use.
    pub(super) fn peer(&mut self, name: &[u8]) -> Result<usize, FabricError> {
        self.peers.use_named(&mut self.ep, name)
    }

    /// Sends `CHALLENGE` with `token` to link `to` of the endpoint named
    /// `name` (a HELLO claimed it), best effort: no free slot or a name
    /// that cannot be used, and the connector's next HELLO or its deadline
    /// decides. Where the provider allows (`removable`), a name only the
    /// challenge used leaves the address vector once it is sent, so forged
    /// names do not pile up in it.
    pub(super) fn challenge(
        &mut self,
        pidx: usize,
        name: &[u8],
        to: Dest,
        token: u64,
        removable: bool,
    ) {
        let peer = match self.peer(name) {
            Ok(p) => p,
            Err(e) => {
                tracing::debug!(error = %e, "HELLO from an unusable name dropped");
                return;
            }
        };
        if let Some(p) = self.peers.get_mut(peer) {
            p.dead |= removable && p.users == 1;
        }
        match self.post(pidx, peer, None, |buf| {
            write_header(buf, CHALLENGE, 0, to, token);
            HEADER_LEN
        }) {
            // No free slot (or -FI_EAGAIN, a busy peer): queued with the
            // CLOSEs, as a lost challenge would leave the connector waiting
            // for its deadline. Bounded: a flood's are dropped.
            Ok(false) if self.closes.len() < MAX_QUEUED_CONTROL => {
                self.closes
                    .push_back((peer, to, CHALLENGE, token, Instant::now()));
                return;
            }
            Ok(_) => {}
            Err(e) => tracing::debug!(error = %e, "CHALLENGE not sent"),
        }
        self.release_peer(peer, true);
    }

    /// Posts this port's queued CLOSE and CHALLENGE messages (port index `pidx`) while
    /// slots are free; one queued longer than [`CLOSE_GIVE_UP`], or whose
    /// post fails, is given up (the peer learns by its deadline). Returns
    /// whether none is left.
    pub(super) fn flush_closes(&mut self, pidx: usize, now: Instant) -> bool {
        while let Some(&(peer, remote, kind, last, queued)) = self.closes.front() {
            if now.saturating_duration_since(queued) <= CLOSE_GIVE_UP {
                match self.post(pidx, peer, None, |buf| {
                    write_header(buf, kind, 0, remote, last);
                    HEADER_LEN
                }) {
                    Ok(true) => {}
                    Ok(false) => return false,
                    Err(e) => tracing::debug!(error = %e, kind, "control message not sent"),
                }
            }
            self.closes.pop_front();
            self.release_peer(peer, true);
        }
        true
    }

    /// The endpoint aimed at peer `i` (for a rendezvous), if it is there
    /// (a link's peer is: the link is one of its uses).
    pub(super) fn aimed_at(&mut self, i: usize) -> Option<AimedEp<'_>> {
        let peer = self.peers.get(i)?.addr;
        Some(AimedEp {
            ep: &mut self.ep,
            peer,
        })
    }

    /// Drops a use (`user`) or an in-flight send of peer `i`; removes a dead
    /// peer from the address vector when nothing uses it any more. A live
    /// peer stays: `shm` keeps its own state of a peer that sent to us in the
    /// address vector's map, and removing it under a peer that still sends
    /// crashes the provider.
    pub(super) fn release_peer(&mut self, i: usize, user: bool) {
        self.peers.release(&mut self.ep, i, user);
    }

    /// Counts a new link on this endpoint and grows the receive pool to cover
    /// its `slots`; on failure nothing is counted (the slots already posted
    /// stay in the pool).
    pub(super) fn reserve(&mut self, port: usize, slots: usize) -> Result<(), FabricError> {
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
    pub(super) fn post(
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
    pub(super) fn post_with(
        &mut self,
        port: usize,
        peer: usize,
        link: Option<LinkId>,
        fill: impl FnOnce(&mut [u8]) -> usize,
        body: Option<Bytes>,
    ) -> Result<bool, FabricError> {
        let Some(&slot) = self.tx.free.last() else {
            return Ok(false);
        };
        let Some(p) = self.peers.get_mut(peer) else {
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
                .map(|()| self.tx.injected.push(ctx))
        } else {
            self.ep.send(slot, len, to, ctx)
        };
        match posted {
            Ok(()) => {
                self.tx.taken(slot, link, peer);
                p.inflight += 1;
                Ok(true)
            }
            Err(e) if msgr_fabric::is_again(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// A port's endpoint aimed at one of its peers ([`Port::aimed_at`]).
pub(super) struct AimedEp<'a> {
    ep: &'a mut RdmEp,
    peer: PeerAddr,
}

impl PeerRma for AimedEp<'_> {
    fn rma(&mut self) -> &mut RmaBuffers {
        self.ep.rma()
    }

    fn read(&mut self, x: &Exposed, context: u64, around: &[u8], at: usize) -> Posted {
        self.ep.read(x, self.peer, context, around, at)
    }

    fn write(&mut self, id: u32, landing: Landing, context: u64) -> Posted {
        self.ep.write(id, self.peer, landing, context)
    }
}
