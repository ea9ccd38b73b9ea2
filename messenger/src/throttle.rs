//! The receive throttle: how much received data the application may hold.
//!
//! A delivered message carries a guard inside one of its segments; when the
//! last reference to that segment drops, the guard returns its share. While the
//! throttle is full, workers stop reading, so a slow application pushes back on
//! its peers instead of growing without bound.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use msgr_proto::batch::{BATCH_HEADER_LEN, MIN_ENTRY_LEN};
use msgr_proto::{Inbound, Message, Tag};
use parking_lot::Mutex;

/// Bits of [`RxThrottle::held`] that count bytes; the messages are above.
const BYTE_BITS: u32 = 40;
const BYTE_MASK: u64 = (1 << BYTE_BITS) - 1;
/// The largest limits a throttle takes (higher ones are lowered to these):
/// held counts stay below them but for what workers deliver between two
/// looks, far from the 24 and 40 bits they have.
pub(crate) const MAX_MESSAGES: usize = 1 << 22;
pub(crate) const MAX_BYTES: usize = 1 << 39;

/// Shared throttle state.
#[derive(Debug)]
pub(crate) struct RxThrottle {
    max_messages: usize,
    max_bytes: usize,
    /// Messages held (above [`BYTE_BITS`]) and their payload bytes, in one
    /// word: a message is charged by one atomic add and released by one
    /// subtraction, where two counters took two each (an atomic
    /// read-modify-write costs ~8 ns here, and every message pays them).
    held: AtomicU64,
    /// Set by a worker that paused reading; a release then wakes the workers.
    paused: AtomicBool,
    wakers: Mutex<Vec<Arc<mio::Waker>>>,
}

impl RxThrottle {
    /// A throttle of at most `max_messages` messages and `max_bytes` bytes
    /// (each at least 1 and at most [`MAX_MESSAGES`] / [`MAX_BYTES`]).
    pub(crate) fn new(max_messages: usize, max_bytes: usize) -> Arc<Self> {
        Arc::new(RxThrottle {
            max_messages: max_messages.clamp(1, MAX_MESSAGES),
            max_bytes: max_bytes.clamp(1, MAX_BYTES),
            held: AtomicU64::new(0),
            paused: AtomicBool::new(false),
            wakers: Mutex::new(Vec::new()),
        })
    }

    pub(crate) fn add_waker(&self, w: Arc<mio::Waker>) {
        self.wakers.lock().push(w);
    }

    /// Whether reading should pause.
    pub(crate) fn full(&self) -> bool {
        let (messages, bytes) = split(self.held.load(Ordering::Acquire));
        messages >= self.max_messages || bytes >= self.max_bytes
    }

    pub(crate) fn set_paused(&self) {
        self.paused.store(true, Ordering::SeqCst);
    }

    /// Messages and bytes currently held by the application.
    pub(crate) fn held(&self) -> (usize, usize) {
        split(self.held.load(Ordering::Relaxed))
    }

    /// Charges `msg` to the throttle; the charge is returned when the segment
    /// carrying the guard is dropped everywhere.
    pub(crate) fn charge(self: &Arc<Self>, msg: &mut Message) {
        let len = msg.payload_len();
        let seg = if msg.data.is_empty() {
            &mut msg.front
        } else {
            &mut msg.data
        };
        self.guard(seg, 1, len);
    }

    /// Charges what a unit received for a session will deliver, before the
    /// session reads it: a message frame its message; a batch frame its
    /// entries and its body's bytes, with one guard on the body that every
    /// message of the batch shares (one allocation and one atomic add per
    /// batch, not per message; the charge returns when the last of them
    /// drops, which is when the body's memory is freed). Control frames
    /// are not charged.
    pub(crate) fn charge_unit(self: &Arc<Self>, unit: &mut Inbound) {
        match unit {
            Inbound::Message(m) => self.charge(&mut m.msg),
            Inbound::Frame(f) if f.tag == Tag::MessageBatch => {
                if let Some(body) = f.segments.first_mut() {
                    // The claim is checked by the session after this: bound it
                    // by what the body can hold so a hostile count cannot
                    // overflow the message bits.
                    let claimed = msgr_proto::batch::claimed_count(body) as usize;
                    let room = body.len().saturating_sub(BATCH_HEADER_LEN) / MIN_ENTRY_LEN;
                    let n = claimed.min(room).max(1);
                    let len = body.len();
                    self.guard(body, n as u64, len);
                }
            }
            // A message frame a transport assembled from pieces: header,
            // front, data.
            Inbound::Frame(f) if f.tag == Tag::Message && f.segments.len() == 3 => {
                let len = f.segments[1].len() + f.segments[2].len();
                let at = if f.segments[2].is_empty() { 1 } else { 2 };
                self.guard(&mut f.segments[at], 1, len);
            }
            _ => {}
        }
    }

