//! The engine's send side: queueing ([`Session::send`],
//! [`Session::send_encoded`]), what goes out next
//! ([`Session::poll_transmit`]: control frames first, then messages as
//! far as the in-flight window and the peer's limits let them, then an
//! ack), sealing on a secure link, and the peer's acks releasing the
//! queue.

use std::collections::VecDeque;
use std::time::Instant;

use super::outbox::{Sent, Terms, Unsent, UnsentBatch};
use super::{
    call_allowed, EncodedBatch, FaultReason, LinkId, Outbox, ProtocolError, SendError, Session,
    SessionConfig, SessionEvent, State,
};
use crate::banner::features;
use crate::batch::BatchReader;
use crate::control::{control_frame, Ack, Close};
use crate::fragment::{Fragment, Fragmenter};
use crate::frame::{Frame, Tag, FLAG_UNCHECKED_PAYLOAD};
use crate::message::{Message, MessageFrame};
use crate::priority::Priority;
use crate::stream::Transmit;

/// The outgoing side: the queue, the sequence numbers of what was queued,
/// sent and acknowledged, and the control frames waiting to go.
#[derive(Debug)]
pub(super) struct Outgoing {
    /// Messages from `send` until released, small ones encoded as batch
    /// entries at `send` ([`outbox`](super::outbox)).
    pub(super) outbox: Outbox,
    /// Control frames (and the banner) to transmit before any message.
    pub(super) ctrl: VecDeque<Transmit>,
    /// Whether sent messages are kept until acknowledged and replayed on
    /// a new link (the session's policy, or the peer's for an acceptor).
    pub(super) lossless: bool,
    /// Payload bytes transmitted on the current link and not yet acknowledged.
    pub(super) in_flight_bytes: usize,
    /// Messages queued since the session (re)started: a message's
    /// number in queue order, its sequence number unless lanes
    /// reordered it or fragments came before it (numbers are given when
    /// things are transmitted, [`Outbox`]).
    pub(super) out_seq: u64,
    /// Per class, the last class seq given to a message cut into
    /// fragments.
    pub(super) class_seqs: [u64; Priority::COUNT],
    /// The last sequence number transmitted.
    pub(super) sent_seq: u64,
    /// The last sequence number the peer acknowledged.
    pub(super) acked_seq: u64,
}

impl Outgoing {
    /// Lossless: as much is in flight as the peer may be asked to hold.
    fn window_full(&self, cfg: &SessionConfig) -> bool {
        self.lossless
            && (self.sent_seq - self.acked_seq >= cfg.max_in_flight_messages
                || self.in_flight_bytes >= cfg.max_in_flight_bytes)
    }

    /// Transmits again from the first unacknowledged message (a new link).
    pub(super) fn rewind_to_acked(&mut self) {
        self.sent_seq = self.acked_seq;
        self.in_flight_bytes = 0;
        self.outbox.rewind();
    }

    /// Numbers from 0 again (the peer lost the session; the queue was
    /// dropped).
    pub(super) fn restart(&mut self) {
        self.out_seq = 0;
        self.class_seqs = [0; Priority::COUNT];
        self.sent_seq = 0;
        self.in_flight_bytes = 0;
        self.acked_seq = 0;
    }
}

impl Session {
    /// Whether anything is waiting to be transmitted (an ack that may
    /// still wait for a message to carry it is not: [`Session::poll_timeout`]
    /// says when it goes).
    pub fn wants_transmit(&self) -> bool {
        !self.tx.ctrl.is_empty()
            || (self.is_open()
                && ((self.tx.outbox.has_unsent() && !self.tx.window_full(&self.cfg))
                    || self.ack_pressing()))
    }

    /// Whether what arrived unacknowledged is acknowledged now without
    /// waiting for a message to carry it: no delay is configured, or a
    /// quarter of this side's own in-flight window arrived (the peer's,
    /// if configured alike, is far from full).
    fn ack_pressing(&self) -> bool {
        let unacked = self.rx.in_seq - self.rx.acked_in_seq;
        unacked > 0
            && (self.cfg.ack_delay.is_zero()
                || unacked >= (self.cfg.max_in_flight_messages / 4).max(1)
                || self.rx.unacked_bytes >= self.cfg.max_in_flight_bytes / 4)
    }

    /// Whether an `Ack` frame of its own goes now: something arrived
    /// unacknowledged and it is [pressing](Self::ack_pressing) or its
    /// delay is over.
    fn ack_now(&self, now: Instant) -> bool {
        self.rx.in_seq > self.rx.acked_in_seq
            && (self.ack_pressing() || self.rx.ack_due.is_none_or(|due| now >= due))
    }

