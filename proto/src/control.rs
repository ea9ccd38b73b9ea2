//! Payloads of the session's control frames, encoded with postcard.
//!
//! The connector's hello carries the session's `Policy`, so it lives with
//! the session (`session::Hello`); the frames' format is docs/PROTOCOL.md's.

use msgr_addr::{EntityAddr, EntityName};
use serde::{de::DeserializeOwned, Deserialize, Serialize};

use crate::codec::{Codec, Postcard};
use crate::error::Malformed;
use crate::frame::{Frame, Tag};

/// The largest payload segments a side accepts (its `FrameLimits` for a
/// message's front and data), announced in the handshake so that a peer
/// refuses a message too large for it at `send` instead of sending a
/// frame that can only be rejected (and, lossless, replayed into the same
/// rejection for ever).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Largest front segment accepted, in bytes.
    pub max_front: u32,
    /// Largest data segment accepted, in bytes.
    pub max_data: u32,
}

impl Limits {
    /// The message limits of a side's frame limits.
    pub fn of(limits: &crate::FrameLimits) -> Limits {
        Limits {
            max_front: limits.max_segment[1],
            max_data: limits.max_segment[2],
        }
    }

    /// Whether a message with these segment lengths fits; if not, which
    /// segment does not, its length and the limit.
    pub fn check(&self, front: usize, data: usize) -> Result<(), TooLarge> {
        for (segment, len, max) in [
            (Segment::Front, front, self.max_front),
            (Segment::Data, data, self.max_data),
        ] {
            if len > max as usize {
                return Err(TooLarge { segment, len, max });
            }
        }
        Ok(())
    }
}

/// One of a message's two payload segments.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Segment {
    /// The front segment (typically the encoded typed payload).
    Front,
    /// The data segment (bulk bytes).
    Data,
}

impl std::fmt::Display for Segment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Segment::Front => "front",
            Segment::Data => "data",
        })
    }
}

/// A message segment is larger than the peer accepts (its [`Limits`]):
/// why a send is refused, or a session that queued it ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
#[error(
    "message {segment} of {len} bytes is more than the peer takes ({max}){hint}",
    hint = match segment {
        // The front is for the header-like part, bounded small on purpose.
        Segment::Front => "; bulk bytes belong in the data segment (Message::new's third \
                           argument, up to max_data_bytes), not the front",
        Segment::Data => "",
    }
)]
pub struct TooLarge {
    /// Which segment.
    pub segment: Segment,
    /// Its length in bytes.
    pub len: usize,
    /// The peer's limit for it.
    pub max: u32,
}

/// The acceptor's answer to a [`Hello`](crate::session::Hello) that starts a new session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HelloOk {
    /// The acceptor's entity name.
    pub name: EntityName,
    /// The acceptor's address.
    pub addr: EntityAddr,
    /// The new session's cookie.
    pub cookie: u64,
}

/// The acceptor resumes the session: replay what I have not received.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReconnectOk {
    /// The acceptor's entity name.
    pub name: EntityName,
    /// The acceptor's address.
    pub addr: EntityAddr,
    /// Highest sequence number the acceptor has received.
    pub in_seq: u64,
}

/// Cumulative acknowledgement.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ack {
    /// Every message up to and including this sequence number has arrived.
    pub seq: u64,
}

/// Keepalive probe or its answer; the stamp is echoed for round-trip measurement.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Keepalive {
    /// Sender's opaque stamp (microseconds on its clock).
    pub stamp: u64,
}

/// A keepalive where both sides offered `features::PACED_KEEPALIVE`: not
/// answered; it tells the receiver how long its sender waits for a frame
/// before it gives the link up, and the receiver sends something at least
/// every third of that.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PacedKeepalive {
    /// Sender's opaque stamp (microseconds on its clock).
    pub stamp: u64,
    /// The sender's keepalive timeout, milliseconds.
    pub timeout_ms: u64,
}

/// Orderly end of a session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Close {
    /// Why the sender ends the session.
    pub reason: String,
}

/// Why an acceptor refused a connector for good: a refusal that another
/// dial would meet again, so the connector ends the session instead of
/// redialling. It travels as a [`Close`] frame with a second segment, the
/// refusal's code (a `u16`, postcard), where both banners offered
/// `features::REFUSALS` ([`refusal_frame`], [`parse_refusal`]); the close's
/// reason is the code's fixed text. Neither carries key material, nor
/// anything the connector did not send itself.
///
/// ```
/// use msgr_proto::control::{parse_refusal, refusal_frame, Refusal};
///
/// let frame = refusal_frame(&Refusal::UnknownPeer);
/// assert_eq!(parse_refusal(&frame).unwrap(), Refusal::UnknownPeer);
/// assert_eq!(Refusal::UnknownPeer.to_string(), "our name is not in the peer's keyring");
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Refusal {
    /// The acceptor's keyring does not list the name the connector proved
    /// (code 1).
    UnknownPeer,
    /// The acceptor's keyring lists another key for the name the
    /// connector proved: an impostor, or a key changed on one side only
    /// (code 2).
    WrongKey,
    /// A code this build does not know (a newer peer's), with the text
    /// the peer gave it (cut, control characters replaced).
    Other {
        /// The refusal's code.
        code: u16,
        /// The peer's text for it.
        text: String,
    },
}

/// The longest peer text a [`Refusal::Other`] keeps, in characters.
const REFUSAL_TEXT_MAX: usize = 120;

impl Refusal {
    /// The refusal's code on the wire.
    pub fn code(&self) -> u16 {
        match self {
            Refusal::UnknownPeer => 1,
            Refusal::WrongKey => 2,
            Refusal::Other { code, .. } => *code,
        }
    }

