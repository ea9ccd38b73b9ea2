//! Units handed to a link, the same on both endpoint types
//! ([`Queueing`]): a small frame is posted at once where the link can take
//! it so, else the unit is encoded ([`rendezvous::encode_unit`]) and queued;
//! a unit queued behind nothing is posted at once rather than at the pass's
//! flush. Each transport says how it reaches a link and posts.

use msgr_proto::arena::ByteArena;
use msgr_proto::{LinkId, Transmit};

use super::outbox::Outbox;
use super::rendezvous::{self, OutUnit};
use crate::dirty::DirtyLinks;
use crate::{TransportError, TransportEvent};

/// A link's part: its queue, and what it says of its output and its peer.
pub(super) trait QueuedLink {
    fn outbox(&mut self) -> &mut Outbox;
    /// Whether it has something to post: queued units, or control that
    /// waits outside the queue.
    fn has_output(&self) -> bool;
    /// Whether its peer takes a unit's epilogue after its descriptor
    /// ([`rendezvous::peer_late_epilogue`]).
    fn peer_late(&self) -> bool;
}

/// The parts of a transport its sending uses: where small frames are
/// encoded ([`OutUnit::Small`]); whether a large frame's segment may be
/// exposed where it lies (the endpoints have `FI_RMA`); the links marked
/// for the pass's flush; events found outside a poll, reported by the next.
pub(super) type SendParts<'a> = (
    &'a mut ByteArena,
    bool,
    &'a mut DirtyLinks,
    &'a mut Vec<TransportEvent>,
);

/// A transport's part, and the sending it shares ([`Queueing::send_unit`]).
pub(super) trait Queueing {
    type Link: QueuedLink;

    fn link_mut(&mut self, id: LinkId) -> Option<&mut Self::Link>;
    /// Posts a small frame straight into a transmit slot where `id` can
    /// take it so now; gives it back where it must go the queue's way.
    fn post_small(&mut self, id: LinkId, f: Transmit) -> Result<Option<Transmit>, TransportError>;
    /// Sends what `id` has to send now.
    fn flush_link(&mut self, id: LinkId, events: &mut Vec<TransportEvent>);
    fn parts(&mut self) -> SendParts<'_>;

    /// `Transport::send`: a banner as it is; a frame posted at once
    /// ([`Queueing::post_small`]) or encoded, its epilogue late where the
    /// peer takes it so, and queued.
    fn send_unit(&mut self, link: LinkId, unit: Transmit) -> Result<(), TransportError> {
        let unit = match unit {
            Transmit::Banner(b) => OutUnit::Flat(b.to_vec()),
            unit => {
                let Some(f) = self.post_small(link, unit)? else {
                    return Ok(());
                };
                // Looked up for rendezvous units only: not per small message.
                let late = f.encoded_len() > rendezvous::RNDV_THRESHOLD
                    && self.link_mut(link).is_some_and(|l| l.peer_late());
                let (arena, in_place, _, _) = self.parts();
                rendezvous::encode_unit(f, in_place, late, arena)?
            }
        };
        self.queue(link, unit)
    }

    /// Queues `unit` on `link`: one queued behind nothing is posted at once
    /// ([`Queueing::flush_now`]); the link is marked for the pass's flush
    /// only if something is left to post.
    fn queue(&mut self, link: LinkId, unit: OutUnit) -> Result<(), TransportError> {
        let outbox = self
            .link_mut(link)
            .ok_or(TransportError::NoSuchLink(link.0))?
            .outbox();
        outbox.push(unit);
        if outbox.len() == 1 {
            self.flush_now(link);
        }
        if self.link_mut(link).is_some_and(|l| l.has_output()) {
            self.parts().2.push(link);
        }
        Ok(())
    }

    /// Posts what `id` has queued now rather than at the pass's flush, for
    /// a unit `send` queued behind nothing: a reply then leaves before the
    /// rest of the worker's pass (~0.1 µs of a 64 B shm one-way). Each unit
    /// is its own post on these endpoints, so nothing is lost by not
    /// waiting for more. A failure is reported at the next poll.
    fn flush_now(&mut self, id: LinkId) {
        let mut events = Vec::new();
        self.flush_link(id, &mut events);
        self.parts().3.append(&mut events);
    }
}
