//! msgr: framed, ordered messages between the processes of a distributed
//! system, over TCP, RDMA verbs, rdma_cm and libfabric, with one API.
//!
//! - [`Messenger`]: bind to a typed address, connect to peers, shut down.
//! - [`Connection`]: send to one peer; lossy or lossless per [`Policy`].
//! - [`Dispatcher`]: receive messages and connection events.
//! - [`Message`]: header + front + data; typed payloads through serde: a
//!   [`Codec`], [`Postcard`] by default, `Bincode` with the feature
//!   `bincode` (see [`Codec`] for which to pick).
//! - [`MessengerConfig`]: every tunable, from code, a TOML file or `MSGR_*` variables.
//! - [`Counters`]: what happened, from the API or as Prometheus text.
//!
//! Tests can break links on purpose, by hand or by a plan, with the cargo
//! feature `fault-injection`: test hooks a default build leaves out.
//!
//! ```
//! use std::sync::{Arc, mpsc};
//! use std::time::Duration;
//! use msgr::{Connection, Dispatcher, EntityName, Message, Messenger, NullDispatcher};
//!
//! #[derive(serde::Serialize, serde::Deserialize)]
//! struct Hello { text: String }
//!
//! struct Inbox(std::sync::Mutex<mpsc::Sender<String>>);
//! impl Dispatcher for Inbox {
//!     fn on_message(&self, _conn: &Connection, msg: Message) {
//!         let hello: Hello = msg.decode().expect("a Hello");
//!         self.0.lock().unwrap().send(hello.text).unwrap();
//!     }
//! }
//!
//! let (tx, rx) = mpsc::channel();
//! let mut server = Messenger::builder(EntityName::server(1))
//!     .bind("tcp://127.0.0.1:0".parse()?)
//!     .start(Arc::new(Inbox(std::sync::Mutex::new(tx))))?;
//! let mut client = Messenger::builder(EntityName::client(1)).start(Arc::new(NullDispatcher))?;
//! let conn = client.connect(server.addr().expect("bound"))?;
//! conn.send(Message::encode(1, &Hello { text: "hi".into() })?)?;
//! assert_eq!(rx.recv_timeout(Duration::from_secs(10))?, "hi");
//! client.shutdown(Duration::from_secs(1));
//! server.shutdown(Duration::from_secs(1));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Layers
//!
//! The modules import in one direction: each only from the layers below
//! its own (`tests/layering.rs` checks every `crate::` and `super::` path,
//! nested modules included). Bottom first:
//!
//! 1. `counters`, `faults`, `throttle`, `affinity`, `auth`: the leaves —
//!    the figures, the fault plan (feature `fault-injection`), the receive
//!    throttle, CPU pinning, the authentication types re-exported.
//! 2. `config`: every tunable, and how a callback's panic is handled.
//! 3. `regions`, `pending`: the exposed regions as the owner keeps them;
//!    a connection's queued sends, and why a send is refused.
//! 4. `replies`: calls waiting for their replies, and why a call got none.
//! 5. `state`: what handles and workers share — the messenger's state,
//!    each connection's, the commands that carry them to a worker.
//! 6. `connection`: the [`Connection`] handle: sends, state, status.
//! 7. `call`: request/response over a connection.
//! 8. `dispatcher`: what the application receives, and the panic guard.
//! 9. `inbox`: a dispatcher that queues for the application to pull.
//! 10. `worker`: the event loop that owns sessions and transports.
//! 11. `messenger`: the [`Messenger`]: start, bind, connect, shut down.
//! 12. `rma`: one-sided operations, on top of the messenger and calls.
//! 13. `service`: typed services, a request type in and a reply type out.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod affinity;
mod call;
mod config;
mod connection;
mod counters;
mod dispatcher;
#[cfg(feature = "fault-injection")]
mod faults;
mod inbox;
mod messenger;
mod pending;
mod regions;
mod replies;
pub mod rma;
pub mod service;
mod state;
mod throttle;
mod worker;

