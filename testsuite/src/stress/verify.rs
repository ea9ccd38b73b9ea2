//! What the servers check as messages arrive, and what the clients remember
//! about what they sent, so that the end of a run can compare the two.
//!
//! Every message is tagged (client, server, epoch, n, class, prev). An epoch
//! is one run of consecutive sends by one client to one server over one
//! `Connection` object without a known disturbance; `n` counts from 1 within
//! it. Messages travel in mixed priority classes, and msgr promises order
//! within a class only, so each message also names its class and `prev`, the
//! `n` of the epoch's previous message in that class: the server checks
//! order, duplicates and gaps per class, and the count per epoch. The data segment
//! is a slice of a seeded pattern buffer whose offset derives from the tag, so
//! the receiver checks the bytes without trusting anything in the message.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use msgr::{Connection, Dispatcher, FaultReason, Message, Policy, Priority};
use rand::{RngCore, SeedableRng};

/// Message type of workload messages.
pub const PROBE_TYPE: u16 = 0x5157;
/// Length of the encoded tag (the front segment).
pub const PROBE_LEN: usize = 4 + 4 + 4 + 8 + 4 + 1 + 8;
/// Bytes of the shared pattern buffer (the largest message plus room to slide).
const PATTERN_SLACK: usize = 64 << 10;

/// The tag at the front of every workload message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Probe {
    /// Client index.
    pub client: u32,
    /// Server index.
    pub server: u32,
    /// Epoch of (client, server), from 1.
    pub epoch: u32,
    /// Sequence within the epoch, from 1.
    pub n: u64,
    /// Data length.
    pub len: u32,
    /// Its class ([`Priority::index`]; never `Control`).
    pub class: u8,
    /// The `n` of the epoch's previous message in this class (0: none).
    pub prev: u64,
}

impl Probe {
    fn encode(&self) -> Bytes {
        let mut v = Vec::with_capacity(PROBE_LEN);
        v.extend_from_slice(&self.client.to_le_bytes());
        v.extend_from_slice(&self.server.to_le_bytes());
        v.extend_from_slice(&self.epoch.to_le_bytes());
        v.extend_from_slice(&self.n.to_le_bytes());
        v.extend_from_slice(&self.len.to_le_bytes());
        v.push(self.class);
        v.extend_from_slice(&self.prev.to_le_bytes());
        Bytes::from(v)
    }

    pub(crate) fn decode(b: &[u8]) -> Option<Probe> {
        if b.len() != PROBE_LEN {
            return None;
        }
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        let class = b[24];
        if class == 0 || usize::from(class) >= Priority::COUNT {
            return None;
        }
        Some(Probe {
            client: u32_at(0),
            server: u32_at(4),
            epoch: u32_at(8),
            n: u64_at(12),
            len: u32_at(20),
            class,
            prev: u64_at(25),
        })
    }

    /// The key of the stream this message belongs to.
    pub fn key(&self) -> StreamKey {
        (self.client, self.server, self.epoch)
    }
}

/// (client, server, epoch).
pub type StreamKey = (u32, u32, u32);

/// The seeded bytes every message's data is a slice of.
#[derive(Clone)]
pub struct Pattern {
    buf: Bytes,
    max_len: usize,
}

impl Pattern {
    /// A pattern for messages of up to `max_len` bytes.
    pub fn new(seed: u64, max_len: usize) -> Self {
        let mut v = vec![0u8; max_len + PATTERN_SLACK];
        rand::rngs::StdRng::seed_from_u64(seed ^ 0x7061_7474_6572_6e00).fill_bytes(&mut v);
        Pattern {
            buf: Bytes::from(v),
            max_len,
        }
    }

    fn offset(&self, p: &Probe) -> usize {
        let mut x = (u64::from(p.client) << 32 | u64::from(p.server))
            ^ (u64::from(p.epoch) << 17)
            ^ p.n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        x ^= x >> 29;
        x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x ^= x >> 32;
        (x % (self.buf.len() - p.len as usize + 1) as u64) as usize
    }

    /// The message for `p` (data shares the pattern's buffer: no copy).
    pub fn message(&self, p: &Probe) -> Message {
        assert!(
            p.len as usize <= self.max_len,
            "message larger than the pattern"
        );
        let off = self.offset(p);
        Message::new(
            PROBE_TYPE,
            p.encode(),
            self.buf.slice(off..off + p.len as usize),
        )
        .with_class(Priority::ALL[usize::from(p.class)])
    }

    pub(crate) fn intact(&self, p: &Probe, data: &[u8]) -> bool {
        if data.len() != p.len as usize || data.len() > self.max_len {
            return false;
        }
        let off = self.offset(p);
        self.buf[off..off + data.len()] == *data
    }
}

