//! Typed entity addresses and entity names for the msgr messenger.
//!
//! Use this crate to say *where* an entity is ([`EntityAddr`], or several
//! addresses in preference order: [`AddrVec`]) and *who* it is
//! ([`EntityName`]). The messenger picks its backend from the address's
//! [`TransportKind`]. Every type has one string syntax, used for
//! configuration, logs, command lines and (through serde) the wire; the table
//! below is the definition of that syntax.
//!
//! ```
//! use msgr_addr::{AddrVec, EntityAddr, EntityName, TransportKind};
//!
//! let addr: EntityAddr = "verbs://198.51.100.1:6800/7?dev=rxe0&port=1&gid=1".parse()?;
//! assert_eq!(addr.transport, TransportKind::Verbs);
//! assert_eq!(addr.nonce, 7);
//! assert_eq!(addr.rdma.device.as_deref(), Some("rxe0"));
//! assert_eq!(addr.to_string(), "verbs://198.51.100.1:6800/7?dev=rxe0&port=1&gid=1");
//!
//! // Reach a peer over verbs if this process can, else over TCP.
//! let peer: AddrVec = "[verbs://198.51.100.1:6800,tcp://198.51.100.1:6801]".parse()?;
//! let tcp_only = peer.pick(|t| *t == TransportKind::Tcp).expect("has a tcp address");
//! assert_eq!(tcp_only.socket.port(), 6801);
//!
//! let me = EntityName::client(4123);
//! assert_eq!(me.to_string(), "client.4123");
//! assert_eq!("client.4123".parse::<EntityName>()?, me);
//!
//! // Errors say what was wrong and carry the offending text.
//! let err = "tcp://localhost:6800".parse::<EntityAddr>().unwrap_err();
//! assert_eq!(err, msgr_addr::AddrParseError::BadSocketAddr("localhost:6800".into()));
//! # Ok::<(), msgr_addr::AddrParseError>(())
//! ```
//!
//! # Address syntax
//!
//! ```text
//! addr     = scheme "://" socket [ "/" nonce ] [ "?" query ]
//! scheme   = "tcp" | "verbs" | "rdmacm" | "fabric+" provider
//! provider = component *( ";" component )    ; component = 1*[a-z0-9_], whole name <= 64 bytes
//! socket   = IPv4 ":" port | "[" IPv6 [ "%" scope-id ] "]" ":" port   ; IP literals only
//! nonce    = canonical decimal u64            ; omitted when 0
//! query    = item *( "&" item )               ; item = key "=" value, each key at most once
//! addrvec  = addr | "[" [ addr *( "," addr ) ] "]"
//! name     = ( "client" | "server" | "peer" ) "." canonical-decimal-u64
//! ```
//!
//! | Form | Example | Meaning |
//! |---|---|---|
//! | `tcp://IP:PORT` | `tcp://127.0.0.1:6800`, `tcp://[::1]:6800` | [`TransportKind::Tcp`] |
//! | `verbs://IP:PORT` | `verbs://198.51.100.1:6800` | [`TransportKind::Verbs`]; the socket is the out-of-band TCP exchange |
//! | `rdmacm://IP:PORT` | `rdmacm://198.51.100.1:7471` | [`TransportKind::RdmaCm`] |
//! | `fabric+PROV://IP:PORT` | `fabric+tcp://127.0.0.1:6800`, `fabric+shm://…`, `fabric+verbs://…`, `fabric+efa://…`, `fabric+tcp;ofi_rxm://…` | [`TransportKind::Fabric`] with [`FabricProvider::name`] = `PROV` |
//! | `…/NONCE` | `tcp://127.0.0.1:6800/42` | [`EntityAddr::nonce`] = 42 (absent: 0) |
//! | `?dev=NAME` | `verbs://198.51.100.1:6800?dev=rxe0` | [`RdmaLocation::device`]; 1–64 bytes of `[A-Za-z0-9_.-]` |
//! | `?port=N` | `…?port=1` | [`RdmaLocation::port`], `u8` |
//! | `?gid=N` | `…?gid=1` | [`RdmaLocation::gid_index`], `u8` |
//! | `?ep=msg\|rdm` | `fabric+tcp;ofi_rxm://127.0.0.1:6800?ep=rdm` | [`FabricProvider::endpoint`] (absent: `msg`) |
//! | `[A,B,…]` | `[verbs://198.51.100.1:6800,tcp://198.51.100.1:6801]` | [`AddrVec`] in preference order; `[]` is empty |
//! | `KIND.ID` | `client.4123`, `server.0`, `peer.7` | [`EntityName`] |
//!
//! Rules:
//!
//! * `dev`, `port`, `gid` are accepted only for `verbs`, `rdmacm` and
//!   `fabric+` providers whose first component is `verbs` (e.g.
//!   `fabric+verbs;ofi_rxm`); `ep` only for `fabric+…`. Anything else is
//!   [`AddrParseError::OptionNotValidForTransport`].
//! * Host names are **not** resolved — a parser does no DNS. Only IP literals.
//! * Everything is case-sensitive (lower-case schemes, keys, kinds) and no
//!   whitespace is allowed anywhere.
//! * Decimal numbers (nonce, `port`, `gid`, entity id) are canonical: digits
//!   only, no sign, no leading zeros (`0` itself is fine).
//! * Input is bounded before it is looked at: [`MAX_ADDR_LEN`] bytes for an
//!   address, [`MAX_ADDRVEC_LEN`] bytes and [`MAX_ADDRVEC_ENTRIES`] entries for
//!   a vector, [`MAX_NAME_LEN`] bytes for a name.
//!
//! # Canonical form
//!
//! `Display` writes the canonical form: nonce only when non-zero; query keys
//! in the order `dev`, `port`, `gid`, `ep`; `ep` only when `rdm`; the socket
//! address as `std` prints it (compressed lower-case IPv6); a one-element
//! [`AddrVec`] without brackets.
//!
//! * For every value that passes `validate` (every parsed value does),
//!   `x.to_string().parse() == Ok(x)`.
//! * For every canonical string `s`, `s.parse()?.to_string() == s`.
//! * These non-canonical spellings are accepted and print canonically: an
//!   explicit zero nonce (`/0`), query keys in another order, an explicit
//!   `ep=msg`, IPv6 in uncompressed or upper-case form, a port with leading
//!   zeros (`:06800`, accepted by `std`), and a one-element vector in brackets
//!   (`[tcp://127.0.0.1:6800]`).
//!
//! What `validate` rejects (such values still print, but not to text that
//! parses back to them): invalid provider or device names, RDMA details on a
//! transport that does not take them, IPv6 flow info other than 0 (the syntax
//! has no place for it), more than [`MAX_ADDRVEC_ENTRIES`] addresses. Serde
//! serialization of [`EntityAddr`] and [`AddrVec`] fails for such values
//! rather than emit text the other side cannot read.
//!
//! # Serde
//!
//! [`EntityAddr`], [`AddrVec`], [`EntityName`] and [`EntityKind`] serialize as
//! their string forms and deserialize by parsing, in self-describing and
//! binary formats alike.
//!
//! # Layers
//!
//! The modules import in one direction, each only from the layers below its
//! own (`tests/layering.rs` checks it). Bottom first:
//!
//! 1. `report`: how errors read (Debug as Display, long input cut).
//! 2. `error`: [`AddrParseError`], what every parser returns.
//! 3. `parse`: the shared lexical rules (length bound, canonical decimals).
//! 4. `addr`, `name`: [`EntityAddr`] and its parts; [`EntityName`].
//! 5. `addrvec`: [`AddrVec`], addresses in preference order.
//! 6. `serde_impls`: every type as its string form through serde.

