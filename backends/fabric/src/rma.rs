//! The rendezvous: memory registered for `fi_read` and `fi_write`
//! ([`RmaBuffers`], one per endpoint), with the check words ([`CHECK_LEN`])
//! that keep a late read from returning freed memory, and registrations a
//! caller keeps across exposures where keys are checked ([`ReadRegion`]).

use crate::error::{check, FabricError};
use crate::info::{MrMode, RmaOp};
use crate::landing::{LandingPool, RmaGauge};
use crate::net::{close, Net, NetObjects};
use bytes::Bytes;
use libfabric_sys as sys;
use std::os::raw::c_void;
use std::ptr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// A read's target sits as the peer's buffer does modulo this many bytes:
/// a copy between buffers that are misaligned within a cache line is
/// slower (a 1 MiB `process_vm_readv` here: ~52 µs against ~46).
const READ_ALIGN: usize = 64;

/// Memory registered for an RMA operation, owned until the registration is
/// closed. `check`: the word the last [`CHECK_LEN`] bytes of `mem` hold
/// while exposed, or must hold once read; 0: none (exposed in place where
/// keys are checked).
struct Region {
    /// The buffer; for one exposed in place, only its check word (if any).
    mem: Vec<u8>,
    /// Exposed in place ([`RmaBuffers::expose_in_place`]): held, not owned.
    shared: Option<Bytes>,
    mr: *mut sys::fid_mr,
    /// The registration of a check word kept apart from the buffer (`mem`
    /// of one exposed in place); null if none.
    word_mr: *mut sys::fid_mr,
    check: u64,
    /// Bytes of `mem` once a read completed: what it filled and what was
    /// placed around it ([`RmaBuffers::read`]), after `skip`; `mem.len()`
    /// when exposed.
    len: usize,
    /// Bytes at the front of `mem` that belong to no unit: a read's target
    /// is shifted so that it sits as the peer's buffer does within a cache
    /// line ([`READ_ALIGN`]).
    skip: usize,
    /// `mem` came from the [`LandingPool`] and goes back to it once the
    /// unit that landed in it is dropped.
    pooled: bool,
    /// A registration the caller keeps across exposures
    /// ([`RmaBuffers::expose_registered`]): `mr` is its, closed when the
    /// last holder lets it go, not with this region.
    kept: Option<Arc<ReadRegion>>,
}

impl Region {
    /// A buffer of ours under one registration.
    fn owned(mem: Vec<u8>, mr: *mut sys::fid_mr, check: u64, len: usize) -> Region {
        Region {
            mem,
            shared: None,
            mr,
            word_mr: ptr::null_mut(),
            check,
            len,
            skip: 0,
            pooled: false,
            kept: None,
        }
    }

    fn close(self) -> Vec<u8> {
        let Region {
            mem,
            shared,
            mr,
            word_mr,
            kept,
            ..
        } = self;
        if kept.is_none() {
            close(mr as *mut sys::fid);
        }
        close(word_mr as *mut sys::fid);
        // Memory held in place outlives its registration.
        drop((shared, kept));
        mem
    }
}

/// Bytes of the application's registered for peers' reads and kept by the
/// caller across exposures ([`RmaBuffers::register_for_reads`],
/// [`RmaBuffers::expose_registered`]) instead of registered for each and
/// closed after it: on hardware a registration pins the pages and loads
/// the adapter's translation table, which for a large buffer can cost more
/// than moving it. Holds the bytes, so they can be neither freed nor
/// changed while registered. Closes its registration when the last holder
/// drops it (it holds the domain open meanwhile, and may outlive its
/// [`Net`]).
pub struct ReadRegion {
    mem: Bytes,
    mr: *mut sys::fid_mr,
    /// Keeps the domain open until after `mr` is closed.
    _net: Arc<NetObjects>,
}

// SAFETY: the handle is a plain pointer to a registration of the domain,
// closed once, by Drop; moving it to another thread moves no thread-bound
// state (the endpoints whose operations use it go with it: one worker owns
// the domain, its endpoints and its regions).
unsafe impl Send for ReadRegion {}
// SAFETY: through `&self` only the bytes (immutable) and the handle's value
// (read by `expose_registered`, on the owning worker) are reached.
unsafe impl Sync for ReadRegion {}

impl std::fmt::Debug for ReadRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadRegion")
            .field("len", &self.mem.len())
            .finish_non_exhaustive()
    }
}

impl Drop for ReadRegion {
    fn drop(&mut self) {
        close(self.mr as *mut sys::fid);
    }
}

/// Why a registration was not even tried (`code`: the libfabric errno).
fn refused(code: u32, why: &str) -> FabricError {
    FabricError::Call {
        op: "fi_mr_reg",
        code: code as i32,
        msg: why.into(),
    }
}

