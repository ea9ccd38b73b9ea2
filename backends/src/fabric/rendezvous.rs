//! The `fi_read` rendezvous for large units, shared by the MSG transport
//! ([`super::FabricTransport`]) and the RDM one ([`super::rdm`]).
//!
//! Where the endpoint has `FI_RMA` with reads (decided once per worker,
//! [`msgr_fabric::Net::rma`]), a unit larger than [`RNDV_THRESHOLD`] at a
//! unit boundary is not copied through slots: the sender registers it where
//! it lies ([`msgr_fabric::Ep::expose`] / [`msgr_fabric::RdmEp::expose`],
//! which honour the provider's `mr_mode`) and sends a descriptor (address,
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
//! What this module holds is transport-independent: the descriptor's
//! encoding, the sending side's bookkeeping, the deadline and the counters.
//! Each transport frames the descriptor and the answer in its own header.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::Bytes;
use msgr_fabric::{Exposed, FabricError, CHECK_LEN};
use msgr_proto::{Frame, FrameError, FrameLimits, Inbound};

use super::{PieceError, Reassembly};
use crate::{SimulatedFault, TransportError};
use msgr_addr::TransportKind;

/// Units larger than this go by `fi_read` rendezvous where the endpoint
/// has `FI_RMA`.
pub const RNDV_THRESHOLD: usize = 64 << 10;
/// Rendezvous units a link may have exposed and not yet read by the peer.
pub const RNDV_MAX: usize = 4;
/// Bytes of a rendezvous descriptor: address, length, key, id, check word.
pub const DESC_LEN: usize = 8 + 8 + 8 + 4 + 8;
/// Bytes of the answer to a descriptor: the sender's id.
pub const DONE_LEN: usize = 4;

/// Why a received descriptor is refused (the link fails).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DescError {
    /// Fewer bytes than a descriptor.
    #[error("short rendezvous descriptor ({0} bytes, want {DESC_LEN})")]
    Short(usize),
    /// A unit of 0 bytes (only its check word) is never sent by rendezvous.
    #[error("rendezvous of 0 bytes")]
    Empty,
    /// Larger than any frame this side accepts.
    #[error("rendezvous of {len} bytes (frame limit {max})")]
    TooLarge {
        /// Length in the descriptor.
        len: u64,
        /// The receiver's frame limit.
        max: u64,
    },
    /// A descriptor where a unit's next piece should be.
    #[error("rendezvous inside a multi-piece unit")]
    InsideUnit,
    /// An answer for a unit this side has not exposed.
    #[error("rendezvous answer for nothing exposed ({0:?})")]
    UnknownDone(Option<u32>),
}

/// Writes `x`'s descriptor at the start of `buf` (at least [`DESC_LEN`]
/// bytes); returns its length.
pub fn encode(buf: &mut [u8], x: &Exposed) -> usize {
    buf[..8].copy_from_slice(&x.addr.to_le_bytes());
    buf[8..16].copy_from_slice(&x.len.to_le_bytes());
    buf[16..24].copy_from_slice(&x.key.to_le_bytes());
    buf[24..28].copy_from_slice(&x.id.to_le_bytes());
    buf[28..36].copy_from_slice(&x.check.to_le_bytes());
    DESC_LEN
}

/// The descriptor at the start of `body`, for a receiver whose frames are
/// at most `max_frame` bytes and whose reassembly is `mid_unit` or not.
pub fn decode(body: &[u8], max_frame: u64, mid_unit: bool) -> Result<Exposed, DescError> {
    let b: &[u8; DESC_LEN] = body
        .get(..DESC_LEN)
        .and_then(|b| b.try_into().ok())
        .ok_or(DescError::Short(body.len()))?;
    let word = |at: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&b[at..at + 8]);
        u64::from_le_bytes(w)
    };
    let x = Exposed {
        addr: word(0),
        len: word(8),
        key: word(16),
        id: u32::from_le_bytes([b[24], b[25], b[26], b[27]]),
        check: word(28),
    };
    if mid_unit {
        return Err(DescError::InsideUnit);
    }
    if x.len <= CHECK_LEN as u64 {
        return Err(DescError::Empty);
    }
    if x.len > max_frame {
        return Err(DescError::TooLarge {
            len: x.len,
            max: max_frame,
        });
    }
    Ok(x)
}

/// A frame encoded as one unit, with spare capacity for the check word
/// when it is large enough to go by rendezvous (`expose` then appends it
/// without copying the unit).
pub fn encode_unit(f: &Frame) -> Result<Vec<u8>, FrameError> {
    let len = f.encoded_len();
    let spare = if len > RNDV_THRESHOLD { CHECK_LEN } else { 0 };
    let mut out = Vec::with_capacity(len + spare);
    f.encode()?.write_into(&mut out);
    Ok(out)
}

