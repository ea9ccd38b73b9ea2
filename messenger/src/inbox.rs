//! A dispatcher that queues: receive messages and connection events where
//! and when the application wants them — blocking, with a deadline, as a
//! future or as a `Stream` (futures-core's) — instead of in callbacks on the worker.
//!
//! [`Inbox`] is the channel form of [`Dispatcher`]: start a messenger with
//! it and take what arrives from any thread or task. Messages wait in the
//! inbox holding their share of the receive throttle (`rx_throttle_*`), so
//! an application that falls behind pauses reading from the network
//! rather than growing the queue: the worker never blocks on it. A
//! connection's messages can be taken apart ([`Inbox::connection`]).
//! Messages wait by priority class: a receive takes the most urgent class
//! first (an `Interactive` message does not wait behind queued bulk), and
//! within a class the order they came in, as the session delivered them.
//! Callbacks ([`Dispatcher`]) remain the zero-overhead path.
//!
//! ```
//! use std::time::Duration;
//! use msgr::{EntityName, Inbox, Message, Messenger, Policy};
//!
//! let inbox = Inbox::new();
//! let mut server = Messenger::builder(EntityName::server(1))
//!     .bind("tcp://127.0.0.1:0".parse().unwrap())
//!     .without_env()
//!     .start(inbox.dispatcher())
//!     .unwrap();
//! let mut client = Messenger::builder(EntityName::client(1))
//!     .without_env()
//!     .start(Inbox::new().dispatcher())
//!     .unwrap();
//! let conn = client.connect_with(server.addr().expect("bound"), Policy::LosslessClient).unwrap();
//! conn.send(Message::new(1, &b"hello"[..], &b""[..])).unwrap();
//! let (from, msg) = inbox.recv_timeout(Duration::from_secs(5)).expect("a message");
//! assert_eq!(&msg.front[..], b"hello");
//! assert_eq!(from.peer().unwrap().name, EntityName::client(1));
//! client.shutdown(Duration::from_secs(1));
//! server.shutdown(Duration::from_secs(1));
//! ```

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use futures_core::Stream;
use msgr_proto::priority::Priority;
use msgr_proto::{FaultReason, Message};

use crate::{Connection, Dispatcher};

/// What happened to a connection: the [`Dispatcher`] callbacks other than
/// `on_message`, as values.
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
/// use msgr::ConnectionEvent;
/// let (_, event) = inbox.next_event_timeout(Duration::from_secs(10)).expect("an event");
/// assert_eq!(event, ConnectionEvent::Accepted);
/// # drop(conn);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConnectionEvent {
    /// A connection this side opened is established.
    Connected,
    /// A connection from a peer is established.
    Accepted,
    /// An attempt to open a connection failed (a lossless one tries again).
    ConnectFailed(FaultReason),
    /// The connection ended; queued messages were dropped.
    Reset(FaultReason),
    /// The peer lost the session; the connection goes on as a new one.
    RemoteReset,
}

/// Queues of messages and events, filled by the worker, emptied by the
/// application. Cheap to clone (shared).
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
/// conn.send(Message::new(1, &b"hi"[..], &b""[..]))?;
/// let (from, msg) = inbox.recv_timeout(Duration::from_secs(10)).expect("delivered");
/// assert_eq!((&msg.front[..], from.peer().map(|p| p.name)), (&b"hi"[..], Some(EntityName::client(1))));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Default)]
pub struct Inbox {
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

/// Messages waiting, a queue per priority class: taken most urgent class
/// first, in arrival order within one.
struct ClassQueue<T>([VecDeque<T>; Priority::COUNT]);

impl<T> Default for ClassQueue<T> {
    fn default() -> Self {
        ClassQueue(std::array::from_fn(|_| VecDeque::new()))
    }
}

impl<T> ClassQueue<T> {
    fn push_back(&mut self, class: Priority, item: T) {
        self.0[class.index()].push_back(item);
    }

