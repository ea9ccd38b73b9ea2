//! Accepted links before their session is known: handshake admission
//! (the policy is `admission`'s), the acceptor sessions' handshakes, and
//! routing an identified link to the worker and session it belongs to.

use std::net::IpAddr;
use std::time::Instant;

use mio::Token;
use msgr_backends::Transport;
use msgr_proto::{
    session::Hello, Banner, Inbound, LinkId, Session, SessionEvent, Takeover, Transmit,
};
use rand::{rngs::StdRng, Rng, SeedableRng};
use rustc_hash::FxHashMap;

use super::admission::{admit, Admit, PendingLink, WaitingLink, WaitingLinks, WAITING_PER_SLOT};
use super::events::count_protocol_error;
use super::{LinkEntry, Owner, Slot, Worker};
use crate::connection::Connection;
use crate::counters::Counters;
use crate::state::{owner_of, peer_key, Adoption, Command};
use msgr_addr::EntityAddr;

/// Accepted links on their way to a session.
pub(super) struct Handshakes {
    pub(super) pending: FxHashMap<LinkId, PendingLink>,
    /// Accepted links waiting for room in `pending`.
    pub(super) waiting: WaitingLinks,
    /// Passes of the event loop so far (handshake admission counts them).
    pub(super) passes: u64,
    /// Cookies of the sessions accepted here.
    pub(super) rng: StdRng,
}

impl Handshakes {
    pub(super) fn new() -> Handshakes {
        Handshakes {
            pending: FxHashMap::default(),
            waiting: WaitingLinks::default(),
            passes: 0,
            rng: StdRng::from_os_rng(),
        }
    }
}

impl Worker {
    /// A transport accepted `link` on `listener`. Bounded handshake state
    /// (admission module): an idle pending link gives way, or the new one
    /// waits for a slot or is refused.
    pub(super) fn on_accepted(
        &mut self,
        link: LinkId,
        listener: Token,
        source: IpAddr,
        now: Instant,
    ) {
        let Some(&(t, _)) = self.net.listeners.iter().find(|(_, tok)| *tok == listener) else {
            self.net
                .transports
                .iter_mut()
                .for_each(|x| x.close(link, false));
            return;
        };
        let cfg = &self.shared.cfg;
        let (total, per_source) = (cfg.max_handshakes, cfg.max_handshakes_per_source);
        let passes = self.handshakes.passes;
        match admit(&self.handshakes.pending, source, passes, total, per_source) {
            Admit::Yes => {}
            Admit::Evict(old) => {
                Counters::add(&self.shared.counters.handshakes_evicted, 1);
                self.drop_pending(old);
            }
            Admit::Refuse if self.waiting_room(source) => {
                self.wait_for_slot(link, t, source, now);
                return;
            }
            Admit::Refuse => {
                Counters::add(&self.shared.counters.handshakes_refused, 1);
                self.net.transports[t].close(link, false);
                return;
            }
        }
        Counters::add(&self.shared.counters.links_active, 1);
        let entry = LinkEntry {
            transport: t,
            owner: Owner::Pending,
        };
        self.net.links.insert(link, entry);
        self.start_pending(link, source, None, now);
    }

    /// A burst: `link` waits, unread, for a handshake slot. The banner goes
    /// now: the peer's banner timer (2 s) is shorter than a burst's wait.
    fn wait_for_slot(&mut self, link: LinkId, t: usize, source: IpAddr, now: Instant) {
        let counters = &self.shared.counters;
        Counters::add(&counters.handshakes_waited, 1);
        Counters::add(&counters.links_active, 1);
        self.net.transports[t].pause_reading(link, true);
        let cfg = &self.shared.cfg.session;
        let banner = Banner::for_session(cfg.payload_crc, cfg.security.modes);
        let deadline = now + cfg.handshake_timeout;
        let entry = LinkEntry {
            transport: t,
            owner: Owner::Waiting,
        };
        self.net.links.insert(link, entry);
        let waiting = WaitingLink {
            source,
            transport: t,
            deadline,
            early: Vec::new(),
        };
        self.handshakes.waiting.push(link, waiting);
        self.timers.wake_by(deadline);
        self.transmit(t, link, Transmit::Banner(banner.encode()), now);
    }

