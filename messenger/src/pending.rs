//! A connection's messages between `send` and the worker: encoded as
//! batch entries on the sender's thread, or kept whole; and why a send
//! is refused (the session's `SendError`, msgr's one).

use bytes::BytesMut;
use msgr_proto::batch::EntryParts;
use msgr_proto::control::Limits;
use msgr_proto::rma::{RmaRequest, RMA_BIT};
use msgr_proto::session::EncodedBatch;
use msgr_proto::Message;

/// A message could not be sent.
///
/// ```
/// # use std::{sync::Arc, time::Duration};
/// # use msgr::{EntityName, Inbox, Message, Messenger, NullDispatcher};
/// # let inbox = Inbox::new();
/// # let server = Messenger::builder(EntityName::server(1)).without_env()
/// #     .bind("tcp://127.0.0.1:0".parse()?).start(inbox.dispatcher())?;
/// # let client = Messenger::builder(EntityName::client(1)).without_env()
/// #     .start(Arc::new(NullDispatcher))?;
/// # let conn = client.connect(server.addr().expect("bound"))?;
/// use msgr::SendError;
/// conn.mark_down();
/// # while conn.state() != msgr::ConnectionState::Closed { std::thread::sleep(Duration::from_millis(1)); }
/// let refused = conn.send(Message::new(1, &b"late"[..], &b""[..])).unwrap_err();
/// assert_eq!(refused.error, SendError::Closed);
/// assert_eq!(&refused.message.front[..], b"late"); // the message comes back
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub use msgr_proto::SendError;

/// A send that was refused, with what it refused: the message (a batch's
/// messages, for [`Connection::send_batch`](crate::Connection::send_batch)) comes back unchanged, to send
/// again later, elsewhere, or to drop — as `std::sync::mpsc::SendError`
/// gives its value back. Its `Display` is the [`SendError`]'s, and `?`
/// turns it into that [`SendError`] (dropping the message), a
/// [`crate::CallError`], or a boxed error.
///
/// ```no_run
/// use msgr::{Connection, Message, SendError, SendRejected};
///
/// /// Sends `msg`, keeping it for later if the queue is full.
/// fn send_or_keep(conn: &Connection, msg: Message, later: &mut Vec<Message>) -> Result<(), SendError> {
///     match conn.send(msg) {
///         Ok(()) => Ok(()),
///         Err(SendRejected { error: SendError::QueueFull { .. }, message }) => {
///             later.push(message);
///             Ok(())
///         }
///         Err(other) => Err(other.into()),
///     }
/// }
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct SendRejected<M = Message> {
    /// Why it was refused.
    pub error: SendError,
    /// What was refused, given back.
    pub message: M,
}

impl<M> SendRejected<M> {
    /// The message refused.
    pub fn into_message(self) -> M {
        self.message
    }
}

/// The error only: a message's bytes are no debugging aid (and may be large).
impl<M> std::fmt::Debug for SendRejected<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendRejected")
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

impl<M> std::fmt::Display for SendRejected<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

impl<M> std::error::Error for SendRejected<M> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(&self.error)
    }
}

impl<M> From<SendRejected<M>> for SendError {
    fn from(r: SendRejected<M>) -> SendError {
        r.error
    }
}

/// What [`Connection::send`](crate::Connection::send) hands to the worker: small messages encoded
/// as batch entries on the sender's thread, so that the `Message` never
/// travels to the worker and the hand-off (one [`Command::Flush`](crate::state::Command::Flush), at
/// most one wake-up) is paid once per batch, not per message.
pub(crate) enum Outgoing {
    Batch(EncodedBatch),
    /// A message in a frame of its own (large).
    Message(Message),
    /// A one-sided operation's request: the worker may carry it natively.
    /// Boxed so that the common items stay as small as a message.
    Rma(Box<RmaCall>),
}

impl Outgoing {
    pub(crate) fn batch(&self) -> Option<&EncodedBatch> {
        match self {
            Outgoing::Batch(b) => Some(b),
            Outgoing::Message(_) | Outgoing::Rma(_) => None,
        }
    }
}

/// A one-sided operation's request as the caller built it, and encoded
/// in the message that goes to the owner: the worker looks it up for a
/// native path without decoding the message again.
pub(crate) struct RmaCall {
    pub(crate) request: RmaRequest,
    pub(crate) msg: Message,
}

/// What a connection's send path queues: a message, or an RMA request.
pub(crate) trait Queued {
    /// The message admitted against the queue's bounds and the peer's
    /// limits.
    fn message(&self) -> &Message;
    /// Marks it as call `id`'s request.
    fn set_call(&mut self, id: u64);
    /// Queues it on `pending`, in order.
    fn push(self, pending: &mut Pending, max_body: usize, limits: Limits);
}

impl Queued for Message {
    fn message(&self) -> &Message {
        self
    }
    fn set_call(&mut self, id: u64) {
        self.call = id;
    }
    #[inline]
    fn push(self, pending: &mut Pending, max_body: usize, limits: Limits) {
        pending.push(self, max_body, limits);
    }
}

