#![no_main]
//! The body lives in msgr_proto::sim::fuzz::fragment_decode so `cargo test` replays the corpus.
libfuzzer_sys::fuzz_target!(|data: &[u8]| msgr_proto::sim::fuzz::fragment_decode(data));
