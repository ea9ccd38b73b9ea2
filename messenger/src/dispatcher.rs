//! The application's side of a messenger: callbacks for messages and
//! connection life-cycle events.

use msgr_proto::message::REPLY_BIT;
use msgr_proto::rma::RMA_BIT;
use msgr_proto::view::BatchEntries;
use msgr_proto::{FaultReason, Message, MessageRef};

use crate::config::HandlerPanicPolicy;
use crate::Connection;

/// Receives what a [`crate::Messenger`] delivers.
///
/// Callbacks run on the messenger's worker thread that owns the connection, in
/// order per connection. Keep them short: a slow callback delays every
/// connection of that worker. Sending from a callback is cheap (no wake-up).
///
/// ```
/// use msgr::{Connection, Dispatcher, Message};
/// struct Echo;
/// impl Dispatcher for Echo {
///     fn on_message(&self, conn: &Connection, msg: Message) {
///         let _ = conn.send(msg); // echo it back
///     }
/// }
/// ```
pub trait Dispatcher: Send + Sync + 'static {
    /// A message arrived (in order; exactly once on lossless connections).
    ///
    /// ```
    /// # use std::{sync::{mpsc, Arc, Mutex}, time::Duration};
    /// # use msgr::{Connection, Dispatcher, EntityName, FaultReason, Message, Messenger, NullDispatcher};
    /// /// Tells a channel what happened.
    /// struct Log(Mutex<mpsc::Sender<String>>);
    /// impl Log {
    ///     fn say(&self, what: String) { let _ = self.0.lock().unwrap().send(what); }
    /// }
    /// impl Dispatcher for Log {
    ///     fn on_message(&self, _conn: &Connection, msg: Message) {
    ///         self.say(String::from_utf8_lossy(&msg.front).into_owned());
    ///     }
    /// }
    /// let (tx, rx) = mpsc::channel();
    /// let server = Messenger::builder(EntityName::server(1)).without_env()
    ///     .bind("tcp://127.0.0.1:0".parse()?).start(Arc::new(Log(Mutex::new(tx))))?;
    /// let client = Messenger::builder(EntityName::client(1)).without_env()
    ///     .start(Arc::new(NullDispatcher))?;
    /// let conn = client.connect(server.addr().expect("bound"))?;
    /// conn.send(Message::new(1, &b"hi"[..], &b""[..]))?;
    /// assert_eq!(rx.recv_timeout(Duration::from_secs(10))?, "hi");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn on_message(&self, conn: &Connection, msg: Message);

    /// Messages that arrived together in one batch frame, in order, as
    /// views of the frame's buffer ([`MessageRef`]): nothing is built,
    /// copied or counted per message to hand them over. Take what you
    /// like from `messages`; whatever is left when this returns goes to
    /// [`Dispatcher::on_message`], one by one and in order, so every
    /// message is delivered once either way. The default takes none.
    ///
    /// Order holds across both callbacks: a batch may be handed over in
    /// several calls (a reply or an RMA operation among its messages
    /// goes to its caller between them), and messages that did not
    /// arrive in a batch frame (large ones sent in fragments, a lone
    /// message frame) come to `on_message` alone. Keep one with
    /// [`MessageRef::to_message`] (no copy: it shares the buffer).
    ///
    /// ```
    /// # use std::{sync::{Arc, atomic::{AtomicU64, Ordering}}, time::{Duration, Instant}};
    /// use msgr::{Connection, Dispatcher, EntityName, Message, MessageRefs, Messenger, NullDispatcher};
    /// /// Counts the bytes of type-1 messages without building a `Message`.
    /// #[derive(Default)]
    /// struct Count(AtomicU64);
    /// impl Dispatcher for Count {
    ///     fn on_message(&self, _: &Connection, msg: Message) {
    ///         if msg.msg_type == 1 {
    ///             self.0.fetch_add(msg.data.len() as u64, Ordering::Relaxed);
    ///         }
    ///     }
    ///     fn on_batch(&self, _: &Connection, messages: &mut MessageRefs<'_>) {
    ///         let mut bytes = 0;
    ///         for m in messages.filter(|m| m.msg_type == 1) {
    ///             bytes += m.data.len() as u64;
    ///         }
    ///         self.0.fetch_add(bytes, Ordering::Relaxed);
    ///     }
    /// }
    /// let count = Arc::new(Count::default());
    /// let server = Messenger::builder(EntityName::server(1)).without_env()
    ///     .bind("tcp://127.0.0.1:0".parse()?).start(count.clone())?;
    /// let client = Messenger::builder(EntityName::client(1)).without_env()
    ///     .start(Arc::new(NullDispatcher))?;
    /// let conn = client.connect(server.addr().expect("bound"))?;
    /// conn.send_batch((0..100).map(|_| Message::new(1, &b""[..], &[0u8; 64][..])).collect())?;
    /// let deadline = Instant::now() + Duration::from_secs(10);
    /// while count.0.load(Ordering::Relaxed) < 6400 && Instant::now() < deadline {
    ///     std::thread::sleep(Duration::from_millis(5));
    /// }
    /// assert_eq!(count.0.load(Ordering::Relaxed), 6400);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn on_batch(&self, conn: &Connection, messages: &mut MessageRefs<'_>) {
        let _ = (conn, messages);
    }

    /// A connection this side opened is established.
    ///
    /// ```
    /// # use std::{sync::{mpsc, Arc, Mutex}, time::Duration};
    /// # use msgr::{Connection, Dispatcher, EntityName, FaultReason, Message, Messenger, NullDispatcher};
    /// /// Tells a channel what happened.
    /// struct Log(Mutex<mpsc::Sender<String>>);
    /// impl Log {
    ///     fn say(&self, what: String) { let _ = self.0.lock().unwrap().send(what); }
    /// }
    /// impl Dispatcher for Log {
    ///     fn on_message(&self, _: &Connection, _: Message) {}
    ///     fn on_connect(&self, conn: &Connection) {
    ///         self.say(format!("connected to {}", conn.peer().unwrap().name));
    ///     }
    /// }
    /// let (tx, rx) = mpsc::channel();
    /// let server = Messenger::builder(EntityName::server(1)).without_env()
    ///     .bind("tcp://127.0.0.1:0".parse()?).start(Arc::new(NullDispatcher))?;
    /// let client = Messenger::builder(EntityName::client(1)).without_env()
    ///     .start(Arc::new(Log(Mutex::new(tx))))?;
    /// let _conn = client.connect(server.addr().expect("bound"))?;
    /// assert_eq!(rx.recv_timeout(Duration::from_secs(10))?, "connected to server.1");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn on_connect(&self, conn: &Connection) {
        let _ = conn;
    }

    /// A connection from a peer is established.
    ///
    /// ```
    /// # use std::{sync::{mpsc, Arc, Mutex}, time::Duration};
    /// # use msgr::{Connection, Dispatcher, EntityName, FaultReason, Message, Messenger, NullDispatcher};
    /// /// Tells a channel what happened.
    /// struct Log(Mutex<mpsc::Sender<String>>);
    /// impl Log {
    ///     fn say(&self, what: String) { let _ = self.0.lock().unwrap().send(what); }
    /// }
    /// impl Dispatcher for Log {
    ///     fn on_message(&self, _: &Connection, _: Message) {}
    ///     fn on_accept(&self, conn: &Connection) {
    ///         self.say(format!("accepted {}", conn.peer().unwrap().name));
    ///     }
    /// }
    /// let (tx, rx) = mpsc::channel();
    /// let server = Messenger::builder(EntityName::server(1)).without_env()
    ///     .bind("tcp://127.0.0.1:0".parse()?).start(Arc::new(Log(Mutex::new(tx))))?;
    /// let client = Messenger::builder(EntityName::client(1)).without_env()
    ///     .start(Arc::new(NullDispatcher))?;
    /// let conn = client.connect(server.addr().expect("bound"))?;
    /// assert_eq!(rx.recv_timeout(Duration::from_secs(10))?, "accepted client.1");
    /// # drop(conn);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn on_accept(&self, conn: &Connection) {
        let _ = conn;
    }

    /// An attempt to open a connection this side opened failed, before it
    /// was ever established: nothing listens there, the handshake failed or
    /// timed out, the peer is not an msgr endpoint... Called for each
    /// attempt. A lossless connection tries again after its backoff (until
    /// `connect_timeout_ms`, if set, ends it with `on_reset`); a lossy one
    /// ends (`on_reset` follows). See also [`Connection::wait_connected`].
    ///
    /// ```
    /// # use std::{sync::{mpsc, Arc, Mutex}, time::Duration};
    /// # use msgr::{Connection, Dispatcher, EntityName, FaultReason, Message, Messenger, NullDispatcher};
    /// /// Tells a channel what happened.
    /// struct Log(Mutex<mpsc::Sender<String>>);
    /// impl Log {
    ///     fn say(&self, what: String) { let _ = self.0.lock().unwrap().send(what); }
    /// }
    /// impl Dispatcher for Log {
    ///     fn on_message(&self, _: &Connection, _: Message) {}
    ///     fn on_connect_failed(&self, conn: &Connection, _reason: &FaultReason) {
    ///         self.say(format!("{} did not answer", conn.target()));
    ///     }
    /// }
    /// let (tx, rx) = mpsc::channel();
    /// let client = Messenger::builder(EntityName::client(1)).without_env()
    ///     .start(Arc::new(Log(Mutex::new(tx))))?;
    /// // A port nobody listens on (bound, then closed).
    /// let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    /// let conn = client.connect(&format!("tcp://127.0.0.1:{port}").parse()?)?;
    /// assert_eq!(rx.recv_timeout(Duration::from_secs(10))?, format!("{} did not answer", conn.target()));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn on_connect_failed(&self, conn: &Connection, reason: &FaultReason) {
        let _ = (conn, reason);
    }

    /// The connection ended: lossy fault, peer close, mark-down, or a lossless
    /// server session whose peer never came back. Queued messages were dropped.
    ///
    /// ```
    /// # use std::{sync::{mpsc, Arc, Mutex}, time::Duration};
    /// # use msgr::{Connection, Dispatcher, EntityName, FaultReason, Message, Messenger, NullDispatcher};
    /// /// Tells a channel what happened.
    /// struct Log(Mutex<mpsc::Sender<String>>);
    /// impl Log {
    ///     fn say(&self, what: String) { let _ = self.0.lock().unwrap().send(what); }
    /// }
    /// impl Dispatcher for Log {
    ///     fn on_message(&self, _: &Connection, _: Message) {}
    ///     fn on_reset(&self, _conn: &Connection, reason: &FaultReason) {
    ///         self.say(format!("reset: {reason:?}"));
    ///     }
    /// }
    /// let (tx, rx) = mpsc::channel();
    /// let server = Messenger::builder(EntityName::server(1)).without_env()
    ///     .bind("tcp://127.0.0.1:0".parse()?).start(Arc::new(NullDispatcher))?;
    /// let client = Messenger::builder(EntityName::client(1)).without_env()
    ///     .start(Arc::new(Log(Mutex::new(tx))))?;
    /// client.connect(server.addr().expect("bound"))?.mark_down();
    /// assert_eq!(rx.recv_timeout(Duration::from_secs(10))?, "reset: MarkedDown");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn on_reset(&self, conn: &Connection, reason: &FaultReason) {
        let _ = (conn, reason);
    }

    /// The peer lost the session (it restarted or reset it): unacknowledged
    /// messages were dropped, and the connection continues as a new session.
    ///
    /// ```
    /// # use std::{sync::{mpsc, Arc, Mutex}, time::Duration};
    /// # use msgr::{Connection, Dispatcher, EntityName, FaultReason, Message, Messenger, NullDispatcher};
    /// /// Tells a channel what happened.
    /// struct Log(Mutex<mpsc::Sender<String>>);
    /// impl Log {
    ///     fn say(&self, what: String) { let _ = self.0.lock().unwrap().send(what); }
    /// }
    /// impl Dispatcher for Log {
    ///     fn on_message(&self, _: &Connection, _: Message) {}
    ///     fn on_remote_reset(&self, _conn: &Connection) {
    ///         // Whatever the peer had not acknowledged is lost: resend state.
    ///         self.say("the server lost our session".into());
    ///     }
    /// }
    /// let (tx, rx) = mpsc::channel();
    /// let client = Messenger::builder(EntityName::client(1)).without_env()
    ///     .start(Arc::new(Log(Mutex::new(tx))))?;
    /// let inbox = msgr::Inbox::new();
    /// let server = Messenger::builder(EntityName::server(1)).without_env()
    ///     .bind("tcp://127.0.0.1:0".parse()?).start(inbox.dispatcher())?;
    /// let _conn = client.connect(server.addr().expect("bound"))?;
    /// // The server drops its side of the session; the client's reconnect learns it.
    /// let (accepted, _) = inbox.next_event_timeout(Duration::from_secs(10)).expect("accepted");
    /// accepted.mark_down();
    /// assert_eq!(rx.recv_timeout(Duration::from_secs(10))?, "the server lost our session");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn on_remote_reset(&self, conn: &Connection) {
        let _ = conn;
    }

    /// The messenger shut down: nothing more will be delivered (an
    /// [`crate::Inbox`] ends its streams here). Called once, from the
    /// thread that called `shutdown`.
    ///
    /// ```
    /// # use std::{sync::{mpsc, Arc, Mutex}, time::Duration};
    /// # use msgr::{Connection, Dispatcher, EntityName, FaultReason, Message, Messenger, NullDispatcher};
    /// /// Tells a channel what happened.
    /// struct Log(Mutex<mpsc::Sender<String>>);
    /// impl Log {
    ///     fn say(&self, what: String) { let _ = self.0.lock().unwrap().send(what); }
    /// }
    /// impl Dispatcher for Log {
    ///     fn on_message(&self, _: &Connection, _: Message) {}
    ///     fn on_shutdown(&self) {
    ///         self.say("shut down".into());
    ///     }
    /// }
    /// let (tx, rx) = mpsc::channel();
    /// let mut m = Messenger::builder(EntityName::client(1)).without_env()
    ///     .start(Arc::new(Log(Mutex::new(tx))))?;
    /// m.shutdown(Duration::from_secs(1));
    /// assert_eq!(rx.try_recv()?, "shut down");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn on_shutdown(&self) {}
}

