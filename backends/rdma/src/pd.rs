//! Protection domains.

use crate::device::Context;
use crate::error::{RdmaError, Result};
use rdma_cm_sys as sys;
use std::ptr::NonNull;
use std::sync::Arc;

/// A protection domain: memory regions, queue pairs and SRQs of one PD may
/// be used together.
#[derive(Debug)]
pub struct ProtectionDomain {
    pd: NonNull<sys::ibv_pd>,
    ctx: Arc<Context>,
}

// SAFETY: verbs objects are thread-safe; the PD is only destroyed in Drop.
unsafe impl Send for ProtectionDomain {}
// SAFETY: as above.
unsafe impl Sync for ProtectionDomain {}

impl ProtectionDomain {
    /// Allocates a protection domain on `ctx` (`ibv_alloc_pd`).
    pub fn new(ctx: &Arc<Context>) -> Result<Arc<Self>> {
        crate::error::clear_errno();
        // SAFETY: the context is alive (we keep an Arc to it).
        let pd = unsafe { sys::ibv_alloc_pd(ctx.as_ptr()) };
        let pd = NonNull::new(pd).ok_or_else(|| RdmaError::last_os("ibv_alloc_pd"))?;
        Ok(Arc::new(ProtectionDomain {
            pd,
            ctx: ctx.clone(),
        }))
    }

    /// The device context the PD belongs to.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// The raw `ibv_pd`, for verbs this layer does not wrap.
    pub fn as_ptr(&self) -> *mut sys::ibv_pd {
        self.pd.as_ptr()
    }
}

impl Drop for ProtectionDomain {
    fn drop(&mut self) {
        // SAFETY: every MR/QP/SRQ of this PD holds an Arc to it, so none is left.
        unsafe { sys::ibv_dealloc_pd(self.pd.as_ptr()) };
    }
}
