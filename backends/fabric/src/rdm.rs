//! Reliable datagram endpoints (`FI_EP_RDM`): [`RdmEp`], its address vector
//! of peers ([`PeerAddr`]), and the [`Net`] methods that open and resolve them.

use crate::error::{check, strerror, FabricError, Site};
use crate::info::{getinfo, getinfo_on, EpType};
use crate::net::{bind_and_enable, close, sockaddr, Net, NetObjects};
use crate::rma::{Exposed, Landing, RmaBuffers};
use crate::slots::{post_recv, sends_in_place, Buffers, SendSlots, TxSide, FI_ADDR_UNSPEC};
use bytes::Bytes;
use libfabric_sys as sys;
use std::ffi::CString;
use std::net::SocketAddr;
use std::os::raw::c_void;
use std::ptr;
use std::sync::Arc;

/// A peer in an [`RdmEp`]'s address vector (`fi_addr_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PeerAddr(u64);

/// Longest endpoint name [`RdmEp::name`] returns or [`RdmEp::insert`] takes.
pub const MAX_NAME_LEN: usize = 256;

/// An `FI_EP_RDM` endpoint: address vector, transmit slots, and a receive
/// pool shared by all its peers that grows by blocks of equal size.
pub struct RdmEp {
    ep: *mut sys::fid_ep,
    av: *mut sys::fid_av,
    mr_local: bool,
    addr_format: u32,
    name: Vec<u8>,
    tx: TxSide,
    rx: Vec<Buffers>,
    rx_block: usize,
    slot_size: usize,
    /// The endpoint's `tx_attr.inject_size`: sends up to it may go by
    /// [`RdmEp::inject`].
    inject_size: usize,
    /// Never close (see the crate docs: `shm`).
    leak: bool,
    rma: RmaBuffers,
    /// Keeps the domain and CQ open until after the endpoint, its address
    /// vector and its registrations are closed (fields drop after
    /// `Drop::drop`, in order).
    net: Arc<NetObjects>,
}

// SAFETY: see `Net`.
unsafe impl Send for RdmEp {}

impl std::fmt::Debug for RdmEp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmEp")
            .field("name", &String::from_utf8_lossy(&self.name))
            .field("rx_slots", &self.rx_slots())
            .finish()
    }
}

impl Drop for RdmEp {
    fn drop(&mut self) {
        if self.leak {
            // The region's name goes now (the mapping stays for whoever has
            // it): nothing new can reach this endpoint, and /dev/shm does not
            // keep it after the process. shm names are `fi_shm://NAME` or
            // `fi_ns://NAME` for the file /dev/shm/NAME.
            let file = self
                .name
                .split(|&b| b == 0)
                .next()
                .map(|n| match n.windows(3).position(|w| w == b"://") {
                    Some(i) => &n[i + 3..],
                    None => n,
                })
                .and_then(|n| CString::new(n).ok());
            if let Some(file) = file {
                // SAFETY: file is a NUL-terminated string; shm_unlink only
                // removes a name.
                unsafe { libc::shm_unlink(file.as_ptr()) };
            }
            // The provider may still write into the receive slots and read
            // the transmit slots: they live as long as the process.
            std::mem::forget(std::mem::take(&mut self.rx));
            self.rma.leak();
            std::mem::forget(std::mem::replace(&mut self.tx.buffers, Buffers::new(0, 0)));
            return;
        }
        // Endpoint first (the provider stops touching the buffers), then the
        // registrations and the address vector.
        close(self.ep as *mut sys::fid);
        self.rma.close_all();
        self.tx.buffers.close_mr();
        for b in &mut self.rx {
            b.close_mr();
        }
        close(self.av as *mut sys::fid);
    }
}

/// Why `verbs;ofi_rxm` endpoints fail `fi_enable` on Soft-RoCE (measured in
/// the QEMU guest, docs/GUEST.md).
const RXM_VERBS_CQ_LIMIT: &str = "ofi_rxm (libfabric 1.17) opens its verbs completion queue with \
(MSG rx size + tx size) x FI_UNIVERSE_SIZE entries, (128 + 128) x 256 = 65536 by default, and the \
device refuses more than its max_cqe (Soft-RoCE rxe: 32767), so ibv_create_cq fails \
(\"vrb_cq_open: Unable to create verbs CQ\"); FI_UNIVERSE_SIZE=64 makes it fit, but then \
libfabric 1.17 crashes (SIGSEGV) closing the endpoints over rxe: use FI_EP_MSG \
(fabric+verbs:// without ?ep=rdm)";

