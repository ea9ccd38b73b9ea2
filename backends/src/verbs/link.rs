//! One verbs link: its RC queue pair, the out-of-band TCP socket (setup,
//! then liveness: EOF = peer gone), credits, the send queue of unit parts and
//! the reassembly of received parts.

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};
use mio::net::TcpStream;
use msgr_proto::Inbound;
use msgr_rdma::QueuePair;

/// Bytes of the header in front of every send.
pub(crate) const HDR: usize = 8;

/// What a send carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Banner = 0,
    Frame = 1,
    /// Credits only: consumes no credit (lands in a reserve receive).
    Credit = 2,
}

impl Kind {
    pub(crate) fn from_u8(v: u8) -> Option<Kind> {
        match v {
            0 => Some(Kind::Banner),
            1 => Some(Kind::Frame),
            2 => Some(Kind::Credit),
            _ => None,
        }
    }
}

/// Flag: more parts of this unit follow.
pub(crate) const MORE: u8 = 1;

/// The per-send header: kind, flags, credits granted to the receiver's peer.
pub(crate) fn header(kind: Kind, more: bool, credits: u32) -> [u8; HDR] {
    let mut h = [0u8; HDR];
    h[0] = kind as u8;
    h[1] = if more { MORE } else { 0 };
    h[4..8].copy_from_slice(&credits.to_le_bytes());
    h
}

/// One send's worth of a unit.
#[derive(Debug)]
pub(crate) struct Part {
    pub(crate) kind: Kind,
    pub(crate) more: bool,
    pub(crate) bytes: Bytes,
}

/// Where the out-of-band setup stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Setup {
    /// Connecting side: TCP connect in progress.
    TcpConnecting,
    /// Waiting for the peer's QP info (both sides).
    AwaitInfo,
    /// Accepting side: our QP is in RTS; waiting for the connector's ready byte.
    AwaitReady,
    /// Both QPs in RTS; the link carries units.
    Up,
}

pub(crate) struct VerbsLink {
    pub(crate) stream: TcpStream,
    pub(crate) outgoing: bool,
    pub(crate) setup: Setup,
    /// Bytes of the setup exchange received so far.
    pub(crate) oob: Vec<u8>,
    pub(crate) qp: QueuePair,
    pub(crate) psn: u32,
    /// Receive chunks posted on this QP.
    pub(crate) rx_chunks: Vec<u32>,
    /// Send chunks whose send has not completed.
    pub(crate) tx_inflight: Vec<u32>,
    /// Units not yet posted, cut into parts that fit a chunk.
    pub(crate) queue: VecDeque<Part>,
    pub(crate) queued_bytes: usize,
    /// Data sends we may post (the peer's free receives).
    pub(crate) credits: u32,
    /// Receives reposted whose credit the peer has not been told of.
    pub(crate) to_grant: u32,
    /// Credits kept back while reading is paused (backpressure).
    pub(crate) withheld: u32,
    /// The send chunk of the credit-only send in flight (at most one).
    pub(crate) credit_chunk: Option<u32>,
    /// Parts of the unit being received.
    pub(crate) reasm: BytesMut,
    pub(crate) paused: bool,
    pub(crate) frozen: bool,
    /// Received while paused, delivered on resume.
    pub(crate) held: VecDeque<Inbound>,
}

impl std::fmt::Debug for VerbsLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsLink")
            .field("qpn", &self.qp.qp_num())
            .field("setup", &self.setup)
            .field("credits", &self.credits)
            .field("queued_bytes", &self.queued_bytes)
            .finish()
    }
}

impl VerbsLink {
    /// Queues `bytes` of one unit, cut into parts of at most `max` bytes.
    pub(crate) fn push(&mut self, kind: Kind, bytes: Bytes, max: usize) {
        self.queued_bytes += bytes.len();
        let mut rest = bytes;
        loop {
            let take = rest.len().min(max);
            let part = rest.split_to(take);
            let more = !rest.is_empty();
            self.queue.push_back(Part {
                kind,
                more,
                bytes: part,
            });
            if !more {
                return;
            }
        }
    }
}
