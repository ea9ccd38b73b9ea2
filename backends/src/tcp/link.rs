//! One TCP connection: its send queue (coalescing small frames, passing large
//! segments by reference) and its receive buffer and decoder.

use std::collections::VecDeque;
use std::io::{self, IoSlice, Write};
use std::sync::Arc;
use std::time::Instant;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use mio::net::TcpStream;
use msgr_proto::frame::PREAMBLE_LEN;
use msgr_proto::{Frame, FrameLimits, Inbound, StreamDecoder, Transmit};
use smallvec::SmallVec;

use crate::shelf::Shelf;

/// The coalescing tail is sealed into a chunk once it holds this much, so
/// a backlog of small frames is a list of bounded buffers: one growing
/// buffer was copied whole on each regrowth (about 3% of a 64 B stream's
/// instructions).
const TAIL_MAX: usize = 64 << 10;
/// Most iovecs handed to one writev.
const MAX_IOVECS: usize = 64;
/// Read granularity: at least this much room before each read.
const MIN_READ_CHUNK: usize = 4 << 10;
/// Largest read granularity a busy link grows to.
const MAX_READ_CHUNK: usize = 256 << 10;
/// Frames at least this large are read into a buffer of their own size.
const LARGE_UNIT: usize = 64 << 10;
/// Most bytes of idle frame buffers a transport keeps for reuse.
pub(crate) const SHELF_BYTES: usize = 8 << 20;
/// Most bytes read for one readiness event before yielding to other links.
pub(crate) const READ_BUDGET: usize = 4 << 20;
/// A frame with at least this many checksummed bytes has its epilogue
/// computed after its segments were written ([`Chunk::Epilogue`]).
const DEFERRED_CRC_MIN: usize = 64 << 10;

/// A piece of the send queue.
#[derive(Debug)]
enum Chunk {
    /// Bytes to write.
    Data(Bytes),
    /// The epilogue of a large frame whose preamble and segments are queued
    /// before it. If nothing is queued behind it, it is computed once they
    /// have been written: the checksum of a megabyte (~15 µs) then runs
    /// while the bytes travel and the peer reads them, rather than before
    /// the first byte leaves ([`SendQueue::compute_epilogues`]). The wire is
    /// the same.
    Epilogue(Box<Frame>),
}

impl Chunk {
    fn data(&self) -> Option<&Bytes> {
        match self {
            Chunk::Data(b) => Some(b),
            Chunk::Epilogue(_) => None,
        }
    }
}

/// The outgoing byte queue of one link: `chunks` first, then `tail`.
#[derive(Debug, Default)]
pub(crate) struct SendQueue {
    chunks: VecDeque<Chunk>,
    tail: BytesMut,
    len: usize,
}

impl SendQueue {
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Bytes of memory the queue holds: its unsent chunks and its tail's
    /// allocation.
    pub(crate) fn buffer_bytes(&self) -> usize {
        let chunks: usize = self
            .chunks
            .iter()
            .filter_map(Chunk::data)
            .map(Bytes::len)
            .sum();
        chunks + self.tail.capacity()
    }

    /// Appends a unit; segments above `copy_threshold` are referenced, not
    /// copied. `defer_crc`: a large frame's epilogue may wait for its
    /// segments to be written ([`Chunk::Epilogue`]); false on a link
    /// streaming out, whose peer would wait for each late epilogue.
    pub(crate) fn push(
        &mut self,
        unit: Transmit,
        copy_threshold: usize,
        defer_crc: bool,
    ) -> Result<(), msgr_proto::FrameError> {
        if unit.largest_segment() <= copy_threshold {
            // All copied anyway: encode straight into the tail, without an
            // EncodedFrame (or, for a message, a Frame) in between.
            let checked = unit.checked()?;
            let len = unit.encoded_len();
            self.room_for_small(len);
            checked.write(&mut self.tail);
            self.len += len;
            return Ok(());
        }
        match unit.into_frame() {
            Err(banner) => self.put_small(&banner),
            Ok(f) => {
                self.put_small(&f.preamble()?.encode());
                for seg in &f.segments {
                    if seg.len() > copy_threshold {
                        self.put_big(seg.clone());
                    } else {
                        self.put_small(seg);
                    }
                }
                if defer_crc && f.checked_bytes() >= DEFERRED_CRC_MIN {
                    self.seal_tail();
                    self.len += 4 * f.segments.len();
                    self.chunks.push_back(Chunk::Epilogue(Box::new(f)));
                } else {
                    let (epilogue, len) = f.epilogue_bytes();
                    self.put_small(&epilogue[..len]);
                }
            }
        }
        Ok(())
    }

