//! The application's side of a messenger: callbacks for messages and
//! connection life-cycle events.

use msgr_proto::{FaultReason, Message};

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
