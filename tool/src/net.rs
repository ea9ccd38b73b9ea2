//! The messenger side of the tool: the responder (`serve`), the ping-pong and
//! streaming clients, and the little protocol between them.
//!
//! Message types (payload in the data segment):
//! - `PING` → the responder echoes it as `PONG` (same front and data).
//! - `PING_OWN` → the responder answers `PONG` with as many data bytes from
//!   a buffer of its own ([`Reply::Own`]).
//! - `STREAM` → counted; if its front is non-empty the responder answers
//!   `CREDIT` (the callback-driven sender's flow control).
//! - `STREAM_END` → answered with `STREAM_DONE` carrying the responder's
//!   totals; it arrives after every earlier message of the connection, so
//!   it marks the end of a bandwidth run.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use msgr::{
    Connection, ConnectionState, Dispatcher, EntityAddr, EntityName, FaultReason, Message,
    MessageRefs, Messenger, MessengerConfig, SendError, SendRejected,
};
use serde::{Deserialize, Serialize};

use crate::error::ToolError;
use crate::progress::Progress;
use crate::stats::{PingResult, StreamResult};

/// Ping request.
pub const PING: u16 = 0x6d01;
/// Ping reply.
pub const PONG: u16 = 0x6d02;
/// Ping request answered from the responder's own buffer ([`Reply::Own`]).
pub const PING_OWN: u16 = 0x6d07;
/// Ping flag: the client sends a payload whose checksum it computed once
/// ([`Message::with_data_checksum`], `msgr ping --seal true`), and the
/// responder answers in kind: from its own buffer sealed once, or echoing
/// the message it got, whose checksum was checked on the way in. Without
/// it both ends checksum every payload they send.
pub const PING_SEALED: u8 = 1;
/// A streamed message.
pub const STREAM: u16 = 0x6d03;
/// End of a stream.
pub const STREAM_END: u16 = 0x6d04;
/// Reply to the end of a stream.
pub const STREAM_DONE: u16 = 0x6d05;
/// Flow-control credit for the callback-driven sender.
pub const CREDIT: u16 = 0x6d06;

/// What the responder counted (sent back in `STREAM_DONE`).
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct Totals {
    /// Pings echoed.
    pub pings: u64,
    /// Stream messages received.
    pub stream_messages: u64,
    /// Stream payload bytes received.
    pub stream_bytes: u64,
    /// Stream messages received on the connection the end marker came
    /// on, since its last end marker: what the sender's stream delivered.
    pub this_stream: u64,
}

/// Stream messages a connection delivered since its last end marker:
/// the responder's state on each connection ([`Connection::user_state`]),
/// reached from the connection a callback gets, with no map to look up.
#[derive(Default)]
struct Streamed(AtomicU64);

/// `conn`'s count of stream messages.
fn streamed(conn: &Connection) -> Option<&AtomicU64> {
    conn.user_state(Streamed::default).map(|s| &s.0)
}

/// The server side: answers pings, counts streams.
#[derive(Default)]
pub struct Responder {
    pings: AtomicU64,
    /// The answer to `PING_OWN`: its data made for the last size asked,
    /// then sent again and again, never written after, and sealed
    /// ([`PING_SEALED`]).
    own: Mutex<Message>,
    stream_messages: AtomicU64,
    stream_bytes: AtomicU64,
    /// Connections accepted.
    pub accepted: AtomicU64,
    /// Connections reset.
    pub resets: AtomicU64,
}

impl Responder {
    /// Current totals.
    pub fn totals(&self) -> Totals {
        Totals {
            pings: self.pings.load(Ordering::Relaxed),
            stream_messages: self.stream_messages.load(Ordering::Relaxed),
            stream_bytes: self.stream_bytes.load(Ordering::Relaxed),
            this_stream: 0,
        }
    }
}

/// Sends a pong: as the reply to the ping's call (`call`: its id, 0 if
/// it was sent plainly), so a blocking `Connection::call` gets it, in the
/// ping's class (`priority`: its byte), as a reply takes its request's.
fn answer(conn: &Connection, call: u64, priority: u8, mut pong: Message) {
    let _ = if call == 0 {
        if pong.priority == 0 {
            pong.priority = priority;
        }
        conn.send(pong)
    } else {
        let mut request = Message::new(PING, Bytes::new(), Bytes::new());
        request.call = call;
        request.priority = priority;
        conn.reply(&request, pong)
    };
}

