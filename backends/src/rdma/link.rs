//! One RDMA link: its RC queue pair, how it was set up (out-of-band TCP or
//! rdma_cm), credits, the send queue of unit parts, the reassembly of
//! received parts and the rendezvous buffers in both directions.

use std::collections::VecDeque;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use msgr_proto::arena::ByteArena;
use msgr_proto::Inbound;
use msgr_rdma::{MemoryRegion, QueuePair, ReadOnlyRegion};
use rustc_hash::FxHashMap;

use super::conn::Conn;
use crate::regcache::Lent;

/// Bytes of the header in front of every send.
pub(crate) const HDR: usize = 8;

/// What a send carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Banner = 0,
    Frame = 1,
    /// Credits only: consumes no credit (lands in the link's spare slot).
    Credit = 2,
    /// A frame to fetch with an RDMA read: [`ReadDesc`] follows the header.
    ReadReq = 3,
    /// The reader fetched a [`Kind::ReadReq`]'s frame: its token follows.
    ReadDone = 4,
}

impl Kind {
    /// How a unit the session sends goes: a banner as one, anything else
    /// as a frame.
    pub(crate) fn of(unit: &msgr_proto::Transmit) -> Kind {
        match unit {
            msgr_proto::Transmit::Banner(_) => Kind::Banner,
            msgr_proto::Transmit::Frame(_) | msgr_proto::Transmit::Message(_) => Kind::Frame,
        }
    }

    pub(crate) fn from_u8(v: u8) -> Option<Kind> {
        match v {
            0 => Some(Kind::Banner),
            1 => Some(Kind::Frame),
            2 => Some(Kind::Credit),
            3 => Some(Kind::ReadReq),
            4 => Some(Kind::ReadDone),
            _ => None,
        }
    }
}

/// Flag: more parts of this unit follow.
pub(crate) const MORE: u8 = 1;

/// Bytes of each chunk of a link's receive arena (copied units up to a
/// quarter of it share one).
const RX_ARENA: usize = 16 << 10;

/// The per-send header: kind, flags, credits granted to the receiver's peer.
pub(crate) fn header(kind: Kind, more: bool, credits: u32) -> [u8; HDR] {
    let mut h = [0u8; HDR];
    h[0] = kind as u8;
    h[1] = if more { MORE } else { 0 };
    h[4..8].copy_from_slice(&credits.to_le_bytes());
    h
}

/// Where a rendezvous frame (or its largest segment) waits to be read: the
/// start of a [`Kind::ReadReq`], whose other bytes are the rest of the
/// frame, the read landing among them at `at` (`crate::split`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ReadDesc {
    pub(crate) token: u32,
    pub(crate) rkey: u32,
    pub(crate) addr: u64,
    pub(crate) len: u64,
    pub(crate) at: u32,
}

impl ReadDesc {
    pub(crate) const LEN: usize = 28;

    pub(crate) fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[..4].copy_from_slice(&self.token.to_le_bytes());
        b[4..8].copy_from_slice(&self.rkey.to_le_bytes());
        b[8..16].copy_from_slice(&self.addr.to_le_bytes());
        b[16..24].copy_from_slice(&self.len.to_le_bytes());
        b[24..28].copy_from_slice(&self.at.to_le_bytes());
        b
    }

    /// The descriptor at the start of `b` and the inline bytes after it.
    pub(crate) fn decode(b: &[u8]) -> Option<(Self, &[u8])> {
        let (d, inline) = b.split_at_checked(Self::LEN)?;
        let u32_at = |o: usize| u32::from_le_bytes(d[o..o + 4].try_into().expect("4 bytes"));
        let u64_at = |o: usize| u64::from_le_bytes(d[o..o + 8].try_into().expect("8 bytes"));
        Some((
            ReadDesc {
                token: u32_at(0),
                rkey: u32_at(4),
                addr: u64_at(8),
                len: u64_at(16),
                at: u32_at(24),
            },
            inline,
        ))
    }
}

/// One send's worth of a unit.
#[derive(Debug)]
pub(crate) struct Part {
    pub(crate) kind: Kind,
    pub(crate) more: bool,
    /// The part's bytes: these, then those of `then` in order (a frame's
    /// preamble, a slice of its payload, its CRCs), gathered into the send
    /// chunk by [`Part::copy_to`].
    pub(crate) bytes: Bytes,
    pub(crate) then: Vec<Bytes>,
}