/// The payload type of [`Message`]'s segments and of RMA reads: cheap to
/// clone, shared without copying.
///
/// ```
/// use msgr::{Bytes, Message};
/// let payload = Bytes::from(vec![7u8; 1 << 20]);
/// let msg = Message::new(1, Bytes::new(), payload.clone()); // no copy
/// assert_eq!(msg.data.as_ptr(), payload.as_ptr());
/// ```
pub use bytes::Bytes;
pub use call::{CallFuture, TypedCallError};
pub use config::{
    parse_policy, ConfigError, HandlerPanicPolicy, MessengerConfig, CONFIG_KEYS, MAX_CONFIG_FILE,
    RESERVED_ENV,
};
pub use connection::{ConnectError, Connection, ConnectionState, ConnectionStatus, SendFuture};
pub use counters::Counters;
pub use dispatcher::{Dispatcher, MessageRefs, NullDispatcher};
#[cfg(feature = "fault-injection")]
pub use faults::{FaultPlan, FaultPlanError};
pub use inbox::{ConnectionEvent, ConnectionInbox, Events, Inbox, Messages, Recv, RecvApart};
pub use messenger::{
    Broadcast, MemoryUse, Messenger, MessengerBuilder, MessengerError, ShutdownFuture,
    ShutdownReport,
};
pub use pending::{SendError, SendRejected};
pub use replies::CallError;
// The re-exports from msgr's own crates below, one per item: the docs on
// each `pub use` come first on the item's page, and their examples are
// doctests of this crate, written as a user of `msgr` writes them.

/// An address that does not parse.
///
/// ```
/// let err = "udp://127.0.0.1:1".parse::<msgr::EntityAddr>().unwrap_err();
/// assert!(err.to_string().contains("udp"));
/// ```
pub use msgr_addr::AddrParseError;
/// One peer's addresses in preference order, for
/// [`Messenger::connect_any`].
///
/// ```
/// let addrs: msgr::AddrVec = "[tcp://127.0.0.1:7000,tcp://127.0.0.1:6800]".parse()?;
/// assert_eq!(addrs.len(), 2);
/// assert_eq!(addrs.first().map(|a| a.socket.port()), Some(7000));
/// # Ok::<(), msgr::AddrParseError>(())
/// ```
pub use msgr_addr::AddrVec;
/// A typed address: the transport picks the backend.
///
/// ```
/// use msgr::{EntityAddr, TransportKind};
/// let addr: EntityAddr = "tcp://127.0.0.1:6800".parse()?;
/// assert_eq!(addr.transport, TransportKind::Tcp);
/// assert!(addr.is_loopback());
/// assert_eq!(addr.to_string(), "tcp://127.0.0.1:6800");
/// # Ok::<(), msgr::AddrParseError>(())
/// ```
pub use msgr_addr::EntityAddr;
/// The role in an [`EntityName`].
///
/// ```
/// use msgr::{EntityKind, EntityName};
/// assert_eq!(EntityName::server(2).kind, EntityKind::Server);
/// assert_eq!("peer".parse::<EntityKind>()?, EntityKind::Peer);
/// # Ok::<(), msgr::AddrParseError>(())
/// ```
pub use msgr_addr::EntityKind;
/// Who an entity is, whatever its address.
///
/// ```
/// use msgr::EntityName;
/// let name: EntityName = "client.42".parse()?;
/// assert_eq!(name, EntityName::client(42));
/// assert_eq!(name.to_string(), "client.42");
/// # Ok::<(), msgr::AddrParseError>(())
/// ```
pub use msgr_addr::EntityName;
/// A libfabric endpoint type.
///
/// ```
/// use msgr::{EntityAddr, FabricEndpoint, TransportKind};
/// let addr: EntityAddr = "fabric+tcp://127.0.0.1:7000?ep=rdm".parse()?;
/// let TransportKind::Fabric(provider) = &addr.transport else { unreachable!() };
/// assert_eq!(provider.endpoint, FabricEndpoint::Rdm);
/// # Ok::<(), msgr::AddrParseError>(())
/// ```
pub use msgr_addr::FabricEndpoint;
/// A libfabric provider and endpoint type.
///
/// ```
/// use msgr::{FabricEndpoint, FabricProvider, TransportKind};
/// let p = FabricProvider::new("tcp;ofi_rxm").with_endpoint(FabricEndpoint::Rdm);
/// assert_eq!(p.core_provider(), "tcp");
/// assert_eq!(TransportKind::Fabric(p).scheme(), "fabric+tcp;ofi_rxm");
/// ```
pub use msgr_addr::FabricProvider;
/// Where on an RDMA fabric an endpoint lives.
///
/// ```
/// let addr: msgr::EntityAddr = "verbs://127.0.0.1:7000?dev=rxe0&port=1".parse()?;
/// assert_eq!(addr.rdma.device.as_deref(), Some("rxe0"));
/// assert!(msgr::RdmaLocation::default().is_empty());
/// # Ok::<(), msgr::AddrParseError>(())
/// ```
pub use msgr_addr::RdmaLocation;
/// The transport of an address.
///
/// ```
/// use msgr::TransportKind;
/// let addr: msgr::EntityAddr = "rdmacm://127.0.0.1:7000".parse()?;
/// assert_eq!(addr.transport, TransportKind::RdmaCm);
/// assert!(!TransportKind::Tcp.allows_rdma_location());
/// # Ok::<(), msgr::AddrParseError>(())
/// ```
pub use msgr_addr::TransportKind;

