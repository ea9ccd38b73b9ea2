//! A session's send queue, encoded at `send` (Zenoh's `WBatch` is the
//! model): each small message becomes a batch entry in the batch the
//! session keeps open, and the encoded batches are what is transmitted
//! and what is kept for replay until acknowledged. No per-message queue
//! entry, move or reference count remains; a message too large to batch
//! is queued whole, as it is sent in a frame of its own.
//!
//! The session decides framing (window, the peer's limits and features);
//! this keeps the order and the counts. Batch boundaries may change on
//! replay (a partially acknowledged batch is replayed from its first
//! unacknowledged entry); sequence numbers never do.

use std::collections::VecDeque;

use bytes::{Buf, Bytes, BytesMut};

use crate::batch::{
    append_entry, entry_extents, write_header, EntryExtent, EntryParts, BATCH_HEADER_LEN,
    MAX_ENTRY_OVERHEAD,
};
use crate::control::Limits;
use crate::fragment::{Fragment, Fragmenter};
use crate::message::Message;
use crate::priority::Priority;

/// Messages encoded as batch entries before they reach the session: by
/// the application's thread at `msgr::Connection::send`, so that the
/// `Message` never travels to the session's thread and the hand-off, the
/// queue admission and the wake-up are paid once per batch. The session
/// takes it whole ([`super::Session::send_encoded`]) and gives its
/// entries their sequence numbers, which are implicit in a batch (its
/// base and the entries' order).
///
/// Its bytes are header room, then entries (as the session's outbox writes them).
#[derive(Debug)]
pub struct EncodedBatch {
    body: BytesMut,
    count: u32,
    payload: usize,
    /// The entries' call fields or'ed: whether the peer must have agreed
    /// to calls (or to one-sided operations).
    calls: u64,
    /// The peer's limits every entry was checked against.
    limits: Limits,
    /// The class of its messages (a batch is of one class: its entries
    /// travel in its class's lane).
    class: Priority,
    /// Its first entry's priority byte: an entry with the same byte is of
    /// the same class without mapping it (the per-message path).
    priority: u8,
}

impl EncodedBatch {
    /// How many batches' bounds the largest allocation holds.
    pub const SHARED_BATCHES: usize = 4;
    /// The smallest allocation batches are opened in: a connection that
    /// sends a little keeps no more than this spare.
    pub const MIN_ALLOCATION: usize = 2 << 10;

    /// Whether a message of `payload` bytes is encoded into batches under
    /// a `batch_max_bytes` of `max_body` (as the session decides: at most
    /// a quarter of a batch, so a batch always has room for its first).
    pub fn batchable(payload: usize, max_body: usize) -> bool {
        payload <= max_body / 4 && Self::first_entry_room(payload) <= max_body
    }

    /// Bytes a batch needs to hold one entry of `payload` bytes.
    fn first_entry_room(payload: usize) -> usize {
        BATCH_HEADER_LEN + MAX_ENTRY_OVERHEAD + payload
    }

    /// An empty batch of at most `max_body` bytes that has room for an
    /// entry of `payload` bytes: in what is left of `buf`'s allocation if
    /// that entry fits there, else in a new allocation of `alloc` bytes
    /// (or the entry's). A batch never grows, which would copy it: it ends
    /// where its allocation does, so the caller sizes `alloc` by how much
    /// its sender sends ([`EncodedBatch::ended_by_allocation`]). Batches
    /// share allocations, as the outbox's do: one kept for replay holds
    /// what it takes, not a batch's bound, so a sparse sender's batches of
    /// one message each cost about their own size. Its entries were
    /// checked against `limits`.
    pub fn open(buf: &mut BytesMut, payload: usize, alloc: usize, limits: Limits) -> EncodedBatch {
        let need = Self::first_entry_room(payload);
        if buf.capacity() < need {
            *buf = BytesMut::with_capacity(alloc.max(need));
        }
        let mut body = std::mem::take(buf);
        body.clear();
        body.resize(BATCH_HEADER_LEN, 0);
        EncodedBatch {
            body,
            count: 0,
            payload: 0,
            calls: 0,
            limits,
            class: Priority::Data,
            priority: 0,
        }
    }

