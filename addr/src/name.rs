//! [`EntityName`]: who an entity is, independent of where it is.

use std::fmt;
use std::str::FromStr;

use crate::error::AddrParseError;
use crate::parse::{check_len, parse_decimal};
use crate::MAX_NAME_LEN;

/// The role part of an [`EntityName`].
///
/// Use it to tell clients, servers and symmetric peers apart (e.g. in
/// policies and logs). String forms: `client`, `server`, `peer`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EntityKind {
    /// An entity that only opens connections. `client`.
    Client,
    /// An entity that accepts connections. `server`.
    Server,
    /// An entity that both accepts and opens connections. `peer`.
    Peer,
}

impl EntityKind {
    /// The string form: `"client"`, `"server"` or `"peer"`.
    pub fn as_str(self) -> &'static str {
        match self {
            EntityKind::Client => "client",
            EntityKind::Server => "server",
            EntityKind::Peer => "peer",
        }
    }
}

impl fmt::Display for EntityKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for EntityKind {
    type Err = AddrParseError;

    /// Parses `client`, `server` or `peer` (lower case only).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "client" => Ok(EntityKind::Client),
            "server" => Ok(EntityKind::Server),
            "peer" => Ok(EntityKind::Peer),
            _ => Err(AddrParseError::UnknownEntityKind(s.to_owned())),
        }
    }
}

/// Who an entity is: a kind plus a numeric id, e.g. `client.4123`.
///
/// Use it to identify the other end of a connection independently of its
/// address (which changes across restarts). String form `<kind>.<id>`, the id
/// a canonical decimal `u64`; serde uses the string form. Ordered by kind,
/// then id.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EntityName {
    /// The role.
    pub kind: EntityKind,
    /// The number, unique among entities of the same kind.
    pub id: u64,
}

impl EntityName {
    /// A name from its parts.
    pub const fn new(kind: EntityKind, id: u64) -> Self {
        EntityName { kind, id }
    }

    /// `client.<id>`.
    pub const fn client(id: u64) -> Self {
        Self::new(EntityKind::Client, id)
    }

    /// `server.<id>`.
    pub const fn server(id: u64) -> Self {
        Self::new(EntityKind::Server, id)
    }

    /// `peer.<id>`.
    pub const fn peer(id: u64) -> Self {
        Self::new(EntityKind::Peer, id)
    }
}

impl fmt::Display for EntityName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.kind, self.id)
    }
}

impl FromStr for EntityName {
    type Err = AddrParseError;

    /// Parses `<kind>.<id>`, e.g. `client.12`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        check_len(s, MAX_NAME_LEN)?;
        let (kind, id) = s
            .split_once('.')
            .ok_or_else(|| AddrParseError::BadEntityName(s.to_owned()))?;
        let kind = kind.parse()?;
        let id = parse_decimal(id).ok_or_else(|| AddrParseError::BadEntityId(id.to_owned()))?;
        Ok(EntityName { kind, id })
    }
}
