//! The libfabric backend over the **verbs provider** on Soft-RoCE, inside the
//! QEMU guest (docs/GUEST.md), in one boot:
//!
//! - the messenger's fabric integration tests (messenger/tests/fabric.rs,
//!   the `verbs_msg` module, ignored on the host): thousands of messages of
//!   0 B–4 MiB intact and in order, those above 64 KiB fetched by `fi_read`
//!   rendezvous (RDMA read on rxe; checked here too) and, in
//!   `verbs_msg_by_write`, written by `fi_write` into buffers the receiver
//!   grants (RDMA write), in `verbs_msg_polled_cq` with the completion
//!   queue polled (`fabric_cq_wait = poll`), links aborted under a lossless session
//!   with every message delivered exactly once, nothing left at shutdown;
//!   in `verbs_msg_kept_registrations` a payload sent again by rendezvous
//!   registered (pinned, on rxe) once; and `verbs_rdm`: RDM endpoints
//!   (`verbs;ofi_rxm`) are refused on rxe with the reason (docs/GUEST.md);
//! - the backend's hostile-peer test over verbs MSG endpoints
//!   (backends/src/fabric/hostile.rs): a peer speaking the wire through
//!   libfabric alone sends what no msgr peer sends (an RDMA read of a key
//!   never given among it), and each bad message ends its link;
//! - the shared stress suite (`msgr-stress --backend fabric+verbs`) with the
//!   default fault plan, server restarts and leak checks.
//!
//! Both bind `fabric+verbs://198.51.100.1:0`: rxe1 on a dummy netdev. The
//! verbs provider resolves addresses through rdma_cm, which cannot resolve
//! loopback addresses, so rxe0 (on lo) is no use to it.
//!
//!     cargo test --release -p msgr-testsuite --features fabric --test guest_fabric -- --nocapture
//!
//! `MSGR_STRESS_SECS` (default 20) and `MSGR_STRESS_SEED` (default random,
//! always printed) override the stress run's duration and seed.
#![cfg(feature = "fabric")]

use msgr::{availability, Availability, EntityAddr};
use msgr_testsuite::guest::stress::{env_u64, StressShape, StressTarget};
use msgr_testsuite::guest::{
    build_programs, build_test_binary, in_guest, shell_quote, GuestCommand, GuestRunner,
    RXE_CM_ADDR,
};
use std::time::Duration;

/// On this host (no RDMA device) `fabric+verbs` says why it cannot run.
#[test]
fn fabric_verbs_unavailable_on_the_host_says_why() {
    if in_guest() || std::path::Path::new("/sys/class/infiniband_verbs/uverbs0").exists() {
        return; // a machine with a device: nothing to check here
    }
    let a: EntityAddr = "fabric+verbs://127.0.0.1:0".parse().unwrap();
    match availability(&a.transport) {
        Availability::Unavailable(reason) => assert!(reason.contains("verbs"), "{reason}"),
        Availability::Available => panic!("fabric+verbs available on a host without a device"),
    }
}

/// The `read N` of the line `ADDR: rendezvous sent S, read N (B bytes), …`
/// that messenger/tests/fabric.rs prints.
fn rendezvous_reads(output: &str) -> Option<u64> {
    let line = output
        .lines()
        .find(|l| l.contains("198.51.100.1") && l.contains(": rendezvous sent "))?;
    let (_, after) = line.split_once(", read ")?;
    after.split_whitespace().next()?.parse().ok()
}

#[test]
fn rendezvous_line_parses() {
    let line = "fabric+verbs://198.51.100.1:0: rendezvous sent 7, read 7 (9 bytes), fallbacks 0";
    assert_eq!(rendezvous_reads(line), Some(7));
    assert_eq!(rendezvous_reads("nothing"), None);
}