    /// Appends bytes that are already encoded (a corrupted unit).
    #[cfg(feature = "fault-injection")]
    pub(crate) fn push_raw(&mut self, b: &[u8]) {
        self.put_small(b);
    }

    fn put_small(&mut self, b: &[u8]) {
        self.room_for_small(b.len());
        self.tail.put_slice(b);
        self.len += b.len();
    }

    /// Seals the tail if `n` more bytes would take it past [`TAIL_MAX`].
    fn room_for_small(&mut self, n: usize) {
        if !self.tail.is_empty() && self.tail.len() + n > TAIL_MAX {
            // A fresh buffer of full size: growing one from empty would
            // copy it a dozen times on the way.
            let sealed = std::mem::replace(&mut self.tail, BytesMut::with_capacity(TAIL_MAX));
            self.chunks.push_back(Chunk::Data(sealed.freeze()));
        }
    }

    /// Moves what the tail holds into the chunks, so that a chunk can follow.
    fn seal_tail(&mut self) {
        if !self.tail.is_empty() {
            self.chunks
                .push_back(Chunk::Data(self.tail.split().freeze()));
        }
    }

    fn put_big(&mut self, b: Bytes) {
        self.seal_tail();
        self.len += b.len();
        self.chunks.push_back(Chunk::Data(b));
    }

