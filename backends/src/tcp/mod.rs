//! The TCP backend: non-blocking sockets in the worker's mio loop.
//!
//! TCP_NODELAY on every link; output is queued by [`Transport::send`] and written
//! by [`Transport::flush`] with vectored writes, so a burst of small frames costs
//! one system call, and large segments are written from the caller's buffers.
//!
//! A socket's bytes show as epoll readiness, so a spinning worker asks epoll
//! on every pass and reads the sockets it names: two system calls between a
//! message's arrival and its bytes. A transport with at most
//! [`READ_POLLED_LINKS`] links instead reads them on every
//! [`Transport::progress`] call (a `recv` that finds nothing costs about
//! what an empty `epoll_wait` does) and lets the worker ask epoll only every
//! few passes, for listeners, connection set-up and writability: one system
//! call between arrival and bytes. A minimal spinning 64 B ping-pong between
//! two processes here: 3.01 µs one-way through `epoll_wait` + `recv`, 2.70 µs
//! by `recv` alone. With more links a `recv` per link per pass would cost more
//! than the one `epoll_wait` it saves, and epoll stays. So does it while a
//! link waits to connect or for room to write: only epoll says when (a
//! streaming sender held up for a few passes by every full socket buffer lost
//! up to 40% of its message rate). And a link moving bulk — more than
//! [`READ_POLL_BULK`] one way since the other way last moved anything — is
//! left to epoll: a `recv` per pass on either end of a stream (each takes the
//! socket's lock, and a reader this eager takes the bytes in small reads)
//! cut `msgr bench`'s 64 B message rate from 3.7–3.8 to 2.3–3.5 M/s.
//!
//! A read-polled link also leaves the worker's Poll while the worker spins,
//! once it has awaited nothing but bytes for [`LEAVE_POLL_AFTER`], and goes
//! back in before the worker sleeps ([`Transport::arm`]) or as soon as it
//! needs epoll again. Registered, every segment that arrives runs epoll's
//! wake-up callback on the sending core, ~0.2 µs of a 64 B one-way over
//! loopback (docs/BENCHMARKS.md, "2026-12-03 15:20–17:20 UTC"), though the
//! socket is read every pass anyway. At most [`READ_POLLED_LINKS`] links are
//! out, so a sleep costs at most that many `epoll_ctl` calls each way.

mod link;

use rustc_hash::FxHashMap;
use std::io;
use std::net::Shutdown;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::event::Event;
use mio::net::{TcpListener, TcpStream};
use mio::{Interest, Registry, Token};
use msgr_addr::{EntityAddr, TransportKind};
use msgr_proto::{FrameLimits, LinkFailure, LinkId, ProtocolError, Transmit};

use crate::shelf::Shelf;
use crate::wire::ConnectProgress;
#[cfg(feature = "fault-injection")]
use crate::RealFault;
use crate::{
    DetachedLink, Transport, TransportContext, TransportError, TransportEvent, TransportStats,
    LISTENER_TOKEN_BASE,
};
use bytes::BytesMut;
use link::{TcpLink, READ_BUDGET, SHELF_BYTES};
use smallvec::SmallVec;

/// The most links a transport reads on every spinning pass instead of
/// waiting for epoll to name them (module docs).
pub const READ_POLLED_LINKS: usize = 2;
/// A link that moved more than this one way since the other way last moved
/// anything is not read-polled (module docs).
pub const READ_POLL_BULK: usize = 16 << 10;
/// How long a read-polled link must await nothing but bytes before it
/// leaves the worker's Poll (`TcpLink::may_leave_poll`).
pub const LEAVE_POLL_AFTER: Duration = Duration::from_millis(1);

/// A TCP connection moving between workers, with undecoded received bytes.
#[derive(Debug)]
pub struct DetachedTcp {
    link: TcpLink,
}

