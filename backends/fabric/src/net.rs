//! One provider opened for one worker ([`Net`]): fabric, domain, and the EQ
//! and CQ all its endpoints share, with wait fds for a mio Poll; endpoints
//! are opened in `msg` and `rdm`, their rendezvous buffers kept in `rma`.

use crate::error::{again_is_empty, check, strerror, FabricError, OtherDomain, Site};
use crate::info::{checks_keys, domain_name, getinfo, getinfo_on, leaks_on_drop, EpType, Info};
use crate::info::{MrMode, RmaChoice, RmaOp};
use crate::landing::{LandingPool, RmaGauge};
use libfabric_sys as sys;
use std::ffi::CStr;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::RawFd;
use std::os::raw::{c_int, c_void};
use std::ptr;
use std::sync::Arc;

pub(crate) fn close(fid: *mut sys::fid) {
    if !fid.is_null() {
        // SAFETY: fid is an open libfabric object owned by the caller, closed once.
        unsafe { sys::fi_close(fid) };
    }
}

/// Binds `ep` to `first` (its EQ or AV) and to `cq` for both directions,
/// then enables it.
///
/// # Safety
/// All three objects must be open and outlive the endpoint.
pub(crate) unsafe fn bind_and_enable(
    ep: *mut sys::fid_ep,
    first: *mut sys::fid,
    first_op: &'static str,
    cq: *mut sys::fid_cq,
) -> Result<(), FabricError> {
    check(first_op, sys::fi_ep_bind(ep, first, 0) as isize)?;
    check(
        "fi_ep_bind(cq)",
        sys::fi_ep_bind(
            ep,
            cq as *mut sys::fid,
            u64::from(sys::FI_TRANSMIT | sys::FI_RECV),
        ) as isize,
    )?;
    check("fi_enable", sys::fi_enable(ep) as isize)?;
    Ok(())
}

fn wait_fd(fid: *mut sys::fid) -> Result<RawFd, FabricError> {
    let mut fd: c_int = -1;
    // SAFETY: FI_GETWAIT on an EQ/CQ opened with FI_WAIT_FD writes one int.
    let rc = unsafe {
        sys::fi_control(
            fid,
            sys::FI_GETWAIT as c_int,
            &mut fd as *mut c_int as *mut c_void,
        )
    };
    check("fi_control(FI_GETWAIT)", rc as isize)?;
    Ok(fd)
}

/// An fd to watch so that a sleeping worker wakes for a CQ's completions
/// ([`Net::cq_wait_fds`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitFd {
    /// The fd.
    pub fd: RawFd,
    /// Watch it for writability too (the provider waits for room to send).
    pub writable: bool,
}

/// The libfabric objects a [`Net`] opens, which everything opened from
/// them needs open: shared (an `Arc`) by the Net and by every endpoint,
/// listener and kept registration made from it, and closed — queues,
/// domain, fabric — when the last of them goes. So no order of drops can
/// close the domain or a queue under an endpoint (which crashed the
/// provider when a Net went before its endpoints: `what_a_net_opened_outlives_it`).
pub(crate) struct NetObjects {
    pub(crate) fabric: *mut sys::fid_fabric,
    pub(crate) domain: *mut sys::fid_domain,
    /// Null for RDM (no connection management).
    pub(crate) eq: *mut sys::fid_eq,
    pub(crate) cq: *mut sys::fid_cq,
    /// Never close (see the crate docs: `shm`).
    leak: bool,
}

// SAFETY: plain handles, closed once, by Drop, on whichever thread drops
// the last holder; shared references reach only their values (each holder
// uses them through its own `&mut self`, on one thread at a time, as for
// `Net`).
unsafe impl Send for NetObjects {}
// SAFETY: as above.
unsafe impl Sync for NetObjects {}

impl Drop for NetObjects {
    fn drop(&mut self) {
        if self.leak {
            return;
        }
        close(self.cq as *mut sys::fid);
        close(self.eq as *mut sys::fid);
        close(self.domain as *mut sys::fid);
        close(self.fabric as *mut sys::fid);
    }
}

