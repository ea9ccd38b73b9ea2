//! Memory regions over caller-owned buffers.

use crate::error::{RdmaError, Result};
use crate::pd::ProtectionDomain;
use rdma_cm_sys as sys;
use std::ops::{Deref, DerefMut, Range};
use std::ptr::NonNull;
use std::sync::Arc;

/// Buffers whose bytes stay at one address for as long as they live, even when
/// the owning value moves: heap allocations and borrowed slices.
///
/// # Safety
/// The slice returned by `deref`/`deref_mut` must keep its address and length
/// for the whole life of the value, whatever else happens to it.
pub unsafe trait StableBuffer: DerefMut<Target = [u8]> {}
// SAFETY: a Vec's heap buffer does not move when the Vec moves, and a
// MemoryRegion never gives out `&mut Vec` (so it cannot grow).
unsafe impl StableBuffer for Vec<u8> {}
// SAFETY: as for Vec.
unsafe impl StableBuffer for Box<[u8]> {}
// SAFETY: the borrow pins the slice for its lifetime.
unsafe impl StableBuffer for &mut [u8] {}

/// Access rights of a memory region (and of a QP's remote access).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Access {
    /// The local device may write the memory (receives, RDMA read
    /// responses); required with remote write or atomics.
    pub local_write: bool,
    /// Peers may RDMA-write the memory.
    pub remote_write: bool,
    /// Peers may RDMA-read the memory.
    pub remote_read: bool,
    /// Peers may run atomic operations on the memory.
    pub remote_atomic: bool,
}

impl Access {
    /// Local write plus remote read and write: what RDMA read/write targets need.
    pub const ALL_RDMA: Access = Access {
        local_write: true,
        remote_write: true,
        remote_read: true,
        remote_atomic: false,
    };
    /// Local write only (receive buffers, send buffers).
    pub const LOCAL: Access = Access {
        local_write: true,
        remote_write: false,
        remote_read: false,
        remote_atomic: false,
    };

    pub(crate) fn raw(self) -> u32 {
        let mut f = 0;
        if self.local_write {
            f |= sys::IBV_ACCESS_LOCAL_WRITE;
        }
        if self.remote_write {
            f |= sys::IBV_ACCESS_REMOTE_WRITE;
        }
        if self.remote_read {
            f |= sys::IBV_ACCESS_REMOTE_READ;
        }
        if self.remote_atomic {
            f |= sys::IBV_ACCESS_REMOTE_ATOMIC;
        }
        f
    }
}

/// A scatter/gather element: a byte range of a registered region.
/// Only [`MemoryRegion::sge`] makes them, so its range is always in bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sge {
    pub(crate) addr: u64,
    pub(crate) length: u32,
    pub(crate) lkey: u32,
}

impl Sge {
    /// The virtual address of the first byte.
    pub fn addr(&self) -> u64 {
        self.addr
    }
    /// The length in bytes.
    pub fn len(&self) -> u32 {
        self.length
    }
    /// True for a zero-length element.
    pub fn is_empty(&self) -> bool {
        self.length == 0
    }
    pub(crate) fn raw(&self) -> sys::ibv_sge {
        sys::ibv_sge {
            addr: self.addr,
            length: self.length,
            lkey: self.lkey,
        }
    }
}

/// A remote memory range for RDMA read/write: what the peer advertises.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteAddr {
    /// The virtual address of the first byte in the peer's region.
    pub addr: u64,
    /// The remote key of the peer's region, which grants the access.
    pub rkey: u32,
}

/// A registered buffer. The region owns (or mutably borrows) the buffer, so
/// the buffer outlives the registration; dropping the region deregisters it.
///
/// The device writes into the buffer behind Rust's back (receives, remote
/// writes, read responses): read it only after the completion of the work
/// request that filled it, and do not post a request that writes into a range
/// you are reading.
pub struct MemoryRegion<B: StableBuffer> {
    mr: NonNull<sys::ibv_mr>,
    buf: B,
    _pd: Arc<ProtectionDomain>,
}

// SAFETY: the MR handle is thread-safe; the buffer is Send if B is.
unsafe impl<B: StableBuffer + Send> Send for MemoryRegion<B> {}
// SAFETY: shared access only reads the buffer and the keys.
unsafe impl<B: StableBuffer + Sync> Sync for MemoryRegion<B> {}

impl<B: StableBuffer> MemoryRegion<B> {
    /// Registers `buf` with `pd`.
    pub fn register(pd: &Arc<ProtectionDomain>, buf: B, access: Access) -> Result<Self> {
        Self::try_register(pd, buf, access).map_err(|(e, _)| e)
    }