/// TCP transport of one worker.
#[derive(Debug)]
pub struct TcpTransport {
    registry: Registry,
    limits: FrameLimits,
    copy_threshold: usize,
    link_ids: Arc<AtomicU64>,
    listeners: FxHashMap<Token, TcpListener>,
    links: FxHashMap<LinkId, TcpLink>,
    /// Links with queued output (flushed together at the end of a loop turn).
    dirty: crate::dirty::DirtyLinks,
    /// Links whose last read was cut short by the budget.
    read_pending: Vec<LinkId>,
    /// Links failed outside a progress call (an injected abort, a socket
    /// that could not go back into the Poll), reported by the next one.
    aborted: Vec<(LinkId, LinkFailure)>,
    /// Links out of the Poll ([`TcpLink::in_poll`]).
    out_of_poll: usize,
    /// Frozen links (fault injection) that were closed: a hung process never
    /// closes its socket, so neither do we until the transport goes away.
    frozen_closed: Vec<TcpLink>,
    /// Buffers of large received frames, for reuse.
    shelf: Arc<Shelf<BytesMut>>,
    /// SO_SNDBUF / SO_RCVBUF of every link (`TransportContext::tcp_socket_buffer`).
    socket_buffer: usize,
}

/// Sets a link's socket buffers to `bytes` each way (0: the kernel's
/// autotuning, untouched). Best effort, as TCP_NODELAY: a kernel that
/// refuses leaves the link working with its own sizes.
fn bound_socket_buffers(stream: &TcpStream, bytes: usize) {
    if bytes > 0 {
        let socket = socket2::SockRef::from(stream);
        let _ = socket.set_send_buffer_size(bytes);
        let _ = socket.set_recv_buffer_size(bytes);
    }
}

impl TcpTransport {
    /// A TCP transport registering its sockets in `registry`.
    pub fn new(registry: &Registry, ctx: &TransportContext) -> Result<Self, TransportError> {
        Ok(TcpTransport {
            registry: registry
                .try_clone()
                .map_err(|e| TransportError::io("clone mio registry", e))?,
            limits: ctx.limits,
            copy_threshold: ctx.copy_threshold,
            link_ids: ctx.link_ids.clone(),
            listeners: FxHashMap::default(),
            links: FxHashMap::default(),
            dirty: Default::default(),
            read_pending: Vec::new(),
            aborted: Vec::new(),
            out_of_poll: 0,
            frozen_closed: Vec::new(),
            shelf: Arc::new(Shelf::new(SHELF_BYTES)),
            socket_buffer: ctx.tcp_socket_buffer,
        })
    }

    fn token(link: LinkId) -> Token {
        Token(link.0 as usize)
    }

    fn add_link(
        &mut self,
        id: LinkId,
        mut link: TcpLink,
        interest: Interest,
    ) -> Result<(), TransportError> {
        self.registry
            .register(&mut link.stream, Self::token(id), interest)
            .map_err(|e| TransportError::io("register tcp link", e))?;
        link.write_interest = interest.is_writable();
        link.in_poll = true;
        self.links.insert(id, link);
        Ok(())
    }

    fn drop_link(&mut self, id: LinkId) -> Option<TcpLink> {
        let mut link = self.links.remove(&id)?;
        if link.in_poll {
            let _ = self.registry.deregister(&mut link.stream);
        } else {
            self.out_of_poll -= 1;
        }
        link.in_poll = false;
        Some(link)
    }

    /// The interest `link` registers with: writability too while it
    /// connects or waits for room to write.
    fn interest(link: &TcpLink) -> Interest {
        if link.write_interest {
            Interest::READABLE | Interest::WRITABLE
        } else {
            Interest::READABLE
        }
    }

    /// Puts link `id` into the Poll (`true`) or takes it out; registers
    /// anew a link whose interest changed. `Err`: it could not go in.
    fn place_in_poll(&mut self, id: LinkId, in_poll: bool) -> io::Result<()> {
        let Some(link) = self.links.get_mut(&id) else {
            return Ok(());
        };
        let (token, interest) = (Self::token(id), Self::interest(link));
        match (link.in_poll, in_poll) {
            (true, true) => self.registry.reregister(&mut link.stream, token, interest),
            (false, true) => {
                self.registry.register(&mut link.stream, token, interest)?;
                link.in_poll = true;
                self.out_of_poll -= 1;
                Ok(())
            }
            (true, false) => {
                link.in_poll = false;
                self.out_of_poll += 1;
                // Fails only for a socket not registered, which is out too.
                let _ = self.registry.deregister(&mut link.stream);
                Ok(())
            }
            (false, false) => Ok(()),
        }
    }

