//! RDMA tests that run inside the QEMU guest (docs/GUEST.md).
//!
//!     cargo test -p msgr-testsuite --features rdma --test guest_rdma -- --nocapture
//!
//! Every test boots its own guest (about 10 s with TCG plus what it runs);
//! the runner serialises the boots. A test that cannot get a guest fails with
//! the reason: these tests never pass without having run.
#![cfg(feature = "rdma")]

use msgr_testsuite::guest::reference::{self, ReferenceParams};
use msgr_testsuite::guest::{
    build_examples, GuestCommand, GuestRunner, GuestVariant, RXE_CM_ADDR, SIW_CM_ADDR,
};
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

fn runner() -> GuestRunner {
    GuestRunner::from_env().unwrap_or_else(|e| panic!("the RDMA test guest is unavailable: {e}"))
}

/// The smoke programs (examples of msgr-rdma), built once per test process
/// with the same profile and target directory as this test binary.
fn example(name: &str) -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    let dir = DIR.get_or_init(|| build_examples(&["-p", "msgr-rdma", "--examples"]));
    let path = dir.join(name);
    assert!(path.exists(), "{} missing", path.display());
    path
}

#[test]
fn failing_guest_command_fails_the_outcome() {
    let out = runner()
        .run(
            &[
                GuestCommand::shell("true", "true"),
                GuestCommand::shell("false", "false"),
                GuestCommand::shell("exit-7", "echo about to fail; exit 7"),
                GuestCommand::shell("sleeps", "sleep 30").timeout(Duration::from_secs(2)),
                GuestCommand::shell(
                    "marker",
                    "test \"$MSGR_IN_GUEST\" = 1 && cat /run/msgr-guest",
                ),
            ],
            Duration::from_secs(240),
        )
        .expect("guest run");
    println!("{out}");
    assert!(
        !out.all_succeeded(),
        "a failing guest command must fail the run"
    );
    assert_eq!(out.command("true").unwrap().exit_status, Some(0));
    assert_eq!(out.command("false").unwrap().exit_status, Some(1));
    let e7 = out.command("exit-7").unwrap();
    assert_eq!(e7.exit_status, Some(7));
    assert!(
        e7.output.contains("about to fail"),
        "output must reach the host"
    );
    assert!(out.command("sleeps").unwrap().timed_out);
    let marker = out.command("marker").unwrap();
    assert!(marker.success(), "guest marker missing: {}", marker.output);
    assert!(marker.output.contains("siw0=198.51.100.2"));
}

#[test]
fn overall_deadline_kills_the_guest() {
    let out = runner().run(
        &[GuestCommand::shell("hang", "sleep 600").timeout(Duration::from_secs(600))],
        Duration::from_secs(25),
    );
    // Either the guest never reached its command loop in 25 s (an error that
    // says so) or it did and the deadline cut the command short.
    match out {
        Ok(out) => {
            assert!(out.deadline_hit);
            assert!(!out.all_succeeded());
            assert_eq!(out.commands[0].exit_status, None);
        }
        Err(e) => assert!(e.to_string().contains("deadline"), "{e}"),
    }
}

/// A guest whose kernel locks up is killed within seconds, not at the
/// deadline, and the job runs once more in a fresh boot. FAKE: a real
/// lockup cannot be produced on purpose, so the command writes the kernel
/// watchdog's report to the kernel log itself (at KERN_CRIT, which reaches
/// the console) — in both boots, so the outcome is the second lockup.
#[test]
fn a_kernel_lockup_is_cut_short_and_the_job_runs_again() {
    let started = std::time::Instant::now();
    let deadline = Duration::from_secs(300);
    let out = runner()
        .run(
            &[GuestCommand::shell(
                "locks-up",
                "echo '<2>watchdog: BUG: soft lockup - CPU#0 stuck for 22s! [fake:1] \
                 (FAKE: written by the test)' >/dev/kmsg; sleep 600",
            )
            .timeout(Duration::from_secs(600))],
            deadline,
        )
        .expect("guest run");
    let line = out.kernel_lockup.as_deref().expect("the lockup was seen");
    assert!(
        line.contains("soft lockup") && line.contains("FAKE"),
        "{line}"
    );
    assert_eq!(out.lockups_before.len(), 1, "{out}");
    assert!(!out.deadline_hit && !out.all_succeeded(), "{out}");
    assert_eq!(out.commands[0].exit_status, None, "{out}");
    // Two boots cut short, far from two deadlines.
    assert!(started.elapsed() < deadline, "took {:?}", started.elapsed());
    println!("{out}");
}

