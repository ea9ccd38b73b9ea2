//! Completion channels and completion queues.

use crate::device::Context;
use crate::error::{RdmaError, Result};
use rdma_cm_sys as sys;
use std::ffi::CStr;
use std::os::fd::RawFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A completion channel: a file descriptor that becomes readable when an
/// armed CQ gets a completion. Register [`CompletionChannel::fd`] with mio
/// (`SourceFd`) after [`CompletionChannel::set_nonblocking`].
///
/// One CQ per channel: [`CompletionQueue::get_event`] then knows the event is
/// its own and acknowledges it at once (so destroying the CQ never hangs on
/// unacknowledged events).
#[derive(Debug)]
pub struct CompletionChannel {
    ch: NonNull<sys::ibv_comp_channel>,
    attached: AtomicBool,
    _ctx: Arc<Context>,
}

// SAFETY: the channel is a file descriptor plus a context pointer; verbs are thread-safe.
unsafe impl Send for CompletionChannel {}
// SAFETY: as above.
unsafe impl Sync for CompletionChannel {}

impl CompletionChannel {
    /// Creates a completion channel on `ctx`, to attach to one
    /// [`CompletionQueue`].
    pub fn new(ctx: &Arc<Context>) -> Result<Arc<Self>> {
        crate::error::clear_errno();
        // SAFETY: live context.
        let ch = unsafe { sys::ibv_create_comp_channel(ctx.as_ptr()) };
        let ch = NonNull::new(ch).ok_or_else(|| RdmaError::last_os("ibv_create_comp_channel"))?;
        Ok(Arc::new(CompletionChannel {
            ch,
            attached: AtomicBool::new(false),
            _ctx: ctx.clone(),
        }))
    }

    /// The channel's file descriptor: readable when an armed CQ has a
    /// completion event.
    pub fn fd(&self) -> RawFd {
        // SAFETY: the channel is alive.
        unsafe { self.ch.as_ref().fd }
    }

    /// Makes [`CompletionQueue::get_event`] return `Ok(false)` instead of blocking.
    pub fn set_nonblocking(&self) -> Result<()> {
        set_nonblocking(self.fd(), "fcntl(comp channel)")
    }
}

impl Drop for CompletionChannel {
    fn drop(&mut self) {
        // SAFETY: the CQ attached to this channel holds an Arc to it, so it is gone.
        unsafe { sys::ibv_destroy_comp_channel(self.ch.as_ptr()) };
    }
}

pub(crate) fn set_nonblocking(fd: RawFd, op: &'static str) -> Result<()> {
    // SAFETY: fcntl on a descriptor we own; no pointers involved.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(RdmaError::last_os(op));
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(RdmaError::last_os(op));
    }
    Ok(())
}

/// Waits until `fd` is readable or `timeout` passes. Ok(false) on timeout.
pub(crate) fn wait_readable(fd: RawFd, timeout: Duration) -> Result<bool> {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    loop {
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n >= 0 {
            return Ok(n > 0);
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(RdmaError::from_os("poll", e));
        }
    }
}

/// A work completion, polled straight into the caller's slice.
#[derive(Clone, Copy)]
#[repr(transparent)]
pub struct WorkCompletion(sys::ibv_wc);

impl Default for WorkCompletion {
    fn default() -> Self {
        // SAFETY: ibv_wc is plain old data; all-zero is a valid value.
        WorkCompletion(unsafe { std::mem::zeroed() })
    }
}

/// What a completed work request was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WcOpcode {
    /// A send (with or without immediate data) completed.
    Send,
    /// An RDMA write (with or without immediate data) completed.
    RdmaWrite,
    /// An RDMA read completed: the data is in the local buffers.
    RdmaRead,
    /// A receive completed: a send of the peer landed in it.
    Recv,
    /// A receive was consumed by the peer's RDMA write with immediate data.
    RecvWithImm,
    /// An opcode this layer does not name (raw `ibv_wc_opcode`).
    Other(u32),
}