    /// Registers `buf` with `pd`; on failure the buffer comes back with the
    /// error (so a caller can still use it another way).
    pub fn try_register(
        pd: &Arc<ProtectionDomain>,
        mut buf: B,
        access: Access,
    ) -> std::result::Result<Self, (RdmaError, B)> {
        if buf.is_empty() {
            return Err((
                RdmaError::InvalidArgument("cannot register an empty buffer".into()),
                buf,
            ));
        }
        let (ptr, len) = (buf.as_mut_ptr(), buf.len());
        // SAFETY: ptr/len describe a live buffer that `self` keeps alive (and at
        // the same address, by StableBuffer) until ibv_dereg_mr in Drop.
        match unsafe { reg_mr(pd, ptr, len, access) } {
            Ok(mr) => Ok(MemoryRegion {
                mr,
                buf,
                _pd: pd.clone(),
            }),
            Err(e) => Err((e, buf)),
        }
    }

    /// The local key: names this region in local work requests' SGEs.
    pub fn lkey(&self) -> u32 {
        // SAFETY: the MR is alive.
        unsafe { self.mr.as_ref().lkey }
    }

    /// The remote key: a peer names this region with it in RDMA reads
    /// and writes (see [`MemoryRegion::remote`]).
    pub fn rkey(&self) -> u32 {
        // SAFETY: the MR is alive.
        unsafe { self.mr.as_ref().rkey }
    }

    /// The virtual address of the buffer's first byte, as registered.
    pub fn addr(&self) -> u64 {
        self.buf.as_ptr() as u64
    }

    /// The length of the registered buffer, in bytes.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Always false: empty buffers cannot be registered.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// The remote address of `range` for a peer's RDMA read/write.
    pub fn remote(&self, range: Range<usize>) -> Result<RemoteAddr> {
        self.check(&range)?;
        Ok(RemoteAddr {
            addr: self.addr() + range.start as u64,
            rkey: self.rkey(),
        })
    }

    /// A scatter/gather element for `range` of this region.
    pub fn sge(&self, range: Range<usize>) -> Result<Sge> {
        self.check(&range)?;
        let length = u32::try_from(range.len())
            .map_err(|_| RdmaError::InvalidArgument("SGE longer than 4 GiB".into()))?;
        Ok(Sge {
            addr: self.addr() + range.start as u64,
            length,
            lkey: self.lkey(),
        })
    }

    fn check(&self, range: &Range<usize>) -> Result<()> {
        if range.start > range.end || range.end > self.buf.len() {
            return Err(RdmaError::InvalidArgument(format!(
                "range {range:?} outside the {}-byte region",
                self.buf.len()
            )));
        }
        Ok(())
    }

    /// Deregisters and gives the buffer back.
    pub fn into_inner(self) -> B {
        let this = std::mem::ManuallyDrop::new(self);
        // SAFETY: deregister first, then move the fields out exactly once;
        // `this` is never dropped.
        unsafe {
            sys::ibv_dereg_mr(this.mr.as_ptr());
            let pd = std::ptr::read(&this._pd);
            drop(pd);
            std::ptr::read(&this.buf)
        }
    }
}

impl<B: StableBuffer> Deref for MemoryRegion<B> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf
    }
}

impl<B: StableBuffer> DerefMut for MemoryRegion<B> {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.buf
    }
}

impl<B: StableBuffer> Drop for MemoryRegion<B> {
    fn drop(&mut self) {
        // SAFETY: registered in `register`, deregistered once.
        unsafe { sys::ibv_dereg_mr(self.mr.as_ptr()) };
    }
}

/// `ibv_reg_mr` of `len` bytes at `ptr` with `access`.
///
/// # Safety
/// The bytes must stay alive, at that address, until the registration is
/// deregistered; the device may write them if `access` allows it.
unsafe fn reg_mr(
    pd: &ProtectionDomain,
    ptr: *mut u8,
    len: usize,
    access: Access,
) -> Result<NonNull<sys::ibv_mr>> {
    crate::error::clear_errno();
    // SAFETY: the caller's promise; pd is a live protection domain.
    let mr = unsafe { sys::ibv_reg_mr(pd.as_ptr(), ptr.cast(), len, access.raw() as i32) };
    NonNull::new(mr).ok_or_else(|| RdmaError::last_os("ibv_reg_mr"))
}

/// Shared, immutable bytes registered for the peer's RDMA reads only (a
/// payload the application handed over, read where it lies): the device
/// never writes them, so no mutable access is needed or given. Holds the
/// bytes until it is dropped, which deregisters them first.
pub struct ReadOnlyRegion {
    mr: NonNull<sys::ibv_mr>,
    buf: bytes::Bytes,
    _pd: Arc<ProtectionDomain>,
}

// SAFETY: the MR handle is thread-safe; Bytes is Send and Sync.
unsafe impl Send for ReadOnlyRegion {}
// SAFETY: shared access only reads the keys.
unsafe impl Sync for ReadOnlyRegion {}