/// One opened provider: fabric, domain, one EQ (`FI_WAIT_FD`) and one CQ
/// (`FI_WAIT_POLLFD` where the provider offers it, else `FI_WAIT_FD`, or
/// none: [`CqWait`]). What is opened from it (endpoints, listeners, kept
/// registrations) may be dropped before or after it.
pub struct Net {
    info: Info,
    /// Whether the CQ has a wait object (else it must be polled).
    cq_waitable: bool,
    /// The CQ's wait object is a list of fds (`FI_WAIT_POLLFD`), not one.
    cq_pollfd: bool,
    /// Room for that list ([`Net::cq_wait_fds`]).
    pollfds: Vec<sys::pollfd>,
    /// Whether endpoint names are IP socket addresses (`tcp`), not strings (`shm`).
    socket_names: bool,
    /// Never close (see the crate docs: `shm`).
    pub(crate) leak: bool,
    /// The one-sided operation endpoints have for the rendezvous, if any.
    pub(crate) rma: Option<RmaOp>,
    /// What registrations must honour (`mr_mode`, checked keys).
    pub(crate) mr: MrMode,
    pub(crate) provider: String,
    pub(crate) ep: EpType,
    pub(crate) rma_gauge: Arc<RmaGauge>,
    pub(crate) landings: Arc<LandingPool>,
    /// Last: registered landing buffers close before the domain.
    pub(crate) objects: Arc<NetObjects>,
}

// SAFETY: the libfabric objects are only used through &mut self / owned
// values on one thread at a time (FI_THREAD_DOMAIN); moving them between
// threads (the messenger builds a transport, then hands it to its worker) is
// allowed by libfabric.
unsafe impl Send for Net {}

impl std::fmt::Debug for Net {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Net")
            .field("provider", &self.provider)
            .field("ep", &self.ep)
            .field("mr", &self.mr)
            .field("cq_waitable", &self.cq_waitable)
            .finish()
    }
}

/// A completion: the caller's context, the bytes received (receives), and
/// whether it is a receive.
#[derive(Clone, Copy, Debug)]
pub struct Completion {
    /// The context the operation was posted with.
    pub context: u64,
    /// Bytes received (receives only).
    pub len: usize,
    /// A receive (else a send).
    pub recv: bool,
    /// `Some(error text)` for an error completion.
    pub error: Option<(i32, &'static str)>,
}

/// A pending connection request, the key of the listener it came to
/// ([`PassiveEp::key`](crate::PassiveEp::key)) and the data the connector passed to
/// [`Net::connect`].
pub struct ConnReq(pub(crate) Info, pub(crate) usize, pub(crate) Vec<u8>);

// SAFETY: an fi_info is plain data owned by this value.
unsafe impl Send for ConnReq {}

impl std::fmt::Debug for ConnReq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ConnReq")
    }
}

impl ConnReq {
    /// The key of the listener the request came to ([`PassiveEp::key`](crate::PassiveEp::key)).
    pub fn listener(&self) -> usize {
        self.1
    }

    /// The data the connector passed to [`Net::connect`] (empty if none).
    pub fn data(&self) -> &[u8] {
        &self.2
    }

    /// The requester's address, when the provider reports it.
    pub fn peer(&self) -> Option<SocketAddr> {
        // SAFETY: the info from an FI_CONNREQ event is valid; dest_addr/len
        // describe the peer's address when set.
        unsafe {
            let i = &*self.0 .0;
            sockaddr(i.dest_addr as *const u8, i.dest_addrlen)
        }
    }
}

/// Connection-management events.
#[derive(Debug)]
pub enum CmEvent {
    /// An incoming connection request; pass it to [`Net::accept`] or to its
    /// listener's [`PassiveEp::reject`](crate::PassiveEp::reject).
    ConnReq(ConnReq),
    /// The endpoint with this key is connected; on the connecting side
    /// with the data the acceptor passed to [`Net::accept`] (empty if none).
    Connected(usize, Vec<u8>),
    /// The endpoint with this key was shut down by the peer.
    Shutdown(usize),
    /// An error on the endpoint with this key (0: not tied to one).
    Error(usize, String),
}

