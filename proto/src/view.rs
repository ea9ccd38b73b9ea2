//! Received messages seen in place: the entries of a batch frame as
//! borrowed views of its one body.
//!
//! A session hands its owner a [`ReceivedBatch`] for the entries of a
//! batch it received and checked (their sequence numbers, calls and
//! encoding), in order; the owner reads them with
//! [`ReceivedBatch::iter`] as [`MessageRef`]s: the header fields, and
//! front and data as slices of the body. Nothing is allocated, sliced or
//! reference-counted per entry; [`MessageRef::to_message`] makes an owned
//! [`Message`] of one (views of the same body, nothing copied) for an
//! application that keeps it.

use bytes::Bytes;

use crate::batch::{entry_message, parse_entry_head, EntryHead};
use crate::codec::{Codec, CodecError, Postcard};
use crate::message::{Message, REPLY_BIT};

/// A received message borrowed from the buffer it arrived in: what a
/// [`Message`] says, with `front` and `data` as slices.
///
/// Made by [`ReceivedBatch::iter`]; [`MessageRef::to_message`] gives the
/// owned message to keep.
///
/// ```
/// use bytes::BytesMut;
/// use msgr_proto::batch::BatchWriter;
/// use msgr_proto::view::ReceivedBatch;
/// use msgr_proto::Message;
///
/// let mut buf = BytesMut::new();
/// let mut w = BatchWriter::begin(&mut buf, 1, 0, 4096);
/// assert!(w.push(&Message::new(7, &b"hi"[..], &b"data"[..])));
/// let batch = ReceivedBatch::whole(w.finish()).unwrap();
/// let m = batch.iter().next().unwrap();
/// assert_eq!((m.msg_type, m.seq, m.front, m.data), (7, 1, &b"hi"[..], &b"data"[..]));
/// assert_eq!(m.to_message().data, &b"data"[..]);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MessageRef<'a> {
    /// As [`Message::msg_type`].
    pub msg_type: u16,
    /// As [`Message::priority`].
    pub priority: u8,
    /// As [`Message::flags`].
    pub flags: u8,
    /// As [`Message::call`]: 0 for a plain message, a request's call id,
    /// or a reply's (`REPLY_BIT` set).
    pub call: u64,
    /// As [`Message::seq`]: its number in its session.
    pub seq: u64,
    /// The front segment.
    pub front: &'a [u8],
    /// The data segment.
    pub data: &'a [u8],
    /// The buffer `front` and `data` lie in.
    body: &'a Bytes,
}

impl<'a> MessageRef<'a> {
    /// The owned message: its segments views of the same buffer (no
    /// copy; the buffer lives while the message does).
    pub fn to_message(&self) -> Message {
        let mut m = Message::received(
            self.msg_type,
            self.priority,
            self.flags,
            self.seq,
            self.body.slice_ref(self.front),
            self.body.slice_ref(self.data),
        );
        m.call = self.call;
        m
    }

    /// As [`Message::call_id`]: `Some((id, is_reply))` for a request or a
    /// reply, `None` for a plain message.
    pub fn call_id(&self) -> Option<(u64, bool)> {
        match self.call & !REPLY_BIT {
            0 => None,
            id => Some((id, self.call & REPLY_BIT != 0)),
        }
    }

    /// Bytes of front and data.
    pub fn payload_len(&self) -> usize {
        self.front.len() + self.data.len()
    }

    /// As [`Message::decode`]: the front segment decoded with the default
    /// codec (postcard).
    pub fn decode<T: serde::de::DeserializeOwned>(&self) -> Result<T, CodecError> {
        Postcard.decode(self.front)
    }
}

/// Consecutive entries of a received batch frame, checked by the session
/// that received them, in order: read them in place with
/// [`ReceivedBatch::iter`]. Holds the frame's body (its one buffer).
#[derive(Debug)]
pub struct ReceivedBatch {
    body: Bytes,
    /// Where the first entry not taken starts.
    at: usize,
    /// Where the last entry ends.
    end: usize,
    /// The first entry's sequence number.
    seq: u64,
    /// Entries not taken.
    left: u32,
}

impl ReceivedBatch {
    /// The `count` entries of `body` from byte `at` to `end`, the first
    /// numbered `seq`: entries a session checked (a range it found
    /// well-formed).
    pub(crate) fn new(body: Bytes, at: usize, end: usize, seq: u64, count: u32) -> ReceivedBatch {
        ReceivedBatch {
            body,
            at,
            end,
            seq,
            left: count,
        }
    }

