//! Calls waiting for their replies: the table a connection keeps, each
//! call's slot where its outcome lands (typed: a reply [`Message`] for a
//! call, an [`RmaAnswer`] for a one-sided operation), and why a call got
//! none ([`CallError`]). The calls themselves are `crate::call`'s.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::task::Waker;
use std::time::{Duration, Instant};

use bytes::Bytes;
use msgr_proto::message::REPLY_BIT;
use msgr_proto::rma::{RmaReply, RmaWireError, RMA_BIT};
use msgr_proto::{FaultReason, Message};

use crate::counters::Counters;
use crate::pending::{Queued, RmaCall};
use crate::pending::{SendError, SendRejected};

/// Why a call got no reply.
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
/// use msgr::CallError;
/// // The server never replies: the call gives up at its timeout.
/// let err = conn.call(Message::new(1, &b"ping"[..], &b""[..]), Duration::from_millis(100));
/// assert!(matches!(err, Err(CallError::Timeout { .. })));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CallError {
    /// No reply within the call's timeout (a reply that comes later is
    /// dropped and counted in `late_replies`).
    #[error("no reply within {after:?}{}", .last_fault.as_ref().map_or(String::new(), |r| format!(" (not connected; last: {r})")))]
    Timeout {
        /// The call's timeout.
        after: Duration,
        /// Why the connection's last link failed, where it was not open
        /// at the deadline (still connecting, or reconnecting): the likely
        /// reason the request never reached the peer (as
        /// [`crate::ConnectError::Timeout`] tells it).
        last_fault: Option<FaultReason>,
    },
    /// The connection was reset before the reply came: the request may or
    /// may not have been handled.
    #[error("the connection was reset: {0}")]
    Reset(FaultReason),
    /// The request could not be sent.
    #[error("the request was not sent: {0}")]
    Send(#[from] SendError),
    /// A blocking call (or RMA operation) from a dispatcher callback on
    /// the worker that owns the connection: that worker sends the request
    /// and delivers the reply only once the callback returns, so the call
    /// could only wait out its timeout. Nothing was sent. Use
    /// [`Connection::call_async`](crate::Connection::call_async) (its future completes after the
    /// callback), or call from another thread.
    #[error(
        "a blocking call from a dispatcher callback of the worker that owns the connection \
         would wait for that worker itself: nothing was sent (use call_async, or another thread)"
    )]
    WouldDeadlock,
    /// A [`CallFuture`](crate::CallFuture) was polled again after it had completed: its
    /// outcome was given already (a bug in the caller, but no panic).
    #[error("the call's future was polled after it completed")]
    Finished,
}

msgr_addr::debug_is_display!(CallError);

impl<M> From<SendRejected<M>> for CallError {
    fn from(r: SendRejected<M>) -> CallError {
        CallError::Send(r.error)
    }
}

/// How a one-sided operation ended, as the requester's worker learned it:
/// no message is made up for a native completion, and the owner's reply
/// is decoded once, by the worker (which keeps the key it brings).
pub(crate) enum RmaAnswer {
    /// The owner served it: its reply (or why that did not decode) and a
    /// read's bytes.
    Owner(Result<RmaReply, RmaWireError>, Bytes),
    /// Carried out natively: a read's bytes (none for a write).
    Native(Bytes),
}

/// What a call's slot waits for: a plain call's reply [`Message`], or an
/// operation's [`RmaAnswer`] (its id marked with `RMA_BIT`).
pub(crate) trait Answer: Sized + Send + 'static {
    /// Or'ed into the call id of calls answered so.
    const MARK: u64;
    /// The request of calls answered so, as queued.
    type Request: Queued + Send + Unpin;
    /// The slot as the table keeps it.
    fn waiter(slot: Arc<CallSlot<Self>>) -> Waiter;
}

impl Answer for Message {
    const MARK: u64 = 0;
    type Request = Message;
    fn waiter(slot: Arc<CallSlot<Self>>) -> Waiter {
        Waiter::Call(slot)
    }
}