/// Whether a backend can be used here, and if not why.
///
/// ```
/// use msgr::{availability, Availability, TransportKind};
/// assert_eq!(availability(&TransportKind::Tcp), Availability::Available);
/// ```
pub use msgr_backends::availability;
/// Why a backend's rendezvous (large-message reads) is withheld, if it is.
///
/// ```
/// // TCP has no rendezvous to withhold.
/// assert_eq!(msgr::rendezvous_withheld(&msgr::TransportKind::Tcp), None);
/// ```
pub use msgr_backends::rendezvous_withheld;
/// What [`availability`] says.
///
/// ```
/// use msgr::{availability, Availability, TransportKind};
/// if let Availability::Unavailable(why) = availability(&TransportKind::Verbs) {
///     assert!(!why.is_empty()); // an operator can act on it
/// }
/// ```
pub use msgr_backends::Availability;
/// How a libfabric worker waits for completions (key `fabric_cq_wait`).
///
/// ```
/// use msgr::{FabricCqWait, MessengerConfig};
/// let mut cfg = MessengerConfig::default();
/// assert_eq!(cfg.rdma.fabric_cq_wait, FabricCqWait::Fd);
/// cfg.set("fabric_cq_wait", "poll")?;
/// assert_eq!(cfg.rdma.fabric_cq_wait, FabricCqWait::Poll);
/// # Ok::<(), msgr::ConfigError>(())
/// ```
pub use msgr_backends::FabricCqWait;
/// Whether libfabric links move large messages by rendezvous (key
/// `fabric_rendezvous`).
///
/// ```
/// use msgr::{FabricRendezvous, MessengerConfig};
/// let mut cfg = MessengerConfig::default();
/// cfg.set("fabric_rendezvous", "off")?;
/// assert_eq!(cfg.rdma.fabric_rendezvous, FabricRendezvous::Off);
/// # Ok::<(), msgr::ConfigError>(())
/// ```
pub use msgr_backends::FabricRendezvous;
/// The RDMA backends' buffer pools (keys `rdma_*`).
///
/// ```
/// let mut cfg = msgr::MessengerConfig::default();
/// cfg.set("rdma_chunk_size", "65536")?;
/// assert_eq!(cfg.rdma.chunk_size, 65536);
/// # Ok::<(), msgr::ConfigError>(())
/// ```
pub use msgr_backends::RdmaPoolConfig;
/// A real transport fault, for [`Connection::inject_fault`]: a drill of
/// what the network does to a connection.
///
/// ```
/// # use std::time::Duration;
/// use msgr::{EntityName, Inbox, Message, Messenger, NullDispatcher, RealFault};
/// # use std::sync::Arc;
/// let inbox = Inbox::new();
/// let server = Messenger::builder(EntityName::server(1)).without_env()
///     .bind("tcp://127.0.0.1:0".parse()?).start(inbox.dispatcher())?;
/// let client = Messenger::builder(EntityName::client(1)).without_env()
///     .start(Arc::new(NullDispatcher))?;
/// let conn = client.connect(server.addr().expect("bound"))?;
/// conn.wait_connected(Duration::from_secs(10))?;
/// conn.inject_fault(RealFault::HalfClose);
/// conn.send(Message::new(1, &b"after the fault"[..], &b""[..]))?;
/// // Lossless: the session comes back on a new link and delivers it.
/// let (_, msg) = inbox.recv_timeout(Duration::from_secs(10)).expect("delivered");
/// assert_eq!(&msg.front[..], b"after the fault");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[cfg(feature = "fault-injection")]
pub use msgr_backends::RealFault;
/// An imitated transport fault, for [`Connection::simulate_fault`] (see
/// its example).
///
/// ```
/// use msgr::SimulatedFault;
/// // One per kind of fault a backend imitates; a test names the one it drills.
/// let drills = [SimulatedFault::HungRead, SimulatedFault::CqReadError];
/// assert_ne!(drills[0], drills[1]);
/// ```
#[cfg(feature = "fault-injection")]
pub use msgr_backends::SimulatedFault;
/// A transport could not be used.
///
/// ```
/// # use std::sync::Arc;
/// use msgr::{EntityName, Messenger, MessengerError, NullDispatcher, TransportError};
/// let taken = std::net::TcpListener::bind("127.0.0.1:0")?;
/// let started = Messenger::builder(EntityName::server(1))
///     .without_env()
///     .bind(format!("tcp://{}", taken.local_addr()?).parse()?) // in use
///     .start(Arc::new(NullDispatcher));
/// assert!(matches!(started, Err(MessengerError::Transport(TransportError::Bind { .. }))));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub use msgr_backends::TransportError;
/// One backend's own counters ([`Messenger::transport_stats`]).
///
/// ```
/// # use std::sync::Arc;
/// use msgr::{EntityName, Messenger, NullDispatcher, TransportKind, TransportStats};
/// let m = Messenger::builder(EntityName::client(1)).without_env().start(Arc::new(NullDispatcher))?;
/// let stats: Vec<TransportStats> = m.transport_stats();
/// assert!(stats.iter().any(|s| s.kind == TransportKind::Tcp));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub use msgr_backends::TransportStats;

