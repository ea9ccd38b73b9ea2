//! Fragment frames: a large message of a priority class cut into bounded
//! pieces, so that a message of a class above can travel between them; and
//! the receiver's reassembly, per class.
//!
//! A [`Tag::Fragment`] frame always has three
//! segments:
//!
//! ```text
//! segment 0, fragment header (48 B), on every fragment:
//!   class u8 | reserved 3 B (0) | front length u32
//!   | class seq u64 | offset u64 | total u64 | seq u64 | ack u64
//! segment 1, message header: 32 B on the first fragment (offset 0), the
//!   Message frame's header (type, priority, flags, seq = class seq, ack,
//!   call); empty on every other fragment
//! segment 2, the piece: bytes offset .. offset + len of the message's
//!   body, front ‖ data (len ≥ 1, or 0 for a message with no payload)
//! ```
//!
//! - `class` is a [`Priority`] on the wire (0 control … 3 background); the
//!   message header's priority byte must map to it (so no message is of
//!   class control, which is the session's own).
//! - `class seq` numbers the fragmented messages of one class, 1, 2, …,
//!   one number per message, the same on all its fragments.
//! - `seq` and `ack` are the session's: the fragment frame's own sequence
//!   number in the session's one sequence space (every fragment takes the
//!   next when it is transmitted, so fragments of a class above may come
//!   between) and the piggybacked acknowledgement, as a message header's.
//!   This module carries them; the session checks them.
//! - `total` is the body's length (front + data) and `front length` where
//!   the front ends in it: the same on every fragment of a message, so each
//!   fragment is checked alone (`offset + len ≤ total`) and the receiver
//!   knows when a message is whole without a "last" flag; the first
//!   fragment is the one at offset 0.
//! - A class's fragments travel in order, one message after the other;
//!   fragments of different classes interleave freely.
//!
//! The frame has the frame layer's CRCs like any other; a piece is
//! checked as a message's data segment is. [`Fragmenter`] cuts a message
//! into fragments (slices of its `Bytes`, nothing copied) and
//! [`Reassembler`] puts them back together, with typed errors for every
//! fragment that does not continue its class. Sent only where both banners
//! offered [`crate::banner::features::LANES`], which no build offers yet:
//! the session does not use this module so far.

use bytes::{Bytes, BytesMut};

use crate::checksum::{crc32c, crc32c_combine, CrcMemo, CRC_MEMO_MIN};
use crate::frame::{Frame, FrameLimits, Tag};
use crate::message::{reserved_clear, Message, MessageFrame, DATA_SEGMENT, MESSAGE_HEADER_LEN};
use crate::priority::Priority;

/// Bytes of the fragment header (segment 0).
pub const FRAGMENT_HEADER_LEN: usize = 48;
/// The default bound of a piece: a class above waits for at most one
/// such piece (~0.4 ms at 2.5 GB/s). 1 MiB, not Zenoh's 64 KiB: on this
/// project's VM loopback over TCP, 64 KiB pieces cost a 1 MiB stream
/// about half its rate (each fragment is a frame of its own through the
/// transport and the reassembly), while a call's wait behind bulk was
/// about the same either way — what the link and the kernel's socket
/// buffers hold ahead of the session dominates it (docs/HISTORY.md).
pub const DEFAULT_MAX_FRAGMENT: usize = 1 << 20;

/// A fragment frame does not have the shape the [module docs](self) give,
/// or a message cannot be cut. Each closes the link on receipt (the frame
/// passed its CRC: the peer wrote it so).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FragmentError {
    /// The frame is not a fragment.
    #[error("a {0:?} frame is not a fragment")]
    NotFragment(Tag),
    /// Not three segments, or a header segment of the wrong length.
    #[error("malformed fragment frame: {0}")]
    Shape(&'static str),
    /// A reserved byte of the fragment or message header is set.
    #[error("reserved bits set in a fragment")]
    ReservedBitsSet,
    /// The class byte names no class.
    #[error("fragment of unknown class {0}")]
    UnknownClass(u8),
    /// Class sequence numbers start at 1.
    #[error("fragment with class seq 0")]
    ZeroSeq,
    /// The front does not fit the total, or the data is longer than a
    /// `u32` (a message's segments are).
    #[error("fragment lengths out of range: front {front_len} of total {total}")]
    Lengths {
        /// The front's length.
        front_len: u32,
        /// The body's length.
        total: u64,
    },
    /// The piece runs past the end of the message.
    #[error("fragment at {offset} of {len} bytes runs past the message's {total}")]
    OffsetPastTotal {
        /// Where the piece starts.
        offset: u64,
        /// Its length.
        len: usize,
        /// The body's length.
        total: u64,
    },
    /// A piece with no bytes in a message that has some.
    #[error("empty fragment of a non-empty message")]
    EmptyPiece,
    /// The message header is not on exactly the fragment at offset 0.
    #[error("message header on a fragment at offset {offset} (only the first has one)")]
    HeadMisplaced {
        /// The fragment's offset.
        offset: u64,
    },
    /// The message header's sequence number is not the fragment's.
    #[error("message header seq {header} on a fragment of class seq {fragment}")]
    SeqMismatch {
        /// The fragment header's class seq.
        fragment: u64,
        /// The message header's seq.
        header: u64,
    },
    /// The message's priority byte does not map to the fragment's class.
    #[error("message of priority {priority} in a fragment of class {class}")]
    ClassMismatch {
        /// The fragment's class.
        class: Priority,
        /// The message header's priority byte.
        priority: u8,
    },
    /// A message cut into pieces of 0 bytes would never end.
    #[error("fragments of at most 0 bytes")]
    ZeroMaxFragment,
}