    /// Puts every link that is out back into the Poll; a link that cannot
    /// go in fails (reported by the next progress call): asleep, the worker
    /// would never hear of it.
    fn all_into_poll(&mut self) {
        if self.out_of_poll == 0 {
            return;
        }
        let out: Vec<LinkId> = (self.links.iter())
            .filter(|(_, l)| !l.in_poll)
            .map(|(&id, _)| id)
            .collect();
        for id in out {
            if let Err(e) = self.place_in_poll(id, true) {
                self.drop_link(id);
                self.aborted
                    .push((id, LinkFailure::io("register tcp link", &e)));
            }
        }
    }

    fn fail(&mut self, id: LinkId, why: LinkFailure, events: &mut Vec<TransportEvent>) {
        if let Some(link) = self.drop_link(id) {
            let _ = link.stream.shutdown(Shutdown::Both);
            events.push(TransportEvent::Failed(id, why));
        }
    }

    fn accept_all(&mut self, token: Token, events: &mut Vec<TransportEvent>) {
        loop {
            let Some(listener) = self.listeners.get(&token) else {
                return;
            };
            match listener.accept() {
                Ok((stream, peer)) => {
                    let _ = stream.set_nodelay(true);
                    bound_socket_buffers(&stream, self.socket_buffer);
                    let id = LinkId(self.link_ids.fetch_add(1, Ordering::Relaxed));
                    let link = TcpLink::new(stream, false, self.limits, self.shelf.clone());
                    match self.add_link(id, link, Interest::READABLE) {
                        Ok(()) => events.push(TransportEvent::Accepted {
                            link: id,
                            peer,
                            listener: token,
                        }),
                        Err(e) => tracing::warn!(error = %e, "dropping accepted connection"),
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    // EMFILE and friends: log and retry on the next readiness.
                    tracing::warn!(error = %e, "accept failed");
                    return;
                }
            }
        }
    }

    /// Reads and decodes one link; reports units, EOF and errors.
    ///
    /// Reads end at a short read (as tokio's do), which saves the `recv`
    /// that would only say `WouldBlock` — one of the few system calls a
    /// small message costs. Edge-triggered epoll reports bytes arriving
    /// after the queue was emptied anew. Not so a close that arrived with
    /// the bytes: after a readiness event that says the peer closed or
    /// errored (`to_would_block`), and when resuming reads that were cut
    /// short or paused, the link reads until `WouldBlock` or end of stream.
    /// So does a link while a large frame arrives: more of it is on its
    /// way, and the next read often finds it without a pass through the
    /// worker's loop.
    ///
    /// Returns whether anything came (bytes, the end of the stream or an error).
    fn read_link(
        &mut self,
        id: LinkId,
        to_would_block: bool,
        events: &mut Vec<TransportEvent>,
    ) -> bool {
        let Some(link) = self.links.get_mut(&id) else {
            return false;
        };
        if link.paused || link.frozen {
            link.read_pending = true;
            return false;
        }
        link.read_pending = false;
        let mut total = 0;
        let why = loop {
            let read = link.read_once();
            if let Ok(r) = read {
                total += r.len;
                link.was_read(r.len);
            }
            let drained =
                !to_would_block && !link.reads_by_frame() && matches!(read, Ok(r) if r.short);
            let last = match &read {
                Ok(r) => r.len == 0 || drained || total >= READ_BUDGET,
                Err(e) => e.kind() != io::ErrorKind::Interrupted,
            };
            // Small frames are decoded once the reads end, from one buffer
            // (decoding between reads would keep each read's buffer in use
            // by its frames and so allocate one per read); a large frame
            // between reads, so that the next read is sized by it.
            if last || link.reads_by_frame() {
                loop {
                    match link.next_unit() {
                        Ok(Some(unit)) => events.push(TransportEvent::Received(id, unit)),
                        Ok(None) => break,
                        Err(e) => {
                            if let Some(l) = self.drop_link(id) {
                                let _ = l.stream.shutdown(Shutdown::Both);
                            }
                            events.push(TransportEvent::Corrupt(id, ProtocolError::Frame(e)));
                            return true;
                        }
                    }
                }
            }
            match read {
                Ok(r) if r.len == 0 => {
                    break LinkFailure::ClosedByPeer("connection closed by peer".into())
                }
                Ok(_) if total >= READ_BUDGET => {
                    // More may be waiting: yield to the other links.
                    link.read_pending = true;
                    self.read_pending.push(id);
                    return true;
                }
                Ok(_) if drained => return true,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return total > 0,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => break LinkFailure::io("read", &e),
            }
        };
        self.fail(id, why, events);
        true
    }

    /// Whether [`Transport::progress`] reads links itself (module docs).
    fn reads_by_polling(&self) -> bool {
        self.links.len() <= READ_POLLED_LINKS
    }

    /// Reads each link [`TcpLink::read_polled`] (module docs); returns
    /// whether any had something.
    /// A read-polled link that has awaited nothing but bytes for
    /// [`LEAVE_POLL_AFTER`] is taken out of the Poll, every other link is
    /// (put back) in it.
    fn poll_reads(&mut self, now: Instant, events: &mut Vec<TransportEvent>) -> bool {
        if !self.reads_by_polling() {
            self.all_into_poll();
            return false;
        }
        let ids: SmallVec<[(LinkId, bool, bool); READ_POLLED_LINKS]> = (self.links.iter_mut())
            .map(|(&id, l)| (id, l.read_polled(), l.may_leave_poll(now)))
            .collect();
        let mut any = false;
        for (id, polled, may_leave) in ids {
            if let Err(e) = self.place_in_poll(id, !may_leave) {
                self.fail(id, LinkFailure::io("register tcp link", &e), events);
                any = true;
                continue;
            }
            if polled {
                any |= self.read_link(id, false, events);
            }
        }
        any
    }

    fn flush_link(&mut self, id: LinkId, events: &mut Vec<TransportEvent>) {
        let Some(link) = self.links.get_mut(&id) else {
            return;
        };
        if link.connecting {
            return;
        }
        let queued = link.tx.len();
        let wrote = link.tx.write_to(&mut link.stream);
        link.wrote(queued - link.tx.len());
        match wrote {
            Ok(true) => {
                if link.close_after_flush {
                    if let Some(l) = self.drop_link(id) {
                        let _ = l.stream.shutdown(Shutdown::Both);
                    }
                } else if link.write_interest {
                    link.write_interest = false;
                    if link.in_poll {
                        let _ = self.place_in_poll(id, true);
                    }
                }
            }
            Ok(false) => {
                if !link.write_interest {
                    // Only epoll says when there is room again.
                    link.write_interest = true;
                    if let Err(e) = self.place_in_poll(id, true) {
                        self.fail(id, LinkFailure::io("register tcp link", &e), events);
                    }
                }
            }
            Err(e) => self.fail(id, LinkFailure::io("write", &e), events),
        }
    }
}

impl Transport for TcpTransport {
    fn kind(&self) -> TransportKind {
        TransportKind::Tcp
    }

