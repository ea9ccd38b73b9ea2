//! The authentication handshake: Noise `XX` over X25519, AES-256-GCM and
//! SHA-256, by the `snow` crate (no cryptography of msgr's own here).
//!
//! Three messages, carried in `Tag::Auth` frames after the banners:
//!
//! ```text
//! connector (initiator)                 acceptor (responder)
//!   -> e
//!                                        <- e, ee, s, es   + its entity name
//!   -> s, se  + its entity name
//! ```
//!
//! The prologue is both banners as they were sent (connector's first), so a
//! banner altered on the way — a feature or mode bit stripped to force a
//! weaker mode — makes the handshake fail. Each side's entity name travels
//! encrypted inside the handshake and is checked, with the static key the
//! peer proved it holds, by the [`PeerVerifier`]. What comes out is the
//! peer's identity and a pair of per-direction keys, fresh for every link
//! (ephemeral keys on both sides), for the record layer.

use std::sync::Arc;

use msgr_addr::EntityName;
use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

use super::keyring::PeerVerifier;
use super::keys::{noise_builder, PublicKey, KEY_LEN};
use super::{AuthError, Credentials};
use crate::banner::BANNER_LEN;

pub use super::keys::NOISE_PARAMS;

/// Largest handshake message (Noise's own bound).
pub const MAX_HANDSHAKE_MESSAGE: usize = 65_535;

/// Opens the prologue, before the two banners.
const PROLOGUE_LABEL: &[u8] = b"msgr auth v1\0";

/// Which end of the handshake this side is: the side that dialled
/// initiates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The connector.
    Initiator,
    /// The acceptor.
    Responder,
}

/// What each side's last handshake message carries, encrypted.
#[derive(Serialize, Deserialize)]
struct IdentityPayload {
    name: EntityName,
}

/// The per-direction keys a finished handshake gives a link; wiped on
/// drop, never printed.
pub struct LinkKeys {
    /// Seals what this side sends.
    pub(crate) send: Zeroizing<[u8; KEY_LEN]>,
    /// Opens what this side receives.
    pub(crate) recv: Zeroizing<[u8; KEY_LEN]>,
}

impl LinkKeys {
    /// Keys given as they are: for tests, benchmarks and fuzzing. Real
    /// keys come from [`Handshake::finish`], fresh for every link.
    pub fn from_secrets(send: [u8; KEY_LEN], recv: [u8; KEY_LEN]) -> LinkKeys {
        LinkKeys {
            send: Zeroizing::new(send),
            recv: Zeroizing::new(recv),
        }
    }

    /// The other end's keys (its sending key is our receiving key).
    pub fn mirrored(&self) -> LinkKeys {
        LinkKeys::from_secrets(*self.recv, *self.send)
    }
}

impl std::fmt::Debug for LinkKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LinkKeys(<redacted>)")
    }
}

/// A finished handshake: who the peer proved to be, and the link's keys.
#[derive(Debug)]
pub struct Authenticated {
    /// The peer's entity name, checked against its key by the verifier.
    pub peer_name: EntityName,
    /// The static key the peer proved it holds.
    pub peer_key: PublicKey,
    /// Keys for the record layer (used in secure mode).
    pub keys: LinkKeys,
}

/// One handshake in progress on one link. See the [module docs](self).
pub struct Handshake {
    noise: Box<snow::HandshakeState>,
    role: Role,
    local_name: EntityName,
    verifier: Arc<dyn PeerVerifier>,
    peer_name: Option<EntityName>,
    /// Messages written and read so far (0..=3).
    step: u8,
}

impl std::fmt::Debug for Handshake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handshake")
            .field("role", &self.role)
            .field("step", &self.step)
            .finish_non_exhaustive()
    }
}

impl Handshake {
    /// Starts a handshake as `role` with our credentials; `initiator_banner`
    /// and `responder_banner` are the two banners exactly as sent.
    pub fn new(
        role: Role,
        creds: &Credentials,
        initiator_banner: &[u8; BANNER_LEN],
        responder_banner: &[u8; BANNER_LEN],
    ) -> Result<Handshake, AuthError> {
        let mut prologue = Vec::with_capacity(PROLOGUE_LABEL.len() + 2 * BANNER_LEN);
        prologue.extend_from_slice(PROLOGUE_LABEL);
        prologue.extend_from_slice(initiator_banner);
        prologue.extend_from_slice(responder_banner);
        let builder = noise_builder()
            .local_private_key(creds.keypair.private_bytes())
            .prologue(&prologue);
        let noise = match role {
            Role::Initiator => builder.build_initiator(),
            Role::Responder => builder.build_responder(),
        }
        .map_err(|_| AuthError::Handshake("could not start"))?;
        Ok(Handshake {
            noise: Box::new(noise),
            role,
            local_name: creds.name.clone(),
            verifier: creds.verifier.clone(),
            peer_name: None,
            step: 0,
        })
    }

