//! Delivery to the application: a session's messages to the reply
//! waiting for them, the RMA region they name or the dispatcher; its
//! events to the dispatcher's callbacks, under the panic policy; and a
//! session's end.

use std::sync::atomic::Ordering;
use std::time::Instant;

use msgr_addr::EntityAddr;
use msgr_backends::{AnyTransport, Transport};
use msgr_proto::{
    message::REPLY_BIT, rma::RMA_BIT, FaultReason, LinkFailure, LinkId, Message, ReceivedBatch,
    SessionEvent,
};
use rustc_hash::FxHashMap;

use super::{native_rma, LinkEntry, Owner, Slot, Worker};
use crate::connection::{Connection, ConnectionState};
use crate::counters::Counters;
use crate::dispatcher::{guarded, Dispatcher, MessageRefs, Panicked};
use crate::state::{peer_key, Shared};

impl Worker {
    pub(super) fn handle_session_event(&mut self, key: u64, ev: SessionEvent, now: Instant) {
        log_event(&ev);
        let Some(slot) = self.sessions.get_mut(&key) else {
            return;
        };
        let conn = slot.conn.clone();
        let c = &self.shared.counters;
        match ev {
            SessionEvent::Connect(addr) => self.dial(key, &addr, now),
            SessionEvent::CloseLink(link) => {
                if let Some(e) = self.forget_link(link) {
                    self.net.transports[e.transport].close(link, true);
                }
            }
            SessionEvent::Identified(_) => {}
            SessionEvent::ConnectFailed { reason } => {
                Counters::add(&c.connect_failures, 1);
                tracing::info!(target = %conn.target(), %reason, "connection attempt failed");
                let r = self.callback(
                    &conn,
                    || "on_connect_failed".into(),
                    |d, c| d.on_connect_failed(c, &reason),
                );
                self.abort_on_panic(key, r);
            }
            SessionEvent::Established(peer) => {
                conn.publish_send_limits(slot.session.send_limits());
                *conn.inner.peer.lock() = Some(peer);
                conn.set_state(ConnectionState::Open);
                let r = if slot.accepted {
                    Counters::add(&c.sessions_accepted, 1);
                    self.callback(&conn, || "on_accept".into(), |d, c| d.on_accept(c))
                } else {
                    Counters::add(&c.sessions_connected, 1);
                    self.callback(&conn, || "on_connect".into(), |d, c| d.on_connect(c))
                };
                self.abort_on_panic(key, r);
            }
            SessionEvent::Moved { from, to, reason } => {
                Counters::add(&c.transport_changes, 1);
                let why = reason.map_or_else(String::new, |r| r.to_string());
                tracing::info!(
                    peer = %conn.target(),
                    %from,
                    %to,
                    reason = %why,
                    queued = slot.session.queued_messages(),
                    "session moved to another transport"
                );
            }
            SessionEvent::Resumed { replayed } => {
                conn.publish_send_limits(slot.session.send_limits());
                conn.set_state(ConnectionState::Open);
                Counters::add(&c.reconnects, 1);
                Counters::add(&c.replayed_messages, replayed);
            }
            SessionEvent::Reset {
                reason,
                undelivered,
            } => self.session_reset(key, &conn, reason, undelivered),
            SessionEvent::RemoteReset { dropped } => {
                // The peer's session is gone, and with it any request it
                // had not answered.
                conn.inner
                    .calls
                    .fail_all(&FaultReason::Transport(LinkFailure::Reset(
                        "the peer reset the session".into(),
                    )));
                Counters::add(&c.remote_resets, 1);
                Counters::add(&c.messages_dropped, dropped);
                let r = self.callback(
                    &conn,
                    || "on_remote_reset".into(),
                    |d, c| d.on_remote_reset(c),
                );
                self.abort_on_panic(key, r);
            }
            SessionEvent::Closed => conn.set_state(ConnectionState::Closed),
        }
    }

