//! Completion contexts: the port and slot, read or write a completion is for.

const RX_BIT: u64 = 1 << 39;
/// Context bit of an fi_read or a granted buffer (the low 32 bits number
/// it within its port).
pub(super) const READ_BIT: u64 = 1 << 38;
/// Context bit of an fi_write (numbered as reads are).
pub(super) const WRITE_BIT: u64 = 1 << 37;
const SLOT_MASK: u64 = (1 << 32) - 1;

pub(super) fn context(port: usize, rx: bool, slot: usize) -> u64 {
    ((port as u64) << 40) | if rx { RX_BIT } else { 0 } | slot as u64
}

pub(super) fn read_context(port: usize, n: u32) -> u64 {
    ((port as u64) << 40) | READ_BIT | u64::from(n)
}

/// Context of an application's one-sided read (both the read and the
/// write bit: see [`is_user_read`]), numbered as reads are.
pub(super) fn user_read_context(port: usize, n: u32) -> u64 {
    ((port as u64) << 40) | READ_BIT | WRITE_BIT | u64::from(n)
}

pub(super) fn is_user_read(c: u64) -> bool {
    c & (READ_BIT | WRITE_BIT) == READ_BIT | WRITE_BIT
}

pub(super) fn write_context(port: usize, n: u32) -> u64 {
    ((port as u64) << 40) | WRITE_BIT | u64::from(n)
}

pub(super) fn decode_context(c: u64) -> (usize, bool, usize) {
    (
        (c >> 40) as usize,
        c & RX_BIT != 0,
        (c & SLOT_MASK) as usize,
    )
}
