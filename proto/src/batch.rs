//! Batch frames: many small messages under one preamble and one CRC32C.
//!
//! A [`Tag::MessageBatch`](crate::Tag::MessageBatch) frame has a single
//! segment, the batch body, checked by the frame's one epilogue word:
//!
//! ```text
//! header (24 B): base seq u64 | ack u64 | entry count u32 | reserved u32 (0)
//! entries:       entry 0 .. entry count-1, back to back, filling the segment
//! entry:         type varint (u16) | priority u8 | flags u8 | entry flags u8
//!                  [| call u64 if entry flags bit 0] | front len varint | data len varint
//!                | front length varint (u32) | data length varint (u32)
//!                | front bytes | data bytes
//! ```
//!
//! Entry `i` carries sequence number `base seq + i`; the ack is the
//! highest sequence number the sender received, once for the batch.
//! Varints are LEB128, at most 3 bytes for a type and 5 for a length;
//! an overlong or out-of-range one is refused. A 64-byte message costs
//! 6 bytes of entry here against 76 bytes of preamble, header and
//! epilogue in a [`Tag::Message`](crate::Tag::Message) frame, and its
//! share of two CRC32C calls against three of its own.
//!
//! Only a session writes batches (each message an entry at `send`,
//! straight into the batch it keeps open, which is then what it
//! transmits and keeps for replay; [`BatchWriter`] writes a whole batch
//! at once) and only a session reads them ([`BatchReader`]: each
//! message's front and data are views of the received segment, nothing
//! copied). Which messages go into a batch, and when, is the session's
//! business (see [`crate::SessionConfig::batch_max_bytes`]); the format
//! is the same on every transport. docs/PROTOCOL.md §2 specifies it.

use bytes::{BufMut, Bytes, BytesMut};

use crate::message::Message;
use crate::priority::Priority;

/// Bytes of the fixed header that opens a batch body.
pub const BATCH_HEADER_LEN: usize = 24;
/// The smallest entry: one-byte type and lengths, no payload.
pub const MIN_ENTRY_LEN: usize = 6;
/// The most bytes an entry adds to its payload (a 3-byte type varint,
/// three single bytes, two 5-byte length varints).
pub const MAX_ENTRY_OVERHEAD: usize = 3 + 3 + 8 + 5 + 5;

/// An entry's third byte: a call (8 bytes, little-endian) follows.
const ENTRY_HAS_CALL: u8 = 1;

/// A batch body does not parse. Every variant closes the link: the
/// body passed its CRC, so the peer wrote it this way.
#[derive(Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BatchError {
    /// The body is shorter than its header.
    #[error("batch of {0} bytes is shorter than its header")]
    ShortHeader(usize),
    /// A batch must carry at least one message.
    #[error("batch with no entries")]
    Empty,
    /// The header's reserved word, or an entry's reserved byte, is set.
    #[error("reserved bits set in a batch")]
    ReservedBitsSet,
    /// The base sequence number is 0, or the last entry's would overflow.
    #[error("batch sequence numbers {base}+{count} out of range")]
    SeqRange {
        /// The header's base sequence number.
        base: u64,
        /// Entries it claims.
        count: u32,
    },
    /// More entries claimed than the body could hold: refused before any is read.
    #[error("batch claims {count} entries in {len} bytes")]
    CountTooLarge {
        /// Entries claimed.
        count: u32,
        /// Body length.
        len: usize,
    },
    /// An entry runs past the end of the body.
    #[error("batch entry {index} is truncated")]
    Truncated {
        /// Which entry.
        index: u32,
    },
    /// A varint is overlong or its value out of range.
    #[error("batch entry {index} has a bad varint")]
    BadVarint {
        /// Which entry.
        index: u32,
    },
    /// Bytes follow the last entry.
    #[error("{0} bytes after the last batch entry")]
    TrailingBytes(usize),
}

msgr_addr::debug_is_display!(BatchError);