    /// The refusal of `code`; `text` (the close's reason) names a code
    /// this build does not know.
    pub fn from_code(code: u16, text: &str) -> Refusal {
        match code {
            1 => Refusal::UnknownPeer,
            2 => Refusal::WrongKey,
            _ => Refusal::Other {
                code,
                text: text
                    .chars()
                    .take(REFUSAL_TEXT_MAX)
                    .map(|c| if c.is_control() { '?' } else { c })
                    .collect(),
            },
        }
    }

    /// The close's reason: the code's fixed text, as the acceptor says it.
    fn wire_text(&self) -> &str {
        match self {
            Refusal::UnknownPeer => "refused: your name is not in my keyring",
            Refusal::WrongKey => "refused: my keyring lists another key for your name",
            Refusal::Other { text, .. } => text,
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::UnknownPeer => f.write_str("our name is not in the peer's keyring"),
            Refusal::WrongKey => {
                f.write_str("the peer's keyring lists another key for our name (an impostor?)")
            }
            Refusal::Other { code, text } => write!(f, "{text} (refusal code {code})"),
        }
    }
}

/// The close frame that carries `refusal` (`features::REFUSALS`).
pub fn refusal_frame(refusal: &Refusal) -> Frame {
    let close = Close {
        reason: refusal.wire_text().to_owned(),
    };
    let mut frame = control_frame(Tag::Close, &close);
    frame
        .segments
        .push(Postcard.encode(&refusal.code()).unwrap_or_default());
    frame
}

/// The refusal a close frame with two segments carries.
pub fn parse_refusal(frame: &Frame) -> Result<Refusal, Malformed> {
    let [reason, code] = frame.segments.as_slice() else {
        return Err(Malformed {
            what: "refusal",
            detail: format!("{} segments where 2 were expected", frame.segments.len()),
        });
    };
    let close: Close = decode(reason, "refusal")?;
    let code: u16 = decode(code, "refusal")?;
    Ok(Refusal::from_code(code, &close.reason))
}

/// Encodes a control payload into a single-segment frame.
pub fn control_frame<T: Serialize>(tag: Tag, payload: &T) -> Frame {
    // Control payloads are plain structs of integers and strings: postcard
    // cannot fail on them, short of running out of memory.
    let bytes = Postcard.encode(payload).unwrap_or_default();
    Frame::single(tag, bytes)
}

/// A handshake frame (hello, hello-ok, reconnect-ok) carrying `limits` in
/// a second segment, as sent where both banners offered
/// `features::LIMITS`.
pub fn with_limits(mut frame: Frame, limits: &Limits) -> Frame {
    frame
        .segments
        .push(Postcard.encode(limits).unwrap_or_default());
    frame
}

/// A handshake frame (hello, hello-ok, reconnect-ok) carrying a dial
/// number in a last segment, as sent where both banners offered
/// `features::DIAL_NUMBERS`: in a hello the number of its dial, in
/// hello-ok and reconnect-ok the sender's last dial so far.
pub fn with_dial_number(mut frame: Frame, number: u64) -> Frame {
    frame
        .segments
        .push(Postcard.encode(&number).unwrap_or_default());
    frame
}

/// What a handshake frame carries beyond its payload, as the link agreed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HandshakeExtras {
    /// The sender's receive limits (`features::LIMITS`).
    pub limits: Option<Limits>,
    /// The dial number (`features::DIAL_NUMBERS`, [`with_dial_number`]).
    pub dial: Option<u64>,
}

/// Decodes a handshake frame: its payload, then its limits segment where
/// `limits` says the link agreed to them, then its dial number where
/// `dials` says so (each must then be there; else it must not).
pub fn parse_handshake<T: DeserializeOwned>(
    frame: &Frame,
    what: &'static str,
    limits: bool,
    dials: bool,
) -> Result<(T, HandshakeExtras), Malformed> {
    let want = 1 + usize::from(limits) + usize::from(dials);
    let segs = frame.segments.as_slice();
    if segs.len() != want {
        return Err(Malformed {
            what,
            detail: format!("{} segments where {want} were agreed", segs.len()),
        });
    }
    let payload = decode(&segs[0], what)?;
    let mut extras = HandshakeExtras::default();
    if limits {
        extras.limits = Some(decode(&segs[1], what)?);
    }
    if dials {
        extras.dial = Some(decode(&segs[want - 1], what)?);
    }
    Ok((payload, extras))
}

fn decode<T: DeserializeOwned>(seg: &[u8], what: &'static str) -> Result<T, Malformed> {
    Postcard.decode(seg).map_err(|e| Malformed {
        what,
        detail: e.detail,
    })
}

/// Decodes the single segment of a control frame.
pub fn parse_control<T: DeserializeOwned>(
    frame: &Frame,
    what: &'static str,
) -> Result<T, Malformed> {
    let [seg] = frame.segments.as_slice() else {
        return Err(Malformed {
            what,
            detail: "expected one segment".into(),
        });
    };
    decode(seg, what)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 60: a front segment refused as too large says where bulk
    /// bytes go; a data segment's refusal says only the limit.
    #[test]
    fn a_front_too_large_points_at_the_data_segment() {
        let front = TooLarge {
            segment: Segment::Front,
            len: 100 << 20,
            max: 64 << 10,
        };
        let text = front.to_string();
        assert!(text.contains("more than the peer takes (65536)"), "{text}");
        assert!(text.contains("belong in the data segment"), "{text}");
        let data = TooLarge {
            segment: Segment::Data,
            ..front
        };
        assert!(!data.to_string().contains("data segment"), "{data}");
    }
}
