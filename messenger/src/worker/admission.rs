//! Handshake admission: which accepted links a worker keeps while their
//! peers have not said who they are, when slots run out.
//!
//! A worker holds at most `max_handshakes` such links, and at most
//! `max_handshakes_per_source` from one IP address. A link that would pass
//! either bound makes room by closing the oldest *idle* pending link — its
//! peer has not even sent a banner, though the worker's loop went round
//! twice since it was accepted (time to read one that was sent): of the
//! same source when the source is at its share, of any source when the
//! worker is at its bound. Only when none is idle is the new link refused
//! (closed at once, nothing allocated). Links that speak are never closed
//! to make room (`handshakes_evicted`, `handshakes_refused`). Links that say
//! nothing also give their slot back after `banner_timeout_ms`, and a
//! foreign protocol is refused at its first byte (the stream decoder).
//!
//! So a flood of connections that never speak cannot lock out a client,
//! from another address or from the flood's own (several clients behind
//! one NAT, or one host's good process beside a broken one): its link
//! takes an idle one's slot and speaks at once. Refusing a source at its
//! share instead (what this module did before) kept such a client out for
//! as long as the flood lasted. Measured (issue 48, loopback, 2 shared
//! cores, share 16, a flood holding 64 idle links from 127.0.0.1 and
//! reopening each one closed): a good client from 127.0.0.1 got a ping
//! through in 20 of 20 tries by eviction (2-112 ms, once 413 ms), in 3 of
//! 20 within 6 s by refusal (after 1.0-4.7 s). Eviction does not make
//! churn dearer: the server's CPU per flood connection was about the same
//! (eviction/refusal 0.9: 20-31 us against 21-35 us in the same runs;
//! both an accept and a close, eviction's a banner more) and so was its
//! CPU under the idle flood (330-470 ms/s against 350-670 ms/s), since a
//! flood reconnects no faster than the server closes its links, either way.
//! The churn is bounded by the pass rule: a source evicts only its links
//! that had their two passes unheard (so at most its share in a pass),
//! never a link that spoke, and is refused while none is idle.
//!
//! **Bursts wait instead of being refused.** A link that finds no room and
//! nothing idle does not get refused while the worker has waiting room: it
//! is held *unread* (reading paused, no session, nothing allocated but the
//! transport's link structure: its bytes stay in the kernel's socket
//! buffer) in a first-in-first-out queue, and takes a slot as one frees —
//! its source's share and the worker's bound still hold, so a source with
//! a full share waits while other sources' links go by. The queue holds at
//! most [`WAITING_PER_SLOT`] × `max_handshakes` links (its server banner is
//! sent at once: a client's banner timer is shorter than a burst's wait); a
//! link waits at most the handshake timeout (its client gives up then
//! anyway), and is closed after it (`handshakes_refused`). With the queue
//! full, the source with the most waiting gives way: its newest waiting
//! link is closed for the new one, if that source has more waiting than the
//! new link's, else the new link is refused — so no source's burst or flood
//! keeps another's links out of the queue either. Refusing made a burst of 10,000 clients from one
//! address (many clients behind one NAT; the fan-in test) come back over
//! and over after their backoff: 33,000–42,000 refusals and 8–10 s until
//! all were up, while the server's worker was mostly idle. A flood gains
//! nothing by it: a waiting link is never read, so it pins no buffers and
//! no session, and its source's share bounds the handshakes it runs.

use std::collections::VecDeque;
use std::net::IpAddr;
use std::time::Instant;

use msgr_proto::{Inbound, LinkId, Session};
use rustc_hash::FxHashMap;

/// An accepted link whose peer has not been identified yet.
pub(crate) struct PendingLink {
    /// Its acceptor session, exchanging banners and waiting for the hello.
    pub(crate) session: Session,
    /// Where it came from.
    pub(crate) source: IpAddr,
    /// When it was accepted.
    pub(crate) since: Instant,
    /// The worker loop's pass it was accepted in.
    pub(crate) since_pass: u64,
}

/// Passes of the worker's loop an accepted link has to be heard from
/// before it counts as idle: the pass that accepted it may go on accepting
/// thousands more (a flood) before any link is read, and the next one reads
/// what its peer sent at once. Counted in passes, not time, because a
/// flood makes passes long.
const PASSES_TO_SPEAK: u64 = 2;