/// The id at the start of an answer's body.
pub fn decode_done(body: &[u8]) -> Option<u32> {
    let b = body.get(..DONE_LEN)?;
    Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

/// Whether a read started at `since` has been in flight longer than
/// `timeout` at `now`.
pub fn overdue(since: Instant, now: Instant, timeout: Duration) -> bool {
    now.saturating_duration_since(since) > timeout
}

/// A completed read (`error`: its completion's, `buf`: the endpoint's
/// buffer): its unit decoded at a unit boundary of `reasm`, and counted; or
/// why the link fails.
pub(crate) fn finish_read(
    error: Option<(i32, &'static str)>,
    buf: Option<Result<Vec<u8>, FabricError>>,
    reasm: &mut Reassembly,
    limits: &FrameLimits,
    counters: &mut Counters,
) -> Result<Inbound, PieceError> {
    if let Some((code, what)) = error {
        return Err(PieceError::Malformed(format!(
            "libfabric fi_read {what}: {}",
            std::io::Error::from_raw_os_error(code)
        )));
    }
    let buf = buf
        .ok_or_else(|| PieceError::Malformed("fi_read completed without a buffer".into()))?
        .map_err(|e| PieceError::Malformed(e.to_string()))?;
    counters.read += 1;
    counters.read_bytes += buf.len() as u64;
    reasm.whole(Bytes::from(buf), limits).map_err(|e| match e {
        PieceError::Malformed(why) => {
            PieceError::Malformed(format!("malformed rendezvous unit: {why}"))
        }
        corrupt => corrupt,
    })
}

/// The rendezvous counters of one transport (see [`Counters::values`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct Counters {
    /// Descriptors sent.
    pub sent: u64,
    /// Units fetched by `fi_read`.
    pub read: u64,
    /// Bytes fetched by `fi_read`.
    pub read_bytes: u64,
    /// Units that went eagerly because their registration failed.
    pub fallbacks: u64,
    /// Links failed because a read missed its deadline.
    pub read_timeouts: u64,
    /// Reads whose completion was ignored (`SimulatedFault::HungRead`).
    pub simulated_hung_reads: u64,
}

impl Counters {
    /// The counters by stable name, with whether rendezvous is on and the
    /// gauges of buffers exposed and reads in flight (`(exposed, reading)`).
    pub fn values(&self, enabled: bool, in_use: (usize, usize)) -> Vec<(&'static str, u64)> {
        vec![
            ("rendezvous_enabled", u64::from(enabled)),
            ("rendezvous_sent", self.sent),
            ("rendezvous_read", self.read),
            ("rendezvous_read_bytes", self.read_bytes),
            ("rendezvous_fallbacks", self.fallbacks),
            ("read_timeouts", self.read_timeouts),
            ("simulated_hung_reads", self.simulated_hung_reads),
            ("rendezvous_exposed", in_use.0 as u64),
            ("rendezvous_reading", in_use.1 as u64),
        ]
    }
}

/// The sending side of one link: units exposed and not yet answered,
/// oldest first, and one exposed whose descriptor is not sent yet.
#[derive(Debug, Default)]
pub struct Exposures {
    exposed: VecDeque<u32>,
    unsent: Option<Exposed>,
    /// The queue's front unit could not be exposed: it goes eagerly.
    eager_front: bool,
}

impl Exposures {
    /// Nothing exposed, nothing waiting to be described.
    pub fn is_idle(&self) -> bool {
        self.exposed.is_empty() && self.unsent.is_none()
    }

    /// Whether the queue's front unit (`front_len` bytes, `front_sent` of
    /// them sent eagerly) goes by rendezvous: it then must not be sent in
    /// pieces, even while [`RNDV_MAX`] units are exposed.
    pub fn wants(&self, enabled: bool, front_sent: usize, front_len: Option<usize>) -> bool {
        enabled
            && !self.eager_front
            && front_sent == 0
            && front_len.is_some_and(|n| n > RNDV_THRESHOLD)
    }

    /// The descriptor to send next, if any: the one not sent yet, else the
    /// queue's front unit exposed now if it goes by rendezvous and fewer
    /// than [`RNDV_MAX`] are exposed. A unit whose registration fails stays
    /// at the front, marked to go eagerly.
    pub fn stage(
        &mut self,
        enabled: bool,
        queue: &mut VecDeque<Vec<u8>>,
        front_sent: usize,
        queued: &mut usize,
        counters: &mut Counters,
        expose: impl FnOnce(Vec<u8>) -> Result<Exposed, (FabricError, Vec<u8>)>,
    ) -> Option<Exposed> {
        if self.unsent.is_none()
            && self.exposed.len() < RNDV_MAX
            && self.wants(enabled, front_sent, queue.front().map(Vec::len))
        {
            let unit = queue.pop_front()?;
            let len = unit.len();
            match expose(unit) {
                Ok(x) => {
                    *queued -= len;
                    self.unsent = Some(x);
                }
                Err((e, unit)) => {
                    tracing::debug!(error = %e, "rendezvous registration failed; sending eagerly");
                    counters.fallbacks += 1;
                    queue.push_front(unit);
                    self.eager_front = true;
                }
            }
        }
        self.unsent
    }

    /// The staged descriptor went: it now waits for its answer.
    pub fn sent(&mut self, counters: &mut Counters) {
        if let Some(x) = self.unsent.take() {
            self.exposed.push_back(x.id);
            counters.sent += 1;
        }
    }

    /// The queue's front unit went (eagerly): the next one may go by
    /// rendezvous again.
    pub fn front_gone(&mut self) {
        self.eager_front = false;
    }

    /// The peer read unit `id`: returns whether it was exposed (then the
    /// caller unexposes it).
    pub fn done(&mut self, id: u32) -> bool {
        match self.exposed.iter().position(|&x| x == id) {
            Some(i) => {
                self.exposed.remove(i);
                true
            }
            None => false,
        }
    }

    /// Every exposed unit's id, for a link that goes (the caller unexposes
    /// them).
    pub fn drain(&mut self) -> Vec<u32> {
        let mut ids: Vec<u32> = self.exposed.drain(..).collect();
        ids.extend(self.unsent.take().map(|x| x.id));
        ids
    }
}

/// The receiving side of one link: the read in flight (later messages
/// wait for it) and the answers owed to the sender.
#[derive(Debug, Default)]
pub struct Receiving {
    /// The fi_read in flight.
    pub reading: Option<Reading>,
    /// Answers to send (the sender's ids).
    pub need_done: Vec<u32>,
    /// Reads still to start whose completion is to be ignored
    /// (`SimulatedFault::HungRead`).
    pub reads_to_hang: u32,
}

impl Receiving {
    /// `SimulatedFault::HungRead`: the link's next read is hung. Refused
    /// (`Unavailable`) by a transport without rendezvous (`rndv` false).
    pub fn simulate(
        &mut self,
        fault: SimulatedFault,
        rndv: bool,
        kind: &TransportKind,
    ) -> Result<(), TransportError> {
        match fault {
            SimulatedFault::HungRead if !rndv => Err(TransportError::Unavailable {
                kind: kind.clone(),
                reason: format!(
                    "cannot simulate {fault:?}: no fi_read rendezvous on these endpoints"
                ),
            }),
            SimulatedFault::HungRead => {
                self.reads_to_hang += 1;
                Ok(())
            }
        }
    }

    /// The link posted the read of the sender's unit `their_id` under
    /// `context`: it is in flight from now, and hung if one was asked for.
    pub fn started(&mut self, context: u64, their_id: u32, counters: &mut Counters) {
        let hung = self.reads_to_hang > 0;
        if hung {
            self.reads_to_hang -= 1;
            counters.simulated_hung_reads += 1;
        }
        self.reading = Some(Reading {
            context,
            since: Instant::now(),
            their_id,
            hung,
        });
    }

    /// The link's read completed (see [`finish_read`]): on success its
    /// answer is owed. `None`: no read was in flight, or its completion is
    /// ignored (a simulated hang: it stays in flight until its deadline).
    pub(crate) fn finish(
        &mut self,
        error: Option<(i32, &'static str)>,
        buf: Option<Result<Vec<u8>, FabricError>>,
        reasm: &mut Reassembly,
        limits: &FrameLimits,
        counters: &mut Counters,
    ) -> Option<Result<Inbound, PieceError>> {
        let reading = self.reading.filter(|r| !r.hung)?;
        self.reading = None;
        let unit = finish_read(error, buf, reasm, limits, counters);
        if unit.is_ok() {
            self.need_done.push(reading.their_id);
        }
        Some(unit)
    }
}

/// A read in flight.
#[derive(Clone, Copy, Debug)]
pub struct Reading {
    /// The read's completion context.
    pub context: u64,
    /// When it was posted (see [`overdue`]).
    pub since: Instant,
    /// The sender's id, for the answer.
    pub their_id: u32,
    /// Its completion is ignored (`SimulatedFault::HungRead`).
    pub hung: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc(len: u64) -> [u8; DESC_LEN] {
        let mut b = [0u8; DESC_LEN];
        encode(
            &mut b,
            &Exposed {
                id: 7,
                addr: 0x1000,
                len,
                key: 42,
                check: 0x5eed,
            },
        );
        b
    }

    #[test]
    fn descriptor_round_trips() {
        let x = decode(&desc(100_000), 1 << 20, false).unwrap();
        assert_eq!(
            x,
            Exposed {
                id: 7,
                addr: 0x1000,
                len: 100_000,
                key: 42,
                check: 0x5eed,
            }
        );
        assert_eq!(decode_done(&7u32.to_le_bytes()), Some(7));
    }

    #[test]
    fn bad_descriptors_are_typed_errors() {
        for n in 0..DESC_LEN {
            assert_eq!(
                decode(&desc(100)[..n], 1 << 20, false),
                Err(DescError::Short(n))
            );
        }
        assert_eq!(decode(&desc(0), 1 << 20, false), Err(DescError::Empty));
        assert_eq!(
            decode(&desc(CHECK_LEN as u64), 1 << 20, false),
            Err(DescError::Empty),
            "a check word and nothing else"
        );
        assert_eq!(
            decode(&desc((1 << 20) + 1), 1 << 20, false),
            Err(DescError::TooLarge {
                len: (1 << 20) + 1,
                max: 1 << 20
            })
        );
        assert_eq!(
            decode(&desc(u64::MAX), 1 << 20, false),
            Err(DescError::TooLarge {
                len: u64::MAX,
                max: 1 << 20
            })
        );
        assert_eq!(
            decode(&desc(100), 1 << 20, true),
            Err(DescError::InsideUnit)
        );
        assert_eq!(decode_done(&[1, 2, 3]), None);
    }

    #[test]
    fn a_hung_read_stays_in_flight_until_its_deadline() {
        let mut r = Receiving::default();
        let mut c = Counters::default();
        r.reads_to_hang = 1;
        r.started(5, 9, &mut c);
        assert_eq!(c.simulated_hung_reads, 1);
        let mut reasm = Reassembly::default();
        let limits = FrameLimits::default();
        // Its completion is ignored: still in flight, nothing owed.
        assert!(r
            .finish(None, Some(Ok(vec![1])), &mut reasm, &limits, &mut c)
            .is_none());
        let reading = r.reading.expect("still reading");
        assert!(reading.hung && r.need_done.is_empty() && c.read == 0);
        let t = Duration::from_secs(2);
        assert!(!overdue(reading.since, reading.since + t, t));
        assert!(overdue(reading.since, reading.since + t * 2, t));
        // The next read is not hung.
        r.reading = None;
        r.started(6, 10, &mut c);
        assert!(r.reading.is_some_and(|x| !x.hung));
        assert_eq!(c.simulated_hung_reads, 1);
    }

    #[test]
    fn exposures_bound_and_fall_back() {
        let mut x = Exposures::default();
        let mut c = Counters::default();
        let mut queue: VecDeque<Vec<u8>> = (0..6).map(|_| vec![0u8; RNDV_THRESHOLD + 1]).collect();
        let mut queued = queue.iter().map(Vec::len).sum::<usize>();
        let mut next = 0;
        for _ in 0..RNDV_MAX {
            let got = x.stage(true, &mut queue, 0, &mut queued, &mut c, |m| {
                next += 1;
                Ok(Exposed {
                    id: next,
                    addr: 0,
                    len: m.len() as u64,
                    key: 1,
                    check: 3,
                })
            });
            assert!(got.is_some());
            x.sent(&mut c);
        }
        // Full: nothing staged, and the front must not go eagerly either.
        assert!(x
            .stage(true, &mut queue, 0, &mut queued, &mut c, |_| unreachable!())
            .is_none());
        assert!(x.wants(true, 0, queue.front().map(Vec::len)));
        assert!(x.done(1) && !x.done(1));
        // A failed registration: the unit stays in front, goes eagerly.
        let got = x.stage(true, &mut queue, 0, &mut queued, &mut c, |m| {
            Err((FabricError::Slot(0), m))
        });
        assert!(got.is_none());
        assert_eq!(queue.len(), 2);
        assert!(!x.wants(true, 0, queue.front().map(Vec::len)));
        x.front_gone();
        assert_eq!((c.sent, c.fallbacks), (RNDV_MAX as u64, 1));
        assert_eq!(x.drain().len(), RNDV_MAX - 1);
        assert!(x.is_idle());
    }
}