/// What the servers saw of one stream.
#[derive(Clone, Debug, Default)]
pub struct StreamState {
    /// Highest n delivered.
    pub last: u64,
    /// Highest n delivered in each class (by [`Priority::index`]).
    pub last_in_class: [u64; Priority::COUNT],
    /// Messages delivered.
    pub delivered: u64,
    /// Payload bytes delivered.
    pub bytes: u64,
    /// Times a message's `prev` was not the last delivered of its class
    /// (losses; fine only where allowed).
    pub gaps: u64,
    /// The first gap, as (the last delivered n of the class, the `prev` got).
    pub first_gap: Option<(u64, u64)>,
}

/// At most this many violations are kept with their text (all are counted).
const KEEP_VIOLATIONS: usize = 200;

/// Violations found anywhere in a run: counted, the first ones kept.
#[derive(Default)]
pub struct Violations {
    count: AtomicU64,
    list: Mutex<Vec<String>>,
}

impl Violations {
    /// Records one.
    pub fn push(&self, what: String) {
        self.count.fetch_add(1, Ordering::Relaxed);
        let mut l = self.list.lock().expect("violations lock");
        if l.len() < KEEP_VIOLATIONS {
            l.push(what);
        }
    }

    /// How many so far.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// The ones kept.
    pub fn list(&self) -> Vec<String> {
        self.list.lock().expect("violations lock").clone()
    }
}

/// The servers' shared record of every stream; survives server restarts.
pub struct Verifier {
    pattern: Pattern,
    streams: Mutex<HashMap<StreamKey, StreamState>>,
    /// Where violations go.
    pub violations: Arc<Violations>,
    /// Messages delivered to any server.
    pub delivered: AtomicU64,
    /// Payload bytes delivered to any server.
    pub delivered_bytes: AtomicU64,
    /// on_reset calls on the server side.
    pub server_resets: AtomicU64,
}

impl Verifier {
    /// A verifier for messages built from `pattern`.
    pub fn new(pattern: Pattern, violations: Arc<Violations>) -> Arc<Self> {
        Arc::new(Verifier {
            pattern,
            streams: Mutex::new(HashMap::new()),
            violations,
            delivered: AtomicU64::new(0),
            delivered_bytes: AtomicU64::new(0),
            server_resets: AtomicU64::new(0),
        })
    }

    /// What was delivered on one stream so far.
    pub fn stream(&self, key: StreamKey) -> StreamState {
        self.streams
            .lock()
            .expect("streams lock")
            .get(&key)
            .cloned()
            .unwrap_or_default()
    }

    fn check(&self, server: u32, msg: &Message) {
        let Some(p) = (msg.msg_type == PROBE_TYPE)
            .then(|| Probe::decode(&msg.front))
            .flatten()
        else {
            self.violations.push(format!(
                "server {server}: undecodable message (type {}, front {} B, data {} B)",
                msg.msg_type,
                msg.front.len(),
                msg.data.len()
            ));
            return;
        };
        if p.server != server {
            self.violations.push(format!(
                "server {server} received a message for server {}: {p:?}",
                p.server
            ));
        }
        if !self.pattern.intact(&p, &msg.data) {
            self.violations.push(format!(
                "corrupt data: {p:?}, got {} B that differ from the pattern",
                msg.data.len()
            ));
        }
        self.delivered.fetch_add(1, Ordering::Relaxed);
        self.delivered_bytes
            .fetch_add(msg.data.len() as u64, Ordering::Relaxed);
        let mut streams = self.streams.lock().expect("streams lock");
        let s = streams.entry(p.key()).or_default();
        // Order and exactly-once hold within a class; across classes a
        // later n may come first.
        let class = usize::from(p.class);
        let before = s.last_in_class[class];
        if p.n <= before {
            let what = if p.n == before {
                "duplicate"
            } else {
                "out of order"
            };
            drop(streams);
            self.violations.push(format!(
                "{what} in class {:?}: client {} -> server {} epoch {}: got n={} after n={before}",
                Priority::ALL[class],
                p.client,
                p.server,
                p.epoch,
                p.n,
            ));
            return;
        }
        if p.prev != before {
            s.gaps += 1;
            if s.first_gap.is_none() {
                s.first_gap = Some((before, p.prev));
            }
        }
        s.last_in_class[class] = p.n;
        s.last = s.last.max(p.n);
        s.delivered += 1;
        s.bytes += msg.data.len() as u64;
    }
}

/// The dispatcher of server `index` (every incarnation of it).
pub struct ServerDispatcher {
    /// Server index.
    pub index: u32,
    /// The shared verifier.
    pub verifier: Arc<Verifier>,
}

impl Dispatcher for ServerDispatcher {
    fn on_message(&self, _conn: &Connection, msg: Message) {
        self.verifier.check(self.index, &msg);
    }

    fn on_reset(&self, _conn: &Connection, _reason: &FaultReason) {
        self.verifier.server_resets.fetch_add(1, Ordering::Relaxed);
    }
}

/// What one client's messenger heard about its connections, by connection id.
#[derive(Default)]
pub struct ClientEvents {
    resets: Mutex<HashMap<u64, String>>,
    remote_resets: Mutex<HashMap<u64, u64>>,
    /// on_reset calls.
    pub reset_count: AtomicU64,
    /// on_remote_reset calls.
    pub remote_reset_count: AtomicU64,
    /// Messages clients received (the workload's servers never send).
    pub unexpected: AtomicU64,
}