    /// Whether the next message is ours to write.
    pub fn is_my_turn(&self) -> bool {
        !self.noise.is_handshake_finished() && self.noise.is_my_turn()
    }

    /// Whether all three messages went.
    pub fn is_finished(&self) -> bool {
        self.noise.is_handshake_finished()
    }

    /// Writes our next message (call when [`Handshake::is_my_turn`]).
    pub fn write_message(&mut self) -> Result<Vec<u8>, AuthError> {
        if !self.is_my_turn() {
            return Err(AuthError::Handshake("not our turn to write"));
        }
        // Our identity rides in our last message: the second (responder)
        // or the third (initiator), both encrypted by then.
        let payload = if self.step == 0 {
            Vec::new()
        } else {
            postcard::to_stdvec(&IdentityPayload {
                name: self.local_name.clone(),
            })
            .map_err(|_| AuthError::Handshake("could not encode our name"))?
        };
        let mut out = vec![0u8; MAX_HANDSHAKE_MESSAGE];
        let n = self
            .noise
            .write_message(&payload, &mut out)
            .map_err(|_| AuthError::Handshake("could not write a message"))?;
        out.truncate(n);
        self.step += 1;
        Ok(out)
    }

    /// Reads the peer's next message; the one that carries its name is
    /// checked here (its key against the verifier).
    pub fn read_message(&mut self, msg: &[u8]) -> Result<(), AuthError> {
        if self.noise.is_handshake_finished() || self.noise.is_my_turn() {
            return Err(AuthError::Handshake("a handshake message out of turn"));
        }
        if msg.len() > MAX_HANDSHAKE_MESSAGE {
            return Err(AuthError::Handshake("handshake message too long"));
        }
        let mut payload = Zeroizing::new(vec![0u8; MAX_HANDSHAKE_MESSAGE]);
        // snow's errors stay opaque on purpose: which check failed is no
        // business of a peer that failed it.
        let n = self
            .noise
            .read_message(msg, &mut payload)
            .map_err(|_| AuthError::Handshake("a handshake message failed to verify"))?;
        self.step += 1;
        let carries_name = self.step >= 2;
        if !carries_name {
            return if n == 0 {
                Ok(())
            } else {
                Err(AuthError::Handshake(
                    "unexpected payload in the first message",
                ))
            };
        }
        let id: IdentityPayload = postcard::from_bytes(&payload[..n])
            .map_err(|_| AuthError::Handshake("malformed identity payload"))?;
        let key = self.remote_key()?;
        self.verifier.verify(&id.name, &key)?;
        self.peer_name = Some(id.name);
        Ok(())
    }

    fn remote_key(&self) -> Result<PublicKey, AuthError> {
        let raw = self
            .noise
            .get_remote_static()
            .ok_or(AuthError::Handshake("no static key from the peer"))?;
        let mut key = [0u8; KEY_LEN];
        if raw.len() != KEY_LEN {
            return Err(AuthError::Handshake("bad static key length"));
        }
        key.copy_from_slice(raw);
        Ok(PublicKey(key))
    }

    /// The link's keys where all three messages passed Noise but the
    /// verifier refused the peer's name or key: the peer proved it holds
    /// the key it showed, only our keyring does not vouch for it. What the
    /// acceptor seals its refusal with on a secure link, so that the peer
    /// (which took the handshake as done) can read why; nothing else is
    /// sent under them. `None` before Noise finished.
    pub fn keys_for_refusal(self) -> Option<LinkKeys> {
        self.noise.is_handshake_finished().then(|| self.split())
    }

    /// This side's sending and receiving keys from Noise's split (its
    /// first key is the initiator's sending key).
    fn split(mut self) -> LinkKeys {
        let (i2r, r2i) = self.noise.dangerously_get_raw_split();
        let (send, recv) = match self.role {
            Role::Initiator => (i2r, r2i),
            Role::Responder => (r2i, i2r),
        };
        LinkKeys::from_secrets(send, recv)
    }

