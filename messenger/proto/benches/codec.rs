//! What the wire format costs a small message, against the one copy every
//! message transport makes anyway (a received unit copied out of its
//! receive slot), in the same run:
//!
//! ```text
//! cargo bench -p msgr-proto --bench codec
//! ```
//!
//! - `encode`: a 64 B message (the session's clone of it) written as wire
//!   bytes (preamble, header, front, data, epilogue with their CRC32Cs)
//!   into a send arena, as the session and a message transport do per send.
//! - `encode via Frame`: the same through a [`Frame`] (header segment
//!   copied out, segments collected), the way every send went until
//!   `MessageFrame`; now what a vectored or rendezvous send does.
//! - `decode`: the wire bytes copied out (as from a receive slot), checked
//!   and cut into the message, as per receive; `decode via Frame` the same
//!   through a [`Frame`].
//! - `copy` (the reference): the same bytes copied into the receive arena.

use std::hint::black_box;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion};
use msgr_proto::arena::ByteArena;
use msgr_proto::message::MessageFrame;
use msgr_proto::{Frame, FrameLimits, Inbound, Message, Transmit};

fn small_message(c: &mut Criterion) {
    let limits = FrameLimits::default();
    let msg = Message::new(7, Bytes::new(), vec![5u8; 64]);
    let wire = msg.to_frame(1).encode_to_vec().expect("encodes");
    let mut tx = ByteArena::new(16 << 10);
    let mut rx = ByteArena::new(16 << 10);
    let mut g = c.benchmark_group("message_64B");
    g.bench_function("encode", |b| {
        let mut ack = 0u64;
        b.iter(|| {
            ack += 1;
            let unit = Transmit::Message(MessageFrame::new(black_box(&msg).clone(), ack));
            let checked = unit.checked().expect("encodes");
            tx.fill(unit.encoded_len(), |b| checked.write(b))
        })
    });
    g.bench_function("encode via Frame", |b| {
        let mut ack = 0u64;
        b.iter(|| {
            ack += 1;
            let f = black_box(&msg).to_frame(ack);
            f.encode_in(&mut tx).expect("encodes")
        })
    });
    g.bench_function("decode", |b| {
        b.iter(|| {
            let unit = rx.copy(black_box(&wire));
            match Inbound::decode_exact(unit, &limits).expect("decodes") {
                Inbound::Message(m) => m.msg,
                other => panic!("not a message: {other:?}"),
            }
        })
    });
    g.bench_function("decode via Frame", |b| {
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
