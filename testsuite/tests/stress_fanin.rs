//! Fan-in, CI-sized: 1,000 lossless clients from 4 processes into one
//! server (this process), a ping through while they connect and idle, and
//! the server back to its sessions and file descriptors after they close.
//! All from 127.0.0.1 at once, far beyond the source's handshake share:
//! the burst waits for slots, none is refused (so none redials).
//! Correctness only: the figures are printed, not asserted (docs/STRESS.md
//! "Fan-in"); then a run whose clients cannot start must fail. Alone in its
//! binary, one run at a time: it counts this process's descriptors.

use std::path::PathBuf;
use std::time::Duration;

use msgr_testsuite::stress::fanin::{run_fan_in, FanInOptions};

#[test]
fn a_thousand_lossless_clients_come_up_idle_and_close() {
    let mut opts = FanInOptions::new(1000, PathBuf::from(env!("CARGO_BIN_EXE_msgr-fanin")));
    opts.checkpoints = Vec::new();
    opts.idle = Duration::from_secs(2);
    // A client's close can miss the server on a loaded machine (its
    // shutdown's deadline passes first); its lossless server session then
    // waits `server_linger` for it. Shorter than the close deadline, so
    // "no session left" means none leaked, whatever the load.
    opts.server_settings.push("server_linger_ms=10000".into());
    // A share of 16 handshakes for the one source: the burst of 1,000 must
    // wait for slots. The server keeps waiting links 60 s (a client that
    // gives up first just redials): a refusal is then the queue's doing,
    // never a loaded machine's.
    opts.server_settings
        .push("max_handshakes_per_source=16".into());
    opts.server_settings
        .push("handshake_timeout_ms=60000".into());
    let report = run_fan_in(&opts).expect("the run starts");
    println!("{}", report.summary());
    assert!(report.passed(), "{}", report.summary());
    // What passed means, spelled out.
    assert_eq!(report.checkpoints.len(), 1, "one burst: {report:?}");
    assert_eq!(report.checkpoints[0].sessions, 1000);
    assert!(report.checkpoints[0].accounted_per_session > 0);
    for (phase, p) in [
        ("connecting", &report.ping_connecting),
        ("idle", &report.ping_idle),
    ] {
        assert!(p.answered > 0, "no ping answered while {phase}");
        assert_eq!(p.lost, 0, "pings lost while {phase}: {p:?}");
    }
    assert_eq!(report.sessions_after, 0, "sessions left on the server");
    assert!(
        report.handshakes_waited > 0,
        "the burst never exceeded the source's share: {report:?}"
    );
    assert_eq!(
        report.handshakes_refused, 0,
        "a burst from one address was refused (its clients redial)"
    );
    assert!(
        report.fds_after <= report.fds_before,
        "file descriptors: {} before the clients, {} after they closed",
        report.fds_before,
        report.fds_after
    );

    // And it can fail: clients that cannot start their messengers.
    let mut broken = opts.clone();
    broken.client_settings.push("no_such_key=1".into());
    let report = run_fan_in(&broken).expect("the run starts");
    assert!(!report.passed(), "a run without clients passed: {report:?}");
}
