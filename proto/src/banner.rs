//! The banner: the first bytes on every new transport connection.
//!
//! Fixed 32 bytes — magic, version, supported and required feature bits and a
//! CRC32C — so an incompatible or foreign peer is recognised from its first
//! packet and gets a clear error instead of a hang.
//!
//! The security modes live here too ([`SecurityMode`], [`ModeSet`]): a
//! side offers them as feature bits, and the bits both banners agree on
//! name the mode of a link. What each mode does is [`crate::auth`]'s.

use std::fmt;
use std::str::FromStr;

use thiserror::Error;

/// Length of an encoded banner.
pub const BANNER_LEN: usize = 32;
/// The magic that opens every msgr connection.
pub const MAGIC: [u8; 8] = *b"msgr v1\n";
/// The protocol version this build speaks.
pub const PROTOCOL_VERSION: u16 = 1;

/// Feature bits exchanged in the banner.
pub mod features {
    /// Frames carry CRC32C of preamble and segments (always on in version 1).
    pub const CRC32C: u64 = 1 << 0;
    /// Lossless sessions can be resumed after a transport fault.
    pub const RECONNECT: u64 = 1 << 1;
    /// Receive credits (RDMA transports).
    pub const CREDITS: u64 = 1 << 2;
    /// Data segments by rendezvous (RDMA read).
    pub const RENDEZVOUS: u64 = 1 << 3;
    /// This side does without CRCs on message payloads (front and data
    /// segments): offered only when configured (`payload_crc = false`), in
    /// use only when both sides offer it (`frame::FLAG_UNCHECKED_PAYLOAD`).
    /// For transports with their own integrity check (RDMA's ICRC, iWARP's
    /// MPA CRC, TLS) where the CRC is the largest per-byte cost left.
    pub const UNCHECKED_PAYLOAD: u64 = 1 << 4;
    /// This side reads batch frames (`Tag::MessageBatch`, see
    /// `crate::batch`): a peer may send it small messages many to a
    /// frame. A side writes batches only to a peer that offered this.
    pub const BATCH: u64 = 1 << 5;
    /// Hello, hello-ok and reconnect-ok carry the sender's receive limits
    /// (`control::Limits`) in a second segment: a side refuses at `send` a
    /// message its peer could not take.
    pub const LIMITS: u64 = 1 << 6;
    /// This side allows the `auth` mode: a Noise handshake proves both
    /// names, frames stay in the clear (`crate::auth`). Offered as the
    /// configured modes say, not by default.
    pub const AUTH: u64 = 1 << 7;
    /// This side allows the `secure` mode: the handshake, then every frame
    /// sealed (`crate::auth::record`).
    pub const SECURE: u64 = 1 << 8;
    /// Messages carry a call (request/response correlation) in header
    /// bytes 24..32 and batch entries (`Message::call`); without it a
    /// message with a call is refused.
    pub const CALLS: u64 = 1 << 9;
    /// Calls whose id has `crate::rma::RMA_BIT` are one-sided operations on
    /// an exposed region, answered by the owner's messenger (with `CALLS`;
    /// without it such a call is refused).
    pub const RMA: u64 = 1 << 10;
    /// Keepalives carry their sender's keepalive timeout and are not
    /// answered: each side sends its own when it has sent nothing for a
    /// third of the peer's timeout (`control::PacedKeepalive`, docs/PROTOCOL.md).
    pub const PACED_KEEPALIVE: u64 = 1 << 11;
    /// Hello carries the number of its dial, hello-ok and reconnect-ok the
    /// number of the sender's last dial, in a last segment
    /// (`control::with_dial_number`): a session turns away a hello its
    /// peer sent before the session opened (`session::DialAttempts`).
    pub const DIAL_NUMBERS: u64 = 1 << 12;
    /// Priority lanes: this side reads `Tag::Fragment` frames, a large
    /// message cut into bounded pieces per priority class and reassembled
    /// per class (`crate::fragment`, `crate::priority`); the session
    /// then sends the most urgent class first. Offered unless
    /// `max_fragment` is 0.
    pub const LANES: u64 = 1 << 13;
    /// With `DIAL_NUMBERS`: a hello that starts a session (cookie 0)
    /// carries, after its dial number, the number of the first dial of
    /// the same attempt to open it (`control::with_dial_number` again). An
    /// acceptor that opened the session for one of those dials, whose
    /// hello-ok the dialler never saw, resumes it instead of resetting it.
    pub const FIRST_DIAL: u64 = 1 << 14;
    /// An RMA owner's refusal carries its own figures: an out-of-range
    /// reply the region's length (`rma::RmaStatus::OutOfRegion`), and a
    /// region that was never exposed its own status
    /// (`rma::RmaStatus::UnknownRegion`), not "revoked". An owner sends
    /// them only to a peer that offered this; a peer without it gets the
    /// replies as before.
    pub const RMA_FIGURES: u64 = 1 << 15;
    /// An acceptor that refuses a connector for good (its keyring does
    /// not list the name the connector proved, or lists another key for
    /// it) tells it why before it closes the link: a `Tag::Close` frame
    /// with a second segment, the refusal's code
    /// (`control::Refusal`), sealed on a secure link. The connector ends
    /// the session instead of redialling into the same refusal. Sent only
    /// to a peer that offered this; a peer without it sees the link
    /// closed, as before.
    pub const REFUSALS: u64 = 1 << 16;
    /// Everything this build supports by default.
    pub const SUPPORTED: u64 = CRC32C
        | RECONNECT
        | CREDITS
        | RENDEZVOUS
        | BATCH
        | LIMITS
        | CALLS
        | RMA
        | PACED_KEEPALIVE
        | DIAL_NUMBERS
        | LANES
        | FIRST_DIAL
        | RMA_FIGURES
        | REFUSALS;
    /// What this build insists on.
    pub const REQUIRED: u64 = CRC32C;
}

