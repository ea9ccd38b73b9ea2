//! What a worker hands each transport it opens ([`TransportContext`], with
//! the RDMA and libfabric settings in it), and whether a transport can be
//! used here ([`Availability`]): below the backends, which read them, and
//! the factory (`select`), which opens them.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use msgr_proto::FrameLimits;

/// What a worker hands each transport it opens.
#[derive(Clone, Debug)]
pub struct TransportContext {
    /// Receive limits for decoding.
    pub limits: FrameLimits,
    /// Allocator of link ids shared by the worker's transports (accepted links
    /// need ids too).
    pub link_ids: Arc<AtomicU64>,
    /// Frames with segments up to this size are copied into one coalescing
    /// buffer (one write for many frames); larger segments go by reference.
    pub copy_threshold: usize,
    /// Pool sizes of the RDMA backends.
    pub rdma: RdmaPoolConfig,
    /// Wakes the worker from another thread (backends whose buffers are
    /// returned by the application, like the RDMA receive chunks).
    pub waker: Option<Arc<mio::Waker>>,
    /// SO_SNDBUF and SO_RCVBUF of every TCP link, in bytes (the kernel
    /// doubles it); 0 leaves the kernel's autotuning. Bytes in socket
    /// buffers are past every priority lane: a bound keeps an urgent
    /// message from waiting behind megabytes of bulk there.
    pub tcp_socket_buffer: usize,
}

/// Sizes of the RDMA backends' registered memory, per worker, and the
/// deadline of their rendezvous reads: what the `rdma_*` configuration keys
/// set. The pools are pinned at start-up (checked against RLIMIT_MEMLOCK and
/// the device's limits first).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RdmaPoolConfig {
    /// Bytes per send/receive chunk: the largest eager send (both ends of a
    /// link must agree).
    pub chunk_size: usize,
    /// Receive chunks, all posted to one shared receive queue. Each link is
    /// promised a share (at most 33 slots, at least 3): this bounds the
    /// links a worker can serve.
    pub rx_chunks: u32,
    /// Send chunks shared by the worker's links.
    pub tx_chunks: u32,
    /// Frames larger than this are not copied into chunks: the peer
    /// RDMA-reads them from where they lie (rendezvous).
    pub rendezvous_threshold: usize,
    /// Sends up to this many bytes (header included) are posted inline: the
    /// CPU copies them into the work request, so the device does not fetch
    /// the chunk by DMA. 0: never. A device that refuses inline data at
    /// this size gets QPs without it.
    pub inline_bytes: u32,
    /// A rendezvous read not complete this long after it started fails its
    /// link (the session engine then recovers per its policy); the libfabric
    /// backend's `fi_read` rendezvous uses it too. Leave it above
    /// the time one read piece (at most 4 MiB) takes on a loaded link, and
    /// below the session's keepalive timeout: frames behind a hung read are
    /// held, keepalives included, so that timeout would fire first and the
    /// fault would be counted as a silent peer.
    pub read_timeout: Duration,
    /// Whether the libfabric backend's endpoints use the `fi_read`
    /// rendezvous (the `fabric_rendezvous` key).
    pub fabric_rendezvous: FabricRendezvous,
    /// How a libfabric worker waits for completions (the `fabric_cq_wait`
    /// key).
    pub fabric_cq_wait: FabricCqWait,
    /// Bytes of rendezvous segments a worker keeps registered after their
    /// send, so the same bytes sent again (a clone of the same `Bytes`;
    /// not a slice of it, whose reader would get the whole region's key)
    /// need no registration. Each kept segment stays alive and
    /// pinned until evicted (least recently used first); segments above a
    /// quarter of this are never kept. 0: register every rendezvous anew.
    /// The RDMA backends and, where the provider checks keys (`tcp`,
    /// `verbs`: not `shm`) and the endpoints read, the libfabric backend.
    pub reg_cache_bytes: usize,
    /// Bytes of send and receive buffers a libfabric worker's links may
    /// hold (the `fabric_link_bytes` key): a link beyond it is refused.
    /// A MSG link holds its own slots (4 MiB), an RDM link its share of
    /// the endpoint's receive pool (`tcp;ofi_rxm` 1.25 MiB, `shm` 272 KiB).
    pub fabric_link_bytes: usize,
    /// The RC QPs' local ACK timeout code (4.096 µs × 2^code): how long
    /// a packet may go unacknowledged before it is resent. `None`: 14
    /// (≈ 67 ms) over verbs, rdma_cm's own choice from the path over
    /// rdmacm.
    pub ack_timeout: Option<u8>,
    /// How often an unacknowledged packet is resent before the QP fails
    /// (0–7): with the ACK timeout, how long loss on the wire is borne
    /// before the link faults and the session reconnects and replays.
    pub retry_count: u8,
}

