//! The device a transport uses: protection domain, one completion queue with
//! its channel, one shared receive queue and the registered chunk pools —
//! sized from configuration and checked against the device's limits and
//! RLIMIT_MEMLOCK before anything is registered.

use std::sync::Arc;

use msgr_addr::RdmaLocation;
use msgr_rdma::{
    open_device, CompletionChannel, CompletionQueue, Context, Gid, Mtu, ProtectionDomain, QpCaps,
    QpInit, QueuePair, RdmaError, RecvWr, SharedReceiveQueue,
};

use super::pool::Pool;
use super::wr;
use crate::RdmaPoolConfig;

/// Sends in flight per link (send queue depth).
pub(crate) const SQ_DEPTH: u32 = 64;
/// Most RDMA reads a link has in flight (rendezvous).
pub(crate) const MAX_READS: u32 = 8;
/// Data credits a link is granted at most (receives the peer may fill).
pub(crate) const MAX_LINK_CREDITS: u32 = 32;
/// Fewest shared-receive-queue slots a link needs: two data credits and one
/// slot for a credit-only message.
pub(crate) const MIN_LINK_SHARE: u32 = 3;

/// One device's resources, shared by every link of a transport.
pub(crate) struct Device {
    pub(crate) ctx: Arc<Context>,
    pub(crate) pd: Arc<ProtectionDomain>,
    pub(crate) channel: Arc<CompletionChannel>,
    pub(crate) cq: Arc<CompletionQueue>,
    pub(crate) srq: Arc<SharedReceiveQueue>,
    pub(crate) rx: Pool,
    pub(crate) tx: Pool,
    /// Shared-receive-queue slots not promised to any link (see
    /// [`Device::take_share`]).
    pub(crate) rx_budget: u32,
    /// RDMA reads this end may have outstanding or serve per QP.
    pub(crate) rd_atomic: u8,
    /// Sends up to this many bytes are posted inline (copied into the work
    /// request: no DMA read of the chunk, lower latency for tiny messages).
    pub(crate) max_inline: u32,
    pub(crate) port: u8,
    pub(crate) gid_index: u8,
    pub(crate) gid: Gid,
    pub(crate) lid: u16,
    pub(crate) mtu: Mtu,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("name", &self.ctx.name())
            .field("port", &self.port)
            .field("gid_index", &self.gid_index)
            .field("gid", &self.gid)
            .field("rx", &self.rx)
            .field("tx", &self.tx)
            .field("rx_budget", &self.rx_budget)
            .finish()
    }
}

impl Device {
    /// Opens the device the address names (default: the first one), checks
    /// its port and picks a GID (default: an IPv4-mapped one, as RoCE v2 over
    /// an IPv4 netdev needs): the verbs backend's out-of-band setup sends it.
    pub(crate) fn open(loc: &RdmaLocation, pools: &RdmaPoolConfig) -> Result<Self, RdmaError> {
        let ctx = open_device(loc.device.as_deref())?;
        let port = loc.port.unwrap_or(1);
        let pattr = ctx.query_port(port)?;
        if !pattr.active {
            return Err(RdmaError::InvalidArgument(format!(
                "port {port} of {} is not active",
                ctx.name()
            )));
        }
        let (gid_index, gid) = match loc.gid_index {
            Some(i) => (i, ctx.query_gid(port, u32::from(i))?),
            None => {
                let gids: Vec<(u32, Gid)> = (0..pattr.gid_tbl_len.min(256))
                    .filter_map(|i| ctx.query_gid(port, i).ok().map(|g| (i, g)))
                    .filter(|(_, g)| !g.is_zero())
                    .collect();
                let v4 = |g: &Gid| g.0[..10].iter().all(|&b| b == 0) && g.0[10..12] == [0xff, 0xff];
                let (i, g) = gids
                    .iter()
                    .find(|(_, g)| v4(g))
                    .or_else(|| gids.first())
                    .copied()
                    .ok_or_else(|| {
                        RdmaError::InvalidArgument(format!(
                            "no usable GID on port {port} of {}",
                            ctx.name()
                        ))
                    })?;
                (i as u8, g)
            }
        };
        let mut d = Self::with_context(ctx, port, pools)?;
        d.gid_index = gid_index;
        d.gid = gid;
        d.lid = pattr.lid;
        d.mtu = pattr.active_mtu;
        Ok(d)
    }

