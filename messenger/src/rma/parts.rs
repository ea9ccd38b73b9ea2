//! Operations that move as several requests: one longer than a request
//! moves, split into parts and pipelined ([`Parts`]), and several
//! operations with one completion ([`Batch`], `read_many`/`write_many`).

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use msgr_proto::checksum::crc32c;
use msgr_proto::rma::RmaOp;

use super::{
    read_outcome, request, rma_call, write_outcome, RmaError, RmaFuture, RmaHandle, RmaOptions,
};
use crate::call::AnswerFuture;
use crate::replies::{CallError, RmaAnswer};
use crate::Connection;

/// What an operation in parts moves: a read's bytes (those in order so
/// far, and parts that came before the ones ahead of them), or the
/// caller's buffer a read fills, or the bytes to write.
pub(super) enum Moved<'a> {
    Read(Vec<u8>, BTreeMap<u64, Bytes>),
    Into(&'a mut [u8]),
    Write(Bytes),
}

impl Moved<'_> {
    pub(super) fn read() -> Moved<'static> {
        Moved::Read(Vec::new(), BTreeMap::new())
    }

    pub(super) fn into_read(self) -> Bytes {
        match self {
            Moved::Read(v, _) => Bytes::from(v),
            Moved::Into(_) | Moved::Write(_) => Bytes::new(),
        }
    }
}

/// A read or write longer than one request moves (`rma_part_bytes`, or
/// what one message carries): split into parts, each a request of its
/// own (served by the owner or carried out natively, as any operation),
/// `rma_parts_in_flight` of them at a time. It completes when every part
/// did; the first part that fails fails it, naming the part
/// ([`RmaError::Part`]); its timeout is the operation's, not a part's.
pub(super) struct Parts<'a> {
    conn: Connection,
    handle: RmaHandle,
    /// Where in the region, and how many bytes.
    offset: u64,
    len: u64,
    /// The most bytes a part moves, and the most parts in flight.
    part: u64,
    window: usize,
    options: RmaOptions,
    pub(super) deadline: Instant,
    /// Bytes (from `offset`) handed to parts so far.
    issued: u64,
    /// Parts sent and not answered yet: where (from `offset`), how long.
    in_flight: Vec<(u64, u64, AnswerFuture<RmaAnswer>)>,
    moved: Moved<'a>,
}

impl<'a> Parts<'a> {
    pub(super) fn new(
        conn: &Connection,
        handle: &RmaHandle,
        (offset, len): (u64, u64),
        options: RmaOptions,
        mut moved: Moved<'a>,
    ) -> Parts<'a> {
        let op = match moved {
            Moved::Read(ref mut buf, _) => {
                // Filled in order, each byte written once (not zeroed
                // first: a GiB's memset is a tenth of its transfer).
                *buf = Vec::with_capacity(len as usize);
                RmaOp::Read
            }
            Moved::Into(_) => RmaOp::Read,
            Moved::Write(_) => RmaOp::Write,
        };
        let part = conn.part_len(op);
        let window = conn.inner.shared.cfg.rma_parts_in_flight.max(1);
        Parts {
            conn: conn.clone(),
            handle: handle.clone(),
            offset,
            len,
            part,
            window,
            options,
            deadline: Instant::now() + options.timeout,
            issued: 0,
            in_flight: Vec::with_capacity(window),
            moved,
        }
    }

    /// Sends parts while fewer than the window are in flight.
    fn fill(&mut self, left: Duration) {
        while self.in_flight.len() < self.window && self.issued < self.len {
            let at = self.issued;
            let n = self.part.min(self.len - at);
            self.issued += n;
            let h = &self.handle;
            let offset = self.offset + at;
            let checksum = self.options.checksum;
            let (req, bytes) = match &self.moved {
                Moved::Read(..) | Moved::Into(_) => (
                    request(h, RmaOp::Read, offset, n, checksum.then_some(0)),
                    Bytes::new(),
                ),
                Moved::Write(b) => {
                    let bytes = b.slice(at as usize..(at + n) as usize);
                    let crc = checksum.then(|| crc32c(&bytes));
                    (request(h, RmaOp::Write, offset, n, crc), bytes)
                }
            };
            let call = self
                .conn
                .call_async_answered(rma_call(req, bytes, self.options.class), left);
            self.in_flight.push((at, n, call));
        }
    }

    /// Part `(at, n)` answered: a read's bytes in place.
    fn landed(&mut self, (at, n): (u64, u64), answer: RmaAnswer) -> Result<(), RmaError> {
        let range = (self.offset + at, n);
        match &mut self.moved {
            Moved::Read(buf, early) => {
                let bytes = read_outcome(answer, &self.handle, range, self.options.checksum)?;
                if at != buf.len() as u64 {
                    early.insert(at, bytes);
                    return Ok(());
                }
                buf.extend_from_slice(&bytes);
                while let Some(next) = early.remove(&(buf.len() as u64)) {
                    buf.extend_from_slice(&next);
                }
                Ok(())
            }
            Moved::Into(buf) => {
                let bytes = read_outcome(answer, &self.handle, range, self.options.checksum)?;
                buf[at as usize..(at + n) as usize].copy_from_slice(&bytes);
                Ok(())
            }
            Moved::Write(_) => write_outcome(answer, &self.handle, range),
        }
    }

    /// The operation failed in part `(at, n)` with `e`: its timeout is
    /// the operation's; anything else names the part.
    fn failed(&self, (at, n): (u64, u64), e: RmaError) -> RmaError {
        match e {
            RmaError::Call(CallError::Timeout { last_fault, .. }) => {
                RmaError::Call(CallError::Timeout {
                    after: self.options.timeout,
                    last_fault,
                })
            }
            e => RmaError::Part {
                offset: self.offset + at,
                len: n,
                error: Box::new(e),
            },
        }
    }
}