    /// Gives an accepted link its acceptor session and starts its
    /// handshake; one that waited for its slot brings the units that came
    /// before its reading paused, and sent its banner already.
    pub(super) fn start_pending(
        &mut self,
        link: LinkId,
        source: IpAddr,
        waited: Option<Vec<Inbound>>,
        now: Instant,
    ) {
        let mut session = Session::accept(
            self.shared.cfg.session.clone(),
            self.shared.local.clone(),
            link,
            now,
        );
        let early = match waited {
            Some(early) => {
                // The session's first transmit is its banner, the one sent
                // when the link started waiting (same configuration).
                let banner = session.poll_transmit(now);
                debug_assert!(matches!(banner, Some((_, Transmit::Banner(_)))));
                early
            }
            None => Vec::new(),
        };
        for unit in early {
            if let Err(e) = session.handle_inbound(link, unit, now) {
                count_protocol_error(&self.shared.counters, &e);
                break;
            }
        }
        self.handshakes.pending.insert(
            link,
            PendingLink {
                session,
                source,
                since: now,
                since_pass: self.handshakes.passes,
            },
        );
        self.drive_pending(link, now);
    }

    /// Closes the links that waited for a handshake slot too long, and
    /// starts the handshakes of those that have one now (admission).
    pub(super) fn admit_waiting(&mut self, now: Instant) {
        if self.handshakes.waiting.is_empty() {
            return;
        }
        for (link, _) in self.handshakes.waiting.expired(now) {
            self.close_waiting(link);
        }
        let cfg = &self.shared.cfg;
        let (total, per_source) = (cfg.max_handshakes, cfg.max_handshakes_per_source);
        for (link, w) in
            self.handshakes
                .waiting
                .admissible(&self.handshakes.pending, total, per_source)
        {
            if let Some(e) = self.net.links.get_mut(&link) {
                e.owner = Owner::Pending;
            }
            self.net.transports[w.transport].pause_reading(link, false);
            self.start_pending(link, w.source, Some(w.early), now);
        }
        if let Some(d) = self.handshakes.waiting.next_deadline() {
            self.timers.wake_by(d);
        }
    }

    /// Whether a link from `source` may wait for a handshake slot: there
    /// is room, or a source with more waiting gave a link up for it.
    pub(super) fn waiting_room(&mut self, source: IpAddr) -> bool {
        if self.handshakes.waiting.len() < WAITING_PER_SLOT * self.shared.cfg.max_handshakes {
            return true;
        }
        let Some((link, _)) = self.handshakes.waiting.make_room_for(source) else {
            return false;
        };
        self.close_waiting(link);
        true
    }

    /// Closes a waiting link (admission): it brought more than one may.
    pub(super) fn drop_waiting(&mut self, link: LinkId) {
        self.handshakes.waiting.remove(link);
        self.close_waiting(link);
    }

    /// Closes a link taken out of the waiting queue, counted refused.
    pub(super) fn close_waiting(&mut self, link: LinkId) {
        if let Some(e) = self.forget_link(link) {
            Counters::add(&self.shared.counters.handshakes_refused, 1);
            self.net.transports[e.transport].close(link, false);
        }
    }

    /// Closes a pending link to make room for another (admission).
    pub(super) fn drop_pending(&mut self, link: LinkId) {
        self.handshakes.pending.remove(&link);
        if let Some(e) = self.forget_link(link) {
            self.net.transports[e.transport].close(link, false);
        }
    }

    /// Drives a not-yet-routed accepted link's session.
    pub(super) fn drive_pending(&mut self, link: LinkId, now: Instant) {
        let Some(t) = self.net.links.get(&link).map(|e| e.transport) else {
            return;
        };
        loop {
            let Some(p) = self.handshakes.pending.get_mut(&link) else {
                return;
            };
            let mut out = std::mem::take(&mut self.driving.outbox);
            while let Some(tx) = p.session.poll_transmit(now) {
                out.push(tx);
            }
            for (l, unit) in out.drain(..) {
                self.transmit(t, l, unit, now);
            }
            self.driving.outbox = out;
            let Some(p) = self.handshakes.pending.get_mut(&link) else {
                return;
            };
            let ev = p.session.poll_event();
            tracing::debug!(worker = self.idx, ?link, event = ?ev, "pending link event");
            match ev {
                Some(SessionEvent::Identified(hello)) => {
                    let Some(p) = self.handshakes.pending.remove(&link) else {
                        return;
                    };
                    self.route(link, t, p.session, hello, now);
                    return;
                }
                Some(SessionEvent::CloseLink(l)) => {
                    self.forget_link(l);
                    self.net.transports[t].close(l, true);
                }
                Some(_) => {}
                None => break,
            }
        }
        if self
            .handshakes
            .pending
            .get(&link)
            .is_some_and(|p| p.session.is_closed())
        {
            self.handshakes.pending.remove(&link);
        } else if let Some(tm) = self
            .handshakes
            .pending
            .get(&link)
            .and_then(|p| p.session.poll_timeout())
        {
            self.timers.wake_by(tm);
        }
    }