    fn listen(&mut self, addr: &EntityAddr, token: Token) -> Result<EntityAddr, TransportError> {
        let (listener, bound) = crate::wire::bind_listener(addr, &self.registry, token)?;
        self.listeners.insert(token, listener);
        Ok(bound)
    }

    fn unlisten(&mut self, token: Token) {
        if let Some(mut l) = self.listeners.remove(&token) {
            let _ = self.registry.deregister(&mut l);
        }
    }

    fn connect(&mut self, link: LinkId, addr: &EntityAddr) -> Result<(), TransportError> {
        let stream =
            TcpStream::connect(addr.socket).map_err(|e| TransportError::io("connect", e))?;
        let _ = stream.set_nodelay(true);
        bound_socket_buffers(&stream, self.socket_buffer);
        self.add_link(
            link,
            TcpLink::new(stream, true, self.limits, self.shelf.clone()),
            Interest::READABLE | Interest::WRITABLE,
        )
    }

    fn send(&mut self, link: LinkId, unit: Transmit) -> Result<(), TransportError> {
        let l = self
            .links
            .get_mut(&link)
            .ok_or(TransportError::NoSuchLink(link.0))?;
        let was_empty = l.tx.is_empty();
        let defer_crc = !l.sending_bulk();
        l.tx.push(unit, self.copy_threshold, defer_crc)?;
        if was_empty {
            self.dirty.push(link);
        }
        Ok(())
    }

    fn flush(&mut self, _now: Instant, events: &mut Vec<TransportEvent>) {
        let flush = |t: &mut Self, id| t.flush_link(id, events);
        crate::dirty::DirtyLinks::flush_each(self, |t| &mut t.dirty, flush);
    }

