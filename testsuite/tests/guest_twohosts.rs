//! The shared stress workload between two RDMA hosts joined by a lossy wire,
//! in one guest boot (docs/GUEST.md, "Two hosts on a wire"): host B's
//! servers listen on rxeb (10.77.0.2) or siwb (10.77.1.2), the clients reach
//! them from host A's rxea / siwa across a veth pair with 1 % netem loss in
//! both directions, and A's end of the wire goes down for 2 s mid-run. Over
//! rdma_cm on rxe, then on siw: 0 violations, progress,
//! reconnects, no leaked link, and packets really dropped on the wire.
//!
//!     cargo test --release -p msgr-testsuite --features rdma --test guest_twohosts -- --nocapture
//!
//! `MSGR_STRESS_SECS` (default 20 per backend) and `MSGR_STRESS_SEED`
//! (default random, always printed) override duration and seed.
#![cfg(feature = "rdma")]

use msgr_testsuite::guest::stress::{build_msgr_stress, StressShape, StressTarget};
use msgr_testsuite::guest::twohosts::{self, RXE_B, SIW_B};
use msgr_testsuite::guest::{GuestCommand, GuestRunner, GuestVariant};
use std::time::Duration;

const SERVERS: u32 = 2;
const CLIENTS: u32 = 6;
/// netem loss on every wire end, percent.
const LOSS_PERCENT: f64 = 1.0;
/// How long host A's end of the wire stays down.
const FLAP_DOWN: Duration = Duration::from_secs(2);

/// A stress run across the wire and the wire ends its traffic crosses.
struct WireRun {
    target: StressTarget,
    /// Host A's end, taken down mid-run.
    a_end: &'static str,
    /// Host B's end.
    b_end: &'static str,
}

fn runs() -> Vec<WireRun> {
    vec![
        WireRun {
            target: StressTarget {
                name: "msgr-stress-rdmacm-rxe-wire",
                backend: "rdmacm",
                bind: format!("rdmacm://{RXE_B}:0"),
                prelude: "",
                extra: &[],
            },
            a_end: "va0",
            b_end: "vb0",
        },
        WireRun {
            target: StressTarget {
                name: "msgr-stress-rdmacm-siw-wire",
                backend: "rdmacm",
                bind: format!("rdmacm://{SIW_B}:0"),
                prelude: "ulimit -l unlimited\n",
                // No --rma: an RMA operation that waits out its 10 s
                // deadline while the wire is down (the flap keeps it down
                // 10-20 s in a busy guest) is a violation to the checker,
                // which knows of no outage but restarts, resets and
                // mark_downs (docs/GUEST.md).
                extra: &[],
            },
            a_end: "va1",
            b_end: "vb1",
        },
    ]
}

fn counters_name(run: &WireRun) -> String {
    format!("{}-counters", run.target.name)
}

#[test]
fn stress_suite_between_two_hosts_on_a_lossy_wire() {
    let shape = StressShape::from_env(SERVERS, CLIENTS);
    println!(
        "seed {} ({} s per backend, {SERVERS} servers x {CLIENTS} clients, \
         {LOSS_PERCENT} % loss, a {FLAP_DOWN:?} link flap)",
        shape.seed, shape.secs
    );
    let bin = build_msgr_stress("rdma");
    let runs = runs();
    let mut cmds: Vec<GuestCommand> = vec![twohosts::setup_command()];
    for r in &runs {
        cmds.push(twohosts::across_lossy_wire(
            r.target.command(&bin, shape),
            LOSS_PERCENT,
            r.a_end,
            Duration::from_secs(shape.secs * 2 / 5),
            FLAP_DOWN,
        ));
        cmds.push(twohosts::counters_command(&counters_name(r)));
    }
    let runner = GuestRunner::from_env()
        .unwrap_or_else(|e| panic!("the RDMA test guest is unavailable: {e}"))
        .variant(GuestVariant::Netem);
    let out = runner
        .run(&cmds, Duration::from_secs(2 * (shape.secs + 200) + 240))
        .expect("guest run");
    println!("{out}");
    let setup = out.command("wire-setup").expect("wire-setup ran");
    assert!(setup.success(), "the wire was not built:\n{out}");
    let mut before = twohosts::counters(&out, "wire-setup");
    for r in &runs {
        r.target.check(&out, shape);
        let after = twohosts::counters(&out, &counters_name(r));
        let end = |list: &[twohosts::EndCounters], dev: &str| {
            list.iter()
                .find(|c| c.dev == dev)
                .cloned()
                .unwrap_or_else(|| panic!("no counters of {dev}:\n{out}"))
        };
        for dev in [r.a_end, r.b_end] {
            let (b, a) = (end(&before, dev), end(&after, dev));
            println!(
                "{}: {dev} sent {} packets, netem dropped {}",
                r.target.name,
                a.tx.saturating_sub(b.tx),
                a.dropped.saturating_sub(b.dropped)
            );
            assert!(
                a.tx > b.tx + 500,
                "{}: the traffic did not cross {dev}",
                r.target.name
            );
            assert!(
                a.dropped > b.dropped,
                "{}: netem dropped nothing on {dev}",
                r.target.name
            );
        }
        before = after;
    }
}
