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
//! - this file: the session's data across phases (sequence numbers, the
//!   queue, the link's record layer), the owner's inputs and outputs, the
//!   send path, takeover of accepted links and faults; `outbox.rs` the
//!   send queue, `attempts.rs` dial numbers, `config.rs` the settings.
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
mod outbox;
mod side;
mod state;

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use msgr_addr::{EntityAddr, EntityName};

pub use attempts::DialAttempts;
use attempts::PeerDials;
pub use config::{Policy, SessionConfig, DEFAULT_BATCH_MAX_BYTES};
pub use error::ProtocolError;
pub use hello::Hello;

use crate::auth::{AuthError, Handshake, PublicKey, RecordError, RecordLayer, Role, SecurityMode};
use crate::banner::{features, Banner, BANNER_LEN};
use crate::batch::BatchReader;
use crate::control::{
    control_frame, parse_handshake, with_dial_number, with_limits, Ack, Close, HandshakeExtras,
    HelloOk, Keepalive, Limits, PacedKeepalive, ReconnectOk, TooLarge,
};
use crate::frame::{Frame, Tag, FLAG_UNCHECKED_PAYLOAD};
use crate::message::{Message, MessageFrame};
use crate::stream::{Inbound, Transmit};
pub use outbox::EncodedBatch;
use outbox::{Outbox, Sent, Terms, Unsent, UnsentBatch};
use side::Side;
use state::State;

/// Names one transport link (connection) for the engine; chosen by the caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LinkId(pub u64);

/// Who this side is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalIdentity {
    /// Our entity name.
    pub name: EntityName,
    /// Our address (with its nonce; port 0 if we do not listen).
    pub addr: EntityAddr,
    /// Numbers our dials (one counter per messenger, shared by its
    /// sessions): a peer recognises a hello that outlived its dial.
    pub dials: DialAttempts,
}

/// Who the peer is, once the handshake told us.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerInfo {
    /// The peer's entity name.
    pub name: EntityName,
    /// The peer's address.
    pub addr: EntityAddr,
    /// The public key the peer proved it holds, where the session
    /// authenticated it (`auth` or `secure` mode); `None` in `crc` mode,
    /// where the name is the peer's word.
    pub key: Option<PublicKey>,
    /// The feature bits both banners agreed on ([`crate::banner::features`]):
    /// what the peer understands beyond the session's own frames (the
    /// replies it may be sent, e.g. `RMA_FIGURES`).
    pub features: u64,
}

/// Why a session ended or a link was dropped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FaultReason {
    /// The transport reported an error or the peer closed the connection.
    Transport(String),
    /// The peer broke the protocol (bad frame, bad sequence...).
    Protocol(ProtocolError),
    /// Nothing arrived within the keepalive timeout.
    KeepaliveTimeout,
    /// The banner/hello exchange took too long.
    HandshakeTimeout,
    /// The peer sent no banner within `banner_timeout`.
    BannerTimeout,
    /// The peer ended the session with a close frame.
    PeerClosed(String),
    /// The local application marked the peer down.
    MarkedDown,
    /// A lossless server session waited too long for its peer to return.
    LingerExpired,
    /// A queued message is larger than the peer accepts (its limits came
    /// with the handshake, after the message was queued): sending it could
    /// only be refused, and a lossless session would replay it into the
    /// same refusal. The session ends instead.
    TooLarge(TooLarge),
    /// A connection that never opened gave up after the configured
    /// `connect_timeout`.
    ConnectTimeout(Duration),
    /// A call (`Connection::call`) or its reply was queued for a peer that
    /// does not take calls (it did not offer `features::CALLS`).
    CallsUnsupported,
    /// The application's handler for this connection panicked (its
    /// dispatcher callback, with the panic's message); the messenger ended
    /// the connection and went on serving the others.
    HandlerPanicked(String),
}

impl std::fmt::Display for FaultReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FaultReason::Transport(e) => write!(f, "transport: {e}"),
            FaultReason::Protocol(e) => write!(f, "protocol: {e}"),
            FaultReason::KeepaliveTimeout => write!(f, "keepalive timeout"),
            FaultReason::HandshakeTimeout => write!(f, "handshake timeout"),
            FaultReason::BannerTimeout => write!(f, "no banner from the peer in time"),
            FaultReason::PeerClosed(r) => write!(f, "peer closed the session: {r}"),
            FaultReason::MarkedDown => write!(f, "marked down"),
            FaultReason::LingerExpired => write!(f, "peer did not come back"),
            FaultReason::TooLarge(t) => write!(f, "queued {t}"),
            FaultReason::ConnectTimeout(t) => write!(f, "not connected within {t:?}"),
            FaultReason::HandlerPanicked(m) => write!(f, "the application's handler panicked: {m}"),
            FaultReason::CallsUnsupported => {
                write!(f, "the peer does not take calls (an older msgr)")
            }
        }
    }
}

/// What the engine tells its owner about the session's state (received
/// messages come out of [`Session::poll_message`] instead).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SessionEvent {
    /// Open a transport connection to this address, then call
    /// [`Session::link_up`] or [`Session::link_failed`].
    Connect(EntityAddr),
    /// Close this link once what was already transmitted on it is written.
    CloseLink(LinkId),
    /// Acceptor only: the peer said hello. Route it — to an existing session
    /// with [`Session::take_link`], or start a new one with [`Session::accept_new`].
    Identified(Hello),
    /// The session is open for the first time (`on_connect` / `on_accept`).
    Established(PeerInfo),
    /// Connector: an attempt to open the session failed (`on_connect_failed`):
    /// the transport could not connect, or the handshake failed, before the
    /// session was ever open. A lossless session tries again after its
    /// backoff (until `connect_timeout`, if set); a lossy one ends.
    ConnectFailed {
        /// Why the attempt failed.
        reason: FaultReason,
    },
    /// The session's new link reaches the peer at another of its addresses
    /// (an address vector, [`Session::set_alternates`]): the session moved
    /// from one transport to another. `Resumed` follows.
    Moved {
        /// The address of the link before.
        from: EntityAddr,
        /// The address of this link.
        to: EntityAddr,
        /// Why the link before was lost.
        reason: Option<FaultReason>,
    },
    /// The session resumed on a new link; `replayed` messages are sent again.
    Resumed {
        /// Messages sent again on the new link.
        replayed: u64,
    },
    /// The session ended (`on_reset`): lossy fault, peer close, mark down, or
    /// a lossless server session whose peer never returned. Terminal.
    Reset {
        /// Why.
        reason: FaultReason,
        /// Queued messages that were not (known to be) delivered.
        undelivered: u64,
    },
    /// The peer lost the session state (restarted or reset it): messages not
    /// acknowledged are dropped and a fresh session starts (`on_remote_reset`).
    RemoteReset {
        /// Queued messages dropped with the old session.
        dropped: u64,
    },
    /// A graceful close finished: everything queued was acknowledged. Terminal.
    Closed,
}

/// A message could not be queued.
#[derive(Clone, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// The send queue is at its message or byte bound: back off and retry.
    #[error("send queue full ({messages} messages, {bytes} bytes queued)")]
    QueueFull {
        /// Messages queued.
        messages: usize,
        /// Payload bytes queued.
        bytes: usize,
    },
    /// The session is closing or closed.
    #[error("session is closed")]
    Closed,
    /// The message is larger than the peer accepts (its limits, announced
    /// in the handshake; this side's own before the peer is known): it
    /// would only be refused. Nothing was queued.
    #[error(transparent)]
    TooLarge(#[from] TooLarge),
}

msgr_addr::debug_is_display!(SendError);

