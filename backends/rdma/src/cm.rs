//! rdma_cm: event channel and communication identifiers (connection set-up
//! for RoCE and iWARP; the data path is the ordinary QP of `qp.rs`).

use crate::cq::{set_nonblocking, wait_readable};
use crate::device::Context;
use crate::error::{RdmaError, Result};
use crate::pd::ProtectionDomain;
use crate::qp::{DestroysQp, QpInit, QueuePair};
use rdma_cm_sys as sys;
use std::ffi::CStr;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The channel rdma_cm reports connection events on. Its fd can be made
/// non-blocking and registered with mio.
#[derive(Debug)]
pub struct EventChannel {
    ch: NonNull<sys::rdma_event_channel>,
}

// SAFETY: the channel is a file descriptor; librdmacm is thread-safe.
unsafe impl Send for EventChannel {}
// SAFETY: as above.
unsafe impl Sync for EventChannel {}

/// Kinds of rdma_cm events.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmEventKind {
    /// `resolve_addr` finished: the id is bound to a local device.
    AddrResolved,
    /// Address resolution failed.
    AddrError,
    /// `resolve_route` finished: the id is ready to connect.
    RouteResolved,
    /// Route resolution failed.
    RouteError,
    /// A peer asks a listening id to connect; the event carries the new
    /// connection's id.
    ConnectRequest,
    /// The peer replied to a connect from an id whose QP rdma_cm did not
    /// create; the caller completes the connection itself.
    ConnectResponse,
    /// Setting up the connection failed.
    ConnectError,
    /// The peer could not be reached or did not answer the connect.
    Unreachable,
    /// The peer rejected the connection, or nothing listens there; `status`
    /// says why.
    Rejected,
    /// The connection is up and its QP can send.
    Established,
    /// The connection is closed (either side disconnected).
    Disconnected,
    /// The RDMA device the id uses is going away; destroy the id.
    DeviceRemoval,
    /// A disconnected connection's QP left timewait and may be reused.
    TimewaitExit,
    /// The local address the id is bound to moved to another device
    /// (e.g. a bonding failover).
    AddrChange,
    /// An event this layer does not name (raw `rdma_cm_event_type`).
    Other(u32),
}

impl CmEventKind {
    fn from_raw(v: sys::rdma_cm_event_type) -> Self {
        match v {
            sys::RDMA_CM_EVENT_ADDR_RESOLVED => Self::AddrResolved,
            sys::RDMA_CM_EVENT_ADDR_ERROR => Self::AddrError,
            sys::RDMA_CM_EVENT_ROUTE_RESOLVED => Self::RouteResolved,
            sys::RDMA_CM_EVENT_ROUTE_ERROR => Self::RouteError,
            sys::RDMA_CM_EVENT_CONNECT_REQUEST => Self::ConnectRequest,
            sys::RDMA_CM_EVENT_CONNECT_RESPONSE => Self::ConnectResponse,
            sys::RDMA_CM_EVENT_CONNECT_ERROR => Self::ConnectError,
            sys::RDMA_CM_EVENT_UNREACHABLE => Self::Unreachable,
            sys::RDMA_CM_EVENT_REJECTED => Self::Rejected,
            sys::RDMA_CM_EVENT_ESTABLISHED => Self::Established,
            sys::RDMA_CM_EVENT_DISCONNECTED => Self::Disconnected,
            sys::RDMA_CM_EVENT_DEVICE_REMOVAL => Self::DeviceRemoval,
            sys::RDMA_CM_EVENT_TIMEWAIT_EXIT => Self::TimewaitExit,
            sys::RDMA_CM_EVENT_ADDR_CHANGE => Self::AddrChange,
            o => Self::Other(o),
        }
    }
}