/// The banner exchange failed: the peer is not (a compatible) msgr.
#[derive(Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum BannerError {
    /// The first bytes are not msgr's magic.
    #[error("bad banner magic {0:02x?}: peer is not an msgr endpoint")]
    BadMagic([u8; 8]),
    /// The banner's checksum does not match.
    #[error("banner crc mismatch")]
    Crc,
    /// The peer speaks a protocol version this build does not.
    #[error("incompatible protocol version: peer {peer}, ours {ours}")]
    IncompatibleVersion {
        /// The peer's version.
        peer: u16,
        /// Our version.
        ours: u16,
    },
    /// The peer requires features we do not offer: security modes our
    /// settings do not allow, or features this build lacks.
    #[error("{}", requires_missing(*missing))]
    PeerRequiresMissing {
        /// The bits we lack.
        missing: u64,
    },
    /// We require features the peer lacks.
    #[error("peer lacks required features {missing:#x}")]
    PeerLacksRequired {
        /// The bits the peer lacks.
        missing: u64,
    },
}

msgr_addr::debug_is_display!(BannerError);

/// A decoded banner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Banner {
    /// Protocol version.
    pub version: u16,
    /// Features the sender supports.
    pub supported: u64,
    /// Features the sender refuses to run without.
    pub required: u64,
}

impl Default for Banner {
    fn default() -> Self {
        Banner {
            version: PROTOCOL_VERSION,
            supported: features::SUPPORTED,
            required: features::REQUIRED,
        }
    }
}

impl Banner {
    /// The banner of a side that checksums message payloads or not
    /// (`payload_crc = false` offers [`features::UNCHECKED_PAYLOAD`]).
    pub fn with_payload_crc(payload_crc: bool) -> Banner {
        let mut b = Banner::default();
        if !payload_crc {
            b.supported |= features::UNCHECKED_PAYLOAD;
        }
        b
    }

    /// The banner of a side with these settings: payload CRCs on or off,
    /// and the security modes it allows.
    pub fn for_session(payload_crc: bool, modes: ModeSet) -> Banner {
        let mut b = Banner::with_payload_crc(payload_crc);
        let (supported, required) = modes.banner_bits();
        b.supported |= supported;
        b.required |= required;
        b
    }

    /// Encodes the banner.
    pub fn encode(&self) -> [u8; BANNER_LEN] {
        let mut out = [0u8; BANNER_LEN];
        out[..8].copy_from_slice(&MAGIC);
        out[8..10].copy_from_slice(&self.version.to_le_bytes());
        out[12..20].copy_from_slice(&self.supported.to_le_bytes());
        out[20..28].copy_from_slice(&self.required.to_le_bytes());
        let crc = crate::checksum::crc32c(&out[..28]);
        out[28..].copy_from_slice(&crc.to_le_bytes());
        out
    }

