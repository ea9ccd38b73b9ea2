//! A raw `fi_read` / `fi_write` loop ([`RawRmaLoop`]), the reference msgr's
//! one-sided RMA is measured against (issue 49; the `msgr bench --rma`
//! tool): between two `FI_EP_RDM` endpoints of this process, on `shm` or on
//! `tcp` (`tcp;ofi_rxm`, which hands RMA straight down to the `tcp`
//! provider's connected endpoints, the data path of msgr's `fabric+tcp`).
//!
//! Each endpoint is a node of its own — fabric, domain, completion queue,
//! address vector — so that the target's queue can be polled by a thread of
//! its own while a measurement runs (`tcp` serves a peer's reads and lands
//! its writes only when the target's provider is progressed). One buffer on
//! each side is registered once, honouring the domain's `mr_mode`
//! (`FI_MR_VIRT_ADDR`: the target's address, else offset 0;
//! `FI_MR_PROV_KEY`: the provider's key, else one chosen here;
//! `FI_MR_LOCAL`: the initiator's buffer registered too, else not); the
//! initiator keeps a fixed number of operations of one size in flight, each
//! in a slot of its own buffer, and reaps completions in batches. No
//! messenger, no copy, no registration per operation: what the provider
//! does when nothing else is asked of it.
//!
//! Apart from [`Net`](crate::Net)'s endpoints because those offer RMA only in the shape
//! of msgr's rendezvous (a fresh registered buffer for each read, a granted
//! buffer for each write), whose costs a reference must not pay.

use crate::error::{again_is_empty, check, is_again, strerror, FabricError};
use crate::info::{getinfo_rma, leaks_on_drop, EpType, RmaOp};
use crate::net::{bind_and_enable, close};
use crate::rdm::{av_insert, MAX_NAME_LEN};
use libfabric_sys as sys;
use std::ffi::CStr;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::raw::c_void;
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Completions reaped per `fi_cq_read`.
const BATCH: usize = 16;
/// How long a measurement may run past its time (draining what is in
/// flight) before it gives up: every wait has a deadline.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(20);

/// A failure of the loop itself (not of a libfabric call), as a
/// [`FabricError::Call`] naming `op` and the errno-style `code`.
fn loop_error(op: &'static str, code: u32, msg: String) -> FabricError {
    FabricError::Call {
        op,
        code: code as i32,
        msg,
    }
}

/// One endpoint with its own fabric, domain, queue and address vector, and
/// one registered buffer. Closed in reverse order on drop — except on
/// `shm`, whose endpoints of one process that talked must never be closed
/// (libfabric 1.17 dereferences a closed peer's region: the crate's docs),
/// so a `shm` node is leaked with its buffer.
struct Node {
    fabric: *mut sys::fid_fabric,
    domain: *mut sys::fid_domain,
    cq: *mut sys::fid_cq,
    av: *mut sys::fid_av,
    ep: *mut sys::fid_ep,
    /// Null where the buffer needs no registration (the initiator's,
    /// without `FI_MR_LOCAL`).
    mr: *mut sys::fid_mr,
    mem: Vec<u8>,
    /// The provider's full name (`tcp;ofi_rxm`).
    provider: String,
    virt_addr: bool,
    leak: bool,
}

// SAFETY: the handles are plain pointers to this node's own libfabric
// objects (FI_THREAD_DOMAIN: one thread at a time uses a domain's
// objects); a node is used by one thread at a time — the target's by its
// poller during a measurement, by its owner otherwise.
unsafe impl Send for Node {}

impl Drop for Node {
    fn drop(&mut self) {
        if self.leak {
            std::mem::forget(std::mem::take(&mut self.mem));
            return;
        }
        // Everything opened on an object is closed before it (the list's
        // order); `close` skips what was never opened.
        for fid in [
            self.ep as *mut sys::fid,
            self.mr as *mut sys::fid,
            self.av as *mut sys::fid,
            self.cq as *mut sys::fid,
            self.domain as *mut sys::fid,
            self.fabric as *mut sys::fid,
        ] {
            close(fid);
        }
    }
}

