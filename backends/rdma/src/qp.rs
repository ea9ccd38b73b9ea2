//! Reliable-connected queue pairs: creation, state transitions, posting.

use crate::cq::CompletionQueue;
use crate::device::{Gid, Mtu};
use crate::error::{RdmaError, Result};
use crate::mr::{Access, RemoteAddr, Sge};
use crate::pd::ProtectionDomain;
use crate::srq::SharedReceiveQueue;
use crate::wr::{post_chain, post_recv_chain, LocalSges, RecvWr};
use rdma_cm_sys as sys;
use std::ptr::NonNull;
use std::sync::Arc;

/// Queue sizes of a QP.
#[derive(Clone, Copy, Debug)]
pub struct QpCaps {
    /// Most outstanding work requests on the send queue.
    pub max_send_wr: u32,
    /// Most outstanding work requests on the receive queue (unused with
    /// an SRQ).
    pub max_recv_wr: u32,
    /// Most scatter/gather elements per send work request.
    pub max_send_sge: u32,
    /// Most scatter/gather elements per receive work request.
    pub max_recv_sge: u32,
    /// Most bytes a send may carry inline (see [`SendWr::inline`]).
    pub max_inline_data: u32,
}

impl Default for QpCaps {
    fn default() -> Self {
        QpCaps {
            max_send_wr: 64,
            max_recv_wr: 64,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        }
    }
}

/// What an RC QP is created with.
#[derive(Clone, Debug)]
pub struct QpInit {
    /// Where send work requests complete.
    pub send_cq: Arc<CompletionQueue>,
    /// Where receive work requests complete.
    pub recv_cq: Arc<CompletionQueue>,
    /// Receives come from this SRQ instead of the QP's own receive queue.
    pub srq: Option<Arc<SharedReceiveQueue>>,
    /// The queue sizes to ask for; the device may grant more.
    pub caps: QpCaps,
    /// Every send request completes with a CQ entry (else only `signaled` ones).
    pub sq_sig_all: bool,
}

impl QpInit {
    /// Completions go to `send_cq` and `recv_cq`; default caps, no SRQ, and
    /// only signaled sends complete.
    pub fn new(send_cq: &Arc<CompletionQueue>, recv_cq: &Arc<CompletionQueue>) -> Self {
        QpInit {
            send_cq: send_cq.clone(),
            recv_cq: recv_cq.clone(),
            srq: None,
            caps: QpCaps::default(),
            sq_sig_all: false,
        }
    }

    pub(crate) fn raw(&self) -> sys::ibv_qp_init_attr {
        sys::ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: self.send_cq.as_ptr(),
            recv_cq: self.recv_cq.as_ptr(),
            srq: self
                .srq
                .as_ref()
                .map_or(std::ptr::null_mut(), |s| s.as_ptr()),
            cap: sys::ibv_qp_cap {
                max_send_wr: self.caps.max_send_wr,
                max_recv_wr: self.caps.max_recv_wr,
                max_send_sge: self.caps.max_send_sge,
                max_recv_sge: self.caps.max_recv_sge,
                max_inline_data: self.caps.max_inline_data,
            },
            qp_type: sys::IBV_QPT_RC,
            sq_sig_all: i32::from(self.sq_sig_all),
        }
    }
}

/// Parameters of RESET → INIT.
#[derive(Clone, Copy, Debug)]
pub struct InitAttr {
    /// The device port the QP uses (numbered from 1).
    pub port: u8,
    /// Index into the port's partition key table (0 = the default
    /// partition).
    pub pkey_index: u16,
    /// What the peer may do to our memory through this QP.
    pub access: Access,
}

impl Default for InitAttr {
    fn default() -> Self {
        InitAttr {
            port: 1,
            pkey_index: 0,
            access: Access::ALL_RDMA,
        }
    }
}