/// Bytes of the check word [`RmaBuffers::expose`] appends to a buffer (give
/// the buffer that much spare capacity and it is not reallocated).
///
/// Why: a read must never return memory that no longer holds the unit. Most
/// providers check the key at the target, so a read of a withdrawn
/// (deregistered) buffer fails. `shm` does not: with `FI_MR_VIRT_ADDR` and no
/// RMA ordering it reads the peer's memory directly (`process_vm_readv`),
/// key unchecked, so a late read of a freed buffer would return whatever
/// the allocator put there since — a well-formed frame of another link,
/// even. So every exposed buffer ends in a word unique to the exposure,
/// zeroed before the buffer is freed, and the reader compares it. The kernel
/// copies in address order and x86-64 makes stores visible in program
/// order: a reader that finds the word intact read the rest before it was
/// zeroed, hence before the memory was freed. (Weakly ordered CPUs narrow
/// the window without closing it.)
///
/// Memory exposed in place ([`RmaBuffers::expose_in_place`]) is the
/// application's: no word can follow it, and it stays alive and unchanged
/// after it is withdrawn. There the word lies apart, in a registration of
/// its own ([`Exposed::word`]), and the reader reads it only once the read
/// of the buffer completed: a word still intact then was not yet zeroed,
/// so the buffer was still exposed while it was read — on any CPU.
pub const CHECK_LEN: usize = 8;

/// Check words: unique per process and never 0 (the zeroed value).
static NEXT_CHECK: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn next_check() -> u64 {
    // splitmix64 of a counter: distinct for every exposure, and unlike the
    // counter itself, unlikely to match bytes an allocator or a frame left.
    let mut z = NEXT_CHECK
        .fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed)
        .wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)) | 1
}

/// What a peer needs to `fi_read` a buffer of ours
/// ([`RmaBuffers::expose`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Exposed {
    /// Names the buffer for `unexpose`.
    pub id: u32,
    /// The address to read from (a virtual address under
    /// `FI_MR_VIRT_ADDR`, else an offset: 0).
    pub addr: u64,
    /// Bytes to read: the buffer and its check word.
    pub len: u64,
    /// The registration's remote key.
    pub key: u64,
    /// The check word ([`CHECK_LEN`]): the buffer ends in it while exposed,
    /// or it lies apart at [`Exposed::word`]; 0 for a buffer exposed in
    /// place where the provider checks keys, which needs none.
    pub check: u64,
    /// Where the check word lies when it does not end the buffer (exposed
    /// in place where keys are unchecked): read after the buffer.
    pub word: Option<RemoteWord>,
    /// Held for a write ([`RmaOp::Write`]), not open to reads: `addr`,
    /// `key` and `check` are 0, and the peer grants a buffer for the
    /// holder to write `len` bytes into ([`RmaBuffers::grant`]).
    pub write: bool,
}

/// A buffer of ours a peer may write into ([`RmaBuffers::grant`]): what
/// the writer needs, besides its own unit's length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Landing {
    /// Where to write (a virtual address under `FI_MR_VIRT_ADDR`, else an
    /// offset: 0).
    pub addr: u64,
    /// The registration's remote key.
    pub key: u64,
}

/// A check word registered apart from the buffer it vouches for: what a
/// peer needs to read it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteWord {
    /// Its address (as [`Exposed::addr`]).
    pub addr: u64,
    /// Its registration's remote key.
    pub key: u64,
}

/// What [`RmaBuffers::read_done`] made of a read's completion.
#[derive(Debug)]
pub enum ReadDone {
    /// The read is over: its buffer without the check word, or why it is
    /// not the peer's unit.
    Read(Result<Bytes, FabricError>),
    /// The buffer is filled and its check word, apart, is being read: the
    /// read completes again under the same context.
    WordNext,
}

impl ReadDone {
    /// The buffer of a read that is over; `None` while its word is read.
    pub fn finished(self) -> Option<Result<Bytes, FabricError>> {
        match self {
            ReadDone::Read(r) => Some(r),
            ReadDone::WordNext => None,
        }
    }
}

/// A check word to read apart once the buffer's read completes: where it
/// lies and what it must be, and the endpoint (and peer) to read it on.
struct WordRead {
    ep: *mut sys::fid_ep,
    from: u64,
    word: RemoteWord,
    check: u64,
}

