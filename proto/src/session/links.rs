//! A link's life in the engine: our banner first, the handshake where
//! the banners chose one, the hello, then open (a new session) or resume
//! (replaying from the peer's ack); a fault redials, waits or ends the
//! session. Also the acceptor's routing of an accepted link to the session
//! its hello names ([`Session::take_link`]).

use std::time::Instant;

use super::{
    reset_frame, FaultReason, Hello, LinkId, LinkSecurity, ProtocolError, Session, SessionEvent,
    State, Takeover,
};
use crate::auth::{AuthError, Handshake, Role};
use crate::banner::{features, Banner, BANNER_LEN};
use crate::control::{
    control_frame, parse_handshake, with_dial_number, with_limits, HandshakeExtras, HelloOk,
    Limits, ReconnectOk,
};
use crate::frame::{Frame, Tag};
use crate::stream::Transmit;

impl Session {
    /// Acceptor: starts a new session for the hello this session received
    /// (after [`SessionEvent::Identified`]), with a fresh, unique `cookie`.
    pub fn accept_new(&mut self, cookie: u64, now: Instant) {
        debug_assert!(cookie != 0, "cookie 0 means 'new session' on the wire");
        let (link, hello) = match std::mem::replace(&mut self.state, State::Closed) {
            State::Identified { link, hello, .. } => (link, hello),
            other => {
                self.state = other;
                return;
            }
        };
        self.adopt_peer(&hello);
        self.remote.cookie = cookie;
        self.remote.key = self.link_security.peer.as_ref().map(|(_, k)| *k);
        self.remote.dials.opened_for(hello.dial);
        self.open_new(link, now);
    }

    /// The first dial of the attempt the hello this (pending) session
    /// routes goes on with (`features::FIRST_DIAL`).
    fn hello_first_dial(&self) -> Option<u64> {
        match self.state {
            State::Identified { first_dial, .. } => first_dial,
            _ => None,
        }
    }