/// How to reach the peer's QP (INIT → RTR).
#[derive(Clone, Copy, Debug)]
pub struct RtrAttr {
    /// The MTU of the path: at most the active MTU of both ports.
    pub path_mtu: Mtu,
    /// The peer QP's number.
    pub dest_qp_num: u32,
    /// The peer's initial send PSN.
    pub rq_psn: u32,
    /// RDMA reads/atomics the peer may have outstanding towards us.
    pub max_dest_rd_atomic: u8,
    /// RNR NAK timer code (IB encoding; 12 = 0.64 ms).
    pub min_rnr_timer: u8,
    /// The local port the path leaves from (numbered from 1).
    pub port: u8,
    /// The peer's LID (InfiniBand; 0 on RoCE).
    pub dlid: u16,
    /// The peer's GID. Required on Ethernet link layers (RoCE): adds a GRH.
    pub dgid: Option<Gid>,
    /// Index of our source GID in the port's GID table (used with
    /// `dgid`).
    pub sgid_index: u8,
    /// IP hop limit / TTL of the GRH (used with `dgid`).
    pub hop_limit: u8,
}

/// Parameters of RTR → RTS.
#[derive(Clone, Copy, Debug)]
pub struct RtsAttr {
    /// Our initial send PSN (the peer's `rq_psn`).
    pub sq_psn: u32,
    /// Local ACK timeout code (4.096 µs × 2^timeout).
    pub timeout: u8,
    /// How often to resend after an ACK timeout before the request fails
    /// (0-7).
    pub retry_cnt: u8,
    /// 7 = retry forever.
    pub rnr_retry: u8,
    /// RDMA reads/atomics we may have outstanding.
    pub max_rd_atomic: u8,
}

impl Default for RtsAttr {
    fn default() -> Self {
        RtsAttr {
            sq_psn: 0,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 1,
        }
    }
}

/// QP states as `ibv_query_qp` reports them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QpState {
    /// Just created or reset: no work requests can be posted.
    Reset,
    /// Receives can be posted but are not processed yet.
    Init,
    /// Ready to receive: receives are processed, sends not yet allowed.
    Rtr,
    /// Ready to send: fully operational.
    Rts,
    /// Send queue drain: sends already started finish, new ones wait.
    Sqd,
    /// Send queue error: a send failed (not used by RC QPs).
    Sqe,
    /// Error: outstanding and new work requests complete as flushed.
    Err,
    /// A state this layer does not name (raw `ibv_qp_state`).
    Unknown(u32),
}

/// The operation of a send work request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendOp {
    /// Send to the peer's next posted receive.
    Send,
    /// Send with 32-bit immediate data (not on iWARP).
    SendWithImm(u32),
    /// Write the local data into the peer's memory; no receive is
    /// consumed and the peer sees no completion.
    RdmaWrite(RemoteAddr),
    /// RDMA write that also consumes a receive at the peer (not on iWARP).
    RdmaWriteWithImm(RemoteAddr, u32),
    /// Read the peer's memory into the local buffers.
    RdmaRead(RemoteAddr),
}

/// A send-queue work request.
#[derive(Clone, Copy, Debug)]
pub struct SendWr<'a> {
    /// Returned in this request's work completion.
    pub wr_id: u64,
    /// Local memory: the data to send/write, or where read data lands.
    pub sges: &'a [Sge],
    /// What the request does.
    pub op: SendOp,
    /// Produce a completion (when the QP was not made with `sq_sig_all`).
    pub signaled: bool,
    /// Copy the data into the WR at post time (up to `max_inline_data`).
    pub inline: bool,
    /// Wake a peer that armed its CQ for solicited events only.
    pub solicited: bool,
}

impl<'a> SendWr<'a> {
    /// A signaled request without inline data or solicited flag.
    pub fn new(wr_id: u64, op: SendOp, sges: &'a [Sge]) -> Self {
        SendWr {
            wr_id,
            sges,
            op,
            signaled: true,
            inline: false,
            solicited: false,
        }
    }

