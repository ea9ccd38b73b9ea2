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
//!
//! A dial of its own also tells a hello that goes on trying to open a
//! session from one that starts anew: a dialler whose hello-ok was slower
//! than its handshake timeout dials again with cookie 0, and its hello
//! names the first dial of that attempt (`features::FIRST_DIAL`). The
//! acceptor that opened the session for one of those dials resumes it:
//! resetting it would drop what it queued between two live peers.

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
/// was last opened or resumed with it; and, while the peer may not have
/// heard the hello-ok, the dial this side opened the session for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct PeerDials {
    nonce: u64,
    floor: u64,
    /// The peer's dial whose hello this side answered with hello-ok, a
    /// new session; `None` once the peer showed it knows the cookie (a
    /// resume) or the session did not open so.
    opened_by: Option<u64>,
}

impl PeerDials {
    /// Learns that the peer incarnation `nonce` had dialled up to `floor`.
    pub(crate) fn learn(&mut self, nonce: u64, floor: Option<u64>) {
        let Some(floor) = floor else { return };
        if nonce == 0 {
            return;
        }
        if self.nonce != nonce {
            *self = PeerDials {
                nonce,
                floor,
                opened_by: None,
            };
        } else {
            self.floor = self.floor.max(floor);
        }
    }

    /// The session opened (hello-ok) for the peer's hello numbered `dial`
    /// (learnt already); `None` for a peer that does not number its dials.
    pub(crate) fn opened_for(&mut self, dial: Option<u64>) {
        self.opened_by = dial.filter(|_| self.nonce != 0);
    }

    /// The peer knows the session's cookie (it resumed, or answered our
    /// dial), or the session starts anew: no cookie-0 hello continues
    /// an opening any more.
    pub(crate) fn forget_opening(&mut self) {
        self.opened_by = None;
    }

    /// Whether a cookie-0 hello from incarnation `nonce`, numbered `dial`,
    /// whose attempt to open began with dial `first`, is a later dial of
    /// the attempt this side opened the session for: the peer gave that
    /// dial up before the hello-ok arrived, and goes on trying.
    pub(crate) fn continues_opening(
        &self,
        nonce: u64,
        dial: Option<u64>,
        first: Option<u64>,
    ) -> bool {
        match (self.opened_by, dial, first) {
            (Some(opened), Some(dial), Some(first)) => {
                nonce != 0 && nonce == self.nonce && first <= opened && opened < dial
            }
            _ => false,
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

    #[test]
    fn only_later_dials_of_the_attempt_that_opened_continue_it() {
        let mut p = PeerDials::default();
        p.learn(7, Some(5));
        assert!(!p.continues_opening(7, Some(6), Some(5)), "not opened yet");
        p.opened_for(Some(5));
        assert!(p.continues_opening(7, Some(6), Some(5)));
        assert!(
            p.continues_opening(7, Some(9), Some(2)),
            "an attempt begun earlier"
        );
        assert!(!p.continues_opening(7, Some(9), Some(6)), "a new attempt");
        assert!(
            !p.continues_opening(7, Some(5), Some(5)),
            "the opening dial itself"
        );
        assert!(
            !p.continues_opening(8, Some(6), Some(5)),
            "a restarted peer"
        );
        assert!(
            !p.continues_opening(7, Some(6), None),
            "a peer without FIRST_DIAL"
        );
        assert!(
            !p.continues_opening(7, None, Some(5)),
            "a peer without numbers"
        );
        p.forget_opening();
        assert!(
            !p.continues_opening(7, Some(6), Some(5)),
            "the peer had the cookie"
        );
        p.opened_for(Some(5));
        p.learn(8, Some(1));
        assert!(
            !p.continues_opening(7, Some(6), Some(5)),
            "a new incarnation forgets"
        );
        assert!(!p.continues_opening(8, Some(6), Some(1)));
    }
}
