//! The shared stress workload (docs/STRESS.md) over the RDMA backends, inside
//! the QEMU guest, one after the other in one boot: verbs on rxe0
//! (`verbs://127.0.0.1:0?dev=rxe0`), rdmacm on rxe1 (RoCE) and rdmacm on
//! siw0 (iWARP), each with the default fault plan, real QP faults, server
//! restarts, exactly-once / in-order verification and leak checks (verbs
//! on rxe0 and rdmacm on siw0 with the RMA workload too: `--rma`); and rdmacm
//! on rxe1 with TCP beside it, sessions moving between the two at every fault.
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
use msgr_testsuite::guest::stress::{build_msgr_stress, StressShape, StressTarget};
use msgr_testsuite::guest::{GuestCommand, GuestRunner};
use std::time::Duration;

const SERVERS: u32 = 2;
const CLIENTS: u32 = 6;

fn targets() -> Vec<StressTarget> {
    vec![
        StressTarget {
            name: "msgr-stress-verbs-rxe0",
            backend: "verbs",
            bind: format!("verbs://127.0.0.1:0?dev={LOOPBACK_DEVICE}"),
            prelude: "",
            // One-sided RMA beside the messages: ranges of each
            // server's region written and read back, checked byte for byte.
            extra: &["--rma"],
        },
        StressTarget {
            name: "msgr-stress-rdmacm-rxe1",
            backend: "rdmacm",
            bind: format!("rdmacm://{}:0", CmFabric::Rxe.addr()),
            prelude: "",
            extra: &[],
        },
        StressTarget {
            name: "msgr-stress-rdmacm-siw0",
            backend: "rdmacm",
            bind: format!("rdmacm://{}:0", CmFabric::Siw.addr()),
            prelude: "ulimit -l unlimited\n",
            extra: &["--rma"],
        },
        // Transport change: the servers listen on rxe1 and on TCP, the
        // clients dial both, and every link fault moves a session from
        // RoCE to TCP or back.
        StressTarget {
            name: "msgr-stress-rdmacm-rxe1-and-tcp",
            backend: "rdmacm",
            bind: format!("rdmacm://{}:0", CmFabric::Rxe.addr()),
            prelude: "",
            extra: &["--transport-change"],
        },
    ]
}

#[test]
fn stress_suite_over_rdma_in_the_guest() {
    let shape = StressShape::from_env(SERVERS, CLIENTS);
    println!(
        "seed {} ({} s per backend, {SERVERS} servers x {CLIENTS} clients)",
        shape.seed, shape.secs
    );
    let bin = build_msgr_stress("rdma");
    let targets = targets();
    let cmds: Vec<GuestCommand> = targets.iter().map(|t| t.command(&bin, shape)).collect();
    let runner = GuestRunner::from_env()
        .unwrap_or_else(|e| panic!("the RDMA test guest is unavailable: {e}"));
    let out = runner
        .run(&cmds, Duration::from_secs(3 * (shape.secs + 200)))
        .expect("guest run");
    println!("{out}");
    for t in &targets {
        t.check(&out, shape);
    }
}
