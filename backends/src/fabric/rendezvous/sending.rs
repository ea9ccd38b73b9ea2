//! The sending side of a link: units exposed to the peer; what the link owes the peer, in order.

use std::collections::VecDeque;

use msgr_fabric::{FabricError, Landing};
use msgr_proto::Frame;

use super::{
    encode_epilogue, encode_grant, Counters, Described, OutUnit, Receiving, DONE_LEN, EPILOGUE_MAX,
    EPILOGUE_MSG_MAX, GRANT_LEN, RNDV_MAX, RNDV_THRESHOLD,
};

/// The queue a unit to expose is taken from: a link's outbox (`outbox`,
/// above this module).
pub trait FrontQueue {
    /// Bytes of the front unit sent already (in pieces).
    fn front_sent(&self) -> usize;
    /// The front unit's length, if any.
    fn front_len(&self) -> Option<usize>;
    fn take_front(&mut self) -> Option<OutUnit>;
    /// Puts back a unit [`FrontQueue::take_front`] took.
    fn put_front(&mut self, unit: OutUnit);
}

/// The sending side of one link: units exposed and not yet answered,
/// oldest first, and one exposed whose descriptor is not sent yet.
#[derive(Debug, Default)]
pub struct Exposures {
    /// Ids exposed (or held for a write), oldest first, and whether a
    /// write of the unit was posted.
    exposed: VecDeque<(u32, bool)>,
    unsent: Option<Described>,
    /// The queue's front unit could not be exposed: it goes eagerly.
    eager_front: bool,
    /// Units written into the peer's grants whose "written" is not sent
    /// yet.
    pub need_written: Vec<u32>,
    /// Late epilogues not sent yet: the unit's id, the words, their length.
    pub need_epilogue: Vec<(u32, [u8; EPILOGUE_MAX], usize)>,
    /// Units held for a write whose epilogue is computed once the write is
    /// posted ([`Exposures::write_posted`]).
    epilogue_after_write: Vec<(u32, Box<Frame>)>,
}

impl Exposures {
    /// Nothing exposed, nothing waiting to be described.
    pub fn is_idle(&self) -> bool {
        self.exposed.is_empty()
            && self.unsent.is_none()
            && self.need_written.is_empty()
            && self.need_epilogue.is_empty()
    }

    /// Whether something of this side waits for a transmit slot (or a
    /// credit) outside the link's queue: a descriptor staged but not sent,
    /// "written" or late epilogues owed. A link whose queue is empty still
    /// has output then, and must be flushed when a slot or credit frees.
    pub fn owes_posts(&self) -> bool {
        self.unsent.is_some() || !self.need_written.is_empty() || !self.need_epilogue.is_empty()
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
        outbox: &mut impl FrontQueue,
        counters: &mut Counters,
        expose: impl FnOnce(OutUnit) -> Result<Described, Box<(FabricError, OutUnit)>>,
    ) -> Option<Described> {
        if self.unsent.is_none()
            && self.exposed.len() < RNDV_MAX
            && self.wants(enabled, outbox.front_sent(), outbox.front_len())
        {
            let unit = outbox.take_front()?;
            match expose(unit) {
                Ok(x) => self.unsent = Some(x),
                Err(refused) => {
                    let (e, unit) = *refused;
                    tracing::debug!(error = %e, "rendezvous registration failed; sending eagerly");
                    counters.fallbacks += 1;
                    outbox.put_front(unit);
                    self.eager_front = true;
                }
            }
        }
        self.unsent.clone()
    }

    /// The staged descriptor went: it now waits for its answer. A late
    /// epilogue is computed now, while the peer reads the unit, and owed
    /// ([`Exposures::need_epilogue`]); that of a unit held for a write once
    /// the write is posted ([`Exposures::write_posted`]), while the unit
    /// moves.
    pub fn sent(&mut self, counters: &mut Counters) {
        if let Some(d) = self.unsent.take() {
            self.exposed.push_back((d.x.id, false));
            counters.sent += 1;
            counters.in_place += u64::from(d.in_place);
            match d.late {
                Some(frame) if d.x.write => self.epilogue_after_write.push((d.x.id, frame)),
                Some(frame) => self.owe_epilogue(d.x.id, &frame, counters),
                None => {}
            }
        }
    }

    /// The write of unit `id` into the peer's grant is posted: its late
    /// epilogue is computed now, and sent before its "written" (both owed).
    pub fn write_posted(&mut self, id: u32, counters: &mut Counters) {
        if let Some(i) = self.epilogue_after_write.iter().position(|e| e.0 == id) {
            let (_, frame) = self.epilogue_after_write.swap_remove(i);
            self.owe_epilogue(id, &frame, counters);
        }
        self.need_written.push(id);
    }

