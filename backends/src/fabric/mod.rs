//! The libfabric backend (`fabric+<provider>://`), over either endpoint
//! type a provider offers:
//!
//! - `FI_EP_MSG` (the default): one connected endpoint per link —
//!   [`FabricTransport`].
//! - `FI_EP_RDM` (`?ep=rdm`): reliable unconnected endpoints that the links
//!   share — [`rdm`].
//!
//! Both keep one libfabric `Net` per worker (fabric, domain, event and
//! completion queues), cut units into slot-sized pieces and move large ones
//! by rendezvous. Where each concern lives:
//!
//! - this module: what the two transports share — the slot size, completion
//!   batches, queue reads that fail every link, simulated faults, the
//!   provider probe, opening a worker's `Net`;
//! - `msg`: the `FI_EP_MSG` transport — its links and slots, header bytes,
//!   completion contexts, connection set-up, sending and receiving;
//! - [`rdm`]: the `FI_EP_RDM` transport (its wire format, shared
//!   endpoints and links in modules of their own);
//! - `outbox`: a link's queued units, cut into pieces to send;
//! - `reassembly`: received pieces joined into a unit and decoded;
//! - `rendezvous`: large units moved by `fi_read` or `fi_write` — the
//!   descriptors on the wire, queued units, the sending side (and the
//!   messages a link owes its peer, `Owed`) and the receiving side;
//! - `user_rma`: one-sided reads of applications' regions (`msgr::rma`),
//!   for both transports;
//! - `wait_fd`: a completion queue's wait fds, in the worker's Poll only
//!   while it sleeps;
//! - `tests` (tests only): fixtures both transports' tests run;
//! - `hostile` (tests only): peers that speak the wire through libfabric
//!   alone and send what no msgr peer sends.
//!
//! # Layers
//!
//! Bottom first (`tests/layering.rs`):
//!
//! 1. `wait_fd`, `reassembly`, `user_rma`
//! 2. `rendezvous`
//! 3. `outbox`
//! 4. `common`: the state both transports share
//! 5. `queueing`
//! 6. `endpoint_kind`: the one `Transport` implementation
//! 7. `rdm`
//! 8. `msg`

mod common;
mod endpoint_kind;
#[cfg(test)]
mod hostile;
mod msg;
mod outbox;
mod queueing;
pub mod rdm;
mod reassembly;
pub(crate) mod rendezvous;
#[cfg(test)]
pub(crate) mod tests;
mod user_rma;
mod wait_fd;

use std::sync::{Mutex, OnceLock};

use mio::Registry;
use msgr_addr::{FabricEndpoint, FabricProvider, TransportKind};
use msgr_fabric::{CmEvent, Completion, CqWait, EpType, FabricError, Net, RmaChoice, Site};
use msgr_proto::LinkFailure;
use rustc_hash::FxHashMap;

use crate::queue_failure::failed_read;
use crate::{Availability, FabricCqWait, FabricRendezvous, TransportContext, TransportError};
pub use msg::{
    FabricTransport, LAST, MORE, RNDV, RNDV_DONE, RNDV_EPILOGUE, RNDV_GRANT, RNDV_WRITTEN, SLOTS,
};
use queueing::Queueing;

/// Bytes per transmit/receive slot (one message on the wire).
pub const SLOT_SIZE: usize = 64 << 10;

/// Pieces of at least this many bytes that lie inside one segment the
/// application handed over are sent from there ([`msgr_fabric::Ep::send_in_place`],
/// `RdmEp::send_in_place`) where the provider allows, instead of being
/// copied into the slot: on a 1 MiB unit over `tcp` MSG that is 15 of its
/// 17 pieces, over `tcp;ofi_rxm` (16 KiB pieces) 63 of 65. Below it the
/// copy is cheaper than the second iovec (shm's pieces stay below it).
pub(crate) const IN_PLACE_MIN: usize = 4 << 10;
/// Completions read per `fi_cq_read` batch, and most batches per call.
const CQ_BATCH: usize = 32;
const CQ_ROUNDS: usize = 16;

