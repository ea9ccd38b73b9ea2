//! What one Net's endpoints share of the rendezvous: the buffers granted
//! to peers' writes, reused ([`LandingPool`]), and the count of
//! registrations alive ([`RmaGauge`], [`crate::Net::rma_in_use`]). Below
//! the Net, which holds them, and the endpoints' `RmaBuffers`, which use
//! them.

use bytes::Bytes;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

/// Buffers granted to peers' writes ([`RmaBuffers::grant`](crate::rma::RmaBuffers::grant)), taken back
/// when the unit that landed in one is dropped and handed out again: a
/// granted buffer must be initialised (that the peer wrote all of it is
/// the peer's word, not the provider's), and zeroing a fresh one cost a
/// 1 MiB one-way over `tcp` 20–40 µs of its ~190. A reused buffer holds an
/// earlier unit's bytes until the write replaces them. At most
/// [`LandingPool::KEEP`] buffers of at most [`LandingPool::LARGEST`] bytes
/// wait here; one Net's endpoints share them.
#[derive(Debug, Default)]
pub(crate) struct LandingPool {
    free: std::sync::Mutex<Vec<Vec<u8>>>,
}

impl LandingPool {
    const KEEP: usize = 4;
    const LARGEST: usize = 16 << 20;

    /// `len` initialised bytes: the smallest free buffer that has them
    /// (and not more than twice as many), else a zeroed new one.
    pub(crate) fn take(&self, len: usize) -> Vec<u8> {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        let fits = |v: &Vec<u8>| v.len() >= len && v.len() / 2 <= len;
        let best = (0..free.len())
            .filter(|&i| fits(&free[i]))
            .min_by_key(|&i| free[i].len());
        match best {
            Some(i) => {
                let mut v = free.swap_remove(i);
                v.truncate(len);
                v
            }
            None => vec![0u8; len],
        }
    }

    /// `mem` as the bytes of a unit, coming back here when dropped.
    pub(crate) fn lend(self: &Arc<Self>, mem: Vec<u8>) -> Bytes {
        Bytes::from_owner(Landed {
            mem,
            pool: Arc::downgrade(self),
        })
    }

    fn give_back(&self, mem: Vec<u8>) {
        if mem.capacity() > Self::LARGEST {
            return;
        }
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        if free.len() < Self::KEEP {
            free.push(mem);
        }
    }
}

/// A unit's bytes in a buffer of the [`LandingPool`], which takes it back
/// when the last `Bytes` of it goes.
struct Landed {
    mem: Vec<u8>,
    pool: std::sync::Weak<LandingPool>,
}

impl AsRef<[u8]> for Landed {
    fn as_ref(&self) -> &[u8] {
        &self.mem
    }
}

impl Drop for Landed {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.upgrade() {
            pool.give_back(std::mem::take(&mut self.mem));
        }
    }
}

/// Registrations for the rendezvous alive on a Net's endpoints
/// ([`Net::rma_in_use`](crate::Net::rma_in_use)).
#[derive(Debug, Default)]
pub(crate) struct RmaGauge {
    pub(crate) exposed: AtomicUsize,
    pub(crate) reading: AtomicUsize,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Granted buffers come back when the last handle of their unit is
    /// dropped and are handed out again — the smallest that fits, never
    /// one more than twice too large; a new one is zeroed; the pool keeps a
    /// bounded number, and a unit that outlives its pool is simply freed.
    #[test]
    fn landing_buffers_are_reused() {
        let pool = Arc::new(LandingPool::default());
        let free = |pool: &LandingPool| pool.free.lock().unwrap().len();
        let a = pool.take(1000);
        assert!(a.len() == 1000 && a.iter().all(|&b| b == 0));
        let p = a.as_ptr();
        let unit = pool.lend(a);
        let other = unit.slice(10..20);
        drop(unit);
        assert_eq!(free(&pool), 0, "still referenced");
        drop(other);
        assert_eq!(free(&pool), 1);
        let b = pool.take(900);
        assert_eq!((b.as_ptr(), b.len()), (p, 900), "reused");
        let c = pool.take(900);
        assert_ne!(c.as_ptr(), p, "handed out once");
        drop(pool.lend(b));
        let d = pool.take(400);
        assert_ne!(d.as_ptr(), p, "not twice too large");
        drop((c, d));
        for _ in 0..10 {
            drop(pool.lend(vec![0u8; 10]));
        }
        assert_eq!(free(&pool), LandingPool::KEEP);
        let unit = pool.lend(vec![1]);
        drop(pool);
        drop(unit);
    }
}
