//! Long-term X25519 key pairs and their text forms.
//!
//! A private key never shows in `Debug` or `Display` output and is wiped
//! from memory when dropped. Text forms are lowercase hex (64 digits for
//! 32 bytes), so a key file can be read and diffed by eye.

use std::fmt;
use std::str::FromStr;

use msgr_addr::EntityName;
use zeroize::{Zeroize, Zeroizing};

use super::KeyFileError;

/// Bytes of an X25519 key, public or private.
pub const KEY_LEN: usize = 32;

/// An entity's X25519 public key: what a keyring lists and a peer proves
/// it holds the private half of.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PublicKey(pub [u8; KEY_LEN]);

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({self})")
    }
}

impl fmt::Display for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl FromStr for PublicKey {
    type Err = KeyFileError;

    /// 64 hex digits.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut out = [0u8; KEY_LEN];
        decode_hex(s, &mut out)?;
        Ok(PublicKey(out))
    }
}

/// An entity's long-term key pair. The private half is wiped on drop and
/// never printed.
#[derive(Clone)]
pub struct StaticKeypair {
    private: Zeroizing<[u8; KEY_LEN]>,
    public: PublicKey,
}

impl fmt::Debug for StaticKeypair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StaticKeypair")
            .field("public", &self.public)
            .field("private", &"<redacted>")
            .finish()
    }
}

impl StaticKeypair {
    /// A fresh key pair from the operating system's random source.
    pub fn generate() -> StaticKeypair {
        let mut kp = super::handshake::noise_builder()
            .generate_keypair()
            .expect("the default resolver generates X25519 keys");
        let mut private = Zeroizing::new([0u8; KEY_LEN]);
        private.copy_from_slice(&kp.private);
        kp.private.zeroize();
        let mut public = [0u8; KEY_LEN];
        public.copy_from_slice(&kp.public);
        StaticKeypair {
            private,
            public: PublicKey(public),
        }
    }

    /// The key pair of a private key (its public half computed).
    pub fn from_private(private: [u8; KEY_LEN]) -> StaticKeypair {
        let private = Zeroizing::new(private);
        let public = PublicKey(x25519_public(&private));
        StaticKeypair { private, public }
    }

    /// The public half.
    pub fn public(&self) -> PublicKey {
        self.public
    }

    pub(crate) fn private_bytes(&self) -> &[u8; KEY_LEN] {
        &self.private
    }

    /// The private key file of `name`: one line,
    /// `msgr-private-key v1 <entity name> <64 hex digits>`, after a comment.
    /// Write it where only its owner reads it (`msgr keygen` does).
    pub fn to_key_file(&self, name: &EntityName) -> Zeroizing<String> {
        let mut s = Zeroizing::new(String::with_capacity(160));
        s.push_str("# msgr private key: keep it secret (mode 0600)\n");
        s.push_str(&format!("{KEY_FILE_MAGIC} {name} "));
        for b in self.private.iter() {
            s.push_str(&format!("{b:02x}"));
        }
        s.push('\n');
        s
    }

    /// Reads a private key file written by [`StaticKeypair::to_key_file`]:
    /// the entity name it belongs to and the key pair.
    pub fn parse_key_file(text: &str) -> Result<(EntityName, StaticKeypair), KeyFileError> {
        let mut found = None;
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let at = i + 1;
            if found.is_some() {
                return Err(KeyFileError::Line {
                    line: at,
                    detail: "a key file holds one key".into(),
                });
            }
            let mut words = line.split_whitespace();
            let (Some(magic), Some(version), Some(name), Some(hex), None) = (
                words.next(),
                words.next(),
                words.next(),
                words.next(),
                words.next(),
            ) else {
                return Err(KeyFileError::Line {
                    line: at,
                    detail: format!("expected `{KEY_FILE_MAGIC} <entity name> <64 hex digits>`"),
                });
            };
            if format!("{magic} {version}") != KEY_FILE_MAGIC {
                return Err(KeyFileError::Line {
                    line: at,
                    detail: format!("not a msgr private key (expected `{KEY_FILE_MAGIC}`)"),
                });
            }
            let name = name.parse::<EntityName>().map_err(|e| KeyFileError::Line {
                line: at,
                detail: e.to_string(),
            })?;
            let mut private = Zeroizing::new([0u8; KEY_LEN]);
            decode_hex(hex, &mut private[..]).map_err(|e| e.at_line(at))?;
            found = Some((name, StaticKeypair::from_private(*private)));
        }
        found.ok_or(KeyFileError::Line {
            line: 0,
            detail: "no key in the file".into(),
        })
    }
}

/// The first words of a private key file's key line.
pub const KEY_FILE_MAGIC: &str = "msgr-private-key v1";

/// The X25519 public key of `private` (a Diffie-Hellman with the base
/// point, done by the Noise library's own X25519).
fn x25519_public(private: &[u8; KEY_LEN]) -> [u8; KEY_LEN] {
    let mut dh = snow::resolvers::DefaultResolver
        .resolve_dh(&snow::params::DHChoice::Curve25519)
        .expect("the default resolver has X25519");
    dh.set(private);
    let mut public = [0u8; KEY_LEN];
    public.copy_from_slice(dh.pubkey());
    public
}

use snow::resolvers::CryptoResolver as _;

/// Decodes exactly `out.len()` bytes of hex from `s`.
pub(crate) fn decode_hex(s: &str, out: &mut [u8]) -> Result<(), KeyFileError> {
    let bytes = s.as_bytes();
    if bytes.len() != 2 * out.len() {
        return Err(KeyFileError::BadKey(format!(
            "{} hex digits, expected {}",
            bytes.len(),
            2 * out.len()
        )));
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    };
    for (o, pair) in out.iter_mut().zip(bytes.chunks_exact(2)) {
        match (digit(pair[0]), digit(pair[1])) {
            (Some(h), Some(l)) => *o = h << 4 | l,
            _ => return Err(KeyFileError::BadKey("not a hex digit".into())),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_files_round_trip_and_never_print_the_private_key() {
        let kp = StaticKeypair::generate();
        let name = EntityName::server(3);
        let text = kp.to_key_file(&name);
        let (n, back) = StaticKeypair::parse_key_file(&text).unwrap();
        assert_eq!(n, name);
        assert_eq!(back.public(), kp.public());
        let private_hex = text.lines().nth(1).unwrap().rsplit(' ').next().unwrap();
        assert!(!format!("{kp:?}").contains(private_hex));
        assert!(!format!("{kp:?}").contains(&private_hex[..16]));
        assert_eq!(
            back.public(),
            StaticKeypair::from_private(*back.private_bytes()).public()
        );
    }

    #[test]
    fn bad_key_files_are_typed_errors() {
        for text in [
            "",
            "# only a comment\n",
            "msgr-private-key v1 server.1\n",
            "msgr-private-key v2 server.1 00\n",
            "msgr-private-key v1 nobody 0000000000000000000000000000000000000000000000000000000000000000\n",
            "msgr-private-key v1 server.1 zz00000000000000000000000000000000000000000000000000000000000000\n",
            "msgr-private-key v1 server.1 00\n",
        ] {
            assert!(StaticKeypair::parse_key_file(text).is_err(), "{text:?}");
        }
        let one = StaticKeypair::generate().to_key_file(&EntityName::client(1));
        let two = format!("{}{}", *one, *one);
        assert!(StaticKeypair::parse_key_file(&two).is_err());
    }
}