    fn owe_epilogue(&mut self, id: u32, frame: &Frame, counters: &mut Counters) {
        let (words, len) = frame.epilogue_bytes();
        self.need_epilogue.push((id, words, len));
        counters.late_epilogues += 1;
    }

    /// The queue's front unit went (eagerly): the next one may go by
    /// rendezvous again.
    pub fn front_gone(&mut self) {
        self.eager_front = false;
    }

    /// The peer read unit `id`: returns whether it was exposed (then the
    /// caller unexposes it).
    pub fn done(&mut self, id: u32) -> bool {
        match self.exposed.iter().position(|&(x, _)| x == id) {
            Some(i) => {
                self.exposed.remove(i);
                self.epilogue_after_write.retain(|e| e.0 != id);
                true
            }
            None => false,
        }
    }

    /// Every exposed unit's id, for a link that goes (the caller unexposes
    /// them).
    pub fn drain(&mut self) -> Vec<u32> {
        let mut ids: Vec<u32> = self.exposed.drain(..).map(|(x, _)| x).collect();
        ids.extend(self.unsent.take().map(|d| d.x.id));
        self.need_written.clear();
        self.need_epilogue.clear();
        self.epilogue_after_write.clear();
        ids
    }

    /// The peer granted a buffer for unit `id`: returns whether it is ours
    /// to write now (described, held for a write and not written yet); the
    /// caller posts the write and then owes the peer a "written".
    pub fn granted(&mut self, id: u32) -> bool {
        match self.exposed.iter_mut().find(|(x, _)| *x == id) {
            Some((_, written)) if !*written => {
                *written = true;
                true
            }
            _ => false,
        }
    }
}

/// A rendezvous message a link owes its peer besides its data: a late
/// epilogue, a grant, "written" or an answer (`RNDV_DONE`). Both endpoint
/// types send them in the order [`Owed::next`] gives, each under their own
/// kind of message, with the body [`Owed::encode`] writes.
#[derive(Clone, Copy, Debug)]
pub enum Owed {
    /// A unit's late epilogue: the unit's id, the words, their length.
    Epilogue(u32, [u8; EPILOGUE_MAX], usize),
    /// A buffer granted for the peer's unit to be written into.
    Grant(u32, Landing),
    /// Our unit was written into the peer's grant.
    Written(u32),
    /// The peer's unit arrived: it may let it go.
    Done(u32),
}

/// The kinds of message a transport sends [`Owed`] as on its wire.
#[derive(Clone, Copy, Debug)]
pub struct OwedKinds {
    pub epilogue: u8,
    pub grant: u8,
    pub written: u8,
    pub done: u8,
}

/// Bytes of an [`Owed`] message's body at most.
pub const OWED_MAX: usize = EPILOGUE_MSG_MAX;
const _: () = assert!(OWED_MAX >= GRANT_LEN && OWED_MAX >= DONE_LEN);

impl Owed {
    /// What the link owes next, if anything. Late epilogues go first,
    /// oldest first: a receiver then has a unit's epilogue by the time its
    /// write is announced, and places it before taking the unit.
    pub fn next(x: &Exposures, r: &Receiving) -> Option<Owed> {
        if let Some(&(unit, words, len)) = x.need_epilogue.first() {
            return Some(Owed::Epilogue(unit, words, len));
        }
        if let Some(&(unit, landing)) = r.need_grant.last() {
            return Some(Owed::Grant(unit, landing));
        }
        if let Some(&unit) = x.need_written.last() {
            return Some(Owed::Written(unit));
        }
        r.need_done.last().map(|&unit| Owed::Done(unit))
    }

    /// Its kind of message on a wire that numbers them `kinds`.
    pub fn kind(&self, kinds: &OwedKinds) -> u8 {
        match self {
            Owed::Epilogue(..) => kinds.epilogue,
            Owed::Grant(..) => kinds.grant,
            Owed::Written(_) => kinds.written,
            Owed::Done(_) => kinds.done,
        }
    }

    /// Writes the message's body into `buf` (at least [`OWED_MAX`] bytes);
    /// returns its length.
    pub fn encode(&self, buf: &mut [u8]) -> usize {
        match *self {
            Owed::Epilogue(unit, words, len) => encode_epilogue(buf, unit, &words[..len]),
            Owed::Grant(unit, landing) => encode_grant(buf, unit, landing),
            Owed::Written(unit) | Owed::Done(unit) => {
                buf[..DONE_LEN].copy_from_slice(&unit.to_le_bytes());
                DONE_LEN
            }
        }
    }

