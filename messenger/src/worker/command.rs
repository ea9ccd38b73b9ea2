//! Commands: what handles and callbacks ask of a worker, through its
//! channel or (on the worker's own thread) the thread-local list, and
//! how the worker carries them out.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::Receiver;

use msgr_addr::TransportKind;
use msgr_backends::Transport;
use msgr_proto::{FaultReason, LinkId, Message, Session};

use super::{native_rma, LinkEntry, Owner, Slot, Worker};
use crate::connection::{Connection, ConnectionState};
use crate::counters::Counters;
use crate::pending::{Outgoing, RmaCall};
use crate::state::{peer_key, Adoption, Command, ConnInner, WorkerStats, LOCAL_WORKER};

/// Where a worker takes its commands from, and the emptied lists it
/// keeps for their memory (no allocation per command or batch).
pub(super) struct CommandInbox {
    pub(super) rx: Receiver<Command>,
    /// Set while the loop blocks in `poll`: a handle that queues a
    /// command then wakes it (`WorkerHandle::submit`).
    pub(super) sleeping: Arc<AtomicBool>,
    /// The dispatcher callbacks' commands being handled swap with this.
    pub(super) spare: Vec<Command>,
    /// An emptied list of what sends queued, for the next connection's
    /// turn ([`Worker::take_pending`]): no allocation per batch.
    pub(super) spare_outgoing: Vec<Outgoing>,
}

impl CommandInbox {
    pub(super) fn new(rx: Receiver<Command>, sleeping: Arc<AtomicBool>) -> CommandInbox {
        CommandInbox {
            rx,
            sleeping,
            spare: Vec::new(),
            spare_outgoing: Vec::new(),
        }
    }
}

impl Worker {
    pub(super) fn take_commands(&mut self) -> bool {
        let mut any = false;
        let now = self.now;
        while let Ok(cmd) = self.inbox.rx.try_recv() {
            any = true;
            self.handle_command(cmd, now);
        }
        any | self.take_local_commands()
    }

    /// Commands issued by dispatcher callbacks on this thread.
    pub(super) fn take_local_commands(&mut self) -> bool {
        let mut any = false;
        loop {
            // Looked at several times per message and mostly empty: a
            // glance first, the swap only when there is something.
            let queued =
                LOCAL_WORKER.with(|l| l.borrow().as_ref().is_some_and(|w| !w.commands.is_empty()));
            if !queued {
                return any;
            }
            let spare = std::mem::take(&mut self.inbox.spare);
            let mut cmds = LOCAL_WORKER.with(|l| match &mut *l.borrow_mut() {
                Some(w) => std::mem::replace(&mut w.commands, spare),
                None => spare,
            });
            if cmds.is_empty() {
                self.inbox.spare = cmds;
                return any;
            }
            any = true;
            let now = self.now;
            for c in cmds.drain(..) {
                self.handle_command(c, now);
            }
            self.inbox.spare = cmds;
        }
    }

    pub(super) fn handle_command(&mut self, cmd: Command, now: Instant) {
        match cmd {
            Command::Connect { conn } => self.start_connect(Connection::from_inner(conn), now),
            Command::Unbind { token, kind } => self.unbind(token, kind),
            Command::CallDeadline { key, id, at } => {
                self.timers.calls.push(std::cmp::Reverse((at, key, id)));
                self.timers.wake_by(at);
            }
            Command::Flush { conn } => self.take_pending(&conn),
            Command::MarkDown { key } => {
                if let Some(slot) = self.sessions.get_mut(&key) {
                    slot.session.mark_down(now);
                    self.touch(key);
                }
            }
            Command::Close { key } => {
                if let Some(slot) = self.sessions.get_mut(&key) {
                    slot.session.close(now);
                    self.touch(key);
                }
            }
            #[cfg(feature = "fault-injection")]
            Command::Inject { key, fault } => self.inject(key, fault),
            Command::RmaRevoke { region } => {
                for t in &mut self.net.transports {
                    t.rma_unexpose(region);
                }
            }
            Command::Stats { reply } => {
                let _ = reply.send(self.stats());
            }
            Command::Adopt(adoption) => self.adopt(*adoption, now),
            Command::Shutdown { deadline } => self.begin_shutdown(deadline, now),
        }
    }

