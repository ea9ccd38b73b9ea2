//! The phases of a session, each holding what only it needs.
//!
//! quinn-proto's connection `State` is the model: the handshake lives
//! inside `Authenticating`, the peer's hello inside `Identified`, the dial
//! being waited for inside `Connecting`, so that a combination the engine
//! must never be in (a handshake on an open link, a hello kept after it
//! was routed) cannot be written. What outlives a phase — the sequence
//! numbers, the queue, the link's record layer — stays on the session.
//!
//! ```text
//! connector: Connecting ─link up─> Banner ─> [Authenticating] ─> HelloSent ─hello-ok, reconnect-ok─> Open
//! acceptor:                        Banner ─> [Authenticating] ─> AwaitHello ─hello─> Identified ─routed─> Open
//! Open ─close─> Draining ─close sent─> Closed
//! acceptor: Authenticating ─peer refused for good─> Refusing ─refusal sent─> Closed
//! a lost link ─> Standby ─redial─> Connecting  (or a link the peer dialled is taken over: Identified ─> Open)
//! ```
//!
//! `Authenticating` only in `auth` and `secure` modes; any phase may end
//! in `Closed`.

use std::time::{Duration, Instant};

use super::Hello;
use super::LinkId;
use crate::auth::Handshake;

/// Where a session stands, as its status shows it: one value per phase
/// of the engine, shown in words ("connecting", "standing by", "open"...)
/// for logs and for telling why a session is not open.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Phase {
    /// Waiting for the transport to connect.
    Connecting,
    /// Exchanging banners.
    ExchangingBanners,
    /// Authenticating (in `auth` and `secure` modes).
    Authenticating,
    /// The hello sent, its answer awaited (the connecting side).
    AwaitingHelloAnswer,
    /// Waiting for the peer's hello (the accepting side).
    AwaitingHello,
    /// The hello heard, the link on its way to its session.
    RoutingHello,
    /// Messages flow.
    Open,
    /// Closing: its last output being sent.
    Closing,
    /// A link lost: waiting to redial, or for the peer to.
    StandingBy,
    /// Ended.
    Closed,
}

impl Phase {
    /// The phase in words.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Connecting => "connecting",
            Phase::ExchangingBanners => "exchanging banners",
            Phase::Authenticating => "authenticating",
            Phase::AwaitingHelloAnswer => "waiting for the hello answer",
            Phase::AwaitingHello => "waiting for hello",
            Phase::RoutingHello => "routing the hello",
            Phase::Open => "open",
            Phase::Closing => "closing",
            Phase::StandingBy => "standing by",
            Phase::Closed => "closed",
        }
    }
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a session stands, with what only that phase needs.
#[derive(Debug)]
pub(super) enum State {
    /// Connector: waiting for the transport connection it asked for.
    Connecting {
        /// When it asked: a dial not up within `handshake_timeout` is
        /// given up (a peer behind a partition drops the SYNs; the kernel
        /// would retry them for minutes).
        since: Instant,
        /// That connection, once the owner said which
        /// ([`Session::dialing`](super::Session::dialing)).
        dialing: Option<LinkId>,
    },
    /// Link up, our banner sent; waiting for the peer's.
    Banner(LinkId),
    /// Banners done, `auth` or `secure` chosen: the Noise handshake runs.
    Authenticating {
        link: LinkId,
        handshake: Box<Handshake>,
    },
    /// Connector: hello sent; waiting for the answer.
    HelloSent(LinkId),
    /// Acceptor: banners done; waiting for hello.
    AwaitHello(LinkId),
    /// Acceptor: hello received; waiting for the owner to route it (or
    /// routed here by [`Session::take_link`](super::Session::take_link),
    /// for as long as it takes to answer). Boxed: the largest phase
    /// otherwise, and a session spends moments in it.
    Identified {
        link: LinkId,
        hello: Box<Hello>,
        /// The first dial of the attempt a cookie-0 hello goes on with
        /// (`features::FIRST_DIAL`).
        first_dial: Option<u64>,
    },
    /// Messages flow.
    Open {
        link: LinkId,
        /// The peer's keepalive timeout, from its last paced keepalive
        /// (`features::PACED_KEEPALIVE`): this side's keepalives go a
        /// third of it apart. `None` until one came on this link.
        peer_keepalive_timeout: Option<Duration>,
    },
    /// Closing gracefully: the close frame is being transmitted on the link.
    Draining(LinkId),
    /// Acceptor: the peer is refused for good (`features::REFUSALS`); the
    /// refusal is being transmitted on the link, which then closes.
    /// Nothing more is read from it.
    Refusing(LinkId),
    /// No link: reconnect at `reconnect_at`, or wait for the peer (`None`).
    Standby {
        reconnect_at: Option<Instant>,
        /// Since when (a server session waits `server_linger` at most).
        since: Instant,
    },
    /// Terminal.
    Closed,
}

impl State {
    /// Open on `link`, no keepalive heard on it yet.
    pub(super) fn open(link: LinkId) -> State {
        State::Open {
            link,
            peer_keepalive_timeout: None,
        }
    }

    pub(super) fn phase(&self) -> Phase {
        match self {
            State::Connecting { .. } => Phase::Connecting,
            State::Banner(_) => Phase::ExchangingBanners,
            State::Authenticating { .. } => Phase::Authenticating,
            State::HelloSent(_) => Phase::AwaitingHelloAnswer,
            State::AwaitHello(_) => Phase::AwaitingHello,
            State::Identified { .. } => Phase::RoutingHello,
            State::Open { .. } => Phase::Open,
            State::Draining(_) | State::Refusing(_) => Phase::Closing,
            State::Standby { .. } => Phase::StandingBy,
            State::Closed => Phase::Closed,
        }
    }

    /// The link the phase runs on, if any.
    pub(super) fn link(&self) -> Option<LinkId> {
        match *self {
            State::Banner(link)
            | State::Authenticating { link, .. }
            | State::HelloSent(link)
            | State::AwaitHello(link)
            | State::Identified { link, .. }
            | State::Open { link, .. }
            | State::Draining(link)
            | State::Refusing(link) => Some(link),
            State::Connecting { .. } | State::Standby { .. } | State::Closed => None,
        }
    }

    /// Whether the session has ended.
    pub(super) fn is_closed(&self) -> bool {
        matches!(self, State::Closed)
    }

    /// Whether a link is up but the session not open on it yet: the
    /// banners, the handshake or the hello are under way (or its refusal,
    /// bounded by the same deadline).
    pub(super) fn is_handshaking(&self) -> bool {
        matches!(
            self,
            State::Banner(_)
                | State::Authenticating { .. }
                | State::HelloSent(_)
                | State::AwaitHello(_)
                | State::Identified { .. }
                | State::Refusing(_)
        )
    }
}