impl Net {
    /// Turns an `fi_enable` failure whose cause is known into an error that
    /// says it ([`FabricError::ProviderLimit`]); others pass unchanged.
    fn known_enable_failure(&self, e: FabricError) -> FabricError {
        match e {
            FabricError::Call {
                op: "fi_enable",
                code,
                ..
            } if code == sys::FI_EINVAL as i32
                && self.ep == EpType::Rdm
                && self.provider.split(';').next() == Some("verbs") =>
            {
                FabricError::ProviderLimit {
                    provider: self.provider.clone(),
                    op: "fi_enable",
                    code,
                    why: RXM_VERBS_CQ_LIMIT,
                }
            }
            other => other,
        }
    }

    /// Opens an RDM endpoint. With `bind`, it is named after that address
    /// (`FI_SOURCE`: for `tcp;ofi_rxm` the socket it listens on, port 0
    /// picked by the provider; for `shm` the name `fi_ns://IP:PORT`); without,
    /// the provider picks an anonymous name. The receive pool starts with one
    /// block of `rx_block` slots (see [`RdmEp::grow_rx`]).
    pub fn rdm_endpoint(
        &mut self,
        bind: Option<SocketAddr>,
        tx_slots: usize,
        rx_block: usize,
        slot_size: usize,
    ) -> Result<RdmEp, FabricError> {
        // On this Net's domain (the provider's first one may belong to
        // another device: verbs); a bound address another domain serves is
        // `OtherDomain`, not the bare -FI_EINVAL of an endpoint opened
        // from that domain's info.
        let info = match bind {
            Some(addr) => self.info_on_domain(Site::Local(addr))?,
            None => getinfo_on(
                &self.provider,
                EpType::Rdm,
                None,
                false,
                self.rma,
                Some(&self.domain()),
            )?,
        };
        let mut ep = RdmEp {
            ep: ptr::null_mut(),
            av: ptr::null_mut(),
            mr_local: self.mr.local,
            addr_format: 0,
            name: Vec::new(),
            tx: TxSide::new(Buffers::new(tx_slots, slot_size)),
            rx: Vec::new(),
            rx_block,
            slot_size,
            inject_size: 0,
            leak: self.leak,
            rma: self.rma_regions(),
            net: self.objects.clone(),
        };
        let o = &self.objects;
        // SAFETY: info is valid; the CQ and domain outlive the endpoint (it
        // holds them open: `RdmEp::net`); ep's Drop closes what was opened,
        // endpoint before buffers.
        unsafe {
            ep.addr_format = (*info.0).addr_format;
            let tx_attr = (*info.0).tx_attr;
            if !tx_attr.is_null() {
                ep.inject_size = (*tx_attr).inject_size;
            }
            ep.tx.in_place = sends_in_place(ep.mr_local, tx_attr);
            let mut av_attr = sys::fi_av_attr {
                type_: sys::FI_AV_MAP,
                ..Default::default()
            };
            check(
                "fi_av_open",
                sys::fi_av_open(o.domain, &mut av_attr, &mut ep.av, ptr::null_mut()) as isize,
            )?;
            check(
                "fi_endpoint",
                sys::fi_endpoint(o.domain, info.0, &mut ep.ep, ptr::null_mut()) as isize,
            )?;
            bind_and_enable(ep.ep, ep.av as *mut sys::fid, "fi_ep_bind(av)", o.cq)
                .map_err(|e| self.known_enable_failure(e))?;
            if self.mr.local {
                ep.tx.buffers.register(o.domain, u64::from(sys::FI_SEND))?;
            }
            let mut raw = [0u8; MAX_NAME_LEN];
            let mut len = raw.len();
            check(
                "fi_getname",
                sys::fi_getname(
                    ep.ep as *mut sys::fid,
                    raw.as_mut_ptr() as *mut c_void,
                    &mut len,
                ) as isize,
            )?;
            ep.name = raw[..len.min(raw.len())].to_vec();
        }
        ep.grow_rx()?;
        Ok(ep)
    }