/// Writes one batch body in place, entry by entry, into a buffer the
/// caller keeps between batches (so its allocation is reused once the
/// previous batch was sent). See the [module docs](self).
///
/// ```
/// use bytes::BytesMut;
/// use msgr_proto::batch::{BatchReader, BatchWriter};
/// use msgr_proto::Message;
///
/// let mut buf = BytesMut::new();
/// let mut w = BatchWriter::begin(&mut buf, 7, 3, 4096);
/// assert!(w.push(&Message::new(1, &b"a"[..], &b"data"[..])));
/// assert!(w.push(&Message::new(2, &b""[..], &b""[..])));
/// let body = w.finish();
/// let mut r = BatchReader::new(body).unwrap();
/// assert_eq!((r.base_seq(), r.ack(), r.entry_count()), (7, 3, 2));
/// let first = r.next_message().unwrap().unwrap();
/// assert_eq!((first.seq, first.msg_type, &first.data[..]), (7, 1, &b"data"[..]));
/// assert_eq!(r.next_message().unwrap().unwrap().seq, 8);
/// assert_eq!(r.next_message(), Ok(None));
/// ```
#[derive(Debug)]
pub struct BatchWriter<'a> {
    out: &'a mut BytesMut,
    count: u32,
    max_body: usize,
}

impl<'a> BatchWriter<'a> {
    /// Starts a batch whose first entry is sequence number `base_seq`,
    /// carrying `ack`, of at most `max_body` bytes (header included).
    /// `out` must be empty; the batch is written at its start.
    pub fn begin(out: &'a mut BytesMut, base_seq: u64, ack: u64, max_body: usize) -> Self {
        debug_assert!(out.is_empty(), "a batch starts in an empty buffer");
        out.reserve(max_body.max(BATCH_HEADER_LEN));
        out.put_u64_le(base_seq);
        out.put_u64_le(ack);
        // Count and reserved word: the count is patched by `finish`.
        out.put_u64_le(0);
        BatchWriter {
            out,
            count: 0,
            max_body,
        }
    }

    /// The bytes `msg` takes as an entry.
    pub fn entry_len(msg: &Message) -> usize {
        varint_len(u32::from(msg.msg_type))
            + 3
            + if msg.call != 0 { 8 } else { 0 }
            + varint_len(msg.front.len() as u32)
            + varint_len(msg.data.len() as u32)
            + msg.payload_len()
    }

    /// Appends `msg` as the next entry if it fits within the batch's
    /// bound; false (and nothing written) if it does not. A payload
    /// segment longer than `u32::MAX` never fits.
    pub fn push(&mut self, msg: &Message) -> bool {
        let room = self.max_body.saturating_sub(self.out.len());
        if append_entry(self.out, &EntryParts::from(msg), room).is_none() {
            return false;
        }
        self.count += 1;
        true
    }

    /// Entries written so far.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// Bytes of the body so far, header included.
    pub fn len(&self) -> usize {
        self.out.len()
    }

    /// Whether no entry was written yet.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The finished body, split off the caller's buffer (which keeps the
    /// rest of its allocation for the next batch).
    pub fn finish(self) -> Bytes {
        self.out[16..20].copy_from_slice(&self.count.to_le_bytes());
        self.out.split().freeze()
    }
}

/// A message's fields as a batch entry carries them, borrowed: what a
/// sender encodes without building a [`Message`] (`msgr`'s
/// `Connection::send_parts`), or a [`Message`]'s own
/// ([`EntryParts::from`]).
///
/// ```
/// use msgr_proto::batch::EntryParts;
/// use msgr_proto::priority::Priority;
/// use msgr_proto::Message;
///
/// let parts = EntryParts::new(1, b"head", b"body").with_class(Priority::Interactive);
/// assert_eq!((parts.class(), parts.payload_len()), (Priority::Interactive, 8));
/// let msg = Message::new(1, &b"head"[..], &b"body"[..]).with_class(Priority::Interactive);
/// assert_eq!(EntryParts::from(&msg), parts);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryParts<'a> {
    /// The message type.
    pub msg_type: u16,
    /// The priority byte ([`Message::priority`]).
    pub priority: u8,
    /// The message's flags byte.
    pub flags: u8,
    /// The call field (0: not a call).
    pub call: u64,
    /// The front segment.
    pub front: &'a [u8],
    /// The data segment.
    pub data: &'a [u8],
}