impl WorkCompletion {
    /// The `wr_id` of the work request this completion is for.
    pub fn wr_id(&self) -> u64 {
        self.0.wr_id
    }
    /// True when the work request succeeded (`IBV_WC_SUCCESS`).
    pub fn is_success(&self) -> bool {
        self.0.status == sys::IBV_WC_SUCCESS
    }
    /// The raw status (`IBV_WC_*`); see [`WorkCompletion::status_str`].
    pub fn status(&self) -> u32 {
        self.0.status
    }
    /// libibverbs' description of the status (`ibv_wc_status_str`).
    pub fn status_str(&self) -> String {
        // SAFETY: returns a static string for any status value.
        let p = unsafe { sys::ibv_wc_status_str(self.0.status) };
        if p.is_null() {
            return format!("status {}", self.0.status);
        }
        // SAFETY: non-null static NUL-terminated string.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
    /// Only meaningful when the completion succeeded.
    pub fn opcode(&self) -> WcOpcode {
        match self.0.opcode {
            sys::IBV_WC_SEND => WcOpcode::Send,
            sys::IBV_WC_RDMA_WRITE => WcOpcode::RdmaWrite,
            sys::IBV_WC_RDMA_READ => WcOpcode::RdmaRead,
            sys::IBV_WC_RECV => WcOpcode::Recv,
            sys::IBV_WC_RECV_RDMA_WITH_IMM => WcOpcode::RecvWithImm,
            o => WcOpcode::Other(o),
        }
    }
    /// Bytes received (receive completions).
    pub fn byte_len(&self) -> u32 {
        self.0.byte_len
    }
    /// Immediate data (host byte order), when the sender attached some.
    pub fn imm_data(&self) -> Option<u32> {
        if self.0.wc_flags & sys::IBV_WC_WITH_IMM != 0 {
            // SAFETY: with IBV_WC_WITH_IMM set the union holds imm_data.
            Some(u32::from_be(unsafe { self.0.__bindgen_anon_1.imm_data }))
        } else {
            None
        }
    }
    /// The number of the local QP the completion belongs to (for an SRQ
    /// receive, the QP that took the message).
    pub fn qp_num(&self) -> u32 {
        self.0.qp_num
    }
    /// `Err(RdmaError::WorkCompletion)` for a failed completion.
    pub fn ok(&self) -> Result<&Self> {
        if self.is_success() {
            Ok(self)
        } else {
            Err(RdmaError::WorkCompletion {
                wr_id: self.0.wr_id,
                status: self.0.status,
                status_str: self.status_str(),
                vendor_err: self.0.vendor_err,
            })
        }
    }
}

impl std::fmt::Debug for WorkCompletion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkCompletion")
            .field("wr_id", &self.wr_id())
            .field("status", &self.status_str())
            .field("opcode", &self.opcode())
            .field("byte_len", &self.byte_len())
            .field("imm", &self.imm_data())
            .finish()
    }
}

/// A completion queue, optionally bound to a completion channel.
#[derive(Debug)]
pub struct CompletionQueue {
    cq: NonNull<sys::ibv_cq>,
    channel: Option<Arc<CompletionChannel>>,
    _ctx: Arc<Context>,
}

// SAFETY: CQ verbs are thread-safe (libibverbs locks internally).
unsafe impl Send for CompletionQueue {}
// SAFETY: as above.
unsafe impl Sync for CompletionQueue {}

impl CompletionQueue {
    /// A CQ of at least `cqe` entries; `channel` makes it armable.
    pub fn new(
        ctx: &Arc<Context>,
        cqe: u32,
        channel: Option<&Arc<CompletionChannel>>,
    ) -> Result<Arc<Self>> {
        if let Some(ch) = channel {
            if ch.attached.swap(true, Ordering::AcqRel) {
                return Err(RdmaError::InvalidArgument(
                    "a completion channel serves one CQ".into(),
                ));
            }
        }
        let cqe = i32::try_from(cqe).map_err(|_| RdmaError::InvalidArgument("cqe".into()))?;
        let ch_ptr = channel.map_or(std::ptr::null_mut(), |c| c.ch.as_ptr());
        crate::error::clear_errno();
        // SAFETY: live context; the channel (if any) outlives the CQ (Arc kept).
        let cq = unsafe { sys::ibv_create_cq(ctx.as_ptr(), cqe, std::ptr::null_mut(), ch_ptr, 0) };
        let cq = NonNull::new(cq).ok_or_else(|| {
            if let Some(ch) = channel {
                ch.attached.store(false, Ordering::Release);
            }
            RdmaError::last_os("ibv_create_cq")
        })?;
        Ok(Arc::new(CompletionQueue {
            cq,
            channel: channel.cloned(),
            _ctx: ctx.clone(),
        }))
    }

