//! What the cluster's nodes record and how the parent checks it. Pure data
//! and functions: the unit tests below feed them bad logs.
//!
//! A stream is one (sender, sender incarnation, receiver, epoch): the
//! sender's epoch toward a peer starts at 1 and moves on at every reset of
//! its session with that peer (the peer restarted, or closed), and numbers
//! its messages from 1.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

/// One stream's identity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct StreamId {
    /// Sending node.
    pub sender: u32,
    /// Its incarnation (from 1; each restart is a new one).
    pub sender_inc: u32,
    /// Receiving node.
    pub receiver: u32,
    /// The sender's epoch toward the receiver.
    pub epoch: u32,
}

/// What one receiver incarnation saw of one stream.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamLog {
    /// First sequence number delivered.
    pub first: u64,
    /// Last sequence number delivered.
    pub last: u64,
    /// Messages delivered.
    pub count: u64,
}

/// Kept with their text; all are counted.
const KEEP: usize = 50;

/// One receiver incarnation's record of everything delivered to it.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ReceiveLog {
    /// Every stream seen.
    pub streams: Vec<(StreamId, StreamLog)>,
    /// Violations seen as messages arrived (the first ones).
    pub violations: Vec<String>,
    /// How many.
    pub violation_count: u64,
    #[serde(skip)]
    index: HashMap<StreamId, usize>,
}

impl ReceiveLog {
    fn violation(&mut self, what: String) {
        self.violation_count += 1;
        if self.violations.len() < KEEP {
            self.violations.push(what);
        }
    }

    /// Records the delivery of message `n` of stream `id` whose bytes were
    /// (`intact`) or were not as sent. Within one receiver incarnation a
    /// stream must arrive exactly once and in order, without gaps (lossless
    /// sessions; a reset would have started a new epoch).
    pub fn record(&mut self, id: StreamId, n: u64, intact: bool) {
        if !intact {
            self.violation(format!("corrupt message {n} of {id:?}"));
        }
        let i = match self.index.get(&id) {
            Some(&i) => i,
            None => {
                self.streams.push((
                    id,
                    StreamLog {
                        first: n,
                        last: n,
                        count: 1,
                    },
                ));
                self.index.insert(id, self.streams.len() - 1);
                return;
            }
        };
        let log = self.streams[i].1;
        if n <= log.last {
            let what = if n == log.last {
                "duplicate"
            } else {
                "out of order"
            };
            self.violation(format!("{what}: {id:?} got {n} after {}", log.last));
            return;
        }
        if n != log.last + 1 {
            self.violation(format!(
                "gap (lost messages): {id:?} got {n} after {}",
                log.last
            ));
        }
        let log = &mut self.streams[i].1;
        log.last = n;
        log.count += 1;
    }

    /// The log of stream `id`, if it was seen.
    pub fn stream(&self, id: &StreamId) -> Option<StreamLog> {
        self.streams.iter().find(|(s, _)| s == id).map(|(_, l)| *l)
    }
}

/// One node incarnation's record, as the parent has it at the end.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct IncarnationRecord {
    /// Node.
    pub node: u32,
    /// Incarnation.
    pub inc: u32,
    /// What it received (its last report: complete when `drained`).
    pub log: ReceiveLog,
    /// What it sent, per stream (complete when `drained`).
    pub sent: Vec<(StreamId, u64)>,
    /// It stopped sending and saw every message acknowledged before it
    /// reported (the end of the run, or a graceful restart); false for an
    /// incarnation killed with SIGKILL.
    pub drained: bool,
}

/// What the cross-incarnation checks found.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct CheckOutcome {
    /// Violations (the first ones with their text).
    pub violations: Vec<String>,
    /// How many.
    pub violation_count: u64,
    /// Messages delivered, over every incarnation.
    pub delivered: u64,
    /// Messages a drained sender sent that no incarnation of their receiver
    /// got: those a restarted receiver's old session still held (reported
    /// by the sender's reset, never delivered to the new incarnation).
    pub dropped_by_restarts: u64,
}

