//! One-sided reads of applications' regions (`msgr::rma`, issue 49) over
//! libfabric, shared by the MSG transport ([`super::FabricTransport`]) and
//! the RDM one ([`super::rdm`]): what differs between them is only how an
//! endpoint and a peer are found for a link.
//!
//! The owner's messenger opens a region on the endpoint that carries a
//! link when the peer first asks for it ([`UserExposures::expose`]): the
//! memory is registered where it lies ([`RmaBuffers::expose_in_place`],
//! which honours the provider's `mr_mode`), and the key that goes back to
//! the peer ([`UserKey`]) names the registration. The peer then `fi_read`s
//! ranges of it with no CPU of the owner's in the way
//! ([`UserReads::start`], completed by [`UserReads::done`]).
//!
//! Native reads run only where the endpoint's rendezvous reads
//! ([`RmaOp::Read`]: `shm`, `verbs`); where it writes (`tcp` in libfabric
//! 1.17, whose reads are withheld) the messenger serves reads itself.
//! Where the provider does not check keys (`shm`), the registration's
//! check word lies apart ([`msgr_fabric::CHECK_LEN`]) and is read after
//! each range: once the owner withdraws the region the word is zeroed
//! first, so a late read is refused, never handed up as the region's.
//! Writes are not native: where keys are unchecked a late write would land
//! in memory the owner has taken back.

use bytes::Bytes;
use msgr_fabric::{Exposed, ReadDone, RemoteWord, RmaBuffers, RmaOp};
use msgr_proto::LinkId;
use rustc_hash::FxHashMap;

use crate::{RmaFailure, TransportEvent};

/// Bytes of an encoded [`UserKey`].
pub const USER_KEY_LEN: usize = 6 * 8;

/// What a peer needs to read a region an endpoint of ours exposed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UserKey {
    /// The region's first byte (a virtual address under `FI_MR_VIRT_ADDR`,
    /// else 0: an offset).
    addr: u64,
    /// Its length.
    len: u64,
    /// The registration's remote key.
    key: u64,
    /// The check word, where keys are not checked; 0 if none.
    check: u64,
    /// Where the check word lies (with `check`).
    word: Option<RemoteWord>,
}

impl UserKey {
    fn from_exposed(x: &Exposed) -> UserKey {
        UserKey {
            addr: x.addr,
            len: x.len,
            key: x.key,
            check: x.check,
            word: x.word,
        }
    }

    /// The key as it travels: addr | len | key | check | word addr | word
    /// key, little-endian (the word's fields 0 without a check word).
    pub fn encode(&self) -> Vec<u8> {
        let w = self.word.unwrap_or(RemoteWord { addr: 0, key: 0 });
        [self.addr, self.len, self.key, self.check, w.addr, w.key]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect()
    }

    /// Parses what a peer sent; `None` if it is not a key.
    pub fn decode(b: &[u8]) -> Option<UserKey> {
        if b.len() != USER_KEY_LEN {
            return None;
        }
        let v = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap_or_default());
        let (check, word) = (
            v(3),
            RemoteWord {
                addr: v(4),
                key: v(5),
            },
        );
        Some(UserKey {
            addr: v(0),
            len: v(1),
            key: v(2),
            check,
            word: (check != 0).then_some(word),
        })
    }

    /// The range `offset..offset + len` as a read target; `None` if it is
    /// not inside the region.
    fn range(&self, offset: u64, len: u64) -> Option<Exposed> {
        let end = offset.checked_add(len)?;
        let addr = self.addr.checked_add(offset)?;
        (len > 0 && end <= self.len).then_some(Exposed {
            id: 0,
            addr,
            len,
            key: self.key,
            check: self.check,
            word: self.word,
            write: false,
        })
    }
}

/// The regions one endpoint has open to peers' reads: region number ->
/// (exposure id in the endpoint's [`RmaBuffers`], the key handed out).
#[derive(Debug, Default)]
pub struct UserExposures {
    open: FxHashMap<u64, (u32, Vec<u8>)>,
}

