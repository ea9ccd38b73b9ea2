//! What the connection handles and the workers share: the messenger's
//! [`Shared`] state, each connection's [`ConnInner`], the commands that
//! carry them to a worker ([`Command`], through its [`WorkerHandle`] or,
//! on the worker's own thread, [`LOCAL_WORKER`]), and which worker owns
//! which peer. It imports no handle, call or worker module: they all
//! build on it.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::Sender;
use mio::Waker;
use msgr_addr::{EntityAddr, TransportKind};
use msgr_backends::{DetachedLink, TransportContext, TransportStats};
use msgr_proto::{
    session::Hello, FaultReason, LinkId, LocalIdentity, PeerInfo, Phase, Policy, Session,
};
use parking_lot::Mutex;

use crate::config::MessengerConfig;
use crate::counters::Counters;
use crate::pending::Pending;
use crate::regions::RegionTable;
use crate::replies::PendingCalls;
use crate::throttle::RxThrottle;

/// State shared by the facade, the workers and the connection handles.
pub(crate) struct Shared {
    pub(crate) id: u64,
    pub(crate) local: LocalIdentity,
    pub(crate) cfg: MessengerConfig,
    pub(crate) counters: Counters,
    pub(crate) workers: Vec<WorkerHandle>,
    pub(crate) registry: Mutex<HashMap<EntityAddr, Arc<ConnInner>>>,
    pub(crate) throttle: Arc<RxThrottle>,
    pub(crate) link_ids: Arc<AtomicU64>,
    pub(crate) transport_ctx: TransportContext,
    pub(crate) session_keys: AtomicU64,
    /// Every address listened on (the first is `local.addr`), and whether
    /// it still is.
    pub(crate) bound: Mutex<Vec<(EntityAddr, bool)>>,
    /// Regions exposed to one-sided operations ([`crate::rma`]).
    pub(crate) regions: Arc<RegionTable>,
}

impl Shared {
    /// Forgets the connection of session `key` as the one to `addr`'s peer,
    /// if it still is: the next connect to that peer opens a new session.
    pub(crate) fn unregister(&self, key: u64, addr: &EntityAddr) {
        let k = peer_key(addr);
        let mut reg = self.registry.lock();
        if reg.get(&k).is_some_and(|c| c.key == key) {
            reg.remove(&k);
        }
    }

    pub(crate) fn next_session_key(&self) -> u64 {
        self.session_keys.fetch_add(1, Ordering::Relaxed)
    }
}

/// How other threads reach a worker.
pub(crate) struct WorkerHandle {
    tx: Sender<Command>,
    waker: Arc<Waker>,
    sleeping: Arc<AtomicBool>,
    /// Set if the worker's thread died of a panic (a bug in msgr or a
    /// backend): its sessions are gone, and sends to them fail.
    dead: Arc<AtomicBool>,
}

