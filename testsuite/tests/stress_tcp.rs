//! The shared stress workload, ~20 s over every available backend (TCP here),
//! with faults on. Alone in its binary so thread counts are its own.
//! `MSGR_STRESS_SECS` and `MSGR_STRESS_SEED` override duration and seed.

use std::time::Duration;

use msgr_testsuite::stress::{available_backends, run, StressConfig};

#[test]
fn stress_every_available_backend_with_faults() {
    let backends = available_backends();
    assert!(!backends.is_empty(), "no backend available");
    let secs: u64 = std::env::var("MSGR_STRESS_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    for backend in backends {
        let mut cfg = StressConfig::new(backend);
        if let Some(seed) = std::env::var("MSGR_STRESS_SEED")
            .ok()
            .and_then(|v| v.parse().ok())
        {
            cfg.seed = seed;
        }
        cfg.duration = Duration::from_secs(secs);
        println!("seed {} backend {}", cfg.seed, cfg.backend.name);
        let report = run(&cfg);
        println!("{}", report.summary());
        assert!(
            report.passed(),
            "stress run failed; reproduce with MSGR_STRESS_SEED={} (msgr-stress --seed {} --backend {})\n{}",
            report.seed,
            report.seed,
            report.backend,
            report.summary()
        );
        assert!(report.delivered_messages > 1000, "the run made progress");
        assert!(report.injected_faults > 0, "faults were injected");
        assert!(report.reconnects > 0, "sessions resumed after faults");
    }
}
