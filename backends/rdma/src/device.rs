//! Device discovery and device contexts.

use crate::error::{RdmaError, Result};
use rdma_cm_sys as sys;
use std::ffi::CStr;
use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

/// Names of the RDMA devices of this machine.
///
/// Without any RDMA support in the kernel this is `Err(RdmaError::NoDevice)`;
/// with support but no device it is an empty list.
pub fn device_names() -> Result<Vec<String>> {
    DeviceList::new().map(|l| l.names())
}

/// Opens the device called `name`, or the first device when `name` is None.
pub fn open_device(name: Option<&str>) -> Result<Arc<Context>> {
    DeviceList::new()?.open(name)
}

/// The list returned by `ibv_get_device_list`.
struct DeviceList {
    list: NonNull<*mut sys::ibv_device>,
    len: usize,
}

impl DeviceList {
    fn new() -> Result<Self> {
        let mut n: libc::c_int = 0;
        crate::error::clear_errno();
        // SAFETY: `n` is a valid out-pointer; the returned array is freed in Drop.
        let list = unsafe { sys::ibv_get_device_list(&mut n) };
        let list = NonNull::new(list).ok_or_else(|| RdmaError::last_os("ibv_get_device_list"))?;
        Ok(DeviceList {
            list,
            len: usize::try_from(n).unwrap_or(0),
        })
    }

    fn devices(&self) -> impl Iterator<Item = *mut sys::ibv_device> + '_ {
        // SAFETY: the list holds `len` valid device pointers while it is alive.
        (0..self.len).map(move |i| unsafe { *self.list.as_ptr().add(i) })
    }

    fn names(&self) -> Vec<String> {
        self.devices().map(device_name).collect()
    }

    fn open(&self, name: Option<&str>) -> Result<Arc<Context>> {
        let dev = match name {
            Some(want) => self.devices().find(|&d| device_name(d) == want),
            None => self.devices().next(),
        };
        let Some(dev) = dev else {
            let names = self.names();
            return Err(RdmaError::NoDevice(match name {
                Some(want) if !names.is_empty() => {
                    format!("no device called {want:?} (devices: {})", names.join(", "))
                }
                _ => "the kernel has RDMA support but no RDMA device is configured \
                      (e.g. `rdma link add rxe0 type rxe netdev lo`)"
                    .into(),
            }));
        };
        let name = device_name(dev);
        crate::error::clear_errno();
        // SAFETY: `dev` comes from the live device list; the context stays valid
        // after the list is freed (documented by libibverbs).
        let ctx = unsafe { sys::ibv_open_device(dev) };
        let ctx = NonNull::new(ctx).ok_or_else(|| RdmaError::last_os("ibv_open_device"))?;
        Ok(Arc::new(Context {
            ctx,
            name,
            owned: true,
            _keep: None,
        }))
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: the pointer came from ibv_get_device_list and is freed once.
        unsafe { sys::ibv_free_device_list(self.list.as_ptr()) }
    }
}

fn device_name(dev: *mut sys::ibv_device) -> String {
    // SAFETY: `dev` is a valid device; the name is a NUL-terminated string it owns.
    let p = unsafe { sys::ibv_get_device_name(dev) };
    if p.is_null() {
        return String::new();
    }
    // SAFETY: non-null NUL-terminated string owned by the device.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// An open device (`ibv_context`). Verbs objects are thread-safe, so the
/// context is shared by `Arc` between the objects created from it.
pub struct Context {
    ctx: NonNull<sys::ibv_context>,
    name: String,
    /// False for contexts that rdma_cm owns (a `CmId`'s `verbs`).
    owned: bool,
    /// What keeps a borrowed context open (the rdma_cm id it came from).
    _keep: Option<Arc<dyn std::any::Any + Send + Sync>>,
}

// SAFETY: libibverbs contexts may be used from any thread.
unsafe impl Send for Context {}
// SAFETY: as above; all verbs on a context are thread-safe.
unsafe impl Sync for Context {}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context").field("name", &self.name).finish()
    }
}

