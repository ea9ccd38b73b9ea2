//! Typed services: a request type, a reply type and a handler make a
//! server; [`ServiceClient`] calls it. No enum of message types, no match
//! on them, no `reply_typed` by hand.
//!
//! - [`serve`]: the handler runs on the messenger's worker threads, as a
//!   [`Dispatcher`] callback does (the fastest path; keep it short).
//! - [`serve_async`]: the handler is async and runs in the caller's task,
//!   taking requests from an [`Inbox`]; run several for concurrency.
//! - [`ServiceClient`]: [`ServiceClient::call`] blocks,
//!   [`ServiceClient::call_async`] is a future on any executor.
//!
//! Requests and replies are calls ([`Connection::call`]) whose payload is
//! the value encoded with [`crate::Postcard`] in the front segment, under
//! the message types [`REQUEST`], [`REPLY`] and [`FAULT`]. A request the
//! server cannot answer (it does not decode, the handler panicked, the
//! reply does not encode or is too large) is answered with a
//! [`ServiceFault`]: the caller gets [`ServiceError::Fault`] at once, not a
//! timeout.
//!
//! ```
//! use std::{sync::Arc, time::Duration};
//! use msgr::{EntityName, Messenger, NullDispatcher, ServiceClient};
//!
//! let mut server = Messenger::builder(EntityName::server(1)).without_env()
//!     .bind("tcp://127.0.0.1:0".parse()?)
//!     .start(msgr::serve(|name: String| format!("hello, {name}")))?;
//! let client = Messenger::builder(EntityName::client(1)).without_env()
//!     .start(Arc::new(NullDispatcher))?;
//! let greeter: ServiceClient<String, String> = ServiceClient::new(client.connect(server.addr().expect("bound"))?);
//! assert_eq!(greeter.call(&"msgr".to_string(), Duration::from_secs(10))?, "hello, msgr");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::future::Future;
use std::marker::PhantomData;
use std::pin::{pin, Pin};
use std::task::{Context, Poll};
use std::time::Duration;

use msgr_proto::{CodecError, Message, TypedError};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::call::CallFuture;
use crate::dispatcher::{guarded, Panicked};
use crate::pending::{SendError, SendRejected};
use crate::replies::CallError;
use crate::{Connection, Dispatcher, Inbox};

/// The message type of a service request.
///
/// ```
/// assert_eq!(msgr::service::REQUEST, 0xfe00);
/// ```
pub const REQUEST: u16 = 0xfe00;
/// The message type of a service reply: the handler's value.
///
/// ```
/// assert_eq!(msgr::service::REPLY, 0xfe01);
/// ```
pub const REPLY: u16 = 0xfe01;
/// The message type of a [`ServiceFault`]: the server's answer when it has
/// no reply to give.
///
/// ```
/// assert_eq!(msgr::service::FAULT, 0xfe02);
/// ```
pub const FAULT: u16 = 0xfe02;

/// Why a server answered a request without a reply (it travels to the
/// caller, in [`ServiceError::Fault`]).
///
/// ```
/// use msgr::ServiceFault;
/// let fault = ServiceFault::BadRequest("unexpected end of input".into());
/// assert!(fault.to_string().contains("did not decode"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[non_exhaustive]
pub enum ServiceFault {
    /// The request is not the service's request type (or not a service
    /// request at all); why it did not decode.
    #[error("the request did not decode on the server: {0}")]
    BadRequest(String),
    /// The handler panicked on this request; the panic's message. The
    /// server's connection stays open, and the panic is logged and counted
    /// (`handler_panics`) as any callback's.
    #[error("the server's handler panicked: {0}")]
    Panicked(String),
    /// The handler's reply did not encode, or is larger than this
    /// connection carries; why.
    #[error("the server's reply could not be sent: {0}")]
    BadReply(String),
}

/// Why a [`ServiceClient`] call has no reply.
///
/// ```
/// # use std::{sync::Arc, time::Duration};
/// use msgr::{EntityName, Messenger, NullDispatcher, ServiceClient, ServiceError, ServiceFault};
/// let server = Messenger::builder(EntityName::server(1)).without_env()
///     .bind("tcp://127.0.0.1:0".parse()?)
///     .start(msgr::serve(|n: u32| n + 1))?;
/// let client = Messenger::builder(EntityName::client(1)).without_env()
///     .start(Arc::new(NullDispatcher))?;
/// // A client that sends a string to a service of numbers.
/// let wrong: ServiceClient<String, u32> = ServiceClient::new(client.connect(server.addr().expect("bound"))?);
/// let err = wrong.call(&"one".to_string(), Duration::from_secs(10)).unwrap_err();
/// assert!(matches!(err, ServiceError::Fault(ServiceFault::BadRequest(_))));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ServiceError {
    /// The request did not encode.
    #[error("the request did not encode: {0}")]
    Encode(CodecError),
    /// No answer: timeout, reset, or the request was not sent.
    #[error(transparent)]
    Call(#[from] CallError),
    /// The server answered with a fault instead of a reply.
    #[error(transparent)]
    Fault(ServiceFault),
    /// The answer is not a reply of this service or does not decode as
    /// its reply type.
    #[error("the reply did not decode: {0}")]
    Decode(TypedError),
}

