//! The requester's side of native one-sided operations (`crate::rma`,
//! "Native operations"): serving an owner's operation with the region's
//! key on the link, keeping the keys a requester's sessions were given,
//! turning a read or write the application queued into a transport's
//! `rma_read` or `rma_write`, and asking the owner instead when that
//! fails.

use std::sync::Arc;

use msgr_backends::{AnyTransport, RegionMemory, RmaFailure, Transport};
use msgr_proto::auth::SecurityMode;
use msgr_proto::message::REPLY_BIT;
use msgr_proto::rma::{RmaKey, RmaOp, RmaReply};
use msgr_proto::{FaultReason, LinkId, Message, Session};
use rustc_hash::FxHashMap;

use super::rma_owner;
use super::{LinkEntry, Slot, Worker};
use crate::counters::Counters;
use crate::pending::RmaCall;
use crate::replies::RmaAnswer;

/// Keys a session keeps at most; past it they are dropped (reads go to
/// the owner until a reply brings the key again).
const KEYS_MAX: usize = 1024;

/// A session's keys for native operations, by region.
pub(super) type RegionKeys = FxHashMap<u64, RegionKey>;

/// A region's key as a session holds it.
pub(super) struct RegionKey {
    /// The link it was given on (it names a registration on that link's
    /// endpoint).
    link: LinkId,
    /// The key; `None` once a native operation of the region over that
    /// link failed: not tried there again.
    key: Option<Box<[u8]>>,
    /// Whether writes may try it (cleared when the transport refuses a
    /// write with it: its writes are the owner's, its reads may still go).
    writes: bool,
}

/// A native read or write in flight: whose it is, on which link, and the
/// request to send the owner if it fails.
pub(super) struct NativeOp {
    pub(super) session: u64,
    pub(super) link: LinkId,
    /// The region and the operation, as the caller asked them.
    pub(super) region: u64,
    pub(super) op: RmaOp,
    pub(super) request: Message,
}

/// Whether `session`'s link may move region bytes natively: not in
/// `secure` mode, where every byte of a session is sealed.
fn may_go_native(session: &Session) -> Option<LinkId> {
    session
        .link()
        .filter(|_| session.security_mode() != SecurityMode::Secure)
}

/// Serves an RMA request that arrived on `slot`'s session, with the
/// region's key on the session's link where its endpoint reads natively.
pub(super) fn serve(
    slot: &Slot,
    msg: Message,
    transports: &mut [AnyTransport],
    links: &FxHashMap<LinkId, LinkEntry>,
    counters: &Counters,
) {
    let on = may_go_native(&slot.session).and_then(|l| links.get(&l).map(|e| (l, e.transport)));
    match on {
        Some((link, t)) => {
            let transport = &mut transports[t];
            let mut expose = |region, mem: &Arc<RegionMemory>, access| {
                transport.rma_expose(link, region, mem, access)
            };
            rma_owner::serve(&slot.conn, msg, counters, Some(&mut expose));
        }
        None => rma_owner::serve(&slot.conn, msg, counters, None),
    }
}

/// The owner's reply to one of `slot`'s RMA requests: decoded once, here;
/// the key it brings kept for native operations over the link it came
/// on; the outcome to the operation's caller.
pub(super) fn owner_replied(slot: &mut Slot, reply: Message, counters: &Counters) {
    let id = reply.call & !REPLY_BIT;
    let mut decoded = RmaReply::decode(&reply.front);
    if let Ok(r) = &mut decoded {
        if let Some(k) = r.key.take() {
            note_key(slot, k);
        }
    }
    let answer = RmaAnswer::Owner(decoded, reply.data);
    slot.conn.inner.calls.complete_rma(id, answer, counters);
}

/// Keeps `k` for native operations over `slot`'s link.
fn note_key(slot: &mut Slot, k: RmaKey) {
    let Some(link) = slot.session.link() else {
        return;
    };
    if slot
        .rma_keys
        .get(&k.region)
        .is_some_and(|held| held.link == link)
    {
        return; // known here already, or failed here: not again
    }
    if slot.rma_keys.len() >= KEYS_MAX {
        slot.rma_keys.clear();
    }
    let key = RegionKey {
        link,
        key: Some(k.key.into_boxed_slice()),
        writes: true,
    };
    slot.rma_keys.insert(k.region, key);
}

