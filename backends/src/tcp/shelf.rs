//! Buffers of large received frames, taken back when the application drops
//! the frame's last segment and reused for the next large frame.
//!
//! A fresh MiB-sized buffer per frame costs a page fault per 4 KiB as the
//! kernel copies into it (the allocator hands such blocks back to the kernel
//! when they are freed): 5–9% of a 1 MiB stream's CPU, found by perf. A
//! shelf per transport keeps at most [`SHELF_BYTES`] of idle buffers.

use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};

/// Most bytes of idle buffers one shelf keeps; a larger buffer is freed.
pub(crate) const SHELF_BYTES: usize = 8 << 20;

/// Idle receive buffers of one transport.
#[derive(Debug, Default)]
pub(crate) struct RxBufferShelf {
    idle: Mutex<Vec<BytesMut>>,
}

impl RxBufferShelf {
    /// An empty buffer with room for `len` bytes: an idle one that fits
    /// (and is not more than four times too large), else a new one.
    pub(crate) fn take(&self, len: usize) -> BytesMut {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let fits = idle
            .iter()
            .position(|b| b.capacity() >= len && b.capacity() / 4 <= len);
        match fits {
            Some(i) => idle.swap_remove(i),
            None => BytesMut::with_capacity(len),
        }
    }

    /// `buf` (from [`RxBufferShelf::take`]) as `Bytes` whose last drop puts
    /// the buffer back on this shelf.
    pub(crate) fn lend(self: &Arc<Self>, buf: BytesMut) -> Bytes {
        Bytes::from_owner(Shelved {
            buf,
            shelf: self.clone(),
        })
    }

    fn put(&self, mut buf: BytesMut) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let held: usize = idle.iter().map(BytesMut::capacity).sum();
        if held + buf.capacity() <= SHELF_BYTES {
            buf.clear();
            idle.push(buf);
        }
    }

    /// Bytes of idle buffers on the shelf.
    #[cfg(test)]
    pub(crate) fn idle_bytes(&self) -> usize {
        let idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        idle.iter().map(BytesMut::capacity).sum()
    }
}

/// A lent buffer: goes back to its shelf when the last `Bytes` drops.
struct Shelved {
    buf: BytesMut,
    shelf: Arc<RxBufferShelf>,
}

impl AsRef<[u8]> for Shelved {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Shelved {
    fn drop(&mut self) {
        self.shelf.put(std::mem::take(&mut self.buf));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_frame_buffer_is_reused_and_the_shelf_is_bounded() {
        let shelf = Arc::new(RxBufferShelf::default());
        let mut b = shelf.take(1 << 20);
        b.extend_from_slice(&[7u8; 1 << 20]);
        let ptr = b.as_ptr();
        let lent = shelf.lend(b);
        let seg = lent.slice(10..20);
        drop(lent);
        assert_eq!(
            shelf.idle_bytes(),
            0,
            "back on the shelf while a segment lives"
        );
        assert_eq!(&seg[..], &[7u8; 10]);
        drop(seg);
        assert!(shelf.idle_bytes() >= 1 << 20);
        let again = shelf.take(1 << 20);
        assert_eq!(again.as_ptr(), ptr, "the idle buffer was not reused");
        assert!(again.is_empty());
        // Too small a request for it: a buffer of its own.
        let small = shelf.take(64 << 10);
        assert_ne!(small.as_ptr(), ptr);
        // Never more than SHELF_BYTES idle.
        let many: Vec<Bytes> = (0..20)
            .map(|_| {
                let mut b = shelf.take(1 << 20);
                b.extend_from_slice(&[1u8; 1 << 20]);
                shelf.lend(b)
            })
            .collect();
        drop(many);
        assert!(shelf.idle_bytes() <= SHELF_BYTES, "{}", shelf.idle_bytes());
        drop(again);
    }
}