    /// When an unacknowledged arrival's `Ack` frame goes, if nothing
    /// carries the ack before (open sessions).
    pub(super) fn ack_deadline(&self) -> Option<Instant> {
        if self.rx.in_seq > self.rx.acked_in_seq {
            Some(self.rx.ack_due.unwrap_or(self.clock.last_rx))
        } else {
            None
        }
    }

    /// Queues a message; it is sent when the session is open. Returns its
    /// number in queue order: its sequence number where no message of
    /// another class and no fragment went before it (numbers are given as
    /// things are transmitted, docs/PROTOCOL.md "Fragment frames"). A
    /// small message is encoded here, as an entry of the batch the
    /// session keeps open for its class (what is transmitted, and kept
    /// for replay, is that encoding); a large one is queued whole.
    pub fn send(&mut self, msg: Message) -> Result<u64, SendError> {
        if self.closing || self.state.is_closed() {
            return Err(SendError::Closed);
        }
        let limits = self.send_limits();
        limits.check(msg.front.len(), msg.data.len())?;
        let (queued, bytes) = (self.tx.outbox.messages(), self.tx.outbox.bytes());
        let (max_messages, max_bytes) = self.cfg.queue_bounds(msg.class());
        if queued >= max_messages || (bytes > 0 && bytes + msg.payload_len() > max_bytes) {
            return Err(SendError::QueueFull {
                messages: queued as u64,
                bytes: bytes as u64,
            });
        }
        self.tx.out_seq += 1;
        if self.batchable(&msg) {
            let terms = Terms {
                limits,
                features: self.remote.features,
            };
            let fits = msg.call == 0 || call_allowed(msg.call, self.remote.features);
            let max = self.cfg.batch_max_bytes;
            self.tx.outbox.push_entry(&msg, terms, fits, max);
        } else {
            self.tx.outbox.push_single(msg);
        }
        Ok(self.tx.out_seq)
    }

    /// Queues messages encoded before they came here, in order after
    /// everything sent before; returns the sequence number of the last.
    /// The queue bounds are checked once for all of them: all or none.
    /// Entries encoded under limits other than the link's, or calls the
    /// link did not agree to, are checked one by one before they are
    /// transmitted (as a batch encoded here before a handshake is).
    pub fn send_encoded(&mut self, batch: EncodedBatch) -> Result<u64, SendError> {
        if self.closing || self.state.is_closed() {
            return Err(SendError::Closed);
        }
        let (count, payload) = (batch.count() as usize, batch.payload());
        if count == 0 {
            return Ok(self.tx.out_seq);
        }
        let (queued, bytes) = (self.tx.outbox.messages(), self.tx.outbox.bytes());
        let (max_messages, max_bytes) = self.cfg.queue_bounds(batch.class());
        if queued + count > max_messages || (bytes > 0 && bytes + payload > max_bytes) {
            return Err(SendError::QueueFull {
                messages: queued as u64,
                bytes: bytes as u64,
            });
        }
        let terms = Terms {
            limits: batch.limits(),
            features: self.remote.features,
        };
        let fits = call_allowed(batch.calls(), self.remote.features);
        self.tx.outbox.push_encoded(batch, terms, fits);
        self.tx.out_seq += count as u64;
        Ok(self.tx.out_seq)
    }

    /// The next unit to transmit and the link it goes to (sealed, on a link
    /// in secure mode).
    pub fn poll_transmit(&mut self, now: Instant) -> Option<(LinkId, Transmit)> {
        let (link, unit) = self.next_transmit(now)?;
        Some((link, self.protect(unit)))
    }

    /// `unit` as it goes on the current link: sealed once the link has a
    /// record layer, except the banner and handshake messages before it.
    pub(super) fn protect(&mut self, unit: Transmit) -> Transmit {
        let Some(record) = self.link_security.record.as_mut() else {
            return unit;
        };
        match &unit {
            Transmit::Banner(_) => unit,
            Transmit::Frame(f) if f.tag == Tag::Auth => unit,
            _ => Transmit::Frame(record.seal(unit)),
        }
    }

    /// A frame refusing this (accepted, not yet routed) link, sealed if the
    /// link is secure: a peer in secure mode takes nothing in the clear.
    pub fn refusal(&mut self, frame: Frame) -> Transmit {
        self.protect(Transmit::Frame(frame))
    }

