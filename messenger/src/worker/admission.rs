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

use std::net::IpAddr;
use std::time::Instant;

use msgr_proto::{LinkId, Session};
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
    /// No room and nothing idle to make room: refuse the new link.
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
}