impl<'a> EntryParts<'a> {
    /// A message of `msg_type` with these segments, of class data, no
    /// flags and no call (as [`Message::new`] builds one).
    #[inline]
    pub fn new(msg_type: u16, front: &'a [u8], data: &'a [u8]) -> Self {
        EntryParts {
            msg_type,
            priority: 0,
            flags: 0,
            call: 0,
            front,
            data,
        }
    }

    /// These parts in class `class` (as [`Message::with_class`]).
    #[inline]
    pub fn with_class(mut self, class: Priority) -> Self {
        self.priority = class.to_legacy();
        self
    }

    /// The class it travels in ([`Message::class`]).
    #[inline]
    pub fn class(&self) -> Priority {
        Priority::from_legacy(self.priority)
    }

    /// Front and data bytes.
    #[inline]
    pub fn payload_len(&self) -> usize {
        self.front.len() + self.data.len()
    }

    /// A [`Message`] of copies of these parts: for a message that must go
    /// whole (in a frame of its own).
    pub fn to_message(&self) -> Message {
        let mut msg = Message::new(
            self.msg_type,
            Bytes::copy_from_slice(self.front),
            Bytes::copy_from_slice(self.data),
        );
        (msg.priority, msg.flags, msg.call) = (self.priority, self.flags, self.call);
        msg
    }
}

impl<'a> From<&'a Message> for EntryParts<'a> {
    #[inline]
    fn from(msg: &'a Message) -> Self {
        EntryParts {
            msg_type: msg.msg_type,
            priority: msg.priority,
            flags: msg.flags,
            call: msg.call,
            front: &msg.front,
            data: &msg.data,
        }
    }
}

/// Appends `msg` to `out` as a batch entry if the entry takes at most
/// `room` bytes; returns the bytes it took, or `None` (and nothing
/// written) if it does not fit or a segment is longer than `u32::MAX`.
/// How a session encodes each message at `send`, into the batch it keeps
/// open ([`BatchWriter::push`] for a whole batch at once).
pub(crate) fn append_entry(out: &mut BytesMut, msg: &EntryParts<'_>, room: usize) -> Option<usize> {
    let (front, data) = (msg.front.len(), msg.data.len());
    let (Ok(front_len), Ok(data_len)) = (u32::try_from(front), u32::try_from(data)) else {
        return None;
    };
    // The entry's head is assembled on the stack and appended in one
    // copy: a put per field cost a capacity check each.
    let mut head = [0u8; MAX_ENTRY_OVERHEAD];
    let n = if msg.msg_type < 0x80 && msg.call == 0 && front_len < 0x80 && data_len < 0x80 {
        // A small message's: every varint one byte and no call (the
        // varint loops cost as much again as the rest).
        let small = [msg.msg_type as u8, msg.priority, msg.flags, 0];
        head[..4].copy_from_slice(&small);
        head[4] = front_len as u8;
        head[5] = data_len as u8;
        MIN_ENTRY_LEN
    } else if msg.call == 0 && front_len < 0x80 && data_len < 0x80 {
        // The same with a type of two or three varint bytes: only the
        // type's varint is looped over.
        let n = write_varint(&mut head, 0, u32::from(msg.msg_type));
        let rest = [msg.priority, msg.flags, 0, front_len as u8, data_len as u8];
        head[n..n + 5].copy_from_slice(&rest);
        n + 5
    } else {
        let mut n = write_varint(&mut head, 0, u32::from(msg.msg_type));
        head[n] = msg.priority;
        head[n + 1] = msg.flags;
        n += 3;
        if msg.call != 0 {
            head[n - 1] = ENTRY_HAS_CALL;
            head[n..n + 8].copy_from_slice(&msg.call.to_le_bytes());
            n += 8;
        }
        n = write_varint(&mut head, n, front_len);
        write_varint(&mut head, n, data_len)
    };
    let len = n + front + data;
    if len > room {
        return None;
    }
    out.reserve(len);
    out.extend_from_slice(&head[..n]);
    if front > 0 {
        out.extend_from_slice(msg.front);
    }
    if data > 0 {
        out.extend_from_slice(msg.data);
    }
    Some(len)
}