    /// The endpoint name a peer bound to `addr` has (what
    /// [`Net::rdm_endpoint`] with `bind` gives it), for [`RdmEp::insert`].
    pub fn resolve(&self, addr: SocketAddr) -> Result<Vec<u8>, FabricError> {
        let info = getinfo(&self.provider, EpType::Rdm, Some(addr), false, self.rma)?;
        // SAFETY: dest_addr/dest_addrlen of a valid fi_info describe the
        // resolved address when set.
        let (p, len) = unsafe { ((*info.0).dest_addr as *const u8, (*info.0).dest_addrlen) };
        if p.is_null() || len == 0 || len > MAX_NAME_LEN {
            return Err(FabricError::Call {
                op: "fi_getinfo(resolve)",
                code: sys::FI_ENODATA as i32,
                msg: format!("no destination address for {addr}"),
            });
        }
        // SAFETY: p points to len readable bytes owned by info.
        Ok(unsafe { std::slice::from_raw_parts(p, len) }.to_vec())
    }
}

/// Inserts the one address `name` into `av`.
///
/// # Safety
/// `av` must be open, and `name` one address the provider reads within
/// its bounds.
pub(crate) unsafe fn av_insert(
    av: *mut sys::fid_av,
    name: &[u8],
) -> Result<sys::fi_addr_t, FabricError> {
    let mut out: sys::fi_addr_t = 0;
    // SAFETY: the caller's promises; `out` receives one fi_addr_t.
    let rc = unsafe {
        sys::fi_av_insert(
            av,
            name.as_ptr() as *const c_void,
            1,
            &mut out,
            0,
            ptr::null_mut(),
        )
    };
    if rc != 1 {
        return Err(FabricError::Call {
            op: "fi_av_insert",
            code: if rc < 0 { -rc } else { sys::FI_EINVAL as i32 },
            msg: if rc < 0 {
                strerror(-rc)
            } else {
                "address not inserted".into()
            },
        });
    }
    Ok(out)
}

impl SendSlots for RdmEp {
    fn tx_side(&self) -> &TxSide {
        &self.tx
    }

    fn tx_side_mut(&mut self) -> &mut TxSide {
        &mut self.tx
    }
}

impl RdmEp {
    /// This endpoint's name (`fi_getname`), what peers pass to [`RdmEp::insert`].
    pub fn name(&self) -> &[u8] {
        &self.name
    }

    /// The name as an IP socket address, when the provider's names are sockaddrs.
    pub fn name_as_socket(name: &[u8]) -> Option<SocketAddr> {
        sockaddr(name.as_ptr(), name.len())
    }

    /// Adds a peer to the address vector. `name` comes from the wire: it is
    /// checked to be something the provider reads within bounds (a string
    /// with its NUL, or at least as long as our own name).
    pub fn insert(&mut self, name: &[u8]) -> Result<PeerAddr, FabricError> {
        let bad = |why: &str| FabricError::Call {
            op: "fi_av_insert",
            code: sys::FI_EINVAL as i32,
            msg: format!("peer name rejected: {why}"),
        };
        if name.len() > MAX_NAME_LEN {
            return Err(bad("too long"));
        }
        if self.addr_format == sys::FI_ADDR_STR {
            if !name.contains(&0) {
                return Err(bad("not NUL-terminated"));
            }
        } else if name.len() < self.name.len() {
            return Err(bad("shorter than an address of this provider"));
        }
        // SAFETY: the AV is open; `name` holds one address the provider
        // reads within its bounds (checked above).
        unsafe { av_insert(self.av, name) }.map(PeerAddr)
    }

    /// Removes a peer (no operation to it may be in flight). A failure is
    /// harmless (the entry stays until the endpoint closes); it is returned
    /// for the caller to log.
    pub fn remove(&mut self, peer: PeerAddr) -> Result<(), FabricError> {
        let mut a = peer.0;
        // SAFETY: `a` is one fi_addr_t inserted in this AV.
        let rc = unsafe { sys::fi_av_remove(self.av, &mut a, 1, 0) };
        check("fi_av_remove", rc as isize).map(drop)
    }