    /// The resources of a device rdma_cm chose (the context of a resolved or
    /// requested connection); rdma_cm handles addressing, so no GID is picked.
    pub(crate) fn with_context(
        ctx: Arc<Context>,
        port: u8,
        pools: &RdmaPoolConfig,
    ) -> Result<Self, RdmaError> {
        let attr = ctx.query_device()?;
        let mut limit = memlock();
        if ctx.name().starts_with("siw") {
            // siw checks RLIMIT_MEMLOCK itself, CAP_IPC_LOCK or not.
            limit.cap_ipc_lock = false;
        }
        check_fit(&attr, pools, &limit)?;
        let pd = ProtectionDomain::new(&ctx)?;
        let channel = CompletionChannel::new(&ctx)?;
        channel.set_nonblocking()?;
        let cq_entries = cq_entries(pools).min(attr.max_cqe);
        let cq = CompletionQueue::new(&ctx, cq_entries, Some(&channel))?;
        let srq = SharedReceiveQueue::new(&pd, pools.rx_chunks, 1, 0)?;
        let rx = Pool::new(&pd, pools.chunk_size, pools.rx_chunks)?;
        let tx = Pool::new(&pd, pools.chunk_size, pools.tx_chunks)?;
        let mut d = Device {
            ctx,
            pd,
            channel,
            cq,
            srq,
            rx,
            tx,
            rx_budget: pools.rx_chunks,
            rd_atomic: attr
                .max_qp_rd_atom
                .min(attr.max_qp_init_rd_atom)
                .clamp(1, 16) as u8,
            max_inline: pools.inline_bytes,
            port,
            gid_index: 0,
            gid: Gid([0; 16]),
            lid: 0,
            mtu: Mtu::Mtu1024,
        };
        while let Some(c) = d.rx.take() {
            d.post_recv(c)?;
        }
        Ok(d)
    }

    /// Posts receive chunk `c` to the shared receive queue.
    pub(crate) fn post_recv(&mut self, c: u32) -> Result<(), RdmaError> {
        let sge = self.rx.sge(c, self.rx.chunk_size())?;
        self.srq.post_recv(&[RecvWr {
            wr_id: wr::recv(c),
            sges: &[sge],
        }])
    }

    /// Promises a new link a share of the shared receive queue: the credits
    /// its peer may use plus one slot for a credit-only message. Shares never
    /// add up to more than the posted receives, so no send ever finds the
    /// queue empty. A link gets the most credits while the queue is lightly
    /// promised, fewer as it fills, and `None` when not even
    /// [`MIN_LINK_SHARE`] is left (the connection fails, and is retried).
    pub(crate) fn take_share(&mut self) -> Option<u32> {
        let share = (self.rx_budget / 8)
            .clamp(MIN_LINK_SHARE, MAX_LINK_CREDITS + 1)
            .min(self.rx_budget);
        if share < MIN_LINK_SHARE {
            return None;
        }
        self.rx_budget -= share;
        Some(share)
    }

    /// Creates a link's QP with `create` (plain verbs or rdma_cm) on the
    /// shared CQ and receive queue. Sends up to [`Device::max_inline`] bytes
    /// go inline; a device that refuses inline data gets QPs without it from
    /// then on.
    pub(crate) fn create_qp(
        &mut self,
        create: impl Fn(QpInit) -> Result<QueuePair, RdmaError>,
    ) -> Result<QueuePair, RdmaError> {
        loop {
            let mut init = QpInit::new(&self.cq, &self.cq);
            init.srq = Some(self.srq.clone());
            init.caps = QpCaps {
                max_send_wr: SQ_DEPTH + MAX_READS,
                max_recv_wr: 0,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: self.max_inline,
            };
            match create(init) {
                Err(e) if self.max_inline > 0 => {
                    tracing::debug!(error = %e, device = self.ctx.name(), "QP with inline data refused; going without");
                    self.max_inline = 0;
                }
                other => return other,
            }
        }
    }

    /// Returns a released link's share.
    pub(crate) fn return_share(&mut self, share: u32) {
        self.rx_budget += share;
    }
}

/// Completion queue entries a transport needs: every receive, and every send
/// and read of as many links as the receive queue can serve.
fn cq_entries(p: &RdmaPoolConfig) -> u32 {
    let links = (p.rx_chunks / MIN_LINK_SHARE).max(1);
    p.rx_chunks
        .saturating_add(links.saturating_mul(SQ_DEPTH + MAX_READS))
        .min(1 << 20)
}

/// How much memory this process may pin.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct MemlockLimit {
    /// The soft RLIMIT_MEMLOCK in bytes; `None` = unlimited.
    pub(crate) bytes: Option<u64>,
    /// CAP_IPC_LOCK in the effective set: the limit does not apply.
    pub(crate) cap_ipc_lock: bool,
}

/// Reads RLIMIT_MEMLOCK and CAP_IPC_LOCK from /proc/self (no unsafe needed).
pub(crate) fn memlock() -> MemlockLimit {
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    let bytes = limits
        .lines()
        .find(|l| l.starts_with("Max locked memory"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|v| {
            if v == "unlimited" {
                None
            } else {
                v.parse().ok()
            }
        });
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    const CAP_IPC_LOCK: u32 = 14;
    let cap_ipc_lock = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_IPC_LOCK) != 0);
    MemlockLimit {
        bytes,
        cap_ipc_lock,
    }
}

