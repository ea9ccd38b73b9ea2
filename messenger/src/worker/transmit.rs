//! The way out: a unit to its transport, through the fault plan when
//! one is configured (delayed units held in order per link; cargo feature
//! `fault-injection`).

#[cfg(feature = "fault-injection")]
use std::collections::VecDeque;
use std::time::Instant;

use msgr_backends::Transport;
#[cfg(feature = "fault-injection")]
use msgr_proto::Tag;
use msgr_proto::{LinkId, Transmit};
#[cfg(feature = "fault-injection")]
use rustc_hash::FxHashMap;

use super::Worker;
#[cfg(feature = "fault-injection")]
use crate::counters::Counters;
#[cfg(feature = "fault-injection")]
use crate::faults::{FaultAction, FaultInjector, FaultPlan};

/// The configured fault plan, if any, and the units it holds back.
#[cfg(feature = "fault-injection")]
pub(super) struct FaultPath {
    pub(super) plan: Option<FaultInjector>,
    /// Units held back by an injected delay, per link, in order.
    pub(super) held: FxHashMap<LinkId, (Instant, VecDeque<(Transmit, FaultAction)>)>,
}

#[cfg(feature = "fault-injection")]
impl FaultPath {
    pub(super) fn new(plan: Option<FaultPlan>, worker: usize) -> FaultPath {
        FaultPath {
            plan: plan.map(|p| FaultInjector::new(p, worker)),
            held: FxHashMap::default(),
        }
    }
}

impl Worker {
    /// Hands one unit to its transport.
    #[cfg(not(feature = "fault-injection"))]
    pub(super) fn transmit(&mut self, t: usize, link: LinkId, unit: Transmit, _now: Instant) {
        if let Err(e) = self.net.transports[t].send(link, unit) {
            tracing::debug!(error = %e, ?link, "transmit on a link that is gone");
        }
    }

    /// Hands one unit to its transport, through the fault plan if one is set.
    #[cfg(feature = "fault-injection")]
    pub(super) fn transmit(&mut self, t: usize, link: LinkId, unit: Transmit, now: Instant) {
        let action = match &mut self.faults.plan {
            Some(f) => f.decide(is_handshake(&unit)),
            None => FaultAction::Pass,
        };
        if action != FaultAction::Pass {
            Counters::add(&self.shared.counters.injected_faults, 1);
        }
        if let Some((_, q)) = self.faults.held.get_mut(&link) {
            // Something earlier on this link is delayed: keep the order.
            q.push_back((unit, action));
            return;
        }
        if let FaultAction::Delay(d) = action {
            let at = now + d;
            self.faults
                .held
                .insert(link, (at, VecDeque::from([(unit, FaultAction::Pass)])));
            self.timers.wake_by(at);
            return;
        }
        self.apply(t, link, unit, action);
    }

    /// Sends a unit as the fault plan decided.
    #[cfg(feature = "fault-injection")]
    pub(super) fn apply(&mut self, t: usize, link: LinkId, unit: Transmit, action: FaultAction) {
        let res = match action {
            FaultAction::Pass | FaultAction::Delay(_) => self.net.transports[t].send(link, unit),
            FaultAction::FailLink => self.net.transports[t].abort(link),
            FaultAction::Corrupt(bit) => {
                Counters::add(&self.shared.counters.corruptions_injected, 1);
                msgr_backends::FaultInjection::send_corrupted(
                    &mut self.net.transports[t],
                    link,
                    unit,
                    bit,
                )
            }
        };
        if let Err(e) = res {
            tracing::debug!(error = %e, ?link, "transmit on a link that is gone");
        }
    }

    /// Sends units whose injected delay is over.
    #[cfg(feature = "fault-injection")]
    pub(super) fn release_held(&mut self, now: Instant) {
        if self.faults.held.is_empty() {
            return;
        }
        let due: Vec<LinkId> = self
            .faults
            .held
            .iter()
            .filter(|(_, (at, _))| *at <= now)
            .map(|(l, _)| *l)
            .collect();
        for link in due {
            let Some((_, q)) = self.faults.held.remove(&link) else {
                continue;
            };
            let Some(t) = self.net.links.get(&link).map(|e| e.transport) else {
                continue;
            };
            for (unit, action) in q {
                self.apply(t, link, unit, action);
            }
        }
        for (at, _) in self.faults.held.values() {
            self.timers.wake_by(*at);
        }
    }

    /// Sends `refusal` (from the link's own session: sealed on a secure
    /// link) and closes the link.
    pub(super) fn refuse(&mut self, link: LinkId, t: usize, refusal: Transmit) {
        self.transmit(t, link, refusal, self.now);
        self.forget_link(link);
        self.net.transports[t].close(link, true);
    }
}

/// Banner and hello traffic: what the plan's handshake faults target.
#[cfg(feature = "fault-injection")]
pub(super) fn is_handshake(unit: &Transmit) -> bool {
    match unit {
        Transmit::Banner(_) => true,
        Transmit::Frame(f) => matches!(
            f.tag,
            Tag::Hello | Tag::HelloOk | Tag::ReconnectOk | Tag::SessionReset | Tag::Wait
        ),
        Transmit::Message(_) => false,
    }
}