    /// Adds a block of receive slots to the pool (registered if the provider
    /// wants `FI_MR_LOCAL`); returns the new slots' index range. The caller
    /// posts them.
    pub fn grow_rx(&mut self) -> Result<std::ops::Range<usize>, FabricError> {
        let mut b = Buffers::new(self.rx_block, self.slot_size);
        if self.mr_local {
            // SAFETY: the domain is open and outlives this endpoint (`net`).
            unsafe { b.register(self.net.domain, u64::from(sys::FI_RECV))? };
        }
        let start = self.rx_slots();
        self.rx.push(b);
        Ok(start..start + self.rx_block)
    }

    /// Receive slots in the pool.
    pub fn rx_slots(&self) -> usize {
        self.rx.len() * self.rx_block
    }

    /// Bytes per slot.
    pub fn slot_size(&self) -> usize {
        self.slot_size
    }

    fn rx_block(&mut self, slot: usize) -> Result<(&mut Buffers, usize), FabricError> {
        let block = self.rx_block;
        self.rx
            .get_mut(slot / block)
            .map(|b| (b, slot % block))
            .ok_or(FabricError::Slot(slot))
    }

    /// Posts receive slot `slot` (from any peer) with completion context `context`.
    pub fn post_recv(&mut self, slot: usize, context: u64) -> Result<(), FabricError> {
        let ep = self.ep;
        let (b, i) = self.rx_block(slot)?;
        post_recv(ep, b, i, FI_ADDR_UNSPEC, context)
    }

    /// A completed receive: frees the slot and returns its first `len` bytes.
    pub fn recv_done(&mut self, slot: usize, len: usize) -> &[u8] {
        match self.rx_block(slot) {
            Ok((b, i)) => b.done(i, len),
            Err(_) => &[],
        }
    }

    /// Sends the first `len` bytes of transmit slot `slot` to `to`. `Err`
    /// with [`is_again`](crate::is_again) means the provider's queue is full: retry later.
    pub fn send(
        &mut self,
        slot: usize,
        len: usize,
        to: PeerAddr,
        context: u64,
    ) -> Result<(), FabricError> {
        self.tx.send(self.ep, slot, len, to.0, context)
    }

    /// Sends the first `head` bytes of transmit slot `slot` followed by
    /// `body` to `to`, without copying `body` (`post_send_in_place`);
    /// [`FabricError::Slot`] where [`SendSlots::sends_in_place`] is false. `Err`
    /// with [`is_again`](crate::is_again): retry later.
    pub fn send_in_place(
        &mut self,
        slot: usize,
        head: usize,
        body: Bytes,
        to: PeerAddr,
        context: u64,
    ) -> Result<(), FabricError> {
        self.tx
            .send_in_place(self.ep, slot, head, body, to.0, context)
    }

    /// The largest send [`RdmEp::inject`] takes (`tx_attr.inject_size`;
    /// 0: the provider injects nothing).
    pub fn inject_size(&self) -> usize {
        self.inject_size
    }

    /// Sends the first `len` bytes of transmit slot `slot` to `to` by
    /// `fi_inject`: the provider has copied them when it returns and
    /// reports no completion, so the slot is free again at once. This is
    /// how a small send avoids the completion queue (a completion written
    /// by the provider and read back per message). `len` must be at most
    /// [`RdmEp::inject_size`]; `Err` with [`is_again`](crate::is_again): retry later.
    pub fn inject(&mut self, slot: usize, len: usize, to: PeerAddr) -> Result<(), FabricError> {
        if len > self.inject_size {
            return Err(FabricError::Call {
                op: "fi_inject",
                code: sys::FI_EMSGSIZE as i32,
                msg: format!("{len} bytes above the inject size {}", self.inject_size),
            });
        }
        let p = self.tx.buffers.idle_ptr(slot, len)?;
        // SAFETY: p points to `len` bytes of an idle slot of the endpoint's
        // transmit buffer, alive for the call; fi_inject copies them before
        // it returns and keeps no reference to them or to a context.
        let rc = unsafe { sys::fi_inject(self.ep, p as *const c_void, len, to.0) };
        check("fi_inject", rc)?;
        Ok(())
    }

    /// The endpoint's rendezvous buffers (for peers to read).
    pub fn rma(&mut self) -> &mut RmaBuffers {
        &mut self.rma
    }

