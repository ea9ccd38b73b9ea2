//! The `fi_read` rendezvous for large units, shared by the MSG transport
//! ([`super::FabricTransport`]) and the RDM one ([`super::rdm`]).
//!
//! Where the endpoint has `FI_RMA` with reads (decided once per worker,
//! [`msgr_fabric::Net::rma`]), a unit larger than [`RNDV_THRESHOLD`] at a
//! unit boundary is not copied through slots: the sender registers it where
//! it lies ([`msgr_fabric::RmaBuffers::expose`] of the endpoint,
//! which honours the provider's `mr_mode`) and sends a descriptor (address,
//! length, key, id: [`encode`]) in the link's ordered stream. The receiver
//! checks it ([`decode`]), `fi_read`s the unit into a buffer of its own,
//! hands it up in order (later messages wait behind it) and answers with the
//! id, upon which the sender deregisters and frees the unit. At most
//! [`RNDV_MAX`] units per link are exposed at once ([`Exposures`]); a read
//! not complete within the read timeout (`rdma_read_timeout_ms`, shared
//! with the RDMA backends: [`crate::RdmaPoolConfig::read_timeout`]) fails
//! the link ([`overdue`], counted in `read_timeouts`); a unit whose
//! registration fails goes eagerly (counted as a fallback).
//!
//! A read that never completes cannot be had for real from the providers
//! tested here (`tcp`, `tcp;ofi_rxm`: a broken connection ends the read
//! with an error completion), so `SimulatedFault::HungRead` imitates one
//! ([`Receiving::reads_to_hang`]): the completion of the link's next read
//! is ignored (counted in `simulated_hung_reads`) and the deadline must
//! fail the link. The provider did write the buffer, and is done with it
//! once it completes: the transport frees it then (`read_done`), or with
//! the endpoint if no completion ever comes.
//!
//! A large frame is not copied into one buffer to be exposed
//! ([`msgr_fabric::RmaBuffers::expose_in_place`]): its largest segment is
//! exposed where the application put it and the rest of the frame
//! (preamble, small segments, CRCs: at most [`INLINE_MAX`] bytes) travels
//! inside the descriptor ([`OutUnit::Split`]); the receiver reads the
//! segment into the gap between them. Where the provider does not check
//! keys (`shm`) the descriptor also names a check word registered apart,
//! which the receiver reads after the segment ([`msgr_fabric::CHECK_LEN`]).
//! The copy was a tenth of a 1 MiB ping-pong's CPU over `tcp`, and a
//! quarter to a third of its one-way time over `shm`.
//!
//! Where the reads are withheld ([`msgr_fabric::rma_withheld`]: libfabric
//! 1.17's `tcp`) and the provider checks keys, units go by `fi_write`
//! instead ([`RmaOp::Write`]): the sender holds the unit (registered only
//! where the domain wants local registrations) and sends its descriptor
//! flagged [`WRITE_ME`], naming nothing to read; the receiver grants a
//! zeroed buffer with the inline bytes in place, registered for remote
//! writes ([`encode_grant`]); the sender writes the unit into it and says
//! "written" by a send posted right behind the write (`FI_ORDER_SAW`); the
//! receiver then hands the unit up and answers as after a read. A granted
//! buffer is never freed while its endpoint is open and a write into it
//! may be under way (RDM endpoints outlive their links: a link that goes
//! with a grant outstanding leaves it to the endpoint's close). Over
//! `tcp;ofi_rxm` the writes go to the core `tcp` endpoint in one piece,
//! where eager messages were 16 KiB bounce-buffer copies: a 1 MiB one-way
//! took about half the time.
//!
//! The epilogue (the CRC32C of each segment) is the last of a split frame's
//! inline bytes, and the checksum of a large segment takes as long as a
//! good part of its move (a 1 MiB one-way over `shm`: ~20 µs of ~60).
//! Between peers that both said so at set-up ([`CAPS_LATE_EPILOGUE`]), a
//! split unit goes with its epilogue zeroed and its descriptor flagged
//! [`LATE_EPILOGUE`]: the sender computes the epilogue once the descriptor
//! is posted, while the receiver reads (or grants), and sends it in a
//! message of its own ([`encode_epilogue`]); the receiver puts it in place
//! and checks the unit once both the unit and its epilogue are there
//! ([`Receiving::finish`], [`Receiving::epilogue_arrived`]). A unit whose
//! epilogue never comes misses the read deadline as a hung read does.
//!
//! What this module holds is transport-independent: the descriptor's
//! encoding, the sending side's bookkeeping, the deadline and the counters.
//! Each transport frames the descriptor and the answer in its own header.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::Bytes;
use msgr_fabric::{
    Exposed, FabricError, Landing, ReadRegion, RemoteWord, RmaBuffers, RmaOp, CHECK_LEN,
};
use msgr_proto::arena::ByteArena;
use msgr_proto::frame::{EncodedFrame, MAX_SEGMENTS, PREAMBLE_LEN};
use msgr_proto::{Frame, FrameError, FrameLimits, Inbound, Transmit};

use super::outbox::Outbox;
use super::reassembly::{PieceError, Reassembly};
use crate::regcache::RegCache;
use crate::split::INLINE_MAX;
use crate::split::{split_frame, SplitFrame};
use crate::{SimulatedFault, TransportError};
use msgr_addr::TransportKind;

/// Units larger than this go by `fi_read` rendezvous where the endpoint
/// has `FI_RMA`.
pub const RNDV_THRESHOLD: usize = 64 << 10;
/// Frames shorter than this are encoded at once into a shared chunk
/// ([`OutUnit::Small`]); longer ones keep their segments until copied into
/// the send slots.
pub const SMALL_UNIT: usize = 4 << 10;
/// The chunk size of a transport's arena for [`OutUnit::Small`] units.
pub const SMALL_ARENA: usize = 4 * SMALL_UNIT;
/// Rendezvous units a link may have exposed and not yet read by the peer.
pub const RNDV_MAX: usize = 4;
/// Bytes of a rendezvous descriptor before its inline bytes: address,
/// length, key, id, check word, where the read lands among the inline
/// bytes, the address and key of a check word apart and whether there is
/// one ([`WORD_APART`]).
pub const DESC_LEN: usize = 8 + 8 + 8 + 4 + 8 + 4 + 8 + 8 + 4;
/// Descriptor flag: the check word lies apart ([`Exposed::word`]).
const WORD_APART: u32 = 1;
/// Descriptor flag: the unit is held for a write ([`Exposed::write`]): the
/// receiver grants a buffer ([`encode_grant`]) instead of reading.
const WRITE_ME: u32 = 2;
/// Descriptor flag: the unit's epilogue (the last inline bytes) is zero
/// here and follows in a message of its own ([`encode_epilogue`]).
pub const LATE_EPILOGUE: u32 = 4;
/// Bytes of an epilogue at most (a CRC32C per segment).
pub const EPILOGUE_MAX: usize = 4 * MAX_SEGMENTS;
/// Bytes of the message carrying a late epilogue at most: the sender's id,
/// the epilogue's length, the epilogue.
pub const EPILOGUE_MSG_MAX: usize = 4 + 1 + EPILOGUE_MAX;
/// Bytes of a grant: the sender's id, then where to write and the key.
pub const GRANT_LEN: usize = 4 + 8 + 8;
/// The largest descriptor with its inline bytes.
pub const DESC_MAX: usize = DESC_LEN + INLINE_MAX;
/// Bytes of the answer to a descriptor: the sender's id.
pub const DONE_LEN: usize = 4;

/// What each end of a link tells the other at set-up (MSG: the connection
/// data of `fi_connect` / `fi_accept`; RDM: after the HELLO's name and the
/// WELCOME's ids): [`CAPS_TAG`] and a flags byte, [`CAPS_READS`] set when
/// it reads rendezvous units, [`CAPS_WRITES`] when it grants buffers for
/// them to be written into. A sender offers a unit by rendezvous only to a
/// peer that moves them by the same operation as its own endpoints (they
/// may have reads while the peer's libfabric withholds them:
/// `msgr_fabric::rma_withheld`).
pub const CAPS_LEN: usize = 2;
/// The first byte of the capabilities.
const CAPS_TAG: u8 = b'm';
/// Capability flag: this end `fi_read`s rendezvous units.
const CAPS_READS: u8 = 1;
/// Capability flag: this end grants buffers for rendezvous units to be
/// `fi_write`n into.
const CAPS_WRITES: u8 = 2;
/// Capability flag: this end takes a unit's epilogue after its descriptor
/// ([`LATE_EPILOGUE`]). An msgr from before it neither sends nor takes one.
pub const CAPS_LATE_EPILOGUE: u8 = 4;

/// The capabilities of an end whose endpoints move rendezvous units by
/// `op` (none: every unit through the slots).
pub fn caps(op: Option<RmaOp>) -> [u8; CAPS_LEN] {
    let flags = match op {
        Some(RmaOp::Read) => CAPS_READS | CAPS_LATE_EPILOGUE,
        Some(RmaOp::Write) => CAPS_WRITES | CAPS_LATE_EPILOGUE,
        None => 0,
    };
    [CAPS_TAG, flags]
}

/// Whether a peer whose set-up carried `caps` takes late epilogues.
pub fn peer_late_epilogue(caps: &[u8]) -> bool {
    matches!(caps, [CAPS_TAG, flags, ..] if flags & CAPS_LATE_EPILOGUE != 0)
}

