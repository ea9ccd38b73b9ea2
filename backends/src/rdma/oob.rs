//! The verbs backend's connection setup: QP numbers, PSNs and GIDs exchanged
//! over a TCP connection (as Ceph's RDMAStack does), which then stays open as
//! the liveness channel (EOF = the peer is gone).
//!
//! The connector sends its [`QpInfo`]; the acceptor answers with its own once
//! its QP is in RTS; the connector brings its QP to RTS, reports `Connected`
//! and sends one ready byte, on which (or on the connector's first send,
//! which may overtake it) the acceptor reports `Accepted`. Receives come from
//! the shared receive queue, posted before any link exists, so no send ever
//! meets an empty queue.

use std::io::{ErrorKind, Read, Write};
use std::net::Shutdown;
use std::sync::atomic::Ordering;

use mio::event::Event;
use mio::net::{TcpListener, TcpStream};
use mio::{Interest, Token};
use msgr_addr::{EntityAddr, TransportKind};
use msgr_proto::{LinkFailure, LinkId};
use msgr_rdma::{Gid, InitAttr, QueuePair, RdmaError, RtrAttr, RtsAttr};

use super::conn::{Conn, OobConn, OobStep};
use super::device::Device;
use super::link::RdmaLink;
use super::{rdma_err, LinkParams, RdmaTransport};
use crate::wire::ConnectProgress;
use crate::{RdmaPoolConfig, TransportError, TransportEvent};

/// Where the out-of-band setup stands.
/// What each side tells the other over the out-of-band TCP connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct QpInfo {
    pub(crate) qpn: u32,
    pub(crate) psn: u32,
    pub(crate) gid: Gid,
    pub(crate) lid: u16,
    /// Path MTU code (IB encoding, 1 = 256 ... 5 = 4096).
    pub(crate) mtu: u8,
    pub(crate) params: LinkParams,
}

/// Magic and version of the exchange ("MSGRVRB" + 2).
const MAGIC: [u8; 8] = *b"MSGRVRB\x02";
/// Encoded size of [`QpInfo`].
pub(crate) const INFO_LEN: usize = 56;
/// The byte the connecting side sends once its QP is in RTS.
pub(crate) const READY: u8 = 0x5a;

impl QpInfo {
    pub(crate) fn encode(&self) -> [u8; INFO_LEN] {
        let mut b = [0u8; INFO_LEN];
        b[..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&self.qpn.to_le_bytes());
        b[12..16].copy_from_slice(&self.psn.to_le_bytes());
        b[16..32].copy_from_slice(&self.gid.0);
        b[32..34].copy_from_slice(&self.lid.to_le_bytes());
        b[34] = self.mtu;
        b[36..36 + LinkParams::LEN].copy_from_slice(&self.params.encode());
        b
    }

    pub(crate) fn decode(b: &[u8], chunk: usize) -> Result<Self, LinkFailure> {
        if b.len() != INFO_LEN || b[..8] != MAGIC {
            let why = "the peer is not a msgr verbs endpoint (bad setup magic)";
            return Err(LinkFailure::Setup(why.into()));
        }
        let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[16..32]);
        let info = QpInfo {
            qpn: u32_at(8),
            psn: u32_at(12) & 0x00ff_ffff,
            gid: Gid(gid),
            lid: u16::from_le_bytes([b[32], b[33]]),
            mtu: b[34],
            params: LinkParams::decode(&b[36..36 + LinkParams::LEN], chunk)?,
        };
        if !(1..=5).contains(&info.mtu) {
            let why = format!("bad MTU code {} in the verbs setup", info.mtu);
            return Err(LinkFailure::Setup(why));
        }
        Ok(info)
    }
}

fn mtu_code(m: msgr_rdma::Mtu) -> u8 {
    match m.bytes() {
        256 => 1,
        512 => 2,
        1024 => 3,
        2048 => 4,
        _ => 5,
    }
}

/// The path MTU: the smaller of both ends.
fn path_mtu(peer_code: u8, local: msgr_rdma::Mtu) -> msgr_rdma::Mtu {
    use msgr_rdma::Mtu;
    if peer_code < mtu_code(local) {
        match peer_code {
            1 => Mtu::Mtu256,
            2 => Mtu::Mtu512,
            3 => Mtu::Mtu1024,
            _ => Mtu::Mtu2048,
        }
    } else {
        local
    }
}