impl Responder {
    /// Counts `messages` stream messages of `bytes` payload bytes that
    /// `conn` delivered.
    fn count_stream(&self, conn: &Connection, messages: u64, bytes: u64) {
        if messages == 0 {
            return;
        }
        if let Some(n) = streamed(conn) {
            n.fetch_add(messages, Ordering::Relaxed);
        }
        self.stream_messages.fetch_add(messages, Ordering::Relaxed);
        self.stream_bytes.fetch_add(bytes, Ordering::Relaxed);
    }
}

impl Dispatcher for Responder {
    /// Stream messages that ask for no credit are counted in place, once
    /// per batch; anything else goes to `on_message` in its turn (the
    /// count so far told first: an end marker reads it).
    fn on_batch(&self, conn: &Connection, messages: &mut MessageRefs<'_>) {
        let (mut n, mut bytes) = (0, 0);
        for m in messages {
            if m.msg_type == STREAM && m.front.is_empty() {
                n += 1;
                bytes += m.data.len() as u64;
                continue;
            }
            self.count_stream(conn, std::mem::take(&mut n), std::mem::take(&mut bytes));
            self.on_message(conn, m.to_message());
        }
        self.count_stream(conn, n, bytes);
    }

    fn on_message(&self, conn: &Connection, msg: Message) {
        match msg.msg_type {
            PING => {
                self.pings.fetch_add(1, Ordering::Relaxed);
                let (call, priority) = (msg.call, msg.priority);
                let reply = if msg.flags & PING_SEALED != 0 {
                    // The message as received, checksum and all.
                    let mut reply = msg;
                    reply.msg_type = PONG;
                    reply
                } else {
                    Message::new(PONG, msg.front, msg.data)
                };
                answer(conn, call, priority, reply);
            }
            PING_OWN => {
                self.pings.fetch_add(1, Ordering::Relaxed);
                let (call, priority) = (msg.call, msg.priority);
                let own = {
                    let mut own = self.own.lock().unwrap_or_else(|p| p.into_inner());
                    if own.data.len() != msg.data.len() {
                        let data = vec![0xa5; msg.data.len()];
                        *own = Message::new(PONG, Bytes::new(), data).with_data_checksum();
                    }
                    own.clone()
                };
                let reply = if msg.flags & PING_SEALED != 0 {
                    let mut reply = own;
                    reply.front = msg.front;
                    reply
                } else {
                    Message::new(PONG, msg.front, own.data)
                };
                answer(conn, call, priority, reply);
            }
            STREAM => {
                self.count_stream(conn, 1, msg.data.len() as u64);
                if !msg.front.is_empty() {
                    let _ = conn.send(Message::new(CREDIT, msg.front, Bytes::new()));
                }
            }
            STREAM_END => {
                let totals = Totals {
                    this_stream: streamed(conn).map_or(0, |n| n.swap(0, Ordering::Relaxed)),
                    ..self.totals()
                };
                if let Ok(m) = Message::encode(STREAM_DONE, &totals) {
                    let _ = conn.send(m);
                }
            }
            _ => {}
        }
    }

    fn on_accept(&self, _conn: &Connection) {
        self.accepted.fetch_add(1, Ordering::Relaxed);
    }

    fn on_reset(&self, _conn: &Connection, _reason: &FaultReason) {
        self.resets.fetch_add(1, Ordering::Relaxed);
    }
}

/// The entity name this process's clients use: `--name`, else
/// `client.PID`.
pub fn client_name() -> EntityName {
    ENTITY_NAME
        .get()
        .cloned()
        .unwrap_or_else(|| EntityName::client(u64::from(std::process::id())))
}

/// The server's name: `--name`, else `server.PID`.
pub fn server_name() -> EntityName {
    ENTITY_NAME
        .get()
        .cloned()
        .unwrap_or_else(|| EntityName::server(u64::from(std::process::id())))
}

/// `--name`, set once by `main`.
pub static ENTITY_NAME: std::sync::OnceLock<EntityName> = std::sync::OnceLock::new();

/// Where a client connects: one address or an address vector (the next
/// address after each fault: `connect_any`), and, if named, the only
/// entity that may answer there (`connect_to`).
#[derive(Clone, Debug)]
pub struct Target {
    /// The server's addresses, in preference order.
    pub addrs: msgr::AddrVec,
    /// The server's entity name, if pinned (`--peer`).
    pub peer: Option<EntityName>,
}

impl Target {
    /// The first address's transport (whose counters a run reports).
    fn transport(&self) -> &msgr::TransportKind {
        &self.addrs.0[0].transport
    }
}

