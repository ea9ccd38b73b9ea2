//! Timers: sessions' deadlines (earliest first, only the due ones
//! looked at), pending handshakes' and async calls' deadlines.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Instant;

use msgr_proto::LinkId;

use super::Worker;

/// A worker's deadlines.
#[derive(Default)]
pub(super) struct Timers {
    /// The earliest of them all, if any: when the loop must wake.
    pub(super) next: Option<Instant>,
    /// Sessions' timer deadlines, earliest first: (when, session key). An
    /// entry is live while its slot's `armed` holds its time; one left
    /// behind when a session's deadline moved earlier is skipped when it
    /// comes up. Firing timers looks at the sessions due, not at every
    /// session: 10,000 idle ones fire a keepalive each every 2 s, and a
    /// scan of all of them per firing took 60% of a core (issue 52).
    pub(super) sessions: BinaryHeap<Reverse<(Instant, u64)>>,
    /// Async calls' deadlines: (when, session key, call id), earliest first.
    pub(super) calls: BinaryHeap<Reverse<(Instant, u64, u64)>>,
    /// The shutdown's deadline, once shutting down.
    pub(super) shutdown: Option<Instant>,
}

impl Timers {
    /// Makes the loop wake by `at` at the latest.
    pub(super) fn wake_by(&mut self, at: Instant) {
        self.next = Some(self.next.map_or(at, |n| n.min(at)));
    }
}

impl Worker {
    pub(super) fn fire_timers(&mut self, now: Instant) {
        match self.timers.next {
            Some(t) if t <= now => {}
            _ => return,
        }
        let mut next: Option<Instant> = self.timers.shutdown;
        while let Some(&std::cmp::Reverse((at, key))) = self.timers.sessions.peek() {
            if at > now {
                next = Some(next.map_or(at, |n| n.min(at)));
                break;
            }
            self.timers.sessions.pop();
            let Some(s) = self.sessions.get_mut(&key) else {
                continue;
            };
            if s.armed != Some(at) {
                continue;
            }
            s.armed = None;
            match s.session.poll_timeout() {
                // Driven next, which files it under its next deadline.
                Some(t) if t <= now => {
                    s.session.handle_timeout(now);
                    self.touch(key);
                }
                // Its deadline moved later since this entry was made.
                Some(t) => {
                    s.armed = Some(t);
                    self.timers.sessions.push(std::cmp::Reverse((t, key)));
                }
                None => {}
            }
        }
        let links: Vec<LinkId> = self.handshakes.pending.keys().copied().collect();
        for l in links {
            let Some(p) = self.handshakes.pending.get_mut(&l) else {
                continue;
            };
            if p.session.poll_timeout().is_some_and(|t| t <= now) {
                p.session.handle_timeout(now);
                self.drive_pending(l, now);
            }
            if let Some(t) = self
                .handshakes
                .pending
                .get(&l)
                .and_then(|p| p.session.poll_timeout())
            {
                next = Some(next.map_or(t, |n| n.min(t)));
            }
        }
        while let Some(std::cmp::Reverse((at, key, id))) = self.timers.calls.peek().copied() {
            if at > now {
                next = Some(next.map_or(at, |n| n.min(at)));
                break;
            }
            self.timers.calls.pop();
            if let Some(s) = self.sessions.get(&key) {
                s.conn.expire_call(id);
            }
        }
        self.timers.next = next;
    }
}