/// One rdma_cm event, copied out and already acknowledged.
#[derive(Debug)]
pub struct CmEvent {
    /// What happened.
    pub kind: CmEventKind,
    /// rdma_cm's name of the event (`RDMA_CM_EVENT_ESTABLISHED`).
    pub name: String,
    /// 0, or a negative errno / reject reason.
    pub status: i32,
    /// Identifies the CmId the event is for (compare with [`CmId::handle`]);
    /// for a `ConnectRequest`, the new connection's id.
    pub id_handle: usize,
    /// For a `ConnectRequest`: the listening id it came to (else 0).
    pub listen_handle: usize,
    /// The new connection of a `ConnectRequest`: accept or drop it.
    pub new_id: Option<CmId>,
    /// Private data of connect requests / responses / rejects.
    pub private_data: Vec<u8>,
    /// The peer's responder resources (connect events).
    pub responder_resources: u8,
    /// The peer's initiator depth (connect events).
    pub initiator_depth: u8,
}

impl EventChannel {
    /// Fails with [`RdmaError::NoDevice`] when the kernel has no rdma_cm.
    pub fn new() -> Result<Arc<Self>> {
        crate::error::clear_errno();
        // SAFETY: no arguments; NULL on failure with errno set.
        let ch = unsafe { sys::rdma_create_event_channel() };
        let ch = NonNull::new(ch).ok_or_else(|| RdmaError::last_os("rdma_create_event_channel"))?;
        Ok(Arc::new(EventChannel { ch }))
    }

    /// The channel's file descriptor: readable when an event is pending.
    /// Register it with mio after [`EventChannel::set_nonblocking`].
    pub fn fd(&self) -> RawFd {
        // SAFETY: live channel.
        unsafe { self.ch.as_ref().fd }
    }

    /// Makes [`EventChannel::get_event`] return `Ok(None)` instead of blocking.
    pub fn set_nonblocking(&self) -> Result<()> {
        set_nonblocking(self.fd(), "fcntl(rdma_cm channel)")
    }

    /// The next event; `Ok(None)` when non-blocking and there is none.
    pub fn get_event(self: &Arc<Self>) -> Result<Option<CmEvent>> {
        let mut ev: *mut sys::rdma_cm_event = std::ptr::null_mut();
        // SAFETY: live channel, valid out-pointer.
        if unsafe { sys::rdma_get_cm_event(self.ch.as_ptr(), &mut ev) } != 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::WouldBlock {
                return Ok(None);
            }
            return Err(RdmaError::from_os("rdma_get_cm_event", e));
        }
        // SAFETY: rdma_get_cm_event succeeded, so `ev` is a valid event until acked.
        let e = unsafe { &*ev };
        let kind = CmEventKind::from_raw(e.event);
        // SAFETY: conn is the active union member for the connection events
        // this layer reports private data for (RC, port space TCP).
        let conn = unsafe { e.param.conn };
        let private_data = if conn.private_data.is_null() || conn.private_data_len == 0 {
            Vec::new()
        } else {
            // SAFETY: private_data_len bytes at private_data, valid until the ack below.
            unsafe {
                std::slice::from_raw_parts(
                    conn.private_data.cast::<u8>(),
                    usize::from(conn.private_data_len),
                )
            }
            .to_vec()
        };
        let new_id = match kind {
            CmEventKind::ConnectRequest => NonNull::new(e.id).map(|id| CmId {
                inner: Arc::new(CmIdInner {
                    id,
                    has_qp: Mutex::new(false),
                    _channel: self.clone(),
                }),
            }),
            _ => None,
        };
        let out = CmEvent {
            kind,
            name: event_name(e.event),
            status: e.status,
            id_handle: e.id as usize,
            listen_handle: e.listen_id as usize,
            new_id,
            private_data,
            responder_resources: conn.responder_resources,
            initiator_depth: conn.initiator_depth,
        };
        // SAFETY: acknowledged exactly once; nothing borrowed from it survives.
        unsafe { sys::rdma_ack_cm_event(ev) };
        Ok(Some(out))
    }

    /// The next event, waiting at most `timeout`.
    pub fn next_event(self: &Arc<Self>, timeout: Duration) -> Result<CmEvent> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if !wait_readable(self.fd(), left)? {
                return Err(RdmaError::Timeout {
                    op: "rdma_cm event",
                    after: timeout,
                });
            }
            if let Some(ev) = self.get_event()? {
                return Ok(ev);
            }
        }
    }

    /// The next event, which must be `want` with status 0.
    pub fn expect(self: &Arc<Self>, want: CmEventKind, timeout: Duration) -> Result<CmEvent> {
        let ev = self.next_event(timeout)?;
        if ev.kind != want || ev.status != 0 {
            return Err(RdmaError::UnexpectedCmEvent {
                expected: format!("{want:?}"),
                got: ev.name,
                status: ev.status,
            });
        }
        Ok(ev)
    }
}