    /// Ends the batch: what is left of its allocation goes back to
    /// `buf`, for the next batch.
    pub fn close(&mut self, buf: &mut BytesMut) {
        *buf = self.body.split_off(self.body.len());
    }

    /// Appends `msg` as an entry if the body stays within `max_body`
    /// bytes and `msg` is of the batch's class (its first entry's);
    /// `false` (nothing written) if not.
    #[inline]
    pub fn push(&mut self, msg: &Message, max_body: usize) -> bool {
        self.push_parts(&EntryParts::from(msg), max_body)
    }

    /// [`EncodedBatch::push`] of a message's borrowed parts: no
    /// [`Message`] needed. The batch's room is checked once, for the
    /// whole entry.
    pub fn push_parts(&mut self, parts: &EntryParts<'_>, max_body: usize) -> bool {
        if self.count == 0 {
            (self.priority, self.class) = (parts.priority, parts.class());
        } else if parts.priority != self.priority && parts.class() != self.class {
            return false;
        }
        let room = max_body
            .min(self.body.capacity())
            .saturating_sub(self.body.len());
        if append_entry(&mut self.body, parts, room).is_none() {
            return false;
        }
        self.count += 1;
        self.payload += parts.payload_len();
        self.calls |= parts.call;
        true
    }

    /// Whether the batch is full because its allocation ended before
    /// `max_body` did (its sender outgrew the allocation's size).
    pub fn ended_by_allocation(&self, max_body: usize) -> bool {
        self.body.capacity() < max_body
    }

    /// Bytes encoded (header room included).
    pub fn encoded_bytes(&self) -> usize {
        self.body.len()
    }

    /// Heap bytes it holds (its part of the shared allocation).
    pub fn memory_bytes(&self) -> usize {
        self.body.capacity()
    }

    /// Messages encoded.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// Payload bytes of the messages encoded.
    pub fn payload(&self) -> usize {
        self.payload
    }

    /// The limits its entries were checked against.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The class of its messages.
    pub fn class(&self) -> Priority {
        self.class
    }

    /// The entries' call fields or'ed (0: no call).
    pub(super) fn calls(&self) -> u64 {
        self.calls
    }

    /// Its body, as a test corrupts it.
    #[cfg(test)]
    pub(super) fn body_mut(&mut self) -> &mut BytesMut {
        &mut self.body
    }
}

/// What a batch's entries were checked against when they were encoded:
/// the limits and features in force then. A batch encoded under other
/// terms than the link's is checked entry by entry before it is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Terms {
    pub(super) limits: Limits,
    pub(super) features: u64,
}

/// A batch not transmitted yet: its entries follow [`BATCH_HEADER_LEN`]
/// bytes of room in `body`, where the header goes when it is sent.
#[derive(Debug)]
pub(super) struct UnsentBatch {
    /// Its first entry's sequence number; 0 until it is first transmitted
    /// (sequence numbers are given as things go, see [`Outbox`]).
    pub(super) base_seq: u64,
    pub(super) count: u32,
    /// Payload bytes of its messages.
    pub(super) payload: usize,
    pub(super) terms: Terms,
    /// Every entry fits `terms` (a call where calls are not agreed does not).
    pub(super) fits: bool,
    /// The class of its messages.
    pub(super) class: Priority,
    pub(super) body: BytesMut,
}

impl UnsentBatch {
    /// Splits off the first entries, up to (not including) entry
    /// `count`, whose `len` bytes and `payload` the caller measured: they
    /// go now, the rest stays (copied behind a new header's room). The
    /// rest is numbered on from the first part if that was numbered.
    pub(super) fn split_to(&mut self, count: u32, len: usize, payload: usize) -> UnsentBatch {
        let head = self.body.split_to(BATCH_HEADER_LEN + len);
        let mut rest = BytesMut::with_capacity(BATCH_HEADER_LEN + self.body.len());
        rest.resize(BATCH_HEADER_LEN, 0);
        rest.extend_from_slice(&self.body);
        self.body = rest;
        let first = UnsentBatch {
            base_seq: self.base_seq,
            count,
            payload,
            terms: self.terms,
            fits: self.fits,
            class: self.class,
            body: head,
        };
        if self.base_seq != 0 {
            self.base_seq += u64::from(count);
        }
        self.count -= count;
        self.payload -= payload;
        first
    }

