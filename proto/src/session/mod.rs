//! The session engine: a pure state machine, shared by every transport.
//!
//! A [`Session`] is one logical conversation with one peer. It outlives the
//! transport links it runs over: lossless sessions number their messages, keep
//! them until acknowledged, and replay the rest on a new link. The engine holds
//! no sockets, threads or clocks — like quinn-proto's `Connection`, the caller
//! feeds it input ([`Session::handle_inbound`], [`Session::link_up`],
//! [`Session::link_failed`], [`Session::handle_timeout`]) with the current time,
//! and pulls work out ([`Session::poll_transmit`], [`Session::poll_message`],
//! [`Session::poll_event`], [`Session::poll_timeout`]). Tests and fuzzers
//! drive it in memory; every backend shares it unchanged.
//!
//! Received messages and events come out apart, as quinn-proto keeps stream
//! data out of its events: [`Session::poll_message`] takes the messages,
//! [`Session::poll_event`] the changes of state ([`SessionEvent`]). The two
//! keep the order in which things happened — a message that arrived after
//! `Established` waits until that event is taken, an event that came after
//! messages waits until they are — so the owner drains both in turn:
//!
//! ```
//! # use msgr_proto::{Message, Session, SessionEvent};
//! fn drain(s: &mut Session, deliver: &mut dyn FnMut(Message), handle: &mut dyn FnMut(SessionEvent)) {
//!     loop {
//!         while let Some(msg) = s.poll_message() {
//!             deliver(msg);
//!         }
//!         // Only `None` once both are empty: a message that waited for
//!         // this event is taken by the next turn.
//!         let Some(ev) = s.poll_event() else { break };
//!         handle(ev);
//!     }
//! }
//! ```
//!
//! # Layers
//!
//! The submodules import in one direction (`tests/layering.rs` checks
//! it), bottom first. Those from `identity` up each hold a part of
//! [`Session`]'s methods, and may use this file's items ([`Session`] and
//! the helpers at its end):
//!
//! 1. `attempts`, `config`, `error`: dial numbers; the settings and
//!    [`Policy`]; [`ProtocolError`].
//! 2. `hello`: the hello that carries a policy.
//! 3. `owner`: what passes between a session and its owner ([`LinkId`],
//!    [`SessionEvent`], [`FaultReason`], [`SessionStats`], ...), and the
//!    queue that hands events and messages over in order.
//! 4. `side`, `state`, `outbox`: who dials and whom; the phase; the send
//!    queue.
//! 5. `identity`: who the peer is (`Remote`) and proved to be on the
//!    current link (`LinkSecurity`); the checks that it stays the same.
//! 6. `send`, `timers`, `links`, `handlers`, `refusal`: the send path
//!    (`Outgoing`); the timers (`Clock`, `Redial`); a link's life, from
//!    its banner to its fault, and the routing of accepted links; the
//!    receive side (`Incoming`), one handler per frame tag; refusals no
//!    redial changes, told to the peer and heeded.
//!
//! Where things are:
//! - `state.rs`: the session's phase (`State`: connecting, banners,
//!   authenticating, hello, open, draining, standby, closed), each variant
//!   holding what only that phase needs — the Noise handshake inside
//!   `Authenticating`, the peer's hello inside `Identified`, the dial waited
//!   for inside `Connecting` — with the transitions drawn at its top.
//! - `side.rs`: `Side`, connector or acceptor, with the peer's address
//!   vector (which address the session dials, which it last opened via,
//!   the peer the application expects) as one value.
//! - `handlers.rs`: the receive side, one handler per frame tag
//!   (`on_banner`, `on_auth`, `on_hello`, `on_hello_ok`, `on_reconnect_ok`,
//!   `on_session_reset`, `on_wait`, `on_message`, `on_batch`, `on_ack`,
//!   `on_keepalive`, `on_close`...), dispatched by `process`.
//! - `send.rs`: queueing (`send`, `send_encoded`), what goes out next
//!   (`poll_transmit`: control frames, then messages within the in-flight
//!   window, then acks), sealing, and acknowledgements releasing the queue.
//! - `timers.rs`: banner, handshake, keepalive, redial and linger
//!   deadlines (`handle_timeout`, `poll_timeout`) and the backoff's jitter.
//! - `links.rs`: a link's life — banner, handshake, hello, open or resume,
//!   fault, end — and takeover of accepted links (`take_link`).
//! - this file: [`Session`]'s data, its constructors and accessors, the
//!   owner's inputs (close, abort, link events, received units) and the
//!   small helpers the parts share; `outbox.rs` the send queue,
//!   `attempts.rs` dial numbers, `config.rs` the settings.
//! - `refusal.rs`: refusals no redial changes — the acceptor's, told to
//!   the connector before the link closes (`features::REFUSALS`), and the
//!   connector's own — which end a connector's session at once.
//!
//! Where a reconnect is decided: [`Session::fault`] (after a transport fault),
//! [`Session::take_link`] (an accepted link that claims an existing session,
//! including simultaneous connects) and the handlers of the acceptor's answer
//! to our hello (`on_hello_ok`, `on_reconnect_ok`, `on_session_reset`,
//! `on_wait` in `handlers.rs`).

