//! Shutdown with messages in flight; leak checks. Alone in its own test binary
//! so that thread and socket counts are this test's own.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use msgr::ConnectionState;

/// Shutdown with messages in flight drains them (or reports what it could not
/// deliver) and leaks no thread or socket.
#[test]
fn shutdown_drains_or_reports_and_leaks_nothing() {
    let threads_before = thread_count();
    let rec = Recorder::new();
    let mut srv = server(fast_config(), rec.clone());
    let mut cli = client(fast_config(), Arc::new(msgr::NullDispatcher));
    let conn = cli.connect(srv.addr().expect("bound")).unwrap();
    for n in 1..=5000 {
        send(&conn, probe_message(1, n, 2000));
    }
    let r = cli.shutdown(Duration::from_secs(10));
    assert_eq!(r.undelivered, 0, "drained within the deadline: {r:?}");
    assert_eq!(r.leaked_links, 0);
    assert!(wait_until(Duration::from_secs(5), || rec.delivered(1) == 5000));
    rec.assert_clean();

    // A peer that hangs: nothing can be acknowledged, so shutdown gives up at
    // its deadline and reports every queued message as undelivered.
    let mut cli2 = client_named(2, fast_config(), Arc::new(msgr::NullDispatcher));
    let conn2 = cli2.connect(srv.addr().expect("bound")).unwrap();
    assert!(wait_until(Duration::from_secs(5), || conn2.state()
        == ConnectionState::Open));
    let hung = srv
        .connections()
        .into_iter()
        .find(|c| c.peer().is_some_and(|p| &p.name == cli2.name()));
    hung.expect("server side of cli2")
        .inject_fault(msgr::RealFault::Freeze);
    std::thread::sleep(Duration::from_millis(50));
    for n in 1..=100 {
        conn2.send(probe_message(9, n, 10)).unwrap();
    }
    let started = std::time::Instant::now();
    let r = cli2.shutdown(Duration::from_millis(500));
    // Without its deadline shutdown would wait on the frozen link for
    // ever; the bound only tells that from a busy machine's slowness.
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "shutdown honours its deadline"
    );
    assert_eq!(r.undelivered, 100, "{r:?}");
    assert_eq!(r.forced_sessions, 1, "{r:?}");
    assert_eq!(r.leaked_links, 0);
    let r = srv.shutdown(Duration::from_secs(2));
    assert_eq!(r.leaked_links, 0);
    drop((cli, cli2, srv));
    assert!(
        wait_until(Duration::from_secs(5), || thread_count() <= threads_before),
        "worker threads exited ({} > {threads_before})",
        thread_count()
    );
    assert_eq!(open_sockets(), 0, "no socket left open");
}

fn thread_count() -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Sockets this process holds.
fn open_sockets() -> usize {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return 0;
    };
    dir.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|p| p.to_string_lossy().starts_with("socket:"))
        .count()
}