pub(crate) fn sockaddr(p: *const u8, len: usize) -> Option<SocketAddr> {
    if p.is_null() {
        return None;
    }
    // SAFETY: the caller passes a pointer to `len` readable bytes.
    let b = unsafe { std::slice::from_raw_parts(p, len) };
    if b.len() >= 16 && u16::from_ne_bytes([b[0], b[1]]) == libc::AF_INET as u16 {
        let port = u16::from_be_bytes([b[2], b[3]]);
        let ip = Ipv4Addr::new(b[4], b[5], b[6], b[7]);
        return Some(SocketAddr::V4(SocketAddrV4::new(ip, port)));
    }
    if b.len() >= 28 && u16::from_ne_bytes([b[0], b[1]]) == libc::AF_INET6 as u16 {
        let port = u16::from_be_bytes([b[2], b[3]]);
        let mut ip = [0u8; 16];
        ip.copy_from_slice(&b[8..24]);
        return Some(SocketAddr::V6(SocketAddrV6::new(
            Ipv6Addr::from(ip),
            port,
            0,
            0,
        )));
    }
    None
}

impl Net {
    /// Opens `provider` with `ep` endpoints: fabric, domain, EQ and CQ, on
    /// the first domain the provider lists.
    pub fn open(provider: &str, ep: EpType, cq_size: usize) -> Result<Net, FabricError> {
        Self::open_at(provider, ep, cq_size, None, RmaChoice::IfSound)
    }

    /// [`Net::open`] on the domain that serves `site` (with `None`, the first
    /// the provider lists): `verbs` has one domain per RDMA device and opens
    /// an endpoint only on the domain owning its address. `rma` says which
    /// one-sided operation endpoints get for the rendezvous ([`Net::rma`]
    /// tells).
    pub fn open_at(
        provider: &str,
        ep: EpType,
        cq_size: usize,
        site: Option<Site>,
        rma: RmaChoice,
    ) -> Result<Net, FabricError> {
        Self::open_with(provider, ep, cq_size, site, rma, CqWait::Fd)
    }

    /// [`Net::open_at`] with the CQ's wait object chosen: under
    /// [`CqWait::Poll`] the CQ has none (as under a provider without wait
    /// objects: [`Net::cq_fd`] is `None` and the caller polls it).
    pub fn open_with(
        provider: &str,
        ep: EpType,
        cq_size: usize,
        site: Option<Site>,
        rma: RmaChoice,
        cq_wait: CqWait,
    ) -> Result<Net, FabricError> {
        let (addr, source) = site.map_or((None, false), Site::hint);
        // Endpoints get the first rendezvous operation wanted that the
        // provider has (decided once per Net).
        let with_rma = rma.wanted(provider).iter().find_map(|&op| {
            getinfo(provider, ep, addr, source, Some(op))
                .ok()
                .map(|i| (i, Some(op)))
        });
        let (info, rma) = match with_rma {
            Some(found) => found,
            None => (getinfo(provider, ep, addr, source, None)?, None),
        };
        // The first domain that opens: `verbs;ofi_rxm` lists rxe0 (on lo)
        // first, and its fi_domain fails (rdma_cm cannot resolve loopback
        // addresses) while rxe1's opens.
        let mut tried = Vec::new();
        let mut entry = info.0;
        while !entry.is_null() {
            // SAFETY: entry is an element of the list `info` owns (alive for
            // the loop); fi_dupinfo copies that one entry (its `next` null).
            let (one, next) = unsafe { (Info(sys::fi_dupinfo(entry)), (*entry).next) };
            if one.0.is_null() {
                break;
            }
            // SAFETY: one is a valid fi_info (fi_dupinfo).
            let domain = unsafe { domain_name(one.0) };
            match Self::open_info(provider, ep, cq_size, one, rma, cq_wait) {
                Ok(net) => return Ok(net),
                Err(e) => tried.push(format!("domain `{domain}`: {e}")),
            }
            entry = next;
        }
        Err(FabricError::NoDomain {
            provider: provider.to_owned(),
            tried: tried.join("; "),
        })
    }