/// A server of one service, its handler run on the messenger's worker
/// threads: give it to [`crate::MessengerBuilder::start`]. Each call's
/// request is decoded as `Req`, passed to `handler`, and its `Rep` sent
/// back to the caller; a request that does not decode, or on which the
/// handler panics, is answered with a [`ServiceFault`]. A panic fails only
/// its request: it is logged and counted (`handler_panics`) as any
/// callback's, `on_handler_panic = abort` aborts, but the connection is not
/// ended. Messages that are not calls have no one to answer and are
/// dropped (logged at debug).
///
/// The handler runs as [`Dispatcher::on_message`] does: in order per
/// connection, concurrently across connections of different workers;
/// keep it short (a slow one delays the other connections of its worker),
/// or use [`serve_async`].
///
/// ```
/// use std::{collections::HashMap, sync::{Arc, Mutex}, time::Duration};
/// use msgr::{EntityName, Messenger, NullDispatcher, ServiceClient};
///
/// // A counter per name: the handler's state is what it captures.
/// let counts = Mutex::new(HashMap::<String, u64>::new());
/// let server = Messenger::builder(EntityName::server(1)).without_env()
///     .bind("tcp://127.0.0.1:0".parse()?)
///     .start(msgr::serve(move |name: String| {
///         let mut counts = counts.lock().unwrap();
///         let n = counts.entry(name).or_default();
///         *n += 1;
///         *n
///     }))?;
/// let client = Messenger::builder(EntityName::client(1)).without_env()
///     .start(Arc::new(NullDispatcher))?;
/// let counter: ServiceClient<String, u64> = ServiceClient::new(client.connect(server.addr().expect("bound"))?);
/// let t = Duration::from_secs(10);
/// counter.call(&"a".to_string(), t)?;
/// assert_eq!(counter.call(&"a".to_string(), t)?, 2);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn serve<Req, Rep, F>(handler: F) -> std::sync::Arc<dyn Dispatcher>
where
    Req: DeserializeOwned + 'static,
    Rep: Serialize + 'static,
    F: Fn(Req) -> Rep + Send + Sync + 'static,
{
    std::sync::Arc::new(Server {
        handler,
        types: PhantomData,
    })
}

/// [`serve`]'s dispatcher.
struct Server<Req, Rep, F> {
    handler: F,
    /// `fn` types: the server holds no `Req` or `Rep`, and is `Send` and
    /// `Sync` whatever they are.
    types: PhantomData<fn(Req) -> Rep>,
}

impl<Req, Rep, F> Dispatcher for Server<Req, Rep, F>
where
    Req: DeserializeOwned + 'static,
    Rep: Serialize + 'static,
    F: Fn(Req) -> Rep + Send + Sync + 'static,
{
    fn on_message(&self, conn: &Connection, msg: Message) {
        if !is_request(conn, &msg) {
            return;
        }
        let outcome = decode_request::<Req>(&msg)
            .and_then(|req| contained(conn, &msg, || (self.handler)(req)));
        if let Err(rejected) = conn.send(reply_message(outcome, &msg)) {
            if let Some(fault) = undeliverable(conn, rejected) {
                let _ = conn.send(fault_message(&fault, &msg));
            }
        }
    }
}