/// Whether and how the libfabric backend sends large units by rendezvous
/// (`fabric_rendezvous = auto | off | on | write`).
///
/// `Auto` is right for nearly everyone: the receiver `fi_read`s the unit
/// where the provider has reads and the libfabric loaded has no known bug
/// in them; else, where the provider has writes and checks keys at the
/// target (`tcp`, `verbs`), the receiver grants a buffer and the sender
/// `fi_write`s the unit into it (libfabric before 1.18 over `tcp` has a
/// bug in its reads, so there it is writes; the `rendezvous_enabled`,
/// `rendezvous_read` and `rendezvous_writes` counters tell). `Off` copies
/// every unit through the send slots (to compare, or to steer around a
/// provider's RMA). `On` uses the reads despite a known bug: only for a
/// libfabric patched past it. `Write` uses the writes even where reads
/// would do (to compare).
///
/// ```
/// # use msgr_backends::{FabricRendezvous, RdmaPoolConfig};
/// let cfg = RdmaPoolConfig { fabric_rendezvous: FabricRendezvous::Off, ..Default::default() };
/// assert_eq!(cfg.fabric_rendezvous, FabricRendezvous::Off);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FabricRendezvous {
    /// Where the provider has reads without a known bug here.
    #[default]
    Auto,
    /// Never.
    Off,
    /// Wherever the provider has reads.
    On,
    /// Writes into buffers the receiver grants, wherever the provider has
    /// them and checks keys.
    Write,
}

/// How the libfabric backend's workers wait for completions
/// (`fabric_cq_wait = fd | poll`).
///
/// `Fd`, the default, opens each completion queue with wait fds (over
/// `tcp` the provider's own sockets, `FI_WAIT_POLLFD`; elsewhere one fd),
/// put into the worker's epoll set while the worker sleeps: an idle worker
/// wakes as soon as a completion comes, and a busy one pays nothing per
/// message for it (docs/BENCHMARKS.md). A sleep costs an `epoll_ctl` per
/// endpoint each way.
///
/// `Poll` opens it without a wait object, as busy-polling benchmarks such
/// as `fi_pingpong` do: nothing to sleep on,
/// so an idle worker polls the queue every millisecond (at once while a
/// link is moving data), and a message that comes after an idle spell
/// waits up to that millisecond. Over `tcp` no faster than `Fd` since
/// 2026-12-03; kept for providers whose wait objects cost more, and for
/// comparisons. `shm` has no wait objects and is always polled.
///
/// ```
/// # use msgr_backends::{FabricCqWait, RdmaPoolConfig};
/// let cfg = RdmaPoolConfig { fabric_cq_wait: FabricCqWait::Poll, ..Default::default() };
/// assert_eq!(cfg.fabric_cq_wait, FabricCqWait::Poll);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FabricCqWait {
    /// A wait fd in the worker's epoll set.
    #[default]
    Fd,
    /// No wait object: polled.
    Poll,
}

impl Default for RdmaPoolConfig {
    fn default() -> Self {
        RdmaPoolConfig {
            chunk_size: 32 << 10,
            rx_chunks: 1024,
            tx_chunks: 512,
            rendezvous_threshold: 128 << 10,
            inline_bytes: 256,
            read_timeout: Duration::from_secs(10),
            fabric_rendezvous: FabricRendezvous::Auto,
            fabric_cq_wait: FabricCqWait::Fd,
            reg_cache_bytes: 32 << 20,
            fabric_link_bytes: 1 << 30,
            ack_timeout: None,
            retry_count: 7,
        }
    }
}

impl TransportContext {
    /// A context with the given limits and a fresh link-id allocator.
    pub fn new(limits: FrameLimits) -> Self {
        TransportContext {
            limits,
            link_ids: Arc::new(AtomicU64::new(1)),
            copy_threshold: 8 << 10,
            rdma: RdmaPoolConfig::default(),
            waker: None,
            tcp_socket_buffer: 0,
        }
    }
}

/// Whether a transport can be used in this build and on this machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Availability {
    /// Ready to use.
    Available,
    /// Not usable; the text says why and what to do.
    Unavailable(String),
}