    /// Decodes a banner, checking magic first so a foreign protocol is named as such.
    pub fn decode(raw: &[u8; BANNER_LEN]) -> Result<Banner, BannerError> {
        let mut magic = [0u8; 8];
        magic.copy_from_slice(&raw[..8]);
        if magic != MAGIC {
            return Err(BannerError::BadMagic(magic));
        }
        let crc = u32::from_le_bytes([raw[28], raw[29], raw[30], raw[31]]);
        if crc != crate::checksum::crc32c(&raw[..28]) {
            return Err(BannerError::Crc);
        }
        let u64_at = |o: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&raw[o..o + 8]);
            u64::from_le_bytes(b)
        };
        Ok(Banner {
            version: u16::from_le_bytes([raw[8], raw[9]]),
            supported: u64_at(12),
            required: u64_at(20),
        })
    }

    /// Agrees on the features both sides use, or says why the peer is incompatible.
    pub fn negotiate(&self, peer: &Banner) -> Result<u64, BannerError> {
        if peer.version != self.version {
            return Err(BannerError::IncompatibleVersion {
                peer: peer.version,
                ours: self.version,
            });
        }
        let missing = peer.required & !self.supported;
        if missing != 0 {
            return Err(BannerError::PeerRequiresMissing { missing });
        }
        let lacking = self.required & !peer.supported;
        if lacking != 0 {
            return Err(BannerError::PeerLacksRequired { missing: lacking });
        }
        Ok(self.supported & peer.supported)
    }
}

/// How a link protects what it carries: [`crate::auth`] says what each
/// mode does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SecurityMode {
    /// Names on trust, CRC32C frames.
    Crc,
    /// Authenticated names, CRC32C frames.
    Auth,
    /// Authenticated names, every frame sealed (AES-256-GCM).
    Secure,
}

impl SecurityMode {
    /// The mode of a link whose banners agreed on `features`: the
    /// strongest both offered.
    pub fn negotiate(features: u64) -> SecurityMode {
        if features & features::SECURE != 0 {
            SecurityMode::Secure
        } else if features & features::AUTH != 0 {
            SecurityMode::Auth
        } else {
            SecurityMode::Crc
        }
    }

    /// Its name in configuration (`crc`, `auth`, `secure`).
    pub fn as_str(self) -> &'static str {
        match self {
            SecurityMode::Crc => "crc",
            SecurityMode::Auth => "auth",
            SecurityMode::Secure => "secure",
        }
    }
}

impl fmt::Display for SecurityMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for SecurityMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "crc" => Ok(SecurityMode::Crc),
            "auth" => Ok(SecurityMode::Auth),
            "secure" => Ok(SecurityMode::Secure),
            other => Err(format!(
                "unknown security mode {other:?} (crc, auth, secure)"
            )),
        }
    }
}

/// The modes a side allows on its links. The default allows `crc` only
/// (no keys needed).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ModeSet(u8);

impl ModeSet {
    /// `crc` only: today's trusted-network behaviour.
    pub const CRC: ModeSet = ModeSet(1);
    /// `auth` only.
    pub const AUTH: ModeSet = ModeSet(2);
    /// `secure` only.
    pub const SECURE: ModeSet = ModeSet(4);

    /// A set of the given modes.
    pub fn of(modes: &[SecurityMode]) -> ModeSet {
        ModeSet(modes.iter().fold(0, |s, m| s | ModeSet::bit(*m)))
    }

    fn bit(m: SecurityMode) -> u8 {
        match m {
            SecurityMode::Crc => 1,
            SecurityMode::Auth => 2,
            SecurityMode::Secure => 4,
        }
    }

    /// Whether `m` is allowed.
    pub fn allows(self, m: SecurityMode) -> bool {
        self.0 & ModeSet::bit(m) != 0
    }

    /// Whether any mode is allowed.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Whether a handshake can happen (`auth` or `secure` allowed): then
    /// the side needs credentials.
    pub fn needs_credentials(self) -> bool {
        self.allows(SecurityMode::Auth) || self.allows(SecurityMode::Secure)
    }

    /// The banner bits (supported, required) this set offers: `AUTH` where
    /// `auth` is allowed, `SECURE` where `secure` is; required where it is
    /// the only mode allowed. (A set such as `auth,secure` requires one of
    /// two, which bits cannot say: [`ModeSet::choose`] refuses the rest.)
    pub fn banner_bits(self) -> (u64, u64) {
        let mut supported = 0;
        if self.allows(SecurityMode::Auth) {
            supported |= features::AUTH;
        }
        if self.allows(SecurityMode::Secure) {
            supported |= features::SECURE;
        }
        let required = if self == ModeSet::AUTH || self == ModeSet::SECURE {
            supported
        } else {
            0
        };
        (supported, required)
    }
}