    /// Opens fabric, domain, EQ (MSG) and CQ from one `fi_info` entry.
    fn open_info(
        provider: &str,
        ep: EpType,
        cq_size: usize,
        info: Info,
        rma: Option<RmaOp>,
        cq_wait: CqWait,
    ) -> Result<Net, FabricError> {
        let leak = leaks_on_drop(provider);
        let mut net = Net {
            info,
            cq_waitable: cq_wait == CqWait::Fd,
            cq_pollfd: false,
            pollfds: Vec::new(),
            socket_names: false,
            leak,
            rma,
            mr: MrMode::default(),
            provider: provider.to_owned(),
            ep,
            rma_gauge: Arc::default(),
            landings: Arc::default(),
            objects: Arc::new(NetObjects {
                fabric: ptr::null_mut(),
                domain: ptr::null_mut(),
                eq: ptr::null_mut(),
                cq: ptr::null_mut(),
                leak,
            }),
        };
        let Some(o) = Arc::get_mut(&mut net.objects) else {
            unreachable!("not shared while it is opened");
        };
        // SAFETY: info is a valid fi_info from fi_getinfo; each out-pointer is
        // a field of `o`, closed by its Drop if set.
        unsafe {
            let i = &*net.info.0;
            let mr_mode = (*i.domain_attr).mr_mode as u32;
            net.mr = MrMode::new(mr_mode, checks_keys(provider));
            net.socket_names = matches!(
                i.addr_format,
                sys::FI_SOCKADDR | sys::FI_SOCKADDR_IN | sys::FI_SOCKADDR_IN6
            );
            check(
                "fi_fabric",
                sys::fi_fabric(i.fabric_attr, &mut o.fabric, ptr::null_mut()) as isize,
            )?;
            check(
                "fi_domain",
                sys::fi_domain(o.fabric, net.info.0, &mut o.domain, ptr::null_mut()) as isize,
            )?;
            if ep == EpType::Msg {
                let mut eq_attr = sys::fi_eq_attr {
                    size: 256,
                    wait_obj: sys::FI_WAIT_FD,
                    ..Default::default()
                };
                check(
                    "fi_eq_open",
                    sys::fi_eq_open(o.fabric, &mut eq_attr, &mut o.eq, ptr::null_mut()) as isize,
                )?;
            }
            let mut cq_attr = sys::fi_cq_attr {
                size: cq_size,
                format: sys::FI_CQ_FORMAT_MSG,
                wait_obj: sys::FI_WAIT_FD,
                ..Default::default()
            };
            let mut rc = -(sys::FI_ENOSYS as c_int);
            if net.cq_waitable {
                // A list of the provider's own fds (`tcp`: its sockets and a
                // signal) rather than an epoll set holding them: the caller
                // watches them only while it sleeps, and while it spins no
                // socket is in any epoll set, whose wake-up callback every
                // arriving segment would run (wait_fd.rs in the backend).
                cq_attr.wait_obj = sys::FI_WAIT_POLLFD;
                rc = sys::fi_cq_open(o.domain, &mut cq_attr, &mut o.cq, ptr::null_mut());
                net.cq_pollfd = rc == 0;
                cq_attr.wait_obj = sys::FI_WAIT_FD;
            } else {
                cq_attr.wait_obj = sys::FI_WAIT_NONE;
            }
            if rc != 0 {
                // Nothing of the refused attempt is closed by Drop.
                o.cq = ptr::null_mut();
                rc = sys::fi_cq_open(o.domain, &mut cq_attr, &mut o.cq, ptr::null_mut());
            }
            if rc == -(sys::FI_ENOSYS as c_int) && net.cq_waitable {
                // No wait objects in this provider: a polled CQ.
                cq_attr.wait_obj = sys::FI_WAIT_NONE;
                net.cq_waitable = false;
                rc = sys::fi_cq_open(o.domain, &mut cq_attr, &mut o.cq, ptr::null_mut());
            }
            check("fi_cq_open", rc as isize)?;
        }
        Ok(net)
    }

    /// Whether endpoint names are IP socket addresses (an endpoint bound to
    /// port 0 gets a port from the OS), rather than strings such as `shm`'s
    /// `fi_ns://IP:PORT`, where the port is only part of a name.
    pub fn socket_names(&self) -> bool {
        self.socket_names
    }

    /// The one-sided operation endpoints have for the rendezvous, if any:
    /// reads of peers' exposed buffers ([`RmaBuffers::expose`](crate::RmaBuffers::expose),
    /// [`Ep::read`](crate::Ep::read), [`RdmEp::read`](crate::RdmEp::read)) or writes into buffers peers grant
    /// ([`RmaBuffers::grant`](crate::RmaBuffers::grant), [`Ep::write`](crate::Ep::write), [`RdmEp::write`](crate::RdmEp::write)).
    pub fn rma(&self) -> Option<RmaOp> {
        self.rma
    }

