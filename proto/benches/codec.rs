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
//!
//! And the typed-payload codecs against each other (`codecs_*`): postcard
//! and bincode encoding and decoding a small struct of ids and counts, and
//! an array of 64 Ki `u64`s of every magnitude.

use std::hint::black_box;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion};
use msgr_proto::arena::ByteArena;
use msgr_proto::message::MessageFrame;
use msgr_proto::{Bincode, Codec, Frame, FrameLimits, Inbound, Message, Postcard, Transmit};
use serde::{de::DeserializeOwned, Deserialize, Serialize};

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

/// A typical small request: ids, counts, a short name.
#[derive(Serialize, Deserialize)]
struct Small {
    id: u64,
    shard: u32,
    offset: u64,
    len: u32,
    name: String,
}

/// `value` encoded and decoded with each codec, in group `group`.
fn codecs_on<T: Serialize + DeserializeOwned>(c: &mut Criterion, group: &str, value: &T) {
    fn one<C: Codec, T: Serialize + DeserializeOwned>(
        g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
        name: &str,
        codec: C,
        value: &T,
    ) {
        let bytes = codec.encode(value).expect("encodes");
        eprintln!("{name}: {} bytes", bytes.len());
        g.bench_function(format!("{name} encode"), |b| {
            b.iter(|| codec.encode(black_box(value)).expect("encodes"))
        });
        g.bench_function(format!("{name} decode"), |b| {
            b.iter(|| codec.decode::<T>(black_box(&bytes)).expect("decodes"))
        });
    }
    let mut g = c.benchmark_group(group);
    one(&mut g, "postcard", Postcard, value);
    one(&mut g, "bincode", Bincode, value);
    g.finish();
}

fn codecs(c: &mut Criterion) {
    let small = Small {
        id: 12_345,
        shard: 7,
        offset: 1 << 20,
        len: 4096,
        name: "object-17".into(),
    };
    codecs_on(c, "codecs_small_struct", &small);
    // Every magnitude, as counters and offsets have: varints of 1 to 10 bytes.
    let array: Vec<u64> = (0..65_536u64)
        .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (i % 64))
        .collect();
    codecs_on(c, "codecs_u64x64Ki", &array);
}

criterion_group!(benches, small_message, codecs);
criterion_main!(benches);