impl Answer for RmaAnswer {
    const MARK: u64 = RMA_BIT;
    type Request = RmaCall;
    fn waiter(slot: Arc<CallSlot<Self>>) -> Waiter {
        Waiter::Rma(slot)
    }
}

/// A slot in the table, by what it waits for.
pub(crate) enum Waiter {
    Call(Arc<CallSlot<Message>>),
    Rma(Arc<CallSlot<RmaAnswer>>),
}

impl Waiter {
    fn fail(&self, e: CallError) {
        match self {
            Waiter::Call(s) => s.complete(Err(e)),
            Waiter::Rma(s) => s.complete(Err(e)),
        }
    }
}

/// One pending call: where its outcome lands and who waits for it.
pub(crate) struct CallSlot<T> {
    pub(crate) state: Mutex<SlotState<T>>,
    pub(crate) ready: Condvar,
    /// The outcome is in `state`: a caller spinning on its reply
    /// ([`CallSlot::spin`]) looks here, not at the lock.
    pub(crate) done: AtomicBool,
    /// A blocking caller waits on `ready`: only then is it notified (a
    /// notification is a system call, which a spinning caller is spared).
    pub(crate) parked: AtomicBool,
}

impl<T> Default for CallSlot<T> {
    fn default() -> Self {
        CallSlot {
            state: Mutex::new(SlotState {
                outcome: None,
                waker: None,
            }),
            ready: Condvar::new(),
            done: AtomicBool::new(false),
            parked: AtomicBool::new(false),
        }
    }
}

pub(crate) struct SlotState<T> {
    pub(crate) outcome: Option<Result<T, CallError>>,
    pub(crate) waker: Option<Waker>,
}

impl<T> CallSlot<T> {
    pub(crate) fn complete(&self, outcome: Result<T, CallError>) {
        let mut s = self.state.lock().expect("call slot");
        if s.outcome.is_none() {
            s.outcome = Some(outcome);
        }
        let waker = s.waker.take();
        drop(s);
        self.done.store(true, Ordering::Release);
        // Set under the lock before the caller waits, which this one took
        // after: seen here if the caller is (or is about to be) parked.
        if self.parked.load(Ordering::Acquire) {
            self.ready.notify_all();
        }
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// Spins until the outcome is in, `window` (`call_spin_us`) has
    /// passed or `worker_asleep` says the worker that brings the reply went
    /// to sleep (the reply then waits for the kernel to wake it, and this
    /// thread would hold a CPU for nothing): a reply that comes within it
    /// is taken without the thread parking (a parked thread's wake-up costs
    /// tens of µs on a VM) and without the notification's system call.
    /// Whether it came.
    pub(crate) fn spin(&self, window: Duration, worker_asleep: impl Fn() -> bool) -> bool {
        /// Spins between two looks at the clock (a clock read is not free
        /// everywhere).
        const SPINS_PER_CLOCK: u32 = 64;
        if window.is_zero() {
            return self.done.load(Ordering::Acquire);
        }
        let until = Instant::now() + window;
        let mut spins = 0u32;
        loop {
            if self.done.load(Ordering::Acquire) {
                return true;
            }
            if worker_asleep() {
                return false;
            }
            spins += 1;
            if spins.is_multiple_of(SPINS_PER_CLOCK) && Instant::now() >= until {
                return false;
            }
            std::hint::spin_loop();
        }
    }
}

/// A connection's calls waiting for replies.
#[derive(Default)]
pub(crate) struct PendingCalls {
    slots: Mutex<HashMap<u64, (Waiter, Duration)>>,
}

/// Call ids, unique per process (a reply names the id of its request).
static NEXT_CALL: AtomicU64 = AtomicU64::new(1);

impl PendingCalls {
    /// A new pending call, answered by a `T` (its id marked so).
    pub(crate) fn register<T: Answer>(&self, timeout: Duration) -> (u64, Arc<CallSlot<T>>) {
        let id = (NEXT_CALL.fetch_add(1, Ordering::Relaxed) & !(REPLY_BIT | RMA_BIT)) | T::MARK;
        let slot = Arc::new(CallSlot::default());
        self.slots
            .lock()
            .expect("pending calls")
            .insert(id, (T::waiter(slot.clone()), timeout));
        (id, slot)
    }

