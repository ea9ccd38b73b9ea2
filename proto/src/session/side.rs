//! Which side of its link a session is, and where it dials.
//!
//! A session dials (connector) or was dialled (acceptor), and that can
//! change over its life: a lossless peer's acceptor session redials a peer
//! that listens, and a connector takes an accepted link when both sides
//! dialled at once. What it dials survives the changes: the peer's address
//! vector ([`Dials`]), kept from the first time it was known.

use msgr_addr::{EntityAddr, EntityName};

use super::Hello;
use super::Policy;

/// Connector or acceptor, with what each needs.
#[derive(Debug)]
pub(super) enum Side {
    /// This side dials the current link (or is about to).
    Connector {
        /// Where it dials.
        dials: Dials,
        /// Whether it dials again after a fault.
        may_reconnect: bool,
    },
    /// The current link was accepted.
    Acceptor {
        /// Where to dial should the session redial its peer: known once
        /// a hello routed the link here (or kept from a dial of ours).
        dials: Option<Dials>,
        /// Whether the peer asked to be redialled (a lossless peer that
        /// listens).
        may_reconnect: bool,
    },
}

/// The peer's addresses, in preference order (never empty): what the
/// application asked for (a proxy or a load balancer may stand there),
/// not what the peer calls itself. After each fault the next attempt dials
/// the next one, so a session whose transport fails goes on over another.
#[derive(Debug)]
pub(super) struct Dials {
    addrs: Vec<EntityAddr>,
    /// Which of `addrs` the current (or next) attempt dials.
    at: usize,
    /// Which of `addrs` the session's last open link was dialled at.
    opened_via: Option<usize>,
    /// The entity the application dialled, if it named one.
    expected_peer: Option<EntityName>,
}

impl Dials {
    fn one(addr: EntityAddr) -> Dials {
        Dials {
            addrs: vec![addr],
            at: 0,
            opened_via: None,
            expected_peer: None,
        }
    }
}

impl Side {
    /// A session that dials `peer` under `policy`.
    pub(super) fn connector(peer: EntityAddr, policy: Policy) -> Side {
        Side::Connector {
            dials: Dials::one(peer),
            may_reconnect: matches!(policy, Policy::LosslessClient | Policy::LosslessPeer),
        }
    }

    /// A session for an accepted link, its peer unknown yet.
    pub(super) fn acceptor() -> Side {
        Side::Acceptor {
            dials: None,
            may_reconnect: false,
        }
    }

    pub(super) fn is_connector(&self) -> bool {
        matches!(self, Side::Connector { .. })
    }

    /// Whether the session dials again after a fault.
    pub(super) fn may_reconnect(&self) -> bool {
        match self {
            Side::Connector { may_reconnect, .. } | Side::Acceptor { may_reconnect, .. } => {
                *may_reconnect
            }
        }
    }

    fn dials(&self) -> Option<&Dials> {
        match self {
            Side::Connector { dials, .. } => Some(dials),
            Side::Acceptor { dials, .. } => dials.as_ref(),
        }
    }

    fn dials_mut(&mut self) -> Option<&mut Dials> {
        match self {
            Side::Connector { dials, .. } => Some(dials),
            Side::Acceptor { dials, .. } => dials.as_mut(),
        }
    }

    /// Where the current (or next) attempt dials.
    pub(super) fn dial(&self) -> Option<&EntityAddr> {
        self.dials().map(|d| &d.addrs[d.at])
    }

    /// The entity the application dialled, if it named one.
    pub(super) fn expected_peer(&self) -> Option<&EntityName> {
        self.dials()?.expected_peer.as_ref()
    }

    /// Connector: whoever answers must be `name`.
    pub(super) fn expect_peer(&mut self, name: EntityName) {
        if let Some(d) = self.dials_mut() {
            d.expected_peer = Some(name);
        }
    }

    /// Connector: `more` addresses after the current one, in preference
    /// order; the next attempt dials the first.
    pub(super) fn set_alternates(&mut self, more: impl IntoIterator<Item = EntityAddr>) {
        let Some(d) = self.dials_mut() else {
            return;
        };
        let first = d.addrs[d.at].clone();
        let via = d.opened_via.map(|i| d.addrs[i].clone());
        d.addrs = std::iter::once(first).chain(more).collect();
        d.at = 0;
        d.opened_via = via.and_then(|a| d.addrs.iter().position(|x| *x == a));
    }

    /// A connector with more than one address moves to the next one (a
    /// fault ended the attempt).
    pub(super) fn next_address(&mut self) {
        if let Side::Connector { dials, .. } = self {
            if dials.addrs.len() > 1 {
                dials.at = (dials.at + 1) % dials.addrs.len();
            }
        }
    }

