//! A worker confined to one CPU that a busy thread also wants stops
//! spinning for a while and sleeps on its wait fds (the worker's `spin`
//! module says why). A test binary of its own: it keeps one CPU busy.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use nix::sched::{sched_setaffinity, CpuSet};
use nix::unistd::Pid;

#[test]
fn a_pinned_worker_sharing_its_cpu_with_a_busy_thread_stops_spinning() {
    let cpu = *msgr::allowed_cpus().first().expect("a CPU to run on");
    // The server's one worker on `cpu`, spinning long after each message.
    let mut cfg = fast_config();
    cfg.set("worker_cpus", &cpu.to_string()).unwrap();
    cfg.busy_poll = Duration::from_millis(200);
    cfg.busy_poll_max = Duration::from_millis(200);
    let rec = Recorder::new();
    let mut srv = server(cfg, rec.clone());
    let mut cli = client(fast_config(), Arc::new(msgr::NullDispatcher));
    let conn = cli.connect(srv.addr().expect("bound")).unwrap();

    // A thread that wants `cpu` all the time, for at most 20 s.
    let stop = Arc::new(AtomicBool::new(false));
    let hog = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut set = CpuSet::new();
            set.set(cpu).expect("cpu");
            sched_setaffinity(Pid::from_raw(0), &set).expect("pin the busy thread");
            let end = std::time::Instant::now() + Duration::from_secs(20);
            while !stop.load(Ordering::Relaxed) && std::time::Instant::now() < end {
                std::hint::spin_loop();
            }
        })
    };
    // Messages keep the worker busy-polling, and so yielding to the thread.
    let mut sent = 0u64;
    let paused = wait_until(Duration::from_secs(15), || {
        sent += 1;
        send(&conn, probe_message(1, sent, 64));
        srv.counters().spin_pauses.load(Ordering::Relaxed) > 0
    });
    stop.store(true, Ordering::Relaxed);
    hog.join().expect("busy thread");
    let delivered = wait_until(Duration::from_secs(30), || rec.delivered(1) == sent);
    rec.assert_clean();
    cli.shutdown(Duration::from_secs(5));
    srv.shutdown(Duration::from_secs(5));
    assert!(
        paused,
        "no spin pause in 15 s of {sent} messages with a busy thread on CPU {cpu}"
    );
    assert!(delivered, "delivered {} of {sent}", rec.delivered(1));
}
