//! A link's outgoing units, in order, and how they are cut into pieces of
//! at most one message each — the same on both endpoint types, which differ
//! only in how a piece is posted (a flag byte on a connected endpoint, a
//! header with credits and a sequence number on a shared one).

use std::collections::VecDeque;

use bytes::Bytes;

use super::rendezvous::{Exposures, FrontQueue, OutUnit};
use super::IN_PLACE_MIN;

/// The units a link has queued to send, oldest first, and how far the
/// front one went in pieces.
#[derive(Debug, Default)]
pub(crate) struct Outbox {
    queue: VecDeque<OutUnit>,
    /// Bytes of the front unit already sent.
    front_sent: usize,
    /// Bytes queued and not sent (the link's backlog).
    queued: usize,
}

/// The next piece of the front unit: where it starts, how long it is,
/// whether it ends the unit, and its bytes where they can go from where
/// they lie instead of being copied into a slot.
#[derive(Debug)]
pub(crate) struct Piece {
    from: usize,
    pub(crate) len: usize,
    pub(crate) last: bool,
    pub(crate) shared: Option<Bytes>,
}

impl Outbox {
    pub(crate) fn push(&mut self, unit: OutUnit) {
        self.queued += unit.len();
        self.queue.push_back(unit);
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Units queued (the front one included while part of it is sent).
    pub(crate) fn len(&self) -> usize {
        self.queue.len()
    }

    /// Bytes queued and not sent yet.
    pub(crate) fn backlog(&self) -> usize {
        self.queued
    }

    /// Bytes of the front unit sent already: a unit under way goes on in
    /// pieces, never by rendezvous.
    pub(crate) fn front_sent(&self) -> usize {
        self.front_sent
    }

    /// Bytes of the front unit, if any.
    pub(crate) fn front_len(&self) -> Option<usize> {
        self.queue.front().map(OutUnit::len)
    }

    /// Takes the front unit (none of it sent) out, to go another way (by
    /// rendezvous); [`Outbox::put_front`] puts it back if it cannot.
    pub(crate) fn take_front(&mut self) -> Option<OutUnit> {
        debug_assert_eq!(self.front_sent, 0, "a unit taken out half sent");
        let unit = self.queue.pop_front()?;
        self.queued -= unit.len();
        Some(unit)
    }

    pub(crate) fn put_front(&mut self, unit: OutUnit) {
        self.queued += unit.len();
        self.queue.push_front(unit);
    }

    /// The front unit's next piece of at most `max` bytes, or `None` if
    /// nothing is queued or the front unit waits to go by rendezvous
    /// (`rndv`: the link moves large units so; see [`Exposures::wants`]).
    /// `in_place`: the endpoint can send a piece from where it lies.
    /// Nothing is spent until [`Outbox::piece_sent`].
    #[inline]
    pub(crate) fn next_piece(
        &mut self,
        exposures: &Exposures,
        rndv: bool,
        max: usize,
        in_place: bool,
    ) -> Option<Piece> {
        let from = self.front_sent;
        let front = self.queue.front_mut()?;
        if exposures.wants(rndv, from, Some(front.len())) {
            return None; // a large unit waiting for fewer exposed
        }
        if from == 0 {
            // It goes eagerly: an epilogue kept for a late send is due now.
            front.resolve_epilogue();
        }
        let left = front.len() - from;
        let len = left.min(max);
        let shared = (len >= IN_PLACE_MIN && in_place)
            .then(|| front.shared(from, len))
            .flatten();
        Some(Piece {
            from,
            len,
            last: len == left,
            shared,
        })
    }

    /// Copies `piece`'s bytes into `dst` (at least `piece.len` long).
    pub(crate) fn copy_out(&self, piece: &Piece, dst: &mut [u8]) {
        if let Some(front) = self.queue.front() {
            front.copy_out(piece.from, &mut dst[..piece.len]);
        }
    }

    /// `piece` (from [`Outbox::next_piece`]) was posted: the front unit
    /// moves on, or goes with its last piece.
    pub(crate) fn piece_sent(&mut self, piece: &Piece, exposures: &mut Exposures) {
        self.queued -= piece.len;
        if piece.last {
            self.queue.pop_front();
            self.front_sent = 0;
            exposures.front_gone();
        } else {
            self.front_sent += piece.len;
        }
    }
}

impl FrontQueue for Outbox {
    fn front_sent(&self) -> usize {
        Outbox::front_sent(self)
    }

    fn front_len(&self) -> Option<usize> {
        Outbox::front_len(self)
    }

    fn take_front(&mut self) -> Option<OutUnit> {
        Outbox::take_front(self)
    }

    fn put_front(&mut self, unit: OutUnit) {
        Outbox::put_front(self, unit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flat(n: usize) -> OutUnit {
        OutUnit::Flat((0..n).map(|i| i as u8).collect())
    }

    #[test]
    fn units_go_in_pieces_in_order() {
        let (mut out, mut x) = (Outbox::default(), Exposures::default());
        out.push(flat(10));
        out.push(flat(3));
        assert_eq!((out.len(), out.backlog()), (2, 13));
        let mut got = Vec::new();
        while let Some(p) = out.next_piece(&x, false, 4, false) {
            let mut buf = [0u8; 4];
            out.copy_out(&p, &mut buf);
            got.push((buf[..p.len].to_vec(), p.last));
            out.piece_sent(&p, &mut x);
        }
        let want: Vec<(Vec<u8>, bool)> = vec![
            (vec![0, 1, 2, 3], false),
            (vec![4, 5, 6, 7], false),
            (vec![8, 9], true),
            (vec![0, 1, 2], true),
        ];
        assert_eq!(got, want);
        assert!(out.is_empty() && out.backlog() == 0 && out.front_sent() == 0);
    }

    #[test]
    fn a_piece_not_sent_is_offered_again() {
        let (mut out, x) = (Outbox::default(), Exposures::default());
        out.push(flat(6));
        let a = out.next_piece(&x, false, 4, false).unwrap();
        let b = out.next_piece(&x, false, 4, false).unwrap();
        assert_eq!((a.from, a.len, a.last), (b.from, b.len, b.last));
        assert_eq!(out.backlog(), 6);
    }

    #[test]
    fn a_large_unit_waits_for_its_rendezvous() {
        let (mut out, x) = (Outbox::default(), Exposures::default());
        out.push(flat(super::super::rendezvous::RNDV_THRESHOLD + 1));
        assert!(out.next_piece(&x, true, 1 << 20, false).is_none());
        // Without a rendezvous on the link it goes in pieces.
        assert!(out.next_piece(&x, false, 1 << 20, false).is_some());
        let unit = out.take_front().unwrap();
        assert!(out.is_empty() && out.backlog() == 0);
        out.put_front(unit);
        assert_eq!(out.backlog(), super::super::rendezvous::RNDV_THRESHOLD + 1);
    }
}