    /// Stops listening (`token`) and closes every link over the transport
    /// `kind`: `Messenger::unbind`.
    fn unbind(&mut self, token: Option<mio::Token>, kind: TransportKind) {
        if let Some(token) = token {
            if let Some(i) = self.net.listeners.iter().position(|(_, tok)| *tok == token) {
                let (t, token) = self.net.listeners.remove(i);
                self.net.transports[t].unlisten(token);
            }
        }
        let gone: Vec<(LinkId, usize)> = self
            .net
            .links
            .iter()
            .filter(|(_, e)| self.net.transports[e.transport].kind() == kind)
            .map(|(l, e)| (*l, e.transport))
            .collect();
        for (link, t) in gone {
            if let Err(e) = self.net.transports[t].abort(link) {
                tracing::debug!(error = %e, "closing a link of an unbound transport");
            }
        }
    }

    /// Produces (or imitates) `fault` on session `key`'s link.
    #[cfg(feature = "fault-injection")]
    fn inject(&mut self, key: u64, fault: crate::state::LinkFault) {
        use crate::state::LinkFault;
        use msgr_backends::FaultInjection;
        if let Some(link) = self.sessions.get(&key).and_then(|s| s.session.link()) {
            if let Some(e) = self.net.links.get(&link) {
                Counters::add(&self.shared.counters.injected_faults, 1);
                let transport = &mut self.net.transports[e.transport];
                let done = match fault {
                    LinkFault::Real(f) => transport.inject(link, f),
                    LinkFault::Simulated(f) => transport.simulate(link, f),
                };
                if let Err(err) = done {
                    tracing::debug!(error = %err, "fault injection failed");
                }
            }
        }
    }

    /// The backends' own counters and the sessions' memory.
    fn stats(&self) -> WorkerStats {
        // The session engine lives in its slot: `memory_bytes`
        // counts its size too, so it is taken off here.
        let slots = self.sessions.values().map(|s| {
            std::mem::size_of::<Slot>() - std::mem::size_of::<Session>()
                + crate::state::handle_bytes()
                + s.conn.inner.pending.lock().memory_bytes()
                + s.session.memory_bytes()
        });
        let table = self.sessions.capacity() * std::mem::size_of::<(u64, Box<Slot>)>();
        let pending = self
            .handshakes
            .pending
            .values()
            .map(|p| p.session.memory_bytes());
        let timers = self.timers.sessions.capacity()
            * std::mem::size_of::<std::cmp::Reverse<(Instant, u64)>>();
        WorkerStats {
            transports: self.net.transports.iter().map(|t| t.stats()).collect(),
            sessions: self.sessions.len() + self.handshakes.pending.len(),
            session_bytes: table + timers + slots.chain(pending).sum::<usize>(),
        }
    }

    /// Takes over an accepted link whose session lives here.
    fn adopt(&mut self, adoption: Adoption, now: Instant) {
        let Adoption {
            link,
            detached,
            session,
            hello,
            transport,
        } = adoption;
        let Some(t) = self
            .net
            .transports
            .iter()
            .position(|x| x.kind() == transport)
        else {
            return;
        };
        if self.net.transports[t].attach(link, detached).is_ok() {
            self.net.links.insert(
                link,
                LinkEntry {
                    transport: t,
                    owner: Owner::Pending,
                },
            );
            self.route_local(link, t, session, hello, now);
        }
    }

