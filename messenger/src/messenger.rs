//! The facade: build, bind, start, connect, shut down.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use msgr_addr::{EntityAddr, EntityName, TransportKind};
use msgr_backends::{
    availability, open_transport, Availability, TransportContext, TransportError, TransportStats,
    LISTENER_TOKEN_BASE,
};
use msgr_proto::{FaultReason, LinkFailure, LocalIdentity, Message, Policy};
use parking_lot::Mutex;
use thiserror::Error;

use crate::config::MessengerConfig;
use crate::counters::Counters;
use crate::dispatcher::Dispatcher;
use crate::state::{owner_of, peer_key, Command, Shared};
use crate::throttle::RxThrottle;
use crate::worker::{run_guarded, Worker, WorkerReport};
use crate::Connection;

/// Messenger-level failures.
///
/// ```
/// use std::sync::Arc;
/// use msgr::{EntityName, Messenger, MessengerError, NullDispatcher, Policy};
/// let m = Messenger::builder(EntityName::client(1)).without_env().start(Arc::new(NullDispatcher))?;
/// let err = m.connect_with(&"tcp://127.0.0.1:9".parse()?, Policy::Server).unwrap_err();
/// assert!(matches!(err, MessengerError::BadPolicy(Policy::Server)));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Error)]
#[non_exhaustive]
pub enum MessengerError {
    /// The transport for an address cannot be used; the reason says why.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// Lossy and lossless clients connect; `Server` is what the accepting side is.
    #[error("policy {0:?} cannot be used to connect")]
    BadPolicy(Policy),
    /// The messenger is shutting down.
    #[error("messenger is shut down")]
    ShutDown,
    /// An address (vector) that cannot be dialled.
    #[error("bad address: {0}")]
    BadAddress(String),
    /// A worker thread could not be started.
    #[error("starting worker: {0}")]
    Spawn(std::io::Error),
    /// The configuration from the environment or its file is not valid.
    #[error(transparent)]
    Config(#[from] crate::ConfigError),
    /// The worker that would own the connection died (a panic: see
    /// [`ShutdownReport::workers_died`]).
    #[error("the messenger's worker {0} has died")]
    WorkerStopped(usize),
}

msgr_addr::debug_is_display!(MessengerError);

/// What [`Messenger::shutdown`] reports.
///
/// ```
/// use std::{sync::Arc, time::Duration};
/// use msgr::{EntityName, Messenger, NullDispatcher};
/// let mut m = Messenger::builder(EntityName::client(1)).without_env().start(Arc::new(NullDispatcher))?;
/// let report = m.shutdown(Duration::from_secs(1));
/// assert_eq!(report, msgr::ShutdownReport::default()); // nothing was left
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShutdownReport {
    /// Queued messages that were not delivered (dropped at the deadline or by
    /// resets during the drain).
    pub undelivered: u64,
    /// Sessions still open at the deadline, closed forcibly.
    pub forced_sessions: usize,
    /// Transport links still open after the workers stopped (should be 0).
    pub leaked_links: usize,
    /// Links still closing at the deadline (writing the last output of a
    /// session that had ended, to a peer that did not take it), aborted.
    /// Shutdown waits for closing links as it does for sessions.
    pub aborted_links: usize,
    /// Worker threads that died of a panic (should be 0: a bug; their
    /// sessions were lost, and `worker_deaths` counts them as it happens).
    pub workers_died: usize,
}

/// Builds a [`Messenger`].
///
/// ```no_run
/// use std::sync::Arc;
/// use msgr::{Messenger, NullDispatcher, EntityName};
/// let mut m = Messenger::builder(EntityName::server(1))
///     .bind("tcp://127.0.0.1:6800".parse().unwrap())
///     .start(Arc::new(NullDispatcher))
///     .unwrap();
/// println!("listening on {}", m.addr().expect("bound"));
/// m.shutdown(std::time::Duration::from_secs(1));
/// ```
pub struct MessengerBuilder {
    name: EntityName,
    /// The application's own configuration, if it gave one.
    cfg: Option<MessengerConfig>,
    /// Read `MSGR_CONFIG` and `MSGR_*` when no configuration was given.
    from_env: bool,
    bind: Vec<EntityAddr>,
    credentials: Option<Arc<msgr_proto::auth::Credentials>>,
}

impl MessengerBuilder {
    /// Uses this configuration, as it is: the environment is not read (an
    /// application that wants it too starts from
    /// [`MessengerConfig::from_env`]). Without this call the builder uses
    /// the defaults, then `MSGR_CONFIG`'s file, then `MSGR_<KEY>` variables
    /// (see [`MessengerBuilder::without_env`]).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use msgr::{EntityName, Messenger, MessengerConfig, NullDispatcher};
    /// let mut cfg = MessengerConfig::default();
    /// cfg.set("workers", "1")?;
    /// let m = Messenger::builder(EntityName::client(1)).config(cfg).start(Arc::new(NullDispatcher))?;
    /// assert_eq!(m.name(), &EntityName::client(1));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn config(mut self, cfg: MessengerConfig) -> Self {
        self.cfg = Some(cfg);
        self
    }

    /// Without a [`MessengerBuilder::config`], use the defaults alone: no
    /// `MSGR_CONFIG` file, no `MSGR_*` variables (for a program whose
    /// environment is not its configuration).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use msgr::{EntityName, Messenger, NullDispatcher};
    /// // MSGR_* variables and MSGR_CONFIG are ignored: the defaults alone.
    /// let m = Messenger::builder(EntityName::client(1)).without_env().start(Arc::new(NullDispatcher))?;
    /// assert!(m.addrs().is_empty()); // the default binds nothing
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn without_env(mut self) -> Self {
        self.from_env = false;
        self
    }

