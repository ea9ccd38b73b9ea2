//! The msgr wire protocol, with no I/O in it.
//!
//! # Layers
//!
//! The modules import in one direction: each only from the layers below
//! its own, never from its own layer or above (`tests/layering.rs` reads
//! this list, and the same section of every module with submodules, and
//! checks every `crate::` and `super::` path in `src/`). Bottom first:
//!
//! 1. [`checksum`], [`codec`], [`arena`], [`pool`], [`error`], [`link_failure`], [`priority`]:
//!    the leaves — CRC32C; typed payloads;
//!    small byte strings copied into shared chunks; large buffers lent as
//!    `Bytes` and reused; the decode errors several layers return
//!    ([`FrameError`], [`Malformed`]); why a transport's link failed
//!    ([`LinkFailure`]), which sessions carry; the priority classes
//!    ([`Priority`]).
//! 2. [`frame`]: where a frame is encoded and decoded (preamble, segments,
//!    CRC32C), and the overhead sealing adds to a frame.
//! 3. [`banner`]: the first bytes of every connection; version, features,
//!    the security modes they offer ([`banner::ModeSet`]), [`BannerError`].
//! 4. [`message`]: application messages and their frame form.
//! 5. [`batch`], [`fragment`]: many small messages in one frame (one
//!    preamble, one CRC32C); one large message in many bounded fragments of
//!    its class, and their reassembly.
//! 6. [`control`], [`view`]: payloads of the session's control frames;
//!    received batch entries read in place ([`MessageRef`]).
//! 7. [`rma`]: one-sided operations on exposed regions: the handle, and the
//!    request and reply where the owner's CPU serves them.
//! 8. [`stream`]: the units transports move, and the byte-stream splitter.
//! 9. [`auth`]: authentication (Noise handshake, keys, keyrings) and the
//!    secure mode's record layer, taking and returning frames.
//! 10. [`session`]: the session engine — handshake, seq/ack, replay,
//!     reconnect, keepalive — as a pure state machine driven by its caller;
//!     it owns [`Policy`], the [`session::Hello`] that carries it, and
//!     [`ProtocolError`], which wraps every lower layer's error.
//! 11. `sim`: the in-memory simulator and the fuzz targets' bodies (feature
//!     `sim`), a test harness on top of everything.
//!
//! Where a type moved down a layer, a path other crates use stays:
//! [`auth::ModeSet`] and [`auth::SecurityMode`] re-export banner's.
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
pub mod fragment;
pub mod frame;
pub mod link_failure;
pub mod message;
pub mod pool;
pub mod priority;
pub mod rma;
pub mod session;
#[cfg(feature = "sim")]
pub mod sim;
pub mod stream;
pub mod view;

pub use banner::{Banner, BannerError};
#[cfg(feature = "bincode")]
pub use codec::Bincode;
pub use codec::{Codec, CodecError, Postcard, TypedError, TypedMessage};
pub use control::{Refusal, Segment, TooLarge};
pub use error::{FrameError, Malformed};
pub use frame::{Frame, FrameDecoder, FrameLimits, Tag};
pub use link_failure::LinkFailure;
pub use message::Message;
pub use priority::Priority;
pub use session::{
    FaultReason, LinkId, LocalIdentity, PeerInfo, Phase, Policy, ProtocolError, Received,
    SendError, Session, SessionConfig, SessionEvent, SessionStats, Takeover,
};
pub use stream::{CheckedUnit, Inbound, StreamDecoder, Transmit};
pub use view::{MessageRef, ReceivedBatch};
