//! The shared stress workload: N servers × M clients sending random traffic
//! under a fault plan, over every backend compiled in and available.
//!
//! ```no_run
//! use msgr_testsuite::stress::{available_backends, run, StressConfig};
//! use std::time::Duration;
//! for backend in available_backends() {
//!     let mut cfg = StressConfig::new(backend);
//!     cfg.duration = Duration::from_secs(10);
//!     let report = run(&cfg);
//!     println!("{}", report.summary());
//!     assert!(report.passed(), "seed {}: {:?}", report.seed, report.violations);
//! }
//! ```
//!
//! What is checked, and how, is in docs/STRESS.md. In short: each client
//! tags its messages (client, server, epoch, n); the servers' shared
//! [`verify::Verifier`] checks order, duplicates and bytes as they arrive;
//! the end of the run compares what each epoch sent with what arrived
//! (lossless and undisturbed: exactly 1..=sent), then checks for leaked
//! receive buffers, links and threads. Every wait is bounded and the whole
//! run has a hard deadline.
//!
//! # Layers
//!
//! The modules import in one direction, each only from the layers below its
//! own (`tests/layering.rs` checks it). Bottom first:
//!
//! 1. `seed`, `verify`, `backends`: independent seeds from the run's seed;
//!    the message tags and the checks on what arrives; which backends exist.
//! 2. `rma`: the RMA part of the workload and its report.
//! 3. `report`: what a run reports.
//! 4. `workload`: the run itself (servers, clients, chaos, final checks).
//! 5. `netns`, `fanin`: the run over real network faults in namespaces;
//!    the many-clients-to-one-server run.
//! 6. `cluster`: node processes on a bridge, each in its own namespace.

use std::sync::Arc;
use std::time::Duration;

use msgr::{EntityAddr, FaultPlan, MessengerConfig};

pub mod backends;
pub mod cluster;
pub mod fanin;
pub mod netns;
mod report;
mod rma;
mod seed;
pub mod verify;
mod workload;

pub use backends::{available_backends, backend_by_name, candidates, Backend};
pub use cluster::{run_cluster, ClusterOptions, ClusterReport};
pub use netns::{
    namespaces_left, run_in_netns, NetnsCluster, NetnsError, NetnsOptions, NetnsPair, NsExec,
};
pub use report::{Progress, StressReport};
pub use rma::RmaReport;
pub use workload::run;

/// The fault plan the suite uses unless told otherwise: productive runs with
/// a fault every few thousand frames on some link (each fault replays the
/// whole unacknowledged window).
pub const DEFAULT_FAULTS: &str = "fail=20000,corrupt=20000,delay=2000,delay_max_ms=5,handshake=50";

/// Where messengers are created: here, or on threads inside network
/// namespaces (their worker threads inherit the namespace).
#[derive(Clone, Default)]
pub struct Placement {
    servers: Option<Arc<NsExec>>,
    clients: Option<Arc<NsExec>>,
}

impl Placement {
    /// Everything in this process's own network namespace.
    pub fn local() -> Self {
        Placement::default()
    }

    /// Servers created inside `servers`' namespace, clients inside `clients`'.
    pub fn namespaces(servers: Arc<NsExec>, clients: Arc<NsExec>) -> Self {
        Placement {
            servers: Some(servers),
            clients: Some(clients),
        }
    }

    pub(crate) fn on_server<R: Send + 'static>(&self, f: impl FnOnce() -> R + Send + 'static) -> R {
        match &self.servers {
            Some(ns) => ns.run(f),
            None => f(),
        }
    }

    pub(crate) fn on_client<R: Send + 'static>(&self, f: impl FnOnce() -> R + Send + 'static) -> R {
        match &self.clients {
            Some(ns) => ns.run(f),
            None => f(),
        }
    }
}

/// A progress callback, called about once per `progress_interval`.
pub type ProgressFn = Arc<dyn Fn(&Progress) + Send + Sync>;

