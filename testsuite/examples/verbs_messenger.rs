//! Two messengers over the verbs backend, in one process (run inside the test
//! guest: `verbs://127.0.0.1:PORT?dev=rxe0`, rxe0 sits on lo).
//!
//! 1. Streams N messages of mixed sizes (0 B .. 200 KiB: small ones in one
//!    send, large ones cut into several chunk-sized sends) with the lossless
//!    policy, and verifies order and bytes on arrival.
//! 2. Halfway through, moves the client's QP to ERR for real
//!    (`inject_fault(Abort)`); the session reconnects and replays, and the
//!    receiver must still see every message exactly once, in order.
//! 3. A 64-byte ping-pong for a latency figure.
//!
//!     verbs_messenger [DEVICE (default rxe0)] [N (default 3000)] [SCHEME (default verbs)]
//!
//! With SCHEME `tcp` the same run goes over the TCP backend: the reference
//! for ratios in the same guest boot.
//!
//! Exits 0 on success; every wait has a deadline.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use msgr::{
    Connection, Dispatcher, EntityAddr, EntityName, FaultReason, Message, Messenger,
    MessengerConfig, Policy, RealFault,
};

fn pattern(n: u64, len: usize) -> Vec<u8> {
    let mut x = n.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0xdead_beef;
    let mut v = Vec::with_capacity(len);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes()[..(len - v.len()).min(8)]);
    }
    v
}

fn size_of(n: u64) -> usize {
    match n % 10 {
        0 => (n as usize * 7919) % (200 << 10),
        1 | 2 => (n as usize * 131) % (40 << 10),
        _ => (n as usize * 17) % 2048,
    }
}

fn message(stream: u32, n: u64, len: usize) -> Message {
    let mut front = Vec::with_capacity(12);
    front.extend_from_slice(&stream.to_le_bytes());
    front.extend_from_slice(&n.to_le_bytes());
    Message::new(7, front, pattern(n, len))
}

#[derive(Default)]
struct Log {
    last: u64,
    delivered: u64,
    duplicates: u64,
    gaps: u64,
    corrupt: u64,
    bytes: u64,
}

#[derive(Default)]
struct Recorder {
    log: Mutex<Log>,
    resets: Mutex<Vec<String>>,
    /// Ping-pong: echoes of stream 2 received (client side).
    pongs: AtomicU64,
    pong_lock: Mutex<()>,
    pong_cv: Condvar,
    echo: bool,
}

impl Dispatcher for Recorder {
    fn on_message(&self, conn: &Connection, msg: Message) {
        let front = &msg.front;
        if front.len() != 12 {
            self.log.lock().unwrap().corrupt += 1;
            return;
        }
        let stream = u32::from_le_bytes(front[..4].try_into().unwrap());
        let n = u64::from_le_bytes(front[4..12].try_into().unwrap());
        if stream == 2 {
            if self.echo {
                let _ = conn.send_timeout(msg, Duration::from_secs(10));
            } else {
                let _g = self.pong_lock.lock().unwrap();
                self.pongs.fetch_add(1, Ordering::Release);
                self.pong_cv.notify_all();
            }
            return;
        }
        let mut l = self.log.lock().unwrap();
        if msg.data.len() != size_of(n) || msg.data[..] != pattern(n, size_of(n))[..] {
            l.corrupt += 1;
        }
        if n <= l.last {
            l.duplicates += 1;
        } else {
            if n != l.last + 1 {
                l.gaps += 1;
            }
            l.last = n;
            l.delivered += 1;
            l.bytes += msg.data.len() as u64;
        }
    }

    fn on_reset(&self, _conn: &Connection, reason: &FaultReason) {
        self.resets.lock().unwrap().push(reason.to_string());
    }
}

fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    cond()
}

fn config() -> MessengerConfig {
    let mut cfg = MessengerConfig::default();
    cfg.session.keepalive_interval = Duration::from_millis(200);
    cfg.session.keepalive_timeout = Duration::from_secs(5);
    cfg.session.handshake_timeout = Duration::from_secs(5);
    cfg.session.backoff_min = Duration::from_millis(1);
    cfg.session.backoff_max = Duration::from_millis(50);
    cfg.busy_poll = Duration::from_micros(200);
    cfg
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dev = args.get(1).map_or("rxe0", String::as_str).to_owned();
    let n: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(3000);
    let scheme = args.get(3).map_or("verbs", String::as_str).to_owned();
    if let Err(e) = run(&dev, n, &scheme) {
        eprintln!("verbs_messenger: FAILED: {e}");
        std::process::exit(1);
    }
    println!("verbs_messenger: OK");
}