/// Writes a batch header into the first [`BATCH_HEADER_LEN`] bytes of
/// `body`, whose entries were appended after room left for it.
pub(crate) fn write_header(body: &mut [u8], base_seq: u64, ack: u64, count: u32) {
    body[0..8].copy_from_slice(&base_seq.to_le_bytes());
    body[8..16].copy_from_slice(&ack.to_le_bytes());
    body[16..20].copy_from_slice(&count.to_le_bytes());
    body[20..24].fill(0);
}

/// An entry's fields before its payload, as parsed from its first bytes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EntryHead {
    pub(crate) msg_type: u16,
    pub(crate) priority: u8,
    pub(crate) flags: u8,
    pub(crate) call: u64,
    pub(crate) front_len: usize,
    pub(crate) data_len: usize,
    /// Bytes of the head (the payload follows).
    pub(crate) len: usize,
}

impl EntryHead {
    /// Bytes of the whole entry, head and payload.
    pub(crate) fn entry_len(&self) -> usize {
        self.len + self.front_len + self.data_len
    }
}

/// Parses the head of the entry at the start of `b` (entry `index` of
/// its batch) and checks that its payload follows in full.
#[inline]
pub(crate) fn parse_entry_head(b: &[u8], index: u32) -> Result<EntryHead, BatchError> {
    // The common head: a type of up to three bytes, then five single
    // bytes (no call, one-byte lengths), read with no varint loop.
    if let Some((msg_type, n)) = short_type(b) {
        if let Some(&[priority, flags, 0, front, data]) =
            b.get(n..n + 5).and_then(<[u8]>::first_chunk)
        {
            if front < 0x80 && data < 0x80 {
                let (front_len, data_len) = (usize::from(front), usize::from(data));
                let len = n + 5;
                if b.len() - len < front_len + data_len {
                    return Err(BatchError::Truncated { index });
                }
                return Ok(EntryHead {
                    msg_type,
                    priority,
                    flags,
                    call: 0,
                    front_len,
                    data_len,
                    len,
                });
            }
        }
    }
    parse_wide_entry_head(b, index)
}

/// A type varint at the start of `b` that is minimal and fits a `u16`,
/// and its length; `None` for anything else (the full parse decides).
#[inline]
fn short_type(b: &[u8]) -> Option<(u16, usize)> {
    let low = |byte: u8| u16::from(byte & 0x7f);
    match *b {
        [t0, ..] if t0 < 0x80 => Some((u16::from(t0), 1)),
        // (t0 has its continuation bit from here on, and t1 below.)
        [t0, t1, ..] if t1 < 0x80 => (t1 != 0).then(|| (low(t0) | u16::from(t1) << 7, 2)),
        [t0, t1, t2, ..] if t2 != 0 && t2 <= 3 => {
            Some((low(t0) | low(t1) << 7 | u16::from(t2) << 14, 3))
        }
        _ => None,
    }
}

/// [`parse_entry_head`] for any other head: varints of any width, a call.
fn parse_wide_entry_head(b: &[u8], index: u32) -> Result<EntryHead, BatchError> {
    let mut at = 0;
    let msg_type = read_varint(b, &mut at, index)?;
    let msg_type = u16::try_from(msg_type).map_err(|_| BatchError::BadVarint { index })?;
    let Some(&[priority, flags, reserved]) = b.get(at..at + 3).and_then(|s| s.first_chunk()) else {
        return Err(BatchError::Truncated { index });
    };
    if reserved & !ENTRY_HAS_CALL != 0 {
        return Err(BatchError::ReservedBitsSet);
    }
    at += 3;
    let mut call = 0;
    if reserved & ENTRY_HAS_CALL != 0 {
        let Some(c) = b.get(at..at + 8).and_then(|s| s.first_chunk::<8>()) else {
            return Err(BatchError::Truncated { index });
        };
        call = u64::from_le_bytes(*c);
        if call == 0 {
            // One message, one encoding: no call is no flag.
            return Err(BatchError::ReservedBitsSet);
        }
        at += 8;
    }
    let front_len = read_varint(b, &mut at, index)? as usize;
    let data_len = read_varint(b, &mut at, index)? as usize;
    if b.len() - at < front_len || b.len() - at - front_len < data_len {
        return Err(BatchError::Truncated { index });
    }
    Ok(EntryHead {
        msg_type,
        priority,
        flags,
        call,
        front_len,
        data_len,
        len: at,
    })
}