/// The first fragment's message header, without the sequence number (the
/// fragment's class seq) and the payload (the pieces).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct MessageHead {
    /// [`Message::msg_type`].
    pub msg_type: u16,
    /// [`Message::priority`]: maps to the fragment's class.
    pub priority: u8,
    /// [`Message::flags`].
    pub flags: u8,
    /// [`Message::call`].
    pub call: u64,
    /// The piggybacked acknowledgement, as a message frame's.
    pub ack: u64,
}

/// One fragment: a piece of a message of a class, with what the receiver
/// needs to put it back. See the [module docs](self) for the wire layout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fragment {
    /// The message's class.
    pub class: Priority,
    /// The message's sequence number within its class (≥ 1).
    pub class_seq: u64,
    /// The message's front length: where the front ends in the body.
    pub front_len: u32,
    /// Where the piece starts in the body (front ‖ data).
    pub offset: u64,
    /// The body's length.
    pub total: u64,
    /// The message header: on the first fragment (offset 0) only.
    pub head: Option<MessageHead>,
    /// The piece.
    pub piece: Bytes,
    /// The frame's sequence number in the session (each fragment has its
    /// own; 0 where no session numbered it). The session checks it.
    pub seq: u64,
    /// The session's piggybacked acknowledgement.
    pub ack: u64,
}

impl Fragment {
    /// Whether this is a message's first fragment.
    pub fn is_first(&self) -> bool {
        self.offset == 0
    }

    /// Whether this is a message's last fragment (a message of one
    /// fragment: both).
    pub fn is_last(&self) -> bool {
        self.offset.saturating_add(self.piece.len() as u64) == self.total
    }

    /// Checks the fragment on its own: lengths in range, the header where
    /// it belongs, the class the message's. What [`Fragment::from_frame`]
    /// and [`Reassembler::push`] check first.
    pub fn check(&self) -> Result<(), FragmentError> {
        if self.class_seq == 0 {
            return Err(FragmentError::ZeroSeq);
        }
        let front = u64::from(self.front_len);
        if front > self.total || self.total - front > u64::from(u32::MAX) {
            return Err(FragmentError::Lengths {
                front_len: self.front_len,
                total: self.total,
            });
        }
        let len = self.piece.len();
        let end = self.offset.checked_add(len as u64);
        if end.is_none_or(|end| end > self.total) {
            return Err(FragmentError::OffsetPastTotal {
                offset: self.offset,
                len,
                total: self.total,
            });
        }
        if len == 0 && self.total != 0 {
            return Err(FragmentError::EmptyPiece);
        }
        match self.head {
            Some(head) if self.is_first() => {
                if Priority::from_legacy(head.priority) != self.class {
                    return Err(FragmentError::ClassMismatch {
                        class: self.class,
                        priority: head.priority,
                    });
                }
                Ok(())
            }
            None if !self.is_first() => Ok(()),
            _ => Err(FragmentError::HeadMisplaced {
                offset: self.offset,
            }),
        }
    }

    /// The fragment header (segment 0).
    fn header(&self) -> [u8; FRAGMENT_HEADER_LEN] {
        let mut h = [0u8; FRAGMENT_HEADER_LEN];
        h[0] = self.class.to_wire();
        h[4..8].copy_from_slice(&self.front_len.to_le_bytes());
        h[8..16].copy_from_slice(&self.class_seq.to_le_bytes());
        h[16..24].copy_from_slice(&self.offset.to_le_bytes());
        h[24..32].copy_from_slice(&self.total.to_le_bytes());
        h[32..40].copy_from_slice(&self.seq.to_le_bytes());
        h[40..48].copy_from_slice(&self.ack.to_le_bytes());
        h
    }

