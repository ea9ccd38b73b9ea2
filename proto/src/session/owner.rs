//! What passes between a session and its owner: the names the owner
//! gives links ([`LinkId`]), who this side is ([`LocalIdentity`]), what the
//! session tells it ([`SessionEvent`], [`FaultReason`], [`PeerInfo`],
//! [`SessionStats`]), what [`Session::send`] and [`Session::take_link`]
//! answer, and the queue ([`ToOwner`]) that hands events and received
//! messages over in the order they happened.

use std::collections::VecDeque;
use std::time::Duration;

use msgr_addr::{EntityAddr, EntityName};

#[cfg(doc)]
use super::Session;
use super::{DialAttempts, Hello, ProtocolError};
use crate::auth::{AuthError, PublicKey};
use crate::control::{Refusal, TooLarge};
use crate::frame::Frame;
use crate::link_failure::LinkFailure;
use crate::message::Message;
use crate::view::ReceivedBatch;

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
    Transport(LinkFailure),
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
    /// The peer refused this side for good and said why (a connector that
    /// the acceptor's keyring does not vouch for): another dial would
    /// meet the same refusal, so the session ended instead of redialling.
    Refused(Refusal),
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
            FaultReason::Refused(r) => write!(f, "refused by the peer: {r}"),
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

/// A message could not be sent: the one send error of msgr, the session's
/// (queue full, closed, too large) and its callers' (a wait for room that
/// gave up, a worker gone, a reply to no request) alike.
#[derive(Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SendError {
    /// The send queue is at its message or byte bound
    /// (`max_queued_messages`, `max_queued_bytes`): back off and retry, or
    /// wait for room.
    #[error("send queue full ({messages} messages, {bytes} bytes queued)")]
    QueueFull {
        /// Messages queued.
        messages: u64,
        /// Payload bytes queued.
        bytes: u64,
    },
    /// The connection was reset, marked down or closed (the session is
    /// closing or closed).
    #[error("connection is closed")]
    Closed,
    /// A send that waits for room gave up after this long.
    #[error("send queue stayed full for {0:?}")]
    Timeout(Duration),
    /// The message is larger than the peer accepts (its limits, announced
    /// in the handshake; this side's own `max_front_bytes` and
    /// `max_data_bytes` until the peer is known). Nothing was queued: the
    /// peer could only refuse it.
    #[error(transparent)]
    TooLarge(#[from] TooLarge),
    /// The worker thread that owns the connection died (a panic, a bug);
    /// the connection is gone with it.
    #[error("the worker owning this connection has died")]
    WorkerStopped,
    /// A reply to a message that is not a request (it came without a
    /// call, or is itself a reply).
    #[error("the message answered is not a request")]
    NotARequest,
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
    /// Fragment frames transmitted (replays included): pieces of
    /// messages larger than `max_fragment`, where lanes are in use.
    pub tx_fragments: u64,
    /// Fragment frames received (duplicates included).
    pub rx_fragments: u64,
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
    /// `Ack` frames sent: acknowledgements no outgoing message carried.
    pub acks: u64,
    /// Messages that left the send queue (acknowledged, sent lossy, or dropped).
    pub released_messages: u64,
    /// Payload bytes that left the send queue.
    pub released_bytes: u64,
}

/// What a session received, in order, for its owner to deliver: a
/// message, or the entries of a batch frame to read in place.
///
/// [`crate::Session::poll_received`] gives these;
/// [`crate::Session::poll_message`] the same messages one by one, owned.
#[derive(Debug)]
pub enum Received {
    /// A message that came alone (a message frame, one made whole from
    /// its fragments), or an entry already taken off its batch.
    Message(Message),
    /// Consecutive entries of one batch frame, checked: each is delivered
    /// once its owner reads it ([`ReceivedBatch::iter`]).
    Batch(ReceivedBatch),
}

/// A session's output for its owner: events and received messages in two
/// queues, each event stamped with how many messages came before it, so
/// that taking them apart keeps their order (see the [module docs](self)).
#[derive(Debug, Default)]
pub(super) struct ToOwner {
    /// Each event with the number of messages queued before it.
    pub(super) events: VecDeque<(u64, SessionEvent)>,
    /// What was received, in order: messages, and batches of them.
    received: VecDeque<Received>,
    /// Messages in `received` (a batch counts its entries).
    waiting: u64,
    /// Messages ever queued (taken, waiting or dropped).
    pub(super) queued: u64,
}

impl ToOwner {
    pub(super) fn push_back(&mut self, ev: SessionEvent) {
        self.events.push_back((self.queued, ev));
    }

    pub(super) fn push_message(&mut self, msg: Message) {
        self.push_received(Received::Message(msg), 1);
    }

    /// Queues entries of a batch, delivered in order from their view.
    pub(super) fn push_batch(&mut self, batch: ReceivedBatch) {
        let n = batch.len() as u64;
        self.push_received(Received::Batch(batch), n);
    }

    fn push_received(&mut self, r: Received, messages: u64) {
        self.received.push_back(r);
        self.waiting += messages;
        self.queued += messages;
    }

    /// Messages taken (or dropped) so far.
    pub(super) fn taken(&self) -> u64 {
        self.queued - self.waiting
    }

    pub(super) fn pop_event(&mut self) -> Option<SessionEvent> {
        let (before, _) = self.events.front()?;
        if *before > self.taken() {
            return None;
        }
        self.events.pop_front().map(|(_, ev)| ev)
    }

    /// Whether an event comes before the next message.
    fn event_first(&self) -> bool {
        matches!(self.events.front(), Some((before, _)) if *before <= self.taken())
    }

    /// The next message or batch; a batch counts as taken whole.
    pub(super) fn pop_received(&mut self) -> Option<Received> {
        if self.event_first() {
            return None;
        }
        let r = self.received.pop_front()?;
        self.waiting -= match &r {
            Received::Message(_) => 1,
            Received::Batch(b) => b.len() as u64,
        };
        Some(r)
    }

    /// The next message, owned (one taken off the batch in front).
    pub(super) fn pop_message(&mut self) -> Option<Message> {
        if self.event_first() {
            return None;
        }
        let msg = match self.received.front_mut()? {
            Received::Batch(b) => {
                let m = b.pop_message();
                if b.is_empty() || m.is_none() {
                    // (None: entries it could not read, dropped.)
                    let gone = b.len() as u64;
                    self.received.pop_front();
                    self.waiting -= gone;
                }
                m
            }
            Received::Message(_) => match self.received.pop_front() {
                Some(Received::Message(m)) => Some(m),
                _ => None,
            },
        };
        if msg.is_some() {
            self.waiting -= 1;
        }
        msg
    }

    /// Drops the messages not taken yet (the events they held back follow).
    pub(super) fn drop_messages(&mut self) {
        self.received.clear();
        self.waiting = 0;
    }

    pub(super) fn memory_bytes(&self) -> usize {
        self.events.capacity() * std::mem::size_of::<(u64, SessionEvent)>()
            + self.received.capacity() * std::mem::size_of::<Received>()
    }
}