    /// The provider's form, over `num_sge` SGEs at `sg` (see [`post_chain`]).
    fn raw(&self, sg: *mut sys::ibv_sge, num_sge: i32) -> sys::ibv_send_wr {
        // SAFETY: ibv_send_wr is plain old data; all-zero is valid.
        let mut wr: sys::ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = self.wr_id;
        wr.sg_list = sg;
        wr.num_sge = num_sge;
        let mut flags = 0;
        if self.signaled {
            flags |= sys::IBV_SEND_SIGNALED;
        }
        if self.inline {
            flags |= sys::IBV_SEND_INLINE;
        }
        if self.solicited {
            flags |= sys::IBV_SEND_SOLICITED;
        }
        wr.send_flags = flags;
        let remote = |wr: &mut sys::ibv_send_wr, r: RemoteAddr| {
            wr.wr.rdma = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
                remote_addr: r.addr,
                rkey: r.rkey,
            };
        };
        match self.op {
            SendOp::Send => wr.opcode = sys::IBV_WR_SEND,
            SendOp::SendWithImm(imm) => {
                wr.opcode = sys::IBV_WR_SEND_WITH_IMM;
                wr.__bindgen_anon_1.imm_data = imm.to_be();
            }
            SendOp::RdmaWrite(r) => {
                wr.opcode = sys::IBV_WR_RDMA_WRITE;
                remote(&mut wr, r);
            }
            SendOp::RdmaWriteWithImm(r, imm) => {
                wr.opcode = sys::IBV_WR_RDMA_WRITE_WITH_IMM;
                wr.__bindgen_anon_1.imm_data = imm.to_be();
                remote(&mut wr, r);
            }
            SendOp::RdmaRead(r) => {
                wr.opcode = sys::IBV_WR_RDMA_READ;
                remote(&mut wr, r);
            }
        }
        wr
    }
}

impl LocalSges for SendWr<'_> {
    fn local_sges(&self) -> &[Sge] {
        self.sges
    }
}

/// What made a QP by `rdma_create_qp` and destroys it (its rdma_cm id:
/// `crate::cm`, above this module).
pub(crate) trait DestroysQp: Send + Sync + std::fmt::Debug {
    /// `rdma_destroy_qp` on the id, once.
    fn destroy_qp(&self);
}

/// Who destroys the QP.
#[derive(Debug)]
enum Owner {
    Verbs,
    /// Made by rdma_create_qp: destroyed by rdma_destroy_qp on its id.
    Cm(Arc<dyn DestroysQp>),
}

fn granted_caps(c: &sys::ibv_qp_cap) -> QpCaps {
    QpCaps {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
    }
}

/// A reliable-connected queue pair.
#[derive(Debug)]
pub struct QueuePair {
    qp: NonNull<sys::ibv_qp>,
    owner: Owner,
    _pd: Arc<ProtectionDomain>,
    _init: QpInit,
    /// The caps the device granted (it may round up what was asked).
    caps: QpCaps,
}

// SAFETY: QP verbs are thread-safe.
unsafe impl Send for QueuePair {}
// SAFETY: as above.
unsafe impl Sync for QueuePair {}

impl QueuePair {
    /// Creates an RC QP in the RESET state; connect it with
    /// [`QueuePair::to_init`], [`QueuePair::to_rtr`], [`QueuePair::to_rts`].
    pub fn new(pd: &Arc<ProtectionDomain>, init: QpInit) -> Result<Self> {
        let mut attr = init.raw();
        crate::error::clear_errno();
        // SAFETY: live PD; the CQs/SRQ in `attr` are kept alive by `init`.
        let qp = unsafe { sys::ibv_create_qp(pd.as_ptr(), &mut attr) };
        let qp = NonNull::new(qp).ok_or_else(|| RdmaError::last_os("ibv_create_qp"))?;
        Ok(QueuePair {
            qp,
            owner: Owner::Verbs,
            _pd: pd.clone(),
            _init: init,
            caps: granted_caps(&attr.cap),
        })
    }

