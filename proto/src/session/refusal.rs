//! Refusals another dial would meet again. An acceptor whose keyring does
//! not vouch for the connector says why before it closes the link (a
//! [`Refusal`] in a close frame, sealed on a secure link, where both
//! banners offered `features::REFUSALS`); a connector that hears one, or
//! finds one itself (banners or modes that cannot agree, no key, a peer
//! its own keyring does not vouch for), ends the session at once instead
//! of redialling into it until its `connect_timeout`.
//!
//! Where each mode decides: in `crc` mode only the banners can refuse,
//! and both sides read both banners, so each knows why without being
//! told. In `auth` and `secure` modes the acceptor checks the
//! connector's name and key on reading the third handshake message; the
//! connector has finished its side by then (its hello is on the way), so
//! it reads the refusal as the answer to its hello. In `secure` mode the
//! refusal is sealed under the keys that handshake agreed (Noise finished;
//! only our keyring refused): the connector takes nothing in the clear.

use std::time::Instant;

use super::{FaultReason, LinkId, ProtocolError, Session, SessionEvent, State};
use crate::auth::{AuthError, RecordLayer, SecurityMode};
use crate::banner::{features, BannerError};
use crate::control::{parse_refusal, refusal_frame, Refusal};
use crate::frame::Frame;
use crate::stream::Transmit;

impl Session {
    /// `e` broke the current link: refuse the peer with the reason
    /// (acceptor), end the session (connector, before it ever opened,
    /// where no redial can change the outcome), or fault the link.
    pub(super) fn after_link_error(&mut self, e: &ProtocolError, now: Instant) {
        if self.state.is_closed() || self.is_refusing() {
            // Ended already (the handler saw to it), or the refusal goes
            // out first and then the link closes.
            return;
        }
        if !self.established {
            if self.side.is_connector() && refused_for_good(e) {
                self.end_refused(FaultReason::Protocol(e.clone()));
                return;
            }
            if !self.side.is_connector() && self.refuse(e) {
                return;
            }
        }
        self.fault(FaultReason::Protocol(e.clone()), now);
    }

    /// Whether the current link carries this side's refusal out: nothing
    /// more is read from it.
    pub(super) fn is_refusing(&self) -> bool {
        matches!(self.state, State::Refusing(_))
    }

    /// Acceptor: tells the peer why `e` refuses it for good, where the
    /// peer reads refusals and the handshake got far enough for it to
    /// read ours; the link closes once it is out. `false` where the link
    /// is to fault as before.
    fn refuse(&mut self, e: &ProtocolError) -> bool {
        let Some(refusal) = refusal_for(e) else {
            return false;
        };
        let finished = matches!(
            &self.state,
            State::Authenticating { handshake, .. } if handshake.is_finished()
        );
        if !finished || self.remote.features & features::REFUSALS == 0 {
            return false;
        }
        let State::Authenticating { link, handshake } =
            std::mem::replace(&mut self.state, State::Closed)
        else {
            return false;
        };
        if self.link_security.mode == SecurityMode::Secure {
            let Some(keys) = handshake.keys_for_refusal() else {
                return false;
            };
            self.link_security.record = Some(Box::new(RecordLayer::new(&keys)));
        }
        self.redial.last_fault = Some(FaultReason::Protocol(e.clone()));
        self.stats.faults += 1;
        self.tx.ctrl.clear();
        self.tx
            .ctrl
            .push_back(Transmit::Frame(refusal_frame(&refusal)));
        self.state = State::Refusing(link);
        true
    }

    /// The refusal on `link` went out: close the link; the session ends
    /// (silently, as an acceptor's that never opened does).
    pub(super) fn refusal_sent(&mut self, link: LinkId) {
        if matches!(self.state, State::Refusing(l) if l == link) {
            self.events.push_back(SessionEvent::CloseLink(link));
            self.state = State::Closed;
        }
    }

    /// Whether a close frame is a refusal: a second segment, on a link
    /// whose banners agreed to them, in answer to our hello.
    pub(super) fn is_refusal(&self, frame: &Frame) -> bool {
        frame.segments.len() == 2
            && self.remote.features & features::REFUSALS != 0
            && matches!(self.state, State::HelloSent(_))
    }

    /// Connector: the acceptor refused us for good, and said why.
    pub(super) fn on_refused(&mut self, frame: &Frame) -> Result<(), ProtocolError> {
        let refusal = parse_refusal(frame)?;
        self.end_refused(FaultReason::Refused(refusal));
        Ok(())
    }