    /// Whether endpoints are never closed (`shm`, see the crate docs).
    pub fn never_closes(&self) -> bool {
        self.leak
    }

    /// The provider's inject size: the largest send it completes by copying,
    /// without the receiver's help (`tx_attr.inject_size`).
    pub fn inject_size(&self) -> usize {
        // SAFETY: info is a valid fi_info from fi_getinfo with a tx_attr.
        unsafe {
            let i = &*self.info.0;
            if i.tx_attr.is_null() {
                0
            } else {
                (*i.tx_attr).inject_size
            }
        }
    }

    /// Whether buffers must be registered (`FI_MR_LOCAL`).
    pub fn mr_local(&self) -> bool {
        self.mr.local
    }

    /// The EQ's wait fd (readable when connection events may be waiting);
    /// `None` for RDM, which has no EQ.
    pub fn eq_fd(&self) -> Result<Option<RawFd>, FabricError> {
        if self.objects.eq.is_null() {
            return Ok(None);
        }
        wait_fd(self.objects.eq as *mut sys::fid).map(Some)
    }

    /// Whether the CQ has no wait object and must be polled
    /// ([`CqWait::Poll`], or a provider without wait objects).
    pub fn cq_polled(&self) -> bool {
        !self.cq_waitable
    }

    /// The CQ's one wait fd (readable when completions may be waiting), if
    /// its wait object is one fd; `None` when it is a list
    /// ([`Net::cq_wait_fds`]) or the CQ must be polled.
    pub fn cq_fd(&self) -> Result<Option<RawFd>, FabricError> {
        if !self.cq_waitable || self.cq_pollfd {
            return Ok(None);
        }
        wait_fd(self.objects.cq as *mut sys::fid).map(Some)
    }

    /// Replaces `out` with the fds a sleeping caller must watch to wake for
    /// the CQ's completions: its one wait fd, or the provider's current list
    /// (`FI_WAIT_POLLFD`: endpoints' sockets come and go with them); empty
    /// for a polled CQ. Call it right before sleeping, after a poll of the
    /// queues, and [`Net::try_wait`] after watching them.
    pub fn cq_wait_fds(&mut self, out: &mut Vec<WaitFd>) -> Result<(), FabricError> {
        out.clear();
        if !self.cq_pollfd {
            if let Some(fd) = self.cq_fd()? {
                out.push(WaitFd {
                    fd,
                    writable: false,
                });
            }
            return Ok(());
        }
        loop {
            let mut list = sys::fi_wait_pollfd {
                change_index: 0,
                nfds: self.pollfds.len(),
                fd: self.pollfds.as_mut_ptr(),
            };
            // SAFETY: FI_GETWAIT on a CQ opened with FI_WAIT_POLLFD takes an
            // fi_wait_pollfd; the provider writes at most `nfds` pollfds at
            // `fd` (self.pollfds has that many) and sets `nfds` to how many
            // there are, failing with -FI_ETOOSMALL if they do not fit.
            let rc = unsafe {
                sys::fi_control(
                    self.objects.cq as *mut sys::fid,
                    sys::FI_GETWAIT as c_int,
                    &mut list as *mut sys::fi_wait_pollfd as *mut c_void,
                )
            };
            if rc == -(sys::FI_ETOOSMALL as c_int) && list.nfds > self.pollfds.len() {
                self.pollfds.resize(
                    list.nfds,
                    sys::pollfd {
                        fd: -1,
                        events: 0,
                        revents: 0,
                    },
                );
                continue;
            }
            check("fi_control(FI_GETWAIT)", rc as isize)?;
            let n = list.nfds.min(self.pollfds.len());
            out.extend(self.pollfds[..n].iter().map(|p| WaitFd {
                fd: p.fd,
                writable: p.events & libc::POLLOUT != 0,
            }));
            return Ok(());
        }
    }

