//! The configuration keys: one table ([`CONFIG_KEYS`]) of every key's
//! name, documentation, values and setter, which `MessengerConfig::set`,
//! the environment check and docs/CONFIG.md all read; and the lookup of a
//! name in it.

use std::time::Duration;

use super::{parse_policy, ConfigError, HandlerPanicPolicy, MessengerConfig};
use crate::affinity::CpuListError;

/// Why a text value does not fit its key (shown in
/// `ConfigError::BadValue`'s `why`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum BadValue {
    #[error("{0}")]
    Number(#[from] std::num::ParseIntError),
    #[error("`{}`: {error}", msgr_addr::excerpt(text))]
    Addr {
        text: String,
        error: msgr_addr::AddrParseError,
    },
    #[error("{0}")]
    Modes(String),
    #[error("{0}")]
    Cpus(#[from] CpuListError),
    #[error("CPU {cpu} is not one this process may run on ({allowed:?})")]
    CpuNotAllowed { cpu: usize, allowed: Vec<usize> },
    #[error("0 (no batches) or {min} to {max}")]
    BatchSize { min: usize, max: usize },
    #[cfg(feature = "fault-injection")]
    #[error("{0}")]
    FaultPlan(#[from] crate::faults::FaultPlanError),
    #[cfg(not(feature = "fault-injection"))]
    #[error(
        "this build has no fault injection (cargo feature `fault-injection`); it takes only off"
    )]
    NoFaultInjection,
}

/// The row of `name` in [`CONFIG_KEYS`].
pub(super) fn config_key(name: &str) -> Option<&'static ConfigKey> {
    CONFIG_KEYS.iter().find(|k| k.name == name)
}

/// `: did you mean X?` for the key closest to `name` (case aside), shown
/// by `show`, when one is close enough to be a typo of it; else where the
/// keys are listed.
pub(super) fn did_you_mean(name: &str, show: impl Fn(&str) -> String) -> String {
    let name = name.to_ascii_lowercase();
    let closest = CONFIG_KEYS
        .iter()
        .map(|k| (edit_distance(&name, k.name), k.name))
        .min();
    match closest {
        // A typo: a few letters wrong, missing, extra or swapped.
        Some((d, k)) if d <= 2.max(k.len() / 4) => format!(": did you mean {}?", show(k)),
        _ => ": no such key (docs/CONFIG.md lists them)".into(),
    }
}