impl ClientEvents {
    /// Why connection `id` was reset, if it was.
    pub fn reset_of(&self, id: u64) -> Option<String> {
        self.resets.lock().expect("resets lock").get(&id).cloned()
    }

    /// How many remote resets connection `id` has had.
    pub fn remote_resets_of(&self, id: u64) -> u64 {
        self.remote_resets
            .lock()
            .expect("remote resets lock")
            .get(&id)
            .copied()
            .unwrap_or(0)
    }

    /// Forgets a connection that is no longer used (keeps memory flat on long runs).
    pub fn forget(&self, id: u64) {
        self.resets.lock().expect("resets lock").remove(&id);
        self.remote_resets
            .lock()
            .expect("remote resets lock")
            .remove(&id);
    }
}

impl Dispatcher for ClientEvents {
    fn on_message(&self, _conn: &Connection, _msg: Message) {
        self.unexpected.fetch_add(1, Ordering::Relaxed);
    }

    fn on_reset(&self, conn: &Connection, reason: &FaultReason) {
        self.reset_count.fetch_add(1, Ordering::Relaxed);
        self.resets
            .lock()
            .expect("resets lock")
            .insert(conn.id(), reason.to_string());
    }

    fn on_remote_reset(&self, conn: &Connection) {
        self.remote_reset_count.fetch_add(1, Ordering::Relaxed);
        *self
            .remote_resets
            .lock()
            .expect("remote resets lock")
            .entry(conn.id())
            .or_default() += 1;
    }
}

/// A client's record of one epoch, kept for the final comparison.
pub struct EpochRecord {
    /// (client, server, epoch).
    pub key: StreamKey,
    /// The connection's policy.
    pub policy: Policy,
    /// The connection it was sent on.
    pub conn: Connection,
    /// Messages sent (accepted by `send`).
    pub sent: AtomicU64,
    /// The client marked the connection down (queued messages may be lost).
    pub marked_down: AtomicBool,
    /// The client saw a reset, remote reset or server restart and moved on.
    pub ended_disturbed: AtomicBool,
    /// The connection's remote-reset count when the epoch began.
    pub remote_resets_at_start: u64,
    /// The server slot's generation when the epoch began.
    pub generation_at_start: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Message `n` of epoch (0, 0, 1) in `class` after `prev` of its class.
    fn msg(pattern: &Pattern, n: u64, class: Priority, prev: u64) -> Message {
        pattern.message(&Probe {
            client: 0,
            server: 0,
            epoch: 1,
            n,
            len: 8,
            class: class.index() as u8,
            prev,
        })
    }

    /// Across classes a later message may come first; within one, a
    /// reorder or a duplicate is a violation and a lost message a gap.
    #[test]
    fn order_and_exactly_once_are_checked_per_class() {
        use Priority::{Background as B, Interactive as I};
        let pattern = Pattern::new(7, 64);
        let v = Verifier::new(pattern.clone(), Arc::default());
        // Sent: 1 B, 2 B, 3 I, 4 B; delivered: 3 I overtakes both.
        for (n, class, prev) in [(3, I, 0), (1, B, 0), (2, B, 1), (4, B, 2)] {
            v.check(0, &msg(&pattern, n, class, prev));
        }
        let s = v.stream((0, 0, 1));
        assert_eq!(
            (v.violations.count(), s.delivered, s.last, s.gaps),
            (0, 4, 4, 0)
        );
        assert_eq!(
            msg(&pattern, 3, I, 0).class(),
            I,
            "the probe travels in its class"
        );

        v.check(0, &msg(&pattern, 2, B, 1));
        assert_eq!(v.violations.count(), 1, "an old message of a class again");
        assert!(
            v.violations.list()[0].starts_with("out of order"),
            "{:?}",
            v.violations.list()
        );
        v.check(0, &msg(&pattern, 4, B, 2));
        assert!(
            v.violations.list()[1].starts_with("duplicate"),
            "{:?}",
            v.violations.list()
        );
        // 5 I was lost: 6 I says its class's previous was 5.
        v.check(0, &msg(&pattern, 6, I, 5));
        let s = v.stream((0, 0, 1));
        assert_eq!((s.gaps, s.first_gap, s.delivered), (1, Some((3, 5)), 5));
    }

    #[test]
    fn a_probe_decodes_as_encoded_and_refuses_the_control_class() {
        let p = Probe {
            client: 1,
            server: 2,
            epoch: 3,
            n: 4,
            len: 5,
            class: Priority::Background.index() as u8,
            prev: 6,
        };
        let bytes = p.encode();
        assert_eq!(bytes.len(), PROBE_LEN);
        assert_eq!(Probe::decode(&bytes), Some(p));
        let mut control = bytes.to_vec();
        control[24] = 0;
        assert_eq!(Probe::decode(&control), None);
    }
}
