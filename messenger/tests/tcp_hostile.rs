//! Hostile input over raw sockets: each bad connection gets a typed error (counted
//! as a protocol error) and is closed, while a well-behaved client keeps being
//! served and memory stays bounded.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use msgr::{ConnectionState, Policy};
use msgr_proto::banner::{Banner, BANNER_LEN};
use msgr_proto::frame::{Frame, Preamble, Tag, MAX_SEGMENTS};

fn raw(addr: &msgr::EntityAddr) -> TcpStream {
    let s = TcpStream::connect(addr.socket).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.set_nodelay(true).unwrap();
    s
}

/// Reads until EOF or reset; panics if the server keeps the connection open
/// past the read timeout.
fn assert_closed_by_server(mut s: TcpStream, what: &str) {
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return,
            Err(e) => panic!("{what}: server did not close the connection: {e}"),
        }
    }
}

fn read_banner(s: &mut TcpStream) {
    let mut b = [0u8; BANNER_LEN];
    s.read_exact(&mut b).expect("server banner");
    Banner::decode(&b).expect("server speaks msgr");
}

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

#[test]
fn hostile_peers_are_closed_and_good_ones_keep_being_served() {
    let rec = Recorder::new();
    let mut cfg = fast_config();
    cfg.session.handshake_timeout = Duration::from_millis(500);
    let mut srv = server(cfg, rec.clone());
    let addr = srv.addr().clone();

    // A well-behaved client streams throughout.
    let mut cli = client(fast_config(), Arc::new(msgr::NullDispatcher));
    let good = cli.connect_with(&addr, Policy::LosslessClient).unwrap();
    let mut n = 0u64;
    let mut good_round = |count: u64| {
        for _ in 0..count {
            n += 1;
            send(&good, probe_message(1, n, 256));
        }
        let want = n;
        assert!(
            wait_until(Duration::from_secs(10), || rec.delivered(1) == want),
            "good client starved: {} of {want}",
            rec.delivered(1)
        );
    };
    good_round(100);
    let rss_before = rss_kib();
    let errors = || srv_errors(&srv);
    let mut expected_errors = errors();

    // 1. Not msgr at all.
    let mut s = raw(&addr);
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    s.write_all(&[0u8; 8]).unwrap();
    assert_closed_by_server(s, "wrong banner");
    expected_errors += 1;
    good_round(100);

    // 2. msgr, but a protocol version from the future.
    let mut s = raw(&addr);
    s.write_all(&Banner { version: 99, ..Banner::default() }.encode()).unwrap();
    assert_closed_by_server(s, "incompatible version");
    expected_errors += 1;
    good_round(100);

    // 3. A frame claiming 4 GiB: refused from its preamble, nothing allocated.
    let mut s = raw(&addr);
    read_banner(&mut s);
    s.write_all(&Banner::default().encode()).unwrap();
    let huge = Preamble {
        tag: Tag::Message,
        flags: 0,
        segment_count: 3,
        segment_lens: [32, u32::MAX, u32::MAX, 0],
    };
    assert_eq!(huge.segment_lens.len(), MAX_SEGMENTS);
    s.write_all(&huge.encode()).unwrap();
    assert_closed_by_server(s, "4 GiB frame");
    expected_errors += 1;
    good_round(100);

    // 4. A frame whose segment CRC is wrong.
    let mut s = raw(&addr);
    read_banner(&mut s);
    s.write_all(&Banner::default().encode()).unwrap();
    let mut f = Frame::single(Tag::Hello, Bytes::from_static(b"not really a hello")).encode_to_vec().unwrap();
    let last = f.len() - 1;
    f[last] ^= 0xff;
    s.write_all(&f).unwrap();
    assert_closed_by_server(s, "corrupted crc");
    expected_errors += 1;
    good_round(100);

    // 5. A truncated frame, then silence: the handshake deadline closes it.
    let mut s = raw(&addr);
    read_banner(&mut s);
    s.write_all(&Banner::default().encode()).unwrap();
    let f = Frame::single(Tag::Hello, Bytes::from(vec![1u8; 100])).encode_to_vec().unwrap();
    s.write_all(&f[..f.len() / 2]).unwrap();
    assert_closed_by_server(s, "truncated frame");
    good_round(100);

    // 6. A well-formed frame that makes no sense here (a message before hello).
    let mut s = raw(&addr);
    read_banner(&mut s);
    s.write_all(&Banner::default().encode()).unwrap();
    let m = msgr::Message::new(1, Bytes::from_static(b"x"), Bytes::new()).to_frame(0);
    s.write_all(&m.encode_to_vec().unwrap()).unwrap();
    assert_closed_by_server(s, "message before hello");
    expected_errors += 1;
    good_round(100);

    assert!(
        wait_until(Duration::from_secs(5), || errors() >= expected_errors),
        "every bad connection counted as a protocol error: {} < {expected_errors}",
        errors()
    );
    let grown = rss_kib().saturating_sub(rss_before);
    assert!(grown < 64 * 1024, "memory stayed bounded (grew {grown} KiB)");
    assert_eq!(good.state(), ConnectionState::Open, "the good client was never disturbed");
    rec.assert_clean();
    assert!(rec.resets.lock().unwrap().is_empty());
    cli.shutdown(Duration::from_secs(5));
    srv.shutdown(Duration::from_secs(5));
}

fn srv_errors(srv: &msgr::Messenger) -> u64 {
    srv.counters().protocol_errors.load(Ordering::Relaxed)
}