/// Keys asked for when the provider does not pick them (no
/// `FI_MR_PROV_KEY`): they must be unique within a domain, which many
/// endpoints share, so one counter serves the process.
static NEXT_MR_KEY: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// The rendezvous buffers of one endpoint (MSG or RDM). Under
/// [`RmaOp::Read`]: those peers may read, and those being filled by reads
/// of ours. Under [`RmaOp::Write`]: units of ours held until written into
/// a peer's buffer, and buffers of ours granted to peers to write into.
/// Registration honours the domain's `mr_mode` (`FI_MR_PROV_KEY` or a key
/// of ours, `FI_MR_VIRT_ADDR` or offset 0, `FI_MR_LOCAL` for the local
/// side of an operation).
pub struct RmaBuffers {
    /// The domain registrations are made on, held open until the last
    /// registration made here (a [`ReadRegion`] may outlive the endpoint)
    /// is closed.
    net: Arc<NetObjects>,
    /// The endpoint's one-sided operation ([`Net::rma`]).
    op: Option<RmaOp>,
    /// What registrations must honour, the Net's.
    mr: MrMode,
    /// Buffers peers may fi_read, by id.
    exposed: std::collections::HashMap<u32, Region>,
    next_exposed: u32,
    /// Buffers being filled by fi_read, by operation context.
    reading: std::collections::HashMap<u64, Region>,
    /// Of those, the ones whose check word is read next, apart.
    words_next: std::collections::HashMap<u64, WordRead>,
    /// Writes of ours in flight, by operation context: the exposed buffer
    /// each reads from.
    writing: std::collections::HashMap<u64, u32>,
    /// Buffers unexposed while a write from them was in flight: freed when
    /// their last write completes.
    retired: std::collections::HashMap<u32, Region>,
    /// Buffers granted to a peer's write and given up before the peer said
    /// it wrote ([`RmaBuffers::abandon`]): no write can start into them, but
    /// one under way may still land, so they stay until the endpoint
    /// closes; and their bytes.
    abandoned: Vec<Vec<u8>>,
    abandoned_bytes: usize,
    /// Where granted buffers come from and go back to.
    landings: Arc<LandingPool>,
    /// The Net's count of both, over all its endpoints.
    gauge: Arc<RmaGauge>,
}

impl Net {
    /// Empty rendezvous bookkeeping for an endpoint of this Net.
    pub(crate) fn rma_regions(&self) -> RmaBuffers {
        RmaBuffers {
            net: self.objects.clone(),
            op: self.rma,
            mr: self.mr,
            exposed: Default::default(),
            next_exposed: 0,
            reading: Default::default(),
            words_next: Default::default(),
            writing: Default::default(),
            retired: Default::default(),
            abandoned: Vec::new(),
            abandoned_bytes: 0,
            gauge: self.rma_gauge.clone(),
            landings: self.landings.clone(),
        }
    }

    /// Buffers exposed for peers and buffers being filled by reads, over
    /// all endpoints of this Net, until their registrations close (with
    /// the endpoint at the latest).
    pub fn rma_in_use(&self) -> (usize, usize) {
        (
            self.rma_gauge.exposed.load(Ordering::Relaxed),
            self.rma_gauge.reading.load(Ordering::Relaxed),
        )
    }
}

impl RmaBuffers {
    /// Registers the `len` bytes at `mem` (initialised or not: the
    /// provider only reads or writes them).
    fn register(
        &mut self,
        mem: *const u8,
        len: usize,
        access: u64,
    ) -> Result<*mut sys::fid_mr, FabricError> {
        let key = if self.mr.prov_key {
            0
        } else {
            NEXT_MR_KEY.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        };
        let mut mr: *mut sys::fid_mr = ptr::null_mut();
        // SAFETY: mem..mem+len is a live allocation the caller keeps
        // (inside a Region or ReadRegion) until the registration is closed;
        // the domain outlives the registration (`net`, held by both).
        let rc = unsafe {
            sys::fi_mr_reg(
                self.net.domain,
                mem as *const c_void,
                len,
                access,
                0,
                key,
                0,
                &mut mr,
                ptr::null_mut(),
            )
        };
        check("fi_mr_reg", rc as isize)?;
        Ok(mr)
    }

    /// The endpoint's one-sided operation ([`Net::rma`]).
    pub fn op(&self) -> Option<RmaOp> {
        self.op
    }

    /// Under [`RmaOp::Write`]: the registration of `len` bytes at `ptr`
    /// for the local side of a write, where the domain wants one
    /// (`FI_MR_LOCAL`); null otherwise.
    fn write_source(
        &mut self,
        ptr: *const u8,
        len: usize,
    ) -> Result<*mut sys::fid_mr, FabricError> {
        if self.mr.local {
            self.register(ptr, len, u64::from(sys::FI_WRITE))
        } else {
            Ok(ptr::null_mut())
        }
    }

    /// Under [`RmaOp::Write`]: keeps `shared` (memory the application
    /// handed over) or `mem` (a buffer of ours), registered by `mr`
    /// ([`RmaBuffers::write_source`]), until [`RmaBuffers::unexpose`];
    /// nothing is open to peers. The unit goes when the peer grants a
    /// buffer ([`Ep::write`](crate::Ep::write), [`RdmEp::write`](crate::RdmEp::write)).
    fn hold(&mut self, mr: *mut sys::fid_mr, mem: Vec<u8>, shared: Option<Bytes>) -> Exposed {
        let (ptr, len) = match &shared {
            Some(b) => (b.as_ptr(), b.len()),
            None => (mem.as_ptr(), mem.len()),
        };
        let region = Region {
            mem,
            shared,
            mr,
            word_mr: ptr::null_mut(),
            check: 0,
            len,
            skip: 0,
            pooled: false,
            kept: None,
        };
        self.publish(ptr, region)
    }

