//! The shared stress workload (`msgr-stress`, docs/STRESS.md) as guest
//! commands, and the checks every guest run of it must pass: used by
//! tests/guest_stress.rs (verbs, rdmacm) and tests/guest_fabric.rs
//! (libfabric's verbs provider).

use super::{build_programs, shell_quote, GuestCommand, GuestOutcome};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// One backend the suite runs over in the guest.
#[derive(Clone, Debug)]
pub struct StressTarget {
    /// The guest command's name.
    pub name: &'static str,
    /// The registry name (`msgr-stress --backend`).
    pub backend: &'static str,
    /// The servers' bind address.
    pub bind: String,
    /// Shell run first (siw enforces RLIMIT_MEMLOCK even for root).
    pub prelude: &'static str,
    /// More `msgr-stress` arguments (`--transport-change`).
    pub extra: &'static [&'static str],
}

/// How long and how big one run is.
#[derive(Clone, Copy, Debug)]
pub struct StressShape {
    /// How long the workload runs, in seconds (`--duration`).
    pub secs: u64,
    /// Server messengers (`--servers`).
    pub servers: u32,
    /// Client messengers, one thread each (`--clients`).
    pub clients: u32,
    /// The run's seed (`--seed`): the clients' operations and the fault
    /// plans are drawn from it.
    pub seed: u64,
}

impl StressShape {
    /// `servers` × `clients` for `MSGR_STRESS_SECS` seconds (default 20)
    /// with seed `MSGR_STRESS_SEED` (default random): the guest stress
    /// tests' knobs.
    pub fn from_env(servers: u32, clients: u32) -> Self {
        StressShape {
            secs: env_u64("MSGR_STRESS_SECS").unwrap_or(20),
            servers,
            clients,
            seed: env_u64("MSGR_STRESS_SEED").unwrap_or_else(rand::random),
        }
    }
}

impl StressTarget {
    /// `msgr-stress` arguments for this target (the first 12 reproduce it).
    pub fn args(&self, shape: StressShape) -> Vec<String> {
        vec![
            "--backend".into(),
            self.backend.into(),
            "--bind".into(),
            self.bind.clone(),
            "--duration".into(),
            shape.secs.to_string(),
            "--servers".into(),
            shape.servers.to_string(),
            "--clients".into(),
            shape.clients.to_string(),
            "--seed".into(),
            shape.seed.to_string(),
            "--json".into(),
            "--quiet".into(),
        ]
        .into_iter()
        .chain(self.extra.iter().map(|a| a.to_string()))
        .collect()
    }

    /// The guest command running `bin` (msgr-stress) over this target.
    pub fn command(&self, bin: &Path, shape: StressShape) -> GuestCommand {
        let mut script = format!("{}{}", self.prelude, shell_quote(&bin.to_string_lossy()));
        for a in self.args(shape) {
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
        GuestCommand::shell(self.name, script).timeout(Duration::from_secs(shape.secs + 360))
    }

    /// Checks this target's run: its report parses, no violation, progress,
    /// faults, reconnects and no leaked link. Returns the report.
    #[track_caller]
    pub fn check(&self, out: &GuestOutcome, shape: StressShape) -> serde_json::Value {
        let c = out
            .command(self.name)
            .unwrap_or_else(|| panic!("{} did not run\n{out}", self.name));
        let repro = format!(
            "{}: reproduce with MSGR_STRESS_SEED={} (in the guest: {}msgr-stress {})",
            self.name,
            shape.seed,
            self.prelude.replace('\n', "; "),
            self.args(shape)[..12].join(" ")
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
            .unwrap_or_else(|| panic!("no report; {repro}\n{out}"))
            .clone();
        let n = |k: &str| {
            r[k].as_u64()
                .unwrap_or_else(|| panic!("report has no {k}; {repro}\n{out}"))
        };
        assert_eq!(r["backend"], self.backend, "{repro}");
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
        r
    }
}

/// Builds `msgr-stress` with cargo `features` for the guest (the calling
/// test's profile and target directory, [`build_programs`]) and returns its
/// path.
pub fn build_msgr_stress(features: &str) -> PathBuf {
    let bin = build_programs(&[
        "-p",
        "msgr-testsuite",
        "--features",
        features,
        "--bin",
        "msgr-stress",
    ])
    .join("msgr-stress");
    assert!(bin.exists(), "{} missing", bin.display());
    bin
}

/// A number from the environment (`MSGR_STRESS_SECS`, `MSGR_STRESS_SEED`).
pub fn env_u64(key: &str) -> Option<u64> {
    std::env::var(key).ok().map(|v| {
        v.parse()
            .unwrap_or_else(|_| panic!("{key}={v} is not a number"))
    })
}