impl Drop for EventChannel {
    fn drop(&mut self) {
        // SAFETY: every CmId on this channel holds an Arc to it, so none is left.
        unsafe { sys::rdma_destroy_event_channel(self.ch.as_ptr()) };
    }
}

fn event_name(v: sys::rdma_cm_event_type) -> String {
    // SAFETY: returns a static string for any value.
    let p = unsafe { sys::rdma_event_str(v) };
    if p.is_null() {
        return format!("event {v}");
    }
    // SAFETY: non-null static NUL-terminated string.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// rdma_cm port spaces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PortSpace {
    /// Reliable connected (RC QPs); the one a messenger uses.
    Tcp,
    /// Unreliable datagram (UD QPs).
    Udp,
}

/// Connection parameters of connect / accept.
#[derive(Clone, Debug)]
pub struct ConnParam {
    /// Sent to the peer with the request / reply (at most 56 bytes on IB/RoCE).
    pub private_data: Vec<u8>,
    /// RDMA reads and atomics we accept outstanding from the peer.
    pub responder_resources: u8,
    /// RDMA reads and atomics we may have outstanding towards the peer.
    pub initiator_depth: u8,
    /// How often to retry a transfer the peer did not acknowledge in time (0-7).
    pub retry_count: u8,
    /// How often to retry after the peer had no receive posted
    /// (receiver not ready); 7 = forever.
    pub rnr_retry_count: u8,
}

impl Default for ConnParam {
    fn default() -> Self {
        ConnParam {
            private_data: Vec::new(),
            responder_resources: 1,
            initiator_depth: 1,
            retry_count: 7,
            rnr_retry_count: 7,
        }
    }
}

impl ConnParam {
    fn raw(&self) -> Result<sys::rdma_conn_param> {
        let len = u8::try_from(self.private_data.len())
            .map_err(|_| RdmaError::InvalidArgument("private data over 255 bytes".into()))?;
        Ok(sys::rdma_conn_param {
            private_data: if len == 0 {
                std::ptr::null()
            } else {
                self.private_data.as_ptr().cast()
            },
            private_data_len: len,
            responder_resources: self.responder_resources,
            initiator_depth: self.initiator_depth,
            flow_control: 0,
            retry_count: self.retry_count,
            rnr_retry_count: self.rnr_retry_count,
            srq: 0,
            qp_num: 0,
        })
    }
}

/// The shared part of a CmId (a QP made by rdma_create_qp keeps it alive).
#[derive(Debug)]
pub(crate) struct CmIdInner {
    id: NonNull<sys::rdma_cm_id>,
    has_qp: Mutex<bool>,
    _channel: Arc<EventChannel>,
}

// SAFETY: librdmacm ids may be used from any thread.
unsafe impl Send for CmIdInner {}
// SAFETY: as above.
unsafe impl Sync for CmIdInner {}

impl DestroysQp for CmIdInner {
    fn destroy_qp(&self) {
        let mut has = self.has_qp.lock().unwrap_or_else(|e| e.into_inner());
        if *has {
            // SAFETY: the QP was made by rdma_create_qp on this id; destroyed once.
            unsafe { sys::rdma_destroy_qp(self.id.as_ptr()) };
            *has = false;
        }
    }
}