impl Node {
    /// Opens a node of `provider` with a buffer of `len` bytes, registered
    /// for `access` — for `local` access only where the domain asks for it.
    fn open(provider: &str, len: usize, access: u32, local: bool) -> Result<Node, FabricError> {
        // `tcp` listens where its source address says: loopback, port of
        // the OS's choosing. `shm` names its endpoints itself.
        let (addr, source) = if provider == "tcp" {
            (Some(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))), true)
        } else {
            (None, false)
        };
        // No message ordering: the loop sends no messages (and `shm` in
        // libfabric 1.17, asked for FI_ORDER_SAW, completes reads that
        // leave the initiator's buffer as it was: the test below).
        let both = [RmaOp::Read, RmaOp::Write];
        let info = getinfo_rma(provider, EpType::Rdm, addr, source, &both, false, None)?;
        let mut node = Node {
            fabric: ptr::null_mut(),
            domain: ptr::null_mut(),
            cq: ptr::null_mut(),
            av: ptr::null_mut(),
            ep: ptr::null_mut(),
            mr: ptr::null_mut(),
            // Touched now, so no measurement pays its page faults.
            mem: vec![0x5a; len],
            provider: provider.to_owned(),
            virt_addr: false,
            leak: leaks_on_drop(provider),
        };
        // SAFETY: info is a valid fi_info (getinfo_rma); every out-pointer is
        // a field of `node`, whose Drop closes what was opened; the buffer is
        // node.mem, which lives as long as the registration (closed first).
        unsafe {
            let i = &*info.0;
            let name = (*i.fabric_attr).prov_name;
            if !name.is_null() {
                node.provider = CStr::from_ptr(name).to_string_lossy().into_owned();
            }
            let mr_mode = (*i.domain_attr).mr_mode as u32;
            node.virt_addr = mr_mode & sys::FI_MR_VIRT_ADDR != 0;
            let prov_key = mr_mode & sys::FI_MR_PROV_KEY != 0;
            let mr_local = mr_mode & sys::FI_MR_LOCAL != 0;
            let fabric = sys::fi_fabric(i.fabric_attr, &mut node.fabric, ptr::null_mut());
            check("fi_fabric", fabric as isize)?;
            let domain = sys::fi_domain(node.fabric, info.0, &mut node.domain, ptr::null_mut());
            check("fi_domain", domain as isize)?;
            let mut cq_attr = sys::fi_cq_attr {
                size: 4 * BATCH,
                format: sys::FI_CQ_FORMAT_CONTEXT,
                wait_obj: sys::FI_WAIT_NONE,
                ..Default::default()
            };
            let cq = sys::fi_cq_open(node.domain, &mut cq_attr, &mut node.cq, ptr::null_mut());
            check("fi_cq_open", cq as isize)?;
            let mut av_attr = sys::fi_av_attr {
                type_: sys::FI_AV_MAP,
                ..Default::default()
            };
            let av = sys::fi_av_open(node.domain, &mut av_attr, &mut node.av, ptr::null_mut());
            check("fi_av_open", av as isize)?;
            let ep = sys::fi_endpoint(node.domain, info.0, &mut node.ep, ptr::null_mut());
            check("fi_endpoint", ep as isize)?;
            bind_and_enable(node.ep, node.av as *mut sys::fid, "fi_ep_bind(av)", node.cq)?;
            if !local || mr_local {
                // One registration per domain: any key will do where the
                // application picks it.
                let key = if prov_key { 0 } else { 1 };
                let rc = sys::fi_mr_reg(
                    node.domain,
                    node.mem.as_ptr() as *const c_void,
                    node.mem.len(),
                    u64::from(access),
                    0,
                    key,
                    0,
                    &mut node.mr,
                    ptr::null_mut(),
                );
                check("fi_mr_reg", rc as isize)?;
            }
        }
        Ok(node)
    }

    /// The endpoint's name, for a peer's address vector.
    fn name(&self) -> Result<Vec<u8>, FabricError> {
        let mut raw = [0u8; MAX_NAME_LEN];
        let mut len = raw.len();
        // SAFETY: ep is open; raw has room for `len` bytes.
        let rc = unsafe {
            sys::fi_getname(
                self.ep as *mut sys::fid,
                raw.as_mut_ptr() as *mut c_void,
                &mut len,
            )
        };
        check("fi_getname", rc as isize)?;
        Ok(raw[..len.min(raw.len())].to_vec())
    }

    /// Where and by which key a peer reaches the registered buffer.
    fn remote(&self) -> (u64, u64) {
        let addr = if self.virt_addr {
            self.mem.as_ptr() as u64
        } else {
            0
        };
        // SAFETY: mr is an open registration (a target node always has one).
        (addr, unsafe { sys::fi_mr_key(self.mr) })
    }

    /// Reads up to [`BATCH`] completions: the contexts of those that
    /// succeeded go to `done`; an error completion is an error.
    fn reap(&mut self, done: &mut Vec<usize>) -> Result<(), FabricError> {
        let mut raw = [sys::fi_cq_entry {
            op_context: ptr::null_mut(),
        }; BATCH];
        // SAFETY: the CQ's format is FI_CQ_FORMAT_CONTEXT; raw has room for
        // BATCH entries.
        let n = unsafe { sys::fi_cq_read(self.cq, raw.as_mut_ptr() as *mut c_void, BATCH) };
        if n > 0 {
            done.extend(raw[..n as usize].iter().map(|e| e.op_context as usize));
            return Ok(());
        }
        if n != -(sys::FI_EAVAIL as isize) {
            return again_is_empty("fi_cq_read", n).map(drop);
        }
        let mut err = sys::fi_cq_err_entry::default();
        // SAFETY: err is a valid fi_cq_err_entry; err_data stays null.
        let k = unsafe { sys::fi_cq_readerr(self.cq, &mut err, 0) };
        check("fi_cq_readerr", k)?;
        Err(FabricError::Call {
            op: "completion",
            code: err.err,
            msg: strerror(err.err),
        })
    }
}

