//! `--only mixed`: a server under mixed traffic (issue 58 item 4). Each of
//! [`CLIENTS`] clients (a messenger with one connection each) does three
//! things at once on its one connection: 64 B calls back to back at
//! [`CALL_PRIORITY`], a 64 B heartbeat call every [`HEARTBEAT_EVERY`] at
//! [`HIGHEST`], and 1 MiB bulk messages at the default priority, at most
//! [`BULK_WINDOW`] unacknowledged (an application with a window of its own,
//! not a full queue as `hol` streams). Each class's p50 and p99 are
//! compared with the same calls (or paced heartbeats) on an idle
//! connection, and the bulk throughput with the bulk alone (every client
//! streaming, nobody calling), all in the same round.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use msgr::{EntityAddr, EntityName, MessengerConfig};

use super::hol::{bar, BULK_TARGET};
use super::load::{stopping_on_error, Calls, LoadConn, HIGHEST};
use super::{compare, compare_info, median, Comparison, Round};
use crate::error::ToolError;
use crate::stats::{PingResult, StreamResult};

/// Clients (the quick run: [`QUICK_CLIENTS`]).
pub const CLIENTS: usize = 8;
/// Clients of a quick run.
pub const QUICK_CLIENTS: usize = 3;
/// The calls' priority: above the bulk, below the heartbeats (three classes
/// whatever small set of lanes `u8` priorities come to map onto).
pub const CALL_PRIORITY: u8 = 128;
/// From the start of one heartbeat to the next.
pub const HEARTBEAT_EVERY: Duration = Duration::from_millis(10);
/// Bytes per bulk message.
pub const BULK_SIZE: usize = 1 << 20;
/// Bulk bytes a client keeps unacknowledged at most.
pub const BULK_WINDOW: usize = 8 << 20;

/// One round's figures.
#[derive(Clone, Debug)]
pub struct MixedRound {
    /// Clients.
    pub clients: usize,
    /// Calls on the idle connection.
    pub idle_calls: PingResult,
    /// Heartbeats on the idle connection.
    pub idle_heartbeats: PingResult,
    /// Every client's bulk, nothing else running: their aggregate.
    pub bulk_alone: StreamResult,
    /// Every client's calls under the mixed load.
    pub calls: PingResult,
    /// Every client's heartbeats under the mixed load.
    pub heartbeats: PingResult,
    /// Every client's bulk under the mixed load: their aggregate.
    pub bulk: StreamResult,
}

/// What one round measures and how long.
pub struct MixedPlan {
    /// Clients.
    pub clients: usize,
    /// The idle calls (warm-up and count).
    pub idle_calls: (u64, u64),
    /// Heartbeats on the idle connection.
    pub idle_heartbeats: u64,
    /// How long the bulk alone, then the mixed load, run.
    pub window: Duration,
    /// Bound on connecting.
    pub connect_timeout: Duration,
    /// Bound on each call and bulk stream.
    pub timeout: Duration,
}

/// Progress steps one round takes.
pub const STEPS: u64 = 4;

/// One round against the responder at `target`.
pub fn round(
    cfg: &MessengerConfig,
    target: &EntityAddr,
    plan: &MixedPlan,
    step: &mut dyn FnMut(&str),
) -> Result<MixedRound, ToolError> {
    let mut loads = Vec::with_capacity(plan.clients);
    let opened = (0..plan.clients).try_for_each(|i| {
        let name = EntityName::client(1000 + i as u64);
        loads.push(LoadConn::open(
            name,
            cfg,
            target,
            (plan.connect_timeout, plan.timeout),
        )?);
        Ok(())
    });
    let r = opened.and_then(|()| round_on(&loads, plan, step));
    for l in loads {
        l.close();
    }
    r
}

fn round_on(
    loads: &[LoadConn],
    plan: &MixedPlan,
    step: &mut dyn FnMut(&str),
) -> Result<MixedRound, ToolError> {
    let never = AtomicBool::new(false);
    step("mixed: calls, idle connection");
    let (warmup, count) = plan.idle_calls;
    let idle = Calls::counted(warmup, count, None);
    let (rtt, secs) = loads[0].calls(CALL_PRIORITY, &idle, &never)?;
    let idle_calls = PingResult::new(64, warmup, rtt, secs);
    step("mixed: heartbeats, idle connection");
    let beats = Calls::counted(0, plan.idle_heartbeats, Some(HEARTBEAT_EVERY));
    let (rtt, secs) = loads[0].calls(HIGHEST, &beats, &never)?;
    let idle_heartbeats = PingResult::new(64, 0, rtt, secs);
    step(&format!("mixed: bulk alone, {} clients", loads.len()));
    let bulk_alone = run_load(loads, plan.window, false)?.2;
    step(&format!(
        "mixed: calls, heartbeats and bulk, {} clients",
        loads.len()
    ));
    let (calls, heartbeats, bulk) = run_load(loads, plan.window, true)?;
    Ok(MixedRound {
        clients: loads.len(),
        idle_calls,
        idle_heartbeats,
        bulk_alone,
        calls,
        heartbeats,
        bulk,
    })
}