    /// Session `key` asks for a link to `addr`: opened on the transport
    /// serving it (an address vector may name another transport than
    /// the last attempt's).
    fn dial(&mut self, key: u64, addr: &EntityAddr, now: Instant) {
        let Some(slot) = self.sessions.get(&key) else {
            return;
        };
        if slot.session.failed_attempts() > 0 {
            Counters::add(&self.shared.counters.redials, 1);
        }
        let link = LinkId(self.shared.link_ids.fetch_add(1, Ordering::Relaxed));
        // An address vector may name another transport than the
        // last attempt's.
        let t = match self.transport_for(addr) {
            Ok(t) => t,
            Err(e) => {
                if let Some(slot) = self.sessions.get_mut(&key) {
                    slot.session.link_failed(link, e.link_failure(), now);
                }
                return;
            }
        };
        let Some(slot) = self.sessions.get_mut(&key) else {
            return;
        };
        slot.transport = t;
        match self.net.transports[t].connect(link, addr) {
            Ok(()) => {
                slot.session.dialing(link);
                Counters::add(&self.shared.counters.links_active, 1);
                self.net.links.insert(
                    link,
                    LinkEntry {
                        transport: t,
                        owner: Owner::Session(key),
                    },
                );
            }
            Err(e) => slot.session.link_failed(link, e.link_failure(), now),
        }
    }

    /// Session `key` ended: its handle, calls and counters say why, then
    /// the dispatcher's `on_reset`.
    fn session_reset(
        &mut self,
        key: u64,
        conn: &Connection,
        reason: FaultReason,
        undelivered: u64,
    ) {
        let c = &self.shared.counters;
        if let Some(slot) = self.sessions.get(&key) {
            // Why, before the state says Closed: a waiter that sees the
            // state reads the reason next (`Connection::wait_connected`).
            conn.publish_status(&slot.session);
        }
        conn.set_state(ConnectionState::Closed);
        Counters::add(&c.session_resets, 1);
        Counters::add(&c.messages_dropped, undelivered);
        if reason == FaultReason::KeepaliveTimeout {
            Counters::add(&c.keepalive_timeouts, 1);
        }
        if matches!(reason, FaultReason::TooLarge(_)) {
            Counters::add(&c.messages_too_large, 1);
        }
        self.report.undelivered += undelivered;
        conn.inner.calls.fail_all(&reason);
        // The session has ended: a panic here is logged and counted.
        let _ = self.callback(conn, || "on_reset".into(), |d, c| d.on_reset(c, &reason));
    }

    /// Runs one dispatcher callback for `conn` under the configured panic
    /// policy (`crate::dispatcher::guarded`); `what` names what it was
    /// given, for the log.
    pub(super) fn callback(
        &self,
        conn: &Connection,
        what: impl FnOnce() -> String,
        f: impl FnOnce(&dyn crate::Dispatcher, &Connection),
    ) -> Result<(), Panicked> {
        let shared = &self.shared;
        guarded(
            shared.cfg.handler_panic,
            &shared.counters.handler_panics,
            conn,
            what,
            || f(&*self.dispatcher, conn),
        )
    }

    /// Ends session `key` if its handler panicked: `on_reset` follows with
    /// the panic's message.
    pub(super) fn abort_on_panic(&mut self, key: u64, r: Result<(), Panicked>) {
        if let Err(Panicked(why)) = r {
            if let Some(slot) = self.sessions.get_mut(&key) {
                slot.session.abort(FaultReason::HandlerPanicked(why));
                self.touch(key);
            }
        }
    }

    pub(super) fn remove_session(&mut self, key: u64) {
        let Some(slot) = self.sessions.remove(&key) else {
            return;
        };
        self.shared
            .counters
            .sessions_active
            .fetch_sub(1, Ordering::Relaxed);
        slot.conn.set_state(ConnectionState::Closed);
        let target = &slot.conn.inner.target;
        for addr in [slot.session.peer_addr().unwrap_or(target), target] {
            let k = peer_key(addr);
            if self.by_peer.get(&k) == Some(&key) {
                self.by_peer.remove(&k);
            }
            self.shared.unregister(key, addr);
        }
        // Any link still registered to it goes too.
        let stale: Vec<LinkId> = self
            .net
            .links
            .iter()
            .filter(|(_, e)| matches!(e.owner, Owner::Session(k) if k == key))
            .map(|(l, _)| *l)
            .collect();
        for l in stale {
            if let Some(e) = self.forget_link(l) {
                self.net.transports[e.transport].close(l, true);
            }
        }
    }
}

