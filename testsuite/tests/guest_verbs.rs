//! The verbs backend of the messenger, inside the QEMU guest (docs/GUEST.md),
//! and its refusal on a host without RDMA.
//!
//!     cargo test -p msgr-testsuite --features rdma --test guest_verbs -- --nocapture
#![cfg(feature = "rdma")]

use msgr::{availability, Availability, TransportKind};
use msgr_testsuite::guest::{build_examples, in_guest, GuestCommand, GuestRunner};
use std::path::PathBuf;
use std::time::Duration;

/// Builds testsuite's `verbs_messenger` example with this test's profile and
/// target directory.
fn example(name: &str) -> PathBuf {
    let dir = build_examples(&[
        "-p",
        "msgr-testsuite",
        "--features",
        "rdma",
        "--example",
        name,
    ]);
    let path = dir.join(name);
    assert!(path.exists(), "{} missing", path.display());
    path
}

/// On this host (no RDMA in the kernel) the verbs backend says why it cannot run.
#[test]
fn verbs_unavailable_on_the_host_says_why() {
    if in_guest() || std::path::Path::new("/sys/class/infiniband_verbs/uverbs0").exists() {
        return; // a machine with a device: nothing to check here
    }
    match availability(&TransportKind::Verbs) {
        Availability::Unavailable(reason) => {
            assert!(reason.contains("no RDMA device"), "{reason}")
        }
        Availability::Available => panic!("verbs available on a host without a device"),
    }
}

#[test]
fn messenger_over_verbs_in_the_guest() {
    let prog = example("verbs_messenger");
    let runner = GuestRunner::from_env()
        .unwrap_or_else(|e| panic!("the RDMA test guest is unavailable: {e}"));
    let run = |name: &str, bind: &str| {
        GuestCommand::program(name, &prog, &[bind, "3000"]).timeout(Duration::from_secs(400))
    };
    let cmds = [
        run("verbs-rxe0", "verbs://127.0.0.1:0?dev=rxe0"),
        // rdma_cm needs a routable address on the device's netdev: rxe1 and
        // siw0 sit on dummy netdevs with TEST-NET-2 addresses inside the guest.
        run("rdmacm-rxe1", "rdmacm://198.51.100.1:0"),
        // siw checks RLIMIT_MEMLOCK even for root: with the kernel's default
        // 8 MiB the pools do not fit, and the messenger must say so clearly...
        GuestCommand::shell(
            "rdmacm-siw0-memlock",
            format!(
                "ulimit -l 8192; {} rdmacm://198.51.100.2:0 10",
                shell_quote_path(&prog)
            ),
        )
        .timeout(Duration::from_secs(60)),
        // ...and with the limit raised (as a deployment would) all of it runs.
        GuestCommand::shell(
            "rdmacm-siw0",
            format!(
                "ulimit -l unlimited; {} rdmacm://198.51.100.2:0 3000",
                shell_quote_path(&prog)
            ),
        )
        .timeout(Duration::from_secs(400)),
        // The same program over TCP in the same boot: the ratio reference.
        run("tcp", "tcp://127.0.0.1:0"),
        // Reference peer in the same boot: perftest with its own out-of-band
        // TCP exchange on lo, like ours (informational; not asserted).
        GuestCommand::shell(
            "ib_send_lat-rxe0",
            "cd $TMPDIR; (ib_send_lat -d rxe0 -x 1 -p 18515 -s 64 -n 1000 >srv.log 2>&1 &); \
             sleep 5; ib_send_lat -d rxe0 -x 1 -p 18515 -s 64 -n 1000 127.0.0.1",
        )
        .timeout(Duration::from_secs(120)),
    ];
    let out = runner
        .run(&cmds, Duration::from_secs(840))
        .expect("guest run");
    println!("{out}");
    for name in ["verbs-rxe0", "rdmacm-rxe1", "rdmacm-siw0", "tcp"] {
        let c = out
            .command(name)
            .unwrap_or_else(|| panic!("{name} did not run: {out}"));
        assert!(c.success(), "{name} failed: {out}");
        let o = &c.output;
        assert!(o.contains("verbs_messenger: OK"), "{name}: {o}");
        assert!(o.contains("stream: delivered 3000 of 3000"), "{name}: {o}");
    }
    // Rendezvous read sinks are reused once the application drops the
    // messages on RoCE (rxe), never on iWARP (siw: remotely writable).
    for (name, reuses) in [
        ("verbs-rxe0", true),
        ("rdmacm-rxe1", true),
        ("rdmacm-siw0", false),
    ] {
        let o = &out.command(name).expect("ran").output;
        let line = o
            .lines()
            .find(|l| l.contains("reads into reused sinks"))
            .unwrap_or_else(|| panic!("{name}: no sink figure: {o}"));
        let reused: u64 = line
            .trim()
            .strip_prefix("both ways: ")
            .and_then(|l| l.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{name}: {line}"));
        assert_eq!(reused > 0, reuses, "{name}: {line}");
    }
    // The hung-read phase (RDMA only; its fault is simulated, and says so).
    for name in ["verbs-rxe0", "rdmacm-rxe1", "rdmacm-siw0"] {
        let o = &out.command(name).expect("ran").output;
        assert!(o.contains("hung read: SIMULATED fault"), "{name}: {o}");
        assert!(
            o.contains("hung read: delivered 10 of 10") && o.contains("read_timeouts 1,"),
            "{name}: {o}"
        );
    }
    let m = out.command("rdmacm-siw0-memlock").expect("ran");
    assert!(
        !m.success(),
        "pools larger than RLIMIT_MEMLOCK were accepted: {out}"
    );
    assert!(
        m.output.contains("RLIMIT_MEMLOCK is 8192 KiB") && m.output.contains("rdma_rx_chunks"),
        "the memlock error does not name the limit and the keys: {}",
        m.output
    );
}

// `msgr ping` / `msgr stream` over verbs against perftest: tests/guest_bench.rs.

fn shell_quote_path(p: &std::path::Path) -> String {
    msgr_testsuite::guest::shell_quote(&p.to_string_lossy())
}
