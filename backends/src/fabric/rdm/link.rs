//! [`RdmLink`]: one link over a [`Port`], and its out-of-order [`HeldPieces`].

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use bytes::Bytes;
use mio::Token;
use msgr_fabric::{FabricError, PeerBell};
use msgr_proto::LinkId;

use super::port::Port;
use super::wire::{write_header, Dest, HEADER_LEN, OWED_KINDS};
use super::CREDITS;
use crate::fabric::common::LinkCommon;
use crate::fabric::queueing::QueuedLink;
use crate::fabric::rendezvous::{self, Owed};

#[derive(Debug)]
pub(in crate::fabric) struct RdmLink {
    pub(super) port: usize,
    pub(super) common: LinkCommon,
    pub(super) peer: usize,
    pub(super) cookie: u32,
    /// The peer's end; known once welcomed (connector) or from the HELLO.
    pub(super) remote: Option<Dest>,
    /// Accepted (the listener's token and the peer) or outgoing (`None`).
    pub(super) accepted: Option<(Token, SocketAddr)>,
    /// The HELLO and WELCOME still to send.
    pub(super) setup: Setup,
    /// Credits: the data pieces this end may send, and those it owes back.
    pub(super) flow: Flow,
    /// Transmit slots in flight for this link.
    pub(super) inflight: usize,
    /// Data pieces received and not yet handed up, by number: reading is
    /// paused, or they overtook earlier ones (a provider completes a small
    /// message sent after a large one first when the large one goes by its
    /// rendezvous protocol). At most the link's credits.
    pub(super) held: HeldPieces,
    /// Number of the next data piece to hand up / to send.
    pub(super) rx_seq: u64,
    tx_seq: u64,
    pub(super) last_sent: Instant,
    /// The peer's doorbell, rung after a post while the peer sleeps
    /// (`super::doorbell`); `None`: not announced or not mappable, and
    /// this end polls the link as without one.
    pub(super) peer_bell: Option<PeerBell>,
}

/// A link's set-up messages still to send.
#[derive(Debug, Default)]
pub(super) struct Setup {
    pub(super) need_hello: bool,
    /// The listener's challenge token, sent in the HELLO's `seq` (0: none
    /// yet, see `super::challenge`).
    pub(super) token: u64,
    pub(super) need_welcome: bool,
    /// Where a connecting link's HELLO goes: the listener's doorbell is
    /// rung by this address (`super::doorbell`).
    pub(super) hello_to: Option<SocketAddr>,
    /// The listener was rung for a HELLO not yet posted (`shm` refuses a
    /// first post to an endpoint until that endpoint's progress has taken
    /// the connection request the post left it): once per link.
    pub(super) rang_before_hello: bool,
}

/// A link's flow control: data pieces it may send (credits the peer
/// gave), and credits it owes the peer for pieces consumed, returned in
/// headers or a `KEEP`.
#[derive(Debug)]
pub(super) struct Flow {
    pub(super) credits: u32,
    /// Data pieces this end takes unconsumed on the link (its receive
    /// window, announced at set-up): how far ahead a piece may be.
    pub(super) window: u32,
    /// The peer's window ([`super::wire::peer_window`]): the most credits
    /// this end holds.
    pub(super) peer_window: u32,
    pub(super) to_return: u32,
    /// A `KEEP` is to be sent (a keepalive, or credits to return).
    pub(super) need_keep: bool,
}

impl Flow {
    /// Whether enough credits are owed to send them in a `KEEP` of their
    /// own: half the window, at most [`KEEP_EVERY`] (a large window's
    /// sender would otherwise wait long for its first credits back).
    fn keep_due(&self) -> bool {
        self.to_return >= (self.window / 2).clamp(1, KEEP_EVERY)
    }

    /// Credits to return in the next header (all owed, as a u16).
    fn take_credits(&mut self) -> u16 {
        let n = self.to_return.min(u32::from(u16::MAX));
        self.to_return -= n;
        n as u16
    }
}

/// A link's received data pieces not yet handed up, by number (receive
/// slot and length). A piece is less than the link's window ahead of the
/// next one handed up (the sender's credits bound it; the receiver checks),
/// so a ring of that many entries holds them: nothing is allocated per
/// piece, as an ordered map did for every message.
#[derive(Debug)]
pub(super) struct HeldPieces {
    ring: Box<[Option<(usize, usize)>]>,
    count: usize,
}

impl HeldPieces {
    /// Room for a window of `window` pieces (at least one).
    pub(super) fn new(window: u32) -> Self {
        HeldPieces {
            ring: vec![None; window.max(1) as usize].into_boxed_slice(),
            count: 0,
        }
    }

    fn at(&self, seq: u64) -> usize {
        (seq % self.ring.len() as u64) as usize
    }

    /// Whether piece `seq` (within the window) is held already.
    pub(super) fn contains(&self, seq: u64) -> bool {
        self.ring[self.at(seq)].is_some()
    }

    /// Holds piece `seq`, which must be within the window and not held.
    pub(super) fn insert(&mut self, seq: u64, piece: (usize, usize)) {
        let at = self.at(seq);
        let entry = &mut self.ring[at];
        debug_assert!(entry.is_none(), "piece {seq} held twice");
        self.count += usize::from(entry.is_none());
        *entry = Some(piece);
    }

    /// Takes piece `seq` if it is held.
    pub(super) fn take(&mut self, seq: u64) -> Option<(usize, usize)> {
        let at = self.at(seq);
        let piece = self.ring[at].take();
        self.count -= usize::from(piece.is_some());
        piece
    }