/// What a [`RawRmaLoop::run`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawFigures {
    /// Operations completed.
    pub ops: u64,
    /// Bytes they moved (`ops` times the size).
    pub bytes: u64,
    /// From the first post to the last completion.
    pub elapsed: Duration,
}

/// A raw RMA loop ready to measure (module docs): an initiator with
/// `in_flight` slots of `largest` bytes and a target exposing `largest`
/// bytes, both `FI_EP_RDM` endpoints of this process.
///
/// ```no_run
/// use msgr_fabric::{RawRmaLoop, RmaOp};
/// use std::time::Duration;
///
/// let mut raw = RawRmaLoop::open("shm", 8, 1 << 20)?;
/// let f = raw.run(RmaOp::Read, 4096, Duration::from_secs(1))?;
/// println!("{}: {} reads of 4 KiB in {:?}", raw.provider(), f.ops, f.elapsed);
/// # Ok::<(), msgr_fabric::FabricError>(())
/// ```
pub struct RawRmaLoop {
    /// Dropped first: its operations are over, then the target goes.
    initiator: Node,
    target: Node,
    peer: sys::fi_addr_t,
    /// The target buffer's address (or offset) and key.
    remote: (u64, u64),
    in_flight: usize,
    /// The largest operation it serves (its buffers' slot size).
    largest: usize,
}

