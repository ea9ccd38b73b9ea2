//! [`RegionMemory`]: an application's buffer opened to one-sided
//! operations (`msgr::rma`), the thin safe layer over memory that a NIC
//! and the CPU share.
//!
//! The CPU reaches the bytes only through [`RegionMemory::read`] and
//! [`RegionMemory::write`], under one lock: the owner's own access and
//! the reads and writes its messenger serves exclude each other. A NIC
//! reaches them through a registration made from a [`RegionMemory::view`]
//! (`fi_read` by a peer) or in place (`RegionMemory::register_rdma`: a
//! peer's RDMA READ or WRITE): that access is outside any lock, as RDMA is —
//! the bytes a peer reads while the owner writes them may be a mix of
//! both. The view holds the memory: it is freed only after the last
//! registration made from it is closed, never under a NIC's feet.

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use bytes::Bytes;

/// An exposed region's bytes (see the module docs).
pub struct RegionMemory {
    lock: RwLock<()>,
    mem: UnsafeCell<Box<[u8]>>,
    /// `mem`'s first byte and length, fixed for the memory's life: a boxed
    /// slice is never reallocated, and `mem` is taken out only by
    /// [`RegionMemory::into_vec`], which owns the last reference.
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the CPU reads and writes the bytes only under `lock` (read
// guards share, the write guard excludes), so moving or sharing the value
// between threads adds no data race; `ptr` is only ever dereferenced
// through those guards or handed to a registration.
unsafe impl Send for RegionMemory {}
// SAFETY: as for Send: every access through `&self` takes `lock`.
unsafe impl Sync for RegionMemory {}

impl std::fmt::Debug for RegionMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegionMemory")
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl RegionMemory {
    /// Takes `buffer` over.
    pub fn new(buffer: Vec<u8>) -> Arc<RegionMemory> {
        let mut mem = buffer.into_boxed_slice();
        let (ptr, len) = (mem.as_mut_ptr(), mem.len());
        Arc::new(RegionMemory {
            lock: RwLock::new(()),
            mem: UnsafeCell::new(mem),
            ptr,
            len,
        })
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes, shared with other readers; writers wait meanwhile.
    pub fn read(&self) -> RegionRead<'_> {
        let guard = self.lock.read().unwrap_or_else(|e| e.into_inner());
        // SAFETY: `ptr..ptr + len` is the live boxed slice (see `ptr`), and
        // no `&mut` to it exists while a read guard is held.
        let bytes = unsafe { std::slice::from_raw_parts(self.ptr, self.len) };
        RegionRead {
            _guard: guard,
            bytes,
        }
    }

    /// The bytes, for this writer alone.
    pub fn write(&self) -> RegionWrite<'_> {
        let guard = self.lock.write().unwrap_or_else(|e| e.into_inner());
        // SAFETY: `ptr..ptr + len` is the live boxed slice (see `ptr`), and
        // the write guard excludes every other reference made through
        // `read` or `write`.
        let bytes = unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) };
        RegionWrite {
            _guard: guard,
            bytes,
        }
    }

    /// The memory as `Bytes`, for a transport to register where it lies:
    /// holds the memory alive until the last clone is dropped.
    pub fn view(self: &Arc<Self>) -> Bytes {
        // Made under a read guard: no writer holds `&mut` meanwhile.
        let _shared = self.lock.read().unwrap_or_else(|e| e.into_inner());
        Bytes::from_owner(View(self.clone()))
    }

    /// The buffer back, if nothing else holds the memory (no view is
    /// alive): else `Err` with it.
    pub fn into_vec(self: Arc<Self>) -> Result<Vec<u8>, Arc<Self>> {
        Arc::try_unwrap(self).map(|m| m.mem.into_inner().into_vec())
    }
}

#[cfg(any(feature = "verbs", feature = "rdmacm"))]
impl RegionMemory {
    /// Registers the memory in place on `pd` with `access` (a peer's RDMA
    /// reads, and writes where `access` allows them): the registration
    /// holds the memory alive and is closed before it lets go.
    pub(crate) fn register_rdma(
        self: &Arc<Self>,
        pd: &Arc<msgr_rdma::ProtectionDomain>,
        access: msgr_rdma::Access,
    ) -> Result<msgr_rdma::ExternalRegion<Arc<RegionMemory>>, msgr_rdma::RdmaError> {
        // SAFETY: `ptr..ptr + len` is the boxed slice, which never moves
        // or frees while an `Arc` to it lives (the registration holds one,
        // and deregisters before dropping it). The bytes sit in an
        // `UnsafeCell`: the CPU reaches them only through slices made under
        // `lock`, and a NIC's writes land outside it, as the module docs
        // say RDMA does (a reader meanwhile may see a mix).
        unsafe { msgr_rdma::ExternalRegion::register(pd, self.clone(), self.ptr, self.len, access) }
            .map_err(|(e, _)| e)
    }
}

/// [`RegionMemory::view`]'s owner: the memory, kept alive.
struct View(Arc<RegionMemory>);

impl AsRef<[u8]> for View {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the memory is alive while `self.0` is; `Bytes` asks for
        // the slice once, when the view is made, under a read guard
        // (`view`), and keeps only its address and length after that.
        unsafe { std::slice::from_raw_parts(self.0.ptr, self.0.len) }
    }
}

/// The bytes of a [`RegionMemory`], read under its lock.
pub struct RegionRead<'a> {
    _guard: RwLockReadGuard<'a, ()>,
    bytes: &'a [u8],
}

impl Deref for RegionRead<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.bytes
    }
}

/// The bytes of a [`RegionMemory`], written under its lock.
pub struct RegionWrite<'a> {
    _guard: RwLockWriteGuard<'a, ()>,
    bytes: &'a mut [u8],
}

impl Deref for RegionWrite<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.bytes
    }
}

impl DerefMut for RegionWrite<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_view_holds_the_memory_and_sees_writes() {
        let m = RegionMemory::new(vec![1, 2, 3, 4]);
        m.write()[1] = 9;
        let v = m.view();
        assert_eq!(&v[..], &[1, 9, 3, 4]);
        assert_eq!(&m.read()[..], &[1, 9, 3, 4]);
        // A view alive: the buffer cannot come back.
        let m = m.into_vec().expect_err("a view holds it");
        drop(v);
        assert_eq!(m.into_vec().expect("nothing holds it"), vec![1, 9, 3, 4]);
    }
}