    pub(super) fn next_transmit(&mut self, now: Instant) -> Option<(LinkId, Transmit)> {
        let link = self.link()?;
        if let Some(t) = self.tx.ctrl.pop_front() {
            self.clock.last_tx = now;
            if self.tx.ctrl.is_empty() && matches!(self.state, State::Draining(l) if l == link) {
                // The close frame is out: now the link may go.
                self.state = State::Closed;
                self.events.push_back(SessionEvent::CloseLink(link));
                self.events.push_back(SessionEvent::Closed);
            }
            if self.tx.ctrl.is_empty() {
                self.refusal_sent(link);
            }
            return Some((link, t));
        }
        if !self.is_open() {
            return None;
        }
        if self.tx.outbox.has_unsent() && !self.tx.window_full(&self.cfg) {
            let unit = self.transmit_next()?;
            self.clock.last_tx = now;
            return Some((link, unit));
        }
        if self.ack_now(now) {
            self.rx.acked();
            self.stats.acks += 1;
            self.clock.last_tx = now;
            return Some((
                link,
                Transmit::Frame(control_frame(
                    Tag::Ack,
                    &Ack {
                        seq: self.rx.in_seq,
                    },
                )),
            ));
        }
        None
    }

    /// Why the peer could not take `msg`, if it could not: over its
    /// limits, or a call where the link did not agree to calls.
    pub(super) fn unsendable(&self, msg: &Message) -> Option<FaultReason> {
        if let Err(t) = self.send_limits().check(msg.front.len(), msg.data.len()) {
            return Some(FaultReason::TooLarge(t));
        }
        (!call_allowed(msg.call, self.remote.features)).then_some(FaultReason::CallsUnsupported)
    }

    /// Whether `msg` goes in a batch: batches are on, the peer reads them
    /// (or it is not known yet: a link that does not agree unbatches them,
    /// [`Session::unbatch`]) and the message is small (at most a quarter
    /// of a batch, so a batch always has room for its first message).
    pub(super) fn batchable(&self, msg: &Message) -> bool {
        (self.remote.features == 0 || self.remote.features & features::BATCH != 0)
            && EncodedBatch::batchable(msg.payload_len(), self.cfg.batch_max_bytes)
    }

    /// What the peer takes on the current link, as a batch records it.
    pub(super) fn terms(&self) -> Terms {
        Terms {
            limits: self.send_limits(),
            features: self.remote.features,
        }
    }

    /// Whether lanes are in use on this link: both banners offered
    /// `LANES` (this side does unless `max_fragment` is 0).
    pub(super) fn lanes(&self) -> bool {
        self.remote.features & features::LANES != 0
    }

    /// The next unit of messages: the next unsent batch, as far as the
    /// in-flight window and the peer's limits let it go (the rest waits),
    /// the next large message in a frame of its own, or the next fragment
    /// of one larger than `max_fragment` where lanes are in use. Each
    /// takes the next sequence numbers as it goes (what is replayed has
    /// them). `None` if the session ended on a message the peer cannot
    /// take: one queued before the peer's limits (or features) were
    /// known can only be refused, so the session ends rather than send it
    /// (and, lossless, replay it into the same refusal for ever). The
    /// caller checked that something is unsent and the window is not
    /// full.
    pub(super) fn transmit_next(&mut self) -> Option<Transmit> {
        let lanes = self.lanes();
        loop {
            match self.tx.outbox.pop_unsent(lanes)? {
                Unsent::Single(msg) => {
                    if let Some(why) = self.unsendable(&msg) {
                        self.tx.outbox.push_front_unsent(Unsent::Single(msg));
                        self.terminate(why);
                        return None;
                    }
                    if lanes && msg.seq == 0 && msg.payload_len() > self.cfg.max_fragment {
                        return self.start_cut(msg);
                    }
                    return Some(self.transmit_single(msg));
                }
                Unsent::Cut(cut) => {
                    if let Some(t) = self.transmit_cut(cut) {
                        return Some(t);
                    }
                }
                Unsent::Fragment(f) if lanes => return Some(self.transmit_fragment(f)),
                Unsent::Fragment(f) => {
                    // Replayed to a peer that no longer reads fragments:
                    // it cannot be sent otherwise without a new number.
                    self.tx.outbox.push_front_unsent(Unsent::Fragment(f));
                    self.terminate(FaultReason::Protocol(ProtocolError::Malformed {
                        what: "fragment",
                        detail: "to replay on a link that did not agree to lanes".into(),
                    }));
                    return None;
                }
                Unsent::Batch(mut b) if self.remote.features & features::BATCH == 0 => {
                    if b.base_seq == 0 {
                        // Numbered now: its messages go next, one by one.
                        b.base_seq = self.tx.sent_seq + 1;
                    }
                    if let Err(e) = self.unbatch(b) {
                        self.terminate(FaultReason::Protocol(e));
                        return None;
                    }
                }
                Unsent::Batch(b) => return self.transmit_batch(b),
            }
        }
    }

