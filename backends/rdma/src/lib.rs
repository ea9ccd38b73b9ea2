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
//!
//! # Layers
//!
//! Each module imports only from the layers below its own
//! (`tests/layering.rs`). Bottom first:
//!
//! 1. `error`: what a verb refused.
//! 2. `device`: devices, their limits, ports and GIDs.
//! 3. `pd`, `cq`: protection domains; completion channels and queues.
//! 4. `mr`: memory regions.
//! 5. `wr`: receive requests and posting chains.
//! 6. `srq`: shared receive queues.
//! 7. `qp`: queue pairs.
//! 8. `cm`: rdma_cm ids, which make queue pairs.

#![warn(missing_docs)]

pub mod cm;
pub mod cq;
pub mod device;
pub mod error;
pub mod mr;
pub mod pd;
pub mod qp;
pub mod srq;
mod wr;

pub use cm::{CmEvent, CmEventKind, CmId, ConnParam, EventChannel, PortSpace};
pub use cq::{CompletionChannel, CompletionQueue, WcOpcode, WorkCompletion};
pub use device::{device_names, open_device, Context, DeviceAttr, Gid, Mtu, PortAttr};
pub use error::{RdmaError, Result};
pub use mr::{Access, ExternalRegion, MemoryRegion, ReadOnlyRegion, RemoteAddr, Sge, StableBuffer};
pub use pd::ProtectionDomain;
pub use qp::{InitAttr, QpCaps, QpInit, QpState, QueuePair, RtrAttr, RtsAttr, SendOp, SendWr};
pub use srq::SharedReceiveQueue;
pub use wr::RecvWr;