    /// Writes as much as the socket takes. Ok(true) when everything is out.
    pub(crate) fn write_to(&mut self, w: &mut impl Write) -> io::Result<bool> {
        while self.len > 0 {
            self.compute_epilogues();
            // On the stack: a heap vector cost an allocation per write.
            let mut iov: SmallVec<[IoSlice<'_>; MAX_IOVECS]> = SmallVec::new();
            // Up to the first epilogue still to compute: what precedes it
            // goes first.
            for c in self
                .chunks
                .iter()
                .take(MAX_IOVECS - 1)
                .map_while(Chunk::data)
            {
                iov.push(IoSlice::new(c));
            }
            // The tail follows the last chunk: it may go only if every chunk did.
            if iov.len() == self.chunks.len() && !self.tail.is_empty() {
                iov.push(IoSlice::new(&self.tail));
            }
            let written = w.write_vectored(&iov);
            drop(iov);
            let n = match written {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            self.consume(n);
        }
        Ok(true)
    }

    /// Computes the epilogues this write reaches, except the last thing
    /// queued: its frame's bytes go first ([`Chunk::Epilogue`]). Behind a
    /// stream the peer would wait for a late epilogue before the next
    /// frame (1 MiB streaming lost a fifth of its bandwidth), so an epilogue
    /// with anything queued after it is computed before it is written.
    fn compute_epilogues(&mut self) {
        let n = self.chunks.len();
        for i in 0..n.min(MAX_IOVECS - 1) {
            let Chunk::Epilogue(f) = &self.chunks[i] else {
                continue;
            };
            let last = i + 1 == n && self.tail.is_empty();
            if last && i > 0 {
                return;
            }
            let (epilogue, len) = f.epilogue_bytes();
            self.chunks[i] = Chunk::Data(Bytes::copy_from_slice(&epilogue[..len]));
        }
    }

    fn consume(&mut self, mut n: usize) {
        self.len -= n;
        while n > 0 {
            match self.chunks.front_mut() {
                Some(Chunk::Data(front)) if n >= front.len() => {
                    n -= front.len();
                    self.chunks.pop_front();
                }
                Some(Chunk::Data(front)) => {
                    front.advance(n);
                    n = 0;
                }
                Some(Chunk::Epilogue(_)) => {
                    // Nothing behind an epilogue still to compute is written.
                    debug_assert!(false, "{n} bytes written past an epilogue not computed");
                    break;
                }
                None => {
                    self.tail.advance(n);
                    n = 0;
                }
            }
        }
        if self.len == 0 && self.tail.capacity() > (1 << 20) {
            // Don't keep a burst's buffer forever.
            self.tail = BytesMut::new();
        }
    }
}

#[derive(Debug)]
pub(crate) struct TcpLink {
    pub(crate) stream: TcpStream,
    pub(crate) connecting: bool,
    pub(crate) tx: SendQueue,
    /// The receive buffer, its decoder and how reads are sized.
    pub(crate) rx: Receiver,
    pub(crate) close_after_flush: bool,
    pub(crate) paused: bool,
    /// Fault injection: neither read nor write.
    pub(crate) frozen: bool,
    /// Readable data may be waiting (edge-triggered readiness was not drained).
    pub(crate) read_pending: bool,
    pub(crate) write_interest: bool,
    /// Registered in the worker's Poll. A read-polled link that awaits
    /// nothing but bytes is taken out while the worker spins (module docs
    /// of `tcp`).
    pub(crate) in_poll: bool,
    /// Which way bytes have moved lately (whether the link is read-polled).
    traffic: Traffic,
}

/// Which way a link's bytes have moved lately: a link moving bulk either
/// way is not read-polled ([`TcpLink::read_polled`]).
#[derive(Debug, Default)]
struct Traffic {
    /// Since when spinning passes have found the link read-polled and
    /// awaiting nothing but bytes ([`TcpLink::may_leave_poll`]).
    quiet_since: Option<Instant>,
    /// Bytes written since a read last brought some, and read since a write
    /// last sent some.
    written_since_read: usize,
    read_since_write: usize,
}

impl Traffic {
    /// Whether the traffic goes back and forth in small units: less than
    /// [`super::READ_POLL_BULK`] each way since the other way last moved
    /// anything.
    fn small_exchanges(&self) -> bool {
        !self.sending_bulk() && self.read_since_write <= super::READ_POLL_BULK
    }

    /// Whether more than [`super::READ_POLL_BULK`] was written since
    /// anything was read: the link streams out.
    fn sending_bulk(&self) -> bool {
        self.written_since_read > super::READ_POLL_BULK
    }
}

/// The receiving half of a link: its buffer, the decoder cutting units out
/// of it, and what sizes the next read.
#[derive(Debug)]
pub(crate) struct Receiver {
    buf: BytesMut,
    decoder: StreamDecoder,
    /// Current read granularity (grows while reads fill the buffer).
    read_chunk: usize,
    /// The last unit decoded was a large frame (see [`Receiver::read_once`]).
    after_large: bool,
    /// Received bytes moved from one buffer to another (what the sizing in
    /// [`Receiver::read_once`] keeps small).
    copied: usize,
    /// Times the receive buffer had to make room (a new buffer, or this one
    /// regrown or compacted).
    regrown: usize,
    /// `recv` calls made, `WouldBlock` ones too (tests count them).
    pub(crate) recvs: usize,
    /// Where large frames' buffers come from and go back to.
    shelf: Arc<Shelf<BytesMut>>,
    /// `buf` is a whole buffer from the shelf, holding one large frame.
    lendable: bool,
}

/// What one [`TcpLink::read_once`] read.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Recv {
    /// Bytes read; 0 is end of stream.
    pub(crate) len: usize,
    /// Fewer bytes than there was room for: the socket's receive queue was
    /// empty when `recv` returned, so (epoll being edge-triggered) bytes
    /// arriving later raise a new readiness event.
    pub(crate) short: bool,
}

impl TcpLink {
    pub(crate) fn new(
        stream: TcpStream,
        connecting: bool,
        limits: FrameLimits,
        shelf: Arc<Shelf<BytesMut>>,
    ) -> Self {
        TcpLink {
            stream,
            connecting,
            tx: SendQueue::default(),
            rx: Receiver::new(limits, shelf),
            close_after_flush: false,
            paused: false,
            frozen: false,
            read_pending: false,
            write_interest: false,
            in_poll: false,
            traffic: Traffic::default(),
        }
    }

    /// Bytes of memory the link's buffers hold (send queue and receive
    /// buffer), for the transport's `buffer_bytes` gauge.
    pub(crate) fn buffer_bytes(&self) -> usize {
        self.tx.buffer_bytes() + self.rx.buf.capacity()
    }

    /// Whether the link has written more than [`super::READ_POLL_BULK`]
    /// since it last read anything: it streams out.
    pub(crate) fn sending_bulk(&self) -> bool {
        self.traffic.sending_bulk()
    }

    /// Bytes went out: the count since the last read grows, the count of
    /// reads since a write starts again.
    pub(crate) fn wrote(&mut self, n: usize) {
        if n > 0 {
            self.traffic.written_since_read += n;
            self.traffic.read_since_write = 0;
        }
    }

