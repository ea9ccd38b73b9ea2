//! The shared stress workload (docs/STRESS.md) over the verbs backend, inside
//! the QEMU guest: `msgr-stress --backend verbs --bind
//! verbs://127.0.0.1:0?dev=rxe0` with the default fault plan, real QP faults,
//! server restarts, exactly-once / in-order verification and leak checks.
//!
//!     cargo test --release -p msgr-testsuite --features rdma --test guest_stress -- --nocapture
//!
//! `MSGR_STRESS_SECS` (default 40) and `MSGR_STRESS_SEED` (default random,
//! always printed) override duration and seed.
//!
//! Fewer messengers than on TCP (2 servers × 6 clients): TCG makes every
//! RDMA operation slow, and the guest has 1 GiB for all the messengers'
//! registered pools.
#![cfg(feature = "rdma")]

use msgr_testsuite::guest::reference::LOOPBACK_DEVICE;
use msgr_testsuite::guest::{build_programs, shell_quote, GuestCommand, GuestRunner};
use std::time::Duration;

const SERVERS: u32 = 2;
const CLIENTS: u32 = 6;

fn env_u64(key: &str) -> Option<u64> {
    std::env::var(key).ok().map(|v| {
        v.parse()
            .unwrap_or_else(|_| panic!("{key}={v} is not a number"))
    })
}

#[test]
fn stress_suite_over_verbs_in_the_guest() {
    let secs = env_u64("MSGR_STRESS_SECS").unwrap_or(40);
    let seed = env_u64("MSGR_STRESS_SEED").unwrap_or_else(rand::random);
    println!("seed {seed} backend verbs ({secs} s, {SERVERS} servers x {CLIENTS} clients)");
    let bin = build_programs(&[
        "-p",
        "msgr-testsuite",
        "--features",
        "rdma",
        "--bin",
        "msgr-stress",
    ])
    .join("msgr-stress");
    assert!(bin.exists(), "{} missing", bin.display());
    let args = [
        "--backend".to_string(),
        "verbs".into(),
        "--bind".into(),
        format!("verbs://127.0.0.1:0?dev={LOOPBACK_DEVICE}"),
        "--duration".into(),
        secs.to_string(),
        "--servers".into(),
        SERVERS.to_string(),
        "--clients".into(),
        CLIENTS.to_string(),
        "--seed".into(),
        seed.to_string(),
        "--json".into(),
        "--quiet".into(),
    ];
    let mut script = shell_quote(&bin.to_string_lossy());
    for a in &args {
        script.push(' ');
        script.push_str(&shell_quote(a));
    }
    // The report (JSON) and the log (stderr) apart, so the report parses.
    script.push_str(
        " >$TMPDIR/report.json 2>$TMPDIR/stress.log\n\
         rc=$?\n\
         cat $TMPDIR/stress.log\n\
         echo '--- report ---'\n\
         cat $TMPDIR/report.json\n\
         exit $rc\n",
    );
    // The workload's own bounds: duration, a 90 s drain, its watchdog at
    // duration + drain + 240 s; the guest's timeout sits above them all.
    let cmd =
        GuestCommand::shell("msgr-stress-verbs", script).timeout(Duration::from_secs(secs + 360));
    let runner = GuestRunner::from_env()
        .unwrap_or_else(|e| panic!("the RDMA test guest is unavailable: {e}"));
    let out = runner
        .run(&[cmd], Duration::from_secs(secs + 480))
        .expect("guest run");
    println!("{out}");
    let c = out.command("msgr-stress-verbs").expect("the command ran");
    let repro = format!(
        "reproduce with MSGR_STRESS_SEED={seed} (in the guest: msgr-stress --seed {seed} {})",
        args[..10].join(" ")
    );
    let (_, report) = c
        .output
        .split_once("--- report ---")
        .unwrap_or_else(|| panic!("no report; {repro}\n{out}"));
    let reports: serde_json::Value = serde_json::from_str(report.trim())
        .unwrap_or_else(|e| panic!("report is not JSON ({e}); {repro}\n{out}"));
    let r = reports
        .as_array()
        .and_then(|a| a.first())
        .unwrap_or_else(|| panic!("no verbs report; {repro}\n{out}"));
    let n = |k: &str| {
        r[k].as_u64()
            .unwrap_or_else(|| panic!("report has no {k}; {repro}\n{out}"))
    };
    assert_eq!(r["backend"], "verbs", "{repro}");
    assert_eq!(
        n("violation_count"),
        0,
        "violations: {}; {repro}",
        r["violations"]
    );
    assert!(c.success(), "msgr-stress failed; {repro}\n{out}");
    assert!(
        n("delivered_messages") > 500,
        "the run made progress; {repro}"
    );
    assert!(n("injected_faults") > 0, "faults were injected; {repro}");
    assert!(
        n("reconnects") > 0,
        "sessions resumed after faults; {repro}"
    );
    assert_eq!(n("leaked_links"), 0, "{repro}");
}
