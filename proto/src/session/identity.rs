//! Who the peer is: what the session learned of it ([`Remote`]: its
//! address, name, cookie, limits, dials and proved key), what the current
//! link proved ([`LinkSecurity`]), and the checks that every link of a
//! session talks to the same peer.

use msgr_addr::{EntityAddr, EntityName};

use super::attempts::PeerDials;
use super::{FaultReason, Hello, ProtocolError, Session};
use crate::auth::{AuthError, PublicKey, RecordLayer, SecurityMode};
use crate::control::Limits;

/// What the session knows of its peer and agreed with it.
#[derive(Debug, Default)]
pub(super) struct Remote {
    /// The peer's address (dialled, or from its hello).
    pub(super) addr: Option<EntityAddr>,
    /// The peer's name, from its hello.
    pub(super) name: Option<EntityName>,
    /// The session's cookie (0 until the acceptor gave one).
    pub(super) cookie: u64,
    /// Feature bits agreed with the peer on the current link.
    pub(super) features: u64,
    /// The peer's receive limits, from the handshake (`features::LIMITS`).
    pub(super) limits: Option<Limits>,
    /// The peer's dials made before the session last opened or resumed.
    pub(super) dials: PeerDials,
    /// The key the session's peer proved when the session first opened on
    /// an authenticated link: every later link must prove the same.
    pub(super) key: Option<PublicKey>,
}

/// One link's security state: what the banners chose, then who the peer
/// proved to be and (secure mode) the record layer. Replaced with every link; moved with an accepted link to the
/// session it resumes. Its Debug shows no key.
#[derive(Debug)]
pub(super) struct LinkSecurity {
    pub(super) mode: SecurityMode,
    pub(super) peer: Option<(EntityName, PublicKey)>,
    pub(super) record: Option<Box<RecordLayer>>,
}

impl Default for LinkSecurity {
    fn default() -> Self {
        LinkSecurity {
            mode: SecurityMode::Crc,
            peer: None,
            record: None,
        }
    }
}

impl Session {
    /// Whether `name` is the peer the application dialled (when it named
    /// one). A session that never opened ends: the address is someone
    /// else's.
    pub(super) fn check_expected(
        &mut self,
        name: &EntityName,
        proved: bool,
    ) -> Result<(), ProtocolError> {
        let Some(want) = self.side.expected_peer().cloned() else {
            return Ok(());
        };
        if want == *name {
            return Ok(());
        }
        let e: ProtocolError = if proved {
            AuthError::UnexpectedPeer {
                expected: want,
                proved: name.clone(),
            }
            .into()
        } else {
            ProtocolError::WrongPeer {
                expected: want.to_string(),
                actual: name.to_string(),
            }
        };
        if !self.established {
            self.terminate(FaultReason::Protocol(e.clone()));
        }
        Err(e)
    }

    /// Whether the identity an accepted link proved may take this session:
    /// once a session's peer authenticated, every link must prove the same
    /// key and name.
    pub(super) fn same_identity(
        &self,
        hello: &Hello,
        link: &LinkSecurity,
    ) -> Result<(), AuthError> {
        let Some(key) = self.remote.key else {
            return Ok(());
        };
        let was = self
            .remote
            .name
            .clone()
            .unwrap_or_else(|| hello.name.clone());
        match &link.peer {
            Some((name, k)) if *k == key && *name == was => Ok(()),
            Some((name, _)) => Err(AuthError::IdentityChanged {
                was,
                now: name.clone(),
            }),
            None => Err(AuthError::NotAuthenticated(was)),
        }
    }

    /// The peer this link authenticated must be the one that names itself
    /// in the hello or its answer.
    pub(super) fn check_claimed(&self, claimed: &EntityName) -> Result<(), AuthError> {
        match &self.link_security.peer {
            Some((name, _)) if name != claimed => Err(AuthError::NameMismatch {
                authenticated: name.clone(),
                claimed: claimed.clone(),
            }),
            _ => Ok(()),
        }
    }

    /// Binds the session to the identity its link proved, the first time
    /// it opens on an authenticated link; a later link must prove the same.
    pub(super) fn bind_identity(&mut self) -> Result<(), AuthError> {
        let Some((name, key)) = self.link_security.peer.clone() else {
            return match (self.remote.key, &self.remote.name) {
                (Some(_), Some(was)) => Err(AuthError::NotAuthenticated(was.clone())),
                _ => Ok(()),
            };
        };
        match self.remote.key {
            Some(k) if k != key => Err(AuthError::IdentityChanged {
                was: self.remote.name.clone().unwrap_or_else(|| name.clone()),
                now: name,
            }),
            _ => {
                self.remote.key = Some(key);
                Ok(())
            }
        }
    }

    pub(super) fn adopt_peer(&mut self, hello: &Hello) {
        self.remote.limits = hello.limits;
        self.remote.dials.learn(hello.addr.nonce, hello.dial);
        self.remote.name = Some(hello.name.clone());
        self.remote.addr = Some(hello.addr.clone());
        self.tx.lossless = hello.policy.lossless();
        self.side.accepted(hello);
    }

    pub(super) fn check_peer(&self, addr: &EntityAddr) -> Result<(), ProtocolError> {
        match &self.remote.addr {
            Some(want) if want.nonce != 0 && want != addr => Err(ProtocolError::WrongPeer {
                expected: want.to_string(),
                actual: addr.to_string(),
            }),
            _ => Ok(()),
        }
    }
}