    /// `msg` in a `Message` frame of its own, numbered now if it was not.
    fn transmit_single(&mut self, mut msg: Message) -> Transmit {
        if msg.seq == 0 {
            msg.seq = self.tx.sent_seq + 1;
        }
        debug_assert_eq!(msg.seq, self.tx.sent_seq + 1, "transmitted in sequence");
        let flags = if self.remote.features & features::UNCHECKED_PAYLOAD != 0 {
            FLAG_UNCHECKED_PAYLOAD
        } else {
            0
        };
        let len = msg.payload_len();
        if self.tx.lossless {
            self.tx.outbox.keep_sent(Sent::Single(msg.clone()));
        }
        self.rx.acked();
        self.count_transmitted(1, 1, len);
        Transmit::Message(MessageFrame {
            msg,
            ack: self.rx.in_seq,
            flags,
        })
    }

    /// Begins cutting `msg` (larger than a fragment) into fragments: it
    /// takes its class's next class seq, and its first fragment goes.
    fn start_cut(&mut self, mut msg: Message) -> Option<Transmit> {
        let class = msg.class().index();
        self.tx.class_seqs[class] += 1;
        msg.seq = self.tx.class_seqs[class];
        match Fragmenter::new(msg, 0, self.cfg.max_fragment) {
            Ok(cut) => self.transmit_cut(cut),
            Err(e) => {
                // Not reached: the limits bound a segment below 4 GiB and
                // `max_fragment` is not 0 where lanes are offered.
                self.terminate(FaultReason::Protocol(ProtocolError::Malformed {
                    what: "fragment",
                    detail: e.to_string(),
                }));
                None
            }
        }
    }

    /// The next fragment of `cut`; the rest keeps its lane's front
    /// (`None` for a cut with nothing left, which a lane never holds).
    fn transmit_cut(&mut self, mut cut: Fragmenter) -> Option<Transmit> {
        let f = cut.next_numbered(self.tx.sent_seq + 1, self.rx.in_seq)?;
        if !cut.is_done() {
            self.tx.outbox.push_front_unsent(Unsent::Cut(cut));
        }
        Some(self.transmit_fragment(f))
    }

    /// Sends fragment `f` (numbered), carrying the current ack.
    fn transmit_fragment(&mut self, mut f: Fragment) -> Transmit {
        debug_assert_eq!(f.seq, self.tx.sent_seq + 1, "transmitted in sequence");
        f.ack = self.rx.in_seq;
        if let Some(head) = &mut f.head {
            head.ack = f.ack;
        }
        self.rx.acked();
        let (last, len) = (usize::from(f.is_last()), f.piece.len());
        if self.tx.lossless {
            self.tx.outbox.keep_sent(Sent::Fragment(f.clone()));
        }
        self.count_transmitted(1, last, len);
        self.stats.tx_fragments += 1;
        Transmit::Frame(f.into_frame())
    }

    /// Sends `b`, or as much of it as may go now: the whole of it where
    /// the window has room and its entries were checked against the
    /// link's terms when encoded (the common case: no entry is looked at
    /// again); else its entries are walked, and those that may go now go
    /// as a batch of their own.
    pub(super) fn transmit_batch(&mut self, mut b: UnsentBatch) -> Option<Transmit> {
        let fresh = b.base_seq == 0;
        if fresh {
            b.base_seq = self.tx.sent_seq + 1;
        }
        let terms = self.terms();
        let checked = b.fits && b.terms == terms;
        let (max_messages, max_bytes) = (
            self.cfg.max_in_flight_messages,
            self.cfg.max_in_flight_bytes,
        );
        // Room in the window (at least one message: it is not full).
        let room = if self.tx.lossless {
            max_messages.saturating_sub(self.tx.sent_seq - self.tx.acked_seq)
        } else {
            u64::MAX
        };
        let in_window = !self.tx.lossless
            || (u64::from(b.count) <= room && self.tx.in_flight_bytes + b.payload < max_bytes);
        if !checked || !in_window {
            let (mut count, mut len, mut payload, mut refused) = (0u32, 0, 0, None);
            for e in b.extents() {
                let window_full = u64::from(count) >= room
                    || (self.tx.lossless && self.tx.in_flight_bytes + payload >= max_bytes);
                if count > 0 && window_full {
                    break;
                }
                if !checked {
                    if let Err(t) = terms.limits.check(e.front_len, e.data_len) {
                        refused = Some(FaultReason::TooLarge(t));
                    } else if !call_allowed(e.call, self.remote.features) {
                        refused = Some(FaultReason::CallsUnsupported);
                    }
                    if refused.is_some() {
                        break;
                    }
                }
                count += 1;
                len += e.len;
                payload += e.front_len + e.data_len;
            }
            if count == 0 {
                // Its first message cannot go (the entries are ours: they parse).
                if fresh {
                    b.base_seq = 0;
                }
                self.tx.outbox.push_front_unsent(Unsent::Batch(b));
                self.terminate(refused.unwrap_or(FaultReason::CallsUnsupported));
                return None;
            }
            if count < b.count {
                let first = b.split_to(count, len, payload);
                if fresh {
                    // The rest is numbered when it goes.
                    b.base_seq = 0;
                }
                self.tx.outbox.push_front_unsent(Unsent::Batch(b));
                b = first;
            }
            b.terms = terms;
            b.fits = true;
        }
        let (count, payload) = (b.count, b.payload);
        let (body, sent) = b.seal_header(self.rx.in_seq);
        self.rx.acked();
        if self.tx.lossless {
            self.tx.outbox.keep_sent(sent);
        }
        self.count_transmitted(u64::from(count), count as usize, payload);
        self.stats.tx_batches += 1;
        Some(Transmit::Frame(Frame::single(Tag::MessageBatch, body)))
    }