    /// Bytes came in (see [`TcpLink::wrote`]).
    pub(crate) fn was_read(&mut self, n: usize) {
        if n > 0 {
            self.traffic.read_since_write += n;
            self.traffic.written_since_read = 0;
        }
    }

    /// Whether the transport reads this link on every spinning pass rather
    /// than when epoll names it (module docs of [`super`]): it is connected,
    /// reading, and its traffic is small exchanges.
    pub(crate) fn read_polled(&self) -> bool {
        !self.connecting && !self.paused && !self.frozen && self.traffic.small_exchanges()
    }

    /// Looks at the link on a spinning pass at `now`; whether it may be out
    /// of the worker's Poll: read-polled and awaiting nothing but bytes for
    /// [`super::LEAVE_POLL_AFTER`]. A credit-paced stream flips a link
    /// between bulk and small exchanges with every credit; taken out and
    /// put back each time (or after 64 quiet passes), `msgr bench`'s 1 MiB
    /// stream lost 3–8% (15 000 `epoll_ctl` calls a round).
    pub(crate) fn may_leave_poll(&mut self, now: Instant) -> bool {
        if !self.read_polled() || self.needs_epoll() {
            self.traffic.quiet_since = None;
            return false;
        }
        let since = *self.traffic.quiet_since.get_or_insert(now);
        now.saturating_duration_since(since) >= super::LEAVE_POLL_AFTER
    }

    /// Whether only epoll can tell what this link waits for: room to
    /// connect or write, or bytes to read while it moves bulk (and is not
    /// read-polled).
    pub(crate) fn needs_epoll(&self) -> bool {
        self.connecting || self.write_interest || !self.traffic.small_exchanges()
    }

    /// One `recv` into the receive buffer ([`Receiver::read_once`]).
    #[inline]
    pub(crate) fn read_once(&mut self) -> io::Result<Recv> {
        self.rx.read_once(&self.stream)
    }

    /// Whether the next read's size depends on the frame being read
    /// ([`Receiver::reads_by_frame`]).
    #[inline]
    pub(crate) fn reads_by_frame(&self) -> bool {
        self.rx.reads_by_frame()
    }

    /// Decodes the next complete unit from the receive buffer.
    #[inline]
    pub(crate) fn next_unit(&mut self) -> Result<Option<Inbound>, msgr_proto::FrameError> {
        self.rx.next_unit()
    }
}

impl Receiver {
    fn new(limits: FrameLimits, shelf: Arc<Shelf<BytesMut>>) -> Self {
        Receiver {
            buf: BytesMut::new(),
            decoder: StreamDecoder::new(limits),
            read_chunk: MIN_READ_CHUNK,
            after_large: false,
            copied: 0,
            regrown: 0,
            recvs: 0,
            shelf,
            lendable: false,
        }
    }

    /// One `recv` from `stream` into the buffer (a [`Recv`] of length 0 is
    /// end of stream).
    ///
    /// The read is sized by what the decoder knows (call [`Receiver::next_unit`]
    /// between reads while [`Receiver::reads_by_frame`]). A large frame is
    /// read into a buffer of its size (from the shelf) and no further, and the read
    /// after a large frame takes only the next preamble. Otherwise the front
    /// of the next frame lands in the tail of this one's buffer and the
    /// buffer is regrown for it, which copies what it holds: about one extra
    /// copy of a 1 MiB stream's payload.
    fn read_once(&mut self, stream: &TcpStream) -> io::Result<Recv> {
        let needed = self.decoder.needed();
        let rest = needed.saturating_sub(self.buf.len());
        let cap = if needed >= LARGE_UNIT && rest > 0 {
            if !self.lendable {
                // Copy what was read of it (its preamble after a large
                // frame; after small ones, up to a read budget) into a
                // buffer of the frame's size, one the frame can take along
                // and give back to the shelf, rather than regrow this one.
                let mut own = self
                    .shelf
                    .take(needed)
                    .unwrap_or_else(|| BytesMut::with_capacity(needed));
                own.extend_from_slice(&self.buf);
                self.copied += self.buf.len();
                self.buf = own;
                self.lendable = true;
            }
            rest
        } else if self.after_large && self.buf.is_empty() {
            self.reserve(PREAMBLE_LEN);
            PREAMBLE_LEN
        } else {
            // Idle and handshaking links read in small chunks (thousands of
            // them cost little memory); a link whose reads fill the buffer
            // grows its chunk, so streaming needs few system calls.
            //
            // A read goes into the room left while that is at least a
            // quarter of a chunk (and holds the frame under way). Decoded
            // frames share the buffer, and while one is still held (an
            // echo's reply keeps its request's bytes until acknowledged)
            // making room means a new buffer: regrowing before every read
            // allocated one per ping-pong round trip, this way one serves a
            // few dozen small frames.
            let room = self.buf.capacity() - self.buf.len();
            if room < rest.max(self.read_chunk / 4) {
                self.reserve(rest.max(self.read_chunk));
            }
            usize::MAX
        };
        let room = (self.buf.capacity() - self.buf.len()).min(cap);
        self.recvs += 1;
        let k = crate::sys::recv_into_spare(&socket2::SockRef::from(stream), &mut self.buf, room)?;
        if k == room && cap == usize::MAX {
            self.read_chunk = (self.read_chunk * 2).min(MAX_READ_CHUNK);
        }
        Ok(Recv {
            len: k,
            short: k < room,
        })
    }