impl CheckOutcome {
    fn violation(&mut self, what: String) {
        self.violation_count += 1;
        if self.violations.len() < KEEP * 4 {
            self.violations.push(what);
        }
    }
}

/// Checks every incarnation's record against the others':
/// - the violations each receiver found as messages arrived;
/// - no message of a stream is delivered to two incarnations of its
///   receiver (a new incarnation starts past what the old one got);
/// - for a sender that drained: each of its streams reached its receiver's
///   incarnations completely (delivered = sent) where the receiver never
///   restarted; otherwise its last epoch's tail (up to `sent`) reached the
///   receiver, and what is missing (there or in the epochs the restarts
///   ended) counts as dropped by the restarts.
pub fn check(records: &[IncarnationRecord]) -> CheckOutcome {
    let mut out = CheckOutcome::default();
    let mut by_node: HashMap<u32, Vec<&IncarnationRecord>> = HashMap::new();
    for r in records {
        out.violation_count += r.log.violation_count;
        for v in &r.log.violations {
            if out.violations.len() < KEEP * 4 {
                out.violations
                    .push(format!("node {} incarnation {}: {v}", r.node, r.inc));
            }
        }
        out.delivered += r.log.streams.iter().map(|(_, l)| l.count).sum::<u64>();
        by_node.entry(r.node).or_default().push(r);
    }
    for incs in by_node.values_mut() {
        incs.sort_by_key(|r| r.inc);
        // A stream seen by two incarnations of one receiver: the later one
        // must start past the earlier one's last.
        for (i, later) in incs.iter().enumerate() {
            for earlier in &incs[..i] {
                for (id, l) in &later.log.streams {
                    if let Some(e) = earlier.log.stream(id) {
                        if l.first <= e.last {
                            out.violation(format!(
                                "{id:?}: incarnation {} of node {} got {}..={} though incarnation {} had got up to {}",
                                later.inc, later.node, l.first, l.last, earlier.inc, e.last
                            ));
                        }
                    }
                }
            }
        }
    }
    for sender in records.iter().filter(|r| r.drained) {
        let mut final_epoch: HashMap<u32, u32> = HashMap::new();
        for (id, _) in &sender.sent {
            let e = final_epoch.entry(id.receiver).or_default();
            *e = (*e).max(id.epoch);
        }
        for &(id, sent) in &sender.sent {
            if sent == 0 {
                continue;
            }
            let receiver_incs = by_node.get(&id.receiver).map_or(&[][..], |v| &v[..]);
            let logs: Vec<StreamLog> = receiver_incs
                .iter()
                .filter_map(|r| r.log.stream(&id))
                .collect();
            let delivered: u64 = logs.iter().map(|l| l.count).sum();
            let last = logs.iter().map(|l| l.last).max().unwrap_or(0);
            let restarted = receiver_incs.len() > 1;
            if !restarted && delivered != sent {
                out.violation(format!(
                    "{id:?}: sent {sent}, delivered {delivered} (the receiver never restarted: all must arrive, once)"
                ));
            } else if restarted
                && (delivered > sent || (final_epoch[&id.receiver] == id.epoch && last != sent))
            {
                out.violation(format!(
                    "{id:?}: sent {sent}, delivered {delivered} up to {last} over {} incarnations of the receiver: the tail is missing",
                    receiver_incs.len()
                ));
            } else {
                out.dropped_by_restarts += sent - delivered;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(sender: u32, receiver: u32, epoch: u32) -> StreamId {
        StreamId {
            sender,
            sender_inc: 1,
            receiver,
            epoch,
        }
    }

    fn log_of(deliveries: &[(StreamId, u64)]) -> ReceiveLog {
        let mut log = ReceiveLog::default();
        for &(s, n) in deliveries {
            log.record(s, n, true);
        }
        log
    }

    fn record(
        node: u32,
        inc: u32,
        log: ReceiveLog,
        sent: Vec<(StreamId, u64)>,
    ) -> IncarnationRecord {
        IncarnationRecord {
            node,
            inc,
            log,
            sent,
            drained: true,
        }
    }

    #[test]
    fn a_clean_exchange_passes() {
        let s = id(0, 1, 1);
        let recs = vec![
            record(0, 1, ReceiveLog::default(), vec![(s, 3)]),
            record(1, 1, log_of(&[(s, 1), (s, 2), (s, 3)]), vec![]),
        ];
        let out = check(&recs);
        assert_eq!(out.violation_count, 0, "{:?}", out.violations);
        assert_eq!(out.delivered, 3);
    }

    #[test]
    fn duplicates_reordering_gaps_and_corruption_are_caught_on_arrival() {
        let s = id(0, 1, 1);
        assert_eq!(log_of(&[(s, 1), (s, 1)]).violation_count, 1);
        assert_eq!(log_of(&[(s, 1), (s, 3), (s, 2)]).violation_count, 2);
        let mut log = ReceiveLog::default();
        log.record(s, 1, false);
        assert_eq!(log.violation_count, 1);
        assert!(log.violations[0].contains("corrupt"));
    }

    #[test]
    fn a_lost_message_without_a_restart_fails() {
        let s = id(0, 1, 1);
        let recs = vec![
            record(0, 1, ReceiveLog::default(), vec![(s, 3)]),
            record(1, 1, log_of(&[(s, 1), (s, 2)]), vec![]),
        ];
        assert_eq!(check(&recs).violation_count, 1);
    }

    #[test]
    fn a_restarted_receiver_may_miss_the_old_sessions_messages_but_never_gets_them_twice() {
        let s = id(0, 1, 1);
        // Incarnation 1 got 1..=2, 3..=4 went with its session, the new
        // incarnation got 5..=6: fine, two dropped by the restart.
        let recs = vec![
            record(0, 1, ReceiveLog::default(), vec![(s, 6)]),
            record(1, 1, log_of(&[(s, 1), (s, 2)]), vec![]),
            record(1, 2, log_of(&[(s, 5), (s, 6)]), vec![]),
        ];
        let out = check(&recs);
        assert_eq!(out.violation_count, 0, "{:?}", out.violations);
        assert_eq!(out.dropped_by_restarts, 2);
        // The new incarnation got message 2 again: a violation.
        let recs = vec![
            record(0, 1, ReceiveLog::default(), vec![(s, 6)]),
            record(1, 1, log_of(&[(s, 1), (s, 2)]), vec![]),
            record(
                1,
                2,
                log_of(&[(s, 2), (s, 3), (s, 4), (s, 5), (s, 6)]),
                vec![],
            ),
        ];
        let out = check(&recs);
        assert!(
            out.violations
                .iter()
                .any(|v| v.contains("though incarnation 1 had got up to 2")),
            "{:?}",
            out.violations
        );
    }

    #[test]
    fn only_the_last_epoch_toward_a_restarted_receiver_must_arrive_whole() {
        let (old, new) = (id(0, 1, 1), id(0, 1, 2));
        // Epoch 1 lost its tail with the receiver's first incarnation; epoch
        // 2 (after the reset) arrived whole at the second: fine.
        let sent = vec![(old, 5), (new, 3)];
        let recs = vec![
            record(0, 1, ReceiveLog::default(), sent.clone()),
            record(1, 1, log_of(&[(old, 1), (old, 2)]), vec![]),
            record(1, 2, log_of(&[(new, 1), (new, 2), (new, 3)]), vec![]),
        ];
        let out = check(&recs);
        assert_eq!(out.violation_count, 0, "{:?}", out.violations);
        assert_eq!(out.dropped_by_restarts, 3);
        // Epoch 2's last message missing: a violation.
        let recs = vec![
            record(0, 1, ReceiveLog::default(), sent),
            record(1, 1, log_of(&[(old, 1), (old, 2)]), vec![]),
            record(1, 2, log_of(&[(new, 1), (new, 2)]), vec![]),
        ];
        assert_eq!(check(&recs).violation_count, 1);
    }
}
