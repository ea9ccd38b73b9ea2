//! The thin layer of OS calls the safe backend code needs and std does not
//! offer safely. Every unsafe block states why it is sound.

use std::io;
use std::mem::MaybeUninit;

use bytes::{BufMut, BytesMut};

/// Reads at most `max` bytes from `sock` into the spare capacity of `buf`
/// without zeroing it first, and extends `buf` by what was read. Returns the
/// byte count (0 = EOF).
pub(crate) fn recv_into_spare(
    sock: &socket2::SockRef<'_>,
    buf: &mut BytesMut,
    max: usize,
) -> io::Result<usize> {
    let spare = buf.spare_capacity_mut();
    let max = max.min(spare.len());
    let spare: &mut [MaybeUninit<u8>] = &mut spare[..max];
    let n = sock.recv(spare)?;
    // SAFETY: `recv` initialised exactly the first `n` bytes of the spare
    // capacity (socket2 guarantees n <= spare.len()), so advancing the length
    // by `n` exposes only initialised bytes.
    unsafe { buf.advance_mut(n) };
    Ok(n)
}
