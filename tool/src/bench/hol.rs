//! `--only hol`: head-of-line blocking (issue 58 item 4). A 64 B call on a
//! connection that is streaming large messages, against the same call on
//! the same connection idle.
//!
//! One client messenger, one connection. Each round: the calls on the idle
//! connection; then for each of [`BULK_SIZES`] a thread streams messages of
//! that size at the default priority, as fast as the send queue takes them
//! (the queue stays full: the worst case an application streaming without
//! a window of its own makes), and once the queue holds half its bytes the
//! calls go, back to back, first at [`HIGHEST`] priority, then (a second
//! stream) at the default — the cost a call pays where it shares the bulk's
//! class. Today `Message::priority` is informative only, so both wait
//! behind every queued message; with priority lanes the first should not.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use msgr::{EntityAddr, EntityName, MessengerConfig};
use serde::Serialize;

use super::load::{stopping_on_error, Calls, LoadConn, DEFAULT, HIGHEST};
use super::{compare, compare_info, median, size_name, Comparison, Round};
use crate::error::ToolError;
use crate::stats::{PingResult, StreamResult};

/// The bulk message sizes streamed beside the calls.
pub const BULK_SIZES: [usize; 2] = [1 << 20, 64 << 20];
/// The fragment size issue 58's bar adds one of on the wire: a high-class
/// call's p99 under bulk ≤ 2 × the idle p99 + this many bytes' time at the
/// bulk's measured rate (lanes' default fragment, about 64 KiB).
pub const FRAGMENT: usize = 64 << 10;
/// The bar's factor on the idle p99.
pub const IDLE_FACTOR: f64 = 2.0;

/// The calls under one load.
#[derive(Clone, Debug, Serialize)]
pub struct HolCase {
    /// Bytes per bulk message.
    pub bulk_size: usize,
    /// The calls' `Message::priority`.
    pub call_priority: u8,
    /// The calls' round trips.
    pub calls: PingResult,
    /// The bulk stream beside them (from its first message to the
    /// responder's answer to its end marker).
    pub bulk: StreamResult,
}

/// One round: the idle calls and each load's.
#[derive(Clone, Debug)]
pub struct HolRound {
    /// The calls on the idle connection.
    pub idle: PingResult,
    /// Per bulk size, at [`HIGHEST`] then at [`DEFAULT`] priority.
    pub cases: Vec<HolCase>,
}

/// What one round measures and how long.
pub struct HolPlan {
    /// The idle calls (warm-up and count).
    pub idle: (u64, u64),
    /// How long the calls run beside each load.
    pub window: Duration,
    /// Timed calls at least beside each load, whatever the window (up to
    /// [`LOADED_CAP`] windows): each may wait behind a whole queue (256 MiB
    /// by default), a second or more on a busy machine.
    pub min_loaded_calls: u64,
    /// Bound on connecting.
    pub connect_timeout: Duration,
    /// Bound on each call and bulk stream.
    pub timeout: Duration,
}

/// Beside a load, calls stop after this many windows even if fewer than
/// the minimum were done (one at least): the run stays bounded.
pub const LOADED_CAP: u32 = 3;

/// Progress steps one round takes.
pub const STEPS: u64 = 1 + 2 * BULK_SIZES.len() as u64;

/// One round against the responder at `target`; `step` is told each
/// phase.
pub fn round(
    cfg: &MessengerConfig,
    target: &EntityAddr,
    plan: &HolPlan,
    step: &mut dyn FnMut(&str),
) -> Result<HolRound, ToolError> {
    let load = LoadConn::open(
        EntityName::client(20),
        cfg,
        target,
        (plan.connect_timeout, plan.timeout),
    )?;
    let r = round_on(&load, cfg, plan, step);
    load.close();
    r
}