/// An initial packet sequence number that differs between links.
fn rand_psn(id: LinkId) -> u32 {
    let x =
        id.0.wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .wrapping_add(std::process::id() as u64);
    ((x >> 20) as u32) & 0x00ff_ffff
}

fn write_all(s: &mut TcpStream, b: &[u8]) -> Result<(), LinkFailure> {
    // A few dozen bytes into a fresh socket's buffer: never short in practice,
    // but a short write is reported rather than spun on.
    match s.write(b) {
        Ok(n) if n == b.len() => Ok(()),
        Ok(n) => Err(LinkFailure::Setup(format!(
            "verbs setup: short write ({n} of {})",
            b.len()
        ))),
        Err(e) => Err(LinkFailure::io("verbs setup: write", &e)),
    }
}

fn oob(l: &mut RdmaLink) -> Option<&mut OobConn> {
    match &mut l.conn {
        Conn::Oob(o) => Some(o),
        Conn::Cm(_) => None,
    }
}

impl RdmaTransport {
    /// The verbs device of this transport, opened at first use.
    fn verbs_device(&mut self, addr: &EntityAddr) -> Result<(), TransportError> {
        if self.dev.is_none() {
            let d = Device::open(&addr.rdma, &self.params.pools)
                .map_err(|e| rdma_err(TransportKind::Verbs, "open verbs device", e))?;
            if d.ctx.is_iwarp() {
                return Err(TransportError::Unavailable {
                    kind: TransportKind::Verbs,
                    reason: format!(
                        "{} is an iWARP device: its connections need rdma_cm; use an rdmacm:// address",
                        d.ctx.name()
                    ),
                });
            }
            self.install_device(d)?;
        }
        self.check_device_name(addr)
    }

    /// A QP in RTR-ready INIT state on the shared CQ and receive queue.
    fn oob_link(
        &mut self,
        id: LinkId,
        stream: TcpStream,
        outgoing: bool,
    ) -> Result<RdmaLink, TransportError> {
        let kind = self.kind.clone();
        let dev = self.dev.as_mut().expect("device opened before links");
        let share = dev
            .take_share()
            .ok_or_else(|| self.counters.share_refused(&kind))?;
        let pd = dev.pd.clone();
        let qp = dev
            .create_qp(|init| QueuePair::new(&pd, init))
            .and_then(|qp| {
                qp.to_init(&InitAttr {
                    port: dev.port,
                    ..InitAttr::default()
                })?;
                Ok(qp)
            })
            .map_err(|e| {
                dev.return_share(share);
                rdma_err(kind.clone(), "create verbs QP", e)
            })?;
        let conn = Conn::Oob(OobConn {
            stream,
            step: if outgoing {
                OobStep::TcpConnecting
            } else {
                OobStep::AwaitInfo
            },
            buf: Vec::with_capacity(INFO_LEN),
            psn: rand_psn(id),
        });
        Ok(RdmaLink::new(conn, outgoing, Some(qp), share))
    }

    fn my_info(&self, l: &RdmaLink) -> QpInfo {
        let dev = self.dev.as_ref().expect("device");
        let psn = match &l.conn {
            Conn::Oob(o) => o.psn,
            Conn::Cm(_) => 0,
        };
        QpInfo {
            qpn: l.qp.as_ref().map_or(0, QueuePair::qp_num),
            psn,
            gid: dev.gid,
            lid: dev.lid,
            mtu: mtu_code(dev.mtu),
            params: self.my_params(l),
        }
    }

    /// Brings `l`'s QP to RTR and RTS towards `peer`.
    fn connect_qp(
        dev: &Device,
        l: &mut RdmaLink,
        peer: &QpInfo,
        pools: &RdmaPoolConfig,
    ) -> Result<(), RdmaError> {
        let psn = oob(l).map_or(0, |o| o.psn);
        let rd = peer.params.rd_atomic.min(dev.rd_atomic);
        let qp = l.qp.as_ref().expect("verbs links have a QP");
        qp.to_rtr(&RtrAttr {
            path_mtu: path_mtu(peer.mtu, dev.mtu),
            dest_qp_num: peer.qpn,
            rq_psn: peer.psn,
            max_dest_rd_atomic: dev.rd_atomic,
            min_rnr_timer: 12,
            port: dev.port,
            dlid: peer.lid,
            dgid: if peer.gid.is_zero() {
                None
            } else {
                Some(peer.gid)
            },
            sgid_index: dev.gid_index,
            hop_limit: 64,
        })?;
        qp.to_rts(&RtsAttr {
            sq_psn: psn,
            max_rd_atomic: rd,
            timeout: pools.ack_timeout.unwrap_or(RtsAttr::default().timeout),
            retry_cnt: pools.retry_count,
            ..RtsAttr::default()
        })?;
        l.flow.credits = peer.params.credits;
        Ok(())
    }