impl Queued for RmaCall {
    fn message(&self) -> &Message {
        &self.msg
    }
    fn set_call(&mut self, id: u64) {
        self.msg.call = id;
    }
    fn push(self, pending: &mut Pending, _: usize, _: Limits) {
        pending.close_open();
        pending.items.push(Outgoing::Rma(Box::new(self)));
    }
}

/// A connection's messages between `send` and the worker's session, in
/// order (see [`Outgoing`]).
#[derive(Default)]
pub(crate) struct Pending {
    /// Closed batches and unbatched messages, oldest first (`open` follows).
    pub(crate) items: Vec<Outgoing>,
    /// The batch being filled.
    pub(crate) open: Option<EncodedBatch>,
    /// The rest of the allocation the last batch was taken from, for the
    /// next ([`EncodedBatch::open`]).
    pub(crate) spare: BytesMut,
    /// The size of the next allocation batches are opened in (0 until
    /// the first): [`EncodedBatch::MIN_ALLOCATION`], four times larger each
    /// time a batch ends at its allocation (up to
    /// [`EncodedBatch::SHARED_BATCHES`] bounds), four times smaller when
    /// the worker takes less than a 32nd of it at once. A connection that
    /// sent a burst and went quiet so keeps no large spare.
    pub(crate) alloc: usize,
    /// A [`Command::Flush`](crate::state::Command::Flush) is on its way to the worker: later sends only
    /// add to what it will take.
    pub(crate) scheduled: bool,
    /// Messages and payload bytes handed to `send` (admitted).
    pub(crate) submitted: [u64; 2],
    /// Messages and bytes that may be admitted without looking at what
    /// the worker released: the room the last full check found, less what
    /// came since (a lower bound, as releases only add room). The queue
    /// bounds are then checked once per batch or so, not per message.
    pub(crate) room: [u64; 2],
}

impl Pending {
    /// Queues `msg`: as an entry of the open batch (a new one when it is
    /// full or was checked against other limits), or whole.
    pub(crate) fn push(&mut self, msg: Message, max_body: usize, limits: Limits) {
        if !self.encode(&EntryParts::from(&msg), max_body, limits) {
            self.push_whole(msg);
        }
    }

    /// [`Pending::push`] of borrowed parts: encoded as an entry where
    /// they go in batches, else copied into a [`Message`] that goes whole.
    pub(crate) fn push_parts(&mut self, parts: &EntryParts<'_>, max_body: usize, limits: Limits) {
        if !self.encode(parts, max_body, limits) {
            self.push_whole(parts.to_message());
        }
    }

    /// Encodes `msg` as an entry of the open batch (a new one when it is
    /// full, was checked against other limits or holds another class),
    /// if it goes in batches;
    /// `false` if it goes whole ([`Pending::push_whole`]). The caller
    /// keeps the `Message`: moving it here cost more than its encoding's
    /// bookkeeping.
    pub(crate) fn encode(&mut self, msg: &EntryParts<'_>, max_body: usize, limits: Limits) -> bool {
        if msg.call & RMA_BIT != 0 || !EncodedBatch::batchable(msg.payload_len(), max_body) {
            return false;
        }
        if let Some(open) = &mut self.open {
            if open.limits() == limits {
                // (It refuses a message of another class: a batch travels
                // in its class's lane.)
                if open.push_parts(msg, max_body) {
                    return true;
                }
                if open.class() == msg.class() && open.ended_by_allocation(max_body) {
                    self.alloc = self.alloc.saturating_mul(4);
                }
            }
        }
        self.close_open();
        let largest = (EncodedBatch::SHARED_BATCHES * max_body).max(EncodedBatch::MIN_ALLOCATION);
        self.alloc = self.alloc.clamp(EncodedBatch::MIN_ALLOCATION, largest);
        let mut batch = EncodedBatch::open(&mut self.spare, msg.payload_len(), self.alloc, limits);
        // (An entry of a batchable message fits an empty batch.)
        let encoded = batch.push_parts(msg, max_body);
        self.open = Some(batch);
        encoded
    }

    /// Queues `msg` to go in a frame of its own, in order.
    pub(crate) fn push_whole(&mut self, msg: Message) {
        self.close_open();
        self.items.push(Outgoing::Message(msg));
    }

    pub(crate) fn close_open(&mut self) {
        if let Some(mut b) = self.open.take() {
            b.close(&mut self.spare);
            self.items.push(Outgoing::Batch(b));
        }
    }

    /// Heap bytes it holds: batches the worker has not taken yet and the
    /// spare allocation the next batch is opened in (`Messenger::memory`
    /// counts them with the connection's session).
    pub(crate) fn memory_bytes(&self) -> usize {
        let batches = self.items.iter().filter_map(Outgoing::batch);
        self.spare.capacity()
            + self.open.as_ref().map_or(0, EncodedBatch::memory_bytes)
            + self.items.capacity() * std::mem::size_of::<Outgoing>()
            + batches.map(EncodedBatch::memory_bytes).sum::<usize>()
    }