/// What to do with a newly accepted link.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Admit {
    /// There is room.
    Yes,
    /// Close this idle pending link first, then take the new one.
    Evict(LinkId),
    /// No room and nothing idle to make room: the new link waits for a
    /// slot ([`WaitingLinks`]), or is refused if none can wait.
    Refuse,
}

/// Decides on a link from `source` given the links `pending` now.
pub(crate) fn admit(
    pending: &FxHashMap<LinkId, PendingLink>,
    source: IpAddr,
    pass: u64,
    max_total: usize,
    max_per_source: usize,
) -> Admit {
    let idle =
        |p: &PendingLink| !p.session.heard_from_peer() && p.since_pass + PASSES_TO_SPEAK <= pass;
    let oldest_idle = |of_source: bool| {
        pending
            .iter()
            .filter(|(_, p)| idle(p) && (!of_source || p.source == source))
            .min_by_key(|(_, p)| p.since)
            .map_or(Admit::Refuse, |(l, _)| Admit::Evict(*l))
    };
    let from_source = pending.values().filter(|p| p.source == source).count();
    if from_source >= max_per_source {
        // The source's own oldest idle link gives way: a good client
        // behind the flood's address gets in (module docs). The pass rule
        // bounds the churn: a link younger than its passes is not idle.
        return oldest_idle(true);
    }
    if pending.len() >= max_total {
        return oldest_idle(false);
    }
    Admit::Yes
}

/// Links that may wait for a handshake slot, per slot (`max_handshakes`):
/// a burst of thousands from one address waits in the worker instead of
/// being refused and redialled. 16,384 by default: a burst of 10,000
/// all accepted before their handshakes run, 256 at a time for one source
/// (with 8,192, 366 and 3,051 of such a burst were refused in two runs of
/// the fan-in). A waiting link costs a socket and the transport's link
/// structure (no buffer: it is not read), a small part of a handshake's
/// memory; the sockets count against the process's descriptor limit.
pub(crate) const WAITING_PER_SLOT: usize = 16;

/// Units a waiting link may bring before it takes a slot: those a backend
/// read before its reading was paused (a banner and a hello). More means a
/// backend that does not pause, or a peer that does not wait for the
/// server's banner: it is closed.
const EARLY_UNITS: usize = 4;

/// An accepted link waiting, unread, for a handshake slot.
pub(crate) struct WaitingLink {
    /// Where it came from.
    pub(crate) source: IpAddr,
    /// Its transport (index in the worker's list).
    pub(crate) transport: usize,
    /// It is closed if it has not taken a slot by then.
    pub(crate) deadline: Instant,
    /// Units a backend read before reading was paused: the session's
    /// first input when the link takes a slot.
    pub(crate) early: Vec<Inbound>,
}

/// Accepted links waiting for a handshake slot, oldest first (module docs).
#[derive(Default)]
pub(crate) struct WaitingLinks {
    links: FxHashMap<LinkId, WaitingLink>,
    /// Arrival order; ids no longer in `links` (gone, or taken) are
    /// skipped when they come up.
    order: VecDeque<LinkId>,
    /// How many of `links` each source has.
    per_source: FxHashMap<IpAddr, usize>,
}

impl WaitingLinks {
    pub(crate) fn len(&self) -> usize {
        self.links.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.links.is_empty()
    }

    pub(crate) fn push(&mut self, link: LinkId, waiting: WaitingLink) {
        *self.per_source.entry(waiting.source).or_default() += 1;
        self.links.insert(link, waiting);
        self.order.push_back(link);
    }

    /// Takes `link` out of `links` (not out of `order`).
    fn take(&mut self, link: LinkId) -> Option<WaitingLink> {
        let w = self.links.remove(&link)?;
        if let Some(n) = self.per_source.get_mut(&w.source) {
            *n -= 1;
            if *n == 0 {
                self.per_source.remove(&w.source);
            }
        }
        Some(w)
    }

    pub(crate) fn remove(&mut self, link: LinkId) -> Option<WaitingLink> {
        let w = self.take(link)?;
        self.skip_gone();
        Some(w)
    }

    /// The queue is full and a link from `source` would wait: the link
    /// that gives way, the newest of the source with the most waiting,
    /// if that source has more than `source` — so a source is never kept
    /// out by another's burst or flood; `None`: the new link is refused.
    pub(crate) fn make_room_for(&mut self, source: IpAddr) -> Option<(LinkId, WaitingLink)> {
        let ours = self.per_source.get(&source).copied().unwrap_or(0);
        let (&largest, &n) = self.per_source.iter().max_by_key(|(_, &n)| n)?;
        if n <= ours + 1 {
            return None;
        }
        let newest = (self.order.iter().rev())
            .find(|l| self.links.get(l).is_some_and(|w| w.source == largest))
            .copied()?;
        self.take(newest).map(|w| (newest, w))
    }