fn run(dev: &str, n: u64, scheme: &str) -> Result<(), String> {
    let bind = if scheme == "tcp" {
        "tcp://127.0.0.1:0".to_owned()
    } else {
        format!("verbs://127.0.0.1:0?dev={dev}")
    };
    let bind: EntityAddr = bind.parse().map_err(|e| format!("address: {e}"))?;
    println!("availability: {:?}", msgr::availability(&bind.transport));
    let srv_rec = Arc::new(Recorder {
        echo: true,
        ..Recorder::default()
    });
    let mut srv = Messenger::builder(EntityName::server(1))
        .config(config())
        .bind(bind)
        .start(srv_rec.clone())
        .map_err(|e| format!("start server: {e}"))?;
    let cli_rec = Arc::new(Recorder::default());
    let mut cli = Messenger::builder(EntityName::client(1))
        .config(config())
        .start(cli_rec.clone())
        .map_err(|e| format!("start client: {e}"))?;
    println!("server bound at {}", srv.addr());
    let conn = cli
        .connect_with(srv.addr(), Policy::LosslessClient)
        .map_err(|e| format!("connect: {e}"))?;

    // 1 + 2: the stream, with a real QP abort halfway.
    let t0 = Instant::now();
    let mut sent_bytes = 0u64;
    for i in 1..=n {
        let len = size_of(i);
        sent_bytes += len as u64;
        conn.send_timeout(message(1, i, len), Duration::from_secs(30))
            .map_err(|e| format!("send {i}: {e}"))?;
        if i == n / 2 {
            // Let some of it arrive, then break the QP under the stream.
            wait_until(Duration::from_secs(30), || {
                srv_rec.log.lock().unwrap().delivered >= n / 4
            });
            println!(
                "injecting QP abort after {} delivered",
                srv_rec.log.lock().unwrap().delivered
            );
            conn.inject_fault(RealFault::Abort);
        }
    }
    let ok = wait_until(Duration::from_secs(180), || {
        srv_rec.log.lock().unwrap().delivered >= n
    });
    let elapsed = t0.elapsed();
    {
        let l = srv_rec.log.lock().unwrap();
        println!(
            "stream: delivered {} of {n}, {} bytes (sent {sent_bytes}), duplicates {}, gaps {}, corrupt {}",
            l.delivered, l.bytes, l.duplicates, l.gaps, l.corrupt
        );
        println!(
            "stream: {:.1} ms, {:.0} msg/s, {:.1} MB/s (TCG guest: compare as ratios only)",
            elapsed.as_secs_f64() * 1e3,
            l.delivered as f64 / elapsed.as_secs_f64(),
            l.bytes as f64 / elapsed.as_secs_f64() / 1e6
        );
        if !ok || l.duplicates != 0 || l.gaps != 0 || l.corrupt != 0 || l.bytes != sent_bytes {
            return Err("lossless delivery did not hold".into());
        }
    }
    let reconnects = cli.counters().reconnects.load(Ordering::Relaxed);
    println!(
        "reconnects after the abort: {reconnects}; resets seen: client {:?} server {:?}",
        cli_rec.resets.lock().unwrap(),
        srv_rec.resets.lock().unwrap()
    );
    if reconnects == 0 {
        return Err("the injected QP abort did not cause a reconnect".into());
    }
    if !cli_rec.resets.lock().unwrap().is_empty() {
        return Err("a lossless session was reset".into());
    }

    // 3: ping-pong, 64 B.
    let rounds = 1000u64;
    let mut rtts = Vec::with_capacity(rounds as usize);
    for i in 0..rounds {
        let t = Instant::now();
        conn.send(message(2, i, 64 - 12))
            .map_err(|e| format!("ping: {e}"))?;
        let deadline = t + Duration::from_secs(10);
        let mut g = cli_rec.pong_lock.lock().unwrap();
        while cli_rec.pongs.load(Ordering::Acquire) <= i {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!("ping {i}: no pong"));
            }
            g = cli_rec.pong_cv.wait_timeout(g, left).unwrap().0;
        }
        drop(g);
        rtts.push(t.elapsed());
    }
    rtts.sort();
    println!(
        "ping-pong 64 B x {rounds}: median RTT {:.1} us, p99 {:.1} us (app thread blocks on a condvar)",
        rtts[rtts.len() / 2].as_secs_f64() * 1e6,
        rtts[rtts.len() * 99 / 100].as_secs_f64() * 1e6
    );

    let rc = cli.shutdown(Duration::from_secs(5));
    let rs = srv.shutdown(Duration::from_secs(5));
    println!("shutdown: client {rc:?} server {rs:?}");
    if rc.leaked_links != 0 || rs.leaked_links != 0 {
        return Err("links leaked".into());
    }
    Ok(())
}