    fn ready(&mut self, event: &Event, _now: Instant, events: &mut Vec<TransportEvent>) {
        let token = event.token();
        if token.0 >= LISTENER_TOKEN_BASE {
            self.accept_all(token, events);
            return;
        }
        let id = LinkId(token.0 as u64);
        let Some(link) = self.links.get_mut(&id) else {
            return;
        };
        if link.connecting {
            match crate::wire::connect_progress(&link.stream, event) {
                ConnectProgress::Pending => return,
                ConnectProgress::Failed(why) => {
                    self.fail(id, why, events);
                    return;
                }
                ConnectProgress::Connected => {
                    link.connecting = false;
                    events.push(TransportEvent::Connected(id));
                    // Whatever was queued before the connection finished goes now.
                    self.flush_link(id, events);
                }
            }
        } else if event.is_writable() {
            self.flush_link(id, events);
        }
        let closing = event.is_read_closed() || event.is_error();
        if event.is_readable() || closing {
            self.read_link(id, closing, events);
        }
    }

    fn progress(&mut self, now: Instant, events: &mut Vec<TransportEvent>) -> bool {
        let mut any = !self.aborted.is_empty();
        for (id, why) in std::mem::take(&mut self.aborted) {
            events.push(TransportEvent::Failed(id, why));
        }
        if !self.read_pending.is_empty() {
            any = true;
            for id in std::mem::take(&mut self.read_pending) {
                self.read_link(id, true, events);
            }
        }
        any | self.poll_reads(now, events)
    }

    fn close(&mut self, link: LinkId, flush: bool) {
        let Some(l) = self.links.get_mut(&link) else {
            return;
        };
        if l.frozen {
            if let Some(l) = self.drop_link(link) {
                self.frozen_closed.push(l);
            }
            return;
        }
        if flush && !l.tx.is_empty() && !l.connecting {
            l.close_after_flush = true;
            self.dirty.push(link);
        } else if let Some(l) = self.drop_link(link) {
            let _ = l.stream.shutdown(Shutdown::Both);
        }
    }

    /// Counted in [`Transport::link_count`] too: the socket is still ours
    /// until its queue is written.
    fn closing_links(&self) -> usize {
        self.links.values().filter(|l| l.close_after_flush).count()
    }

    fn abort_closing(&mut self) -> usize {
        let closing: Vec<LinkId> = self
            .links
            .iter()
            .filter(|(_, l)| l.close_after_flush)
            .map(|(id, _)| *id)
            .collect();
        for &id in &closing {
            if let Some(l) = self.drop_link(id) {
                let _ = l.stream.shutdown(Shutdown::Both);
            }
        }
        closing.len()
    }

    fn pause_reading(&mut self, link: LinkId, paused: bool) {
        if let Some(l) = self.links.get_mut(&link) {
            if l.frozen {
                return;
            }
            l.paused = paused;
            if !paused && l.read_pending {
                self.read_pending.push(link);
            }
        }
    }

    fn backlog(&self, link: LinkId) -> usize {
        self.links.get(&link).map_or(0, |l| l.tx.len())
    }

    fn owns(&self, token: Token) -> bool {
        self.listeners.contains_key(&token) || self.links.contains_key(&LinkId(token.0 as u64))
    }

    /// Puts the links taken out of the Poll while the worker spun back in
    /// (module docs); false if one could not go in (reported by the next
    /// progress call).
    fn arm(&mut self) -> bool {
        self.all_into_poll();
        self.aborted.is_empty()
    }

    /// A connected socket's bytes show only as readiness, unless
    /// [`Transport::progress`] reads the links itself (module docs).
    fn ready_every_pass(&self) -> bool {
        if self.reads_by_polling() {
            self.links.values().any(TcpLink::needs_epoll)
        } else {
            !self.links.is_empty()
        }
    }

    fn link_count(&self) -> usize {
        self.links.len()
    }

    /// `links` open and the `buffer_bytes` their send queues and receive
    /// buffers hold (with the per-link structure): what an idle
    /// connection costs this transport; `write_blocked`: links whose
    /// socket took no more (a full kernel send buffer and peer window),
    /// waiting for room to write.
    fn stats(&self) -> TransportStats {
        let buffers: usize = self.links.values().map(TcpLink::buffer_bytes).sum();
        let structs = self.links.len() * std::mem::size_of::<(LinkId, TcpLink)>();
        let blocked = self.links.values().filter(|l| l.write_interest).count();
        TransportStats {
            kind: self.kind(),
            values: vec![
                ("links", self.links.len() as u64),
                ("buffer_bytes", (buffers + structs) as u64),
                ("write_blocked", blocked as u64),
            ],
        }
    }