    /// Registers `mem` for remote reads, followed by a check word
    /// ([`CHECK_LEN`]), and keeps it until [`RmaBuffers::unexpose`] (or the
    /// endpoint goes); under [`RmaOp::Write`], holds it for a write
    /// instead, without a check word. On failure the buffer comes back as
    /// it was, so the caller can send it another way.
    pub fn expose(&mut self, mut mem: Vec<u8>) -> Result<Exposed, (FabricError, Vec<u8>)> {
        match self.op {
            Some(RmaOp::Read) => {}
            Some(RmaOp::Write) => {
                return match self.write_source(mem.as_ptr(), mem.len()) {
                    Ok(mr) => Ok(self.hold(mr, mem, None)),
                    Err(e) => Err((e, mem)),
                };
            }
            None => {
                let e = refused(sys::FI_ENOSYS, "endpoint without FI_RMA");
                return Err((e, mem));
            }
        }
        let check = next_check();
        mem.extend_from_slice(&check.to_le_bytes());
        let mr = match self.register(mem.as_ptr(), mem.len(), u64::from(sys::FI_REMOTE_READ)) {
            Ok(mr) => mr,
            Err(e) => {
                mem.truncate(mem.len() - CHECK_LEN);
                return Err((e, mem));
            }
        };
        let (ptr, len) = (mem.as_ptr(), mem.len());
        Ok(self.publish(ptr, Region::owned(mem, mr, check, len)))
    }

    /// Registers `mem` for remote reads where it lies, without a copy, and
    /// holds it until [`RmaBuffers::unexpose`] (or the endpoint goes): for
    /// large payloads the application handed over. Where the provider fails
    /// reads of withdrawn registrations (`tcp`, `verbs`) that is all; else
    /// (`shm`) a check word is registered apart ([`CHECK_LEN`]) for the
    /// reader to read after the buffer. When a registration fails, `mem`
    /// comes back with the error and the caller can copy it into a buffer
    /// for [`RmaBuffers::expose`].
    pub fn expose_in_place(&mut self, mem: Bytes) -> Result<Exposed, (FabricError, Bytes)> {
        if self.op == Some(RmaOp::Write) && !mem.is_empty() {
            return match self.write_source(mem.as_ptr(), mem.len()) {
                Ok(mr) => Ok(self.hold(mr, Vec::new(), Some(mem))),
                Err(e) => Err((e, mem)),
            };
        }
        if self.op != Some(RmaOp::Read) || mem.is_empty() {
            let e = refused(sys::FI_ENOSYS, "no in-place exposure on these endpoints");
            return Err((e, mem));
        }
        let remote_read = u64::from(sys::FI_REMOTE_READ);
        let (word, word_mr, check) = if self.mr.keys_checked {
            (Vec::new(), ptr::null_mut(), 0)
        } else {
            let check = next_check();
            let word = check.to_le_bytes().to_vec();
            match self.register(word.as_ptr(), CHECK_LEN, remote_read) {
                Ok(mr) => (word, mr, check),
                Err(e) => return Err((e, mem)),
            }
        };
        let mr = match self.register(mem.as_ptr(), mem.len(), remote_read) {
            Ok(mr) => mr,
            Err(e) => {
                close(word_mr as *mut sys::fid);
                return Err((e, mem));
            }
        };
        let (ptr, len) = (mem.as_ptr(), mem.len());
        Ok(self.publish(
            ptr,
            Region {
                mem: word,
                shared: Some(mem),
                mr,
                word_mr,
                check,
                len,
                skip: 0,
                pooled: false,
                kept: None,
            },
        ))
    }

    /// Whether exposures in place may use registrations the caller keeps
    /// ([`RmaBuffers::register_for_reads`]): under [`RmaOp::Read`] where the
    /// provider checks keys (`tcp`, `verbs`), so a peer's read of a region
    /// no longer exposed fails at the target or returns the very bytes it
    /// was sent, which cannot change while registered. Elsewhere (`shm`)
    /// each exposure needs its own check word ([`CHECK_LEN`]).
    pub fn keeps_registrations(&self) -> bool {
        self.op == Some(RmaOp::Read) && self.mr.keys_checked
    }

    /// Registers `mem` for peers' reads, for the caller to keep and expose
    /// again and again ([`RmaBuffers::expose_registered`]); where
    /// [`RmaBuffers::keeps_registrations`] is false, or when the
    /// registration fails, `mem` comes back with the error.
    pub fn register_for_reads(&mut self, mem: Bytes) -> Result<ReadRegion, (FabricError, Bytes)> {
        if !self.keeps_registrations() || mem.is_empty() {
            let e = refused(sys::FI_ENOSYS, "no registrations kept on these endpoints");
            return Err((e, mem));
        }
        match self.register(mem.as_ptr(), mem.len(), u64::from(sys::FI_REMOTE_READ)) {
            Ok(mr) => Ok(ReadRegion {
                mem,
                mr,
                _net: self.net.clone(),
            }),
            Err(e) => Err((e, mem)),
        }
    }