    /// Routes an accepted link whose hello names this session's peer: resume,
    /// resolve a simultaneous connect, or refuse. `features` are those agreed on
    /// that link; `new_cookie` (random, non-zero) is used if a new session starts.
    pub fn take_link(
        &mut self,
        link: LinkId,
        hello: &Hello,
        pending: &mut Session,
        new_cookie: u64,
        now: Instant,
    ) -> Takeover {
        // Whoever this link authenticated must be the session's peer: an
        // impostor (another key, another name, or no authentication where
        // the session had it) neither resumes nor resets it.
        if let Err(why) = self.same_identity(hello, &pending.link_security) {
            return Takeover::Impostor {
                frame: reset_frame(),
                why,
            };
        }
        if (hello.cookie == 0 || hello.cookie == self.remote.cookie)
            && self.remote.dials.is_stale(hello.addr.nonce, hello.dial)
        {
            // The peer sent this hello before the session last opened or
            // resumed (over our dial, or a later one of its own), and has
            // given its dial up: it neither starts the peer over nor
            // resumes anything. Wait is harmless should anyone still read.
            // (Another cookie is refused below, as from anyone.)
            return Takeover::Rejected(control_frame(Tag::Wait, &()));
        }
        if self.is_ending() {
            if hello.cookie == 0 {
                return Takeover::Ending;
            }
            return Takeover::Rejected(reset_frame());
        }
        // The peer restarted (new nonce): the old session is gone on its side.
        let restarted =
            self.remote.addr.as_ref().is_some_and(|a| {
                a.nonce != 0 && hello.addr.nonce != 0 && a.nonce != hello.addr.nonce
            });
        // A resume must name this session, and a restarted peer has none
        // to resume. Refused before anything changes: a refused link leaves
        // the session as it was (a reset here left it open on its old link
        // with its seqs back at 0, delivering without `Established`). The
        // peer hears the refusal and comes back with cookie 0.
        if hello.cookie != 0
            && (hello.cookie != self.remote.cookie || (restarted && self.established))
        {
            return Takeover::Rejected(reset_frame());
        }
        // A later dial of the attempt we opened the session for: the
        // peer gave its dial up before our hello-ok came, so it has the
        // session without its cookie. It sent nothing in it yet.
        let continues = hello.cookie == 0
            && !restarted
            && self.established
            && self.rx.in_seq == 0
            && self.tx.acked_seq == 0
            && self.remote.dials.continues_opening(
                hello.addr.nonce,
                hello.dial,
                pending.hello_first_dial(),
            );
        if (restarted || hello.cookie == 0) && self.established && !continues {
            // The peer starts over: our session is gone on its side.
            self.remote_reset();
        }
        let racing = matches!(
            self.state,
            State::Connecting { .. } | State::Banner(_) | State::HelloSent(_)
        );
        if racing && self.local.addr.to_string() < hello.addr.to_string() {
            // Both sides dialled; the smaller address's connection wins, and it is ours.
            return Takeover::Rejected(control_frame(Tag::Wait, &()));
        }
        // Take the link: drop any link we had or were building.
        self.close_link_now();
        self.adopt_peer(hello);
        self.remote.features = pending.remote.features;
        let routed = State::Identified {
            link,
            hello: Box::new(hello.clone()),
            first_dial: pending.hello_first_dial(),
        };
        self.attach_link(routed, now);
        self.link_security = std::mem::take(&mut pending.link_security);
        if self.remote.key.is_none() {
            // same_identity passed: this link's peer is the session's.
            self.remote.key = self.link_security.peer.as_ref().map(|(_, k)| *k);
        }
        if continues {
            // To the peer a new session (hello-ok with the cookie), to us
            // a resume: everything we queued is replayed.
            self.answer_hello();
            if let Err(e) = self.resume(link, 0, now) {
                self.fault(FaultReason::Protocol(e), now);
            }
        } else if hello.cookie == 0 {
            if self.remote.cookie == 0 {
                self.remote.cookie = new_cookie;
            }
            self.remote.dials.opened_for(hello.dial);
            self.open_new(link, now);
        } else {
            // The peer knew the cookie: it saw the hello-ok.
            self.remote.dials.forget_opening();
            let ok = ReconnectOk {
                name: self.local.name.clone(),
                addr: self.local.addr.clone(),
                in_seq: self.rx.in_seq,
            };
            let frame = self.handshake_frame(
                control_frame(Tag::ReconnectOk, &ok),
                self.local.dials.current(),
            );
            self.tx.ctrl.push_back(Transmit::Frame(frame));
            if let Err(e) = self.resume(link, hello.in_seq, now) {
                self.fault(FaultReason::Protocol(e), now);
            }
        }
        Takeover::Accepted
    }

    /// The frame to send on an accepted link whose hello names a session that
    /// does not exist here (then close the link).
    pub fn reject_unknown() -> Frame {
        reset_frame()
    }

    /// Whether the link's banners agreed to carry limits in the handshake.
    pub(super) fn limits_agreed(&self) -> bool {
        self.remote.features & features::LIMITS != 0
    }

    /// Whether the link's banners agreed to number dials in the handshake.
    pub(super) fn dials_agreed(&self) -> bool {
        self.remote.features & features::DIAL_NUMBERS != 0
    }

    /// Whether the link's banners agreed that a hello starting a session
    /// names its attempt's first dial.
    pub(super) fn first_dial_agreed(&self) -> bool {
        let both = features::DIAL_NUMBERS | features::FIRST_DIAL;
        self.remote.features & both == both
    }

    /// A handshake frame with this side's receive limits and `dial` (a
    /// hello's number, or our last dial's) where the link agreed to them.
    pub(super) fn handshake_frame(&self, frame: Frame, dial: u64) -> Frame {
        let frame = if self.limits_agreed() {
            with_limits(frame, &Limits::of(&self.cfg.limits))
        } else {
            frame
        };
        if self.dials_agreed() {
            with_dial_number(frame, dial)
        } else {
            frame
        }
    }