    fn abort(&mut self, link: LinkId) -> Result<(), TransportError> {
        let l = self
            .links
            .get(&link)
            .ok_or(TransportError::NoSuchLink(link.0))?;
        socket2::SockRef::from(&l.stream)
            .set_linger(Some(std::time::Duration::ZERO))
            .map_err(|e| TransportError::io("SO_LINGER", e))?;
        // Closing with linger 0 sends RST to the peer.
        self.drop_link(link);
        self.aborted
            .push((link, LinkFailure::Local("injected abortive close".into())));
        Ok(())
    }

    fn detach(&mut self, link: LinkId) -> Option<DetachedLink> {
        self.dirty.remove(link);
        self.read_pending.retain(|l| *l != link);
        let mut l = self.drop_link(link)?;
        l.write_interest = false;
        Some(DetachedLink::Tcp(DetachedTcp { link: l }))
    }

    fn attach(&mut self, link: LinkId, detached: DetachedLink) -> Result<(), TransportError> {
        let DetachedLink::Tcp(d) = detached;
        let pending = !d.link.tx.is_empty();
        self.add_link(link, d.link, Interest::READABLE)?;
        // Bytes may have arrived while it moved: the edge may be gone, so look.
        self.read_pending.push(link);
        if pending {
            self.dirty.push(link);
        }
        Ok(())
    }
}

#[cfg(feature = "fault-injection")]
impl crate::FaultInjection for TcpTransport {
    fn inject(&mut self, link: LinkId, fault: RealFault) -> Result<(), TransportError> {
        let l = self
            .links
            .get_mut(&link)
            .ok_or(TransportError::NoSuchLink(link.0))?;
        let sock = socket2::SockRef::from(&l.stream);
        match fault {
            RealFault::Abort => self.abort(link)?,
            RealFault::HalfClose => {
                sock.shutdown(Shutdown::Write)
                    .map_err(|e| TransportError::io("shutdown", e))?;
            }
            RealFault::StopReading => l.paused = true,
            RealFault::Freeze => l.frozen = true,
        }
        Ok(())
    }

    fn send_corrupted(
        &mut self,
        link: LinkId,
        unit: Transmit,
        bit: u64,
    ) -> Result<(), TransportError> {
        let bytes = crate::wire::corrupted(unit, bit)?;
        let l = self
            .links
            .get_mut(&link)
            .ok_or(TransportError::NoSuchLink(link.0))?;
        let was_empty = l.tx.is_empty();
        l.tx.push_raw(&bytes);
        if was_empty {
            self.dirty.push(link);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::time::Duration;

    use bytes::Bytes;
    use mio::{Events, Poll};
    use msgr_proto::{banner::BANNER_LEN, Frame, Inbound, Tag};

    /// A TCP transport listening on loopback, and the address it got.
    /// A bound asks the kernel for that size each way (Linux doubles it,
    /// for its own bookkeeping); 0 leaves the socket as the kernel made it.
    #[test]
    fn socket_buffers_are_bound_when_asked_and_left_alone_otherwise() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let sizes = |bytes: usize| {
            let stream = TcpStream::from_std(std::net::TcpStream::connect(addr).unwrap());
            let before = socket2::SockRef::from(&stream).send_buffer_size().unwrap();
            bound_socket_buffers(&stream, bytes);
            let s = socket2::SockRef::from(&stream);
            (
                before,
                s.send_buffer_size().unwrap(),
                s.recv_buffer_size().unwrap(),
            )
        };
        let (_, send, recv) = sizes(64 << 10);
        assert_eq!((send, recv), (128 << 10, 128 << 10));
        let (before, send, _) = sizes(0);
        assert_eq!(send, before);
    }

    fn listening() -> (Poll, TcpTransport, std::net::SocketAddr) {
        let poll = Poll::new().unwrap();
        let ctx = TransportContext {
            limits: FrameLimits::default(),
            link_ids: Arc::new(AtomicU64::new(1)),
            copy_threshold: 4096,
            tcp_socket_buffer: 0,
            rdma: Default::default(),
            waker: None,
        };
        let mut t = TcpTransport::new(poll.registry(), &ctx).unwrap();
        let bound = t
            .listen(
                &"tcp://127.0.0.1:0".parse().unwrap(),
                Token(LISTENER_TOKEN_BASE),
            )
            .unwrap();
        (poll, t, bound.socket)
    }

    /// A banner and one 64 B frame, as one write.
    fn banner_and_frame() -> (Vec<u8>, Frame) {
        let f = Frame::new(Tag::Message, [Bytes::from(vec![7u8; 64])]);
        let mut bytes = vec![0u8; BANNER_LEN];
        bytes.extend_from_slice(&f.encode_to_vec().unwrap());
        (bytes, f)
    }

    /// Polls `t` until `done` says so (or fails the test after 10 s).
    fn poll_until(
        poll: &mut Poll,
        t: &mut TcpTransport,
        mut done: impl FnMut(&TcpTransport, &[TransportEvent]) -> bool,
    ) -> Vec<TransportEvent> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut events = Events::with_capacity(16);
        let mut seen = Vec::new();
        while !done(t, &seen) {
            assert!(Instant::now() < deadline, "events so far: {seen:?}");
            poll.poll(&mut events, Some(Duration::from_millis(10)))
                .unwrap();
            for ev in events.iter() {
                t.ready(ev, Instant::now(), &mut seen);
            }
            t.progress(Instant::now(), &mut seen);
        }
        seen
    }

