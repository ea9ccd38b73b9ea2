//! Received pieces joined into units: both transports cut a unit larger
//! than a slot into pieces (MSG: `MORE` / `LAST` messages; RDM: data
//! pieces), and the receiving link's [`Reassembly`] joins them, bounded by
//! the frame limits, and decodes the whole unit; a rendezvous unit arrives
//! whole ([`super::rendezvous`]). Apart from either transport because both
//! use it.

use bytes::{Bytes, BytesMut};
use msgr_proto::arena::ByteArena;
use msgr_proto::banner::BANNER_LEN;
use msgr_proto::frame::{Preamble, PREAMBLE_LEN};
use msgr_proto::{FrameError, FrameLimits, Inbound, LinkFailure, LinkId, ProtocolError};

use crate::TransportEvent;

/// Why a received piece ends its link.
#[derive(Debug)]
pub(crate) enum PieceError {
    /// Not what the sender of this backend sends (the link fails).
    Malformed(String),
    /// An operation the piece needed failed (the link fails).
    Failed(LinkFailure),
    /// A whole unit that does not decode (reported as `Corrupt`).
    Corrupt(FrameError),
}

impl PieceError {
    /// What link `id` reports as it ends for this error.
    pub(crate) fn event(self, id: LinkId) -> TransportEvent {
        match self {
            PieceError::Malformed(why) => TransportEvent::Failed(id, LinkFailure::Protocol(why)),
            PieceError::Failed(why) => TransportEvent::Failed(id, why),
            PieceError::Corrupt(e) => TransportEvent::Corrupt(id, ProtocolError::Frame(e)),
        }
    }
}

/// Reports a rendezvous unit of link `id` that is whole: `Received`, or
/// the error that ends the link. Returns whether the link goes on (if not,
/// the caller drops it).
pub(crate) fn report_unit(
    id: LinkId,
    unit: Result<Inbound, PieceError>,
    events: &mut Vec<TransportEvent>,
) -> bool {
    let (event, goes_on) = match unit {
        Ok(unit) => (TransportEvent::Received(id, unit), true),
        Err(e) => (e.event(id), false),
    };
    events.push(event);
    goes_on
}

/// The frame length the preamble at the start of `first` announces, once
/// its CRC and the limits are checked; 0 if `first` is shorter than a
/// preamble (the whole unit is checked when it is decoded).
fn announced_len(first: &[u8], limits: &FrameLimits) -> Result<usize, FrameError> {
    let Some(raw) = first.first_chunk::<PREAMBLE_LEN>() else {
        return Ok(0);
    };
    Preamble::decode(raw, limits).map(|p| usize::try_from(p.frame_len()).unwrap_or(usize::MAX))
}

/// A unit arriving in pieces (each at most a slot), joined and decoded: a
/// link's first unit is its banner, every later one a frame.
#[derive(Debug)]
pub(crate) struct Reassembly {
    partial: BytesMut,
    banner_seen: bool,
    /// Where a unit that came in one piece is copied out of its receive
    /// slot (small units share a chunk; see [`ByteArena`]).
    arena: ByteArena,
}

/// Bytes of each chunk of a link's receive arena: units up to a quarter of
/// it (4 KiB, an shm slot) are copied into it.
const RX_ARENA: usize = 16 << 10;

/// A unit in several pieces reserves what its preamble announces (checked
/// against the limits) up to this much when its first piece comes, instead
/// of growing by doubling — which copied a 1 MiB unit's bytes about once
/// more and allocated five times. The reservation is virtual until the
/// pieces fill it; beyond this the buffer grows as it did.
const RESERVE_AHEAD_MAX: usize = 16 << 20;

impl Default for Reassembly {
    fn default() -> Self {
        Reassembly {
            partial: BytesMut::new(),
            banner_seen: false,
            arena: ByteArena::new(RX_ARENA),
        }
    }
}

