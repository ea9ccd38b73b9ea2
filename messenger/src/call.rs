//! Request/response over a connection: [`Connection::call`] sends a
//! request and waits for its reply; the peer answers with
//! [`Connection::reply`].
//!
//! The correlation travels in the message header (`Message::call`, bytes
//! 24..32, between peers that agreed `features::CALLS`): a request carries
//! a call id, its reply the same id with bit 63 set. A reply goes to the
//! caller that waits for it, never to the [`crate::Dispatcher`]; one whose
//! caller gave up (timed out, dropped its future) is dropped and counted
//! (`late_replies`). A reset connection fails its pending calls with
//! [`CallError::Reset`]. On a lossless connection a request and its reply
//! are messages like any other: each is delivered exactly once, across
//! reconnects.
//!
//! The waiting costs the plain message path one branch per received
//! message (is it a reply?); the table of pending calls is touched only by
//! calls.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use msgr_proto::{CodecError, Message, TypedError, TypedMessage};

use crate::affinity::OnCpu;
use crate::pending::{Queued, SendError, SendRejected};
use crate::replies::{Answer, CallError, CallSlot};
use crate::Connection;

/// Why a typed call ([`Connection::call_typed`]) failed: one error type for
/// the request's encoding, the call and the reply's decoding.
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
/// use msgr::{TypedCallError, TypedMessage};
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct Ping;
/// impl TypedMessage for Ping { const TYPE: u16 = 12; }
/// // The server never replies.
/// let err = conn.call_typed::<Ping, Ping>(&Ping, Duration::from_millis(100));
/// assert!(matches!(err, Err(TypedCallError::Call(msgr::CallError::Timeout { .. }))));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TypedCallError {
    /// The request did not encode.
    #[error("the request did not encode: {0}")]
    Encode(#[from] CodecError),
    /// No reply: timeout, reset, or the request was not sent.
    #[error(transparent)]
    Call(#[from] CallError),
    /// The reply is not the type asked for, or does not decode.
    #[error("the reply did not decode: {0}")]
    Decode(#[from] TypedError),
}

msgr_addr::debug_is_display!(TypedCallError);

impl Connection {
    /// Call `id`'s deadline passed (worker, for async calls).
    pub(crate) fn expire_call(&self, id: u64) {
        self.inner
            .calls
            .expire(id, |after| self.call_timed_out(after));
    }

    /// A call of timeout `after` got no reply in time: with why the link
    /// failed if the connection is not open now.
    pub(crate) fn call_timed_out(&self, after: Duration) -> CallError {
        let st = self.status();
        CallError::Timeout {
            after,
            last_fault: st
                .last_fault
                .filter(|_| st.state != crate::ConnectionState::Open),
        }
    }

    /// Sends `request` and waits for the peer's [`Connection::reply`] to
    /// it, at most `timeout` (sending included: a full send queue counts
    /// against it). Blocks the calling thread: not from a dispatcher
    /// callback, whose worker delivers the reply (use
    /// [`Connection::call_async`] or another thread): from the callback of
    /// the worker that owns the connection it fails at once with
    /// [`CallError::WouldDeadlock`].
    ///
    /// ```no_run
    /// # fn demo(conn: &msgr::Connection) -> Result<(), msgr::CallError> {
    /// use std::time::Duration;
    /// let reply = conn.call(msgr::Message::new(1, &b"ping"[..], &b""[..]), Duration::from_secs(1))?;
    /// println!("{} bytes back", reply.front.len());
    /// # Ok(()) }
    /// ```
    pub fn call(&self, request: Message, timeout: Duration) -> Result<Message, CallError> {
        self.call_answered(request, timeout)
    }

    /// [`Connection::call`] answered by a `T`: a reply `Message`, or an
    /// RMA operation's answer (its id marked `RMA_BIT`, answered by the
    /// peer's messenger or carried out natively).
    pub(crate) fn call_answered<T: Answer>(
        &self,
        mut request: T::Request,
        timeout: Duration,
    ) -> Result<T, CallError> {
        if self.inner.on_owning_worker() {
            return Err(CallError::WouldDeadlock);
        }
        let deadline = Instant::now() + timeout;
        let calls = &self.inner.calls;
        let (id, slot) = calls.register::<T>(timeout);
        request.set_call(id);
        if let Err(e) = self.queue_timeout(request, timeout) {
            calls.forget(id);
            return Err(e.into());
        }
        self.spin_for(&slot, timeout);
        let mut s = slot.state.lock().expect("call slot");
        loop {
            if let Some(outcome) = s.outcome.take() {
                return outcome;
            }
            slot.parked.store(true, Ordering::Release);
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                drop(s);
                calls.forget(id);
                // A reply may have landed between the wait and the forget.
                let late = slot.state.lock().expect("call slot").outcome.take();
                return late.unwrap_or_else(|| Err(self.call_timed_out(timeout)));
            }
            s = slot.ready.wait_timeout(s, left).expect("call slot").0;
        }
    }

    /// Before a blocking caller parks: spins on `slot` for up to
    /// `call_spin_us` (at most `timeout`), only while the connection's
    /// worker is awake — busy-polling or working, so the reply is taken
    /// as soon as it arrives — and the process's CPUs leave one spare
    /// beside this caller, its workers and its other spinning callers
    /// (`crate::affinity::OnCpu`).
    fn spin_for<T>(&self, slot: &CallSlot<T>, timeout: Duration) {
        let window = self.inner.shared.cfg.call_spin.min(timeout);
        let worker = &self.inner.shared.workers[self.inner.worker];
        if window.is_zero() || worker.is_asleep() {
            return;
        }
        if let Some(_cpu) = OnCpu::spare() {
            slot.spin(window, || worker.is_asleep());
        }
    }

    /// [`Connection::call`] as a future, for async code on any executor:
    /// waits for queue room without blocking, and for the reply; the
    /// timeout is kept by the connection's worker (no timer of the
    /// executor's is needed). Dropping the future forgets the call (a
    /// reply that comes anyway is dropped and counted).
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
    /// # std::thread::spawn(move || {
    /// #     if let Some((c, req)) = inbox.recv_timeout(Duration::from_secs(10)) {
    /// #         c.reply(&req, Message::new(2, &b"pong"[..], &b""[..])).unwrap();
    /// #     }
    /// # });
    /// let call = conn.call_async(Message::new(1, &b"ping"[..], &b""[..]), Duration::from_secs(10));
    /// let reply = tokio::runtime::Runtime::new()?.block_on(call)?;
    /// assert_eq!(&reply.front[..], b"pong");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn call_async(&self, request: Message, timeout: Duration) -> CallFuture {
        CallFuture(self.call_async_answered(request, timeout))
    }

    /// A typed call: encodes `request` (its [`TypedMessage::TYPE`]), waits
    /// for the reply at most `timeout` as [`Connection::call`] does, and
    /// decodes it as `Resp` (checking its type).
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # use serde::{Deserialize, Serialize};
    /// use msgr::{Connection, TypedCallError, TypedMessage};
    /// #[derive(Serialize, Deserialize)]
    /// struct Get(String);
    /// impl TypedMessage for Get { const TYPE: u16 = 1; }
    /// #[derive(Serialize, Deserialize)]
    /// struct Value(Option<Vec<u8>>);
    /// impl TypedMessage for Value { const TYPE: u16 = 2; }
    ///
    /// fn get(conn: &Connection, key: &str) -> Result<Option<Vec<u8>>, TypedCallError> {
    ///     let Value(v) = conn.call_typed(&Get(key.into()), Duration::from_secs(1))?;
    ///     Ok(v)
    /// }
    /// ```
    pub fn call_typed<Req: TypedMessage, Resp: TypedMessage>(
        &self,
        request: &Req,
        timeout: Duration,
    ) -> Result<Resp, TypedCallError> {
        let reply = self.call(Message::typed(request)?, timeout)?;
        Ok(reply.decode_typed()?)
    }

    /// [`Connection::call_typed`] as a future (see [`Connection::call_async`]).
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
    /// use msgr::TypedMessage;
    /// #[derive(serde::Serialize, serde::Deserialize)]
    /// struct Double(u32);
    /// impl TypedMessage for Double { const TYPE: u16 = 10; }
    /// # std::thread::spawn(move || {
    /// #     if let Some((c, req)) = inbox.recv_timeout(Duration::from_secs(10)) {
    /// #         let Double(n) = req.decode_typed().unwrap();
    /// #         c.reply_typed(&req, &Double(2 * n)).unwrap();
    /// #     }
    /// # });
    /// let rt = tokio::runtime::Runtime::new()?;
    /// let Double(n) = rt.block_on(conn.call_typed_async(&Double(21), Duration::from_secs(10)))?;
    /// assert_eq!(n, 42);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub async fn call_typed_async<Req: TypedMessage, Resp: TypedMessage>(
        &self,
        request: &Req,
        timeout: Duration,
    ) -> Result<Resp, TypedCallError> {
        let reply = self.call_async(Message::typed(request)?, timeout).await?;
        Ok(reply.decode_typed()?)
    }

    /// Answers `request` with `reply` encoded as its type (see
    /// [`Connection::reply`]).
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
    /// use msgr::TypedMessage;
    /// #[derive(serde::Serialize, serde::Deserialize)]
    /// struct Len(usize);
    /// impl TypedMessage for Len { const TYPE: u16 = 11; }
    /// // The server side: answer each request with its length.
    /// std::thread::spawn(move || {
    ///     if let Some((c, req)) = inbox.recv_timeout(Duration::from_secs(10)) {
    ///         c.reply_typed(&req, &Len(req.front.len())).unwrap();
    ///     }
    /// });
    /// let reply = conn.call(Message::new(1, &b"four"[..], &b""[..]), Duration::from_secs(10))?;
    /// let Len(n) = reply.decode_typed()?;
    /// assert_eq!(n, 4);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reply_typed<Resp: TypedMessage>(
        &self,
        request: &Message,
        reply: &Resp,
    ) -> Result<(), TypedCallError> {
        let m = Message::typed(reply)?;
        Ok(self.reply(request, m).map_err(CallError::from)?)
    }

    /// [`Connection::call_async`] answered by a `T` (see
    /// [`Connection::call_answered`]).
    pub(crate) fn call_async_answered<T: Answer>(
        &self,
        request: T::Request,
        timeout: Duration,
    ) -> AnswerFuture<T> {
        AnswerFuture {
            conn: self.clone(),
            request: Some(request),
            timeout,
            call: None,
        }
    }

    /// Answers `request` (a message that came with a call, see
    /// [`Message::call_id`]) with `reply`; the caller's
    /// [`Connection::call`] returns it. A refused reply comes back in the
    /// error (marked as the reply, except for [`SendError::NotARequest`]).
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
    /// // The server side: answer each request with its text upper-cased.
    /// std::thread::spawn(move || {
    ///     if let Some((c, req)) = inbox.recv_timeout(Duration::from_secs(10)) {
    ///         let up = req.front.to_ascii_uppercase();
    ///         c.reply(&req, Message::new(2, up, Vec::new())).unwrap();
    ///     }
    /// });
    /// let reply = conn.call(Message::new(1, &b"hi"[..], &b""[..]), Duration::from_secs(10))?;
    /// assert_eq!(&reply.front[..], b"HI");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reply(&self, request: &Message, reply: Message) -> Result<(), SendRejected> {
        match request.call_id() {
            Some((_, false)) => self.send(reply.replying_to(request)),
            _ => Err(SendRejected {
                error: SendError::NotARequest,
                message: reply,
            }),
        }
    }
}

