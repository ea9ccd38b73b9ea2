//! Pluggable encoding of typed payloads. The default, [`Postcard`], has a
//! documented, stable wire format.

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
/// use msgr_proto::{Message, TypedError, TypedMessage};
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
#[derive(Debug, Clone, PartialEq, Eq, Error)]
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

/// Turns typed values into message payload bytes and back. Implement it to use
/// another serde format; decoding must never panic on arbitrary bytes.
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