pub use affinity::allowed_cpus;
/// The codec with bincode's fixed-width layout (feature `bincode`):
/// see [`Codec`] for when to pick it over [`Postcard`].
///
/// ```
/// use msgr::{Bincode, Codec, Message};
/// let msg = Message::encode_with(&Bincode, 1, &(7u32, "seven"))?;
/// assert_eq!(Bincode.decode::<(u32, String)>(&msg.front)?, (7, "seven".to_string()));
/// # Ok::<(), msgr::CodecError>(())
/// ```
#[cfg(feature = "bincode")]
pub use msgr_proto::Bincode;
/// A serde format for message payloads ([`Message::encode_with`]).
///
/// ```
/// use msgr::{Codec, Message, Postcard};
/// let msg = Message::encode_with(&Postcard, 1, &(7u8, "seven"))?;
/// assert_eq!(Postcard.decode::<(u8, String)>(&msg.front)?, (7, "seven".to_string()));
/// # Ok::<(), msgr::CodecError>(())
/// ```
pub use msgr_proto::Codec;
/// A payload did not encode or decode.
///
/// ```
/// let msg = msgr::Message::new(1, &b"\xff"[..], &b""[..]);
/// let err = msg.decode::<String>().unwrap_err();
/// assert_eq!(err.codec, "postcard");
/// ```
pub use msgr_proto::CodecError;
/// Why a session ended or a link was lost ([`Dispatcher::on_reset`],
/// [`ConnectionStatus::last_fault`]).
///
/// ```
/// use msgr::{FaultReason, LinkFailure};
/// let why = FaultReason::Transport(LinkFailure::Setup("connection refused".into()));
/// assert!(why.to_string().contains("refused"));
/// ```
pub use msgr_proto::FaultReason;
/// A message as a wire frame, for code that handles frames generically.
///
/// ```
/// use msgr::{Frame, Message};
/// let frame: Frame = Message::new(3, &b"front"[..], &b"data"[..]).to_frame(0);
/// let (back, ack) = Message::from_frame(frame)?;
/// assert_eq!((back.msg_type, &back.data[..], ack), (3, &b"data"[..], 0));
/// # Ok::<(), msgr::ProtocolError>(())
/// ```
pub use msgr_proto::Frame;
/// Bytes that are not a valid frame.
///
/// ```
/// use msgr::{Bytes, Frame, FrameError, FrameLimits};
/// let err: FrameError = Frame::decode_exact(Bytes::from_static(b"not a frame"), &FrameLimits::default())
///     .unwrap_err();
/// assert!(!err.to_string().is_empty());
/// ```
pub use msgr_proto::FrameError;
/// The largest segments and frame a messenger accepts (keys
/// `max_front_bytes`, `max_data_bytes`).
///
/// ```
/// let mut cfg = msgr::MessengerConfig::default();
/// cfg.set("max_front_bytes", "65536")?;
/// assert_eq!(cfg.frame_limits().max_segment[1], 65536);
/// # Ok::<(), msgr::ConfigError>(())
/// ```
pub use msgr_proto::FrameLimits;
/// Why a link failed, as its transport reported it
/// ([`FaultReason::Transport`]).
pub use msgr_proto::LinkFailure;
/// A well-formed frame whose payload does not parse: what
/// [`Message::from_frame`] returns for a frame that is not a message.
/// A [`ProtocolError`] converts from it.
///
/// ```
/// use msgr::{Malformed, Message};
/// let mut frame = Message::new(3, &b"front"[..], &b"data"[..]).to_frame(0);
/// frame.segments.pop(); // a message frame has three
/// let err: Malformed = Message::from_frame(frame).unwrap_err();
/// assert_eq!(err.what, "message frame");
/// ```
pub use msgr_proto::Malformed;
/// A message: a type, a front and a data segment.
///
/// ```
/// use msgr::Message;
/// let msg = Message::new(5, &b"header"[..], vec![0u8; 1024]);
/// assert_eq!((msg.msg_type, msg.payload_len()), (5, 6 + 1024));
/// let typed = Message::encode(6, &("key", 42u32))?;
/// assert_eq!(typed.decode::<(String, u32)>()?, ("key".to_string(), 42));
/// # Ok::<(), msgr::CodecError>(())
/// ```
pub use msgr_proto::Message;
/// A received message borrowed from the buffer it arrived in, as
/// [`Dispatcher::on_batch`] hands it over: the header fields, and front
/// and data as slices. [`MessageRef::to_message`] makes the owned
/// [`Message`] to keep (no copy).
///
/// ```
/// use msgr::{Connection, Dispatcher, Message, MessageRef, MessageRefs};
/// struct Log;
/// impl Log {
///     fn show(&self, m: MessageRef<'_>) {
///         println!("#{} type {}: {} bytes", m.seq, m.msg_type, m.payload_len());
///     }
/// }
/// impl Dispatcher for Log {
///     fn on_message(&self, _: &Connection, msg: Message) {
///         println!("#{} type {} (alone)", msg.seq, msg.msg_type);
///     }
///     fn on_batch(&self, _: &Connection, messages: &mut MessageRefs<'_>) {
///         messages.for_each(|m| self.show(m));
///     }
/// }
/// ```
pub use msgr_proto::MessageRef;
/// Who the peer of a connection is ([`Connection::peer`]).
///
/// ```
/// # use std::{sync::Arc, time::Duration};
/// use msgr::{EntityName, Messenger, NullDispatcher, PeerInfo};
/// let server = Messenger::builder(EntityName::server(1)).without_env()
///     .bind("tcp://127.0.0.1:0".parse()?).start(Arc::new(NullDispatcher))?;
/// let client = Messenger::builder(EntityName::client(1)).without_env()
///     .start(Arc::new(NullDispatcher))?;
/// let conn = client.connect(server.addr().expect("bound"))?;
/// conn.wait_connected(Duration::from_secs(10))?;
/// let peer: PeerInfo = conn.peer().expect("known once open");
/// assert_eq!(peer.name, EntityName::server(1));
/// assert_eq!(peer.key, None); // crc mode: the name is the peer's word
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub use msgr_proto::PeerInfo;
/// Where a connection's session stands ([`ConnectionStatus::phase`]),
/// shown in words.
///
/// ```
/// assert_eq!(msgr::Phase::StandingBy.to_string(), "standing by");
/// ```
pub use msgr_proto::Phase;
/// What a connection promises across faults (key `policy`).
///
/// ```
/// use msgr::{parse_policy, Policy};
/// assert_eq!(Policy::default(), Policy::LosslessClient);
/// assert_eq!(parse_policy("lossy-client"), Some(Policy::LossyClient));
/// ```
pub use msgr_proto::Policy;
/// The default payload codec.
///
/// ```
/// use msgr::{Message, Postcard};
/// let msg = Message::encode_with(&Postcard, 1, &vec![1u16, 2, 3])?;
/// assert_eq!(msg.decode_with::<_, Vec<u16>>(&Postcard)?, vec![1, 2, 3]);
/// # Ok::<(), msgr::CodecError>(())
/// ```
pub use msgr_proto::Postcard;
/// The class a message travels in (its priority lane): on a connection
/// where both sides offer lanes, a more urgent class goes first at every
/// queue and a large message of a class below is cut into fragments so
/// it waits for at most one. Order and exactly-once hold within a class;
/// across classes no order is promised. Replies take their request's
/// class.
///
/// ```
/// use msgr::{Message, Priority};
/// let call = Message::new(1, &b"ping"[..], &b""[..]).with_class(Priority::Interactive);
/// assert_eq!(call.class(), Priority::Interactive);
/// assert_eq!(Message::new(1, &b""[..], &b""[..]).class(), Priority::Data);
/// ```
pub use msgr_proto::Priority;
/// Input that breaks the wire protocol.
pub use msgr_proto::ProtocolError;
/// One of a message's two payload segments (named in [`TooLarge`]).
///
/// ```
/// assert_eq!(msgr::Segment::Data.to_string(), "data");
/// ```
pub use msgr_proto::Segment;
/// One session's tunables (the `MessengerConfig`'s `session`).
///
/// ```
/// use std::time::Duration;
/// let mut cfg = msgr::MessengerConfig::default();
/// cfg.set("keepalive_interval_ms", "500")?;
/// let session: &msgr::SessionConfig = &cfg.session;
/// assert_eq!(session.keepalive_interval, Duration::from_millis(500));
/// # Ok::<(), msgr::ConfigError>(())
/// ```
pub use msgr_proto::SessionConfig;
/// A segment larger than the peer takes: why a send is refused.
///
/// ```
/// use msgr::{Segment, TooLarge};
/// let e = TooLarge { segment: Segment::Front, len: 10, max: 4 };
/// assert!(e.to_string().contains("10 bytes"));
/// ```
pub use msgr_proto::TooLarge;
/// A typed message is not the type asked for, or does not decode.
///
/// ```
/// use msgr::{Message, TypedError, TypedMessage};
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct Ping;
/// impl TypedMessage for Ping { const TYPE: u16 = 1; }
/// let other = Message::new(2, &b""[..], &b""[..]);
/// assert!(matches!(other.decode_typed::<Ping>(), Err(TypedError::WrongType { actual: 2, .. })));
/// ```
pub use msgr_proto::TypedError;
/// A Rust type that travels as one message type.
///
/// ```
/// use msgr::{Message, TypedMessage};
/// #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
/// struct Temp { celsius: i32 }
/// impl TypedMessage for Temp { const TYPE: u16 = 9; }
/// let msg = Message::typed(&Temp { celsius: 21 })?;
/// assert_eq!(msg.msg_type, 9);
/// assert_eq!(msg.decode_typed::<Temp>()?, Temp { celsius: 21 });
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub use msgr_proto::TypedMessage;
pub use rma::{Access, RmaError, RmaFuture, RmaHandle, RmaOp, RmaOptions, RmaRegion, SharedRegion};
pub use service::{serve, serve_async, ServiceCall, ServiceClient, ServiceError, ServiceFault};