mod attempts;
mod config;
mod error;
mod handlers;
mod hello;
mod identity;
mod links;
mod outbox;
mod owner;
mod refusal;
mod send;
mod side;
mod state;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_acks;
#[cfg(test)]
mod tests_lanes;
mod timers;

use std::collections::VecDeque;
use std::time::Instant;

use msgr_addr::{EntityAddr, EntityName};

pub use attempts::DialAttempts;
pub use config::{Policy, SessionConfig, DEFAULT_ACK_DELAY, DEFAULT_BATCH_MAX_BYTES};
pub use error::ProtocolError;
use handlers::Incoming;
pub use hello::Hello;
use identity::{LinkSecurity, Remote};
pub use outbox::EncodedBatch;
use outbox::Outbox;
use owner::ToOwner;
pub use owner::{
    FaultReason, LinkId, LocalIdentity, PeerInfo, Received, SendError, SessionEvent, SessionStats,
    Takeover,
};
use send::Outgoing;
use side::Side;
pub use state::Phase;
use state::State;
use timers::{Clock, Redial};

use crate::auth::SecurityMode;
use crate::banner::features;
use crate::control::{control_frame, Limits};
use crate::frame::{Frame, Tag};
use crate::link_failure::LinkFailure;
use crate::message::Message;
use crate::stream::{Inbound, Transmit};

/// One session with one peer. See the [module docs](self).
///
/// Its data is grouped by concern: what goes out (`Outgoing`), what came
/// in (`Incoming`), when things happened (`Clock`), how it redials
/// (`Redial`), what it knows of its peer (`Remote`) and of the current
/// link's protection (`LinkSecurity`).
#[derive(Debug)]
pub struct Session {
    cfg: SessionConfig,
    local: LocalIdentity,
    policy: Policy,
    /// Connector or acceptor, and where the session dials ([`side`]).
    side: Side,
    state: State,
    /// It opened once: later links resume it.
    established: bool,
    /// `close` was called: it ends once everything queued is out.
    closing: bool,
    /// Events and received messages for the owner, in the order they happened.
    events: ToOwner,
    /// Counters of its life, summed by the owner.
    stats: SessionStats,
    /// The send side (`send.rs`).
    tx: Outgoing,
    /// The receive side (`handlers.rs`).
    rx: Incoming,
    /// When things happened, for the timers (`timers.rs`).
    clock: Clock,
    /// How it redials after a fault (`timers.rs`).
    redial: Redial,
    /// What it knows of its peer (`identity.rs`).
    remote: Remote,
    /// The current link's protection: its mode, who the peer proved to be
    /// and its record layer (the handshake itself is in
    /// [`State::Authenticating`]).
    link_security: LinkSecurity,
}

impl Session {
    fn blank(cfg: SessionConfig, local: LocalIdentity, policy: Policy, now: Instant) -> Session {
        let backoff = cfg.backoff_min;
        // Seeded by the messenger's random nonce (processes differ), and by
        // the peer or link in `connect` and `accept` (sessions of one
        // process differ).
        let jitter = local.addr.nonce.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        Session {
            cfg,
            local,
            policy,
            side: Side::acceptor(),
            state: State::Closed,
            established: false,
            closing: false,
            events: ToOwner::default(),
            stats: SessionStats::default(),
            tx: Outgoing {
                outbox: Outbox::default(),
                ctrl: VecDeque::new(),
                lossless: policy.lossless(),
                in_flight_bytes: 0,
                out_seq: 0,
                class_seqs: [0; crate::priority::Priority::COUNT],
                sent_seq: 0,
                acked_seq: 0,
            },
            rx: Incoming::default(),
            clock: Clock {
                created: now,
                link_since: now,
                last_rx: now,
                last_tx: now,
            },
            redial: Redial {
                backoff,
                attempts: 0,
                jitter,
                last_fault: None,
                first_dial: None,
            },
            remote: Remote::default(),
            link_security: LinkSecurity::default(),
        }
    }