impl Drop for CmIdInner {
    fn drop(&mut self) {
        // SAFETY: the QP (if any) holds an Arc to us, so it is gone; every
        // event was acknowledged in get_event. Destroyed once.
        unsafe { sys::rdma_destroy_id(self.id.as_ptr()) };
    }
}

/// An rdma_cm communication identifier: a listener or one connection.
#[derive(Debug)]
pub struct CmId {
    inner: Arc<CmIdInner>,
}

fn to_sockaddr(addr: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin) };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin6) };
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

/// Reads a socket address rdma_cm keeps in an id.
///
/// # Safety
/// `p` is null or points to a sockaddr whose family says how much follows
/// (rdma_cm's address unions are sockaddr_storage-sized).
unsafe fn from_sockaddr(p: *const sys::sockaddr) -> Option<SocketAddr> {
    if p.is_null() {
        return None;
    }
    // SAFETY: p points to at least a sockaddr header (caller's contract).
    let family =
        i32::from(unsafe { std::ptr::read_unaligned(p.cast::<libc::sockaddr>()) }.sa_family);
    match family {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let sin = unsafe { std::ptr::read_unaligned(p.cast::<libc::sockaddr_in>()) };
            Some(SocketAddr::new(
                std::net::Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes()).into(),
                u16::from_be(sin.sin_port),
            ))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let sin6 = unsafe { std::ptr::read_unaligned(p.cast::<libc::sockaddr_in6>()) };
            Some(SocketAddr::new(
                std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr).into(),
                u16::from_be(sin6.sin6_port),
            ))
        }
        _ => None,
    }
}

fn ms(d: Duration) -> i32 {
    i32::try_from(d.as_millis()).unwrap_or(i32::MAX).max(1)
}

impl CmId {
    /// Creates an id on `channel`: its events arrive there. Bind and
    /// listen for the passive side, or resolve and connect for the active
    /// side.
    pub fn new(channel: &Arc<EventChannel>, ps: PortSpace) -> Result<Self> {
        let ps = match ps {
            PortSpace::Tcp => sys::RDMA_PS_TCP,
            PortSpace::Udp => sys::RDMA_PS_UDP,
        };
        let mut id: *mut sys::rdma_cm_id = std::ptr::null_mut();
        // SAFETY: live channel, valid out-pointer.
        let ret =
            unsafe { sys::rdma_create_id(channel.ch.as_ptr(), &mut id, std::ptr::null_mut(), ps) };
        if ret != 0 {
            return Err(RdmaError::last_os("rdma_create_id"));
        }
        let id = NonNull::new(id).ok_or_else(|| RdmaError::last_os("rdma_create_id"))?;
        Ok(CmId {
            inner: Arc::new(CmIdInner {
                id,
                has_qp: Mutex::new(false),
                _channel: channel.clone(),
            }),
        })
    }

    fn ptr(&self) -> *mut sys::rdma_cm_id {
        self.inner.id.as_ptr()
    }

    /// Matches [`CmEvent::id_handle`] of events for this id.
    pub fn handle(&self) -> usize {
        self.ptr() as usize
    }

    fn check(ret: i32, op: &'static str) -> Result<()> {
        if ret != 0 {
            return Err(RdmaError::last_os(op));
        }
        Ok(())
    }

    /// The device this id is bound to (after bind to a device address,
    /// address resolution or a connect request); owned by rdma_cm and kept
    /// open by the returned context, which holds on to this id.
    pub fn context(&self) -> Option<Arc<Context>> {
        // SAFETY: live id; `verbs` is set by rdma_cm and lives as long as the id.
        NonNull::new(unsafe { (*self.ptr()).verbs })
            .map(|ctx| Context::borrowed(ctx, self.inner.clone()))
    }

    /// The device port this id uses.
    pub fn port_num(&self) -> u8 {
        // SAFETY: live id.
        unsafe { (*self.ptr()).port_num }
    }

