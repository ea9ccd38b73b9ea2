//! Connected endpoints (`FI_EP_MSG`): listening ([`PassiveEp`]), connection
//! requests accepted or refused, and [`Ep`]s that own their slots.

use crate::error::{check, FabricError, Site};
use crate::net::{bind_and_enable, close, sockaddr, ConnReq, Net, NetObjects};
use crate::rma::{Exposed, Landing, RmaBuffers};
use crate::slots::{post_recv, sends_in_place, Buffers, SendSlots, TxSide, FI_ADDR_UNSPEC};
use bytes::Bytes;
use libfabric_sys as sys;
use std::net::SocketAddr;
use std::os::raw::c_void;
use std::ptr;
use std::sync::Arc;

impl Net {
    /// Listens on `addr` (port 0: the provider picks; see [`PassiveEp::addr`]).
    pub fn listen(&mut self, addr: SocketAddr) -> Result<PassiveEp, FabricError> {
        let info = self.info_on_domain(Site::Local(addr))?;
        let mut pep = PassiveEp {
            pep: ptr::null_mut(),
            addr,
            _net: self.objects.clone(),
        };
        // SAFETY: info is valid; pep.pep is closed by its Drop if set; the
        // fabric and EQ outlive the passive endpoint (it holds them open).
        unsafe {
            check(
                "fi_passive_ep",
                sys::fi_passive_ep(self.objects.fabric, info.0, &mut pep.pep, ptr::null_mut())
                    as isize,
            )?;
            check(
                "fi_pep_bind(eq)",
                sys::fi_pep_bind(pep.pep, self.objects.eq as *mut sys::fid, 0) as isize,
            )?;
            check("fi_listen", sys::fi_listen(pep.pep) as isize)?;
            let mut raw = [0u8; 128];
            let mut len = raw.len();
            check(
                "fi_getname",
                sys::fi_getname(
                    pep.pep as *mut sys::fid,
                    raw.as_mut_ptr() as *mut c_void,
                    &mut len,
                ) as isize,
            )?;
            if let Some(a) = sockaddr(raw.as_ptr(), len.min(raw.len())) {
                pep.addr = a;
            }
        }
        Ok(pep)
    }

    fn new_ep(
        &mut self,
        info: *mut sys::fi_info,
        slots: usize,
        slot_size: usize,
    ) -> Result<Ep, FabricError> {
        let mut ep = self.open_ep(info, slots, slot_size)?;
        self.enable_ep(&mut ep)?;
        Ok(ep)
    }

    /// `fi_endpoint` from `info`, with the endpoint's buffers.
    fn open_ep(
        &mut self,
        info: *mut sys::fi_info,
        slots: usize,
        slot_size: usize,
    ) -> Result<Ep, FabricError> {
        // SAFETY: info is valid (from fi_getinfo or a connection request),
        // and so is its tx_attr where it is not null.
        let sends_in_place = unsafe { sends_in_place(self.mr.local, (*info).tx_attr) };
        let mut ep = Ep {
            ep: ptr::null_mut(),
            tx: TxSide {
                buffers: Buffers::new(slots, slot_size),
                in_place: sends_in_place,
            },
            rx: Buffers::new(slots, slot_size),
            slot_size,
            rma: self.rma_regions(),
            _net: self.objects.clone(),
        };
        // SAFETY: info is valid; ep.ep is closed by Ep::drop if set.
        check("fi_endpoint", unsafe {
            sys::fi_endpoint(self.objects.domain, info, &mut ep.ep, ptr::null_mut())
        } as isize)?;
        Ok(ep)
    }

    /// Binds an opened endpoint to the EQ and CQ, enables it and registers
    /// its buffers where the provider wants `FI_MR_LOCAL`.
    fn enable_ep(&mut self, ep: &mut Ep) -> Result<(), FabricError> {
        let o = &self.objects;
        // SAFETY: ep.ep is open; the EQ and CQ outlive the endpoint (it holds
        // them open: `Ep::_net`); the buffers are owned by the endpoint and
        // freed only after it is closed (Ep::drop).
        unsafe {
            bind_and_enable(ep.ep, o.eq as *mut sys::fid, "fi_ep_bind(eq)", o.cq)?;
            if self.mr.local {
                ep.tx.buffers.register(o.domain, u64::from(sys::FI_SEND))?;
                ep.rx.register(o.domain, u64::from(sys::FI_RECV))?;
            }
        }
        Ok(())
    }