fn round_on(
    load: &LoadConn,
    cfg: &MessengerConfig,
    plan: &HolPlan,
    step: &mut dyn FnMut(&str),
) -> Result<HolRound, ToolError> {
    step("hol: calls, idle connection");
    let (warmup, count) = plan.idle;
    let idle = Calls::counted(warmup, count, None);
    let (rtt, secs) = load.calls(HIGHEST, &idle, &AtomicBool::new(false))?;
    let idle = PingResult::new(64, warmup, rtt, secs);
    let loaded = Calls {
        min: plan.min_loaded_calls,
        cap: plan.window * LOADED_CAP,
        window: plan.window,
        ..Calls::until_stopped(None)
    };
    // Half the queue's bytes: the calls start behind a queue in its steady
    // state, not behind the first few messages.
    let full = cfg.session.max_queued_bytes as u64 / 2;
    let mut cases = Vec::new();
    for size in BULK_SIZES {
        for priority in [HIGHEST, DEFAULT] {
            step(&format!(
                "hol: calls at priority {priority}, {} messages streaming",
                size_name(size)
            ));
            let stop = AtomicBool::new(false);
            let (calls, bulk) = std::thread::scope(|s| {
                let bulk = s.spawn(|| stopping_on_error(&stop, || load.bulk(size, None, &stop)));
                let calls = stopping_on_error(&stop, || {
                    let ramp = Instant::now();
                    while load.queued_bytes() < full
                        && ramp.elapsed() < plan.window
                        && !stop.load(Ordering::Relaxed)
                    {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    load.calls(priority, &loaded, &stop)
                });
                stop.store(true, Ordering::Relaxed);
                (calls, bulk.join().expect("bulk sender"))
            });
            let bulk = bulk?;
            let (rtt, secs) = calls?;
            cases.push(HolCase {
                bulk_size: size,
                call_priority: priority,
                calls: PingResult::new(64, 0, rtt, secs),
                bulk,
            });
        }
    }
    Ok(HolRound { idle, cases })
}

/// Issue 58's bar as a ratio to the idle p99: [`IDLE_FACTOR`] plus one
/// [`FRAGMENT`]'s time at `bulk_mib_per_s` over `idle_p99_us`.
pub fn bar(idle_p99_us: f64, bulk_mib_per_s: f64) -> f64 {
    let fragment_us = FRAGMENT as f64 / (bulk_mib_per_s * (1u64 << 20) as f64) * 1e6;
    IDLE_FACTOR + fragment_us / idle_p99_us
}

/// The table's rows: per load, the calls' p50 and p99 against the idle
/// ones (the high-priority p99 against issue 58's bar, the rest for the
/// record); and per bulk size, the bulk's rate beside high-priority calls
/// against beside default ones (lanes must keep ≥ 0.9 of it).
pub fn comparisons(
    rounds: &[HolRound],
) -> (Vec<Comparison<PingResult>>, Vec<Comparison<StreamResult>>) {
    let Some(first) = rounds.first() else {
        return (Vec::new(), Vec::new());
    };
    let mut idle_p99: Vec<f64> = rounds.iter().map(|r| r.idle.rtt.p99_us).collect();
    let idle_p99 = median(&mut idle_p99);
    let mut calls = Vec::new();
    for (k, case) in first.cases.iter().enumerate() {
        let per_round = || {
            rounds
                .iter()
                .map(|r| Round {
                    msgr: r.cases[k].calls.clone(),
                    reference: r.idle.clone(),
                })
                .collect::<Vec<_>>()
        };
        let what = format!(
            "{} bulk, call prio {}",
            size_name(case.bulk_size),
            case.call_priority
        );
        let reference = "the same call, idle connection, same run";
        calls.push(compare_info(
            format!("hol p50: {what}"),
            "µs",
            reference,
            per_round(),
            |r: &PingResult| r.rtt.p50_us,
        ));
        let p99 = |r: &PingResult| r.rtt.p99_us;
        let metric = format!("hol p99: {what}");
        calls.push(if case.call_priority == HIGHEST {
            let mut bulk: Vec<f64> = rounds.iter().map(|r| r.cases[k].bulk.mib_per_s).collect();
            let target = bar(idle_p99, median(&mut bulk));
            compare(metric, "µs", reference, per_round(), p99, "max", target)
        } else {
            compare_info(metric, "µs", reference, per_round(), p99)
        });
    }
    let bulk = BULK_SIZES
        .iter()
        .map(|&size| {
            let of = |r: &HolRound, priority: u8| {
                r.cases
                    .iter()
                    .find(|c| c.bulk_size == size && c.call_priority == priority)
                    .map(|c| c.bulk.clone())
                    .expect("every case runs every round")
            };
            compare(
                format!("hol bulk: {}, calls high", size_name(size)),
                "MiB/s",
                "the same bulk beside default-priority calls, same run",
                rounds
                    .iter()
                    .map(|r| Round {
                        msgr: of(r, HIGHEST),
                        reference: of(r, DEFAULT),
                    })
                    .collect(),
                |r: &StreamResult| r.mib_per_s,
                "min",
                BULK_TARGET,
            )
        })
        .collect();
    (calls, bulk)
}

/// Bulk throughput beside high-priority calls ≥ this × beside calls of
/// its own class (issue 58: with lanes ≥ 0.9 × without).
pub const BULK_TARGET: f64 = 0.9;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bar_adds_one_fragment_at_the_bulk_rate() {
        // 64 KiB at 1024 MiB/s: 61.04 µs, over an idle p99 of 100 µs.
        let b = bar(100.0, 1024.0);
        assert!((b - (2.0 + 0.6103515625)).abs() < 1e-9, "{b}");
    }
}