impl From<&EntityAddr> for Target {
    fn from(a: &EntityAddr) -> Target {
        Target {
            addrs: msgr::AddrVec(vec![a.clone()]),
            peer: None,
        }
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.addrs.0.as_slice() {
            [one] => write!(f, "{one}")?,
            _ => write!(f, "{}", self.addrs)?,
        }
        match &self.peer {
            Some(p) => write!(f, " ({p})"),
            None => Ok(()),
        }
    }
}

/// Starts a client messenger, connects to `target` and waits until the
/// session is open (at most `timeout`). `reset` is where the dispatcher
/// `d` keeps why the connection went: the reason a failed connect reports.
pub fn connect(
    cfg: &MessengerConfig,
    target: &Target,
    d: Arc<dyn Dispatcher>,
    timeout: Duration,
    reset: &Mutex<Option<String>>,
) -> Result<(Messenger, Connection), ToolError> {
    connect_as(client_name(), cfg, target, d, (timeout, reset))
}

/// [`connect`] as the entity `name`.
fn connect_as(
    name: EntityName,
    cfg: &MessengerConfig,
    target: &Target,
    d: Arc<dyn Dispatcher>,
    (timeout, reset): (Duration, &Mutex<Option<String>>),
) -> Result<(Messenger, Connection), ToolError> {
    if target.addrs.0.is_empty() {
        return Err(ToolError::Usage("no address to connect to".into()));
    }
    for a in &target.addrs.0 {
        if a.socket.port() == 0 || a.is_unspecified() {
            return Err(ToolError::Usage(format!(
                "cannot connect to {a}: give the server's address and port"
            )));
        }
    }
    let m = Messenger::builder(name).config(cfg.clone()).start(d)?;
    let conn = match (&target.peer, target.addrs.0.as_slice()) {
        (None, [one]) => m.connect(one)?,
        (None, _) => m.connect_any(&target.addrs, cfg.policy)?,
        (Some(name), _) => m.connect_any_to(name, &target.addrs, cfg.policy)?,
    };
    let deadline = Instant::now() + timeout;
    // Said at once, and each failed attempt as it happens: a dead address
    // is not a minute of silence.
    eprintln!("connecting to {target}…");
    let mut attempts_told = 0;
    loop {
        match conn.state() {
            ConnectionState::Open => {
                if let Some(peer) = conn.peer() {
                    // Which of the addresses answered, and who.
                    eprintln!("connected to {} at {}", peer.name, peer.addr.with_nonce(0));
                }
                return Ok((m, conn));
            }
            ConnectionState::Closed => {
                if let Some(FaultReason::Refused(reason)) = conn.status().last_fault {
                    return Err(ToolError::Refused {
                        peer: target.to_string(),
                        us: m.name().to_string(),
                        reason,
                    });
                }
                // Ended before it opened: a failure no retry would mend
                // (the session gave up at once), not a reset.
                return Err(ToolError::NotConnected {
                    peer: target.to_string(),
                    reason: reset
                        .lock()
                        .ok()
                        .and_then(|r| r.clone())
                        .unwrap_or_else(|| "closed while connecting".into()),
                });
            }
            ConnectionState::Connecting if Instant::now() >= deadline => {
                let why = match conn.status().last_fault {
                    Some(f) => format!("; last attempt: {f}"),
                    None => " (is `msgr serve` running there?)".into(),
                };
                return Err(ToolError::Timeout {
                    what: format!("connecting to {target}{why}"),
                    after: timeout,
                });
            }
            ConnectionState::Connecting => {
                let status = conn.status();
                if status.attempts > attempts_told {
                    attempts_told = status.attempts;
                    eprintln!("{}", attempt_failed(&status, deadline));
                }
                std::thread::sleep(Duration::from_micros(500));
            }
        }
    }
}

/// The line a failed connection attempt prints: why, and when the next
/// one comes (or that none will before `deadline`).
fn attempt_failed(status: &msgr::ConnectionStatus, deadline: Instant) -> String {
    let why = status
        .last_fault
        .as_ref()
        .map_or_else(|| "no answer".to_owned(), |f| f.to_string());
    let next = match status.retry_in {
        Some(d) if Instant::now() + d < deadline => {
            format!("retrying in {d:.1?}")
        }
        Some(_) => "no time left for another".to_owned(),
        None => "retrying".to_owned(),
    };
    format!("  attempt {} failed: {why}; {next}", status.attempts)
}