impl Part {
    /// A part of one piece.
    pub(crate) fn whole(kind: Kind, more: bool, bytes: Bytes) -> Self {
        Part {
            kind,
            more,
            bytes,
            then: Vec::new(),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.bytes.len() + self.then.iter().map(Bytes::len).sum::<usize>()
    }

    /// Copies the part's bytes to the start of `dst` (at least
    /// [`Part::len`] bytes); returns how many.
    pub(crate) fn copy_to(&self, dst: &mut [u8]) -> usize {
        let mut at = 0;
        for p in std::iter::once(&self.bytes).chain(&self.then) {
            dst[at..at + p.len()].copy_from_slice(p);
            at += p.len();
        }
        at
    }
}

/// Appends to `queue` the parts of one unit made of `pieces` in order,
/// each at most `max` bytes (all full but the last; an empty unit is one
/// empty part); returns the unit's length.
fn cut_into_parts<I>(kind: Kind, pieces: I, max: usize, queue: &mut VecDeque<Part>) -> usize
where
    I: IntoIterator<Item = Bytes>,
    I::IntoIter: Clone,
{
    let pieces = pieces.into_iter();
    let total: usize = pieces.clone().map(|p| p.len()).sum();
    let mut left = total;
    let mut part: Vec<Bytes> = Vec::new();
    let mut room = max;
    let mut emit = |more: bool, part: &mut Vec<Bytes>| {
        let mut then = std::mem::take(part);
        let bytes = if then.is_empty() {
            Bytes::new()
        } else {
            then.remove(0)
        };
        queue.push_back(Part {
            kind,
            more,
            bytes,
            then,
        });
    };
    for mut p in pieces {
        while !p.is_empty() {
            let take = p.len().min(room);
            part.push(p.split_to(take));
            room -= take;
            left -= take;
            if room == 0 && left > 0 {
                emit(true, &mut part);
                room = max;
            }
        }
    }
    emit(false, &mut part);
    total
}

/// A received unit in arrival order: ready, or a rendezvous read in flight
/// (later units wait behind it, so delivery keeps the sender's order).
#[derive(Debug)]
pub(crate) enum RxItem {
    Ready(Inbound),
    Reading(u32),
}

/// A rendezvous read, or an application's read or write, this link has in
/// flight.
pub(crate) struct ReadOp {
    /// Where the frame lands (registered for the read): the inline bytes
    /// around a gap of `desc.len` at `desc.at` that the read fills.
    pub(crate) buf: MemoryRegion<Vec<u8>>,
    /// The unit's length (`buf` may be a larger sink, reused).
    pub(crate) len: usize,
    /// Where the frame lies at the sender, and the token to return.
    pub(crate) desc: ReadDesc,
    /// Bytes for which reads have been posted.
    pub(crate) posted: u64,
    /// Read work requests not completed yet.
    pub(crate) pending: u32,
    pub(crate) deadline: Instant,
    /// `SimulatedFault::HungRead`: its completions are ignored.
    pub(crate) hung: bool,
    /// An application's read or write of a peer's region
    /// (`Transport::rma_read`, `rma_write`): its outcome goes up as
    /// `TransportEvent::RmaRead`/`RmaWrite`, not as a frame, and the peer
    /// is told nothing.
    pub(crate) user: Option<UserOp>,
}

/// What makes a [`ReadOp`] an application's operation.
#[derive(Clone, Copy, Debug)]
pub(crate) struct UserOp {
    /// The caller's token.
    pub(crate) token: u64,
    /// An RDMA WRITE of `buf` into the peer's region (else a READ).
    pub(crate) write: bool,
}

pub(crate) struct RdmaLink {
    /// When the link was made (accepted links must finish setup in time).
    pub(crate) since: Instant,
    pub(crate) conn: Conn,
    pub(crate) outgoing: bool,
    /// The listener an accepted link came from.
    pub(crate) listener: Option<mio::Token>,
    /// Both QPs can carry data; the worker was told (Connected / Accepted).
    pub(crate) up: bool,
    /// The QP (rdmacm connectors create it once the route is resolved).
    pub(crate) qp: Option<QueuePair>,
    /// Shared-receive-queue slots promised to this link (returned on release).
    pub(crate) share: u32,
    /// Its receive chunks lent to the application now.
    pub(crate) lent: u32,
    /// iWARP acceptors send nothing before the connector's first message.
    pub(crate) hold_tx: bool,
    /// Units to send and sends in flight.
    pub(crate) send: SendState,
    /// Credits: sends we may post, and receive slots owed back to the peer.
    pub(crate) flow: CreditFlow,
    /// The unit being received and those held back.
    pub(crate) recv: RecvState,
    pub(crate) paused: bool,
    pub(crate) frozen: bool,
    /// Rendezvous: our frames the peer reads, and the peer's we read.
    pub(crate) rdv: RdvState,
}

/// A link's sending side.
pub(crate) struct SendState {
    /// Send chunks whose send has not completed.
    pub(crate) inflight: Vec<u32>,
    /// Units not yet posted, cut into parts that fit a chunk.
    pub(crate) queue: VecDeque<Part>,
    pub(crate) queued_bytes: usize,
}

/// A link's credit-based flow control.
pub(crate) struct CreditFlow {
    /// Data sends we may post (the peer's receive slots for us).
    pub(crate) credits: u32,
    /// Receives consumed whose credit the peer has not been given back.
    pub(crate) to_grant: u32,
    /// Data sends the peer may still post to us, as far as we know (what we
    /// granted minus what arrived): when it runs low, credits go back alone.
    pub(crate) peer_credits: u32,
    /// Credits kept back while reading is paused (backpressure).
    pub(crate) withheld: u32,
    /// The send chunk of the credit-only send in flight (at most one).
    pub(crate) credit_chunk: Option<u32>,
}

/// A link's receiving side.
pub(crate) struct RecvState {
    /// Parts of the unit being received.
    pub(crate) reasm: BytesMut,
    /// Where small units are copied out of their receive chunk (they
    /// share arena chunks; see [`msgr_proto::arena::ByteArena`]).
    pub(crate) arena: ByteArena,
    /// Received, not delivered yet: while paused, or behind a read.
    pub(crate) held: VecDeque<RxItem>,
}

/// A link's rendezvous reads, both ways.
pub(crate) struct RdvState {
    /// Our frames (or their payloads) the peer is to read, by token
    /// (released on its ReadDone).
    pub(crate) out: FxHashMap<u32, Lent<ReadOnlyRegion>>,
    pub(crate) out_bytes: usize,
    pub(crate) next_token: u32,
    /// The peer's frames we are reading, by read slot.
    pub(crate) reads: FxHashMap<u32, ReadOp>,
    pub(crate) next_read: u32,
    /// Reads still to start that are to hang (`SimulatedFault::HungRead`).
    pub(crate) reads_to_hang: u32,
}

impl std::fmt::Debug for RdmaLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaLink")
            .field("qpn", &self.qp.as_ref().map(QueuePair::qp_num))
            .field("up", &self.up)
            .field("credits", &self.flow.credits)
            .field("queued_bytes", &self.send.queued_bytes)
            .finish()
    }
}

