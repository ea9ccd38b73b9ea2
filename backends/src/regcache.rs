//! Registrations of the application's large segments, kept for reuse by
//! the RDMA backends and, where the provider checks keys, the libfabric one.
//!
//! A rendezvous exposes a frame's largest segment where it lies, and that
//! needs a memory registration: on real hardware pinning the pages and
//! loading the adapter's translation table, which for a large buffer can
//! cost more than moving it. An application that sends from long-lived
//! buffers (a block cache, a staging area: a clone of the same `Bytes`)
//! finds the registration here the next time.
//!
//! Only the very bytes registered are a hit, not a slice of them: a
//! rendezvous hands the peer the region's key, with which it can read the
//! whole region, so a slice sent to one peer would expose the rest of a
//! buffer sent to another. A key a peer keeps after its read lets it read
//! again only bytes it was sent (they cannot change while cached).
//!
//! Sound without memory hooks (the usual caches intercept `munmap` and
//! `free` to learn that memory went): each entry holds a clone of the
//! `Bytes` it registered, so that memory can be neither freed nor reused
//! while the entry lives, and any other live `Bytes` whose bytes lie within
//! it views that very memory. The price: up to the budget
//! (`rdma_reg_cache_bytes`) of memory the application has let go stays
//! alive, and pinned, until it is evicted, least recently used first.
//! Segments above a quarter of the budget are registered for their one
//! rendezvous only, as are frames encoded afresh (never sent again).
//!
//! A registration lent to a rendezvous ([`Lent`]) shares its region, so an
//! entry evicted meanwhile is deregistered only once the peer has read it.

use std::sync::Arc;

use bytes::Bytes;

/// A registration lent to one rendezvous: the region, and the segment the
/// peer reads (within it).
#[derive(Debug)]
pub(crate) struct Lent<R> {
    pub(crate) region: Arc<R>,
    pub(crate) body: Bytes,
}

#[derive(Debug)]
struct Entry<R> {
    region: Arc<R>,
    start: usize,
    end: usize,
    used: u64,
}

/// The cache of one transport (one protection domain).
#[derive(Debug)]
pub(crate) struct RegCache<R> {
    entries: Vec<Entry<R>>,
    bytes: usize,
    budget: usize,
    tick: u64,
    /// Segments found registered.
    pub(crate) hits: u64,
    /// Registrations made and kept.
    pub(crate) misses: u64,
    /// Entries dropped to make room (or after a registration failed).
    pub(crate) evictions: u64,
}

impl<R> RegCache<R> {
    /// A cache keeping at most `budget` bytes registered (0: none).
    pub(crate) fn new(budget: usize) -> Self {
        RegCache {
            entries: Vec::new(),
            bytes: 0,
            budget,
            tick: 0,
            hits: 0,
            misses: 0,
            evictions: 0,
        }
    }

