//! A worker never spins while idle, however far traffic widened its busy-poll
//! window (`busy_poll_max_us`). Alone in its own test binary: it reads the
//! process's CPU time.

mod common;

use std::time::Duration;

use common::*;
use msgr::MessengerConfig;

/// Clock ticks per second of `/proc/<pid>/stat` times (`USER_HZ`, 100 on
/// Linux).
const TICKS_PER_SECOND: u64 = 100;

/// CPU time (user + system) this process has used, in clock ticks.
fn cpu_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("read /proc/self/stat");
    // The command name may hold spaces: fields are counted after its ')'.
    let rest = &stat[stat.rfind(')').expect("comm field") + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line, 12 and 13 here.
    let field = |i: usize| -> u64 { fields[i].parse().expect("numeric time field") };
    field(11) + field(12)
}

/// Runs a ping-pong whose gaps (0.7 ms) are longer than the base window
/// (200 µs) and shorter than the widest (2 ms), so both sides' windows widen,
/// and returns the CPU ticks the process used in the second after it.
fn idle_cpu_after_gappy_traffic(cfg: MessengerConfig) -> u64 {
    let srv = server(cfg.clone(), Recorder::echoing());
    let rec = Recorder::new();
    let cli = client(cfg, rec.clone());
    let conn = cli.connect(srv.addr().expect("bound")).expect("connect");
    for n in 1..=300 {
        send(&conn, probe_message(1, n, 64));
        std::thread::sleep(Duration::from_micros(700));
    }
    assert!(
        wait_until(Duration::from_secs(10), || rec.delivered(1) == 300),
        "echoes arrived: {}",
        rec.delivered(1)
    );
    rec.assert_clean();
    // The widest window is 2 ms: well past it, nothing may still spin.
    std::thread::sleep(Duration::from_millis(100));
    let before = cpu_ticks();
    std::thread::sleep(Duration::from_secs(1));
    let used = cpu_ticks() - before;
    drop((conn, cli, srv));
    used
}

#[test]
fn workers_stop_spinning_once_traffic_stops() {
    let used = idle_cpu_after_gappy_traffic(MessengerConfig::default());
    // A worker spinning through the second would use ~TICKS_PER_SECOND.
    assert!(
        used <= TICKS_PER_SECOND / 5,
        "two idle messengers used {used} ticks of CPU in one second \
         (at most {} allowed): a worker kept spinning",
        TICKS_PER_SECOND / 5
    );
}
