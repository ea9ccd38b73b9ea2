//! What the wire format costs a small message, against the one copy every
//! message transport makes anyway (a received unit copied out of its
//! receive slot), in the same run:
//!
//! ```text
//! cargo bench -p msgr-proto --bench codec
//! ```
//!
//! - `encode`: a 64 B message into a frame (header segment from an arena,
//!   the data shared) and into wire bytes (preamble, segments, epilogue with
//!   their CRC32Cs), as the session and a message transport do per send.
//! - `decode`: the wire bytes copied out (as from a receive slot), checked
//!   and cut into segments, then into the message, as per receive.
//! - `copy` (the reference): the same bytes copied into the receive arena.

use std::hint::black_box;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion};
use msgr_proto::arena::ByteArena;
use msgr_proto::{Frame, FrameLimits, Message};

fn small_message(c: &mut Criterion) {
    let limits = FrameLimits::default();
    let msg = Message::new(7, Bytes::new(), vec![5u8; 64]);
    let wire = msg.to_frame(1).encode_to_vec().expect("encodes");
    let mut headers = ByteArena::new(4096);
    let mut tx = ByteArena::new(16 << 10);
    let mut rx = ByteArena::new(16 << 10);
    let mut g = c.benchmark_group("message_64B");
    g.bench_function("encode", |b| {
        let mut ack = 0u64;
        b.iter(|| {
            ack += 1;
            let f = black_box(&msg).to_frame_in(ack, &mut headers);
            f.encode_in(&mut tx).expect("encodes")
        })
    });
    g.bench_function("decode", |b| {
        b.iter(|| {
            let unit = rx.copy(black_box(&wire));
            let f = Frame::decode_exact(unit, &limits).expect("decodes");
            Message::from_frame(f).expect("a message")
        })
    });
    g.bench_function("copy (reference)", |b| b.iter(|| rx.copy(black_box(&wire))));
    g.finish();
}

criterion_group!(benches, small_message);
criterion_main!(benches);
