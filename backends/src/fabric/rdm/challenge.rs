//! [`HelloChallenges`]: a listener allocates a link only for a connector
//! that proved it receives at the endpoint name its HELLO claims.
//!
//! An RDM endpoint is connectionless: a HELLO names its sender, and nothing
//! below checks the name (`shm` and `tcp;ofi_rxm` report no verified
//! source). Answering a HELLO with a WELCOME and a link would let anyone
//! who can reach the listener get link state in another endpoint's name and
//! send that endpoint unsolicited messages. So a first HELLO gets only a
//! `CHALLENGE` (a header, no larger than the HELLO: no amplification) sent
//! to the name it claims, carrying a token; the connector sends its HELLO
//! again with the token, and only then is anything allocated. As in QUIC's
//! Retry or TCP's SYN cookies the listener keeps no state per challenge: a
//! token is a MAC, under a key drawn at start, of the claimed name and the
//! connector's link id and cookie, in a time epoch. A token is good in the
//! epoch it was made and the next one, and once: a replayed HELLO (even a
//! copy of the real one with its token) draws a new challenge to the name
//! it claims, whose owner ignores it, and allocates nothing.
//!
//! This proves where the connector receives, not who it is: that is the
//! session's handshake, which runs over the link next (auth/secure modes).

use std::time::{Duration, Instant};

use ring::hmac;
use rustc_hash::FxHashSet;

use super::wire::Dest;

/// How long a token's epoch lasts; a token is good for one to two of them.
const EPOCH: Duration = Duration::from_secs(5);

/// Tokens accepted in one epoch before further HELLOs wait for the next:
/// bounds the set of used tokens (each a link the listener made).
const MAX_USED: usize = 1 << 16;

/// Challenges sent in one epoch at most: a flood of forged HELLOs draws
/// this many small messages to the names they claim, then none until the
/// next epoch (`hello_challenges_withheld`).
const MAX_CHALLENGES: u64 = 4096;

/// What a HELLO's token says.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Good, and now used: allocate the link.
    Admit,
    /// None, or one not good (forged, expired, replayed): challenge again.
    Challenge,
}

/// The listener's side of the HELLO challenge (one per transport).
pub(super) struct HelloChallenges {
    key: hmac::Key,
    start: Instant,
    /// The epoch `used` holds tokens of; `used_before` the one before.
    epoch: u64,
    /// The epoch `sent_now` counts challenges of.
    sent_epoch: u64,
    sent_now: u64,
    used: FxHashSet<u64>,
    used_before: FxHashSet<u64>,
    /// Challenges sent (`hello_challenges`).
    pub(super) sent: u64,
    /// HELLOs with a token that was not good (`hello_tokens_refused`).
    pub(super) refused: u64,
    /// Challenges not sent: the epoch's were (`hello_challenges_withheld`).
    pub(super) withheld: u64,
}

impl HelloChallenges {
    /// A new key from the system's random number generator (an error if
    /// it fails: never a predictable key).
    pub(super) fn new(now: Instant) -> Result<Self, ring::error::Unspecified> {
        let rng = ring::rand::SystemRandom::new();
        let key = hmac::Key::generate(hmac::HMAC_SHA256, &rng)?;
        Ok(HelloChallenges {
            key,
            start: now,
            epoch: 0,
            sent_epoch: 0,
            sent_now: 0,
            used: FxHashSet::default(),
            used_before: FxHashSet::default(),
            sent: 0,
            refused: 0,
            withheld: 0,
        })
    }

