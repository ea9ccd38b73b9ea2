//! Scale: a thousand lossless connections into one messenger (fan-in),
//! every message accounted for, and what an idle connection costs.
//! Alone in its test binary: it reads the process's resident memory.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use msgr::{Counters, EntityName, Messenger, NullDispatcher, Policy};

/// Clients, each its own messenger (a session is one per pair of peers).
const CLIENTS: u32 = 1000;
/// Messages each client sends.
const PER_CLIENT: u64 = 20;
/// The bar: bytes of memory per idle TCP connection, as the messenger
/// accounts for it (session state and link buffers).
const IDLE_BYTES_MAX: usize = 64 << 10;

/// Resident set size of this process, in bytes.
fn rss_bytes() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("read /proc/self/statm");
    let pages: usize = statm
        .split_whitespace()
        .nth(1)
        .and_then(|f| f.parse().ok())
        .expect("resident pages field");
    pages * 4096
}

#[test]
fn a_thousand_lossless_connections_fan_in_and_idle_cheaply() {
    let started = Instant::now();
    let rec = Recorder::new();
    let mut scfg = fast_config();
    scfg.session.keepalive_interval = Duration::from_secs(2);
    scfg.session.keepalive_timeout = Duration::from_secs(30);
    let mut srv = server(scfg, rec.clone());
    let rss_before = rss_bytes();

    let mut ccfg = fast_config();
    // A thousand client workers on two cores: none may spin.
    ccfg.busy_poll = Duration::ZERO;
    ccfg.session.keepalive_interval = Duration::from_secs(2);
    ccfg.session.keepalive_timeout = Duration::from_secs(30);
    let mut clients: Vec<(Messenger, msgr::Connection)> = (0..CLIENTS)
        .map(|i| {
            let m = Messenger::builder(EntityName::client(u64::from(i) + 1))
                .config(ccfg.clone())
                .start(Arc::new(NullDispatcher))
                .expect("start client");
            let c = m
                .connect_with(srv.addr().expect("bound"), Policy::LosslessClient)
                .expect("connect");
            (m, c)
        })
        .collect();
    for n in 1..=PER_CLIENT {
        for (i, (_, conn)) in clients.iter().enumerate() {
            send(conn, probe_message(i as u32, n, 64));
        }
    }
    let all = u64::from(CLIENTS) * PER_CLIENT;
    let total = || -> u64 { (0..CLIENTS).map(|i| rec.delivered(i)).sum() };
    assert!(
        wait_until(Duration::from_secs(120), || total() == all),
        "delivered {} of {all} after {:?}",
        total(),
        started.elapsed()
    );
    rec.assert_clean();
    for i in 0..CLIENTS {
        assert_eq!(rec.delivered(i), PER_CLIENT, "client {i}");
    }
    assert!(
        rec.resets.lock().unwrap().is_empty(),
        "lossless never resets"
    );
    // Idle now: every message acknowledged, nothing queued.
    assert!(
        wait_until(Duration::from_secs(30), || clients
            .iter()
            .all(|(_, c)| c.queued() == (0, 0))),
        "acks arrived"
    );
    // One turn serves many links' input: the server took more frames than
    // it made turns (each sparse client's few frames are not a turn each).
    let c = srv.counters();
    let (frames, turns) = (Counters::get(&c.rx_frames), Counters::get(&c.worker_turns));
    assert!(
        frames >= all / PER_CLIENT && turns > 0 && turns < frames,
        "{frames} frames in {turns} turns"
    );
    // Idle sessions make no turns but their keepalives' (one each per
    // interval at most, 2 s here): no work per turn per session, and no
    // turn per session per pass.
    let (turns, sleeps) = (
        Counters::get(&c.worker_turns),
        Counters::get(&c.worker_sleeps),
    );
    std::thread::sleep(Duration::from_secs(1));
    let idle_turns = Counters::get(&c.worker_turns) - turns;
    let idle_sleeps = Counters::get(&c.worker_sleeps) - sleeps;
    println!("idle second: {idle_turns} turns, {idle_sleeps} sleeps of the server's worker");
    assert!(
        idle_turns <= u64::from(CLIENTS) && idle_sleeps <= 2 * u64::from(CLIENTS),
        "{CLIENTS} idle sessions: {idle_turns} turns, {idle_sleeps} sleeps in a second"
    );
    let mem = srv.memory();
    let rss = rss_bytes().saturating_sub(rss_before);
    println!(
        "{CLIENTS} idle connections into one messenger: {mem:?}, {} bytes each as accounted \
         (bar {IDLE_BYTES_MAX}); process RSS grew {} KiB for both ends and {CLIENTS} client \
         messengers, {} bytes per client; delivered in {:?}",
        mem.per_session(),
        rss >> 10,
        rss / CLIENTS as usize,
        started.elapsed()
    );
    assert_eq!(mem.sessions, CLIENTS as usize, "{mem:?}");
    assert_eq!(mem.links, CLIENTS as usize, "{mem:?}");
    assert!(
        mem.per_session() <= IDLE_BYTES_MAX,
        "an idle connection costs {} bytes: {mem:?}",
        mem.per_session()
    );
    let one = clients[0].0.memory();
    assert!(one.per_session() <= IDLE_BYTES_MAX, "client side: {one:?}");

    let deadline = Duration::from_secs(5);
    for (mut m, c) in clients.drain(..) {
        drop(c);
        let r = m.shutdown(deadline);
        assert_eq!(r.leaked_links, 0);
    }
    let r = srv.shutdown(deadline);
    assert_eq!(r.leaked_links, 0, "{r:?}");
}
