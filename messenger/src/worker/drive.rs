//! Driving sessions: each touched session's arrivals out to the
//! application, its output onto its link (bounded by the link's
//! backlog), and its figures and state published to its handle.

use std::sync::atomic::Ordering;
use std::time::Instant;

use msgr_backends::Transport;
use msgr_proto::banner::features;
use msgr_proto::{LinkId, Received, Transmit};
use rustc_hash::FxHashSet;

use super::deliver::{deliver, deliver_batch};
use super::{Worker, TX_HIGH_WATER, TX_LOW_WATER};

/// With priority lanes, a session stops handing frames to its link at
/// this much unsent (the low-water mark, where it continues): the most
/// urgent class is chosen when a frame leaves the session, so what the
/// link already holds is what a call queued later still waits behind.
const LANES_HIGH_WATER: usize = TX_LOW_WATER;
use crate::connection::ConnectionState;
use crate::counters::Counters;

/// The sessions to drive, and what driving them keeps between turns.
#[derive(Default)]
pub(super) struct Driving {
    /// Sessions with something to do this pass.
    pub(super) touched: Vec<u64>,
    /// An emptied list the sessions being driven swap with, so a message
    /// does not allocate for the bookkeeping.
    pub(super) spare: Vec<u64>,
    /// A session's units on their way to its transport (emptied, kept).
    pub(super) outbox: Vec<(LinkId, Transmit)>,
    /// Sessions with output waiting for their link to drain.
    pub(super) blocked: FxHashSet<u64>,
}

impl Worker {
    pub(super) fn touch(&mut self, key: u64) {
        // Touched again (between two peers, every touch of a turn): no lookup.
        if self.driving.touched.last() == Some(&key) {
            return;
        }
        match self.sessions.get_mut(&key) {
            Some(slot) if slot.touched => {}
            Some(slot) => {
                slot.touched = true;
                self.driving.touched.push(key);
            }
            // No slot (yet): driving it is a no-op unless one comes; rare.
            None if self.driving.touched.contains(&key) => {}
            None => self.driving.touched.push(key),
        }
    }

    pub(super) fn drive_touched(&mut self) {
        while !self.driving.touched.is_empty() {
            let now = self.now;
            let spare = std::mem::take(&mut self.driving.spare);
            let mut keys = std::mem::replace(&mut self.driving.touched, spare);
            for key in keys.drain(..) {
                self.drive(key, now);
            }
            self.driving.spare = keys;
            self.take_local_commands();
        }
    }

    /// Moves a session's output to its transport and its events to the application.
    pub(super) fn drive(&mut self, key: u64, now: Instant) {
        // One span per session: its life-cycle events below nest in it.
        let _span = tracing::debug_span!("session", worker = self.idx, id = key).entered();
        // Off the touched list: the first lookup below says so, and a
        // touch from here on lists it again.
        let mut listed = true;
        loop {
            // Deliver what arrived first, then take the sends its callbacks
            // made: a reply then carries the ack (messages piggyback it)
            // instead of following a standalone Ack frame — one unit per
            // request/reply exchange on the wire, not two.
            loop {
                let Some(slot) = self.sessions.get_mut(&key) else {
                    return;
                };
                if std::mem::take(&mut listed) {
                    slot.touched = false;
                }
                // Messages, the hot case (a batch's entries, read in
                // place), are delivered with the slot in hand: no second
                // lookup, no event dispatch.
                while let Some(r) = slot.session.poll_received() {
                    let (shared, dispatcher) = (&self.shared, &*self.dispatcher);
                    let (transports, links) = (&mut self.net.transports, &self.net.links);
                    match r {
                        Received::Batch(b) => {
                            deliver_batch(slot, &b, shared, dispatcher, transports, links)
                        }
                        Received::Message(m) => {
                            deliver(slot, m, shared, dispatcher, transports, links)
                        }
                    }
                }
                // An event, or none once both are drained (an event held
                // back by messages came out after them above).
                let Some(ev) = slot.session.poll_event() else {
                    break;
                };
                self.handle_session_event(key, ev, now);
            }
            self.take_local_commands();
            if !self.send_output(key, now) {
                return;
            }
            let Some(slot) = self.sessions.get_mut(&key) else {
                return;
            };
            let Some(ev) = slot.session.poll_event() else {
                break;
            };
            self.handle_session_event(key, ev, now);
        }
        self.publish(key);
    }

