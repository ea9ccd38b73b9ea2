//! [`EntityAddr`] and the transport description it carries.

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;

use crate::error::AddrParseError;
use crate::parse::{check_len, parse_decimal};
use crate::MAX_ADDR_LEN;

/// Longest accepted libfabric provider name, in bytes.
pub const MAX_PROVIDER_LEN: usize = 64;

/// Longest accepted RDMA device name (`dev=`), in bytes (the kernel's
/// `IB_DEVICE_NAME_MAX`).
pub const MAX_DEVICE_LEN: usize = 64;

/// Which transport a peer is reached over.
///
/// Use it to pick a backend: the messenger's factory matches on this. It is
/// written as the scheme of an address string (`tcp://`, `verbs://`,
/// `rdmacm://`, `fabric+<provider>://`); the libfabric endpoint type goes in
/// the query (`?ep=rdm`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum TransportKind {
    /// Plain TCP sockets. Scheme `tcp`.
    Tcp,
    /// RDMA verbs RC queue pairs; connection setup over an out-of-band TCP
    /// exchange to the address's socket. Scheme `verbs`.
    Verbs,
    /// Connections managed by rdma_cm (iWARP / RoCE). Scheme `rdmacm`.
    RdmaCm,
    /// libfabric with the given provider. Scheme `fabric+<provider name>`.
    Fabric(FabricProvider),
}

impl TransportKind {
    /// The scheme as written in an address string, e.g. `"tcp"` or
    /// `"fabric+tcp;ofi_rxm"`. Use it in log and error messages. The libfabric
    /// endpoint type is not part of the scheme.
    pub fn scheme(&self) -> String {
        match self {
            TransportKind::Tcp => "tcp".to_owned(),
            TransportKind::Verbs => "verbs".to_owned(),
            TransportKind::RdmaCm => "rdmacm".to_owned(),
            TransportKind::Fabric(p) => format!("fabric+{}", p.name),
        }
    }

    /// Whether addresses of this transport may carry [`RdmaLocation`] details
    /// (`dev`, `port`, `gid`): true for [`Verbs`](Self::Verbs),
    /// [`RdmaCm`](Self::RdmaCm) and libfabric providers whose core provider
    /// (first `;` component) is `verbs`.
    pub fn allows_rdma_location(&self) -> bool {
        match self {
            TransportKind::Tcp => false,
            TransportKind::Verbs | TransportKind::RdmaCm => true,
            TransportKind::Fabric(p) => p.core_provider() == "verbs",
        }
    }
}

/// A libfabric provider plus the endpoint type to open with it.
///
/// Use it inside [`TransportKind::Fabric`]. `name` is the provider string as
/// libfabric spells it (`"tcp"`, `"shm"`, `"verbs"`, `"efa"`, or a utility
/// provider stack such as `"tcp;ofi_rxm"`). Valid names are `;`-separated
/// non-empty `[a-z0-9_]+` components, at most `MAX_PROVIDER_LEN` bytes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FabricProvider {
    /// libfabric provider name, e.g. `"tcp"` or `"tcp;ofi_rxm"`.
    pub name: String,
    /// Endpoint type to open (`FI_EP_MSG` or `FI_EP_RDM`).
    pub endpoint: FabricEndpoint,
}

impl FabricProvider {
    /// A provider with the default [`FabricEndpoint::Msg`] endpoint type. Use
    /// it to build a [`TransportKind::Fabric`] in code.
    pub fn new(name: impl Into<String>) -> Self {
        FabricProvider {
            name: name.into(),
            endpoint: FabricEndpoint::Msg,
        }
    }

    /// The same provider with another endpoint type.
    pub fn with_endpoint(mut self, endpoint: FabricEndpoint) -> Self {
        self.endpoint = endpoint;
        self
    }

    /// The core provider: the first `;`-separated component of the name
    /// (`"tcp"` for `"tcp;ofi_rxm"`). Use it to decide what the wire
    /// underneath is.
    pub fn core_provider(&self) -> &str {
        self.name.split(';').next().unwrap_or("")
    }
}