/// Serves requests from `inbox` (give [`Inbox::dispatcher`] to the
/// messenger) with an async handler, one request at a time, until the
/// messenger shuts down; returns how many requests it answered. For
/// concurrency run several over the same inbox (each takes the next
/// request): a bounded number of tasks, not one per call. Answers as
/// [`serve`] does; a reply waits for room in a full send queue.
///
/// ```
/// use std::time::Duration;
/// use msgr::{EntityName, Inbox, Messenger, ServiceClient};
///
/// # tokio::runtime::Runtime::new()?.block_on(async {
/// let inbox = Inbox::new();
/// let server = Messenger::builder(EntityName::server(1)).without_env()
///     .bind("tcp://127.0.0.1:0".parse()?)
///     .start(inbox.dispatcher())?;
/// let serving = tokio::spawn(async move {
///     msgr::serve_async(&inbox, |n: u64| async move { n * 2 }).await
/// });
/// let client = Messenger::builder(EntityName::client(1)).without_env()
///     .start(Inbox::new().dispatcher())?;
/// let double: ServiceClient<u64, u64> = ServiceClient::new(client.connect(server.addr().expect("bound"))?);
/// assert_eq!(double.call_async(&21, Duration::from_secs(10)).await?, 42);
/// server.shutdown_async(Duration::from_secs(1)).await;
/// assert_eq!(serving.await?, 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub async fn serve_async<Req, Rep, F, Fut>(inbox: &Inbox, mut handler: F) -> u64
where
    Req: DeserializeOwned,
    Rep: Serialize,
    F: FnMut(Req) -> Fut,
    Fut: Future<Output = Rep>,
{
    let mut answered = 0;
    while let Some((conn, msg)) = inbox.recv_async().await {
        if !is_request(&conn, &msg) {
            continue;
        }
        let outcome = match decode_request::<Req>(&msg) {
            Ok(req) => run_contained(&conn, &msg, || handler(req)).await,
            Err(fault) => Err(fault),
        };
        if let Err(rejected) = conn.send_async(reply_message(outcome, &msg)).await {
            if let Some(fault) = undeliverable(&conn, rejected) {
                let _ = conn.send_async(fault_message(&fault, &msg)).await;
            }
        }
        answered += 1;
    }
    answered
}

/// Whether `msg` is a call to answer; a message that is not is logged.
fn is_request(conn: &Connection, msg: &Message) -> bool {
    let is = matches!(msg.call_id(), Some((_, false)));
    if !is {
        tracing::debug!(
            connection = conn.id(),
            msg_type = msg.msg_type,
            "a service dropped a message that is not a call"
        );
    }
    is
}

/// The request in `msg`, or the fault that says why there is none.
fn decode_request<Req: DeserializeOwned>(msg: &Message) -> Result<Req, ServiceFault> {
    if msg.msg_type != REQUEST {
        return Err(ServiceFault::BadRequest(format!(
            "message type {} is not a service request (type {REQUEST})",
            msg.msg_type
        )));
    }
    msg.decode()
        .map_err(|e| ServiceFault::BadRequest(e.to_string()))
}

/// Runs `handler` under the messenger's panic policy (logged, counted,
/// `abort` aborts): a panic becomes the request's fault.
fn contained<T>(
    conn: &Connection,
    msg: &Message,
    handler: impl FnOnce() -> T,
) -> Result<T, ServiceFault> {
    let shared = &conn.inner.shared;
    let mut out = None;
    guarded(
        shared.cfg.handler_panic,
        &shared.counters.handler_panics,
        conn,
        || format!("a service request of {} bytes", msg.payload_len()),
        || out = Some(handler()),
    )
    .map_err(|Panicked(why)| ServiceFault::Panicked(why))?;
    // `guarded` returns Ok only when the handler returned.
    out.ok_or_else(|| ServiceFault::Panicked("the handler did not return".into()))
}

/// [`contained`] for an async handler: its creation and each poll of its
/// future (pinned here, not boxed).
async fn run_contained<Rep, Fut: Future<Output = Rep>>(
    conn: &Connection,
    msg: &Message,
    handler: impl FnOnce() -> Fut,
) -> Result<Rep, ServiceFault> {
    let mut fut = pin!(contained(conn, msg, handler)?);
    std::future::poll_fn(|cx| match contained(conn, msg, || fut.as_mut().poll(cx)) {
        Ok(polled) => polled.map(Ok),
        Err(fault) => Poll::Ready(Err(fault)),
    })
    .await
}

/// The answer to `request`: the reply, or the fault (also when the reply
/// does not encode).
fn reply_message<Rep: Serialize>(outcome: Result<Rep, ServiceFault>, request: &Message) -> Message {
    let encoded = outcome.and_then(|rep| {
        Message::encode(REPLY, &rep).map_err(|e| ServiceFault::BadReply(e.to_string()))
    });
    match encoded {
        Ok(reply) => reply.replying_to(request),
        Err(fault) => fault_message(&fault, request),
    }
}

fn fault_message(fault: &ServiceFault, request: &Message) -> Message {
    // A fault is an enum of strings: it encodes (an empty payload, which
    // the caller reports as undecodable, is the fallback).
    Message::encode(FAULT, fault)
        .unwrap_or_else(|_| Message::new(FAULT, bytes::Bytes::new(), bytes::Bytes::new()))
        .replying_to(request)
}