    pub(crate) fn from_cm(
        qp: NonNull<sys::ibv_qp>,
        id: Arc<dyn DestroysQp>,
        pd: &Arc<ProtectionDomain>,
        init: QpInit,
        granted: &sys::ibv_qp_cap,
    ) -> Self {
        QueuePair {
            qp,
            owner: Owner::Cm(id),
            _pd: pd.clone(),
            _init: init,
            caps: granted_caps(granted),
        }
    }

    /// The queue sizes and inline limit the device granted.
    pub fn caps(&self) -> QpCaps {
        self.caps
    }

    /// The raw `ibv_qp`, for verbs this layer does not wrap.
    pub fn as_ptr(&self) -> *mut sys::ibv_qp {
        self.qp.as_ptr()
    }

    /// The QP number: what the peer needs as its `dest_qp_num`.
    pub fn qp_num(&self) -> u32 {
        // SAFETY: live QP.
        unsafe { self.qp.as_ref().qp_num }
    }

    fn modify(&self, attr: &mut sys::ibv_qp_attr, mask: u32, op: &'static str) -> Result<()> {
        // SAFETY: live QP, valid attribute struct; mask names the fields set.
        let ret = unsafe { sys::ibv_modify_qp(self.as_ptr(), attr, mask as i32) };
        if ret != 0 {
            return Err(RdmaError::from_ret(op, ret));
        }
        Ok(())
    }

    /// RESET → INIT.
    pub fn to_init(&self, a: &InitAttr) -> Result<()> {
        let mut attr = sys::ibv_qp_attr {
            qp_state: sys::IBV_QPS_INIT,
            pkey_index: a.pkey_index,
            port_num: a.port,
            qp_access_flags: a.access.raw(),
            ..Default::default()
        };
        self.modify(
            &mut attr,
            sys::IBV_QP_STATE
                | sys::IBV_QP_PKEY_INDEX
                | sys::IBV_QP_PORT
                | sys::IBV_QP_ACCESS_FLAGS,
            "ibv_modify_qp(INIT)",
        )
    }

    /// INIT → RTR (ready to receive).
    pub fn to_rtr(&self, a: &RtrAttr) -> Result<()> {
        let mut attr = sys::ibv_qp_attr {
            qp_state: sys::IBV_QPS_RTR,
            path_mtu: a.path_mtu.raw(),
            dest_qp_num: a.dest_qp_num,
            rq_psn: a.rq_psn & 0xff_ffff,
            max_dest_rd_atomic: a.max_dest_rd_atomic,
            min_rnr_timer: a.min_rnr_timer,
            ..Default::default()
        };
        attr.ah_attr.dlid = a.dlid;
        attr.ah_attr.port_num = a.port;
        if let Some(gid) = a.dgid {
            attr.ah_attr.is_global = 1;
            attr.ah_attr.grh.dgid.raw = gid.0;
            attr.ah_attr.grh.sgid_index = a.sgid_index;
            attr.ah_attr.grh.hop_limit = a.hop_limit;
        }
        self.modify(
            &mut attr,
            sys::IBV_QP_STATE
                | sys::IBV_QP_AV
                | sys::IBV_QP_PATH_MTU
                | sys::IBV_QP_DEST_QPN
                | sys::IBV_QP_RQ_PSN
                | sys::IBV_QP_MAX_DEST_RD_ATOMIC
                | sys::IBV_QP_MIN_RNR_TIMER,
            "ibv_modify_qp(RTR)",
        )
    }

