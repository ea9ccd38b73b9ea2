//! Typed errors of the RDMA layer.

use std::io;
use std::time::Duration;

/// Everything that can go wrong in the RDMA layer.
#[derive(Debug, thiserror::Error)]
pub enum RdmaError {
    /// This machine (kernel) has no RDMA device, or none of the requested name.
    #[error("no RDMA device: {0}")]
    NoDevice(String),
    /// A verbs or rdma_cm call failed.
    #[error("{op} failed: {source}")]
    Os {
        /// The call that failed (`ibv_reg_mr`, `rdma_connect`, ...).
        op: &'static str,
        /// The error it reported.
        #[source]
        source: io::Error,
    },
    /// A work request completed with an error status.
    #[error("work completion for wr_id {wr_id} failed: {status_str} (status {status}, vendor error {vendor_err:#x})")]
    WorkCompletion {
        /// The `wr_id` of the failed work request.
        wr_id: u64,
        /// The raw completion status (`IBV_WC_*`).
        status: u32,
        /// libibverbs' description of the status.
        status_str: String,
        /// The device's own error code, for its vendor's documentation.
        vendor_err: u32,
    },
    /// rdma_cm delivered an event other than the one the caller waited for.
    #[error("rdma_cm: expected {expected}, got {got} (status {status})")]
    UnexpectedCmEvent {
        /// The kind of event waited for.
        expected: String,
        /// rdma_cm's name of the event that came.
        got: String,
        /// The status of the event that came (0, or a negative errno /
        /// reject reason).
        status: i32,
    },
    /// A wait hit its deadline.
    #[error("{op}: no progress within {after:?}")]
    Timeout {
        /// What was waited for.
        op: &'static str,
        /// The deadline that passed.
        after: Duration,
    },
    /// A parameter the layer checks itself (bounds, sizes, sharing rules).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

/// The result type of this crate: `Result<T, RdmaError>`.
pub type Result<T, E = RdmaError> = std::result::Result<T, E>;

/// Sets errno to 0 before a call that reports failure by returning NULL, so
/// that [`RdmaError::last_os`] cannot blame an earlier call's error.
pub(crate) fn clear_errno() {
    // SAFETY: __errno_location returns this thread's errno, always valid.
    unsafe { *libc::__errno_location() = 0 };
}

impl RdmaError {
    /// Maps the error of a failed call to a typed error. Without an RDMA
    /// device (kernel without uverbs/rdma_cm), `ibv_get_device_list` fails with
    /// ENOSYS and `rdma_create_event_channel` with ENODEV: both become
    /// [`RdmaError::NoDevice`] with a message that says what to do.
    pub fn from_os(op: &'static str, source: io::Error) -> Self {
        match (op, source.raw_os_error()) {
            ("ibv_get_device_list", Some(libc::ENOSYS)) => RdmaError::NoDevice(
                "ibv_get_device_list: the kernel has no RDMA support (ENOSYS); \
                 run RDMA code on an RDMA-capable host or in the test guest (docs/GUEST.md)"
                    .into(),
            ),
            ("rdma_create_event_channel", Some(libc::ENODEV)) => RdmaError::NoDevice(
                "rdma_create_event_channel: no rdma_cm device (ENODEV, /dev/infiniband/rdma_cm missing); \
                 run RDMA code on an RDMA-capable host or in the test guest (docs/GUEST.md)"
                    .into(),
            ),
            _ => RdmaError::Os { op, source },
        }
    }

    /// The error of the last failed libc-style call (errno). Callers clear
    /// errno first ([`clear_errno`]): a provider that fails without setting
    /// it (libsiw's CQ and SRQ creation under memory pressure) would
    /// otherwise be reported with whatever an earlier call left there.
    pub(crate) fn last_os(op: &'static str) -> Self {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(0) {
            return RdmaError::Os {
                op,
                source: io::Error::other(
                    "failed without saying why (errno not set; out of memory or locked memory?)",
                ),
            };
        }
        Self::from_os(op, e)
    }

    /// Verbs calls that return a positive errno value instead of setting errno.
    pub(crate) fn from_ret(op: &'static str, ret: i32) -> Self {
        let code = if ret > 0 {
            ret
        } else {
            io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO)
        };
        Self::from_os(op, io::Error::from_raw_os_error(code))
    }

    /// True for [`RdmaError::NoDevice`].
    pub fn is_no_device(&self) -> bool {
        matches!(self, RdmaError::NoDevice(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enosys_and_enodev_mean_no_device() {
        let e = RdmaError::from_os(
            "ibv_get_device_list",
            io::Error::from_raw_os_error(libc::ENOSYS),
        );
        assert!(e.is_no_device(), "{e}");
        assert!(e.to_string().contains("no RDMA device"));
        let e = RdmaError::from_os(
            "rdma_create_event_channel",
            io::Error::from_raw_os_error(libc::ENODEV),
        );
        assert!(e.is_no_device(), "{e}");
        // The same errno from another call is an ordinary OS error.
        let e = RdmaError::from_os("ibv_reg_mr", io::Error::from_raw_os_error(libc::ENODEV));
        assert!(matches!(
            e,
            RdmaError::Os {
                op: "ibv_reg_mr",
                ..
            }
        ));
    }

    #[test]
    fn a_call_that_sets_no_errno_is_not_blamed_on_an_earlier_one() {
        // An earlier failure leaves errno set...
        let _ = std::net::TcpStream::connect("0.0.0.0:0");
        clear_errno();
        // ...a NULL return after the clear says it has no reason.
        let e = RdmaError::last_os("ibv_create_cq");
        let text = e.to_string();
        assert!(text.contains("without saying why"), "{text}");
        // A set errno is still reported as itself.
        // SAFETY: this thread's errno.
        unsafe { *libc::__errno_location() = libc::ENOMEM };
        match RdmaError::last_os("ibv_create_cq") {
            RdmaError::Os { source, .. } => assert_eq!(source.raw_os_error(), Some(libc::ENOMEM)),
            other => panic!("{other}"),
        }
    }

    #[test]
    fn positive_return_is_the_errno() {
        let e = RdmaError::from_ret("ibv_modify_qp", libc::EINVAL);
        match e {
            RdmaError::Os { source, .. } => assert_eq!(source.raw_os_error(), Some(libc::EINVAL)),
            other => panic!("{other}"),
        }
    }
}