    /// The entries' extents (a walk over their heads).
    pub(super) fn extents(&self) -> impl Iterator<Item = EntryExtent> + '_ {
        entry_extents(&self.body[BATCH_HEADER_LEN..])
    }

    /// The finished body: the header written into its room (the batch is
    /// numbered).
    pub(super) fn seal_header(mut self, ack: u64) -> (Bytes, Sent) {
        debug_assert!(self.base_seq != 0, "numbered before it is sealed");
        write_header(&mut self.body, self.base_seq, ack, self.count);
        let body = self.body.freeze();
        let sent = Sent::Batch {
            base_seq: self.base_seq,
            count: self.count,
            payload: self.payload,
            terms: self.terms,
            class: self.class,
            entries: body.slice(BATCH_HEADER_LEN..),
        };
        (body, sent)
    }
}

/// Something to transmit: not numbered yet, in its class's lane; or
/// numbered before (transmitted and not acknowledged when a link
/// failed), in the replay queue.
#[derive(Debug)]
pub(super) enum Unsent {
    Batch(UnsentBatch),
    /// A message in a frame of its own (too large to batch, or batches
    /// off); its `seq` is 0 until it is numbered.
    Single(Message),
    /// A large message being cut into fragments, where lanes were
    /// agreed: it keeps its lane's front until its last fragment went.
    Cut(Fragmenter),
    /// A fragment transmitted before (replay).
    Fragment(Fragment),
}

impl Unsent {
    /// The class it travels in.
    fn class(&self) -> Priority {
        match self {
            Unsent::Batch(b) => b.class,
            Unsent::Single(m) => m.class(),
            Unsent::Cut(c) => c.class(),
            Unsent::Fragment(f) => f.class,
        }
    }

    /// Whether it was numbered (it is replayed with its numbers).
    fn numbered(&self) -> bool {
        match self {
            Unsent::Batch(b) => b.base_seq != 0,
            Unsent::Single(m) => m.seq != 0,
            Unsent::Cut(_) => false,
            Unsent::Fragment(_) => true,
        }
    }
}

/// Something transmitted and kept for replay (lossless) until acknowledged.
#[derive(Debug)]
pub(super) enum Sent {
    Batch {
        base_seq: u64,
        count: u32,
        payload: usize,
        terms: Terms,
        class: Priority,
        /// The entries as sent (the header is written again on replay).
        entries: Bytes,
    },
    Single(Message),
    Fragment(Fragment),
}

impl Sent {
    fn last_seq(&self) -> u64 {
        match self {
            Sent::Batch {
                base_seq, count, ..
            } => base_seq + u64::from(*count) - 1,
            Sent::Single(m) => m.seq,
            Sent::Fragment(f) => f.seq,
        }
    }

    /// Messages it releases once acknowledged: a fragment counts its
    /// message with its last piece.
    fn messages(&self) -> usize {
        match self {
            Sent::Batch { count, .. } => *count as usize,
            Sent::Single(_) => 1,
            Sent::Fragment(f) => usize::from(f.is_last()),
        }
    }

    fn payload(&self) -> usize {
        match self {
            Sent::Batch { payload, .. } => *payload,
            Sent::Single(m) => m.payload_len(),
            Sent::Fragment(f) => f.piece.len(),
        }
    }
}

/// The batch being filled at `send`; its bytes are `Outbox::buf`.
#[derive(Debug, Clone, Copy)]
struct OpenBatch {
    count: u32,
    payload: usize,
    terms: Terms,
    fits: bool,
    class: Priority,
    /// Its place in the order of queueing.
    ticket: u64,
}