    /// The fragment as a [`Tag::Fragment`] frame.
    pub fn into_frame(self) -> Frame {
        let head = match self.head {
            Some(head) => {
                let mut m = Message::received(
                    head.msg_type,
                    head.priority,
                    head.flags,
                    self.class_seq,
                    Bytes::new(),
                    Bytes::new(),
                );
                m.call = head.call;
                Bytes::copy_from_slice(&m.header(head.ack))
            }
            None => Bytes::new(),
        };
        Frame::new(
            Tag::Fragment,
            [Bytes::copy_from_slice(&self.header()), head, self.piece],
        )
    }

    /// Decodes a [`Tag::Fragment`] frame and [checks](Fragment::check) it.
    /// The piece shares the frame's memory. The frame's flags are the
    /// frame layer's (the session checks them for every frame).
    pub fn from_frame(frame: Frame) -> Result<Fragment, FragmentError> {
        if frame.tag != Tag::Fragment {
            return Err(FragmentError::NotFragment(frame.tag));
        }
        let mut segs = frame.segments.into_iter();
        let (Some(h), Some(head), Some(piece), None) =
            (segs.next(), segs.next(), segs.next(), segs.next())
        else {
            return Err(FragmentError::Shape("expected 3 segments"));
        };
        let Ok(h) = <&[u8; FRAGMENT_HEADER_LEN]>::try_from(&h[..]) else {
            return Err(FragmentError::Shape("fragment header is not 32 bytes"));
        };
        let class = Priority::from_wire(h[0]).ok_or(FragmentError::UnknownClass(h[0]))?;
        if h[1..4] != [0; 3] {
            return Err(FragmentError::ReservedBitsSet);
        }
        let u64_at = |o: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&h[o..o + 8]);
            u64::from_le_bytes(b)
        };
        let class_seq = u64_at(8);
        let head = match head.len() {
            0 => None,
            MESSAGE_HEADER_LEN => {
                let mh: &[u8; MESSAGE_HEADER_LEN] = head[..]
                    .try_into()
                    .map_err(|_| FragmentError::Shape("message header is not 32 bytes"))?;
                if !reserved_clear(mh) {
                    return Err(FragmentError::ReservedBitsSet);
                }
                let m = MessageFrame::from_parts(mh, 0, Bytes::new(), Bytes::new(), CrcMemo::NONE);
                if m.msg.seq != class_seq {
                    return Err(FragmentError::SeqMismatch {
                        fragment: class_seq,
                        header: m.msg.seq,
                    });
                }
                Some(MessageHead {
                    msg_type: m.msg.msg_type,
                    priority: m.msg.priority,
                    flags: m.msg.flags,
                    call: m.msg.call,
                    ack: m.ack,
                })
            }
            _ => return Err(FragmentError::Shape("message header is not 0 or 32 bytes")),
        };
        let f = Fragment {
            class,
            class_seq,
            front_len: u32::from_le_bytes([h[4], h[5], h[6], h[7]]),
            offset: u64_at(16),
            total: u64_at(24),
            head,
            piece,
            seq: u64_at(32),
            ack: u64_at(40),
        };
        f.check()?;
        Ok(f)
    }
}

/// Cuts a message into fragments of at most a configured size, lazily:
/// each piece is a slice of the message's front or data (`Bytes`, nothing
/// copied), and no piece spans both, so a fragment may be shorter than the
/// bound where the front ends. A message with no payload is one empty
/// fragment.
///
/// ```
/// use msgr_proto::fragment::{Fragmenter, Reassembler};
/// use msgr_proto::priority::Priority;
/// use msgr_proto::Message;
///
/// let mut m = Message::new(7, &b"front"[..], vec![3u8; 200_000]).with_class(Priority::Background);
/// m.seq = 1; // its sequence number in its class
/// let pieces: Vec<_> = Fragmenter::new(m.clone(), 0, 64 << 10).unwrap().collect();
/// assert_eq!(pieces.len(), 5, "the front, then 200 000 bytes in 64 KiB pieces");
/// let mut r = Reassembler::new(1 << 20);
/// let mut out = None;
/// for f in pieces {
///     out = r.push(f).unwrap();
/// }
/// assert_eq!(out, Some((m, 0)));
/// ```
#[derive(Clone, Debug)]
pub struct Fragmenter {
    msg: Message,
    ack: u64,
    max_fragment: usize,
    /// Where the next piece starts in front ‖ data; past the end once done.
    offset: u64,
    done: bool,
}

impl Fragmenter {
    /// Fragments of `msg`, whose `seq` is its sequence number within its
    /// class ([`Message::class`]), carrying `ack`, with pieces of at most
    /// `max_fragment` bytes ([`DEFAULT_MAX_FRAGMENT`] by default). Fails
    /// for a seq of 0, a bound of 0, or a segment longer than a `u32`.
    pub fn new(msg: Message, ack: u64, max_fragment: usize) -> Result<Fragmenter, FragmentError> {
        if msg.seq == 0 {
            return Err(FragmentError::ZeroSeq);
        }
        if max_fragment == 0 {
            return Err(FragmentError::ZeroMaxFragment);
        }
        let (front, data) = (msg.front.len() as u64, msg.data.len() as u64);
        if front > u64::from(u32::MAX) || data > u64::from(u32::MAX) {
            return Err(FragmentError::Lengths {
                front_len: u32::MAX,
                total: front + data,
            });
        }
        Ok(Fragmenter {
            msg,
            ack,
            max_fragment,
            offset: 0,
            done: false,
        })
    }

