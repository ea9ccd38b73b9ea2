//! What the transports report: accepted, connected and failed links,
//! arrived units, native RMA completions; the transports' progress,
//! arming and flushing, and the receive throttle's pause of reading.

use std::sync::atomic::Ordering;
use std::time::Instant;

use mio::Token;
use msgr_backends::{AnyTransport, RmaFailure, Transport, TransportEvent};
use msgr_proto::{Inbound, LinkId, Session};
use rustc_hash::FxHashMap;

use super::{LinkEntry, Owner, Worker, TX_LOW_WATER};
use crate::counters::Counters;

/// The transports a worker runs, what listens on them and the links over
/// them, with the events they report.
pub(super) struct Net {
    pub(super) transports: Vec<AnyTransport>,
    pub(super) listeners: Vec<(usize, Token)>,
    pub(super) links: FxHashMap<LinkId, LinkEntry>,
    /// What the transports reported, handled in [`Worker::handle_transport_events`].
    pub(super) events: Vec<TransportEvent>,
    /// Reading paused by the receive throttle.
    pub(super) rx_paused: bool,
}

impl Net {
    pub(super) fn new(transports: Vec<AnyTransport>, listeners: Vec<(usize, Token)>) -> Net {
        Net {
            transports,
            listeners,
            links: FxHashMap::default(),
            events: Vec::new(),
            rx_paused: false,
        }
    }
}

/// Links whose protocol error a batch of events has counted. One bad
/// connection is one error, but it can be reported twice in a batch: a
/// transport decodes all it read before the worker sees any of it, so
/// the 32 bytes of a bad banner come as a unit the session refuses and
/// the bytes after them as `Corrupt` (and a session may refuse one unit,
/// then another). Nothing for a link follows its `Corrupt`, nor a later
/// batch its refusal (the session closes the link first), so a batch's
/// list suffices; it allocates only when something was bad.
#[derive(Default)]
struct ErredLinks(Vec<LinkId>);

impl ErredLinks {
    /// Whether this is `link`'s first error in the batch (noted if so).
    fn first(&mut self, link: LinkId) -> bool {
        let first = !self.0.contains(&link);
        if first {
            self.0.push(link);
        }
        first
    }
}

impl Worker {
    pub(super) fn progress_transports(&mut self) -> bool {
        let mut any = false;
        for t in &mut self.net.transports {
            any |= t.progress(self.now, &mut self.net.events);
        }
        if any {
            self.handle_transport_events();
        }
        any
    }

    /// Arms every transport's wait objects before blocking; false as soon as
    /// one has something pending already (the worker will not block, and
    /// arms the rest next time).
    pub(super) fn arm_transports(&mut self) -> bool {
        self.net.transports.iter_mut().all(|t| t.arm())
    }

    pub(super) fn flush_transports(&mut self) {
        loop {
            for t in &mut self.net.transports {
                t.flush(self.now, &mut self.net.events);
            }
            let unblocked = self.unblock_sessions();
            if self.net.events.is_empty() && !unblocked {
                return;
            }
            self.handle_transport_events();
            self.drive_touched();
        }
    }

    /// Sessions held back by a backed-up link continue once it has drained
    /// below the low-water mark. Returns whether any did.
    pub(super) fn unblock_sessions(&mut self) -> bool {
        if self.driving.blocked.is_empty() {
            return false;
        }
        let mut any = false;
        let keys: Vec<u64> = self.driving.blocked.iter().copied().collect();
        for key in keys {
            let backlog = match self.sessions.get(&key) {
                Some(slot) => match slot.session.link() {
                    Some(l) => self.net.transports[slot.transport].backlog(l),
                    None => 0,
                },
                None => 0,
            };
            if backlog < TX_LOW_WATER {
                self.driving.blocked.remove(&key);
                self.touch(key);
                any = true;
            }
        }
        any
    }

    pub(super) fn handle_transport_events(&mut self) {
        // Every pass asks, and most have nothing: no swap of the buffers then.
        if self.net.events.is_empty() {
            return;
        }
        let now = self.now;
        let mut evs = std::mem::take(&mut self.net.events);
        let mut erred = ErredLinks::default();
        let mut frames = 0;
        for ev in evs.drain(..) {
            tracing::trace!(worker = self.idx, event = ?ev, "transport event");
            match ev {
                TransportEvent::Accepted {
                    link,
                    listener,
                    peer,
                } => self.on_accepted(link, listener, peer.ip(), now),
                TransportEvent::Connected(link) => {
                    if let Some(Owner::Session(k)) = self.net.links.get(&link).map(|e| e.owner) {
                        if let Some(s) = self.sessions.get_mut(&k) {
                            s.session.link_up(link, now);
                        }
                        self.touch(k);
                    }
                }
                TransportEvent::Received(link, unit) => {
                    frames += 1;
                    self.on_received(link, unit, now, &mut erred)
                }
                TransportEvent::Corrupt(link, err) => {
                    tracing::debug!(link = link.0, error = %err, "link received bytes that do not decode");
                    if erred.first(link) {
                        count_protocol_error(&self.shared.counters, &err);
                    }
                    self.link_gone(link, |s, now| s.handle_decode_error(link, err, now), now);
                }
                TransportEvent::Failed(link, why) => {
                    tracing::debug!(link = link.0, %why, "link failed");
                    self.link_gone(link, |s, now| s.link_failed(link, why, now), now);
                }
                TransportEvent::RmaRead { token, result, .. } => {
                    self.native_op_done(token, result);
                }
                TransportEvent::RmaWrite { token, result, .. } => {
                    self.native_op_done(token, result.map(|()| bytes::Bytes::new()));
                }
            }
        }
        Counters::add(&self.shared.counters.rx_frames, frames);
        // Keep the allocation.
        if self.net.events.is_empty() {
            self.net.events = evs;
        }
    }