impl ReadOnlyRegion {
    /// Registers `buf` with `pd` for remote reads; on failure the bytes
    /// come back with the error.
    pub fn try_register(
        pd: &Arc<ProtectionDomain>,
        buf: bytes::Bytes,
    ) -> std::result::Result<Self, (RdmaError, bytes::Bytes)> {
        if buf.is_empty() {
            return Err((
                RdmaError::InvalidArgument("cannot register an empty buffer".into()),
                buf,
            ));
        }
        let access = Access {
            remote_read: true,
            ..Access::default()
        };
        // SAFETY: the bytes stay alive and at one address while `self` holds
        // them (a Bytes' data does not move with the handle, and nothing can
        // mutate shared Bytes) until ibv_dereg_mr in Drop; without local or
        // remote write access the device only reads them, so the *mut the
        // C signature asks for is never written through.
        match unsafe { reg_mr(pd, buf.as_ptr().cast_mut(), buf.len(), access) } {
            Ok(mr) => Ok(ReadOnlyRegion {
                mr,
                buf,
                _pd: pd.clone(),
            }),
            Err(e) => Err((e, buf)),
        }
    }

    /// The key a peer reads with.
    pub fn rkey(&self) -> u32 {
        // SAFETY: mr is a live registration.
        unsafe { self.mr.as_ref().rkey }
    }

    /// The address a peer reads at.
    pub fn addr(&self) -> u64 {
        self.buf.as_ptr() as u64
    }

    /// The length of the registered bytes.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Always false: empty buffers cannot be registered.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
}

impl Drop for ReadOnlyRegion {
    fn drop(&mut self) {
        // SAFETY: registered in `try_register`, deregistered once, before
        // the bytes are released (fields drop after this).
        unsafe { sys::ibv_dereg_mr(self.mr.as_ptr()) };
    }
}

impl std::fmt::Debug for ReadOnlyRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadOnlyRegion")
            .field("addr", &self.addr())
            .field("len", &self.len())
            .field("rkey", &self.rkey())
            .finish()
    }
}

/// Memory that something else owns and shares, registered for a peer's
/// RDMA reads and/or writes in place: an application's buffer opened to
/// one-sided operations, whose CPU accesses its owner serialises itself.
/// `owner` keeps the memory alive; dropping the region deregisters it
/// before the owner goes, so the device never touches freed memory.
pub struct ExternalRegion<O> {
    mr: NonNull<sys::ibv_mr>,
    addr: u64,
    len: usize,
    _owner: O,
    _pd: Arc<ProtectionDomain>,
}

// SAFETY: the MR handle is thread-safe; the owner is Send if O is.
unsafe impl<O: Send> Send for ExternalRegion<O> {}
// SAFETY: shared access only reads the keys.
unsafe impl<O: Sync> Sync for ExternalRegion<O> {}

impl<O> ExternalRegion<O> {
    /// Registers `len` bytes at `ptr`, held by `owner`, with `pd`.
    ///
    /// # Safety
    /// `ptr..ptr + len` must stay allocated, at that address, for as long
    /// as `owner` lives, and the memory must tolerate the device reading
    /// and (if `access` allows remote writes) writing it at any time
    /// outside Rust's borrow rules: no `&`/`&mut` to it may be held
    /// across such a write except under the owner's own synchronisation
    /// (interior mutability, as in an `UnsafeCell`).
    pub unsafe fn register(
        pd: &Arc<ProtectionDomain>,
        owner: O,
        ptr: *mut u8,
        len: usize,
        access: Access,
    ) -> std::result::Result<Self, (RdmaError, O)> {
        if len == 0 {
            return Err((
                RdmaError::InvalidArgument("cannot register an empty buffer".into()),
                owner,
            ));
        }
        // SAFETY: the caller's promise: the memory outlives the registration
        // (deregistered in Drop, before `owner`) and tolerates the device.
        match unsafe { reg_mr(pd, ptr, len, access) } {
            Ok(mr) => Ok(ExternalRegion {
                mr,
                addr: ptr as u64,
                len,
                _owner: owner,
                _pd: pd.clone(),
            }),
            Err(e) => Err((e, owner)),
        }
    }

    /// The key a peer reads or writes with.
    pub fn rkey(&self) -> u32 {
        // SAFETY: mr is a live registration.
        unsafe { self.mr.as_ref().rkey }
    }

    /// The address a peer names the first byte by.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// The length of the registered memory.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: empty memory cannot be registered.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl<O> Drop for ExternalRegion<O> {
    fn drop(&mut self) {
        // SAFETY: registered in `register`, deregistered once, before the
        // owner is released (fields drop after this).
        unsafe { sys::ibv_dereg_mr(self.mr.as_ptr()) };
    }
}

impl<O> std::fmt::Debug for ExternalRegion<O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExternalRegion")
            .field("addr", &self.addr)
            .field("len", &self.len)
            .field("rkey", &self.rkey())
            .finish()
    }
}

impl<B: StableBuffer> std::fmt::Debug for MemoryRegion<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len())
            .field("lkey", &self.lkey())
            .field("rkey", &self.rkey())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_flags() {
        assert_eq!(Access::default().raw(), 0);
        assert_eq!(Access::LOCAL.raw(), sys::IBV_ACCESS_LOCAL_WRITE);
        let all = Access::ALL_RDMA.raw();
        assert_ne!(all & sys::IBV_ACCESS_REMOTE_READ, 0);
        assert_ne!(all & sys::IBV_ACCESS_REMOTE_WRITE, 0);
    }
}
