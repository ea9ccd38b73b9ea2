//! The regions a messenger exposes to one-sided operations, as the owner
//! keeps them: the table the handles (`crate::rma`) fill and the owner's
//! worker serves from, and the checks and copies of one operation.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use bytes::Bytes;
use msgr_addr::EntityName;
use msgr_backends::RegionMemory;
use msgr_proto::checksum::crc32c;
use msgr_proto::pool::BufferPool;
use msgr_proto::rma::{Access, RmaOp, RmaRequest, RmaStatus};
use parking_lot::RwLock;
use rustc_hash::FxHashMap;

/// Message type of RMA requests and replies (they never reach a
/// dispatcher: the RMA bit of their call routes them).
pub(crate) const RMA_TYPE: u16 = 0;

/// One exposed region, as the owner's messenger keeps it.
pub(crate) struct Region {
    pub(crate) id: u64,
    pub(crate) access: Access,
    pub(crate) capability: [u8; 16],
    /// Only these peers may use it (`None`: any that holds the handle).
    pub(crate) peers: Option<Vec<EntityName>>,
    pub(crate) mem: Arc<RegionMemory>,
    /// A region exposed read-only from shared bytes
    /// (`Messenger::expose_shared`): its reads are slices of them, no
    /// copy; `mem` is then empty and the region is not moved natively.
    pub(crate) shared: Option<Bytes>,
}

/// A messenger's exposed regions, by number.
#[derive(Default)]
pub(crate) struct RegionTable {
    pub(crate) regions: RwLock<FxHashMap<u64, Arc<Region>>>,
    pub(crate) next: AtomicU64,
    /// Where large reads are copied out to: reused once the reply is
    /// written (a fresh MiB per read is paged in again each time).
    pub(crate) read_buffers: BufferPool,
}

impl RegionTable {
    pub(crate) fn get(&self, id: u64) -> Option<Arc<Region>> {
        self.regions.read().get(&id).cloned()
    }
}

/// A random capability (from the system's generator, as the session
/// cookies are).
pub(crate) fn capability() -> [u8; 16] {
    let mut c = [0u8; 16];
    rand::fill(&mut c);
    c
}

/// Compares capabilities in time independent of where they differ.
fn same_capability(a: &[u8; 16], b: &[u8; 16]) -> bool {
    a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

impl Region {
    /// Checks and carries out `r` (`written`: a write's bytes; `peer`: who
    /// asks, looked up only for a region exposed to named peers;
    /// `takes_figures`: whether the requester reads a refusal's figures,
    /// asked only on a refusal); the status, a read's checksum (if asked)
    /// and its bytes.
    pub(crate) fn serve(
        &self,
        peer: impl FnOnce() -> Option<EntityName>,
        takes_figures: impl Fn() -> bool,
        r: &RmaRequest,
        written: &Bytes,
        buffers: &BufferPool,
    ) -> (RmaStatus, u32, Bytes) {
        let refused = |s| (s, 0, Bytes::new());
        let out_of_range = |region_len: usize| {
            refused(if takes_figures() {
                RmaStatus::OutOfRegion {
                    region_len: region_len as u64,
                }
            } else {
                RmaStatus::OutOfRange
            })
        };
        if !same_capability(&r.capability, &self.capability) {
            return refused(RmaStatus::Denied);
        }
        if let Some(peers) = &self.peers {
            let name = peer();
            if !name.is_some_and(|n| peers.contains(&n)) {
                return refused(RmaStatus::Denied);
            }
        }
        if !self.access.allows(r.op) {
            return refused(RmaStatus::Forbidden);
        }
        let range = |len: usize| {
            let start = usize::try_from(r.offset).ok()?;
            let end = start.checked_add(usize::try_from(r.len).ok()?)?;
            (end <= len).then_some(start..end)
        };
        match r.op {
            RmaOp::Read if self.shared.is_some() => {
                let shared = self.shared.clone().unwrap_or_default();
                let Some(range) = range(shared.len()) else {
                    return out_of_range(shared.len());
                };
                // A slice of the shared bytes: no copy.
                let out = shared.slice(range);
                let crc = r.checksum.map_or(0, |_| crc32c(&out));
                (RmaStatus::Ok, crc, out)
            }
            RmaOp::Read => {
                let bytes = self.mem.read();
                let Some(range) = range(bytes.len()) else {
                    return out_of_range(bytes.len());
                };
                let mut out = buffers.take(range.len());
                out.extend_from_slice(&bytes[range]);
                drop(bytes);
                let out = buffers.share(out);
                let crc = r.checksum.map_or(0, |_| crc32c(&out));
                (RmaStatus::Ok, crc, out)
            }
            RmaOp::Write => {
                if written.len() as u64 != r.len {
                    return refused(RmaStatus::Malformed);
                }
                if r.checksum.is_some_and(|c| c != crc32c(written)) {
                    return refused(RmaStatus::Corrupt);
                }
                let mut bytes = self.mem.write();
                let Some(range) = range(bytes.len()) else {
                    return out_of_range(bytes.len());
                };
                bytes[range].copy_from_slice(written);
                (RmaStatus::Ok, 0, Bytes::new())
            }
        }
    }
}