    /// Listens on `addr` (port 0 picks a free port; see [`Messenger::addr`]).
    /// The address's transport decides the backend. Without this call the
    /// configuration's `bind` key does (so a file or the environment alone
    /// can pick the backend); without either, the messenger only connects.
    ///
    /// Call it again to listen on more backends at once (say
    /// `rdmacm://…:7000` and `tcp://…:6800`): the first address is the
    /// messenger's identity ([`Messenger::addr`]), every one accepts, and a
    /// peer's session resumes over whichever it reaches
    /// ([`Messenger::connect_any`] on its side). [`Messenger::addrs`] lists
    /// them.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use msgr::{EntityName, Messenger, NullDispatcher};
    /// let m = Messenger::builder(EntityName::server(1))
    ///     .without_env()
    ///     .bind("tcp://127.0.0.1:0".parse()?)
    ///     .bind("tcp://127.0.0.1:0".parse()?)
    ///     .start(Arc::new(NullDispatcher))?;
    /// assert_eq!(m.addrs().len(), 2);
    /// assert_ne!(m.addr().expect("bound").socket.port(), 0); // port 0 became a free port
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn bind(mut self, addr: EntityAddr) -> Self {
        self.bind.push(addr);
        self
    }

    /// Proves this identity in the `auth` and `secure` modes (the
    /// configuration's `security` key), in place of the `key_file` and
    /// `keyring` files; the credentials' name must be the messenger's.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use msgr::auth::{Credentials, Keyring, StaticKeypair};
    /// use msgr::{EntityName, Messenger, MessengerConfig, NullDispatcher};
    ///
    /// let me = EntityName::server(1);
    /// let key = StaticKeypair::generate();
    /// let mut ring = Keyring::new();
    /// ring.insert(me.clone(), key.public());
    /// let mut cfg = MessengerConfig::default();
    /// cfg.set("security", "secure").unwrap();
    /// let mut m = Messenger::builder(me.clone())
    ///     .config(cfg)
    ///     .credentials(Credentials::new(me, key, Arc::new(ring)))
    ///     .start(Arc::new(NullDispatcher))
    ///     .unwrap();
    /// m.shutdown(std::time::Duration::from_secs(1));
    /// ```
    pub fn credentials(mut self, creds: msgr_proto::auth::Credentials) -> Self {
        self.credentials = Some(Arc::new(creds));
        self
    }

    /// Starts the workers and the listener; messages go to `dispatcher`.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use msgr::{EntityName, Messenger, NullDispatcher};
    /// let mut m = Messenger::builder(EntityName::client(1)).without_env().start(Arc::new(NullDispatcher))?;
    /// assert!(m.connections().is_empty());
    /// m.shutdown(std::time::Duration::from_secs(1));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn start(self, dispatcher: Arc<dyn Dispatcher>) -> Result<Messenger, MessengerError> {
        Messenger::start(self, dispatcher)
    }
}

/// A messenger: one entity's endpoint for framed, ordered messages to peers
/// over any compiled-in transport.
///
/// Use [`Messenger::builder`] to bind and start one, [`Messenger::connect`] to
/// open a [`Connection`], and implement [`Dispatcher`] to receive.
///
/// # Dropping without `shutdown`
///
/// Dropping a messenger that was not shut down runs
/// [`Messenger::shutdown`] with a one-second deadline, and blocks the
/// dropping thread while it does: the listeners close, every session
/// drains what it has queued (a lossless one until the peer acknowledged
/// it) until the deadline, what is still queued then is dropped and its
/// sessions closed forcibly, the worker threads are joined, calls still
/// waiting for a reply fail with [`CallError::Reset`](crate::CallError::Reset),
/// and the dispatcher's [`on_shutdown`](Dispatcher::on_shutdown) runs
/// (which ends an [`Inbox`](crate::Inbox)'s streams). The
/// [`ShutdownReport`] is discarded: call `shutdown` yourself to choose the
/// deadline or to learn what was not delivered. Dropping after `shutdown`
/// does nothing more.
///
/// ```
/// use std::{sync::Arc, time::Duration};
/// use msgr::{EntityName, Inbox, Message, Messenger, NullDispatcher};
///
/// let inbox = Inbox::new();
/// let server = Messenger::builder(EntityName::server(1))
///     .without_env()
///     .bind("tcp://127.0.0.1:0".parse()?)
///     .start(inbox.dispatcher())?;
/// let client = Messenger::builder(EntityName::client(1))
///     .without_env()
///     .start(Arc::new(NullDispatcher))?;
/// client.connect(server.addr().expect("bound"))?.send(Message::new(1, &b"sent, then dropped"[..], &b""[..]))?;
/// drop(client); // drains for up to a second, then joins its workers
/// let (_, msg) = inbox.recv_timeout(Duration::from_secs(10)).expect("delivered");
/// assert_eq!(&msg.front[..], b"sent, then dropped");
/// drop(server); // the inbox hears on_shutdown: it holds no more
/// assert!(inbox.recv_timeout(Duration::from_secs(1)).is_none());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Messenger {
    pub(crate) shared: Arc<Shared>,
    /// Where messages and connection events go (the workers hold it too).
    dispatcher: Arc<dyn Dispatcher>,
    threads: Vec<JoinHandle<WorkerReport>>,
    report: Option<ShutdownReport>,
}

static MESSENGER_IDS: AtomicU64 = AtomicU64::new(1);

