//! Pluggable encoding of typed payloads. The default, [`Postcard`], has a
//! documented, stable wire format; `Bincode` (feature `bincode`) is the
//! other one offered. Both sides of a message type must use the same codec:
//! neither format says which it is.

use bytes::Bytes;
use serde::{de::DeserializeOwned, Serialize};
use thiserror::Error;

/// A typed payload could not be encoded or decoded.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{codec} codec: {detail}")]
pub struct CodecError {
    /// Which codec.
    pub codec: &'static str,
    /// What went wrong.
    pub detail: String,
}

/// A Rust type that travels as one message type. Its [`TypedMessage::TYPE`]
/// goes in the message header ([`crate::Message::typed`]), and decoding
/// checks it ([`crate::Message::decode_typed`]): a message of another type
/// is a [`TypedError::WrongType`], never a value decoded from bytes meant
/// for something else (postcard is not self-describing: a `Temp { celsius:
/// 21 }` decodes as an `Id { id: 21 }` without this check).
///
/// ```
/// # use msgr_proto::{Message, TypedError, TypedMessage};
/// #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
/// struct Temp { celsius: i32 }
/// impl TypedMessage for Temp { const TYPE: u16 = 9; }
/// #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
/// struct Id { id: i32 }
/// impl TypedMessage for Id { const TYPE: u16 = 10; }
///
/// let m = Message::typed(&Temp { celsius: 21 }).unwrap();
/// assert_eq!(m.msg_type, 9);
/// assert_eq!(m.decode_typed::<Temp>(), Ok(Temp { celsius: 21 }));
/// assert!(matches!(m.decode_typed::<Id>(), Err(TypedError::WrongType { expected: 10, actual: 9, .. })));
/// ```
pub trait TypedMessage: Serialize + DeserializeOwned {
    /// The message type number of this Rust type: one per type within an
    /// application (the raw `msg_type` API shares the same numbers).
    const TYPE: u16;
}

/// A typed message could not be decoded.
#[derive(Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum TypedError {
    /// The message is of another type than the one asked for.
    #[error("message type {actual} is not a {name} (type {expected})")]
    WrongType {
        /// The asked type's [`TypedMessage::TYPE`].
        expected: u16,
        /// The message's type.
        actual: u16,
        /// The asked Rust type's name.
        name: &'static str,
    },
    /// The type matches but the payload does not decode.
    #[error(transparent)]
    Codec(#[from] CodecError),
}

msgr_addr::debug_is_display!(TypedError);

/// Turns typed values into message payload bytes and back. Implement it to use
/// another serde format; decoding must never panic on arbitrary bytes.
///
/// Which to pick:
/// - **postcard** (the default): integers as varints, so small numbers take
///   one or two bytes — the most compact for typical structs of ids,
///   counts and short strings; a stable, documented format (1.x); `no_std`
///   capable (a peer on a microcontroller can speak it).
/// - **bincode** (2.x, its `legacy` layout: bincode 1.x's format):
///   integers at their full width, little-endian. Larger for small
///   numbers, but each integer is written with a plain store: encoding
///   large numeric arrays (`Vec<u64>`, `Vec<f32>`...) is much cheaper than
///   varint's byte-by-byte loop. Decoding is not (serde reads a sequence
///   element by element either way). For payloads that are mostly large
///   numeric arrays, encoded more often than decoded, where size on the
///   wire matters less; for bulk bytes the message's `data` segment (no
///   codec at all) is cheaper than either.
///
/// `cargo bench -p msgr-proto --bench codec -- codecs` compares them. On
/// one run (a shared 2-core machine, so take ±15 %): a small struct of
/// ids, counts and a short name, postcard 18 B, bincode 41 B, both
/// ~350 ns to encode and 120–145 ns to decode; 64 Ki `u64`s of every
/// magnitude, postcard 324 KB, 0.96 ms to encode, 0.55 ms to decode,
/// bincode 524 KB, 0.12 ms to encode (8× faster), 0.58 ms to decode.
pub trait Codec {
    /// Encodes a value.
    fn encode<T: Serialize>(&self, value: &T) -> Result<Bytes, CodecError>;
    /// Decodes a value; trailing bytes are an error.
    fn decode<T: DeserializeOwned>(&self, bytes: &[u8]) -> Result<T, CodecError>;
}