    /// The class the fragments are of.
    pub fn class(&self) -> Priority {
        self.msg.class()
    }

    /// The body's length (front + data).
    fn total(&self) -> u64 {
        self.msg.payload_len() as u64
    }

    /// Fragments not yet taken.
    fn remaining_count(&self) -> usize {
        if self.done {
            return 0;
        }
        let pieces = |len: usize| len.div_ceil(self.max_fragment);
        let front = self.msg.front.len();
        let at = self.offset as usize;
        let n = if at < front {
            pieces(front - at) + pieces(self.msg.data.len())
        } else {
            pieces(self.msg.data.len() - (at - front))
        };
        // A message with no payload is still one fragment.
        n.max(1)
    }
}

impl Fragmenter {
    /// The next fragment as the session sends it: frame sequence number
    /// `seq` and acknowledgement `ack` (the first fragment's message
    /// header carries the same ack). `None` once the message is out.
    pub fn next_numbered(&mut self, seq: u64, ack: u64) -> Option<Fragment> {
        let mut f = self.next()?;
        f.seq = seq;
        f.ack = ack;
        if let Some(head) = &mut f.head {
            head.ack = ack;
        }
        Some(f)
    }

    /// Whether every fragment was taken.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Payload bytes not yet taken.
    pub fn remaining_bytes(&self) -> usize {
        (self.total() - self.offset.min(self.total())) as usize
    }
}

impl Iterator for Fragmenter {
    type Item = Fragment;

    fn next(&mut self) -> Option<Fragment> {
        if self.done {
            return None;
        }
        let front = self.msg.front.len();
        // In range: `new` bounded both segments by u32::MAX.
        let at = self.offset as usize;
        let piece = if at < front {
            self.msg.front.slice(at..front.min(at + self.max_fragment))
        } else {
            let d = at - front;
            let data = &self.msg.data;
            data.slice(d..data.len().min(d + self.max_fragment))
        };
        let head = (at == 0).then_some(MessageHead {
            msg_type: self.msg.msg_type,
            priority: self.msg.priority,
            flags: self.msg.flags,
            call: self.msg.call,
            ack: self.ack,
        });
        let f = Fragment {
            class: self.class(),
            class_seq: self.msg.seq,
            front_len: front as u32,
            offset: self.offset,
            total: self.total(),
            head,
            piece,
            seq: 0,
            ack: self.ack,
        };
        self.offset += f.piece.len() as u64;
        self.done = self.offset == f.total;
        Some(f)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.remaining_count();
        (n, Some(n))
    }
}

impl ExactSizeIterator for Fragmenter {}

/// A fragment does not continue its class's message, or its message is
/// larger than this receiver takes. The reassembler's state is as before
/// the fragment: nothing of it was kept.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReassemblyError {
    /// The fragment is malformed on its own.
    #[error(transparent)]
    Malformed(#[from] FragmentError),
    /// A later fragment of a message whose first never came.
    #[error("{class} fragment at {offset} of message {class_seq} with no message begun")]
    NoFirst {
        /// The class.
        class: Priority,
        /// The fragment's class seq.
        class_seq: u64,
        /// The fragment's offset.
        offset: u64,
    },
    /// A first fragment while the class's message is not whole yet.
    #[error("{class} message {got} begins before message {in_progress} ended")]
    SecondFirst {
        /// The class.
        class: Priority,
        /// The message in progress.
        in_progress: u64,
        /// The new first fragment's class seq.
        got: u64,
    },
    /// A fragment that does not start where the previous one ended.
    #[error("{class} fragment at offset {got}, expected {expected}")]
    OutOfOrder {
        /// The class.
        class: Priority,
        /// Where the next fragment must start.
        expected: u64,
        /// Where this one starts.
        got: u64,
    },
    /// A message that is not the next of its class.
    #[error("{class} message {got}, expected {expected}")]
    SeqGap {
        /// The class.
        class: Priority,
        /// The class seq expected next.
        expected: u64,
        /// The fragment's.
        got: u64,
    },
    /// A later fragment of another message than the one in progress.
    #[error("{class} fragment of message {got} while message {in_progress} is in progress")]
    SeqChanged {
        /// The class.
        class: Priority,
        /// The message in progress.
        in_progress: u64,
        /// The fragment's class seq.
        got: u64,
    },
    /// A later fragment whose total or front length is not its first's.
    #[error("{class} fragment's lengths differ from its message's first fragment")]
    LengthsChanged {
        /// The class.
        class: Priority,
    },
    /// A message larger than this receiver takes: refused at its first
    /// fragment, before anything is allocated.
    #[error("{class} message of {total} bytes, limit is {max}")]
    TooLarge {
        /// The class.
        class: Priority,
        /// The body's length the fragment claims.
        total: u64,
        /// The receiver's limit.
        max: usize,
    },
}

