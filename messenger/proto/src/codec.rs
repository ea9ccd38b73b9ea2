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
