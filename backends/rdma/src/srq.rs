//! Shared receive queues.

use crate::error::{RdmaError, Result};
use crate::pd::ProtectionDomain;
use crate::wr::{post_recv_chain, RecvWr};
use rdma_cm_sys as sys;
use std::ptr::NonNull;
use std::sync::Arc;

/// A shared receive queue: one pool of receive buffers for many QPs.
#[derive(Debug)]
pub struct SharedReceiveQueue {
    srq: NonNull<sys::ibv_srq>,
    _pd: Arc<ProtectionDomain>,
}

// SAFETY: SRQ verbs are thread-safe.
unsafe impl Send for SharedReceiveQueue {}
// SAFETY: as above.
unsafe impl Sync for SharedReceiveQueue {}

impl SharedReceiveQueue {
    /// `limit` > 0 arms the SRQ limit event (low-watermark) at that many WRs.
    pub fn new(
        pd: &Arc<ProtectionDomain>,
        max_wr: u32,
        max_sge: u32,
        limit: u32,
    ) -> Result<Arc<Self>> {
        let mut attr = sys::ibv_srq_init_attr {
            srq_context: std::ptr::null_mut(),
            attr: sys::ibv_srq_attr {
                max_wr,
                max_sge,
                srq_limit: limit,
            },
        };
        crate::error::clear_errno();
        // SAFETY: live PD, valid attributes.
        let srq = unsafe { sys::ibv_create_srq(pd.as_ptr(), &mut attr) };
        let srq = NonNull::new(srq).ok_or_else(|| RdmaError::last_os("ibv_create_srq"))?;
        Ok(Arc::new(SharedReceiveQueue {
            srq,
            _pd: pd.clone(),
        }))
    }

    /// The raw `ibv_srq`, for verbs this layer does not wrap.
    pub fn as_ptr(&self) -> *mut sys::ibv_srq {
        self.srq.as_ptr()
    }

    /// Posts receive work requests to the shared queue (as one chain); any
    /// QP attached to the SRQ may consume them. On failure the error names
    /// the first rejected request; requests before it were posted.
    pub fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<()> {
        post_recv_chain(wrs, "ibv_post_srq_recv", |head, bad| {
            // SAFETY: a well-formed chain over registered memory (see QueuePair::post_recv).
            unsafe { sys::ibv_post_srq_recv(self.as_ptr(), head, bad) }
        })
    }
}

impl Drop for SharedReceiveQueue {
    fn drop(&mut self) {
        // SAFETY: QPs using the SRQ hold Arcs to it, so none is left.
        unsafe { sys::ibv_destroy_srq(self.srq.as_ptr()) };
    }
}