impl Messenger {
    /// Starts building a messenger for entity `name`.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use msgr::{EntityName, Messenger, NullDispatcher};
    /// let m = Messenger::builder(EntityName::peer(3)).without_env().start(Arc::new(NullDispatcher))?;
    /// assert_eq!(m.name().to_string(), "peer.3");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn builder(name: EntityName) -> MessengerBuilder {
        MessengerBuilder {
            name,
            cfg: None,
            from_env: true,
            bind: Vec::new(),
            credentials: None,
        }
    }

    fn start(
        mut b: MessengerBuilder,
        dispatcher: Arc<dyn Dispatcher>,
    ) -> Result<Messenger, MessengerError> {
        let mut cfg = match b.cfg.take() {
            Some(cfg) => cfg,
            None if b.from_env => MessengerConfig::from_env()?,
            None => MessengerConfig::default(),
        };
        cfg.session.security = cfg.security_for(&b.name, b.credentials.take())?;
        // Derived limits, once, from the final values (never by `set`).
        cfg.session.limits = cfg.frame_limits();
        if b.bind.is_empty() {
            b.bind.extend(cfg.bind.clone());
        }
        let nonce = rand::random::<u64>() | 1;
        let mut ctx = TransportContext::new(cfg.session.limits);
        ctx.rdma = cfg.rdma;
        ctx.tcp_socket_buffer = cfg.tcp_socket_buffer;
        let mut prepared = Vec::new();
        for _ in 0..cfg.workers.max(1) {
            prepared.push(Worker::prepare().map_err(MessengerError::Spawn)?);
        }
        // Each worker gets every available backend; unavailable ones are simply
        // not there, and connecting to such an address says why.
        let mut worker_transports = Vec::new();
        for (poll, handle, _, _) in &prepared {
            // Backends that take buffers back from the application wake
            // their worker through it.
            let ctx = TransportContext {
                waker: Some(handle.waker()),
                ..ctx.clone()
            };
            let mut ts = Vec::new();
            // TCP always (when built), the bound transport too; others open on
            // first connect.
            if availability(&TransportKind::Tcp) == Availability::Available {
                ts.push(open_transport(&TransportKind::Tcp, poll.registry(), &ctx)?);
            }
            for addr in &b.bind {
                use msgr_backends::Transport;
                if !ts.iter().any(|t| t.kind() == addr.transport) {
                    ts.push(open_transport(&addr.transport, poll.registry(), &ctx)?);
                }
            }
            worker_transports.push(ts);
        }
        // The listeners live on worker 0.
        let mut listeners = Vec::new();
        let mut bound_addrs = Vec::new();
        for (i, addr) in b.bind.iter().enumerate() {
            use msgr_backends::Transport;
            let ts = &mut worker_transports[0];
            let t = ts
                .iter()
                .position(|t| t.kind() == addr.transport)
                .ok_or_else(|| {
                    let reason = match availability(&addr.transport) {
                        Availability::Unavailable(r) => r,
                        Availability::Available => "not opened".into(),
                    };
                    TransportError::Unavailable {
                        kind: addr.transport.clone(),
                        reason,
                    }
                })?;
            let token = mio::Token(LISTENER_TOKEN_BASE + i);
            let bound = ts[t].listen(addr, token)?;
            listeners.push((t, token));
            bound_addrs.push(bound.with_nonce(nonce));
        }
        let local_addr = bound_addrs
            .first()
            .cloned()
            .unwrap_or_else(|| EntityAddr::tcp(([0, 0, 0, 0], 0).into()).with_nonce(nonce));
        let throttle = RxThrottle::new(cfg.rx_throttle_messages, cfg.rx_throttle_bytes);
        let mut handles = Vec::new();
        let mut rest = Vec::new();
        for (poll, handle, rx, sleeping) in prepared {
            throttle.add_waker(handle.waker());
            handles.push(handle);
            rest.push((poll, rx, sleeping));
        }
        let shared = Arc::new(Shared {
            id: MESSENGER_IDS.fetch_add(1, Ordering::Relaxed),
            local: LocalIdentity {
                name: b.name,
                addr: local_addr,
                dials: msgr_proto::session::DialAttempts::new(),
            },
            cfg,
            counters: Counters::default(),
            workers: handles,
            registry: Mutex::new(HashMap::new()),
            throttle,
            link_ids: ctx.link_ids.clone(),
            transport_ctx: ctx.clone(),
            session_keys: AtomicU64::new(1),
            bound: Mutex::new(bound_addrs.into_iter().map(|a| (a, true)).collect()),
            regions: Arc::default(),
        });
        let mut threads = Vec::new();
        for (idx, ((poll, rx, sleeping), ts)) in rest.into_iter().zip(worker_transports).enumerate()
        {
            let l = if idx == 0 {
                std::mem::take(&mut listeners)
            } else {
                Vec::new()
            };
            let prepared = (poll, rx, sleeping);
            let w = Worker::new(idx, shared.clone(), dispatcher.clone(), prepared, ts, l);
            let dead = shared.workers[idx].dead_flag();
            let guard = shared.clone();
            let cpus = &shared.cfg.worker_cpus;
            let cpu = (!cpus.is_empty()).then(|| cpus[idx % cpus.len()]);
            let th = std::thread::Builder::new()
                .name(format!("msgr-worker-{idx}"))
                .spawn(move || {
                    if let Some(cpu) = cpu {
                        // Checked when configured; the process's own mask
                        // may have shrunk since.
                        if let Err(e) = crate::affinity::pin_current_thread(cpu) {
                            tracing::warn!(worker = idx, cpu, error = %e, "worker not pinned");
                        }
                    }
                    // Its connections read closed from then on: `send`
                    // looks at one word per message, not at the worker.
                    let mark_closed = || {
                        for c in guard.registry.lock().values() {
                            if c.worker == idx {
                                Connection::from_inner(c.clone())
                                    .set_state(crate::ConnectionState::Closed);
                            }
                        }
                    };
                    run_guarded(
                        idx,
                        &dead,
                        &guard.counters.worker_deaths,
                        mark_closed,
                        || w.run(),
                    )
                })
                .map_err(MessengerError::Spawn)?;
            threads.push(th);
        }
        tracing::info!(addr = %shared.local.addr, "messenger started");
        Ok(Messenger {
            shared,
            dispatcher,
            threads,
            report: None,
        })
    }

    /// The address this messenger listens on first, what peers connect to
    /// (with the port chosen at bind time and its nonce); `None` if it
    /// never bound (a messenger that only connects has no address a peer
    /// could dial). After [`Messenger::unbind`] it is still the
    /// messenger's identity; [`Messenger::addrs`] lists what it listens on.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use msgr::{EntityName, Messenger, NullDispatcher};
    /// let server = Messenger::builder(EntityName::server(1))
    ///     .without_env()
    ///     .bind("tcp://127.0.0.1:0".parse()?)
    ///     .start(Arc::new(NullDispatcher))?;
    /// let addr = server.addr().expect("bound");
    /// assert!(addr.is_loopback());
    /// assert_ne!(addr.socket.port(), 0);
    ///
    /// let client = Messenger::builder(EntityName::client(1)).without_env().start(Arc::new(NullDispatcher))?;
    /// assert_eq!(client.addr(), None);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn addr(&self) -> Option<&EntityAddr> {
        let bound = !self.shared.bound.lock().is_empty();
        bound.then_some(&self.shared.local.addr)
    }

    /// Every address this messenger listens on, in the order bound (the
    /// first is [`Messenger::addr`]): what a peer puts in its address
    /// vector for [`Messenger::connect_any`].
    ///
    /// ```
    /// use std::sync::Arc;
    /// use msgr::{EntityName, Messenger, NullDispatcher};
    /// let m = Messenger::builder(EntityName::server(1))
    ///     .without_env()
    ///     .bind("tcp://127.0.0.1:0".parse()?)
    ///     .start(Arc::new(NullDispatcher))?;
    /// assert_eq!(m.addrs().first(), Some(m.addr().expect("bound")));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn addrs(&self) -> crate::AddrVec {
        crate::AddrVec(
            self.shared
                .bound
                .lock()
                .iter()
                .filter(|(_, on)| *on)
                .map(|(a, _)| a.clone())
                .collect(),
        )
    }

    /// Stops listening on `addr` (one of [`Messenger::addrs`]) and closes
    /// every link over its backend, as an operator takes a backend out of
    /// service (a port going down, a device removed): sessions on those
    /// links go on over another address of their peers' vectors, or reset
    /// (lossy) or wait (lossless) as after any fault. False if `addr` is
    /// not listened on.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use msgr::{EntityName, Messenger, NullDispatcher};
    /// let m = Messenger::builder(EntityName::server(1))
    ///     .without_env()
    ///     .bind("tcp://127.0.0.1:0".parse()?)
    ///     .start(Arc::new(NullDispatcher))?;
    /// let addr = m.addr().expect("bound").clone();
    /// assert!(m.unbind(&addr));
    /// assert!(m.addrs().is_empty());
    /// assert!(!m.unbind(&addr)); // no longer listened on
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn unbind(&self, addr: &EntityAddr) -> bool {
        let mut bound = self.shared.bound.lock();
        let Some(i) = bound
            .iter()
            .position(|(a, on)| *on && a.transport == addr.transport && a.socket == addr.socket)
        else {
            return false;
        };
        bound[i].1 = false;
        let kind = addr.transport.clone();
        drop(bound);
        for (w, h) in self.shared.workers.iter().enumerate() {
            h.submit(Command::Unbind {
                token: (w == 0).then(|| mio::Token(LISTENER_TOKEN_BASE + i)),
                kind: kind.clone(),
            });
        }
        true
    }

    /// This messenger's entity name.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use msgr::{EntityName, Messenger, NullDispatcher};
    /// let m = Messenger::builder(EntityName::client(7)).without_env().start(Arc::new(NullDispatcher))?;
    /// assert_eq!(m.name(), &EntityName::client(7));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn name(&self) -> &EntityName {
        &self.shared.local.name
    }

    /// Opens (or returns the existing) connection to `addr` with the configured policy.
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use msgr::{EntityName, Inbox, Message, Messenger, NullDispatcher};
    /// # let inbox = Inbox::new();
    /// # let server = Messenger::builder(EntityName::server(1)).without_env()
    /// #     .bind("tcp://127.0.0.1:0".parse()?).start(inbox.dispatcher())?;
    /// # let client = Messenger::builder(EntityName::client(1)).without_env()
    /// #     .start(Arc::new(NullDispatcher))?;
    /// # let conn = client.connect(server.addr().expect("bound"))?;
    /// let conn = client.connect(server.addr().expect("bound"))?;
    /// conn.send(Message::new(1, &b"hi"[..], &b""[..]))?;
    /// assert!(inbox.recv_timeout(Duration::from_secs(10)).is_some());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn connect(&self, addr: &EntityAddr) -> Result<Connection, MessengerError> {
        self.connect_with(addr, self.shared.cfg.policy)
    }

    /// Opens (or returns the existing) connection to `addr` with `policy`.
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use msgr::{EntityName, Inbox, Message, Messenger, NullDispatcher};
    /// # let inbox = Inbox::new();
    /// # let server = Messenger::builder(EntityName::server(1)).without_env()
    /// #     .bind("tcp://127.0.0.1:0".parse()?).start(inbox.dispatcher())?;
    /// # let client = Messenger::builder(EntityName::client(1)).without_env()
    /// #     .start(Arc::new(NullDispatcher))?;
    /// # let conn = client.connect(server.addr().expect("bound"))?;
    /// use msgr::Policy;
    /// # let client = Messenger::builder(EntityName::client(2)).without_env()
    /// #     .start(Arc::new(NullDispatcher))?;
    /// let lossy = client.connect_with(server.addr().expect("bound"), Policy::LossyClient)?;
    /// assert_eq!(lossy.policy(), Policy::LossyClient);
    /// # drop(conn);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn connect_with(
        &self,
        addr: &EntityAddr,
        policy: Policy,
    ) -> Result<Connection, MessengerError> {
        self.open(std::slice::from_ref(addr), policy, None)
    }

    /// Opens a connection to the peer at any of `addrs`, its addresses in
    /// preference order (an [`crate::AddrVec`], say
    /// `[rdmacm://10.0.0.2:7000,tcp://10.0.0.2:6800]`): it dials the first;
    /// when a link fails, the next attempt dials the next address, round
    /// the vector, so a lossless session goes on over another backend
    /// when one fails — replaying what the peer had not acknowledged,
    /// exactly once and in order, as after any reconnect. Each move is
    /// counted (`transport_changes`) and logged (from, to, why). The peer
    /// must be one entity listening on all of them (several
    /// [`MessengerBuilder::bind`] calls).
    ///
    /// ```no_run
    /// # fn demo(m: &msgr::Messenger) -> Result<(), msgr::MessengerError> {
    /// let addrs: msgr::AddrVec = "[fabric+tcp://10.0.0.2:7000,tcp://10.0.0.2:6800]".parse().unwrap();
    /// let conn = m.connect_any(&addrs, msgr::Policy::LosslessClient)?;
    /// # Ok(()) }
    /// ```
    pub fn connect_any(
        &self,
        addrs: &crate::AddrVec,
        policy: Policy,
    ) -> Result<Connection, MessengerError> {
        if addrs.is_empty() {
            return Err(MessengerError::BadAddress("an empty address vector".into()));
        }
        self.open(&addrs.0, policy, None)
    }

    /// Opens a connection to entity `name` at `addr` with `policy`: whoever
    /// answers there must be `name` — in the `auth` and `secure` modes,
    /// must *prove* it is (the key the keyring lists for `name`); in `crc`
    /// mode, must say so. Anyone else ends the connection at its first
    /// handshake (`on_reset`: the peer is not the one dialled), so a host
    /// that took over the address — holding some other listed key — cannot
    /// pass for `name`. [`Messenger::connect_with`] takes whichever
    /// authenticated entity answers; use this one where it matters who.
    /// A connection to `addr` that already exists is returned as it is.
    ///
    /// ```no_run
    /// # use std::sync::Arc;
    /// # use msgr::{EntityName, Messenger, NullDispatcher, Policy};
    /// # let m = Messenger::builder(EntityName::client(1)).start(Arc::new(NullDispatcher)).unwrap();
    /// let conn = m.connect_to(
    ///     &EntityName::server(1),
    ///     &"tcp://127.0.0.1:6800".parse().unwrap(),
    ///     Policy::LosslessClient,
    /// )?;
    /// # Ok::<(), msgr::MessengerError>(())
    /// ```
    pub fn connect_to(
        &self,
        name: &msgr_addr::EntityName,
        addr: &EntityAddr,
        policy: Policy,
    ) -> Result<Connection, MessengerError> {
        self.open(std::slice::from_ref(addr), policy, Some(name.clone()))
    }

    /// [`Messenger::connect_any`] to the entity `name` only: whoever else
    /// answers at any of `addrs` is refused, as [`Messenger::connect_to`]
    /// refuses it at one address.
    ///
    /// ```
    /// use std::{sync::Arc, time::Duration};
    /// use msgr::{AddrVec, EntityName, Messenger, NullDispatcher, Policy};
    /// let server = Messenger::builder(EntityName::server(1))
    ///     .without_env()
    ///     .bind("tcp://127.0.0.1:0".parse()?)
    ///     .start(Arc::new(NullDispatcher))?;
    /// let client = Messenger::builder(EntityName::client(1)).without_env().start(Arc::new(NullDispatcher))?;
    /// let conn = client.connect_any_to(&EntityName::server(1), &server.addrs(), Policy::LosslessClient)?;
    /// conn.wait_connected(Duration::from_secs(10))?;
    /// // An empty vector names no one.
    /// assert!(client.connect_any_to(&EntityName::server(1), &AddrVec::new(), Policy::LosslessClient).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn connect_any_to(
        &self,
        name: &msgr_addr::EntityName,
        addrs: &crate::AddrVec,
        policy: Policy,
    ) -> Result<Connection, MessengerError> {
        if addrs.is_empty() {
            return Err(MessengerError::BadAddress("an empty address vector".into()));
        }
        self.open(&addrs.0, policy, Some(name.clone()))
    }

    fn open(
        &self,
        addrs: &[EntityAddr],
        policy: Policy,
        expected: Option<msgr_addr::EntityName>,
    ) -> Result<Connection, MessengerError> {
        let addr = &addrs[0];
        if self.report.is_some() {
            return Err(MessengerError::ShutDown);
        }
        if policy == Policy::Server {
            return Err(MessengerError::BadPolicy(policy));
        }
        for a in addrs {
            if let Availability::Unavailable(reason) = availability(&a.transport) {
                return Err(TransportError::Unavailable {
                    kind: a.transport.clone(),
                    reason,
                }
                .into());
            }
        }
        let key = peer_key(addr);
        let mut reg = self.shared.registry.lock();
        if let Some(c) = reg.get(&key).map(|c| Connection::from_inner(c.clone())) {
            if c.state() != crate::ConnectionState::Closed {
                return Ok(c);
            }
        }
        let worker = owner_of(&key, self.shared.workers.len());
        if self.shared.workers[worker].is_dead() {
            return Err(MessengerError::WorkerStopped(worker));
        }
        let conn = Connection::new(
            self.shared.clone(),
            self.shared.next_session_key(),
            worker,
            addr.clone(),
            policy,
            expected,
        );
        *conn.inner.alternates.lock() = addrs[1..].to_vec();
        reg.insert(key, conn.inner.clone());
        drop(reg);
        let inner = conn.inner.clone();
        self.shared.workers[worker].submit(Command::Connect { conn: inner });
        Ok(conn)
    }

    /// The connections currently alive (connecting, open or reconnecting).
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use msgr::{EntityName, Inbox, Message, Messenger, NullDispatcher};
    /// # let inbox = Inbox::new();
    /// # let server = Messenger::builder(EntityName::server(1)).without_env()
    /// #     .bind("tcp://127.0.0.1:0".parse()?).start(inbox.dispatcher())?;
    /// # let client = Messenger::builder(EntityName::client(1)).without_env()
    /// #     .start(Arc::new(NullDispatcher))?;
    /// # let conn = client.connect(server.addr().expect("bound"))?;
    /// assert_eq!(client.connections().len(), 1);
    /// assert_eq!(client.connections()[0].id(), conn.id());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn connections(&self) -> Vec<Connection> {
        let reg = self.shared.registry.lock();
        reg.values()
            .map(|c| Connection::from_inner(c.clone()))
            .filter(|c| c.state() != crate::ConnectionState::Closed)
            .collect()
    }

    /// Connects to every peer the configuration names (the `peers` key),
    /// with the configured `policy`: the connections in that order. For a
    /// program whose peers, and so whose backends, come from a file or the
    /// environment rather than its code.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use msgr::{EntityName, Messenger, MessengerConfig, NullDispatcher};
    /// let mut cfg = MessengerConfig::default();
    /// cfg.set("peers", "tcp://127.0.0.1:9").unwrap();
    /// let mut m = Messenger::builder(EntityName::client(1))
    ///     .config(cfg)
    ///     .start(Arc::new(NullDispatcher))
    ///     .unwrap();
    /// let conns = m.connect_peers().unwrap();
    /// assert_eq!(conns[0].target().to_string(), "tcp://127.0.0.1:9");
    /// m.shutdown(std::time::Duration::from_secs(1));
    /// ```
    ///
    /// # Errors
    /// As [`Messenger::connect_with`], for the first peer that fails.
    pub fn connect_peers(&self) -> Result<Vec<Connection>, MessengerError> {
        let policy = self.shared.cfg.policy;
        self.shared
            .cfg
            .peers
            .iter()
            .map(|a| self.connect_with(a, policy))
            .collect()
    }

    /// Ends the session with the peer at `addr`, if any, dropping its queue.
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use msgr::{EntityName, Inbox, Message, Messenger, NullDispatcher};
    /// # let inbox = Inbox::new();
    /// # let server = Messenger::builder(EntityName::server(1)).without_env()
    /// #     .bind("tcp://127.0.0.1:0".parse()?).start(inbox.dispatcher())?;
    /// # let client = Messenger::builder(EntityName::client(1)).without_env()
    /// #     .start(Arc::new(NullDispatcher))?;
    /// # let conn = client.connect(server.addr().expect("bound"))?;
    /// client.mark_down(server.addr().expect("bound"));
    /// // The session is gone: the next connect opens a new one.
    /// assert_ne!(client.connect(server.addr().expect("bound"))?.id(), conn.id());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn mark_down(&self, addr: &EntityAddr) {
        let c = self.shared.registry.lock().get(&peer_key(addr)).cloned();
        if let Some(c) = c.map(Connection::from_inner) {
            c.mark_down();
        }
    }

    /// Received messages and payload bytes the application still holds (the
    /// receive throttle's view). Drops to zero once every delivered message is
    /// dropped: a leak check for rx buffers.
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use msgr::{EntityName, Inbox, Message, Messenger, NullDispatcher};
    /// # let inbox = Inbox::new();
    /// # let server = Messenger::builder(EntityName::server(1)).without_env()
    /// #     .bind("tcp://127.0.0.1:0".parse()?).start(inbox.dispatcher())?;
    /// # let client = Messenger::builder(EntityName::client(1)).without_env()
    /// #     .start(Arc::new(NullDispatcher))?;
    /// # let conn = client.connect(server.addr().expect("bound"))?;
    /// conn.send(Message::new(1, &b"held"[..], &b""[..]))?;
    /// let (_, msg) = inbox.recv_timeout(Duration::from_secs(10)).expect("delivered");
    /// let (messages, bytes) = server.rx_held(); // the application holds it
    /// assert_eq!(messages, 1);
    /// assert!(bytes >= 4); // its payload (and what shares its buffer)
    /// drop(msg);
    /// assert_eq!(server.rx_held(), (0, 0));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn rx_held(&self) -> (usize, usize) {
        self.shared.throttle.held()
    }

    /// The messenger's counters.
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use msgr::{EntityName, Inbox, Message, Messenger, NullDispatcher};
    /// # let inbox = Inbox::new();
    /// # let server = Messenger::builder(EntityName::server(1)).without_env()
    /// #     .bind("tcp://127.0.0.1:0".parse()?).start(inbox.dispatcher())?;
    /// # let client = Messenger::builder(EntityName::client(1)).without_env()
    /// #     .start(Arc::new(NullDispatcher))?;
    /// # let conn = client.connect(server.addr().expect("bound"))?;
    /// use msgr::Counters;
    /// # let mut client = client;
    /// conn.send(Message::new(1, &b"count me"[..], &b""[..]))?;
    /// inbox.recv_timeout(Duration::from_secs(10)).expect("delivered");
    /// client.shutdown(Duration::from_secs(1)); // the counts are final
    /// assert_eq!(Counters::get(&client.counters().sessions_connected), 1);
    /// assert!(Counters::get(&client.counters().tx_messages) >= 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn counters(&self) -> &Counters {
        &self.shared.counters
    }

    /// The backends' own counters and gauges — for RDMA: credits held,
    /// credit stalls, pool occupancy, rendezvous counts — summed over the
    /// workers, one entry per backend. Each worker is asked; one that does
    /// not answer within a second is left out. Render them for Prometheus
    /// with [`Counters::transport_prometheus`].
    ///
    /// ```
    /// use std::sync::Arc;
    /// use msgr::{EntityName, Messenger, NullDispatcher, TransportKind};
    /// let mut m = Messenger::builder(EntityName::client(1))
    ///     .start(Arc::new(NullDispatcher))
    ///     .unwrap();
    /// let stats = m.transport_stats();
    /// // One entry per open backend (TCP keeps no counters of its own).
    /// assert!(stats.iter().any(|s| s.kind == TransportKind::Tcp));
    /// print!("{}", msgr::Counters::transport_prometheus(&stats));
    /// m.shutdown(std::time::Duration::from_secs(1));
    /// ```
    pub fn transport_stats(&self) -> Vec<TransportStats> {
        self.worker_stats().0
    }

    /// The memory this messenger holds for its connections, as its parts
    /// account for it: session state (engines, queue capacity, the
    /// workers' per-session slots and handles) and the transports' link
    /// buffers (TCP: send queues and receive buffers). Queued and
    /// delivered payloads are not in it (the application's: see
    /// [`Messenger::rx_held`]), nor the kernel's socket buffers, nor the
    /// RDMA and libfabric backends' pools (sized at start, not per
    /// connection: see their `transport_stats`). Divide by the sessions
    /// for what an idle connection costs ([`MemoryUse::per_session`]).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use msgr::{EntityName, Messenger, NullDispatcher};
    /// let mut m = Messenger::builder(EntityName::client(1))
    ///     .start(Arc::new(NullDispatcher))
    ///     .unwrap();
    /// let mem = m.memory();
    /// assert_eq!((mem.sessions, mem.per_session()), (0, 0));
    /// m.shutdown(std::time::Duration::from_secs(1));
    /// ```
    pub fn memory(&self) -> MemoryUse {
        let (transports, sessions, session_bytes) = self.worker_stats();
        let gauge = |name| {
            transports
                .iter()
                .flat_map(|t| &t.values)
                .filter(|(n, _)| *n == name)
                .map(|(_, v)| *v as usize)
                .sum()
        };
        MemoryUse {
            sessions,
            session_bytes,
            links: gauge("links"),
            link_buffer_bytes: gauge("buffer_bytes"),
        }
    }

    /// Every worker's transport stats, merged by backend, and the sessions'
    /// count and bytes. A worker that does not answer within a second is
    /// left out.
    fn worker_stats(&self) -> (Vec<TransportStats>, usize, usize) {
        let (tx, rx) = std::sync::mpsc::channel();
        for w in &self.shared.workers {
            w.submit(Command::Stats { reply: tx.clone() });
        }
        drop(tx);
        let deadline = Instant::now() + Duration::from_secs(1);
        let mut merged: Vec<TransportStats> = Vec::new();
        let (mut sessions, mut session_bytes) = (0, 0);
        for _ in 0..self.shared.workers.len() {
            let left = deadline.saturating_duration_since(Instant::now());
            let Ok(per_worker) = rx.recv_timeout(left) else {
                break;
            };
            sessions += per_worker.sessions;
            session_bytes += per_worker.session_bytes;
            for s in per_worker.transports {
                match merged.iter_mut().find(|m| m.kind == s.kind) {
                    Some(m) => {
                        for (name, v) in s.values {
                            match m.values.iter_mut().find(|(n, _)| *n == name) {
                                Some((_, total)) => *total += v,
                                None => m.values.push((name, v)),
                            }
                        }
                    }
                    None => merged.push(s),
                }
            }
        }
        (merged, sessions, session_bytes)
    }

    /// Stops listening, lets every session drain what it has queued until
    /// `timeout`, then closes what remains and joins the workers. Idempotent.
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use msgr::{EntityName, Inbox, Message, Messenger, NullDispatcher};
    /// # let inbox = Inbox::new();
    /// # let server = Messenger::builder(EntityName::server(1)).without_env()
    /// #     .bind("tcp://127.0.0.1:0".parse()?).start(inbox.dispatcher())?;
    /// # let client = Messenger::builder(EntityName::client(1)).without_env()
    /// #     .start(Arc::new(NullDispatcher))?;
    /// # let conn = client.connect(server.addr().expect("bound"))?;
    /// # let mut client = client;
    /// conn.send(Message::new(1, &b"bye"[..], &b""[..]))?;
    /// let report = client.shutdown(Duration::from_secs(5));
    /// assert_eq!(report.undelivered, 0); // drained before the deadline
    /// assert!(inbox.recv_timeout(Duration::from_secs(10)).is_some());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn shutdown(&mut self, timeout: Duration) -> ShutdownReport {
        if let Some(r) = self.report {
            return r;
        }
        let deadline = Instant::now() + timeout;
        for w in &self.shared.workers {
            w.submit(Command::Shutdown { deadline });
        }
        let mut report = ShutdownReport::default();
        for th in self.threads.drain(..) {
            match th.join() {
                Ok(r) => {
                    report.undelivered += r.undelivered;
                    report.forced_sessions += r.forced;
                    report.leaked_links += r.leaked_links;
                    report.aborted_links += r.aborted_links;
                    report.workers_died += usize::from(r.died);
                }
                Err(_) => {
                    tracing::error!("a worker thread panicked");
                    report.workers_died += 1;
                }
            }
        }
        // Calls still waiting will get no reply; handles refer back to the
        // shared state: break the cycle.
        let gone = FaultReason::Transport(LinkFailure::Local("the messenger shut down".into()));
        for c in self.shared.registry.lock().drain().map(|(_, c)| c) {
            c.calls.fail_all(&gone);
        }
        self.dispatcher.on_shutdown();
        self.report = Some(report);
        report
    }

    /// [`Messenger::shutdown`] as a future, for async code: the shutdown
    /// runs on a thread of its own and the future completes with its
    /// report (any executor; no runtime needed).
    ///
    /// ```
    /// use std::{sync::Arc, time::Duration};
    /// use msgr::{EntityName, Messenger, NullDispatcher};
    /// let m = Messenger::builder(EntityName::client(1)).without_env().start(Arc::new(NullDispatcher))?;
    /// let report = tokio::runtime::Runtime::new()?.block_on(m.shutdown_async(Duration::from_secs(1)));
    /// assert_eq!(report.workers_died, 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn shutdown_async(mut self, timeout: Duration) -> ShutdownFuture {
        let slot: Arc<Mutex<(Option<ShutdownReport>, Option<std::task::Waker>)>> = Arc::default();
        let done = slot.clone();
        let spawned = std::thread::Builder::new()
            .name("msgr-shutdown".into())
            .spawn(move || {
                let report = self.shutdown(timeout);
                let waker = {
                    let mut s = done.lock();
                    s.0 = Some(report);
                    s.1.take()
                };
                if let Some(w) = waker {
                    w.wake();
                }
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "could not start the shutdown thread");
        }
        ShutdownFuture { slot }
    }

    /// Sends `msg` to every connection that is not closed (connecting ones
    /// queue it), in no particular order. The payload is shared, not
    /// copied: every connection's message holds the same bytes until its
    /// transport has written them. Returns how many took it and which
    /// refused it and why (a full queue, a peer that takes less).
    ///
    /// ```no_run
    /// # fn demo(m: &msgr::Messenger) {
    /// let r = m.broadcast(msgr::Message::new(9, &b"news"[..], &b""[..]));
    /// println!("{} peers, {} refused", r.sent, r.refused.len());
    /// # }
    /// ```
    pub fn broadcast(&self, msg: Message) -> Broadcast {
        let mut r = Broadcast::default();
        for c in self.connections() {
            match c.send(msg.clone()) {
                Ok(()) => r.sent += 1,
                Err(e) => r.refused.push((c, e.error)),
            }
        }
        r
    }
}