/// One entry of a batch, seen without its payload: what a sender that
/// keeps encoded entries for replay needs to cut a batch short (a
/// credit window, a partial acknowledgement, a check against the peer's
/// limits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EntryExtent {
    /// Bytes of the whole entry.
    pub(crate) len: usize,
    /// Its front segment's length.
    pub(crate) front_len: usize,
    /// Its data segment's length.
    pub(crate) data_len: usize,
    /// Its call (0 for a plain message).
    pub(crate) call: u64,
}

/// The extents of the entries of `entries` (bytes of a batch body after
/// its header), in order, until the first that does not parse.
pub(crate) fn entry_extents(entries: &[u8]) -> impl Iterator<Item = EntryExtent> + '_ {
    let mut at = 0;
    let mut index = 0u32;
    std::iter::from_fn(move || {
        let head = parse_entry_head(entries.get(at..)?, index).ok()?;
        let len = head.len + head.front_len + head.data_len;
        at += len;
        index += 1;
        Some(EntryExtent {
            len,
            front_len: head.front_len,
            data_len: head.data_len,
            call: head.call,
        })
    })
}

/// Reads a batch body entry by entry: each message's front and data are
/// views of the body (no copy), its `seq` the batch's base plus its
/// index. The header is checked by [`BatchReader::new`], before any
/// entry is read; an entry's lengths before its bytes are taken. See
/// the [module docs](self).
#[derive(Debug)]
pub struct BatchReader {
    body: Bytes,
    pos: usize,
    base_seq: u64,
    ack: u64,
    count: u32,
    index: u32,
}

impl BatchReader {
    /// Checks the header of `body`: long enough, at least one entry and
    /// no more than the body could hold, reserved word zero, sequence
    /// numbers from 1 without overflow.
    pub fn new(body: Bytes) -> Result<BatchReader, BatchError> {
        let Some(h) = body.first_chunk::<BATCH_HEADER_LEN>() else {
            return Err(BatchError::ShortHeader(body.len()));
        };
        let base_seq = u64::from_le_bytes(h[0..8].try_into().unwrap_or_default());
        let ack = u64::from_le_bytes(h[8..16].try_into().unwrap_or_default());
        let count = u32::from_le_bytes(h[16..20].try_into().unwrap_or_default());
        if h[20..24] != [0; 4] {
            return Err(BatchError::ReservedBitsSet);
        }
        if count == 0 {
            return Err(BatchError::Empty);
        }
        if (count as usize) > (body.len() - BATCH_HEADER_LEN) / MIN_ENTRY_LEN {
            return Err(BatchError::CountTooLarge {
                count,
                len: body.len(),
            });
        }
        if base_seq == 0 || base_seq.checked_add(u64::from(count)).is_none() {
            return Err(BatchError::SeqRange {
                base: base_seq,
                count,
            });
        }
        Ok(BatchReader {
            body,
            pos: BATCH_HEADER_LEN,
            base_seq,
            ack,
            count,
            index: 0,
        })
    }

    /// The sequence number of the first entry.
    pub fn base_seq(&self) -> u64 {
        self.base_seq
    }

    /// The sender's acknowledgement, once for the whole batch.
    pub fn ack(&self) -> u64 {
        self.ack
    }

    /// Entries the batch carries (named apart from `Iterator::count`,
    /// which would consume the reader).
    pub fn entry_count(&self) -> u32 {
        self.count
    }

    /// The next message, `Ok(None)` after the last; an error if an entry
    /// does not parse or bytes follow the last one.
    pub fn next_message(&mut self) -> Result<Option<Message>, BatchError> {
        let at = self.pos;
        let Some((seq, head)) = self.next_entry()? else {
            return Ok(None);
        };
        Ok(Some(entry_message(&self.body, at, seq, &head)))
    }

    /// The next entry's sequence number and head, without its payload
    /// taken (it starts at [`BatchReader::position`] before the call,
    /// plus the head's length); `Ok(None)` after the last, an error as
    /// [`BatchReader::next_message`]'s.
    pub(crate) fn next_entry(&mut self) -> Result<Option<(u64, EntryHead)>, BatchError> {
        if self.index == self.count {
            let rest = self.body.len() - self.pos;
            return if rest == 0 {
                Ok(None)
            } else {
                Err(BatchError::TrailingBytes(rest))
            };
        }
        let index = self.index;
        let head = parse_entry_head(&self.body[self.pos..], index)?;
        self.pos += head.entry_len();
        self.index += 1;
        Ok(Some((self.base_seq + u64::from(index), head)))
    }