/// Sends from a non-callback thread, backing off while the queue is full.
pub fn send_blocking(conn: &Connection, msg: Message, deadline: Instant) -> Result<(), ToolError> {
    let mut tries = 0u32;
    let mut msg = msg;
    loop {
        let back = match conn.send(msg) {
            Ok(()) => return Ok(()),
            Err(SendRejected {
                error: SendError::QueueFull { .. },
                message,
            }) => message,
            Err(e) => return Err(e.into()),
        };
        if Instant::now() >= deadline {
            return Err(ToolError::Timeout {
                what: "waiting for room in the send queue".into(),
                after: Duration::ZERO,
            });
        }
        tries += 1;
        if tries < 8 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(50));
        }
        msg = back;
    }
}

/// What the responder answers a ping with.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Reply {
    /// As many bytes from a buffer of its own, sent again for every ping —
    /// what `fi_pingpong` and `ib_send_lat` answer with, so the default
    /// when comparing with them.
    #[default]
    Own,
    /// The bytes it received. A large echo costs more than the references
    /// pay: the receive has just written those bytes on the responder's
    /// core, and the pinger's copy of them pulls each modified cache line
    /// from there (a 1 MiB ping-pong over shm, measured: ~1.5× the time).
    Echo,
}

/// Options of a ping-pong run.
#[derive(Clone, Debug)]
pub struct PingOpts {
    /// Payload bytes.
    pub size: usize,
    /// What the responder answers with.
    pub reply: Reply,
    /// Timed round trips.
    pub count: u64,
    /// Untimed round trips first.
    pub warmup: u64,
    /// Bound on the whole run.
    pub timeout: Duration,
    /// Bound on connecting.
    pub connect_timeout: Duration,
    /// Checksum the payload once and reuse it ([`PING_SEALED`]), as an
    /// application sending the same bytes again would; `false`: both ends
    /// checksum every payload they send, as for fresh data.
    pub seal: bool,
    /// Where to write every timed round trip's time, in the order they
    /// ran (ns, one a line): whether slow ones come alone or in stretches.
    pub samples_to: Option<std::path::PathBuf>,
}

/// The ping every round trip sends.
fn ping_message(opts: &PingOpts) -> Message {
    let kind = match opts.reply {
        Reply::Own => PING_OWN,
        Reply::Echo => PING,
    };
    let ping = Message::new(kind, Bytes::new(), vec![0x5a; opts.size]);
    if !opts.seal {
        return ping;
    }
    let mut ping = ping.with_data_checksum();
    ping.flags = PING_SEALED;
    ping
}

struct PingState {
    sent_at: Instant,
    first_timed: Option<Instant>,
    replies: u64,
    samples: Vec<u64>,
}

struct PingClient {
    total: u64,
    warmup: u64,
    /// What every ping sends (`PING` or `PING_OWN`, sealed or not).
    ping: Message,
    state: Mutex<PingState>,
    progress: AtomicU64,
    done: Mutex<Option<mpsc::Sender<Instant>>>,
    reset: Mutex<Option<String>>,
    /// A reply that was not what the ping asked for (the run stops).
    bad_reply: Mutex<Option<String>>,
}

impl PingClient {
    fn ping(&self) -> Message {
        self.ping.clone()
    }
}

impl Dispatcher for PingClient {
    fn on_message(&self, conn: &Connection, msg: Message) {
        if msg.msg_type != PONG {
            return;
        }
        if msg.data.len() != self.ping.data.len() {
            let why = format!(
                "a reply of {} bytes to a ping of {}",
                msg.data.len(),
                self.ping.data.len()
            );
            *self.bad_reply.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
            return;
        }
        let now = Instant::now();
        let Ok(mut st) = self.state.lock() else {
            return;
        };
        let rtt = now.duration_since(st.sent_at);
        st.replies += 1;
        if st.replies > self.warmup {
            st.samples.push(rtt.as_nanos() as u64);
        } else if st.replies == self.warmup {
            st.first_timed = Some(now);
        }
        self.progress.store(st.replies, Ordering::Relaxed);
        if st.replies < self.total {
            st.sent_at = Instant::now();
            if let Err(e) = conn.send(self.ping()) {
                *self.reset.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
            }
        } else if let Some(tx) = self.done.lock().ok().and_then(|mut d| d.take()) {
            let _ = tx.send(now);
        }
    }

    fn on_reset(&self, _conn: &Connection, reason: &FaultReason) {
        *self.reset.lock().unwrap_or_else(|p| p.into_inner()) = Some(reason.to_string());
    }

    /// The server lost the session (it restarted): the ping in flight is
    /// gone, and no reply will come. The run ends with the reason.
    fn on_remote_reset(&self, _conn: &Connection) {
        *self.reset.lock().unwrap_or_else(|p| p.into_inner()) = Some(REMOTE_RESET.into());
    }
}

