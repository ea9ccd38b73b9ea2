//! Shared test harness: messengers on loopback, a recording dispatcher that
//! checks order and integrity as messages arrive, and deadline-bound waits.
#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use msgr::{Connection, Dispatcher, EntityName, FaultReason, Message, Messenger, MessengerConfig};
use serde::{Deserialize, Serialize};

/// The front segment of every test message.
#[derive(Serialize, Deserialize, Debug, Clone, Copy)]
pub struct Probe {
    pub stream: u32,
    pub n: u64,
    pub len: u32,
    pub crc: u32,
}

/// Deterministic data for message `n` of `stream`.
pub fn pattern(stream: u32, n: u64, len: usize) -> Bytes {
    let mut x = (u64::from(stream) << 40) ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0xdead_beef;
    let mut v = Vec::with_capacity(len);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes()[..(len - v.len()).min(8)]);
    }
    Bytes::from(v)
}

pub fn probe_message(stream: u32, n: u64, len: usize) -> Message {
    probe_message_of(stream, n, pattern(stream, n, len))
}

/// Message `n` of `stream` carrying `data` (the same bytes may go in
/// several messages).
pub fn probe_message_of(stream: u32, n: u64, data: Bytes) -> Message {
    let probe = Probe {
        stream,
        n,
        len: data.len() as u32,
        crc: crc32c::crc32c(&data),
    };
    let mut m = Message::encode(7, &probe).expect("encode probe");
    m.data = data;
    m
}

/// What a recorder saw, per stream.
#[derive(Default, Debug)]
pub struct StreamLog {
    /// Highest n delivered so far (0 = none; tests number from 1).
    pub last: u64,
    pub delivered: u64,
    pub duplicates: u64,
    pub gaps: u64,
    pub corrupt: u64,
    pub bytes: u64,
    /// Messages that came knowing their data's checksum (checked on the
    /// way in: `Message::data_checksum`).
    pub checksum_known: u64,
}

#[derive(Default)]
pub struct Recorder {
    pub streams: Mutex<HashMap<u32, StreamLog>>,
    pub resets: Mutex<Vec<(u64, String)>>,
    pub remote_resets: AtomicU64,
    pub connects: AtomicU64,
    pub accepts: AtomicU64,
    /// Echo every message back on the connection it came from.
    pub echo: bool,
}

impl Recorder {
    pub fn new() -> Arc<Self> {
        Arc::new(Recorder::default())
    }

    pub fn echoing() -> Arc<Self> {
        Arc::new(Recorder {
            echo: true,
            ..Recorder::default()
        })
    }

    pub fn delivered(&self, stream: u32) -> u64 {
        self.streams
            .lock()
            .unwrap()
            .get(&stream)
            .map_or(0, |s| s.delivered)
    }

    pub fn last(&self, stream: u32) -> u64 {
        self.streams
            .lock()
            .unwrap()
            .get(&stream)
            .map_or(0, |s| s.last)
    }

    /// Panics with a description if any stream saw a duplicate, gap or corruption.
    pub fn assert_clean(&self) {
        for (id, s) in self.streams.lock().unwrap().iter() {
            assert!(
                s.duplicates == 0 && s.gaps == 0 && s.corrupt == 0,
                "stream {id}: {s:?}"
            );
        }
    }
}

impl Dispatcher for Recorder {
    fn on_message(&self, conn: &Connection, msg: Message) {
        let Ok(p) = msg.decode::<Probe>() else {
            self.streams
                .lock()
                .unwrap()
                .entry(u32::MAX)
                .or_default()
                .corrupt += 1;
            return;
        };
        {
            let mut streams = self.streams.lock().unwrap();
            let s = streams.entry(p.stream).or_default();
            let crc = crc32c::crc32c(&msg.data);
            if msg.data.len() != p.len as usize || crc != p.crc {
                s.corrupt += 1;
            }
            match msg.data_checksum() {
                Some(known) if known == crc => s.checksum_known += 1,
                Some(_) => s.corrupt += 1,
                None => {}
            }
            if p.n <= s.last {
                s.duplicates += 1;
            } else {
                if p.n != s.last + 1 {
                    s.gaps += 1;
                }
                s.last = p.n;
                s.delivered += 1;
                s.bytes += msg.data.len() as u64;
            }
        }
        if self.echo {
            let _ = conn.send_timeout(msg, Duration::from_secs(10));
        }
    }

    fn on_connect(&self, _conn: &Connection) {
        self.connects.fetch_add(1, Ordering::Relaxed);
    }

    fn on_accept(&self, _conn: &Connection) {
        self.accepts.fetch_add(1, Ordering::Relaxed);
    }