/// Everything a run depends on. A run is reproducible from its seed (as far
/// as thread scheduling allows): each client's and the chaos thread's
/// operations, every message size and every messenger's fault seed derive
/// from it. Plain data: one field per knob of the run.
#[derive(Clone)]
pub struct StressConfig {
    /// The run's seed.
    pub seed: u64,
    /// The backend.
    pub backend: Backend,
    /// Server messengers.
    pub servers: usize,
    /// Client messengers (one thread each).
    pub clients: usize,
    /// How long clients generate operations (the drain and checks come after).
    pub duration: Duration,
    /// The fault plan for every messenger (its seed is mixed with the run's
    /// seed and the messenger's identity), or none.
    pub faults: Option<FaultPlan>,
    /// Every k-th client (k-1, 2k-1, ...) uses lossy connections; 0 = none.
    pub lossy_every: usize,
    /// Mean time between server shutdown+restart events; zero = never.
    pub restart_every: Duration,
    /// Clients and the chaos thread inject real transport faults
    /// (`Connection::inject_fault`).
    pub real_faults: bool,
    /// Servers listen on TCP too and clients dial both addresses (an
    /// address vector): every link fault moves a session to the other
    /// transport and back, replaying each time.
    pub transport_change: bool,
    /// Clients mark connections down now and then.
    pub mark_downs: bool,
    /// Every server incarnation exposes a 1 MiB region and clients write
    /// and read back random ranges of their own slice of it, besides their
    /// messages (docs/STRESS.md "RMA").
    pub rma: bool,
    /// Largest message data segment.
    pub max_message: usize,
    /// One message in this many is large (64 KiB, max_message].
    pub large_one_in: u32,
    /// Server bind addresses (server i uses `bind[i % len]`); empty = the
    /// backend's loopback template.
    pub bind: Vec<EntityAddr>,
    /// Where messengers live.
    pub placement: Placement,
    /// Base messenger configuration (timers, queue bounds).
    pub messenger: MessengerConfig,
    /// Bound of the final drain (every queue empty, every message delivered).
    pub drain_timeout: Duration,
    /// A send queue that stays full this long is a violation (no progress).
    pub stall_timeout: Duration,
    /// Past `duration` + this, the process reports the hang and exits.
    pub hard_deadline_slack: Duration,
    /// Progress callback.
    pub progress: Option<ProgressFn>,
    /// How often the progress callback runs.
    pub progress_interval: Duration,
}

impl StressConfig {
    /// Defaults: 4 servers × 16 clients for 20 s with [`DEFAULT_FAULTS`], a
    /// random seed, server restarts every ~3 s, real faults and mark-downs on,
    /// one client in four lossy.
    pub fn new(backend: Backend) -> Self {
        StressConfig {
            seed: rand::random(),
            backend,
            servers: 4,
            clients: 16,
            duration: Duration::from_secs(20),
            faults: Some(DEFAULT_FAULTS.parse().expect("default fault plan")),
            lossy_every: 4,
            restart_every: Duration::from_secs(3),
            real_faults: true,
            transport_change: false,
            mark_downs: true,
            rma: false,
            max_message: 4 << 20,
            large_one_in: 1000,
            bind: Vec::new(),
            placement: Placement::local(),
            messenger: default_messenger_config(),
            drain_timeout: Duration::from_secs(90),
            stall_timeout: Duration::from_secs(60),
            hard_deadline_slack: Duration::from_secs(240),
            progress: None,
            progress_interval: Duration::from_secs(1),
        }
    }
}

/// Short timers so that faults are detected and repaired quickly, send
/// queues bounded so that memory stays flat (2048 messages / 8 MiB per
/// connection), and small fragments.
pub fn default_messenger_config() -> MessengerConfig {
    let mut cfg = MessengerConfig::default();
    cfg.session.keepalive_interval = Duration::from_millis(100);
    cfg.session.keepalive_timeout = Duration::from_millis(1500);
    cfg.session.handshake_timeout = Duration::from_secs(3);
    cfg.session.backoff_min = Duration::from_millis(1);
    cfg.session.backoff_max = Duration::from_millis(50);
    cfg.session.wait_retry = Duration::from_millis(200);
    cfg.session.max_queued_messages = 2048;
    cfg.session.max_queued_bytes = 8 << 20;
    cfg.busy_poll = Duration::from_micros(20);
    // Messages of every class mix on each connection: fragments small
    // enough that the many 16..64 KiB messages travel in pieces too, and
    // an urgent message overtakes them mid-message.
    cfg.session.max_fragment = 16 << 10;
    cfg
}
