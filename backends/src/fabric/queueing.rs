//! Units handed to a link, the same on both endpoint types
//! ([`Queueing`]): a small frame is posted at once where the link can take
//! it so, else the unit is encoded ([`rendezvous::encode_unit`]) and queued;
//! a unit queued behind nothing is posted at once rather than at the pass's
//! flush. Each transport says how it reaches a link and posts.

use msgr_proto::arena::ByteArena;
use msgr_proto::{LinkId, Transmit};

use rustc_hash::FxHashMap;

use super::common::{LinkCommon, Shared};
use super::outbox::Outbox;
use super::rendezvous::{self, OutUnit};
use crate::dirty::DirtyLinks;
use crate::{TransportError, TransportEvent};

/// A link's part: its state common to both endpoint kinds, and what it
/// says of its output, its peer and its connection.
pub(super) trait QueuedLink {
    fn common(&self) -> &LinkCommon;
    fn common_mut(&mut self) -> &mut LinkCommon;
    /// Whether it has something to post: queued units, or control that
    /// waits outside the queue.
    fn has_output(&self) -> bool;
    /// Whether it is set up (connected, or its peer's end known).
    fn up(&self) -> bool;
    /// Nothing left to send, in flight, or exposed for the peer.
    fn idle(&self) -> bool;
    /// Whether received messages wait for reading to resume.
    fn holds_received(&self) -> bool;

    fn outbox(&mut self) -> &mut Outbox {
        &mut self.common_mut().outbox
    }
    /// Whether its peer takes a unit's epilogue after its descriptor
    /// ([`rendezvous::peer_late_epilogue`]).
    fn peer_late(&self) -> bool {
        self.common().peer_late
    }
}

/// A transport's links by id.
pub(super) type Links<L> = FxHashMap<LinkId, L>;

/// What a transport's sending keeps between calls, the same on both
/// endpoint types.
#[derive(Debug)]
pub(super) struct Outgoing {
    /// Where small frames are encoded ([`OutUnit::Small`]).
    pub(super) tx_arena: ByteArena,
    /// The links marked for the pass's flush.
    pub(super) dirty: DirtyLinks,
    /// Links whose reading resumed with held receives.
    pub(super) resumed: Vec<LinkId>,
    /// Events found outside an event-reporting call (a set-up deadline,
    /// an injected abort, a failed send posted by `send` itself), reported
    /// by the next poll.
    pub(super) deferred_events: Vec<TransportEvent>,
}

impl Default for Outgoing {
    fn default() -> Self {
        Outgoing {
            tx_arena: ByteArena::new(rendezvous::SMALL_ARENA),
            dirty: DirtyLinks::default(),
            resumed: Vec::new(),
            deferred_events: Vec::new(),
        }
    }
}

/// [`Queueing`]'s accessors of a transport whose fields `shared`, `out`
/// and `links` (of `$link`s) are its parts.
macro_rules! queueing_parts {
    ($link:ty) => {
        fn shared(&self) -> &Shared {
            &self.shared
        }

        fn links(&self) -> &Links<$link> {
            &self.links
        }

        fn parts(&mut self) -> (&mut Shared, &mut Outgoing, &mut Links<$link>) {
            (&mut self.shared, &mut self.out, &mut self.links)
        }
    };
}
pub(super) use queueing_parts;

/// A transport's part, and the sending it shares ([`Queueing::send_unit`]).
pub(super) trait Queueing {
    type Link: QueuedLink;

    fn shared(&self) -> &Shared;
    fn links(&self) -> &Links<Self::Link>;
    /// The worker's state, its sending's and its links, at once.
    fn parts(&mut self) -> (&mut Shared, &mut Outgoing, &mut Links<Self::Link>);
    /// Posts a small frame straight into a transmit slot where `id` can
    /// take it so now; gives it back where it must go the queue's way.
    fn post_small(&mut self, id: LinkId, f: Transmit) -> Result<Option<Transmit>, TransportError>;
    /// Sends what `id` has to send now.
    fn flush_link(&mut self, id: LinkId, events: &mut Vec<TransportEvent>);

    fn link_mut(&mut self, id: LinkId) -> Option<&mut Self::Link> {
        self.parts().2.get_mut(&id)
    }

    fn out(&mut self) -> &mut Outgoing {
        self.parts().1
    }

    /// Whether a large frame's segment may be exposed where it lies (the
    /// endpoints have `FI_RMA`).
    fn in_place(&self) -> bool {
        self.shared().net.rma().is_some()
    }

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
                let in_place = self.in_place();
                rendezvous::encode_unit(f, in_place, late, &mut self.out().tx_arena)?
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
            self.out().dirty.push(link);
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
        self.out().deferred_events.append(&mut events);
    }
}