    /// A unit arrived on `link`: to its session, its pending handshake,
    /// or kept while it waits for a handshake slot.
    fn on_received(&mut self, link: LinkId, unit: Inbound, now: Instant, erred: &mut ErredLinks) {
        match self.net.links.get(&link).map(|e| e.owner) {
            Some(Owner::Session(k)) => {
                if let Some(s) = self.sessions.get_mut(&k) {
                    let throttle = &self.shared.throttle;
                    let r = s
                        .session
                        .handle_inbound_with(link, unit, now, |u| throttle.charge_unit(u));
                    if let Err(e) = r {
                        if erred.first(link) {
                            count_protocol_error(&self.shared.counters, &e);
                        }
                    }
                }
                self.touch(k);
            }
            Some(Owner::Pending) => {
                if let Some(p) = self.handshakes.pending.get_mut(&link) {
                    if let Err(e) = p.session.handle_inbound(link, unit, now) {
                        if erred.first(link) {
                            count_protocol_error(&self.shared.counters, &e);
                        }
                    }
                }
                self.drive_pending(link, now);
            }
            Some(Owner::Waiting) if !self.handshakes.waiting.keep_early(link, unit) => {
                self.drop_waiting(link);
            }
            Some(Owner::Waiting) | None => {}
        }
    }

    /// A link closed underneath us: tell its session.
    pub(super) fn link_gone(
        &mut self,
        link: LinkId,
        tell: impl FnOnce(&mut Session, Instant),
        now: Instant,
    ) {
        // Native operations on it are asked of the owner, over the next
        // link (a write that may have landed lands again: RMA writes are
        // idempotent).
        let stranded: Vec<u64> = (self.native_ops.iter())
            .filter(|(_, r)| r.link == link)
            .map(|(&t, _)| t)
            .collect();
        for token in stranded {
            self.native_op_done(token, Err(RmaFailure::LinkGone));
        }
        let Some(e) = self.forget_link(link) else {
            return;
        };
        Counters::add(&self.shared.counters.link_faults, 1);
        match e.owner {
            Owner::Session(k) => {
                if let Some(s) = self.sessions.get_mut(&k) {
                    tell(&mut s.session, now);
                }
                self.touch(k);
            }
            Owner::Pending => {
                if let Some(mut p) = self.handshakes.pending.remove(&link) {
                    tell(&mut p.session, now);
                }
            }
            Owner::Waiting => {
                self.handshakes.waiting.remove(link);
            }
        }
    }

    /// Forgets `link` (if this worker still has it) and counts it closed;
    /// closing it on its transport is the caller's (flushed or not, or
    /// already closed underneath).
    pub(super) fn forget_link(&mut self, link: LinkId) -> Option<LinkEntry> {
        let e = self.net.links.remove(&link)?;
        self.shared
            .counters
            .links_active
            .fetch_sub(1, Ordering::Relaxed);
        Some(e)
    }

    pub(super) fn check_throttle(&mut self) {
        let th = &self.shared.throttle;
        let mut full = th.full();
        if full && !self.net.rx_paused {
            th.set_paused();
            // A release may have slipped in before set_paused: look again.
            full = th.full();
        }
        if full == self.net.rx_paused {
            return;
        }
        if full {
            Counters::add(&self.shared.counters.rx_throttle_pauses, 1);
        }
        self.net.rx_paused = full;
        let now = Instant::now();
        for (link, e) in &self.net.links {
            self.net.transports[e.transport].pause_reading(*link, full);
        }
        for s in self.sessions.values_mut() {
            s.session.set_rx_paused(full, now);
        }
    }
}

/// Counts a link closed for what its peer sent, by kind: every one in
/// `protocol_errors`, and failed authentication, sealed frames that did
/// not open and checksum mismatches in their own counters (logged, once
/// per link: who failed, or what corrupts data, is worth a look).
pub(super) fn count_protocol_error(counters: &Counters, e: &msgr_proto::ProtocolError) {
    Counters::add(&counters.protocol_errors, 1);
    match e {
        msgr_proto::ProtocolError::Auth(why) => {
            Counters::add(&counters.auth_failures, 1);
            tracing::warn!(%why, "authentication failed; link closed");
        }
        msgr_proto::ProtocolError::Record(why) => {
            Counters::add(&counters.sealed_frames_refused, 1);
            tracing::warn!(%why, "a frame on a secure link did not open; link closed");
        }
        // Corruption on the way (or a bug): at the default level, not
        // only in debug output.
        msgr_proto::ProtocolError::Frame(
            msgr_proto::FrameError::PreambleCrc { .. } | msgr_proto::FrameError::SegmentCrc { .. },
        )
        | msgr_proto::ProtocolError::Banner(msgr_proto::BannerError::Crc) => {
            Counters::add(&counters.checksum_failures, 1);
            tracing::warn!(error = %e, "checksum mismatch: link closed");
        }
        _ => {}
    }
}
