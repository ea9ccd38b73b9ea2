//! Who a peer is, and keeping its frames private: authentication and the
//! secure mode. No I/O here, like the rest of the crate.
//!
//! Three modes, chosen per link from what both banners offer
//! ([`SecurityMode::negotiate`]):
//!
//! - [`SecurityMode::Crc`]: names are taken on trust and frames carry
//!   CRC32C only — for networks where every host is trusted.
//! - [`SecurityMode::Auth`]: a Noise `XX` handshake ([`handshake`]) after
//!   the banners proves each side holds the key its keyring lists for the
//!   name it gives; frames stay in the clear with their CRCs.
//! - [`SecurityMode::Secure`]: as `Auth`, then every frame sealed with
//!   AES-256-GCM under per-direction, per-link keys ([`record`]).
//!
//! What a side offers and requires is its [`ModeSet`]: the modes it
//! allows. The strongest mode both allow is used; a side that does not
//! allow `crc` requires authentication in its banner, and the banners are
//! part of the handshake's transcript, so a peer — or anything between the
//! two — cannot talk it down to a weaker mode.
//!
//! # Layers
//!
//! The submodules import in one direction (`tests/layering.rs` checks
//! it), bottom first; each may use this file's items (the errors,
//! [`Credentials`]):
//!
//! 1. [`keys`]: X25519 key pairs, the private key file, and the Noise
//!    protocol they are for.
//! 2. [`keyring`]: entity names and their public keys; [`PeerVerifier`].
//! 3. [`handshake`]: the Noise `XX` handshake, proving keys against a
//!    verifier and agreeing on a link's keys.
//! 4. [`record`]: sealing and opening frames under the keys a handshake
//!    agreed.

pub mod handshake;
pub mod keyring;
pub mod keys;
pub mod record;

use std::sync::Arc;

use msgr_addr::EntityName;

pub use handshake::{Authenticated, Handshake, Role};
pub use keyring::{Keyring, PeerVerifier};
pub use keys::{PublicKey, StaticKeypair};
pub use record::{RecordError, RecordLayer};

pub use crate::banner::{ModeSet, SecurityMode};

// The set itself is the banner's (its bits are banner features); choosing
// can fail with an `AuthError`, so that half is here.
impl ModeSet {
    /// The mode of a link whose banners agreed on `features`, if this side
    /// allows it. Both sides compute the same mode; the one that does not
    /// allow it closes the link. A mode with a handshake binds both banners
    /// into it, so the choice cannot be altered on the way; a link whose
    /// banners were stripped to `crc` is refused here by a side that does
    /// not allow `crc`.
    pub fn choose(self, features: u64) -> Result<SecurityMode, AuthError> {
        let mode = SecurityMode::negotiate(features);
        if self.allows(mode) {
            Ok(mode)
        } else {
            Err(AuthError::ModeNotAllowed {
                mode,
                allowed: self.to_string(),
            })
        }
    }
}

/// Who this side is and whom it believes: its name, its key pair and the
/// verifier (usually a [`Keyring`]) that checks peers. Cheap to clone
/// (shared); never prints the private key.
#[derive(Clone, Debug)]
pub struct Credentials {
    /// The name this side proves.
    pub name: EntityName,
    pub(crate) keypair: StaticKeypair,
    pub(crate) verifier: Arc<dyn PeerVerifier>,
}

impl Credentials {
    /// Credentials from their parts.
    pub fn new(
        name: EntityName,
        keypair: StaticKeypair,
        verifier: Arc<dyn PeerVerifier>,
    ) -> Credentials {
        Credentials {
            name,
            keypair,
            verifier,
        }
    }

    /// Our public key.
    pub fn public_key(&self) -> PublicKey {
        self.keypair.public()
    }
}

/// What a session needs to secure its links: the modes allowed and, where
/// a handshake may happen, the credentials.
#[derive(Clone, Debug, Default)]
pub struct Security {
    /// Modes allowed.
    pub modes: ModeSet,
    /// This side's identity (required when `modes` allows `auth` or `secure`).
    pub credentials: Option<Arc<Credentials>>,
}