    /// The session opened: a connector with more than one address notes
    /// where, and returns the `(from, to)` of a move between addresses.
    pub(super) fn opened(&mut self) -> Option<(EntityAddr, EntityAddr)> {
        let Side::Connector { dials, .. } = self else {
            return None;
        };
        if dials.addrs.len() < 2 {
            return None;
        }
        let moved = dials
            .opened_via
            .map(|from| (&dials.addrs[from], &dials.addrs[dials.at]))
            .filter(|(from, to)| from != to)
            .map(|(from, to)| (from.clone(), to.clone()));
        dials.opened_via = Some(dials.at);
        moved
    }

    /// The session took a link accepted from the peer of `hello`: it is
    /// the acceptor, redials (if at all) where it dialled before or else
    /// where the peer listens, and only for a peer that asked for it.
    pub(super) fn accepted(&mut self, hello: &Hello) {
        // A server reconnects only for peers that asked for it and that listen.
        let may_reconnect = hello.policy == Policy::LosslessPeer && hello.addr.socket.port() != 0;
        let dials = match std::mem::replace(self, Side::acceptor()) {
            Side::Connector { dials, .. } => dials,
            Side::Acceptor { dials, .. } => dials.unwrap_or_else(|| Dials::one(hello.addr.clone())),
        };
        *self = Side::Acceptor {
            dials: Some(dials),
            may_reconnect,
        };
    }

    /// The session dials again: it becomes the connector, and returns
    /// where to dial (`None` if it never knew: it stays as it is).
    pub(super) fn redial(&mut self) -> Option<EntityAddr> {
        let peer = self.dial()?.clone();
        if let Side::Acceptor {
            dials,
            may_reconnect,
        } = self
        {
            if let Some(dials) = dials.take() {
                *self = Side::Connector {
                    dials,
                    may_reconnect: *may_reconnect,
                };
            }
        }
        Some(peer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(port: u16) -> EntityAddr {
        EntityAddr::tcp(([127, 0, 0, 1], port).into())
    }

    fn hello_from(peer: EntityAddr, policy: Policy) -> Hello {
        Hello {
            name: EntityName::client(1),
            addr: peer,
            target: addr(1),
            policy,
            cookie: 0,
            in_seq: 0,
            limits: None,
            dial: None,
        }
    }

    /// A connector goes round its address vector after faults and says
    /// when it opened at another address than the last time.
    #[test]
    fn a_connector_goes_round_its_addresses_and_reports_moves() {
        let mut side = Side::connector(addr(10), Policy::LosslessClient);
        side.set_alternates([addr(11), addr(12)]);
        assert_eq!(side.dial(), Some(&addr(10)));
        assert_eq!(side.opened(), None, "the first open moves nowhere");
        side.next_address();
        assert_eq!(side.dial(), Some(&addr(11)));
        side.next_address();
        assert_eq!(side.opened(), Some((addr(10), addr(12))));
        side.next_address();
        assert_eq!(side.dial(), Some(&addr(10)), "round the vector");
        assert_eq!(side.opened(), Some((addr(12), addr(10))));
    }

    /// One address: no move is ever reported and faults keep it.
    #[test]
    fn a_single_address_neither_rotates_nor_moves() {
        let mut side = Side::connector(addr(10), Policy::LossyClient);
        assert!(!side.may_reconnect());
        side.next_address();
        assert_eq!(side.dial(), Some(&addr(10)));
        assert_eq!(side.opened(), None);
    }

    /// An acceptor learns where to redial from the hello, and only a
    /// listening lossless peer is redialled; a connector that takes an
    /// accepted link keeps its own addresses (and expected peer).
    #[test]
    fn taking_a_link_keeps_where_the_session_dials() {
        let mut side = Side::acceptor();
        assert_eq!(side.redial(), None, "no peer known: nothing to dial");
        assert!(!side.is_connector());
        side.accepted(&hello_from(addr(20), Policy::LosslessPeer));
        assert!(side.may_reconnect() && !side.is_connector());
        assert_eq!(side.redial(), Some(addr(20)));
        assert!(side.is_connector());

        let mut side = Side::connector(addr(10), Policy::LosslessPeer);
        side.expect_peer(EntityName::server(1));
        side.accepted(&hello_from(addr(30), Policy::LosslessClient));
        assert!(!side.is_connector() && !side.may_reconnect());
        assert_eq!(side.dial(), Some(&addr(10)), "the application's address");
        assert_eq!(side.expected_peer(), Some(&EntityName::server(1)));
        let no_port = EntityAddr::tcp(([127, 0, 0, 1], 0).into());
        side.accepted(&hello_from(no_port, Policy::LosslessPeer));
        assert!(!side.may_reconnect(), "a peer that does not listen");
    }
}