/// libfabric endpoint type.
///
/// Use [`Msg`](Self::Msg) (the default) for connected endpoints and
/// [`Rdm`](Self::Rdm) for reliable-datagram endpoints. Written as `?ep=rdm`;
/// `msg` is the default and is not printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum FabricEndpoint {
    /// `FI_EP_MSG`: connection-oriented. Query value `msg` (default, omitted).
    #[default]
    Msg,
    /// `FI_EP_RDM`: reliable datagram. Query value `rdm`.
    Rdm,
}

impl FabricEndpoint {
    /// The query value: `"msg"` or `"rdm"`.
    pub fn as_str(self) -> &'static str {
        match self {
            FabricEndpoint::Msg => "msg",
            FabricEndpoint::Rdm => "rdm",
        }
    }
}

/// Where on the RDMA fabric an endpoint lives (only meaningful for
/// [`TransportKind::Verbs`], [`TransportKind::RdmaCm`] and libfabric over
/// verbs).
///
/// Use it to pin a connection to a device, port and GID index; `None` means
/// "let the backend choose". Written as the query keys `dev`, `port`, `gid`.
/// Valid device names are 1 to `MAX_DEVICE_LEN` bytes of `[A-Za-z0-9_.-]`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct RdmaLocation {
    /// RDMA device name, e.g. `"rxe0"`, `"mlx5_0"`. Query key `dev`.
    pub device: Option<String>,
    /// Device port number (1-based in verbs). Query key `port`.
    pub port: Option<u8>,
    /// GID table index. Query key `gid`.
    pub gid_index: Option<u8>,
}

impl RdmaLocation {
    /// Whether no detail is set (the backend chooses everything).
    pub fn is_empty(&self) -> bool {
        self.device.is_none() && self.port.is_none() && self.gid_index.is_none()
    }
}

/// A typed entity address: transport + socket address + nonce (+ RDMA
/// details).
///
/// Use it wherever a peer or a local bind point is named: to bind a
/// messenger, to connect to a peer, in configuration and on the wire. The
/// nonce tells apart successive incarnations of an entity on the same socket
/// address. See the [crate documentation](crate) for the string syntax, which
/// is also the serde form.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct EntityAddr {
    /// How the peer is reached.
    pub transport: TransportKind,
    /// IP address and port (for verbs: of the out-of-band TCP exchange; for
    /// rdma_cm: what rdma_cm resolves and listens on).
    pub socket: SocketAddr,
    /// Incarnation nonce; 0 means "none".
    pub nonce: u64,
    /// RDMA device/port/GID details; empty for other transports.
    pub rdma: RdmaLocation,
}

impl EntityAddr {
    /// An address with nonce 0 and no RDMA details. Use it to build an
    /// address in code.
    pub fn new(transport: TransportKind, socket: SocketAddr) -> Self {
        EntityAddr {
            transport,
            socket,
            nonce: 0,
            rdma: RdmaLocation::default(),
        }
    }

    /// A TCP address with nonce 0.
    pub fn tcp(socket: SocketAddr) -> Self {
        Self::new(TransportKind::Tcp, socket)
    }

    /// The same address with another nonce. Use it when an entity stamps its
    /// incarnation onto its bind address.
    pub fn with_nonce(mut self, nonce: u64) -> Self {
        self.nonce = nonce;
        self
    }

    /// The same address with another port. Use it after binding to port 0 to
    /// record the port the kernel chose.
    pub fn with_port(mut self, port: u16) -> Self {
        self.socket.set_port(port);
        self
    }

    /// The same address with RDMA location details.
    pub fn with_rdma(mut self, rdma: RdmaLocation) -> Self {
        self.rdma = rdma;
        self
    }

    /// Whether the IP is a loopback address (`127.0.0.0/8`, `::1`, or an
    /// IPv4-mapped loopback such as `::ffff:127.0.0.1`).
    pub fn is_loopback(&self) -> bool {
        self.socket.ip().to_canonical().is_loopback()
    }

    /// Whether the address is not a concrete peer: the IP is unspecified
    /// (`0.0.0.0`, `::`, `::ffff:0.0.0.0`) or the port is 0. Use it to reject
    /// connecting to a bind-only address.
    pub fn is_unspecified(&self) -> bool {
        self.socket.ip().to_canonical().is_unspecified() || self.socket.port() == 0
    }

