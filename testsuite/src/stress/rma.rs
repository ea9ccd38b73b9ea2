//! The RMA part of the workload (`StressConfig::rma`, docs/STRESS.md "RMA"):
//! every server incarnation exposes a region, clients write and read their
//! own slice of it, and the run checks the bytes and how often the owner
//! served each write.
//!
//! The handle travels through the run's shared state (the server slot), not
//! in a message: servers and clients live in one process, and a restarted
//! server's new region must reach clients that have no message from it.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use msgr::{CallError, RmaError, RmaHandle, RmaRegion};
use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};
use serde::Serialize;

use super::seed::mix;
use super::verify::Violations;

/// Bytes each server incarnation exposes (ReadWrite).
pub(crate) const REGION_LEN: usize = 1 << 20;
/// Timeout of one operation. A lossless operation that is not answered
/// in this long while nothing excused it is a violation.
pub(crate) const RMA_TIMEOUT: Duration = Duration::from_secs(10);

/// One server incarnation's region, kept in its slot.
pub(crate) struct Exposed {
    /// The incarnation (`ServerSlot::incarnation` after its start).
    pub incarnation: u64,
    pub region: RmaRegion,
    pub handle: RmaHandle,
}

/// The RMA figures of a run (report and JSON).
#[derive(Clone, Debug, Default, Serialize)]
pub struct RmaReport {
    /// Writes that succeeded (each read back and checked).
    pub writes: u64,
    /// Reads that succeeded (each checked against the client's copy).
    pub reads: u64,
    /// Bytes written by successful writes.
    pub bytes_written: u64,
    /// Bytes returned by successful reads.
    pub bytes_read: u64,
    /// Bytes compared against what their writer last wrote (reads and the
    /// owner's end check).
    pub bytes_checked: u64,
    /// Failed operations by kind and excuse (`reset/lossy`,
    /// `timeout/restart`, ...): expected outcomes, not violations.
    pub failed: BTreeMap<String, u64>,
    /// Writes whose outcome is unknown (failed after being sent: they may
    /// or may not have landed).
    pub ambiguous_writes: u64,
    /// `rma_writes_served` summed over every server incarnation.
    pub served_writes: u64,
    /// `rma_refused` summed over every server incarnation.
    pub refused: u64,
    /// Incarnations whose served writes were compared with the clients'
    /// outcomes.
    pub incarnations_accounted: u64,
    /// Mean time of a successful operation, milliseconds.
    pub op_ms_mean: f64,
    /// Longest successful operation, milliseconds.
    pub op_ms_max: f64,
    /// Client slices the owners compared with their writers' copies at the end.
    pub slices_checked_at_end: u64,
    /// Violations: an acknowledged write missing, or an operation on an
    /// undisturbed connection failing (lossless: any failure; lossy: any
    /// but a reset).
    pub lost: u64,
    /// Violations: bytes read (or found by the owner) that their writer
    /// never wrote there, or a checksum mismatch.
    pub corrupted: u64,
    /// Violations: an incarnation served more writes than clients sent it
    /// (a write applied twice).
    pub twice: u64,
}

/// What a client knows of its slice of one server's region.
pub(crate) struct Shadow {
    /// The incarnation whose region this describes (0: none yet).
    pub incarnation: u64,
    /// What the client last wrote (zeros where it wrote nothing).
    pub bytes: Vec<u8>,
    /// Where `bytes` is certain (false after a write whose outcome is unknown).
    pub known: Vec<bool>,
}

impl Shadow {
    pub fn new(len: usize) -> Shadow {
        Shadow {
            incarnation: 0,
            bytes: vec![0; len],
            known: vec![true; len],
        }
    }

    /// A new incarnation's region: zeros, all known.
    pub fn renew(&mut self, incarnation: u64) {
        self.incarnation = incarnation;
        self.bytes.fill(0);
        self.known.fill(true);
    }

    /// The first position in `range` (relative to the slice) where `got`
    /// differs from a known byte, if any; and how many bytes were checked.
    pub fn mismatch(&self, start: usize, got: &[u8]) -> (Option<usize>, u64) {
        let mut checked = 0;
        for (i, b) in got.iter().enumerate() {
            if self.known[start + i] {
                checked += 1;
                if self.bytes[start + i] != *b {
                    return (Some(start + i), checked);
                }
            }
        }
        (None, checked)
    }
}

/// The run's RMA bookkeeping, shared by clients and servers.
#[derive(Default)]
pub(crate) struct RmaState {
    pub writes: AtomicU64,
    pub reads: AtomicU64,
    pub bytes_written: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_checked: AtomicU64,
    pub ambiguous: AtomicU64,
    pub lost: AtomicU64,
    pub corrupted: AtomicU64,
    failed: Mutex<BTreeMap<String, u64>>,
    /// (server, incarnation) -> (writes acknowledged, writes ambiguous).
    writes_by_incarnation: Mutex<HashMap<(u32, u64), (u64, u64)>>,
    /// (server, incarnation) -> (writes served, refused), from each retired
    /// messenger's counters.
    served: Mutex<HashMap<(u32, u64), (u64, u64)>>,
    /// Every client's shadows at its end: (client, server, shadow).
    pub finals: Mutex<Vec<(u32, u32, Shadow)>>,
    pub slices_checked_at_end: AtomicU64,
    /// Successful operations' time in all and the longest, microseconds.
    pub op_us_total: AtomicU64,
    pub op_us_max: AtomicU64,
}

