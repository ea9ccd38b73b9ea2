//! Session policies and tunables.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::auth::Security;
use crate::frame::FrameLimits;
use crate::priority::Priority;

/// Delivery guarantee and reconnect role of a session (modelled on Ceph's).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum Policy {
    /// At most once, in order. A fault ends the session and tells the dispatcher.
    LossyClient,
    /// Exactly once, in order, across transport faults; this side reconnects.
    #[default]
    LosslessClient,
    /// Exactly once, in order; either side may reconnect (and both may connect at once).
    LosslessPeer,
    /// The accepting side: lossless sessions resume when the peer reconnects,
    /// but a server never initiates a connection.
    Server,
}

impl Policy {
    /// Whether messages survive transport faults.
    pub fn lossless(self) -> bool {
        !matches!(self, Policy::LossyClient)
    }
}

/// [`SessionConfig::batch_max_bytes`] by default: a quarter of the RDMA
/// transports' default receive chunk (32 KiB), so a batch is one receive
/// there; 4 KiB messages at most go into batches.
pub const DEFAULT_BATCH_MAX_BYTES: usize = 16 << 10;

/// [`SessionConfig::ack_delay`] by default: long enough for a server's
/// turn over hundreds of connections to pass before their acks go alone
/// (a reply made meanwhile carries them), short beside any timer a peer
/// waits on.
///
/// ```
/// use msgr_proto::session::{SessionConfig, DEFAULT_ACK_DELAY};
/// assert_eq!(SessionConfig::default().ack_delay, DEFAULT_ACK_DELAY);
/// ```
pub const DEFAULT_ACK_DELAY: Duration = Duration::from_millis(1);

/// Tunables of one session. The defaults suit a LAN; tests shrink the timers.
#[derive(Clone, Debug, PartialEq)]
pub struct SessionConfig {
    /// Frame size limits enforced on receive.
    pub limits: FrameLimits,
    /// Send a keepalive after this long without transmitting.
    pub keepalive_interval: Duration,
    /// Fault the link after this long without receiving anything.
    pub keepalive_timeout: Duration,
    /// Fault a link whose banner/hello exchange has not finished by then,
    /// and give up a dial whose transport connection is not up by then.
    pub handshake_timeout: Duration,
    /// Fault a link whose peer has not sent its banner (the first 32
    /// bytes) by then: shorter than the whole handshake, so a connection
    /// that says nothing gives its slot back soon.
    pub banner_timeout: Duration,
    /// First reconnect delay; doubles per failed attempt.
    pub backoff_min: Duration,
    /// Ceiling of the reconnect delay.
    pub backoff_max: Duration,
    /// After a `Wait` from a peer that won a connection race, retry after this
    /// long if its connection has not arrived.
    pub wait_retry: Duration,
    /// A lossless server-side session with no link is dropped after this long.
    pub server_linger: Duration,
    /// Most messages queued for sending (including sent, unacked ones).
    pub max_queued_messages: usize,
    /// Most payload bytes queued for sending (including sent, unacked ones).
    pub max_queued_bytes: usize,
    /// Lossless: most messages transmitted and not yet acknowledged. Bounds
    /// what a reconnect replays (and keeps senders from outrunning acks).
    pub max_in_flight_messages: u64,
    /// Lossless: most payload bytes transmitted and not yet acknowledged.
    pub max_in_flight_bytes: usize,
    /// How long an acknowledgement of what arrived may wait for an
    /// outgoing message to carry it (every message, batch and fragment
    /// carries the current ack) before it goes as an `Ack` frame of its
    /// own; it goes at once when a quarter of this side's own in-flight
    /// window (`max_in_flight_messages`, `max_in_flight_bytes`) arrived
    /// unacknowledged, so a peer configured alike never waits for it.
    /// Zero: an ack after every pass that received something.
    pub ack_delay: Duration,
    /// Checksum message payloads (front and data segments) with CRC32C.
    /// `false` on both sides of a link skips it (negotiated in the banner);
    /// frame preambles and message headers are always checked.
    pub payload_crc: bool,
    /// Largest batch frame body this side writes, in bytes
    /// (batch frames); 0 sends every message in a frame of its own.
    /// Messages whose payload is at most a quarter of it go into batch
    /// frames where the peer reads them (`features::BATCH`): whatever is
    /// queued when the session transmits, never waiting for more. Larger
    /// messages keep frames of their own (their data segment referenced,
    /// not copied, and checksummed apart). Keep it within one receive
    /// buffer of the RDMA transports (`rdma_chunk_size`) and at most the
    /// peer's header-segment limit (64 KiB).
    pub batch_max_bytes: usize,
    /// Priority lanes: a message larger than this travels as fragments
    /// of at most this many payload bytes where both sides offered
    /// `LANES`, so that a message of a more urgent class waits for at
    /// most one fragment (docs/PROTOCOL.md, "Fragment frames"). Default
    /// [`crate::fragment::DEFAULT_MAX_FRAGMENT`] (1 MiB); 0: this side
    /// does not offer `LANES` (one class, no fragments, as before).
    pub max_fragment: usize,
    /// A connector whose session never opened ends this long after it was
    /// created, with `FaultReason::ConnectTimeout` (queued messages are
    /// dropped and reported, as at any reset). `None`: a lossless session
    /// keeps trying for ever (each failed attempt is reported); a lossy one
    /// ends at its first failure anyway. Sessions that opened once are not
    /// concerned: their reconnects follow the policy.
    pub connect_timeout: Option<Duration>,
    /// The security modes this side allows and its credentials
    /// (see the `security` configuration key); by default `crc` only.
    pub security: Security,
}

impl SessionConfig {
    /// The queue bounds a message of `class` is admitted under (messages,
    /// payload bytes): `max_queued_messages` and `max_queued_bytes` for
    /// data and background, twice them for the classes above, so that
    /// bulk filling the queue leaves urgent messages room of their own
    /// (docs/GUARANTEES.md, "Priority lanes").
    ///
    /// ```
    /// use msgr_proto::{Priority, SessionConfig};
    /// let cfg = SessionConfig::default();
    /// let (msgs, bytes) = cfg.queue_bounds(Priority::Data);
    /// assert_eq!(cfg.queue_bounds(Priority::Interactive), (2 * msgs, 2 * bytes));
    /// assert_eq!(cfg.queue_bounds(Priority::Background), (msgs, bytes));
    /// ```
    pub fn queue_bounds(&self, class: Priority) -> (usize, usize) {
        let share = if class.is_above(Priority::Data) { 2 } else { 1 };
        (
            self.max_queued_messages.saturating_mul(share),
            self.max_queued_bytes.saturating_mul(share),
        )
    }
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            limits: FrameLimits::default(),
            keepalive_interval: Duration::from_secs(2),
            keepalive_timeout: Duration::from_secs(15),
            handshake_timeout: Duration::from_secs(10),
            banner_timeout: Duration::from_secs(2),
            backoff_min: Duration::from_millis(5),
            backoff_max: Duration::from_secs(2),
            wait_retry: Duration::from_secs(1),
            server_linger: Duration::from_secs(900),
            max_queued_messages: 64 * 1024,
            max_queued_bytes: 256 << 20,

            max_in_flight_messages: 16 * 1024,
            max_in_flight_bytes: 32 << 20,
            ack_delay: DEFAULT_ACK_DELAY,
            payload_crc: true,
            batch_max_bytes: DEFAULT_BATCH_MAX_BYTES,
            max_fragment: crate::fragment::DEFAULT_MAX_FRAGMENT,
            connect_timeout: None,
            security: Security::default(),
        }
    }
}