    /// Whether both addresses name the same endpoint: equal transport and
    /// socket address; the nonce and the RDMA details are ignored. Use it to
    /// recognise a restarted peer (same endpoint, new nonce).
    pub fn same_endpoint(&self, other: &EntityAddr) -> bool {
        self.transport == other.transport && self.socket == other.socket
    }

    /// Checks that this value can be written in the string syntax, i.e. that
    /// `addr.to_string().parse() == Ok(addr)`. Every parsed address passes.
    ///
    /// Use it before storing or sending an address built in code. It fails
    /// for: an invalid libfabric provider name, an invalid device name, RDMA
    /// details on a transport that does not take them, and an IPv6 socket
    /// address with non-zero flow info.
    pub fn validate(&self) -> Result<(), AddrParseError> {
        if let TransportKind::Fabric(p) = &self.transport {
            if !valid_provider_name(&p.name) {
                return Err(AddrParseError::BadFabricProvider(p.name.clone()));
            }
        }
        if let SocketAddr::V6(v6) = &self.socket {
            if v6.flowinfo() != 0 {
                return Err(AddrParseError::UnrepresentableFlowInfo(v6.flowinfo()));
            }
        }
        if !self.transport.allows_rdma_location() {
            let set = [
                ("dev", self.rdma.device.is_some()),
                ("port", self.rdma.port.is_some()),
                ("gid", self.rdma.gid_index.is_some()),
            ];
            if let Some((key, _)) = set.iter().find(|(_, is_set)| *is_set) {
                return Err(AddrParseError::OptionNotValidForTransport {
                    key: (*key).to_owned(),
                    scheme: self.transport.scheme(),
                });
            }
        }
        if let Some(dev) = &self.rdma.device {
            if !valid_device_name(dev) {
                return Err(AddrParseError::BadQuery {
                    key: "dev".to_owned(),
                    value: dev.clone(),
                });
            }
        }
        Ok(())
    }
}

/// `[a-z0-9_]+` components separated by single `;`, at most
/// [`MAX_PROVIDER_LEN`] bytes.
pub(crate) fn valid_provider_name(name: &str) -> bool {
    name.len() <= MAX_PROVIDER_LEN
        && name.split(';').all(|c| {
            !c.is_empty()
                && c.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        })
}