/// What a client reports when the server lost its session mid-run.
const REMOTE_RESET: &str =
    "the server lost the session (restarted?): messages in flight were dropped";

/// Runs a ping-pong against a responder at `target`. The round trips are
/// driven from the dispatcher callback (a reply sends the next ping, with no
/// thread hand-off); this thread only waits.
pub fn ping(
    cfg: &MessengerConfig,
    target: &Target,
    opts: &PingOpts,
    progress: &mut Progress,
) -> Result<PingResult, ToolError> {
    if opts.count == 0 {
        return Err(ToolError::Usage("--count must be at least 1".into()));
    }
    let (tx, rx) = mpsc::channel();
    let total = opts.count + opts.warmup;
    let d = Arc::new(PingClient {
        total,
        warmup: opts.warmup,
        ping: ping_message(opts),
        state: Mutex::new(PingState {
            sent_at: Instant::now(),
            first_timed: None,
            replies: 0,
            samples: Vec::with_capacity(opts.count as usize),
        }),
        progress: AtomicU64::new(0),
        done: Mutex::new(Some(tx)),
        reset: Mutex::new(None),
        bad_reply: Mutex::new(None),
    });
    let (mut m, conn) = connect(cfg, target, d.clone(), opts.connect_timeout, &d.reset)?;
    let start = Instant::now();
    {
        let mut st = d.state.lock().unwrap_or_else(|p| p.into_inner());
        if opts.warmup == 0 {
            st.first_timed = Some(start);
        }
        st.sent_at = Instant::now();
        conn.send(d.ping())?;
    }
    progress.set_length(total);
    let deadline = start + opts.timeout;
    let result = loop {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(end) => break Ok(end),
            Err(_) => {
                progress.set(d.progress.load(Ordering::Relaxed));
                if let Some(r) = d.reset.lock().unwrap_or_else(|p| p.into_inner()).clone() {
                    break Err(ToolError::Reset {
                        peer: target.to_string(),
                        reason: r,
                    });
                }
                let bad = d.bad_reply.lock().unwrap_or_else(|p| p.into_inner()).take();
                if let Some(what) = bad {
                    break Err(ToolError::BadReply {
                        peer: target.to_string(),
                        what,
                    });
                }
                if Instant::now() >= deadline {
                    break Err(ToolError::Timeout {
                        what: format!(
                            "ping-pong with {target} ({} of {total} round trips done)",
                            d.progress.load(Ordering::Relaxed)
                        ),
                        after: opts.timeout,
                    });
                }
            }
        }
    };
    m.shutdown(Duration::from_secs(1));
    let end = result?;
    progress.set(total);
    let st = std::mem::replace(
        &mut *d.state.lock().unwrap_or_else(|p| p.into_inner()),
        PingState {
            sent_at: end,
            first_timed: None,
            replies: 0,
            samples: Vec::new(),
        },
    );
    let elapsed = end.duration_since(st.first_timed.unwrap_or(start));
    if let Some(path) = &opts.samples_to {
        let text: String = st.samples.iter().map(|ns| format!("{ns}\n")).collect();
        std::fs::write(path, text).map_err(|source| ToolError::Io {
            what: format!("writing the round trips to {}", path.display()),
            source,
        })?;
    }
    Ok(PingResult::new(
        opts.size,
        opts.warmup,
        st.samples,
        elapsed.as_secs_f64(),
    ))
}

/// How long a stream runs.
#[derive(Clone, Copy, Debug)]
pub enum Limit {
    /// This many messages.
    Count(u64),
    /// About this long.
    Time(Duration),
}

/// Who sends the stream's messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Driver {
    /// The main thread sends through `Connection::send`, backing off while
    /// the queue is full (every message crosses to the worker's thread).
    Main,
    /// The dispatcher sends batches from its callbacks on the worker's
    /// thread, paced by credits from the responder.
    Callback,
}

/// Options of a streaming run.
#[derive(Clone, Debug)]
pub struct StreamOpts {
    /// Payload bytes per message.
    pub size: usize,
    /// How long.
    pub limit: Limit,
    /// Sender.
    pub driver: Driver,
    /// Bound on the whole run.
    pub timeout: Duration,
    /// Bound on connecting.
    pub connect_timeout: Duration,
    /// Checksum the payload once and reuse the checksum on every send
    /// ([`Message::with_data_checksum`]): the stream sends one buffer
    /// again and again, as an application re-sending the same bytes would;
    /// `false`: every send checksums it, as for fresh data. The receiver
    /// checks every byte either way.
    pub seal: bool,
}

struct StreamState {
    sent: u64,
    finished: bool,
}