    /// The counters, named as the transport's stats name them.
    pub(super) fn values(&self) -> [(&'static str, u64); 3] {
        [
            ("hello_challenges", self.sent),
            ("hello_tokens_refused", self.refused),
            ("hello_challenges_withheld", self.withheld),
        ]
    }

    fn epoch_at(&self, now: Instant) -> u64 {
        (now.saturating_duration_since(self.start).as_millis() / EPOCH.as_millis()) as u64
    }

    /// The token for a HELLO from `name` for the connector's link `from`,
    /// made in `epoch`. Never 0 (0 is "no token").
    fn token(&self, epoch: u64, name: &[u8], from: Dest) -> u64 {
        let mut ctx = hmac::Context::with_key(&self.key);
        ctx.update(&epoch.to_le_bytes());
        ctx.update(&from.link.to_le_bytes());
        ctx.update(&from.cookie.to_le_bytes());
        ctx.update(name);
        let tag = ctx.sign();
        let mut t = [0u8; 8];
        t.copy_from_slice(&tag.as_ref()[..8]);
        u64::from_le_bytes(t).max(1)
    }

    /// The token to send in a challenge to `name`'s link `from` now, or
    /// `None` if this epoch's challenges were all sent.
    pub(super) fn issue(&mut self, now: Instant, name: &[u8], from: Dest) -> Option<u64> {
        let epoch = self.epoch_at(now);
        if epoch != self.sent_epoch {
            (self.sent_epoch, self.sent_now) = (epoch, 0);
        }
        if self.sent_now >= MAX_CHALLENGES {
            self.withheld += 1;
            return None;
        }
        self.sent_now += 1;
        self.sent += 1;
        Some(self.token(epoch, name, from))
    }

    /// Judges a HELLO's `token` (0: none) from `name`'s link `from`.
    pub(super) fn judge(&mut self, now: Instant, name: &[u8], from: Dest, token: u64) -> Verdict {
        if token == 0 {
            return Verdict::Challenge;
        }
        let epoch = self.epoch_at(now);
        if epoch != self.epoch {
            // Tokens of two epochs ago expire: so do their used marks.
            self.used_before = if epoch == self.epoch + 1 {
                std::mem::take(&mut self.used)
            } else {
                FxHashSet::default()
            };
            self.used.clear();
            self.epoch = epoch;
        }
        let made_in = [epoch, epoch.wrapping_sub(1)]
            .into_iter()
            .find(|&e| self.token(e, name, from) == token);
        let good = made_in.is_some()
            && !self.used.contains(&token)
            && !self.used_before.contains(&token)
            && self.used.len() < MAX_USED;
        if !good {
            self.refused += 1;
            return Verdict::Challenge;
        }
        self.used.insert(token);
        Verdict::Admit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FROM: Dest = Dest {
        link: 7,
        cookie: 0xc0ff_ee00,
    };

    #[test]
    fn a_token_admits_once_for_its_name_and_link_only() {
        let now = Instant::now();
        let mut c = HelloChallenges::new(now).unwrap();
        assert_eq!(c.judge(now, b"a", FROM, 0), Verdict::Challenge);
        let t = c.issue(now, b"a", FROM).unwrap();
        assert_ne!(t, 0);
        // Another name, another link id or cookie: not good.
        assert_eq!(c.judge(now, b"b", FROM, t), Verdict::Challenge);
        let other = Dest { link: 8, ..FROM };
        assert_eq!(c.judge(now, b"a", other, t), Verdict::Challenge);
        let other = Dest { cookie: 1, ..FROM };
        assert_eq!(c.judge(now, b"a", other, t), Verdict::Challenge);
        assert_eq!(c.judge(now, b"a", FROM, t ^ 1), Verdict::Challenge);
        assert_eq!(c.judge(now, b"a", FROM, t), Verdict::Admit);
        // Replayed.
        assert_eq!(c.judge(now, b"a", FROM, t), Verdict::Challenge);
        assert_eq!((c.sent, c.refused), (1, 5));
    }

    #[test]
    fn a_token_is_good_in_its_epoch_and_the_next_then_expires() {
        let now = Instant::now();
        let mut c = HelloChallenges::new(now).unwrap();
        let t = c.issue(now, b"a", FROM).unwrap();
        let next = now + EPOCH + Duration::from_millis(1);
        assert_eq!(c.judge(next, b"a", FROM, t), Verdict::Admit);
        assert_eq!(c.judge(next, b"a", FROM, t), Verdict::Challenge);
        let t = c.issue(now, b"a", FROM).unwrap();
        let later = now + 2 * EPOCH + Duration::from_millis(1);
        assert_eq!(c.judge(later, b"a", FROM, t), Verdict::Challenge);
        // A token used in one epoch stays used in the next.
        let t = c.issue(later, b"a", FROM).unwrap();
        assert_eq!(c.judge(later, b"a", FROM, t), Verdict::Admit);
        let after = later + EPOCH;
        assert_eq!(c.judge(after, b"a", FROM, t), Verdict::Challenge);
    }

    #[test]
    fn challenges_per_epoch_are_bounded() {
        let now = Instant::now();
        let mut c = HelloChallenges::new(now).unwrap();
        for _ in 0..MAX_CHALLENGES {
            assert!(c.issue(now, b"a", FROM).is_some());
        }
        assert!(c.issue(now, b"a", FROM).is_none());
        assert_eq!(c.withheld, 1);
        assert!(c.issue(now + EPOCH, b"a", FROM).is_some());
    }
}