/// A transport's queue reads that failed: counted per queue, and the
/// completion-queue failures still to be simulated
/// (`SimulatedFault::CqReadError`, feature `fault-injection`). A queue that cannot be read leaves
/// the fates of its operations (CQ) or connection events (EQ) unknown, so
/// the caller fails every link on it instead of taking it for empty.
#[derive(Debug, Default)]
pub(crate) struct QueueFailures {
    cq: u64,
    eq: u64,
    simulated_cq: u32,
}

impl QueueFailures {
    /// One batch of completions (at most [`CQ_BATCH`]) into `batch`, or why
    /// the completion queue could not be read.
    fn read_cq(
        &mut self,
        net: &mut Net,
        batch: &mut Vec<Completion>,
    ) -> Result<usize, LinkFailure> {
        let read = if self.simulated_cq > 0 {
            self.simulated_cq -= 1;
            Err(FabricError::Call {
                op: "fi_cq_read (SIMULATED)",
                code: libc::EIO,
                msg: std::io::Error::from_raw_os_error(libc::EIO).to_string(),
            })
        } else {
            net.read_cq(batch, CQ_BATCH)
        };
        read.map_err(|e| failed_read(&mut self.cq, "libfabric completion queue", &e))
    }

    /// One connection-management event, or why the event queue could not
    /// be read.
    fn read_eq(&mut self, net: &mut Net) -> Result<Option<CmEvent>, LinkFailure> {
        net.read_eq()
            .map_err(|e| failed_read(&mut self.eq, "libfabric event queue", &e))
    }

    #[cfg(feature = "fault-injection")]
    fn simulate_cq(&mut self) {
        self.simulated_cq += 1;
    }

    /// `cq_failures` and `eq_failures`, for the transport's stats.
    fn values(&self) -> [(&'static str, u64); 2] {
        [("cq_failures", self.cq), ("eq_failures", self.eq)]
    }
}

/// Reads `t`'s completion queue in batches of [`CQ_BATCH`], at most
/// [`CQ_ROUNDS`] of them (a full batch may mean more), handing each
/// completion to `complete`. Returns whether any came, or, with that, why
/// the queue could not be read: the caller then fails every link on it.
fn read_completions<T: Queueing>(
    t: &mut T,
    mut complete: impl FnMut(&mut T, &Completion),
) -> Result<bool, (bool, LinkFailure)> {
    let mut any = false;
    for _ in 0..CQ_ROUNDS {
        let shared = t.parts().0;
        let mut batch = std::mem::take(&mut shared.completions);
        batch.clear();
        let read = shared.queue_failures.read_cq(&mut shared.net, &mut batch);
        for c in &batch {
            complete(t, c);
        }
        t.parts().0.completions = batch;
        let n = read.map_err(|why| (any, why))?;
        if n == 0 {
            break;
        }
        any = true;
        if n < CQ_BATCH {
            break;
        }
    }
    Ok(any)
}

/// The bound on the buffers a worker's links hold (`fabric_link_bytes`):
/// a link that would pass it is refused — an accept rejected, a HELLO
/// dropped, a connect failed with the reason — and counted
/// (`links_refused`). Without it a peer could make a worker allocate
/// buffers for every link it opens (MSG: each has its own slots; RDM: an
/// endpoint's receive pool grows per link and never shrinks) before any
/// handshake, which bounds only the messenger's own state.
#[derive(Debug)]
pub(crate) struct LinkBudget {
    /// Buffer bytes one link holds.
    per_link: usize,
    max: usize,
    refused: u64,
}

impl LinkBudget {
    pub(crate) fn new(per_link: usize, max: usize) -> Self {
        LinkBudget {
            per_link,
            max,
            refused: 0,
        }
    }

    /// Whether one more link fits beside `links`; a refusal is counted.
    pub(crate) fn admits(&mut self, links: usize) -> bool {
        let fits = (links + 1).saturating_mul(self.per_link) <= self.max;
        self.refused += u64::from(!fits);
        fits
    }

    /// What a connect the budget refused fails with.
    pub(crate) fn refusal(&self, links: usize) -> TransportError {
        let why = format!(
            "{links} links hold {} bytes of buffers; one more would pass fabric_link_bytes ({})",
            links.saturating_mul(self.per_link),
            self.max
        );
        TransportError::io(
            "fabric link buffers",
            std::io::Error::new(std::io::ErrorKind::OutOfMemory, why),
        )
    }

