//! Small byte strings copied into shared chunks.

use bytes::{Bytes, BytesMut};

/// Copies small byte strings into chunks of `chunk_size` bytes and hands
/// each copy out as its own [`Bytes`]: one allocation per chunk instead of
/// one (or two, once the copy is shared) per string. Used for message
/// headers on the way out and for small received units of the message
/// transports.
///
/// A copy keeps its whole chunk alive until it drops, as a frame cut from
/// a TCP read buffer keeps that buffer: strings larger than a quarter of a
/// chunk get a buffer of their own, so a held copy pins at most a chunk.
///
/// ```
/// use msgr_proto::arena::ByteArena;
///
/// let mut arena = ByteArena::new(4096);
/// let a = arena.copy(b"header one");
/// let b = arena.copy(b"header two");
/// assert_eq!((&a[..], &b[..]), (&b"header one"[..], &b"header two"[..]));
/// ```
#[derive(Debug)]
pub struct ByteArena {
    chunk: BytesMut,
    chunk_size: usize,
}

impl ByteArena {
    /// An arena that allocates chunks of `chunk_size` bytes (the first on
    /// first use).
    pub fn new(chunk_size: usize) -> Self {
        ByteArena {
            chunk: BytesMut::new(),
            chunk_size,
        }
    }

    /// A copy of `src`.
    pub fn copy(&mut self, src: &[u8]) -> Bytes {
        self.fill(src.len(), |b| b.extend_from_slice(src))
    }

    /// The `len` bytes `write` appends to the buffer it is given (it must
    /// append exactly `len`): for a string assembled in place, such as a
    /// small frame encoded straight into the arena.
    ///
    /// ```
    /// use bytes::BufMut;
    /// use msgr_proto::arena::ByteArena;
    ///
    /// let mut arena = ByteArena::new(4096);
    /// let b = arena.fill(5, |buf| {
    ///     buf.put_u8(1);
    ///     buf.put_u32_le(7);
    /// });
    /// assert_eq!(&b[..], &[1, 7, 0, 0, 0]);
    /// ```
    pub fn fill(&mut self, len: usize, write: impl FnOnce(&mut BytesMut)) -> Bytes {
        if len > self.chunk_size / 4 {
            let mut own = BytesMut::with_capacity(len);
            write(&mut own);
            debug_assert_eq!(own.len(), len, "ByteArena::fill wrote another length");
            return own.freeze();
        }
        if self.chunk.capacity() - self.chunk.len() < len {
            self.chunk = BytesMut::with_capacity(self.chunk_size);
        }
        write(&mut self.chunk);
        debug_assert_eq!(
            self.chunk.len(),
            len,
            "ByteArena::fill wrote another length"
        );
        self.chunk.split().freeze()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Copies across several chunks, large and empty ones among them, each
    /// stay their own bytes after the arena moved on.
    #[test]
    fn copies_stay_apart_across_chunks() {
        let mut arena = ByteArena::new(256);
        let sources: Vec<Vec<u8>> = (0..200usize)
            .map(|i| vec![i as u8; [0, 1, 31, 64, 65, 300][i % 6]])
            .collect();
        let copies: Vec<Bytes> = sources.iter().map(|s| arena.copy(s)).collect();
        for (s, c) in sources.iter().zip(&copies) {
            assert_eq!(&c[..], &s[..]);
        }
    }
}
