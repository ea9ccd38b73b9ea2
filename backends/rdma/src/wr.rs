//! Work request chains: receive requests ([`RecvWr`]), and how a list of
//! requests is posted as one chain built on the stack, shared by queue
//! pairs and shared receive queues.

use crate::error::{RdmaError, Result};
use crate::mr::Sge;
use rdma_cm_sys as sys;
use smallvec::SmallVec;

/// A receive work request.
#[derive(Clone, Copy, Debug)]
pub struct RecvWr<'a> {
    /// Returned in this request's work completion.
    pub wr_id: u64,
    /// Where received data lands, in order.
    pub sges: &'a [Sge],
}

/// A work request with local memory to name (send or receive).
pub(crate) trait LocalSges {
    fn local_sges(&self) -> &[Sge];
}

impl LocalSges for RecvWr<'_> {
    fn local_sges(&self) -> &[Sge] {
        self.sges
    }
}

/// Posts `wrs` as one chain through `post`: `make` turns each into the
/// provider's form over its SGE array and count, `set_next` links them.
/// The SGEs and the chain live on the stack for the common post (a few
/// requests of a few SGEs; a heap vector per request and two more per post
/// were most of a 64 B echo's allocations), built in place and not moved
/// once pointers into them exist. On failure the error names the first
/// rejected request; requests before it were posted.
pub(crate) fn post_chain<T: LocalSges, W>(
    wrs: &[T],
    op: &'static str,
    make: impl Fn(&T, *mut sys::ibv_sge, i32) -> W,
    set_next: impl Fn(&mut W, *mut W),
    post: impl FnOnce(*mut W, &mut *mut W) -> i32,
) -> Result<()> {
    if wrs.is_empty() {
        return Ok(());
    }
    let mut sges: SmallVec<[sys::ibv_sge; 8]> = SmallVec::new();
    for w in wrs {
        for sge in w.local_sges() {
            sges.push(sge.raw());
        }
    }
    // `sges` is complete, so it no longer moves: one pointer to it serves
    // every request (each gets its own run of it, in order; a request
    // without any SGEs gets the end, which it never reads).
    let base = sges.as_mut_ptr();
    let mut raw: SmallVec<[W; 4]> = SmallVec::new();
    let mut at = 0;
    for w in wrs {
        let n = w.local_sges().len();
        let count =
            i32::try_from(n).map_err(|_| RdmaError::InvalidArgument("too many SGEs".into()))?;
        raw.push(make(w, base.wrapping_add(at), count));
        at += n;
    }
    // Linked once every request is in place (a spill to the heap moves them).
    link(&mut raw, set_next);
    let mut bad: *mut W = std::ptr::null_mut();
    let ret = post(raw.as_mut_ptr(), &mut bad);
    if ret != 0 {
        let idx = raw.iter().position(|w| std::ptr::eq(w, bad));
        return Err(post_error(op, ret, idx));
    }
    Ok(())
}

/// Posts receive requests through `post` (to a QP's or an SRQ's queue).
pub(crate) fn post_recv_chain(
    wrs: &[RecvWr<'_>],
    op: &'static str,
    post: impl FnOnce(*mut sys::ibv_recv_wr, &mut *mut sys::ibv_recv_wr) -> i32,
) -> Result<()> {
    post_chain(
        wrs,
        op,
        |w, sg_list, num_sge| sys::ibv_recv_wr {
            wr_id: w.wr_id,
            next: std::ptr::null_mut(),
            sg_list,
            num_sge,
        },
        |w, next| w.next = next,
        post,
    )
}

fn link<T>(v: &mut [T], set_next: impl Fn(&mut T, *mut T)) {
    for i in 1..v.len() {
        let next: *mut T = &mut v[i];
        set_next(&mut v[i - 1], next);
    }
}

/// A post that failed, naming the first request the provider rejected.
pub(crate) fn post_error(op: &'static str, ret: i32, idx: Option<usize>) -> RdmaError {
    match RdmaError::from_ret(op, ret) {
        RdmaError::Os { op, source } => RdmaError::Os {
            op,
            source: std::io::Error::new(
                source.kind(),
                format!("{source} (first rejected work request: {idx:?})"),
            ),
        },
        e => e,
    }
}