impl RdmaLink {
    pub(crate) fn new(conn: Conn, outgoing: bool, qp: Option<QueuePair>, share: u32) -> Self {
        RdmaLink {
            since: Instant::now(),
            conn,
            outgoing,
            listener: None,
            up: false,
            qp,
            share,
            lent: 0,
            hold_tx: false,
            send: SendState {
                inflight: Vec::new(),
                queue: VecDeque::new(),
                queued_bytes: 0,
            },
            flow: CreditFlow {
                credits: 0,
                to_grant: 0,
                peer_credits: share.saturating_sub(1),
                withheld: 0,
                credit_chunk: None,
            },
            recv: RecvState {
                reasm: BytesMut::new(),
                arena: ByteArena::new(RX_ARENA),
                held: VecDeque::new(),
            },
            paused: false,
            frozen: false,
            rdv: RdvState {
                out: FxHashMap::default(),
                out_bytes: 0,
                next_token: 1,
                reads: FxHashMap::default(),
                next_read: 0,
                reads_to_hang: 0,
            },
        }
    }

    /// Data credits this link grants its peer at setup (one slot of its share
    /// is kept for credit-only messages).
    pub(crate) fn initial_credits(&self) -> u32 {
        self.share - 1
    }

    /// Queues `bytes` of one unit, cut into parts of at most `max` bytes.
    pub(crate) fn push(&mut self, kind: Kind, bytes: Bytes, max: usize) {
        self.push_pieces(kind, [bytes], max);
    }

    /// Queues one unit made of `pieces` in order (a frame's preamble,
    /// segments and CRCs, which stay where they are until a part is copied
    /// into its send chunk), cut into parts of at most `max` bytes.
    pub(crate) fn push_pieces<I>(&mut self, kind: Kind, pieces: I, max: usize)
    where
        I: IntoIterator<Item = Bytes>,
        I::IntoIter: Clone,
    {
        self.send.queued_bytes += cut_into_parts(kind, pieces, max, &mut self.send.queue);
    }

    /// One of our receive slots is free again: its credit goes back to the
    /// peer (held back while reading is paused).
    pub(crate) fn grant_one(&mut self) {
        if self.paused {
            self.flow.withheld += 1;
        } else {
            self.flow.to_grant += 1;
        }
    }

