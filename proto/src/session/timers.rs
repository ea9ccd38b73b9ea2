//! The engine's timers: the banner and handshake deadlines of a link,
//! keepalives and the silence that faults an open one, the redial after
//! a fault (backoff with jitter), a lossless server session's linger and
//! a connector's `connect_timeout`. The owner asks when
//! ([`Session::poll_timeout`]) and calls [`Session::handle_timeout`].

use std::time::{Duration, Instant};

use super::{FaultReason, Session, SessionEvent, State};
use crate::banner::features;
use crate::control::{control_frame, Keepalive, PacedKeepalive};
use crate::frame::Tag;
use crate::stream::Transmit;

/// When things happened, for the timers.
#[derive(Debug)]
pub(super) struct Clock {
    /// When the session was created (its `connect_timeout` counts from it).
    pub(super) created: Instant,
    /// When the current link started (banner and handshake timeouts).
    pub(super) link_since: Instant,
    /// The last unit received (the keepalive timeout).
    pub(super) last_rx: Instant,
    /// The last unit transmitted (when a keepalive is due).
    pub(super) last_tx: Instant,
}

impl Clock {
    /// A new link starts `now`: its deadlines count from here.
    pub(super) fn link_started(&mut self, now: Instant) {
        self.link_since = now;
        self.last_rx = now;
        self.last_tx = now;
    }
}

/// How the session redials after a fault.
#[derive(Debug)]
pub(super) struct Redial {
    /// The delay before the next redial (doubling up to `backoff_max`).
    pub(super) backoff: Duration,
    /// Link faults since the session was last open (what the backoff grew by).
    pub(super) attempts: u32,
    /// State of the backoff's jitter (xorshift), so that peers that lost
    /// their links together do not redial in lockstep.
    pub(super) jitter: u64,
    /// Why the last link was lost or the session ended (for diagnostics).
    pub(super) last_fault: Option<FaultReason>,
    /// Connector: the number of the first dial of its attempt to open the
    /// session (cookie 0), sent with every later dial of that attempt
    /// (`features::FIRST_DIAL`); `None` once open or reset, when the next
    /// cookie-0 hello begins a new attempt.
    pub(super) first_dial: Option<u64>,
}

impl Redial {
    /// `delay` with equal jitter: between half of it and all of it, drawn
    /// from the session's xorshift state.
    pub(super) fn jittered(&mut self, delay: Duration) -> Duration {
        let mut x = self.jitter;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.jitter = x;
        let half = delay / 2;
        half + half.mul_f64((x >> 11) as f64 / (1u64 << 53) as f64)
    }
}

impl Session {
    /// When a connector that never opened gives up (`connect_timeout`).
    pub(super) fn connect_deadline(&self) -> Option<Instant> {
        let t = self.cfg.connect_timeout?;
        (self.side.is_connector() && !self.established && !self.state.is_closed())
            .then_some(self.clock.created + t)
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
            State::Banner(_) if now >= self.clock.link_since + self.cfg.banner_timeout => {
                self.fault(FaultReason::BannerTimeout, now);
            }
            _ if self.state.is_handshaking()
                && now >= self.clock.link_since + self.cfg.handshake_timeout =>
            {
                self.fault(FaultReason::HandshakeTimeout, now);
            }
            State::Open { .. } => {
                if !self.rx.paused && now >= self.clock.last_rx + self.cfg.keepalive_timeout {
                    self.fault(FaultReason::KeepaliveTimeout, now);
                } else if now >= self.clock.last_tx + self.keepalive_every()
                    && self.tx.ctrl.is_empty()
                {
                    self.queue_keepalive(now);
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

    /// Queues this side's keepalive (paced where the peer paces them).
    pub(super) fn queue_keepalive(&mut self, now: Instant) {
        let stamp = now.duration_since(self.clock.link_since).as_micros() as u64;
        let frame = if self.remote.features & features::PACED_KEEPALIVE != 0 {
            let timeout_ms = self.cfg.keepalive_timeout.as_millis() as u64;
            control_frame(Tag::Keepalive, &PacedKeepalive { stamp, timeout_ms })
        } else {
            control_frame(Tag::Keepalive, &Keepalive { stamp })
        };
        self.tx.ctrl.push_back(Transmit::Frame(frame));
        self.stats.keepalives += 1;
    }

    /// A paced keepalive arrived at `now`: this side's own goes with it
    /// if it would be due within half a pace. Idle sessions' keepalives
    /// then go both ways in the pass that read the peer's — one wake-up
    /// of a server per idle session and pace, not that and a timer's —
    /// and this side's timer does not fire while the peer's keep coming.
    /// Early is never late: the peer hears this side at least as often.
    pub(super) fn keepalive_along(&mut self, now: Instant) {
        let every = self.keepalive_every();
        if now >= self.clock.last_tx + every / 2 && self.tx.ctrl.is_empty() {
            self.queue_keepalive(now);
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
    pub(super) fn state_timeout(&self) -> Option<Instant> {
        match self.state {
            State::Banner(_) => Some(
                self.clock.link_since + self.cfg.banner_timeout.min(self.cfg.handshake_timeout),
            ),
            _ if self.state.is_handshaking() => {
                Some(self.clock.link_since + self.cfg.handshake_timeout)
            }
            State::Open { .. } => {
                let mut due = self.clock.last_tx + self.keepalive_every();
                if !self.rx.paused {
                    due = due.min(self.clock.last_rx + self.cfg.keepalive_timeout);
                }
                Some(self.ack_deadline().map_or(due, |ack| ack.min(due)))
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

    /// How long this side may send nothing before it sends a keepalive:
    /// `keepalive_interval`, or with paced keepalives a third of the
    /// peer's timeout once the peer said it — 5 s between the defaults'
    /// 15 s timeouts, a keepalive each way instead of a keepalive and its
    /// answer every 2 s (10,000 idle sessions cost a server 12-15% of a
    /// core in the answers' writes; issue 52).
    pub(super) fn keepalive_every(&self) -> Duration {
        let peer_timeout = match self.state {
            State::Open {
                peer_keepalive_timeout,
                ..
            } => peer_keepalive_timeout,
            _ => None,
        };
        match peer_timeout {
            Some(t) if self.remote.features & features::PACED_KEEPALIVE != 0 => t / 3,
            _ => self.cfg.keepalive_interval,
        }
    }
}