    fn received(seen: &[TransportEvent]) -> Vec<&Frame> {
        seen.iter()
            .filter_map(|e| match e {
                TransportEvent::Received(_, Inbound::Frame(f)) => Some(f),
                _ => None,
            })
            .collect()
    }

    /// A message that arrives whole is read with one `recv`: a short read
    /// ends the reads, without a second `recv` that only says `WouldBlock`.
    /// (More links than are read-polled: this is the epoll path.)
    #[test]
    fn a_short_read_ends_the_reads() {
        let (mut poll, mut t, addr) = listening();
        let idle: Vec<_> = (0..READ_POLLED_LINKS)
            .map(|_| std::net::TcpStream::connect(addr).unwrap())
            .collect();
        let mut client = std::net::TcpStream::connect(addr).unwrap();
        poll_until(&mut poll, &mut t, |t, _| t.links.len() == idle.len() + 1);
        assert!(!t.reads_by_polling() && t.ready_every_pass());
        let recvs = |t: &TcpTransport| t.links.values().map(|l| l.rx.recvs).sum::<usize>();
        let before = recvs(&t);
        let (bytes, f) = banner_and_frame();
        client.write_all(&bytes).unwrap();
        let seen = poll_until(&mut poll, &mut t, |_, seen| !received(seen).is_empty());
        assert_eq!(received(&seen), [&f]);
        assert_eq!(
            recvs(&t) - before,
            1,
            "recv calls for one message that arrived whole"
        );
        drop((client, idle));
    }

    /// [`Transport::progress`] alone, no epoll, called until a frame is
    /// there or `within` has passed.
    fn progress_until_received(t: &mut TcpTransport, within: Duration) -> Vec<TransportEvent> {
        let deadline = Instant::now() + within;
        let mut seen = Vec::new();
        while received(&seen).is_empty() && Instant::now() < deadline {
            t.progress(Instant::now(), &mut seen);
        }
        seen
    }