/// What [`Messenger::broadcast`] did.
///
/// ```
/// # use std::{sync::Arc, time::Duration};
/// # use msgr::{EntityName, Inbox, Message, Messenger, NullDispatcher};
/// # let inbox = Inbox::new();
/// # let server = Messenger::builder(EntityName::server(1)).without_env()
/// #     .bind("tcp://127.0.0.1:0".parse()?).start(inbox.dispatcher())?;
/// # let client = Messenger::builder(EntityName::client(1)).without_env()
/// #     .start(Arc::new(NullDispatcher))?;
/// # let conn = client.connect(server.addr().expect("bound"))?;
/// let sent = client.broadcast(Message::new(1, &b"all"[..], &b""[..]));
/// assert_eq!((sent.sent, sent.refused.len()), (1, 0));
/// assert!(inbox.recv_timeout(Duration::from_secs(10)).is_some());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Default)]
pub struct Broadcast {
    /// Connections that queued the message.
    pub sent: usize,
    /// Connections that refused it, and why.
    pub refused: Vec<(Connection, crate::SendError)>,
}

/// The future of [`Messenger::shutdown_async`].
///
/// ```
/// use std::{sync::Arc, time::Duration};
/// use msgr::{EntityName, Messenger, NullDispatcher, ShutdownFuture};
/// let m = Messenger::builder(EntityName::client(1)).without_env().start(Arc::new(NullDispatcher))?;
/// let fut: ShutdownFuture = m.shutdown_async(Duration::from_secs(1));
/// assert_eq!(tokio::runtime::Runtime::new()?.block_on(fut).leaked_links, 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct ShutdownFuture {
    slot: Arc<Mutex<(Option<ShutdownReport>, Option<std::task::Waker>)>>,
}