    /// Opens an endpoint and starts connecting it to `addr`, passing `data`
    /// (a few bytes: the acceptor reads it with [`ConnReq::data`]);
    /// `FI_CONNECTED` (or an error) comes out of [`Net::read_eq`] under
    /// [`Ep::key`].
    pub fn connect(
        &mut self,
        addr: SocketAddr,
        slots: usize,
        slot_size: usize,
        data: &[u8],
    ) -> Result<Ep, FabricError> {
        let info = self.info_on_domain(Site::Peer(addr))?;
        let ep = self.new_ep(info.0, slots, slot_size)?;
        // SAFETY: ep is enabled; dest_addr of the info is the peer's address;
        // the provider copies `data` before returning.
        let rc = unsafe {
            sys::fi_connect(
                ep.ep,
                (*info.0).dest_addr,
                data.as_ptr() as *const c_void,
                data.len(),
            )
        };
        check("fi_connect", rc as isize)?;
        Ok(ep)
    }

    /// Accepts a connection request, passing `data` to the connector (its
    /// `FI_CONNECTED` carries it); `FI_CONNECTED` follows on the EQ. On
    /// failure the request comes back if no endpoint took it, for the caller
    /// to [`PassiveEp::reject`]; once an endpoint took it, the endpoint owns
    /// the connection and closing it (on failure, here) tells the peer.
    pub fn accept(
        &mut self,
        req: ConnReq,
        slots: usize,
        slot_size: usize,
        data: &[u8],
    ) -> Result<Ep, (FabricError, Option<ConnReq>)> {
        let mut ep = match self.open_ep(req.0 .0, slots, slot_size) {
            Ok(ep) => ep,
            Err(e) => return Err((e, Some(req))),
        };
        self.enable_ep(&mut ep).map_err(|e| (e, None))?;
        // SAFETY: ep was created from the request's info and is enabled; the
        // provider copies `data` before returning.
        let rc = unsafe { sys::fi_accept(ep.ep, data.as_ptr() as *const c_void, data.len()) };
        check("fi_accept", rc as isize).map_err(|e| (e, None))?;
        Ok(ep)
    }
}

/// A listening passive endpoint.
pub struct PassiveEp {
    pep: *mut sys::fid_pep,
    addr: SocketAddr,
    /// Keeps the fabric and EQ open until after `pep` is closed.
    _net: Arc<NetObjects>,
}

// SAFETY: see `Net`.
unsafe impl Send for PassiveEp {}

impl std::fmt::Debug for PassiveEp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PassiveEp")
            .field("addr", &self.addr)
            .finish()
    }
}

impl PassiveEp {
    /// The address actually bound.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The key under which connection requests name this listener
    /// ([`ConnReq::listener`]).
    pub fn key(&self) -> usize {
        self.pep as usize
    }

    /// Refuses a connection request that came to this listener: the
    /// connector's endpoint gets an `FI_ECONNREFUSED` error event at once
    /// instead of waiting for its own timeout. A request of another
    /// listener is not touched (an error).
    pub fn reject(&mut self, req: ConnReq) -> Result<(), FabricError> {
        if req.listener() != self.key() {
            return Err(FabricError::Call {
                op: "fi_reject",
                code: sys::FI_EINVAL as i32,
                msg: "a connection request of another listener".into(),
            });
        }
        // SAFETY: self.pep is the open passive endpoint the request's
        // FI_CONNREQ event came from, and the handle is the one the provider
        // put in that event's info; no endpoint took it (`Net::accept` hands
        // the request back only then) and `req` is consumed, so it is
        // rejected at most once. The info itself is freed after the call,
        // with `req` (fi_freeinfo does not touch the handle).
        let rc = unsafe { sys::fi_reject(self.pep, (*req.0 .0).handle, ptr::null(), 0) };
        check("fi_reject", rc as isize)?;
        Ok(())
    }
}