/// The future of [`Connection::call_async`]. Polled again after it
/// completed, it is ready with [`CallError::Finished`].
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
/// # std::thread::spawn(move || {
/// #     if let Some((c, req)) = inbox.recv_timeout(Duration::from_secs(10)) {
/// #         c.reply(&req, Message::new(2, &b"pong"[..], &b""[..])).unwrap();
/// #     }
/// # });
/// let fut: msgr::CallFuture = conn.call_async(Message::new(1, &b"ping"[..], &b""[..]), Duration::from_secs(10));
/// let reply = tokio::runtime::Runtime::new()?.block_on(fut)?;
/// assert_eq!(&reply.front[..], b"pong");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct CallFuture(AnswerFuture<Message>);

impl Future for CallFuture {
    type Output = Result<Message, CallError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0).poll(cx)
    }
}

/// A call waiting for its `T` (see [`Connection::call_answered`]): the
/// future under [`CallFuture`] and `crate::RmaFuture`.
pub(crate) struct AnswerFuture<T: Answer> {
    conn: Connection,
    request: Option<T::Request>,
    timeout: Duration,
    call: Option<(u64, Arc<CallSlot<T>>)>,
}

impl<T: Answer> Future for AnswerFuture<T> {
    type Output = Result<T, CallError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        if let Some(mut request) = this.request.take() {
            let (id, slot) = match &this.call {
                Some((id, slot)) => (*id, slot.clone()),
                None => {
                    let (id, slot) = this.conn.inner.calls.register::<T>(this.timeout);
                    this.call = Some((id, slot.clone()));
                    this.conn.call_deadline(id, Instant::now() + this.timeout);
                    (id, slot)
                }
            };
            request.set_call(id);
            match this.conn.send_or_wait(request, cx) {
                Ok(None) => {}
                Ok(Some(back)) => {
                    this.request = Some(back);
                    // The deadline still runs: a queue that stays full
                    // times the call out.
                    return poll_slot(&slot, cx).map(|o| {
                        this.call = None;
                        o
                    });
                }
                Err(e) => {
                    this.conn.inner.calls.forget(id);
                    this.call = None;
                    return Poll::Ready(Err(e.into()));
                }
            }
        }
        let Some((_, slot)) = &this.call else {
            return Poll::Ready(Err(CallError::Finished));
        };
        let slot = slot.clone();
        poll_slot(&slot, cx).map(|o| {
            this.call = None;
            o
        })
    }
}

fn poll_slot<T>(slot: &CallSlot<T>, cx: &mut Context<'_>) -> Poll<Result<T, CallError>> {
    let mut s = slot.state.lock().expect("call slot");
    match s.outcome.take() {
        Some(o) => Poll::Ready(o),
        None => {
            // Polled again by the same task (an RMA operation's parts, a
            // select): the waker kept already wakes it; no clone.
            if !s.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                s.waker = Some(cx.waker().clone());
            }
            Poll::Pending
        }
    }
}

impl<T: Answer> Drop for AnswerFuture<T> {
    fn drop(&mut self) {
        if let Some((id, _)) = self.call.take() {
            self.conn.inner.calls.forget(id);
        }
    }
}