    /// The peer's verified identity and the link's keys, once
    /// [`Handshake::is_finished`].
    pub fn finish(mut self) -> Result<Authenticated, AuthError> {
        if !self.noise.is_handshake_finished() {
            return Err(AuthError::Handshake("handshake not finished"));
        }
        let peer_name = self
            .peer_name
            .take()
            .ok_or(AuthError::Handshake("the peer never named itself"))?;
        let peer_key = self.remote_key()?;
        Ok(Authenticated {
            peer_name,
            peer_key,
            keys: self.split(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::{Keyring, StaticKeypair};
    use crate::banner::Banner;

    fn creds(name: EntityName, ring: &Arc<Keyring>, kp: StaticKeypair) -> Credentials {
        Credentials::new(name, kp, ring.clone())
    }

    fn pair() -> (Credentials, Credentials) {
        let (a, b) = (StaticKeypair::generate(), StaticKeypair::generate());
        let mut ring = Keyring::new();
        ring.insert(EntityName::client(1), a.public());
        ring.insert(EntityName::server(1), b.public());
        let ring = Arc::new(ring);
        (
            creds(EntityName::client(1), &ring, a),
            creds(EntityName::server(1), &ring, b),
        )
    }

    fn run(i: &mut Handshake, r: &mut Handshake) -> Result<(), AuthError> {
        let m1 = i.write_message()?;
        r.read_message(&m1)?;
        let m2 = r.write_message()?;
        i.read_message(&m2)?;
        let m3 = i.write_message()?;
        r.read_message(&m3)
    }

    #[test]
    fn both_sides_learn_each_other_and_agree_on_keys() {
        let (c, s) = pair();
        let banner = Banner::default().encode();
        let mut i = Handshake::new(Role::Initiator, &c, &banner, &banner).unwrap();
        let mut r = Handshake::new(Role::Responder, &s, &banner, &banner).unwrap();
        run(&mut i, &mut r).unwrap();
        let (a, b) = (i.finish().unwrap(), r.finish().unwrap());
        assert_eq!(a.peer_name, EntityName::server(1));
        assert_eq!(b.peer_name, EntityName::client(1));
        assert_eq!(*a.keys.send, *b.keys.recv);
        assert_eq!(*a.keys.recv, *b.keys.send);
        assert_ne!(*a.keys.send, *a.keys.recv);
        assert_eq!(format!("{:?}", a.keys), "LinkKeys(<redacted>)");
    }

    #[test]
    fn a_changed_banner_fails_the_handshake() {
        let (c, s) = pair();
        let offered = Banner::for_session(
            true,
            crate::auth::ModeSet::of(&[
                crate::auth::SecurityMode::Auth,
                crate::auth::SecurityMode::Secure,
            ]),
        );
        let sent = offered.encode();
        let mut stripped = offered;
        stripped.supported &= !crate::banner::features::SECURE;
        let seen = stripped.encode();
        let mut i = Handshake::new(Role::Initiator, &c, &sent, &sent).unwrap();
        let mut r = Handshake::new(Role::Responder, &s, &seen, &sent).unwrap();
        assert!(matches!(run(&mut i, &mut r), Err(AuthError::Handshake(_))));
    }

    #[test]
    fn an_unlisted_or_wrong_key_is_refused() {
        let (c, s) = pair();
        let banner = Banner::default().encode();
        // An impostor: listed name, its own key.
        let impostor = Credentials::new(
            EntityName::client(1),
            StaticKeypair::generate(),
            c.verifier.clone(),
        );
        let mut i = Handshake::new(Role::Initiator, &impostor, &banner, &banner).unwrap();
        let mut r = Handshake::new(Role::Responder, &s, &banner, &banner).unwrap();
        assert_eq!(
            run(&mut i, &mut r),
            Err(AuthError::WrongKey(EntityName::client(1)))
        );
        // An unknown name.
        let stranger = Credentials::new(
            EntityName::client(99),
            StaticKeypair::generate(),
            c.verifier.clone(),
        );
        let mut i = Handshake::new(Role::Initiator, &stranger, &banner, &banner).unwrap();
        let mut r = Handshake::new(Role::Responder, &s, &banner, &banner).unwrap();
        assert_eq!(
            run(&mut i, &mut r),
            Err(AuthError::UnknownPeer(EntityName::client(99)))
        );
        // The initiator took the handshake as done; the responder that
        // refused it has the same keys to seal its refusal with.
        let theirs = i.finish().expect("the initiator finished").keys;
        let ours = r.keys_for_refusal().expect("Noise finished");
        assert_eq!(*ours.send, *theirs.recv);
        assert_eq!(*ours.recv, *theirs.send);
    }

    #[test]
    fn replayed_or_reordered_messages_fail() {
        let (c, s) = pair();
        let banner = Banner::default().encode();
        let mut i = Handshake::new(Role::Initiator, &c, &banner, &banner).unwrap();
        let mut r = Handshake::new(Role::Responder, &s, &banner, &banner).unwrap();
        let m1 = i.write_message().unwrap();
        r.read_message(&m1).unwrap();
        // The first message again where the third belongs.
        let m2 = r.write_message().unwrap();
        i.read_message(&m2).unwrap();
        assert!(r.read_message(&m1).is_err());
        // A third message recorded from another run does not fit this one.
        let (c2, s2) = (c.clone(), s.clone());
        let mut i2 = Handshake::new(Role::Initiator, &c2, &banner, &banner).unwrap();
        let mut r2 = Handshake::new(Role::Responder, &s2, &banner, &banner).unwrap();
        let m1b = i2.write_message().unwrap();
        r2.read_message(&m1b).unwrap();
        let m2b = r2.write_message().unwrap();
        i2.read_message(&m2b).unwrap();
        let m3_other = i.write_message().unwrap();
        assert!(r2.read_message(&m3_other).is_err());
        // Reading out of turn is refused before Noise sees it.
        assert!(i2.read_message(&m2b).is_err());
    }
}
