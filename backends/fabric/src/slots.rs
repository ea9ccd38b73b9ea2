//! Fixed-size send and receive slots and their posting, shared by MSG and RDM
//! endpoints: a slot stays busy while the provider may touch it.

use crate::error::{check, FabricError};
use crate::net::close;
use bytes::Bytes;
use libfabric_sys as sys;
use std::os::raw::c_void;
use std::ptr;

/// `FI_ADDR_UNSPEC` (a macro in C): receive from any peer, or the peer a
/// connected endpoint is connected to.
pub(crate) const FI_ADDR_UNSPEC: u64 = u64::MAX;

/// Fixed-size slots in one allocation, optionally registered. A slot handed
/// to the provider is marked busy until its completion, so no safe accessor
/// hands it out while the provider may read or write it.
pub(crate) struct Buffers {
    mem: Vec<u8>,
    pub(crate) busy: Vec<bool>,
    /// Per slot: the caller's bytes a send in flight reads in place
    /// ([`post_send_in_place`]), held until the slot is done — or for as
    /// long as the buffers, which outlive the endpoint (or are leaked with it).
    held: Vec<Option<Bytes>>,
    size: usize,
    mr: *mut sys::fid_mr,
    desc: *mut c_void,
}

impl Buffers {
    pub(crate) fn new(slots: usize, size: usize) -> Self {
        Buffers {
            mem: vec![0u8; slots * size],
            busy: vec![false; slots],
            held: vec![None; slots],
            size,
            mr: ptr::null_mut(),
            desc: ptr::null_mut(),
        }
    }

    /// # Safety
    /// `domain` must be open and outlive the registration.
    pub(crate) unsafe fn register(
        &mut self,
        domain: *mut sys::fid_domain,
        access: u64,
    ) -> Result<(), FabricError> {
        check(
            "fi_mr_reg",
            sys::fi_mr_reg(
                domain,
                self.mem.as_ptr() as *const c_void,
                self.mem.len(),
                access,
                0,
                0,
                0,
                &mut self.mr,
                ptr::null_mut(),
            ) as isize,
        )?;
        self.desc = sys::fi_mr_desc(self.mr);
        Ok(())
    }

    /// The start of an idle slot whose first `len` bytes go to the provider.
    pub(crate) fn idle_ptr(&mut self, slot: usize, len: usize) -> Result<*mut u8, FabricError> {
        if self.busy.get(slot) != Some(&false) || len > self.size {
            return Err(FabricError::Slot(slot));
        }
        Ok(self.mem[slot * self.size..].as_mut_ptr())
    }

    fn mark_busy(&mut self, slot: usize) {
        self.busy[slot] = true;
    }

    /// Ends the provider's use of `slot` and returns its first `len` bytes.
    pub(crate) fn done(&mut self, slot: usize, len: usize) -> &[u8] {
        if let Some(b) = self.busy.get_mut(slot) {
            *b = false;
        }
        if let Some(held) = self.held.get_mut(slot) {
            *held = None;
        }
        let start = (slot * self.size).min(self.mem.len());
        let end = (start + len.min(self.size)).min(self.mem.len());
        &self.mem[start..end]
    }

    pub(crate) fn idle_mut(&mut self, slot: usize) -> Option<&mut [u8]> {
        if self.busy.get(slot) != Some(&false) {
            return None;
        }
        let size = self.size;
        Some(&mut self.mem[slot * size..(slot + 1) * size])
    }

    pub(crate) fn close_mr(&mut self) {
        close(self.mr as *mut sys::fid);
        self.mr = ptr::null_mut();
    }
}

/// Posts `fi_recv` of slot `slot` of `bufs` on `ep` from `from`.
pub(crate) fn post_recv(
    ep: *mut sys::fid_ep,
    bufs: &mut Buffers,
    slot: usize,
    from: u64,
    context: u64,
) -> Result<(), FabricError> {
    let size = bufs.size;
    let p = bufs.idle_ptr(slot, size)?;
    // SAFETY: the slot lies in memory owned by the endpoint's owner and freed
    // only after the endpoint is closed; it is marked busy below so no safe
    // accessor hands it out until its completion.
    let rc = unsafe {
        sys::fi_recv(
            ep,
            p as *mut c_void,
            size,
            bufs.desc,
            from,
            context as *mut c_void,
        )
    };
    check("fi_recv", rc)?;
    bufs.mark_busy(slot);
    Ok(())
}

/// Posts `fi_send` of the first `len` bytes of slot `slot` of `bufs` to `to`.
pub(crate) fn post_send(
    ep: *mut sys::fid_ep,
    bufs: &mut Buffers,
    slot: usize,
    len: usize,
    to: u64,
    context: u64,
) -> Result<(), FabricError> {
    let p = bufs.idle_ptr(slot, len)?;
    // SAFETY: as in post_recv; the slot stays busy until its completion.
    let rc = unsafe {
        sys::fi_send(
            ep,
            p as *const c_void,
            len,
            bufs.desc,
            to,
            context as *mut c_void,
        )
    };
    check("fi_send", rc)?;
    bufs.mark_busy(slot);
    Ok(())
}