    /// A read-polled link is out of the worker's Poll while the worker
    /// spins, once it has awaited nothing but bytes for [`LEAVE_POLL_AFTER`]
    /// (bytes for it raise no readiness: `progress` reads them), and back
    /// in once armed to sleep, where bytes already waiting wake the worker;
    /// with more links than are read-polled, every link is in.
    #[test]
    fn read_polled_links_leave_the_poll_while_the_worker_spins() {
        let (mut poll, mut t, addr) = listening();
        let mut client = std::net::TcpStream::connect(addr).unwrap();
        poll_until(&mut poll, &mut t, |t, _| t.links.len() == 1);
        let id = *t.links.keys().next().unwrap();
        let mut seen = Vec::new();
        // Passes over LEAVE_POLL_AFTER, by the clock they are given.
        let spin = |t: &mut TcpTransport, seen: &mut Vec<TransportEvent>| {
            let start = Instant::now();
            t.progress(start, seen);
            t.progress(start + LEAVE_POLL_AFTER, seen);
        };
        t.progress(Instant::now(), &mut seen);
        assert!(t.links[&id].in_poll, "out after one pass");
        spin(&mut t, &mut seen);
        assert!(!t.links[&id].in_poll && t.out_of_poll == 1);
        let (bytes, f) = banner_and_frame();
        client.write_all(&bytes).unwrap();
        let mut events = Events::with_capacity(16);
        let names = |events: &Events| events.iter().any(|e| e.token() == TcpTransport::token(id));
        poll.poll(&mut events, Some(Duration::from_millis(200)))
            .unwrap();
        assert!(!names(&events), "readiness for a link out of the Poll");
        assert!(t.arm());
        assert!(t.links[&id].in_poll && t.out_of_poll == 0);
        poll.poll(&mut events, Some(Duration::from_secs(10)))
            .unwrap();
        assert!(
            names(&events),
            "bytes waiting did not wake a sleeping worker"
        );
        for ev in events.iter() {
            t.ready(ev, Instant::now(), &mut seen);
        }
        assert_eq!(received(&seen), [&f]);

        spin(&mut t, &mut seen);
        assert!(!t.links[&id].in_poll, "out again while spinning");
        let more: Vec<_> = (0..READ_POLLED_LINKS)
            .map(|_| std::net::TcpStream::connect(addr).unwrap())
            .collect();
        poll_until(&mut poll, &mut t, |t, _| t.links.len() == more.len() + 1);
        t.progress(Instant::now(), &mut seen);
        assert!(!t.reads_by_polling());
        assert!(t.links.values().all(|l| l.in_poll) && t.out_of_poll == 0);
        drop((client, more));
    }

    /// A lone link is read by `progress` without epoll naming it, and the
    /// worker need not ask epoll every pass; once it has taken in bulk, it
    /// is epoll's again until it answers.
    #[test]
    fn a_lone_link_is_read_polled_until_it_moves_bulk() {
        let (mut poll, mut t, addr) = listening();
        let mut client = std::net::TcpStream::connect(addr).unwrap();
        poll_until(&mut poll, &mut t, |t, _| t.links.len() == 1);
        assert!(t.reads_by_polling() && !t.ready_every_pass());
        let (bytes, f) = banner_and_frame();
        client.write_all(&bytes).unwrap();
        let seen = progress_until_received(&mut t, Duration::from_secs(10));
        assert_eq!(received(&seen), [&f], "progress alone read the link");

        // Bulk in: a 64 KiB frame.
        let big = Frame::new(Tag::Message, [Bytes::from(vec![1u8; 64 << 10])]);
        client.write_all(&big.encode_to_vec().unwrap()).unwrap();
        let seen = poll_until(&mut poll, &mut t, |_, seen| !received(seen).is_empty());
        assert_eq!(received(&seen), [&big]);
        assert!(t.ready_every_pass(), "a link that took in bulk is epoll's");
        let small = Frame::new(Tag::Message, [Bytes::from(vec![2u8; 64])]);
        client.write_all(&small.encode_to_vec().unwrap()).unwrap();
        let seen = progress_until_received(&mut t, Duration::from_millis(200));
        assert!(
            received(&seen).is_empty(),
            "read-polled after bulk: {seen:?}"
        );
        let seen = poll_until(&mut poll, &mut t, |_, seen| !received(seen).is_empty());
        assert_eq!(received(&seen), [&small], "epoll names it");

        // An answer goes out: small exchanges again.
        let link = *t.links.keys().next().unwrap();
        t.send(link, Transmit::Frame(small.clone())).unwrap();
        t.flush(Instant::now(), &mut Vec::new());
        assert!(!t.ready_every_pass());
        client.write_all(&small.encode_to_vec().unwrap()).unwrap();
        let seen = progress_until_received(&mut t, Duration::from_secs(10));
        assert_eq!(received(&seen), [&small]);
        drop(client);
    }

    /// A peer that sends its last bytes and closes at once: the close can
    /// come with the bytes in one readiness event, and no event follows a
    /// short read then — the link must read on to the end of stream.
    #[test]
    fn a_close_that_comes_with_the_last_bytes_is_seen() {
        for _ in 0..20 {
            let (mut poll, mut t, addr) = listening();
            let mut client = std::net::TcpStream::connect(addr).unwrap();
            let (bytes, f) = banner_and_frame();
            client.write_all(&bytes).unwrap();
            drop(client);
            let seen = poll_until(&mut poll, &mut t, |_, seen| {
                seen.iter().any(|e| matches!(e, TransportEvent::Failed(..)))
            });
            assert_eq!(received(&seen), [&f]);
        }
    }
}