#![forbid(unsafe_code)]
#![deny(missing_docs)]
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

mod addr;
mod addrvec;
mod error;
mod name;
mod parse;
mod report;
mod serde_impls;

pub use addr::{
    EntityAddr, FabricEndpoint, FabricProvider, RdmaLocation, TransportKind, MAX_DEVICE_LEN,
    MAX_PROVIDER_LEN,
};
pub use addrvec::AddrVec;
pub use error::AddrParseError;
pub use name::{EntityKind, EntityName};
pub use report::{excerpt, EXCERPT_LEN};

/// Longest accepted [`EntityAddr`] string, in bytes; longer input is rejected
/// with [`AddrParseError::TooLong`] before parsing. Every valid address prints
/// far shorter (under 256 bytes).
pub const MAX_ADDR_LEN: usize = 1024;

/// Most addresses an [`AddrVec`] string may hold.
pub const MAX_ADDRVEC_ENTRIES: usize = 16;

/// Longest accepted [`AddrVec`] string, in bytes (room for
/// [`MAX_ADDRVEC_ENTRIES`] valid addresses).
pub const MAX_ADDRVEC_LEN: usize = 8192;

/// Longest accepted [`EntityName`] string, in bytes (the longest valid name,
/// `server.18446744073709551615`, is 27).
pub const MAX_NAME_LEN: usize = 64;