    /// Starts reading the exposed buffer `x` of peer `from` into a new
    /// buffer of ours, at offset `at` of the bytes `around` (as
    /// [`Ep::read`](crate::Ep::read)), which the endpoint owns until
    /// [`RmaBuffers::read_done`] with the same `context`.
    pub fn read(
        &mut self,
        x: &Exposed,
        from: PeerAddr,
        context: u64,
        around: &[u8],
        at: usize,
    ) -> Result<(), FabricError> {
        self.rma.read(self.ep, x, from.0, context, around, at)
    }

    /// Starts writing our held unit `id` into the buffer peer `to` granted
    /// (`landing`), as [`Ep::write`](crate::Ep::write).
    pub fn write(
        &mut self,
        id: u32,
        to: PeerAddr,
        landing: Landing,
        context: u64,
    ) -> Result<(), FabricError> {
        self.rma.write(self.ep, id, to.0, landing, context)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::is_again;
    use crate::net::Completion;

    /// An anonymous RDM endpoint reaches one bound to a loopback address by
    /// resolving it, sends its own name, and the bound one answers by that name.
    fn rdm_exchange(provider: &str, port: u16) {
        let mut net = Net::open(provider, EpType::Rdm, 64).unwrap();
        assert!(net.eq_fd().unwrap().is_none());
        let bind: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let mut server = net.rdm_endpoint(Some(bind), 2, 2, 512).unwrap();
        let mut client = net.rdm_endpoint(None, 2, 2, 512).unwrap();
        // Port 0: the provider picked one, found in the name (sockaddr names).
        let bound = RdmEp::name_as_socket(server.name()).unwrap_or(bind);
        let server_name = net.resolve(bound).unwrap();
        assert_eq!(
            server_name,
            server.name(),
            "{provider}: resolve gives the bound name"
        );
        server.post_recv(0, 1).unwrap();
        client.post_recv(0, 2).unwrap();
        let to_server = client.insert(&server_name).unwrap();
        let name = client.name().to_vec();
        client.tx_slot(0).unwrap()[..name.len()].copy_from_slice(&name);
        let t0 = std::time::Instant::now();
        let mut got = Vec::new();
        // -FI_EAGAIN until the provider has set up its connection: progress
        // (read the CQ) and retry.
        while let Err(e) = client.send(0, name.len(), to_server, 3) {
            assert!(
                is_again(&e) && t0.elapsed().as_secs() < 10,
                "{provider}: {e}"
            );
            net.read_cq(&mut got, 8).expect("fi_cq_read");
        }
        let mut answered = false;
        while !got.iter().any(|c: &Completion| c.context == 2) {
            assert!(
                t0.elapsed().as_secs() < 10,
                "{provider}: timed out: {got:?}"
            );
            let from = got.len();
            net.read_cq(&mut got, 8).expect("fi_cq_read");
            // A copy: answering reads the CQ into `got` again.
            let fresh: Vec<Completion> = got[from..].to_owned();
            for c in fresh {
                assert!(c.error.is_none(), "{provider}: {c:?}");
                if c.context == 1 && !answered {
                    let peer_name = server.recv_done(0, c.len).to_vec();
                    assert_eq!(peer_name, name);
                    let to_client = server.insert(&peer_name).unwrap();
                    server.tx_slot(0).unwrap()[..2].copy_from_slice(b"ok");
                    while let Err(e) = server.send(0, 2, to_client, 4) {
                        assert!(is_again(&e) && t0.elapsed().as_secs() < 10, "{e}");
                        net.read_cq(&mut got, 8).expect("fi_cq_read");
                    }
                    answered = true;
                }
            }
        }
        let c = got.iter().find(|c| c.context == 2).unwrap();
        assert_eq!(client.recv_done(0, c.len), b"ok");
        assert!(client.insert(b"no NUL and short").is_err() || provider != "shm");
    }

    #[test]
    fn rdm_tcp_rxm_exchange() {
        rdm_exchange("tcp;ofi_rxm", 0);
    }

    #[test]
    fn rdm_shm_exchange() {
        // A port from the OS keeps the shm name unique on this host.
        let reserve = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        rdm_exchange("shm", reserve.local_addr().unwrap().port());
    }
}
