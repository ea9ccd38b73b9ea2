//! What AES-256-GCM alone costs per core, by record length: ring (what
//! the secure mode's record layer seals with, `auth::record`) against the
//! RustCrypto `aes-gcm` crate, sealing in place, in the same run:
//!
//! ```text
//! cargo bench -p msgr-proto --bench cipher
//! ```
//!
//! The secure mode's 1 MiB streaming is compared with the crc mode's in
//! `msgr bench --only secure`; this says how much of the difference the
//! cipher itself is (issue 51, item 3).

use std::hint::black_box;

use aes_gcm::aead::{AeadInPlace, KeyInit};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};

fn seal_in_place(c: &mut Criterion) {
    let key = [7u8; 32];
    let ring_key = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &key).expect("a 32-byte key"));
    let rc_key = aes_gcm::Aes256Gcm::new_from_slice(&key).expect("a 32-byte key");
    let mut g = c.benchmark_group("aes-256-gcm seal");
    for len in [1024usize, 16 << 10, 64 << 10, 1 << 20] {
        let mut buf = vec![0x5au8; len];
        g.throughput(Throughput::Bytes(len as u64));
        g.bench_function(BenchmarkId::new("ring", len), |b| {
            b.iter(|| {
                let nonce = Nonce::assume_unique_for_key([1; 12]);
                let tag = ring_key
                    .seal_in_place_separate_tag(nonce, Aad::empty(), black_box(&mut buf[..]))
                    .expect("seal");
                let _ = black_box(tag);
            })
        });
        g.bench_function(BenchmarkId::new("aes-gcm crate", len), |b| {
            b.iter(|| {
                let nonce = aes_gcm::Nonce::from_slice(&[1; 12]);
                let tag = rc_key
                    .encrypt_in_place_detached(nonce, b"", black_box(&mut buf[..]))
                    .expect("seal");
                let _ = black_box(tag);
            })
        });
    }
    g.finish();
}

criterion_group!(benches, seal_in_place);
criterion_main!(benches);
