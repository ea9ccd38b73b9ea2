//! Real network faults for TCP: servers and clients in two network
//! namespaces joined by a veth pair, nftables dropping packets and sending
//! TCP resets, link flaps during the run; lossless guarantees must hold.
//!
//! Needs root, iproute2 and nftables. Ignored by a plain `cargo test` (whose
//! environment may lack them); scripts/test.sh installs them and runs it with
//! `--ignored`. When run without what it needs it FAILS, saying what is missing.

use std::time::Duration;

use msgr_testsuite::stress::{
    backend_by_name, namespaces_left, run_in_netns, NetnsOptions, StressConfig,
};

#[test]
#[ignore = "needs root, ip and nft: scripts/test.sh runs it with --ignored"]
fn stress_tcp_across_namespaces_with_drops_resets_and_flaps() {
    let mut cfg = StressConfig::new(backend_by_name("tcp").expect("tcp backend"));
    if let Some(seed) = std::env::var("MSGR_STRESS_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        cfg.seed = seed;
    }
    cfg.duration = Duration::from_secs(
        std::env::var("MSGR_STRESS_SECS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(30),
    );
    println!("seed {}", cfg.seed);
    let report = match run_in_netns(&cfg, &NetnsOptions::default()) {
        Ok(r) => r,
        Err(e) => panic!("{e}"),
    };
    println!("{}", report.summary());
    assert!(
        report.passed(),
        "namespace stress run failed; reproduce with MSGR_STRESS_SEED={}\n{}",
        report.seed,
        report.summary()
    );
    assert!(report.delivered_messages > 1000, "the run made progress");
    let left = namespaces_left(std::process::id()).expect("ip netns list");
    assert!(left.is_empty(), "namespaces left: {left:?}");
}
