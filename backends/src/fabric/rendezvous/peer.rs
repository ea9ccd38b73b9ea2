//! What a link does through its endpoint to move rendezvous units, the
//! same on both endpoint types: take a peer's offer (read the unit, or
//! grant it a buffer), write a unit of ours into a grant, free a unit the
//! peer answered, and take a unit that landed. The endpoint is reached
//! through [`PeerRma`]: an MSG endpoint is connected to the link's peer, an
//! RDM one names the peer by its address-vector entry. Contexts are the
//! transport's: each numbers its operations its own way.

use std::time::{Duration, Instant};

use msgr_fabric::{Exposed, FabricError, Landing, ReadDone, RmaBuffers, RmaOp};
use msgr_proto::{FrameLimits, Inbound, LinkFailure};

use super::{decode, Counters, DescError, Exposures, Offered, Receiving};
use crate::fabric::post_failure;
use crate::fabric::reassembly::{PieceError, Reassembly};

/// What posting a one-sided operation gives.
pub(crate) type Posted = Result<(), FabricError>;

/// A link's endpoint, aimed at the link's peer: its rendezvous buffers
/// and the one-sided operations on the peer's.
pub(crate) trait PeerRma {
    /// The endpoint's rendezvous buffers.
    fn rma(&mut self) -> &mut RmaBuffers;
    /// Reads the peer's exposed buffer `x` into a buffer of ours, at `at`
    /// among the bytes `around` (`Ep::read`).
    fn read(&mut self, x: &Exposed, context: u64, around: &[u8], at: usize) -> Posted;
    /// Writes our held unit `id` into the peer's grant (`Ep::write`).
    fn write(&mut self, id: u32, landing: Landing, context: u64) -> Posted;
}

fn malformed(why: impl ToString) -> PieceError {
    PieceError::Malformed(why.to_string())
}

/// A peer's descriptor (`body`, see [`decode`]), if it offers its unit by
/// the operation this end moves units by (`ours`).
pub(crate) fn check_offer(
    body: &[u8],
    max_frame: u64,
    mid_unit: bool,
    ours: Option<RmaOp>,
) -> Result<Offered<'_>, PieceError> {
    let d = decode(body, max_frame, mid_unit).map_err(malformed)?;
    let offered = if d.x.write { RmaOp::Write } else { RmaOp::Read };
    if ours != Some(offered) {
        return Err(malformed(DescError::WrongOp { offered, ours }));
    }
    Ok(d)
}

impl Receiving {
    /// Takes the unit `d` offers under `context`: reads it into a buffer
    /// of ours, or grants it one to be written into. Returns whether a
    /// grant is owed to the peer now.
    pub(crate) fn take_offer(
        &mut self,
        d: &Offered<'_>,
        ep: &mut impl PeerRma,
        context: u64,
        counters: &mut Counters,
    ) -> Result<bool, PieceError> {
        let granted = if d.x.write {
            let landing = ep
                .rma()
                .grant(&d.x, context, d.inline, d.at)
                .map_err(|e| malformed(format!("rendezvous grant: {e}")))?;
            self.need_grant.push((d.x.id, landing));
            Some(context)
        } else {
            ep.read(&d.x, context, d.inline, d.at)
                .map_err(|e| malformed(format!("fi_read: {e}")))?;
            None
        };
        self.started(d.x.id, granted, d.late_room(), counters);
        Ok(granted.is_some())
    }

    /// Whether the unit in flight has been so longer than `timeout` at
    /// `now` (its link fails: [`Counters::read_timed_out`]).
    pub fn overdue(&self, now: Instant, timeout: Duration) -> bool {
        self.reading
            .is_some_and(|r| super::overdue(r.since, now, timeout))
    }
}

impl Exposures {
    /// The peer answered unit `done` (`RNDV_DONE`): it is freed on `rma`.
    pub(crate) fn answered(
        &mut self,
        done: Option<u32>,
        rma: &mut RmaBuffers,
    ) -> Result<(), DescError> {
        match done.filter(|&d| self.done(d)) {
            Some(d) => {
                rma.unexpose(d);
                Ok(())
            }
            None => Err(DescError::UnknownDone(done)),
        }
    }

    /// The peer granted a buffer (`grant`, from `RNDV_GRANT`) for a unit
    /// of ours: the unit is written into it under the context `context`
    /// gives for the unit's id, and the peer is owed a "written". Why the
    /// link fails, if it does.
    pub(crate) fn write_granted(
        &mut self,
        grant: Option<(u32, Landing)>,
        ep: &mut impl PeerRma,
        context: impl FnOnce(u32) -> u64,
        counters: &mut Counters,
    ) -> Result<(), LinkFailure> {
        let Some((unit, landing)) = grant.filter(|&(unit, _)| self.granted(unit)) else {
            let unknown = DescError::UnknownGrant(grant.map(|(unit, _)| unit));
            return Err(LinkFailure::Protocol(unknown.to_string()));
        };
        ep.write(unit, landing, context(unit))
            .map_err(|e| post_failure("fi_write", &e))?;
        counters.writes += 1;
        self.write_posted(unit, counters);
        Ok(())
    }
}

/// What became of a rendezvous unit that landed ([`landed`]).
pub(crate) struct Landed {
    /// The endpoint is done with the operation's context; else the
    /// buffer's check word is read next, apart, and the operation
    /// completes again under the same context.
    pub over: bool,
    /// The unit, whole, or why its link fails; `None`: nothing to hand up
    /// (its completion is ignored, its late epilogue is still on its way,
    /// or its link went).
    pub unit: Option<Result<Inbound, PieceError>>,
}

/// The unit under `context` on the endpoint's buffers `rma` landed: its
/// read completed (with `error` if it failed), or the peer said it wrote
/// it into our grant. `link`: the receiving side and reassembly of its
/// link, `None` if the link went. Its late epilogue is put in place if it
/// came, and the buffer is taken from the endpoint even if the completion
/// is then ignored (a simulated hang) or the link went: the provider is
/// done with it.
pub(crate) fn landed(
    link: Option<(&mut Receiving, &mut Reassembly)>,
    rma: &mut RmaBuffers,
    context: u64,
    error: Option<(i32, &'static str)>,
    limits: &FrameLimits,
    counters: &mut Counters,
) -> Landed {
    let (link, placed) = match link {
        Some((receiving, reasm)) => {
            let placed = receiving.place_epilogue(rma, context);
            (Some((receiving, reasm)), placed)
        }
        None => (None, Ok(())),
    };
    let buf = match rma.read_done(context, error.is_none()) {
        // A placement that failed fails the link now; the word's read
        // completes later, with the link gone, and frees the buffer.
        Some(ReadDone::WordNext) => {
            return Landed {
                over: false,
                unit: placed.err().map(Err),
            }
        }
        done => done.and_then(ReadDone::finished),
    };
    let unit = match placed {
        Err(e) => Some(Err(e)),
        Ok(()) => link
            .and_then(|(receiving, reasm)| receiving.finish(error, buf, reasm, limits, counters)),
    };
    Landed { over: true, unit }
}

impl Counters {
    /// A link fails because its unit in flight missed the deadline
    /// `timeout`: counted, and why.
    pub fn read_timed_out(&mut self, timeout: Duration) -> String {
        self.read_timeouts += 1;
        format!("rendezvous unit not complete within {timeout:?} (rdma_read_timeout_ms)")
    }
}
