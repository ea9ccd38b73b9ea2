//! Connection handles: what the application holds to send to one peer.

use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use msgr_addr::EntityAddr;
use msgr_proto::batch::EntryParts;
use msgr_proto::control::Limits;
use msgr_proto::{FaultReason, Message, PeerInfo, Phase, Policy, Priority};
use parking_lot::{Mutex, MutexGuard};
use thiserror::Error;

use crate::counters::Counters;
use crate::pending::{Pending, Queued, SendError, SendRejected};
use crate::state::{Command, ConnInner, PublishedStatus, Shared, ThreadWaker};

const STATE_CONNECTING: u8 = 0;
const STATE_OPEN: u8 = 1;
const STATE_CLOSED: u8 = 2;

/// [`Connection::wait_connected`] gave up.
///
/// ```
/// # use std::{sync::Arc, time::Duration};
/// # use msgr::{EntityAddr, EntityName, Message, Messenger, NullDispatcher, Policy};
/// # let client = Messenger::builder(EntityName::client(1)).without_env()
/// #     .start(Arc::new(NullDispatcher))?;
/// // A listener that never answers: the session stays in its handshake.
/// let silent = std::net::TcpListener::bind("127.0.0.1:0")?;
/// let addr: EntityAddr = format!("tcp://{}", silent.local_addr()?).parse()?;
/// let conn = client.connect_with(&addr, Policy::LosslessClient)?;
/// use msgr::ConnectError;
/// let err = conn.wait_connected(Duration::from_millis(50)).unwrap_err();
/// assert!(matches!(err, ConnectError::Timeout { .. }));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The connection ended before it was established.
    #[error("connection ended before it was established: {}", .0.as_ref().map_or("no reason".to_string(), |r| r.to_string()))]
    Closed(Option<FaultReason>),
    /// Not established within the deadline; the last attempt's failure, if any.
    #[error("not established within {after:?}{}", .last_fault.as_ref().map_or(String::new(), |r| format!(" (last: {r})")))]
    Timeout {
        /// How long it waited.
        after: Duration,
        /// Why the last attempt failed.
        last_fault: Option<FaultReason>,
    },
}

msgr_addr::debug_is_display!(ConnectError);

/// The life-cycle state of a connection, as the application sees it.
///
/// ```
/// # use std::{sync::Arc, time::Duration};
/// # use msgr::{EntityName, Inbox, Message, Messenger, NullDispatcher};
/// # let inbox = Inbox::new();
/// # let server = Messenger::builder(EntityName::server(1)).without_env()
/// #     .bind("tcp://127.0.0.1:0".parse()?).start(inbox.dispatcher())?;
/// # let client = Messenger::builder(EntityName::client(1)).without_env()
/// #     .start(Arc::new(NullDispatcher))?;
/// # let conn = client.connect(server.addr().expect("bound"))?;
/// use msgr::ConnectionState;
/// conn.wait_connected(Duration::from_secs(10))?;
/// assert_eq!(conn.state(), ConnectionState::Open);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnectionState {
    /// Handshaking, or reconnecting after a fault (lossless).
    Connecting,
    /// Established.
    Open,
    /// Ended; sends fail with [`SendError::Closed`].
    Closed,
}

/// Where a connection stands and why it last lost its link: what to log
/// when a connection stays [`ConnectionState::Connecting`] for longer than
/// expected. A snapshot, taken by [`Connection::status`].
///
/// ```no_run
/// # fn f(conn: &msgr::Connection) {
/// let st = conn.status();
/// if let Some(why) = &st.last_fault {
///     eprintln!("{} is {} after {} faults, the last: {why}", conn.target(), st.phase, st.faults);
/// }
/// # }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectionStatus {
    /// As [`Connection::state`].
    pub state: ConnectionState,
    /// The session's phase, shown in words: "connecting" (waiting for the
    /// transport), "standing by" (waiting to redial, or for the peer),
    /// "exchanging banners", "open", "closed"...
    pub phase: Phase,
    /// Links the connection lost so far (faults of any kind).
    pub faults: u64,
    /// Why the last link was lost, or why the connection ended.
    pub last_fault: Option<FaultReason>,
    /// Attempts since the connection was last open (link faults and failed
    /// redials): how far its reconnect backoff has grown. 0 while open.
    pub attempts: u32,
    /// When it dials again, if it stands by after a fault (the backoff,
    /// doubling from `backoff_min_ms` to `backoff_max_ms`, with jitter).
    pub retry_in: Option<Duration>,
}