    /// Stops listening, closes the sessions and the links still in
    /// their handshake; the loop ends once drained or at `deadline`.
    fn begin_shutdown(&mut self, deadline: Instant, now: Instant) {
        for (t, token) in std::mem::take(&mut self.net.listeners) {
            self.net.transports[t].unlisten(token);
        }
        let keys: Vec<u64> = self.sessions.keys().copied().collect();
        for k in keys {
            if let Some(s) = self.sessions.get_mut(&k) {
                s.session.close(now);
            }
            self.touch(k);
        }
        let waiting: Vec<LinkId> = self.handshakes.waiting.drain().map(|(l, _)| l).collect();
        for link in self
            .handshakes
            .pending
            .drain()
            .map(|(l, _)| l)
            .chain(waiting)
        {
            if let Some(e) = self.net.links.remove(&link) {
                self.net.transports[e.transport].close(link, false);
            }
        }
        self.timers.shutdown = Some(deadline);
        self.timers.wake_by(deadline);
    }

    /// Hands what `Connection::send` queued on `conn` to its session:
    /// encoded batches whole, other messages one by one, RMA requests
    /// natively where they may go so.
    pub(super) fn take_pending(&mut self, conn: &ConnInner) {
        let mut items = std::mem::take(&mut self.inbox.spare_outgoing);
        conn.pending.lock().take(&mut items);
        let key = conn.key;
        for item in items.drain(..) {
            match item {
                Outgoing::Batch(batch) => {
                    let n = u64::from(batch.count());
                    let sent = match self.sessions.get_mut(&key) {
                        Some(slot) => slot.session.send_encoded(batch).map(drop),
                        None => Err(msgr_proto::SendError::Closed),
                    };
                    if let Err(e) = sent {
                        // The handle's own bound makes this unreachable
                        // unless the session closed meanwhile.
                        tracing::debug!(error = %e, "send refused by session");
                        Counters::add(&self.shared.counters.messages_dropped, n);
                    }
                }
                Outgoing::Message(msg) => self.queue_message(key, msg),
                Outgoing::Rma(call) => self.queue_rma(key, *call),
            }
        }
        self.inbox.spare_outgoing = items;
        self.touch(key);
    }

    /// Hands an application's message to its session.
    fn queue_message(&mut self, key: u64, msg: Message) {
        match self.sessions.get_mut(&key) {
            Some(slot) => native_rma::send_on_session(slot, msg, &self.shared.counters),
            None => Counters::add(&self.shared.counters.messages_dropped, 1),
        }
    }

    /// Reads or writes natively where session `key`'s link may, else
    /// hands the request to the session for the owner.
    fn queue_rma(&mut self, key: u64, call: RmaCall) {
        let msg = match self.sessions.get_mut(&key) {
            Some(slot) => {
                let (transports, links) = (&mut self.net.transports, &self.net.links);
                let native = &mut self.native_ops;
                match native_rma::try_native((key, slot), call, transports, links, native) {
                    Ok(()) => return,
                    Err(msg) => msg,
                }
            }
            None => call.msg,
        };
        self.queue_message(key, msg);
    }

    pub(super) fn start_connect(&mut self, conn: Connection, now: Instant) {
        let key = conn.inner.key;
        if self.sessions.contains_key(&key) {
            return;
        }
        let t = match self.transport_for(&conn.inner.target) {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(error = %e, target = %conn.inner.target, "cannot connect");
                conn.set_state(ConnectionState::Closed);
                let reason = FaultReason::Transport(e.link_failure());
                let _ = self.callback(&conn, || "on_reset".into(), |d, c| d.on_reset(c, &reason));
                return;
            }
        };
        let mut session = Session::connect(
            self.shared.cfg.session.clone(),
            self.shared.local.clone(),
            conn.inner.target.clone(),
            conn.inner.policy,
            now,
        );
        if let Some(name) = &conn.inner.expected {
            session.expect_peer(name.clone());
        }
        let alternates = conn.inner.alternates.lock().clone();
        if !alternates.is_empty() {
            session.set_alternates(alternates);
        }
        self.by_peer.insert(peer_key(&conn.inner.target), key);
        Counters::add(&self.shared.counters.sessions_active, 1);
        self.sessions
            .insert(key, Slot::new(session, conn, t, false));
        self.touch(key);
    }
}