    pub(crate) fn forget(&self, id: u64) {
        self.slots.lock().expect("pending calls").remove(&id);
    }

    fn take(&self, id: u64) -> Option<Waiter> {
        let slot = self.slots.lock().expect("pending calls").remove(&id);
        slot.map(|(w, _)| w)
    }

    /// A reply (a message whose call has the reply bit): to the call that
    /// waits for it, or dropped and counted if none does any more.
    pub(crate) fn route_reply(&self, msg: Message, counters: &Counters) {
        let id = msg.call & !REPLY_BIT;
        match self.take(id) {
            Some(Waiter::Call(s)) => s.complete(Ok(msg)),
            // (Decoded here only where the worker did not: it decodes
            // the owner's replies itself, for the key they bring.)
            Some(Waiter::Rma(s)) => {
                s.complete(Ok(RmaAnswer::Owner(RmaReply::decode(&msg.front), msg.data)))
            }
            None => Counters::add(&counters.late_replies, 1),
        }
    }

    /// Operation `id` ended (worker): to its caller, or dropped and
    /// counted as a late reply if none waits any more.
    pub(crate) fn complete_rma(&self, id: u64, answer: RmaAnswer, counters: &Counters) {
        // Only an operation's slot: a plain call's id never has the RMA
        // bit, so none is taken here.
        let mut slots = self.slots.lock().expect("pending calls");
        let slot = match slots.remove(&id) {
            Some((Waiter::Rma(s), _)) => Some(s),
            Some(other) => {
                slots.insert(id, other);
                None
            }
            None => None,
        };
        drop(slots);
        match slot {
            Some(s) => s.complete(Ok(answer)),
            None => Counters::add(&counters.late_replies, 1),
        }
    }

    /// The call's deadline passed (worker, for async calls): it fails
    /// with `timed_out` of its timeout.
    pub(crate) fn expire(&self, id: u64, timed_out: impl FnOnce(Duration) -> CallError) {
        let slot = self.slots.lock().expect("pending calls").remove(&id);
        if let Some((w, timeout)) = slot {
            w.fail(timed_out(timeout));
        }
    }

    /// The connection was reset: every pending call fails.
    pub(crate) fn fail_all(&self, reason: &FaultReason) {
        let slots: Vec<_> = self.slots.lock().expect("pending calls").drain().collect();
        for (_, (w, _)) in slots {
            w.fail(CallError::Reset(reason.clone()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A spinning caller takes an outcome that lands while it spins, and
    /// stops when the worker that would bring it sleeps or its window
    /// passes.
    #[test]
    fn a_spin_ends_at_the_outcome_the_worker_sleeping_or_the_window() {
        let slot = Arc::new(CallSlot::<Message>::default());
        let long = Duration::from_secs(60);
        // The worker went to sleep: no spin at all.
        assert!(!slot.spin(long, || true));
        // The window passed.
        assert!(!slot.spin(Duration::from_micros(50), || false));
        // An outcome from another thread, within a window it cannot outlast.
        let completer = {
            let slot = slot.clone();
            std::thread::spawn(move || slot.complete(Err(CallError::Finished)))
        };
        assert!(slot.spin(long, || false));
        completer.join().unwrap();
        // No notification: the caller never parked.
        assert!(!slot.parked.load(Ordering::Acquire));
        let mut s = slot.state.lock().unwrap();
        assert!(matches!(s.outcome.take(), Some(Err(CallError::Finished))));
    }
}