/// The project's own programs over the real RDMA stack, in one guest boot:
/// verbs (two RC QPs on rxe0), rdma_cm over Soft-RoCE and over soft-iWARP.
#[test]
fn smoke_programs() {
    let verbs = example("verbs_smoke");
    let cm = example("rdmacm_smoke");
    let cmds = [
        GuestCommand::shell("devices", "ibv_devices && rdma link show"),
        GuestCommand::program("verbs-rxe0", &verbs, &["rxe0", "100"]),
        GuestCommand::program("rdmacm-rxe", &cm, &[RXE_CM_ADDR, "7471", "50"]),
        GuestCommand::program("rdmacm-siw", &cm, &[SIW_CM_ADDR, "7472", "50"]),
    ];
    let out = runner()
        .run(&cmds, Duration::from_secs(480))
        .expect("guest run");
    println!("{out}");
    out.assert_success();
    assert!(out
        .command("rdmacm-siw")
        .unwrap()
        .output
        .contains("OK on siw0"));
    assert!(out
        .command("rdmacm-rxe")
        .unwrap()
        .output
        .contains("OK on rxe1"));
}

/// On the host the rdma_cm smoke program must refuse (TEST-NET-2 would route off the machine).
#[test]
fn rdmacm_smoke_refuses_outside_the_guest() {
    let out = Command::new(example("rdmacm_smoke"))
        .args([RXE_CM_ADDR])
        .env_remove("MSGR_IN_GUEST")
        .output()
        .expect("run rdmacm_smoke");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("refusing"));
}

#[test]
fn reference_peers() {
    let cmds = reference::reference_commands(&ReferenceParams::default());
    let out = runner()
        .run(&cmds, Duration::from_secs(600))
        .expect("guest run");
    let figures = reference::parse_reference(&out);
    println!(
        "reference peers (one guest boot, {:.1} s):\n{figures}",
        out.elapsed.as_secs_f64()
    );
    assert!(
        figures.all_ok(),
        "a reference peer failed:\n{figures}\n{out}"
    );
}

/// The netem variant: two network namespaces joined by a veth pair with
/// TEST-NET-2 addresses, netem loss/delay/duplication/reordering on one end,
/// then ping and a TCP echo across.
#[test]
fn netem_between_namespaces() {
    let script = r#"
set -e
ip netns add msgr-a
ip netns add msgr-b
ip link add va type veth peer name vb
ip link set va netns msgr-a
ip link set vb netns msgr-b
ip -n msgr-a addr add 198.51.100.65/26 dev va
ip -n msgr-b addr add 198.51.100.66/26 dev vb
for ns in msgr-a msgr-b; do ip -n $ns link set lo up; done
ip -n msgr-a link set va up
ip -n msgr-b link set vb up
ip netns exec msgr-a tc qdisc add dev va root netem delay 10ms 2ms loss 5% duplicate 2% reorder 10% 50%
ip netns exec msgr-a tc qdisc show dev va
ip netns exec msgr-a busybox ping -c 10 -i 0.1 -W 2 198.51.100.66 | tail -n 3 | tee $TMPDIR/ping.log
grep -Eq ' [1-9][0-9]* packets received' $TMPDIR/ping.log
ip netns exec msgr-b busybox nc -l -p 7000 -e /bin/cat &
ip netns exec msgr-a bash -c '
  # The listener may take a moment to start (slow exec under TCG).
  for i in $(seq 30); do
    exec 3<>/dev/tcp/198.51.100.66/7000 && break
    sleep 0.5
  done 2>/dev/null
  echo hello-through-netem >&3
  read -r -t 20 reply <&3
  echo "echo reply: $reply"
  test "$reply" = hello-through-netem'
kill %1 2>/dev/null || true
"#;
    let out = runner()
        .variant(GuestVariant::Netem)
        .run(
            &[GuestCommand::shell("netns-netem", script)],
            Duration::from_secs(240),
        )
        .expect("guest run");
    println!("{out}\n{}", out.console);
    out.assert_success();
    assert!(out.commands[0].output.contains("netem"));
}