    /// Whether the next read's size depends on the frame being read (a
    /// large frame, or the preamble after one): decode before it.
    fn reads_by_frame(&self) -> bool {
        self.after_large || self.decoder.needed() >= LARGE_UNIT
    }

    /// Makes room for `n` more received bytes.
    fn reserve(&mut self, n: usize) {
        if self.buf.capacity() - self.buf.len() < n {
            // Regrowing moves what the buffer holds (an upper bound: the
            // buffer may grow in place).
            self.copied += self.buf.len();
            self.regrown += 1;
        }
        self.buf.reserve(n);
    }

    /// Decodes the next complete unit from the buffer.
    fn next_unit(&mut self) -> Result<Option<Inbound>, msgr_proto::FrameError> {
        let unit = if self.lendable {
            let shelf = &self.shelf;
            self.decoder.decode_with(&mut self.buf, |b| {
                let len = b.len();
                shelf.lend(b, len)
            })?
        } else {
            self.decoder.decode(&mut self.buf)?
        };
        if let Some(unit) = &unit {
            // A lent buffer left with the frame.
            self.lendable = false;
            self.after_large = unit.encoded_len() >= LARGE_UNIT;
        }
        Ok(unit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use msgr_proto::{Frame, Tag};

    /// A writer that keeps what it is given and the size of each call.
    #[derive(Default)]
    struct Wire {
        bytes: Vec<u8>,
        calls: Vec<usize>,
    }

    impl Write for Wire {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.write_vectored(&[IoSlice::new(buf)])
        }

        fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
            let n = bufs.iter().map(|b| b.len()).sum();
            bufs.iter().for_each(|b| self.bytes.extend_from_slice(b));
            self.calls.push(n);
            Ok(n)
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// A large frame queued last has its segments written before its
    /// epilogue is computed (one writev up to the epilogue, then the
    /// epilogue); with a frame behind it, or small, or with its payload not
    /// checksummed, it goes in one. The bytes are the encoding either way,
    /// in order.
    #[test]
    fn a_large_frames_epilogue_follows_its_written_segments() {
        let large = Frame::new(
            Tag::Message,
            [
                Bytes::from(vec![1u8; 40]),
                Bytes::new(),
                Bytes::from(vec![9u8; 1 << 20]),
            ],
        );
        let mut unchecked = large.clone();
        unchecked.flags = msgr_proto::frame::FLAG_UNCHECKED_PAYLOAD;
        let medium = Frame::new(Tag::Message, [Bytes::from(vec![3u8; 8 << 10])]);
        let small = Frame::new(Tag::Message, [Bytes::from(vec![2u8; 64])]);
        let cases = [
            (&large, false, true),
            (&large, true, false),
            (&unchecked, false, false),
            (&medium, false, false),
        ];
        for (first, then_small, split) in cases {
            let mut q = SendQueue::default();
            q.push(Transmit::Frame(first.clone()), 4096, true).unwrap();
            let mut expected = first.encode_to_vec().unwrap();
            if then_small {
                q.push(Transmit::Frame(small.clone()), 4096, true).unwrap();
                expected.extend(small.encode_to_vec().unwrap());
            }
            let mut wire = Wire::default();
            assert!(q.write_to(&mut wire).unwrap());
            assert!(wire.bytes == expected, "the wire is the encoding");
            let before_epilogue = first.encoded_len() - 4 * first.segments.len();
            let calls = if split {
                vec![before_epilogue, expected.len() - before_epilogue]
            } else {
                vec![expected.len()]
            };
            assert_eq!(wire.calls, calls, "then a small frame: {then_small}");
            assert!(q.is_empty());
        }
    }

    /// Many more referenced segments than one writev takes (a replay after a
    /// reconnect queues thousands): the coalesced tail must not jump ahead of
    /// the chunks left out of the iovec list.
    #[test]
    fn send_queue_keeps_order_with_more_chunks_than_iovecs() {
        // A socket with room for everything offered in one writev.
        check_order(400, 64 << 20);
        check_order(400, 1 << 20);
    }

    #[test]
    fn send_queue_keeps_order_across_small_and_big() {
        check_order(20, 7000);
    }

    /// Thousands of small frames: the tail is sealed into chunks every
    /// `TAIL_MAX` bytes, and they leave in order, however the socket takes them.
    #[test]
    fn send_queue_keeps_order_across_sealed_tails() {
        let mut q = SendQueue::default();
        let mut expect = Vec::new();
        for i in 0..10_000u32 {
            let f = Frame::new(Tag::Message, vec![Bytes::from(i.to_le_bytes().repeat(5))]);
            q.push(Transmit::Frame(f.clone()), 8 << 10, true).unwrap();
            expect.extend(f.encode_to_vec().unwrap());
        }
        assert!(
            expect.len() > 4 * TAIL_MAX,
            "the test must seal several tails"
        );
        assert!(q.chunks.len() >= 4, "{} chunks", q.chunks.len());
        assert!(q
            .chunks
            .iter()
            .all(|c| c.data().is_some_and(|b| b.len() <= TAIL_MAX)));
        for trickle in [expect.len(), 65_537, 999] {
            let mut q2 = SendQueue::default();
            for i in 0..10_000u32 {
                let f = Frame::new(Tag::Message, vec![Bytes::from(i.to_le_bytes().repeat(5))]);
                q2.push(Transmit::Frame(f), 8 << 10, true).unwrap();
            }
            assert_eq!(drain(&mut q2, trickle), expect, "trickle {trickle}");
        }
    }

    /// Frames of mixed sizes over a real loopback connection, read as the
    /// transport reads them: all arrive intact, and the reads of a frame too
    /// large for one read chunk stop at its end, so nothing of the next frame
    /// sits in (and is later copied out of) its buffer.
    #[test]
    fn large_frames_are_read_into_buffers_of_their_own() {
        use std::time::{Duration, Instant};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let sizes = [10, 70_000, 5, 1 << 20, 1 << 20, 64 << 10, 300, 3 << 19, 1];
        let frames: Vec<Frame> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let data = Bytes::from(vec![i as u8; n]);
                Frame::new(Tag::Message, [Bytes::from_static(b"h"), Bytes::new(), data])
            })
            .collect();
        // The decoder takes any banner; the engine validates it.
        let mut wire = vec![0u8; msgr_proto::banner::BANNER_LEN];
        for f in &frames {
            wire.extend(f.encode_to_vec().unwrap());
        }
        let writer = std::thread::spawn(move || {
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            s.write_all(&wire).unwrap();
        });
        let (s, _) = listener.accept().unwrap();
        s.set_nonblocking(true).unwrap();
        let shelf = Arc::new(Shelf::new(SHELF_BYTES));
        let mut link = TcpLink::new(
            TcpStream::from_std(s),
            false,
            FrameLimits::default(),
            shelf.clone(),
        );
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        while got.len() < frames.len() {
            assert!(
                Instant::now() < deadline,
                "{} of {} frames",
                got.len(),
                frames.len()
            );
            // Let the writer refill the socket: the next frame is waiting
            // whenever one ends, as in a busy stream.
            std::thread::sleep(Duration::from_millis(2));
            match link.read_once() {
                Ok(r) if r.len == 0 => panic!("end of stream after {} frames", got.len()),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => panic!("read: {e}"),
            }
            while let Some(unit) = link.next_unit().unwrap() {
                let Inbound::Frame(f) = unit else {
                    continue;
                };
                if f.encoded_len() > MAX_READ_CHUNK {
                    assert!(
                        link.rx.buf.is_empty(),
                        "{} bytes of the next frame were read into frame {}'s buffer",
                        link.rx.buf.len(),
                        got.len()
                    );
                }
                got.push(f);
            }
        }
        writer.join().unwrap();
        assert!(got == frames, "frames changed on the way");
        drop(got);
        assert!(
            shelf.idle_bytes() >= 1 << 20,
            "large frames' buffers did not go back to the shelf"
        );
        // At most a read chunk per large frame that follows small ones, a
        // preamble per large frame that follows a large one; regrowing by
        // read chunks moved ~1.5x the 3.5 MiB of large frames.
        let bound = 3 * MAX_READ_CHUNK;
        assert!(
            link.rx.copied <= bound,
            "{} received bytes moved between buffers (at most {bound})",
            link.rx.copied
        );
    }