/// A message of a class being put back together.
#[derive(Debug)]
struct Partial {
    class_seq: u64,
    front_len: u32,
    total: u64,
    head: MessageHead,
    /// The body so far, `total` bytes reserved at the first fragment.
    body: BytesMut,
    /// The CRC32C of the data received so far, while every data piece's
    /// is known ([`Reassembler::push_checked`]).
    data_crc: Option<u32>,
}

/// One class's reassembly state.
#[derive(Debug)]
struct Lane {
    /// The class seq the next message must have.
    next_seq: u64,
    partial: Option<Partial>,
}

/// Puts fragments back together into messages, one message in progress
/// per class: fragments arrive in order within a class and interleaved
/// across classes. Every fragment that does not continue its class is a
/// [`ReassemblyError`], never a panic, and leaves the state as it was.
///
/// Memory: a message's body is reserved at its first fragment, after its
/// total was checked against `max_message`; at most one message per class
/// is in progress, so at most `max_message` × [`Priority::COUNT`] bytes
/// are held ([`Reassembler::reserved`]). A message of one fragment is
/// not copied (its front and data are slices of the piece).
///
/// A link fault loses the fragments in flight: [`Reassembler::discard_partial`]
/// drops the messages in progress, whose sender replays them from their
/// first fragment; class seqs already delivered stay delivered.
#[derive(Debug)]
pub struct Reassembler {
    max_message: usize,
    lanes: [Lane; Priority::COUNT],
}

impl Reassembler {
    /// A reassembler of messages whose body (front + data) is at most
    /// `max_message` bytes, each class expecting class seq 1 first.
    pub fn new(max_message: usize) -> Reassembler {
        Reassembler {
            max_message,
            lanes: std::array::from_fn(|_| Lane {
                next_seq: 1,
                partial: None,
            }),
        }
    }

    /// A reassembler taking what a message frame may carry under
    /// `limits`: front and data at most their segments' limits.
    pub fn for_limits(limits: &FrameLimits) -> Reassembler {
        let seg = |i: usize| limits.max_segment[i] as usize;
        Reassembler::new(seg(1).saturating_add(seg(2)))
    }

    /// The class seq the next message of `class` must have.
    pub fn next_seq(&self, class: Priority) -> u64 {
        self.lanes[class.index()].next_seq
    }

    /// Bytes reserved for messages in progress (at most `max_message` per
    /// class).
    pub fn reserved(&self) -> usize {
        self.lanes
            .iter()
            .filter_map(|l| l.partial.as_ref())
            .map(|p| p.body.capacity())
            .sum()
    }

    /// Drops every message in progress (a link fault: their fragments are
    /// replayed from the first). Returns how many were dropped.
    pub fn discard_partial(&mut self) -> usize {
        self.lanes
            .iter_mut()
            .filter_map(|l| l.partial.take())
            .count()
    }

    /// Takes the next fragment of its class: the message and its ack once
    /// the fragment completes one, `None` while it does not.
    pub fn push(&mut self, frag: Fragment) -> Result<Option<(Message, u64)>, ReassemblyError> {
        self.push_checked(frag, None)
    }

    /// As [`Reassembler::push`], with the piece's CRC32C where the frame
    /// layer checked and kept it ([`Frame::known_crc`] of segment 2): a
    /// message whose data pieces' CRCs are all known (kept, or short
    /// enough to read again) comes out knowing its data's
    /// ([`Message::data_checksum`]), as one received in a `Message` frame
    /// does.
    pub fn push_checked(
        &mut self,
        frag: Fragment,
        piece_crc: Option<u32>,
    ) -> Result<Option<(Message, u64)>, ReassemblyError> {
        frag.check()?;
        let max = self.max_message;
        let lane = &mut self.lanes[frag.class.index()];
        let done = match &mut lane.partial {
            None => lane.begin(frag, max, piece_crc)?,
            Some(partial) => partial.continue_with(frag, piece_crc)?,
        };
        if let Some((msg, _)) = &done {
            // Whole: the class's next message may begin.
            lane.partial = None;
            lane.next_seq = msg.seq.wrapping_add(1);
        }
        Ok(done)
    }
}