impl Reassembly {
    /// Whether no unit is half joined.
    pub(crate) fn is_idle(&self) -> bool {
        self.partial.is_empty()
    }

    /// A whole unit that came in one buffer (the RDM rendezvous): a frame,
    /// decoded without another copy. Must come at a unit boundary, after
    /// the banner.
    pub(crate) fn whole(
        &mut self,
        unit: Bytes,
        limits: &FrameLimits,
    ) -> Result<Inbound, PieceError> {
        if !self.partial.is_empty() || !self.banner_seen {
            return Err(PieceError::Malformed(
                "a whole unit inside another or before the banner".into(),
            ));
        }
        Inbound::decode_exact(unit, limits).map_err(PieceError::Corrupt)
    }

    /// Adds one piece (`last`: the unit ends here); returns the unit once whole.
    /// A unit is bounded by the frame limit before anything is kept.
    pub(crate) fn push(
        &mut self,
        last: bool,
        body: &[u8],
        limits: &FrameLimits,
    ) -> Result<Option<Inbound>, PieceError> {
        let max = (limits.max_frame as usize).max(BANNER_LEN);
        if self.partial.len() + body.len() > max {
            return Err(PieceError::Malformed(format!(
                "unit larger than the frame limit {max}"
            )));
        }
        if !last {
            if self.partial.is_empty() && self.banner_seen {
                // A bad preamble fails the link now, not after the limit's
                // worth of pieces.
                let len = announced_len(body, limits).map_err(PieceError::Corrupt)?;
                self.partial.reserve(len.min(RESERVE_AHEAD_MAX));
            }
            self.partial.extend_from_slice(body);
            return Ok(None);
        }
        let whole = if self.partial.is_empty() {
            self.arena.copy(body)
        } else {
            self.partial.extend_from_slice(body);
            self.partial.split().freeze()
        };
        if !self.banner_seen {
            let banner = <[u8; BANNER_LEN]>::try_from(&whole[..])
                .map_err(|_| PieceError::Malformed(format!("banner of {} bytes", whole.len())))?;
            self.banner_seen = true;
            return Ok(Some(Inbound::Banner(banner)));
        }
        Inbound::decode_exact(whole, limits)
            .map(Some)
            .map_err(PieceError::Corrupt)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use msgr_proto::Frame;

    use crate::fabric::SLOT_SIZE;

    /// A unit in pieces: the first piece's preamble is checked at once
    /// (a bad one fails the link before the limit's worth of pieces is
    /// buffered) and the whole frame is reserved in one allocation; the
    /// pieces then join into the frame that was sent.
    #[test]
    fn reassembly_reserves_what_the_preamble_announces() {
        let limits = FrameLimits::default();
        let frame = Frame::new(
            msgr_proto::Tag::Message,
            vec![
                Bytes::from_static(b"header"),
                Bytes::from(vec![3u8; 200_000]),
            ],
        );
        let wire = frame.encode_to_vec().unwrap();
        let mut r = Reassembly::default();
        assert!(matches!(
            r.push(true, &[0; BANNER_LEN], &limits),
            Ok(Some(Inbound::Banner(_)))
        ));
        let (first, rest) = wire.split_at(SLOT_SIZE - 1);
        assert!(r.push(false, first, &limits).unwrap().is_none());
        assert!(
            r.partial.capacity() >= wire.len(),
            "{}",
            r.partial.capacity()
        );
        match r.push(true, rest, &limits) {
            Ok(Some(Inbound::Frame(f))) => assert_eq!(f.encode_to_vec().unwrap(), wire),
            other => panic!("{other:?}"),
        }
        // The same first piece with its preamble's CRC broken.
        let mut bad = first.to_vec();
        bad[PREAMBLE_LEN - 1] ^= 1;
        assert!(matches!(
            r.push(false, &bad, &limits),
            Err(PieceError::Corrupt(FrameError::PreambleCrc { .. }))
        ));
    }
}
