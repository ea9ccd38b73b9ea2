//! A queued unit: how its bytes are copied or shared, and how it is exposed to the peer.

use bytes::Bytes;
use msgr_fabric::{FabricError, ReadRegion, RmaBuffers, CHECK_LEN};
use msgr_proto::arena::ByteArena;
use msgr_proto::frame::{EncodedFrame, PREAMBLE_LEN};
use msgr_proto::{Frame, FrameError, Transmit};

use super::{Described, DESC_LEN, RNDV_THRESHOLD, SMALL_UNIT};
use crate::regcache::RegCache;
use crate::split::{split_frame, SplitFrame};

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
    /// late ([`LATE_EPILOGUE`](super::LATE_EPILOGUE)); computed from the frame, whose segments
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

#[cfg(test)]
mod tests {
    use super::*;

    use super::super::tests::big_frame;
    use super::super::SMALL_ARENA;
    use crate::split::INLINE_MAX;

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
}