    /// `links_refused`, for the transport's stats.
    pub(crate) fn values(&self) -> [(&'static str, u64); 1] {
        [("links_refused", self.refused)]
    }
}

/// `Transport::simulate` of both endpoint types: `HungRead` hangs the
/// link's next rendezvous read, `CqReadError` fails the next CQ read
/// (module docs). `receiving` is the link's, `None` if there is no such link.
#[cfg(feature = "fault-injection")]
fn simulate_fault(
    receiving: Option<&mut rendezvous::Receiving>,
    link: msgr_proto::LinkId,
    fault: crate::SimulatedFault,
    rndv: bool,
    kind: &TransportKind,
    queue_failures: &mut QueueFailures,
) -> Result<(), TransportError> {
    let receiving = receiving.ok_or(TransportError::NoSuchLink(link.0))?;
    match fault {
        crate::SimulatedFault::HungRead => receiving.hang_next_read(rndv, kind),
        crate::SimulatedFault::CqReadError => {
            queue_failures.simulate_cq();
            Ok(())
        }
    }
}

/// Why a link fails whose operation `op` completed with `error` (the
/// code and what the provider said of it).
fn completion_failure(op: &str, (code, what): (i32, &str)) -> LinkFailure {
    LinkFailure::Completion {
        status: code,
        detail: format!(
            "libfabric {op} {what}: {}",
            std::io::Error::from_raw_os_error(code)
        ),
    }
}

/// Why a link fails whose post (`what`: "fi_send", "repost receive"...)
/// libfabric refused with `e`.
fn post_failure(what: &str, e: &FabricError) -> LinkFailure {
    let kind = match e {
        FabricError::Call { code, .. } => std::io::Error::from_raw_os_error(*code).kind(),
        _ => std::io::ErrorKind::Other,
    };
    LinkFailure::Io {
        kind,
        detail: format!("{what}: {e}"),
    }
}

/// The first `N` bytes (at most) of a message body, copied out of its
/// receive slot so the transport can be borrowed again (a rendezvous
/// descriptor, grant, answer or late epilogue: none longer than its `N`).
struct OutOfSlot<const N: usize> {
    buf: [u8; N],
    len: usize,
}

impl<const N: usize> OutOfSlot<N> {
    fn new(body: &[u8]) -> Self {
        let len = body.len().min(N);
        let mut buf = [0u8; N];
        buf[..len].copy_from_slice(&body[..len]);
        OutOfSlot { buf, len }
    }

    fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

fn ep_type(p: &FabricProvider) -> EpType {
    match p.endpoint {
        FabricEndpoint::Msg => EpType::Msg,
        FabricEndpoint::Rdm => EpType::Rdm,
    }
}

/// Whether the provider exists here with the endpoint type asked for and
/// what the backend needs of it (`fi_getinfo` with the backend's hints:
/// `FI_MSG`, the `mr_mode` bits it honours, and for RDM send-after-send
/// ordering), cached per provider (the probe loads every provider). A
/// provider that offers only the other endpoint type says so.
pub(crate) fn probe(p: &FabricProvider) -> Availability {
    static CACHE: OnceLock<Mutex<FxHashMap<FabricProvider, Availability>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let mut cache = cache.lock().unwrap_or_else(|e| e.into_inner());
    cache
        .entry(p.clone())
        .or_insert_with(|| match msgr_fabric::probe(&p.name, ep_type(p)) {
            Ok(()) => Availability::Available,
            Err(e) => {
                let (other, query) = match p.endpoint {
                    FabricEndpoint::Msg => (EpType::Rdm, "?ep=rdm"),
                    FabricEndpoint::Rdm => (EpType::Msg, "?ep=msg (or no ep)"),
                };
                if msgr_fabric::probe(&p.name, other).is_ok() {
                    Availability::Unavailable(format!(
                        "{e}; provider `{}` offers only FI_EP_{} endpoints here: use fabric+{}://…{query}",
                        p.name,
                        other_name(other),
                        p.name
                    ))
                } else {
                    Availability::Unavailable(e.to_string())
                }
            }
        })
        .clone()
}

fn other_name(ep: EpType) -> &'static str {
    match ep {
        EpType::Msg => "MSG",
        EpType::Rdm => "RDM",
    }
}

/// What `inject(HalfClose)` answers on every fabric link.
#[cfg(feature = "fault-injection")]
fn no_half_close(kind: &TransportKind) -> TransportError {
    TransportError::Unavailable {
        kind: kind.clone(),
        reason: "half-close has no libfabric equivalent".into(),
    }
}

/// What `attach` answers: fabric links stay on the worker that made them.
fn no_migration(kind: &TransportKind) -> TransportError {
    TransportError::Unavailable {
        kind: kind.clone(),
        reason: "fabric links do not move between workers".into(),
    }
}

/// What opening either transport for one worker starts with: its kind,
/// refused if the provider is not here; the Net the configuration asks for,
/// with those options (to reopen it on another domain); a handle of the
/// worker's registry of its own.
fn open_worker(
    provider: &FabricProvider,
    registry: &Registry,
    ctx: &TransportContext,
) -> Result<(TransportKind, NetOptions, Net, Registry), TransportError> {
    let kind = TransportKind::Fabric(provider.clone());
    if let Availability::Unavailable(reason) = probe(provider) {
        return Err(TransportError::Unavailable { kind, reason });
    }
    let net_options = NetOptions::of(ctx);
    let net = open_net(&kind, None, net_options)?;
    let registry = registry
        .try_clone()
        .map_err(|e| TransportError::io("clone mio registry", e))?;
    Ok((kind, net_options, net, registry))
}

/// Opens a worker's Net for `kind` (on the domain serving `site`, if
/// given), with the rendezvous reads and the CQ wait object `asked` asks
/// for. Where `Auto` finds the reads withheld in this libfabric
/// ([`msgr_fabric::rma_withheld`]), says so once per process: large units
/// then go through the send slots.
fn open_net(
    kind: &TransportKind,
    site: Option<Site>,
    asked: NetOptions,
) -> Result<Net, TransportError> {
    let TransportKind::Fabric(p) = kind else {
        unreachable!("a fabric transport has a fabric kind");
    };
    let mode = asked.rendezvous;
    let cq_wait = match asked.cq_wait {
        FabricCqWait::Fd => CqWait::Fd,
        FabricCqWait::Poll => CqWait::Poll,
    };
    let net = Net::open_with(&p.name, ep_type(p), 8192, site, rma_choice(mode), cq_wait)
        .map_err(|e| fab_err(kind, e))?;
    if let (FabricRendezvous::Auto, Some(why)) = (mode, msgr_fabric::rma_withheld(&p.name)) {
        static NOTED: std::sync::Once = std::sync::Once::new();
        NOTED.call_once(|| {
            tracing::info!(provider = %p.name, reason = why, rma = ?net.rma(), "fabric rendezvous reads withheld (fabric_rendezvous = auto)");
        });
    }
    Ok(net)
}

/// What the configuration asks of a worker's Net, kept to open it again
/// on another domain.
#[derive(Clone, Copy, Debug)]
pub(crate) struct NetOptions {
    pub(crate) rendezvous: FabricRendezvous,
    pub(crate) cq_wait: FabricCqWait,
}

impl NetOptions {
    pub(crate) fn of(ctx: &TransportContext) -> Self {
        NetOptions {
            rendezvous: ctx.rdma.fabric_rendezvous,
            cq_wait: ctx.rdma.fabric_cq_wait,
        }
    }
}

/// What `fabric_rendezvous` asks of a Net's reads.
fn rma_choice(mode: FabricRendezvous) -> RmaChoice {
    match mode {
        FabricRendezvous::Auto => RmaChoice::IfSound,
        FabricRendezvous::Off => RmaChoice::Never,
        FabricRendezvous::On => RmaChoice::Always,
        FabricRendezvous::Write => RmaChoice::Writes,
    }
}

fn fab_err(kind: &TransportKind, e: FabricError) -> TransportError {
    TransportError::Unavailable {
        kind: kind.clone(),
        reason: e.to_string(),
    }
}