    /// `fi_trywait` on the EQ and the CQ (if it has a wait fd): true if it
    /// is safe to block on their fds (nothing is pending inside the
    /// provider); false means poll again. With neither (a polled CQ, no
    /// EQ) true: nothing can be armed, and the caller polls on a timer.
    pub fn try_wait(&mut self) -> bool {
        let mut fids = [ptr::null_mut::<sys::fid>(); 2];
        let mut count = 0;
        for (fid, waitable) in [
            (self.objects.cq as *mut sys::fid, self.cq_waitable),
            (self.objects.eq as *mut sys::fid, !self.objects.eq.is_null()),
        ] {
            if waitable {
                fids[count] = fid;
                count += 1;
            }
        }
        if count == 0 {
            return true;
        }
        // SAFETY: the first `count` fids are open, have wait objects and
        // belong to this fabric.
        let rc = unsafe { sys::fi_trywait(self.objects.fabric, fids.as_mut_ptr(), count as c_int) };
        rc == 0
    }

    /// Reads up to `max` (at most 32) completions, appended to `out`; returns
    /// how many (0: none yet). An error completion comes as one entry with
    /// its `error` set. `Err` means the queue itself could not be read
    /// (`fi_cq_read` or `fi_cq_readerr` failed with anything but
    /// `-FI_EAGAIN`): its operations' fates are unknown, so the caller must
    /// not go on as if it were merely empty — a CQ that kept failing would
    /// otherwise stall every endpoint on it without a word.
    pub fn read_cq(&mut self, out: &mut Vec<Completion>, max: usize) -> Result<usize, FabricError> {
        // Not zeroed: the provider writes the entries it returns, and only
        // those are read (zeroing 1 KiB was a tenth of an idle poll's cost).
        let mut raw = [const { std::mem::MaybeUninit::<sys::fi_cq_msg_entry>::uninit() }; 32];
        let want = max.min(raw.len());
        // SAFETY: raw has room for `want` fi_cq_msg_entry (the CQ's format).
        let n = unsafe { sys::fi_cq_read(self.objects.cq, raw.as_mut_ptr() as *mut c_void, want) };
        if n > 0 {
            let n = (n as usize).min(want);
            for e in &raw[..n] {
                // SAFETY: fi_cq_read wrote the first `n` entries.
                let e = unsafe { e.assume_init_ref() };
                out.push(Completion {
                    context: e.op_context as u64,
                    len: e.len,
                    recv: e.flags & u64::from(sys::FI_RECV) != 0,
                    error: None,
                });
            }
            return Ok(n);
        }
        if n != -(sys::FI_EAVAIL as isize) {
            return again_is_empty("fi_cq_read", n);
        }
        let mut err = sys::fi_cq_err_entry::default();
        // SAFETY: err is a valid fi_cq_err_entry; err_data stays null so
        // the provider uses its own buffer.
        let k = unsafe { sys::fi_cq_readerr(self.objects.cq, &mut err, 0) };
        if k <= 0 {
            return again_is_empty("fi_cq_readerr", k);
        }
        out.push(Completion {
            context: err.op_context as u64,
            len: 0,
            recv: err.flags & u64::from(sys::FI_RECV) != 0,
            error: Some((err.err, "completion error")),
        });
        Ok(1)
    }

    /// Reads one connection-management event, if any (never for RDM).
    /// `Err` means the queue itself could not be read (as for
    /// [`Net::read_cq`]): connection events may be lost.
    pub fn read_eq(&mut self) -> Result<Option<CmEvent>, FabricError> {
        if self.objects.eq.is_null() {
            return Ok(None);
        }
        let mut buf = [0u64; 32];
        let mut event: u32 = 0;
        // SAFETY: buf is 256 bytes, large enough for an fi_eq_cm_entry.
        let n = unsafe {
            sys::fi_eq_read(
                self.objects.eq,
                &mut event,
                buf.as_mut_ptr() as *mut c_void,
                std::mem::size_of_val(&buf),
                0,
            )
        };
        if n == -(sys::FI_EAVAIL as isize) {
            let mut err = sys::fi_eq_err_entry::default();
            // SAFETY: err is a valid fi_eq_err_entry.
            let k = unsafe { sys::fi_eq_readerr(self.objects.eq, &mut err, 0) };
            if k > 0 {
                return Ok(Some(CmEvent::Error(err.fid as usize, strerror(err.err))));
            }
            return again_is_empty("fi_eq_readerr", k).map(|_| None);
        }
        if n <= 0 {
            return again_is_empty("fi_eq_read", n).map(|_| None);
        }
        // SAFETY: a successful read wrote an fi_eq_cm_entry for CM events.
        let entry = unsafe { &*(buf.as_ptr() as *const sys::fi_eq_cm_entry) };
        // Connection data follows the entry: the read's length says how much.
        let data = || -> Vec<u8> {
            let head = std::mem::size_of::<sys::fi_eq_cm_entry>();
            let end = (n as usize).min(std::mem::size_of_val(&buf));
            let bytes = buf.iter().flat_map(|w| w.to_ne_bytes());
            bytes.take(end).skip(head).collect()
        };
        Ok(match event {
            sys::FI_CONNREQ => Some(CmEvent::ConnReq(ConnReq(
                Info(entry.info),
                entry.fid as usize,
                data(),
            ))),
            sys::FI_CONNECTED => {
                if !entry.info.is_null() {
                    drop(Info(entry.info));
                }
                Some(CmEvent::Connected(entry.fid as usize, data()))
            }
            sys::FI_SHUTDOWN => Some(CmEvent::Shutdown(entry.fid as usize)),
            other => Some(CmEvent::Error(
                entry.fid as usize,
                format!("unexpected EQ event {other}"),
            )),
        })
    }