    /// Where the next entry starts in the body.
    pub(crate) fn position(&self) -> usize {
        self.pos
    }

    /// The body read (the received segment, all of it).
    pub(crate) fn into_body(self) -> Bytes {
        self.body
    }
}

/// The message of the entry at `at` in `body`, whose head is `head`: its
/// front and data views of `body`, nothing copied.
pub(crate) fn entry_message(body: &Bytes, at: usize, seq: u64, head: &EntryHead) -> Message {
    let start = at + head.len;
    let front = slice_or_empty(body, start, head.front_len);
    let data = slice_or_empty(body, start + head.front_len, head.data_len);
    let mut m = Message::received(head.msg_type, head.priority, head.flags, seq, front, data);
    m.call = head.call;
    m
}

impl Iterator for BatchReader {
    type Item = Result<Message, BatchError>;

    /// [`BatchReader::next_message`], stopping after the first error.
    fn next(&mut self) -> Option<Self::Item> {
        let r = self.next_message().transpose();
        if matches!(r, Some(Err(_))) {
            // Nothing more is read after a malformed entry.
            self.index = self.count;
            self.pos = self.body.len();
        }
        r
    }
}

/// The entry count a batch body's header claims, unchecked (0 for a body
/// too short to say): what a receive throttle charges a batch before the
/// session reads it.
pub fn claimed_count(body: &[u8]) -> u32 {
    body.get(16..20)
        .and_then(|s| s.first_chunk::<4>())
        .map_or(0, |c| u32::from_le_bytes(*c))
}

/// A view of `len` bytes of `body` from `start`; an empty one costs no
/// reference count (most messages have an empty front or data).
fn slice_or_empty(body: &Bytes, start: usize, len: usize) -> Bytes {
    if len == 0 {
        Bytes::new()
    } else {
        body.slice(start..start + len)
    }
}

fn varint_len(v: u32) -> usize {
    match v {
        0..=0x7f => 1,
        0x80..=0x3fff => 2,
        0x4000..=0x1f_ffff => 3,
        0x20_0000..=0xfff_ffff => 4,
        _ => 5,
    }
}

/// Writes `v` as a LEB128 varint into `out` at `at`; returns the index
/// after it. `out` has room: a u32 takes at most 5 bytes, and the callers'
/// buffers are sized by [`MAX_ENTRY_OVERHEAD`].
fn write_varint(out: &mut [u8; MAX_ENTRY_OVERHEAD], mut at: usize, mut v: u32) -> usize {
    while v >= 0x80 {
        out[at] = (v as u8) | 0x80;
        v >>= 7;
        at += 1;
    }
    out[at] = v as u8;
    at + 1
}