    /// Decodes a handshake frame as this link agreed to carry them.
    pub(super) fn parse_handshake<T: serde::de::DeserializeOwned>(
        &self,
        frame: &Frame,
        what: &'static str,
    ) -> Result<(T, HandshakeExtras), ProtocolError> {
        Ok(parse_handshake(
            frame,
            what,
            self.limits_agreed(),
            self.dials_agreed(),
        )?)
    }

    /// Our banner, as configured.
    pub(super) fn banner(&self) -> Banner {
        let mut b = Banner::for_session(self.cfg.payload_crc, self.cfg.security.modes);
        if self.cfg.max_fragment == 0 {
            // No lanes: one class, no fragments, as a peer without them.
            b.supported &= !features::LANES;
        }
        b
    }

    /// Starts the handshake once the banners chose `auth` or `secure`;
    /// the connector writes the first message.
    pub(super) fn start_handshake(
        &mut self,
        link: LinkId,
        peer_banner: &[u8; BANNER_LEN],
    ) -> Result<(), ProtocolError> {
        let creds = self
            .cfg
            .security
            .credentials
            .clone()
            .ok_or(AuthError::NoCredentials)?;
        let ours = self.banner().encode();
        let (role, initiator, responder) = if self.side.is_connector() {
            (Role::Initiator, &ours, peer_banner)
        } else {
            (Role::Responder, peer_banner, &ours)
        };
        let mut hs = Handshake::new(role, &creds, initiator, responder)?;
        if hs.is_my_turn() {
            let m = hs.write_message()?;
            self.tx
                .ctrl
                .push_back(Transmit::Frame(Frame::single(Tag::Auth, m)));
        }
        self.state = State::Authenticating {
            link,
            handshake: Box::new(hs),
        };
        Ok(())
    }

    /// Banners (and handshake, if any) done: the connector says hello, the
    /// acceptor waits for it.
    pub(super) fn after_banners(&mut self, link: LinkId) {
        if self.side.is_connector() {
            let hello = Hello {
                name: self.local.name.clone(),
                addr: self.local.addr.clone(),
                target: self
                    .remote
                    .addr
                    .clone()
                    .unwrap_or_else(|| self.local.addr.clone()),
                policy: self.policy,
                cookie: self.remote.cookie,
                in_seq: self.rx.in_seq,
                limits: None,
                dial: None,
            };
            let dial = self.local.dials.next();
            let frame = self.handshake_frame(control_frame(Tag::Hello, &hello), dial);
            let frame = if self.remote.cookie == 0 {
                // Every dial until the session opens goes on with the
                // first: the acceptor may have opened it for any of them.
                let first = *self.redial.first_dial.get_or_insert(dial);
                if self.first_dial_agreed() {
                    with_dial_number(frame, first)
                } else {
                    frame
                }
            } else {
                frame
            };
            self.tx.ctrl.push_back(Transmit::Frame(frame));
            self.state = State::HelloSent(link);
        } else {
            self.state = State::AwaitHello(link);
        }
    }

    /// Starts a fresh link: our banner goes first.
    pub(super) fn start_link(&mut self, link: LinkId, now: Instant) {
        self.attach_link(State::Banner(link), now);
        self.tx
            .ctrl
            .push_back(Transmit::Banner(self.banner().encode()));
    }

    /// Runs the session on a new link, in `state` (on that link): a fresh
    /// one, or one whose banners and hello were already exchanged (by the
    /// acceptor session that routed it here).
    pub(super) fn attach_link(&mut self, state: State, now: Instant) {
        self.tx.ctrl.clear();
        self.link_security = LinkSecurity::default();
        self.clock.link_started(now);
        self.state = state;
    }

    /// Opens a brand-new session on `link` (acceptor side), answering the hello.
    pub(super) fn open_new(&mut self, link: LinkId, now: Instant) {
        self.answer_hello();
        self.state = State::open(link);
        self.tx.rewind_to_acked();
        self.on_open(now, 0);
    }

    /// Acceptor: answers the hello with hello-ok, naming the session's cookie.
    fn answer_hello(&mut self) {
        let ok = HelloOk {
            name: self.local.name.clone(),
            addr: self.local.addr.clone(),
            cookie: self.remote.cookie,
        };
        let frame =
            self.handshake_frame(control_frame(Tag::HelloOk, &ok), self.local.dials.current());
        self.tx.ctrl.push_back(Transmit::Frame(frame));
    }