    /// An accepted link's peer said hello: hand it to the worker that owns its session.
    pub(super) fn route(
        &mut self,
        link: LinkId,
        t: usize,
        session: Session,
        hello: Hello,
        now: Instant,
    ) {
        let owner = owner_of(&peer_key(&hello.addr), self.shared.workers.len());
        if owner == self.idx {
            self.route_local(link, t, session, hello, now);
            return;
        }
        match self.net.transports[t].detach(link) {
            Some(detached) => {
                self.net.links.remove(&link);
                let transport = self.net.transports[t].kind();
                self.shared.workers[owner].submit(Command::Adopt(Box::new(Adoption {
                    link,
                    detached,
                    session,
                    hello,
                    transport,
                })));
            }
            // A backend whose links cannot move: the session lives here.
            None => self.route_local(link, t, session, hello, now),
        }
    }

    /// Attaches an identified link to its session here: resume, race, or new.
    pub(super) fn route_local(
        &mut self,
        link: LinkId,
        t: usize,
        mut session: Session,
        hello: Hello,
        now: Instant,
    ) {
        let pk = peer_key(&hello.addr);
        let cookie = self.handshakes.rng.random::<u64>() | 1;
        if let Some(&key) = self.by_peer.get(&pk) {
            if let Some(slot) = self.sessions.get_mut(&key) {
                match slot
                    .session
                    .take_link(link, &hello, &mut session, cookie, now)
                {
                    Takeover::Accepted => {
                        if let Some(e) = self.net.links.get_mut(&link) {
                            e.owner = Owner::Session(key);
                        }
                        if slot.transport != t {
                            // The peer resumed its session over another
                            // transport (an address vector on its side).
                            Counters::add(&self.shared.counters.transport_changes, 1);
                            tracing::info!(
                                peer = %hello.addr,
                                from = ?self.net.transports[slot.transport].kind(),
                                to = ?self.net.transports[t].kind(),
                                "session resumed over another transport"
                            );
                        }
                        slot.transport = t;
                        self.touch(key);
                        return;
                    }
                    Takeover::Rejected(frame) => {
                        self.refuse(link, t, session.refusal(frame));
                        return;
                    }
                    Takeover::Impostor { frame, why } => {
                        Counters::add(&self.shared.counters.impostors_refused, 1);
                        tracing::warn!(
                            worker = self.idx,
                            claimed = %hello.name,
                            addr = %hello.addr,
                            %why,
                            "refused a link that claims an authenticated session"
                        );
                        self.refuse(link, t, session.refusal(frame));
                        return;
                    }
                    Takeover::Ending => {
                        // A new session begins below and takes the peer's
                        // routing and registry entries; the old one ends
                        // on its own.
                        self.by_peer.remove(&pk);
                        self.shared.unregister(key, &hello.addr);
                    }
                }
            }
        }
        if hello.cookie != 0 {
            let refusal = session.refusal(Session::reject_unknown());
            self.refuse(link, t, refusal);
            return;
        }
        session.accept_new(cookie, now);
        self.open_accepted(link, t, session, &hello, pk);
    }

    /// Starts the session an accepted link's new peer begins here (its
    /// handle is the registry's, if the application connected to it).
    fn open_accepted(
        &mut self,
        link: LinkId,
        t: usize,
        session: Session,
        hello: &Hello,
        pk: EntityAddr,
    ) {
        let key = self.shared.next_session_key();
        let conn = {
            let mut reg = self.shared.registry.lock();
            let inner = reg.entry(pk.clone()).or_insert_with(|| {
                let conn = Connection::new(
                    self.shared.clone(),
                    key,
                    self.idx,
                    hello.addr.clone(),
                    session.policy(),
                    None,
                );
                conn.inner
            });
            Connection::from_inner(inner.clone())
        };
        let key = conn.inner.key;
        if let Some(e) = self.net.links.get_mut(&link) {
            e.owner = Owner::Session(key);
        }
        self.by_peer.insert(pk, key);
        Counters::add(&self.shared.counters.sessions_active, 1);
        self.sessions.insert(key, Slot::new(session, conn, t, true));
        self.touch(key);
    }
}