    /// A session that dials `peer`. It asks for a transport connection at once
    /// ([`SessionEvent::Connect`]). `policy` must not be [`Policy::Server`].
    pub fn connect(
        cfg: SessionConfig,
        local: LocalIdentity,
        peer: EntityAddr,
        policy: Policy,
        now: Instant,
    ) -> Session {
        let mut s = Session::blank(cfg, local, policy, now);
        s.redial.jitter = mixed(s.redial.jitter, &peer);
        s.side = Side::connector(peer.clone(), policy);
        s.events.push_back(SessionEvent::Connect(peer.clone()));
        s.remote.addr = Some(peer);
        s.state = State::Connecting {
            since: now,
            dialing: None,
        };
        s
    }

    /// Connector: whoever answers must be `name` — proved by the handshake
    /// in `auth` and `secure` modes, said in the answer to the hello in
    /// `crc` mode. Anyone else ends a session that never opened
    /// ([`AuthError::UnexpectedPeer`](crate::auth::AuthError::UnexpectedPeer), [`ProtocolError::WrongPeer`]); a
    /// session that opened faults the link and tries again.
    pub fn expect_peer(&mut self, name: EntityName) {
        self.side.expect_peer(name);
    }

    /// Connector: more addresses of the same peer, after the one given to
    /// [`Session::connect`], in preference order (an address vector such
    /// as `[rdmacm://…, tcp://…]`). A lossless session that loses its link
    /// dials the next address on its next attempt (round the vector), so
    /// it goes on over another transport when one fails, replaying by seq
    /// as after any reconnect; [`SessionEvent::Moved`] says so. The peer
    /// must be the same entity (one identity, one session) listening on
    /// each.
    pub fn set_alternates(&mut self, more: impl IntoIterator<Item = EntityAddr>) {
        self.side.set_alternates(more);
    }

    /// A session for a freshly accepted link; it learns its peer from the hello.
    pub fn accept(cfg: SessionConfig, local: LocalIdentity, link: LinkId, now: Instant) -> Session {
        let mut s = Session::blank(cfg, local, Policy::Server, now);
        s.redial.jitter = mixed(s.redial.jitter, link);
        s.start_link(link, now);
        s
    }

    /// The link the session currently runs on (or is handshaking on).
    pub fn link(&self) -> Option<LinkId> {
        self.state.link()
    }

    /// Where the session stands ("connecting", "standing by", "open"...
    /// in words): for logs and for telling why a session is not open.
    pub fn phase(&self) -> Phase {
        self.state.phase()
    }

    /// Why the session last lost a link, or why it ended; `None` until the
    /// first fault.
    pub fn last_fault(&self) -> Option<&FaultReason> {
        self.redial.last_fault.as_ref()
    }

    /// When a session standing by after a fault dials again (`None` when
    /// it is not waiting to: open, connecting, or waiting for the peer).
    pub fn reconnect_at(&self) -> Option<Instant> {
        match self.state {
            State::Standby { reconnect_at, .. } => reconnect_at,
            _ => None,
        }
    }

    /// Link faults since the session was last open: the attempts its
    /// backoff has grown by (0 while open).
    pub fn failed_attempts(&self) -> u32 {
        self.redial.attempts
    }

    /// Whether the peer has said anything on the current link: its banner
    /// arrived. An accepted link that has not is idle, the first to give
    /// way when handshake slots run out.
    pub fn heard_from_peer(&self) -> bool {
        !matches!(self.state, State::Banner(_))
    }

    /// Whether messages flow right now.
    pub fn is_open(&self) -> bool {
        matches!(self.state, State::Open { .. })
    }

    /// Whether the session has ended; drop it once its events (and
    /// messages) are drained.
    pub fn is_closed(&self) -> bool {
        self.state.is_closed()
    }

    /// Whether the session has ended or is ending (after `close` or
    /// `mark_down`, or the peer's close): it takes no new link.
    pub fn is_ending(&self) -> bool {
        self.closing || self.is_closed()
    }