/// A session's messages from `send` until released (acknowledged;
/// transmitted, if lossy; or dropped). See the [module docs](self).
///
/// **Lanes.** What is not yet transmitted waits in its class's lane,
/// not numbered: sequence numbers are given as things are transmitted,
/// so the one sequence space of the session (acks, replay, the peer's
/// dedupe) stays as it was while the order of transmission is chosen
/// late. Where lanes were agreed, the most urgent non-empty lane goes
/// first; where not, the oldest thing queued of any lane (its ticket):
/// one FIFO, exactly as before. What was transmitted and not
/// acknowledged when a link failed keeps its numbers and is replayed
/// first, in their order ([`Outbox::rewind`]).
#[derive(Default)]
pub(super) struct Outbox {
    /// The open batch's bytes (header room, then entries), in an
    /// allocation that later batches share: a batch is split off it when
    /// it closes, so batches kept for replay take what they hold, not a
    /// batch's bound each.
    buf: BytesMut,
    open: Option<OpenBatch>,
    /// Not yet numbered, per class, oldest first, each with its ticket
    /// (the order it was queued in; 0 for what was put back: it goes
    /// next). The open batch follows its lane.
    lanes: [VecDeque<(u64, Unsent)>; Priority::COUNT],
    /// The next ticket.
    tickets: u64,
    /// Numbered, not acknowledged when the last link failed: goes before
    /// every lane, in sequence order.
    replay: VecDeque<Unsent>,
    /// Transmitted and not yet acknowledged (lossless), oldest first.
    unacked: VecDeque<Sent>,
    messages: usize,
    bytes: usize,
}

impl std::fmt::Debug for Outbox {
    // No payload bytes in a Debug.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbox")
            .field("messages", &self.messages)
            .field("bytes", &self.bytes)
            .field("lanes", &self.lanes.each_ref().map(VecDeque::len))
            .field("replay", &self.replay.len())
            .field("unacked", &self.unacked.len())
            .field("open", &self.open)
            .finish()
    }
}

impl Outbox {
    /// Messages queued (unsent, or sent and not yet acknowledged).
    pub(super) fn messages(&self) -> usize {
        self.messages
    }

    /// Payload bytes queued.
    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Whether anything waits to be transmitted.
    pub(super) fn has_unsent(&self) -> bool {
        self.open.is_some() || !self.replay.is_empty() || self.lanes.iter().any(|l| !l.is_empty())
    }

    /// Bytes of the queue's own structures and its buffer's allocation
    /// (the payloads of unbatched messages are the application's).
    pub(super) fn memory_bytes(&self) -> usize {
        let unsent: usize = self.lanes.iter().map(VecDeque::capacity).sum();
        self.buf.capacity()
            + unsent * std::mem::size_of::<(u64, Unsent)>()
            + self.replay.capacity() * std::mem::size_of::<Unsent>()
            + self.unacked.capacity() * std::mem::size_of::<Sent>()
    }

    fn ticket(&mut self) -> u64 {
        self.tickets += 1;
        self.tickets
    }

    /// Encodes `msg` as an entry of the open batch (closing it first if
    /// the entry would not fit `max_body`, it is of another class, or it
    /// was encoded under other terms). `fits`: the message fits `terms`.
    /// The caller checked that an entry of `msg` fits an empty batch.
    pub(super) fn push_entry(&mut self, msg: &Message, terms: Terms, fits: bool, max_body: usize) {
        let payload = msg.payload_len();
        let class = msg.class();
        if let Some(open) = &mut self.open {
            let room = max_body.saturating_sub(self.buf.len());
            if open.terms == terms
                && open.class == class
                && append_entry(&mut self.buf, &EntryParts::from(msg), room).is_some()
            {
                open.count += 1;
                open.payload += payload;
                open.fits &= fits;
                self.messages += 1;
                self.bytes += payload;
                return;
            }
            self.close_open();
        }
        if self.buf.capacity() == 0 {
            // The first batch sets the size of the allocations batches
            // share (later ones reuse a freed one, or take one this size).
            self.buf = BytesMut::with_capacity(max_body);
        }
        self.buf.resize(BATCH_HEADER_LEN, 0);
        let room = max_body - BATCH_HEADER_LEN;
        let encoded = append_entry(&mut self.buf, &EntryParts::from(msg), room);
        debug_assert!(encoded.is_some(), "the session checked it is batchable");
        let ticket = self.ticket();
        self.open = Some(OpenBatch {
            count: 1,
            payload,
            terms,
            fits,
            class,
            ticket,
        });
        self.messages += 1;
        self.bytes += payload;
    }

    /// Queues `batch`, encoded elsewhere, as the next batch of its class.
    /// `fits`: every entry fits `terms` (the caller knows from the
    /// batch's limits and calls).
    pub(super) fn push_encoded(&mut self, batch: EncodedBatch, terms: Terms, fits: bool) {
        self.close_open();
        self.messages += batch.count as usize;
        self.bytes += batch.payload;
        let ticket = self.ticket();
        self.lanes[batch.class.index()].push_back((
            ticket,
            Unsent::Batch(UnsentBatch {
                base_seq: 0,
                count: batch.count,
                payload: batch.payload,
                terms,
                fits,
                class: batch.class,
                body: batch.body,
            }),
        ));
    }