    pub(super) fn oob_listen(
        &mut self,
        addr: &EntityAddr,
        token: Token,
    ) -> Result<EntityAddr, TransportError> {
        self.verbs_device(addr)?;
        let (listener, bound_addr) = crate::wire::bind_listener(addr, &self.registry, token)?;
        self.setup
            .oob_listeners
            .insert(token, (listener, bound_addr.clone()));
        Ok(bound_addr)
    }

    pub(super) fn oob_connect(
        &mut self,
        link: LinkId,
        addr: &EntityAddr,
    ) -> Result<(), TransportError> {
        self.verbs_device(addr)?;
        let stream =
            TcpStream::connect(addr.socket).map_err(|e| TransportError::io("connect", e))?;
        let _ = stream.set_nodelay(true);
        let mut l = self.oob_link(link, stream, true)?;
        let o = oob(&mut l).expect("just made");
        if let Err(e) = self.registry.register(
            &mut o.stream,
            Token(link.0 as usize),
            Interest::READABLE | Interest::WRITABLE,
        ) {
            self.release(l);
            return Err(TransportError::io("register verbs setup socket", e));
        }
        self.insert_link(link, l);
        Ok(())
    }

    pub(super) fn oob_accept_all(&mut self, token: Token, events: &mut Vec<TransportEvent>) {
        loop {
            let Some((listener, _)) = self.setup.oob_listeners.get(&token) else {
                return;
            };
            match listener.accept() {
                Ok((stream, _peer)) => {
                    self.counters.connect_requests += 1;
                    let _ = stream.set_nodelay(true);
                    let id = LinkId(self.link_ids.fetch_add(1, Ordering::Relaxed));
                    match self.oob_link(id, stream, false) {
                        Ok(mut l) => {
                            let o = oob(&mut l).expect("just made");
                            if let Err(e) = self.registry.register(
                                &mut o.stream,
                                Token(id.0 as usize),
                                Interest::READABLE,
                            ) {
                                tracing::warn!(error = %e, "dropping accepted verbs connection");
                                self.counters.accepts_failed += 1;
                                self.release(l);
                                continue;
                            }
                            l.listener = Some(token);
                            self.insert_link(id, l);
                            // The connector's info may already be there.
                            self.read_oob(id, events);
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "dropping accepted verbs connection");
                            self.counters.accepts_failed += 1;
                        }
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    return;
                }
            }
        }
    }

    /// Readiness of a verbs link's setup socket.
    pub(super) fn oob_ready(
        &mut self,
        id: LinkId,
        event: &Event,
        events: &mut Vec<TransportEvent>,
    ) {
        let Some(l) = self.links.get_mut(&id) else {
            return;
        };
        let Some(o) = oob(l) else {
            return;
        };
        if o.step == OobStep::TcpConnecting {
            match crate::wire::connect_progress(&o.stream, event) {
                ConnectProgress::Pending => return,
                ConnectProgress::Failed(why) => {
                    self.fail(id, why, events);
                    return;
                }
                ConnectProgress::Connected => {
                    let _ = self.registry.reregister(
                        &mut o.stream,
                        Token(id.0 as usize),
                        Interest::READABLE,
                    );
                    o.step = OobStep::AwaitInfo;
                    let info = self.my_info(self.links.get(&id).expect("present"));
                    let o = oob(self.links.get_mut(&id).expect("present")).expect("oob");
                    if let Err(why) = write_all(&mut o.stream, &info.encode()) {
                        self.fail(id, why, events);
                        return;
                    }
                }
            }
        }
        if event.is_readable() || event.is_read_closed() || event.is_error() {
            self.read_oob(id, events);
        }
    }

