//! One-sided RMA on the wire: the handle a region's owner hands out, and the
//! request and reply a peer's read or write travels as where no NIC does
//! the work (docs/PROTOCOL.md §6).
//!
//! An operation is a call (`features::CALLS`) whose id has [`RMA_BIT`] set,
//! between peers that agreed `features::RMA`: the owner's messenger answers
//! it from the exposed region, never the application's dispatcher. Being a
//! message, it is numbered, acknowledged, batched, sealed in secure mode and
//! replayed after a reconnect like any other, so on a lossless session each
//! operation lands exactly once.
//!
//! - request (front segment, [`REQUEST_LEN`] bytes): op u8 (1 read, 2
//!   write) | flags u8 (bit 0: checksum; bit 1: the requester moves the
//!   region natively where its link can, send the region's key) |
//!   reserved u16 (0) | region u64 |
//!   capability 16 B | offset u64 | length u64. A write's bytes are the
//!   data segment, exactly `length` of them; with the checksum flag, their
//!   CRC32C follows the request in the front (4 more bytes).
//! - reply (front segment, [`REPLY_LEN`] bytes): status u8 ([`RmaStatus`]) |
//!   flags u8 (bit 0: a key follows) | reserved 2 B (0) | CRC32C u32 of the
//!   bytes read (checksum flag; else 0); with the key flag, the region
//!   u64 and the transport's key for it on this link (1 to [`KEY_MAX`]
//!   bytes: [`RmaKey`]). A read's bytes are the data segment.
//!
//! Nothing here trusts its input: every decoder returns [`RmaWireError`].

use serde::{Deserialize, Serialize};

/// Call-id bit of an RMA operation (bit 63 is [`crate::message::REPLY_BIT`]).
pub const RMA_BIT: u64 = 1 << 62;

/// Bytes of an encoded request, without a write's checksum.
pub const REQUEST_LEN: usize = 44;

/// Bytes of an encoded reply.
pub const REPLY_LEN: usize = 8;

/// Request flag: a CRC32C of the bytes moved travels with them and is
/// checked where they land.
const FLAG_CHECKSUM: u8 = 1;

/// Request flag: the requester's link moves regions natively; answer with
/// the region's key on this link if the owner's has one.
const FLAG_WANT_KEY: u8 = 2;

/// Reply flag: the region's key follows the fixed part.
const FLAG_KEY: u8 = 1;

/// Reply flag: a refusal's figures follow the fixed part (the region's
/// length, 8 bytes, for [`RmaStatus::OutOfRegion`]); sent only to a peer
/// that agreed `features::RMA_FIGURES`.
const FLAG_FIGURES: u8 = 2;

/// The largest key a reply carries (a libfabric key is 48 bytes).
pub const KEY_MAX: usize = 64;

/// What a region lets its peers do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Access {
    /// Peers may read it.
    Read,
    /// Peers may write it.
    Write,
    /// Peers may read and write it.
    ReadWrite,
}

impl Access {
    /// Whether `op` is allowed.
    pub fn allows(self, op: RmaOp) -> bool {
        matches!(
            (self, op),
            (Access::ReadWrite, _) | (Access::Read, RmaOp::Read) | (Access::Write, RmaOp::Write)
        )
    }
}

/// A one-sided operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RmaOp {
    /// Copy bytes out of the region.
    Read,
    /// Copy bytes into the region.
    Write,
}

/// A region's name and rights as its owner hands them to a peer: small,
/// serializable (serde), to travel inside any message or call, as a
/// Mercury bulk handle travels in an RPC. Whoever holds it may use it as
/// its rights say on a connection to the owner (and only to peers the
/// owner named, if it named any): keep it as you would a password.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RmaHandle {
    /// The region's number in its owner's messenger.
    pub region: u64,
    /// Its length in bytes.
    pub len: u64,
    /// What the holder may do.
    pub access: Access,
    /// The random capability the owner checks on every operation.
    pub capability: [u8; 16],
}

impl std::fmt::Debug for RmaHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The capability is a secret: not in logs.
        f.debug_struct("RmaHandle")
            .field("region", &self.region)
            .field("len", &self.len)
            .field("access", &self.access)
            .finish_non_exhaustive()
    }
}