impl Lane {
    /// A first fragment with no message of the class in progress: checked
    /// against the class seq expected and the limit before anything is
    /// reserved. The message if it is whole (a message of one fragment is
    /// not copied: its segments are slices of the piece).
    fn begin(
        &mut self,
        frag: Fragment,
        max: usize,
        piece_crc: Option<u32>,
    ) -> Result<Option<(Message, u64)>, ReassemblyError> {
        let class = frag.class;
        let Some(head) = frag.head else {
            return Err(ReassemblyError::NoFirst {
                class,
                class_seq: frag.class_seq,
                offset: frag.offset,
            });
        };
        if frag.class_seq != self.next_seq {
            return Err(ReassemblyError::SeqGap {
                class,
                expected: self.next_seq,
                got: frag.class_seq,
            });
        }
        let total = match usize::try_from(frag.total) {
            Ok(total) if total <= max => total,
            _ => {
                return Err(ReassemblyError::TooLarge {
                    class,
                    total: frag.total,
                    max,
                })
            }
        };
        let data_crc = data_crc_after(Some(0), &frag, piece_crc);
        if frag.is_last() {
            return Ok(Some(assemble(
                frag.class_seq,
                frag.front_len,
                &head,
                frag.piece,
                data_crc,
            )));
        }
        let mut body = BytesMut::with_capacity(total);
        body.extend_from_slice(&frag.piece);
        self.partial = Some(Partial {
            class_seq: frag.class_seq,
            front_len: frag.front_len,
            total: frag.total,
            head,
            body,
            data_crc,
        });
        Ok(None)
    }
}

impl Partial {
    /// A later fragment: it must continue this message where it stands.
    /// The message once it is whole (the caller then drops this).
    fn continue_with(
        &mut self,
        frag: Fragment,
        piece_crc: Option<u32>,
    ) -> Result<Option<(Message, u64)>, ReassemblyError> {
        let class = frag.class;
        if frag.head.is_some() {
            return Err(ReassemblyError::SecondFirst {
                class,
                in_progress: self.class_seq,
                got: frag.class_seq,
            });
        }
        if frag.class_seq != self.class_seq {
            return Err(ReassemblyError::SeqChanged {
                class,
                in_progress: self.class_seq,
                got: frag.class_seq,
            });
        }
        if (frag.total, frag.front_len) != (self.total, self.front_len) {
            return Err(ReassemblyError::LengthsChanged { class });
        }
        let expected = self.body.len() as u64;
        if frag.offset != expected {
            return Err(ReassemblyError::OutOfOrder {
                class,
                expected,
                got: frag.offset,
            });
        }
        self.body.extend_from_slice(&frag.piece);
        self.data_crc = data_crc_after(self.data_crc, &frag, piece_crc);
        if !frag.is_last() {
            return Ok(None);
        }
        let body = std::mem::take(&mut self.body).freeze();
        Ok(Some(assemble(
            self.class_seq,
            self.front_len,
            &self.head,
            body,
            self.data_crc,
        )))
    }
}

/// The CRC32C of the data up to and including `frag`'s piece, from the
/// data's before it (`None`: not known): a front piece changes nothing; a
/// data piece's CRC is the one the frame layer kept, or computed here if
/// the piece is short (below [`CRC_MEMO_MIN`], as a frame would not keep
/// it), else unknown.
fn data_crc_after(before: Option<u32>, frag: &Fragment, piece_crc: Option<u32>) -> Option<u32> {
    if frag.offset < u64::from(frag.front_len) {
        return before;
    }
    let piece = &frag.piece;
    let crc = piece_crc.or_else(|| (piece.len() < CRC_MEMO_MIN).then(|| crc32c(piece)))?;
    Some(crc32c_combine(before?, crc, piece.len()))
}