impl Drop for PassiveEp {
    fn drop(&mut self) {
        close(self.pep as *mut sys::fid);
    }
}

/// An active MSG endpoint with its own transmit and receive slots.
pub struct Ep {
    ep: *mut sys::fid_ep,
    tx: TxSide,
    rx: Buffers,
    slot_size: usize,
    rma: RmaBuffers,
    /// Keeps the domain and queues open until after the endpoint and its
    /// registrations are closed (fields drop after `Drop::drop`, in order).
    _net: Arc<NetObjects>,
}

// SAFETY: see `Net`.
unsafe impl Send for Ep {}

impl std::fmt::Debug for Ep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ep").field("key", &self.key()).finish()
    }
}

impl Drop for Ep {
    fn drop(&mut self) {
        // Close the endpoint first: after fi_close the provider no longer
        // touches the buffers, which are then freed with `self`.
        close(self.ep as *mut sys::fid);
        self.rma.close_all();
        self.tx.buffers.close_mr();
        self.rx.close_mr();
    }
}

impl SendSlots for Ep {
    fn tx_side(&self) -> &TxSide {
        &self.tx
    }

    fn tx_side_mut(&mut self) -> &mut TxSide {
        &mut self.tx
    }
}

impl Ep {
    /// The key under which EQ events name this endpoint.
    pub fn key(&self) -> usize {
        self.ep as usize
    }

    /// Bytes per slot.
    pub fn slot_size(&self) -> usize {
        self.slot_size
    }

    /// Number of slots of each direction.
    pub fn slots(&self) -> usize {
        self.tx_slots()
    }

    /// Posts receive slot `slot` with completion context `context`.
    pub fn post_recv(&mut self, slot: usize, context: u64) -> Result<(), FabricError> {
        post_recv(self.ep, &mut self.rx, slot, 0, context)
    }

    /// A completed receive: frees the slot and returns its first `len` bytes.
    pub fn recv_done(&mut self, slot: usize, len: usize) -> &[u8] {
        self.rx.done(slot, len)
    }

    /// Sends the first `len` bytes of transmit slot `slot`. `Err` with
    /// [`is_again`](crate::is_again) means the provider's queue is full: retry later.
    pub fn send(&mut self, slot: usize, len: usize, context: u64) -> Result<(), FabricError> {
        self.tx.send(self.ep, slot, len, 0, context)
    }

    /// Sends the first `head` bytes of transmit slot `slot` followed by
    /// `body`, without copying `body` (`post_send_in_place`): large pieces
    /// of a frame go this way where [`SendSlots::sends_in_place`]; elsewhere this
    /// returns [`FabricError::Slot`]. `Err` with [`is_again`](crate::is_again): retry later.
    pub fn send_in_place(
        &mut self,
        slot: usize,
        head: usize,
        body: Bytes,
        context: u64,
    ) -> Result<(), FabricError> {
        self.tx.send_in_place(self.ep, slot, head, body, 0, context)
    }

    /// The endpoint's rendezvous buffers (for the connected peer to read).
    pub fn rma(&mut self) -> &mut RmaBuffers {
        &mut self.rma
    }

    /// Starts reading the connected peer's exposed buffer `x` into a new
    /// buffer of ours, at offset `at` of the bytes `around` (placed before
    /// and after it; empty for a whole unit), owned by the endpoint until
    /// [`RmaBuffers::read_done`] with the same `context`. A connected
    /// endpoint needs no peer address.
    pub fn read(
        &mut self,
        x: &Exposed,
        context: u64,
        around: &[u8],
        at: usize,
    ) -> Result<(), FabricError> {
        self.rma
            .read(self.ep, x, FI_ADDR_UNSPEC, context, around, at)
    }

