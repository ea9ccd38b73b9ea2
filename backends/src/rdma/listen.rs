//! The rdmacm backend's listeners, and a watch on the one failure of theirs
//! that no rdma_cm event reports.
//!
//! Soft-iWARP (`siw`) listens through a kernel TCP socket. Linux 6.1's siw
//! (and every kernel whose `siw_cm_llp_state_change` hands a not yet
//! accepted connection's close to the listening endpoint) releases that
//! socket when a peer closes a TCP connection before siw has accepted it —
//! a client that gives up on its connect at the wrong moment. rdma_cm still
//! calls the id listening, no event says otherwise, and every later connect
//! is refused: a server that is up and unreachable for good. (Destroying
//! such an id also trips a refcount warning in the kernel: siw puts the
//! released endpoint a second time.)
//!
//! The watch: right after `rdma_listen`, a TCP bind to the same address
//! with `SO_REUSEADDR` — which only a listening socket refuses — tells
//! whether a kernel socket listens for the id (siw: yes; RoCE and
//! offloading iWARP NICs: no, and they are left alone). Such a listener is
//! probed every [`CHECK_EVERY`]; once its socket is gone, the id is
//! destroyed and the address listened on again (`listeners_restored`). A
//! re-listen that fails is retried at the next check.

use std::io::ErrorKind;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use mio::Token;
use msgr_rdma::{CmId, PortSpace};
use socket2::{Domain, Socket, Type};

use super::conn::cm_err;
use super::RdmaTransport;
use crate::TransportError;

/// Connection requests a listener queues.
const BACKLOG: i32 = 128;

/// How often a listener backed by a kernel TCP socket is probed.
const CHECK_EVERY: Duration = Duration::from_secs(1);

/// One listening rdma_cm id.
struct CmListener {
    /// Held, not read: dropping it destroys the listening id.
    _id: CmId,
    token: Token,
    /// The bound address (its port chosen when 0 was asked for).
    addr: SocketAddr,
    /// A kernel TCP socket listens for it (siw): probed every [`CHECK_EVERY`].
    watched: bool,
}

/// The listeners of a transport and their watch.
#[derive(Default)]
pub(crate) struct Listeners {
    /// By id handle (what a connection request names).
    by_handle: rustc_hash::FxHashMap<usize, CmListener>,
    /// Addresses whose re-listen failed, with their tokens: retried.
    lost: Vec<(SocketAddr, Token)>,
    next_check: Option<Instant>,
}

impl Listeners {
    pub(crate) fn token_of(&self, handle: usize) -> Option<Token> {
        self.by_handle.get(&handle).map(|l| l.token)
    }

    pub(crate) fn owns(&self, token: Token) -> bool {
        self.by_handle.values().any(|l| l.token == token)
    }

    pub(crate) fn remove_token(&mut self, token: Token) {
        self.by_handle.retain(|_, l| l.token != token);
        self.lost.retain(|(_, t)| *t != token);
    }

    /// When the next probe is due, if anything is watched.
    pub(crate) fn wake_at(&self) -> Option<Instant> {
        self.next_check
    }

    fn add(&mut self, id: CmId, token: Token, addr: SocketAddr, now: Instant) {
        let watched = kernel_tcp_listener(addr) == Some(true);
        tracing::debug!(%addr, watched, "rdma_cm listener");
        if watched && self.next_check.is_none() {
            self.next_check = Some(now + CHECK_EVERY);
        }
        self.by_handle.insert(
            id.handle(),
            CmListener {
                _id: id,
                token,
                addr,
                watched,
            },
        );
    }
}

/// Whether a kernel TCP socket listens on `addr`; `None` when the probe
/// itself could not be made (no socket to spare, say).
fn kernel_tcp_listener(addr: SocketAddr) -> Option<bool> {
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, None).ok()?;
    s.set_reuse_address(true).ok()?;
    match s.bind(&addr.into()) {
        Ok(()) => Some(false),
        Err(e) if e.kind() == ErrorKind::AddrInUse => Some(true),
        Err(_) => None,
    }
}

impl RdmaTransport {
    /// A listening id on `addr` (port 0: one is picked), registered under
    /// `token`. Returns the bound address.
    pub(super) fn cm_listen_at(
        &mut self,
        addr: SocketAddr,
        token: Token,
    ) -> Result<SocketAddr, TransportError> {
        let channel = self.cm_state()?.channel();
        let id = CmId::new(&channel, PortSpace::Tcp).map_err(|e| cm_err("rdma_create_id", e))?;
        id.bind_addr(addr)
            .map_err(|e| cm_err("rdma_bind_addr", e))?;
        if id.context().is_some() {
            self.cm_device(&id)?;
        }
        id.listen(BACKLOG).map_err(|e| cm_err("rdma_listen", e))?;
        let bound = id.local_addr().unwrap_or(addr);
        let cm = self.setup.cm.as_mut().expect("made above");
        cm.listeners.add(id, token, bound, Instant::now());
        Ok(bound)
    }

    /// Probes the watched listeners when due; listens again where the
    /// kernel socket is gone (see the module docs).
    pub(super) fn check_listeners(&mut self, now: Instant) {
        let Some(cm) = self.setup.cm.as_mut() else {
            return;
        };
        let l = &mut cm.listeners;
        if l.next_check.is_none_or(|t| now < t) {
            return;
        }
        let dead: Vec<usize> = l
            .by_handle
            .iter()
            .filter(|(_, x)| x.watched && kernel_tcp_listener(x.addr) == Some(false))
            .map(|(h, _)| *h)
            .collect();
        let mut again = std::mem::take(&mut l.lost);
        for h in dead {
            let x = l.by_handle.remove(&h).expect("listed above");
            tracing::warn!(
                addr = %x.addr,
                "siw released the TCP socket behind this rdma_cm listener (a peer closed \
                 a connection before siw accepted it) and every connect would be refused: \
                 listening again"
            );
            again.push((x.addr, x.token));
            // Destroys the id (the kernel may warn of a refcount underflow).
            drop(x);
        }
        for (addr, token) in again {
            match self.cm_listen_at(addr, token) {
                Ok(_) => self.counters.listeners_restored += 1,
                Err(e) => {
                    tracing::error!(%addr, error = %e, "could not listen again; retrying");
                    if let Some(cm) = self.setup.cm.as_mut() {
                        cm.listeners.lost.push((addr, token));
                    }
                }
            }
        }
        if let Some(cm) = self.setup.cm.as_mut() {
            let l = &mut cm.listeners;
            let watching = !l.lost.is_empty() || l.by_handle.values().any(|x| x.watched);
            l.next_check = watching.then_some(now + CHECK_EVERY);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_sees_a_listening_socket_and_only_that() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        assert_eq!(kernel_tcp_listener(addr), Some(true));
        // An accepted connection on the port is not a listener.
        let _c = std::net::TcpStream::connect(addr).unwrap();
        let _a = l.accept().unwrap();
        drop(l);
        assert_eq!(kernel_tcp_listener(addr), Some(false));
    }
}