    fn on_reset(&self, conn: &Connection, reason: &FaultReason) {
        self.resets
            .lock()
            .unwrap()
            .push((conn.id(), reason.to_string()));
    }

    fn on_remote_reset(&self, _conn: &Connection) {
        self.remote_resets.fetch_add(1, Ordering::Relaxed);
    }
}

/// Waits until `cond` holds or the deadline passes; returns whether it held.
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    cond()
}

/// A config with short timers so fault tests finish quickly.
pub fn fast_config() -> MessengerConfig {
    let mut cfg = MessengerConfig::default();
    cfg.session.keepalive_interval = Duration::from_millis(100);
    cfg.session.keepalive_timeout = Duration::from_millis(1500);
    cfg.session.handshake_timeout = Duration::from_secs(3);
    cfg.session.backoff_min = Duration::from_millis(1);
    cfg.session.backoff_max = Duration::from_millis(50);
    cfg.session.wait_retry = Duration::from_millis(200);
    cfg.busy_poll = Duration::from_micros(50);
    cfg
}

pub fn server(cfg: MessengerConfig, d: Arc<dyn Dispatcher>) -> Messenger {
    Messenger::builder(EntityName::server(1))
        .config(cfg)
        .bind("tcp://127.0.0.1:0".parse().expect("addr"))
        .start(d)
        .expect("start server")
}

pub fn client(cfg: MessengerConfig, d: Arc<dyn Dispatcher>) -> Messenger {
    client_named(1, cfg, d)
}

/// A client messenger of entity `client.N`: several in one test are
/// several peers (a session is one per pair).
pub fn client_named(n: u64, cfg: MessengerConfig, d: Arc<dyn Dispatcher>) -> Messenger {
    Messenger::builder(EntityName::client(n))
        .config(cfg)
        .start(d)
        .expect("start client")
}

/// The address, nonce included, that the peer named `name` announced in
/// its session with `m`: a client that never bound has no
/// [`Messenger::addr`], but its sessions carry its identity.
pub fn announced_addr(m: &Messenger, name: &EntityName) -> Option<msgr::EntityAddr> {
    m.connections()
        .into_iter()
        .find_map(|c| c.peer().filter(|p| p.name == *name).map(|p| p.addr))
}

/// Sends with a deadline per message; panics if the queue stays full.
pub fn send(conn: &Connection, msg: Message) {
    conn.send_timeout(msg, Duration::from_secs(30))
        .expect("send within 30 s");
}

/// Queues `msg` on a connection before its handshake told the peer's
/// limits: `connect(try)` starts a fresh client, connects it and returns it
/// with the connection. The handshake can beat the send (the peer's limit
/// `max` then refuses it at once): another fresh client tries, up to 5.
pub fn queue_before_handshake<T>(
    mut connect: impl FnMut(u64) -> (T, Connection),
    msg: &Message,
    max: u32,
) -> (T, Connection) {
    for attempt in 0..5 {
        let (client, conn) = connect(attempt);
        match conn.send(msg.clone()) {
            Ok(()) => return (client, conn),
            Err(msgr::SendRejected {
                error: msgr::SendError::TooLarge(msgr::TooLarge { max: m, .. }),
                ..
            }) if m == max => {
                eprintln!("try {attempt}: the handshake beat the send; a fresh client tries");
            }
            Err(e) => panic!("queue before the handshake: {e}"),
        }
    }
    panic!("5 handshakes in a row beat the send queued before them");
}

/// Logs to stderr when RUST_LOG is set (for debugging a failing test).
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// Key pairs for some entities and the keyring that lists them.
pub struct Ids {
    pub keys: Vec<(EntityName, msgr::auth::StaticKeypair)>,
    pub ring: Arc<msgr::auth::Keyring>,
}

impl Ids {
    pub fn new(names: &[EntityName]) -> Ids {
        let keys: Vec<_> = names
            .iter()
            .map(|n| (n.clone(), msgr::auth::StaticKeypair::generate()))
            .collect();
        let mut ring = msgr::auth::Keyring::new();
        for (n, k) in &keys {
            ring.insert(n.clone(), k.public());
        }
        Ids {
            keys,
            ring: Arc::new(ring),
        }
    }

    pub fn creds(&self, name: &EntityName) -> msgr::auth::Credentials {
        let (_, k) = self.keys.iter().find(|(n, _)| n == name).expect("known");
        msgr::auth::Credentials::new(name.clone(), k.clone(), self.ring.clone())
    }
}

/// [`fast_config`] allowing these security modes (`secure`, `auth,secure`...).
pub fn secure_config(modes: &str) -> MessengerConfig {
    let mut cfg = fast_config();
    cfg.set("security", modes).unwrap();
    cfg
}
