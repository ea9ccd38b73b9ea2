//! Numbering a side's dials, so that a hello that outlived its dial is
//! recognised (Ceph's `global_seq` plays this part in its messenger).
//!
//! Two lossless peers that dial each other at once keep one of the two
//! links; the other side's hello may still be in flight when the session
//! opens over the kept one (a slow direction, a loaded node). Without a
//! number, that late hello looks like the peer starting over (a new session
//! from the same incarnation), and the established session would be reset
//! and its queue dropped. With one, the session knows every dial the peer
//! made before it opened or resumed the session (the peer's floor, sent in
//! hello-ok and reconnect-ok, or the number of the hello it took) and turns
//! away the older ones.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The counter of one side's dials (one per messenger, shared by its
/// sessions through [`LocalIdentity`](super::LocalIdentity)). Clones share
/// the count.
#[derive(Clone, Default)]
pub struct DialAttempts(Arc<AtomicU64>);

impl DialAttempts {
    /// A counter at 0 (no dial yet).
    pub fn new() -> DialAttempts {
        DialAttempts::default()
    }

    /// Numbers a new dial's hello: 1, 2, ...
    pub fn next(&self) -> u64 {
        self.0.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// The number of the last dial so far: every hello sent before now
    /// carries at most this.
    pub fn current(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

impl fmt::Debug for DialAttempts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DialAttempts({})", self.current())
    }
}

/// Clones compare equal: an identity is the same whatever its count.
impl PartialEq for DialAttempts {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for DialAttempts {}

/// What a session knows of its peer's dials: every dial of the peer's
/// incarnation `nonce` numbered up to `floor` was made before the session
/// was last opened or resumed with it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct PeerDials {
    nonce: u64,
    floor: u64,
}

impl PeerDials {
    /// Learns that the peer incarnation `nonce` had dialled up to `floor`.
    pub(crate) fn learn(&mut self, nonce: u64, floor: Option<u64>) {
        let Some(floor) = floor else { return };
        if nonce == 0 {
            return;
        }
        if self.nonce != nonce {
            *self = PeerDials { nonce, floor };
        } else {
            self.floor = self.floor.max(floor);
        }
    }

    /// Whether a hello from incarnation `nonce` numbered `attempt` was sent
    /// before the session last opened or resumed: its dial was abandoned.
    pub(crate) fn is_stale(&self, nonce: u64, attempt: Option<u64>) -> bool {
        attempt.is_some_and(|a| nonce != 0 && nonce == self.nonce && a <= self.floor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dials_are_numbered_from_one_and_clones_share_the_count() {
        let a = DialAttempts::new();
        let b = a.clone();
        assert_eq!(a.current(), 0);
        assert_eq!(a.next(), 1);
        assert_eq!(b.next(), 2);
        assert_eq!(a.current(), 2);
        assert_eq!(a, b);
        assert_ne!(a, DialAttempts::new());
    }

    #[test]
    fn only_older_dials_of_the_same_incarnation_are_stale() {
        let mut p = PeerDials::default();
        assert!(!p.is_stale(7, Some(1)), "nothing learnt yet");
        p.learn(7, Some(5));
        assert!(p.is_stale(7, Some(5)));
        assert!(p.is_stale(7, Some(1)));
        assert!(!p.is_stale(7, Some(6)), "a later dial");
        assert!(!p.is_stale(8, Some(1)), "another incarnation (a restart)");
        assert!(
            !p.is_stale(7, None),
            "a peer that does not number its dials"
        );
        assert!(!p.is_stale(0, Some(1)), "an unknown incarnation");
        p.learn(7, Some(3));
        assert!(p.is_stale(7, Some(5)), "the floor never goes down");
        p.learn(8, Some(2));
        assert!(
            !p.is_stale(7, Some(1)),
            "the peer restarted: its old dials are not ours to judge"
        );
        assert!(p.is_stale(8, Some(2)));
        p.learn(8, None);
        assert!(p.is_stale(8, Some(2)));
    }
}
