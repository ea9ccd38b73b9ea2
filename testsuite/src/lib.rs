//! The shared stress workload and test environments for every msgr backend:
//! the stress suite ([`stress`]) that `msgr-stress`, `msgr-fanin` and the
//! tests run, and the QEMU guest runner ([`guest`]) for tests that need a
//! real RDMA stack.
//!
//! # Layers
//!
//! The modules import in one direction, each only from the layers below its
//! own (`tests/layering.rs` checks it). Bottom first:
//!
//! 1. `cli`, `guest`, `stress`: what the suite's programs share around a
//!    run; the guest runner; the stress suite. None uses another.
#![warn(missing_docs)]

pub mod cli;
pub mod guest;
pub mod stress;
