//! The references every benchmark is compared with, run in the same process
//! on the same loopback: plain blocking `std::net` code (`std_net`), and
//! with the `fabric` feature a raw libfabric `fi_read`/`fi_write` loop
//! for one-sided RMA over `shm` and `tcp` (`msgr-fabric`'s `RawRmaLoop`,
//! adapted in `fabric_rma`).
//!
//! # Layers
//!
//! 1. `std_net`, `fabric_rma`: one reference each, beside each other.

#[cfg(feature = "fabric")]
mod fabric_rma;
mod std_net;

#[cfg(feature = "fabric")]
pub use fabric_rma::RawRma;
pub use std_net::{framed_stream, ping, stream};

/// Without the `fabric` feature there is no raw RMA loop: none is ever made.
#[cfg(not(feature = "fabric"))]
pub enum RawRma {}

#[cfg(not(feature = "fabric"))]
impl RawRma {
    /// Never a loop in a build without libfabric.
    pub fn for_transport(
        _transport: &msgr_addr::TransportKind,
        _in_flight: usize,
        _largest: usize,
    ) -> Result<Option<RawRma>, crate::error::ToolError> {
        Ok(None)
    }

    /// Unreachable: no value exists.
    pub fn provider(&self) -> &str {
        match *self {}
    }

    /// Unreachable: no value exists.
    pub fn run(
        &mut self,
        _op: msgr::RmaOp,
        _size: usize,
        _secs: std::time::Duration,
    ) -> Result<crate::stats::StreamResult, crate::error::ToolError> {
        match *self {}
    }
}