    /// Binds the id to a local address; a specific (non-wildcard) address
    /// also binds it to that address's device, and port 0 picks a free
    /// port. Comes before [`CmId::listen`].
    pub fn bind_addr(&self, addr: SocketAddr) -> Result<()> {
        let (mut ss, _) = to_sockaddr(&addr);
        // SAFETY: live id; ss holds a valid sockaddr for the family.
        let ret = unsafe {
            sys::rdma_bind_addr(self.ptr(), (&mut ss as *mut libc::sockaddr_storage).cast())
        };
        Self::check(ret, "rdma_bind_addr")
    }

    /// The local address (after bind, resolution or a connect request); with
    /// port 0 bound, the port rdma_cm chose.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        // SAFETY: live id; the pointer is into the id's route and read at once.
        unsafe { from_sockaddr(sys::rdma_get_local_addr(self.ptr())) }
    }

    /// The peer's address (connections).
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        // SAFETY: as in local_addr.
        unsafe { from_sockaddr(sys::rdma_get_peer_addr(self.ptr())) }
    }

    /// Starts address resolution; completes with `AddrResolved` on the channel.
    pub fn resolve_addr(
        &self,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        timeout: Duration,
    ) -> Result<()> {
        let (mut d, _) = to_sockaddr(&dst);
        let mut s = src.map(|s| to_sockaddr(&s).0);
        let sp = s.as_mut().map_or(std::ptr::null_mut(), |s| {
            (s as *mut libc::sockaddr_storage).cast()
        });
        // SAFETY: live id; valid sockaddrs (or NULL source).
        let ret = unsafe {
            sys::rdma_resolve_addr(
                self.ptr(),
                sp,
                (&mut d as *mut libc::sockaddr_storage).cast(),
                ms(timeout),
            )
        };
        Self::check(ret, "rdma_resolve_addr")
    }

    /// Sets the local ACK timeout code (4.096 µs × 2^`code`, 0–31) that
    /// rdma_cm gives the QP when it moves it to RTS: how long a sent
    /// packet may go unacknowledged before it is sent again. Before
    /// `connect` or `accept`; without it rdma_cm derives one from the
    /// path. iWARP devices (whose transport retransmits on its own) may
    /// refuse it.
    pub fn set_ack_timeout(&self, code: u8) -> Result<()> {
        let mut value = code;
        // SAFETY: live id; the option's value is one u8, its size given.
        let ret = unsafe {
            sys::rdma_set_option(
                self.ptr(),
                sys::RDMA_OPTION_ID as i32,
                sys::RDMA_OPTION_ID_ACK_TIMEOUT as i32,
                (&mut value as *mut u8).cast(),
                1,
            )
        };
        Self::check(ret, "rdma_set_option(RDMA_OPTION_ID_ACK_TIMEOUT)")
    }

    /// Starts route resolution; completes with `RouteResolved`.
    pub fn resolve_route(&self, timeout: Duration) -> Result<()> {
        // SAFETY: live id.
        let ret = unsafe { sys::rdma_resolve_route(self.ptr(), ms(timeout)) };
        Self::check(ret, "rdma_resolve_route")
    }

    /// Listens for connections on the bound address; each arrives as a
    /// `ConnectRequest` event on the channel. `backlog` bounds how many
    /// requests may wait.
    pub fn listen(&self, backlog: i32) -> Result<()> {
        // SAFETY: live, bound id.
        let ret = unsafe { sys::rdma_listen(self.ptr(), backlog) };
        Self::check(ret, "rdma_listen")
    }

    /// Creates this connection's RC QP (rdma_cm moves it through its states
    /// during connect/accept). At most one per id.
    pub fn create_qp(&self, pd: &Arc<ProtectionDomain>, init: QpInit) -> Result<QueuePair> {
        let mut has = self.inner.has_qp.lock().unwrap_or_else(|e| e.into_inner());
        if *has {
            return Err(RdmaError::InvalidArgument(
                "this CmId already has a QP".into(),
            ));
        }
        let mut attr = init.raw();
        // SAFETY: live id and PD of the id's device; CQs kept alive by `init`.
        let ret = unsafe { sys::rdma_create_qp(self.ptr(), pd.as_ptr(), &mut attr) };
        Self::check(ret, "rdma_create_qp")?;
        // SAFETY: rdma_create_qp succeeded, so id->qp is set.
        let qp = NonNull::new(unsafe { (*self.ptr()).qp })
            .ok_or_else(|| RdmaError::InvalidArgument("rdma_create_qp left no QP".into()))?;
        *has = true;
        Ok(QueuePair::from_cm(
            qp,
            self.inner.clone(),
            pd,
            init,
            &attr.cap,
        ))
    }

    /// Active side: connect (after the route is resolved and the QP created);
    /// completes with `Established` (or `Rejected` / `Unreachable` ...).
    pub fn connect(&self, param: &ConnParam) -> Result<()> {
        let mut p = param.raw()?;
        // SAFETY: live id; p's private data lives across the call (copied by rdma_cm).
        let ret = unsafe { sys::rdma_connect(self.ptr(), &mut p) };
        Self::check(ret, "rdma_connect")
    }

    /// Passive side: accept a `ConnectRequest`'s new id (QP created first).
    pub fn accept(&self, param: &ConnParam) -> Result<()> {
        let mut p = param.raw()?;
        // SAFETY: as in connect.
        let ret = unsafe { sys::rdma_accept(self.ptr(), &mut p) };
        Self::check(ret, "rdma_accept")
    }

    /// Passive side: reject a connection request.
    pub fn reject(&self, private_data: &[u8]) -> Result<()> {
        let len = u8::try_from(private_data.len())
            .map_err(|_| RdmaError::InvalidArgument("private data over 255 bytes".into()))?;
        // SAFETY: live id; data copied by rdma_cm.
        let ret = unsafe { sys::rdma_reject(self.ptr(), private_data.as_ptr().cast(), len) };
        Self::check(ret, "rdma_reject")
    }

    /// Disconnects; both sides get `Disconnected`.
    pub fn disconnect(&self) -> Result<()> {
        // SAFETY: live id.
        let ret = unsafe { sys::rdma_disconnect(self.ptr()) };
        Self::check(ret, "rdma_disconnect")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_rdma_cm_on_a_host_without_rdma() {
        if std::path::Path::new("/dev/infiniband/rdma_cm").exists() {
            return;
        }
        let e = EventChannel::new().unwrap_err();
        assert!(e.is_no_device(), "{e}");
    }

    #[test]
    fn sockaddr_conversion() {
        let (ss, len) = to_sockaddr(&"198.51.100.1:7471".parse().unwrap());
        assert_eq!(len as usize, std::mem::size_of::<libc::sockaddr_in>());
        // SAFETY: written as sockaddr_in above.
        let sin: libc::sockaddr_in =
            unsafe { std::ptr::read((&ss as *const libc::sockaddr_storage).cast()) };
        assert_eq!(sin.sin_family, libc::AF_INET as libc::sa_family_t);
        assert_eq!(u16::from_be(sin.sin_port), 7471);
        assert_eq!(sin.sin_addr.s_addr.to_ne_bytes(), [198, 51, 100, 1]);
        // SAFETY: ss holds a sockaddr_in.
        let back = unsafe { from_sockaddr((&ss as *const libc::sockaddr_storage).cast()) };
        assert_eq!(back, Some("198.51.100.1:7471".parse().unwrap()));
        let (ss6, _) = to_sockaddr(&"[::1]:9".parse().unwrap());
        // SAFETY: ss6 holds a sockaddr_in6.
        let back6 = unsafe { from_sockaddr((&ss6 as *const libc::sockaddr_storage).cast()) };
        assert_eq!(back6, Some("[::1]:9".parse().unwrap()));
        let (_, len6) = to_sockaddr(&"[::1]:1".parse().unwrap());
        assert_eq!(len6 as usize, std::mem::size_of::<libc::sockaddr_in6>());
    }
}