/// Levenshtein distance (insertions, deletions, substitutions) of two
/// short ASCII names.
fn edit_distance(a: &str, b: &str) -> usize {
    let b = b.as_bytes();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.bytes().enumerate() {
        let mut diag = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let next = (diag + usize::from(ca != cb))
                .min(row[j] + 1)
                .min(row[j + 1] + 1);
            diag = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

/// One configuration key: its name, what it does, the values it takes and
/// how it is applied. [`CONFIG_KEYS`] lists every one; [`MessengerConfig::set`],
/// the environment check ([`MessengerConfig::apply_env`]) and
/// docs/CONFIG.md all come from that table.
#[derive(Clone, Copy, Debug)]
pub struct ConfigKey {
    /// The key as a file writes it; `MSGR_<KEY>` upper-cased in the environment.
    pub name: &'static str,
    /// What it does, with its default.
    pub doc: &'static str,
    kind: Kind,
}

/// The values a key takes and where they go: checked here, once, for
/// every way of setting a key.
#[derive(Clone, Copy, Debug)]
enum Kind {
    /// A whole number in `min..=max`.
    Int {
        min: u64,
        max: u64,
        set: fn(&mut MessengerConfig, u64),
    },
    /// `true` or `false` (also `on`/`off`, `1`/`0`).
    Bool(fn(&mut MessengerConfig, bool)),
    /// One of `words`; `set` says whether it knew the word (it may know
    /// aliases the docs do not list).
    Choice {
        words: &'static [&'static str],
        set: fn(&mut MessengerConfig, &str) -> bool,
    },
    /// Text of the form `form` describes; a `list` is comma-separated, or
    /// a TOML array in a file.
    Text {
        form: &'static str,
        list: bool,
        set: fn(&mut MessengerConfig, &str) -> Result<(), BadValue>,
    },
}

impl ConfigKey {
    /// The values the key takes, as docs/CONFIG.md shows them: a range,
    /// `true | false`, the words allowed, or the form of the text.
    pub fn values(&self) -> String {
        match self.kind {
            Kind::Int { min, max, .. } => format!("{min}..={max}"),
            Kind::Bool(_) => "true | false".into(),
            Kind::Choice { words, .. } => words.join(" | "),
            Kind::Text { form, .. } => form.into(),
        }
    }

    /// Whether the key takes a list (comma-separated, or a TOML array).
    pub fn is_list(&self) -> bool {
        matches!(self.kind, Kind::Text { list: true, .. })
    }

    /// Checks `value` and applies it to `cfg`.
    pub(super) fn apply(&self, cfg: &mut MessengerConfig, value: &str) -> Result<(), ConfigError> {
        let bad = |why: String| ConfigError::BadValue {
            key: self.name.into(),
            value: value.into(),
            why,
        };
        let v = value.trim();
        match self.kind {
            Kind::Int { min, max, set } => {
                let n: u64 = v
                    .parse()
                    .map_err(|e: std::num::ParseIntError| bad(e.to_string()))?;
                if !(min..=max).contains(&n) {
                    return Err(bad(format!("must be {min}..={max}")));
                }
                set(cfg, n);
            }
            Kind::Bool(set) => set(
                cfg,
                match v {
                    "true" | "on" | "1" => true,
                    "false" | "off" | "0" => false,
                    _ => return Err(bad("expected true or false".into())),
                },
            ),
            Kind::Choice { words, set } => {
                if !set(cfg, v) {
                    let (last, rest) = words.split_last().unwrap_or((&"", &[]));
                    let rest = rest.join(", ");
                    return Err(bad(if rest.is_empty() {
                        format!("expected {last}")
                    } else {
                        format!("expected {rest} or {last}")
                    }));
                }
            }
            Kind::Text { set, .. } => set(cfg, v).map_err(|e| bad(e.to_string()))?,
        }
        Ok(())
    }
}

/// The longest timer a key takes: a day, in milliseconds. (0 fires at
/// once, a handshake that can never finish; u64::MAX overflows the clock.)
const MAX_TIMER_MS: u64 = 86_400_000;

/// A timer key in milliseconds, 1 ms to a day.
const fn ms(set: fn(&mut MessengerConfig, u64)) -> Kind {
    Kind::Int {
        min: 1,
        max: MAX_TIMER_MS,
        set,
    }
}

/// A number key in `min..=max`.
const fn int(min: u64, max: u64, set: fn(&mut MessengerConfig, u64)) -> Kind {
    Kind::Int { min, max, set }
}

const fn key(name: &'static str, doc: &'static str, kind: Kind) -> ConfigKey {
    ConfigKey { name, doc, kind }
}

/// Comma-separated addresses (empty or `none`: none); a bad one is named.
fn parse_addr_list(value: &str) -> Result<Vec<msgr_addr::EntityAddr>, BadValue> {
    if value == "none" {
        return Ok(Vec::new());
    }
    value
        .split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .map(|a| {
            a.parse().map_err(|error| BadValue::Addr {
                text: a.into(),
                error,
            })
        })
        .collect()
}

/// A file path (empty or `none`: none).
fn parse_path(value: &str) -> Option<std::path::PathBuf> {
    (!value.is_empty() && value != "none").then(|| std::path::PathBuf::from(value))
}

/// Every key, what it does (with its default), the values it takes and
/// where they go: the one table `set`, the environment check and
/// docs/CONFIG.md are made from.
pub static CONFIG_KEYS: &[ConfigKey] = &[
    key(
        "workers",
        "event-loop worker threads (default 1)",
        int(1, 256, |c, n| c.workers = n as usize),
    ),
    key(
        "payload_crc",
        "CRC32C on message payloads (default true); false on both sides skips it, \
         for transports that check integrity themselves (RDMA); headers stay checked",
        Kind::Bool(|c, b| c.session.payload_crc = b),
    ),
    key(
        "bind",
        "addresses to listen on when the application gives none, e.g. tcp://127.0.0.1:6800 or \
         verbs://198.51.100.1:6800?dev=rxe0: each one's transport picks its backend, the \
         first is the messenger's own (default none)",
        Kind::Text {
            form: "address list",
            list: true,
            set: |c, v| {
                c.bind = parse_addr_list(v)?;
                Ok(())
            },
        },
    ),
    key(
        "security",
        "modes this side allows on its links, the strongest both sides \
         allow is used: crc (names on trust, CRC32C frames; the default), auth (a Noise \
         handshake proves both names, frames in the clear), secure (auth, then every frame \
         sealed with AES-256-GCM); auth and secure need key_file and keyring",
        Kind::Text {
            form: "list of crc, auth, secure",
            list: true,
            set: |c, v| {
                c.session.security.modes = v.parse().map_err(BadValue::Modes)?;
                Ok(())
            },
        },
    ),
    key(
        "key_file",
        "this entity's private key file (msgr keygen writes it; its name must be the \
         messenger's) for the auth and secure modes (default none)",
        Kind::Text {
            form: "path",
            list: false,
            set: |c, v| {
                c.key_file = parse_path(v);
                Ok(())
            },
        },
    ),
    key(
        "keyring",
        "file of entity names and the public keys they must prove (`<name> <64 hex>` lines; \
         msgr keygen appends to it) for the auth and secure modes (default none)",
        Kind::Text {
            form: "path",
            list: false,
            set: |c, v| {
                c.keyring = parse_path(v);
                Ok(())
            },
        },
    ),
    key(
        "max_handshakes_per_source",
        "most pending handshakes per worker from one IP address (default 256); a new link from \
         a source at its share closes that source's own oldest pending link that has not sent \
         its banner to make room (handshakes_evicted), so a client behind a flood's address \
         still gets in; while none is idle (all spoke or were just accepted) the new link \
         waits, unread, for a slot (handshakes_waited; at most 16 × `max_handshakes` per \
         worker, `handshake_timeout_ms` each) or, that queue full, is refused \
         (handshakes_refused)",
        int(1, 1 << 20, |c, n| c.max_handshakes_per_source = n as usize),
    ),
    key(
        "banner_timeout_ms",
        "close a connection whose peer has not sent its banner (32 bytes) by then (default 2000)",
        ms(|c, n| c.session.banner_timeout = Duration::from_millis(n)),
    ),
    key(
        "connect_timeout_ms",
        "a connection this side opened that is not established within this long ends \
         (on_reset: not connected within ...); 0 (default): lossless ones keep trying, \
         each failed attempt reported to on_connect_failed",
        int(0, MAX_TIMER_MS, |c, n| {
            c.session.connect_timeout = (n != 0).then(|| Duration::from_millis(n))
        }),
    ),
    key(
        "peers",
        "addresses of the peers Messenger::connect_peers connects to with the \
         configured policy, e.g. tcp://10.0.0.2:6800,verbs://10.0.0.3:6800?dev=mlx5_0 (default none)",
        Kind::Text {
            form: "address list",
            list: true,
            set: |c, v| {
                c.peers = parse_addr_list(v)?;
                Ok(())
            },
        },
    ),
    key(
        "on_handler_panic",
        "what a panicking dispatcher callback does: fail-connection (default: that connection \
         ends, on_reset says why, the worker serves the others) or abort (the process)",
        Kind::Choice {
            words: &["fail-connection", "abort"],
            set: |c, v| {
                c.handler_panic = match v {
                    "fail-connection" => HandlerPanicPolicy::FailConnection,
                    "abort" => HandlerPanicPolicy::Abort,
                    _ => return false,
                };
                true
            },
        },
    ),
    key(
        "batch_max_bytes",
        "largest batch frame a session writes (default 16384; 0 = a frame per message): \
         messages of at most a quarter of it that are queued together travel \
         in one frame with one CRC32C (docs/PROTOCOL.md)",
        Kind::Text {
            form: "0 or 256..=65536",
            list: false,
            set: |c, v| {
                let n: usize = v.parse()?;
                // A batch must hold at least one small message, and fit the
                // header-segment limit (64 KiB) every peer enforces.
                const MIN: usize = 256;
                let max = c.session.limits.max_segment[0] as usize;
                if n != 0 && !(MIN..=max).contains(&n) {
                    return Err(BadValue::BatchSize { min: MIN, max });
                }
                c.session.batch_max_bytes = n;
                Ok(())
            },
        },
    ),
    key(
        "busy_poll_us",
        "busy-poll window after activity before blocking, in µs (default 200; 0 = never spin)",
        int(0, 1_000_000, |c, n| c.busy_poll = Duration::from_micros(n)),
    ),
    key(
        "call_spin_us",
        "how long a blocking call (`Connection::call`, `read`, `write`) spins on its reply \
         before it parks its thread, in µs (default 50; 0: park at once). It spins only while \
         the connection's worker is awake (busy-polling or working) and the CPUs the process \
         may use leave one spare beside the caller, the process's workers (asleep or not) and \
         its other spinning callers, for threads msgr cannot see (a peer process on the same \
         host): so never on 2 CPUs. A reply that comes within the spin costs no wake-up; \
         spinning without a spare CPU took one from the threads that bring the reply (64 B \
         call p50 ~120 µs against 32-60 µs parked on 2 CPUs)",
        int(0, 1_000_000, |c, n| c.call_spin = Duration::from_micros(n)),
    ),
    key(
        "rma_part_bytes",
        "an RMA read or write longer than this (or than one message carries: max_data_bytes \
         of the side that receives the bytes) moves in parts of at most this many bytes, \
         each a request of its own, pipelined (default 1048576)",
        int(1, u32::MAX as u64, |c, n| c.rma_part_bytes = n as usize),
    ),
    key(
        "rma_parts_in_flight",
        "parts of one RMA operation in flight at once (default 8)",
        int(1, 1024, |c, n| c.rma_parts_in_flight = n as usize),
    ),
    key(
        "busy_poll_max_us",
        "widest busy-poll window, in µs (default 2000): an idle gap up to this long that \
         ended in activity widens the next window to twice the gap",
        int(0, 10_000_000, |c, n| c.busy_poll_max = Duration::from_micros(n)),
    ),
    key(
        "busy_poll_syscall_every",
        "while busy-polling, make the loop's system calls (epoll_wait, unless a transport \
         needs it every pass; sched_yield when idle) on one pass in N (default 0: adaptive; \
         1: every pass)",
        int(0, 1_000_000, |c, n| c.busy_poll_syscall_every = n as u32),
    ),
    key(
        "worker_cpus",
        "CPUs to pin the workers to, as taskset -c writes them (0,2-3): worker i on the \
         i-th, round robin; busy-polling workers each want one of their own (default: \
         none, the scheduler places them)",
        Kind::Text {
            form: "CPU list (0,2-3) or none",
            list: true,
            set: |c, v| {
                c.worker_cpus = parse_worker_cpus(v)?;
                Ok(())
            },
        },
    ),
    key(
        "policy",
        "policy of connections this side opens (default lossless-client)",
        Kind::Choice {
            words: &["lossy-client", "lossless-client", "lossless-peer"],
            set: |c, v| parse_policy(v).map(|p| c.policy = p).is_some(),
        },
    ),
    key(
        "keepalive_interval_ms",
        "send a keepalive after this much send silence (default 2000)",
        ms(|c, n| c.session.keepalive_interval = Duration::from_millis(n)),
    ),
    key(
        "keepalive_timeout_ms",
        "declare the link dead after this much receive silence (default 15000)",
        ms(|c, n| c.session.keepalive_timeout = Duration::from_millis(n)),
    ),
    key(
        "handshake_timeout_ms",
        "a dial's transport connection must be up, and then banner + hello finish, each within this (default 10000)",
        ms(|c, n| c.session.handshake_timeout = Duration::from_millis(n)),
    ),
    key(
        "backoff_min_ms",
        "first reconnect delay, doubling per failure (default 5)",
        ms(|c, n| c.session.backoff_min = Duration::from_millis(n)),
    ),
    key(
        "backoff_max_ms",
        "reconnect delay ceiling (default 2000)",
        ms(|c, n| c.session.backoff_max = Duration::from_millis(n)),
    ),
    key(
        "server_linger_ms",
        "a lossless server session whose client went without a close waits this long for it to dial back before it ends (default 900000)",
        ms(|c, n| c.session.server_linger = Duration::from_millis(n)),
    ),
    key(
        "max_queued_messages",
        "send queue bound per connection, in messages (default 65536; interactive messages \
         have as much again of their own)",
        int(1, 1 << 24, |c, n| c.session.max_queued_messages = n as usize),
    ),
    key(
        "max_queued_bytes",
        "send queue bound per connection, in payload bytes (default 256 MiB; interactive \
         messages have as much again of their own)",
        int(1, 1 << 40, |c, n| c.session.max_queued_bytes = n as usize),
    ),
    key(
        "ack_delay_us",
        "how long the acknowledgement of what arrived waits for an outgoing message to carry it \
         before it goes in a frame of its own, in µs (default 1000; 0 = at once; it goes at once \
         anyway when a quarter of the in-flight window arrived unacknowledged)",
        int(0, 1_000_000, |c, n| c.session.ack_delay = Duration::from_micros(n)),
    ),
    key(
        "max_fragment_bytes",
        "priority lanes: a message larger than this that is not batched travels as fragments \
         of at most this many bytes where both sides offer lanes, so that a message of a more \
         urgent class waits for at most one (default 1048576; 0 = no lanes: one class, no \
         fragments, as a peer without them; docs/PROTOCOL.md)",
        int(0, 1 << 30, |c, n| c.session.max_fragment = n as usize),
    ),
    key(
        "tcp_socket_buffer_bytes",
        "SO_SNDBUF and SO_RCVBUF of every TCP link (the kernel doubles it); bytes in socket buffers are \
         past every priority lane, so a bound shortens an urgent message's wait behind bulk; 0: the \
         kernel's autotuning (default 0)",
        int(0, 1 << 30, |c, n| c.tcp_socket_buffer = n as usize),
    ),
    key(
        "max_front_bytes",
        "largest front segment accepted (default 16 MiB)",
        int(1, 1 << 30, |c, n| c.session.limits.max_segment[1] = n as u32),
    ),
    key(
        "max_data_bytes",
        "largest data segment accepted (default 128 MiB)",
        int(1, u32::MAX as u64, |c, n| {
            c.session.limits.max_segment[2] = n as u32
        }),
    ),
    key(
        "rx_throttle_messages",
        "received messages the application may hold before reading pauses (default 65536)",
        int(1, crate::throttle::MAX_MESSAGES as u64, |c, n| {
            c.rx_throttle_messages = n as usize
        }),
    ),
    key(
        "rx_throttle_bytes",
        "received payload bytes the application may hold before reading pauses (default 512 MiB)",
        int(1, crate::throttle::MAX_BYTES as u64, |c, n| {
            c.rx_throttle_bytes = n as usize
        }),
    ),
    key(
        "max_handshakes",
        "accepted connections that may be mid-handshake at once per worker (default 1024); a new \
         one beyond it closes the oldest that has not sent its banner, of any source \
         (handshakes_evicted), or waits for a slot while none is idle (handshakes_waited), \
         refused only when that queue is full (handshakes_refused)",
        int(1, 1 << 20, |c, n| c.max_handshakes = n as usize),
    ),
    // The pools' own start-up check (RLIMIT_MEMLOCK, device caps) says
    // more; these bounds keep the numbers themselves sane.
    key(
        "rdma_chunk_size",
        "RDMA send/receive chunk bytes: the largest eager send; both ends must agree (default 32768)",
        int(4096, 1 << 24, |c, n| c.rdma.chunk_size = n as usize),
    ),
    key(
        "rdma_rx_chunks",
        "RDMA receive chunks per worker in one shared receive queue; each link takes 3..=33 (default 1024)",
        int(1, 1 << 20, |c, n| c.rdma.rx_chunks = n as u32),
    ),
    key(
        "rdma_tx_chunks",
        "RDMA send chunks per worker (default 512)",
        int(1, 1 << 20, |c, n| c.rdma.tx_chunks = n as u32),
    ),
    key(
        "rdma_rendezvous_bytes",
        "RDMA frames above this are RDMA-read by the receiver instead of copied (default 131072)",
        int(0, 1 << 30, |c, n| c.rdma.rendezvous_threshold = n as usize),
    ),
    key(
        "rdma_inline_bytes",
        "RDMA sends up to this many bytes go inline in the work request, not fetched by DMA; 0: never (default 256)",
        int(0, 4096, |c, n| c.rdma.inline_bytes = n as u32),
    ),
    key(
        "rdma_ack_timeout",
        "RDMA RC queue pairs: how long a sent packet may go unacknowledged before it is resent, as \
         the verbs code n for 4.096 µs × 2^n (1–31; 14 ≈ 67 ms, 18 ≈ 1.07 s); with \
         `rdma_retry_count` it sets how long loss on the wire is borne before the QP fails and the \
         session reconnects and replays (about (retries + 1) × the timeout); 0: the default, 14 \
         over verbs and rdma_cm's choice from the path over rdmacm (IB's own 0, never time out, \
         is not offered: a dead peer would go unnoticed) (default 0)",
        int(0, 31, |c, n| c.rdma.ack_timeout = (n > 0).then_some(n as u8)),
    ),
    key(
        "rdma_retry_count",
        "RDMA RC queue pairs: how often an unacknowledged packet is resent before the QP fails \
         (0–7; see `rdma_ack_timeout`) (default 7)",
        int(0, 7, |c, n| c.rdma.retry_count = n as u8),
    ),
    key(
        "rdma_read_timeout_ms",
        "an RDMA or libfabric rendezvous read not complete after this fails its link (default 10000, below keepalive_timeout_ms)",
        // Not 0: every read would fail its link at once.
        ms(|c, n| c.rdma.read_timeout = Duration::from_millis(n)),
    ),
    key(
        "rdma_reg_cache_bytes",
        "RDMA and libfabric (reads, provider checks keys: tcp, verbs) rendezvous segments kept registered for their next send (a clone of the same Bytes); kept memory stays alive until evicted; 0: none (default 33554432)",
        int(0, 1 << 40, |c, n| c.rdma.reg_cache_bytes = n as usize),
    ),
    key(
        "fabric_rendezvous",
        "libfabric large units by rendezvous: auto (fi_read where this libfabric has no known bug in the provider's reads, else fi_write into a buffer the receiver grants where the provider checks keys), off, on (reads despite a known bug), write (default auto)",
        Kind::Choice {
            words: &["auto", "off", "on", "write"],
            set: |c, v| {
                use msgr_backends::FabricRendezvous as R;
                c.rdma.fabric_rendezvous = match v {
                    "auto" => R::Auto,
                    "off" => R::Off,
                    "on" => R::On,
                    "write" => R::Write,
                    _ => return false,
                };
                true
            },
        },
    ),
    key(
        "fabric_cq_wait",
        "how an idle libfabric worker waits for completions: fd (a wait fd in epoll; a 64 B tcp one-way ~0.8 us slower) or poll (no wait object, as fi_pingpong: faster per message, but polled every 1 ms while idle) (default fd)",
        Kind::Choice {
            words: &["fd", "poll"],
            set: |c, v| {
                use msgr_backends::FabricCqWait as W;
                c.rdma.fabric_cq_wait = match v {
                    "fd" => W::Fd,
                    "poll" => W::Poll,
                    _ => return false,
                };
                true
            },
        },
    ),
    key(
        "fabric_link_bytes",
        "send and receive buffers a libfabric worker's links may hold; a link beyond it is refused (links_refused): a MSG link holds 4 MiB, an RDM link 1.25 MiB over tcp, 272 KiB over shm (default 1073741824)",
        int(1 << 20, 1 << 44, |c, n| c.rdma.fabric_link_bytes = n as usize),
    ),
    key(
        "faults",
        "fault injection plan, a test hook of builds with the cargo feature fault-injection (others take only off), e.g. seed=7,fail=500,corrupt=2000,delay=100,delay_max_ms=5,handshake=20 (default off)",
        Kind::Text {
            form: "fault plan or off",
            list: false,
            set: set_faults,
        },
    ),
];

/// `faults`: a fault plan, or off. A build without the cargo feature
/// `fault-injection` has no fault path: it takes off and refuses a plan.
fn set_faults(cfg: &mut MessengerConfig, value: &str) -> Result<(), BadValue> {
    #[cfg(feature = "fault-injection")]
    {
        cfg.faults = match value {
            "" | "off" => None,
            plan => Some(plan.parse()?),
        };
        Ok(())
    }
    #[cfg(not(feature = "fault-injection"))]
    {
        let _ = cfg;
        match value {
            "" | "off" => Ok(()),
            _ => Err(BadValue::NoFaultInjection),
        }
    }
}

/// `worker_cpus`: a CPU list (empty or `none`: no pinning), each CPU one
/// this process may run on.
fn parse_worker_cpus(value: &str) -> Result<Vec<usize>, BadValue> {
    if value.is_empty() || value == "none" {
        return Ok(Vec::new());
    }
    let cpus = crate::affinity::parse_cpu_list(value)?;
    let allowed = crate::affinity::allowed_cpus();
    if let Some(c) = cpus.iter().find(|c| !allowed.contains(c)) {
        return Err(BadValue::CpuNotAllowed { cpu: *c, allowed });
    }
    Ok(cpus)
}
