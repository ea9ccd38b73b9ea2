//! The cluster run's checks catch a planted bug: three node processes in
//! network namespaces, node 0 sends one message twice; the run must fail
//! with exactly that duplicate (and clean up its namespaces). The clean
//! 8-node run is scripts/test.sh's `msgr-stress --cluster 8`.
//!
//! Needs root, iproute2 and nftables: ignored by a plain `cargo test`;
//! scripts/test.sh runs it with `--ignored`. Without them it FAILS, saying
//! what is missing.

use std::time::Duration;

use msgr_testsuite::stress::{namespaces_left, run_cluster, ClusterOptions};

#[test]
#[ignore = "needs root, ip and nft: scripts/test.sh runs it with --ignored"]
fn a_planted_duplicate_fails_the_cluster_run() {
    let mut opts = ClusterOptions::new(3);
    opts.duration = Duration::from_secs(12);
    opts.plant_duplicate = true;
    opts.node_program = Some(env!("CARGO_BIN_EXE_msgr-stress").into());
    println!("seed {}", opts.seed);
    let report = match run_cluster(&opts) {
        Ok(r) => r,
        Err(e) => panic!("{e}"),
    };
    println!("{}", report.summary());
    assert!(!report.passed(), "the planted duplicate was not caught");
    assert!(
        report
            .violations
            .iter()
            .any(|v| v.contains("duplicate") && v.contains("sender: 0")),
        "{:?}",
        report.violations
    );
    assert!(report.delivered > 1000, "the run made progress");
    let left = namespaces_left(std::process::id()).expect("ip netns list");
    assert!(left.is_empty(), "namespaces left: {left:?}");
}