    fn pop_front(&mut self) -> Option<T> {
        self.0.iter_mut().find_map(VecDeque::pop_front)
    }
}

#[derive(Default)]
struct State {
    messages: ClassQueue<(Connection, Message)>,
    events: VecDeque<(Connection, ConnectionEvent)>,
    /// Messages of connections taken apart, by connection id.
    apart: HashMap<u64, ClassQueue<Message>>,
    wakers: Vec<Waker>,
    closed: bool,
}

impl State {
    fn wake(&mut self) -> Vec<Waker> {
        std::mem::take(&mut self.wakers)
    }
}

/// Which queue a receive takes from.
#[derive(Clone, Copy)]
enum Queue {
    Messages,
    Events,
    Apart(u64),
}

/// One item from a queue.
enum Item {
    Message(Connection, Message),
    Event(Connection, ConnectionEvent),
    Apart(Message),
}

impl Inbox {
    /// An empty inbox; give [`Inbox::dispatcher`] to a messenger.
    ///
    /// ```
    /// let inbox = msgr::Inbox::new();
    /// assert!(inbox.try_recv().is_none());
    /// ```
    pub fn new() -> Inbox {
        Inbox::default()
    }

    /// This inbox as the messenger's dispatcher.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use msgr::{EntityName, Inbox, Messenger};
    /// let inbox = Inbox::new();
    /// let m = Messenger::builder(EntityName::server(1)).without_env().start(inbox.dispatcher())?;
    /// drop(m); // its shutdown ends the inbox: receiving returns None at once
    /// assert!(inbox.recv_timeout(std::time::Duration::from_secs(60)).is_none());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn dispatcher(&self) -> Arc<dyn Dispatcher> {
        Arc::new(self.clone())
    }

