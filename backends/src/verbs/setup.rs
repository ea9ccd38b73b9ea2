//! The device a transport uses and the out-of-band exchange (over TCP, as
//! Ceph's RDMAStack does) that connects two RC queue pairs.

use std::sync::Arc;

use msgr_addr::RdmaLocation;
use msgr_rdma::{
    open_device, CompletionChannel, CompletionQueue, Context, Gid, Mtu, ProtectionDomain, RdmaError,
};

use super::pool::Pool;

/// Size of a chunk (one send or receive buffer).
pub(crate) const CHUNK: usize = 32 << 10;
/// Receive chunks in the transport's pool.
pub(crate) const RX_CHUNKS: u32 = 512;
/// Send chunks in the transport's pool.
pub(crate) const TX_CHUNKS: u32 = 512;
/// Receives posted per link that the peer may fill with data (its credits).
pub(crate) const RX_DEPTH: u32 = 32;
/// Extra receives per link for credit-only messages (they take no credit).
pub(crate) const RX_RESERVE: u32 = 8;
/// Sends in flight per link.
pub(crate) const SQ_DEPTH: u32 = 64;
/// Completion queue entries per transport.
pub(crate) const CQ_ENTRIES: u32 = 4096;

/// One device's resources, shared by every link of a transport.
pub(crate) struct Device {
    pub(crate) ctx: Arc<Context>,
    pub(crate) pd: Arc<ProtectionDomain>,
    pub(crate) channel: Arc<CompletionChannel>,
    pub(crate) cq: Arc<CompletionQueue>,
    pub(crate) rx: Pool,
    pub(crate) tx: Pool,
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
            .finish()
    }
}

impl Device {
    /// Opens the device the address names (default: the first one), checks
    /// its port and picks a GID (default: an IPv4-mapped one, as RoCE v2 over
    /// an IPv4 netdev needs), then creates the CQ and the chunk pools.
    pub(crate) fn open(loc: &RdmaLocation) -> Result<Self, RdmaError> {
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
        let pd = ProtectionDomain::new(&ctx)?;
        let channel = CompletionChannel::new(&ctx)?;
        channel.set_nonblocking()?;
        let cq = CompletionQueue::new(&ctx, CQ_ENTRIES, Some(&channel))?;
        let pool = |count| {
            Pool::new(&pd, CHUNK, count).map_err(|e| {
                RdmaError::InvalidArgument(format!(
                    "registering {} KiB of chunks failed ({e}); RLIMIT_MEMLOCK is {}: \
                     raise it (ulimit -l, or memlock in /etc/security/limits.conf) \
                     to at least {} KiB for this worker's pools",
                    (CHUNK * count as usize) >> 10,
                    memlock_limit(),
                    (CHUNK * (RX_CHUNKS + TX_CHUNKS) as usize) >> 10
                ))
            })
        };
        let rx = pool(RX_CHUNKS)?;
        let tx = pool(TX_CHUNKS)?;
        Ok(Device {
            ctx,
            pd,
            channel,
            cq,
            rx,
            tx,
            port,
            gid_index,
            gid,
            lid: pattr.lid,
            mtu: pattr.active_mtu,
        })
    }
}

/// The soft RLIMIT_MEMLOCK as /proc/self/limits states it (for error messages).
fn memlock_limit() -> String {
    std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("Max locked memory"))
                .and_then(|l| l.split_whitespace().nth(3).map(str::to_owned))
        })
        .map_or_else(|| "unknown".into(), |v| format!("{v} bytes"))
}

/// What each side tells the other over the out-of-band TCP connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct QpInfo {
    pub(crate) qpn: u32,
    pub(crate) psn: u32,
    pub(crate) gid: Gid,
    pub(crate) lid: u16,
    /// Path MTU code (IB encoding, 1 = 256 ... 5 = 4096).
    pub(crate) mtu: u8,
    /// Data credits the sender of this struct grants (receives it posted).
    pub(crate) credits: u32,
    /// Size of each receive buffer.
    pub(crate) chunk: u32,
}

/// Magic and version of the exchange ("MSGRVRB" + 1).
const MAGIC: [u8; 8] = *b"MSGRVRB\x01";
/// Encoded size of [`QpInfo`].
pub(crate) const INFO_LEN: usize = 48;
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
        b[36..40].copy_from_slice(&self.credits.to_le_bytes());
        b[40..44].copy_from_slice(&self.chunk.to_le_bytes());
        b
    }

    pub(crate) fn decode(b: &[u8]) -> Result<Self, String> {
        if b.len() != INFO_LEN || b[..8] != MAGIC {
            return Err("the peer is not a msgr verbs endpoint (bad setup magic)".into());
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
            credits: u32_at(36),
            chunk: u32_at(40),
        };
        if info.credits == 0 || info.chunk as usize != CHUNK || !(1..=5).contains(&info.mtu) {
            return Err(format!(
                "unsupported verbs setup from the peer (credits {}, chunk {}, mtu code {})",
                info.credits, info.chunk, info.mtu
            ));
        }
        Ok(info)
    }
}

pub(crate) fn mtu_code(m: Mtu) -> u8 {
    match m.bytes() {
        256 => 1,
        512 => 2,
        1024 => 3,
        2048 => 4,
        _ => 5,
    }
}

pub(crate) fn mtu_from_code(c: u8, local: Mtu) -> Mtu {
    // The path MTU is the smaller of both ends.
    if c < mtu_code(local) {
        match c {
            1 => Mtu::Mtu256,
            2 => Mtu::Mtu512,
            3 => Mtu::Mtu1024,
            _ => Mtu::Mtu2048,
        }
    } else {
        local
    }
}

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
            credits: RX_DEPTH,
            chunk: CHUNK as u32,
        };
        assert_eq!(QpInfo::decode(&i.encode()).unwrap(), i);
        assert!(QpInfo::decode(&[0u8; INFO_LEN]).is_err());
        assert!(QpInfo::decode(b"GET / HTTP/1.1").is_err());
    }
}
