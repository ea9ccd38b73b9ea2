//! The `fi_read` rendezvous for large units, shared by the MSG transport
//! ([`super::FabricTransport`]) and the RDM one ([`super::rdm`]).
//!
//! Where the endpoint has `FI_RMA` with reads (decided once per worker,
//! [`msgr_fabric::Net::rma`]), a unit larger than [`RNDV_THRESHOLD`] at a
//! unit boundary is not copied through slots: the sender registers it where
//! it lies ([`msgr_fabric::RmaBuffers::expose`] of the endpoint,
//! which honours the provider's `mr_mode`) and sends a descriptor (address,
//! length, key, id: [`encode`]) in the link's ordered stream. The receiver
//! checks it ([`decode`]), `fi_read`s the unit into a buffer of its own,
//! hands it up in order (later messages wait behind it) and answers with the
//! id, upon which the sender deregisters and frees the unit. At most
//! [`RNDV_MAX`] units per link are exposed at once ([`Exposures`]); a read
//! not complete within the read timeout (`rdma_read_timeout_ms`, shared
//! with the RDMA backends: [`crate::RdmaPoolConfig::read_timeout`]) fails
//! the link ([`overdue`], counted in `read_timeouts`); a unit whose
//! registration fails goes eagerly (counted as a fallback).
//!
//! A read that never completes cannot be had for real from the providers
//! tested here (`tcp`, `tcp;ofi_rxm`: a broken connection ends the read
//! with an error completion), so `SimulatedFault::HungRead` imitates one
//! ([`Receiving::reads_to_hang`]): the completion of the link's next read
//! is ignored (counted in `simulated_hung_reads`) and the deadline must
//! fail the link. The provider did write the buffer, and is done with it
//! once it completes: the transport frees it then (`read_done`), or with
//! the endpoint if no completion ever comes.
//!
//! A large frame is not copied into one buffer to be exposed
//! ([`msgr_fabric::RmaBuffers::expose_in_place`]): its largest segment is
//! exposed where the application put it and the rest of the frame
//! (preamble, small segments, CRCs: at most [`INLINE_MAX`](crate::split::INLINE_MAX) bytes) travels
//! inside the descriptor ([`OutUnit::Split`]); the receiver reads the
//! segment into the gap between them. Where the provider does not check
//! keys (`shm`) the descriptor also names a check word registered apart,
//! which the receiver reads after the segment ([`msgr_fabric::CHECK_LEN`]).
//! The copy was a tenth of a 1 MiB ping-pong's CPU over `tcp`, and a
//! quarter to a third of its one-way time over `shm`.
//!
//! Where the reads are withheld ([`msgr_fabric::rma_withheld`]: libfabric
//! 1.17's `tcp`) and the provider checks keys, units go by `fi_write`
//! instead ([`RmaOp::Write`]): the sender holds the unit (registered only
//! where the domain wants local registrations) and sends its descriptor
//! flagged [`WRITE_ME`], naming nothing to read; the receiver grants a
//! zeroed buffer with the inline bytes in place, registered for remote
//! writes ([`encode_grant`]); the sender writes the unit into it and says
//! "written" by a send posted right behind the write (`FI_ORDER_SAW`); the
//! receiver then hands the unit up and answers as after a read. A granted
//! buffer is never freed while its endpoint is open and a write into it
//! may be under way (RDM endpoints outlive their links: a link that goes
//! with a grant outstanding leaves it to the endpoint's close). Over
//! `tcp;ofi_rxm` the writes go to the core `tcp` endpoint in one piece,
//! where eager messages were 16 KiB bounce-buffer copies: a 1 MiB one-way
//! took about half the time.
//!
//! The epilogue (the CRC32C of each segment) is the last of a split frame's
//! inline bytes, and the checksum of a large segment takes as long as a
//! good part of its move (a 1 MiB one-way over `shm`: ~20 µs of ~60).
//! Between peers that both said so at set-up ([`CAPS_LATE_EPILOGUE`]), a
//! split unit goes with its epilogue zeroed and its descriptor flagged
//! [`LATE_EPILOGUE`]: the sender computes the epilogue once the descriptor
//! is posted, while the receiver reads (or grants), and sends it in a
//! message of its own ([`encode_epilogue`]); the receiver puts it in place
//! and checks the unit once both the unit and its epilogue are there
//! ([`Receiving::finish`], [`Receiving::epilogue_arrived`]). A unit whose
//! epilogue never comes misses the read deadline as a hung read does.
//!
//! What this module holds is transport-independent: the descriptor's
//! encoding, the sending side's bookkeeping, taking an offer, writing into
//! a grant, freeing an answered unit and taking one that landed (through
//! [`PeerRma`], the link's endpoint aimed at its peer), the deadline and
//! the counters. Each transport frames the descriptor and the answer in
//! its own header, numbers its operations' contexts and finds a link's
//! endpoint and peer its own way.
//!
//! # Layers
//!
//! Bottom first (`tests/layering.rs`):
//!
//! 1. `wire`
//! 2. `unit`
//! 3. `receiving`
//! 4. `sending`
//! 5. `peer`