/// Whether an endpoint may send the caller's bytes in place
/// ([`post_send_in_place`]): the provider wants no registration of local
/// buffers and gathers at least two iovecs per send (`tx_attr`, null: no).
///
/// # Safety
/// `tx_attr` is null or points to the endpoint's valid `fi_tx_attr`.
pub(crate) unsafe fn sends_in_place(mr_local: bool, tx_attr: *const sys::fi_tx_attr) -> bool {
    // SAFETY: as the caller promises.
    !mr_local && !tx_attr.is_null() && unsafe { (*tx_attr).iov_limit } >= 2
}

/// Posts `fi_sendv` of the first `head` bytes of slot `slot` of `bufs`
/// followed by `body` to `to`, without copying `body`: `bufs` holds it (a
/// reference to the caller's bytes, which `Bytes` lets no one change) until
/// the slot is done, so the provider reads memory that stays put. Only for
/// providers that want no registration of local buffers and gather two
/// iovecs (`allowed`: the endpoint's `sends_in_place`; otherwise
/// [`FabricError::Slot`]).
#[allow(clippy::too_many_arguments)] // post_send's, and the body and its gate
pub(crate) fn post_send_in_place(
    ep: *mut sys::fid_ep,
    bufs: &mut Buffers,
    allowed: bool,
    slot: usize,
    head: usize,
    body: Bytes,
    to: u64,
    context: u64,
) -> Result<(), FabricError> {
    if !allowed {
        return Err(FabricError::Slot(slot));
    }
    let p = bufs.idle_ptr(slot, head)?;
    let iov = [
        sys::iovec {
            iov_base: p as *mut c_void,
            iov_len: head,
        },
        sys::iovec {
            iov_base: body.as_ptr() as *mut c_void,
            iov_len: body.len(),
        },
    ];
    // Only the slot has a registration; the provider wants none.
    let mut desc = [bufs.desc, ptr::null_mut()];
    // SAFETY: the slot as in post_send; `body`'s memory is kept alive and
    // unchanged by the handle stored in `bufs.held` below until the slot is
    // done, and the buffers outlive the endpoint (closed first, or leaked
    // with it). The provider only reads it.
    let rc = unsafe {
        sys::fi_sendv(
            ep,
            iov.as_ptr(),
            desc.as_mut_ptr(),
            2,
            to,
            context as *mut c_void,
        )
    };
    check("fi_sendv", rc)?;
    bufs.mark_busy(slot);
    bufs.held[slot] = Some(body);
    Ok(())
}

/// An endpoint's transmit slots and whether it may send the caller's bytes
/// in place: the side MSG and RDM endpoints share, whose operations
/// [`SendSlots`] offers on both.
pub struct TxSide {
    pub(crate) buffers: Buffers,
    /// [`sends_in_place`] said yes for the endpoint.
    pub(crate) in_place: bool,
}

impl TxSide {
    pub(crate) fn new(buffers: Buffers) -> Self {
        TxSide {
            buffers,
            in_place: false,
        }
    }

    /// [`post_send`] from slot `slot` on `ep` to `to` (`FI_ADDR_UNSPEC`
    /// on a connected endpoint).
    pub(crate) fn send(
        &mut self,
        ep: *mut sys::fid_ep,
        slot: usize,
        len: usize,
        to: u64,
        context: u64,
    ) -> Result<(), FabricError> {
        post_send(ep, &mut self.buffers, slot, len, to, context)
    }

    /// [`post_send_in_place`] from slot `slot` on `ep` to `to`, refused
    /// unless the endpoint sends in place.
    #[allow(clippy::too_many_arguments)] // the post's: endpoint, slot, bytes, peer
    pub(crate) fn send_in_place(
        &mut self,
        ep: *mut sys::fid_ep,
        slot: usize,
        head: usize,
        body: Bytes,
        to: u64,
        context: u64,
    ) -> Result<(), FabricError> {
        let allowed = self.in_place;
        post_send_in_place(
            ep,
            &mut self.buffers,
            allowed,
            slot,
            head,
            body,
            to,
            context,
        )
    }
}

/// The transmit-slot operations of [`Ep`](crate::Ep) and
/// [`RdmEp`](crate::RdmEp): filling a slot, letting it go, and whether a
/// send may carry bytes from where they lie. Their sends differ only in
/// the destination (none, or a peer's address) and stay their own.
pub trait SendSlots {
    /// The endpoint's transmit side.
    #[doc(hidden)]
    fn tx_side(&self) -> &TxSide;

    /// The endpoint's transmit side, to change.
    #[doc(hidden)]
    fn tx_side_mut(&mut self) -> &mut TxSide;

    /// Transmit slots.
    fn tx_slots(&self) -> usize {
        self.tx_side().buffers.busy.len()
    }

    /// The transmit slot `slot` to fill, if it is not in flight.
    fn tx_slot(&mut self, slot: usize) -> Option<&mut [u8]> {
        self.tx_side_mut().buffers.idle_mut(slot)
    }

    /// A completed send: the slot may be refilled (and bytes it sent in
    /// place are let go).
    fn send_done(&mut self, slot: usize) {
        self.tx_side_mut().buffers.done(slot, 0);
    }

    /// Whether the endpoint's `send_in_place` can be used: the provider
    /// needs no registration of local buffers (`FI_MR_LOCAL` unset) and
    /// gathers at least two iovecs per send (`tcp`, `tcp;ofi_rxm`, `shm`;
    /// not `verbs`).
    fn sends_in_place(&self) -> bool {
        self.tx_side().in_place
    }
}