    /// Bytes registered by live entries.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// `reg_cache_hits`, `_misses`, `_evictions` and `_bytes`, for the
    /// transport's stats.
    pub(crate) fn values(&self) -> [(&'static str, u64); 4] {
        [
            ("reg_cache_hits", self.hits),
            ("reg_cache_misses", self.misses),
            ("reg_cache_evictions", self.evictions),
            ("reg_cache_bytes", self.bytes() as u64),
        ]
    }

    /// The registration of `body`: a cached one that covers it, else one
    /// made by `register` (kept when `reuse` says the segment may come again
    /// and it fits the budget). A failed registration is tried once more
    /// after every entry is dropped (their pinned pages may be what the
    /// memlock limit refused); the error returns `body`.
    pub(crate) fn get<E>(
        &mut self,
        body: Bytes,
        reuse: bool,
        mut register: impl FnMut(Bytes) -> Result<R, (E, Bytes)>,
    ) -> Result<Lent<R>, (E, Bytes)> {
        self.tick += 1;
        let (start, end) = span(&body);
        if let Some(e) = self
            .entries
            .iter_mut()
            .find(|e| e.start == start && e.end == end)
        {
            e.used = self.tick;
            self.hits += 1;
            return Ok(Lent {
                region: e.region.clone(),
                body,
            });
        }
        let keep = reuse && body.len() <= self.budget / 4;
        let region = match register(body.clone()) {
            Ok(r) => Arc::new(r),
            Err((_, body)) if !self.entries.is_empty() => {
                self.clear();
                Arc::new(register(body.clone())?)
            }
            Err(e) => return Err(e),
        };
        if keep {
            while self.bytes + body.len() > self.budget {
                self.evict_oldest();
            }
            self.bytes += body.len();
            self.misses += 1;
            self.entries.push(Entry {
                region: region.clone(),
                start,
                end,
                used: self.tick,
            });
        }
        Ok(Lent { region, body })
    }

    fn evict_oldest(&mut self) {
        let Some(i) = (0..self.entries.len()).min_by_key(|&i| self.entries[i].used) else {
            return;
        };
        let e = self.entries.swap_remove(i);
        self.bytes -= e.end - e.start;
        self.evictions += 1;
    }

    /// Drops every entry (a registration still lent goes with its last
    /// holder): after a refused registration, and before the domain the
    /// registrations belong to closes.
    pub(crate) fn clear(&mut self) {
        self.evictions += self.entries.len() as u64;
        self.entries.clear();
        self.bytes = 0;
    }
}

fn span(b: &Bytes) -> (usize, usize) {
    let start = b.as_ptr() as usize;
    (start, start + b.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// Stands for a registration: which bytes it covers (the cache's logic
    /// only; the real regions are tested in the guest).
    #[derive(Debug)]
    struct Region(Bytes);

    fn ok(count: &Cell<u32>) -> impl FnMut(Bytes) -> Result<Region, ((), Bytes)> + '_ {
        move |b| {
            count.set(count.get() + 1);
            Ok(Region(b))
        }
    }

    #[test]
    fn a_segment_sent_again_is_registered_once() {
        let count = Cell::new(0);
        let mut c = RegCache::new(1 << 20);
        let buf = Bytes::from(vec![7u8; 64 << 10]);
        let first = c.get(buf.clone(), true, ok(&count)).unwrap();
        let again = c.get(buf.clone(), true, ok(&count)).unwrap();
        assert_eq!(count.get(), 1);
        assert_eq!((c.hits, c.misses), (1, 1));
        assert!(Arc::ptr_eq(&first.region, &again.region));
        assert_eq!(first.region.0.as_ptr(), buf.as_ptr());
        assert_eq!(first.region.0.len(), buf.len());
        assert_eq!(c.bytes(), 64 << 10);
    }

    /// A slice's reader would get the key of the whole region: it is
    /// registered on its own (so is a wider view of the same memory).
    #[test]
    fn a_slice_of_a_kept_segment_is_not_a_hit() {
        let count = Cell::new(0);
        let mut c = RegCache::new(1 << 20);
        let buf = Bytes::from(vec![7u8; 64 << 10]);
        c.get(buf.slice(100..5000), true, ok(&count)).unwrap();
        let whole = c.get(buf.clone(), true, ok(&count)).unwrap();
        let slice = c.get(buf.slice(200..300), true, ok(&count)).unwrap();
        assert_eq!(count.get(), 3);
        assert_eq!(c.hits, 0);
        assert_eq!(whole.region.0.len(), buf.len());
        assert_eq!(slice.region.0.len(), 100);
        assert_eq!(slice.body.as_ptr(), buf[200..].as_ptr());
    }

    #[test]
    fn equal_bytes_elsewhere_are_not_a_hit() {
        let count = Cell::new(0);
        let mut c = RegCache::new(1 << 20);
        let a = Bytes::from(vec![1u8; 4096]);
        let b = Bytes::from(vec![1u8; 4096]);
        c.get(a.clone(), true, ok(&count)).unwrap();
        c.get(b, true, ok(&count)).unwrap();
        assert_eq!(count.get(), 2);
        assert_eq!(c.hits, 0);
    }

    #[test]
    fn the_budget_evicts_the_least_recently_used_and_keeps_their_memory_until_then() {
        let count = Cell::new(0);
        let mut c = RegCache::new(64 << 10);
        let bufs: Vec<Bytes> = (0..3).map(|i| Bytes::from(vec![i; 16 << 10])).collect();
        for b in &bufs {
            c.get(b.clone(), true, ok(&count)).unwrap();
        }
        // Touch the first: the second is now the oldest.
        c.get(bufs[0].clone(), true, ok(&count)).unwrap();
        let d = Bytes::from(vec![9u8; 16 << 10]);
        c.get(d.clone(), true, ok(&count)).unwrap();
        assert_eq!(c.bytes(), 64 << 10);
        let e = Bytes::from(vec![8u8; 16 << 10]);
        c.get(e, true, ok(&count)).unwrap();
        assert_eq!(c.evictions, 1);
        assert_eq!(c.bytes(), 64 << 10);
        let before = count.get();
        c.get(bufs[0].clone(), true, ok(&count)).unwrap();
        c.get(bufs[2].clone(), true, ok(&count)).unwrap();
        c.get(d, true, ok(&count)).unwrap();
        assert_eq!(count.get(), before, "survivors still hit");
        c.get(bufs[1].clone(), true, ok(&count)).unwrap();
        assert_eq!(count.get(), before + 1, "the oldest was the one evicted");
    }

    #[test]
    fn large_or_one_off_segments_are_not_kept() {
        let count = Cell::new(0);
        let mut c = RegCache::new(64 << 10);
        let big = Bytes::from(vec![0u8; 17 << 10]);
        let once = Bytes::from(vec![0u8; 1024]);
        c.get(big.clone(), true, ok(&count)).unwrap();
        c.get(big, true, ok(&count)).unwrap();
        c.get(once.clone(), false, ok(&count)).unwrap();
        c.get(once, false, ok(&count)).unwrap();
        assert_eq!(count.get(), 4);
        assert_eq!((c.hits, c.misses, c.bytes()), (0, 0, 0));
        let mut off = RegCache::new(0);
        let b = Bytes::from(vec![0u8; 10]);
        off.get(b.clone(), true, ok(&count)).unwrap();
        off.get(b, true, ok(&count)).unwrap();
        assert_eq!((off.hits, off.misses), (0, 0));
    }

    #[test]
    fn a_refused_registration_is_retried_once_with_the_cache_emptied() {
        let mut c = RegCache::new(1 << 20);
        let count = Cell::new(0);
        let kept = Bytes::from(vec![0u8; 4096]);
        c.get(kept.clone(), true, ok(&count)).unwrap();
        // Refuses while anything else is registered, as a memlock limit would.
        let live = Cell::new(1u32);
        let refuse_while_pinned = |b: Bytes| {
            if live.get() > 0 {
                live.set(0);
                Err(("ENOMEM", b))
            } else {
                Ok(Region(b))
            }
        };
        let body = Bytes::from(vec![1u8; 4096]);
        let lent = c.get(body.clone(), true, refuse_while_pinned).unwrap();
        assert_eq!(lent.body, body);
        assert_eq!(c.evictions, 1);
        // With nothing to evict, the error comes back with the bytes.
        let mut empty: RegCache<Region> = RegCache::new(1 << 20);
        let (e, back) = empty
            .get(body.clone(), true, |b| Err::<Region, _>(("ENOMEM", b)))
            .unwrap_err();
        assert_eq!((e, back), ("ENOMEM", body));
    }
}