/// Reads a LEB128 u32 at `*at`, refusing more than 5 bytes, bits past 32
/// and a non-minimal encoding (a trailing zero group), so that one value
/// has one encoding.
fn read_varint(b: &[u8], at: &mut usize, index: u32) -> Result<u32, BatchError> {
    // Most types and lengths of small messages take one byte.
    if let Some(&byte) = b.get(*at) {
        if byte < 0x80 {
            *at += 1;
            return Ok(u32::from(byte));
        }
    }
    let mut v: u32 = 0;
    for i in 0..5 {
        let Some(&byte) = b.get(*at + i) else {
            return Err(BatchError::Truncated { index });
        };
        let group = u32::from(byte & 0x7f);
        if i == 4 && group > 0x0f {
            return Err(BatchError::BadVarint { index });
        }
        v |= group << (7 * i);
        if byte & 0x80 == 0 {
            if i > 0 && group == 0 {
                return Err(BatchError::BadVarint { index });
            }
            *at += i + 1;
            return Ok(v);
        }
    }
    Err(BatchError::BadVarint { index })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(msgs: &[Message], base: u64, ack: u64) -> Bytes {
        let mut buf = BytesMut::new();
        let mut w = BatchWriter::begin(&mut buf, base, ack, 1 << 16);
        for m in msgs {
            assert!(w.push(m));
        }
        w.finish()
    }

    #[test]
    fn varints_round_trip_at_every_width_and_refuse_the_rest() {
        for v in [
            0,
            1,
            0x7f,
            0x80,
            0x3fff,
            0x4000,
            0x1f_ffff,
            0x20_0000,
            u32::MAX,
        ] {
            let mut out = [0u8; MAX_ENTRY_OVERHEAD];
            let len = write_varint(&mut out, 2, v) - 2;
            assert_eq!(len, varint_len(v), "{v:#x}");
            let mut at = 2;
            assert_eq!(read_varint(&out, &mut at, 0), Ok(v));
            assert_eq!(at, 2 + len);
        }
        for bad in [
            &[0x80, 0x00][..],                   // non-minimal
            &[0xff, 0xff, 0xff, 0xff, 0x1f][..], // past 32 bits
            &[0x80, 0x80, 0x80, 0x80, 0x80][..],
        ] {
            assert_eq!(
                read_varint(bad, &mut 0, 3),
                Err(BatchError::BadVarint { index: 3 })
            );
        }
        assert_eq!(
            read_varint(&[0x80], &mut 0, 1),
            Err(BatchError::Truncated { index: 1 })
        );
    }

    #[test]
    fn a_batch_round_trips_every_field_and_shares_the_body() {
        let mut odd = Message::new(u16::MAX, vec![1u8; 200], vec![2u8; 300]);
        odd.priority = 9;
        odd.flags = 0xa5;
        let msgs = [
            Message::default(),
            odd,
            Message::new(0x80, &b"f"[..], &b""[..]),
        ];
        let body = batch(&msgs, 41, 40);
        let len = body.len();
        assert_eq!(
            len,
            BATCH_HEADER_LEN + msgs.iter().map(BatchWriter::entry_len).sum::<usize>()
        );
        let got: Vec<Message> = BatchReader::new(body.clone())
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert_eq!(got.len(), 3);
        for (i, (g, m)) in got.iter().zip(&msgs).enumerate() {
            let mut want = m.clone();
            want.seq = 41 + i as u64;
            assert_eq!(g, &want);
        }
        let inside = body.as_ptr_range();
        assert!(inside.contains(&got[1].data.as_ptr()), "a view, not a copy");
    }

    #[test]
    fn the_short_head_reads_as_the_full_parse_does() {
        let types = [0, 1, 0x7f, 0x80, 0xff, 0x3fff, 0x4000, 0x6d03, 0xffff];
        for ty in types {
            for (front, data) in [(0, 0), (1, 64), (127, 0), (0, 128), (128, 300)] {
                let m = Message::new(ty, vec![1u8; front], vec![2u8; data]);
                let mut out = BytesMut::new();
                append_entry(&mut out, &EntryParts::from(&m), usize::MAX).unwrap();
                assert_eq!(out.len(), BatchWriter::entry_len(&m), "type {ty:#x}");
                let short = parse_entry_head(&out, 0).unwrap();
                let full = parse_wide_entry_head(&out, 0).unwrap();
                let fields = |h: &EntryHead| (h.msg_type, h.front_len, h.data_len, h.len);
                assert_eq!(fields(&short), fields(&full), "type {ty:#x}");
                assert_eq!(fields(&short), (ty, front, data, out.len() - front - data));
                assert_eq!(
                    parse_entry_head(&out[..out.len() - 1], 0).unwrap_err(),
                    BatchError::Truncated { index: 0 }
                );
            }
        }
        // Types no short read takes: non-minimal, past u16.
        for bad in [
            &[0x80, 0x00][..],
            &[0xff, 0xff, 0x04][..],
            &[0x80, 0x80, 0x00][..],
        ] {
            let mut entry = bad.to_vec();
            entry.extend_from_slice(&[0, 0, 0, 0, 0]);
            assert_eq!(
                parse_entry_head(&entry, 2).unwrap_err(),
                BatchError::BadVarint { index: 2 }
            );
        }
    }

    #[test]
    fn a_full_writer_refuses_without_writing() {
        let mut buf = BytesMut::new();
        let mut w = BatchWriter::begin(&mut buf, 1, 0, BATCH_HEADER_LEN + 70);
        let m = Message::new(1, Bytes::new(), vec![0u8; 64]);
        assert_eq!(BatchWriter::entry_len(&m), 6 + 64);
        assert!(w.push(&m));
        let len = w.len();
        assert!(!w.push(&Message::new(1, Bytes::new(), vec![0u8; 1])));
        assert_eq!((w.len(), w.count()), (len, 1));
        let body = w.finish();
        assert_eq!(claimed_count(&body), 1);
        assert!(buf.is_empty(), "the buffer is ready for the next batch");
    }

    #[test]
    fn bad_headers_are_refused_before_any_entry() {
        let good = batch(&[Message::default()], 1, 0);
        assert_eq!(
            BatchReader::new(good.slice(..10)).unwrap_err(),
            BatchError::ShortHeader(10)
        );
        let patch = |at: usize, bytes: &[u8]| {
            let mut b = good.to_vec();
            b[at..at + bytes.len()].copy_from_slice(bytes);
            BatchReader::new(Bytes::from(b)).unwrap_err()
        };
        assert_eq!(patch(16, &0u32.to_le_bytes()), BatchError::Empty);
        assert_eq!(patch(20, &[1]), BatchError::ReservedBitsSet);
        assert!(matches!(
            patch(16, &u32::MAX.to_le_bytes()),
            BatchError::CountTooLarge { .. }
        ));
        assert!(matches!(
            patch(0, &0u64.to_le_bytes()),
            BatchError::SeqRange { .. }
        ));
        assert!(matches!(
            patch(0, &u64::MAX.to_le_bytes()),
            BatchError::SeqRange { .. }
        ));
    }

    #[test]
    fn bad_entries_are_typed_errors() {
        let m = Message::new(1, &b"ab"[..], &b"cd"[..]);
        let two = batch(&[m.clone(), m], 1, 0);
        // Cut inside the second entry.
        let mut r = BatchReader::new(two.slice(..two.len() - 1)).unwrap();
        assert!(r.next_message().unwrap().is_some());
        assert_eq!(r.next_message(), Err(BatchError::Truncated { index: 1 }));
        // A byte too many.
        let mut long = two.to_vec();
        long.push(0);
        let mut r = BatchReader::new(Bytes::from(long)).unwrap();
        assert_eq!(r.by_ref().filter(Result::is_ok).count(), 2);
        let mut r = BatchReader::new(Bytes::from({
            let mut l = two.to_vec();
            l.push(0);
            l
        }))
        .unwrap();
        r.next_message().unwrap();
        r.next_message().unwrap();
        assert_eq!(r.next_message(), Err(BatchError::TrailingBytes(1)));
        // The entry's flags byte: a bit that means nothing yet, and the
        // call flag with a call of 0 (no call is no flag: one encoding).
        for bit in [2u8, 0x80] {
            let mut b = two.to_vec();
            b[BATCH_HEADER_LEN + 3] = bit;
            let mut r = BatchReader::new(Bytes::from(b)).unwrap();
            assert_eq!(r.next_message(), Err(BatchError::ReservedBitsSet));
        }
        let mut b = two.to_vec();
        b[BATCH_HEADER_LEN + 3] = ENTRY_HAS_CALL;
        b.splice(BATCH_HEADER_LEN + 4..BATCH_HEADER_LEN + 4, [0u8; 8]);
        let mut r = BatchReader::new(Bytes::from(b)).unwrap();
        assert_eq!(r.next_message(), Err(BatchError::ReservedBitsSet));
        // A type past u16.
        let mut b = two.to_vec();
        b.splice(BATCH_HEADER_LEN..BATCH_HEADER_LEN + 1, [0xff, 0xff, 0x04]);
        let mut r = BatchReader::new(Bytes::from(b)).unwrap();
        assert_eq!(r.next_message(), Err(BatchError::BadVarint { index: 0 }));
        // A length past the body.
        let mut b = two.to_vec();
        b[BATCH_HEADER_LEN + 4] = 0x7f;
        let mut r = BatchReader::new(Bytes::from(b)).unwrap();
        assert_eq!(r.next_message(), Err(BatchError::Truncated { index: 0 }));
    }
}