mod peer;
mod receiving;
mod sending;
mod unit;
mod wire;

pub(crate) use peer::*;
pub use receiving::*;
pub use sending::*;
pub use unit::*;
/// A descriptor no endpoint exposed, for tests (the hostile peers').
#[cfg(test)]
pub(crate) use wire::tests::desc as test_descriptor;
pub use wire::*;

use std::time::{Duration, Instant};

use msgr_fabric::RmaOp;

/// Units larger than this go by `fi_read` rendezvous where the endpoint
/// has `FI_RMA`.
pub const RNDV_THRESHOLD: usize = 64 << 10;
/// Frames shorter than this are encoded at once into a shared chunk
/// ([`OutUnit::Small`]); longer ones keep their segments until copied into
/// the send slots.
pub const SMALL_UNIT: usize = 4 << 10;
/// The chunk size of a transport's arena for [`OutUnit::Small`] units.
pub const SMALL_ARENA: usize = 4 * SMALL_UNIT;
/// Rendezvous units a link may have exposed and not yet read by the peer.
pub const RNDV_MAX: usize = 4;

/// What each end of a link tells the other at set-up (MSG: the connection
/// data of `fi_connect` / `fi_accept`; RDM: after the HELLO's name and the
/// WELCOME's ids): [`CAPS_TAG`] and a flags byte, [`CAPS_READS`] set when
/// it reads rendezvous units, [`CAPS_WRITES`] when it grants buffers for
/// them to be written into. A sender offers a unit by rendezvous only to a
/// peer that moves them by the same operation as its own endpoints (they
/// may have reads while the peer's libfabric withholds them:
/// `msgr_fabric::rma_withheld`).
pub const CAPS_LEN: usize = 2;
/// The first byte of the capabilities.
const CAPS_TAG: u8 = b'm';
/// Capability flag: this end `fi_read`s rendezvous units.
const CAPS_READS: u8 = 1;
/// Capability flag: this end grants buffers for rendezvous units to be
/// `fi_write`n into.
const CAPS_WRITES: u8 = 2;
/// Capability flag: this end takes a unit's epilogue after its descriptor
/// ([`LATE_EPILOGUE`]). An msgr from before it neither sends nor takes one.
pub const CAPS_LATE_EPILOGUE: u8 = 4;

/// The capabilities of an end whose endpoints move rendezvous units by
/// `op` (none: every unit through the slots).
pub fn caps(op: Option<RmaOp>) -> [u8; CAPS_LEN] {
    let flags = match op {
        Some(RmaOp::Read) => CAPS_READS | CAPS_LATE_EPILOGUE,
        Some(RmaOp::Write) => CAPS_WRITES | CAPS_LATE_EPILOGUE,
        None => 0,
    };
    [CAPS_TAG, flags]
}

/// Whether a peer whose set-up carried `caps` takes late epilogues.
pub fn peer_late_epilogue(caps: &[u8]) -> bool {
    matches!(caps, [CAPS_TAG, flags, ..] if flags & CAPS_LATE_EPILOGUE != 0)
}

/// How a peer whose set-up carried `caps` moves rendezvous units. Without
/// them (an msgr from before they were sent, which always read where its
/// endpoints could) it reads.
pub fn peer_op(caps: &[u8]) -> Option<RmaOp> {
    match caps {
        [CAPS_TAG, flags, ..] if flags & CAPS_READS != 0 => Some(RmaOp::Read),
        [CAPS_TAG, flags, ..] if flags & CAPS_WRITES != 0 => Some(RmaOp::Write),
        [CAPS_TAG, ..] => None,
        _ => Some(RmaOp::Read),
    }
}

/// The rendezvous operation of a link between an end moving units by
/// `ours` and a peer moving them by `theirs`: the same, or none.
pub fn link_op(ours: Option<RmaOp>, theirs: Option<RmaOp>) -> Option<RmaOp> {
    ours.filter(|&op| theirs == Some(op))
}

/// Whether a read started at `since` has been in flight longer than
/// `timeout` at `now`.
pub fn overdue(since: Instant, now: Instant, timeout: Duration) -> bool {
    now.saturating_duration_since(since) > timeout
}