/// Device limits a messenger sizes its pools against.
#[derive(Clone, Debug)]
pub struct DeviceAttr {
    /// Most queue pairs the device supports.
    pub max_qp: u32,
    /// Most outstanding work requests per send or receive queue.
    pub max_qp_wr: u32,
    /// Most scatter/gather elements per work request.
    pub max_sge: u32,
    /// Most completion queues.
    pub max_cq: u32,
    /// Most entries per completion queue.
    pub max_cqe: u32,
    /// Most memory regions.
    pub max_mr: u32,
    /// Largest memory region, in bytes.
    pub max_mr_size: u64,
    /// Most protection domains.
    pub max_pd: u32,
    /// Most shared receive queues.
    pub max_srq: u32,
    /// Most outstanding work requests per shared receive queue.
    pub max_srq_wr: u32,
    /// Most RDMA reads and atomics a QP can serve for its peer at once
    /// (bounds a QP's `max_dest_rd_atomic`, a connection's responder
    /// resources).
    pub max_qp_rd_atom: u32,
    /// Most RDMA reads and atomics a QP can have outstanding itself
    /// (bounds a QP's `max_rd_atomic`, a connection's initiator depth).
    pub max_qp_init_rd_atom: u32,
}

/// Port state, MTU and link layer.
#[derive(Clone, Debug)]
pub struct PortAttr {
    /// The port is up (`IBV_PORT_ACTIVE`).
    pub active: bool,
    /// The MTU the port currently uses; a QP's path MTU should not exceed it.
    pub active_mtu: Mtu,
    /// The largest MTU the port supports.
    pub max_mtu: Mtu,
    /// The port's local identifier (InfiniBand; 0 on RoCE and iWARP).
    pub lid: u16,
    /// How many entries the port's GID table has (valid GID indexes
    /// are below this).
    pub gid_tbl_len: u32,
    /// Ethernet (RoCE, iWARP) rather than InfiniBand: connections need a GRH/GID.
    pub ethernet: bool,
}

/// A path MTU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Mtu {
    /// 256 bytes.
    Mtu256,
    /// 512 bytes.
    Mtu512,
    /// 1024 bytes.
    Mtu1024,
    /// 2048 bytes.
    Mtu2048,
    /// 4096 bytes.
    Mtu4096,
}

impl Mtu {
    pub(crate) fn from_raw(v: sys::ibv_mtu) -> Mtu {
        match v {
            sys::IBV_MTU_256 => Mtu::Mtu256,
            sys::IBV_MTU_512 => Mtu::Mtu512,
            sys::IBV_MTU_2048 => Mtu::Mtu2048,
            sys::IBV_MTU_4096 => Mtu::Mtu4096,
            _ => Mtu::Mtu1024,
        }
    }

    pub(crate) fn raw(self) -> sys::ibv_mtu {
        match self {
            Mtu::Mtu256 => sys::IBV_MTU_256,
            Mtu::Mtu512 => sys::IBV_MTU_512,
            Mtu::Mtu1024 => sys::IBV_MTU_1024,
            Mtu::Mtu2048 => sys::IBV_MTU_2048,
            Mtu::Mtu4096 => sys::IBV_MTU_4096,
        }
    }

    /// The MTU in bytes.
    pub fn bytes(self) -> u32 {
        128 << self.raw()
    }
}

/// A 128-bit global identifier (RoCE: an IPv6 or IPv4-mapped address).
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// True for the all-zero GID: an unused entry of a port's GID table.
    pub fn is_zero(&self) -> bool {
        self.0.iter().all(|&b| b == 0)
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, pair) in self.0.chunks(2).enumerate() {
            if i > 0 {
                f.write_str(":")?;
            }
            write!(f, "{:02x}{:02x}", pair[0], pair[1])?;
        }
        Ok(())
    }
}

impl Context {
    /// A context that rdma_cm owns (not closed on drop).
    pub(crate) fn borrowed(
        ctx: NonNull<sys::ibv_context>,
        keep: Arc<dyn std::any::Any + Send + Sync>,
    ) -> Arc<Context> {
        // SAFETY: ctx is a live context with a live device.
        let name = device_name(unsafe { (*ctx.as_ptr()).device });
        Arc::new(Context {
            ctx,
            name,
            owned: false,
            _keep: Some(keep),
        })
    }

    /// iWARP devices (siw, ...) have no immediate data, and the active side
    /// of a connection must send first.
    pub fn is_iwarp(&self) -> bool {
        // SAFETY: live context with a live device.
        unsafe { (*(*self.ctx.as_ptr()).device).transport_type == sys::IBV_TRANSPORT_IWARP }
    }

