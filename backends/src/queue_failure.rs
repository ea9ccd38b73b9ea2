//! A completion or event queue that cannot be read: every link on it fails.
//!
//! The fates of the requests posted on a queue that cannot be read are
//! unknown. Going on as if it were empty would stall every link on it
//! without a word, so the transports (RDMA's `ibv_poll_cq`, libfabric's
//! `fi_cq_read` and `fi_eq_read`) fail them all and the sessions recover per
//! policy over new links. A queue broken for good fails on every pass, so
//! the failures are counted and logged at the 1st, 2nd, 4th, 8th… only.

use std::fmt::Display;

use msgr_proto::{LinkFailure, LinkId};

/// Counts one failed read of the `queue` and returns the reason its links
/// fail with.
pub(crate) fn failed_read(count: &mut u64, queue: &str, e: &dyn Display) -> LinkFailure {
    *count += 1;
    if count.is_power_of_two() {
        tracing::error!(error = %e, failures = *count, "{queue} failed; failing every link on it");
    }
    LinkFailure::QueueUnreadable(format!("{queue} failed: {e}"))
}

/// Fails each of `links` with `why` through `fail`. Returns whether there
/// was any: a failing queue with no link left is no activity, so the worker
/// may sleep rather than spin on it.
pub(crate) fn fail_every_link(
    links: Vec<LinkId>,
    why: &LinkFailure,
    mut fail: impl FnMut(LinkId, LinkFailure),
) -> bool {
    let any = !links.is_empty();
    for id in links {
        fail(id, why.clone());
    }
    any
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_link_fails_with_the_queue_named() {
        let mut count = 0;
        let why = failed_read(&mut count, "ibv_poll_cq", &"EIO");
        assert_eq!(count, 1);
        assert_eq!(why.to_string(), "ibv_poll_cq failed: EIO");
        assert!(matches!(why, LinkFailure::QueueUnreadable(_)));
        let mut failed = Vec::new();
        assert!(fail_every_link(
            vec![LinkId(3), LinkId(5)],
            &why,
            |id, w| { failed.push((id, w)) }
        ));
        assert_eq!(failed.len(), 2);
        assert!(failed.iter().all(|(_, w)| *w == why));
        assert!(!fail_every_link(Vec::new(), &why, |_, _| unreachable!()));
    }
}
