//! Which public key each entity name must prove it holds.
//!
//! Text form, one entity per line (`#` starts a comment):
//!
//! ```text
//! # msgr keyring v1
//! server.1 5a1e...64 hex digits...
//! client.7 0b3c...
//! ```
//!
//! A name appears once; a key may serve several names (a host's
//! processes sharing one key). `msgr keygen` appends its line.

use std::collections::HashMap;

use msgr_addr::EntityName;

use super::keys::PublicKey;
use super::{AuthError, KeyFileError};

/// Decides whether a peer that proved it holds `key` may speak as `name`.
///
/// [`Keyring`] is the implementation msgr ships; a deployment with its own
/// directory (a monitor, an LDAP) implements this instead. It runs on a
/// worker thread inside the handshake: keep it quick and do no I/O.
pub trait PeerVerifier: Send + Sync + std::fmt::Debug {
    /// `Ok` if `key` is `name`'s key; otherwise why not.
    fn verify(&self, name: &EntityName, key: &PublicKey) -> Result<(), AuthError>;
}

/// Entity names and their public keys. See the [module docs](self) for
/// the file format.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Keyring {
    keys: HashMap<EntityName, PublicKey>,
}

impl Keyring {
    /// An empty keyring (every peer is unknown).
    pub fn new() -> Keyring {
        Keyring::default()
    }

    /// Adds or replaces `name`'s key.
    pub fn insert(&mut self, name: EntityName, key: PublicKey) {
        self.keys.insert(name, key);
    }

    /// `name`'s key, if listed.
    pub fn get(&self, name: &EntityName) -> Option<&PublicKey> {
        self.keys.get(name)
    }

    /// How many names are listed.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether no name is listed.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Parses the text form; a name listed twice is an error (which key
    /// was meant?).
    pub fn parse(text: &str) -> Result<Keyring, KeyFileError> {
        let mut ring = Keyring::new();
        for (i, line) in text.lines().enumerate() {
            let at = i + 1;
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let mut words = line.split_whitespace();
            let (Some(name), Some(key), None) = (words.next(), words.next(), words.next()) else {
                return Err(KeyFileError::Line {
                    line: at,
                    detail: "expected `<entity name> <64 hex digits>`".into(),
                });
            };
            let name = name.parse::<EntityName>().map_err(|e| KeyFileError::Line {
                line: at,
                detail: e.to_string(),
            })?;
            let key = key.parse::<PublicKey>().map_err(|e| e.at_line(at))?;
            if ring.keys.insert(name.clone(), key).is_some() {
                return Err(KeyFileError::Line {
                    line: at,
                    detail: format!("{name} is listed twice"),
                });
            }
        }
        Ok(ring)
    }

    /// The keyring's line for one entity (what `msgr keygen` appends).
    pub fn line(name: &EntityName, key: &PublicKey) -> String {
        format!("{name} {key}\n")
    }
}

impl PeerVerifier for Keyring {
    fn verify(&self, name: &EntityName, key: &PublicKey) -> Result<(), AuthError> {
        match self.keys.get(name) {
            None => Err(AuthError::UnknownPeer(name.clone())),
            Some(k) if k != key => Err(AuthError::WrongKey(name.clone())),
            Some(_) => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_verify_and_refuse() {
        let a = PublicKey([1; 32]);
        let b = PublicKey([2; 32]);
        let text = format!(
            "# msgr keyring v1\n{}\n  {}  # a comment\n",
            Keyring::line(&EntityName::server(1), &a).trim(),
            Keyring::line(&EntityName::client(2), &b).trim()
        );
        let ring = Keyring::parse(&text).unwrap();
        assert_eq!(ring.len(), 2);
        assert_eq!(ring.verify(&EntityName::server(1), &a), Ok(()));
        assert_eq!(
            ring.verify(&EntityName::server(1), &b),
            Err(AuthError::WrongKey(EntityName::server(1)))
        );
        assert_eq!(
            ring.verify(&EntityName::server(9), &a),
            Err(AuthError::UnknownPeer(EntityName::server(9)))
        );
        let twice = format!("{text}server.1 {b}\n");
        assert!(matches!(
            Keyring::parse(&twice),
            Err(KeyFileError::Line { line: 4, .. })
        ));
        for bad in [
            "server.1",
            "server.1 00",
            "nobody.1 0101",
            &format!("server.1 {a} extra"),
        ] {
            assert!(Keyring::parse(bad).is_err(), "{bad:?}");
        }
    }
}
