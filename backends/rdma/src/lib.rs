//! A thin safe layer over libibverbs and librdmacm (via `rdma-cm-sys`, the
//! `msgr-rdma-cm-sys` package), for msgr's verbs and rdma_cm backends.
//!
//! - [`device`]: device list, [`Context`] (open device), limits, ports, GIDs;
//! - [`pd`], [`mr`]: protection domains and memory regions over caller-owned
//!   buffers ([`MemoryRegion`] keeps its buffer alive while registered);
//! - [`cq`]: completion channels (fd for mio), completion queues, polling;
//! - [`qp`]: RC queue pairs with typed INIT → RTR → RTS transitions, ERR for
//!   fault injection, send/recv/RDMA read/write/immediate/inline posting;
//! - [`srq`]: shared receive queues;
//! - [`cm`]: rdma_cm event channel and ids (resolve, listen, connect, accept).
//!
//! Without an RDMA device every entry point fails with
//! [`RdmaError::NoDevice`] rather than an opaque errno.
//!
//! Objects hold `Arc`s to what they were made from (QP → PD, CQs → context),
//! so destruction always runs in a valid order.

#![warn(missing_docs)]

pub mod cm;
pub mod cq;
pub mod device;
pub mod error;
pub mod mr;
pub mod pd;
pub mod qp;
pub mod srq;

pub use cm::{CmEvent, CmEventKind, CmId, ConnParam, EventChannel, PortSpace};
pub use cq::{CompletionChannel, CompletionQueue, WcOpcode, WorkCompletion};
pub use device::{device_names, open_device, Context, DeviceAttr, Gid, Mtu, PortAttr};
pub use error::{RdmaError, Result};
pub use mr::{Access, ExternalRegion, MemoryRegion, ReadOnlyRegion, RemoteAddr, Sge, StableBuffer};
pub use pd::ProtectionDomain;
pub use qp::{
    InitAttr, QpCaps, QpInit, QpState, QueuePair, RecvWr, RtrAttr, RtsAttr, SendOp, SendWr,
};
pub use srq::SharedReceiveQueue;
