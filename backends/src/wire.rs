//! Pieces every backend shares: the TCP listener (the TCP backend's own, and
//! the RDMA backends' out-of-band setup channel) and the bit flip of the fault
//! plan's wire corruption.

use mio::net::TcpListener;
use mio::{Interest, Registry, Token};
use msgr_addr::EntityAddr;
use msgr_proto::LinkFailure;

use crate::TransportError;

/// Binds a non-blocking TCP listener on `addr` (SO_REUSEADDR, so a restarted
/// server can bind while old connections linger) and registers it under
/// `token`. Returns it with `addr` carrying the port actually bound.
pub(crate) fn bind_listener(
    addr: &EntityAddr,
    registry: &Registry,
    token: Token,
) -> Result<(TcpListener, EntityAddr), TransportError> {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(addr.socket),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )
    .map_err(|e| TransportError::io("socket", e))?;
    socket
        .set_reuse_address(true)
        .map_err(|e| TransportError::io("SO_REUSEADDR", e))?;
    socket
        .set_nonblocking(true)
        .map_err(|e| TransportError::io("O_NONBLOCK", e))?;
    socket
        .bind(&addr.socket.into())
        .map_err(|source| TransportError::Bind {
            addr: addr.clone().with_nonce(0),
            source,
        })?;
    // Connections the kernel holds for us between two accepting passes: a
    // burst of thousands at once (10,000 clients dialling a server) that
    // overflows it has its SYNs dropped and retried a second later. The
    // kernel caps it at net.core.somaxconn (4096 by default since 5.4).
    socket
        .listen(4096)
        .map_err(|e| TransportError::io("listen", e))?;
    let mut listener = TcpListener::from_std(socket.into());
    let bound = listener
        .local_addr()
        .map_err(|e| TransportError::io("local_addr", e))?;
    registry
        .register(&mut listener, token, Interest::READABLE)
        .map_err(|e| TransportError::io("register listener", e))?;
    Ok((listener, addr.clone().with_port(bound.port())))
}

/// Encodes `unit` and flips bit `bit` (modulo its length), as line noise
/// would: what a backend sends for [`crate::FaultInjection::send_corrupted`].
#[cfg(feature = "fault-injection")]
pub(crate) fn corrupted(unit: msgr_proto::Transmit, bit: u64) -> Result<Vec<u8>, TransportError> {
    let mut bytes = unit.encode_to_vec()?;
    let bit = bit % (bytes.len() as u64 * 8);
    bytes[(bit / 8) as usize] ^= 1 << (bit % 8);
    Ok(bytes)
}

/// Where a non-blocking TCP connect stands after a readiness event.
pub(crate) enum ConnectProgress {
    /// Not decided yet: wait for the next event.
    Pending,
    /// Established.
    Connected,
    /// Failed, with the reason.
    Failed(LinkFailure),
}

/// Reads a connecting socket's readiness (the TCP backend's links and the
/// RDMA backends' out-of-band channel).
pub(crate) fn connect_progress(
    stream: &mio::net::TcpStream,
    event: &mio::event::Event,
) -> ConnectProgress {
    if event.is_error() || event.is_write_closed() {
        let err = stream.take_error().ok().flatten();
        return ConnectProgress::Failed(
            err.map_or(LinkFailure::Setup("connection refused".to_string()), |e| {
                LinkFailure::io("connect", &e)
            }),
        );
    }
    if !event.is_writable() {
        return ConnectProgress::Pending;
    }
    match stream.peer_addr() {
        Ok(_) => ConnectProgress::Connected,
        Err(e) if e.kind() == std::io::ErrorKind::NotConnected => ConnectProgress::Pending,
        Err(e) => {
            let why = stream.take_error().ok().flatten().unwrap_or(e);
            ConnectProgress::Failed(LinkFailure::io("connect", &why))
        }
    }
}
