//! The factory: which backend serves an address, and why one cannot.

use msgr_addr::TransportKind;

use crate::context::{Availability, TransportContext};
use crate::{AnyTransport, TransportError};

/// Says whether `kind` can be used here, without opening anything heavy.
pub fn availability(kind: &TransportKind) -> Availability {
    match kind {
        TransportKind::Tcp if cfg!(feature = "tcp") => Availability::Available,
        TransportKind::Tcp => Availability::Unavailable("built without the `tcp` feature".into()),
        #[cfg(feature = "verbs")]
        TransportKind::Verbs => crate::rdma::probe(),
        #[cfg(not(feature = "verbs"))]
        TransportKind::Verbs => {
            Availability::Unavailable(
                "built without the `verbs` cargo feature (msgr, msgr-tool and msgr-backends have it)"
                    .into(),
            )
        }
        #[cfg(feature = "rdmacm")]
        TransportKind::RdmaCm => crate::rdma::probe_cm(),
        #[cfg(not(feature = "rdmacm"))]
        TransportKind::RdmaCm => Availability::Unavailable(
            "built without the `rdmacm` cargo feature (msgr, msgr-tool and msgr-backends have it)"
                .into(),
        ),
        #[cfg(feature = "fabric")]
        TransportKind::Fabric(p) => crate::fabric::probe(p),
        #[cfg(not(feature = "fabric"))]
        TransportKind::Fabric(p) => Availability::Unavailable(format!(
            "built without the `fabric` cargo feature (msgr, msgr-tool and msgr-backends have it; provider {})",
            p.name
        )),
    }
}

/// Why `kind`'s large units do not go by rendezvous reads under the
/// default configuration (`fabric_rendezvous = auto`) although its provider
/// has them: a known bug in the libfabric loaded (they go by writes into
/// buffers the receiver grants instead where the provider has those and
/// checks keys, as `tcp` does). `None` for every other transport.
///
/// ```
/// # use msgr_addr::TransportKind;
/// # use msgr_backends::rendezvous_withheld;
/// assert_eq!(rendezvous_withheld(&TransportKind::Tcp), None);
/// ```
pub fn rendezvous_withheld(kind: &TransportKind) -> Option<&'static str> {
    match kind {
        #[cfg(feature = "fabric")]
        TransportKind::Fabric(p) => msgr_fabric::rma_withheld(&p.name),
        _ => None,
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
        TransportKind::Verbs => Ok(AnyTransport::Rdma(crate::rdma::RdmaTransport::new(
            TransportKind::Verbs,
            registry,
            ctx,
        )?)),
        #[cfg(feature = "rdmacm")]
        TransportKind::RdmaCm => Ok(AnyTransport::Rdma(crate::rdma::RdmaTransport::new(
            TransportKind::RdmaCm,
            registry,
            ctx,
        )?)),
        #[cfg(feature = "fabric")]
        TransportKind::Fabric(p) if p.endpoint == msgr_addr::FabricEndpoint::Rdm => Ok(
            AnyTransport::FabricRdm(crate::fabric::rdm::RdmTransport::new(p, registry, ctx)?),
        ),
        #[cfg(feature = "fabric")]
        TransportKind::Fabric(p) => Ok(AnyTransport::Fabric(crate::fabric::FabricTransport::new(
            p, registry, ctx,
        )?)),
        // Unreachable when every backend is compiled in.
        #[allow(unreachable_patterns)]
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