    /// Whether credits should go back now even without data to carry them:
    /// half the window has piled up, or the peer is down to its last
    /// quarter (returned chunks trickle in after the acks that could have
    /// carried them went out).
    pub(crate) fn should_return_credits(&self) -> bool {
        let window = self.initial_credits();
        self.flow.to_grant > 0
            && (self.flow.to_grant >= window.div_ceil(2)
                || self.flow.peer_credits <= (window / 4).max(1))
    }

    /// Whether sends may be posted now.
    pub(crate) fn can_send(&self) -> bool {
        self.up && !self.frozen && !self.hold_tx
    }
}

/// What a link's next send carries ([`next_send`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NextSend {
    /// The next queued part, with the credits owed riding in its header.
    Data,
    /// Only the credits owed (lands in the peer's spare slot, needs none).
    CreditsAlone,
    /// Nothing for now.
    Nothing,
}

/// A link's next send from its state: queued data while it has a credit;
/// else its credits alone when the peer needs them (`peer_needs`:
/// [`RdmaLink::should_return_credits`]) and no credit-only send is in
/// flight (at most one is). Credits go alone also while data waits for a
/// credit: two ends out of credits, each with data queued and owing the
/// other its window, would otherwise wait on each other for ever (the link
/// stalled until the keepalive timeout failed it).
pub(crate) fn next_send(
    queued: bool,
    credits: u32,
    credits_in_flight: bool,
    peer_needs: bool,
) -> NextSend {
    if queued && credits > 0 {
        NextSend::Data
    } else if !credits_in_flight && peer_needs {
        NextSend::CreditsAlone
    } else {
        NextSend::Nothing
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credits_go_alone_whenever_no_data_can_carry_them() {
        use NextSend::*;
        // (queued, credits, credit-only in flight, peer needs credits)
        for (args, want) in [
            ((true, 1, false, true), Data),
            ((true, 1, true, false), Data),
            // Out of credits with data queued, owing the peer: the case
            // that deadlocked when credits waited for the queue to empty.
            ((true, 0, false, true), CreditsAlone),
            ((false, 5, false, true), CreditsAlone),
            ((true, 0, true, true), Nothing),
            ((true, 0, false, false), Nothing),
            ((false, 0, false, false), Nothing),
        ] {
            let (queued, credits, in_flight, needs) = args;
            assert_eq!(
                next_send(queued, credits, in_flight, needs),
                want,
                "{args:?}"
            );
        }
    }

    #[test]
    fn units_are_cut_into_full_parts_that_gather_back() {
        let pieces = [
            Bytes::from_static(b"preamble"),
            Bytes::from((0..70_000u32).map(|i| i as u8).collect::<Vec<_>>()),
            Bytes::new(),
            Bytes::from_static(b"tail"),
        ];
        let want: Vec<u8> = pieces.iter().flat_map(|p| p.to_vec()).collect();
        for max in [
            1,
            3,
            4096,
            32_760,
            want.len() - 1,
            want.len(),
            want.len() + 1,
        ] {
            let mut q = VecDeque::new();
            assert_eq!(
                cut_into_parts(Kind::Frame, pieces.clone(), max, &mut q),
                want.len()
            );
            let mut got = vec![0u8; want.len() + max];
            let mut at = 0;
            for (i, p) in q.iter().enumerate() {
                let last = i == q.len() - 1;
                assert_eq!(p.more, !last, "max {max}: part {i}");
                assert!(p.len() <= max && (last || p.len() == max), "max {max}");
                assert_eq!(p.copy_to(&mut got[at..]), p.len());
                at += p.len();
            }
            assert!(got[..at] == want[..], "max {max}");
        }
        let mut q = VecDeque::new();
        assert_eq!(cut_into_parts(Kind::Banner, [Bytes::new()], 8, &mut q), 0);
        assert!(q.len() == 1 && !q[0].more && q[0].len() == 0);
    }

    #[test]
    fn read_descriptors_round_trip_and_reject_bad_lengths() {
        let d = ReadDesc {
            token: 9,
            rkey: 0xdead_beef,
            addr: 0x7f00_0000_1000,
            len: 64 << 20,
            at: 40,
        };
        assert_eq!(ReadDesc::decode(&d.encode()), Some((d, &[][..])));
        let mut with_inline = d.encode().to_vec();
        with_inline.extend_from_slice(b"inline");
        assert_eq!(ReadDesc::decode(&with_inline), Some((d, &b"inline"[..])));
        assert_eq!(ReadDesc::decode(&d.encode()[..20]), None);
        assert_eq!(ReadDesc::decode(&[]), None);
    }
}