    /// Starts writing our held unit `id` ([`Exposed::write`]) into the
    /// buffer the connected peer granted (`landing`); its completion comes
    /// under `context` ([`RmaBuffers::write_done`]). A send posted after it
    /// does not overtake it (`FI_ORDER_SAW`).
    pub fn write(&mut self, id: u32, landing: Landing, context: u64) -> Result<(), FabricError> {
        self.rma
            .write(self.ep, id, FI_ADDR_UNSPEC, landing, context)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::info::EpType;
    use crate::net::CmEvent;

    #[test]
    fn tcp_msg_ping() {
        let mut net = Net::open("tcp", EpType::Msg, 64).unwrap();
        assert!(net.eq_fd().unwrap().is_some());
        // tcp's CQ waits on a list of fds (FI_WAIT_POLLFD), not one.
        assert!(!net.cq_polled() && net.cq_fd().unwrap().is_none());
        let mut listed = Vec::new();
        net.cq_wait_fds(&mut listed).unwrap();
        let idle = listed.len();
        assert!(idle > 0, "the provider's signal fd at least");
        let pep = net.listen("127.0.0.1:0".parse().unwrap()).unwrap();
        assert_ne!(pep.addr().port(), 0);
        let mut c = net.connect(pep.addr(), 4, 1024, b"hi").unwrap();
        let mut s = None;
        let mut connected = 0;
        let t0 = std::time::Instant::now();
        while connected < 2 {
            assert!(t0.elapsed().as_secs() < 10, "connect timed out");
            let mut done = Vec::new();
            net.read_cq(&mut done, 8).expect("fi_cq_read");
            match net.read_eq().expect("fi_eq_read") {
                Some(CmEvent::ConnReq(r)) => {
                    assert_eq!(r.data(), b"hi", "the connector's data");
                    let mut ep = net.accept(r, 4, 1024, b"yo").unwrap();
                    ep.post_recv(0, 7).unwrap();
                    s = Some(ep);
                }
                Some(CmEvent::Connected(key, data)) => {
                    // The acceptor's data reaches the connector only.
                    let want: &[u8] = if key == c.key() { b"yo" } else { b"" };
                    assert_eq!(data, want, "connection data at {key:#x}");
                    connected += 1;
                }
                Some(other) => panic!("{other:?}"),
                None => {}
            }
        }
        let mut s = s.unwrap();
        c.tx_slot(0).unwrap()[..5].copy_from_slice(b"hello");
        c.send(0, 5, 9).unwrap();
        let mut got = Vec::new();
        while got.len() < 2 {
            assert!(t0.elapsed().as_secs() < 10, "completion timed out");
            net.read_cq(&mut got, 8).expect("fi_cq_read");
        }
        let r = got.iter().find(|c| c.recv).unwrap();
        assert_eq!(r.context, 7);
        assert_eq!(s.recv_done(0, r.len), b"hello");
        // Both connected endpoints' sockets are on the list now.
        net.cq_wait_fds(&mut listed).unwrap();
        assert!(listed.len() >= idle + 2, "{idle} then {listed:?}");
        drop((c, s, pep));
    }

    /// A rejected request fails its connector at once, with
    /// `FI_ECONNREFUSED` (not by a timeout).
    #[test]
    fn tcp_msg_reject() {
        let mut net = Net::open("tcp", EpType::Msg, 64).unwrap();
        let mut pep = net.listen("127.0.0.1:0".parse().unwrap()).unwrap();
        let c = net.connect(pep.addr(), 4, 1024, &[]).unwrap();
        let t0 = std::time::Instant::now();
        let mut refused = None;
        while refused.is_none() {
            assert!(t0.elapsed().as_secs() < 5, "no answer to the connector");
            match net.read_eq().expect("fi_eq_read") {
                Some(CmEvent::ConnReq(r)) => {
                    assert_eq!(r.listener(), pep.key());
                    pep.reject(r).unwrap();
                }
                Some(CmEvent::Error(key, why)) => refused = Some((key, why)),
                Some(other) => panic!("{other:?}"),
                None => std::thread::sleep(std::time::Duration::from_millis(1)),
            }
        }
        let (key, why) = refused.unwrap();
        assert_eq!(key, c.key());
        assert!(why.contains("refused"), "{why}");
        drop((c, pep));
    }
}
