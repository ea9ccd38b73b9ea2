//! CRC32C (Castagnoli): the checksum of banners, preambles and segments.
//!
//! Two implementations, picked per process by what the CPU offers and per
//! call by the input's length. Where it can multiply without carries
//! (x86-64 PCLMULQDQ/VPCLMULQDQ, AArch64 PMULL), `crc-fast` folds many
//! bytes per step: on x86-64 hosts with AVX-512 it did 74 GB/s on 1 MiB
//! against 21 GB/s for the `crc32c` crate's SSE4.2 loop, and 8 ns against
//! 12 ns on 64 bytes, so it takes every input there. Without AVX-512 it
//! folds 128 bits at a time, and on an AMD EPYC with AVX2 (2026-12-04) that
//! was the slower from 384 bytes up — 108 against 70 ns on 512 B, 520
//! against 272 ns on 4 KiB, 18 against 22 GB/s on 1 MiB — while still the
//! faster below 256 bytes (7 against 11 ns on 64 B): there inputs from
//! `SSE_FOLDING_BELOW` (256) bytes go to `crc32c`. Without carry-less multiply
//! both fall back to tables, and there `crc32c`'s are the faster (0.36
//! against 0.26 GB/s on 1 MiB, 3x on 64 bytes, in the QEMU guest's qemu64
//! CPU), so it takes every input. The choice is made once, on first use.

use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use crc_fast::CrcAlgorithm;

/// The CRC32C of `data`.
///
/// ```
/// assert_eq!(msgr_proto::checksum::crc32c(b"123456789"), 0xe306_9283);
/// ```
pub fn crc32c(data: &[u8]) -> u32 {
    if data.len() < folding_below() {
        // Truncation: a 32-bit CRC's value in crc-fast's u64.
        crc_fast::checksum(CrcAlgorithm::Crc32Iscsi, data) as u32
    } else {
        crc32c::crc32c(data)
    }
}

/// The CRC32C of `a ‖ b` from `a`'s CRC32C, `b`'s and `b`'s length
/// (without reading either): how a message put back together from
/// fragments knows its data's checksum from its pieces'.
///
/// ```
/// use msgr_proto::checksum::{crc32c, crc32c_combine};
/// let (a, b) = (&b"1234"[..], &b"56789"[..]);
/// assert_eq!(crc32c_combine(crc32c(a), crc32c(b), b.len()), crc32c(b"123456789"));
/// assert_eq!(crc32c_combine(0, crc32c(b), b.len()), crc32c(b), "an empty start");
/// ```
pub fn crc32c_combine(a: u32, b: u32, b_len: usize) -> u32 {
    crc32c::crc32c_combine(a, b, b_len)
}

/// Segments of at least this many bytes have their checked CRC32C kept
/// with a received frame (`Frame::known_crc`, its `CrcMemo`): below it,
/// reading the segment again costs less than remembering it.
pub const CRC_MEMO_MIN: usize = 64 << 10;

/// Inputs shorter than this go to `crc-fast` where it folds without
/// AVX-512 (its SSE tiers); longer ones to `crc32c` (see the module docs).
const SSE_FOLDING_BELOW: usize = 256;

/// The CRC32C of one segment of a frame (or of a message's data) worked
/// out earlier — checked on receipt, or computed when a message was
/// sealed ([`crate::Message::with_data_checksum`]) — kept so that sending
/// the same bytes again does not read them again. Reading a large buffer
/// once more costs more than its arithmetic: on a 1 MiB ping-pong over
/// libfabric's `shm` only touching each cache line of the sender's buffer
/// made the peer's copy of it a third slower (docs/BENCHMARKS.md).
///
/// The memo holds a handle to the bytes it vouches for, so their memory
/// cannot be freed and reused while it lives: a segment it is asked about
/// is the same bytes if it starts at the same address with the same
/// length. A memo is a cache, not part of the value it rides with: any
/// two compare equal.
#[derive(Clone, Debug, Default)]
pub(crate) struct CrcMemo(Option<Arc<Memo>>);

#[derive(Debug)]
struct Memo {
    segment: usize,
    bytes: Bytes,
    crc: u32,
}