/// Every client's bulk for `window`, with (`calling`) its calls and
/// heartbeats beside it: the calls', the heartbeats' and the bulk's
/// aggregates.
fn run_load(
    loads: &[LoadConn],
    window: Duration,
    calling: bool,
) -> Result<(PingResult, PingResult, StreamResult), ToolError> {
    let stop = AtomicBool::new(false);
    let calls = Mutex::new((Vec::new(), 0f64));
    let beats = Mutex::new((Vec::new(), 0f64));
    let add = |to: &Mutex<(Vec<u64>, f64)>, (rtt, secs): (Vec<u64>, f64)| {
        let mut to = to.lock().unwrap_or_else(|p| p.into_inner());
        to.0.extend(rtt);
        to.1 = to.1.max(secs);
    };
    let outcome: Result<Vec<StreamResult>, ToolError> = std::thread::scope(|s| {
        let mut callers = Vec::new();
        let mut bulks = Vec::new();
        for load in loads {
            let stop = &stop;
            bulks.push(s.spawn(move || {
                stopping_on_error(stop, || load.bulk(BULK_SIZE, Some(BULK_WINDOW), stop))
            }));
            if calling {
                let (add, calls, beats) = (&add, &calls, &beats);
                callers.push(s.spawn(move || {
                    stopping_on_error(stop, || {
                        let plan = Calls::until_stopped(None);
                        add(calls, load.calls(CALL_PRIORITY, &plan, stop)?);
                        Ok(())
                    })
                }));
                callers.push(s.spawn(move || {
                    stopping_on_error(stop, || {
                        let plan = Calls::until_stopped(Some(HEARTBEAT_EVERY));
                        add(beats, load.calls(HIGHEST, &plan, stop)?);
                        Ok(())
                    })
                }));
            }
        }
        let started = std::time::Instant::now();
        while started.elapsed() < window && !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(10));
        }
        stop.store(true, Ordering::Relaxed);
        for c in callers {
            c.join().expect("caller")?;
        }
        bulks
            .into_iter()
            .map(|b| b.join().expect("bulk sender"))
            .collect()
    });
    let bulks = outcome?;
    let sent = bulks.iter().map(|b| b.messages).sum();
    let secs = bulks.iter().map(|b| b.elapsed_s).fold(0.0, f64::max);
    let into = |m: Mutex<(Vec<u64>, f64)>| {
        let (rtt, secs) = m.into_inner().unwrap_or_else(|p| p.into_inner());
        PingResult::new(64, 0, rtt, secs)
    };
    Ok((
        into(calls),
        into(beats),
        StreamResult::new(BULK_SIZE, sent, secs),
    ))
}

/// The table's rows: each class's p50 and p99 against the idle
/// connection's (the p99s against issue 58's bar), and the bulk's
/// throughput against the bulk alone.
pub fn comparisons(
    rounds: &[MixedRound],
) -> (
    Vec<Comparison<PingResult>>,
    Option<Comparison<StreamResult>>,
) {
    if rounds.is_empty() {
        return (Vec::new(), None);
    }
    let mut bulk: Vec<f64> = rounds.iter().map(|r| r.bulk.mib_per_s).collect();
    let bulk_rate = median(&mut bulk);
    let clients = rounds[0].clients;
    let mut rows = Vec::new();
    type Pick = fn(&MixedRound) -> (&PingResult, &PingResult);
    let classes: [(&str, &str, Pick); 2] = [
        ("calls", "the same calls", |r| (&r.calls, &r.idle_calls)),
        ("heartbeats", "the same heartbeats", |r| {
            (&r.heartbeats, &r.idle_heartbeats)
        }),
    ];
    for (name, same, pick) in classes {
        let per_round = || {
            rounds
                .iter()
                .map(|r| {
                    let (loaded, idle) = pick(r);
                    Round {
                        msgr: loaded.clone(),
                        reference: idle.clone(),
                    }
                })
                .collect::<Vec<_>>()
        };
        let reference = format!("{same}, idle connection, same run");
        rows.push(compare_info(
            format!("mixed p50: {name}, {clients} clients"),
            "µs",
            reference.clone(),
            per_round(),
            |r: &PingResult| r.rtt.p50_us,
        ));
        let mut idle_p99: Vec<f64> = rounds.iter().map(|r| pick(r).1.rtt.p99_us).collect();
        rows.push(compare(
            format!("mixed p99: {name}, {clients} clients"),
            "µs",
            reference,
            per_round(),
            |r: &PingResult| r.rtt.p99_us,
            "max",
            bar(median(&mut idle_p99), bulk_rate),
        ));
    }
    let bulk = compare(
        format!("mixed bulk: {clients} clients, with calls"),
        "MiB/s",
        "the same clients' bulk alone, same run",
        rounds
            .iter()
            .map(|r| Round {
                msgr: r.bulk.clone(),
                reference: r.bulk_alone.clone(),
            })
            .collect(),
        |r: &StreamResult| r.mib_per_s,
        "min",
        BULK_TARGET,
    );
    (rows, Some(bulk))
}