    pub(super) fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Takes every held piece.
    pub(super) fn drain(&mut self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.count = 0;
        self.ring.iter_mut().filter_map(Option::take)
    }
}

impl RdmLink {
    /// A link on port `port` to peer `peer` that takes `window` data
    /// pieces unconsumed; the peer's window is [`CREDITS`] until its HELLO
    /// or WELCOME says.
    pub(super) fn new(
        port: usize,
        peer: usize,
        accepted: Option<(Token, SocketAddr)>,
        window: u32,
    ) -> Self {
        let now = Instant::now();
        RdmLink {
            common: LinkCommon::new(now),
            port,
            peer,
            cookie: rand_cookie(),
            remote: None,
            accepted,
            setup: Setup::default(),
            flow: Flow {
                credits: 0,
                window,
                peer_window: CREDITS,
                to_return: 0,
                need_keep: false,
            },
            inflight: 0,
            held: HeldPieces::new(window),
            rx_seq: 0,
            tx_seq: 0,
            last_sent: now,
            peer_bell: None,
        }
    }

    pub(super) fn idle(&self) -> bool {
        self.common.outbox.is_empty() && self.inflight == 0 && self.common.exposures.is_idle()
    }

    /// Whether the link has something to post once a slot or credit frees:
    /// handshake, a keepalive, queued units, or control and a staged
    /// descriptor that wait outside the queue.
    pub(super) fn has_output(&self) -> bool {
        self.setup.need_hello
            || self.setup.need_welcome
            || self.flow.need_keep
            || !self.common.outbox.is_empty()
            || self.common.exposures.owes_posts()
            || self.common.receiving.owes_posts()
    }

    pub(super) fn dest(&self, id: LinkId) -> Dest {
        Dest {
            link: id.0,
            cookie: self.cookie,
        }
    }

    /// Sends a control message of `kind` with `body` to the peer's end,
    /// returning the credits owed in its header. `Ok(false)`: not sent now
    /// (see [`Port::post`]), or the peer's end is not known yet; the
    /// credits stay owed.
    pub(super) fn post_control(
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
        let credits = self.flow.take_credits();
        let sent = port.post(pidx, self.peer, Some(id), |buf| {
            write_header(buf, kind, credits, remote, 0);
            buf[HEADER_LEN..HEADER_LEN + body.len()].copy_from_slice(body);
            HEADER_LEN + body.len()
        })?;
        if sent {
            self.inflight += 1;
            self.last_sent = now;
        } else {
            self.flow.to_return += u32::from(credits);
        }
        Ok(sent)
    }

    /// Sends what the link owes its peer besides data ([`Owed`]); false
    /// if one could not go yet.
    pub(super) fn post_owed(
        &mut self,
        id: LinkId,
        pidx: usize,
        port: &mut Port,
        now: Instant,
    ) -> Result<bool, FabricError> {
        while let Some(owed) = Owed::next(&self.common.exposures, &self.common.receiving) {
            let mut body = [0u8; rendezvous::OWED_MAX];
            let n = owed.encode(&mut body);
            if !self.post_control(id, pidx, port, owed.kind(&OWED_KINDS), &body[..n], now)? {
                return Ok(false);
            }
            owed.posted(&mut self.common.exposures, &mut self.common.receiving);
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
    pub(super) fn post_data(
        &mut self,
        id: LinkId,
        (pidx, port): (usize, &mut Port),
        remote: Dest,
        kind: u8,
        fill: impl FnOnce(&mut [u8]) -> usize,
        body: Option<Bytes>,
        now: Instant,
    ) -> Result<bool, FabricError> {
        let credits = self.flow.take_credits();
        let seq = self.tx_seq;
        let header = |buf: &mut [u8]| {
            write_header(buf, kind, credits, remote, seq);
            HEADER_LEN + fill(&mut buf[HEADER_LEN..])
        };
        let sent = port.post_with(pidx, self.peer, Some(id), header, body);
        if !matches!(sent, Ok(true)) {
            self.flow.to_return += u32::from(credits);
            return sent;
        }
        self.inflight += 1;
        self.flow.credits -= 1;
        self.tx_seq += 1;
        self.last_sent = now;
        Ok(true)
    }

    /// Whether enough credits are owed to send them in a `KEEP` of their
    /// own ([`Flow::keep_due`]).
    pub(super) fn keep_due(&self) -> bool {
        self.flow.keep_due()
    }
}

impl QueuedLink for RdmLink {
    fn common(&self) -> &LinkCommon {
        &self.common
    }

    fn common_mut(&mut self) -> &mut LinkCommon {
        &mut self.common
    }

    fn has_output(&self) -> bool {
        RdmLink::has_output(self)
    }

    fn up(&self) -> bool {
        self.remote.is_some()
    }

    fn idle(&self) -> bool {
        RdmLink::idle(self)
    }

    fn holds_received(&self) -> bool {
        !self.held.is_empty()
    }
}

/// Credits owed that make a `KEEP` due at the latest ([`Flow::keep_due`]).
const KEEP_EVERY: u32 = 32;

/// A per-link random number: a message for a link id of an earlier
/// incarnation (of this process or the peer) does not match it.
fn rand_cookie() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(SEQ.fetch_add(1, Ordering::Relaxed));
    h.finish() as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pieces that overtook earlier ones wait in the ring and come out in
    /// order, across the ring's wrap, each once.
    #[test]
    fn held_pieces_come_out_in_order() {
        let mut held = HeldPieces::new(CREDITS);
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
}