/// A handle on one session with one peer. Cheap to clone; all clones name the
/// same session. Obtained from [`crate::Messenger::connect`] or handed to the
/// [`crate::Dispatcher`] callbacks.
///
/// ```
/// # use std::{sync::Arc, time::Duration};
/// # use msgr::{EntityName, Inbox, Message, Messenger, NullDispatcher};
/// # let inbox = Inbox::new();
/// # let server = Messenger::builder(EntityName::server(1)).without_env()
/// #     .bind("tcp://127.0.0.1:0".parse()?).start(inbox.dispatcher())?;
/// # let client = Messenger::builder(EntityName::client(1)).without_env()
/// #     .start(Arc::new(NullDispatcher))?;
/// # let conn = client.connect(server.addr().expect("bound"))?;
/// let conn: msgr::Connection = client.connect(server.addr().expect("bound"))?;
/// let copy = conn.clone(); // the same session
/// copy.send(Message::new(7, &b"ping"[..], &b""[..]))?;
/// let (_, msg) = inbox.recv_timeout(Duration::from_secs(10)).expect("delivered");
/// assert_eq!(msg.msg_type, 7);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Connection {
    pub(crate) inner: Arc<ConnInner>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("key", &self.inner.key)
            .field("target", &self.inner.target.to_string())
            .field("state", &self.state())
            .finish()
    }
}

impl Connection {
    /// The handle on a connection the messenger's registry or a command
    /// holds the state of.
    pub(crate) fn from_inner(inner: Arc<ConnInner>) -> Self {
        Connection { inner }
    }

    pub(crate) fn new(
        shared: Arc<Shared>,
        key: u64,
        worker: usize,
        target: EntityAddr,
        policy: Policy,
        expected: Option<msgr_addr::EntityName>,
    ) -> Self {
        let l = &shared.cfg.session.limits;
        let (max_front, max_data) = (l.max_segment[1], l.max_segment[2]);
        Connection {
            inner: Arc::new(ConnInner {
                key,
                worker,
                shared,
                target,
                policy,
                expected,
                alternates: Mutex::new(Vec::new()),
                peer: Mutex::new(None),
                state: AtomicU8::new(STATE_CONNECTING),
                pending: Default::default(),
                released: Default::default(),
                status: Mutex::new(PublishedStatus {
                    phase: Phase::Connecting,
                    faults: 0,
                    last_fault: None,
                    attempts: 0,
                    retry_at: None,
                }),
                send_limits: [AtomicU32::new(max_front), AtomicU32::new(max_data)],
                calls: Default::default(),
                room: Default::default(),
                user: Default::default(),
            }),
        }
    }