    /// RTR → RTS (ready to send).
    pub fn to_rts(&self, a: &RtsAttr) -> Result<()> {
        let mut attr = sys::ibv_qp_attr {
            qp_state: sys::IBV_QPS_RTS,
            sq_psn: a.sq_psn & 0xff_ffff,
            timeout: a.timeout,
            retry_cnt: a.retry_cnt,
            rnr_retry: a.rnr_retry,
            max_rd_atomic: a.max_rd_atomic,
            ..Default::default()
        };
        self.modify(
            &mut attr,
            sys::IBV_QP_STATE
                | sys::IBV_QP_SQ_PSN
                | sys::IBV_QP_TIMEOUT
                | sys::IBV_QP_RETRY_CNT
                | sys::IBV_QP_RNR_RETRY
                | sys::IBV_QP_MAX_QP_RD_ATOMIC,
            "ibv_modify_qp(RTS)",
        )
    }

    /// Any state → ERR: outstanding work requests complete with
    /// "flushed" errors. Fault injection and orderly teardown use it.
    pub fn to_err(&self) -> Result<()> {
        let mut attr = sys::ibv_qp_attr {
            qp_state: sys::IBV_QPS_ERR,
            ..Default::default()
        };
        self.modify(&mut attr, sys::IBV_QP_STATE, "ibv_modify_qp(ERR)")
    }

    /// Any state → RESET (reuse after an error).
    pub fn to_reset(&self) -> Result<()> {
        let mut attr = sys::ibv_qp_attr {
            qp_state: sys::IBV_QPS_RESET,
            ..Default::default()
        };
        self.modify(&mut attr, sys::IBV_QP_STATE, "ibv_modify_qp(RESET)")
    }

    /// The QP's current state (`ibv_query_qp`).
    pub fn state(&self) -> Result<QpState> {
        let mut attr = sys::ibv_qp_attr::default();
        let mut init = sys::ibv_qp_init_attr::default();
        // SAFETY: live QP, valid out-pointers.
        let ret = unsafe {
            sys::ibv_query_qp(
                self.as_ptr(),
                &mut attr,
                sys::IBV_QP_STATE as i32,
                &mut init,
            )
        };
        if ret != 0 {
            return Err(RdmaError::from_ret("ibv_query_qp", ret));
        }
        Ok(match attr.qp_state {
            sys::IBV_QPS_RESET => QpState::Reset,
            sys::IBV_QPS_INIT => QpState::Init,
            sys::IBV_QPS_RTR => QpState::Rtr,
            sys::IBV_QPS_RTS => QpState::Rts,
            sys::IBV_QPS_SQD => QpState::Sqd,
            sys::IBV_QPS_SQE => QpState::Sqe,
            sys::IBV_QPS_ERR => QpState::Err,
            s => QpState::Unknown(s),
        })
    }

    /// Posts send-queue work requests (as one chain). On failure the error
    /// names the first rejected request; requests before it were posted.
    pub fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<()> {
        post_chain(
            wrs,
            "ibv_post_send",
            |w, sg, num_sge| w.raw(sg, num_sge),
            |w, next| w.next = next,
            |head, bad| {
                // SAFETY: `head` is a well-formed chain whose SGE arrays live
                // until the call returns (the provider copies WRs at post
                // time); every SGE lies inside a registered region (Sge is
                // only made by MemoryRegion::sge), and remote keys are
                // checked by the peer's device.
                unsafe { sys::ibv_post_send(self.as_ptr(), head, bad) }
            },
        )
    }

    /// Posts receive work requests to this QP's own receive queue.
    pub fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<()> {
        post_recv_chain(wrs, "ibv_post_recv", |head, bad| {
            // SAFETY: as in post_send: a well-formed chain over registered memory.
            unsafe { sys::ibv_post_recv(self.as_ptr(), head, bad) }
        })
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        match &self.owner {
            // SAFETY: we created the QP; destroyed once.
            Owner::Verbs => unsafe {
                sys::ibv_destroy_qp(self.qp.as_ptr());
            },
            Owner::Cm(id) => id.destroy_qp(),
        }
    }
}
