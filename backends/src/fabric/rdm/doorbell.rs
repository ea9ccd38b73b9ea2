//! The doorbell of an RDM transport over `shm` (whose CQ has no wait
//! object): what lets its worker block in epoll as a TCP worker does.
//!
//! The transport owns a [`Doorbell`] (`msgr_fabric`: a shared page whose
//! word says "asleep", a Unix datagram socket in the worker's Poll) and
//! announces its [`BellId`] after its window in HELLO and WELCOME; a peer
//! from before the doorbell announces none and is polled as before. Before
//! the worker blocks, [`Bells::sleep`] sets the word and reads the CQ once
//! more (completions found are kept for the next poll, and the worker does
//! not block); a sender that posted to a peer with a doorbell reads the
//! peer's word and rings only if it is set — under load both ends are
//! awake and a send costs a fence and a load. Each listener also binds a
//! socket named after its address, which a connector rings after its
//! HELLO: a listener's worker may sleep with no link to be rung through.
//! It is rung once before that too, when the HELLO could not go: `shm`
//! refuses a first post to an endpoint until that endpoint's progress has
//! taken the connection request the refused post left it, which a
//! sleeping listener would do only at its backstop.
//! Every sleep still has a deadline ([`BELL_BACKSTOP`]), so a lost ring
//! (a full socket buffer, a peer whose page could not be mapped) costs at
//! most that.

use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixDatagram;
use std::time::Duration;

use mio::unix::SourceFd;
use mio::{Interest, Registry, Token};
use msgr_fabric::{BellId, Completion, Doorbell, Net, PeerBell};

/// How long a worker with a doorbell sleeps at most while every link's
/// peer rings it: the bound on what a lost ring costs.
pub const BELL_BACKSTOP: Duration = Duration::from_millis(10);

/// A transport's doorbell, the sockets listeners are rung by, and its
/// counters.
#[derive(Debug)]
pub(super) struct Bells {
    own: Doorbell,
    token: Token,
    /// Unbound: rings leave from it.
    from: UnixDatagram,
    listeners: Vec<(SocketAddr, UnixDatagram)>,
    /// The word says asleep (set by `sleep`, cleared by `woke`).
    asleep: bool,
    /// Completions read by `sleep`'s last look at the CQ, handled by the
    /// next poll.
    pub(super) early: Vec<Completion>,
    /// Rings sent (`doorbell_rings`).
    rings: u64,
    /// Rings heard on waking (`doorbell_wakes`).
    heard: u64,
    /// Times the worker blocked with the word set (`doorbell_sleeps`).
    sleeps: u64,
}

impl Bells {
    /// Opens the doorbell and puts its socket into `registry` under
    /// `token` for good (readable only when rung). `None`, logged, if the
    /// system refuses: the transport is polled as without one.
    pub(super) fn open(registry: &Registry, token: Token) -> Option<Bells> {
        let opened = Doorbell::open().and_then(|own| {
            let from = UnixDatagram::unbound()?;
            from.set_nonblocking(true)?;
            registry.register(&mut SourceFd(&own.fd()), token, Interest::READABLE)?;
            Ok((own, from))
        });
        match opened {
            Ok((own, from)) => Some(Bells {
                own,
                token,
                from,
                listeners: Vec::new(),
                asleep: false,
                early: Vec::new(),
                rings: 0,
                heard: 0,
                sleeps: 0,
            }),
            Err(e) => {
                tracing::warn!(error = %e, "no doorbell for the shm transport; its worker polls every millisecond when idle");
                None
            }
        }
    }

    pub(super) fn token(&self) -> Token {
        self.token
    }

    /// What a HELLO or WELCOME announces.
    pub(super) fn id(&self) -> BellId {
        self.own.id()
    }

    /// Binds the socket the listener at `listen` is rung by, in the Poll
    /// under the doorbell's token (a failure is logged: HELLOs then wait
    /// for the listener's next poll).
    pub(super) fn listen(&mut self, registry: &Registry, listen: SocketAddr) {
        let bound = msgr_fabric::listener_bell(listen).and_then(|s| {
            registry.register(
                &mut SourceFd(&s.as_raw_fd()),
                self.token,
                Interest::READABLE,
            )?;
            Ok(s)
        });
        match bound {
            Ok(s) => self.listeners.push((listen, s)),
            Err(e) => tracing::debug!(error = %e, %listen, "no doorbell for an shm listener"),
        }
    }

    /// The listener at `listen` stopped listening: its socket goes (closed,
    /// it leaves the Poll).
    pub(super) fn unlisten(&mut self, listen: SocketAddr) {
        self.listeners.retain(|(a, _)| *a != listen);
    }

    /// Rings `peer` if it sleeps (after a post to it).
    pub(super) fn ring(&mut self, peer: &PeerBell) {
        if peer.ring_if_asleep(&self.from) {
            self.rings += 1;
        }
    }

    /// Rings the listener at `listen` (after a HELLO to it).
    pub(super) fn ring_listener(&mut self, listen: SocketAddr) {
        if msgr_fabric::ring_listener(&self.from, listen) {
            self.rings += 1;
        }
    }

    /// Says "asleep", then reads the CQ once more: returns false (and says
    /// "awake" again) if completions came meanwhile — kept in `early` — or
    /// the read failed (the next poll reads it again and reports why).
    pub(super) fn sleep(&mut self, net: &mut Net, max: usize) -> bool {
        self.own.sleep();
        self.asleep = true;
        match net.read_cq(&mut self.early, max) {
            Ok(0) => {
                self.sleeps += 1;
                true
            }
            _ => {
                self.woke();
                false
            }
        }
    }

    /// Says "awake" (peers stop ringing) and reads the rings that came.
    pub(super) fn woke(&mut self) {
        if !std::mem::take(&mut self.asleep) {
            return;
        }
        self.own.wake();
        self.heard += self.own.drain();
        for (_, s) in &self.listeners {
            self.heard += msgr_fabric::drain_rings(s);
        }
    }

    pub(super) fn values(&self) -> [(&'static str, u64); 3] {
        [
            ("doorbell_rings", self.rings),
            ("doorbell_wakes", self.heard),
            ("doorbell_sleeps", self.sleeps),
        ]
    }
}