/// The rendezvous counters of one transport (see [`Counters::values`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct Counters {
    /// Descriptors sent.
    pub sent: u64,
    /// Of those, units exposed in place ([`OutUnit::Split`]).
    pub in_place: u64,
    /// Units fetched by `fi_read`.
    pub read: u64,
    /// Bytes fetched by `fi_read`.
    pub read_bytes: u64,
    /// Units of ours written into buffers peers granted (`fi_write`).
    pub writes: u64,
    /// Units peers wrote into buffers granted here.
    pub landed: u64,
    /// Bytes of those units.
    pub landed_bytes: u64,
    /// Units that went eagerly because their registration failed.
    pub fallbacks: u64,
    /// Links failed because a read missed its deadline.
    pub read_timeouts: u64,
    /// Reads whose completion was ignored (`SimulatedFault::HungRead`).
    pub simulated_hung_reads: u64,
    /// Eager pieces sent from the application's bytes, not copied
    /// (`Ep::send_in_place`, `RdmEp::send_in_place`).
    pub pieces_in_place: u64,
    /// Units whose epilogue went after their descriptor ([`LATE_EPILOGUE`]).
    pub late_epilogues: u64,
}

impl Counters {
    /// The counters by stable name, with whether rendezvous is on and the
    /// gauges of buffers exposed and reads in flight (`(exposed, reading)`).
    pub fn values(&self, enabled: bool, in_use: (usize, usize)) -> Vec<(&'static str, u64)> {
        vec![
            ("rendezvous_enabled", u64::from(enabled)),
            ("rendezvous_sent", self.sent),
            ("rendezvous_in_place", self.in_place),
            ("rendezvous_read", self.read),
            ("rendezvous_read_bytes", self.read_bytes),
            ("rendezvous_writes", self.writes),
            ("rendezvous_landed", self.landed),
            ("rendezvous_landed_bytes", self.landed_bytes),
            ("rendezvous_fallbacks", self.fallbacks),
            ("read_timeouts", self.read_timeouts),
            ("simulated_hung_reads", self.simulated_hung_reads),
            ("pieces_in_place", self.pieces_in_place),
            ("rendezvous_late_epilogues", self.late_epilogues),
            ("rendezvous_exposed", in_use.0 as u64),
            ("rendezvous_reading", in_use.1 as u64),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use bytes::Bytes;
    use msgr_fabric::Exposed;
    use msgr_proto::Frame;

    pub(super) fn exposed(len: u64, check: u64) -> Exposed {
        Exposed {
            id: 7,
            addr: 0x1000,
            len,
            key: 42,
            check,
            word: None,
            write: false,
        }
    }

    /// Capabilities: each end says how it moves units; a link uses an
    /// operation only if both ends do.
    #[test]
    fn capabilities_name_the_operation() {
        for op in [None, Some(RmaOp::Read), Some(RmaOp::Write)] {
            assert_eq!(peer_op(&caps(op)), op);
        }
        // An msgr from before the capabilities read.
        assert_eq!(peer_op(&[]), Some(RmaOp::Read));
        let (r, w) = (Some(RmaOp::Read), Some(RmaOp::Write));
        assert_eq!(link_op(r, r), r);
        assert_eq!(link_op(w, w), w);
        assert_eq!(link_op(r, w), None);
        assert_eq!(link_op(None, None), None);
    }

    /// A large frame whose other segments and CRCs fit a descriptor.
    pub(super) fn big_frame(body: usize, front: usize) -> Frame {
        Frame::new(
            msgr_proto::Tag::Message,
            vec![
                Bytes::from(vec![1u8; 40]),
                Bytes::from(vec![2u8; front]),
                Bytes::from((0..body).map(|i| i as u8).collect::<Vec<_>>()),
            ],
        )
    }

    /// Only a peer whose set-up said so gets late epilogues: an msgr from
    /// before them reads (or grants) without the flag.
    #[test]
    fn late_epilogues_are_negotiated() {
        assert!(peer_late_epilogue(&caps(Some(RmaOp::Read))));
        assert!(peer_late_epilogue(&caps(Some(RmaOp::Write))));
        assert!(!peer_late_epilogue(&caps(None)));
        for old in [&[CAPS_TAG, CAPS_READS][..], &[CAPS_TAG, CAPS_WRITES], &[]] {
            assert!(!peer_late_epilogue(old), "{old:?}");
        }
        assert_eq!(peer_op(&caps(Some(RmaOp::Read))), Some(RmaOp::Read));
        assert_eq!(peer_op(&caps(Some(RmaOp::Write))), Some(RmaOp::Write));
    }
}
