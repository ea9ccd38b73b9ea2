//! A completion queue's wait fds, in the worker's mio Poll only while the
//! worker sleeps.
//!
//! Over `tcp` a CQ opened with one wait fd (`FI_WAIT_FD`) is an epoll set
//! holding the provider's sockets. Kept in the worker's epoll for good, every
//! segment that arrives ran the kernel's wake-up callbacks through both sets,
//! on the sending core over loopback: 0.4–0.6 µs of a 64 B one-way through
//! the transport alone; the provider's set alone still cost ~0.3 µs
//! (docs/BENCHMARKS.md, "2026-12-03 15:20–17:20 UTC"). So the CQ is opened
//! `FI_WAIT_POLLFD` where the provider offers it ([`msgr_fabric::Net`]): its
//! wait object is then the list of the provider's own fds (sockets, a signal),
//! in no epoll set, and they go into the worker's Poll when the transport is
//! armed before a blocking poll and out again at its next poll of the queues
//! — a spinning worker reads the CQ in
//! [`Transport::progress`](crate::Transport::progress) and needs no
//! readiness. Elsewhere (`verbs`) the one wait fd comes and goes the same
//! way. The kernel looks at an fd's state when it is added, so a completion
//! that came before still wakes the worker. A sleep costs an `epoll_ctl` per
//! fd each way: one per endpoint of the worker over `tcp`.

use std::os::fd::RawFd;

use mio::unix::SourceFd;
use mio::{Interest, Registry, Token};
use msgr_fabric::{Net, WaitFd};

/// What wakes a sleeping worker for a CQ, and which of its fds are in the
/// Poll now.
#[derive(Debug)]
pub(crate) struct CqWaitFd {
    /// The CQ can wake a worker by fds of its own (false: it is polled, or
    /// its one fd is an EQ's, registered for good).
    wakes: bool,
    token: Token,
    /// The fds registered by [`CqWaitFd::arm`], deregistered by
    /// [`CqWaitFd::disarm`].
    in_poll: Vec<RawFd>,
    /// Scratch for [`Net::cq_wait_fds`].
    listed: Vec<WaitFd>,
    /// Registering failed: the transport polls its CQ as if it had no
    /// wait object (`wake_at`) rather than sleep without a way to wake.
    failed: bool,
    armed: bool,
}

impl CqWaitFd {
    pub(crate) fn new(wakes: bool, token: Token) -> Self {
        CqWaitFd {
            wakes,
            token,
            in_poll: Vec::new(),
            listed: Vec::new(),
            failed: false,
            armed: false,
        }
    }

    /// The token the fds are registered under.
    pub(crate) fn token(&self) -> Token {
        self.token
    }

    /// Whether registering failed: the CQ cannot wake a sleeping worker,
    /// and the transport asks to be polled instead (`wake_at`).
    pub(crate) fn failed(&self) -> bool {
        self.failed
    }

    /// Puts the CQ's current fds into the Poll before the worker sleeps
    /// (once: they stay until [`CqWaitFd::disarm`]).
    pub(crate) fn arm(&mut self, registry: &Registry, net: &mut Net) {
        if !self.wakes || self.armed || self.failed {
            return;
        }
        self.armed = true;
        if let Err(e) = net.cq_wait_fds(&mut self.listed) {
            return self.fail(registry, &e);
        }
        for w in &self.listed {
            let interest = if w.writable {
                Interest::READABLE | Interest::WRITABLE
            } else {
                Interest::READABLE
            };
            match registry.register(&mut SourceFd(&w.fd), self.token, interest) {
                Ok(()) => self.in_poll.push(w.fd),
                // Listed twice, or a number another owner registered: not
                // ours to take out again.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return self.fail(registry, &e),
            }
        }
    }

    fn fail(&mut self, registry: &Registry, e: &dyn std::fmt::Display) {
        tracing::warn!(error = %e, "cannot put a libfabric CQ's wait fds into the worker's poll; polling the CQ every millisecond instead");
        self.failed = true;
        self.disarm(registry);
    }

    /// Takes the fds out of the Poll: the worker is awake and reads the CQ
    /// itself.
    pub(crate) fn disarm(&mut self, registry: &Registry) {
        if !self.armed {
            return;
        }
        self.armed = false;
        for fd in self.in_poll.drain(..) {
            // Fails only if the fd is gone already, which takes it out too.
            let _ = registry.deregister(&mut SourceFd(&fd));
        }
    }

    /// The CQ was replaced (its Net reopened): out with the old fds.
    pub(crate) fn replace(&mut self, wakes: bool, registry: &Registry) {
        self.disarm(registry);
        *self = CqWaitFd::new(wakes, self.token);
    }
}