/// The message of a whole body, its front the first `front_len` bytes;
/// `data_crc` its data's CRC32C, if known.
fn assemble(
    seq: u64,
    front_len: u32,
    head: &MessageHead,
    body: Bytes,
    data_crc: Option<u32>,
) -> (Message, u64) {
    let mut front = body;
    let data = front.split_off(front_len as usize);
    let memo = match data_crc {
        // Kept as a Message frame's is: for data worth not reading again.
        Some(crc) if data.len() >= CRC_MEMO_MIN => CrcMemo::new(DATA_SEGMENT, &data, crc),
        _ => CrcMemo::NONE,
    };
    let mut msg = Message::received(head.msg_type, head.priority, head.flags, seq, front, data);
    msg.call = head.call;
    msg.set_data_crc(memo);
    (msg, head.ack)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Message `seq` of `class` with `front` and `data` bytes of payload.
    fn message(class: Priority, seq: u64, front: usize, data: usize) -> Message {
        let mut m = Message::new(9, vec![1u8; front], vec![2u8; data]).with_class(class);
        m.seq = seq;
        m.call = 5;
        m
    }

    fn cut(m: &Message, max: usize) -> Vec<Fragment> {
        Fragmenter::new(m.clone(), 4, max).unwrap().collect()
    }

    #[test]
    fn pieces_are_bounded_slices_that_never_span_front_and_data() {
        let m = message(Priority::Data, 1, 100, 250);
        let frags = Fragmenter::new(m.clone(), 4, 64).unwrap();
        assert_eq!(frags.len(), 2 + 4);
        let frags: Vec<_> = frags.collect();
        let lens: Vec<_> = frags.iter().map(|f| f.piece.len()).collect();
        assert_eq!(lens, [64, 36, 64, 64, 64, 58]);
        assert!(frags[0].is_first() && frags[0].head.is_some());
        assert!(frags[1..].iter().all(|f| f.head.is_none()));
        assert!(frags[5].is_last() && !frags[4].is_last());
        // Slices of the message's own memory: nothing copied.
        assert_eq!(frags[0].piece.as_ptr(), m.front.as_ptr());
        assert_eq!(frags[2].piece.as_ptr(), m.data.as_ptr());
        // No payload: one empty fragment, first and last.
        let empty = cut(&message(Priority::Data, 1, 0, 0), 64);
        assert_eq!(empty.len(), 1);
        assert!(empty[0].is_first() && empty[0].is_last());
    }

    #[test]
    fn fragments_round_trip_through_frames_and_reassemble() {
        let m = message(Priority::Background, 1, 10, 1000);
        let mut r = Reassembler::new(4096);
        let mut out = Vec::new();
        for f in cut(&m, 128) {
            let frame = f.clone().into_frame();
            let wire = Bytes::from(frame.encode_to_vec().unwrap());
            let back = Frame::decode_exact(wire, &FrameLimits::default()).unwrap();
            let back = Fragment::from_frame(back).unwrap();
            assert_eq!(back, f);
            out.extend(r.push(back).unwrap());
        }
        assert_eq!(out, [(m, 4)]);
        assert_eq!(r.reserved(), 0);
        assert_eq!(r.next_seq(Priority::Background), 2);
    }

    #[test]
    fn a_fragment_that_does_not_continue_its_class_is_a_typed_error() {
        let bg = Priority::Background;
        let frags = cut(&message(bg, 1, 0, 300), 100);
        let mut r = Reassembler::new(1000);
        // A later fragment with nothing begun.
        assert!(matches!(
            r.push(frags[1].clone()),
            Err(ReassemblyError::NoFirst { .. })
        ));
        // A first fragment that is not the next message.
        let later = cut(&message(bg, 2, 0, 300), 100);
        assert_eq!(
            r.push(later[0].clone()),
            Err(ReassemblyError::SeqGap {
                class: bg,
                expected: 1,
                got: 2
            })
        );
        assert_eq!(r.push(frags[0].clone()), Ok(None));
        // Skipped a piece.
        assert_eq!(
            r.push(frags[2].clone()),
            Err(ReassemblyError::OutOfOrder {
                class: bg,
                expected: 100,
                got: 200
            })
        );
        assert!(matches!(
            r.push(frags[0].clone()),
            Err(ReassemblyError::SecondFirst { .. })
        ));
        assert!(matches!(
            r.push(later[1].clone()),
            Err(ReassemblyError::SeqChanged { .. })
        ));
        let mut longer = frags[1].clone();
        longer.total += 1;
        assert_eq!(
            r.push(longer),
            Err(ReassemblyError::LengthsChanged { class: bg })
        );
        // Every error left the state as it was: the message completes.
        assert_eq!(r.push(frags[1].clone()), Ok(None));
        assert!(r.push(frags[2].clone()).unwrap().is_some());
        // A message over the limit is refused at its first fragment,
        // before anything is reserved.
        let big = cut(&message(bg, 2, 0, 1001), 100);
        assert_eq!(
            r.push(big[0].clone()),
            Err(ReassemblyError::TooLarge {
                class: bg,
                total: 1001,
                max: 1000
            })
        );
        assert_eq!(r.reserved(), 0);
    }

    #[test]
    fn a_malformed_fragment_is_refused_alone() {
        let f = cut(&message(Priority::Data, 1, 3, 300), 100);
        let bad = |edit: &dyn Fn(&mut Fragment)| {
            let mut g = f[1].clone();
            edit(&mut g);
            g.check().unwrap_err()
        };
        assert!(matches!(
            bad(&|g| g.offset = 250),
            FragmentError::OffsetPastTotal { .. }
        ));
        assert!(matches!(
            bad(&|g| g.offset = u64::MAX),
            FragmentError::OffsetPastTotal { .. }
        ));
        assert_eq!(bad(&|g| g.class_seq = 0), FragmentError::ZeroSeq);
        assert!(matches!(
            bad(&|g| g.front_len = 400),
            FragmentError::Lengths { .. }
        ));
        assert!(matches!(
            bad(&|g| g.total = u64::MAX),
            FragmentError::Lengths { .. }
        ));
        assert_eq!(bad(&|g| g.piece = Bytes::new()), FragmentError::EmptyPiece);
        assert!(matches!(
            bad(&|g| g.head = f[0].head),
            FragmentError::HeadMisplaced { .. }
        ));
        let mut first = f[0].clone();
        first.head = None;
        assert!(matches!(
            first.check(),
            Err(FragmentError::HeadMisplaced { .. })
        ));
        // No message is of class control.
        let mut control = f[0].clone();
        control.class = Priority::Control;
        assert!(matches!(
            control.check(),
            Err(FragmentError::ClassMismatch { .. })
        ));
        let mut r = Reassembler::new(1 << 20);
        assert!(matches!(
            r.push(control),
            Err(ReassemblyError::Malformed(_))
        ));
    }

    #[test]
    fn frames_of_another_shape_are_refused() {
        let f = cut(&message(Priority::Interactive, 1, 3, 30), 100).remove(0);
        let frame = f.into_frame();
        let with = |i: usize, seg: Bytes| {
            let mut g = frame.clone();
            g.segments[i] = seg;
            Fragment::from_frame(g)
        };
        let mut h = frame.segments[0].to_vec();
        h[0] = 4;
        assert_eq!(
            with(0, h.clone().into()),
            Err(FragmentError::UnknownClass(4))
        );
        h[0] = 1;
        h[2] = 1;
        assert_eq!(with(0, h.into()), Err(FragmentError::ReservedBitsSet));
        let mut mh = frame.segments[1].to_vec();
        mh[5] = 1;
        assert_eq!(with(1, mh.into()), Err(FragmentError::ReservedBitsSet));
        let mut mh = frame.segments[1].to_vec();
        mh[8] = 2;
        assert!(matches!(
            with(1, mh.into()),
            Err(FragmentError::SeqMismatch { .. })
        ));
        assert!(matches!(
            with(1, Bytes::from_static(b"x")),
            Err(FragmentError::Shape(_))
        ));
        assert!(matches!(
            with(0, Bytes::new()),
            Err(FragmentError::Shape(_))
        ));
        let mut two = frame.clone();
        two.segments.pop();
        assert!(matches!(
            Fragment::from_frame(two),
            Err(FragmentError::Shape(_))
        ));
        let mut other = frame;
        other.tag = Tag::Message;
        assert_eq!(
            Fragment::from_frame(other),
            Err(FragmentError::NotFragment(Tag::Message))
        );
        assert_eq!(
            Fragmenter::new(message(Priority::Data, 0, 1, 1), 0, 64).err(),
            Some(FragmentError::ZeroSeq)
        );
        assert_eq!(
            Fragmenter::new(message(Priority::Data, 1, 1, 1), 0, 0).err(),
            Some(FragmentError::ZeroMaxFragment)
        );
    }

    #[test]
    fn memory_is_bounded_by_the_limit_times_the_classes_and_a_fault_frees_it() {
        let max = 1000;
        let mut r = Reassembler::new(max);
        for (i, class) in Priority::ALL[1..].iter().enumerate() {
            let f = cut(&message(*class, 1, 0, max), 10).remove(0);
            assert_eq!(r.push(f), Ok(None));
            assert_eq!(r.reserved(), max * (i + 1));
        }
        assert!(r.reserved() <= max * Priority::COUNT);
        assert_eq!(r.discard_partial(), 3);
        assert_eq!(r.reserved(), 0);
        // Replayed from its first fragment after the fault, it completes.
        let m = message(Priority::Data, 1, 0, max);
        let out: Vec<_> = cut(&m, 10)
            .into_iter()
            .filter_map(|f| r.push(f).unwrap())
            .collect();
        assert_eq!(out, [(m, 4)]);
    }

    #[test]
    fn a_message_whose_pieces_crcs_are_known_knows_its_datas() {
        let m = message(Priority::Data, 1, 10, 200_000);
        let whole = |known: &dyn Fn(&Fragment) -> Option<u32>| {
            let mut r = Reassembler::new(1 << 20);
            let mut out = None;
            for f in Fragmenter::new(m.clone(), 0, 64 << 10).unwrap() {
                let crc = known(&f);
                out = r.push_checked(f, crc).unwrap();
            }
            out.expect("whole").0
        };
        // As the frame layer keeps them: pieces of 64 KiB; the last is
        // read again (short).
        let kept = |f: &Fragment| (f.piece.len() >= CRC_MEMO_MIN).then(|| crc32c(&f.piece));
        assert_eq!(whole(&kept).data_checksum(), Some(crc32c(&m.data)));
        // A large piece whose CRC nobody kept: not known.
        assert_eq!(whole(&|_| None).data_checksum(), None);
    }

    #[test]
    fn for_limits_takes_what_a_message_frame_may_carry() {
        let r = Reassembler::for_limits(&FrameLimits::default());
        assert_eq!(r.max_message, (16 << 20) + (128 << 20));
    }
}
