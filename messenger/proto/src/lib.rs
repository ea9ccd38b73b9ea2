//! The msgr wire protocol, with no I/O in it.
//!
//! - [`arena`]: small byte strings copied into shared chunks.
//! - [`auth`]: authentication (Noise handshake, keys, keyrings) and the
//!   secure mode's record layer.
//! - [`frame`]: where a frame is encoded and decoded (preamble, segments, CRC32C).
//! - [`banner`]: the first bytes of every connection; version and features.
//! - [`message`]: application messages and their frame form; [`codec`] for typed payloads.
//! - [`batch`]: many small messages in one frame (one preamble, one CRC32C).
//! - [`control`]: payloads of the session's control frames.
//! - [`pool`]: large buffers lent as `Bytes` and reused.
//! - [`rma`]: one-sided operations on exposed regions: the handle, and the
//!   request and reply where the owner's CPU serves them.
//! - [`stream`]: the units transports move, and the byte-stream splitter.
//! - [`session`]: the session engine — handshake, seq/ack, replay, reconnect,
//!   keepalive — as a pure state machine driven by its caller.
//!
//! Everything here reads untrusted peer input and returns typed errors; nothing
//! panics on it. The format is specified in docs/PROTOCOL.md.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod arena;
pub mod auth;
pub mod banner;
pub mod batch;
pub mod checksum;
pub mod codec;
pub mod control;
pub mod error;
pub mod frame;
pub mod message;
pub mod pool;
pub mod rma;
pub mod session;
#[cfg(feature = "sim")]
pub mod sim;
pub mod stream;

pub use banner::{Banner, BannerError};
#[cfg(feature = "bincode")]
pub use codec::Bincode;
pub use codec::{Codec, CodecError, Postcard, TypedError, TypedMessage};
pub use control::{Segment, TooLarge};
pub use error::{FrameError, Malformed};
pub use frame::{Frame, FrameDecoder, FrameLimits, Tag};
pub use message::Message;
pub use session::{
    FaultReason, LinkId, LocalIdentity, PeerInfo, Policy, ProtocolError, SendError, Session,
    SessionConfig, SessionEvent, SessionStats, Takeover,
};
pub use stream::{CheckedUnit, Inbound, StreamDecoder, Transmit};