/// The largest message `stream` sends from borrowed bytes: one that goes
/// in a batch under the default bound (a larger one would be copied
/// before it goes whole; a `Message` only moves a reference count).
const BORROWED_SEND_MAX: usize = 4096;

struct StreamClient {
    /// What every message sends (its front says whether it asks for a
    /// credit), sealed or not.
    template: Message,
    /// Small messages are sent from the template's bytes
    /// (`Connection::send_parts`): no `Message` cloned and dropped per
    /// send, so the sender's count is the library's. (They go as batch
    /// entries, under the batch's one checksum: a sealed checksum of their
    /// own would not be used.)
    borrow: bool,
    /// Messages per credit (callback driver).
    batch: u64,
    max: Option<u64>,
    stop: AtomicBool,
    state: Mutex<StreamState>,
    sent: AtomicU64,
    done: Mutex<Option<mpsc::Sender<(Instant, Totals)>>>,
    reset: Mutex<Option<String>>,
}

/// Messages per credit of the callback driver: two batches of ~4 MiB (at
/// most 4096 messages) in flight.
fn credit_batch(size: usize) -> u64 {
    ((4usize << 20) / size.max(1)).clamp(1, 4096) as u64
}

impl StreamClient {
    /// A sender of `opts`' messages, `batch` per credit, `max` in all if
    /// given; `done` gets the responder's answer to the end marker.
    fn new(
        opts: &StreamOpts,
        batch: u64,
        max: Option<u64>,
        done: mpsc::Sender<(Instant, Totals)>,
    ) -> StreamClient {
        let template = Message::new(STREAM, Bytes::new(), vec![0xa5; opts.size]);
        StreamClient {
            template: if opts.seal {
                template.with_data_checksum()
            } else {
                template
            },
            borrow: opts.size <= BORROWED_SEND_MAX,
            batch,
            max,
            stop: AtomicBool::new(false),
            state: Mutex::new(StreamState {
                sent: 0,
                finished: false,
            }),
            sent: AtomicU64::new(0),
            done: Mutex::new(Some(done)),
            reset: Mutex::new(None),
        }
    }

    fn msg(&self, credit: bool) -> Message {
        let mut m = self.template.clone();
        if credit {
            m.front = Bytes::from_static(b"c");
        }
        m
    }

    /// Sends one message, asking for a credit if `credit`.
    fn send(&self, conn: &Connection, credit: bool) -> Result<(), SendError> {
        if self.borrow {
            let front: &[u8] = if credit { b"c" } else { b"" };
            return conn.send_parts(STREAM, front, &self.template.data);
        }
        conn.send(self.msg(credit)).map_err(SendError::from)
    }

    fn fail(&self, e: impl ToString) {
        *self.reset.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
    }

    /// The first message (asking for a credit) from the application's thread;
    /// everything else goes from callbacks. Sends from any thread are encoded
    /// under the connection's one pending-queue lock, so they keep the order
    /// they took it in.
    fn kick(&self, conn: &Connection) -> Result<(), ToolError> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.sent = 1;
        self.sent.store(1, Ordering::Relaxed);
        conn.send(self.msg(true))?;
        Ok(())
    }

    /// On a credit: sends one batch (its last message asks for the next
    /// credit; two batches after the kick), or the end marker when the run is
    /// over.
    fn on_credit(&self, conn: &Connection) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if st.finished {
            return;
        }
        let batches = if st.sent == 1 { 2 } else { 1 };
        for _ in 0..batches {
            let mut n = self.batch;
            if let Some(max) = self.max {
                n = n.min(max - st.sent);
            }
            if self.stop.load(Ordering::Relaxed) {
                n = 0;
            }
            for i in 0..n {
                if let Err(e) = self.send(conn, i + 1 == n) {
                    self.fail(e);
                    return;
                }
            }
            st.sent += n;
            self.sent.store(st.sent, Ordering::Relaxed);
            if n < self.batch {
                st.finished = true;
                if let Err(e) = conn.send(Message::new(STREAM_END, Bytes::new(), Bytes::new())) {
                    self.fail(e);
                }
                return;
            }
        }
    }
}

impl Dispatcher for StreamClient {
    fn on_message(&self, conn: &Connection, msg: Message) {
        match msg.msg_type {
            CREDIT => self.on_credit(conn),
            STREAM_DONE => {
                let now = Instant::now();
                let totals = msg.decode().unwrap_or_default();
                if let Some(tx) = self.done.lock().ok().and_then(|mut d| d.take()) {
                    let _ = tx.send((now, totals));
                }
            }
            _ => {}
        }
    }