/// The messages of a batch frame handed to [`Dispatcher::on_batch`]: an
/// iterator of [`MessageRef`]s, in order, borrowed from the frame's
/// buffer for the length of the call. It ends before a reply or an RMA
/// operation, which the messenger routes to its caller itself (the
/// messages after it come in the next call).
///
/// ```
/// use msgr::{Connection, Dispatcher, Message, MessageRefs};
/// struct Sum;
/// impl Dispatcher for Sum {
///     fn on_message(&self, _: &Connection, _: Message) {}
///     fn on_batch(&self, _: &Connection, messages: &mut MessageRefs<'_>) {
///         let total: usize = messages.map(|m| m.payload_len()).sum();
///         println!("{total} bytes");
///     }
/// }
/// ```
#[derive(Debug)]
pub struct MessageRefs<'a> {
    entries: BatchEntries<'a>,
    /// The entry that ended the run: a reply or an RMA operation.
    held: Option<MessageRef<'a>>,
}

impl<'a> MessageRefs<'a> {
    pub(crate) fn new(entries: BatchEntries<'a>) -> Self {
        MessageRefs {
            entries,
            held: None,
        }
    }

    /// Whether a message for the application comes next (else a reply
    /// or an RMA operation is held for [`MessageRefs::take_held`], or
    /// the batch is done).
    pub(crate) fn starts_a_run(&mut self) -> bool {
        if self.held.is_some() {
            return false;
        }
        match self.entries.clone().next() {
            Some(m) if !routed_apart(&m) => true,
            Some(_) => {
                self.held = self.entries.next();
                false
            }
            None => false,
        }
    }

