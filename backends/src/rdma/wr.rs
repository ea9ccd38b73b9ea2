//! Work request ids: what a completion is for.
//!
//! Receives come from the shared receive queue, so their id names only the
//! chunk (the completion's QP number names the link). Sends and reads name
//! their link and slot: the send chunk, or the rendezvous read.

use msgr_proto::LinkId;

const INDEX_BITS: u32 = 24;
const KIND_SHIFT: u32 = INDEX_BITS;
const LINK_SHIFT: u32 = INDEX_BITS + 2;
const INDEX_MASK: u64 = (1 << INDEX_BITS) - 1;

/// What a work request was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WrKind {
    /// A receive into rx chunk `index`.
    Recv,
    /// A send from tx chunk `index`.
    Send,
    /// A rendezvous RDMA read, `index` its read slot.
    Read,
}

/// The id of a receive into chunk `chunk`.
pub(crate) fn recv(chunk: u32) -> u64 {
    u64::from(chunk)
}

/// The id of a send or read of `link`.
pub(crate) fn of_link(link: LinkId, kind: WrKind, index: u32) -> u64 {
    let k: u64 = match kind {
        WrKind::Recv => 0,
        WrKind::Send => 1,
        WrKind::Read => 2,
    };
    (link.0 << LINK_SHIFT) | (k << KIND_SHIFT) | (u64::from(index) & INDEX_MASK)
}

/// Splits an id back into (link, kind, index); receives have link 0.
pub(crate) fn parts(id: u64) -> (LinkId, WrKind, u32) {
    let kind = match (id >> KIND_SHIFT) & 3 {
        1 => WrKind::Send,
        2 => WrKind::Read,
        _ => WrKind::Recv,
    };
    (LinkId(id >> LINK_SHIFT), kind, (id & INDEX_MASK) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip() {
        for (l, k, i) in [
            (1u64, WrKind::Send, 0u32),
            (12345, WrKind::Read, 7),
            (1 << 30, WrKind::Send, (1 << 24) - 1),
        ] {
            assert_eq!(parts(of_link(LinkId(l), k, i)), (LinkId(l), k, i));
        }
        assert_eq!(parts(recv(511)), (LinkId(0), WrKind::Recv, 511));
    }
}
