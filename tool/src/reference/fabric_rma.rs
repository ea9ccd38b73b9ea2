//! The reference msgr's one-sided RMA is measured against over libfabric
//! (issue 49): `msgr-fabric`'s raw `fi_read` / `fi_write` loop
//! ([`msgr_fabric::RawRmaLoop`]: two `FI_EP_RDM` endpoints of this process,
//! one buffer registered once on each side, operations kept in flight), on
//! `shm` or on `tcp` (`tcp;ofi_rxm`, the data path of msgr's `fabric+tcp`).
//! Here only what the bench needs of it: the provider for a transport, its
//! figures as a stream result, its errors as the tool's.

use std::time::Duration;

use msgr::RmaOp;
use msgr_addr::TransportKind;
use msgr_fabric::{FabricError, RawRmaLoop};

use crate::error::ToolError;
use crate::stats::StreamResult;

/// The provider the reference uses for a bench transport: `shm` or `tcp`,
/// whatever the endpoint type msgr uses; `None` where there is none.
fn provider_for(kind: &TransportKind) -> Option<&'static str> {
    match kind {
        TransportKind::Fabric(p) => match p.core_provider() {
            "shm" => Some("shm"),
            "tcp" => Some("tcp"),
            _ => None,
        },
        _ => None,
    }
}

fn tool_error(e: FabricError) -> ToolError {
    ToolError::io("raw fabric reference", std::io::Error::other(e))
}

/// A raw RMA loop ready to measure, for the bench.
pub struct RawRma(RawRmaLoop);

impl RawRma {
    /// The loop for a bench over `transport`, with `in_flight` operations
    /// of up to `largest` bytes; `None` where it has none (providers
    /// other than `shm` and `tcp`, transports other than libfabric).
    pub fn for_transport(
        transport: &TransportKind,
        in_flight: usize,
        largest: usize,
    ) -> Result<Option<RawRma>, ToolError> {
        provider_for(transport)
            .map(|p| RawRmaLoop::open(p, in_flight, largest).map(RawRma))
            .transpose()
            .map_err(tool_error)
    }

    /// The provider as libfabric names it (`shm`, `tcp;ofi_rxm`).
    pub fn provider(&self) -> &str {
        self.0.provider()
    }

    /// `size`-byte `op`s, [`RawRma::for_transport`]'s number in flight,
    /// posted for `secs` and then drained: operations done, as a stream
    /// result.
    pub fn run(
        &mut self,
        op: RmaOp,
        size: usize,
        secs: Duration,
    ) -> Result<StreamResult, ToolError> {
        let op = match op {
            RmaOp::Read => msgr_fabric::RmaOp::Read,
            RmaOp::Write => msgr_fabric::RmaOp::Write,
        };
        let f = self.0.run(op, size, secs).map_err(tool_error)?;
        Ok(StreamResult::new(size, f.ops, f.elapsed.as_secs_f64()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only libfabric's `shm` and `tcp` (however layered) get a loop.
    #[test]
    fn raw_loop_providers_are_shm_and_tcp() {
        let kind = |s: &str| s.parse::<msgr::EntityAddr>().unwrap().transport;
        assert_eq!(provider_for(&kind("fabric+shm://127.0.0.1:1")), Some("shm"));
        assert_eq!(provider_for(&kind("fabric+tcp://127.0.0.1:1")), Some("tcp"));
        assert_eq!(provider_for(&kind("tcp://127.0.0.1:1")), None);
    }
}