impl RawRmaLoop {
    /// Opens both nodes of `provider` (`shm` or `tcp`; the loop does not
    /// know others) for `in_flight` operations of up to `largest` bytes,
    /// introduces the initiator to the target, and runs a few operations
    /// so that no measurement pays the connection (`tcp;ofi_rxm` connects
    /// at the first operation).
    pub fn open(provider: &str, in_flight: usize, largest: usize) -> Result<Self, FabricError> {
        let largest = largest.max(1);
        let remote_access = sys::FI_REMOTE_READ | sys::FI_REMOTE_WRITE;
        let target = Node::open(provider, largest, remote_access, false)?;
        let slots = in_flight.max(1);
        let initiator = Node::open(
            provider,
            slots * largest,
            sys::FI_READ | sys::FI_WRITE,
            true,
        )?;
        let name = target.name()?;
        // SAFETY: the initiator's AV is open; `name` is the target's own
        // fi_getname, which the provider reads within its bounds.
        let peer = unsafe { av_insert(initiator.av, &name) }?;
        let remote = target.remote();
        let mut raw = RawRmaLoop {
            initiator,
            target,
            peer,
            remote,
            in_flight: slots,
            largest,
        };
        raw.run(RmaOp::Read, largest.min(4096), Duration::from_millis(20))?;
        Ok(raw)
    }

    /// The provider as libfabric names it (`shm`, `tcp;ofi_rxm`).
    pub fn provider(&self) -> &str {
        &self.initiator.provider
    }

    /// `size`-byte `op`s, [`RawRmaLoop::open`]'s number in flight, posted
    /// for `duration` and then drained (for at most 20 s more). A `size`
    /// of 0 or above `open`'s `largest` is refused (`-FI_EINVAL`), a drain
    /// that does not end in time is `-FI_ETIMEDOUT`.
    pub fn run(
        &mut self,
        op: RmaOp,
        size: usize,
        duration: Duration,
    ) -> Result<RawFigures, FabricError> {
        let largest = self.largest;
        if size == 0 || size > largest {
            let msg = format!("{size} B is outside 1..={largest}");
            return Err(loop_error("raw RMA loop", sys::FI_EINVAL, msg));
        }
        let stop = AtomicBool::new(false);
        let (initiator, target) = (&mut self.initiator, &mut self.target);
        let (peer, remote, in_flight) = (self.peer, self.remote, self.in_flight);
        std::thread::scope(|s| {
            let poller = std::thread::Builder::new()
                .name("raw-rma-target".into())
                .spawn_scoped(s, || {
                    // The target's side only progresses: remote operations
                    // complete nothing here. It yields its CPU at each
                    // pass, as msgr's busy-polling workers do: on a machine
                    // with more runnable threads than cores a pure spinner
                    // holds its core for whole time slices while the
                    // initiator, whose reads it must answer, waits
                    // (`tcp`: 1 MiB reads at ~260 MiB/s against ~1.7 GiB/s).
                    let mut none = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        target.reap(&mut none)?;
                        none.clear();
                        std::thread::yield_now();
                    }
                    Ok::<(), FabricError>(())
                })
                .map_err(|e| {
                    let code = e.raw_os_error().map_or(sys::FI_EOTHER, |c| c as u32);
                    loop_error("spawn(raw-rma-target)", code, e.to_string())
                })?;
            let slots = (in_flight, largest);
            let r = post_and_reap(initiator, (peer, remote), op, size, slots, duration);
            stop.store(true, Ordering::Relaxed);
            let polled = poller.join().unwrap_or_else(|_| {
                let msg = "the target's poller panicked".to_owned();
                Err(loop_error("raw RMA loop", sys::FI_EOTHER, msg))
            });
            let r = r?;
            polled?;
            Ok(r)
        })
    }
}

