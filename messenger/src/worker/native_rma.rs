//! The worker's side of native one-sided reads (`crate::rma`, "Native
//! reads"): serving an owner's read with the region's key on the link,
//! keeping the keys a requester's sessions were given, turning a read the
//! application queued into a transport's `rma_read`, and asking the owner
//! instead when that fails.

use bytes::Bytes;
use msgr_backends::{AnyTransport, Transport};
use msgr_proto::auth::SecurityMode;
use msgr_proto::message::REPLY_BIT;
use msgr_proto::rma::{RmaOp, RmaReply, RmaRequest, RmaStatus, RMA_BIT};
use msgr_proto::{LinkId, Message, Session};
use rustc_hash::FxHashMap;

use super::{LinkEntry, Slot};
use crate::counters::Counters;

/// Keys a session keeps at most; past it they are dropped (reads go to
/// the owner until a reply brings the key again).
const KEYS_MAX: usize = 1024;

/// A session's keys for native reads: region -> (the link it was given
/// on, the key; `None` once a native read of it over that link failed:
/// not tried there again).
pub(super) type RegionKeys = FxHashMap<u64, (LinkId, Option<Box<[u8]>>)>;

/// A native read in flight: whose it is, on which link, and the request
/// to send the owner if it fails.
pub(super) struct NativeRead {
    pub(super) session: u64,
    pub(super) link: LinkId,
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
            let mut expose = |region, mem: &Bytes| transport.rma_expose(link, region, mem);
            crate::rma::serve(&slot.conn, msg, counters, Some(&mut expose));
        }
        None => crate::rma::serve(&slot.conn, msg, counters, None),
    }
}

/// A reply to one of `slot`'s RMA requests: keeps the key it brings for
/// native reads over the link it came on.
pub(super) fn note_key(slot: &mut Slot, reply: &Message) {
    if reply.call & RMA_BIT == 0 {
        return;
    }
    let Ok(RmaReply { key: Some(k), .. }) = RmaReply::decode(&reply.front) else {
        return;
    };
    let Some(link) = slot.session.link() else {
        return;
    };
    if slot
        .rma_keys
        .get(&k.region)
        .is_some_and(|(l, _)| *l == link)
    {
        return; // known here already, or failed here: not again
    }
    if slot.rma_keys.len() >= KEYS_MAX {
        slot.rma_keys.clear();
    }
    slot.rma_keys
        .insert(k.region, (link, Some(k.key.into_boxed_slice())));
}

/// An application's RMA request about to be queued on session `key`: read
/// natively if `slot` holds the region's key on its link (`Ok`), else
/// handed back for the session.
pub(super) fn try_read(
    (key, slot): (u64, &mut Slot),
    msg: Message,
    transports: &mut [AnyTransport],
    links: &FxHashMap<LinkId, LinkEntry>,
    in_flight: &mut FxHashMap<u64, NativeRead>,
) -> Result<(), Message> {
    if msg.call & REPLY_BIT != 0 {
        return Err(msg);
    }
    let Some(link) = may_go_native(&slot.session) else {
        return Err(msg);
    };
    let Ok(r) = RmaRequest::decode(&msg.front) else {
        return Err(msg);
    };
    // Nothing to move in an empty read: the owner answers it.
    if r.op != RmaOp::Read || !r.want_key || r.len == 0 {
        return Err(msg);
    }
    let Some((l, Some(region_key))) = slot.rma_keys.get(&r.region) else {
        return Err(msg);
    };
    let Some(e) = links.get(&link).filter(|_| *l == link) else {
        return Err(msg);
    };
    match transports[e.transport].rma_read(link, region_key, r.offset, r.len, msg.call) {
        Ok(()) => {
            // Out of the session's queue as if sent: its room is free.
            slot.bypassed[0] += 1;
            slot.bypassed[1] += msg.payload_len() as u64;
            let read = NativeRead {
                session: key,
                link,
                request: msg,
            };
            in_flight.insert(read.request.call, read);
            Ok(())
        }
        Err(e) => {
            tracing::debug!(error = %e, "a native read not started: asked of the owner");
            slot.rma_keys.insert(r.region, (link, None));
            Err(msg)
        }
    }
}

/// The reply a native read's bytes make, as the owner's would be.
pub(super) fn reply(token: u64, bytes: Bytes) -> Message {
    let ok = RmaReply {
        status: RmaStatus::Ok,
        checksum: 0,
        key: None,
    };
    let mut m = Message::new(crate::rma::RMA_TYPE, ok.encode(), bytes);
    m.call = token | REPLY_BIT;
    m
}

/// A native read failed: the region is not read natively over its link
/// again, and the request goes back to the session (its room taken
/// again), to be sent to the owner. Returns the request.
pub(super) fn give_up(slot: &mut Slot, read: NativeRead) -> Message {
    if let Ok(r) = RmaRequest::decode(&read.request.front) {
        slot.rma_keys.insert(r.region, (read.link, None));
    }
    slot.bypassed[0] = slot.bypassed[0].saturating_sub(1);
    let len = read.request.payload_len() as u64;
    slot.bypassed[1] = slot.bypassed[1].saturating_sub(len);
    read.request
}