    /// The raw `ibv_cq`, for verbs this layer does not wrap.
    pub fn as_ptr(&self) -> *mut sys::ibv_cq {
        self.cq.as_ptr()
    }

    /// Polls up to `wcs.len()` completions into `wcs`; returns how many.
    pub fn poll(&self, wcs: &mut [WorkCompletion]) -> Result<usize> {
        let n = i32::try_from(wcs.len()).unwrap_or(i32::MAX);
        // SAFETY: WorkCompletion is repr(transparent) over ibv_wc; `n` entries fit.
        let got = unsafe { sys::ibv_poll_cq(self.as_ptr(), n, wcs.as_mut_ptr().cast()) };
        usize::try_from(got).map_err(|_| RdmaError::from_ret("ibv_poll_cq", -got))
    }

    /// Arms the CQ: the channel fires at the next (solicited) completion.
    /// Poll once more after arming: a completion may have landed in between.
    pub fn req_notify(&self, solicited_only: bool) -> Result<()> {
        if self.channel.is_none() {
            return Err(RdmaError::InvalidArgument(
                "req_notify on a CQ without a completion channel".into(),
            ));
        }
        // SAFETY: live CQ.
        let ret = unsafe { sys::ibv_req_notify_cq(self.as_ptr(), i32::from(solicited_only)) };
        if ret != 0 {
            return Err(RdmaError::from_ret("ibv_req_notify_cq", ret));
        }
        Ok(())
    }

    /// Consumes one event of this CQ's channel and acknowledges it. Ok(false)
    /// when the channel is non-blocking and has no event. Re-arm afterwards.
    pub fn get_event(&self) -> Result<bool> {
        let ch = self.channel.as_ref().ok_or_else(|| {
            RdmaError::InvalidArgument("get_event on a CQ without a completion channel".into())
        })?;
        let mut cq: *mut sys::ibv_cq = std::ptr::null_mut();
        let mut ctx: *mut libc::c_void = std::ptr::null_mut();
        // SAFETY: live channel, valid out-pointers.
        let ret = unsafe { sys::ibv_get_cq_event(ch.ch.as_ptr(), &mut cq, &mut ctx) };
        if ret != 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::WouldBlock {
                return Ok(false);
            }
            return Err(RdmaError::from_os("ibv_get_cq_event", e));
        }
        debug_assert_eq!(cq, self.as_ptr(), "one CQ per channel");
        // SAFETY: the event is for `cq` (ours: one CQ per channel); acked once.
        unsafe { sys::ibv_ack_cq_events(cq, 1) };
        Ok(true)
    }

    /// Blocks (with a deadline) until the channel fires, then consumes the event.
    pub fn wait_event(&self, timeout: Duration) -> Result<()> {
        let ch = self
            .channel
            .as_ref()
            .ok_or_else(|| RdmaError::InvalidArgument("CQ without a channel".into()))?;
        if !wait_readable(ch.fd(), timeout)? {
            return Err(RdmaError::Timeout {
                op: "completion channel",
                after: timeout,
            });
        }
        self.get_event()?;
        Ok(())
    }
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        // SAFETY: QPs and SRQs using this CQ hold Arcs to it, so none is left;
        // every channel event was acknowledged in get_event.
        unsafe { sys::ibv_destroy_cq(self.cq.as_ptr()) };
        if let Some(ch) = &self.channel {
            ch.attached.store(false, Ordering::Release);
        }
    }
}