/// 1..=[`MAX_DEVICE_LEN`] bytes of `[A-Za-z0-9_.-]`.
pub(crate) fn valid_device_name(dev: &str) -> bool {
    !dev.is_empty()
        && dev.len() <= MAX_DEVICE_LEN
        && dev
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

fn parse_scheme(scheme: &str) -> Result<TransportKind, AddrParseError> {
    match scheme {
        "tcp" => Ok(TransportKind::Tcp),
        "verbs" => Ok(TransportKind::Verbs),
        "rdmacm" => Ok(TransportKind::RdmaCm),
        _ => match scheme.strip_prefix("fabric+") {
            Some(name) if valid_provider_name(name) => {
                Ok(TransportKind::Fabric(FabricProvider::new(name)))
            }
            Some(name) => Err(AddrParseError::BadFabricProvider(name.to_owned())),
            None => Err(AddrParseError::UnknownScheme(scheme.to_owned())),
        },
    }
}

/// Parses the query (the text after `?`) into RDMA details and an endpoint
/// type, enforcing known keys, no duplicates and per-transport validity.
fn parse_query(
    query: &str,
    transport: &TransportKind,
    scheme: &str,
) -> Result<(RdmaLocation, Option<FabricEndpoint>), AddrParseError> {
    let mut rdma = RdmaLocation::default();
    let mut endpoint = None;
    let mut seen = [false; 4];
    for item in query.split('&') {
        let (key, value) = item
            .split_once('=')
            .filter(|(k, _)| !k.is_empty())
            .ok_or_else(|| AddrParseError::MalformedQuery(item.to_owned()))?;
        let (slot, rdma_key) = match key {
            "dev" => (0, true),
            "port" => (1, true),
            "gid" => (2, true),
            "ep" => (3, false),
            _ => return Err(AddrParseError::UnknownQueryKey(key.to_owned())),
        };
        if let Some(s) = seen.get_mut(slot) {
            if *s {
                return Err(AddrParseError::DuplicateQueryKey(key.to_owned()));
            }
            *s = true;
        }
        let allowed = if rdma_key {
            transport.allows_rdma_location()
        } else {
            matches!(transport, TransportKind::Fabric(_))
        };
        if !allowed {
            return Err(AddrParseError::OptionNotValidForTransport {
                key: key.to_owned(),
                scheme: scheme.to_owned(),
            });
        }
        let bad = || AddrParseError::BadQuery {
            key: key.to_owned(),
            value: value.to_owned(),
        };
        match key {
            "dev" if valid_device_name(value) => rdma.device = Some(value.to_owned()),
            "port" => rdma.port = Some(parse_decimal::<u8>(value).ok_or_else(bad)?),
            "gid" => rdma.gid_index = Some(parse_decimal::<u8>(value).ok_or_else(bad)?),
            "ep" => {
                endpoint = Some(match value {
                    "msg" => FabricEndpoint::Msg,
                    "rdm" => FabricEndpoint::Rdm,
                    _ => return Err(bad()),
                })
            }
            _ => return Err(bad()),
        }
    }
    Ok((rdma, endpoint))
}

impl FromStr for EntityAddr {
    type Err = AddrParseError;

    /// Parses the syntax described in the [crate documentation](crate).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        check_len(s, MAX_ADDR_LEN)?;
        let (scheme, rest) = s
            .split_once("://")
            .filter(|(scheme, _)| !scheme.is_empty())
            .ok_or_else(|| AddrParseError::MissingScheme(s.to_owned()))?;
        let mut transport = parse_scheme(scheme)?;
        let (before_query, query) = match rest.split_once('?') {
            Some((before, query)) => (before, Some(query)),
            None => (rest, None),
        };
        let (socket_text, nonce_text) = match before_query.split_once('/') {
            Some((socket, nonce)) => (socket, Some(nonce)),
            None => (before_query, None),
        };
        let socket: SocketAddr = socket_text
            .parse()
            .map_err(|_| AddrParseError::BadSocketAddr(socket_text.to_owned()))?;
        let nonce = match nonce_text {
            None => 0,
            Some(text) => parse_decimal::<u64>(text)
                .ok_or_else(|| AddrParseError::BadNonce(text.to_owned()))?,
        };
        let (rdma, endpoint) = match query {
            None => (RdmaLocation::default(), None),
            Some(query) => parse_query(query, &transport, scheme)?,
        };
        if let (TransportKind::Fabric(p), Some(ep)) = (&mut transport, endpoint) {
            p.endpoint = ep;
        }
        Ok(EntityAddr {
            transport,
            socket,
            nonce,
            rdma,
        })
    }
}

impl fmt::Display for EntityAddr {
    /// Writes the canonical form: nonce only when non-zero, query keys in the
    /// order `dev`, `port`, `gid`, `ep`, `ep` only when `rdm`. A value that
    /// fails [`EntityAddr::validate`] is still written, but the text does not
    /// parse back to it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.transport {
            TransportKind::Tcp => f.write_str("tcp")?,
            TransportKind::Verbs => f.write_str("verbs")?,
            TransportKind::RdmaCm => f.write_str("rdmacm")?,
            TransportKind::Fabric(p) => write!(f, "fabric+{}", p.name)?,
        }
        write!(f, "://{}", self.socket)?;
        if self.nonce != 0 {
            write!(f, "/{}", self.nonce)?;
        }
        let mut sep = '?';
        if let Some(dev) = &self.rdma.device {
            write!(f, "{sep}dev={dev}")?;
            sep = '&';
        }
        if let Some(port) = self.rdma.port {
            write!(f, "{sep}port={port}")?;
            sep = '&';
        }
        if let Some(gid) = self.rdma.gid_index {
            write!(f, "{sep}gid={gid}")?;
            sep = '&';
        }
        if let TransportKind::Fabric(FabricProvider {
            endpoint: FabricEndpoint::Rdm,
            ..
        }) = &self.transport
        {
            write!(f, "{sep}ep=rdm")?;
        }
        Ok(())
    }
}
