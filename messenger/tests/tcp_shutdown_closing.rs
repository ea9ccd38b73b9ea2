//! Shutdown while a link is still closing: a session ended (marked down)
//! while its link still had output queued, to a peer that had stopped
//! reading, so the link's close-after-flush could not complete at once.
//! Shutdown must wait for such a link as it does for sessions, and abort
//! (and count) it at the deadline: never leave it behind (issue 48, "client
//! shutdown leaked 1 link(s)").

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use msgr::{Connection, ConnectionState, Dispatcher, Message, Messenger, MessengerConfig};

/// A server dispatcher whose first delivery blocks its worker (so that it
/// reads nothing more from its sockets) until the gate opens.
#[derive(Default)]
struct Gate {
    open: Mutex<bool>,
    opened: Condvar,
    entered: AtomicU64,
}

impl Gate {
    fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.opened.notify_all();
    }
}

impl Dispatcher for Gate {
    fn on_message(&self, _conn: &Connection, _msg: Message) {
        self.entered.fetch_add(1, Ordering::SeqCst);
        let open = self.open.lock().unwrap();
        // Bounded: a test that fails does not hold the worker for ever.
        let _ = self
            .opened
            .wait_timeout_while(open, Duration::from_secs(60), |open| !*open);
    }
}

/// Opens the gate when dropped, unless disarmed: a failing assertion does
/// not leave the server's worker blocked (and its shutdown waiting) for
/// the gate's own bound.
struct OpenOnDrop<'a>(&'a Gate, bool);

impl Drop for OpenOnDrop<'_> {
    fn drop(&mut self) {
        if self.1 {
            self.0.open();
        }
    }
}

fn config() -> MessengerConfig {
    let mut cfg = fast_config();
    // The blocked server sends no keepalive: the client must not give up
    // on it while the test sets the window up.
    cfg.session.keepalive_interval = Duration::from_secs(1);
    cfg.session.keepalive_timeout = Duration::from_secs(120);
    // Nothing is acknowledged while the server is blocked: room for more
    // than the kernel's buffers hold (their ceilings are tens of MiB).
    cfg.session.max_in_flight_bytes = 1 << 30;
    cfg.session.max_queued_bytes = 1 << 30;
    // One message larger than the kernel's buffers must sit in the link's
    // own queue: priority lanes keep that queue at about a fragment (the
    // session holds the rest), so they are off here.
    cfg.session.max_fragment = 0;
    cfg
}

/// A TCP transport figure of `m`.
fn tcp_stat(m: &Messenger, name: &str) -> u64 {
    m.transport_stats()
        .iter()
        .filter(|s| s.kind == msgr::TransportKind::Tcp)
        .flat_map(|s| s.values.iter())
        .filter(|(n, _)| *n == name)
        .map(|(_, v)| *v)
        .sum()
}

/// What a loopback connection's two kernel buffers can grow to: the
/// sender's `tcp_wmem` ceiling and the receiver's `tcp_rmem` one (64 MiB
/// if they cannot be read).
fn kernel_buffer_ceilings() -> u64 {
    let ceiling = |f: &str| {
        std::fs::read_to_string(f)
            .ok()
            .and_then(|t| t.split_whitespace().last()?.parse::<u64>().ok())
    };
    match (
        ceiling("/proc/sys/net/ipv4/tcp_wmem"),
        ceiling("/proc/sys/net/ipv4/tcp_rmem"),
    ) {
        (Some(w), Some(r)) => w + r,
        _ => 64 << 20,
    }
}

/// A client whose only session has ended while its link still holds
/// output the (blocked) server does not read: the link is closing, waiting
/// for its flush, and the session is gone.
fn link_left_closing(gate: &Arc<Gate>) -> (Messenger, Messenger) {
    let srv = server(config(), gate.clone());
    let cli = client(config(), Arc::new(msgr::NullDispatcher));
    let mut guard = OpenOnDrop(gate, true);
    let conn = cli.connect(srv.addr().expect("bound")).unwrap();
    conn.wait_connected(Duration::from_secs(30))
        .expect("connected");
    // Sent until the link's socket takes no more (a full kernel send
    // buffer, the blocked server's window closed): from then on the link's
    // own send queue cannot drain, since the server reads nothing. Each
    // message is larger than both kernel buffers can ever grow to (their
    // autotuning ceilings, tcp_wmem and tcp_rmem: 4 + 32 MiB here), or the
    // link's last output could still drain into them and the link close by
    // itself (a run in ten did, with 4 MiB messages). Bounded.
    let size = (kernel_buffer_ceilings() + (16 << 20)).min(120 << 20);
    let data = Bytes::from(vec![0x5a; size as usize]);
    let mut n = 0;
    let blocked =
        || gate.entered.load(Ordering::SeqCst) >= 1 && tcp_stat(&cli, "write_blocked") == 1;
    while !blocked() {
        assert!(
            n < 256,
            "the link never backed up after {n} messages of {size} bytes"
        );
        n += 1;
        send(&conn, probe_message_of(1, n, data.clone()));
        // Each message is handed over at once if there is room: wait for
        // that (or the backed-up link) before sending more.
        wait_until(Duration::from_secs(10), || {
            blocked() || cli.counters().tx_bytes.load(Ordering::Relaxed) >= n * size
        });
    }
    conn.mark_down();
    assert!(
        wait_until(Duration::from_secs(30), || {
            conn.state() == ConnectionState::Closed
                && cli.memory().sessions == 0
                && tcp_stat(&cli, "links") == 1
        }),
        "the session ended, its link still closing: state {:?}, sessions {}, links {}",
        conn.state(),
        cli.memory().sessions,
        tcp_stat(&cli, "links")
    );
    guard.1 = false;
    (srv, cli)
}

/// The peer never takes the link's last output: shutdown waits to its
/// deadline, then aborts the link and says so; the transport keeps none.
#[test]
fn shutdown_aborts_a_link_still_closing_at_its_deadline() {
    let gate = Arc::new(Gate::default());
    let (mut srv, mut cli) = link_left_closing(&gate);
    let _guard = OpenOnDrop(&gate, true);
    let started = Instant::now();
    let r = cli.shutdown(Duration::from_millis(300));
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "waited for the closing link to its deadline: {:?}, {r:?}",
        started.elapsed()
    );
    assert_eq!(
        (r.leaked_links, r.aborted_links, r.forced_sessions),
        (0, 1, 0),
        "{r:?}"
    );
    gate.open();
    let r = srv.shutdown(Duration::from_secs(10));
    assert_eq!(r.leaked_links, 0, "{r:?}");
}

/// The peer reads again while shutdown waits: the link's flush completes,
/// nothing is aborted, nothing leaks.
#[test]
fn shutdown_waits_for_a_link_closing_after_its_flush() {
    let gate = Arc::new(Gate::default());
    let (mut srv, mut cli) = link_left_closing(&gate);
    let _guard = OpenOnDrop(&gate, true);
    let shutting = std::thread::spawn(move || cli.shutdown(Duration::from_secs(60)));
    gate.open();
    let r = shutting.join().expect("shutdown thread");
    assert_eq!(
        (r.leaked_links, r.aborted_links, r.forced_sessions),
        (0, 0, 0),
        "{r:?}"
    );
    let r = srv.shutdown(Duration::from_secs(10));
    assert_eq!(r.leaked_links, 0, "{r:?}");
}