impl WorkerHandle {
    pub(crate) fn new(tx: Sender<Command>, waker: Arc<Waker>, sleeping: Arc<AtomicBool>) -> Self {
        WorkerHandle {
            tx,
            waker,
            sleeping,
            dead: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Queues a command and wakes the worker if it is blocked.
    pub(crate) fn submit(&self, cmd: Command) {
        let sent = self.tx.send(cmd).is_ok();
        // Pairs with the fence in the worker's loop: either it sees our
        // command, or we see it asleep (the channel's own orderings are weaker).
        std::sync::atomic::fence(Ordering::SeqCst);
        if sent && self.sleeping.load(Ordering::SeqCst) {
            let _ = self.waker.wake();
        }
    }

    /// Whether the worker said it is about to block in its poll (or is
    /// blocked there): a reply then comes only after the kernel woke it.
    pub(crate) fn is_asleep(&self) -> bool {
        self.sleeping.load(Ordering::Relaxed)
    }

    /// Whether no command is waiting in the channel.
    pub(crate) fn is_idle(&self) -> bool {
        self.tx.is_empty()
    }

    /// Whether the worker's thread died ([`run_guarded`](crate::worker::run_guarded)).
    pub(crate) fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    pub(crate) fn dead_flag(&self) -> Arc<AtomicBool> {
        self.dead.clone()
    }

    pub(crate) fn waker(&self) -> Arc<Waker> {
        self.waker.clone()
    }
}

/// Which peer a session belongs to, for routing: the address without its nonce
/// (a restarted peer is the same peer), unless it does not listen (port 0),
/// where only the nonce tells clients apart.
pub(crate) fn peer_key(addr: &EntityAddr) -> EntityAddr {
    if addr.socket.port() == 0 {
        addr.clone()
    } else {
        addr.clone().with_nonce(0)
    }
}

/// The worker that owns sessions with `key`.
pub(crate) fn owner_of(key: &EntityAddr, workers: usize) -> usize {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut h);
    (h.finish() % workers as u64) as usize
}

/// What other threads (and callbacks) ask of a worker.
pub(crate) enum Command {
    /// Open a session for this new handle.
    Connect { conn: Arc<ConnInner> },
    /// Time out call `id` of session `key` at `at` (an async call's
    /// deadline; a blocking call keeps its own).
    CallDeadline { key: u64, id: u64, at: Instant },
    /// Stop listening (`token`, worker 0) and close every link over the
    /// transport `kind` (every worker): `Messenger::unbind`.
    Unbind {
        token: Option<mio::Token>,
        kind: TransportKind,
    },
    /// Take what `Connection::send` queued on this connection (one
    /// command per batch: later sends add to what it takes).
    Flush { conn: Arc<ConnInner> },
    /// End a session now.
    MarkDown { key: u64 },
    /// End a session after draining.
    Close { key: u64 },
    /// Produce (or imitate) a fault on a session's link.
    #[cfg(feature = "fault-injection")]
    Inject { key: u64, fault: LinkFault },
    /// Take over an accepted link whose session lives here. Boxed: rare,
    /// and five times the size of a `Send`, which every command would pay.
    Adopt(Box<Adoption>),
    /// Close every registration of an exposed region (it was revoked or
    /// dropped: `crate::rma`).
    RmaRevoke { region: u64 },
    /// Report the backends' own counters and the sessions' memory.
    Stats {
        reply: std::sync::mpsc::Sender<WorkerStats>,
    },
    /// Stop listening, close sessions, stop by the deadline.
    Shutdown { deadline: Instant },
}

/// What a worker reports for [`Command::Stats`].
pub(crate) struct WorkerStats {
    /// Each of its transports' own counters and gauges.
    pub(crate) transports: Vec<TransportStats>,
    /// Sessions it owns, and those whose handshake is under way.
    pub(crate) sessions: usize,
    /// Bytes their state holds: engines, queues' capacity, the worker's
    /// per-session slot and the connection handle's shared part.
    pub(crate) session_bytes: usize,
}

/// An accepted, identified link on its way to the worker that owns its
/// session.
pub(crate) struct Adoption {
    pub(crate) link: LinkId,
    pub(crate) detached: DetachedLink,
    pub(crate) session: Session,
    pub(crate) hello: Hello,
    pub(crate) transport: TransportKind,
}

/// A fault asked of a session's link: one the backend produces for real, or
/// one it can only imitate.
#[cfg(feature = "fault-injection")]
pub(crate) enum LinkFault {
    Real(msgr_backends::RealFault),
    Simulated(msgr_backends::SimulatedFault),
}

/// The worker's last published `ConnectionStatus` fields.
pub(crate) struct PublishedStatus {
    pub(crate) phase: Phase,
    pub(crate) faults: u64,
    pub(crate) last_fault: Option<FaultReason>,
    pub(crate) attempts: u32,
    pub(crate) retry_at: Option<Instant>,
}

pub(crate) struct ConnInner {
    pub(crate) key: u64,
    pub(crate) worker: usize,
    pub(crate) shared: Arc<Shared>,
    pub(crate) target: EntityAddr,
    pub(crate) policy: Policy,
    /// The entity the application dialled, if it named one
    /// ([`crate::Messenger::connect_to`]): whoever answers must be it.
    pub(crate) expected: Option<msgr_addr::EntityName>,
    /// More addresses of the peer after `target` ([`crate::Messenger::connect_any`]).
    pub(crate) alternates: Mutex<Vec<EntityAddr>>,
    pub(crate) peer: Mutex<Option<PeerInfo>>,
    pub(crate) state: AtomicU8,
    /// What `send` encoded and the worker has not taken yet, and the
    /// messages and bytes handed to `send` ...
    pub(crate) pending: Mutex<Pending>,
    /// ... and those that left the session queue (set by the worker).
    pub(crate) released: [AtomicU64; 2],
    /// Set by the worker when the phase or the fault count changes.
    pub(crate) status: Mutex<PublishedStatus>,
    /// The largest front and data segments the peer takes (the session's
    /// `send_limits`, published by the worker when the session opens).
    pub(crate) send_limits: [AtomicU32; 2],
    /// Calls waiting for their replies ([`Connection::call`](crate::Connection::call)).
    pub(crate) calls: PendingCalls,
    /// Async senders waiting for queue room ([`Connection::send_async`](crate::Connection::send_async)).
    pub(crate) room: RoomWaiters,
    /// The application's own state for the connection
    /// ([`Connection::user_state`](crate::Connection::user_state)).
    pub(crate) user: std::sync::OnceLock<Box<dyn std::any::Any + Send + Sync>>,
}

/// Wakes a thread parked in [`Connection::send_timeout`](crate::Connection::send_timeout).
pub(crate) struct ThreadWaker(pub(crate) std::thread::Thread);

impl std::task::Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// Wakers of senders waiting for room in a connection's queue (async ones,
/// and blocked `send_timeout` callers). The worker looks at one flag after
/// it releases messages: nothing else is paid while no one waits.
#[derive(Default)]
pub(crate) struct RoomWaiters {
    waiting: std::sync::atomic::AtomicBool,
    wakers: Mutex<Vec<std::task::Waker>>,
}

impl RoomWaiters {
    pub(crate) fn register(&self, w: &std::task::Waker) {
        let mut ws = self.wakers.lock();
        if !ws.iter().any(|x| x.will_wake(w)) {
            ws.push(w.clone());
        }
        self.waiting.store(true, Ordering::SeqCst);
    }