#[test]
fn fabric_verbs_provider_in_the_guest() {
    let shape = StressShape {
        secs: env_u64("MSGR_STRESS_SECS").unwrap_or(20),
        servers: 2,
        clients: 6,
        seed: env_u64("MSGR_STRESS_SEED").unwrap_or_else(rand::random),
    };
    println!(
        "stress seed {} ({} s, {} servers x {} clients)",
        shape.seed, shape.secs, shape.servers, shape.clients
    );
    let integration = build_test_binary(
        &["-p", "msgr", "--features", "fabric", "--test", "fabric"],
        "fabric",
    );
    let backend_tests = build_test_binary(
        &["-p", "msgr-backends", "--features", "fabric", "--lib"],
        "msgr_backends",
    );
    let stress = build_programs(&[
        "-p",
        "msgr-testsuite",
        "--features",
        "fabric",
        "--bin",
        "msgr-stress",
    ])
    .join("msgr-stress");
    assert!(stress.exists(), "{} missing", stress.display());
    let target = StressTarget {
        name: "msgr-stress-fabric-verbs-rxe1",
        backend: "fabric+verbs",
        bind: format!("fabric+verbs://{RXE_CM_ADDR}:0"),
        prelude: "",
        extra: &[],
    };
    let cmds = [
        // Only the guest-only tests (`--ignored`), one at a time.
        GuestCommand::shell(
            "fabric-tests-verbs",
            format!(
                "{} --ignored --test-threads 1 --nocapture verbs_",
                shell_quote(&integration.to_string_lossy())
            ),
        )
        .timeout(Duration::from_secs(300)),
        GuestCommand::shell(
            "fabric-hostile-verbs",
            format!(
                "{} --ignored --exact --nocapture fabric::hostile::verbs_msg_bad_messages_end_their_link",
                shell_quote(&backend_tests.to_string_lossy())
            ),
        )
        .timeout(Duration::from_secs(120)),
        target.command(&stress, shape),
    ];
    let runner = GuestRunner::from_env()
        .unwrap_or_else(|e| panic!("the RDMA test guest is unavailable: {e}"));
    let out = runner
        .run(&cmds, Duration::from_secs(shape.secs + 600))
        .expect("guest run");
    println!("{out}");

    let tests = out
        .command("fabric-tests-verbs")
        .unwrap_or_else(|| panic!("the integration tests did not run\n{out}"));
    assert!(tests.success(), "integration tests failed\n{out}");
    // With --nocapture a test's own lines come between its name and "ok".
    for name in [
        "verbs_msg::ordering_and_integrity_mixed_sizes",
        "verbs_msg::lossless_exactly_once_across_aborts",
        "verbs_msg_by_write::ordering_and_integrity_mixed_sizes",
        "verbs_msg_polled_cq::ordering_and_integrity_mixed_sizes",
        "verbs_rdm::refused_with_the_reason",
        "verbs_msg_kept_registrations::a_payload_sent_again_keeps_its_registration",
    ] {
        assert!(
            tests.output.contains(&format!("test {name} ... ")),
            "{name} did not run\n{out}"
        );
    }
    assert!(
        tests.output.contains("test result: ok. 6 passed"),
        "not exactly the six verbs tests ran\n{out}"
    );
    // Over verbs MSG endpoints the large messages go by fi_read (RDMA
    // read on rxe): the integration test prints its rendezvous counters.
    let reads = rendezvous_reads(&tests.output)
        .unwrap_or_else(|| panic!("no rendezvous line from verbs_msg\n{out}"));
    assert!(reads > 0, "no large message took the fi_read path\n{out}");
    println!("fabric+verbs MSG: {reads} units fetched by fi_read");
    let hostile = out
        .command("fabric-hostile-verbs")
        .unwrap_or_else(|| panic!("the hostile-peer test did not run\n{out}"));
    assert!(
        hostile.success()
            && hostile
                .output
                .contains("test fabric::hostile::verbs_msg_bad_messages_end_their_link ... ok"),
        "the hostile-peer test over verbs failed\n{out}"
    );
    let r = target.check(&out, shape);
    println!(
        "fabric+verbs stress: {} delivered, {} injected faults, {} reconnects, {} leaked links",
        r["delivered_messages"], r["injected_faults"], r["reconnects"], r["leaked_links"]
    );
}