    fn on_reset(&self, _conn: &Connection, reason: &FaultReason) {
        self.fail(reason);
    }

    /// The server lost the session: what was streamed and not acknowledged
    /// was dropped, so the run cannot report a complete transfer.
    fn on_remote_reset(&self, _conn: &Connection) {
        self.fail(REMOTE_RESET);
    }
}

/// Streams messages one way to a responder at `target`; the clock stops when
/// the responder's reply to the end marker arrives (so every message was
/// received).
pub fn stream(
    cfg: &MessengerConfig,
    target: &Target,
    opts: &StreamOpts,
    progress: &mut Progress,
) -> Result<(StreamResult, Totals), ToolError> {
    if let Limit::Count(0) = opts.limit {
        return Err(ToolError::Usage("--count must be at least 1".into()));
    }
    let (tx, rx) = mpsc::channel();
    let max = match opts.limit {
        Limit::Count(n) => Some(n),
        Limit::Time(_) => None,
    };
    let d = Arc::new(StreamClient::new(opts, credit_batch(opts.size), max, tx));
    let (mut m, conn) = connect(cfg, target, d.clone(), opts.connect_timeout, &d.reset)?;
    match opts.limit {
        Limit::Count(n) => progress.set_length(n),
        Limit::Time(t) => progress.set_length(t.as_millis() as u64),
    }
    let start = Instant::now();
    let deadline = start + opts.timeout;
    let mut run = || -> Result<(), ToolError> {
        match opts.driver {
            Driver::Callback => {
                // One message from here; credits drive the rest.
                d.kick(&conn)?;
                if let Limit::Time(t) = opts.limit {
                    while start.elapsed() < t {
                        std::thread::sleep(Duration::from_millis(20).min(t));
                        progress.set(start.elapsed().as_millis() as u64);
                        if d.reset.lock().unwrap_or_else(|p| p.into_inner()).is_some() {
                            break;
                        }
                    }
                    d.stop.store(true, Ordering::Relaxed);
                }
                Ok(())
            }
            Driver::Main => {
                let mut sent = 0u64;
                loop {
                    let more = match opts.limit {
                        Limit::Count(n) => sent < n,
                        Limit::Time(t) => !sent.is_multiple_of(256) || start.elapsed() < t,
                    };
                    if !more {
                        break;
                    }
                    send_blocking(&conn, d.msg(false), deadline)?;
                    sent += 1;
                    if sent.is_multiple_of(1024) {
                        // A reset ends the run with its reason, now: what
                        // was queued before it was dropped.
                        if let Some(r) = d.reset.lock().unwrap_or_else(|p| p.into_inner()).clone() {
                            return Err(ToolError::Reset {
                                peer: target.to_string(),
                                reason: r,
                            });
                        }
                        progress.set(match opts.limit {
                            Limit::Count(_) => sent,
                            Limit::Time(_) => start.elapsed().as_millis() as u64,
                        });
                    }
                }
                d.sent.store(sent, Ordering::Relaxed);
                d.state.lock().unwrap_or_else(|p| p.into_inner()).finished = true;
                send_blocking(
                    &conn,
                    Message::new(STREAM_END, Bytes::new(), Bytes::new()),
                    deadline,
                )
            }
        }
    };
    let result = run().and_then(|()| loop {
        match rx.recv_timeout(Duration::from_millis(50)) {
            // The end marker's answer came, but a reset on the way dropped
            // messages: the run did not transfer what it reports.
            Ok(r) => match d.reset.lock().unwrap_or_else(|p| p.into_inner()).clone() {
                Some(reason) => {
                    break Err(ToolError::Reset {
                        peer: target.to_string(),
                        reason,
                    })
                }
                None => break Ok(r),
            },
            Err(_) => {
                if let Limit::Count(_) = opts.limit {
                    progress.set(d.sent.load(Ordering::Relaxed));
                }
                if let Some(r) = d.reset.lock().unwrap_or_else(|p| p.into_inner()).clone() {
                    break Err(ToolError::Reset {
                        peer: target.to_string(),
                        reason: r,
                    });
                }
                if Instant::now() >= deadline {
                    break Err(ToolError::Timeout {
                        what: format!("stream to {target} did not complete"),
                        after: opts.timeout,
                    });
                }
            }
        }
    });
    let counters = m
        .transport_stats()
        .into_iter()
        .find(|s| &s.kind == target.transport())
        .map(|s| s.values)
        .unwrap_or_default();
    m.shutdown(Duration::from_secs(1));
    let (end, totals) = result?;
    let sent = d.sent.load(Ordering::Relaxed);
    // Without a reset nothing is lost; a server that counted otherwise
    // did not get what the run would report as transferred.
    if totals.this_stream != sent {
        return Err(ToolError::Incomplete {
            peer: target.to_string(),
            sent,
            delivered: totals.this_stream,
        });
    }
    let elapsed = end.duration_since(start).as_secs_f64();
    let mut r = StreamResult::new(opts.size, sent, elapsed);
    r.sender_transport = counters
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    Ok((r, totals))
}