/// The initiator's loop: keeps `in_flight` operations posted, each from or
/// into a slot of its own (`slot_len` bytes apart), until `duration` has
/// gone, then drains them.
fn post_and_reap(
    node: &mut Node,
    (peer, (addr, key)): (sys::fi_addr_t, (u64, u64)),
    op: RmaOp,
    size: usize,
    (in_flight, slot_len): (usize, usize),
    duration: Duration,
) -> Result<RawFigures, FabricError> {
    let desc = if node.mr.is_null() {
        ptr::null_mut()
    } else {
        // SAFETY: mr is an open registration.
        unsafe { sys::fi_mr_desc(node.mr) }
    };
    let base = node.mem.as_mut_ptr();
    let mut free: Vec<usize> = (0..in_flight).collect();
    let mut reaped = Vec::with_capacity(BATCH);
    let mut done = 0u64;
    let started = Instant::now();
    let give_up = started + duration + DRAIN_TIMEOUT;
    let call = match op {
        RmaOp::Read => "fi_read",
        RmaOp::Write => "fi_write",
    };
    loop {
        let posting = started.elapsed() < duration;
        if posting {
            while let Some(slot) = free.pop() {
                // SAFETY: slot < in_flight, and the buffer holds in_flight
                // slots of slot_len ≥ size bytes.
                let local = unsafe { base.add(slot * slot_len) } as *mut c_void;
                let (ep, ctx) = (node.ep, slot as *mut c_void);
                // SAFETY: ep is open; `local..local+size` lies in the node's
                // buffer, registered (desc) where the domain asks, and not
                // touched by anything else until this slot's completion; the
                // target's buffer is registered for remote reads and writes.
                let rc = unsafe {
                    match op {
                        RmaOp::Read => sys::fi_read(ep, local, size, desc, peer, addr, key, ctx),
                        RmaOp::Write => sys::fi_write(ep, local, size, desc, peer, addr, key, ctx),
                    }
                };
                match check(call, rc) {
                    Ok(_) => {}
                    Err(e) if is_again(&e) => {
                        free.push(slot);
                        break;
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        if free.len() == in_flight && !posting {
            break;
        }
        node.reap(&mut reaped)?;
        if reaped.is_empty() {
            // As the target's poller does: let a waiting thread run.
            std::thread::yield_now();
        }
        done += reaped.len() as u64;
        free.append(&mut reaped);
        if Instant::now() > give_up {
            let msg = format!(
                "{} of {in_flight} {size} B {op:?}s still in flight {:.1} s after the run",
                in_flight - free.len(),
                DRAIN_TIMEOUT.as_secs_f64()
            );
            return Err(loop_error(call, sys::FI_ETIMEDOUT, msg));
        }
    }
    Ok(RawFigures {
        ops: done,
        bytes: done * size as u64,
        elapsed: started.elapsed(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads return the target's bytes and writes land in them, on every
    /// provider the reference uses: it measures operations that work.
    #[test]
    fn raw_reads_and_writes_move_the_bytes() {
        for provider in ["shm", "tcp"] {
            let mut raw = RawRmaLoop::open(provider, 2, 8192).unwrap();
            raw.target.mem[..8].copy_from_slice(b"targetxx");
            raw.run(RmaOp::Read, 4096, Duration::from_millis(20))
                .unwrap();
            for slot in 0..2 {
                let at = slot * 8192;
                assert_eq!(&raw.initiator.mem[at..at + 8], b"targetxx", "{provider}");
            }
            for slot in 0..2 {
                raw.initiator.mem[slot * 8192..][..8].copy_from_slice(b"written!");
            }
            let w = raw
                .run(RmaOp::Write, 4096, Duration::from_millis(20))
                .unwrap();
            assert!(w.ops > 0, "{provider}: {w:?}");
            assert_eq!(w.bytes, w.ops * 4096, "{provider}: {w:?}");
            assert_eq!(&raw.target.mem[..8], b"written!", "{provider}");
        }
    }

    /// A size the buffers cannot hold is refused, not posted.
    #[test]
    fn raw_sizes_outside_the_slots_are_refused() {
        let mut raw = RawRmaLoop::open("tcp", 1, 4096).unwrap();
        for size in [0, 4097] {
            let e = raw
                .run(RmaOp::Read, size, Duration::from_millis(1))
                .unwrap_err();
            assert!(
                matches!(e, FabricError::Call { code, .. } if code == sys::FI_EINVAL as i32),
                "{size}: {e}"
            );
        }
    }
}