/// An answer was not sent: the fault to send instead if the answer was too
/// large (the caller would otherwise wait its whole timeout); other
/// refusals (closed, queue full) are logged, and the caller's call ends by
/// its connection's fate or its timeout.
fn undeliverable(conn: &Connection, rejected: SendRejected) -> Option<ServiceFault> {
    match rejected.error {
        SendError::TooLarge(too_large) => Some(ServiceFault::BadReply(too_large.to_string())),
        SendError::Closed => None, // the caller's call fails with the reset
        error => {
            tracing::warn!(connection = conn.id(), target = %conn.target(), %error,
                "a service reply was not sent: its caller will time out");
            None
        }
    }
}

/// A typed client of a service: calls with a `Req`, gets a `Rep` (see
/// [`serve`] and [`serve_async`] for the server). Cheap to clone: a
/// [`Connection`] handle.
///
/// ```
/// # use std::{sync::Arc, time::Duration};
/// use msgr::{EntityName, Messenger, NullDispatcher, ServiceClient};
/// let server = Messenger::builder(EntityName::server(1)).without_env()
///     .bind("tcp://127.0.0.1:0".parse()?)
///     .start(msgr::serve(|(a, b): (i32, i32)| a + b))?;
/// let client = Messenger::builder(EntityName::client(1)).without_env()
///     .start(Arc::new(NullDispatcher))?;
/// let add = ServiceClient::<(i32, i32), i32>::new(client.connect(server.addr().expect("bound"))?);
/// assert_eq!(add.call(&(40, 2), Duration::from_secs(10))?, 42);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct ServiceClient<Req, Rep> {
    conn: Connection,
    types: PhantomData<fn(&Req) -> Rep>,
}

impl<Req, Rep> Clone for ServiceClient<Req, Rep> {
    fn clone(&self) -> Self {
        ServiceClient {
            conn: self.conn.clone(),
            types: PhantomData,
        }
    }
}

impl<Req, Rep> std::fmt::Debug for ServiceClient<Req, Rep> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceClient")
            .field("conn", &self.conn)
            .field("request", &std::any::type_name::<Req>())
            .field("reply", &std::any::type_name::<Rep>())
            .finish()
    }
}

impl<Req: Serialize, Rep: DeserializeOwned> ServiceClient<Req, Rep> {
    /// A client of the service at the other end of `conn`.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// use msgr::{EntityName, Messenger, NullDispatcher, ServiceClient};
    /// let client = Messenger::builder(EntityName::client(1)).without_env()
    ///     .start(Arc::new(NullDispatcher))?;
    /// let conn = client.connect(&"tcp://127.0.0.1:6800".parse()?)?;
    /// let kv: ServiceClient<String, Option<Vec<u8>>> = ServiceClient::new(conn);
    /// assert_eq!(kv.connection().target().to_string(), "tcp://127.0.0.1:6800");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new(conn: Connection) -> Self {
        ServiceClient {
            conn,
            types: PhantomData,
        }
    }

    /// The connection the calls go over (its state, its peer).
    ///
    /// ```
    /// # use std::sync::Arc;
    /// use msgr::{EntityName, Messenger, NullDispatcher, ServiceClient};
    /// # let client = Messenger::builder(EntityName::client(1)).without_env()
    /// #     .start(Arc::new(NullDispatcher))?;
    /// let svc = ServiceClient::<u8, u8>::new(client.connect(&"tcp://127.0.0.1:6800".parse()?)?);
    /// println!("{:?}", svc.connection().state());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    /// Sends `request` and waits for the reply, at most `timeout` (as
    /// [`Connection::call`]: blocks the calling thread, so not from a
    /// dispatcher callback; use [`ServiceClient::call_async`] there).
    ///
    /// # Errors
    ///
    /// [`ServiceError::Encode`] if the request does not encode;
    /// [`ServiceError::Call`] if no answer came (timeout, reset, not
    /// sent); [`ServiceError::Fault`] if the server answered that it has no
    /// reply (the request did not decode there, the handler panicked);
    /// [`ServiceError::Decode`] if the answer is not a `Rep`.
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// use msgr::{EntityName, Messenger, NullDispatcher, ServiceClient};
    /// let server = Messenger::builder(EntityName::server(1)).without_env()
    ///     .bind("tcp://127.0.0.1:0".parse()?)
    ///     .start(msgr::serve(|s: String| s.len()))?;
    /// # let client = Messenger::builder(EntityName::client(1)).without_env()
    /// #     .start(Arc::new(NullDispatcher))?;
    /// let len = ServiceClient::<String, usize>::new(client.connect(server.addr().expect("bound"))?);
    /// assert_eq!(len.call(&"four".into(), Duration::from_secs(10))?, 4);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn call(&self, request: &Req, timeout: Duration) -> Result<Rep, ServiceError> {
        let msg = Message::encode(REQUEST, request).map_err(ServiceError::Encode)?;
        decode_reply(self.conn.call(msg, timeout)?)
    }

    /// [`ServiceClient::call`] as a future, for async code on any executor
    /// (see [`Connection::call_async`]: the timeout is kept by the
    /// messenger, dropping the future forgets the call). The request is
    /// encoded now: the future owns what it needs, so many calls can be in
    /// flight at once, or spawned.
    ///
    /// # Errors
    ///
    /// As [`ServiceClient::call`].
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// use msgr::{EntityName, Messenger, NullDispatcher, ServiceClient};
    /// let server = Messenger::builder(EntityName::server(1)).without_env()
    ///     .bind("tcp://127.0.0.1:0".parse()?)
    ///     .start(msgr::serve(|n: u32| n * n))?;
    /// # let client = Messenger::builder(EntityName::client(1)).without_env()
    /// #     .start(Arc::new(NullDispatcher))?;
    /// let square = ServiceClient::<u32, u32>::new(client.connect(server.addr().expect("bound"))?);
    /// let calls: Vec<_> = (0..10).map(|n| square.call_async(&n, Duration::from_secs(10))).collect();
    /// tokio::runtime::Runtime::new()?.block_on(async {
    ///     for (n, call) in (0..10).zip(calls) {
    ///         assert_eq!(call.await?, n * n);
    ///     }
    ///     Ok::<(), msgr::ServiceError>(())
    /// })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn call_async(&self, request: &Req, timeout: Duration) -> ServiceCall<Rep> {
        let state = match Message::encode(REQUEST, request) {
            Ok(msg) => CallState::Calling(self.conn.call_async(msg, timeout)),
            Err(e) => CallState::NotEncoded(Some(e)),
        };
        ServiceCall {
            state,
            reply: PhantomData,
        }
    }
}

