//! A dispatcher that queues: receive messages and connection events where
//! and when the application wants them — blocking, with a deadline, as a
//! future or as a [`Stream`] — instead of in callbacks on the worker.
//!
//! [`Inbox`] is the channel form of [`Dispatcher`]: start a messenger with
//! it and take what arrives from any thread or task. Messages wait in the
//! inbox holding their share of the receive throttle (`rx_throttle_*`), so
//! an application that falls behind pauses reading from the network
//! rather than growing the queue: the worker never blocks on it. A
//! connection's messages can be taken apart ([`Inbox::connection`]).
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
//! let conn = client.connect_with(server.addr(), Policy::LosslessClient).unwrap();
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
use msgr_proto::{FaultReason, Message};

use crate::{Connection, Dispatcher};

/// What happened to a connection: the [`Dispatcher`] callbacks other than
/// `on_message`, as values.
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
#[derive(Clone, Default)]
pub struct Inbox {
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Default)]
struct State {
    messages: VecDeque<(Connection, Message)>,
    events: VecDeque<(Connection, ConnectionEvent)>,
    /// Messages of connections taken apart, by connection id.
    apart: HashMap<u64, VecDeque<Message>>,
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
    pub fn new() -> Inbox {
        Inbox::default()
    }

    /// This inbox as the messenger's dispatcher.
    pub fn dispatcher(&self) -> Arc<dyn Dispatcher> {
        Arc::new(self.clone())
    }

    /// The next message (from a connection not taken apart), waiting at
    /// most `timeout`; `None` if none came, or the messenger shut down
    /// and the queue is empty.
    pub fn recv_timeout(&self, timeout: Duration) -> Option<(Connection, Message)> {
        match self.take_blocking(Queue::Messages, timeout)? {
            Item::Message(c, m) => Some((c, m)),
            _ => None,
        }
    }

    /// The next message if one is queued.
    pub fn try_recv(&self) -> Option<(Connection, Message)> {
        self.recv_timeout(Duration::ZERO)
    }

    /// The next message, as a future (`None` once the messenger shut down
    /// and the queue is empty).
    pub fn recv_async(&self) -> Recv<'_> {
        Recv {
            inbox: self,
            queue: Queue::Messages,
        }
    }

    /// The messages as a [`Stream`]; it ends when the messenger shuts down.
    pub fn messages(&self) -> Messages {
        Messages {
            inbox: self.clone(),
        }
    }

    /// The next connection event, waiting at most `timeout`.
    pub fn next_event_timeout(&self, timeout: Duration) -> Option<(Connection, ConnectionEvent)> {
        match self.take_blocking(Queue::Events, timeout)? {
            Item::Event(c, e) => Some((c, e)),
            _ => None,
        }
    }

    /// The connection events as a [`Stream`]; it ends when the messenger
    /// shuts down.
    pub fn events(&self) -> Events {
        Events {
            inbox: self.clone(),
        }
    }

    /// Takes `conn`'s messages apart from the others: from now on they
    /// queue in the returned [`ConnectionInbox`] (until it is dropped).
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
        self.push(|s| match s.apart.get_mut(&id) {
            Some(q) => q.push_back(msg),
            None => s.messages.push_back((conn, msg)),
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
pub struct ConnectionInbox {
    inbox: Inbox,
    id: u64,
}

impl ConnectionInbox {
    /// The connection's next message, waiting at most `timeout`.
    pub fn recv_timeout(&self, timeout: Duration) -> Option<Message> {
        match self.inbox.take_blocking(Queue::Apart(self.id), timeout)? {
            Item::Apart(m) => Some(m),
            _ => None,
        }
    }

    /// The connection's next message, as a future.
    pub fn recv_async(&self) -> RecvApart<'_> {
        RecvApart { apart: self }
    }

    /// The connection's next message as a stream gives it; `None` once
    /// the messenger shut down (see [`Messages::next`]).
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

/// [`Inbox::messages`] as a [`Stream`].
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

/// [`Inbox::events`] as a [`Stream`].
pub struct Events {
    inbox: Inbox,
}

impl Events {
    /// The next connection event; `None` once the messenger shut down
    /// (see [`Messages::next`]).
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