    /// The next message (from a connection not taken apart), waiting at
    /// most `timeout`; `None` if none came, or the messenger shut down
    /// and the queue is empty.
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
    /// assert!(inbox.recv_timeout(Duration::from_millis(10)).is_none()); // nothing yet
    /// conn.send(Message::new(1, &b"hi"[..], &b""[..]))?;
    /// assert!(inbox.recv_timeout(Duration::from_secs(10)).is_some());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn recv_timeout(&self, timeout: Duration) -> Option<(Connection, Message)> {
        match self.take_blocking(Queue::Messages, timeout)? {
            Item::Message(c, m) => Some((c, m)),
            _ => None,
        }
    }

    /// The next message if one is queued.
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
    /// assert!(inbox.try_recv().is_none());
    /// conn.send(Message::new(1, &b"hi"[..], &b""[..]))?;
    /// // Poll, doing other work between looks, until a deadline.
    /// let deadline = std::time::Instant::now() + Duration::from_secs(10);
    /// let (_, msg) = loop {
    ///     if let Some(got) = inbox.try_recv() { break got; }
    ///     assert!(std::time::Instant::now() < deadline, "nothing came");
    ///     std::thread::sleep(Duration::from_millis(1));
    /// };
    /// assert_eq!(&msg.front[..], b"hi");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_recv(&self) -> Option<(Connection, Message)> {
        self.recv_timeout(Duration::ZERO)
    }

    /// The next message, as a future (`None` once the messenger shut down
    /// and the queue is empty).
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
    /// conn.send(Message::new(1, &b"hi"[..], &b""[..]))?;
    /// let (_, msg) = tokio::runtime::Runtime::new()?.block_on(inbox.recv_async()).expect("delivered");
    /// assert_eq!(&msg.front[..], b"hi");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn recv_async(&self) -> Recv<'_> {
        Recv {
            inbox: self,
            queue: Queue::Messages,
        }
    }

    /// The messages as a `Stream` (futures-core's); it ends when the messenger shuts down.
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
    /// conn.send(Message::new(1, &b"one"[..], &b""[..]))?;
    /// let mut messages = inbox.messages();
    /// let (_, msg) = tokio::runtime::Runtime::new()?.block_on(messages.next()).expect("delivered");
    /// assert_eq!(&msg.front[..], b"one");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn messages(&self) -> Messages {
        Messages {
            inbox: self.clone(),
        }
    }

    /// The next connection event, waiting at most `timeout`.
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
    /// use msgr::ConnectionEvent;
    /// let (accepted, event) = inbox.next_event_timeout(Duration::from_secs(10)).expect("an event");
    /// assert_eq!(event, ConnectionEvent::Accepted);
    /// assert_eq!(accepted.peer().map(|p| p.name), Some(EntityName::client(1)));
    /// # drop(conn);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn next_event_timeout(&self, timeout: Duration) -> Option<(Connection, ConnectionEvent)> {
        match self.take_blocking(Queue::Events, timeout)? {
            Item::Event(c, e) => Some((c, e)),
            _ => None,
        }
    }

    /// The connection events as a `Stream` (futures-core's); it ends when the messenger
    /// shuts down.
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
    /// use msgr::ConnectionEvent;
    /// let mut events = inbox.events();
    /// let (_, event) = tokio::runtime::Runtime::new()?.block_on(events.next()).expect("an event");
    /// assert_eq!(event, ConnectionEvent::Accepted);
    /// # drop(conn);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn events(&self) -> Events {
        Events {
            inbox: self.clone(),
        }
    }

    /// Takes `conn`'s messages apart from the others: from now on they
    /// queue in the returned [`ConnectionInbox`] (until it is dropped).
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
    /// use msgr::ConnectionEvent;
    /// let (accepted, _) = inbox.next_event_timeout(Duration::from_secs(10)).expect("accepted");
    /// let apart = inbox.connection(&accepted);
    /// conn.send(Message::new(1, &b"mine"[..], &b""[..]))?;
    /// assert_eq!(&apart.recv_timeout(Duration::from_secs(10)).expect("delivered").front[..], b"mine");
    /// assert!(inbox.try_recv().is_none()); // not in the shared queue
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn connection(&self, conn: &Connection) -> ConnectionInbox {
        self.shared
            .state
            .lock()
            .expect("inbox")
            .apart
            .entry(conn.id())
            .or_default();
        ConnectionInbox {
            inbox: self.clone(),
            id: conn.id(),
        }
    }

    fn pop(state: &mut State, q: Queue) -> Option<Item> {
        match q {
            Queue::Messages => state.messages.pop_front().map(|(c, m)| Item::Message(c, m)),
            Queue::Events => state.events.pop_front().map(|(c, e)| Item::Event(c, e)),
            Queue::Apart(id) => state.apart.get_mut(&id)?.pop_front().map(Item::Apart),
        }
    }

    fn take_blocking(&self, q: Queue, timeout: Duration) -> Option<Item> {
        let deadline = Instant::now() + timeout;
        let mut s = self.shared.state.lock().expect("inbox");
        loop {
            if let Some(item) = Inbox::pop(&mut s, q) {
                return Some(item);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if s.closed || left.is_zero() {
                return None;
            }
            s = self.shared.changed.wait_timeout(s, left).expect("inbox").0;
        }
    }

    fn poll_take(&self, q: Queue, cx: &mut Context<'_>) -> Poll<Option<Item>> {
        let mut s = self.shared.state.lock().expect("inbox");
        if let Some(item) = Inbox::pop(&mut s, q) {
            return Poll::Ready(Some(item));
        }
        if s.closed {
            return Poll::Ready(None);
        }
        if !s.wakers.iter().any(|w| w.will_wake(cx.waker())) {
            s.wakers.push(cx.waker().clone());
        }
        Poll::Pending
    }

    fn push(&self, f: impl FnOnce(&mut State)) {
        let wakers = {
            let mut s = self.shared.state.lock().expect("inbox");
            f(&mut s);
            s.wake()
        };
        self.shared.changed.notify_all();
        for w in wakers {
            w.wake();
        }
    }

    fn event(&self, conn: &Connection, e: ConnectionEvent) {
        let conn = conn.clone();
        self.push(|s| s.events.push_back((conn, e)));
    }
}

impl Dispatcher for Inbox {
    fn on_message(&self, conn: &Connection, msg: Message) {
        let id = conn.id();
        let conn = conn.clone();
        let class = msg.class();
        self.push(|s| match s.apart.get_mut(&id) {
            Some(q) => q.push_back(class, msg),
            None => s.messages.push_back(class, (conn, msg)),
        });
    }