impl Default for ModeSet {
    fn default() -> Self {
        ModeSet::CRC
    }
}

impl fmt::Debug for ModeSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ModeSet({self})")
    }
}

impl fmt::Display for ModeSet {
    /// Comma-separated, weakest first: `crc,auth,secure`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = [SecurityMode::Crc, SecurityMode::Auth, SecurityMode::Secure]
            .into_iter()
            .filter(|m| self.allows(*m))
            .map(SecurityMode::as_str)
            .collect();
        f.write_str(&names.join(","))
    }
}

impl FromStr for ModeSet {
    type Err = String;

    /// A comma-separated list of modes: `secure`, `auth,secure`, `crc`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let modes = s
            .split(',')
            .map(str::parse)
            .collect::<Result<Vec<SecurityMode>, _>>()?;
        Ok(ModeSet::of(&modes))
    }
}

/// Why a peer's required features are not met, in terms an operator can
/// act on: a security mode is a setting (`security`, with `key_file` and
/// `keyring`), anything else the build.
fn requires_missing(missing: u64) -> String {
    use features::{AUTH, SECURE};
    let modes: Vec<&str> = [(AUTH, "auth"), (SECURE, "secure")]
        .iter()
        .filter(|(bit, _)| missing & bit != 0)
        .map(|&(_, name)| name)
        .collect();
    let rest = missing & !(AUTH | SECURE);
    let mut why = Vec::new();
    if !modes.is_empty() {
        why.push(format!(
            "security mode {} (allow it in the settings: `security`, with `key_file` and \
             `keyring`)",
            modes.join(" or ")
        ));
    }
    if rest != 0 {
        why.push(format!("features {rest:#x} that this build lacks"));
    }
    format!("peer requires {} ({missing:#x})", why.join(", and "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_security_mode_is_named_as_a_setting() {
        let e = BannerError::PeerRequiresMissing { missing: 1 << 7 }.to_string();
        assert!(
            e.contains("security mode auth") && e.contains("key_file"),
            "{e}"
        );
        assert!(!e.contains("build"), "{e}");
        let e = BannerError::PeerRequiresMissing { missing: 1 << 20 }.to_string();
        assert!(
            e.contains("this build lacks") && !e.contains("security"),
            "{e}"
        );
    }

    #[test]
    fn round_trip_and_negotiate() {
        let b = Banner::default();
        let d = Banner::decode(&b.encode()).unwrap();
        assert_eq!(b, d);
        assert_eq!(b.negotiate(&d), Ok(features::SUPPORTED));
    }

    #[test]
    fn payloads_go_unchecked_only_when_both_sides_offer_it() {
        let on = Banner::with_payload_crc(true);
        let off = Banner::with_payload_crc(false);
        assert_eq!(on, Banner::default());
        let agreed = |a: &Banner, b: &Banner| a.negotiate(b).unwrap() & features::UNCHECKED_PAYLOAD;
        assert_eq!(agreed(&off, &off), features::UNCHECKED_PAYLOAD);
        assert_eq!(agreed(&off, &on), 0);
        assert_eq!(agreed(&on, &off), 0);
        assert_eq!(agreed(&on, &on), 0);
    }

    #[test]
    fn foreign_and_incompatible_peers_are_named() {
        let mut raw = Banner::default().encode();
        raw[0] = b'G';
        assert!(matches!(
            Banner::decode(&raw),
            Err(BannerError::BadMagic(_))
        ));
        let newer = Banner {
            version: 2,
            ..Banner::default()
        };
        let d = Banner::decode(&newer.encode()).unwrap();
        assert_eq!(
            Banner::default().negotiate(&d),
            Err(BannerError::IncompatibleVersion { peer: 2, ours: 1 })
        );
        let demanding = Banner {
            required: 1 << 40,
            ..Banner::default()
        };
        assert_eq!(
            Banner::default().negotiate(&demanding),
            Err(BannerError::PeerRequiresMissing { missing: 1 << 40 })
        );
        let mut raw = Banner::default().encode();
        raw[13] ^= 1;
        assert_eq!(Banner::decode(&raw), Err(BannerError::Crc));
    }
}