    /// Wraps `seg` in a guard that holds `messages` messages and `len`
    /// bytes charged until it is dropped everywhere.
    fn guard(self: &Arc<Self>, seg: &mut Bytes, messages: u64, len: usize) {
        let charge = charge_of(messages, len);
        self.held.fetch_add(charge, Ordering::AcqRel);
        let inner = std::mem::take(seg);
        *seg = Bytes::from_owner(Guarded {
            throttle: self.clone(),
            charge,
            inner,
        });
    }

    fn release(&self, charge: u64) {
        self.held.fetch_sub(charge, Ordering::AcqRel);
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

/// What `messages` messages of `len` payload bytes add to
/// [`RxThrottle::held`] (a frame's limit keeps `len` far below 2^40, and
/// a frame's bytes bound its messages far below 2^24).
fn charge_of(messages: u64, len: usize) -> u64 {
    (messages << BYTE_BITS) | (len as u64 & BYTE_MASK)
}

/// [`RxThrottle::held`] as (messages, bytes).
fn split(held: u64) -> (usize, usize) {
    ((held >> BYTE_BITS) as usize, (held & BYTE_MASK) as usize)
}

/// A segment that returns its throttle charge when dropped.
struct Guarded {
    throttle: Arc<RxThrottle>,
    /// What [`RxThrottle::held`] was charged.
    charge: u64,
    inner: Bytes,
}

impl AsRef<[u8]> for Guarded {
    fn as_ref(&self) -> &[u8] {
        &self.inner
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        self.throttle.release(self.charge);
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

    /// A batch frame is charged once, for all its entries and its body's
    /// bytes, and stays charged until the last message read from it drops;
    /// a hostile entry count is bounded by what the body could hold.
    #[test]
    fn a_batch_is_charged_once_until_its_last_message_drops() {
        use msgr_proto::batch::{BatchReader, BatchWriter};
        use msgr_proto::Frame;
        let t = RxThrottle::new(1 << 20, 1 << 30);
        let mut buf = bytes::BytesMut::new();
        let mut w = BatchWriter::begin(&mut buf, 1, 0, 4096);
        for i in 0..3u8 {
            assert!(w.push(&Message::new(1, Bytes::new(), vec![i; 64])));
        }
        let body = w.finish();
        let len = body.len();
        let mut unit = Inbound::Frame(Frame::single(Tag::MessageBatch, body));
        t.charge_unit(&mut unit);
        assert_eq!(t.held(), (3, len));
        let Inbound::Frame(f) = unit else {
            unreachable!()
        };
        let msgs: Vec<Message> = BatchReader::new(f.segments[0].clone())
            .unwrap()
            .map(Result::unwrap)
            .collect();
        drop(f);
        let mut msgs = msgs.into_iter();
        let last = msgs.next_back().unwrap();
        drop(msgs);
        assert_eq!(t.held(), (3, len), "a message of the batch is still held");
        assert_eq!(last.data[..], [2u8; 64]);
        drop(last);
        assert_eq!(t.held(), (0, 0));

        let mut hostile = vec![0u8; 30];
        hostile[16..20].copy_from_slice(&u32::MAX.to_le_bytes());
        let mut unit = Inbound::Frame(Frame::single(Tag::MessageBatch, hostile));
        t.charge_unit(&mut unit);
        assert_eq!(t.held(), (1, 30), "a claim bounded by the body");
        drop(unit);
        assert_eq!(t.held(), (0, 0));
    }

    /// Messages and bytes share one word without touching: a byte limit
    /// trips on bytes alone, a message limit on messages alone, a large
    /// payload leaves the message count at one, and limits beyond the
    /// word's room are lowered to it.
    #[test]
    fn messages_and_bytes_count_apart() {
        let t = RxThrottle::new(usize::MAX, 100);
        assert_eq!((t.max_messages, t.max_bytes), (MAX_MESSAGES, 100));
        let mut m = Message::new(1, Bytes::new(), vec![0u8; 100]);
        t.charge(&mut m);
        assert_eq!(t.held(), (1, 100));
        assert!(t.full());
        drop(m);
        assert_eq!(t.held(), (0, 0));
        assert!(!t.full());

        let t = RxThrottle::new(3, usize::MAX);
        assert_eq!(t.max_bytes, MAX_BYTES);
        let mut held: Vec<Message> = (0..3)
            .map(|_| {
                let mut m = Message::new(1, &b"x"[..], Bytes::new());
                t.charge(&mut m);
                m
            })
            .collect();
        assert_eq!(t.held(), (3, 3));
        assert!(t.full());
        held.pop();
        assert!(!t.full());

        let mut big = Message::new(1, Bytes::new(), vec![0u8; 160 << 20]);
        t.charge(&mut big);
        assert_eq!(t.held(), (3, 2 + (160 << 20)));
        drop(big);
        drop(held);
        assert_eq!(t.held(), (0, 0));
    }
}
