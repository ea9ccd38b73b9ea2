//! What priority lanes' fragments cost a large message, without I/O:
//! cutting it into 64 KiB fragments, encoding each frame (preamble,
//! headers, CRC32C of every piece) and decoding and reassembling them,
//! against the same message as one `Message` frame encoded and decoded:
//!
//! ```text
//! cargo bench -p msgr-proto --bench fragment
//! ```
//!
//! The difference is the price of letting a class above interleave: the
//! reassembly's one copy of the body and a frame per 64 KiB. First figures
//! (this 2-core VM, shared with other builds, so noisy): 1 MiB 254 µs
//! against 134 µs (3.8 against 7.3 GiB/s), 16 MiB 8.6 ms against 7.3 ms;
//! both sides include encoding into a `Vec` and both CRC passes.

use std::hint::black_box;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use msgr_proto::fragment::{Fragment, Fragmenter, Reassembler, DEFAULT_MAX_FRAGMENT};
use msgr_proto::{Frame, FrameLimits, Message, Priority};

fn large_message(c: &mut Criterion) {
    let limits = FrameLimits::default();
    let mut g = c.benchmark_group("large message");
    g.sample_size(10);
    for len in [1usize << 20, 16 << 20] {
        let data: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
        let mut m = Message::new(1, Bytes::new(), data).with_class(Priority::Background);
        m.seq = 1;
        g.throughput(Throughput::Bytes(len as u64));
        g.bench_with_input(BenchmarkId::new("fragments", len), &m, |b, m| {
            b.iter(|| {
                let mut r = Reassembler::for_limits(&limits);
                let mut out = None;
                for f in Fragmenter::new(m.clone(), 0, DEFAULT_MAX_FRAGMENT).unwrap() {
                    let wire = Bytes::from(f.into_frame().encode_to_vec().unwrap());
                    let frame = Frame::decode_exact(wire, &limits).unwrap();
                    out = r.push(Fragment::from_frame(frame).unwrap()).unwrap();
                }
                black_box(out)
            })
        });
        g.bench_with_input(BenchmarkId::new("one message frame", len), &m, |b, m| {
            b.iter(|| {
                let wire = Bytes::from(m.to_frame(0).encode_to_vec().unwrap());
                let frame = Frame::decode_exact(wire, &limits).unwrap();
                black_box(Message::from_frame(frame).unwrap())
            })
        });
    }
    g.finish();
}

criterion_group!(benches, large_message);
criterion_main!(benches);