impl CrcMemo {
    /// No memo.
    pub(crate) const NONE: CrcMemo = CrcMemo(None);

    /// Remembers `crc` as the CRC32C of `bytes`, segment `segment` of its
    /// frame. The caller vouches for it: it computed or checked it over
    /// these very bytes.
    pub(crate) fn new(segment: usize, bytes: &Bytes, crc: u32) -> CrcMemo {
        CrcMemo(Some(Arc::new(Memo {
            segment,
            bytes: bytes.clone(),
            crc,
        })))
    }

    /// The memo of a sender that will send `bytes` (segment `segment` of
    /// its frames) more than once, its CRC32C computed now; none for bytes
    /// shorter than [`CRC_MEMO_MIN`], which cost less to read
    /// again than the memo's shared handle costs every clone and frame.
    pub(crate) fn sealed(segment: usize, bytes: &Bytes) -> CrcMemo {
        if bytes.len() < CRC_MEMO_MIN {
            return CrcMemo::NONE;
        }
        CrcMemo::new(segment, bytes, crc32c(bytes))
    }

    /// The CRC32C of `bytes` as segment `segment`, if remembered.
    pub(crate) fn get(&self, segment: usize, bytes: &[u8]) -> Option<u32> {
        let m = self.0.as_deref()?;
        (m.segment == segment && m.bytes.as_ptr() == bytes.as_ptr() && m.bytes.len() == bytes.len())
            .then_some(m.crc)
    }
}

impl PartialEq for CrcMemo {
    fn eq(&self, _: &CrcMemo) -> bool {
        true
    }
}

impl Eq for CrcMemo {}

/// `crc-fast` computes inputs shorter than this on this CPU, `crc32c` the
/// rest: all of them where crc-fast folds with AVX-512 (or on AArch64),
/// the short ones where it folds with SSE, none where it has no carry-less
/// multiply.
fn folding_below() -> usize {
    static FOLDING_BELOW: OnceLock<usize> = OnceLock::new();
    *FOLDING_BELOW.get_or_init(|| folding_below_for(&calculator()))
}

/// crc-fast's name for its CRC32C path on this CPU (`x86_64-avx512-vpclmulqdq`,
/// `x86-sse-pclmulqdq`, `aarch64-neon-pmull`, `software-fallback-tables`…).
fn calculator() -> String {
    crc_fast::get_calculator_target(CrcAlgorithm::Crc32Iscsi)
}

fn folding_below_for(calculator: &str) -> usize {
    if calculator.starts_with("software") {
        0
    } else if calculator.contains("-sse-") {
        SSE_FOLDING_BELOW
    } else {
        usize::MAX
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn check_value() {
        // The catalogued check value of CRC-32/ISCSI.
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(crc32c(&[]), 0);
        println!(
            "crc32c: crc-fast ({}) below {} bytes, the crc32c crate from there",
            calculator(),
            folding_below()
        );
    }

    #[test]
    fn the_split_follows_the_folding_path() {
        assert_eq!(folding_below_for("x86_64-avx512-vpclmulqdq"), usize::MAX);
        assert_eq!(folding_below_for("aarch64-neon-pmull-sha3"), usize::MAX);
        assert_eq!(folding_below_for("x86-sse-pclmulqdq"), SSE_FOLDING_BELOW);
        assert_eq!(folding_below_for("x86_64-sse-pclmulqdq"), SSE_FOLDING_BELOW);
        assert_eq!(folding_below_for("software-fallback-tables"), 0);
    }

    proptest! {
        /// Both implementations agree on every length and alignment, so
        /// peers that picked differently understand each other.
        #[test]
        fn both_implementations_agree(data in proptest::collection::vec(any::<u8>(), 0..20_000), skip in 0usize..64) {
            let d = &data[skip.min(data.len())..];
            prop_assert_eq!(
                crc_fast::checksum(CrcAlgorithm::Crc32Iscsi, d) as u32,
                crc32c::crc32c(d)
            );
            prop_assert_eq!(crc32c(d), crc32c::crc32c(d));
        }
    }
}