/// A decoded request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RmaRequest {
    /// Read or write.
    pub op: RmaOp,
    /// The region named by the handle.
    pub region: u64,
    /// The handle's capability.
    pub capability: [u8; 16],
    /// Where in the region.
    pub offset: u64,
    /// How many bytes.
    pub len: u64,
    /// With a checksum: a write's CRC32C (as sent), or `Some(0)` for a
    /// read that asks for one.
    pub checksum: Option<u32>,
    /// An operation whose requester would move the region natively: the
    /// owner sends the region's key with the reply, if its transport has
    /// one.
    pub want_key: bool,
}

impl RmaRequest {
    /// The request's front segment.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(REQUEST_LEN + 4);
        b.push(match self.op {
            RmaOp::Read => 1,
            RmaOp::Write => 2,
        });
        let want_key = self.want_key;
        b.push(
            if self.checksum.is_some() {
                FLAG_CHECKSUM
            } else {
                0
            } | if want_key { FLAG_WANT_KEY } else { 0 },
        );
        b.extend_from_slice(&[0, 0]);
        b.extend_from_slice(&self.region.to_le_bytes());
        b.extend_from_slice(&self.capability);
        b.extend_from_slice(&self.offset.to_le_bytes());
        b.extend_from_slice(&self.len.to_le_bytes());
        if let (RmaOp::Write, Some(crc)) = (self.op, self.checksum) {
            b.extend_from_slice(&crc.to_le_bytes());
        }
        b
    }

    /// Decodes a request's front segment.
    pub fn decode(front: &[u8]) -> Result<RmaRequest, RmaWireError> {
        let fixed = front.get(..REQUEST_LEN).ok_or(RmaWireError::Short {
            what: "request",
            len: front.len(),
        })?;
        let op = match fixed[0] {
            1 => RmaOp::Read,
            2 => RmaOp::Write,
            other => return Err(RmaWireError::UnknownOp(other)),
        };
        let known = FLAG_CHECKSUM | FLAG_WANT_KEY;
        if fixed[1] & !known != 0 || fixed[2..4] != [0, 0] {
            return Err(RmaWireError::Reserved);
        }
        let u64_at = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&fixed[i..i + 8]);
            u64::from_le_bytes(a)
        };
        let mut capability = [0u8; 16];
        capability.copy_from_slice(&fixed[12..28]);
        let rest = &front[REQUEST_LEN..];
        let checksum = match (fixed[1] & FLAG_CHECKSUM != 0, op, rest.len()) {
            (false, _, 0) => None,
            (true, RmaOp::Read, 0) => Some(0),
            (true, RmaOp::Write, 4) => {
                Some(u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]))
            }
            _ => return Err(RmaWireError::Trailing(rest.len())),
        };
        Ok(RmaRequest {
            op,
            region: u64_at(4),
            capability,
            offset: u64_at(28),
            len: u64_at(36),
            checksum,
            want_key: fixed[1] & FLAG_WANT_KEY != 0,
        })
    }
}

/// How an operation ended, as the owner says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RmaStatus {
    /// Done.
    Ok,
    /// No such region any more: revoked or dropped (or never exposed).
    Revoked,
    /// The capability is not the region's, or the region was not exposed
    /// to this peer.
    Denied,
    /// The range is not inside the region.
    OutOfRange,
    /// The region does not allow this operation.
    Forbidden,
    /// A write's bytes did not match the checksum sent with them.
    Corrupt,
    /// The request does not parse.
    Malformed,
    /// The range is not inside the region, whose length the owner says
    /// (to a peer that agreed `features::RMA_FIGURES`; on the wire:
    /// [`RmaStatus::OutOfRange`]'s code with the length after it).
    OutOfRegion {
        /// The region's length, in bytes.
        region_len: u64,
    },
    /// No region of that id was ever exposed by this owner (as it runs
    /// now): not revoked, never there (to a peer that agreed
    /// `features::RMA_FIGURES`; others are told [`RmaStatus::Revoked`]).
    UnknownRegion,
}

impl RmaStatus {
    fn code(self) -> u8 {
        match self {
            RmaStatus::Ok => 0,
            RmaStatus::Revoked => 1,
            RmaStatus::Denied => 2,
            RmaStatus::OutOfRange => 3,
            RmaStatus::Forbidden => 4,
            RmaStatus::Corrupt => 5,
            RmaStatus::Malformed => 6,
            RmaStatus::OutOfRegion { .. } => 3,
            RmaStatus::UnknownRegion => 7,
        }
    }

    fn of(code: u8) -> Option<RmaStatus> {
        Some(match code {
            0 => RmaStatus::Ok,
            1 => RmaStatus::Revoked,
            2 => RmaStatus::Denied,
            3 => RmaStatus::OutOfRange,
            4 => RmaStatus::Forbidden,
            5 => RmaStatus::Corrupt,
            6 => RmaStatus::Malformed,
            7 => RmaStatus::UnknownRegion,
            _ => return None,
        })
    }
}