    /// The peer, once known.
    pub fn peer(&self) -> Option<PeerInfo> {
        Some(PeerInfo {
            name: self.remote.name.clone()?,
            addr: self.remote.addr.clone()?,
            key: self.remote.key,
            features: self.remote.features,
        })
    }

    /// The address this session dials or was accepted from.
    pub fn peer_addr(&self) -> Option<&EntityAddr> {
        self.remote.addr.as_ref()
    }

    /// This side's policy for the session.
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// Messages queued (unsent, or sent and not yet acknowledged).
    pub fn queued_messages(&self) -> usize {
        self.tx.outbox.messages()
    }

    /// Payload bytes queued.
    pub fn queued_bytes(&self) -> usize {
        self.tx.outbox.bytes()
    }

    /// Bytes this session's state holds: the engine itself and the
    /// capacity of its queues and open batch buffer (queued messages
    /// excluded: [`Session::queued_bytes`] counts them, whether encoded
    /// into batches or, if large, the application's own buffers). What an
    /// idle connection costs, summed by the messenger (`Messenger::memory`).
    pub fn memory_bytes(&self) -> usize {
        std::mem::size_of::<Session>()
            + self.tx.outbox.memory_bytes()
            + self.tx.ctrl.capacity() * std::mem::size_of::<Transmit>()
            + self.events.memory_bytes()
    }

    /// The largest message segments this session sends: the peer's
    /// limits once the handshake told them, this side's own before (the
    /// defaults are the same on both sides).
    pub fn send_limits(&self) -> Limits {
        self.remote
            .limits
            .unwrap_or_else(|| Limits::of(&self.cfg.limits))
    }

    /// Counters of this session.
    pub fn stats(&self) -> SessionStats {
        self.stats
    }

    /// Feature bits agreed with the peer on the current link.
    pub fn features(&self) -> u64 {
        self.remote.features
    }

    /// The security mode of the current link (`Crc` before its banners).
    pub fn security_mode(&self) -> SecurityMode {
        self.link_security.mode
    }

    /// Ends the session now for a local reason (its owner's decision, say
    /// a handler that panicked): queued messages are dropped and reported,
    /// received messages not yet taken with [`Session::poll_message`] are
    /// dropped too (nothing is delivered after the end), and a
    /// [`SessionEvent::Reset`] with `reason` follows.
    pub fn abort(&mut self, reason: FaultReason) {
        if !self.state.is_closed() {
            self.events.drop_messages();
            self.terminate(reason);
        }
    }

    /// Ends the session now; queued messages are dropped and reported.
    pub fn mark_down(&mut self, now: Instant) {
        let _ = now;
        if !self.state.is_closed() {
            self.terminate(FaultReason::MarkedDown);
        }
    }

    /// Ends the session once everything queued is acknowledged (lossless) or
    /// transmitted (lossy): then a close frame is sent and
    /// [`SessionEvent::Closed`] follows. The owner bounds this with its own
    /// deadline and calls [`Session::mark_down`] when it passes.
    pub fn close(&mut self, now: Instant) {
        self.closing = true;
        match self.state {
            State::Open { .. } => self.maybe_finish_close(),
            State::Closed => {}
            _ if self.tx.outbox.messages() == 0 => {
                self.close_link_now();
                self.state = State::Closed;
                self.events.push_back(SessionEvent::Closed);
            }
            _ => {
                let _ = now;
            }
        }
    }

    /// Pauses or resumes the receive-silence check while the owner holds back
    /// reading for a throttle (the peer is not silent, we are not listening).
    pub fn set_rx_paused(&mut self, paused: bool, now: Instant) {
        if self.rx.paused && !paused {
            self.clock.last_rx = now;
        }
        self.rx.paused = paused;
    }

    /// The transport connection asked for by the last
    /// [`SessionEvent::Connect`] is `link` (the owner's name for it): the
    /// one closed if it is not up within `handshake_timeout`, and the only
    /// one [`Session::link_up`] and [`Session::link_failed`] then heed.
    pub fn dialing(&mut self, link: LinkId) {
        if let State::Connecting { dialing, .. } = &mut self.state {
            *dialing = Some(link);
        }
    }

    /// Whether `link` is the dial this session waits for (any, if the
    /// owner never said which).
    fn awaits_dial(&self, link: LinkId) -> bool {
        matches!(self.state, State::Connecting { dialing, .. } if dialing.is_none_or(|d| d == link))
    }

