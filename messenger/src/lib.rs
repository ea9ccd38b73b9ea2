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
//! let conn = client.connect(server.addr())?;
//! conn.send(Message::encode(1, &Hello { text: "hi".into() })?)?;
//! assert_eq!(rx.recv_timeout(Duration::from_secs(10))?, "hi");
//! client.shutdown(Duration::from_secs(1));
//! server.shutdown(Duration::from_secs(1));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod call;
mod config;
mod connection;
mod counters;
mod dispatcher;
mod faults;
mod inbox;
mod messenger;
pub mod rma;
mod throttle;
mod worker;

/// The payload type of [`Message`]'s segments and of RMA reads: cheap to
/// clone, shared without copying.
pub use bytes::Bytes;
pub use call::{CallError, CallFuture, TypedCallError};
pub use config::{
    parse_policy, ConfigError, MessengerConfig, CONFIG_KEYS, MAX_CONFIG_FILE, RESERVED_ENV,
};
pub use connection::{
    ConnectError, Connection, ConnectionState, ConnectionStatus, SendError, SendFuture,
    SendRejected,
};
pub use counters::Counters;
pub use dispatcher::{Dispatcher, HandlerPanicPolicy, NullDispatcher};
pub use faults::{FaultPlan, FaultPlanError};
pub use inbox::{ConnectionEvent, ConnectionInbox, Events, Inbox, Messages, Recv, RecvApart};
pub use messenger::{
    Broadcast, MemoryUse, Messenger, MessengerBuilder, MessengerError, ShutdownFuture,
    ShutdownReport,
};
pub use msgr_addr::{
    AddrParseError, AddrVec, EntityAddr, EntityKind, EntityName, FabricEndpoint, FabricProvider,
    RdmaLocation, TransportKind,
};
pub use msgr_backends::{
    availability, rendezvous_withheld, Availability, FabricCqWait, FabricRendezvous,
    RdmaPoolConfig, RealFault, SimulatedFault, TransportError, TransportStats,
};
#[cfg(feature = "bincode")]
pub use msgr_proto::Bincode;
pub use msgr_proto::{
    Codec, CodecError, FaultReason, Frame, FrameError, FrameLimits, Message, PeerInfo, Policy,
    Postcard, ProtocolError, Segment, SessionConfig, TooLarge, TypedError, TypedMessage,
};
pub use rma::{Access, RmaError, RmaFuture, RmaHandle, RmaOp, RmaOptions, RmaRegion};
pub use worker::affinity::allowed_cpus;

/// Authentication and the secure mode: keys, keyrings, the modes a link
/// may run in (see the configuration keys `security`, `key_file` and
/// `keyring`, and [`MessengerBuilder::credentials`]).
pub mod auth {
    pub use msgr_proto::auth::{
        AuthError, Credentials, KeyFileError, Keyring, ModeSet, PeerVerifier, PublicKey,
        RecordError, Security, SecurityMode, StaticKeypair,
    };
    /// A secret that is wiped when dropped (a private key file's text).
    pub use zeroize::Zeroizing;
}

/// The README's example, compiled and run as a doctest so it cannot rot.
#[doc = include_str!("../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
