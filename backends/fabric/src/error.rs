//! What libfabric refused ([`FabricError`]) and the check every call's return
//! code goes through, which alone decides what is an error and what is only
//! "retry later" (`-FI_EAGAIN`).

use libfabric_sys as sys;
use std::ffi::CStr;
use std::net::SocketAddr;
use thiserror::Error;

/// Something libfabric refused.
#[derive(Debug, Error)]
pub enum FabricError {
    /// `fi_getinfo` found no such provider (or none with the asked capabilities).
    #[error("libfabric provider `{provider}` ({endpoint}) is not available here: {reason} (see `fi_info -l`)")]
    NoProvider {
        /// The provider name asked for.
        provider: String,
        /// "msg" or "rdm".
        endpoint: &'static str,
        /// libfabric's words.
        reason: String,
    },
    /// A libfabric call failed.
    #[error("{op}: {msg} (-{code})")]
    Call {
        /// The call.
        op: &'static str,
        /// The positive libfabric error number.
        code: i32,
        /// `fi_strerror`.
        msg: String,
    },
    /// `-FI_EAGAIN`: the provider's queue is full (or it wants progress
    /// first); retry later. Apart from [`FabricError::Call`] so a refused
    /// post — frequent when a link is saturated — builds no message.
    #[error("{op}: resource temporarily unavailable (-FI_EAGAIN), retry later")]
    Again {
        /// The call.
        op: &'static str,
    },
    /// A buffer slot that is busy or out of range.
    #[error("buffer slot {0} unavailable")]
    Slot(usize),
    /// A call failed for a reason known from the provider's sources and
    /// measurements, said in `why` with what to do.
    #[error("provider {provider}: {op} failed (-{code}): {why}")]
    ProviderLimit {
        /// The provider name.
        provider: String,
        /// The call.
        op: &'static str,
        /// The positive libfabric error number.
        code: i32,
        /// The cause and the way out.
        why: &'static str,
    },
    /// No domain the provider lists could be opened; `tried` says why, per
    /// domain.
    #[error("provider {provider}: no domain opens here ({tried})")]
    NoDomain {
        /// The provider name.
        provider: String,
        /// Each domain tried and its error.
        tried: String,
    },
    /// A rendezvous read whose buffer the peer withdrew before or while it
    /// was read: its check word (at its end, or read after it) was not the
    /// one the descriptor named ([`RmaBuffers::read_done`](crate::RmaBuffers::read_done)). What was read
    /// is not the unit.
    #[error("fi_read: the peer withdrew the buffer (check word {found:#x}, want {want:#x})")]
    Withdrawn {
        /// The check word the descriptor named.
        want: u64,
        /// The one read.
        found: u64,
    },
    /// An address served by another domain (device) than the one this [`Net`](crate::Net)
    /// opened: providers such as `verbs` have one domain per RDMA device and
    /// open an endpoint only on the domain that owns its address.
    #[error("{0}")]
    OtherDomain(Box<OtherDomain>),
}

/// What [`FabricError::OtherDomain`] says (boxed: errors stay small).
#[derive(Debug, Error)]
#[error("provider {provider}: {site} is served by domain `{wanted}`, but this worker's endpoints live on domain `{opened}` (one domain per worker: bind and connect through addresses of one device)")]
pub struct OtherDomain {
    /// The provider name.
    pub provider: String,
    /// The address, with its role.
    pub site: Site,
    /// The domain `fi_getinfo` names for it.
    pub wanted: String,
    /// The domain this Net opened.
    pub opened: String,
}

/// An address that picks a domain: one to listen on, or a peer to connect to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Site {
    /// A local address (listening; `fi_getinfo` with `FI_SOURCE`).
    Local(SocketAddr),
    /// A peer's address (connecting).
    Peer(SocketAddr),
}

impl Site {
    /// `fi_getinfo`'s node/service and whether they name the source.
    pub(crate) fn hint(self) -> (Option<SocketAddr>, bool) {
        match self {
            Site::Local(a) => (Some(a), true),
            Site::Peer(a) => (Some(a), false),
        }
    }
}

impl std::fmt::Display for Site {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Site::Local(a) => write!(f, "local address {a}"),
            Site::Peer(a) => write!(f, "peer {a}"),
        }
    }
}

pub(crate) fn strerror(code: i32) -> String {
    // SAFETY: fi_strerror returns a pointer to a static, NUL-terminated string
    // for any input.
    unsafe { CStr::from_ptr(sys::fi_strerror(code)) }
        .to_string_lossy()
        .into_owned()
}

pub(crate) fn check(op: &'static str, rc: isize) -> Result<isize, FabricError> {
    if rc == -(sys::FI_EAGAIN as isize) {
        Err(FabricError::Again { op })
    } else if rc < 0 {
        let code = (-rc) as i32;
        Err(FabricError::Call {
            op,
            code,
            msg: strerror(code),
        })
    } else {
        Ok(rc)
    }
}

/// A queue read that returned no entry: `-FI_EAGAIN` (and 0) is an empty
/// queue, any other code an error of `op`.
pub(crate) fn again_is_empty(op: &'static str, rc: isize) -> Result<usize, FabricError> {
    // An empty queue is every idle poll's answer; `check` builds no message
    // for it (`Again`): building one (`fi_strerror`, a `String`) took ~5% of
    // a spinning `tcp` transport's samples (perf).
    match check(op, rc) {
        Ok(_) | Err(FabricError::Again { .. }) => Ok(0),
        Err(e) => Err(e),
    }
}

/// Whether a call's error is -FI_EAGAIN.
pub fn is_again(e: &FabricError) -> bool {
    matches!(e, FabricError::Again { .. })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_queue_is_not_an_error() {
        assert_eq!(
            again_is_empty("fi_cq_read", -(sys::FI_EAGAIN as isize)).unwrap(),
            0
        );
        assert_eq!(again_is_empty("fi_cq_read", 0).unwrap(), 0);
        let e = again_is_empty("fi_cq_read", -(sys::FI_EIO as isize)).unwrap_err();
        assert!(
            matches!(e, FabricError::Call { op: "fi_cq_read", code, .. } if code == sys::FI_EIO as i32),
            "{e}"
        );
    }

    #[test]
    fn a_refused_post_is_again_and_other_codes_are_named() {
        let e = check("fi_send", -(sys::FI_EAGAIN as isize)).unwrap_err();
        assert!(matches!(e, FabricError::Again { op: "fi_send" }), "{e}");
        assert!(is_again(&e));
        let e = check("fi_send", -(sys::FI_EIO as isize)).unwrap_err();
        assert!(!is_again(&e), "{e}");
        assert!(e.to_string().starts_with("fi_send: "), "{e}");
        assert_eq!(check("fi_send", 3).unwrap(), 3);
    }
}