/// What [`Session::take_link`] decided about an accepted link.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Takeover {
    /// The session now runs on the link.
    Accepted,
    /// Refuse the link: send this frame on it, then close it.
    Rejected(Frame),
    /// Refuse the link, whose peer proved another identity than the
    /// session's (or none where the session's was proved): send the frame,
    /// close the link, count it. The session is not touched.
    Impostor {
        /// The refusal.
        frame: Frame,
        /// What did not match.
        why: AuthError,
    },
    /// This session is ending (closed, or closing after `close` or
    /// `mark_down`) and the hello asks for a new session: start one beside
    /// it, as if this one were gone already. Refusing would make the peer
    /// drop what it queued for a session that never began.
    Ending,
}

/// Counters of one session's life; the owner sums them into messenger counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SessionStats {
    /// Messages delivered to the application.
    pub rx_messages: u64,
    /// Payload bytes delivered.
    pub rx_bytes: u64,
    /// Messages transmitted (replays included).
    pub tx_messages: u64,
    /// Payload bytes transmitted (replays included).
    pub tx_bytes: u64,
    /// Batch frames transmitted (replays included): `tx_messages` over
    /// this is the messages per frame where every message is batched.
    pub tx_batches: u64,
    /// Batch frames received (duplicates included).
    pub rx_batches: u64,
    /// Messages transmitted again after a reconnect.
    pub replayed: u64,
    /// Received messages dropped as duplicates of delivered ones.
    pub duplicates: u64,
    /// Links lost and replaced while the session lived.
    pub reconnects: u64,
    /// Links faulted (any reason).
    pub faults: u64,
    /// Keepalives sent.
    pub keepalives: u64,
    /// Messages that left the send queue (acknowledged, sent lossy, or dropped).
    pub released_messages: u64,
    /// Payload bytes that left the send queue.
    pub released_bytes: u64,
}

/// One session with one peer. See the [module docs](self).
#[derive(Debug)]
pub struct Session {
    cfg: SessionConfig,
    local: LocalIdentity,
    policy: Policy,
    /// Connector or acceptor, and where the session dials ([`side`]).
    side: Side,
    lossless: bool,
    peer_addr: Option<EntityAddr>,
    peer_name: Option<EntityName>,
    cookie: u64,
    features: u64,
    state: State,
    established: bool,
    closing: bool,
    /// Why the last link was lost or the session ended (for diagnostics).
    last_fault: Option<FaultReason>,

    /// Messages from `send` until released, small ones encoded as batch
    /// entries at `send` ([`outbox`]).
    outbox: Outbox,
    /// Payload bytes transmitted on the current link and not yet acknowledged.
    in_flight_bytes: usize,
    out_seq: u64,
    sent_seq: u64,
    acked_seq: u64,
    in_seq: u64,
    acked_in_seq: u64,

    ctrl: VecDeque<Transmit>,
    /// Events and received messages for the owner, in the order they happened.
    events: ToOwner,
    backoff: Duration,
    link_since: Instant,
    last_rx: Instant,
    last_tx: Instant,
    /// When the session was created (its `connect_timeout` counts from it).
    created: Instant,
    /// Link faults since the session was last open (what the backoff grew by).
    attempts: u32,
    /// State of the backoff's jitter (xorshift), so that peers that lost
    /// their links together do not redial in lockstep.
    jitter: u64,
    rx_paused: bool,
    stats: SessionStats,
    /// The peer's receive limits, from the handshake (`features::LIMITS`).
    peer_limits: Option<Limits>,
    /// The peer's dials made before the session last opened or resumed.
    peer_dials: PeerDials,
    /// The current link's protection: its mode, who the peer proved to be
    /// and its record layer (the handshake itself is in
    /// [`State::Authenticating`]).
    link_security: LinkSecurity,
    /// The key the session's peer proved when the session first opened on
    /// an authenticated link: every later link must prove the same.
    peer_key: Option<PublicKey>,
}

/// One link's security state: what the banners chose, then who the peer
/// proved to be and (secure mode) the record layer. Replaced with every link; moved with an accepted link to the
/// session it resumes. Its Debug shows no key.
#[derive(Debug)]
struct LinkSecurity {
    mode: SecurityMode,
    peer: Option<(EntityName, PublicKey)>,
    record: Option<Box<RecordLayer>>,
}

impl Default for LinkSecurity {
    fn default() -> Self {
        LinkSecurity {
            mode: SecurityMode::Crc,
            peer: None,
            record: None,
        }
    }
}

impl Session {
    fn blank(cfg: SessionConfig, local: LocalIdentity, policy: Policy, now: Instant) -> Session {
        let backoff = cfg.backoff_min;
        // Seeded by the messenger's random nonce (processes differ), and by
        // the peer or link in `connect` and `accept` (sessions of one
        // process differ).
        let jitter = local.addr.nonce.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let mut s = Session {
            cfg,
            local,
            policy,
            side: Side::acceptor(),
            lossless: policy.lossless(),
            peer_addr: None,
            peer_name: None,
            cookie: 0,
            features: 0,
            state: State::Closed,
            established: false,
            closing: false,
            last_fault: None,
            outbox: Outbox::default(),
            in_flight_bytes: 0,
            out_seq: 0,
            sent_seq: 0,
            acked_seq: 0,
            in_seq: 0,
            acked_in_seq: 0,
            ctrl: VecDeque::new(),
            events: ToOwner::default(),
            backoff,
            link_since: now,
            last_rx: now,
            last_tx: now,
            created: now,
            attempts: 0,
            jitter: 0,
            rx_paused: false,
            stats: SessionStats::default(),
            peer_limits: None,
            peer_dials: PeerDials::default(),
            link_security: LinkSecurity::default(),
            peer_key: None,
        };
        s.jitter = jitter;
        s
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
        s.jitter = mixed(s.jitter, &peer);
        s.side = Side::connector(peer.clone(), policy);
        s.events.push_back(SessionEvent::Connect(peer.clone()));
        s.peer_addr = Some(peer);
        s.state = State::Connecting {
            since: now,
            dialing: None,
        };
        s
    }

    /// Connector: whoever answers must be `name` — proved by the handshake
    /// in `auth` and `secure` modes, said in the answer to the hello in
    /// `crc` mode. Anyone else ends a session that never opened
    /// ([`AuthError::UnexpectedPeer`], [`ProtocolError::WrongPeer`]); a
    /// session that opened faults the link and tries again.
    pub fn expect_peer(&mut self, name: EntityName) {
        self.side.expect_peer(name);
    }

    /// Whether `name` is the peer the application dialled (when it named
    /// one). A session that never opened ends: the address is someone
    /// else's.
    fn check_expected(&mut self, name: &EntityName, proved: bool) -> Result<(), ProtocolError> {
        let Some(want) = self.side.expected_peer().cloned() else {
            return Ok(());
        };
        if want == *name {
            return Ok(());
        }
        let e: ProtocolError = if proved {
            AuthError::UnexpectedPeer {
                expected: want,
                proved: name.clone(),
            }
            .into()
        } else {
            ProtocolError::WrongPeer {
                expected: want.to_string(),
                actual: name.to_string(),
            }
        };
        if !self.established {
            self.terminate(FaultReason::Protocol(e.clone()));
        }
        Err(e)
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
        s.jitter = mixed(s.jitter, link);
        s.start_link(link, now);
        s
    }

    // ---- accessors -------------------------------------------------------

    /// The link the session currently runs on (or is handshaking on).
    pub fn link(&self) -> Option<LinkId> {
        self.state.link()
    }