/// An application's RMA request about to be queued on session `key`: read
/// or written natively if `slot` holds the region's key on its link
/// (`Ok`), else handed back for the session. The request is the one the
/// caller built: not decoded from its message.
pub(super) fn try_native(
    (key, slot): (u64, &mut Slot),
    call: RmaCall,
    transports: &mut [AnyTransport],
    links: &FxHashMap<LinkId, LinkEntry>,
    in_flight: &mut FxHashMap<u64, NativeOp>,
) -> Result<(), Message> {
    let RmaCall { request: r, msg } = call;
    // No key held: always so where the link has no native path, as over
    // tcp.
    if slot.rma_keys.is_empty() {
        return Err(msg);
    }
    let Some(link) = may_go_native(&slot.session) else {
        return Err(msg);
    };
    // Nothing to move in an empty operation: the owner answers it.
    if !r.want_key || r.len == 0 {
        return Err(msg);
    }
    let write = r.op == RmaOp::Write;
    let Some(held) = slot.rma_keys.get_mut(&r.region) else {
        return Err(msg);
    };
    let Some(region_key) = held.key.as_deref().filter(|_| held.link == link) else {
        return Err(msg);
    };
    if write && !held.writes {
        return Err(msg);
    }
    let Some(e) = links.get(&link) else {
        return Err(msg);
    };
    let t = &mut transports[e.transport];
    let started = if write {
        t.rma_write(link, region_key, r.offset, &msg.data, msg.call)
    } else {
        t.rma_read(link, region_key, r.offset, r.len, msg.call)
    };
    match started {
        Ok(()) => {
            // Out of the session's queue as if sent: its room is free.
            slot.bypassed[0] += 1;
            slot.bypassed[1] += msg.payload_len() as u64;
            let op = NativeOp {
                session: key,
                link,
                region: r.region,
                op: r.op,
                request: msg,
            };
            in_flight.insert(op.request.call, op);
            Ok(())
        }
        Err(e) => {
            tracing::debug!(error = %e, write, "a native operation not started: asked of the owner");
            if write {
                held.writes = false;
            } else {
                held.key = None;
            }
            Err(msg)
        }
    }
}

/// A native operation failed: the region is not moved natively over its
/// link again, and the request goes back to the session (its room taken
/// again), to be sent to the owner. Returns the request.
pub(super) fn give_up(slot: &mut Slot, op: NativeOp) -> Message {
    let failed = RegionKey {
        link: op.link,
        key: None,
        writes: false,
    };
    slot.rma_keys.insert(op.region, failed);
    slot.bypassed[0] = slot.bypassed[0].saturating_sub(1);
    let len = op.request.payload_len() as u64;
    slot.bypassed[1] = slot.bypassed[1].saturating_sub(len);
    op.request
}

/// Queues `msg` on `slot`'s session: an application's message or RMA
/// request (the worker's `queue_message`), or one going to the owner
/// where a native operation was given up (as it is, not decoded again).
pub(super) fn send_on_session(slot: &mut Slot, msg: Message, counters: &Counters) {
    match slot.session.send(msg) {
        Ok(_) => {}
        // The handle checked the limits it knew; the peer's came with the
        // handshake in between. Not a silent drop: the session ends and
        // on_reset says why.
        Err(msgr_proto::SendError::TooLarge(t)) => {
            slot.session.abort(FaultReason::TooLarge(t));
            Counters::add(&counters.messages_dropped, 1);
        }
        Err(e) => {
            // The handle's own bound makes this unreachable unless the
            // session closed meanwhile; account for the message.
            tracing::debug!(error = %e, "send refused by session");
            Counters::add(&counters.messages_dropped, 1);
        }
    }
}

impl Worker {
    /// A native read or write completed: the caller gets its bytes (a
    /// read's; none for a write); a failed one is asked of the owner.
    pub(super) fn native_op_done(&mut self, token: u64, result: Result<bytes::Bytes, RmaFailure>) {
        let Some(op) = self.native_ops.remove(&token) else {
            return; // its session went, or it was given up already
        };
        let key = op.session;
        let Some(slot) = self.sessions.get_mut(&key) else {
            return;
        };
        let counters = &self.shared.counters;
        match result {
            Ok(bytes) => {
                let done = match op.op {
                    RmaOp::Read => &counters.rma_native_reads,
                    RmaOp::Write => &counters.rma_native_writes,
                };
                Counters::add(done, 1);
                let answer = RmaAnswer::Native(bytes);
                slot.conn.inner.calls.complete_rma(token, answer, counters);
            }
            Err(why) => {
                tracing::debug!(%why, "a native operation failed: asked of the owner");
                Counters::add(&counters.rma_native_fallbacks, 1);
                // Straight to the session: not decoded again, nor tried
                // natively again.
                let request = give_up(slot, op);
                send_on_session(slot, request, counters);
                self.touch(key);
            }
        }
    }
}