    /// Every entry of a batch body, checked as a session checks them
    /// (the header, each entry's encoding, nothing after the last); for
    /// tests and tools that hold a body of their own.
    pub fn whole(body: Bytes) -> Result<ReceivedBatch, crate::batch::BatchError> {
        let mut r = crate::batch::BatchReader::new(body)?;
        let (at, seq, count) = (r.position(), r.base_seq(), r.entry_count());
        while r.next_entry()?.is_some() {}
        let end = r.position();
        Ok(ReceivedBatch::new(r.into_body(), at, end, seq, count))
    }

    /// Entries not taken yet.
    pub fn len(&self) -> usize {
        self.left as usize
    }

    /// Whether every entry was taken.
    pub fn is_empty(&self) -> bool {
        self.left == 0
    }

    /// The entries not taken, in order, as views.
    pub fn iter(&self) -> BatchEntries<'_> {
        BatchEntries {
            body: &self.body,
            at: self.at,
            end: self.end,
            seq: self.seq,
            left: self.left,
        }
    }

    /// Takes the first entry as an owned message (views of the body).
    pub(crate) fn pop_message(&mut self) -> Option<Message> {
        let (at, head) = self.first_head()?;
        let m = entry_message(&self.body, at, self.seq, &head);
        self.at += head.entry_len();
        self.seq += 1;
        self.left -= 1;
        Some(m)
    }

    fn first_head(&self) -> Option<(usize, EntryHead)> {
        if self.left == 0 {
            return None;
        }
        let head = parse_entry_head(self.body.get(self.at..self.end)?, 0).ok()?;
        Some((self.at, head))
    }
}

/// The entries of a [`ReceivedBatch`], in order, as [`MessageRef`]s.
#[derive(Clone, Debug)]
pub struct BatchEntries<'a> {
    body: &'a Bytes,
    at: usize,
    end: usize,
    seq: u64,
    left: u32,
}

impl<'a> Iterator for BatchEntries<'a> {
    type Item = MessageRef<'a>;

    #[inline]
    fn next(&mut self) -> Option<MessageRef<'a>> {
        if self.left == 0 {
            return None;
        }
        // Checked when received: an entry that did not parse now would
        // be a body changed since (it cannot be); it ends the entries.
        let rest = self.body.get(self.at..self.end)?;
        let head = parse_entry_head(rest, 0).ok()?;
        let front_end = head.len + head.front_len;
        let entry_end = front_end + head.data_len;
        let m = MessageRef {
            msg_type: head.msg_type,
            priority: head.priority,
            flags: head.flags,
            call: head.call,
            seq: self.seq,
            front: rest.get(head.len..front_end)?,
            data: rest.get(front_end..entry_end)?,
            body: self.body,
        };
        self.at += entry_end;
        self.seq += 1;
        self.left -= 1;
        Some(m)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left as usize, Some(self.left as usize))
    }
}

impl ExactSizeIterator for BatchEntries<'_> {}

#[cfg(test)]
mod tests {
    use bytes::BytesMut;

    use super::*;
    use crate::batch::{BatchReader, BatchWriter};

    fn body(msgs: &[Message]) -> Bytes {
        let mut buf = BytesMut::new();
        let mut w = BatchWriter::begin(&mut buf, 5, 0, 1 << 16);
        for m in msgs {
            assert!(w.push(m));
        }
        w.finish()
    }

    #[test]
    fn views_say_what_the_owned_messages_say() {
        let mut call = Message::new(0x1234, vec![1u8; 300], &b"d"[..]);
        call.call = 9;
        call.priority = 3;
        call.flags = 0x81;
        let msgs = [
            Message::new(1, &b""[..], &b"abc"[..]),
            call,
            Message::default(),
        ];
        let b = body(&msgs);
        let owned: Vec<Message> = BatchReader::new(b.clone())
            .unwrap()
            .map(Result::unwrap)
            .collect();
        let batch = ReceivedBatch::whole(b).unwrap();
        assert_eq!(batch.iter().len(), 3);
        let seen: Vec<Message> = batch.iter().map(|m| m.to_message()).collect();
        assert_eq!(seen, owned);
        for (v, m) in batch.iter().zip(&owned) {
            assert_eq!((v.front, v.data), (&m.front[..], &m.data[..]));
            assert_eq!(v.call_id(), m.call_id());
        }
    }

    #[test]
    fn popping_takes_the_entries_in_order() {
        let msgs = [
            Message::new(1, &b"a"[..], &b""[..]),
            Message::new(2, &b""[..], &b"b"[..]),
        ];
        let mut batch = ReceivedBatch::whole(body(&msgs)).unwrap();
        let first = batch.pop_message().unwrap();
        assert_eq!((first.msg_type, first.seq), (1, 5));
        assert_eq!(batch.len(), 1);
        let rest: Vec<u64> = batch.iter().map(|m| m.seq).collect();
        assert_eq!(rest, [6]);
        assert_eq!(batch.pop_message().unwrap().data, &b"b"[..]);
        assert!(batch.is_empty() && batch.pop_message().is_none());
    }
}