impl RmaState {
    /// A successful operation took `d`.
    pub fn took(&self, d: Duration) {
        let us = d.as_micros() as u64;
        self.op_us_total.fetch_add(us, Ordering::Relaxed);
        self.op_us_max.fetch_max(us, Ordering::Relaxed);
    }

    pub fn failed(&self, kind: &str) {
        *self
            .failed
            .lock()
            .expect("rma failed lock")
            .entry(kind.to_string())
            .or_default() += 1;
    }

    /// A write to (server, incarnation) acknowledged (`ok`) or of unknown outcome.
    pub fn write_outcome(&self, server: u32, incarnation: u64, ok: bool) {
        let mut m = self.writes_by_incarnation.lock().expect("rma writes lock");
        let e = m.entry((server, incarnation)).or_default();
        if ok {
            e.0 += 1;
        } else {
            e.1 += 1;
            self.ambiguous.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A server incarnation's final counters (after its shutdown).
    pub fn retired(&self, server: u32, incarnation: u64, served: u64, refused: u64) {
        self.served
            .lock()
            .expect("rma served lock")
            .insert((server, incarnation), (served, refused));
    }

    /// Compares every incarnation's served writes with what its clients
    /// saw: acknowledged <= served <= acknowledged + ambiguous. Call when
    /// every client and server is done.
    pub fn account(&self, violations: &Violations, report: &mut RmaReport) {
        let served = self.served.lock().expect("rma served lock");
        let writes = self.writes_by_incarnation.lock().expect("rma writes lock");
        let mut twice = 0;
        for (key, (ok, ambiguous)) in writes.iter() {
            let Some(&(s, _)) = served.get(key) else {
                violations.push(format!(
                    "rma: server {} incarnation {} has writes but no final counters",
                    key.0, key.1
                ));
                continue;
            };
            if s > ok + ambiguous {
                twice += 1;
                violations.push(format!(
                    "rma completed twice: server {} incarnation {} served {s} writes, clients sent {} ({ok} acknowledged, {ambiguous} of unknown outcome)",
                    key.0, key.1, ok + ambiguous
                ));
            }
            if s < *ok {
                self.lost.fetch_add(1, Ordering::Relaxed);
                violations.push(format!(
                    "rma lost: server {} incarnation {} served {s} writes, {ok} were acknowledged",
                    key.0, key.1
                ));
            }
        }
        for (key, (s, _)) in served.iter() {
            if *s > 0 && !writes.contains_key(key) {
                twice += 1;
                violations.push(format!(
                    "rma completed twice: server {} incarnation {} served {s} writes nobody sent it",
                    key.0, key.1
                ));
            }
        }
        report.incarnations_accounted = served.len() as u64;
        report.served_writes = served.values().map(|v| v.0).sum();
        report.refused = served.values().map(|v| v.1).sum();
        report.twice = twice;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        report.writes = g(&self.writes);
        report.reads = g(&self.reads);
        report.bytes_written = g(&self.bytes_written);
        report.bytes_read = g(&self.bytes_read);
        report.bytes_checked = g(&self.bytes_checked);
        report.ambiguous_writes = g(&self.ambiguous);
        report.lost = g(&self.lost);
        report.corrupted = g(&self.corrupted);
        report.slices_checked_at_end = g(&self.slices_checked_at_end);
        let ops = (report.writes + report.reads).max(1);
        report.op_ms_mean = g(&self.op_us_total) as f64 / ops as f64 / 1e3;
        report.op_ms_max = g(&self.op_us_max) as f64 / 1e3;
        report.failed = self.failed.lock().expect("rma failed lock").clone();
    }
}

/// The bytes of client `client`'s write number `seq` to server `server`.
pub(crate) fn write_bytes(seed: u64, client: u32, server: u32, seq: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    let s = mix(
        seed ^ 0x726d_6100,
        u64::from(client) << 32 | u64::from(server),
        seq,
    );
    StdRng::seed_from_u64(s).fill_bytes(&mut v);
    v
}

/// The kind of a failure, for the report.
pub(crate) fn kind(e: &RmaError) -> &'static str {
    match e {
        RmaError::Revoked => "revoked",
        RmaError::Denied => "denied",
        RmaError::OutOfRange { .. } => "out-of-range",
        RmaError::Forbidden(_) => "forbidden",
        RmaError::Corrupt => "checksum",
        RmaError::Malformed(_) => "malformed",
        RmaError::Call(CallError::Timeout { .. }) => "timeout",
        RmaError::Call(CallError::Reset(_)) => "reset",
        RmaError::Call(CallError::Send(_)) => "not-sent",
        _ => "other",
    }
}

/// Whether a write that failed this way may have landed.
pub(crate) fn may_have_landed(e: &RmaError) -> bool {
    matches!(
        e,
        RmaError::Call(CallError::Timeout { .. }) | RmaError::Call(CallError::Reset(_))
    )
}