/// How a peer whose set-up carried `caps` moves rendezvous units. Without
/// them (an msgr from before they were sent, which always read where its
/// endpoints could) it reads.
pub fn peer_op(caps: &[u8]) -> Option<RmaOp> {
    match caps {
        [CAPS_TAG, flags, ..] if flags & CAPS_READS != 0 => Some(RmaOp::Read),
        [CAPS_TAG, flags, ..] if flags & CAPS_WRITES != 0 => Some(RmaOp::Write),
        [CAPS_TAG, ..] => None,
        _ => Some(RmaOp::Read),
    }
}

/// The rendezvous operation of a link between an end moving units by
/// `ours` and a peer moving them by `theirs`: the same, or none.
pub fn link_op(ours: Option<RmaOp>, theirs: Option<RmaOp>) -> Option<RmaOp> {
    ours.filter(|&op| theirs == Some(op))
}

/// Why a received descriptor is refused (the link fails).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DescError {
    /// Fewer bytes than a descriptor.
    #[error("short rendezvous descriptor ({0} bytes, want {DESC_LEN})")]
    Short(usize),
    /// A unit of 0 bytes (only its check word) is never sent by rendezvous.
    #[error("rendezvous of 0 bytes")]
    Empty,
    /// Larger than any frame this side accepts.
    #[error("rendezvous of {len} bytes (frame limit {max})")]
    TooLarge {
        /// Length in the descriptor.
        len: u64,
        /// The receiver's frame limit.
        max: u64,
    },
    /// A descriptor where a unit's next piece should be.
    #[error("rendezvous inside a multi-piece unit")]
    InsideUnit,
    /// A check word apart that is no check word (0), or unknown flags.
    #[error("rendezvous descriptor with a check word apart of 0 or flags {0:#x}")]
    BadWord(u32),
    /// The read would land outside the inline bytes, or after a check word.
    #[error("rendezvous read placed at {at} among {inline} inline bytes")]
    Placement {
        /// Where the read lands.
        at: u64,
        /// Inline bytes that came with the descriptor.
        inline: usize,
    },
    /// An answer for a unit this side has not exposed.
    #[error("rendezvous answer for nothing exposed ({0:?})")]
    UnknownDone(Option<u32>),
    /// A grant for a unit this side does not hold for a write, or holds
    /// and wrote already.
    #[error("rendezvous grant for nothing held ({0:?})")]
    UnknownGrant(Option<u32>),
    /// A "written" for no buffer granted to the peer.
    #[error("rendezvous write announced for nothing granted ({0:?})")]
    UnknownWritten(Option<u32>),
    /// A late epilogue that is no epilogue, does not fit where its unit's
    /// epilogue goes, or one more than units may be exposed.
    #[error("late epilogue refused: {0}")]
    BadEpilogue(&'static str),
    /// A descriptor of the operation this side's endpoints do not take
    /// part in.
    #[error("rendezvous by {offered:?} to an endpoint moving units by {ours:?}")]
    WrongOp {
        /// What the descriptor asks.
        offered: RmaOp,
        /// What this side's endpoints do.
        ours: Option<RmaOp>,
    },
}

/// A unit queued to send.
#[derive(Debug, PartialEq, Eq)]
pub enum OutUnit {
    /// Encoded in one buffer.
    Flat(Vec<u8>),
    /// A small frame (below [`SMALL_UNIT`]) encoded at once into a chunk
    /// shared with others ([`Frame::encode_in`]).
    Small(Bytes),
    /// A frame in its encoded parts, copied straight into the send slots
    /// (never assembled into a buffer of its own first). Boxed, as the
    /// split one: a queued unit stays small to move.
    Frame(Box<EncodedFrame>),
    /// A large frame whose largest segment stays where the application put
    /// it.
    Split(Box<SplitFrame>),
    /// A split frame whose epilogue is still zero, for a peer that takes it
    /// late ([`LATE_EPILOGUE`]); computed from the frame, whose segments
    /// it shares.
    SplitLate(Box<(SplitFrame, Frame)>),
}

impl OutUnit {
    /// Encoded bytes.
    pub fn len(&self) -> usize {
        match self {
            OutUnit::Flat(v) => v.len(),
            OutUnit::Small(b) => b.len(),
            OutUnit::Frame(f) => f.len(),
            OutUnit::Split(s) => s.len(),
            OutUnit::SplitLate(s) => s.0.len(),
        }
    }

    /// Copies the unit's bytes from `offset` into `dst`, as many as fit
    /// (the eager path's pieces); returns how many.
    pub fn copy_out(&self, offset: usize, dst: &mut [u8]) -> usize {
        match self {
            OutUnit::Flat(v) => copy_parts([&v[..]], offset, dst),
            OutUnit::Small(b) => copy_parts([&b[..]], offset, dst),
            OutUnit::Frame(f) => copy_parts(f.parts(), offset, dst),
            OutUnit::Split(s) => copy_parts([&s.head[..], &s.body, &s.tail], offset, dst),
            OutUnit::SplitLate(s) => {
                // Only a unit that goes by rendezvous keeps its epilogue
                // late (the eager paths resolve it first): these bytes
                // would fail the peer's check.
                debug_assert!(false, "a late epilogue sent eagerly");
                let s = &s.0;
                copy_parts([&s.head[..], &s.body, &s.tail], offset, dst)
            }
        }
    }

    /// Computes a late epilogue into the unit's tail ([`OutUnit::SplitLate`]
    /// becomes [`OutUnit::Split`]): for a unit that goes otherwise than by a
    /// rendezvous that takes it late — called as its first eager piece is
    /// sent (with no rendezvous on the link, or none for this unit).
    pub fn resolve_epilogue(&mut self) {
        if let OutUnit::SplitLate(_) = self {
            let OutUnit::SplitLate(s) = std::mem::replace(self, OutUnit::Flat(Vec::new())) else {
                unreachable!("matched above");
            };
            let (mut split, frame) = *s;
            let (words, len) = frame.epilogue_bytes();
            let at = split.tail.len() - len;
            split.tail[at..].copy_from_slice(&words[..len]);
            *self = OutUnit::Split(Box::new(split));
        }
    }

    /// The unit's bytes `offset..offset + len` as a slice of a segment the
    /// unit shares with the application, if they lie inside one: a piece
    /// that can be sent from where it is ([`msgr_fabric::Ep::send_in_place`]).
    pub fn shared(&self, offset: usize, len: usize) -> Option<Bytes> {
        let end = offset.checked_add(len)?;
        let within = |at: usize, seg: &Bytes| {
            (offset >= at && end <= at + seg.len()).then(|| seg.slice(offset - at..end - at))
        };
        match self {
            OutUnit::Frame(f) => {
                let mut at = PREAMBLE_LEN;
                for seg in &f.segments {
                    if let Some(b) = within(at, seg) {
                        return Some(b);
                    }
                    at += seg.len();
                }
                None
            }
            OutUnit::Split(s) => within(s.head.len(), &s.body),
            OutUnit::SplitLate(s) => within(s.0.head.len(), &s.0.body),
            OutUnit::Flat(_) | OutUnit::Small(_) => None,
        }
    }

    /// The unit in one buffer with room for a check word after it.
    fn flatten(mut self) -> Vec<u8> {
        self.resolve_epilogue();
        match self {
            OutUnit::Flat(v) => v,
            OutUnit::Small(b) => {
                let mut v = Vec::with_capacity(b.len() + CHECK_LEN);
                v.extend_from_slice(&b);
                v
            }
            OutUnit::Frame(f) => {
                let mut v = Vec::with_capacity(f.len() + CHECK_LEN);
                f.write_into(&mut v);
                v
            }
            OutUnit::Split(s) => s.into_vec(CHECK_LEN),
            OutUnit::SplitLate(_) => unreachable!("resolved above"),
        }
    }
}

/// Copies the bytes of `parts` (one unit, in order) from `offset` into
/// `dst`, as many as fit; returns how many.
fn copy_parts<'a>(
    parts: impl IntoIterator<Item = &'a [u8]>,
    offset: usize,
    dst: &mut [u8],
) -> usize {
    let (mut skip, mut done) = (offset, 0);
    for p in parts {
        if skip >= p.len() {
            skip -= p.len();
            continue;
        }
        let n = (p.len() - skip).min(dst.len() - done);
        dst[done..done + n].copy_from_slice(&p[skip..skip + n]);
        done += n;
        skip = 0;
        if done == dst.len() {
            break;
        }
    }
    done
}

/// A unit of ours exposed for the peer: what its descriptor carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Described {
    /// The exposed buffer.
    pub x: Exposed,
    /// The unit's bytes around it (empty when the whole unit is exposed).
    pub inline: Vec<u8>,
    /// Where in `inline` the exposed bytes belong.
    pub at: usize,
    /// The exposed bytes are the application's, not a copy.
    pub in_place: bool,
    /// The frame whose epilogue follows the descriptor (the inline one is
    /// zero): [`LATE_EPILOGUE`].
    pub late: Option<Box<Frame>>,
}

/// A peer's descriptor: what to read, and the bytes to place around it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Offered<'a> {
    /// The peer's exposed buffer.
    pub x: Exposed,
    /// The unit's bytes around it.
    pub inline: &'a [u8],
    /// Where in `inline` the read lands.
    pub at: usize,
    /// The unit's epilogue follows in a message of its own
    /// ([`LATE_EPILOGUE`]).
    pub late: bool,
}

impl Offered<'_> {
    /// Bytes at the unit's end a late epilogue may take (the inline bytes
    /// after the read), if it has one.
    pub fn late_room(&self) -> Option<usize> {
        self.late.then(|| self.inline.len() - self.at)
    }
}

