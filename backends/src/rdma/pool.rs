//! Pre-registered pools of fixed-size chunks (one memory region per pool),
//! sized at start-up. Exhaustion is backpressure with a counter, not a crash.

use std::sync::Arc;

use msgr_rdma::{Access, MemoryRegion, ProtectionDomain, RdmaError, Sge};

/// A registered buffer cut into `count` chunks of `chunk` bytes.
pub(crate) struct Pool {
    mr: MemoryRegion<Vec<u8>>,
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
            mr,
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
        &mut self.mr[r]
    }
}
