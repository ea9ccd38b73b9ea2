//! The bodies of the cargo-fuzz targets in `fuzz/`, as plain functions.
//!
//! Each target is `fn(&[u8])` and panics only when it finds a bug (a decoder
//! panicking, a round trip that does not hold, an engine invariant broken).
//! Keeping them here, not in the fuzz crate, lets a normal `cargo test`
//! replay every committed corpus and regression input without a fuzzer
//! (`tests/fuzz_corpus_replay.rs`). [`seed_corpus`] writes the seeds.
//!
//! Inputs of the structure-aware targets (`session_engine`, `message_decode`,
//! `frame_decode` in its structured modes) are read with a tiny [`Reader`]:
//! every byte string is a valid input, short inputs read as zeros.
//!
//! # Layers
//!
//! One file per target (or a few related ones), bottom first:
//!
//! 1. `addr`, `frame`, `rma`: addresses; banners, preambles and frames
//!    (and the frame limits and helpers the targets above share); RMA
//!    payloads.
//! 2. `auth`, `fragment`, `message`: the handshake and sealed frames;
//!    fragment frames and their reassembly; messages, control payloads and
//!    batches.
//! 3. `session`: the session engine driven by a script.
//! 4. `seeds`: the seed corpus of every target.

mod addr;
mod auth;
mod fragment;
mod frame;
mod message;
mod rma;
mod seeds;
mod session;

pub use addr::addr_parse;
pub use auth::{auth_handshake, fuzz_credentials, sealed_decode};
pub use fragment::{by_class, fragment_decode, number_per_class};
pub use frame::{banner, frame_decode, frame_preamble};
pub use message::{batch_decode, message_decode, SampleKind, SamplePayload};
pub use rma::rma_decode;
pub use seeds::{sample_frames, seed_corpus};
pub use session::{session_engine, Op};

/// Names of all targets, as in `fuzz/Cargo.toml` and `fuzz/corpus/<name>/`.
pub const TARGETS: &[&str] = &[
    "frame_preamble",
    "frame_decode",
    "banner",
    "session_engine",
    "message_decode",
    "addr_parse",
    "batch_decode",
    "auth_handshake",
    "sealed_decode",
    "rma_decode",
    "fragment_decode",
];

/// Runs the target called `name` on `data`. Returns false for an unknown name.
pub fn run(name: &str, data: &[u8]) -> bool {
    match name {
        "frame_preamble" => frame_preamble(data),
        "frame_decode" => frame_decode(data),
        "banner" => banner(data),
        "session_engine" => session_engine(data),
        "message_decode" => message_decode(data),
        "addr_parse" => addr_parse(data),
        "batch_decode" => batch_decode(data),
        "auth_handshake" => auth_handshake(data),
        "sealed_decode" => sealed_decode(data),
        "rma_decode" => rma_decode(data),
        "fragment_decode" => fragment_decode(data),
        _ => return false,
    }
    true
}

/// Reads fuzz input; past the end it yields zeros, so every input is valid.
#[derive(Debug)]
pub struct Reader<'a> {
    data: &'a [u8],
}

impl<'a> Reader<'a> {
    /// Reads `data` from the start.
    pub fn new(data: &'a [u8]) -> Self {
        Reader { data }
    }

    /// Whether all input was read.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// One byte (0 past the end).
    pub fn u8(&mut self) -> u8 {
        match self.data.split_first() {
            Some((b, rest)) => {
                self.data = rest;
                *b
            }
            None => 0,
        }
    }

    /// A little-endian u16.
    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    /// A little-endian u32.
    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }

    /// A little-endian u64.
    pub fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | (u64::from(self.u32()) << 32)
    }

    /// Up to `n` bytes (fewer at the end of input).
    pub fn bytes(&mut self, n: usize) -> &'a [u8] {
        let n = n.min(self.data.len());
        let (head, rest) = self.data.split_at(n);
        self.data = rest;
        head
    }

    /// A length-prefixed byte string (one length byte).
    pub fn short_bytes(&mut self) -> &'a [u8] {
        let n = usize::from(self.u8());
        self.bytes(n)
    }

    /// Everything left.
    pub fn rest(&mut self) -> &'a [u8] {
        self.bytes(self.data.len())
    }
}

#[cfg(test)]
mod tests {
    use super::seeds::session_scripts;
    use super::*;

    #[test]
    fn ops_round_trip_through_bytes() {
        for (_, _, ops) in session_scripts() {
            let mut v = Vec::new();
            for op in &ops {
                op.write(&mut v);
            }
            let mut r = Reader::new(&v);
            let back: Vec<Op> =
                std::iter::from_fn(|| (!r.is_empty()).then(|| Op::read(&mut r))).collect();
            assert_eq!(back, ops);
        }
    }
}