    /// Queues a message for the peer. It is sent in order after everything sent
    /// before on this connection; on a lossless connection it is delivered
    /// exactly once even across transport faults. Never blocks. A refused
    /// message comes back in the error ([`SendRejected`]).
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use msgr::{EntityName, Inbox, Message, Messenger, NullDispatcher};
    /// # let inbox = Inbox::new();
    /// # let server = Messenger::builder(EntityName::server(1)).without_env()
    /// #     .bind("tcp://127.0.0.1:0".parse()?).start(inbox.dispatcher())?;
    /// # let client = Messenger::builder(EntityName::client(1)).without_env()
    /// #     .start(Arc::new(NullDispatcher))?;
    /// # let conn = client.connect(server.addr().expect("bound"))?;
    /// conn.send(Message::new(1, &b"hello"[..], &b""[..]))?;
    /// let (_from, msg) = inbox.recv_timeout(Duration::from_secs(10)).expect("delivered");
    /// assert_eq!(&msg.front[..], b"hello");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn send(&self, msg: Message) -> Result<(), SendRejected> {
        self.queue(msg)
    }

    /// Queues a message of `msg_type` made of `front` and `data` as
    /// [`Connection::send`] queues `Message::new(msg_type, front, data)`,
    /// with the same order, admission, refusals and bytes on the wire, but
    /// without building a [`Message`]: a message that goes in a batch is
    /// encoded straight from the borrowed slices into the batch being
    /// filled. One too large for a batch is copied and goes whole, as
    /// `send` sends it. Never blocks; a refusal says why and the slices
    /// stay the caller's. The way to send many small messages from one
    /// buffer; [`Connection::send_parts_in`] for another class.
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use msgr::{EntityName, Inbox, Message, Messenger, NullDispatcher};
    /// # let inbox = Inbox::new();
    /// # let server = Messenger::builder(EntityName::server(1)).without_env()
    /// #     .bind("tcp://127.0.0.1:0".parse()?).start(inbox.dispatcher())?;
    /// # let client = Messenger::builder(EntityName::client(1)).without_env()
    /// #     .start(Arc::new(NullDispatcher))?;
    /// # let conn = client.connect(server.addr().expect("bound"))?;
    /// let payload = [0xa5u8; 64];
    /// conn.send_parts(1, b"hello", &payload)?;
    /// let (_from, msg) = inbox.recv_timeout(Duration::from_secs(10)).expect("delivered");
    /// assert_eq!((&msg.front[..], &msg.data[..]), (&b"hello"[..], &payload[..]));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn send_parts(&self, msg_type: u16, front: &[u8], data: &[u8]) -> Result<(), SendError> {
        self.queue_parts(&EntryParts::new(msg_type, front, data))
    }

    /// [`Connection::send_parts`] of a message in class `class` (as
    /// `send` queues `Message::new(msg_type, front, data).with_class(class)`):
    /// its lane, and the queue headroom of its class.
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use msgr::{EntityName, Inbox, Message, Messenger, NullDispatcher};
    /// # let inbox = Inbox::new();
    /// # let server = Messenger::builder(EntityName::server(1)).without_env()
    /// #     .bind("tcp://127.0.0.1:0".parse()?).start(inbox.dispatcher())?;
    /// # let client = Messenger::builder(EntityName::client(1)).without_env()
    /// #     .start(Arc::new(NullDispatcher))?;
    /// # let conn = client.connect(server.addr().expect("bound"))?;
    /// use msgr::Priority;
    /// conn.send_parts_in(Priority::Interactive, 1, b"ping", b"")?;
    /// let (_from, msg) = inbox.recv_timeout(Duration::from_secs(10)).expect("delivered");
    /// assert_eq!(msg.class(), Priority::Interactive);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn send_parts_in(
        &self,
        class: Priority,
        msg_type: u16,
        front: &[u8],
        data: &[u8],
    ) -> Result<(), SendError> {
        self.queue_parts(&EntryParts::new(msg_type, front, data).with_class(class))
    }

    /// [`Connection::queue`] of borrowed parts: the same admission, then
    /// encoded in place ([`Pending::push_parts`]).
    #[inline]
    fn queue_parts(&self, parts: &EntryParts<'_>) -> Result<(), SendError> {
        let limits = self.send_limits();
        self.check_open()?;
        self.fits_lens(parts.front.len(), parts.data.len(), limits)?;
        let mut pending = self.inner.pending.lock();
        self.reserve(&mut pending, 1, parts.payload_len() as u64, parts.class())?;
        pending.push_parts(parts, self.batch_max_bytes(), limits);
        self.schedule(pending);
        Ok(())
    }

    /// [`Connection::send`] of a message or an RMA request ([`Queued`]).
    #[inline]
    pub(crate) fn queue<Q: Queued>(&self, item: Q) -> Result<(), SendRejected<Q>> {
        let limits = self.send_limits();
        let admitted = self.check_open().and_then(|()| {
            let msg = item.message();
            self.fits(msg, limits)?;
            let mut pending = self.inner.pending.lock();
            self.reserve(&mut pending, 1, msg.payload_len() as u64, msg.class())?;
            Ok(pending)
        });
        match admitted {
            Ok(mut pending) => {
                item.push(&mut pending, self.batch_max_bytes(), limits);
                self.schedule(pending);
                Ok(())
            }
            Err(error) => Err(SendRejected {
                error,
                message: item,
            }),
        }
    }

    /// Queues several messages at once, in order: one queue reservation, one
    /// hand-off to the worker and at most one wake-up for all of them — the way
    /// to reach high message rates from an application thread. All or none: if
    /// they do not all fit, nothing is queued, [`SendError::QueueFull`] says
    /// how full the queue is and the batch comes back whole.
    ///
    /// ```no_run
    /// # fn f(conn: &msgr::Connection) -> Result<(), msgr::SendError> {
    /// let batch: Vec<msgr::Message> =
    ///     (0..64u8).map(|i| msgr::Message::new(1, vec![i; 64], Vec::new())).collect();
    /// conn.send_batch(batch)?;
    /// # Ok(()) }
    /// ```
    pub fn send_batch(&self, msgs: Vec<Message>) -> Result<(), SendRejected<Vec<Message>>> {
        let limits = self.send_limits();
        let admitted = self.check_open().and_then(|()| {
            for m in &msgs {
                self.fits(m, limits)?;
            }
            let bytes = msgs.iter().map(|m| m.payload_len() as u64).sum();
            let mut pending = self.inner.pending.lock();
            if !msgs.is_empty() {
                // All or none: under the bounds of the least urgent.
                let class = msgs.iter().map(Message::class).max().unwrap_or_default();
                self.reserve(&mut pending, msgs.len() as u64, bytes, class)?;
            }
            Ok(pending)
        });
        let mut pending = match admitted {
            Ok(pending) => pending,
            Err(error) => {
                return Err(SendRejected {
                    error,
                    message: msgs,
                })
            }
        };
        if msgs.is_empty() {
            return Ok(());
        }
        let max_body = self.batch_max_bytes();
        for m in msgs {
            pending.push(m, max_body, limits);
        }
        self.schedule(pending);
        Ok(())
    }

    /// Fails if the connection is closed. One load on the path every
    /// message takes: a dead worker's connections are marked closed when
    /// it dies (`worker::run_guarded`).
    fn check_open(&self) -> Result<(), SendError> {
        if self.inner.state.load(Ordering::Acquire) == STATE_CLOSED {
            return Err(self.closed_error());
        }
        Ok(())
    }

    /// The bound of the batches `send` encodes.
    fn batch_max_bytes(&self) -> usize {
        self.inner.shared.cfg.session.batch_max_bytes
    }

    /// Releases the pending queue; the first send since the worker last
    /// took it asks the worker to take it again.
    fn schedule(&self, mut pending: MutexGuard<'_, Pending>) {
        let first = !pending.scheduled;
        pending.scheduled = true;
        drop(pending);
        if first {
            self.inner.dispatch(Command::Flush {
                conn: self.inner.clone(),
            });
        }
    }

    /// Waits until the connection is established, at most `timeout`.
    /// Returns at once if it is open; fails if it ends first
    /// ([`ConnectError::Closed`], with why) or the deadline passes
    /// ([`ConnectError::Timeout`], with the last attempt's failure). A
    /// lossless connection goes on trying after a timeout here.
    ///
    /// ```no_run
    /// # fn f(m: &msgr::Messenger, addr: &msgr::EntityAddr) -> Result<(), Box<dyn std::error::Error>> {
    /// let conn = m.connect(addr)?;
    /// conn.wait_connected(std::time::Duration::from_secs(5))?;
    /// # Ok(()) }
    /// ```
    pub fn wait_connected(&self, timeout: Duration) -> Result<(), ConnectError> {
        let deadline = Instant::now() + timeout;
        let mut pause = Duration::from_micros(50);
        loop {
            match self.state() {
                ConnectionState::Open => return Ok(()),
                ConnectionState::Closed => {
                    return Err(ConnectError::Closed(self.status().last_fault))
                }
                ConnectionState::Connecting if Instant::now() >= deadline => {
                    return Err(ConnectError::Timeout {
                        after: timeout,
                        last_fault: self.status().last_fault,
                    })
                }
                ConnectionState::Connecting => {
                    std::thread::sleep(
                        pause.min(deadline.saturating_duration_since(Instant::now())),
                    );
                    pause = (pause * 2).min(Duration::from_millis(5));
                }
            }
        }
    }

    /// Like [`Connection::send`], but waits up to `timeout` for room in the
    /// send queue ([`SendError::Timeout`] if none came; the message comes
    /// back).
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use msgr::{EntityName, Inbox, Message, Messenger, NullDispatcher};
    /// # let inbox = Inbox::new();
    /// # let server = Messenger::builder(EntityName::server(1)).without_env()
    /// #     .bind("tcp://127.0.0.1:0".parse()?).start(inbox.dispatcher())?;
    /// # let client = Messenger::builder(EntityName::client(1)).without_env()
    /// #     .start(Arc::new(NullDispatcher))?;
    /// # let conn = client.connect(server.addr().expect("bound"))?;
    /// // Waits up to a second for room where `send` would fail with QueueFull.
    /// conn.send_timeout(Message::new(1, &b"hi"[..], &b""[..]), Duration::from_secs(1))?;
    /// assert!(inbox.recv_timeout(Duration::from_secs(10)).is_some());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn send_timeout(&self, msg: Message, timeout: Duration) -> Result<(), SendRejected> {
        self.queue_timeout(msg, timeout)
    }

    /// [`Connection::send_timeout`] of a message or an RMA request.
    pub(crate) fn queue_timeout<Q: Queued>(
        &self,
        msg: Q,
        timeout: Duration,
    ) -> Result<(), SendRejected<Q>> {
        let deadline = Instant::now() + timeout;
        // Woken by the worker when it releases messages (as `send_async`
        // is), not by polling: a sleep per full queue cost 8 callers of
        // 1 MiB RMA writes half their throughput.
        let waker = std::task::Waker::from(Arc::new(ThreadWaker(std::thread::current())));
        let mut cx = std::task::Context::from_waker(&waker);
        let mut msg = msg;
        loop {
            let Some(back) = self.send_or_wait(msg, &mut cx)? else {
                return Ok(());
            };
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(SendRejected {
                    error: SendError::Timeout(timeout),
                    message: back,
                });
            }
            // Looked at again within 5 ms whatever happens (a connection
            // that closes releases nothing).
            std::thread::park_timeout(left.min(Duration::from_millis(5)));
            msg = back;
        }
    }

    /// Queues `msg` without blocking, waiting for room in the queue where
    /// [`Connection::send`] would say [`SendError::QueueFull`]: the worker
    /// wakes the future when it releases messages. For async code on any
    /// executor. A refused message comes back in the error. Polled again
    /// once it has completed, the future is ready with `Ok(())` and sends
    /// nothing.
    ///
    /// ```no_run
    /// # async fn demo(conn: msgr::Connection) -> Result<(), msgr::SendError> {
    /// for i in 0..1000u32 {
    ///     conn.send_async(msgr::Message::new(1, i.to_le_bytes().to_vec(), Vec::new())).await?;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn send_async(&self, msg: Message) -> SendFuture {
        SendFuture {
            conn: self.clone(),
            msg: Some(msg),
        }
    }

    /// Sends `msg`, or if the queue is full registers `cx`'s waker for
    /// room and gives the message back.
    pub(crate) fn send_or_wait<Q: Queued>(
        &self,
        msg: Q,
        cx: &mut std::task::Context<'_>,
    ) -> Result<Option<Q>, SendRejected<Q>> {
        let msg = match self.queue(msg) {
            Err(SendRejected {
                error: SendError::QueueFull { .. },
                message,
            }) => message,
            other => return other.map(|()| None),
        };
        self.inner.room.register(cx.waker());
        // Room may have come before the waker was in place: look again.
        match self.queue(msg) {
            Err(SendRejected {
                error: SendError::QueueFull { .. },
                message,
            }) => Ok(Some(message)),
            other => other.map(|()| None),
        }
    }

    /// Asks the worker to time call `id` out at `at` (async calls).
    pub(crate) fn call_deadline(&self, id: u64, at: Instant) {
        self.inner.dispatch(Command::CallDeadline {
            key: self.inner.key,
            id,
            at,
        });
    }

    /// Fails if `msg` is larger than the peer takes (its `limits`).
    fn fits(&self, msg: &Message, limits: Limits) -> Result<(), SendError> {
        self.fits_lens(msg.front.len(), msg.data.len(), limits)
    }

    /// Fails if segments of `front` and `data` bytes are larger than the
    /// peer takes (its `limits`).
    fn fits_lens(&self, front: usize, data: usize, limits: Limits) -> Result<(), SendError> {
        limits.check(front, data).map_err(|t| {
            Counters::add(&self.inner.shared.counters.messages_too_large, 1);
            SendError::TooLarge(t)
        })
    }

    /// The peer's limits as the worker last published them.
    fn send_limits(&self) -> Limits {
        let l = &self.inner.send_limits;
        Limits {
            max_front: l[0].load(Ordering::Relaxed),
            max_data: l[1].load(Ordering::Relaxed),
        }
    }

    /// The session's send limits, once the handshake told them (worker).
    pub(crate) fn publish_send_limits(&self, limits: Limits) {
        let l = &self.inner.send_limits;
        l[0].store(limits.max_front, Ordering::Relaxed);
        l[1].store(limits.max_data, Ordering::Relaxed);
    }

    /// Why a send on a closed connection fails: its worker died, or the
    /// session ended.
    #[cold]
    fn closed_error(&self) -> SendError {
        if self.inner.shared.workers[self.inner.worker].is_dead() {
            SendError::WorkerStopped
        } else {
            SendError::Closed
        }
    }

    /// Reserves queue room for `n` messages of `len` bytes of `class` (the
    /// least urgent of them), or says it is full. A class above data has
    /// room of its own beyond the bounds ([`SessionConfig::queue_bounds`],
    /// as the session admits it), so bulk cannot shut calls out.
    ///
    /// [`SessionConfig::queue_bounds`]: msgr_proto::SessionConfig::queue_bounds
    fn reserve(
        &self,
        pending: &mut Pending,
        n: u64,
        len: u64,
        class: Priority,
    ) -> Result<(), SendError> {
        let [msgs, bytes] = pending.submitted;
        let [room_msgs, room_bytes] = pending.room;
        if n <= room_msgs && len <= room_bytes {
            pending.room = [room_msgs - n, room_bytes - len];
            pending.submitted = [msgs + n, bytes + len];
            return Ok(());
        }
        let cfg = &self.inner.shared.cfg.session;
        let i = &self.inner;
        let q_msgs = msgs + n - i.released[0].load(Ordering::Acquire);
        let q_bytes = bytes + len - i.released[1].load(Ordering::Acquire);
        // One message larger than the byte bound may go alone into an empty
        // queue (as the session engine allows), or it could never be sent.
        let alone = n == 1 && q_bytes == len;
        let (max_msgs, max_bytes) = cfg.queue_bounds(class);
        let over_bytes = q_bytes > max_bytes as u64 && !alone;
        if q_msgs > max_msgs as u64 || over_bytes {
            Counters::add(&i.shared.counters.send_queue_full, 1);
            return Err(SendError::QueueFull {
                messages: q_msgs - n,
                bytes: q_bytes - len,
            });
        }
        pending.submitted = [msgs + n, bytes + len];
        // The room any class may take without looking again.
        pending.room = [
            (cfg.max_queued_messages as u64).saturating_sub(q_msgs),
            (cfg.max_queued_bytes as u64).saturating_sub(q_bytes),
        ];
        Ok(())
    }

    /// Messages and payload bytes queued (not yet acknowledged by the peer, or
    /// for lossy connections not yet transmitted).
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use msgr::{EntityAddr, EntityName, Message, Messenger, NullDispatcher, Policy};
    /// # let client = Messenger::builder(EntityName::client(1)).without_env()
    /// #     .start(Arc::new(NullDispatcher))?;
    /// // A listener that never answers: the session stays in its handshake.
    /// let silent = std::net::TcpListener::bind("127.0.0.1:0")?;
    /// let addr: EntityAddr = format!("tcp://{}", silent.local_addr()?).parse()?;
    /// let conn = client.connect_with(&addr, Policy::LosslessClient)?;
    /// conn.send(Message::new(1, &b"hello"[..], &b""[..]))?;
    /// // Not acknowledged (the peer never answered): one message, five bytes.
    /// assert_eq!(conn.queued(), (1, 5));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn queued(&self) -> (u64, u64) {
        let i = &self.inner;
        let [msgs, bytes] = i.pending.lock().submitted;
        (
            msgs.saturating_sub(i.released[0].load(Ordering::Acquire)),
            bytes.saturating_sub(i.released[1].load(Ordering::Acquire)),
        )
    }

    /// Ends the session now, dropping queued messages (the dispatcher hears
    /// `on_reset` with [`FaultReason::MarkedDown`]). A connect
    /// to the same peer made after this call opens a new session, even
    /// while this one is still being torn down.
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use msgr::{EntityAddr, EntityName, Message, Messenger, NullDispatcher, Policy};
    /// # let client = Messenger::builder(EntityName::client(1)).without_env()
    /// #     .start(Arc::new(NullDispatcher))?;
    /// // A listener that never answers: the session stays in its handshake.
    /// let silent = std::net::TcpListener::bind("127.0.0.1:0")?;
    /// let addr: EntityAddr = format!("tcp://{}", silent.local_addr()?).parse()?;
    /// let conn = client.connect_with(&addr, Policy::LosslessClient)?;
    /// conn.mark_down();
    /// // The next connect to that peer is a new session.
    /// let again = client.connect_with(&addr, Policy::LosslessClient)?;
    /// assert_ne!(again.id(), conn.id());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn mark_down(&self) {
        self.unregister();
        self.inner.dispatch(Command::MarkDown {
            key: self.inner.key,
        });
    }

    /// Ends the session once everything queued is delivered (bounded by the
    /// session's timers; use [`crate::Messenger::shutdown`] for a deadline).
    /// Until it has ended, a connect to the same peer returns this
    /// connection, which refuses sends: a second session to the same peer
    /// beside one still draining would take the peer's session from it.
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use msgr::{EntityName, Inbox, Message, Messenger, NullDispatcher};
    /// # let inbox = Inbox::new();
    /// # let server = Messenger::builder(EntityName::server(1)).without_env()
    /// #     .bind("tcp://127.0.0.1:0".parse()?).start(inbox.dispatcher())?;
    /// # let client = Messenger::builder(EntityName::client(1)).without_env()
    /// #     .start(Arc::new(NullDispatcher))?;
    /// # let conn = client.connect(server.addr().expect("bound"))?;
    /// conn.send(Message::new(1, &b"last words"[..], &b""[..]))?;
    /// conn.close();
    /// // What was queued before the close is still delivered.
    /// let (_, msg) = inbox.recv_timeout(Duration::from_secs(10)).expect("delivered");
    /// assert_eq!(&msg.front[..], b"last words");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn close(&self) {
        self.inner.dispatch(Command::Close {
            key: self.inner.key,
        });
    }

    /// Takes this connection out of the messenger's registry at once (for
    /// `mark_down`): the worker ends the session at its next command, before
    /// any connect made after this, so `connect` must not hand out the
    /// connection that is about to end.
    fn unregister(&self) {
        let i = &self.inner;
        i.shared.unregister(i.key, &i.target);
        if let Some(peer) = i.peer.lock().as_ref() {
            i.shared.unregister(i.key, &peer.addr);
        }
    }

    /// Produces a real transport fault on the current link (for tests and
    /// fault drills; cargo feature `fault-injection`): the session recovers
    /// per its policy.
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use msgr::{EntityName, Inbox, Message, Messenger, NullDispatcher};
    /// # let inbox = Inbox::new();
    /// # let server = Messenger::builder(EntityName::server(1)).without_env()
    /// #     .bind("tcp://127.0.0.1:0".parse()?).start(inbox.dispatcher())?;
    /// # let client = Messenger::builder(EntityName::client(1)).without_env()
    /// #     .start(Arc::new(NullDispatcher))?;
    /// # let conn = client.connect(server.addr().expect("bound"))?;
    /// use msgr::RealFault;
    /// conn.wait_connected(Duration::from_secs(10))?;
    /// conn.inject_fault(RealFault::Abort);
    /// // A lossless connection reconnects and delivers what it was given.
    /// conn.send(Message::new(1, &b"after"[..], &b""[..]))?;
    /// let (_, msg) = inbox.recv_timeout(Duration::from_secs(10)).expect("delivered");
    /// assert_eq!(&msg.front[..], b"after");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg(feature = "fault-injection")]
    pub fn inject_fault(&self, fault: msgr_backends::RealFault) {
        self.inner.dispatch(Command::Inject {
            key: self.inner.key,
            fault: crate::state::LinkFault::Real(fault),
        });
    }

    /// Imitates, on the current link, a fault its backend cannot produce for
    /// real (see [`SimulatedFault`](crate::SimulatedFault); for tests,
    /// cargo feature `fault-injection`). A backend that cannot
    /// imitate it ignores the request, as [`Connection::inject_fault`] does
    /// with faults a backend does not have.
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use msgr::{EntityName, Inbox, Message, Messenger, NullDispatcher};
    /// # let inbox = Inbox::new();
    /// # let server = Messenger::builder(EntityName::server(1)).without_env()
    /// #     .bind("tcp://127.0.0.1:0".parse()?).start(inbox.dispatcher())?;
    /// # let client = Messenger::builder(EntityName::client(1)).without_env()
    /// #     .start(Arc::new(NullDispatcher))?;
    /// # let conn = client.connect(server.addr().expect("bound"))?;
    /// use msgr::SimulatedFault;
    /// conn.wait_connected(Duration::from_secs(10))?;
    /// // TCP has no rendezvous reads to hang: it ignores the request.
    /// conn.simulate_fault(SimulatedFault::HungRead);
    /// conn.send(Message::new(1, &b"still here"[..], &b""[..]))?;
    /// assert!(inbox.recv_timeout(Duration::from_secs(10)).is_some());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg(feature = "fault-injection")]
    pub fn simulate_fault(&self, fault: msgr_backends::SimulatedFault) {
        self.inner.dispatch(Command::Inject {
            key: self.inner.key,
            fault: crate::state::LinkFault::Simulated(fault),
        });
    }

    /// Where this connection was dialled, or where the peer was accepted from.
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use msgr::{EntityName, Inbox, Message, Messenger, NullDispatcher};
    /// # let inbox = Inbox::new();
    /// # let server = Messenger::builder(EntityName::server(1)).without_env()
    /// #     .bind("tcp://127.0.0.1:0".parse()?).start(inbox.dispatcher())?;
    /// # let client = Messenger::builder(EntityName::client(1)).without_env()
    /// #     .start(Arc::new(NullDispatcher))?;
    /// # let conn = client.connect(server.addr().expect("bound"))?;
    /// assert_eq!(conn.target(), server.addr().expect("bound"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn target(&self) -> &EntityAddr {
        &self.inner.target
    }

    /// The peer's identity once the handshake told it.
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use msgr::{EntityName, Inbox, Message, Messenger, NullDispatcher};
    /// # let inbox = Inbox::new();
    /// # let server = Messenger::builder(EntityName::server(1)).without_env()
    /// #     .bind("tcp://127.0.0.1:0".parse()?).start(inbox.dispatcher())?;
    /// # let client = Messenger::builder(EntityName::client(1)).without_env()
    /// #     .start(Arc::new(NullDispatcher))?;
    /// # let conn = client.connect(server.addr().expect("bound"))?;
    /// conn.wait_connected(Duration::from_secs(10))?;
    /// let peer = conn.peer().expect("known after the handshake");
    /// assert_eq!(peer.name, EntityName::server(1));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn peer(&self) -> Option<PeerInfo> {
        self.inner.peer.lock().clone()
    }

    /// This side's policy for the connection.
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use msgr::{EntityName, Inbox, Message, Messenger, NullDispatcher};
    /// # let inbox = Inbox::new();
    /// # let server = Messenger::builder(EntityName::server(1)).without_env()
    /// #     .bind("tcp://127.0.0.1:0".parse()?).start(inbox.dispatcher())?;
    /// # let client = Messenger::builder(EntityName::client(1)).without_env()
    /// #     .start(Arc::new(NullDispatcher))?;
    /// # let conn = client.connect(server.addr().expect("bound"))?;
    /// use msgr::Policy;
    /// assert_eq!(conn.policy(), Policy::LosslessClient); // the configured default
    /// let lossy = client.connect_with(server.addr().expect("bound"), Policy::LossyClient)?;
    /// assert_eq!(lossy.policy(), Policy::LosslessClient); // the existing session
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn policy(&self) -> Policy {
        self.inner.policy
    }

    /// The current state ([`ConnectionState::Closed`] too if the worker
    /// owning the connection died).
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use msgr::{EntityName, Inbox, Message, Messenger, NullDispatcher};
    /// # let inbox = Inbox::new();
    /// # let server = Messenger::builder(EntityName::server(1)).without_env()
    /// #     .bind("tcp://127.0.0.1:0".parse()?).start(inbox.dispatcher())?;
    /// # let client = Messenger::builder(EntityName::client(1)).without_env()
    /// #     .start(Arc::new(NullDispatcher))?;
    /// # let conn = client.connect(server.addr().expect("bound"))?;
    /// use msgr::ConnectionState;
    /// conn.wait_connected(Duration::from_secs(10))?;
    /// assert_eq!(conn.state(), ConnectionState::Open);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn state(&self) -> ConnectionState {
        if self.inner.shared.workers[self.inner.worker].is_dead() {
            return ConnectionState::Closed;
        }
        match self.inner.state.load(Ordering::Acquire) {
            STATE_CONNECTING => ConnectionState::Connecting,
            STATE_OPEN => ConnectionState::Open,
            _ => ConnectionState::Closed,
        }
    }

    /// Where the connection stands and why it last lost its link (see
    /// [`ConnectionStatus`]).
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use msgr::{EntityAddr, EntityName, Message, Messenger, NullDispatcher, Policy};
    /// # let client = Messenger::builder(EntityName::client(1)).without_env()
    /// #     .start(Arc::new(NullDispatcher))?;
    /// // A listener that never answers: the session stays in its handshake.
    /// let silent = std::net::TcpListener::bind("127.0.0.1:0")?;
    /// let addr: EntityAddr = format!("tcp://{}", silent.local_addr()?).parse()?;
    /// let conn = client.connect_with(&addr, Policy::LosslessClient)?;
    /// let status = conn.status();
    /// assert_eq!(status.state, msgr::ConnectionState::Connecting);
    /// assert_eq!(status.faults, 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn status(&self) -> ConnectionStatus {
        let p = self.inner.status.lock();
        let now = Instant::now();
        ConnectionStatus {
            state: self.state(),
            phase: p.phase,
            faults: p.faults,
            last_fault: p.last_fault.clone(),
            attempts: p.attempts,
            retry_in: p.retry_at.map(|at| at.saturating_duration_since(now)),
        }
    }

    /// Publishes `session`'s phase, faults, last fault and backoff for
    /// [`Connection::status`] (worker).
    pub(crate) fn publish_status(&self, session: &msgr_proto::Session) {
        let last_fault = session.last_fault();
        let mut p = self.inner.status.lock();
        p.phase = session.phase();
        p.faults = session.stats().faults;
        p.attempts = session.failed_attempts();
        p.retry_at = session.reconnect_at();
        if p.last_fault.as_ref() != last_fault {
            p.last_fault = last_fault.cloned();
        }
    }

    pub(crate) fn set_state(&self, s: ConnectionState) {
        let v = match s {
            ConnectionState::Connecting => STATE_CONNECTING,
            ConnectionState::Open => STATE_OPEN,
            ConnectionState::Closed => STATE_CLOSED,
        };
        self.inner.state.store(v, Ordering::Release);
    }

    /// A number naming this connection within its messenger.
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use msgr::{EntityName, Inbox, Message, Messenger, NullDispatcher};
    /// # let inbox = Inbox::new();
    /// # let server = Messenger::builder(EntityName::server(1)).without_env()
    /// #     .bind("tcp://127.0.0.1:0".parse()?).start(inbox.dispatcher())?;
    /// # let client = Messenger::builder(EntityName::client(1)).without_env()
    /// #     .start(Arc::new(NullDispatcher))?;
    /// # let conn = client.connect(server.addr().expect("bound"))?;
    /// // Every handle on one session has its id.
    /// assert_eq!(client.connect(server.addr().expect("bound"))?.id(), conn.id());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn id(&self) -> u64 {
        self.inner.key
    }

    /// The application's own state for this connection: made by `init`
    /// the first time it is asked for, then the same value for as long as
    /// the connection lives, shared by every handle on it. A dispatcher
    /// reaches it from the `&Connection` each callback gets, without a
    /// map keyed by [`Connection::id`]: one load and a type check. One
    /// value per connection: `None` if it was first made as another type
    /// (keep several things in one struct).
    ///
    /// ```
    /// use std::sync::atomic::{AtomicU64, Ordering};
    /// use msgr::{Connection, Dispatcher, Message};
    /// /// Messages received on each connection.
    /// struct Received(AtomicU64);
    /// struct Counting;
    /// impl Dispatcher for Counting {
    ///     fn on_message(&self, conn: &Connection, _msg: Message) {
    ///         if let Some(n) = conn.user_state(|| Received(AtomicU64::new(0))) {
    ///             n.0.fetch_add(1, Ordering::Relaxed);
    ///         }
    ///     }
    /// }
    /// ```
    pub fn user_state<T: std::any::Any + Send + Sync>(
        &self,
        init: impl FnOnce() -> T,
    ) -> Option<&T> {
        self.inner
            .user
            .get_or_init(|| Box::new(init()))
            .downcast_ref()
    }
}