/// Streams from `connections` client messengers at once (a session is one
/// per pair of peers, so each connection is a messenger of its own, named
/// `client.1` .. `client.C`), each driven by its credits on its own
/// worker: their aggregate rate into the responder at `target`. The
/// callback driver's window (two credits' worth of messages) is shared
/// among the connections, at least 16 messages a credit each, so many
/// connections stream sparsely rather than each keeping a whole window
/// in flight; `per_credit` instead gives each connection that many
/// messages a credit. With `Limit::Count(n)` each sends its share of `n`. The
/// clock runs from the first kick to the last connection's end-marker
/// answer; every connection's messages are checked delivered.
pub fn stream_many(
    cfg: &MessengerConfig,
    target: &Target,
    opts: &StreamOpts,
    connections: usize,
    per_credit: Option<u64>,
) -> Result<StreamResult, ToolError> {
    let c = connections as u64;
    if c == 0 {
        return Err(ToolError::Usage("--connections must be at least 1".into()));
    }
    if let Limit::Count(n) = opts.limit {
        if n < c {
            return Err(ToolError::Usage(format!(
                "--count {n} is fewer than one message per connection ({c})"
            )));
        }
    }
    let batch = per_credit.unwrap_or((credit_batch(opts.size) / c).max(16));
    let (tx, rx) = mpsc::channel();
    let mut clients = Vec::with_capacity(connections);
    let connected = (0..c).try_for_each(|i| {
        let max = match opts.limit {
            Limit::Count(n) => Some(n / c + u64::from(i < n % c)),
            Limit::Time(_) => None,
        };
        let d = Arc::new(StreamClient::new(opts, batch, max, tx.clone()));
        let name = EntityName::client(i + 1);
        let (m, conn) = connect_as(
            name,
            cfg,
            target,
            d.clone(),
            (opts.connect_timeout, &d.reset),
        )?;
        clients.push((m, conn, d));
        Ok(())
    });
    let shutdown = |clients: Vec<(Messenger, Connection, Arc<StreamClient>)>| {
        for (mut m, conn, _) in clients {
            drop(conn);
            m.shutdown(Duration::from_secs(1));
        }
    };
    if let Err(e) = connected {
        shutdown(clients);
        return Err(e);
    }
    let start = Instant::now();
    let deadline = start + opts.timeout;
    let failed = |clients: &[(Messenger, Connection, Arc<StreamClient>)]| {
        clients.iter().find_map(|(_, _, d)| {
            d.reset
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone()
                .map(|reason| ToolError::Reset {
                    peer: target.to_string(),
                    reason,
                })
        })
    };
    let result = (|| {
        for (_, conn, d) in &clients {
            d.kick(conn)?;
        }
        if let Limit::Time(t) = opts.limit {
            while start.elapsed() < t && failed(&clients).is_none() {
                std::thread::sleep(Duration::from_millis(20).min(t));
            }
            for (_, _, d) in &clients {
                d.stop.store(true, Ordering::Relaxed);
            }
        }
        let (mut last, mut delivered) = (start, 0u64);
        for answered in 0..clients.len() {
            loop {
                if let Some(e) = failed(&clients) {
                    return Err(e);
                }
                match rx.recv_timeout(Duration::from_millis(50)) {
                    Ok((end, totals)) => {
                        last = last.max(end);
                        delivered += totals.this_stream;
                        break;
                    }
                    Err(_) if Instant::now() >= deadline => {
                        return Err(ToolError::Timeout {
                            what: format!("{c} streams to {target}: {answered} completed"),
                            after: opts.timeout,
                        })
                    }
                    Err(_) => {}
                }
            }
        }
        Ok((last, delivered))
    })();
    let sent: u64 = clients
        .iter()
        .map(|(_, _, d)| d.sent.load(Ordering::Relaxed))
        .sum();
    shutdown(clients);
    let (end, delivered) = result?;
    if delivered != sent {
        return Err(ToolError::Incomplete {
            peer: target.to_string(),
            sent,
            delivered,
        });
    }
    Ok(StreamResult::new(
        opts.size,
        sent,
        end.duration_since(start).as_secs_f64(),
    ))
}