    /// Queues `msg` to go in a frame of its own (or in fragments).
    pub(super) fn push_single(&mut self, mut msg: Message) {
        self.close_open();
        self.messages += 1;
        self.bytes += msg.payload_len();
        // Numbered when it goes.
        msg.seq = 0;
        let ticket = self.ticket();
        self.lanes[msg.class().index()].push_back((ticket, Unsent::Single(msg)));
    }

    fn close_open(&mut self) {
        if let Some(o) = self.open.take() {
            self.lanes[o.class.index()].push_back((
                o.ticket,
                Unsent::Batch(UnsentBatch {
                    base_seq: 0,
                    count: o.count,
                    payload: o.payload,
                    terms: o.terms,
                    fits: o.fits,
                    class: o.class,
                    body: self.buf.split(),
                }),
            ));
        }
    }

    /// Takes the next thing to transmit: what is replayed first; then,
    /// with `lanes`, the front of the most urgent lane that has
    /// something, else the oldest front of any (the open batch closes
    /// when its turn comes).
    pub(super) fn pop_unsent(&mut self, lanes: bool) -> Option<Unsent> {
        if let Some(u) = self.replay.pop_front() {
            return Some(u);
        }
        let open = self.open.map(|o| (o.ticket, o.class.index()));
        let lane = if lanes {
            let first = self.lanes.iter().position(|l| !l.is_empty());
            match (first, open) {
                (Some(f), Some((_, o))) if o >= f => f,
                (Some(f), None) => f,
                (_, Some((_, o))) => {
                    self.close_open();
                    o
                }
                (None, None) => return None,
            }
        } else {
            let oldest = (0..Priority::COUNT)
                .filter_map(|i| self.lanes[i].front().map(|(t, _)| (*t, i)))
                .min();
            match (oldest, open) {
                (Some((_, i)), _) => i,
                (None, Some((_, o))) => {
                    self.close_open();
                    o
                }
                (None, None) => return None,
            }
        };
        self.lanes[lane].pop_front().map(|(_, u)| u)
    }

    /// Puts back what [`Outbox::pop_unsent`] took (or the rest of it): to
    /// the front of the replay queue if it was numbered, else of its lane.
    pub(super) fn push_front_unsent(&mut self, unsent: Unsent) {
        if unsent.numbered() {
            self.replay.push_front(unsent);
        } else {
            self.lanes[unsent.class().index()].push_front((0, unsent));
        }
    }

    /// Keeps what was transmitted for replay.
    pub(super) fn keep_sent(&mut self, sent: Sent) {
        self.unacked.push_back(sent);
    }

    /// Forgets `messages` messages of `bytes` just transmitted (lossy:
    /// nothing is replayed).
    pub(super) fn forget_sent(&mut self, messages: usize, bytes: usize) {
        self.messages -= messages;
        self.bytes -= bytes;
    }

    /// Releases everything up to and including sequence number `seq`
    /// (acknowledged); returns the messages and payload bytes released.
    /// A batch acknowledged in part keeps its other entries.
    pub(super) fn release_through(&mut self, seq: u64) -> (usize, usize) {
        let (mut messages, mut bytes) = (0, 0);
        while let Some(front) = self.unacked.front_mut() {
            if front.last_seq() <= seq {
                messages += front.messages();
                bytes += front.payload();
                self.unacked.pop_front();
                continue;
            }
            if let Sent::Batch {
                base_seq,
                count,
                payload,
                entries,
                ..
            } = front
            {
                if *base_seq <= seq {
                    // The peer acknowledged part of a batch (its entries
                    // came in other frames on an earlier link).
                    let k = (seq - *base_seq + 1) as usize;
                    let (len, released) =
                        entry_extents(entries).take(k).fold((0, 0), |(l, p), e| {
                            (l + e.len, p + e.front_len + e.data_len)
                        });
                    entries.advance(len);
                    *base_seq = seq + 1;
                    *count -= k as u32;
                    *payload -= released;
                    messages += k;
                    bytes += released;
                }
            }
            break;
        }
        self.messages -= messages;
        self.bytes -= bytes;
        (messages, bytes)
    }

