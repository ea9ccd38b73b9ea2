//! The one list of backends the stress workload runs over.
//!
//! The workload never names a transport itself: it asks [`available_backends`]
//! and runs over each. A backend joins the suite by being listed in
//! [`candidates`] (with a bind-address template that works on this host) and
//! by `msgr::availability` saying `Available` in the build at hand; nothing
//! in the workload changes.

use msgr::{availability, Availability, EntityAddr, TransportKind};
use msgr_addr::{FabricEndpoint, FabricProvider};

/// One backend the workload can run over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Backend {
    /// Short name used on the command line and in reports (the address scheme).
    pub name: String,
    /// The transport.
    pub kind: TransportKind,
    /// Where servers bind by default: a loopback address with port 0.
    pub bind_template: String,
}

impl Backend {
    /// The default bind address of the servers.
    pub fn bind_addr(&self) -> EntityAddr {
        self.bind_template.parse().unwrap_or_else(|e| {
            panic!(
                "backend {}: bad template {}: {e}",
                self.name, self.bind_template
            )
        })
    }

    /// Whether this build and host can run it, and if not why.
    pub fn availability(&self) -> Availability {
        availability(&self.kind)
    }
}

/// The name is the address scheme, plus `?ep=rdm` for libfabric RDM
/// endpoints (as in the address), so `fabric+tcp` and `fabric+tcp?ep=rdm`
/// are told apart.
fn backend(kind: TransportKind, template: &str) -> Backend {
    let name = match &kind {
        TransportKind::Fabric(p) if p.endpoint == FabricEndpoint::Rdm => {
            format!("{}?ep=rdm", kind.scheme())
        }
        _ => kind.scheme(),
    };
    Backend {
        name,
        kind,
        bind_template: template.to_string(),
    }
}

/// Every backend msgr knows of, with a loopback bind-address template each.
/// RDMA backends need a device; on a host without one `availability` says so
/// and they are left out (the QEMU guest runs them with `--bind`).
pub fn candidates() -> Vec<Backend> {
    vec![
        backend(TransportKind::Tcp, "tcp://127.0.0.1:0"),
        backend(TransportKind::Verbs, "verbs://127.0.0.1:0"),
        backend(TransportKind::RdmaCm, "rdmacm://127.0.0.1:0"),
        backend(
            TransportKind::Fabric(FabricProvider::new("tcp")),
            "fabric+tcp://127.0.0.1:0",
        ),
        backend(
            TransportKind::Fabric(FabricProvider::new("tcp").with_endpoint(FabricEndpoint::Rdm)),
            "fabric+tcp://127.0.0.1:0?ep=rdm",
        ),
        // The verbs provider needs an RDMA device (the QEMU guest's rxe1:
        // run with --bind fabric+verbs://198.51.100.1:0, see tests/guest_fabric.rs).
        backend(
            TransportKind::Fabric(FabricProvider::new("verbs")),
            "fabric+verbs://127.0.0.1:0",
        ),
        // shm offers only RDM endpoints; its names come from the address
        // (fabric+shm://IP:PORT is the region fi_ns://IP:PORT).
        backend(
            TransportKind::Fabric(FabricProvider::new("shm").with_endpoint(FabricEndpoint::Rdm)),
            "fabric+shm://127.0.0.1:0?ep=rdm",
        ),
    ]
}

/// The candidates this build and host can run.
pub fn available_backends() -> Vec<Backend> {
    candidates()
        .into_iter()
        .filter(|b| b.availability() == Availability::Available)
        .collect()
}

/// Finds a candidate by name (`tcp`, `verbs`, `rdmacm`, `fabric+tcp`,
/// `fabric+tcp?ep=rdm`, `fabric+verbs`, `fabric+shm?ep=rdm`).
pub fn backend_by_name(name: &str) -> Option<Backend> {
    candidates().into_iter().find(|b| b.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_parse_and_tcp_is_available() {
        for b in candidates() {
            assert_eq!(b.bind_addr().transport, b.kind, "{}", b.name);
        }
        assert!(available_backends().iter().any(|b| b.name == "tcp"));
    }
}