    /// Exposes `body`, the very bytes of `region` (registered on this
    /// endpoint's domain by [`RmaBuffers::register_for_reads`]; a clone of
    /// them), for a peer to read, as [`RmaBuffers::expose_in_place`] does,
    /// without registering them again; `unexpose` lets this exposure go and
    /// leaves the registration to its other holders. Other bytes (a slice,
    /// which a peer holding the whole region's key could read past) are
    /// [`FabricError::Call`] (`FI_EINVAL`) and come back.
    pub fn expose_registered(
        &mut self,
        region: Arc<ReadRegion>,
        body: Bytes,
    ) -> Result<Exposed, (FabricError, Bytes)> {
        if body.as_ptr_range() != region.mem.as_ptr_range() {
            let e = refused(sys::FI_EINVAL, "not the registered bytes");
            return Err((e, body));
        }
        let (ptr, len) = (body.as_ptr(), body.len());
        Ok(self.publish(
            ptr,
            Region {
                mem: Vec::new(),
                shared: Some(body),
                mr: region.mr,
                word_mr: ptr::null_mut(),
                check: 0,
                len,
                skip: 0,
                pooled: false,
                kept: Some(region),
            },
        ))
    }

    /// Keeps `region` (registered, its memory starting at `ptr`) exposed
    /// under a new id and returns what a peer needs to read it.
    fn publish(&mut self, ptr: *const u8, region: Region) -> Exposed {
        let write = self.op == Some(RmaOp::Write);
        // Held for a write: open to no peer, nothing to name.
        let key = if write {
            0
        } else {
            // SAFETY: region.mr is an open registration.
            unsafe { sys::fi_mr_key(region.mr) }
        };
        let word = (!region.word_mr.is_null()).then(|| RemoteWord {
            addr: if self.mr.virt_addr {
                region.mem.as_ptr() as u64
            } else {
                0
            },
            // SAFETY: word_mr is an open registration.
            key: unsafe { sys::fi_mr_key(region.word_mr) },
        });
        let id = self.next_exposed;
        self.next_exposed = self.next_exposed.wrapping_add(1);
        let exposed = Exposed {
            id,
            addr: if self.mr.virt_addr && !write {
                ptr as u64
            } else {
                0
            },
            len: region.len as u64,
            key,
            check: region.check,
            word,
            write,
        };
        match self.exposed.insert(id, region) {
            Some(old) => {
                old.close();
            }
            None => {
                self.gauge.exposed.fetch_add(1, Ordering::Relaxed);
            }
        }
        exposed
    }