impl std::future::Future for ShutdownFuture {
    type Output = ShutdownReport;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<ShutdownReport> {
        let mut s = self.slot.lock();
        match s.0.take() {
            Some(r) => std::task::Poll::Ready(r),
            None => {
                s.1 = Some(cx.waker().clone());
                std::task::Poll::Pending
            }
        }
    }
}

/// Memory a messenger holds for its connections ([`Messenger::memory`]).
///
/// ```
/// # use std::{sync::Arc, time::Duration};
/// # use msgr::{EntityName, Inbox, Message, Messenger, NullDispatcher};
/// # let inbox = Inbox::new();
/// # let server = Messenger::builder(EntityName::server(1)).without_env()
/// #     .bind("tcp://127.0.0.1:0".parse()?).start(inbox.dispatcher())?;
/// # let client = Messenger::builder(EntityName::client(1)).without_env()
/// #     .start(Arc::new(NullDispatcher))?;
/// # let conn = client.connect(server.addr().expect("bound"))?;
/// conn.wait_connected(Duration::from_secs(10))?;
/// let mem: msgr::MemoryUse = client.memory();
/// assert_eq!(mem.sessions, 1);
/// assert!(mem.session_bytes > 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryUse {
    /// Sessions alive (handshakes under way included).
    pub sessions: usize,
    /// Bytes of session state: engines, queue capacity, per-session slots.
    pub session_bytes: usize,
    /// Transport links open (backends that count them: TCP).
    pub links: usize,
    /// Bytes of the links' buffers (backends that count them: TCP).
    pub link_buffer_bytes: usize,
}