    /// The link did not agree to batches: `b`'s messages go one per
    /// frame (views of its body; a peer of another implementation). An
    /// entry that does not parse is a bug in their encoding (ours, or
    /// the application thread's: [`EncodedBatch`]): the session ends
    /// with it rather than drop messages silently.
    pub(super) fn unbatch(&mut self, b: UnsentBatch) -> Result<(), ProtocolError> {
        let (body, _) = b.seal_header(0);
        let msgs = BatchReader::new(body)?.collect::<Result<Vec<Message>, _>>()?;
        for m in msgs.into_iter().rev() {
            self.tx.outbox.push_front_unsent(Unsent::Single(m));
        }
        Ok(())
    }

    /// Accounts for the next `seqs` sequence numbers having been
    /// transmitted, `messages` messages of `bytes` payload (a fragment
    /// counts its message with its last piece): a lossless session keeps
    /// them for replay, a lossy one forgets them.
    pub(super) fn count_transmitted(&mut self, seqs: u64, messages: usize, bytes: usize) {
        self.stats.tx_messages += messages as u64;
        self.stats.tx_bytes += bytes as u64;
        self.tx.sent_seq += seqs;
        if self.tx.lossless {
            self.tx.in_flight_bytes += bytes;
        } else {
            // Lossy: nothing is replayed, so nothing is kept.
            self.tx.outbox.forget_sent(messages, bytes);
            self.count_released(messages, bytes);
            self.tx.acked_seq = self.tx.sent_seq;
        }
    }

    pub(super) fn apply_ack(&mut self, seq: u64) -> Result<(), ProtocolError> {
        // Compare with what was transmitted, not what was queued: acking a
        // queued message that was never sent would drop it unsent (and made
        // poll_transmit's index underflow).
        if seq > self.tx.sent_seq {
            return Err(ProtocolError::AckBeyondSent {
                acked: seq,
                sent: self.tx.sent_seq,
            });
        }
        if seq <= self.tx.acked_seq {
            return Ok(());
        }
        self.tx.acked_seq = seq;
        let (n, bytes) = self.tx.outbox.release_through(seq);
        // Acknowledged is transmitted (checked above): it was in flight.
        self.tx.in_flight_bytes = self.tx.in_flight_bytes.saturating_sub(bytes);
        self.count_released(n, bytes);
        if self.closing {
            self.maybe_finish_close();
        }
        Ok(())
    }

    /// Counts messages that left the send queue.
    pub(super) fn count_released(&mut self, n: usize, bytes: usize) {
        self.stats.released_messages += n as u64;
        self.stats.released_bytes += bytes as u64;
    }

    /// Drops every queued message; returns how many there were.
    pub(super) fn drop_queued(&mut self) -> u64 {
        let (n, bytes) = self.tx.outbox.drop_all();
        self.tx.in_flight_bytes = 0;
        self.count_released(n, bytes);
        n as u64
    }

    pub(super) fn maybe_finish_close(&mut self) {
        if let State::Open { link, .. } = self.state {
            if self.tx.outbox.messages() == 0 && !self.tx.outbox.has_unsent() {
                let c = Close {
                    reason: "closed".into(),
                };
                self.tx
                    .ctrl
                    .push_back(Transmit::Frame(control_frame(Tag::Close, &c)));
                // poll_transmit sends the close, then ends the session.
                self.state = State::Draining(link);
            }
        }
    }
}