impl<'a> Future for Parts<'a> {
    type Output = Result<Moved<'a>, RmaError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        loop {
            let mut answered = false;
            let mut i = 0;
            while i < this.in_flight.len() {
                let (at, n, call) = &mut this.in_flight[i];
                let part = (*at, *n);
                match Pin::new(call).poll(cx) {
                    Poll::Pending => i += 1,
                    Poll::Ready(outcome) => {
                        this.in_flight.swap_remove(i);
                        answered = true;
                        let done = outcome
                            .map_err(RmaError::from)
                            .and_then(|a| this.landed(part, a));
                        if let Err(e) = done {
                            return Poll::Ready(Err(this.failed(part, e)));
                        }
                    }
                }
            }
            if this.in_flight.is_empty() && this.issued == this.len {
                let moved = std::mem::replace(&mut this.moved, Moved::Write(Bytes::new()));
                return Poll::Ready(Ok(moved));
            }
            let left = this.deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let timeout = this.conn.call_timed_out(this.options.timeout);
                return Poll::Ready(Err(timeout.into()));
            }
            // Parts sent now are polled (sent) on the next pass.
            let before = this.in_flight.len();
            this.fill(left);
            if !answered && this.in_flight.len() == before {
                return Poll::Pending;
            }
        }
    }
}

/// Operations in flight together, one completion
/// ([`Connection::read_many`], [`Connection::write_many`]): their outcomes
/// in the order asked, or the first failure, naming its range.
pub(super) struct Batch<T> {
    /// Each operation's range and, until it completed, its future.
    ops: Vec<(Range, Option<RmaFuture<T>>)>,
    done: Vec<Option<T>>,
}

/// Where an operation starts in its region, and its length.
pub(super) type Range = (u64, u64);

impl<T> Batch<T> {
    pub(super) fn new(ops: Vec<(Range, RmaFuture<T>)>) -> Batch<T> {
        let done = ops.iter().map(|_| None).collect();
        let ops = ops.into_iter().map(|(r, f)| (r, Some(f))).collect();
        Batch { ops, done }
    }
}

// Nothing of a batch is pinned in place: its futures are boxed, its
// outcomes plain values.
impl<T> Unpin for Batch<T> {}

impl<T> Future for Batch<T> {
    type Output = Result<Vec<T>, RmaError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let mut pending = false;
        for (i, ((offset, len), op)) in this.ops.iter_mut().enumerate() {
            let Some(f) = op else { continue };
            match Pin::new(f).poll(cx) {
                Poll::Pending => pending = true,
                Poll::Ready(Ok(v)) => {
                    *op = None;
                    this.done[i] = Some(v);
                }
                Poll::Ready(Err(e)) => {
                    *op = None;
                    return Poll::Ready(Err(match e {
                        // The whole's timeout, as a single operation's.
                        e @ RmaError::Call(CallError::Timeout { .. }) => e,
                        e @ RmaError::Part { .. } => e,
                        e => RmaError::Part {
                            offset: *offset,
                            len: *len,
                            error: Box::new(e),
                        },
                    }));
                }
            }
        }
        if pending {
            return Poll::Pending;
        }
        Poll::Ready(Ok(this.done.iter_mut().filter_map(Option::take).collect()))
    }
}