impl UserExposures {
    /// Opens `mem` (region `region`, whose rights are `access`) to reads on
    /// the endpoint whose buffers are `rma`, once; the key to hand out, or
    /// `None` where the region is not readable, the endpoint has no native
    /// reads or the registration fails.
    pub fn expose(
        &mut self,
        rma: &mut RmaBuffers,
        region: u64,
        mem: &Bytes,
        access: msgr_proto::rma::Access,
    ) -> Option<Vec<u8>> {
        if !access.allows(msgr_proto::rma::RmaOp::Read) {
            return None; // a key here is for reads only
        }
        if let Some((_, key)) = self.open.get(&region) {
            return Some(key.clone());
        }
        if rma.op() != Some(RmaOp::Read) || mem.is_empty() {
            return None;
        }
        match rma.expose_in_place(mem.clone()) {
            Ok(x) => {
                let key = UserKey::from_exposed(&x).encode();
                self.open.insert(region, (x.id, key.clone()));
                Some(key)
            }
            Err((e, _)) => {
                tracing::debug!(error = %e, "an RMA region not registered: served by the owner");
                None
            }
        }
    }

    /// Ends reads of `region` on this endpoint: its check word is zeroed
    /// and its registration closed before its memory is let go.
    pub fn unexpose(&mut self, rma: &mut RmaBuffers, region: u64) {
        if let Some((id, _)) = self.open.remove(&region) {
            rma.unexpose(id);
        }
    }
}

/// Reads of peers' regions in flight on one transport: completion context
/// -> (link, the caller's token).
#[derive(Debug, Default)]
pub struct UserReads {
    reading: FxHashMap<u64, (LinkId, u64)>,
}

impl UserReads {
    /// Starts reading `len` bytes at `offset` of the region `key` names,
    /// under `context`, by `post` (the endpoint's `read`, to the link's
    /// peer). Why not, if it did not start.
    pub fn start(
        &mut self,
        (link, token, context): (LinkId, u64, u64),
        key: &[u8],
        (offset, len): (u64, u64),
        post: impl FnOnce(&Exposed) -> Result<(), msgr_fabric::FabricError>,
    ) -> Result<(), RmaFailure> {
        let x = UserKey::decode(key)
            .ok_or_else(|| RmaFailure::BadKey("not a libfabric region key".into()))?
            .range(offset, len)
            .ok_or_else(|| {
                RmaFailure::BadKey(format!("{offset}+{len} is not inside the region"))
            })?;
        if self.reading.contains_key(&context) {
            return Err(RmaFailure::Busy);
        }
        post(&x).map_err(|e| RmaFailure::Post(format!("fi_read: {e}")))?;
        self.reading.insert(context, (link, token));
        Ok(())
    }

    /// The completion of read `context` came (`error`: it failed): the
    /// event for the caller, once the read is over (its check word, read
    /// apart, may come next: then nothing yet).
    pub fn done(
        &mut self,
        rma: &mut RmaBuffers,
        context: u64,
        error: Option<(i32, &'static str)>,
        events: &mut Vec<TransportEvent>,
    ) {
        let result = match rma.read_done(context, error.is_none()) {
            Some(ReadDone::WordNext) => return,
            Some(ReadDone::Read(r)) => r.map_err(|e| RmaFailure::Refused(e.to_string())),
            None => Err(RmaFailure::Unknown),
        };
        let Some((link, token)) = self.reading.remove(&context) else {
            return;
        };
        let result = match (result, error) {
            (Err(e), Some((code, what))) => Err(RmaFailure::Completion {
                status: code,
                detail: format!("{e} ({what}: {})", std::io::Error::from_raw_os_error(code)),
            }),
            (r, _) => r,
        };
        events.push(TransportEvent::RmaRead {
            link,
            token,
            result,
        });
    }

    /// Forgets the reads of `link`: its endpoint closed, and their
    /// buffers with it (the worker fails or retries the operations of a
    /// link that went).
    pub fn forget_link(&mut self, link: LinkId) {
        self.reading.retain(|_, (l, _)| *l != link);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_and_ranges_stay_inside() {
        let word = Some(RemoteWord { addr: 77, key: 9 });
        let k = UserKey {
            addr: 4096,
            len: 100,
            key: 5,
            check: 3,
            word,
        };
        assert_eq!(UserKey::decode(&k.encode()), Some(k));
        let plain = UserKey {
            check: 0,
            word: None,
            ..k
        };
        assert_eq!(UserKey::decode(&plain.encode()), Some(plain));
        assert_eq!(UserKey::decode(&k.encode()[1..]), None);
        let r = k.range(10, 90).expect("inside");
        assert_eq!((r.addr, r.len, r.key, r.word), (4106, 90, 5, word));
        assert!(k.range(10, 91).is_none());
        assert!(k.range(u64::MAX, 2).is_none());
        assert!(k.range(0, 0).is_none());
    }
}