    /// The device's name (`rxe0`, `siw0`, `mlx5_0`, ...).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The raw `ibv_context`, for verbs this layer does not wrap.
    pub fn as_ptr(&self) -> *mut sys::ibv_context {
        self.ctx.as_ptr()
    }

    /// Queries the device's limits (`ibv_query_device`).
    pub fn query_device(&self) -> Result<DeviceAttr> {
        let mut a = sys::ibv_device_attr::default();
        // SAFETY: valid context and out-pointer.
        let ret = unsafe { sys::ibv_query_device(self.as_ptr(), &mut a) };
        if ret != 0 {
            return Err(RdmaError::from_ret("ibv_query_device", ret));
        }
        let u = |v: i32| u32::try_from(v).unwrap_or(0);
        Ok(DeviceAttr {
            max_qp: u(a.max_qp),
            max_qp_wr: u(a.max_qp_wr),
            max_sge: u(a.max_sge),
            max_cq: u(a.max_cq),
            max_cqe: u(a.max_cqe),
            max_mr: u(a.max_mr),
            max_mr_size: a.max_mr_size,
            max_pd: u(a.max_pd),
            max_srq: u(a.max_srq),
            max_srq_wr: u(a.max_srq_wr),
            max_qp_rd_atom: u(a.max_qp_rd_atom),
            max_qp_init_rd_atom: u(a.max_qp_init_rd_atom),
        })
    }

    /// Queries the state, MTU and link layer of `port` (ports are numbered
    /// from 1).
    pub fn query_port(&self, port: u8) -> Result<PortAttr> {
        let mut a = sys::ibv_port_attr::default();
        // SAFETY: valid context and out-pointer (the header's ibv_query_port
        // macro expands to this function).
        let ret = unsafe { sys::___ibv_query_port(self.as_ptr(), port, &mut a) };
        if ret != 0 {
            return Err(RdmaError::from_ret("ibv_query_port", ret));
        }
        Ok(PortAttr {
            active: a.state == sys::IBV_PORT_ACTIVE,
            active_mtu: Mtu::from_raw(a.active_mtu),
            max_mtu: Mtu::from_raw(a.max_mtu),
            lid: a.lid,
            gid_tbl_len: u32::try_from(a.gid_tbl_len).unwrap_or(0),
            ethernet: u32::from(a.link_layer) == sys::IBV_LINK_LAYER_ETHERNET,
        })
    }

    /// Reads entry `index` of `port`'s GID table (`ibv_query_gid`); the
    /// index is what an RTR's `sgid_index` names.
    pub fn query_gid(&self, port: u8, index: u32) -> Result<Gid> {
        let mut g = sys::ibv_gid::default();
        let index = i32::try_from(index)
            .map_err(|_| RdmaError::InvalidArgument(format!("gid index {index}")))?;
        // SAFETY: valid context and out-pointer.
        let ret = unsafe { sys::ibv_query_gid(self.as_ptr(), port, index, &mut g) };
        if ret != 0 {
            return Err(RdmaError::from_ret("ibv_query_gid", ret));
        }
        // SAFETY: every bit pattern of the union is a valid [u8; 16].
        Ok(Gid(unsafe { g.raw }))
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        if self.owned {
            // SAFETY: we opened this context; every object made from it holds
            // an Arc to it, so none is left.
            unsafe { sys::ibv_close_device(self.ctx.as_ptr()) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_device_on_a_host_without_rdma() {
        // On machines without an RDMA-capable kernel (the dev and CI hosts):
        // a typed NoDevice error, never a crash or an opaque errno.
        if std::path::Path::new("/sys/class/infiniband").exists() {
            return;
        }
        let e = open_device(Some("rxe0")).unwrap_err();
        assert!(e.is_no_device(), "{e}");
    }

    #[test]
    fn gid_and_mtu_format() {
        let mut g = Gid::default();
        assert!(g.is_zero());
        g.0[10] = 0xff;
        g.0[11] = 0xff;
        g.0[12..].copy_from_slice(&[198, 51, 100, 1]);
        assert_eq!(g.to_string(), "0000:0000:0000:0000:0000:ffff:c633:6401");
        assert_eq!(Mtu::Mtu1024.bytes(), 1024);
        assert_eq!(Mtu::Mtu4096.bytes(), 4096);
    }
}