    /// It was posted: no longer owed.
    pub fn posted(self, x: &mut Exposures, r: &mut Receiving) {
        match self {
            Owed::Epilogue(..) => drop(x.need_epilogue.remove(0)),
            Owed::Grant(..) => drop(r.need_grant.pop()),
            Owed::Written(_) => drop(x.need_written.pop()),
            Owed::Done(_) => drop(r.need_done.pop()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::outbox::Outbox;

    use bytes::Bytes;
    use msgr_fabric::Exposed;
    use msgr_proto::FrameLimits;

    use super::super::tests::exposed;
    use super::super::DescError;
    use crate::fabric::reassembly::Reassembly;

    /// The sending side of a write: a grant is taken once, for a unit
    /// described; the receiving side accepts "written" only for the unit
    /// it granted.
    #[test]
    fn grants_and_written_are_checked() {
        let mut x = Exposures::default();
        let mut c = Counters::default();
        let mut queue = Outbox::default();
        queue.push(OutUnit::Flat(vec![0u8; RNDV_THRESHOLD + 1]));
        let held = Exposed {
            id: 3,
            write: true,
            ..exposed(0, 0)
        };
        let staged = x.stage(true, &mut queue, &mut c, |m| {
            Ok(Described {
                x: Exposed {
                    len: m.len() as u64,
                    ..held
                },
                inline: Vec::new(),
                at: 0,
                in_place: false,
                late: None,
            })
        });
        assert!(staged.is_some());
        assert!(!x.granted(3), "granted before its descriptor went");
        x.sent(&mut c);
        assert!(!x.granted(4), "a unit never described");
        assert!(x.granted(3));
        assert!(!x.granted(3), "granted twice");
        assert!(x.done(3) && x.is_idle());

        let mut r = Receiving::default();
        assert_eq!(r.written(Some(1)), Err(DescError::UnknownWritten(Some(1))));
        r.started(1, None, None, &mut c);
        assert!(r.written(Some(1)).is_err(), "a read is not written");
        r.started(2, Some(0x99), None, &mut c);
        assert_eq!(r.written(Some(2)), Ok(0x99));
        assert!(r.written(Some(1)).is_err() && r.written(None).is_err());
        let mut reasm = Reassembly::default();
        let done = r.finish(
            None,
            Some(Ok(Bytes::from_static(&[1]))),
            &mut reasm,
            &FrameLimits::default(),
            &mut c,
        );
        assert!(done.is_some_and(|u| u.is_err()), "one byte is no frame");
        assert_eq!((c.landed, c.read), (1, 0), "counted as written, not read");
    }

    #[test]
    fn exposures_bound_and_fall_back() {
        let mut x = Exposures::default();
        let mut c = Counters::default();
        let mut queue = Outbox::default();
        for _ in 0..6 {
            queue.push(OutUnit::Flat(vec![0u8; RNDV_THRESHOLD + 1]));
        }
        let mut next = 0;
        for _ in 0..RNDV_MAX {
            let got = x.stage(true, &mut queue, &mut c, |m| {
                next += 1;
                Ok(Described {
                    x: Exposed {
                        id: next,
                        addr: 0,
                        len: m.len() as u64,
                        key: 1,
                        check: 3,
                        word: None,
                        write: false,
                    },
                    inline: Vec::new(),
                    at: 0,
                    in_place: false,
                    late: None,
                })
            });
            assert!(got.is_some());
            x.sent(&mut c);
        }
        // Full: nothing staged, and the front must not go eagerly either.
        assert!(x
            .stage(true, &mut queue, &mut c, |_| unreachable!())
            .is_none());
        assert!(x.wants(true, 0, queue.front_len()));
        assert!(x.done(1) && !x.done(1));
        // A failed registration: the unit stays in front, goes eagerly.
        let got = x.stage(true, &mut queue, &mut c, |m| {
            Err(Box::new((FabricError::Slot(0), m)))
        });
        assert!(got.is_none());
        assert_eq!(queue.len(), 2);
        assert!(!x.wants(true, 0, queue.front_len()));
        x.front_gone();
        assert_eq!((c.sent, c.fallbacks), (RNDV_MAX as u64, 1));
        assert_eq!(x.drain().len(), RNDV_MAX - 1);
        assert!(x.is_idle());
    }
}
