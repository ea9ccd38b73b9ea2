//! Applications' one-sided reads and writes (`msgr::rma`, issue 49) over
//! the verbs and rdmacm transports: the owner's side registers an exposed
//! region in place on the transport's protection domain, with the rights
//! the region gives ([`UserExposures`]), and the key it hands out
//! ([`UserKey`]) names the registration and those rights; the peer
//! RDMA-reads or -writes ranges of it on the link's RC queue pair with no
//! CPU of the owner's in the way, through the same pump as the rendezvous
//! reads (`ReadOp::user`). A write completes once the owner's NIC has
//! acknowledged it: on an RC queue pair, its bytes are in the region.
//!
//! The NIC checks the key, the rights and the bounds: once the owner
//! withdraws the region ([`UserExposures::unexpose`] deregisters it before
//! the memory is let go), a late operation ends in a remote access error,
//! which on an RC queue pair fails the peer's link; its session then asks
//! the owner, who answers `Revoked`.

use msgr_proto::rma::Access;
use msgr_rdma::{ExternalRegion, ProtectionDomain, RemoteAddr};
use rustc_hash::FxHashMap;
use std::sync::Arc;

use crate::RegionMemory;

/// Bytes of an encoded [`UserKey`].
pub(crate) const USER_KEY_LEN: usize = 8 + 8 + 4 + 1;

/// What a peer needs to read a region this transport exposed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct UserKey {
    /// The region's first byte, as the NIC addresses it.
    addr: u64,
    /// Its length.
    len: u64,
    /// The registration's remote key.
    rkey: u32,
    /// Whether the registration takes remote writes.
    writable: bool,
}

impl UserKey {
    /// The key as it travels: addr | len | rkey | writable (1 byte),
    /// little-endian.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(USER_KEY_LEN);
        b.extend_from_slice(&self.addr.to_le_bytes());
        b.extend_from_slice(&self.len.to_le_bytes());
        b.extend_from_slice(&self.rkey.to_le_bytes());
        b.push(u8::from(self.writable));
        b
    }

    /// Parses what a peer sent; `None` if it is not a verbs key.
    pub(crate) fn decode(b: &[u8]) -> Option<UserKey> {
        if b.len() != USER_KEY_LEN {
            return None;
        }
        Some(UserKey {
            addr: u64::from_le_bytes(b[..8].try_into().ok()?),
            len: u64::from_le_bytes(b[8..16].try_into().ok()?),
            rkey: u32::from_le_bytes(b[16..20].try_into().ok()?),
            writable: match b[20] {
                0 => false,
                1 => true,
                _ => return None,
            },
        })
    }

    /// Whether the key takes writes.
    pub(crate) fn writable(&self) -> bool {
        self.writable
    }

    /// Where `offset..offset + len` of the region lies; `None` if it is
    /// empty or not inside the region (the NIC would fail the link on it).
    pub(crate) fn range(&self, offset: u64, len: u64) -> Option<RemoteAddr> {
        let end = offset.checked_add(len)?;
        let addr = self.addr.checked_add(offset)?;
        (len > 0 && end <= self.len).then_some(RemoteAddr {
            addr,
            rkey: self.rkey,
        })
    }
}

/// The regions a transport has open to peers' operations: region number
/// -> (its registration, the key handed out). One registration serves
/// every link: they share the transport's protection domain.
#[derive(Debug, Default)]
pub(crate) struct UserExposures {
    open: FxHashMap<u64, (ExternalRegion<Arc<RegionMemory>>, Vec<u8>)>,
}

impl UserExposures {
    /// Opens `mem` (region `region`) to what `access` allows, once; the key
    /// to hand out, or `None` if registering fails (the owner then serves
    /// the operations).
    pub(crate) fn expose(
        &mut self,
        pd: &Arc<ProtectionDomain>,
        region: u64,
        mem: &Arc<RegionMemory>,
        access: Access,
    ) -> Option<Vec<u8>> {
        if let Some((_, key)) = self.open.get(&region) {
            return Some(key.clone());
        }
        let writable = matches!(access, Access::Write | Access::ReadWrite);
        let rights = msgr_rdma::Access {
            remote_read: matches!(access, Access::Read | Access::ReadWrite),
            remote_write: writable,
            // The verbs rule: remote writes need local write too.
            local_write: writable,
            remote_atomic: false,
        };
        match mem.register_rdma(pd, rights) {
            Ok(mr) => {
                let key = UserKey {
                    addr: mr.addr(),
                    len: mr.len() as u64,
                    rkey: mr.rkey(),
                    writable,
                }
                .encode();
                self.open.insert(region, (mr, key.clone()));
                Some(key)
            }
            Err(e) => {
                tracing::debug!(error = %e, "an RMA region not registered: served by the owner");
                None
            }
        }
    }

    /// Ends native access to `region`: deregistered (later operations fail
    /// at the NIC) before its memory is let go.
    pub(crate) fn unexpose(&mut self, region: u64) {
        self.open.remove(&region);
    }

    /// Regions open now.
    pub(crate) fn len(&self) -> usize {
        self.open.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_and_ranges_stay_inside() {
        let k = UserKey {
            addr: 4096,
            len: 100,
            rkey: 0xdead_beef,
            writable: true,
        };
        assert_eq!(UserKey::decode(&k.encode()), Some(k));
        let ro = UserKey {
            writable: false,
            ..k
        };
        assert_eq!(UserKey::decode(&ro.encode()), Some(ro));
        assert_eq!(UserKey::decode(&k.encode()[1..]), None);
        let mut odd = k.encode();
        odd[20] = 2;
        assert_eq!(UserKey::decode(&odd), None);
        assert_eq!(UserKey::decode(&[0; 48]), None, "a libfabric key");
        let r = k.range(10, 90).expect("inside");
        assert_eq!((r.addr, r.rkey), (4106, 0xdead_beef));
        assert!(k.range(10, 91).is_none());
        assert!(k.range(u64::MAX, 2).is_none());
        assert!(k.range(0, 0).is_none());
    }
}