/// A region's key on the link a reply came over: what the requester's
/// transport needs to read it natively (opaque here).
#[derive(Clone, PartialEq, Eq)]
pub struct RmaKey {
    /// The region.
    pub region: u64,
    /// The owner's transport's key (1 to [`KEY_MAX`] bytes).
    pub key: Vec<u8>,
}

impl std::fmt::Debug for RmaKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key opens the region: not in logs.
        f.debug_struct("RmaKey")
            .field("region", &self.region)
            .field("len", &self.key.len())
            .finish_non_exhaustive()
    }
}

/// A decoded reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RmaReply {
    /// How it ended.
    pub status: RmaStatus,
    /// A read's CRC32C, if asked for (else 0).
    pub checksum: u32,
    /// The region's key on this link, for a request that wanted it and an
    /// owner that has one.
    pub key: Option<RmaKey>,
}

impl RmaReply {
    /// The reply's front segment.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; REPLY_LEN];
        b[0] = self.status.code();
        b[4..8].copy_from_slice(&self.checksum.to_le_bytes());
        if let Some(k) = self
            .key
            .as_ref()
            .filter(|k| (1..=KEY_MAX).contains(&k.key.len()))
        {
            b[1] = FLAG_KEY;
            b.extend_from_slice(&k.region.to_le_bytes());
            b.extend_from_slice(&k.key);
        } else if let RmaStatus::OutOfRegion { region_len } = self.status {
            b[1] = FLAG_FIGURES;
            b.extend_from_slice(&region_len.to_le_bytes());
        }
        b
    }

    /// Decodes a reply's front segment.
    pub fn decode(front: &[u8]) -> Result<RmaReply, RmaWireError> {
        let fixed = front.get(..REPLY_LEN).ok_or(RmaWireError::Short {
            what: "reply",
            len: front.len(),
        })?;
        if fixed[1] & !(FLAG_KEY | FLAG_FIGURES) != 0 || fixed[2..4] != [0, 0] {
            return Err(RmaWireError::Reserved);
        }
        let mut status = RmaStatus::of(fixed[0]).ok_or(RmaWireError::UnknownStatus(fixed[0]))?;
        let rest = &front[REPLY_LEN..];
        let key = match (fixed[1], rest.len()) {
            (0, 0) => None,
            (FLAG_FIGURES, 8) if status == RmaStatus::OutOfRange => {
                let mut len = [0u8; 8];
                len.copy_from_slice(rest);
                status = RmaStatus::OutOfRegion {
                    region_len: u64::from_le_bytes(len),
                };
                None
            }
            (FLAG_KEY, n) if (9..=8 + KEY_MAX).contains(&n) => {
                let mut region = [0u8; 8];
                region.copy_from_slice(&rest[..8]);
                Some(RmaKey {
                    region: u64::from_le_bytes(region),
                    key: rest[8..].to_vec(),
                })
            }
            (_, n) => return Err(RmaWireError::Trailing(n)),
        };
        Ok(RmaReply {
            status,
            checksum: u32::from_le_bytes([fixed[4], fixed[5], fixed[6], fixed[7]]),
            key,
        })
    }
}

/// An RMA request or reply that does not parse.
#[derive(Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RmaWireError {
    /// Shorter (or, for a reply, other) than its fixed part.
    #[error("RMA {what} of {len} bytes")]
    Short {
        /// Request or reply.
        what: &'static str,
        /// Its length.
        len: usize,
    },
    /// An operation this version does not know.
    #[error("unknown RMA operation {0}")]
    UnknownOp(u8),
    /// A status this version does not know.
    #[error("unknown RMA status {0}")]
    UnknownStatus(u8),
    /// A reserved bit or byte is set.
    #[error("reserved bits set in an RMA request or reply")]
    Reserved,
    /// Bytes after the request or reply that its flags do not account for.
    #[error("{0} unexpected bytes after an RMA request or reply")]
    Trailing(usize),
}