/// Authentication and the secure mode: keys, keyrings, the modes a link
/// may run in (see the configuration keys `security`, `key_file` and
/// `keyring`, and [`MessengerBuilder::credentials`]).
pub mod auth {
    /// Why a peer was not authenticated (a link ends with it).
    ///
    /// ```
    /// use msgr::auth::{AuthError, Keyring, PeerVerifier, StaticKeypair};
    /// use msgr::EntityName;
    /// let ring = Keyring::new(); // knows no one
    /// let err: AuthError = ring.verify(&EntityName::client(1), &StaticKeypair::generate().public()).unwrap_err();
    /// assert!(!err.to_string().is_empty());
    /// ```
    pub use msgr_proto::auth::AuthError;
    /// This side's name, key pair and the verifier of peers.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use msgr::auth::{Credentials, Keyring, StaticKeypair};
    /// use msgr::EntityName;
    /// let key = StaticKeypair::generate();
    /// let public = key.public();
    /// let creds = Credentials::new(EntityName::server(1), key, Arc::new(Keyring::new()));
    /// assert_eq!(creds.public_key(), public);
    /// ```
    pub use msgr_proto::auth::Credentials;
    /// A key file or keyring that does not parse.
    ///
    /// ```
    /// use msgr::auth::{KeyFileError, Keyring};
    /// let err: KeyFileError = Keyring::parse("client.1 not-a-key\n").unwrap_err();
    /// assert!(matches!(err, KeyFileError::Line { line: 1, .. }));
    /// ```
    pub use msgr_proto::auth::KeyFileError;
    /// Entity names and their public keys (the `keyring` file).
    ///
    /// ```
    /// use msgr::auth::{Keyring, StaticKeypair};
    /// use msgr::EntityName;
    /// let key = StaticKeypair::generate().public();
    /// let text = Keyring::line(&EntityName::client(1), &key);
    /// let ring = Keyring::parse(&text)?;
    /// assert_eq!(ring.get(&EntityName::client(1)), Some(&key));
    /// # Ok::<(), msgr::auth::KeyFileError>(())
    /// ```
    pub use msgr_proto::auth::Keyring;
    /// The security modes a messenger allows (key `security`).
    ///
    /// ```
    /// use msgr::auth::{ModeSet, SecurityMode};
    /// let modes = ModeSet::of(&[SecurityMode::Auth, SecurityMode::Secure]);
    /// assert!(modes.allows(SecurityMode::Secure) && !modes.allows(SecurityMode::Crc));
    /// assert!(modes.needs_credentials());
    /// ```
    pub use msgr_proto::auth::ModeSet;
    /// Decides whether a key may speak for a name; implement it for a
    /// directory of your own.
    ///
    /// ```
    /// use msgr::auth::{AuthError, PeerVerifier, PublicKey};
    /// use msgr::EntityName;
    /// /// Trusts one key, whatever name it claims (for a test).
    /// #[derive(Debug)]
    /// struct OneKey(PublicKey);
    /// impl PeerVerifier for OneKey {
    ///     fn verify(&self, _name: &EntityName, key: &PublicKey) -> Result<(), AuthError> {
    ///         if *key == self.0 { Ok(()) } else { Err(AuthError::Handshake("unknown key")) }
    ///     }
    /// }
    /// let key = msgr::auth::StaticKeypair::generate().public();
    /// assert!(OneKey(key).verify(&EntityName::client(1), &key).is_ok());
    /// ```
    pub use msgr_proto::auth::PeerVerifier;
    /// An entity's public key.
    ///
    /// ```
    /// use msgr::auth::StaticKeypair;
    /// let pair = StaticKeypair::generate();
    /// assert_eq!(pair.public(), pair.public()); // derived, stable
    /// assert_ne!(pair.public(), StaticKeypair::generate().public());
    /// ```
    pub use msgr_proto::auth::PublicKey;
    /// Why a sealed frame did not open.
    pub use msgr_proto::auth::RecordError;
    /// What a session needs to secure its links.
    ///
    /// ```
    /// use msgr::auth::SecurityMode;
    /// use msgr::{EntityName, MessengerConfig};
    /// let security = MessengerConfig::default().security_for(&EntityName::client(1), None)?;
    /// assert!(security.modes.allows(SecurityMode::Crc));
    /// assert!(security.credentials.is_none());
    /// # Ok::<(), msgr::ConfigError>(())
    /// ```
    pub use msgr_proto::auth::Security;
    /// How a link protects what it carries.
    ///
    /// ```
    /// use msgr::auth::SecurityMode;
    /// assert_eq!(SecurityMode::Secure.as_str(), "secure");
    /// assert!(SecurityMode::Crc < SecurityMode::Secure);
    /// ```
    pub use msgr_proto::auth::SecurityMode;
    /// An entity's key pair.
    ///
    /// ```
    /// use msgr::auth::StaticKeypair;
    /// use msgr::EntityName;
    /// let pair = StaticKeypair::generate();
    /// let file = pair.to_key_file(&EntityName::server(1)); // wiped when dropped
    /// let (name, back) = StaticKeypair::parse_key_file(&file)?;
    /// assert_eq!((name, back.public()), (EntityName::server(1), pair.public()));
    /// # Ok::<(), msgr::auth::KeyFileError>(())
    /// ```
    pub use msgr_proto::auth::StaticKeypair;
    /// Why a peer refused this side for good, as it said (a server whose
    /// keyring does not vouch for us): the connection ended at once with
    /// [`FaultReason::Refused`](crate::FaultReason::Refused) instead of
    /// redialling into the same refusal.
    ///
    /// ```
    /// use msgr::auth::Refusal;
    /// use msgr::{ConnectError, FaultReason};
    /// // What `wait_connected` returns to a client the server does not know:
    /// let err = ConnectError::Closed(Some(FaultReason::Refused(Refusal::UnknownPeer)));
    /// assert!(err.to_string().contains("not in the peer's keyring"));
    /// ```
    pub use msgr_proto::Refusal;
    /// A secret that is wiped when dropped (a private key file's text).
    ///
    /// ```
    /// use msgr::auth::{StaticKeypair, Zeroizing};
    /// let file: Zeroizing<String> = StaticKeypair::generate().to_key_file(&msgr::EntityName::client(1));
    /// assert!(!file.is_empty());
    /// ```
    pub use zeroize::Zeroizing;
}

/// The README's example, compiled and run as a doctest so it cannot rot.
#[doc = include_str!("../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

/// Gives each type its message type number ([`TypedMessage::TYPE`]): one
/// line for what is otherwise an `impl` block per type.
///
/// ```
/// use serde::{Deserialize, Serialize};
/// #[derive(Serialize, Deserialize)]
/// struct Get(String);
/// #[derive(Serialize, Deserialize)]
/// struct Value(Option<Vec<u8>>);
/// msgr::typed_messages!(Get = 1, Value = 2);
///
/// use msgr::TypedMessage;
/// assert_eq!((Get::TYPE, Value::TYPE), (1, 2));
/// let m = msgr::Message::typed(&Get("k".into()))?;
/// assert_eq!(m.msg_type, 1);
/// # Ok::<(), msgr::CodecError>(())
/// ```
#[macro_export]
macro_rules! typed_messages {
    ($($ty:ty = $n:expr),+ $(,)?) => {
        $(impl $crate::TypedMessage for $ty {
            const TYPE: u16 = $n;
        })+
    };
}