/// The future of [`Connection::send_async`].
///
/// ```
/// # use std::{sync::Arc, time::Duration};
/// # use msgr::{EntityName, Inbox, Message, Messenger, NullDispatcher};
/// # let inbox = Inbox::new();
/// # let server = Messenger::builder(EntityName::server(1)).without_env()
/// #     .bind("tcp://127.0.0.1:0".parse()?).start(inbox.dispatcher())?;
/// # let client = Messenger::builder(EntityName::client(1)).without_env()
/// #     .start(Arc::new(NullDispatcher))?;
/// # let conn = client.connect(server.addr().expect("bound"))?;
/// let sent: msgr::SendFuture = conn.send_async(Message::new(1, &b"hi"[..], &b""[..]));
/// tokio::runtime::Runtime::new()?.block_on(sent)?;
/// assert!(inbox.recv_timeout(Duration::from_secs(10)).is_some());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct SendFuture {
    conn: Connection,
    msg: Option<Message>,
}

impl std::future::Future for SendFuture {
    type Output = Result<(), SendRejected>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let Some(msg) = self.msg.take() else {
            return std::task::Poll::Ready(Ok(()));
        };
        match self.conn.send_or_wait(msg, cx) {
            Ok(None) => std::task::Poll::Ready(Ok(())),
            Ok(Some(back)) => {
                self.msg = Some(back);
                std::task::Poll::Pending
            }
            Err(e) => std::task::Poll::Ready(Err(e)),
        }
    }
}
