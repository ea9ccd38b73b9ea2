//! What a CRC32C costs by input length: msgr's `checksum::crc32c` (which
//! picks an implementation by the CPU and the length) against each of the
//! two implementations it picks from, in the same run:
//!
//! ```text
//! cargo bench -p msgr-proto --bench checksum
//! ```
//!
//! Where `crc-fast` folds with AVX-512 msgr's figure should be its figure
//! at every length; where it folds with SSE, its figure below 256 bytes
//! and the `crc32c` crate's from there (the module docs of
//! `msgr_proto::checksum` say what was measured).

use std::hint::black_box;

use crc_fast::CrcAlgorithm;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

fn by_length(c: &mut Criterion) {
    let data: Vec<u8> = (0..1usize << 20).map(|i| (i * 31 % 251) as u8).collect();
    let mut g = c.benchmark_group("crc32c");
    for len in [64usize, 512, 4096, 65536, 1 << 20] {
        let d = &data[..len];
        g.throughput(Throughput::Bytes(len as u64));
        g.bench_with_input(BenchmarkId::new("msgr", len), d, |b, d| {
            b.iter(|| msgr_proto::checksum::crc32c(black_box(d)))
        });
        g.bench_with_input(BenchmarkId::new("crc-fast", len), d, |b, d| {
            b.iter(|| crc_fast::checksum(CrcAlgorithm::Crc32Iscsi, black_box(d)) as u32)
        });
        g.bench_with_input(BenchmarkId::new("crc32c crate", len), d, |b, d| {
            b.iter(|| crc32c::crc32c(black_box(d)))
        });
    }
    g.finish();
}

criterion_group!(benches, by_length);
criterion_main!(benches);