/// Exposes a unit on `rma`: a split one in place, its head and tail inline
/// if they fit a descriptor of at most `room` bytes (under a registration
/// kept in `cache` where the endpoint allows: a payload sent again is not
/// registered again); otherwise (or where the provider allows no exposure
/// in place) the unit copied into one buffer with its check word. On
/// failure the unit comes back (flattened if it got that far) to go
/// eagerly.
pub fn expose(
    rma: &mut RmaBuffers,
    cache: &mut RegCache<ReadRegion>,
    unit: OutUnit,
    room: usize,
) -> Result<Described, Box<(FabricError, OutUnit)>> {
    let fits = |s: &SplitFrame| DESC_LEN + s.head.len() + s.tail.len() <= room;
    let (split, late) = match unit {
        OutUnit::Split(s) if fits(&s) => (*s, None),
        OutUnit::SplitLate(s) if fits(&s.0) => (s.0, Some(Box::new(s.1))),
        unit => return expose_whole(rma, unit),
    };
    let (inline, at) = split.inline();
    let SplitFrame { head, body, tail } = split;
    let exposed = if rma.keeps_registrations() {
        cache
            .get(body, true, |b| rma.register_for_reads(b))
            .and_then(|lent| rma.expose_registered(lent.region, lent.body))
    } else {
        rma.expose_in_place(body)
    };
    match exposed {
        Ok(x) => Ok(Described {
            x,
            inline,
            at,
            in_place: true,
            late,
        }),
        Err((_, body)) => {
            let split = SplitFrame { head, body, tail };
            let unit = match late {
                Some(frame) => OutUnit::SplitLate(Box::new((split, *frame))),
                None => OutUnit::Split(Box::new(split)),
            };
            expose_whole(rma, unit)
        }
    }
}

/// Exposes `unit` copied into one buffer with its check word.
fn expose_whole(
    rma: &mut RmaBuffers,
    unit: OutUnit,
) -> Result<Described, Box<(FabricError, OutUnit)>> {
    match rma.expose(unit.flatten()) {
        Ok(x) => Ok(Described {
            x,
            inline: Vec::new(),
            at: 0,
            in_place: false,
            late: None,
        }),
        Err((e, v)) => Err(Box::new((e, OutUnit::Flat(v)))),
    }
}

/// Writes `d`'s descriptor at the start of `buf` (at least [`DESC_LEN`]
/// bytes and its inline ones: [`expose`] saw to that); returns its length.
pub fn encode(buf: &mut [u8], d: &Described) -> usize {
    let x = &d.x;
    buf[..8].copy_from_slice(&x.addr.to_le_bytes());
    buf[8..16].copy_from_slice(&x.len.to_le_bytes());
    buf[16..24].copy_from_slice(&x.key.to_le_bytes());
    buf[24..28].copy_from_slice(&x.id.to_le_bytes());
    buf[28..36].copy_from_slice(&x.check.to_le_bytes());
    buf[36..40].copy_from_slice(&(d.at as u32).to_le_bytes());
    let (word, mut flags) = match x.word {
        Some(w) => (w, WORD_APART),
        None => (RemoteWord { addr: 0, key: 0 }, 0),
    };
    if x.write {
        flags |= WRITE_ME;
    }
    if d.late.is_some() {
        flags |= LATE_EPILOGUE;
    }
    buf[40..48].copy_from_slice(&word.addr.to_le_bytes());
    buf[48..56].copy_from_slice(&word.key.to_le_bytes());
    buf[56..60].copy_from_slice(&flags.to_le_bytes());
    buf[DESC_LEN..DESC_LEN + d.inline.len()].copy_from_slice(&d.inline);
    DESC_LEN + d.inline.len()
}

/// The descriptor that is `body`, for a receiver whose frames are at most
/// `max_frame` bytes and whose reassembly is `mid_unit` or not.
pub fn decode(body: &[u8], max_frame: u64, mid_unit: bool) -> Result<Offered<'_>, DescError> {
    let b: &[u8; DESC_LEN] = body
        .get(..DESC_LEN)
        .and_then(|b| b.try_into().ok())
        .ok_or(DescError::Short(body.len()))?;
    let inline = &body[DESC_LEN..];
    let word = |at: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&b[at..at + 8]);
        u64::from_le_bytes(w)
    };
    let half = |at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
    let flags = half(56);
    let x = Exposed {
        addr: word(0),
        len: word(8),
        key: word(16),
        id: half(24),
        check: word(28),
        word: (flags & WORD_APART != 0).then(|| RemoteWord {
            addr: word(40),
            key: word(48),
        }),
        write: flags & WRITE_ME != 0,
    };
    let at = u64::from(half(36));
    if mid_unit {
        return Err(DescError::InsideUnit);
    }
    // A unit held for a write names nothing to read and has no check word.
    let bad_write = x.write && (x.addr != 0 || x.key != 0 || x.check != 0 || x.word.is_some());
    // A check word at the end of the read ends the unit: nothing inline
    // may follow it, a late epilogue included.
    let word_at_end = x.check != 0 && x.word.is_none();
    let late = flags & LATE_EPILOGUE != 0;
    if flags & !(WORD_APART | WRITE_ME | LATE_EPILOGUE) != 0
        || (x.word.is_some() && x.check == 0)
        || bad_write
        || (late && word_at_end)
    {
        return Err(DescError::BadWord(flags));
    }
    let placed = if word_at_end {
        at == inline.len() as u64
    } else {
        at <= inline.len() as u64
    };
    if !placed {
        return Err(DescError::Placement {
            at,
            inline: inline.len(),
        });
    }
    let word_len = if word_at_end { CHECK_LEN as u64 } else { 0 };
    if x.len <= word_len {
        return Err(DescError::Empty);
    }
    let len = x.len.saturating_add(inline.len() as u64);
    if len > max_frame.saturating_add(word_len) {
        return Err(DescError::TooLarge {
            len,
            max: max_frame,
        });
    }
    Ok(Offered {
        x,
        inline,
        at: at as usize,
        late,
    })
}

/// Writes the late epilogue `words` of the sender's unit `id` at the start
/// of `buf` ([`EPILOGUE_MSG_MAX`] bytes at least); returns its length.
pub fn encode_epilogue(buf: &mut [u8], id: u32, words: &[u8]) -> usize {
    buf[..4].copy_from_slice(&id.to_le_bytes());
    buf[4] = words.len() as u8;
    buf[5..5 + words.len()].copy_from_slice(words);
    5 + words.len()
}

/// The sender's id and the epilogue of a late epilogue's body.
pub fn decode_epilogue(body: &[u8]) -> Result<(u32, &[u8]), DescError> {
    let [a, b, c, d, len, rest @ ..] = body else {
        return Err(DescError::BadEpilogue("short"));
    };
    let len = usize::from(*len);
    if len == 0 || len > EPILOGUE_MAX || len % 4 != 0 || rest.len() < len {
        return Err(DescError::BadEpilogue("not a CRC per segment"));
    }
    Ok((u32::from_le_bytes([*a, *b, *c, *d]), &rest[..len]))
}

/// A frame or message as one unit to send: a small one encoded into a
/// chunk of `arena` ([`OutUnit::Small`]); a large one (as a [`Frame`]) split around its largest
/// segment when the endpoints can expose memory `in_place` (they have
/// `FI_RMA`), that segment is large enough to go by rendezvous and the rest
/// fits inline in a descriptor ([`OutUnit::Split`], or
/// [`OutUnit::SplitLate`] with its epilogue left to compute where the peer
/// takes it `late` and it is not known already: [`Frame::checksums_known`]);
/// else kept in its encoded parts ([`OutUnit::Frame`]:
/// copied once, into the send slots or into the buffer a rendezvous
/// exposes).
pub fn encode_unit(
    unit: Transmit,
    in_place: bool,
    late: bool,
    arena: &mut ByteArena,
) -> Result<OutUnit, FrameError> {
    let len = unit.encoded_len();
    if len < SMALL_UNIT {
        let checked = unit.checked()?;
        return Ok(OutUnit::Small(arena.fill(len, |b| checked.write(b))));
    }
    let f = match unit.into_frame() {
        Ok(f) => f,
        Err(banner) => return Ok(OutUnit::Flat(banner.to_vec())),
    };
    if !(in_place && len > RNDV_THRESHOLD) {
        return Ok(OutUnit::Frame(Box::new(f.into_encoded()?)));
    }
    // An epilogue known already (a sealed payload) goes inline: late, it
    // would only cost a message.
    if late && !f.checksums_known() {
        let enc = f.clone().into_encoded_without_epilogue()?;
        return Ok(match split_frame(enc) {
            Ok(s) => OutUnit::SplitLate(Box::new((s, f))),
            // Not split: the whole frame is copied, checksummed now.
            Err(_) => OutUnit::Frame(Box::new(f.into_encoded()?)),
        });
    }
    Ok(match split_frame(f.into_encoded()?) {
        Ok(s) => OutUnit::Split(Box::new(s)),
        Err(whole) => OutUnit::Frame(Box::new(whole)),
    })
}

/// Writes the grant of a buffer (`landing`) for the sender's unit `id` at
/// the start of `buf` ([`GRANT_LEN`] bytes); returns its length.
pub fn encode_grant(buf: &mut [u8], id: u32, landing: Landing) -> usize {
    buf[..4].copy_from_slice(&id.to_le_bytes());
    buf[4..12].copy_from_slice(&landing.addr.to_le_bytes());
    buf[12..20].copy_from_slice(&landing.key.to_le_bytes());
    GRANT_LEN
}

/// The sender's id and the buffer of a grant's body.
pub fn decode_grant(body: &[u8]) -> Option<(u32, Landing)> {
    let b = body.get(..GRANT_LEN)?;
    let word = |at: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&b[at..at + 8]);
        u64::from_le_bytes(w)
    };
    let id = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    Some((
        id,
        Landing {
            addr: word(4),
            key: word(12),
        },
    ))
}