    /// Everything queued, into `into` (empty; this keeps its allocation
    /// for the next sends): the worker's turn.
    pub(crate) fn take(&mut self, into: &mut Vec<Outgoing>) {
        self.close_open();
        self.scheduled = false;
        let batches = self.items.iter().filter_map(Outgoing::batch);
        let taken: usize = batches.map(EncodedBatch::encoded_bytes).sum();
        if taken * 32 < self.alloc {
            self.alloc = (self.alloc / 4).max(EncodedBatch::MIN_ALLOCATION);
            if self.spare.capacity() > self.alloc {
                // Freed once the batches cut from it are acknowledged.
                self.spare = BytesMut::new();
            }
        }
        std::mem::swap(&mut self.items, into);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: usize = 24 + 3 * (6 + 10);

    fn limits() -> Limits {
        Limits {
            max_front: 1 << 20,
            max_data: 1 << 20,
        }
    }

    fn msg(n: u8, len: usize) -> Message {
        Message::new(u16::from(n), vec![n; len], Vec::new())
    }

    /// What the worker takes: per item, a batch's count or 0 for a
    /// message on its own.
    fn shape(p: &mut Pending) -> Vec<u32> {
        let mut items = Vec::new();
        p.take(&mut items);
        items
            .iter()
            .map(|i| match i {
                Outgoing::Batch(b) => b.count(),
                Outgoing::Message(_) | Outgoing::Rma(_) => 0,
            })
            .collect()
    }

    /// Small messages fill batches up to the bound; a large one, a
    /// one-sided operation or new limits close the open batch and keep
    /// their place in the order.
    #[test]
    fn sends_fill_batches_in_order() {
        let mut p = Pending::default();
        for n in 1..=4 {
            p.push(msg(n, 10), MAX, limits());
        }
        p.push(msg(5, MAX), MAX, limits());
        p.push(msg(6, 10), MAX, limits());
        let mut rma = msg(7, 10);
        rma.call = RMA_BIT | 1;
        p.push(rma, MAX, limits());
        p.push(msg(8, 10), MAX, limits());
        let request = RmaRequest {
            op: msgr_proto::rma::RmaOp::Read,
            region: 1,
            capability: [0; 16],
            offset: 0,
            len: 10,
            checksum: None,
            want_key: true,
        };
        let encoded = Message::new(1, request.encode(), Vec::new());
        let call = RmaCall {
            request,
            msg: encoded,
        };
        Queued::push(call, &mut p, MAX, limits());
        p.push(msg(8, 10), MAX, limits());
        let mut other = limits();
        other.max_data = 100;
        p.push(msg(9, 10), MAX, other);
        // Another class starts another batch: each goes in its lane.
        p.push(msg(10, 10), MAX, other);
        p.push(
            msg(11, 10).with_class(msgr_proto::Priority::Interactive),
            MAX,
            other,
        );
        assert_eq!(shape(&mut p), [3, 1, 0, 1, 0, 1, 0, 1, 2, 1]);
        assert!(!p.scheduled && p.items.is_empty() && p.open.is_none());
    }

    /// A sparse sender's batches of one message each share an allocation:
    /// each kept for replay holds its own size, not a batch's bound.
    #[test]
    fn sparse_batches_share_an_allocation() {
        const BIG: usize = 4096;
        let entry = 24 + 6 + 10;
        let mut p = Pending::default();
        let mut taken = Vec::new();
        for round in 1..=3 {
            p.push(msg(round, 10), BIG, limits());
            let mut items = Vec::new();
            p.take(&mut items);
            assert_eq!(items.len(), 1);
            taken.extend(items);
            let first = EncodedBatch::MIN_ALLOCATION;
            assert_eq!(p.spare.capacity(), first - usize::from(round) * entry);
        }
    }

    /// A burst grows the allocations batches are opened in up to
    /// `SHARED_BATCHES` bounds; when the sender goes quiet they shrink
    /// again and the large spare is let go.
    #[test]
    fn allocations_follow_the_sender() {
        const BIG: usize = 4096;
        let mut p = Pending::default();
        let mut items = Vec::new();
        for n in 0..2000 {
            p.push(msg((n % 200) as u8, 40), BIG, limits());
        }
        p.take(&mut items);
        assert!(
            p.alloc > EncodedBatch::MIN_ALLOCATION,
            "a burst's allocation grew"
        );
        let full = items.iter().filter_map(Outgoing::batch);
        let sizes: Vec<usize> = full.map(EncodedBatch::encoded_bytes).collect();
        let near_bound = sizes.iter().filter(|&&n| n > BIG - 100).count();
        assert!(
            near_bound * 2 > sizes.len(),
            "batches near their bound: {sizes:?}"
        );
        for quiet in 0..3 {
            items.clear();
            p.push(msg(quiet, 10), BIG, limits());
            p.take(&mut items);
        }
        assert_eq!(p.alloc, EncodedBatch::MIN_ALLOCATION);
        let kept = p.memory_bytes() - p.items.capacity() * std::mem::size_of::<Outgoing>();
        assert!(
            kept <= EncodedBatch::MIN_ALLOCATION,
            "{kept} bytes kept when quiet"
        );
    }
}
