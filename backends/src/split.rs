//! A large frame split around its largest segment, for the rendezvous of
//! the RDMA and libfabric backends: the segment (the application's bytes)
//! is registered for the peer's reads where it lies, and the rest of the
//! frame — preamble, small segments, CRCs — travels inline in the read
//! request, so the payload is never copied on the sending side. The reader
//! reads the segment into the gap between the inline bytes.

use bytes::{BufMut, Bytes};
use msgr_proto::frame::EncodedFrame;

/// Inline bytes (all of a split frame but its largest segment) at most.
pub(crate) const INLINE_MAX: usize = 1024;

/// An encoded frame as the bytes before its largest segment, the segment,
/// and the bytes after it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct SplitFrame {
    /// The preamble and the segments before `body`.
    pub(crate) head: Vec<u8>,
    /// The largest segment, shared with the application's message.
    pub(crate) body: Bytes,
    /// The segments after `body` and the epilogue.
    pub(crate) tail: Vec<u8>,
}

impl SplitFrame {
    pub(crate) fn len(&self) -> usize {
        self.head.len() + self.body.len() + self.tail.len()
    }

    /// The frame in one buffer, with `spare` bytes of capacity after it
    /// (for the fabric backend's check word).
    pub(crate) fn into_vec(self, spare: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len() + spare);
        v.extend_from_slice(&self.head);
        v.extend_from_slice(&self.body);
        v.extend_from_slice(&self.tail);
        v
    }

    /// The bytes around the body, head first, and where the body goes
    /// among them.
    pub(crate) fn inline(&self) -> (Vec<u8>, usize) {
        let mut v = Vec::with_capacity(self.head.len() + self.tail.len());
        v.extend_from_slice(&self.head);
        v.extend_from_slice(&self.tail);
        (v, self.head.len())
    }
}

/// Splits `enc` around its largest segment when all else is at most
/// [`INLINE_MAX`] bytes; else gives it back.
// `Err` hands the frame back as it came (no error to report), only for
// frames above the rendezvous threshold: its size does not matter.
#[allow(clippy::result_large_err)]
pub(crate) fn split_frame(mut enc: EncodedFrame) -> Result<SplitFrame, EncodedFrame> {
    let len = enc.len();
    let Some((i, n)) = enc
        .segments
        .iter()
        .enumerate()
        .max_by_key(|(_, s)| s.len())
        .map(|(i, s)| (i, s.len()))
    else {
        return Err(enc);
    };
    if n == 0 || len - n > INLINE_MAX {
        return Err(enc);
    }
    let body = std::mem::take(&mut enc.segments[i]);
    let mut head = Vec::with_capacity(len - n);
    head.put_slice(&enc.preamble);
    for s in &enc.segments[..i] {
        head.put_slice(s);
    }
    let mut tail = Vec::with_capacity(len - n - head.len());
    for s in &enc.segments[i + 1..] {
        tail.put_slice(s);
    }
    tail.put_slice(enc.epilogue());
    Ok(SplitFrame { head, body, tail })
}

/// Where a read of `len` bytes lands among `inline` bytes at `at`: the
/// whole unit's length, if `at` lies within them and the unit within
/// `max_frame`. (The libfabric descriptor checks the same and more — a
/// check word — with a typed error for each case.)
#[cfg(any(feature = "verbs", feature = "rdmacm"))]
pub(crate) fn placed_len(len: u64, inline: usize, at: u64, max_frame: u64) -> Option<u64> {
    let total = len.checked_add(inline as u64)?;
    (at <= inline as u64 && len > 0 && total <= max_frame).then_some(total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use msgr_proto::{Frame, Tag};

    fn frame(segs: &[usize]) -> Frame {
        Frame::new(
            Tag::Message,
            segs.iter()
                .enumerate()
                .map(|(k, &n)| Bytes::from((0..n).map(|i| (i + k) as u8).collect::<Vec<_>>())),
        )
    }

    #[test]
    fn split_frames_put_back_together_are_the_frame() {
        for segs in [&[40, 0, 1 << 20][..], &[40, 300, 100_000, 12], &[200_000]] {
            let f = frame(segs);
            let want = f.encode_to_vec().unwrap();
            let s = split_frame(f.into_encoded().unwrap()).expect("split");
            assert_eq!(s.len(), want.len());
            let (inline, at) = s.inline();
            let mut got = inline[..at].to_vec();
            got.extend_from_slice(&s.body);
            got.extend_from_slice(&inline[at..]);
            assert!(got == want, "{segs:?}");
        }
    }

    #[test]
    fn frames_whose_rest_does_not_fit_inline_stay_whole() {
        let f = frame(&[40, INLINE_MAX, 1 << 20]);
        assert!(split_frame(f.into_encoded().unwrap()).is_err());
        let f = frame(&[0]);
        assert!(split_frame(f.into_encoded().unwrap()).is_err());
    }

    #[test]
    #[cfg(any(feature = "verbs", feature = "rdmacm"))]
    fn placements_outside_the_inline_bytes_or_the_limit_are_refused() {
        assert_eq!(placed_len(100, 8, 4, 1 << 20), Some(108));
        assert_eq!(placed_len(100, 8, 9, 1 << 20), None);
        assert_eq!(placed_len(0, 8, 0, 1 << 20), None);
        assert_eq!(placed_len(1 << 20, 8, 0, 1 << 20), None);
        assert_eq!(placed_len(u64::MAX, 8, 0, u64::MAX), None);
    }
}