/// The default codec: postcard 1.x.
#[derive(Clone, Copy, Debug, Default)]
pub struct Postcard;

impl Codec for Postcard {
    fn encode<T: Serialize>(&self, value: &T) -> Result<Bytes, CodecError> {
        postcard::to_stdvec(value)
            .map(Bytes::from)
            .map_err(|e| CodecError {
                codec: "postcard",
                detail: e.to_string(),
            })
    }

    fn decode<T: DeserializeOwned>(&self, bytes: &[u8]) -> Result<T, CodecError> {
        match postcard::take_from_bytes(bytes) {
            Ok((v, [])) => Ok(v),
            Ok((_, rest)) => Err(CodecError {
                codec: "postcard",
                detail: format!("{} trailing bytes", rest.len()),
            }),
            Err(e) => Err(CodecError {
                codec: "postcard",
                detail: e.to_string(),
            }),
        }
    }
}

/// The bincode 2 codec in its `legacy` configuration (little-endian,
/// fixed-width integers: the format of bincode 1.x's `serialize`); see
/// [`Codec`] for when to choose it over [`Postcard`]. Feature `bincode`.
///
/// Decoding bounds what a length prefix may make it allocate by the
/// input's size (a string's or byte buffer's bytes must be in the input):
/// a hostile prefix is an error, not a huge allocation.
#[cfg(feature = "bincode")]
#[derive(Clone, Copy, Debug, Default)]
pub struct Bincode;

#[cfg(feature = "bincode")]
impl Bincode {
    const CONFIG: bincode::config::Configuration<
        bincode::config::LittleEndian,
        bincode::config::Fixint,
    > = bincode::config::legacy();

    /// Decodes with at most `LIMIT` bytes claimed for strings and byte
    /// buffers (bincode allocates what a length prefix claims before it
    /// reads the bytes).
    fn decode_within<const LIMIT: usize, T: DeserializeOwned>(
        bytes: &[u8],
    ) -> Result<(T, usize), bincode::error::DecodeError> {
        bincode::serde::decode_from_slice(bytes, Self::CONFIG.with_limit::<LIMIT>())
    }

    fn error(detail: impl std::fmt::Display) -> CodecError {
        CodecError {
            codec: "bincode",
            detail: detail.to_string(),
        }
    }
}

#[cfg(feature = "bincode")]
impl Codec for Bincode {
    fn encode<T: Serialize>(&self, value: &T) -> Result<Bytes, CodecError> {
        bincode::serde::encode_to_vec(value, Self::CONFIG)
            .map(Bytes::from)
            .map_err(Self::error)
    }

    fn decode<T: DeserializeOwned>(&self, bytes: &[u8]) -> Result<T, CodecError> {
        // Only strings and byte buffers claim bytes (serde's sequences
        // grow as they are read), and a valid input holds what they claim:
        // a limit at or above the input's length refuses nothing valid,
        // and one at most 16 times it (4 KiB for small inputs) bounds
        // what a lying prefix allocates (no bound past 256 MiB of input,
        // 16 times the largest front segment by default).
        let r = match bytes.len() as u64 {
            0..=0x1000 => Self::decode_within::<0x1000, T>(bytes),
            0x1001..=0x1_0000 => Self::decode_within::<0x1_0000, T>(bytes),
            0x1_0001..=0x10_0000 => Self::decode_within::<0x10_0000, T>(bytes),
            0x10_0001..=0x100_0000 => Self::decode_within::<0x100_0000, T>(bytes),
            0x100_0001..=0x1000_0000 => Self::decode_within::<0x1000_0000, T>(bytes),
            _ => Self::decode_within::<{ usize::MAX }, T>(bytes),
        };
        match r {
            Ok((v, read)) if read == bytes.len() => Ok(v),
            Ok((_, read)) => Err(Self::error(format_args!(
                "{} trailing bytes",
                bytes.len() - read
            ))),
            Err(e) => Err(Self::error(e)),
        }
    }
}