    fn on_connect(&self, conn: &Connection) {
        self.event(conn, ConnectionEvent::Connected);
    }

    fn on_accept(&self, conn: &Connection) {
        self.event(conn, ConnectionEvent::Accepted);
    }

    fn on_connect_failed(&self, conn: &Connection, reason: &FaultReason) {
        self.event(conn, ConnectionEvent::ConnectFailed(reason.clone()));
    }

    fn on_reset(&self, conn: &Connection, reason: &FaultReason) {
        self.event(conn, ConnectionEvent::Reset(reason.clone()));
    }

    fn on_remote_reset(&self, conn: &Connection) {
        self.event(conn, ConnectionEvent::RemoteReset);
    }

    fn on_shutdown(&self) {
        self.push(|s| s.closed = true);
    }
}

/// One connection's messages, taken apart by [`Inbox::connection`].
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
/// let (accepted, _) = inbox.next_event_timeout(Duration::from_secs(10)).expect("accepted");
/// let apart: msgr::ConnectionInbox = inbox.connection(&accepted);
/// conn.send(Message::new(1, &b"x"[..], &b""[..]))?;
/// assert!(apart.recv_timeout(Duration::from_secs(10)).is_some());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct ConnectionInbox {
    inbox: Inbox,
    id: u64,
}

impl ConnectionInbox {
    /// The connection's next message, waiting at most `timeout`.
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
    /// let (accepted, _) = inbox.next_event_timeout(Duration::from_secs(10)).expect("accepted");
    /// let apart = inbox.connection(&accepted);
    /// assert!(apart.recv_timeout(Duration::from_millis(10)).is_none());
    /// conn.send(Message::new(1, &b"x"[..], &b""[..]))?;
    /// assert!(apart.recv_timeout(Duration::from_secs(10)).is_some());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn recv_timeout(&self, timeout: Duration) -> Option<Message> {
        match self.inbox.take_blocking(Queue::Apart(self.id), timeout)? {
            Item::Apart(m) => Some(m),
            _ => None,
        }
    }

    /// The connection's next message, as a future.
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
    /// let (accepted, _) = inbox.next_event_timeout(Duration::from_secs(10)).expect("accepted");
    /// let apart = inbox.connection(&accepted);
    /// conn.send(Message::new(1, &b"x"[..], &b""[..]))?;
    /// let msg = tokio::runtime::Runtime::new()?.block_on(apart.recv_async()).expect("delivered");
    /// assert_eq!(&msg.front[..], b"x");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn recv_async(&self) -> RecvApart<'_> {
        RecvApart { apart: self }
    }

    /// The connection's next message as a stream gives it; `None` once
    /// the messenger shut down (see [`Messages::next`]).
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
    /// let (accepted, _) = inbox.next_event_timeout(Duration::from_secs(10)).expect("accepted");
    /// let mut apart = inbox.connection(&accepted);
    /// conn.send(Message::new(1, &b"x"[..], &b""[..]))?;
    /// let msg = tokio::runtime::Runtime::new()?.block_on(apart.next()).expect("delivered");
    /// assert_eq!(msg.msg_type, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub async fn next(&mut self) -> Option<Message> {
        std::future::poll_fn(|cx| Pin::new(&mut *self).poll_next(cx)).await
    }
}

impl Stream for ConnectionInbox {
    type Item = Message;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Message>> {
        self.inbox
            .poll_take(Queue::Apart(self.id), cx)
            .map(|i| match i {
                Some(Item::Apart(m)) => Some(m),
                _ => None,
            })
    }
}

impl Drop for ConnectionInbox {
    fn drop(&mut self) {
        // Its messages go back to the common queue from now on; those
        // still queued apart are dropped with it.
        let mut s = self.inbox.shared.state.lock().expect("inbox");
        s.apart.remove(&self.id);
    }
}

/// The future of [`ConnectionInbox::recv_async`].
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
/// let (accepted, _) = inbox.next_event_timeout(Duration::from_secs(10)).expect("accepted");
/// let apart = inbox.connection(&accepted);
/// conn.send(Message::new(1, &b"x"[..], &b""[..]))?;
/// let fut: msgr::RecvApart<'_> = apart.recv_async();
/// assert!(tokio::runtime::Runtime::new()?.block_on(fut).is_some());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct RecvApart<'a> {
    apart: &'a ConnectionInbox,
}

