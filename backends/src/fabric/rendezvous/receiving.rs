//! The receiving side of a link: the unit read (or written) in flight, and the answers owed.

use std::time::Instant;

use bytes::Bytes;
use msgr_fabric::{FabricError, Landing, RmaBuffers};
use msgr_proto::{FrameLimits, Inbound};

use super::{decode_epilogue, Counters, DescError, EPILOGUE_MAX, RNDV_MAX};
use crate::fabric::completion_failure;
use crate::fabric::reassembly::{PieceError, Reassembly};

/// A completed read (`error`: its completion's, `buf`: the endpoint's
/// buffer): its unit decoded at a unit boundary of `reasm`, and counted; or
/// why the link fails.
pub(crate) fn finish_read(
    error: Option<(i32, &'static str)>,
    buf: Option<Result<Bytes, PieceError>>,
    by_write: bool,
    reasm: &mut Reassembly,
    limits: &FrameLimits,
    counters: &mut Counters,
) -> Result<Inbound, PieceError> {
    if let Some(error) = error {
        return Err(PieceError::Failed(completion_failure("fi_read", error)));
    }
    let buf =
        buf.ok_or_else(|| PieceError::Malformed("rendezvous unit without a buffer".into()))??;
    if by_write {
        counters.landed += 1;
        counters.landed_bytes += buf.len() as u64;
    } else {
        counters.read += 1;
        counters.read_bytes += buf.len() as u64;
    }
    reasm.whole(buf, limits).map_err(|e| match e {
        PieceError::Malformed(why) => {
            PieceError::Malformed(format!("malformed rendezvous unit: {why}"))
        }
        corrupt => corrupt,
    })
}

/// The receiving side of one link: the read in flight (later messages
/// wait for it) and the answers owed to the sender.
#[derive(Debug, Default)]
pub struct Receiving {
    /// The fi_read in flight.
    pub reading: Option<Reading>,
    /// Answers to send (the sender's ids).
    pub need_done: Vec<u32>,
    /// Grants to send: the sender's id and the buffer its unit goes into.
    pub need_grant: Vec<(u32, Landing)>,
    /// Reads still to start whose completion is to be ignored
    /// (`SimulatedFault::HungRead`).
    pub reads_to_hang: u32,
    /// Late epilogues that came before their unit did: the sender's id,
    /// the words, their length. At most [`RNDV_MAX`]: no more units may be
    /// exposed.
    epilogues: Vec<(u32, [u8; EPILOGUE_MAX], usize)>,
    /// The unit read (or written) whose late epilogue has not come yet.
    parked: Option<Bytes>,
}

impl Receiving {
    /// Whether answers or grants wait for a transmit slot (as
    /// [`Exposures::owes_posts`](super::Exposures::owes_posts)).
    pub fn owes_posts(&self) -> bool {
        !self.need_done.is_empty() || !self.need_grant.is_empty()
    }

    /// `SimulatedFault::HungRead`: the link's next read is hung. Refused
    /// (`Unavailable`) by a transport without rendezvous (`rndv` false).
    #[cfg(feature = "fault-injection")]
    pub fn hang_next_read(
        &mut self,
        rndv: bool,
        kind: &msgr_addr::TransportKind,
    ) -> Result<(), crate::TransportError> {
        if !rndv {
            return Err(crate::TransportError::Unavailable {
                kind: kind.clone(),
                reason: format!(
                    "cannot simulate {:?}: no rendezvous on these endpoints",
                    crate::SimulatedFault::HungRead
                ),
            });
        }
        self.reads_to_hang += 1;
        Ok(())
    }

    /// The link posted the read of the sender's unit `their_id`, or granted
    /// it the buffer kept under context `granted` (the unit comes by the
    /// peer's write); its epilogue comes late into `late_room` bytes
    /// ([`Offered::late_room`](super::Offered::late_room)) or not. It is in flight from now, and hung
    /// if one was asked for.
    pub fn started(
        &mut self,
        their_id: u32,
        granted: Option<u64>,
        late_room: Option<usize>,
        counters: &mut Counters,
    ) {
        let hung = self.reads_to_hang > 0;
        if hung {
            self.reads_to_hang -= 1;
            counters.simulated_hung_reads += 1;
        }
        self.reading = Some(Reading {
            since: Instant::now(),
            their_id,
            hung,
            granted,
            late_room,
        });
    }

    /// The link's read completed (see [`finish_read`]): on success its
    /// answer is owed. `None`: no read was in flight, or its completion is
    /// ignored (a simulated hang: it stays in flight until its deadline).
    pub(crate) fn finish(
        &mut self,
        error: Option<(i32, &'static str)>,
        buf: Option<Result<Bytes, FabricError>>,
        reasm: &mut Reassembly,
        limits: &FrameLimits,
        counters: &mut Counters,
    ) -> Option<Result<Inbound, PieceError>> {
        let reading = self.reading.filter(|r| !r.hung)?;
        let buf = match (reading.late_room, error, buf) {
            (Some(_), None, Some(Ok(unit))) => {
                // The epilogue is still on its way: the read stays in
                // flight (and under its deadline) until it comes.
                self.parked = Some(unit);
                return None;
            }
            (_, _, buf) => buf.map(|b| b.map_err(|e| PieceError::Malformed(e.to_string()))),
        };
        Some(self.finished(reading, error, buf, reasm, limits, counters))
    }

    /// The late epilogue of the unit in flight, if it came already: to be
    /// placed where the unit lands ([`msgr_fabric::RmaBuffers::place_tail`],
    /// before the unit is taken from the endpoint), from then on no longer
    /// late. An error if it does not fit after the read.
    pub fn epilogue_to_place(&mut self) -> Result<Option<Vec<u8>>, PieceError> {
        let Some(reading) = self.reading.as_mut() else {
            return Ok(None);
        };
        let Some(room) = reading.late_room else {
            return Ok(None);
        };
        let Some(i) = self.epilogues.iter().position(|e| e.0 == reading.their_id) else {
            return Ok(None);
        };
        let (_, words, len) = self.epilogues.swap_remove(i);
        if len > room {
            let e = DescError::BadEpilogue("larger than the bytes after the read");
            return Err(PieceError::Malformed(e.to_string()));
        }
        reading.late_room = None;
        Ok(Some(words[..len].to_vec()))
    }

    /// Places the late epilogue of the unit landing under `context` on
    /// `rma`, if it came already ([`Receiving::epilogue_to_place`]).
    pub(crate) fn place_epilogue(
        &mut self,
        rma: &mut RmaBuffers,
        context: u64,
    ) -> Result<(), PieceError> {
        if let Some(words) = self.epilogue_to_place()? {
            rma.place_tail(context, &words)
                .map_err(|e| PieceError::Malformed(format!("late epilogue: {e}")))?;
        }
        Ok(())
    }

    /// A late epilogue came (`body`, see [`encode_epilogue`](super::encode_epilogue)): the unit it
    /// completes, if that unit was read already and waits for it; else it
    /// is kept for its unit ([`Receiving::epilogue_to_place`]). Refused if
    /// malformed, or if it would be one more kept than units may be
    /// exposed.
    pub(crate) fn epilogue_arrived(
        &mut self,
        body: &[u8],
        reasm: &mut Reassembly,
        limits: &FrameLimits,
        counters: &mut Counters,
    ) -> Result<Option<Result<Inbound, PieceError>>, PieceError> {
        let malformed = |e: DescError| PieceError::Malformed(e.to_string());
        let (id, words) = decode_epilogue(body).map_err(malformed)?;
        let waiting = self
            .reading
            .filter(|r| r.their_id == id && !r.hung && self.parked.is_some());
        let Some(reading) = waiting else {
            if self.epilogues.len() >= RNDV_MAX {
                return Err(malformed(DescError::BadEpilogue(
                    "more than units may be exposed",
                )));
            }
            let mut kept = [0u8; EPILOGUE_MAX];
            kept[..words.len()].copy_from_slice(words);
            self.epilogues.push((id, kept, words.len()));
            return Ok(None);
        };
        let (Some(room), Some(unit)) = (reading.late_room, self.parked.take()) else {
            return Err(malformed(DescError::BadEpilogue(
                "for a unit that has its own",
            )));
        };
        let buf = Some(place_epilogue(unit, room, words));
        Ok(Some(
            self.finished(reading, None, buf, reasm, limits, counters),
        ))
    }

    /// The unit of `reading` is whole: decoded and counted, its answer
    /// owed if it is good.
    fn finished(
        &mut self,
        reading: Reading,
        error: Option<(i32, &'static str)>,
        buf: Option<Result<Bytes, PieceError>>,
        reasm: &mut Reassembly,
        limits: &FrameLimits,
        counters: &mut Counters,
    ) -> Result<Inbound, PieceError> {
        self.reading = None;
        self.parked = None;
        let by_write = reading.granted.is_some();
        let unit = finish_read(error, buf, by_write, reasm, limits, counters);
        if unit.is_ok() {
            self.need_done.push(reading.their_id);
        }
        unit
    }
}

/// `unit` with `words` as its last bytes, where its zero epilogue lies
/// (within the `room` bytes after what was read); why not, if they do not
/// fit there.
fn place_epilogue(unit: Bytes, room: usize, words: &[u8]) -> Result<Bytes, PieceError> {
    let Some(at) = unit
        .len()
        .checked_sub(words.len())
        .filter(|_| words.len() <= room)
    else {
        let why = DescError::BadEpilogue("larger than the bytes after the read");
        return Err(PieceError::Malformed(why.to_string()));
    };
    // A read's buffer is the transport's alone by now: no copy (a granted
    // one is lent by its pool, but a write's epilogue comes before its
    // "written" and was placed already).
    let mut unit = unit
        .try_into_mut()
        .unwrap_or_else(|shared| shared[..].into());
    unit[at..].copy_from_slice(words);
    Ok(unit.freeze())
}

/// A read in flight.
#[derive(Clone, Copy, Debug)]
pub struct Reading {
    /// When it was posted (see [`overdue`](super::overdue)).
    pub since: Instant,
    /// The sender's id, for the answer.
    pub their_id: u32,
    /// Its completion is ignored (`SimulatedFault::HungRead`).
    pub hung: bool,
    /// The unit comes by the peer's write into the buffer granted under
    /// this context; `None`: by our `fi_read`.
    pub granted: Option<u64>,
    /// The unit's epilogue comes late ([`LATE_EPILOGUE`](super::LATE_EPILOGUE)), into at most
    /// this many bytes at its end.
    pub late_room: Option<usize>,
}

impl Receiving {
    /// The peer says it wrote unit `their_id`: the context of the buffer
    /// granted for it, if that is the unit this link waits for.
    pub fn written(&self, their_id: Option<u32>) -> Result<u64, DescError> {
        self.reading
            .and_then(|r| r.granted.filter(|_| Some(r.their_id) == their_id))
            .ok_or(DescError::UnknownWritten(their_id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::time::Duration;

    use super::super::tests::big_frame;
    use super::super::{
        decode, decode_done, decode_grant, encode_epilogue, overdue, DESC_MAX, EPILOGUE_MSG_MAX,
    };

    /// A unit that landed before its late epilogue waits for it; an
    /// epilogue that came first is handed out to be placed; a wrong one
    /// fails the unit's checksum, one that does not fit or one too many
    /// is refused.
    #[test]
    fn a_unit_waits_for_its_late_epilogue() {
        let limits = FrameLimits::default();
        let mut c = Counters::default();
        let mut reasm = Reassembly::default();
        let banner = [0u8; msgr_proto::banner::BANNER_LEN];
        assert!(matches!(
            reasm.push(true, &banner, &limits),
            Ok(Some(Inbound::Banner(_)))
        ));
        let frame = big_frame(100_000, 0);
        let want = frame.encode_to_vec().unwrap();
        let (words, len) = frame.epilogue_bytes();
        let words = &words[..len];
        let landed = {
            let mut v = want.clone();
            let n = v.len();
            v[n - len..].fill(0);
            Bytes::from(v)
        };
        let room = Some(len + 40);
        let epilogue = |id: u32, w: &[u8]| {
            let mut m = [0u8; EPILOGUE_MSG_MAX];
            let n = encode_epilogue(&mut m, id, w);
            m[..n].to_vec()
        };
        let frame_of = |u: Result<Inbound, PieceError>| match u {
            Ok(Inbound::Frame(f)) => f,
            other => panic!("{other:?}"),
        };

        // Landed first: parked until the epilogue comes.
        let mut r = Receiving::default();
        r.started(5, None, room, &mut c);
        assert!(r
            .finish(None, Some(Ok(landed.clone())), &mut reasm, &limits, &mut c)
            .is_none());
        assert!(r.reading.is_some() && r.need_done.is_empty());
        let got = r
            .epilogue_arrived(&epilogue(5, words), &mut reasm, &limits, &mut c)
            .unwrap()
            .expect("the unit");
        assert_eq!(frame_of(got), frame);
        assert!(r.reading.is_none() && r.need_done == [5]);

        // The epilogue first: kept, then handed out once its unit is in
        // flight, and the unit is no longer late.
        let mut r = Receiving::default();
        let kept = r.epilogue_arrived(&epilogue(6, words), &mut reasm, &limits, &mut c);
        assert!(matches!(kept, Ok(None)));
        r.started(6, None, room, &mut c);
        assert_eq!(r.epilogue_to_place().unwrap().as_deref(), Some(words));
        assert_eq!(r.epilogue_to_place().unwrap(), None);
        let unit = r.finish(
            None,
            Some(Ok(Bytes::from(want.clone()))),
            &mut reasm,
            &limits,
            &mut c,
        );
        assert_eq!(frame_of(unit.expect("not parked")), frame);

        // A wrong epilogue: the unit fails its check.
        let mut r = Receiving::default();
        r.started(7, None, room, &mut c);
        assert!(r
            .finish(None, Some(Ok(landed.clone())), &mut reasm, &limits, &mut c)
            .is_none());
        let wrong = vec![0xee; len];
        let got = r.epilogue_arrived(&epilogue(7, &wrong), &mut reasm, &limits, &mut c);
        assert!(
            matches!(got, Ok(Some(Err(PieceError::Corrupt(_))))),
            "{got:?}"
        );

        // Larger than the bytes after the read, parked or placed.
        let mut r = Receiving::default();
        r.started(8, None, Some(len - 4), &mut c);
        assert!(r
            .finish(None, Some(Ok(landed.clone())), &mut reasm, &limits, &mut c)
            .is_none());
        let got = r.epilogue_arrived(&epilogue(8, words), &mut reasm, &limits, &mut c);
        assert!(
            matches!(got, Ok(Some(Err(PieceError::Malformed(_))))),
            "{got:?}"
        );
        let mut r = Receiving::default();
        assert!(matches!(
            r.epilogue_arrived(&epilogue(9, words), &mut reasm, &limits, &mut c),
            Ok(None)
        ));
        r.started(9, None, Some(len - 4), &mut c);
        assert!(matches!(
            r.epilogue_to_place(),
            Err(PieceError::Malformed(_))
        ));

        // No more kept than units may be exposed.
        let mut r = Receiving::default();
        for id in 0..RNDV_MAX as u32 {
            let kept = r.epilogue_arrived(&epilogue(100 + id, words), &mut reasm, &limits, &mut c);
            assert!(matches!(kept, Ok(None)));
        }
        let one_more = r.epilogue_arrived(&epilogue(200, words), &mut reasm, &limits, &mut c);
        assert!(
            matches!(one_more, Err(PieceError::Malformed(_))),
            "{one_more:?}"
        );
    }

    /// Whatever a peer sends as a descriptor, a grant, an answer or a late
    /// epilogue, in whatever order: a typed error or a value, never a
    /// panic. (Seeded, so a failure repeats.)
    #[test]
    fn arbitrary_wire_input_is_an_error_or_a_value() {
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let limits = FrameLimits::default();
        let mut c = Counters::default();
        let mut reasm = Reassembly::default();
        let mut r = Receiving::default();
        for round in 0..20_000u32 {
            let len = (next() % (DESC_MAX as u64 + 8)) as usize;
            let mut body: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            // Small lengths and ids often enough to reach past the checks.
            if let Some(b) = body.get_mut(4) {
                *b %= 24;
            }
            if let Some(b) = body.get_mut(0) {
                *b %= 8;
            }
            if round % 2 == 0 {
                for b in body.iter_mut().skip(1).take(3) {
                    *b = 0;
                }
            }
            let _ = decode(&body, 1 << 20, round % 7 == 0);
            let _ = decode_grant(&body);
            let _ = decode_done(&body);
            if let Ok(d) = decode(&body, 1 << 20, false) {
                assert!(d.at <= d.inline.len());
                assert!(d.late_room().is_none_or(|room| room <= d.inline.len()));
            }
            if let Ok((_, words)) = decode_epilogue(&body) {
                assert!(words.len() % 4 == 0 && words.len() <= EPILOGUE_MAX);
            }
            match next() % 4 {
                0 => r.started(
                    u32::from(body.first().copied().unwrap_or(0)),
                    None,
                    Some(len % 20),
                    &mut c,
                ),
                1 => {
                    let unit = Bytes::from(body.clone());
                    let _ = r.finish(None, Some(Ok(unit)), &mut reasm, &limits, &mut c);
                }
                2 => {
                    if r.epilogue_arrived(&body, &mut reasm, &limits, &mut c)
                        .is_err()
                    {
                        r = Receiving::default();
                    }
                }
                _ => {
                    if r.epilogue_to_place().is_err() {
                        r = Receiving::default();
                    }
                }
            }
        }
    }

    #[test]
    fn a_hung_read_stays_in_flight_until_its_deadline() {
        let mut r = Receiving::default();
        let mut c = Counters::default();
        r.reads_to_hang = 1;
        r.started(9, None, None, &mut c);
        assert_eq!(c.simulated_hung_reads, 1);
        let mut reasm = Reassembly::default();
        let limits = FrameLimits::default();
        // Its completion is ignored: still in flight, nothing owed.
        assert!(r
            .finish(
                None,
                Some(Ok(Bytes::from_static(&[1]))),
                &mut reasm,
                &limits,
                &mut c
            )
            .is_none());
        let reading = r.reading.expect("still reading");
        assert!(reading.hung && r.need_done.is_empty() && c.read == 0);
        let t = Duration::from_secs(2);
        assert!(!overdue(reading.since, reading.since + t, t));
        assert!(overdue(reading.since, reading.since + t * 2, t));
        // The next read is not hung.
        r.reading = None;
        r.started(10, None, None, &mut c);
        assert!(r.reading.is_some_and(|x| !x.hung));
        assert_eq!(c.simulated_hung_reads, 1);
    }
}