    pub(super) fn on_open(&mut self, now: Instant, replayed: u64) {
        // Open: the peer has answered, and our next hello resumes.
        self.redial.first_dial = None;
        self.redial.backoff = self.cfg.backoff_min;
        self.redial.attempts = 0;
        self.clock.last_rx = now;
        if let Some((from, to)) = self.side.opened() {
            self.events.push_back(SessionEvent::Moved {
                from,
                to,
                reason: self.redial.last_fault.clone(),
            });
        }
        if self.established {
            self.stats.reconnects += 1;
            self.stats.replayed += replayed;
            self.events.push_back(SessionEvent::Resumed { replayed });
        } else if let Some(peer) = self.peer() {
            self.established = true;
            self.events.push_back(SessionEvent::Established(peer));
        }
        if self.closing {
            self.maybe_finish_close();
        }
    }

    /// Resumes on `link` after the peer said it received up to `peer_in_seq`.
    pub(super) fn resume(
        &mut self,
        link: LinkId,
        peer_in_seq: u64,
        now: Instant,
    ) -> Result<(), ProtocolError> {
        self.apply_ack(peer_in_seq)?;
        // apply_ack made acked_seq >= peer_in_seq: replay from there.
        self.tx.rewind_to_acked();
        // Everything queued is unsent again: the replay, then the lanes.
        let replayed = self.tx.outbox.messages() as u64;
        // Acks piggybacked on the old link may have been lost: re-ack, at once.
        self.rx.acked_in_seq = 0;
        self.rx.ack_due = Some(now);
        self.state = State::open(link);
        self.on_open(now, replayed);
        Ok(())
    }

    /// The peer lost our session: drop its state and tell the application.
    pub(super) fn remote_reset(&mut self) {
        let dropped = self.drop_queued();
        self.tx.restart();
        self.rx.restart();
        self.remote.cookie = 0;
        self.remote.dials.forget_opening();
        self.redial.first_dial = None;
        self.established = false;
        self.events.push_back(SessionEvent::RemoteReset { dropped });
    }

    pub(super) fn close_link_now(&mut self) {
        if let Some(l) = self.link() {
            self.events.push_back(SessionEvent::CloseLink(l));
        }
        self.tx.ctrl.clear();
    }

    /// A link-level fault: decide between reconnecting, waiting and ending.
    pub fn fault(&mut self, reason: FaultReason, now: Instant) {
        if self.state.is_closed() {
            return;
        }
        if self.side.is_connector() && !self.established {
            self.events.push_back(SessionEvent::ConnectFailed {
                reason: reason.clone(),
            });
        }
        self.stats.faults += 1;
        self.close_link_now();
        let lossless = self.tx.lossless;
        let never_established_acceptor = !self.side.is_connector() && !self.established;
        // A closing lossless session keeps reconnecting to drain; its owner
        // bounds that with a deadline and mark_down.
        if !lossless || never_established_acceptor {
            self.terminate(reason);
            return;
        }
        self.redial.last_fault = Some(reason);
        self.redial.attempts = self.redial.attempts.saturating_add(1);
        // The next attempt goes to the peer's next address.
        self.side.next_address();
        if self.side.may_reconnect() {
            let at = now + self.redial.jittered(self.redial.backoff);
            self.redial.backoff = (self.redial.backoff * 2).min(self.cfg.backoff_max);
            self.state = State::Standby {
                reconnect_at: Some(at),
                since: now,
            };
        } else {
            self.state = State::Standby {
                reconnect_at: None,
                since: now,
            };
        }
    }

    pub(super) fn terminate(&mut self, reason: FaultReason) {
        self.close_link_now();
        let undelivered = self.drop_queued();
        self.state = State::Closed;
        self.redial.last_fault = Some(reason.clone());
        let silent = !self.established && !self.side.is_connector();
        if !silent {
            self.events.push_back(SessionEvent::Reset {
                reason,
                undelivered,
            });
        }
    }
}