    /// The full name of the provider this Net opened, layers included:
    /// `tcp;ofi_rxm` where RDM endpoints over `tcp` were asked for by the
    /// core's name. Decisions about a layer's own protocol (its eager limit,
    /// [`eager_limit`](crate::eager_limit)) take this name, not the one asked for.
    pub fn provider_name(&self) -> String {
        // SAFETY: self.info is the valid fi_info the fabric was opened from;
        // its fabric_attr and prov_name are checked before they are read.
        unsafe {
            let attr = (*self.info.0).fabric_attr;
            if attr.is_null() || (*attr).prov_name.is_null() {
                return self.provider.clone();
            }
            CStr::from_ptr((*attr).prov_name)
                .to_string_lossy()
                .into_owned()
        }
    }

    /// The name of the domain this Net opened (`rxe1` for `verbs`, an
    /// interface name for `tcp`).
    pub fn domain(&self) -> String {
        // SAFETY: self.info is the valid fi_info the domain was opened from.
        unsafe { domain_name(self.info.0) }
    }

    /// Whether endpoints for `site` can live on this Net's domain (`tcp`
    /// lists every interface as a domain for any address: always; `verbs`
    /// only the device rdma_cm resolves the address to).
    pub fn serves(&self, site: Site) -> bool {
        self.info_on_domain(site).is_ok()
    }

    /// `fi_getinfo` for `site` on this Net's domain; when the provider has
    /// none there but another domain serves `site`, the error is
    /// [`FabricError::OtherDomain`] naming both (an endpoint opened from the
    /// other domain's info fails with a bare `-FI_EINVAL`).
    pub(crate) fn info_on_domain(&self, site: Site) -> Result<Info, FabricError> {
        let (addr, source) = site.hint();
        let opened = self.domain();
        getinfo_on(
            &self.provider,
            self.ep,
            addr,
            source,
            self.rma,
            Some(&opened),
        )
        .map_err(|e| {
            match getinfo(&self.provider, self.ep, addr, source, self.rma) {
                Ok(info) => {
                    // SAFETY: info is a valid fi_info from fi_getinfo.
                    let wanted = unsafe { domain_name(info.0) };
                    FabricError::OtherDomain(Box::new(OtherDomain {
                        provider: self.provider.clone(),
                        site,
                        wanted,
                        opened,
                    }))
                }
                Err(_) => e,
            }
        })
    }
}

/// Whether a [`Net`]'s CQ has a wait object ([`Net::open_with`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CqWait {
    /// Fds the caller blocks on ([`Net::cq_wait_fds`]): the provider's own
    /// list (`FI_WAIT_POLLFD`) where it offers one, else one fd
    /// (`FI_WAIT_FD`). With one fd, `tcp` keeps its sockets in an epoll set
    /// (the fd), whose wake-up callback every arriving segment runs: a 64 B
    /// one-way measured 0.3 µs slower than polled; with the list, no slower.
    #[default]
    Fd,
    /// No wait object (`FI_WAIT_NONE`), as busy-polling tools open theirs:
    /// nothing to block on.
    Poll,
}