    /// Reads the setup socket: setup messages, then only EOF/errors matter.
    fn read_oob(&mut self, id: LinkId, events: &mut Vec<TransportEvent>) {
        loop {
            let Some(o) = self.links.get_mut(&id).and_then(oob) else {
                return;
            };
            let want = match o.step {
                OobStep::AwaitInfo => INFO_LEN - o.buf.len(),
                OobStep::AwaitReady => 1,
                OobStep::TcpConnecting => return,
                OobStep::Up => 64,
            };
            let mut buf = [0u8; 64];
            match o.stream.read(&mut buf[..want]) {
                Ok(0) => {
                    // Completions that arrived before the peer closed come first.
                    self.poll_cq(events);
                    let why = LinkFailure::ClosedByPeer("connection closed by peer".into());
                    self.fail(id, why, events);
                    return;
                }
                Ok(n) => {
                    if let Err(why) = self.on_oob(id, &buf[..n], events) {
                        self.fail(id, why, events);
                        return;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    self.poll_cq(events);
                    self.fail(id, LinkFailure::io("setup socket", &e), events);
                    return;
                }
            }
        }
    }

    fn on_oob(
        &mut self,
        id: LinkId,
        bytes: &[u8],
        events: &mut Vec<TransportEvent>,
    ) -> Result<(), LinkFailure> {
        let pools = self.params.pools;
        let chunk = pools.chunk_size;
        let dev = self.dev.as_ref().expect("device");
        let l = self.links.get_mut(&id).expect("caller checked");
        let o = oob(l).expect("caller checked");
        match o.step {
            OobStep::AwaitInfo => {
                o.buf.extend_from_slice(bytes);
                if o.buf.len() < INFO_LEN {
                    return Ok(());
                }
                let peer = QpInfo::decode(&o.buf, chunk)?;
                Self::connect_qp(dev, l, &peer, &pools)
                    .map_err(|e| LinkFailure::Setup(format!("verbs connect: {e}")))?;
                let outgoing = l.outgoing;
                let o = oob(l).expect("oob");
                if outgoing {
                    write_all(&mut o.stream, &[READY])?;
                    o.step = OobStep::Up;
                    self.mark_up(id, events);
                } else {
                    o.step = OobStep::AwaitReady;
                    let info = self.my_info(self.links.get(&id).expect("present"));
                    let o = oob(self.links.get_mut(&id).expect("present")).expect("oob");
                    write_all(&mut o.stream, &info.encode())?;
                }
            }
            OobStep::AwaitReady => {
                if bytes != [READY] {
                    return Err(LinkFailure::Protocol(
                        "bad ready byte in verbs setup".into(),
                    ));
                }
                o.step = OobStep::Up;
                self.mark_up(id, events);
            }
            // Nothing is sent on the socket once up; ignore stray bytes.
            OobStep::Up | OobStep::TcpConnecting => {}
        }
        Ok(())
    }

    /// Whether an acceptor's first receive may stand for the ready byte (its
    /// QP is in RTS: the connector's send can overtake the byte).
    pub(super) fn oob_may_accept_on_recv(l: &mut RdmaLink) -> bool {
        match oob(l) {
            Some(o) if o.step == OobStep::AwaitReady => {
                o.step = OobStep::Up;
                true
            }
            _ => false,
        }
    }

    pub(super) fn oob_release(&mut self, o: &mut OobConn) {
        let _ = self.registry.deregister(&mut o.stream);
        let _ = o.stream.shutdown(Shutdown::Both);
    }

    pub(super) fn oob_unlisten(&mut self, token: Token) {
        if let Some((mut l, _)) = self.setup.oob_listeners.remove(&token) {
            let _ = self.registry.deregister(&mut l);
        }
    }
}

/// The half-close fault of a verbs link: no half-close exists on a QP, so the
/// setup socket's sending side closes (the peer sees EOF: we are gone).
#[cfg(feature = "fault-injection")]
pub(super) fn half_close(o: &OobConn) -> std::io::Result<()> {
    o.stream.shutdown(Shutdown::Write)
}

/// The listener a verbs acceptor came from (`TcpListener`s live in the transport).
pub(super) type OobListener = (TcpListener, EntityAddr);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qp_info_round_trips_and_rejects_garbage() {
        let i = QpInfo {
            qpn: 17,
            psn: 0x12_3456,
            gid: Gid([7; 16]),
            lid: 3,
            mtu: 3,
            params: LinkParams {
                credits: 32,
                chunk: 32 << 10,
                rd_atomic: 4,
            },
        };
        assert_eq!(QpInfo::decode(&i.encode(), 32 << 10).unwrap(), i);
        // A peer with another chunk size is refused.
        assert!(QpInfo::decode(&i.encode(), 8 << 10).is_err());
        assert!(QpInfo::decode(&[0u8; INFO_LEN], 32 << 10).is_err());
        assert!(QpInfo::decode(b"GET / HTTP/1.1", 32 << 10).is_err());
    }
}