    /// Keeps a unit that came for waiting `link`; `false`: it brought more
    /// than a waiting link may ([`EARLY_UNITS`]), close it.
    pub(crate) fn keep_early(&mut self, link: LinkId, unit: Inbound) -> bool {
        let Some(w) = self.links.get_mut(&link) else {
            return true;
        };
        w.early.push(unit);
        w.early.len() <= EARLY_UNITS
    }

    /// All of them, for a worker closing every link.
    pub(crate) fn drain(&mut self) -> impl Iterator<Item = (LinkId, WaitingLink)> + '_ {
        self.order.clear();
        self.per_source.clear();
        self.links.drain()
    }

    fn skip_gone(&mut self) {
        while self
            .order
            .front()
            .is_some_and(|l| !self.links.contains_key(l))
        {
            self.order.pop_front();
        }
    }

    /// The oldest link's deadline: every link waits as long, so it is the
    /// earliest.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.order
            .iter()
            .find_map(|l| self.links.get(l))
            .map(|w| w.deadline)
    }

    /// Takes out the links whose deadline has passed.
    pub(crate) fn expired(&mut self, now: Instant) -> Vec<(LinkId, WaitingLink)> {
        let mut out = Vec::new();
        self.skip_gone();
        while let Some(&l) = self.order.front() {
            if self.links.get(&l).is_some_and(|w| w.deadline > now) {
                break;
            }
            out.extend(self.take(l).map(|w| (l, w)));
            self.order.pop_front();
        }
        out
    }

    /// Takes out, oldest first, the links that have a slot now beside
    /// `pending`: within the worker's bound and their source's share. A
    /// source at its share keeps its place while others' links go by.
    pub(crate) fn admissible(
        &mut self,
        pending: &FxHashMap<LinkId, PendingLink>,
        max_total: usize,
        max_per_source: usize,
    ) -> Vec<(LinkId, WaitingLink)> {
        let mut out = Vec::new();
        let mut total = pending.len();
        if total >= max_total || self.links.is_empty() {
            return out;
        }
        let mut per_source: FxHashMap<IpAddr, usize> = FxHashMap::default();
        for p in pending.values() {
            *per_source.entry(p.source).or_default() += 1;
        }
        let mut kept = VecDeque::with_capacity(self.order.len());
        while let Some(l) = self.order.pop_front() {
            let Some(w) = self.links.get(&l) else {
                continue;
            };
            let n = per_source.entry(w.source).or_default();
            if *n < max_per_source {
                *n += 1;
                total += 1;
                out.extend(self.take(l).map(|w| (l, w)));
                if total >= max_total {
                    break;
                }
            } else {
                kept.push_back(l);
            }
        }
        kept.extend(self.order.drain(..));
        self.order = kept;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use msgr_addr::{EntityAddr, EntityName};
    use msgr_proto::{Banner, Inbound, LocalIdentity, SessionConfig};
    use std::time::Duration;

    fn link(n: u64, source: [u8; 4], since: Instant, heard: bool) -> (LinkId, PendingLink) {
        let local = LocalIdentity {
            name: EntityName::server(1),
            addr: EntityAddr::tcp(([127, 0, 0, 1], 6800).into()),
            dials: Default::default(),
        };
        let mut session = Session::accept(SessionConfig::default(), local, LinkId(n), since);
        if heard {
            let banner = Inbound::Banner(Banner::default().encode());
            session.handle_inbound(LinkId(n), banner, since).unwrap();
        }
        let p = PendingLink {
            session,
            source: IpAddr::from(source),
            since,
            since_pass: 0,
        };
        (LinkId(n), p)
    }

    #[test]
    fn the_oldest_idle_link_gives_way_and_speaking_ones_never_do() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let a = [10, 0, 0, 1];
        let b = [10, 0, 0, 2];
        let mut pending: FxHashMap<LinkId, PendingLink> = [
            link(1, a, at(5), true),
            link(2, a, at(1), false),
            link(3, a, at(3), false),
            link(4, b, at(0), true),
        ]
        .into_iter()
        .collect();
        let src = |x: [u8; 4]| IpAddr::from(x);
        assert_eq!(admit(&pending, src(b), 5, 10, 10), Admit::Yes);
        // Full: the oldest idle link anywhere (2; 4 is older but speaks).
        assert_eq!(admit(&pending, src(b), 5, 4, 10), Admit::Evict(LinkId(2)));
        // ... unless the loop has not had the passes to read it.
        assert_eq!(admit(&pending, src(b), 1, 4, 10), Admit::Refuse);
        // A source at its share closes its own oldest idle link (2; 4
        // is older but of another source) ...
        assert_eq!(admit(&pending, src(a), 5, 10, 3), Admit::Evict(LinkId(2)));
        // ... not before the loop had the passes to read it ...
        assert_eq!(admit(&pending, src(a), 1, 10, 3), Admit::Refuse);
        // ... and never one that spoke: b's only link did.
        assert_eq!(admit(&pending, src(b), 5, 10, 1), Admit::Refuse);
        assert_eq!(admit(&pending, src(b), 5, 10, 2), Admit::Yes);
        pending.remove(&LinkId(2));
        pending.remove(&LinkId(3));
        assert_eq!(
            admit(&pending, src(a), 5, 2, 10),
            Admit::Refuse,
            "nothing idle"
        );
    }

    #[test]
    fn waiting_links_take_slots_oldest_first_within_their_sources_share() {
        let t0 = Instant::now();
        let a = IpAddr::from([10, 0, 0, 1]);
        let b = IpAddr::from([10, 0, 0, 2]);
        let pending: FxHashMap<LinkId, PendingLink> =
            [link(1, [10, 0, 0, 1], t0, true)].into_iter().collect();
        let mut waiting = WaitingLinks::default();
        let wait = |source, s| WaitingLink {
            source,
            transport: 0,
            deadline: t0 + Duration::from_secs(s),
            early: Vec::new(),
        };
        // a, a, b, a, b in arrival order.
        for (n, src) in [(10, a), (11, a), (12, b), (13, a), (14, b)] {
            waiting.push(LinkId(n), wait(src, n));
        }
        let ids =
            |v: Vec<(LinkId, WaitingLink)>| v.into_iter().map(|(l, _)| l.0).collect::<Vec<_>>();
        // a has one pending of a share of 2: one of its links goes, the
        // oldest; b's go by a's that wait; the worker's bound (5) stops it.
        assert_eq!(ids(waiting.admissible(&pending, 5, 2)), [10, 12, 14]);
        assert_eq!(waiting.len(), 2);
        // The caller makes those pending; here `pending` stays as it was,
        // so a's share has room for one again: its oldest waiting link.
        assert_eq!(ids(waiting.admissible(&pending, 5, 2)), [11]);
        // A gone link is skipped; the rest time out in order.
        assert!(waiting.remove(LinkId(13)).is_some());
        assert!(waiting.is_empty());
        waiting.push(LinkId(20), wait(a, 20));
        waiting.push(LinkId(21), wait(a, 21));
        assert_eq!(waiting.next_deadline(), Some(t0 + Duration::from_secs(20)));
        assert_eq!(ids(waiting.expired(t0 + Duration::from_secs(20))), [20]);
        assert_eq!(waiting.next_deadline(), Some(t0 + Duration::from_secs(21)));
        // The worker at its bound: nothing goes.
        assert!(waiting.admissible(&pending, 1, 10).is_empty());
        // A backend that reads ahead may bring a few units, not more.
        let unit = || Inbound::Banner(msgr_proto::Banner::default().encode());
        assert!((0..EARLY_UNITS).all(|_| waiting.keep_early(LinkId(21), unit())));
        assert!(!waiting.keep_early(LinkId(21), unit()));

        // Full: the source with the most waiting gives up its newest for
        // another source, never for itself.
        let mut waiting = WaitingLinks::default();
        for (n, src) in [(30, a), (31, a), (32, b), (33, a)] {
            waiting.push(LinkId(n), wait(src, n));
        }
        assert!(waiting.make_room_for(a).is_none());
        let gave = waiting.make_room_for(b).map(|(l, _)| l.0);
        assert_eq!(gave, Some(33));
        // a 2, b 1: b's next link would make them even, so it is refused.
        assert!(waiting.make_room_for(b).is_none());
        assert_eq!(
            waiting
                .make_room_for(IpAddr::from([10, 0, 0, 3]))
                .map(|(l, _)| l.0),
            Some(31)
        );
    }
}