/// The answer to a request: the reply decoded, or why there is none.
fn decode_reply<Rep: DeserializeOwned>(answer: Message) -> Result<Rep, ServiceError> {
    match answer.msg_type {
        REPLY => answer
            .decode()
            .map_err(|e| ServiceError::Decode(TypedError::Codec(e))),
        FAULT => match answer.decode::<ServiceFault>() {
            Ok(fault) => Err(ServiceError::Fault(fault)),
            Err(e) => Err(ServiceError::Decode(TypedError::Codec(e))),
        },
        actual => Err(ServiceError::Decode(TypedError::WrongType {
            expected: REPLY,
            actual,
            name: std::any::type_name::<Rep>(),
        })),
    }
}

/// The future of [`ServiceClient::call_async`]; polled again after it
/// completed, it is ready with [`CallError::Finished`].
///
/// ```
/// # use std::{sync::Arc, time::Duration};
/// use msgr::{EntityName, Messenger, NullDispatcher, ServiceCall, ServiceClient};
/// let server = Messenger::builder(EntityName::server(1)).without_env()
///     .bind("tcp://127.0.0.1:0".parse()?)
///     .start(msgr::serve(|b: bool| !b))?;
/// # let client = Messenger::builder(EntityName::client(1)).without_env()
/// #     .start(Arc::new(NullDispatcher))?;
/// let not = ServiceClient::<bool, bool>::new(client.connect(server.addr().expect("bound"))?);
/// let call: ServiceCall<bool> = not.call_async(&true, Duration::from_secs(10));
/// // 'static: it can be spawned.
/// let answer = tokio::runtime::Runtime::new()?.block_on(async { tokio::spawn(call).await })?;
/// assert_eq!(answer?, false);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct ServiceCall<Rep> {
    state: CallState,
    /// `fn`: the future holds no `Rep`, and is `Send` whatever it is.
    reply: PhantomData<fn() -> Rep>,
}

enum CallState {
    /// The request did not encode: the error, until it is given.
    NotEncoded(Option<CodecError>),
    Calling(CallFuture),
}

impl<Rep: DeserializeOwned> Future for ServiceCall<Rep> {
    type Output = Result<Rep, ServiceError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.state {
            CallState::NotEncoded(e) => Poll::Ready(Err(match e.take() {
                Some(e) => ServiceError::Encode(e),
                None => ServiceError::Call(CallError::Finished),
            })),
            CallState::Calling(call) => Pin::new(call).poll(cx).map(|answer| decode_reply(answer?)),
        }
    }
}