/// Checks the configured pools against the device's limits and the memlock
/// limit, naming the limit and the configuration keys when they do not fit.
pub(crate) fn check_fit(
    attr: &msgr_rdma::DeviceAttr,
    p: &RdmaPoolConfig,
    memlock: &MemlockLimit,
) -> Result<(), RdmaError> {
    let bad = |what: String| Err(RdmaError::InvalidArgument(what));
    if p.chunk_size < 4096 || p.rx_chunks < MIN_LINK_SHARE || p.tx_chunks == 0 {
        return bad(format!(
            "RDMA pools too small: rdma_chunk_size {} (at least 4096), rdma_rx_chunks {} \
             (at least {MIN_LINK_SHARE}), rdma_tx_chunks {} (at least 1)",
            p.chunk_size, p.rx_chunks, p.tx_chunks
        ));
    }
    if attr.max_srq == 0 || p.rx_chunks > attr.max_srq_wr {
        return bad(format!(
            "rdma_rx_chunks {} exceeds the device's shared receive queue (max_srq {}, \
             max_srq_wr {}): lower rdma_rx_chunks",
            p.rx_chunks, attr.max_srq, attr.max_srq_wr
        ));
    }
    if SQ_DEPTH > attr.max_qp_wr {
        return bad(format!(
            "the device allows {} work requests per queue, msgr needs {SQ_DEPTH}",
            attr.max_qp_wr
        ));
    }
    let rx_bytes = p.chunk_size as u64 * u64::from(p.rx_chunks);
    let tx_bytes = p.chunk_size as u64 * u64::from(p.tx_chunks);
    if rx_bytes.max(tx_bytes) > attr.max_mr_size {
        return bad(format!(
            "a chunk pool of {} bytes exceeds the device's max_mr_size {}: lower \
             rdma_chunk_size or rdma_rx_chunks/rdma_tx_chunks",
            rx_bytes.max(tx_bytes),
            attr.max_mr_size
        ));
    }
    let need = rx_bytes + tx_bytes;
    match memlock.bytes {
        Some(limit) if !memlock.cap_ipc_lock && need > limit => bad(format!(
            "RLIMIT_MEMLOCK is {} KiB but this worker's RDMA pools pin {} KiB \
             (rdma_rx_chunks {} + rdma_tx_chunks {} of rdma_chunk_size {}): raise the limit \
             (ulimit -l, LimitMEMLOCK= in a systemd unit, memlock in \
             /etc/security/limits.conf) or shrink the pools; rendezvous buffers pin more",
            limit >> 10,
            need >> 10,
            p.rx_chunks,
            p.tx_chunks,
            p.chunk_size
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr() -> msgr_rdma::DeviceAttr {
        msgr_rdma::DeviceAttr {
            max_qp: 1024,
            max_qp_wr: 4096,
            max_sge: 4,
            max_cq: 64,
            max_cqe: 1 << 16,
            max_mr: 1024,
            max_mr_size: 1 << 32,
            max_pd: 16,
            max_srq: 64,
            max_srq_wr: 4096,
            max_qp_rd_atom: 16,
            max_qp_init_rd_atom: 16,
        }
    }

    #[test]
    fn pools_are_checked_against_memlock_and_device_limits() {
        let p = RdmaPoolConfig::default();
        let pinned = p.chunk_size as u64 * u64::from(p.rx_chunks + p.tx_chunks);
        let unlimited = MemlockLimit {
            bytes: None,
            cap_ipc_lock: false,
        };
        assert!(check_fit(&attr(), &p, &unlimited).is_ok());
        let small = MemlockLimit {
            bytes: Some(8 << 20),
            cap_ipc_lock: false,
        };
        assert!(
            pinned > 8 << 20,
            "the defaults pin more than Debian's 8 MiB"
        );
        let e = check_fit(&attr(), &p, &small).unwrap_err().to_string();
        assert!(e.contains("RLIMIT_MEMLOCK is 8192 KiB"), "{e}");
        assert!(e.contains("rdma_rx_chunks"), "{e}");
        // CAP_IPC_LOCK lifts the limit.
        let cap = MemlockLimit {
            cap_ipc_lock: true,
            ..small
        };
        assert!(check_fit(&attr(), &p, &cap).is_ok());
        // Enough limit: fine.
        let enough = MemlockLimit {
            bytes: Some(pinned),
            cap_ipc_lock: false,
        };
        assert!(check_fit(&attr(), &p, &enough).is_ok());

        let mut a = attr();
        a.max_srq_wr = p.rx_chunks - 1;
        let e = check_fit(&a, &p, &unlimited).unwrap_err().to_string();
        assert!(e.contains("max_srq_wr"), "{e}");
        let mut a = attr();
        a.max_mr_size = 1 << 20;
        let e = check_fit(&a, &p, &unlimited).unwrap_err().to_string();
        assert!(e.contains("max_mr_size"), "{e}");
        let tiny = RdmaPoolConfig { rx_chunks: 2, ..p };
        assert!(check_fit(&attr(), &tiny, &unlimited).is_err());
    }

    #[test]
    fn this_process_memlock_parses() {
        // /proc is always there on Linux; the soft limit is a number or unlimited.
        let m = memlock();
        let text = std::fs::read_to_string("/proc/self/limits").unwrap();
        let line = text
            .lines()
            .find(|l| l.starts_with("Max locked memory"))
            .unwrap();
        assert_eq!(m.bytes.is_none(), line.contains("unlimited"), "{line}");
    }
}
