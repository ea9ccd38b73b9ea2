//! Buffers of large received units, taken back when the application drops
//! the unit's last segment and reused for the next one: TCP's frame buffers
//! (`BytesMut`) and the RDMA backends' registered read sinks
//! (`MemoryRegion`, which stay registered on the shelf).
//!
//! A fresh MiB-sized buffer per frame costs a page fault per 4 KiB as the
//! kernel copies into it (the allocator hands such blocks back to the kernel
//! when they are freed): half of a 1 MiB TCP stream's time. A fresh read
//! sink costs a registration (pinning its pages) and a deregistration per
//! rendezvous. A shelf keeps a bounded number of idle bytes.

use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};

/// A buffer a [`Shelf`] can lend out and take back.
pub(crate) trait Shelvable: Send + 'static {
    /// Bytes it can hold.
    fn room(&self) -> usize;
    /// Its bytes (the first `len` of them are lent).
    fn bytes(&self) -> &[u8];
    /// Called when it comes back, before it is kept for reuse.
    fn reset(&mut self) {}
}

impl Shelvable for BytesMut {
    fn room(&self) -> usize {
        self.capacity()
    }
    fn bytes(&self) -> &[u8] {
        self
    }
    fn reset(&mut self) {
        self.clear();
    }
}

/// Idle buffers of one transport, at most `max_bytes` of them.
#[derive(Debug)]
pub(crate) struct Shelf<B> {
    idle: Mutex<Vec<B>>,
    max_bytes: usize,
}

impl<B: Shelvable> Shelf<B> {
    /// An empty shelf keeping at most `max_bytes` of idle buffers.
    pub(crate) fn new(max_bytes: usize) -> Self {
        Shelf {
            idle: Mutex::new(Vec::new()),
            max_bytes,
        }
    }

    /// An idle buffer with room for `len` bytes (and not more than four
    /// times that), if there is one.
    pub(crate) fn take(&self, len: usize) -> Option<B> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let i = idle
            .iter()
            .position(|b| b.room() >= len && b.room() / 4 <= len)?;
        Some(idle.swap_remove(i))
    }

    /// Drops every idle buffer (say, to unpin registered memory).
    #[cfg(any(test, feature = "verbs", feature = "rdmacm"))]
    pub(crate) fn clear(&self) {
        self.idle.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    /// The first `len` bytes of `buf` as `Bytes` whose last drop puts `buf`
    /// back on this shelf.
    pub(crate) fn lend(self: &Arc<Self>, buf: B, len: usize) -> Bytes {
        debug_assert!(len <= buf.bytes().len());
        Bytes::from_owner(Shelved {
            buf: Some(buf),
            len,
            shelf: self.clone(),
        })
    }

    /// Keeps `buf` for a later [`Shelf::take`], room allowing.
    pub(crate) fn put(&self, mut buf: B) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let held: usize = idle.iter().map(Shelvable::room).sum();
        if held + buf.room() <= self.max_bytes {
            buf.reset();
            idle.push(buf);
        }
    }

    /// Bytes of idle buffers on the shelf.
    #[cfg(test)]
    pub(crate) fn idle_bytes(&self) -> usize {
        let idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        idle.iter().map(Shelvable::room).sum()
    }
}

/// A lent buffer: goes back to its shelf when the last `Bytes` drops.
struct Shelved<B: Shelvable> {
    /// Always `Some` until dropped.
    buf: Option<B>,
    len: usize,
    shelf: Arc<Shelf<B>>,
}

impl<B: Shelvable> AsRef<[u8]> for Shelved<B> {
    fn as_ref(&self) -> &[u8] {
        self.buf.as_ref().map_or(&[], |b| &b.bytes()[..self.len])
    }
}

impl<B: Shelvable> Drop for Shelved<B> {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            self.shelf.put(buf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_unit_buffer_is_reused_and_the_shelf_is_bounded() {
        let shelf = Arc::new(Shelf::<BytesMut>::new(8 << 20));
        assert!(shelf.take(1 << 20).is_none());
        let mut b = BytesMut::with_capacity(1 << 20);
        b.extend_from_slice(&[7u8; 1 << 20]);
        let ptr = b.as_ptr();
        let lent = shelf.lend(b, 1 << 20);
        assert_eq!(lent.len(), 1 << 20);
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
        // Too small a request for it: none.
        assert!(shelf.take(64 << 10).is_none());
        let again = shelf.take(1 << 20).expect("the idle buffer");
        assert_eq!(again.as_ptr(), ptr, "the idle buffer was not reused");
        assert!(again.is_empty());
        // Never more than max_bytes idle.
        let many: Vec<Bytes> = (0..20)
            .map(|_| {
                let mut b = BytesMut::with_capacity(1 << 20);
                b.extend_from_slice(&[1u8; 1 << 20]);
                shelf.lend(b, 100)
            })
            .collect();
        assert!(many.iter().all(|b| b.len() == 100));
        drop(many);
        assert!(shelf.idle_bytes() <= 8 << 20, "{}", shelf.idle_bytes());
        shelf.clear();
        assert_eq!(shelf.idle_bytes(), 0);
    }
}