    /// Small frames arriving one at a time, each still held when the next
    /// is read (as an echo's reply holds its request's bytes until
    /// acknowledged): many share one receive buffer. Making room before
    /// every read took a new buffer per frame.
    #[test]
    fn held_small_frames_share_a_receive_buffer() {
        use std::time::{Duration, Instant};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut writer = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (s, _) = listener.accept().unwrap();
        s.set_nonblocking(true).unwrap();
        let mut link = TcpLink::new(
            TcpStream::from_std(s),
            false,
            FrameLimits::default(),
            Arc::new(Shelf::new(SHELF_BYTES)),
        );
        writer
            .write_all(&[0u8; msgr_proto::banner::BANNER_LEN])
            .unwrap();
        let count = 200;
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut held = Vec::new();
        while held.len() < count {
            let f = Frame::new(Tag::Message, [Bytes::from(vec![held.len() as u8; 64])]);
            writer.write_all(&f.encode_to_vec().unwrap()).unwrap();
            loop {
                assert!(
                    Instant::now() < deadline,
                    "{} of {count} frames",
                    held.len()
                );
                match link.read_once() {
                    Ok(r) if r.len == 0 => panic!("end of stream"),
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_micros(100))
                    }
                    Err(e) => panic!("read: {e}"),
                }
                match link.next_unit().unwrap() {
                    Some(Inbound::Frame(got)) => {
                        assert_eq!(got, f);
                        held.push(got);
                        break;
                    }
                    Some(Inbound::Banner(_)) | None => {}
                    Some(other) => panic!("not the frame sent: {other:?}"),
                }
            }
        }
        // ~110 B a frame, a 4 KiB buffer refilled while a quarter is left:
        // about 8 buffers for the 200.
        assert!(
            link.rx.regrown <= count / 10,
            "the receive buffer made room {} times for {count} held frames",
            link.rx.regrown
        );
    }

    fn check_order(frames: u16, trickle: usize) {
        let mut q = SendQueue::default();
        let frames: Vec<Frame> = (0..frames)
            .map(|i| {
                let big = i % 3 == 0;
                let len = if big { 20_000 } else { 10 };
                Frame::new(Tag::Message, vec![Bytes::from(vec![i as u8; len])])
            })
            .collect();
        let mut expect = Vec::new();
        for f in &frames {
            q.push(Transmit::Frame(f.clone()), 8 << 10, true).unwrap();
            expect.extend(f.encode_to_vec().unwrap());
        }
        assert!(
            drain(&mut q, trickle) == expect,
            "bytes reordered on the way out"
        );
    }

    /// Everything `q` writes to a socket that takes at most `limit` bytes
    /// per call.
    fn drain(q: &mut SendQueue, limit: usize) -> Vec<u8> {
        // A writer that takes at most `limit` bytes per call.
        struct Trickle {
            out: Vec<u8>,
            limit: usize,
        }
        impl Write for Trickle {
            fn write(&mut self, b: &[u8]) -> io::Result<usize> {
                let n = b.len().min(self.limit);
                self.out.extend_from_slice(&b[..n]);
                Ok(n)
            }
            fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
                let mut n = 0;
                for b in bufs {
                    let k = self.write(&b[..b.len().min(self.limit - n)])?;
                    n += k;
                    if n == self.limit {
                        break;
                    }
                }
                Ok(n)
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let mut w = Trickle {
            out: Vec::new(),
            limit,
        };
        assert!(q.write_to(&mut w).unwrap());
        assert!(q.is_empty());
        w.out
    }
}