    /// The transport connection asked for by [`SessionEvent::Connect`] is up.
    pub fn link_up(&mut self, link: LinkId, now: Instant) {
        if self.awaits_dial(link) {
            self.start_link(link, now);
        } else {
            // Not wanted any more (e.g. a racing accept won): close it.
            self.events.push_back(SessionEvent::CloseLink(link));
        }
    }

    /// The link failed or the peer closed it.
    pub fn link_failed(&mut self, link: LinkId, reason: LinkFailure, now: Instant) {
        if self.awaits_dial(link) || self.link() == Some(link) {
            let reason = match self.state {
                // A peer that refuses our identity says nothing (it tells an
                // unproven peer no reasons): it closes the link.
                State::Authenticating { .. } => LinkFailure::WhileAuthenticating(Box::new(reason)),
                _ => reason,
            };
            self.fault(FaultReason::Transport(reason), now);
        }
    }

    /// Feeds one unit received on `link`. Errors are also handled internally
    /// (the link is faulted); they are returned for logging and counters.
    pub fn handle_inbound(
        &mut self,
        link: LinkId,
        unit: Inbound,
        now: Instant,
    ) -> Result<(), ProtocolError> {
        self.handle_inbound_with(link, unit, now, |_| {})
    }

    /// As [`Session::handle_inbound`], with `opened` called on the unit
    /// once a secure link has opened it (the plain unit otherwise): what
    /// the owner accounts for the memory of received messages sees the
    /// messages, not their ciphertext.
    pub fn handle_inbound_with(
        &mut self,
        link: LinkId,
        unit: Inbound,
        now: Instant,
        opened: impl FnOnce(&mut Inbound),
    ) -> Result<(), ProtocolError> {
        if self.link() != Some(link) || self.is_refusing() {
            return Ok(());
        }
        self.clock.last_rx = now;
        let (in_seq, len) = (self.rx.in_seq, unit.encoded_len());
        let r = self.unseal(unit).and_then(|mut unit| {
            opened(&mut unit);
            self.process(link, unit, now)
        });
        if self.rx.in_seq > in_seq {
            self.rx.arrived_unacked(len, now, self.cfg.ack_delay);
        }
        if let Err(e) = &r {
            self.after_link_error(e, now);
        }
        r
    }

    /// A frame could not be decoded on `link` (bad CRC, hostile length...).
    pub fn handle_decode_error(&mut self, link: LinkId, err: ProtocolError, now: Instant) {
        if self.link() == Some(link) && !self.is_refusing() {
            self.fault(FaultReason::Protocol(err), now);
        }
    }

    /// The next event for the owner; `None` also while messages that
    /// arrived before it wait in [`Session::poll_message`].
    pub fn poll_event(&mut self) -> Option<SessionEvent> {
        self.events.pop_event()
    }

    /// The next received message, in order, exactly once (lossless) or at
    /// most once (lossy); `None` also while an event that came before it
    /// waits in [`Session::poll_event`] (`Established` before the first
    /// message, `RemoteReset` before the new session's).
    pub fn poll_message(&mut self) -> Option<Message> {
        self.events.pop_message()
    }

    /// As [`Session::poll_message`], with the entries of a batch frame
    /// handed over together, to read in place ([`Received::Batch`]): no
    /// message built per entry. Mixes with `poll_message` freely; either
    /// takes each message once.
    pub fn poll_received(&mut self) -> Option<Received> {
        self.events.pop_received()
    }
}

/// `seed` mixed with `v` (a fixed-key hash: deterministic per run), never 0
/// (a xorshift state must not be).
fn mixed(seed: u64, v: impl std::hash::Hash) -> u64 {
    use std::hash::Hasher;
    // `new` has fixed keys (unlike `RandomState`): the same draws per run.
    let mut h = std::hash::DefaultHasher::new();
    v.hash(&mut h);
    (seed ^ h.finish()) | 1
}

fn reset_frame() -> Frame {
    control_frame(Tag::SessionReset, &())
}

/// Whether a message with call field `call` may travel on a link with
/// `features`: a plain message always; a call where `CALLS` was agreed; an
/// RMA operation (`crate::rma::RMA_BIT`) where `RMA` was too.
fn call_allowed(call: u64, features: u64) -> bool {
    call == 0
        || (features & features::CALLS != 0
            && (call & crate::rma::RMA_BIT == 0 || features & features::RMA != 0))
}