    /// Connector: ends the session for a refusal no redial changes; the
    /// attempt failed (`ConnectFailed`, before it ever opened) and the
    /// session ended (`Reset`), both saying why.
    fn end_refused(&mut self, reason: FaultReason) {
        if !self.established {
            self.events.push_back(SessionEvent::ConnectFailed {
                reason: reason.clone(),
            });
        }
        self.stats.faults += 1;
        self.terminate(reason);
    }
}

/// The refusal an acceptor tells a connector for `e`, if `e` is one the
/// connector would meet on every dial.
fn refusal_for(e: &ProtocolError) -> Option<Refusal> {
    match e {
        ProtocolError::Auth(AuthError::UnknownPeer(_)) => Some(Refusal::UnknownPeer),
        ProtocolError::Auth(AuthError::WrongKey(_)) => Some(Refusal::WrongKey),
        _ => None,
    }
}

/// Whether `e`, found by a connector on its own link, would be found on
/// every dial: the peer's banner asks for what this side does not offer
/// (or the other way round), no mode both allow, no key of ours where one
/// is needed, a peer our keyring does not vouch for or that is not the
/// entity dialled. Corruption (a banner's CRC, a handshake message that
/// does not verify) and a foreign protocol at the address are not: a
/// redial may meet a sound link, or an msgr that came back.
fn refused_for_good(e: &ProtocolError) -> bool {
    match e {
        ProtocolError::Banner(b) => matches!(
            b,
            BannerError::IncompatibleVersion { .. }
                | BannerError::PeerRequiresMissing { .. }
                | BannerError::PeerLacksRequired { .. }
        ),
        ProtocolError::Auth(a) => matches!(
            a,
            AuthError::ModeNotAllowed { .. }
                | AuthError::NoCredentials
                | AuthError::UnknownPeer(_)
                | AuthError::WrongKey(_)
                | AuthError::UnexpectedPeer { .. }
        ),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use msgr_addr::{EntityAddr, EntityName};

    use super::*;
    use crate::auth::{Credentials, Keyring, ModeSet, Security, StaticKeypair};
    use crate::session::{LocalIdentity, Policy, SessionConfig};

    /// One side's settings: `modes`, and `name` with `key` believing `ring`
    /// (no credentials without a key).
    fn config(modes: &str, who: Option<(EntityName, StaticKeypair, &Keyring)>) -> SessionConfig {
        let credentials = who
            .map(|(name, kp, ring)| Arc::new(Credentials::new(name, kp, Arc::new(ring.clone()))));
        SessionConfig {
            security: Security {
                modes: modes.parse::<ModeSet>().expect("modes"),
                credentials,
            },
            ..SessionConfig::default()
        }
    }

    fn local(name: EntityName, port: u16) -> LocalIdentity {
        LocalIdentity {
            name,
            addr: EntityAddr::tcp(([127, 0, 0, 1], port).into()).with_nonce(u64::from(port)),
            dials: Default::default(),
        }
    }

    /// A lossless client (link 1) dialling a server (its session for the
    /// accepted link 2), driven until both are quiet. Returns the client's
    /// events and whether the server closed its link.
    fn dial(
        client: SessionConfig,
        server: SessionConfig,
        now: Instant,
    ) -> (Session, Vec<SessionEvent>, bool) {
        let server_addr = local(EntityName::server(1), 2).addr;
        let mut c = Session::connect(
            client,
            local(EntityName::client(1), 1),
            server_addr,
            Policy::LosslessClient,
            now,
        );
        assert!(matches!(c.poll_event(), Some(SessionEvent::Connect(_))));
        c.link_up(LinkId(1), now);
        let mut s = Session::accept(server, local(EntityName::server(1), 2), LinkId(2), now);
        let (mut events, mut server_closed) = (Vec::new(), false);
        for _ in 0..8 {
            // What the server sent before it closed the link arrives.
            while let Some((_, t)) = s.poll_transmit(now) {
                let _ = c.handle_inbound(LinkId(1), t.into(), now);
            }
            while let Some(ev) = s.poll_event() {
                match ev {
                    SessionEvent::Identified(_) => s.accept_new(7, now),
                    SessionEvent::CloseLink(_) => server_closed = true,
                    _ => {}
                }
            }
            while let Some((_, t)) = c.poll_transmit(now) {
                if !server_closed {
                    let _ = s.handle_inbound(LinkId(2), t.into(), now);
                }
            }
            events.extend(std::iter::from_fn(|| c.poll_event()));
        }
        (c, events, server_closed)
    }

    /// A client whose name the server's keyring does not list, in `auth`
    /// and `secure` mode, and an impostor (a listed name, another key):
    /// the server tells each why and closes; the client's session ends at
    /// once with that reason, typed, and never redials.
    #[test]
    fn a_refused_client_hears_why_and_never_redials() {
        let now = Instant::now();
        let (server_kp, client_kp) = (StaticKeypair::generate(), StaticKeypair::generate());
        let mut client_ring = Keyring::new();
        client_ring.insert(EntityName::server(1), server_kp.public());
        client_ring.insert(EntityName::client(1), client_kp.public());
        let mut impostor_ring = Keyring::new();
        impostor_ring.insert(EntityName::server(1), server_kp.public());
        impostor_ring.insert(EntityName::client(1), StaticKeypair::generate().public());
        for (mode, server_ring, want) in [
            ("auth", &impostor_ring, Refusal::WrongKey),
            ("secure", &impostor_ring, Refusal::WrongKey),
            ("auth", &Keyring::new(), Refusal::UnknownPeer),
            ("secure", &Keyring::new(), Refusal::UnknownPeer),
        ] {
            let mut server_ring = server_ring.clone();
            server_ring.insert(EntityName::server(1), server_kp.public());
            let server_key = StaticKeypair::from_private(*server_kp.private_bytes());
            let client_key = StaticKeypair::from_private(*client_kp.private_bytes());
            let (c, events, server_closed) = dial(
                config(
                    mode,
                    Some((EntityName::client(1), client_key, &client_ring)),
                ),
                config(
                    mode,
                    Some((EntityName::server(1), server_key, &server_ring)),
                ),
                now,
            );
            let why = FaultReason::Refused(want.clone());
            assert!(server_closed, "{mode}: the server closes the link");
            assert!(c.is_closed(), "{mode} {want:?}: {events:?}");
            assert_eq!(c.last_fault(), Some(&why), "{mode}");
            assert!(
                events.contains(&SessionEvent::Reset {
                    reason: why.clone(),
                    undelivered: 0
                }),
                "{mode}: {events:?}"
            );
            assert!(
                events.contains(&SessionEvent::ConnectFailed { reason: why }),
                "{mode}: {events:?}"
            );
            assert!(
                !events.iter().any(|e| matches!(e, SessionEvent::Connect(_))),
                "{mode}: no redial: {events:?}"
            );
            assert_eq!(c.poll_timeout(), None, "{mode}: nothing left to time");
        }
    }

    /// A client without a key, dialling a server that requires
    /// authentication, reads the server's banner and ends at once: no
    /// redial can give it a key.
    #[test]
    fn a_keyless_client_of_an_authenticating_server_ends_at_once() {
        let now = Instant::now();
        let kp = StaticKeypair::generate();
        let mut ring = Keyring::new();
        ring.insert(EntityName::server(1), kp.public());
        let (c, events, _) = dial(
            config("crc", None),
            config("auth", Some((EntityName::server(1), kp, &ring))),
            now,
        );
        assert!(c.is_closed(), "{events:?}");
        assert!(
            matches!(
                c.last_fault(),
                Some(FaultReason::Protocol(ProtocolError::Banner(
                    BannerError::PeerRequiresMissing { .. }
                )))
            ),
            "{:?}",
            c.last_fault()
        );
        assert!(
            !events.iter().any(|e| matches!(e, SessionEvent::Connect(_))),
            "no redial: {events:?}"
        );
    }

    #[test]
    fn refusal_frames_round_trip_and_unknown_codes_keep_a_clean_text() {
        for r in [Refusal::UnknownPeer, Refusal::WrongKey] {
            assert_eq!(parse_refusal(&refusal_frame(&r)), Ok(r));
        }
        let other = Refusal::from_code(99, &format!("new\x1b[31m{}", "x".repeat(500)));
        let Refusal::Other { code: 99, text } = &other else {
            panic!("{other:?}");
        };
        assert!(
            text.starts_with("new?[31m") && text.chars().count() == 120,
            "{text}"
        );
        assert_eq!(parse_refusal(&refusal_frame(&other)), Ok(other.clone()));
        let mut one = refusal_frame(&Refusal::UnknownPeer);
        one.segments.pop();
        assert!(parse_refusal(&one).is_err());
    }
}