    /// The worker released messages: wake whoever waits for room.
    pub(crate) fn released(&self) {
        if self.waiting.load(Ordering::SeqCst) {
            self.waiting.store(false, Ordering::SeqCst);
            let ws = std::mem::take(&mut *self.wakers.lock());
            for w in ws {
                w.wake();
            }
        }
    }
}

/// What a worker thread keeps for the commands its own dispatcher
/// callbacks issue, which need no channel or wake-up.
pub(crate) struct LocalWorker {
    /// The messenger's id.
    pub(crate) messenger: u64,
    /// The worker's index in it.
    pub(crate) worker: usize,
    /// Commands issued on this thread, in order.
    pub(crate) commands: Vec<Command>,
}

impl LocalWorker {
    pub(crate) fn new(messenger: u64, worker: usize) -> Self {
        LocalWorker {
            messenger,
            worker,
            commands: Vec::new(),
        }
    }
}

thread_local! {
    /// Set while a worker thread runs (see [`LocalWorker`]).
    pub(crate) static LOCAL_WORKER: RefCell<Option<LocalWorker>> = const { RefCell::new(None) };
}

/// Whether this thread is a worker's (a dispatcher callback runs on one):
/// it must not wait for its own worker.
pub(crate) fn on_worker_thread() -> bool {
    LOCAL_WORKER.with(|l| l.borrow().is_some())
}

/// Bytes of a connection handle's shared part (one per session).
pub(crate) fn handle_bytes() -> usize {
    std::mem::size_of::<ConnInner>()
}

impl ConnInner {
    /// Whether this thread is the worker that owns the connection (a
    /// dispatcher callback of it): what this thread waits for, it cannot
    /// also deliver.
    pub(crate) fn on_owning_worker(&self) -> bool {
        LOCAL_WORKER.with(|l| {
            l.borrow()
                .as_ref()
                .is_some_and(|w| w.messenger == self.shared.id && w.worker == self.worker)
        })
    }

    /// Hands a command to the owning worker: directly if we are on that
    /// worker's thread (a dispatcher callback), else through its channel.
    #[inline]
    pub(crate) fn dispatch(&self, cmd: Command) {
        let worker = &self.shared.workers[self.worker];
        let cmd = LOCAL_WORKER.with(|l| match &mut *l.borrow_mut() {
            // On the owning worker's thread: no channel, no wake-up. Only while
            // its channel is empty, though: a command another thread queued
            // before this one must not be overtaken.
            Some(local)
                if local.messenger == self.shared.id
                    && local.worker == self.worker
                    && worker.is_idle() =>
            {
                local.commands.push(cmd);
                None
            }
            _ => Some(cmd),
        });
        if let Some(cmd) = cmd {
            worker.submit(cmd);
        }
    }
}