msgr_addr::debug_is_display!(RmaWireError);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_replies_round_trip() {
        for (op, checksum) in [
            (RmaOp::Read, None),
            (RmaOp::Read, Some(0)),
            (RmaOp::Write, None),
            (RmaOp::Write, Some(0xdead_beef)),
        ] {
            let r = RmaRequest {
                op,
                region: 7,
                capability: [9; 16],
                offset: 1 << 40,
                len: 4096,
                checksum,
                want_key: checksum.is_none(),
            };
            assert_eq!(RmaRequest::decode(&r.encode()), Ok(r));
        }
        let rep = RmaReply {
            status: RmaStatus::OutOfRange,
            checksum: 5,
            key: None,
        };
        assert_eq!(RmaReply::decode(&rep.encode()), Ok(rep));
        let keyed = RmaReply {
            status: RmaStatus::Ok,
            checksum: 0,
            key: Some(RmaKey {
                region: 3,
                key: vec![1; 48],
            }),
        };
        assert_eq!(RmaReply::decode(&keyed.encode()), Ok(keyed.clone()));
        // A refusal with the owner's figures (`features::RMA_FIGURES`).
        for status in [
            RmaStatus::OutOfRegion {
                region_len: 5 << 30,
            },
            RmaStatus::UnknownRegion,
        ] {
            let rep = RmaReply {
                status,
                checksum: 0,
                key: None,
            };
            assert_eq!(RmaReply::decode(&rep.encode()), Ok(rep));
        }
        // Figures only after an out-of-range status, and 8 bytes of them.
        let mut figures = RmaReply {
            status: RmaStatus::OutOfRegion { region_len: 1 },
            checksum: 0,
            key: None,
        }
        .encode();
        assert!(RmaReply::decode(&figures[..REPLY_LEN + 7]).is_err());
        figures[0] = 1;
        assert!(RmaReply::decode(&figures).is_err());
        // Flags beyond the two known are refused.
        let w = RmaRequest {
            op: RmaOp::Write,
            region: 1,
            capability: [0; 16],
            offset: 0,
            len: 1,
            checksum: None,
            want_key: true,
        };
        let mut enc = w.encode();
        assert!(RmaRequest::decode(&enc).unwrap().want_key);
        enc[1] |= 4;
        assert_eq!(RmaRequest::decode(&enc), Err(RmaWireError::Reserved));
        // A key flag with no key, or one too long, is refused.
        let mut bare = keyed.encode();
        bare.truncate(REPLY_LEN + 8);
        assert_eq!(RmaReply::decode(&bare), Err(RmaWireError::Trailing(8)));
        let mut long = RmaReply { key: None, ..keyed }.encode();
        long[1] = FLAG_KEY;
        long.extend_from_slice(&[0; 8 + KEY_MAX + 1]);
        assert!(RmaReply::decode(&long).is_err());
    }

    #[test]
    fn bad_requests_and_replies_are_typed_errors() {
        let good = RmaRequest {
            op: RmaOp::Read,
            region: 1,
            capability: [0; 16],
            offset: 0,
            len: 1,
            checksum: None,
            want_key: false,
        }
        .encode();
        assert!(matches!(
            RmaRequest::decode(&good[..10]),
            Err(RmaWireError::Short { .. })
        ));
        let mut bad = good.clone();
        bad[0] = 9;
        assert_eq!(RmaRequest::decode(&bad), Err(RmaWireError::UnknownOp(9)));
        let mut bad = good.clone();
        bad[2] = 1;
        assert_eq!(RmaRequest::decode(&bad), Err(RmaWireError::Reserved));
        let mut bad = good.clone();
        bad.push(0);
        assert_eq!(RmaRequest::decode(&bad), Err(RmaWireError::Trailing(1)));
        assert!(RmaReply::decode(&[0; 7]).is_err());
        assert_eq!(
            RmaReply::decode(&[42, 0, 0, 0, 0, 0, 0, 0]),
            Err(RmaWireError::UnknownStatus(42))
        );
    }

    #[test]
    fn access_allows_what_it_says() {
        assert!(Access::Read.allows(RmaOp::Read) && !Access::Read.allows(RmaOp::Write));
        assert!(Access::Write.allows(RmaOp::Write) && !Access::Write.allows(RmaOp::Read));
        assert!(Access::ReadWrite.allows(RmaOp::Read) && Access::ReadWrite.allows(RmaOp::Write));
    }

    #[test]
    fn a_handle_keeps_its_capability_out_of_debug() {
        let h = RmaHandle {
            region: 1,
            len: 2,
            access: Access::Read,
            capability: [0xab; 16],
        };
        assert!(!format!("{h:?}").contains("171"), "{h:?}");
        let bytes = postcard::to_allocvec(&h).unwrap();
        assert_eq!(postcard::from_bytes::<RmaHandle>(&bytes).unwrap(), h);
    }
}
