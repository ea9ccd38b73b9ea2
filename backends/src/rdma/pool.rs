//! Pre-registered pools of fixed-size chunks (one memory region per pool),
//! sized at start-up. Exhaustion is backpressure with a counter, not a crash.
//!
//! Received chunks are lent to the application without a copy
//! ([`Pool::lend`]): the message's bytes point into the registered chunk,
//! and when the last of them drops the chunk goes to [`RxReturns`], from
//! which the worker posts it again and returns its credit to the peer.

use std::ops::Range;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use msgr_proto::LinkId;
use msgr_rdma::{Access, MemoryRegion, ProtectionDomain, RdmaError, Sge};

/// Receive chunks the application has let go of, waiting for the worker to
/// post them again. Filled from any thread (wherever the last reference to
/// a message drops); the worker is woken when the list stops being empty.
pub(crate) struct RxReturns {
    chunks: Mutex<Vec<(LinkId, u32)>>,
    waker: Option<Arc<mio::Waker>>,
}

impl RxReturns {
    pub(crate) fn new(waker: Option<Arc<mio::Waker>>) -> Arc<Self> {
        Arc::new(RxReturns {
            chunks: Mutex::new(Vec::new()),
            waker,
        })
    }

    fn push(&self, link: LinkId, chunk: u32) {
        let first = {
            let mut q = self.chunks.lock().unwrap_or_else(|e| e.into_inner());
            q.push((link, chunk));
            q.len() == 1
        };
        // One wake per batch: the worker drains the whole list at once.
        if first {
            if let Some(w) = &self.waker {
                let _ = w.wake();
            }
        }
    }

    /// Everything returned since the last call.
    pub(crate) fn take(&self) -> Vec<(LinkId, u32)> {
        std::mem::take(&mut *self.chunks.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// A lent receive chunk: the owner of a message's bytes.
struct RxLoan {
    mr: Arc<MemoryRegion<Vec<u8>>>,
    range: Range<usize>,
    link: LinkId,
    chunk: u32,
    returns: Arc<RxReturns>,
}

impl AsRef<[u8]> for RxLoan {
    fn as_ref(&self) -> &[u8] {
        // The chunk is not posted while lent: no device write touches it.
        &self.mr[self.range.clone()]
    }
}

impl Drop for RxLoan {
    fn drop(&mut self) {
        self.returns.push(self.link, self.chunk);
    }
}

/// A registered buffer cut into `count` chunks of `chunk` bytes.
pub(crate) struct Pool {
    /// Shared with the loans of received chunks (they keep it registered
    /// and alive, even past the transport).
    mr: Arc<MemoryRegion<Vec<u8>>>,
    chunk: usize,
    free: Vec<u32>,
    /// Times a caller found the pool empty.
    pub(crate) exhausted: u64,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("chunk", &self.chunk)
            .field("free", &self.free.len())
            .field("exhausted", &self.exhausted)
            .finish()
    }
}

impl Pool {
    pub(crate) fn new(
        pd: &Arc<ProtectionDomain>,
        chunk: usize,
        count: u32,
    ) -> Result<Self, RdmaError> {
        let mr = MemoryRegion::register(pd, vec![0u8; chunk * count as usize], Access::LOCAL)?;
        Ok(Pool {
            mr: Arc::new(mr),
            chunk,
            free: (0..count).rev().collect(),
            exhausted: 0,
        })
    }

    pub(crate) fn chunk_size(&self) -> usize {
        self.chunk
    }

    pub(crate) fn available(&self) -> usize {
        self.free.len()
    }

    pub(crate) fn take(&mut self) -> Option<u32> {
        let c = self.free.pop();
        if c.is_none() {
            self.exhausted += 1;
        }
        c
    }

    pub(crate) fn put(&mut self, c: u32) {
        debug_assert!(!self.free.contains(&c), "chunk {c} returned twice");
        self.free.push(c);
    }

    fn range(&self, c: u32, len: usize) -> std::ops::Range<usize> {
        let start = c as usize * self.chunk;
        start..start + len.min(self.chunk)
    }

    /// The SGE covering the first `len` bytes of chunk `c`.
    pub(crate) fn sge(&self, c: u32, len: usize) -> Result<Sge, RdmaError> {
        self.mr.sge(self.range(c, len))
    }

    /// Chunk `c`'s first `len` bytes (read only after its receive completed).
    pub(crate) fn bytes(&self, c: u32, len: usize) -> &[u8] {
        let r = self.range(c, len);
        &self.mr[r]
    }

    /// Chunk `c` for filling before a send is posted.
    pub(crate) fn bytes_mut(&mut self, c: u32) -> &mut [u8] {
        let r = self.range(c, self.chunk);
        let mr = Arc::get_mut(&mut self.mr).expect("send pools are never lent out");
        &mut mr[r]
    }

    /// Lends bytes `within` of received chunk `c` (whose receive completed
    /// and which is not posted again until returned) as a `Bytes`; when the
    /// last clone drops, `(link, c)` goes to `returns`.
    pub(crate) fn lend(
        &self,
        c: u32,
        within: Range<usize>,
        link: LinkId,
        returns: &Arc<RxReturns>,
    ) -> Bytes {
        let start = c as usize * self.chunk;
        let end = start + within.end.min(self.chunk);
        Bytes::from_owner(RxLoan {
            mr: self.mr.clone(),
            range: (start + within.start).min(end)..end,
            link,
            chunk: c,
            returns: returns.clone(),
        })
    }
}