    /// Makes everything transmitted and not acknowledged unsent again
    /// (a new link replays it with its numbers), before every lane.
    pub(super) fn rewind(&mut self) {
        while let Some(sent) = self.unacked.pop_back() {
            let unsent = match sent {
                Sent::Batch {
                    base_seq,
                    count,
                    payload,
                    terms,
                    class,
                    entries,
                } => {
                    let mut body = BytesMut::with_capacity(BATCH_HEADER_LEN + entries.len());
                    body.resize(BATCH_HEADER_LEN, 0);
                    body.extend_from_slice(&entries);
                    Unsent::Batch(UnsentBatch {
                        base_seq,
                        count,
                        payload,
                        terms,
                        fits: true,
                        class,
                        body,
                    })
                }
                Sent::Single(m) => Unsent::Single(m),
                Sent::Fragment(f) => Unsent::Fragment(f),
            };
            self.replay.push_front(unsent);
        }
    }

    /// Drops everything; returns the messages and payload bytes dropped.
    pub(super) fn drop_all(&mut self) -> (usize, usize) {
        self.open = None;
        self.buf.clear();
        for lane in &mut self.lanes {
            lane.clear();
        }
        self.replay.clear();
        self.unacked.clear();
        let dropped = (self.messages, self.bytes);
        (self.messages, self.bytes) = (0, 0);
        dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::BatchReader;

    const MAX: usize = 512;

    fn terms() -> Terms {
        Terms {
            limits: Limits {
                max_front: 1 << 20,
                max_data: 1 << 20,
            },
            features: 0,
        }
    }

    fn msg(i: u8) -> Message {
        Message::new(u16::from(i), vec![i; usize::from(i % 3)], vec![i; 10])
    }

    /// Sends messages 1..=n as entries; returns the outbox.
    fn filled(n: u8) -> Outbox {
        let mut o = Outbox::default();
        for i in 1..=n {
            o.push_entry(&msg(i), terms(), true, MAX);
        }
        o
    }

    /// The messages a batch carries, as the peer reads them.
    fn read(body: Bytes) -> Vec<(u64, u16, usize)> {
        BatchReader::new(body)
            .unwrap()
            .map(|m| {
                let m = m.unwrap();
                (m.seq, m.msg_type, m.payload_len())
            })
            .collect()
    }

    fn want(seqs: std::ops::RangeInclusive<u8>) -> Vec<(u64, u16, usize)> {
        seqs.map(|i| (u64::from(i), u16::from(i), msg(i).payload_len()))
            .collect()
    }

    /// The next batch, numbered from `next` if it was not (as the
    /// session numbers what it transmits).
    fn next_batch(o: &mut Outbox, next: u64) -> UnsentBatch {
        match o.pop_unsent(true) {
            Some(Unsent::Batch(mut b)) => {
                if b.base_seq == 0 {
                    b.base_seq = next;
                }
                b
            }
            other => panic!("expected a batch, got {other:?}"),
        }
    }

    #[test]
    fn entries_encoded_at_send_are_the_batch_sent_and_split_where_asked() {
        let mut o = filled(5);
        assert_eq!(
            (o.messages(), o.bytes()),
            (5, (1..=5).map(|i| msg(i).payload_len()).sum())
        );
        let mut b = next_batch(&mut o, 1);
        assert_eq!((b.base_seq, b.count), (1, 5));
        // A window of two: the first two go, the rest waits.
        let ext: Vec<EntryExtent> = b.extents().collect();
        assert_eq!(ext.len(), 5);
        let (len, payload) = ext[..2].iter().fold((0, 0), |(l, p), e| {
            (l + e.len, p + e.front_len + e.data_len)
        });
        let first = b.split_to(2, len, payload);
        let (body, sent) = first.seal_header(9);
        assert_eq!(BatchReader::new(body.clone()).unwrap().ack(), 9);
        assert_eq!(read(body), want(1..=2));
        o.keep_sent(sent);
        let (body, sent) = b.seal_header(0);
        assert_eq!(read(body), want(3..=5));
        o.keep_sent(sent);
        assert!(o.pop_unsent(true).is_none());
        // Released in order, the counts with them.
        assert_eq!(o.release_through(2), (2, payload));
        assert_eq!(o.messages(), 3);
    }

    #[test]
    fn a_partly_acknowledged_batch_is_replayed_from_its_first_unacknowledged_entry() {
        let mut o = filled(6);
        let (body, sent) = next_batch(&mut o, 1).seal_header(0);
        assert_eq!(read(body), want(1..=6));
        o.keep_sent(sent);
        // More sent meanwhile: it goes after the replay.
        o.push_entry(&msg(7), terms(), true, MAX);
        let released = o.release_through(4);
        assert_eq!(released, (4, (1..=4).map(|i| msg(i).payload_len()).sum()));
        o.rewind();
        // Replayed with its numbers, then the new one numbered on.
        let (body, _) = next_batch(&mut o, 0).seal_header(0);
        assert_eq!(read(body), want(5..=6));
        let (body, _) = next_batch(&mut o, 7).seal_header(0);
        assert_eq!(read(body), want(7..=7));
        assert_eq!(o.messages(), 3);
        assert_eq!(o.drop_all().0, 3);
        assert_eq!((o.messages(), o.bytes()), (0, 0));
    }

    #[test]
    fn a_full_batch_new_terms_or_another_class_start_another_and_singles_keep_their_place() {
        let mut o = Outbox::default();
        let big = Message::new(1, Bytes::new(), vec![0u8; 100]);
        for _ in 1..=5 {
            o.push_entry(&big, terms(), true, 4 * 100);
        }
        let mut other = terms();
        other.features = 1;
        o.push_entry(&msg(6), other, true, 4 * 100);
        o.push_single(msg(7));
        o.push_entry(&msg(8), other, true, 4 * 100);
        o.push_entry(
            &msg(9).with_class(Priority::Background),
            other,
            true,
            4 * 100,
        );
        // Without lanes: one FIFO, whatever the classes.
        let counts: Vec<(u16, u32)> = std::iter::from_fn(|| o.pop_unsent(false))
            .map(|u| match u {
                Unsent::Batch(b) => (read_first_type(&b), b.count),
                Unsent::Single(m) => (m.msg_type, 0),
                other => panic!("{other:?}"),
            })
            .collect();
        // 3 entries of 106 bytes fit 400 with the header; then new terms.
        assert_eq!(counts, [(1, 3), (1, 2), (6, 1), (7, 0), (8, 1), (9, 1)]);
    }

    /// The type of a batch's first entry.
    fn read_first_type(b: &UnsentBatch) -> u16 {
        let mut body = BytesMut::from(&b.body[..]);
        write_header(&mut body, 1, 0, b.count);
        BatchReader::new(body.freeze())
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .msg_type
    }

    #[test]
    fn with_lanes_the_most_urgent_class_goes_first_and_replay_before_all() {
        let mut o = Outbox::default();
        let bulk =
            |i: u16| Message::new(i, Bytes::new(), vec![0u8; 100]).with_class(Priority::Background);
        o.push_single(bulk(1));
        o.push_single(bulk(2));
        o.push_entry(&msg(3), terms(), true, MAX);
        o.push_entry(
            &msg(4).with_class(Priority::Interactive),
            terms(),
            true,
            MAX,
        );
        o.push_entry(&msg(5), terms(), true, MAX);
        let order = |o: &mut Outbox, lanes: bool| -> Vec<u16> {
            std::iter::from_fn(|| o.pop_unsent(lanes))
                .map(|u| match u {
                    Unsent::Batch(b) => read_first_type(&b),
                    Unsent::Single(m) => m.msg_type,
                    other => panic!("{other:?}"),
                })
                .collect()
        };
        // Interactive, then data (3 and 5: two batches, the class changed
        // in between), then background in its order.
        assert_eq!(order(&mut o, true), [4, 3, 5, 1, 2]);
        // Something numbered and rewound goes before every lane.
        let mut sent = bulk(6);
        sent.seq = 1;
        o.keep_sent(Sent::Single(sent));
        o.push_entry(
            &msg(7).with_class(Priority::Interactive),
            terms(),
            true,
            MAX,
        );
        o.rewind();
        assert_eq!(order(&mut o, true), [6, 7]);
    }
}