impl MemoryUse {
    /// Bytes per session, session state and link buffers together: what
    /// one idle connection costs when the messenger holds only idle ones.
    /// 0 without sessions.
    ///
    /// ```
    /// let mem = msgr::MemoryUse { sessions: 2, session_bytes: 1000, links: 2, link_buffer_bytes: 200 };
    /// assert_eq!(mem.per_session(), 600);
    /// ```
    pub fn per_session(&self) -> usize {
        (self.session_bytes + self.link_buffer_bytes)
            .checked_div(self.sessions)
            .unwrap_or(0)
    }
}

/// [`Messenger::shutdown`] with a one-second deadline, unless it was shut
/// down already (see [`Messenger`]'s "Dropping without `shutdown`").
impl Drop for Messenger {
    fn drop(&mut self) {
        self.shutdown(Duration::from_secs(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The limits a started messenger enforces are derived at start from
    /// the final values: the frame limit follows the segment limits, and
    /// keys set before or after them (`workers`) do not move it.
    #[test]
    fn a_started_messenger_derives_its_frame_limit_from_the_segment_limits() {
        let started = |keys: &[(&str, &str)]| {
            let mut cfg = MessengerConfig::default();
            for (k, v) in keys {
                cfg.set(k, v).unwrap();
            }
            let mut m = Messenger::builder(EntityName::client(1))
                .config(cfg)
                .start(Arc::new(crate::NullDispatcher))
                .unwrap();
            let limits = m.shared.cfg.session.limits;
            m.shutdown(Duration::from_secs(5));
            limits
        };
        let segments = |data: u64| 4096 + (64 << 10) + (16 << 20) + data + (64 << 10);
        let default = started(&[]);
        assert_eq!(default.max_frame, segments(128 << 20));
        assert_eq!(started(&[("workers", "2")]), default);
        let small = started(&[("workers", "2"), ("max_data_bytes", "1048576")]);
        assert_eq!(small.max_frame, segments(1 << 20));
        let large = started(&[("max_data_bytes", "1073741824"), ("workers", "2")]);
        assert_eq!(large.max_frame, segments(1 << 30));
    }
}