    /// Ends remote access to an exposed buffer and frees it, its check word
    /// zeroed first ([`CHECK_LEN`]); one exposed in place is let go.
    /// A buffer a write of ours still reads from is kept until that write
    /// completes ([`RmaBuffers::write_done`]).
    pub fn unexpose(&mut self, id: u32) {
        if let Some(mut r) = self.exposed.remove(&id) {
            if self.writing.values().any(|&w| w == id) {
                self.retired.insert(id, r);
                return;
            }
            if r.check != 0 {
                if let Some(word) = r.mem.last_chunk_mut::<CHECK_LEN>() {
                    // SAFETY: `word` is a live byte array; a volatile store
                    // is not elided as dead before the free.
                    unsafe { ptr::write_volatile(word, [0; CHECK_LEN]) };
                }
            }
            // The word is zeroed before memory held in place is let go.
            std::sync::atomic::fence(Ordering::SeqCst);
            drop(r.close());
            self.gauge.exposed.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// `fi_read` of the peer's exposed buffer `x` on `ep` (from `from`:
    /// ignored on connected endpoints) into a new buffer, at offset `at`
    /// of `around`, whose bytes are placed before and after it: the buffer
    /// then holds `around[..at]`, what was read, `around[at..]`. A buffer
    /// that ends in its check word has nothing after it; one whose word
    /// lies apart has it read once the buffer is ([`RmaBuffers::read_done`]).
    pub(crate) fn read(
        &mut self,
        ep: *mut sys::fid_ep,
        x: &Exposed,
        from: u64,
        context: u64,
        around: &[u8],
        at: usize,
    ) -> Result<(), FabricError> {
        let (len, addr, key) = (x.len as usize, x.addr, x.key);
        let word_at_end = x.check != 0 && x.word.is_none();
        if self.op != Some(RmaOp::Read)
            || x.write
            || self.reading.contains_key(&context)
            || (word_at_end && (len < CHECK_LEN || at != around.len()))
            || (x.word.is_some() && x.check == 0)
            || at > around.len()
        {
            return Err(FabricError::Slot(context as usize));
        }
        let total = len
            .checked_add(around.len())
            .ok_or(FabricError::Slot(context as usize))?;
        // A word read apart lands after everything else.
        let word_room = if x.word.is_some() { CHECK_LEN } else { 0 };
        // Not zeroed: the read fills its part (a megabyte of memset
        // otherwise) and the bytes around it are written here; the length
        // is set once the read completed (`read_done`).
        let mut mem: Vec<u8> = Vec::with_capacity(READ_ALIGN - 1 + total + word_room);
        // Where the peer's buffer sits within a cache line is known under
        // FI_MR_VIRT_ADDR (else it is an offset: line-aligned is the guess).
        let peer_line = if self.mr.virt_addr { addr } else { 0 } as usize;
        let skip = peer_line.wrapping_sub(mem.as_ptr() as usize + at) % READ_ALIGN;
        let spare = &mut mem.spare_capacity_mut()[skip..];
        for (dst, &b) in spare[..at].iter_mut().zip(&around[..at]) {
            dst.write(b);
        }
        for (dst, &b) in spare[at + len..total].iter_mut().zip(&around[at..]) {
            dst.write(b);
        }
        // SAFETY: `skip + at + len <= skip + total`, within the capacity
        // just allocated.
        let target = unsafe { mem.as_mut_ptr().add(skip + at) };
        let remote = (from, addr, key);
        // SAFETY: ep is the open endpoint that owns this Rma; mem is moved
        // into `reading` below (a Vec's heap buffer does not move with it)
        // and stays there until read_done or the endpoint's close, so the
        // provider writes into live memory.
        let mr = unsafe { self.post_read(ep, target, len, remote, context)? };
        // The word read apart is checked when it is read, not now.
        let check = if x.word.is_some() { 0 } else { x.check };
        if let Some(word) = x.word {
            let next = WordRead {
                ep,
                from,
                word,
                check: x.check,
            };
            self.words_next.insert(context, next);
        }
        let region = Region {
            skip,
            ..Region::owned(mem, mr, check, total)
        };
        self.reading.insert(context, region);
        self.gauge.reading.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Under [`RmaOp::Write`]: a new buffer for the peer's unit `x` (held
    /// there for a write), with `x.len` bytes of room at offset `at` of
    /// `around`, placed as `RmaBuffers::read` places a read, registered
    /// for the peer to write into, and kept under `context` until
    /// [`RmaBuffers::read_done`] (once the peer says it wrote) or the
    /// endpoint's close — never freed while the endpoint is open, for a
    /// write into it may be under way. The buffer is initialised first
    /// (that the peer wrote it all is the peer's word, not the provider's):
    /// one a dropped unit gave back (`LandingPool`), else zeroed.
    pub fn grant(
        &mut self,
        x: &Exposed,
        context: u64,
        around: &[u8],
        at: usize,
    ) -> Result<Landing, FabricError> {
        let len = x.len as usize;
        if self.op != Some(RmaOp::Write)
            || !x.write
            || len == 0
            || self.reading.contains_key(&context)
            || at > around.len()
        {
            return Err(FabricError::Slot(context as usize));
        }
        let total = len
            .checked_add(around.len())
            .ok_or(FabricError::Slot(context as usize))?;
        let mut mem = self.landings.take(total);
        mem[..at].copy_from_slice(&around[..at]);
        mem[at + len..].copy_from_slice(&around[at..]);
        let target = &mem[at..at + len];
        let mr = self.register(target.as_ptr(), len, u64::from(sys::FI_REMOTE_WRITE))?;
        let landing = Landing {
            addr: if self.mr.virt_addr {
                target.as_ptr() as u64
            } else {
                0
            },
            // SAFETY: mr is an open registration.
            key: unsafe { sys::fi_mr_key(mr) },
        };
        let region = Region {
            pooled: true,
            ..Region::owned(mem, mr, 0, total)
        };
        self.reading.insert(context, region);
        self.gauge.reading.fetch_add(1, Ordering::Relaxed);
        Ok(landing)
    }

    /// Writes `bytes` as the last bytes of the unit landing under `context`
    /// (a read in flight, or a buffer granted for a write), which lie among
    /// the bytes placed around the read or the write, not in its target:
    /// a unit's late epilogue, placed before the unit is taken
    /// ([`RmaBuffers::read_done`]). The caller checked that they lie after
    /// the target.
    pub fn place_tail(&mut self, context: u64, bytes: &[u8]) -> Result<(), FabricError> {
        let r = self
            .reading
            .get_mut(&context)
            .ok_or(FabricError::Slot(context as usize))?;
        // The check word, where there is one, ends the region by now (read
        // with the unit, or apart once the unit is in: `read_word`).
        let word = if r.check != 0 { CHECK_LEN } else { 0 };
        let end = r.skip + r.len - word;
        let start = end
            .checked_sub(bytes.len())
            .filter(|&start| start >= r.skip && end <= r.mem.capacity())
            .ok_or(FabricError::Slot(context as usize))?;
        // SAFETY: `start..end` lies within the buffer's capacity (checked
        // above) and after the target the provider may be writing (the
        // caller's word), so these bytes are the transport's alone; written
        // through the raw pointer, no reference to the buffer is made while
        // the provider writes another part of it.
        unsafe {
            r.mem
                .as_mut_ptr()
                .add(start)
                .copy_from_nonoverlapping(bytes.as_ptr(), bytes.len());
        }
        Ok(())
    }

    /// Gives up the buffer granted under `context` before the peer said it
    /// wrote (its link went): its registration closes at once, so no write
    /// into it can start, but one the provider has begun may still land
    /// (an RDM endpoint's connection to the peer outlives the link), so
    /// the memory stays until the endpoint closes
    /// ([`RmaBuffers::abandoned_bytes`] counts it).
    pub fn abandon(&mut self, context: u64) {
        if let Some(r) = self.reading.remove(&context) {
            self.gauge.reading.fetch_sub(1, Ordering::Relaxed);
            let mem = r.close();
            self.abandoned_bytes += mem.capacity();
            self.abandoned.push(mem);
        }
    }

    /// Bytes of the buffers [`RmaBuffers::abandon`] keeps until the
    /// endpoint closes.
    pub fn abandoned_bytes(&self) -> usize {
        self.abandoned_bytes
    }

    /// `fi_write` of our held unit `id` ([`Exposed::write`]) on `ep` into
    /// the buffer `landing` of peer `to` (ignored on connected endpoints).
    /// The unit stays held until the write completes
    /// ([`RmaBuffers::write_done`] with the same `context`), even if it is
    /// unexposed before.
    pub(crate) fn write(
        &mut self,
        ep: *mut sys::fid_ep,
        id: u32,
        to: u64,
        landing: Landing,
        context: u64,
    ) -> Result<(), FabricError> {
        let Some(r) = self.exposed.get(&id) else {
            return Err(FabricError::Slot(id as usize));
        };
        if self.op != Some(RmaOp::Write) || self.writing.contains_key(&context) {
            return Err(FabricError::Slot(context as usize));
        }
        let (ptr, len) = match &r.shared {
            Some(b) => (b.as_ptr(), b.len()),
            None => (r.mem.as_ptr(), r.mem.len()),
        };
        let desc = if r.mr.is_null() {
            ptr::null_mut()
        } else {
            // SAFETY: r.mr is an open registration.
            unsafe { sys::fi_mr_desc(r.mr) }
        };
        // SAFETY: ep is the open endpoint that owns this Rma; the bytes are
        // the region's, which stays in `exposed` or `retired` until the
        // write's completion (`write_done`) or the endpoint's close.
        let rc = unsafe {
            sys::fi_write(
                ep,
                ptr as *const c_void,
                len,
                desc,
                to,
                landing.addr,
                landing.key,
                context as *mut c_void,
            )
        };
        check("fi_write", rc)?;
        self.writing.insert(context, id);
        Ok(())
    }

    /// The write `context` completed (with or without error): a unit
    /// unexposed meanwhile is freed now. Returns whether `context` was a
    /// write of this endpoint.
    pub fn write_done(&mut self, context: u64) -> bool {
        let Some(id) = self.writing.remove(&context) else {
            return false;
        };
        if !self.writing.values().any(|&w| w == id) {
            if let Some(r) = self.retired.remove(&id) {
                drop(r.close());
                self.gauge.exposed.fetch_sub(1, Ordering::Relaxed);
            }
        }
        true
    }

    /// Posts an `fi_read` of `len` bytes from the peer's `(from, addr, key)`
    /// into `target` on `ep`, registering `target` first where the domain
    /// wants local registrations (`FI_MR_LOCAL`); returns that
    /// registration (null if none) for the caller to close once the read
    /// completed.
    ///
    /// # Safety
    ///
    /// `ep` is the open endpoint that owns this `RmaBuffers`, and
    /// `target..target + len` is memory the caller keeps alive and
    /// untouched until the read's completion or the endpoint's close.
    unsafe fn post_read(
        &mut self,
        ep: *mut sys::fid_ep,
        target: *mut u8,
        len: usize,
        (from, addr, key): (u64, u64, u64),
        context: u64,
    ) -> Result<*mut sys::fid_mr, FabricError> {
        let mr = if self.mr.local {
            self.register(target, len, u64::from(sys::FI_READ))?
        } else {
            ptr::null_mut()
        };
        let desc = if mr.is_null() {
            ptr::null_mut()
        } else {
            // SAFETY: mr is an open registration.
            unsafe { sys::fi_mr_desc(mr) }
        };
        // SAFETY: the caller's contract: a live endpoint and memory that
        // outlives the operation.
        let rc = unsafe {
            sys::fi_read(
                ep,
                target as *mut c_void,
                len,
                desc,
                from,
                addr,
                key,
                context as *mut c_void,
            )
        };
        if let Err(e) = check("fi_read", rc) {
            close(mr as *mut sys::fid);
            return Err(e);
        }
        Ok(mr)
    }

    /// The buffer of read `context` is filled (`r`, its registration
    /// closed): reads its check word, apart at `w`, into the spare room
    /// after it, under the same context. The region then ends in the word,
    /// as one read with the word at its end does.
    fn read_word(&mut self, context: u64, mut r: Region, w: WordRead) -> Result<(), FabricError> {
        // SAFETY: `read` allocated `r.skip + r.len + CHECK_LEN` bytes of
        // capacity.
        let target = unsafe { r.mem.as_mut_ptr().add(r.skip + r.len) };
        let remote = (w.from, w.word.addr, w.word.key);
        // SAFETY: w.ep is the open endpoint that owns this Rma (as in
        // `read`); `r.mem` goes back into `reading` below and stays there
        // until read_done or the endpoint's close.
        let mr = unsafe { self.post_read(w.ep, target, CHECK_LEN, remote, context)? };
        r.mr = mr;
        r.check = w.check;
        r.len += CHECK_LEN;
        self.reading.insert(context, r);
        self.gauge.reading.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Frees the registration of the read `context` whose completion came
    /// (`succeeded`: without error) and returns its buffer, without the
    /// check word; `Err` if the read failed or the word was not the
    /// descriptor's (the peer withdrew the buffer: what was read is not its
    /// unit). [`ReadDone::WordNext`] when the buffer is filled and its check
    /// word, apart, is being read under the same context: a completion for
    /// it follows. `None` if `context` is not a read. A buffer granted for
    /// a write ([`RmaBuffers::grant`]) comes back the same way once the
    /// peer said it wrote (`succeeded`), or when the link gives up on it.
    pub fn read_done(&mut self, context: u64, succeeded: bool) -> Option<ReadDone> {
        let r = self.reading.remove(&context)?;
        self.gauge.reading.fetch_sub(1, Ordering::Relaxed);
        let word_next = self.words_next.remove(&context);
        let failed = || FabricError::Call {
            op: "fi_read",
            code: sys::FI_EIO as i32,
            msg: "the read failed".into(),
        };
        if let Some(w) = word_next {
            if !succeeded {
                r.close();
                return Some(ReadDone::Read(Err(failed())));
            }
            // The buffer's registration goes; its memory stays in `r`.
            close(r.mr as *mut sys::fid);
            let r = Region {
                mr: ptr::null_mut(),
                ..r
            };
            return Some(match self.read_word(context, r, w) {
                Ok(()) => ReadDone::WordNext,
                Err(e) => ReadDone::Read(Err(e)),
            });
        }
        let (want, len, skip, pooled) = (r.check, r.len, r.skip, r.pooled);
        let mut mem = r.close();
        if !succeeded {
            return Some(ReadDone::Read(Err(failed())));
        }
        if pooled {
            // SAFETY: `grant` initialised all `len` bytes (skip is 0).
            unsafe { mem.set_len(len) };
            return Some(ReadDone::Read(Ok(self.landings.lend(mem))));
        }
        // The bytes skipped in front are initialised to make the whole
        // Vec one; a unit is a megabyte and they are at most a line.
        for b in &mut mem.spare_capacity_mut()[..skip] {
            b.write(0);
        }
        // SAFETY: the read completed without error, so the provider wrote
        // the bytes `read` reserved for it, `read` wrote those around them
        // and the `skip` before them were just written: all `skip + len`
        // bytes of the capacity are initialised.
        unsafe { mem.set_len(skip + len) };
        if want != 0 {
            let found = mem
                .last_chunk::<CHECK_LEN>()
                .map_or(0, |w| u64::from_le_bytes(*w));
            if found != want {
                return Some(ReadDone::Read(Err(FabricError::Withdrawn { want, found })));
            }
            mem.truncate(mem.len() - CHECK_LEN);
        }
        let unit = Bytes::from(mem);
        Some(ReadDone::Read(Ok(if skip == 0 {
            unit
        } else {
            unit.slice(skip..)
        })))
    }

    /// Closes every registration; the caller closed the endpoint first, so
    /// the provider no longer touches the buffers.
    pub(crate) fn close_all(&mut self) {
        let exposed = self.exposed.len() + self.retired.len();
        let reading = self.reading.len();
        for r in self
            .exposed
            .drain()
            .chain(self.retired.drain())
            .map(|(_, r)| r)
        {
            r.close();
        }
        self.writing.clear();
        self.abandoned.clear();
        self.abandoned_bytes = 0;
        for r in self.reading.drain().map(|(_, r)| r) {
            r.close();
        }
        self.words_next.clear();
        self.gauge.exposed.fetch_sub(exposed, Ordering::Relaxed);
        self.gauge.reading.fetch_sub(reading, Ordering::Relaxed);
    }

    /// Keeps every buffer for the process's lifetime (an endpoint that is
    /// never closed: the provider may still touch them); they stay counted.
    pub(crate) fn leak(&mut self) {
        std::mem::forget(std::mem::take(&mut self.exposed));
        std::mem::forget(std::mem::take(&mut self.retired));
        std::mem::forget(std::mem::take(&mut self.abandoned));
        std::mem::forget(std::mem::take(&mut self.reading));
    }
}

#[cfg(test)]
mod tests;