/// A message `slot`'s session delivered, by its call field: a reply to
/// the call that waits for it, an RMA request to the region it names,
/// anything else to the application's dispatcher (or inbox). A handler
/// that panics ends the session (`on_reset` follows).
///
/// Borrows the connection rather than cloning it (an atomic count up and
/// down per message). Counted with the session's other figures once it is
/// driven (`Worker::drive`), not by atomic additions per message; charged
/// to the receive throttle when its unit arrived (`RxThrottle::charge_unit`).
pub(super) fn deliver(
    slot: &mut Slot,
    msg: Message,
    shared: &Shared,
    dispatcher: &dyn Dispatcher,
    transports: &mut [AnyTransport],
    links: &FxHashMap<LinkId, LinkEntry>,
) {
    if msg.call & REPLY_BIT != 0 {
        if msg.call & RMA_BIT != 0 {
            native_rma::owner_replied(slot, msg, &shared.counters);
        } else {
            slot.conn.inner.calls.route_reply(msg, &shared.counters);
        }
        return;
    }
    if msg.call & RMA_BIT != 0 {
        native_rma::serve(slot, msg, transports, links, &shared.counters);
        return;
    }
    let conn = &slot.conn;
    let ty = msg.msg_type;
    if let Err(Panicked(why)) = guarded(
        shared.cfg.handler_panic,
        &shared.counters.handler_panics,
        conn,
        || format!("a message of type {ty}"),
        || dispatcher.on_message(conn, msg),
    ) {
        slot.session.abort(FaultReason::HandlerPanicked(why));
    }
}

/// The entries of a batch `slot`'s session received, in order: runs of
/// them to the dispatcher's `on_batch` as views of the batch's buffer,
/// what it leaves to `on_message` one by one, and each reply or RMA
/// operation between the runs routed as [`deliver`] routes it. A handler
/// that panics ends the session: the rest of the batch is not delivered
/// (`on_reset` follows), as the rest of the session's queue is not.
pub(super) fn deliver_batch(
    slot: &mut Slot,
    batch: &ReceivedBatch,
    shared: &Shared,
    dispatcher: &dyn Dispatcher,
    transports: &mut [AnyTransport],
    links: &FxHashMap<LinkId, LinkEntry>,
) {
    let mut refs = MessageRefs::new(batch.iter());
    let (policy, panics) = (shared.cfg.handler_panic, &shared.counters.handler_panics);
    loop {
        if refs.starts_a_run() {
            let conn = &slot.conn;
            let left = refs.entries_left();
            let mut r = guarded(
                policy,
                panics,
                conn,
                || format!("a batch of {left} messages"),
                || dispatcher.on_batch(conn, &mut refs),
            );
            // What the handler left of its run, one by one.
            while r.is_ok() {
                let Some(m) = refs.next() else { break };
                let ty = m.msg_type;
                r = guarded(
                    policy,
                    panics,
                    conn,
                    || format!("a message of type {ty}"),
                    || dispatcher.on_message(conn, m.to_message()),
                );
            }
            if let Err(Panicked(why)) = r {
                slot.session.abort(FaultReason::HandlerPanicked(why));
                return;
            }
        }
        let Some(routed) = refs.take_held() else {
            return;
        };
        deliver(
            slot,
            routed.to_message(),
            shared,
            dispatcher,
            transports,
            links,
        );
    }
}

/// Life-cycle events at the info level, the others in debug output.
fn log_event(ev: &SessionEvent) {
    match &ev {
        SessionEvent::Established(p) => {
            tracing::info!(peer = %p.addr, name = %p.name, "session established")
        }
        SessionEvent::Reset {
            reason,
            undelivered,
        } => {
            tracing::info!(%reason, undelivered, "session reset")
        }
        SessionEvent::RemoteReset { dropped } => {
            tracing::info!(dropped, "peer reset the session")
        }
        other => tracing::debug!(event = ?other, "session event"),
    }
}
