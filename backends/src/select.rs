//! The factory: which backend serves an address, and why one cannot.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use msgr_addr::TransportKind;
use msgr_proto::FrameLimits;

use crate::{AnyTransport, TransportError};

/// What a worker hands each transport it opens.
#[derive(Clone, Debug)]
pub struct TransportContext {
    /// Receive limits for decoding.
    pub limits: FrameLimits,
    /// Allocator of link ids shared by the worker's transports (accepted links
    /// need ids too).
    pub link_ids: Arc<AtomicU64>,
    /// Frames with segments up to this size are copied into one coalescing
    /// buffer (one write for many frames); larger segments go by reference.
    pub copy_threshold: usize,
}

impl TransportContext {
    /// A context with the given limits and a fresh link-id allocator.
    pub fn new(limits: FrameLimits) -> Self {
        TransportContext {
            limits,
            link_ids: Arc::new(AtomicU64::new(1)),
            copy_threshold: 8 << 10,
        }
    }
}

/// Whether a transport can be used in this build and on this machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Availability {
    /// Ready to use.
    Available,
    /// Not usable; the text says why and what to do.
    Unavailable(String),
}

/// Says whether `kind` can be used here, without opening anything heavy.
pub fn availability(kind: &TransportKind) -> Availability {
    match kind {
        TransportKind::Tcp if cfg!(feature = "tcp") => Availability::Available,
        TransportKind::Tcp => Availability::Unavailable("built without the `tcp` feature".into()),
        #[cfg(feature = "verbs")]
        TransportKind::Verbs => match crate::verbs::probe() {
            Ok(()) => Availability::Available,
            Err(reason) => Availability::Unavailable(reason),
        },
        #[cfg(not(feature = "verbs"))]
        TransportKind::Verbs => {
            Availability::Unavailable("built without the `verbs` feature of msgr-backends".into())
        }
        TransportKind::RdmaCm => Availability::Unavailable(
            "the rdma_cm backend is not part of this build yet (see issue: RDMA backends)".into(),
        ),
        #[cfg(feature = "fabric")]
        TransportKind::Fabric(p) => crate::fabric::probe(p),
        #[cfg(not(feature = "fabric"))]
        TransportKind::Fabric(p) => Availability::Unavailable(format!(
            "the libfabric backend (provider {}) is not part of this build yet",
            p.name
        )),
    }
}

/// Opens the backend that serves `kind` for one worker.
pub fn open_transport(
    kind: &TransportKind,
    registry: &mio::Registry,
    ctx: &TransportContext,
) -> Result<AnyTransport, TransportError> {
    match kind {
        #[cfg(feature = "tcp")]
        TransportKind::Tcp => Ok(AnyTransport::Tcp(crate::tcp::TcpTransport::new(
            registry, ctx,
        )?)),
        #[cfg(feature = "verbs")]
        TransportKind::Verbs => Ok(AnyTransport::Verbs(crate::verbs::VerbsTransport::new(
            registry, ctx,
        )?)),
        #[cfg(feature = "fabric")]
        TransportKind::Fabric(p) if p.endpoint == msgr_addr::FabricEndpoint::Rdm => Ok(
            AnyTransport::FabricRdm(crate::fabric::rdm::RdmTransport::new(p, registry, ctx)?),
        ),
        #[cfg(feature = "fabric")]
        TransportKind::Fabric(p) => Ok(AnyTransport::Fabric(crate::fabric::FabricTransport::new(
            p, registry, ctx,
        )?)),
        other => {
            let _ = (registry, ctx);
            let reason = match availability(other) {
                Availability::Unavailable(r) => r,
                Availability::Available => "no backend registered".into(),
            };
            Err(TransportError::Unavailable {
                kind: other.clone(),
                reason,
            })
        }
    }
}
