//! What the session engine costs a small message — the layers between the
//! wire format and the application, with no I/O (the engine has none) —
//! against a plain copy of the message's bytes, in the same run:
//!
//! ```text
//! cargo bench -p msgr-proto --bench session
//! ```
//!
//! - `request_reply`: a 64 B message from one open session to the other
//!   and a reply back, each through `send`, `poll_transmit` (the message
//!   goes out as a `MessageFrame`, the ack riding with it), `handle_inbound` and
//!   `poll_message`, the frames handed over as they are (no encoding: that is
//!   `--bench codec`). Two messages, both sides' work for each.
//! - `copy (reference)`: the two messages' 64 bytes copied into a shared
//!   chunk each (`ByteArena`), as a message transport copies a small unit
//!   out of its receive slot.

use std::hint::black_box;
use std::time::Instant;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion};
use msgr_addr::{EntityAddr, EntityName};
use msgr_proto::arena::ByteArena;
use msgr_proto::{LinkId, LocalIdentity, Message, Policy, Session, SessionConfig, SessionEvent};

/// Everything `from` has to send on its link, delivered to `to` on `link`.
fn hand_over(from: &mut Session, to: &mut Session, link: LinkId, now: Instant) {
    while let Some((_, t)) = from.poll_transmit(now) {
        to.handle_inbound(link, t.into(), now)
            .expect("a valid unit");
    }
}

/// A client session and the server session it opened, both past the
/// handshake.
fn open_pair(now: Instant) -> (Session, Session) {
    let cfg = SessionConfig::default();
    let addr = |port| EntityAddr::tcp(([127, 0, 0, 1], port).into()).with_nonce(u64::from(port));
    let server_addr = addr(2);
    let mut client = Session::connect(
        cfg.clone(),
        LocalIdentity {
            name: EntityName::client(1),
            addr: addr(1),
            dials: Default::default(),
        },
        server_addr.clone(),
        Policy::LosslessClient,
        now,
    );
    let (to_client, to_server) = (LinkId(1), LinkId(2));
    client.link_up(to_client, now);
    let mut server = Session::accept(
        cfg,
        LocalIdentity {
            name: EntityName::server(1),
            addr: server_addr,
            dials: Default::default(),
        },
        to_server,
        now,
    );
    for _ in 0..8 {
        hand_over(&mut client, &mut server, to_server, now);
        while let Some(ev) = server.poll_event() {
            if matches!(ev, SessionEvent::Identified(_)) {
                server.accept_new(7, now);
            }
        }
        hand_over(&mut server, &mut client, to_client, now);
        while client.poll_event().is_some() {}
        if client.is_open() && server.is_open() {
            return (client, server);
        }
    }
    panic!("the handshake did not finish");
}

/// The next message `s` delivers (past any event before it).
fn delivered(s: &mut Session) -> Message {
    loop {
        if let Some(m) = s.poll_message() {
            return m;
        }
        s.poll_event().expect("a message delivered");
    }
}

fn small_message(c: &mut Criterion) {
    let now = Instant::now();
    let (mut client, mut server) = open_pair(now);
    let (to_client, to_server) = (LinkId(1), LinkId(2));
    let request = Message::new(7, Bytes::new(), vec![5u8; 64]);
    let reply = Message::new(8, Bytes::new(), vec![6u8; 64]);
    let mut g = c.benchmark_group("session_64B");
    g.bench_function("request_reply", |b| {
        b.iter(|| {
            client.send(black_box(&request).clone()).expect("room");
            hand_over(&mut client, &mut server, to_server, now);
            let got = delivered(&mut server);
            server.send(black_box(&reply).clone()).expect("room");
            hand_over(&mut server, &mut client, to_client, now);
            (got, delivered(&mut client))
        })
    });
    let mut arena = ByteArena::new(16 << 10);
    g.bench_function("copy (reference)", |b| {
        b.iter(|| {
            (
                arena.copy(black_box(&request.data)),
                arena.copy(black_box(&reply.data)),
            )
        })
    });
    g.finish();
}

criterion_group!(benches, small_message);
criterion_main!(benches);