/// The id at the start of an answer's body (a "done", or a "written").
pub fn decode_done(body: &[u8]) -> Option<u32> {
    let b = body.get(..DONE_LEN)?;
    Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

/// Whether a read started at `since` has been in flight longer than
/// `timeout` at `now`.
pub fn overdue(since: Instant, now: Instant, timeout: Duration) -> bool {
    now.saturating_duration_since(since) > timeout
}

/// A completed read (`error`: its completion's, `buf`: the endpoint's
/// buffer): its unit decoded at a unit boundary of `reasm`, and counted; or
/// why the link fails.
pub(crate) fn finish_read(
    error: Option<(i32, &'static str)>,
    buf: Option<Result<Bytes, String>>,
    by_write: bool,
    reasm: &mut Reassembly,
    limits: &FrameLimits,
    counters: &mut Counters,
) -> Result<Inbound, PieceError> {
    if let Some((code, what)) = error {
        return Err(PieceError::Malformed(format!(
            "libfabric fi_read {what}: {}",
            std::io::Error::from_raw_os_error(code)
        )));
    }
    let buf = buf
        .ok_or_else(|| PieceError::Malformed("rendezvous unit without a buffer".into()))?
        .map_err(PieceError::Malformed)?;
    if by_write {
        counters.landed += 1;
        counters.landed_bytes += buf.len() as u64;
    } else {
        counters.read += 1;
        counters.read_bytes += buf.len() as u64;
    }
    reasm.whole(buf, limits).map_err(|e| match e {
        PieceError::Malformed(why) => {
            PieceError::Malformed(format!("malformed rendezvous unit: {why}"))
        }
        corrupt => corrupt,
    })
}

/// The rendezvous counters of one transport (see [`Counters::values`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct Counters {
    /// Descriptors sent.
    pub sent: u64,
    /// Of those, units exposed in place ([`OutUnit::Split`]).
    pub in_place: u64,
    /// Units fetched by `fi_read`.
    pub read: u64,
    /// Bytes fetched by `fi_read`.
    pub read_bytes: u64,
    /// Units of ours written into buffers peers granted (`fi_write`).
    pub writes: u64,
    /// Units peers wrote into buffers granted here.
    pub landed: u64,
    /// Bytes of those units.
    pub landed_bytes: u64,
    /// Units that went eagerly because their registration failed.
    pub fallbacks: u64,
    /// Links failed because a read missed its deadline.
    pub read_timeouts: u64,
    /// Reads whose completion was ignored (`SimulatedFault::HungRead`).
    pub simulated_hung_reads: u64,
    /// Eager pieces sent from the application's bytes, not copied
    /// (`Ep::send_in_place`, `RdmEp::send_in_place`).
    pub pieces_in_place: u64,
    /// Units whose epilogue went after their descriptor ([`LATE_EPILOGUE`]).
    pub late_epilogues: u64,
}

impl Counters {
    /// The counters by stable name, with whether rendezvous is on and the
    /// gauges of buffers exposed and reads in flight (`(exposed, reading)`).
    pub fn values(&self, enabled: bool, in_use: (usize, usize)) -> Vec<(&'static str, u64)> {
        vec![
            ("rendezvous_enabled", u64::from(enabled)),
            ("rendezvous_sent", self.sent),
            ("rendezvous_in_place", self.in_place),
            ("rendezvous_read", self.read),
            ("rendezvous_read_bytes", self.read_bytes),
            ("rendezvous_writes", self.writes),
            ("rendezvous_landed", self.landed),
            ("rendezvous_landed_bytes", self.landed_bytes),
            ("rendezvous_fallbacks", self.fallbacks),
            ("read_timeouts", self.read_timeouts),
            ("simulated_hung_reads", self.simulated_hung_reads),
            ("pieces_in_place", self.pieces_in_place),
            ("rendezvous_late_epilogues", self.late_epilogues),
            ("rendezvous_exposed", in_use.0 as u64),
            ("rendezvous_reading", in_use.1 as u64),
        ]
    }
}

/// The sending side of one link: units exposed and not yet answered,
/// oldest first, and one exposed whose descriptor is not sent yet.
#[derive(Debug, Default)]
pub struct Exposures {
    /// Ids exposed (or held for a write), oldest first, and whether a
    /// write of the unit was posted.
    exposed: VecDeque<(u32, bool)>,
    unsent: Option<Described>,
    /// The queue's front unit could not be exposed: it goes eagerly.
    eager_front: bool,
    /// Units written into the peer's grants whose "written" is not sent
    /// yet.
    pub need_written: Vec<u32>,
    /// Late epilogues not sent yet: the unit's id, the words, their length.
    pub need_epilogue: Vec<(u32, [u8; EPILOGUE_MAX], usize)>,
    /// Units held for a write whose epilogue is computed once the write is
    /// posted ([`Exposures::write_posted`]).
    epilogue_after_write: Vec<(u32, Box<Frame>)>,
}

impl Exposures {
    /// Nothing exposed, nothing waiting to be described.
    pub fn is_idle(&self) -> bool {
        self.exposed.is_empty()
            && self.unsent.is_none()
            && self.need_written.is_empty()
            && self.need_epilogue.is_empty()
    }

    /// Whether something of this side waits for a transmit slot (or a
    /// credit) outside the link's queue: a descriptor staged but not sent,
    /// "written" or late epilogues owed. A link whose queue is empty still
    /// has output then, and must be flushed when a slot or credit frees.
    pub fn owes_posts(&self) -> bool {
        self.unsent.is_some() || !self.need_written.is_empty() || !self.need_epilogue.is_empty()
    }

    /// Whether the queue's front unit (`front_len` bytes, `front_sent` of
    /// them sent eagerly) goes by rendezvous: it then must not be sent in
    /// pieces, even while [`RNDV_MAX`] units are exposed.
    pub fn wants(&self, enabled: bool, front_sent: usize, front_len: Option<usize>) -> bool {
        enabled
            && !self.eager_front
            && front_sent == 0
            && front_len.is_some_and(|n| n > RNDV_THRESHOLD)
    }

    /// The descriptor to send next, if any: the one not sent yet, else the
    /// queue's front unit exposed now if it goes by rendezvous and fewer
    /// than [`RNDV_MAX`] are exposed. A unit whose registration fails stays
    /// at the front, marked to go eagerly.
    pub fn stage(
        &mut self,
        enabled: bool,
        outbox: &mut Outbox,
        counters: &mut Counters,
        expose: impl FnOnce(OutUnit) -> Result<Described, Box<(FabricError, OutUnit)>>,
    ) -> Option<Described> {
        if self.unsent.is_none()
            && self.exposed.len() < RNDV_MAX
            && self.wants(enabled, outbox.front_sent(), outbox.front_len())
        {
            let unit = outbox.take_front()?;
            match expose(unit) {
                Ok(x) => self.unsent = Some(x),
                Err(refused) => {
                    let (e, unit) = *refused;
                    tracing::debug!(error = %e, "rendezvous registration failed; sending eagerly");
                    counters.fallbacks += 1;
                    outbox.put_front(unit);
                    self.eager_front = true;
                }
            }
        }
        self.unsent.clone()
    }

    /// The staged descriptor went: it now waits for its answer. A late
    /// epilogue is computed now, while the peer reads the unit, and owed
    /// ([`Exposures::need_epilogue`]); that of a unit held for a write once
    /// the write is posted ([`Exposures::write_posted`]), while the unit
    /// moves.
    pub fn sent(&mut self, counters: &mut Counters) {
        if let Some(d) = self.unsent.take() {
            self.exposed.push_back((d.x.id, false));
            counters.sent += 1;
            counters.in_place += u64::from(d.in_place);
            match d.late {
                Some(frame) if d.x.write => self.epilogue_after_write.push((d.x.id, frame)),
                Some(frame) => self.owe_epilogue(d.x.id, &frame, counters),
                None => {}
            }
        }
    }

    /// The write of unit `id` into the peer's grant is posted: its late
    /// epilogue is computed now, and sent before its "written" (both owed).
    pub fn write_posted(&mut self, id: u32, counters: &mut Counters) {
        if let Some(i) = self.epilogue_after_write.iter().position(|e| e.0 == id) {
            let (_, frame) = self.epilogue_after_write.swap_remove(i);
            self.owe_epilogue(id, &frame, counters);
        }
        self.need_written.push(id);
    }

    fn owe_epilogue(&mut self, id: u32, frame: &Frame, counters: &mut Counters) {
        let (words, len) = frame.epilogue_bytes();
        self.need_epilogue.push((id, words, len));
        counters.late_epilogues += 1;
    }

    /// The queue's front unit went (eagerly): the next one may go by
    /// rendezvous again.
    pub fn front_gone(&mut self) {
        self.eager_front = false;
    }

    /// The peer read unit `id`: returns whether it was exposed (then the
    /// caller unexposes it).
    pub fn done(&mut self, id: u32) -> bool {
        match self.exposed.iter().position(|&(x, _)| x == id) {
            Some(i) => {
                self.exposed.remove(i);
                self.epilogue_after_write.retain(|e| e.0 != id);
                true
            }
            None => false,
        }
    }

    /// Every exposed unit's id, for a link that goes (the caller unexposes
    /// them).
    pub fn drain(&mut self) -> Vec<u32> {
        let mut ids: Vec<u32> = self.exposed.drain(..).map(|(x, _)| x).collect();
        ids.extend(self.unsent.take().map(|d| d.x.id));
        self.need_written.clear();
        self.need_epilogue.clear();
        self.epilogue_after_write.clear();
        ids
    }

    /// The peer granted a buffer for unit `id`: returns whether it is ours
    /// to write now (described, held for a write and not written yet); the
    /// caller posts the write and then owes the peer a "written".
    pub fn granted(&mut self, id: u32) -> bool {
        match self.exposed.iter_mut().find(|(x, _)| *x == id) {
            Some((_, written)) if !*written => {
                *written = true;
                true
            }
            _ => false,
        }
    }
}

/// A rendezvous message a link owes its peer besides its data: a late
/// epilogue, a grant, "written" or an answer (`RNDV_DONE`). Both endpoint
/// types send them in the order [`Owed::next`] gives, each under their own
/// kind of message, with the body [`Owed::encode`] writes.
#[derive(Clone, Copy, Debug)]
pub enum Owed {
    /// A unit's late epilogue: the unit's id, the words, their length.
    Epilogue(u32, [u8; EPILOGUE_MAX], usize),
    /// A buffer granted for the peer's unit to be written into.
    Grant(u32, Landing),
    /// Our unit was written into the peer's grant.
    Written(u32),
    /// The peer's unit arrived: it may let it go.
    Done(u32),
}

/// The kinds of message a transport sends [`Owed`] as on its wire.
#[derive(Clone, Copy, Debug)]
pub struct OwedKinds {
    pub epilogue: u8,
    pub grant: u8,
    pub written: u8,
    pub done: u8,
}

/// Bytes of an [`Owed`] message's body at most.
pub const OWED_MAX: usize = EPILOGUE_MSG_MAX;
const _: () = assert!(OWED_MAX >= GRANT_LEN && OWED_MAX >= DONE_LEN);

impl Owed {
    /// What the link owes next, if anything. Late epilogues go first,
    /// oldest first: a receiver then has a unit's epilogue by the time its
    /// write is announced, and places it before taking the unit.
    pub fn next(x: &Exposures, r: &Receiving) -> Option<Owed> {
        if let Some(&(unit, words, len)) = x.need_epilogue.first() {
            return Some(Owed::Epilogue(unit, words, len));
        }
        if let Some(&(unit, landing)) = r.need_grant.last() {
            return Some(Owed::Grant(unit, landing));
        }
        if let Some(&unit) = x.need_written.last() {
            return Some(Owed::Written(unit));
        }
        r.need_done.last().map(|&unit| Owed::Done(unit))
    }

    /// Its kind of message on a wire that numbers them `kinds`.
    pub fn kind(&self, kinds: &OwedKinds) -> u8 {
        match self {
            Owed::Epilogue(..) => kinds.epilogue,
            Owed::Grant(..) => kinds.grant,
            Owed::Written(_) => kinds.written,
            Owed::Done(_) => kinds.done,
        }
    }

    /// Writes the message's body into `buf` (at least [`OWED_MAX`] bytes);
    /// returns its length.
    pub fn encode(&self, buf: &mut [u8]) -> usize {
        match *self {
            Owed::Epilogue(unit, words, len) => encode_epilogue(buf, unit, &words[..len]),
            Owed::Grant(unit, landing) => encode_grant(buf, unit, landing),
            Owed::Written(unit) | Owed::Done(unit) => {
                buf[..DONE_LEN].copy_from_slice(&unit.to_le_bytes());
                DONE_LEN
            }
        }
    }

    /// It was posted: no longer owed.
    pub fn posted(self, x: &mut Exposures, r: &mut Receiving) {
        match self {
            Owed::Epilogue(..) => drop(x.need_epilogue.remove(0)),
            Owed::Grant(..) => drop(r.need_grant.pop()),
            Owed::Written(_) => drop(x.need_written.pop()),
            Owed::Done(_) => drop(r.need_done.pop()),
        }
    }
}

/// The receiving side of one link: the read in flight (later messages
/// wait for it) and the answers owed to the sender.
#[derive(Debug, Default)]
pub struct Receiving {
    /// The fi_read in flight.
    pub reading: Option<Reading>,
    /// Answers to send (the sender's ids).
    pub need_done: Vec<u32>,
    /// Grants to send: the sender's id and the buffer its unit goes into.
    pub need_grant: Vec<(u32, Landing)>,
    /// Reads still to start whose completion is to be ignored
    /// (`SimulatedFault::HungRead`).
    pub reads_to_hang: u32,
    /// Late epilogues that came before their unit did: the sender's id,
    /// the words, their length. At most [`RNDV_MAX`]: no more units may be
    /// exposed.
    epilogues: Vec<(u32, [u8; EPILOGUE_MAX], usize)>,
    /// The unit read (or written) whose late epilogue has not come yet.
    parked: Option<Bytes>,
}

impl Receiving {
    /// Whether answers or grants wait for a transmit slot (as
    /// [`Exposures::owes_posts`]).
    pub fn owes_posts(&self) -> bool {
        !self.need_done.is_empty() || !self.need_grant.is_empty()
    }

    /// `SimulatedFault::HungRead`: the link's next read is hung. Refused
    /// (`Unavailable`) by a transport without rendezvous (`rndv` false).
    pub fn hang_next_read(
        &mut self,
        rndv: bool,
        kind: &TransportKind,
    ) -> Result<(), TransportError> {
        if !rndv {
            return Err(TransportError::Unavailable {
                kind: kind.clone(),
                reason: format!(
                    "cannot simulate {:?}: no rendezvous on these endpoints",
                    SimulatedFault::HungRead
                ),
            });
        }
        self.reads_to_hang += 1;
        Ok(())
    }

    /// The link posted the read of the sender's unit `their_id`, or granted
    /// it the buffer kept under context `granted` (the unit comes by the
    /// peer's write); its epilogue comes late into `late_room` bytes
    /// ([`Offered::late_room`]) or not. It is in flight from now, and hung
    /// if one was asked for.
    pub fn started(
        &mut self,
        their_id: u32,
        granted: Option<u64>,
        late_room: Option<usize>,
        counters: &mut Counters,
    ) {
        let hung = self.reads_to_hang > 0;
        if hung {
            self.reads_to_hang -= 1;
            counters.simulated_hung_reads += 1;
        }
        self.reading = Some(Reading {
            since: Instant::now(),
            their_id,
            hung,
            granted,
            late_room,
        });
    }

    /// The link's read completed (see [`finish_read`]): on success its
    /// answer is owed. `None`: no read was in flight, or its completion is
    /// ignored (a simulated hang: it stays in flight until its deadline).
    pub(crate) fn finish(
        &mut self,
        error: Option<(i32, &'static str)>,
        buf: Option<Result<Bytes, FabricError>>,
        reasm: &mut Reassembly,
        limits: &FrameLimits,
        counters: &mut Counters,
    ) -> Option<Result<Inbound, PieceError>> {
        let reading = self.reading.filter(|r| !r.hung)?;
        let buf = match (reading.late_room, error, buf) {
            (Some(_), None, Some(Ok(unit))) => {
                // The epilogue is still on its way: the read stays in
                // flight (and under its deadline) until it comes.
                self.parked = Some(unit);
                return None;
            }
            (_, _, buf) => buf.map(|b| b.map_err(|e| e.to_string())),
        };
        Some(self.finished(reading, error, buf, reasm, limits, counters))
    }

    /// The late epilogue of the unit in flight, if it came already: to be
    /// placed where the unit lands ([`msgr_fabric::RmaBuffers::place_tail`],
    /// before the unit is taken from the endpoint), from then on no longer
    /// late. An error if it does not fit after the read.
    pub fn epilogue_to_place(&mut self) -> Result<Option<Vec<u8>>, PieceError> {
        let Some(reading) = self.reading.as_mut() else {
            return Ok(None);
        };
        let Some(room) = reading.late_room else {
            return Ok(None);
        };
        let Some(i) = self.epilogues.iter().position(|e| e.0 == reading.their_id) else {
            return Ok(None);
        };
        let (_, words, len) = self.epilogues.swap_remove(i);
        if len > room {
            let e = DescError::BadEpilogue("larger than the bytes after the read");
            return Err(PieceError::Malformed(e.to_string()));
        }
        reading.late_room = None;
        Ok(Some(words[..len].to_vec()))
    }

    /// Places the late epilogue of the unit landing under `context` on
    /// `rma`, if it came already ([`Receiving::epilogue_to_place`]).
    pub(crate) fn place_epilogue(
        &mut self,
        rma: &mut RmaBuffers,
        context: u64,
    ) -> Result<(), PieceError> {
        if let Some(words) = self.epilogue_to_place()? {
            rma.place_tail(context, &words)
                .map_err(|e| PieceError::Malformed(format!("late epilogue: {e}")))?;
        }
        Ok(())
    }

    /// A late epilogue came (`body`, see [`encode_epilogue`]): the unit it
    /// completes, if that unit was read already and waits for it; else it
    /// is kept for its unit ([`Receiving::epilogue_to_place`]). Refused if
    /// malformed, or if it would be one more kept than units may be
    /// exposed.
    pub(crate) fn epilogue_arrived(
        &mut self,
        body: &[u8],
        reasm: &mut Reassembly,
        limits: &FrameLimits,
        counters: &mut Counters,
    ) -> Result<Option<Result<Inbound, PieceError>>, PieceError> {
        let malformed = |e: DescError| PieceError::Malformed(e.to_string());
        let (id, words) = decode_epilogue(body).map_err(malformed)?;
        let waiting = self
            .reading
            .filter(|r| r.their_id == id && !r.hung && self.parked.is_some());
        let Some(reading) = waiting else {
            if self.epilogues.len() >= RNDV_MAX {
                return Err(malformed(DescError::BadEpilogue(
                    "more than units may be exposed",
                )));
            }
            let mut kept = [0u8; EPILOGUE_MAX];
            kept[..words.len()].copy_from_slice(words);
            self.epilogues.push((id, kept, words.len()));
            return Ok(None);
        };
        let (Some(room), Some(unit)) = (reading.late_room, self.parked.take()) else {
            return Err(malformed(DescError::BadEpilogue(
                "for a unit that has its own",
            )));
        };
        let buf = Some(place_epilogue(unit, room, words));
        Ok(Some(
            self.finished(reading, None, buf, reasm, limits, counters),
        ))
    }

    /// The unit of `reading` is whole: decoded and counted, its answer
    /// owed if it is good.
    fn finished(
        &mut self,
        reading: Reading,
        error: Option<(i32, &'static str)>,
        buf: Option<Result<Bytes, String>>,
        reasm: &mut Reassembly,
        limits: &FrameLimits,
        counters: &mut Counters,
    ) -> Result<Inbound, PieceError> {
        self.reading = None;
        self.parked = None;
        let by_write = reading.granted.is_some();
        let unit = finish_read(error, buf, by_write, reasm, limits, counters);
        if unit.is_ok() {
            self.need_done.push(reading.their_id);
        }
        unit
    }
}

/// `unit` with `words` as its last bytes, where its zero epilogue lies
/// (within the `room` bytes after what was read); why not, if they do not
/// fit there.
fn place_epilogue(unit: Bytes, room: usize, words: &[u8]) -> Result<Bytes, String> {
    let Some(at) = unit
        .len()
        .checked_sub(words.len())
        .filter(|_| words.len() <= room)
    else {
        return Err(DescError::BadEpilogue("larger than the bytes after the read").to_string());
    };
    // A read's buffer is the transport's alone by now: no copy (a granted
    // one is lent by its pool, but a write's epilogue comes before its
    // "written" and was placed already).
    let mut unit = unit
        .try_into_mut()
        .unwrap_or_else(|shared| shared[..].into());
    unit[at..].copy_from_slice(words);
    Ok(unit.freeze())
}

/// A read in flight.
#[derive(Clone, Copy, Debug)]
pub struct Reading {
    /// When it was posted (see [`overdue`]).
    pub since: Instant,
    /// The sender's id, for the answer.
    pub their_id: u32,
    /// Its completion is ignored (`SimulatedFault::HungRead`).
    pub hung: bool,
    /// The unit comes by the peer's write into the buffer granted under
    /// this context; `None`: by our `fi_read`.
    pub granted: Option<u64>,
    /// The unit's epilogue comes late ([`LATE_EPILOGUE`]), into at most
    /// this many bytes at its end.
    pub late_room: Option<usize>,
}

impl Receiving {
    /// The peer says it wrote unit `their_id`: the context of the buffer
    /// granted for it, if that is the unit this link waits for.
    pub fn written(&self, their_id: Option<u32>) -> Result<u64, DescError> {
        self.reading
            .and_then(|r| r.granted.filter(|_| Some(r.their_id) == their_id))
            .ok_or(DescError::UnknownWritten(their_id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exposed(len: u64, check: u64) -> Exposed {
        Exposed {
            id: 7,
            addr: 0x1000,
            len,
            key: 42,
            check,
            word: None,
            write: false,
        }
    }

    fn with_word(mut x: Exposed) -> Exposed {
        x.word = Some(RemoteWord {
            addr: 0x2000,
            key: 43,
        });
        x
    }

    fn described(len: u64, check: u64, inline: &[u8], at: usize) -> Vec<u8> {
        describe(exposed(len, check), inline, at)
    }

    fn describe(x: Exposed, inline: &[u8], at: usize) -> Vec<u8> {
        let mut b = vec![0u8; DESC_MAX];
        let d = Described {
            x,
            inline: inline.to_vec(),
            at,
            in_place: false,
            late: None,
        };
        let n = encode(&mut b, &d);
        b.truncate(n);
        b
    }

    fn desc(len: u64) -> Vec<u8> {
        described(len, 0x5eed, &[], 0)
    }

    #[test]
    fn descriptor_round_trips() {
        let b = desc(100_000);
        let d = decode(&b, 1 << 20, false).unwrap();
        assert_eq!(
            d,
            Offered {
                x: exposed(100_000, 0x5eed),
                inline: &[],
                at: 0,
                late: false,
            }
        );
        let b = described(100_000, 0, b"headtail", 4);
        let d = decode(&b, 1 << 20, false).unwrap();
        assert_eq!(
            d,
            Offered {
                x: exposed(100_000, 0),
                inline: b"headtail",
                at: 4,
                late: false,
            }
        );
        // A check word apart: the read may land among the inline bytes.
        let x = with_word(exposed(100_000, 0x5eed));
        let b = describe(x, b"headtail", 4);
        let d = decode(&b, 1 << 20, false).unwrap();
        assert_eq!(
            d,
            Offered {
                x,
                inline: b"headtail",
                at: 4,
                late: false,
            }
        );
        assert_eq!(decode_done(&7u32.to_le_bytes()), Some(7));
    }

    /// A unit held for a write: its descriptor names nothing to read and
    /// round-trips with the flag; one that names an address, a key or a
    /// check word anyway is refused. A grant round-trips too.
    #[test]
    fn write_descriptors_and_grants_round_trip() {
        let held = Exposed {
            addr: 0,
            key: 0,
            write: true,
            ..exposed(100_000, 0)
        };
        let b = describe(held, b"headtail", 4);
        let d = decode(&b, 1 << 20, false).unwrap();
        assert_eq!(
            d,
            Offered {
                x: held,
                inline: b"headtail",
                at: 4,
                late: false,
            }
        );
        for bad in [
            Exposed { addr: 1, ..held },
            Exposed { key: 1, ..held },
            Exposed { check: 9, ..held },
        ] {
            let b = describe(bad, b"headtail", 4);
            assert_eq!(
                decode(&b, 1 << 20, false),
                Err(DescError::BadWord(WRITE_ME))
            );
        }
        let landing = Landing {
            addr: 0xdead_beef,
            key: 77,
        };
        let mut g = [0u8; GRANT_LEN];
        assert_eq!(encode_grant(&mut g, 5, landing), GRANT_LEN);
        assert_eq!(decode_grant(&g), Some((5, landing)));
        assert_eq!(decode_grant(&g[..GRANT_LEN - 1]), None);
    }

    /// Capabilities: each end says how it moves units; a link uses an
    /// operation only if both ends do.
    #[test]
    fn capabilities_name_the_operation() {
        for op in [None, Some(RmaOp::Read), Some(RmaOp::Write)] {
            assert_eq!(peer_op(&caps(op)), op);
        }
        // An msgr from before the capabilities read.
        assert_eq!(peer_op(&[]), Some(RmaOp::Read));
        let (r, w) = (Some(RmaOp::Read), Some(RmaOp::Write));
        assert_eq!(link_op(r, r), r);
        assert_eq!(link_op(w, w), w);
        assert_eq!(link_op(r, w), None);
        assert_eq!(link_op(None, None), None);
    }

    /// The sending side of a write: a grant is taken once, for a unit
    /// described; the receiving side accepts "written" only for the unit
    /// it granted.
    #[test]
    fn grants_and_written_are_checked() {
        let mut x = Exposures::default();
        let mut c = Counters::default();
        let mut queue = Outbox::default();
        queue.push(OutUnit::Flat(vec![0u8; RNDV_THRESHOLD + 1]));
        let held = Exposed {
            id: 3,
            write: true,
            ..exposed(0, 0)
        };
        let staged = x.stage(true, &mut queue, &mut c, |m| {
            Ok(Described {
                x: Exposed {
                    len: m.len() as u64,
                    ..held
                },
                inline: Vec::new(),
                at: 0,
                in_place: false,
                late: None,
            })
        });
        assert!(staged.is_some());
        assert!(!x.granted(3), "granted before its descriptor went");
        x.sent(&mut c);
        assert!(!x.granted(4), "a unit never described");
        assert!(x.granted(3));
        assert!(!x.granted(3), "granted twice");
        assert!(x.done(3) && x.is_idle());

        let mut r = Receiving::default();
        assert_eq!(r.written(Some(1)), Err(DescError::UnknownWritten(Some(1))));
        r.started(1, None, None, &mut c);
        assert!(r.written(Some(1)).is_err(), "a read is not written");
        r.started(2, Some(0x99), None, &mut c);
        assert_eq!(r.written(Some(2)), Ok(0x99));
        assert!(r.written(Some(1)).is_err() && r.written(None).is_err());
        let mut reasm = Reassembly::default();
        let done = r.finish(
            None,
            Some(Ok(Bytes::from_static(&[1]))),
            &mut reasm,
            &FrameLimits::default(),
            &mut c,
        );
        assert!(done.is_some_and(|u| u.is_err()), "one byte is no frame");
        assert_eq!((c.landed, c.read), (1, 0), "counted as written, not read");
    }

    #[test]
    fn check_words_apart_are_checked() {
        // Apart, yet no word to compare.
        let b = describe(with_word(exposed(100, 0)), b"ab", 1);
        assert_eq!(decode(&b, 1 << 20, false), Err(DescError::BadWord(1)));
        // Flags this side does not know.
        let mut b = desc(100);
        b[56] = 2;
        assert_eq!(decode(&b, 1 << 20, false), Err(DescError::BadWord(2)));
        // The word is not part of the read: a frame of the limit and no
        // more, and a read of 8 bytes is not just a word.
        let limit = with_word(exposed(1 << 20, 9));
        assert!(decode(&describe(limit, &[], 0), 1 << 20, false).is_ok());
        let over = with_word(exposed((1 << 20) + 1, 9));
        assert_eq!(
            decode(&describe(over, &[], 0), 1 << 20, false),
            Err(DescError::TooLarge {
                len: (1 << 20) + 1,
                max: 1 << 20
            })
        );
        let eight = with_word(exposed(CHECK_LEN as u64, 9));
        assert!(decode(&describe(eight, &[], 0), 1 << 20, false).is_ok());
    }

    #[test]
    fn misplaced_reads_are_typed_errors() {
        // Past the inline bytes.
        assert_eq!(
            decode(&described(100, 0, b"ab", 3), 1 << 20, false),
            Err(DescError::Placement { at: 3, inline: 2 })
        );
        // Inline bytes after a check word.
        assert_eq!(
            decode(&described(100, 9, b"ab", 1), 1 << 20, false),
            Err(DescError::Placement { at: 1, inline: 2 })
        );
        // The frame is the read and the inline bytes together.
        assert_eq!(
            decode(&described(1 << 20, 0, b"ab", 0), 1 << 20, false),
            Err(DescError::TooLarge {
                len: (1 << 20) + 2,
                max: 1 << 20
            })
        );
        assert_eq!(
            decode(&described(0, 0, b"ab", 0), 1 << 20, false),
            Err(DescError::Empty)
        );
    }

    /// A large frame whose other segments and CRCs fit a descriptor.
    fn big_frame(body: usize, front: usize) -> Frame {
        Frame::new(
            msgr_proto::Tag::Message,
            vec![
                Bytes::from(vec![1u8; 40]),
                Bytes::from(vec![2u8; front]),
                Bytes::from((0..body).map(|i| i as u8).collect::<Vec<_>>()),
            ],
        )
    }

    /// Only a peer whose set-up said so gets late epilogues: an msgr from
    /// before them reads (or grants) without the flag.
    #[test]
    fn late_epilogues_are_negotiated() {
        assert!(peer_late_epilogue(&caps(Some(RmaOp::Read))));
        assert!(peer_late_epilogue(&caps(Some(RmaOp::Write))));
        assert!(!peer_late_epilogue(&caps(None)));
        for old in [&[CAPS_TAG, CAPS_READS][..], &[CAPS_TAG, CAPS_WRITES], &[]] {
            assert!(!peer_late_epilogue(old), "{old:?}");
        }
        assert_eq!(peer_op(&caps(Some(RmaOp::Read))), Some(RmaOp::Read));
        assert_eq!(peer_op(&caps(Some(RmaOp::Write))), Some(RmaOp::Write));
    }

    /// The flag round-trips and says where the epilogue may go; a unit
    /// whose check word ends it has no room for one. The epilogue's own
    /// message is checked before anything is taken from it.
    #[test]
    fn late_descriptors_and_epilogues_round_trip() {
        let mut b = vec![0u8; DESC_MAX];
        let d = Described {
            x: with_word(exposed(100_000, 0x5eed)),
            inline: b"headtail".to_vec(),
            at: 4,
            in_place: true,
            late: Some(Box::new(big_frame(10, 0))),
        };
        let n = encode(&mut b, &d);
        let got = decode(&b[..n], 1 << 20, false).unwrap();
        assert!(got.late);
        assert_eq!(got.late_room(), Some(4));
        let plain = desc(100_000);
        assert_eq!(decode(&plain, 1 << 20, false).unwrap().late_room(), None);
        // A check word at the end of the read, and a late epilogue.
        let at_end = Described {
            x: exposed(100_000, 0x5eed),
            inline: Vec::new(),
            at: 0,
            ..d
        };
        let n = encode(&mut b, &at_end);
        assert_eq!(
            decode(&b[..n], 1 << 20, false),
            Err(DescError::BadWord(LATE_EPILOGUE))
        );

        let mut m = [0u8; EPILOGUE_MSG_MAX];
        let n = encode_epilogue(&mut m, 9, &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(
            decode_epilogue(&m[..n]),
            Ok((9, &[1, 2, 3, 4, 5, 6, 7, 8][..]))
        );
        let bad = DescError::BadEpilogue("not a CRC per segment");
        for (body, why) in [
            (&[9, 0, 0][..], DescError::BadEpilogue("short")),
            (&[9, 0, 0, 0, 0], bad.clone()),
            (&[9, 0, 0, 0, 3, 1, 2, 3], bad.clone()),
            (&[9, 0, 0, 0, 20], bad.clone()),
            (&[9, 0, 0, 0, 8, 1, 2, 3, 4], bad),
        ] {
            assert_eq!(decode_epilogue(body), Err(why), "{body:?}");
        }
    }

    /// A unit for a peer that takes its epilogue late is the unit it would
    /// otherwise be, once its epilogue is computed: in the slots (eager)
    /// and in one buffer alike.
    #[test]
    fn late_units_resolve_to_the_frame() {
        let frame = big_frame(1 << 20, 100);
        let want = frame.encode_to_vec().unwrap();
        let mut arena = ByteArena::new(SMALL_ARENA);
        let unit = encode_unit(Transmit::Frame(frame.clone()), true, true, &mut arena).unwrap();
        assert!(matches!(unit, OutUnit::SplitLate(_)));
        assert_eq!(unit.len(), want.len());
        assert!(unit.flatten() == want);
        let mut unit = encode_unit(Transmit::Frame(frame.clone()), true, true, &mut arena).unwrap();
        unit.resolve_epilogue();
        assert_eq!(
            unit,
            encode_unit(Transmit::Frame(frame.clone()), true, false, &mut arena).unwrap()
        );
        // Not late when the epilogue is known already (sealed data), nor
        // without exposure in place, nor below the threshold.
        let sealed = frame.clone().with_segment_checksum(2);
        let unit = encode_unit(Transmit::Frame(sealed), true, true, &mut arena).unwrap();
        assert!(matches!(unit, OutUnit::Split(_)));
        assert!(unit.flatten() == want);
        let unit = encode_unit(Transmit::Frame(frame), false, true, &mut arena).unwrap();
        assert!(matches!(unit, OutUnit::Frame(_)));
        let unit =
            encode_unit(Transmit::Frame(big_frame(1000, 0)), true, true, &mut arena).unwrap();
        assert!(matches!(unit, OutUnit::Small(_)));
    }

    /// A unit that landed before its late epilogue waits for it; an
    /// epilogue that came first is handed out to be placed; a wrong one
    /// fails the unit's checksum, one that does not fit or one too many
    /// is refused.
    #[test]
    fn a_unit_waits_for_its_late_epilogue() {
        let limits = FrameLimits::default();
        let mut c = Counters::default();
        let mut reasm = Reassembly::default();
        let banner = [0u8; msgr_proto::banner::BANNER_LEN];
        assert!(matches!(
            reasm.push(true, &banner, &limits),
            Ok(Some(Inbound::Banner(_)))
        ));
        let frame = big_frame(100_000, 0);
        let want = frame.encode_to_vec().unwrap();
        let (words, len) = frame.epilogue_bytes();
        let words = &words[..len];
        let landed = {
            let mut v = want.clone();
            let n = v.len();
            v[n - len..].fill(0);
            Bytes::from(v)
        };
        let room = Some(len + 40);
        let epilogue = |id: u32, w: &[u8]| {
            let mut m = [0u8; EPILOGUE_MSG_MAX];
            let n = encode_epilogue(&mut m, id, w);
            m[..n].to_vec()
        };
        let frame_of = |u: Result<Inbound, PieceError>| match u {
            Ok(Inbound::Frame(f)) => f,
            other => panic!("{other:?}"),
        };

        // Landed first: parked until the epilogue comes.
        let mut r = Receiving::default();
        r.started(5, None, room, &mut c);
        assert!(r
            .finish(None, Some(Ok(landed.clone())), &mut reasm, &limits, &mut c)
            .is_none());
        assert!(r.reading.is_some() && r.need_done.is_empty());
        let got = r
            .epilogue_arrived(&epilogue(5, words), &mut reasm, &limits, &mut c)
            .unwrap()
            .expect("the unit");
        assert_eq!(frame_of(got), frame);
        assert!(r.reading.is_none() && r.need_done == [5]);

        // The epilogue first: kept, then handed out once its unit is in
        // flight, and the unit is no longer late.
        let mut r = Receiving::default();
        let kept = r.epilogue_arrived(&epilogue(6, words), &mut reasm, &limits, &mut c);
        assert!(matches!(kept, Ok(None)));
        r.started(6, None, room, &mut c);
        assert_eq!(r.epilogue_to_place().unwrap().as_deref(), Some(words));
        assert_eq!(r.epilogue_to_place().unwrap(), None);
        let unit = r.finish(
            None,
            Some(Ok(Bytes::from(want.clone()))),
            &mut reasm,
            &limits,
            &mut c,
        );
        assert_eq!(frame_of(unit.expect("not parked")), frame);

        // A wrong epilogue: the unit fails its check.
        let mut r = Receiving::default();
        r.started(7, None, room, &mut c);
        assert!(r
            .finish(None, Some(Ok(landed.clone())), &mut reasm, &limits, &mut c)
            .is_none());
        let wrong = vec![0xee; len];
        let got = r.epilogue_arrived(&epilogue(7, &wrong), &mut reasm, &limits, &mut c);
        assert!(
            matches!(got, Ok(Some(Err(PieceError::Corrupt(_))))),
            "{got:?}"
        );

        // Larger than the bytes after the read, parked or placed.
        let mut r = Receiving::default();
        r.started(8, None, Some(len - 4), &mut c);
        assert!(r
            .finish(None, Some(Ok(landed.clone())), &mut reasm, &limits, &mut c)
            .is_none());
        let got = r.epilogue_arrived(&epilogue(8, words), &mut reasm, &limits, &mut c);
        assert!(
            matches!(got, Ok(Some(Err(PieceError::Malformed(_))))),
            "{got:?}"
        );
        let mut r = Receiving::default();
        assert!(matches!(
            r.epilogue_arrived(&epilogue(9, words), &mut reasm, &limits, &mut c),
            Ok(None)
        ));
        r.started(9, None, Some(len - 4), &mut c);
        assert!(matches!(
            r.epilogue_to_place(),
            Err(PieceError::Malformed(_))
        ));

        // No more kept than units may be exposed.
        let mut r = Receiving::default();
        for id in 0..RNDV_MAX as u32 {
            let kept = r.epilogue_arrived(&epilogue(100 + id, words), &mut reasm, &limits, &mut c);
            assert!(matches!(kept, Ok(None)));
        }
        let one_more = r.epilogue_arrived(&epilogue(200, words), &mut reasm, &limits, &mut c);
        assert!(
            matches!(one_more, Err(PieceError::Malformed(_))),
            "{one_more:?}"
        );
    }

    /// Whatever a peer sends as a descriptor, a grant, an answer or a late
    /// epilogue, in whatever order: a typed error or a value, never a
    /// panic. (Seeded, so a failure repeats.)
    #[test]
    fn arbitrary_wire_input_is_an_error_or_a_value() {
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let limits = FrameLimits::default();
        let mut c = Counters::default();
        let mut reasm = Reassembly::default();
        let mut r = Receiving::default();
        for round in 0..20_000u32 {
            let len = (next() % (DESC_MAX as u64 + 8)) as usize;
            let mut body: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            // Small lengths and ids often enough to reach past the checks.
            if let Some(b) = body.get_mut(4) {
                *b %= 24;
            }
            if let Some(b) = body.get_mut(0) {
                *b %= 8;
            }
            if round % 2 == 0 {
                for b in body.iter_mut().skip(1).take(3) {
                    *b = 0;
                }
            }
            let _ = decode(&body, 1 << 20, round % 7 == 0);
            let _ = decode_grant(&body);
            let _ = decode_done(&body);
            if let Ok(d) = decode(&body, 1 << 20, false) {
                assert!(d.at <= d.inline.len());
                assert!(d.late_room().is_none_or(|room| room <= d.inline.len()));
            }
            if let Ok((_, words)) = decode_epilogue(&body) {
                assert!(words.len() % 4 == 0 && words.len() <= EPILOGUE_MAX);
            }
            match next() % 4 {
                0 => r.started(
                    u32::from(body.first().copied().unwrap_or(0)),
                    None,
                    Some(len % 20),
                    &mut c,
                ),
                1 => {
                    let unit = Bytes::from(body.clone());
                    let _ = r.finish(None, Some(Ok(unit)), &mut reasm, &limits, &mut c);
                }
                2 => {
                    if r.epilogue_arrived(&body, &mut reasm, &limits, &mut c)
                        .is_err()
                    {
                        r = Receiving::default();
                    }
                }
                _ => {
                    if r.epilogue_to_place().is_err() {
                        r = Receiving::default();
                    }
                }
            }
        }
    }

    /// Queued units move on every push and pop: the large variants are
    /// boxed so that a unit is a small frame's `Bytes` and a tag.
    #[test]
    fn a_queued_unit_is_small_to_move() {
        assert!(std::mem::size_of::<OutUnit>() <= 40);
    }

    #[test]
    fn units_split_around_their_largest_segment_and_read_back_whole() {
        for (frame, split) in [
            (big_frame(RNDV_THRESHOLD + 1, 0), true),
            (big_frame(1 << 20, 100), true),
            // The rest does not fit a descriptor: one buffer.
            (big_frame(1 << 20, INLINE_MAX), false),
            // Not that large: its encoded parts.
            (big_frame(SMALL_UNIT, 0), false),
            // Small: encoded into the arena.
            (big_frame(1000, 0), false),
        ] {
            let mut arena = ByteArena::new(SMALL_ARENA);
            let want = frame.encode_to_vec().unwrap();
            let small = want.len() < SMALL_UNIT;
            assert_eq!(
                encode_unit(Transmit::Frame(frame.clone()), false, false, &mut arena).unwrap(),
                if small {
                    OutUnit::Small(Bytes::from(want.clone()))
                } else {
                    OutUnit::Frame(Box::new(frame.clone().into_encoded().unwrap()))
                },
                "without exposure in place: the encoded frame as it is"
            );
            let unit = encode_unit(Transmit::Frame(frame), true, false, &mut arena).unwrap();
            assert_eq!(matches!(unit, OutUnit::Split { .. }), split);
            assert_eq!(matches!(unit, OutUnit::Small(_)), small);
            assert_eq!(unit.len(), want.len());
            // Eager pieces of every size put it back together.
            for piece in [1, 7, 4096, 65_535, want.len()] {
                let mut got = vec![0u8; want.len()];
                let mut at = 0;
                while at < want.len() {
                    let end = (at + piece).min(want.len());
                    assert_eq!(unit.copy_out(at, &mut got[at..end]), end - at);
                    at = end;
                }
                assert!(got == want, "piece {piece}");
            }
            // As the reader lays it out: head, what was read, tail.
            if let OutUnit::Split(s) = &unit {
                let mut got = s.head.clone();
                got.extend_from_slice(&s.body);
                got.extend_from_slice(&s.tail);
                assert!(got == want);
            }
            assert!(unit.flatten() == want);
        }
    }

    #[test]
    fn bad_descriptors_are_typed_errors() {
        for n in 0..DESC_LEN {
            assert_eq!(
                decode(&desc(100)[..n], 1 << 20, false),
                Err(DescError::Short(n))
            );
        }
        assert_eq!(decode(&desc(0), 1 << 20, false), Err(DescError::Empty));
        assert_eq!(
            decode(&desc(CHECK_LEN as u64), 1 << 20, false),
            Err(DescError::Empty),
            "a check word and nothing else"
        );
        // A frame of the limit with its check word is fine; one more is not.
        assert!(decode(&desc((1 << 20) + CHECK_LEN as u64), 1 << 20, false).is_ok());
        assert_eq!(
            decode(&desc((1 << 20) + CHECK_LEN as u64 + 1), 1 << 20, false),
            Err(DescError::TooLarge {
                len: (1 << 20) + CHECK_LEN as u64 + 1,
                max: 1 << 20
            })
        );
        assert_eq!(
            decode(&desc(u64::MAX), 1 << 20, false),
            Err(DescError::TooLarge {
                len: u64::MAX,
                max: 1 << 20
            })
        );
        assert_eq!(
            decode(&desc(100), 1 << 20, true),
            Err(DescError::InsideUnit)
        );
        assert_eq!(decode_done(&[1, 2, 3]), None);
    }

    #[test]
    fn a_hung_read_stays_in_flight_until_its_deadline() {
        let mut r = Receiving::default();
        let mut c = Counters::default();
        r.reads_to_hang = 1;
        r.started(9, None, None, &mut c);
        assert_eq!(c.simulated_hung_reads, 1);
        let mut reasm = Reassembly::default();
        let limits = FrameLimits::default();
        // Its completion is ignored: still in flight, nothing owed.
        assert!(r
            .finish(
                None,
                Some(Ok(Bytes::from_static(&[1]))),
                &mut reasm,
                &limits,
                &mut c
            )
            .is_none());
        let reading = r.reading.expect("still reading");
        assert!(reading.hung && r.need_done.is_empty() && c.read == 0);
        let t = Duration::from_secs(2);
        assert!(!overdue(reading.since, reading.since + t, t));
        assert!(overdue(reading.since, reading.since + t * 2, t));
        // The next read is not hung.
        r.reading = None;
        r.started(10, None, None, &mut c);
        assert!(r.reading.is_some_and(|x| !x.hung));
        assert_eq!(c.simulated_hung_reads, 1);
    }

    #[test]
    fn exposures_bound_and_fall_back() {
        let mut x = Exposures::default();
        let mut c = Counters::default();
        let mut queue = Outbox::default();
        for _ in 0..6 {
            queue.push(OutUnit::Flat(vec![0u8; RNDV_THRESHOLD + 1]));
        }
        let mut next = 0;
        for _ in 0..RNDV_MAX {
            let got = x.stage(true, &mut queue, &mut c, |m| {
                next += 1;
                Ok(Described {
                    x: Exposed {
                        id: next,
                        addr: 0,
                        len: m.len() as u64,
                        key: 1,
                        check: 3,
                        word: None,
                        write: false,
                    },
                    inline: Vec::new(),
                    at: 0,
                    in_place: false,
                    late: None,
                })
            });
            assert!(got.is_some());
            x.sent(&mut c);
        }
        // Full: nothing staged, and the front must not go eagerly either.
        assert!(x
            .stage(true, &mut queue, &mut c, |_| unreachable!())
            .is_none());
        assert!(x.wants(true, 0, queue.front_len()));
        assert!(x.done(1) && !x.done(1));
        // A failed registration: the unit stays in front, goes eagerly.
        let got = x.stage(true, &mut queue, &mut c, |m| {
            Err(Box::new((FabricError::Slot(0), m)))
        });
        assert!(got.is_none());
        assert_eq!(queue.len(), 2);
        assert!(!x.wants(true, 0, queue.front_len()));
        x.front_gone();
        assert_eq!((c.sent, c.fallbacks), (RNDV_MAX as u64, 1));
        assert_eq!(x.drain().len(), RNDV_MAX - 1);
        assert!(x.is_idle());
    }
}
