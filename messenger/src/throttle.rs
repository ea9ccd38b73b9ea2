//! The receive throttle: how much received data the application may hold.
//!
//! A delivered message carries a guard inside one of its segments; when the
//! last reference to that segment drops, the guard returns its share. While the
//! throttle is full, workers stop reading, so a slow application pushes back on
//! its peers instead of growing without bound.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use msgr_proto::Message;
use parking_lot::Mutex;

/// Shared throttle state.
#[derive(Debug)]
pub(crate) struct RxThrottle {
    max_messages: usize,
    max_bytes: usize,
    messages: AtomicUsize,
    bytes: AtomicUsize,
    /// Set by a worker that paused reading; a release then wakes the workers.
    paused: AtomicBool,
    wakers: Mutex<Vec<Arc<mio::Waker>>>,
}

impl RxThrottle {
    pub(crate) fn new(max_messages: usize, max_bytes: usize) -> Arc<Self> {
        Arc::new(RxThrottle {
            max_messages: max_messages.max(1),
            max_bytes: max_bytes.max(1),
            messages: AtomicUsize::new(0),
            bytes: AtomicUsize::new(0),
            paused: AtomicBool::new(false),
            wakers: Mutex::new(Vec::new()),
        })
    }

    pub(crate) fn add_waker(&self, w: Arc<mio::Waker>) {
        self.wakers.lock().push(w);
    }

    /// Whether reading should pause.
    pub(crate) fn full(&self) -> bool {
        self.messages.load(Ordering::Acquire) >= self.max_messages
            || self.bytes.load(Ordering::Acquire) >= self.max_bytes
    }

    pub(crate) fn set_paused(&self) {
        self.paused.store(true, Ordering::SeqCst);
    }

    /// Messages and bytes currently held by the application.
    pub(crate) fn held(&self) -> (usize, usize) {
        (
            self.messages.load(Ordering::Relaxed),
            self.bytes.load(Ordering::Relaxed),
        )
    }

    /// Charges `msg` to the throttle; the charge is returned when the segment
    /// carrying the guard is dropped everywhere.
    pub(crate) fn charge(self: &Arc<Self>, msg: &mut Message) {
        let len = msg.payload_len();
        self.messages.fetch_add(1, Ordering::AcqRel);
        self.bytes.fetch_add(len, Ordering::AcqRel);
        let seg = if msg.data.is_empty() {
            &mut msg.front
        } else {
            &mut msg.data
        };
        let inner = std::mem::take(seg);
        *seg = Bytes::from_owner(Guarded {
            throttle: self.clone(),
            len,
            inner,
        });
    }

    fn release(&self, len: usize) {
        self.messages.fetch_sub(1, Ordering::AcqRel);
        self.bytes.fetch_sub(len, Ordering::AcqRel);
        if self.paused.load(Ordering::SeqCst)
            && !self.full()
            && self.paused.swap(false, Ordering::SeqCst)
        {
            for w in self.wakers.lock().iter() {
                let _ = w.wake();
            }
        }
    }
}

/// A segment that returns its throttle charge when dropped.
struct Guarded {
    throttle: Arc<RxThrottle>,
    len: usize,
    inner: Bytes,
}

impl AsRef<[u8]> for Guarded {
    fn as_ref(&self) -> &[u8] {
        &self.inner
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        self.throttle.release(self.len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charge_is_returned_when_the_last_clone_drops() {
        let t = RxThrottle::new(2, 1 << 20);
        let mut a = Message::new(1, &b"abc"[..], Bytes::new());
        let mut b = Message::new(1, Bytes::new(), vec![0u8; 10]);
        t.charge(&mut a);
        t.charge(&mut b);
        assert_eq!(t.held(), (2, 13));
        assert!(t.full());
        let kept = b.data.clone();
        drop(b);
        assert_eq!(t.held(), (2, 13), "a clone still holds the data");
        drop(kept);
        assert_eq!(t.held(), (1, 3));
        assert!(!t.full());
        assert_eq!(&a.front[..], b"abc");
        drop(a);
        assert_eq!(t.held(), (0, 0));
    }
}