impl PartialEq for Security {
    fn eq(&self, other: &Self) -> bool {
        self.modes == other.modes
            && match (&self.credentials, &other.credentials) {
                (None, None) => true,
                (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                _ => false,
            }
    }
}

/// Why authentication failed. Each ends the link (and is counted); the
/// sessions already open are not touched.
#[derive(Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AuthError {
    /// A handshake message did not verify, came out of turn, or did not
    /// parse (which check failed is not told to the peer).
    #[error("authentication handshake failed: {0}")]
    Handshake(&'static str),
    /// The peer's name is not in our keyring.
    #[error("{0} is not in the keyring")]
    UnknownPeer(EntityName),
    /// The peer proved a key that is not its name's.
    #[error("{0} proved a key that is not the keyring's for that name")]
    WrongKey(EntityName),
    /// The peer authenticated as one name and then spoke as another.
    #[error("authenticated as {authenticated} but says it is {claimed}")]
    NameMismatch {
        /// The name it proved.
        authenticated: EntityName,
        /// The name it then gave.
        claimed: EntityName,
    },
    /// A resumed session's new link authenticated a different peer than
    /// the session was opened with.
    #[error("the session's peer was {was}; this link authenticated {now}")]
    IdentityChanged {
        /// The session's authenticated peer.
        was: EntityName,
        /// This link's.
        now: EntityName,
    },
    /// The connector dialled one entity and another proved its identity.
    #[error("dialled {expected} but {proved} answered")]
    UnexpectedPeer {
        /// Who the application dialled.
        expected: EntityName,
        /// Who proved its key.
        proved: EntityName,
    },
    /// The strongest mode both sides offer is not one this side allows.
    #[error("the peer offers no mode we allow: {mode} agreed, allowed {allowed}")]
    ModeNotAllowed {
        /// The mode the banners agreed on.
        mode: SecurityMode,
        /// What this side allows.
        allowed: String,
    },
    /// The session's peer authenticated on an earlier link; this one did
    /// not (a downgrade to `crc` where both sides allow it).
    #[error("{0} authenticated before; this link did not")]
    NotAuthenticated(EntityName),
    /// The link needs a handshake but this side has no credentials.
    #[error("authentication is required but no key is configured")]
    NoCredentials,
}

msgr_addr::debug_is_display!(AuthError);

/// A key or keyring file that does not parse.
#[derive(Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyFileError {
    /// A line is wrong (line 0: the file as a whole).
    #[error("line {line}: {detail}")]
    Line {
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        detail: String,
    },
    /// A key's text is wrong.
    #[error("bad key: {0}")]
    BadKey(String),
}

msgr_addr::debug_is_display!(KeyFileError);

impl KeyFileError {
    fn at_line(self, line: usize) -> KeyFileError {
        match self {
            KeyFileError::BadKey(detail) => KeyFileError::Line { line, detail },
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::banner::Banner;

    #[test]
    fn the_strongest_mode_both_allow_wins_and_requirements_hold() {
        let banner = |s: &str| {
            let (sup, req) = s.parse::<ModeSet>().unwrap().banner_bits();
            let mut b = Banner::default();
            b.supported |= sup;
            b.required |= req;
            b
        };
        let mode = |a: &str, b: &str| {
            let (sa, sb) = (a.parse::<ModeSet>().unwrap(), b.parse::<ModeSet>().unwrap());
            let f = banner(a).negotiate(&banner(b)).map_err(|e| e.to_string())?;
            let f2 = banner(b).negotiate(&banner(a)).map_err(|e| e.to_string())?;
            assert_eq!(f, f2);
            let (ma, mb) = (sa.choose(f), sb.choose(f));
            assert_eq!(SecurityMode::negotiate(f), SecurityMode::negotiate(f2));
            match (ma, mb) {
                (Ok(x), Ok(y)) if x == y => Ok(x),
                (x, y) => Err(format!("{x:?} {y:?}")),
            }
        };
        assert_eq!(mode("crc", "crc"), Ok(SecurityMode::Crc));
        assert_eq!(
            mode("crc,auth,secure", "crc,auth,secure"),
            Ok(SecurityMode::Secure)
        );
        assert_eq!(mode("crc,auth", "crc,auth,secure"), Ok(SecurityMode::Auth));
        assert_eq!(mode("auth", "crc,auth"), Ok(SecurityMode::Auth));
        assert_eq!(mode("secure", "auth,secure"), Ok(SecurityMode::Secure));
        assert_eq!(mode("crc,secure", "crc,auth"), Ok(SecurityMode::Crc));
        assert!(mode("auth", "crc").is_err());
        assert!(mode("crc", "secure").is_err());
        assert!(mode("secure", "auth").is_err());
        assert!(mode("secure", "crc,auth").is_err());
        assert!(mode("auth,secure", "crc").is_err());
        assert!("crc,tls".parse::<ModeSet>().is_err());
        assert_eq!(
            "auth,secure".parse::<ModeSet>().unwrap().to_string(),
            "auth,secure"
        );
    }
}