    /// The reply or RMA operation that ended the run, if one did.
    pub(crate) fn take_held(&mut self) -> Option<MessageRef<'a>> {
        self.held.take()
    }

    /// Entries of the batch not taken yet (the run's and those after).
    pub(crate) fn entries_left(&self) -> usize {
        self.entries.len() + usize::from(self.held.is_some())
    }
}

impl<'a> Iterator for MessageRefs<'a> {
    type Item = MessageRef<'a>;

    #[inline]
    fn next(&mut self) -> Option<MessageRef<'a>> {
        if self.held.is_some() {
            return None;
        }
        let m = self.entries.next()?;
        if routed_apart(&m) {
            self.held = Some(m);
            return None;
        }
        Some(m)
    }
}

/// A reply or an RMA operation: the messenger's to route, not the
/// application's to handle.
#[inline]
fn routed_apart(m: &MessageRef<'_>) -> bool {
    m.call & (REPLY_BIT | RMA_BIT) != 0
}

/// A callback panicked (see [`HandlerPanicPolicy`]); the panic's message.
#[derive(Debug)]
pub(crate) struct Panicked(pub(crate) String);

/// Runs one dispatcher callback, catching a panic: logged with `conn` and
/// `what` was delivered, counted in `panics`, then by `policy` the process
/// aborts or the caller gets [`Panicked`] to end the connection. Costs
/// nothing on the path that does not panic (unwinding is table-driven).
pub(crate) fn guarded(
    policy: HandlerPanicPolicy,
    panics: &std::sync::atomic::AtomicU64,
    conn: &Connection,
    what: impl FnOnce() -> String,
    callback: impl FnOnce(),
) -> Result<(), Panicked> {
    let Err(payload) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(callback)) else {
        return Ok(());
    };
    let message = panic_message(payload.as_ref());
    panics.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let what = what();
    tracing::error!(
        connection = conn.id(),
        target = %conn.target(),
        delivering = %what,
        panic = %message,
        "a dispatcher callback panicked"
    );
    if policy == HandlerPanicPolicy::Abort {
        eprintln!(
            "msgr: a dispatcher callback panicked delivering {} on connection {} ({}): {message}; \
             aborting (on_handler_panic = abort)",
            what,
            conn.id(),
            conn.target()
        );
        std::process::abort();
    }
    Err(Panicked(message))
}

/// The message a panic carried (`panic!("...")` gives a `&str` or a
/// `String`), or a placeholder.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

/// A dispatcher that drops everything (for send-only messengers).
///
/// ```
/// use std::sync::Arc;
/// use msgr::{EntityName, Messenger, NullDispatcher};
/// // A client that only sends needs no callbacks.
/// let m = Messenger::builder(EntityName::client(1)).without_env().start(Arc::new(NullDispatcher))?;
/// assert!(m.connections().is_empty());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Default, Clone, Copy)]
pub struct NullDispatcher;

impl Dispatcher for NullDispatcher {
    fn on_message(&self, _conn: &Connection, _msg: Message) {}
}