    /// Moves session `key`'s output to its link, as much as the link's
    /// backlog allows (else it waits in `driving.blocked` for the link to
    /// drain). False if the session is gone.
    fn send_output(&mut self, key: u64, now: Instant) -> bool {
        let Some(slot) = self.sessions.get_mut(&key) else {
            return false;
        };
        let t = slot.transport;
        let mut out = std::mem::take(&mut self.driving.outbox);
        let link = slot.session.link();
        let high_water = if slot.session.features() & features::LANES != 0 {
            LANES_HIGH_WATER
        } else {
            TX_HIGH_WATER
        };
        let mut room = match link {
            Some(l) => high_water.saturating_sub(self.net.transports[t].backlog(l)),
            None => 0,
        };
        while room > 0 {
            let Some(tx) = slot.session.poll_transmit(now) else {
                break;
            };
            room = room.saturating_sub(Transmit::encoded_len(&tx.1));
            out.push(tx);
        }
        if room == 0 && link.is_some() && slot.session.wants_transmit() {
            // The link is backed up: resume when it drains (flush_transports).
            self.driving.blocked.insert(key);
        }
        for (link, unit) in out.drain(..) {
            self.transmit(t, link, unit, now);
        }
        self.driving.outbox = out;
        true
    }

    /// Publishes what driving session `key` changed: the counters, its
    /// status and state, the room its queue released, its next deadline;
    /// and removes it once closed.
    fn publish(&mut self, key: u64) {
        let Some(slot) = self.sessions.get_mut(&key) else {
            return;
        };
        // Account: what left the queue, what was counted.
        let st = slot.session.stats();
        let c = &self.shared.counters;
        Counters::add(&c.tx_messages, st.tx_messages - slot.seen.tx_messages);
        Counters::add(&c.tx_bytes, st.tx_bytes - slot.seen.tx_bytes);
        Counters::add(&c.tx_batches, st.tx_batches - slot.seen.tx_batches);
        Counters::add(&c.tx_acks, st.acks - slot.seen.acks);
        Counters::add(&c.rx_batches, st.rx_batches - slot.seen.rx_batches);
        Counters::add(&c.rx_messages, st.rx_messages - slot.seen.rx_messages);
        Counters::add(&c.rx_bytes, st.rx_bytes - slot.seen.rx_bytes);
        Counters::add(&c.duplicates_dropped, st.duplicates - slot.seen.duplicates);
        let phase = slot.session.phase();
        if st.faults != slot.seen.faults || Some(phase) != slot.seen_phase {
            slot.seen_phase = Some(phase);
            slot.conn.publish_status(&slot.session);
        }
        slot.seen = st;
        slot.conn.set_state(if slot.session.is_open() {
            ConnectionState::Open
        } else if slot.session.is_closed() {
            ConnectionState::Closed
        } else {
            ConnectionState::Connecting
        });
        let inner = &slot.conn.inner;
        let [bypassed, bypassed_bytes] = slot.bypassed;
        inner.released[0].store(st.released_messages + bypassed, Ordering::Release);
        inner.released[1].store(st.released_bytes + bypassed_bytes, Ordering::Release);
        inner.room.released();
        if let Some(t) = slot.session.poll_timeout() {
            // A later deadline keeps the earlier entry: when it comes up,
            // `fire_timers` files the session under its deadline then.
            if slot.armed.is_none_or(|a| t < a) {
                slot.armed = Some(t);
                self.timers.sessions.push(std::cmp::Reverse((t, key)));
                self.timers.wake_by(t);
            }
        }
        if slot.session.is_closed() {
            self.remove_session(key);
        }
    }
}
