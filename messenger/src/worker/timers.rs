//! Timers: sessions' deadlines (earliest first, only the due ones
//! looked at), pending handshakes' and async calls' deadlines.

use std::time::Instant;

use msgr_proto::LinkId;

use super::Worker;

impl Worker {
    pub(super) fn fire_timers(&mut self, now: Instant) {
        match self.next_timer {
            Some(t) if t <= now => {}
            _ => return,
        }
        let mut next: Option<Instant> = self.shutdown;
        while let Some(&std::cmp::Reverse((at, key))) = self.session_timers.peek() {
            if at > now {
                next = Some(next.map_or(at, |n| n.min(at)));
                break;
            }
            self.session_timers.pop();
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
                    self.session_timers.push(std::cmp::Reverse((t, key)));
                }
                None => {}
            }
        }
        let links: Vec<LinkId> = self.pending.keys().copied().collect();
        for l in links {
            let Some(p) = self.pending.get_mut(&l) else {
                continue;
            };
            if p.session.poll_timeout().is_some_and(|t| t <= now) {
                p.session.handle_timeout(now);
                self.drive_pending(l, now);
            }
            if let Some(t) = self.pending.get(&l).and_then(|p| p.session.poll_timeout()) {
                next = Some(next.map_or(t, |n| n.min(t)));
            }
        }
        while let Some(std::cmp::Reverse((at, key, id))) = self.call_deadlines.peek().copied() {
            if at > now {
                next = Some(next.map_or(at, |n| n.min(at)));
                break;
            }
            self.call_deadlines.pop();
            if let Some(s) = self.sessions.get(&key) {
                s.conn.expire_call(id);
            }
        }
        self.next_timer = next;
    }
}
