//! The shared stress workload (docs/STRESS.md) over the RDMA backends, inside
//! the QEMU guest, one after the other in one boot: verbs on rxe0
//! (`verbs://127.0.0.1:0?dev=rxe0`), rdmacm on rxe1 (RoCE) and rdmacm on
//! siw0 (iWARP), each with the default fault plan, real QP faults, server
//! restarts, exactly-once / in-order verification and leak checks.
//!
//!     cargo test --release -p msgr-testsuite --features rdma --test guest_stress -- --nocapture
//!
//! `MSGR_STRESS_SECS` (default 20 per backend) and `MSGR_STRESS_SEED` (default random,
//! always printed) override duration and seed.
//!
//! Fewer messengers than on TCP (2 servers × 6 clients): TCG makes every
//! RDMA operation slow, and the guest has 1 GiB for all the messengers'
//! registered pools.
#![cfg(feature = "rdma")]

use msgr_testsuite::guest::reference::{CmFabric, LOOPBACK_DEVICE};
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

/// One backend the suite runs over in the guest.
struct Target {
    /// The guest command's name.
    name: &'static str,
    /// The registry name (`msgr-stress --backend`).
    backend: &'static str,
    bind: String,
    /// Shell run first (siw enforces RLIMIT_MEMLOCK even for root).
    prelude: &'static str,
}

fn targets() -> Vec<Target> {
    vec![
        Target {
            name: "msgr-stress-verbs-rxe0",
            backend: "verbs",
            bind: format!("verbs://127.0.0.1:0?dev={LOOPBACK_DEVICE}"),
            prelude: "",
        },
        Target {
            name: "msgr-stress-rdmacm-rxe1",
            backend: "rdmacm",
            bind: format!("rdmacm://{}:0", CmFabric::Rxe.addr()),
            prelude: "",
        },
        Target {
            name: "msgr-stress-rdmacm-siw0",
            backend: "rdmacm",
            bind: format!("rdmacm://{}:0", CmFabric::Siw.addr()),
            prelude: "ulimit -l unlimited\n",
        },
    ]
}

#[test]
fn stress_suite_over_rdma_in_the_guest() {
    let secs = env_u64("MSGR_STRESS_SECS").unwrap_or(20);
    let seed = env_u64("MSGR_STRESS_SEED").unwrap_or_else(rand::random);
    println!("seed {seed} ({secs} s per backend, {SERVERS} servers x {CLIENTS} clients)");
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
    let targets = targets();
    let args_of = |t: &Target| -> Vec<String> {
        vec![
            "--backend".into(),
            t.backend.into(),
            "--bind".into(),
            t.bind.clone(),
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
        ]
    };
    let cmds: Vec<GuestCommand> = targets
        .iter()
        .map(|t| {
            let mut script = format!("{}{}", t.prelude, shell_quote(&bin.to_string_lossy()));
            for a in args_of(t) {
                script.push(' ');
                script.push_str(&shell_quote(&a));
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
            // The workload's own bounds: duration, a 90 s drain, its watchdog
            // at duration + drain + 240 s; the command's timeout sits above.
            GuestCommand::shell(t.name, script).timeout(Duration::from_secs(secs + 360))
        })
        .collect();
    let runner = GuestRunner::from_env()
        .unwrap_or_else(|e| panic!("the RDMA test guest is unavailable: {e}"));
    let out = runner
        .run(&cmds, Duration::from_secs(3 * (secs + 200)))
        .expect("guest run");
    println!("{out}");
    for t in &targets {
        check(&out, t, &args_of(t), seed);
    }
}

/// A backend's run: its report parses, no violation, progress, faults,
/// reconnects and no leaked link.
fn check(out: &msgr_testsuite::guest::GuestOutcome, t: &Target, args: &[String], seed: u64) {
    let c = out
        .command(t.name)
        .unwrap_or_else(|| panic!("{} did not run\n{out}", t.name));
    let repro = format!(
        "{}: reproduce with MSGR_STRESS_SEED={seed} (in the guest: {}msgr-stress {})",
        t.name,
        t.prelude.replace('\n', "; "),
        args[..12].join(" ")
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
        .unwrap_or_else(|| panic!("no report; {repro}\n{out}"));
    let n = |k: &str| {
        r[k].as_u64()
            .unwrap_or_else(|| panic!("report has no {k}; {repro}\n{out}"))
    };
    assert_eq!(r["backend"], t.backend, "{repro}");
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