impl Future for RecvApart<'_> {
    type Output = Option<Message>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let a = self.apart;
        a.inbox.poll_take(Queue::Apart(a.id), cx).map(|i| match i? {
            Item::Apart(m) => Some(m),
            _ => None,
        })
    }
}

/// The future of [`Inbox::recv_async`].
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
/// conn.send(Message::new(1, &b"x"[..], &b""[..]))?;
/// let fut: msgr::Recv<'_> = inbox.recv_async();
/// assert!(tokio::runtime::Runtime::new()?.block_on(fut).is_some());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Recv<'a> {
    inbox: &'a Inbox,
    queue: Queue,
}

impl Future for Recv<'_> {
    type Output = Option<(Connection, Message)>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inbox.poll_take(self.queue, cx).map(|i| match i? {
            Item::Message(c, m) => Some((c, m)),
            _ => None,
        })
    }
}

/// [`Inbox::messages`] as a `Stream` (futures-core's).
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
/// conn.send(Message::new(1, &b"x"[..], &b""[..]))?;
/// let mut stream: msgr::Messages = inbox.messages();
/// assert!(tokio::runtime::Runtime::new()?.block_on(stream.next()).is_some());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Messages {
    inbox: Inbox,
}

impl Messages {
    /// The next message and its connection; `None` once the messenger
    /// shut down. The common loop, with no stream combinator crate:
    ///
    /// ```no_run
    /// # async fn demo(inbox: msgr::Inbox) {
    /// let mut messages = inbox.messages();
    /// while let Some((conn, msg)) = messages.next().await {
    ///     let _ = conn.reply(&msg, msgr::Message::new(2, msg.front.clone(), &b""[..]));
    /// }
    /// # }
    /// ```
    pub async fn next(&mut self) -> Option<(Connection, Message)> {
        std::future::poll_fn(|cx| Pin::new(&mut *self).poll_next(cx)).await
    }
}

impl Stream for Messages {
    type Item = (Connection, Message);

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inbox.poll_take(Queue::Messages, cx).map(|i| match i? {
            Item::Message(c, m) => Some((c, m)),
            _ => None,
        })
    }
}

/// [`Inbox::events`] as a `Stream` (futures-core's).
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
/// let mut events: msgr::Events = inbox.events();
/// assert!(tokio::runtime::Runtime::new()?.block_on(events.next()).is_some());
/// # drop(conn);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Events {
    inbox: Inbox,
}

impl Events {
    /// The next connection event; `None` once the messenger shut down
    /// (see [`Messages::next`]).
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
    /// let mut events = inbox.events();
    /// let (_, event) = tokio::runtime::Runtime::new()?.block_on(events.next()).expect("an event");
    /// assert_eq!(event, msgr::ConnectionEvent::Accepted);
    /// # drop(conn);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub async fn next(&mut self) -> Option<(Connection, ConnectionEvent)> {
        std::future::poll_fn(|cx| Pin::new(&mut *self).poll_next(cx)).await
    }
}

impl Stream for Events {
    type Item = (Connection, ConnectionEvent);

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inbox.poll_take(Queue::Events, cx).map(|i| match i? {
            Item::Event(c, e) => Some((c, e)),
            _ => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The most urgent class first; arrival order within a class.
    #[test]
    fn a_class_queue_gives_the_most_urgent_class_first_in_order() {
        use Priority::{Background as B, Data as D, Interactive as I};
        let mut q = ClassQueue::default();
        for (class, n) in [(B, 1), (D, 2), (I, 3), (B, 4), (I, 5), (D, 6)] {
            q.push_back(class, n);
        }
        let order: Vec<i32> = std::iter::from_fn(|| q.pop_front()).collect();
        assert_eq!(order, [3, 5, 2, 6, 1, 4]);
        q.push_back(B, 7);
        assert_eq!(q.pop_front(), Some(7));
        assert_eq!(q.pop_front(), None);
    }
}
