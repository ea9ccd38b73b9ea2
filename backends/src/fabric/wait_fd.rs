//! A completion queue's wait fd, in the worker's mio Poll only while the
//! worker sleeps.
//!
//! Over `tcp` a CQ opened with a wait fd (`FI_WAIT_FD`) is an epoll set
//! holding the provider's sockets. Kept in the worker's epoll for good, every
//! segment that arrives runs the kernel's wake-up callbacks through both
//! sets, on the sending core over loopback: 0.4–0.6 µs of a 64 B one-way
//! through the transport alone, 0.2–0.4 µs through the messenger
//! (docs/BENCHMARKS.md, "2026-12-03 15:20–16:40 UTC"). A spinning worker reads
//! the CQ in [`Transport::progress`](crate::Transport::progress) and needs no
//! readiness, so the fd goes into the Poll when the transport is armed
//! before a blocking poll and out again at the next poll of the queues. The
//! kernel looks at an fd's state when it is added, so a completion that came
//! before still wakes the worker.

use std::os::fd::RawFd;

use mio::unix::SourceFd;
use mio::{Interest, Registry, Token};

/// The wait fd of a CQ (none: the CQ has no wait object, or shares its fd
/// with a queue registered for good) and whether it is in the Poll now.
#[derive(Debug)]
pub(crate) struct CqWaitFd {
    fd: Option<RawFd>,
    token: Token,
    in_poll: bool,
    /// Registering it failed: the transport polls its CQ as if it had no
    /// wait object (`wake_at`) rather than sleep without a way to wake.
    failed: bool,
}

impl CqWaitFd {
    pub(crate) fn new(fd: Option<RawFd>, token: Token) -> Self {
        CqWaitFd {
            fd,
            token,
            in_poll: false,
            failed: false,
        }
    }

    /// The fd, if the CQ has one of its own.
    pub(crate) fn fd(&self) -> Option<RawFd> {
        self.fd
    }

    /// The token the fd is registered under.
    pub(crate) fn token(&self) -> Token {
        self.token
    }

    /// Whether registering the fd failed: it cannot wake a sleeping worker,
    /// and the transport asks to be polled instead (`wake_at`).
    pub(crate) fn failed(&self) -> bool {
        self.failed
    }

    /// Puts the fd into the Poll before the worker sleeps (once: it stays
    /// until [`CqWaitFd::disarm`]).
    pub(crate) fn arm(&mut self, registry: &Registry) {
        let Some(fd) = self.fd else {
            return;
        };
        if self.in_poll || self.failed {
            return;
        }
        match registry.register(&mut SourceFd(&fd), self.token, Interest::READABLE) {
            Ok(()) => self.in_poll = true,
            Err(e) => {
                tracing::warn!(error = %e, "cannot put a libfabric CQ's wait fd into the worker's poll; polling the CQ every millisecond instead");
                self.failed = true;
            }
        }
    }

    /// Takes the fd out of the Poll: the worker is awake and reads the CQ
    /// itself.
    pub(crate) fn disarm(&mut self, registry: &Registry) {
        if !self.in_poll {
            return;
        }
        self.in_poll = false;
        if let Some(fd) = self.fd {
            // Fails only if the fd is gone already, which takes it out too.
            let _ = registry.deregister(&mut SourceFd(&fd));
        }
    }

    /// The CQ was replaced (its Net reopened): out with the old fd.
    pub(crate) fn replace(&mut self, fd: Option<RawFd>, registry: &Registry) {
        self.disarm(registry);
        *self = CqWaitFd::new(fd, self.token);
    }
}