    /// Where the session stands, in words ("connecting", "standing by",
    /// "open"...): for logs and for telling why a session is not open.
    pub fn phase(&self) -> &'static str {
        self.state.name()
    }

    /// Why the session last lost a link, or why it ended; `None` until the
    /// first fault.
    pub fn last_fault(&self) -> Option<&FaultReason> {
        self.last_fault.as_ref()
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
        self.attempts
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
            name: self.peer_name.clone()?,
            addr: self.peer_addr.clone()?,
            key: self.peer_key,
            features: self.features,
        })
    }

    /// The address this session dials or was accepted from.
    pub fn peer_addr(&self) -> Option<&EntityAddr> {
        self.peer_addr.as_ref()
    }

    /// This side's policy for the session.
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// Messages queued (unsent, or sent and not yet acknowledged).
    pub fn queued_messages(&self) -> usize {
        self.outbox.messages()
    }

    /// Payload bytes queued.
    pub fn queued_bytes(&self) -> usize {
        self.outbox.bytes()
    }

    /// Whether anything is waiting to be transmitted.
    pub fn wants_transmit(&self) -> bool {
        !self.ctrl.is_empty()
            || (self.is_open()
                && ((self.sent_seq < self.out_seq && !self.window_full())
                    || self.in_seq > self.acked_in_seq))
    }

    /// Lossless: as much is in flight as the peer may be asked to hold.
    fn window_full(&self) -> bool {
        self.lossless
            && (self.sent_seq - self.acked_seq >= self.cfg.max_in_flight_messages
                || self.in_flight_bytes >= self.cfg.max_in_flight_bytes)
    }

    /// Bytes this session's state holds: the engine itself and the
    /// capacity of its queues and open batch buffer (queued messages
    /// excluded: [`Session::queued_bytes`] counts them, whether encoded
    /// into batches or, if large, the application's own buffers). What an
    /// idle connection costs, summed by the messenger (`Messenger::memory`).
    pub fn memory_bytes(&self) -> usize {
        std::mem::size_of::<Session>()
            + self.outbox.memory_bytes()
            + self.ctrl.capacity() * std::mem::size_of::<Transmit>()
            + self.events.memory_bytes()
    }

    /// The largest message segments this session sends: the peer's
    /// limits once the handshake told them, this side's own before (the
    /// defaults are the same on both sides).
    pub fn send_limits(&self) -> Limits {
        self.peer_limits
            .unwrap_or_else(|| Limits::of(&self.cfg.limits))
    }

    /// Counters of this session.
    pub fn stats(&self) -> SessionStats {
        self.stats
    }

    /// Feature bits agreed with the peer on the current link.
    pub fn features(&self) -> u64 {
        self.features
    }

    // ---- application input ------------------------------------------------

    /// Queues a message; it is sent when the session is open. Returns its
    /// sequence number. A small message is encoded here, as an entry of
    /// the batch the session keeps open (what is transmitted, and kept
    /// for replay, is that encoding); a large one is queued whole.
    pub fn send(&mut self, mut msg: Message) -> Result<u64, SendError> {
        if self.closing || self.state.is_closed() {
            return Err(SendError::Closed);
        }
        let limits = self.send_limits();
        limits.check(msg.front.len(), msg.data.len())?;
        let (queued, bytes) = (self.outbox.messages(), self.outbox.bytes());
        if queued >= self.cfg.max_queued_messages
            || (bytes > 0 && bytes + msg.payload_len() > self.cfg.max_queued_bytes)
        {
            return Err(SendError::QueueFull {
                messages: queued,
                bytes,
            });
        }
        self.out_seq += 1;
        if self.batchable(&msg) {
            let terms = Terms {
                limits,
                features: self.features,
            };
            let fits = msg.call == 0 || call_allowed(msg.call, self.features);
            let max = self.cfg.batch_max_bytes;
            self.outbox.push_entry(&msg, self.out_seq, terms, fits, max);
        } else {
            msg.seq = self.out_seq;
            self.outbox.push_single(msg);
        }
        Ok(self.out_seq)
    }

    /// Queues messages encoded before they came here, in order after
    /// everything sent before; returns the sequence number of the last.
    /// The queue bounds are checked once for all of them: all or none.
    /// Entries encoded under limits other than the link's, or calls the
    /// link did not agree to, are checked one by one before they are
    /// transmitted (as a batch encoded here before a handshake is).
    pub fn send_encoded(&mut self, batch: EncodedBatch) -> Result<u64, SendError> {
        if self.closing || self.state.is_closed() {
            return Err(SendError::Closed);
        }
        let (count, payload) = (batch.count() as usize, batch.payload());
        if count == 0 {
            return Ok(self.out_seq);
        }
        let (queued, bytes) = (self.outbox.messages(), self.outbox.bytes());
        if queued + count > self.cfg.max_queued_messages
            || (bytes > 0 && bytes + payload > self.cfg.max_queued_bytes)
        {
            return Err(SendError::QueueFull {
                messages: queued,
                bytes,
            });
        }
        let terms = Terms {
            limits: batch.limits(),
            features: self.features,
        };
        let fits = call_allowed(batch.calls(), self.features);
        self.outbox
            .push_encoded(batch, self.out_seq + 1, terms, fits);
        self.out_seq += count as u64;
        Ok(self.out_seq)
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
            _ if self.outbox.messages() == 0 => {
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
        if self.rx_paused && !paused {
            self.last_rx = now;
        }
        self.rx_paused = paused;
    }

    // ---- transport input ---------------------------------------------------

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
    pub fn link_failed(&mut self, link: LinkId, reason: String, now: Instant) {
        if self.awaits_dial(link) || self.link() == Some(link) {
            let reason = match self.state {
                // A peer that refuses our identity says nothing (it tells an
                // unproven peer no reasons): it closes the link.
                State::Authenticating { .. } => format!(
                    "{reason}, while authenticating: the peer may not accept our name or key"
                ),
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
        if self.link() != Some(link) {
            return Ok(());
        }
        self.last_rx = now;
        let r = self.open(unit).and_then(|mut unit| {
            opened(&mut unit);
            self.process(link, unit, now)
        });
        if let Err(e) = &r {
            self.fault(FaultReason::Protocol(e.clone()), now);
        }
        r
    }

    /// A frame could not be decoded on `link` (bad CRC, hostile length...).
    pub fn handle_decode_error(&mut self, link: LinkId, err: ProtocolError, now: Instant) {
        if self.link() == Some(link) {
            self.fault(FaultReason::Protocol(err), now);
        }
    }

    /// When a connector that never opened gives up (`connect_timeout`).
    fn connect_deadline(&self) -> Option<Instant> {
        let t = self.cfg.connect_timeout?;
        (self.side.is_connector() && !self.established && !self.state.is_closed())
            .then_some(self.created + t)
    }

    /// Fires the timers that are due.
    pub fn handle_timeout(&mut self, now: Instant) {
        if let (Some(at), Some(t)) = (self.connect_deadline(), self.cfg.connect_timeout) {
            if now >= at {
                self.terminate(FaultReason::ConnectTimeout(t));
                return;
            }
        }
        match self.state {
            State::Banner(_) if now >= self.link_since + self.cfg.banner_timeout => {
                self.fault(FaultReason::BannerTimeout, now);
            }
            _ if self.state.is_handshaking()
                && now >= self.link_since + self.cfg.handshake_timeout =>
            {
                self.fault(FaultReason::HandshakeTimeout, now);
            }
            State::Open { .. } => {
                if !self.rx_paused && now >= self.last_rx + self.cfg.keepalive_timeout {
                    self.fault(FaultReason::KeepaliveTimeout, now);
                } else if now >= self.last_tx + self.keepalive_every() && self.ctrl.is_empty() {
                    let stamp = now.duration_since(self.link_since).as_micros() as u64;
                    let frame = if self.features & features::PACED_KEEPALIVE != 0 {
                        let timeout_ms = self.cfg.keepalive_timeout.as_millis() as u64;
                        control_frame(Tag::Keepalive, &PacedKeepalive { stamp, timeout_ms })
                    } else {
                        control_frame(Tag::Keepalive, &Keepalive { stamp })
                    };
                    self.ctrl.push_back(Transmit::Frame(frame));
                    self.stats.keepalives += 1;
                }
            }
            State::Standby {
                reconnect_at: Some(at),
                ..
            } if now >= at => {
                if let Some(peer) = self.side.redial() {
                    self.state = State::Connecting {
                        since: now,
                        dialing: None,
                    };
                    self.events.push_back(SessionEvent::Connect(peer));
                }
            }
            State::Connecting { since, dialing } if now >= since + self.cfg.handshake_timeout => {
                if let Some(link) = dialing {
                    self.events.push_back(SessionEvent::CloseLink(link));
                }
                self.fault(FaultReason::HandshakeTimeout, now);
            }
            State::Standby {
                reconnect_at: None,
                since,
            } if now >= since + self.cfg.server_linger => {
                self.terminate(FaultReason::LingerExpired);
            }
            _ => {}
        }
    }

    /// When [`Session::handle_timeout`] next needs calling.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let state = self.state_timeout();
        match (state, self.connect_deadline()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The current state's own timer.
    fn state_timeout(&self) -> Option<Instant> {
        match self.state {
            State::Banner(_) => {
                Some(self.link_since + self.cfg.banner_timeout.min(self.cfg.handshake_timeout))
            }
            _ if self.state.is_handshaking() => Some(self.link_since + self.cfg.handshake_timeout),
            State::Open { .. } => {
                let ka = self.last_tx + self.keepalive_every();
                if self.rx_paused {
                    Some(ka)
                } else {
                    Some(ka.min(self.last_rx + self.cfg.keepalive_timeout))
                }
            }
            State::Standby {
                reconnect_at: Some(at),
                ..
            } => Some(at),
            State::Standby {
                reconnect_at: None,
                since,
            } => Some(since + self.cfg.server_linger),
            State::Connecting { since, .. } => Some(since + self.cfg.handshake_timeout),
            _ => None,
        }
    }

    // ---- output ------------------------------------------------------------

    /// The next unit to transmit and the link it goes to (sealed, on a link
    /// in secure mode).
    pub fn poll_transmit(&mut self, now: Instant) -> Option<(LinkId, Transmit)> {
        let (link, unit) = self.next_transmit(now)?;
        Some((link, self.protect(unit)))
    }

    /// The security mode of the current link (`Crc` before its banners).
    pub fn security_mode(&self) -> SecurityMode {
        self.link_security.mode
    }

    /// `unit` as it goes on the current link: sealed once the link has a
    /// record layer, except the banner and handshake messages before it.
    fn protect(&mut self, unit: Transmit) -> Transmit {
        let Some(record) = self.link_security.record.as_mut() else {
            return unit;
        };
        match &unit {
            Transmit::Banner(_) => unit,
            Transmit::Frame(f) if f.tag == Tag::Auth => unit,
            _ => Transmit::Frame(record.seal(unit)),
        }
    }

    /// A frame refusing this (accepted, not yet routed) link, sealed if the
    /// link is secure: a peer in secure mode takes nothing in the clear.
    pub fn refusal(&mut self, frame: Frame) -> Transmit {
        self.protect(Transmit::Frame(frame))
    }

    fn next_transmit(&mut self, now: Instant) -> Option<(LinkId, Transmit)> {
        let link = self.link()?;
        if let Some(t) = self.ctrl.pop_front() {
            self.last_tx = now;
            if self.ctrl.is_empty() && matches!(self.state, State::Draining(l) if l == link) {
                // The close frame is out: now the link may go.
                self.state = State::Closed;
                self.events.push_back(SessionEvent::CloseLink(link));
                self.events.push_back(SessionEvent::Closed);
            }
            return Some((link, t));
        }
        if !self.is_open() {
            return None;
        }
        if self.sent_seq < self.out_seq && !self.window_full() {
            let unit = self.transmit_next()?;
            self.last_tx = now;
            return Some((link, unit));
        }
        if self.in_seq > self.acked_in_seq {
            self.acked_in_seq = self.in_seq;
            self.last_tx = now;
            return Some((
                link,
                Transmit::Frame(control_frame(Tag::Ack, &Ack { seq: self.in_seq })),
            ));
        }
        None
    }

    /// Why the peer could not take `msg`, if it could not: over its
    /// limits, or a call where the link did not agree to calls.
    fn unsendable(&self, msg: &Message) -> Option<FaultReason> {
        if let Err(t) = self.send_limits().check(msg.front.len(), msg.data.len()) {
            return Some(FaultReason::TooLarge(t));
        }
        (!call_allowed(msg.call, self.features)).then_some(FaultReason::CallsUnsupported)
    }

    /// Whether `msg` goes in a batch: batches are on, the peer reads them
    /// (or it is not known yet: a link that does not agree unbatches them,
    /// [`Session::unbatch`]) and the message is small (at most a quarter
    /// of a batch, so a batch always has room for its first message).
    fn batchable(&self, msg: &Message) -> bool {
        (self.features == 0 || self.features & features::BATCH != 0)
            && EncodedBatch::batchable(msg.payload_len(), self.cfg.batch_max_bytes)
    }

    /// What the peer takes on the current link, as a batch records it.
    fn terms(&self) -> Terms {
        Terms {
            limits: self.send_limits(),
            features: self.features,
        }
    }

    /// The next unit of messages: the next unsent batch, as far as the
    /// in-flight window and the peer's limits let it go (the rest waits),
    /// or the next large message in a frame of its own. `None` if the
    /// session ended on a message the peer cannot take: one queued before
    /// the peer's limits (or features) were known can only be refused, so
    /// the session ends rather than send it (and, lossless, replay it into
    /// the same refusal for ever). The caller checked that something is
    /// unsent and the window is not full.
    fn transmit_next(&mut self) -> Option<Transmit> {
        loop {
            match self.outbox.pop_unsent()? {
                Unsent::Single(msg) => {
                    if let Some(why) = self.unsendable(&msg) {
                        self.outbox.push_front_unsent(Unsent::Single(msg));
                        self.terminate(why);
                        return None;
                    }
                    let flags = if self.features & features::UNCHECKED_PAYLOAD != 0 {
                        FLAG_UNCHECKED_PAYLOAD
                    } else {
                        0
                    };
                    let len = msg.payload_len();
                    if self.lossless {
                        self.outbox.keep_sent(Sent::Single(msg.clone()));
                    }
                    self.acked_in_seq = self.in_seq;
                    self.count_transmitted(1, len);
                    return Some(Transmit::Message(MessageFrame {
                        msg,
                        ack: self.in_seq,
                        flags,
                    }));
                }
                Unsent::Batch(b) if self.features & features::BATCH == 0 => {
                    if let Err(e) = self.unbatch(b) {
                        self.terminate(FaultReason::Protocol(e));
                        return None;
                    }
                }
                Unsent::Batch(b) => return self.transmit_batch(b),
            }
        }
    }

    /// Sends `b`, or as much of it as may go now: the whole of it where
    /// the window has room and its entries were checked against the
    /// link's terms when encoded (the common case: no entry is looked at
    /// again); else its entries are walked, and those that may go now go
    /// as a batch of their own.
    fn transmit_batch(&mut self, mut b: UnsentBatch) -> Option<Transmit> {
        let terms = self.terms();
        let checked = b.fits && b.terms == terms;
        let (max_messages, max_bytes) = (
            self.cfg.max_in_flight_messages,
            self.cfg.max_in_flight_bytes,
        );
        // Room in the window (at least one message: it is not full).
        let room = if self.lossless {
            max_messages.saturating_sub(self.sent_seq - self.acked_seq)
        } else {
            u64::MAX
        };
        let in_window = !self.lossless
            || (u64::from(b.count) <= room && self.in_flight_bytes + b.payload < max_bytes);
        if !checked || !in_window {
            let (mut count, mut len, mut payload, mut refused) = (0u32, 0, 0, None);
            for e in b.extents() {
                let window_full = u64::from(count) >= room
                    || (self.lossless && self.in_flight_bytes + payload >= max_bytes);
                if count > 0 && window_full {
                    break;
                }
                if !checked {
                    if let Err(t) = terms.limits.check(e.front_len, e.data_len) {
                        refused = Some(FaultReason::TooLarge(t));
                    } else if !call_allowed(e.call, self.features) {
                        refused = Some(FaultReason::CallsUnsupported);
                    }
                    if refused.is_some() {
                        break;
                    }
                }
                count += 1;
                len += e.len;
                payload += e.front_len + e.data_len;
            }
            if count == 0 {
                // Its first message cannot go (the entries are ours: they parse).
                self.outbox.push_front_unsent(Unsent::Batch(b));
                self.terminate(refused.unwrap_or(FaultReason::CallsUnsupported));
                return None;
            }
            if count < b.count {
                let first = b.split_to(count, len, payload);
                self.outbox.push_front_unsent(Unsent::Batch(b));
                b = first;
            }
            b.terms = terms;
            b.fits = true;
        }
        let (count, payload) = (b.count, b.payload);
        let (body, sent) = b.seal_header(self.in_seq);
        self.acked_in_seq = self.in_seq;
        if self.lossless {
            self.outbox.keep_sent(sent);
        }
        self.count_transmitted(u64::from(count), payload);
        self.stats.tx_batches += 1;
        Some(Transmit::Frame(Frame::single(Tag::MessageBatch, body)))
    }

    /// The link did not agree to batches: `b`'s messages go one per
    /// frame (views of its body; a peer of another implementation). An
    /// entry that does not parse is a bug in their encoding (ours, or
    /// the application thread's: [`EncodedBatch`]): the session ends
    /// with it rather than drop messages silently.
    fn unbatch(&mut self, b: UnsentBatch) -> Result<(), ProtocolError> {
        let (body, _) = b.seal_header(0);
        let msgs = BatchReader::new(body)?.collect::<Result<Vec<Message>, _>>()?;
        for m in msgs.into_iter().rev() {
            self.outbox.push_front_unsent(Unsent::Single(m));
        }
        Ok(())
    }

    /// Accounts for the next `n` unsent messages (`bytes` of payload)
    /// having been transmitted: a lossless session keeps them for replay,
    /// a lossy one forgets them.
    fn count_transmitted(&mut self, n: u64, bytes: usize) {
        self.stats.tx_messages += n;
        self.stats.tx_bytes += bytes as u64;
        self.sent_seq += n;
        if self.lossless {
            self.in_flight_bytes += bytes;
        } else {
            // Lossy: nothing is replayed, so nothing is kept.
            self.outbox.forget_sent(n as usize, bytes);
            self.count_released(n as usize, bytes);
            self.acked_seq = self.sent_seq;
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

    // ---- routing of accepted links ----------------------------------------

    /// Acceptor: starts a new session for the hello this session received
    /// (after [`SessionEvent::Identified`]), with a fresh, unique `cookie`.
    pub fn accept_new(&mut self, cookie: u64, now: Instant) {
        debug_assert!(cookie != 0, "cookie 0 means 'new session' on the wire");
        let (link, hello) = match std::mem::replace(&mut self.state, State::Closed) {
            State::Identified { link, hello } => (link, hello),
            other => {
                self.state = other;
                return;
            }
        };
        self.adopt_peer(&hello);
        self.cookie = cookie;
        self.peer_key = self.link_security.peer.as_ref().map(|(_, k)| *k);
        self.open_new(link, now);
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
        if (hello.cookie == 0 || hello.cookie == self.cookie)
            && self.peer_dials.is_stale(hello.addr.nonce, hello.dial)
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
        let restarted = self
            .peer_addr
            .as_ref()
            .is_some_and(|a| a.nonce != 0 && hello.addr.nonce != 0 && a.nonce != hello.addr.nonce);
        // A resume must name this session, and a restarted peer has none
        // to resume. Refused before anything changes: a refused link leaves
        // the session as it was (a reset here left it open on its old link
        // with its seqs back at 0, delivering without `Established`). The
        // peer hears the refusal and comes back with cookie 0.
        if hello.cookie != 0 && (hello.cookie != self.cookie || (restarted && self.established)) {
            return Takeover::Rejected(reset_frame());
        }
        if (restarted || hello.cookie == 0) && self.established {
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
        self.features = pending.features;
        let routed = State::Identified {
            link,
            hello: Box::new(hello.clone()),
        };
        self.attach_link(routed, now);
        self.link_security = std::mem::take(&mut pending.link_security);
        if self.peer_key.is_none() {
            // same_identity passed: this link's peer is the session's.
            self.peer_key = self.link_security.peer.as_ref().map(|(_, k)| *k);
        }
        if hello.cookie == 0 {
            if self.cookie == 0 {
                self.cookie = new_cookie;
            }
            self.open_new(link, now);
        } else {
            let ok = ReconnectOk {
                name: self.local.name.clone(),
                addr: self.local.addr.clone(),
                in_seq: self.in_seq,
            };
            let frame = self.handshake_frame(
                control_frame(Tag::ReconnectOk, &ok),
                self.local.dials.current(),
            );
            self.ctrl.push_back(Transmit::Frame(frame));
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

    // ---- internals ---------------------------------------------------------

    /// `delay` with equal jitter: between half of it and all of it, drawn
    /// from the session's xorshift state.
    fn jittered(&mut self, delay: Duration) -> Duration {
        let mut x = self.jitter;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.jitter = x;
        let half = delay / 2;
        half + half.mul_f64((x >> 11) as f64 / (1u64 << 53) as f64)
    }

    /// Whether the link's banners agreed to carry limits in the handshake.
    fn limits_agreed(&self) -> bool {
        self.features & features::LIMITS != 0
    }

    /// Whether the link's banners agreed to number dials in the handshake.
    fn dials_agreed(&self) -> bool {
        self.features & features::DIAL_NUMBERS != 0
    }

    /// A handshake frame with this side's receive limits and `dial` (a
    /// hello's number, or our last dial's) where the link agreed to them.
    fn handshake_frame(&self, frame: Frame, dial: u64) -> Frame {
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
    fn parse_handshake<T: serde::de::DeserializeOwned>(
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
    fn banner(&self) -> Banner {
        Banner::for_session(self.cfg.payload_crc, self.cfg.security.modes)
    }

    /// Whether the identity an accepted link proved may take this session:
    /// once a session's peer authenticated, every link must prove the same
    /// key and name.
    fn same_identity(&self, hello: &Hello, link: &LinkSecurity) -> Result<(), AuthError> {
        let Some(key) = self.peer_key else {
            return Ok(());
        };
        let was = self.peer_name.clone().unwrap_or_else(|| hello.name.clone());
        match &link.peer {
            Some((name, k)) if *k == key && *name == was => Ok(()),
            Some((name, _)) => Err(AuthError::IdentityChanged {
                was,
                now: name.clone(),
            }),
            None => Err(AuthError::NotAuthenticated(was)),
        }
    }

    /// The peer this link authenticated must be the one that names itself
    /// in the hello or its answer.
    fn check_claimed(&self, claimed: &EntityName) -> Result<(), AuthError> {
        match &self.link_security.peer {
            Some((name, _)) if name != claimed => Err(AuthError::NameMismatch {
                authenticated: name.clone(),
                claimed: claimed.clone(),
            }),
            _ => Ok(()),
        }
    }

    /// Binds the session to the identity its link proved, the first time
    /// it opens on an authenticated link; a later link must prove the same.
    fn bind_identity(&mut self) -> Result<(), AuthError> {
        let Some((name, key)) = self.link_security.peer.clone() else {
            return match (self.peer_key, &self.peer_name) {
                (Some(_), Some(was)) => Err(AuthError::NotAuthenticated(was.clone())),
                _ => Ok(()),
            };
        };
        match self.peer_key {
            Some(k) if k != key => Err(AuthError::IdentityChanged {
                was: self.peer_name.clone().unwrap_or_else(|| name.clone()),
                now: name,
            }),
            _ => {
                self.peer_key = Some(key);
                Ok(())
            }
        }
    }

    /// Starts the handshake once the banners chose `auth` or `secure`;
    /// the connector writes the first message.
    fn start_handshake(
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
            self.ctrl
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
    fn after_banners(&mut self, link: LinkId) {
        if self.side.is_connector() {
            let hello = Hello {
                name: self.local.name.clone(),
                addr: self.local.addr.clone(),
                target: self
                    .peer_addr
                    .clone()
                    .unwrap_or_else(|| self.local.addr.clone()),
                policy: self.policy,
                cookie: self.cookie,
                in_seq: self.in_seq,
                limits: None,
                dial: None,
            };
            let dial = self.local.dials.next();
            let frame = self.handshake_frame(control_frame(Tag::Hello, &hello), dial);
            self.ctrl.push_back(Transmit::Frame(frame));
            self.state = State::HelloSent(link);
        } else {
            self.state = State::AwaitHello(link);
        }
    }

    /// How long this side may send nothing before it sends a keepalive:
    /// `keepalive_interval`, or with paced keepalives a third of the
    /// peer's timeout once the peer said it — 5 s between the defaults'
    /// 15 s timeouts, a keepalive each way instead of a keepalive and its
    /// answer every 2 s (10,000 idle sessions cost a server 12-15% of a
    /// core in the answers' writes; issue 52).
    fn keepalive_every(&self) -> Duration {
        let peer_timeout = match self.state {
            State::Open {
                peer_keepalive_timeout,
                ..
            } => peer_keepalive_timeout,
            _ => None,
        };
        match peer_timeout {
            Some(t) if self.features & features::PACED_KEEPALIVE != 0 => t / 3,
            _ => self.cfg.keepalive_interval,
        }
    }

    /// Starts a fresh link: our banner goes first.
    fn start_link(&mut self, link: LinkId, now: Instant) {
        self.attach_link(State::Banner(link), now);
        self.ctrl
            .push_back(Transmit::Banner(self.banner().encode()));
    }

    /// Runs the session on a new link, in `state` (on that link): a fresh
    /// one, or one whose banners and hello were already exchanged (by the
    /// acceptor session that routed it here).
    fn attach_link(&mut self, state: State, now: Instant) {
        self.ctrl.clear();
        self.link_security = LinkSecurity::default();
        self.link_since = now;
        self.last_rx = now;
        self.last_tx = now;
        self.state = state;
    }

    fn adopt_peer(&mut self, hello: &Hello) {
        self.peer_limits = hello.limits;
        self.peer_dials.learn(hello.addr.nonce, hello.dial);
        self.peer_name = Some(hello.name.clone());
        self.peer_addr = Some(hello.addr.clone());
        self.lossless = hello.policy.lossless();
        self.side.accepted(hello);
    }

    /// Opens a brand-new session on `link` (acceptor side), answering the hello.
    fn open_new(&mut self, link: LinkId, now: Instant) {
        let ok = HelloOk {
            name: self.local.name.clone(),
            addr: self.local.addr.clone(),
            cookie: self.cookie,
        };
        let frame =
            self.handshake_frame(control_frame(Tag::HelloOk, &ok), self.local.dials.current());
        self.ctrl.push_back(Transmit::Frame(frame));
        self.state = State::open(link);
        self.rewind_to_acked();
        self.on_open(now, 0);
    }

    fn on_open(&mut self, now: Instant, replayed: u64) {
        self.backoff = self.cfg.backoff_min;
        self.attempts = 0;
        self.last_rx = now;
        if let Some((from, to)) = self.side.opened() {
            self.events.push_back(SessionEvent::Moved {
                from,
                to,
                reason: self.last_fault.clone(),
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
    fn resume(
        &mut self,
        link: LinkId,
        peer_in_seq: u64,
        now: Instant,
    ) -> Result<(), ProtocolError> {
        self.apply_ack(peer_in_seq)?;
        // apply_ack made acked_seq >= peer_in_seq: replay from there.
        self.rewind_to_acked();
        let replayed = self.out_seq - self.sent_seq;
        // Acks piggybacked on the old link may have been lost: re-ack.
        self.acked_in_seq = 0;
        self.state = State::open(link);
        self.on_open(now, replayed);
        Ok(())
    }

    fn apply_ack(&mut self, seq: u64) -> Result<(), ProtocolError> {
        // Compare with what was transmitted, not what was queued: acking a
        // queued message that was never sent would drop it unsent (and made
        // poll_transmit's index underflow).
        if seq > self.sent_seq {
            return Err(ProtocolError::AckBeyondSent {
                acked: seq,
                sent: self.sent_seq,
            });
        }
        if seq <= self.acked_seq {
            return Ok(());
        }
        self.acked_seq = seq;
        let (n, bytes) = self.outbox.release_through(seq);
        // Acknowledged is transmitted (checked above): it was in flight.
        self.in_flight_bytes = self.in_flight_bytes.saturating_sub(bytes);
        self.count_released(n, bytes);
        if self.closing {
            self.maybe_finish_close();
        }
        Ok(())
    }

    /// A secure link opens every unit first; nothing passes in the clear.
    fn open(&mut self, unit: Inbound) -> Result<Inbound, ProtocolError> {
        Ok(match (self.link_security.record.as_mut(), unit) {
            (Some(record), Inbound::Frame(f)) => record.open(f, &self.cfg.limits)?,
            (Some(_), Inbound::Message(_)) => {
                return Err(RecordError::Plaintext(Tag::Message).into())
            }
            (_, unit) => unit,
        })
    }

    /// Transmits again from the first unacknowledged message (a new link).
    fn rewind_to_acked(&mut self) {
        self.sent_seq = self.acked_seq;
        self.in_flight_bytes = 0;
        self.outbox.rewind();
    }

    /// Counts messages that left the send queue.
    fn count_released(&mut self, n: usize, bytes: usize) {
        self.stats.released_messages += n as u64;
        self.stats.released_bytes += bytes as u64;
    }

    /// Drops every queued message; returns how many there were.
    fn drop_queued(&mut self) -> u64 {
        let (n, bytes) = self.outbox.drop_all();
        self.in_flight_bytes = 0;
        self.count_released(n, bytes);
        n as u64
    }

    fn check_peer(&self, addr: &EntityAddr) -> Result<(), ProtocolError> {
        match &self.peer_addr {
            Some(want) if want.nonce != 0 && want != addr => Err(ProtocolError::WrongPeer {
                expected: want.to_string(),
                actual: addr.to_string(),
            }),
            _ => Ok(()),
        }
    }

    /// The peer lost our session: drop its state and tell the application.
    fn remote_reset(&mut self) {
        let dropped = self.drop_queued();
        self.out_seq = 0;
        self.sent_seq = 0;
        self.in_flight_bytes = 0;
        self.acked_seq = 0;
        self.in_seq = 0;
        self.acked_in_seq = 0;
        self.cookie = 0;
        self.established = false;
        self.events.push_back(SessionEvent::RemoteReset { dropped });
    }

    fn close_link_now(&mut self) {
        if let Some(l) = self.link() {
            self.events.push_back(SessionEvent::CloseLink(l));
        }
        self.ctrl.clear();
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
        let lossless = self.lossless;
        let never_established_acceptor = !self.side.is_connector() && !self.established;
        // A closing lossless session keeps reconnecting to drain; its owner
        // bounds that with a deadline and mark_down.
        if !lossless || never_established_acceptor {
            self.terminate(reason);
            return;
        }
        self.last_fault = Some(reason);
        self.attempts = self.attempts.saturating_add(1);
        // The next attempt goes to the peer's next address.
        self.side.next_address();
        if self.side.may_reconnect() {
            let at = now + self.jittered(self.backoff);
            self.backoff = (self.backoff * 2).min(self.cfg.backoff_max);
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

    fn terminate(&mut self, reason: FaultReason) {
        self.close_link_now();
        let undelivered = self.drop_queued();
        self.state = State::Closed;
        self.last_fault = Some(reason.clone());
        let silent = !self.established && !self.side.is_connector();
        if !silent {
            self.events.push_back(SessionEvent::Reset {
                reason,
                undelivered,
            });
        }
    }

    fn maybe_finish_close(&mut self) {
        if let State::Open { link, .. } = self.state {
            if self.outbox.messages() == 0 && self.sent_seq == self.out_seq {
                let c = Close {
                    reason: "closed".into(),
                };
                self.ctrl
                    .push_back(Transmit::Frame(control_frame(Tag::Close, &c)));
                // poll_transmit sends the close, then ends the session.
                self.state = State::Draining(link);
            }
        }
    }
}

/// A session's output for its owner: events and received messages in two
/// queues, each event stamped with how many messages came before it, so
/// that taking them apart keeps their order (see the [module docs](self)).
#[derive(Debug, Default)]
struct ToOwner {
    /// Each event with the number of messages queued before it.
    events: VecDeque<(u64, SessionEvent)>,
    messages: VecDeque<Message>,
    /// Messages ever queued (taken, waiting or dropped).
    queued: u64,
}

impl ToOwner {
    fn push_back(&mut self, ev: SessionEvent) {
        self.events.push_back((self.queued, ev));
    }

    fn push_message(&mut self, msg: Message) {
        self.messages.push_back(msg);
        self.queued += 1;
    }

    /// Messages taken (or dropped) so far.
    fn taken(&self) -> u64 {
        self.queued - self.messages.len() as u64
    }

    fn pop_event(&mut self) -> Option<SessionEvent> {
        let (before, _) = self.events.front()?;
        if *before > self.taken() {
            return None;
        }
        self.events.pop_front().map(|(_, ev)| ev)
    }

    fn pop_message(&mut self) -> Option<Message> {
        if let Some((before, _)) = self.events.front() {
            if *before <= self.taken() {
                return None;
            }
        }
        self.messages.pop_front()
    }

    /// Drops the messages not taken yet (the events they held back follow).
    fn drop_messages(&mut self) {
        self.messages.clear();
    }

    fn memory_bytes(&self) -> usize {
        self.events.capacity() * std::mem::size_of::<(u64, SessionEvent)>()
            + self.messages.capacity() * std::mem::size_of::<Message>()
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Redial delays are jittered between half the backoff and all of it,
    /// and differ between sessions of different messengers (nonces).
    #[test]
    fn backoff_is_jittered_within_half_and_whole() {
        let now = Instant::now();
        let session = |nonce| {
            let local = LocalIdentity {
                name: EntityName::client(1),
                addr: EntityAddr::tcp(([127, 0, 0, 1], 0).into()).with_nonce(nonce),
                dials: Default::default(),
            };
            let peer = EntityAddr::tcp(([127, 0, 0, 1], 6800).into());
            Session::connect(
                SessionConfig::default(),
                local,
                peer,
                Policy::LosslessClient,
                now,
            )
        };
        let backoff = Duration::from_millis(100);
        let draws = |nonce| {
            let mut s = session(nonce);
            (0..64).map(|_| s.jittered(backoff)).collect::<Vec<_>>()
        };
        let a = draws(7);
        assert!(
            a.iter().all(|d| *d >= backoff / 2 && *d <= backoff),
            "{a:?}"
        );
        assert!(a.iter().any(|d| *d < backoff * 3 / 4) && a.iter().any(|d| *d > backoff * 3 / 4));
        assert_ne!(a, draws(8), "another messenger draws other delays");
        // Sessions of one messenger to different peers differ too.
        let to = |port| {
            let local = LocalIdentity {
                name: EntityName::client(1),
                addr: EntityAddr::tcp(([127, 0, 0, 1], 0).into()).with_nonce(7),
                dials: Default::default(),
            };
            let peer = EntityAddr::tcp(([127, 0, 0, 1], port).into());
            let mut s = Session::connect(
                SessionConfig::default(),
                local,
                peer,
                Policy::LosslessClient,
                now,
            );
            (0..8).map(|_| s.jittered(backoff)).collect::<Vec<_>>()
        };
        assert_ne!(to(6800), to(6801));
    }

    /// A dial that never comes up (a peer behind a partition drops the
    /// SYNs) is given up after `handshake_timeout`: its link closed, the
    /// session redials after its backoff, and the old dial coming up late
    /// is closed rather than taken.
    #[test]
    fn a_dial_that_never_comes_up_is_given_up_and_redialled() {
        let now = Instant::now();
        let local = LocalIdentity {
            name: EntityName::peer(1),
            addr: EntityAddr::tcp(([127, 0, 0, 1], 6801).into()).with_nonce(1),
            dials: Default::default(),
        };
        let peer = EntityAddr::tcp(([127, 0, 0, 1], 6800).into());
        let cfg = SessionConfig::default();
        let timeout = cfg.handshake_timeout;
        let mut s = Session::connect(cfg, local, peer.clone(), Policy::LosslessPeer, now);
        let events = |s: &mut Session| std::iter::from_fn(|| s.poll_event()).collect::<Vec<_>>();
        assert_eq!(events(&mut s), vec![SessionEvent::Connect(peer.clone())]);
        s.dialing(LinkId(1));
        assert_eq!(s.poll_timeout(), Some(now + timeout));
        s.handle_timeout(now + timeout / 2);
        assert_eq!(s.phase(), "connecting", "not yet");
        s.handle_timeout(now + timeout);
        let ev = events(&mut s);
        assert!(ev.contains(&SessionEvent::CloseLink(LinkId(1))), "{ev:?}");
        assert_eq!(s.last_fault(), Some(&FaultReason::HandshakeTimeout));
        assert_eq!(s.failed_attempts(), 1);
        // The backoff, then a new dial.
        let redial = s.poll_timeout().expect("a redial is due");
        s.handle_timeout(redial);
        assert_eq!(events(&mut s), vec![SessionEvent::Connect(peer)]);
        s.dialing(LinkId(2));
        // The first dial comes up late: closed, the session waits for the second.
        s.link_up(LinkId(1), redial);
        assert_eq!(events(&mut s), vec![SessionEvent::CloseLink(LinkId(1))]);
        assert_eq!(s.phase(), "connecting");
        s.link_failed(LinkId(1), "late".into(), redial);
        assert_eq!(
            s.failed_attempts(),
            1,
            "a failure of the given-up dial is not this one's"
        );
        s.link_up(LinkId(2), redial);
        assert_ne!(s.phase(), "connecting", "the second dial is taken");
    }
    /// Everything `from` has to send, handed to `to` on `link` as is.
    fn hand_over(from: &mut Session, to: &mut Session, link: LinkId, now: Instant) {
        while let Some((_, t)) = from.poll_transmit(now) {
            to.handle_inbound(link, t.into(), now)
                .expect("a valid unit");
        }
    }

    /// A client (on link 1) and the server session it opened (on link
    /// 2), both open; the client's events are not taken yet.
    fn open_pair(now: Instant) -> (Session, Session) {
        let addr =
            |port: u16| EntityAddr::tcp(([127, 0, 0, 1], port).into()).with_nonce(u64::from(port));
        let local = |name, port| LocalIdentity {
            name,
            addr: addr(port),
            dials: Default::default(),
        };
        let cfg = SessionConfig::default();
        let mut c = Session::connect(
            cfg.clone(),
            local(EntityName::client(1), 1),
            addr(2),
            Policy::LosslessClient,
            now,
        );
        c.link_up(LinkId(1), now);
        let mut s = Session::accept(cfg, local(EntityName::server(1), 2), LinkId(2), now);
        for _ in 0..4 {
            hand_over(&mut c, &mut s, LinkId(2), now);
            while let Some(ev) = s.poll_event() {
                if matches!(ev, SessionEvent::Identified(_)) {
                    s.accept_new(7, now);
                }
            }
            hand_over(&mut s, &mut c, LinkId(1), now);
            if c.is_open() && s.is_open() {
                return (c, s);
            }
        }
        panic!("the handshake did not finish");
    }

    fn numbered(i: u8) -> Message {
        Message::new(1, vec![i], bytes::Bytes::new())
    }

    /// Messages and events come out apart but in the order they
    /// happened: no message before the `Established` that came first, no
    /// event that came after messages before them.
    #[test]
    fn messages_and_events_keep_their_order() {
        let now = Instant::now();
        let (mut c, mut s) = open_pair(now);
        for i in 1..=2 {
            s.send(numbered(i)).expect("room");
        }
        hand_over(&mut s, &mut c, LinkId(1), now);
        assert_eq!(c.poll_message(), None, "Connect and Established came first");
        assert!(matches!(c.poll_event(), Some(SessionEvent::Connect(_))));
        assert_eq!(c.poll_message(), None, "Established came first");
        assert!(matches!(c.poll_event(), Some(SessionEvent::Established(_))));
        let fronts: Vec<_> = std::iter::from_fn(|| c.poll_message())
            .map(|m| m.front)
            .collect();
        assert_eq!(fronts, [vec![1u8], vec![2]]);
        assert_eq!(c.poll_event(), None);
        // A message, then a fault: its CloseLink waits for the message.
        s.send(numbered(3)).expect("room");
        hand_over(&mut s, &mut c, LinkId(1), now);
        let bad = ProtocolError::Malformed {
            what: "test",
            detail: "a fault after a message".into(),
        };
        c.handle_decode_error(LinkId(1), bad, now);
        assert_eq!(c.poll_event(), None, "the message came first");
        assert_eq!(c.poll_message().map(|m| m.front), Some(vec![3u8].into()));
        assert_eq!(c.poll_event(), Some(SessionEvent::CloseLink(LinkId(1))));
        assert_eq!(c.poll_message(), None);
    }

    /// A hello that asks to resume from a restarted peer (another nonce)
    /// is refused and leaves the session as it was: no remote reset of a
    /// session that goes on over its link.
    #[test]
    fn a_refused_resume_leaves_the_session_alone() {
        let now = Instant::now();
        let (c, mut s) = open_pair(now);
        while s.poll_event().is_some() {}
        let peer = c.local.addr.clone();
        let hello = Hello {
            name: EntityName::client(1),
            addr: peer.clone().with_nonce(peer.nonce + 1),
            target: s.local.addr.clone(),
            policy: Policy::LosslessClient,
            cookie: 7,
            in_seq: 0,
            limits: None,
            dial: None,
        };
        let mut pending =
            Session::accept(SessionConfig::default(), s.local.clone(), LinkId(3), now);
        let t = s.take_link(LinkId(3), &hello, &mut pending, 9, now);
        assert!(matches!(t, Takeover::Rejected(_)), "{t:?}");
        assert_eq!(s.poll_event(), None, "no remote reset");
        assert!(s.is_open());
        assert_eq!(s.link(), Some(LinkId(2)));
    }

    /// An aborted session delivers nothing more: the messages not taken
    /// are dropped, and the events they held back (the reset) follow.
    #[test]
    fn abort_drops_the_messages_not_taken() {
        let now = Instant::now();
        let (mut c, mut s) = open_pair(now);
        while c.poll_event().is_some() {}
        for i in 1..=3 {
            s.send(numbered(i)).expect("room");
        }
        hand_over(&mut s, &mut c, LinkId(1), now);
        assert_eq!(c.poll_message().map(|m| m.front), Some(vec![1u8].into()));
        c.abort(FaultReason::HandlerPanicked("test".into()));
        assert_eq!(c.poll_message(), None);
        let events: Vec<_> = std::iter::from_fn(|| c.poll_event()).collect();
        assert!(
            matches!(
                events.last(),
                Some(SessionEvent::Reset {
                    reason: FaultReason::HandlerPanicked(_),
                    ..
                })
            ),
            "{events:?}"
        );
        assert_eq!(c.poll_message(), None, "nothing after the end");
    }

    /// Messages `numbered(from..=to)` encoded as one batch elsewhere.
    fn encoded(s: &Session, from: u8, to: u8) -> EncodedBatch {
        let max = s.cfg.batch_max_bytes;
        let mut buf = bytes::BytesMut::new();
        let mut b = EncodedBatch::open(&mut buf, 1, max, s.send_limits());
        for i in from..=to {
            assert!(b.push(&numbered(i), max));
        }
        b.close(&mut buf);
        b
    }

    /// A batch encoded before it reached the session takes the next
    /// sequence numbers, in order with messages sent one by one.
    #[test]
    fn encoded_batches_take_their_place_in_the_sequence() {
        let now = Instant::now();
        let (mut c, mut s) = open_pair(now);
        while c.poll_event().is_some() {}
        assert_eq!(s.send(numbered(1)), Ok(1));
        assert_eq!(s.send_encoded(encoded(&s, 2, 4)), Ok(4));
        assert_eq!(s.send(numbered(5)), Ok(5));
        hand_over(&mut s, &mut c, LinkId(1), now);
        let got: Vec<(u64, Vec<u8>)> = std::iter::from_fn(|| c.poll_message())
            .map(|m| (m.seq, m.front.to_vec()))
            .collect();
        let want: Vec<(u64, Vec<u8>)> = (1..=5u8).map(|i| (u64::from(i), vec![i])).collect();
        assert_eq!(got, want);
    }

    /// For a peer that reads no batches, a batch is split into messages;
    /// one whose entries do not parse (a bug in an encoding) ends the
    /// session with a protocol error instead of losing messages.
    #[test]
    fn an_unparsable_batch_for_a_peer_without_batches_ends_the_session() {
        let now = Instant::now();
        let (mut c, mut s) = open_pair(now);
        while c.poll_event().is_some() {}
        while s.poll_event().is_some() {}
        s.features &= !features::BATCH;
        s.send_encoded(encoded(&s, 1, 2)).expect("room");
        let mut bad = encoded(&s, 3, 4);
        bad.body_mut().extend_from_slice(&[0xff]);
        s.send_encoded(bad).expect("room");
        hand_over(&mut s, &mut c, LinkId(1), now);
        let fronts: Vec<_> = std::iter::from_fn(|| c.poll_message())
            .map(|m| m.front.to_vec())
            .collect();
        assert_eq!(fronts, [vec![1u8], vec![2]], "the good batch, one by one");
        let events: Vec<_> = std::iter::from_fn(|| s.poll_event()).collect();
        assert!(
            events.iter().any(|e| matches!(
                e,
                SessionEvent::Reset {
                    reason: FaultReason::Protocol(ProtocolError::Batch(_)),
                    ..
                }
            )),
            "{events:?}"
        );
        assert_eq!(s.queued_messages(), 0, "the rest is dropped and reported");
    }
}
