//! The owner's side of one-sided operations: a request that arrived on
//! a session, served from or into the region it names (the checks and
//! copies are `crate::regions`'), answered with the outcome, and, where
//! the link reads natively, the region's key given with it.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use msgr_backends::RegionMemory;
use msgr_proto::rma::{Access, RmaKey, RmaOp, RmaReply, RmaRequest, RmaStatus};
use msgr_proto::Message;

use crate::connection::Connection;
use crate::counters::Counters;
use crate::regions::RMA_TYPE;

/// Registers region `region` (its memory, with the rights it gives) for
/// native operations on the endpoint of the link a request came over; the
/// key, if it can.
pub(super) type ExposeNatively<'a> =
    dyn FnMut(u64, &Arc<RegionMemory>, Access) -> Option<Vec<u8>> + 'a;

/// Serves an RMA request that arrived on `conn` (the owner's worker): from
/// or into the region it names, after checking the capability, the peer,
/// the rights and the range; answers with the outcome. Never panics on
/// what the peer sent.
///
/// `native`, where the worker's link to the requester can be read natively
/// and the session is in `crc` mode: registers a region on that link's
/// endpoint and gives its key, sent with a read's reply when asked for.
pub(super) fn serve(
    conn: &Connection,
    req: Message,
    counters: &Counters,
    native: Option<&mut ExposeNatively<'_>>,
) {
    let shared = &conn.inner.shared;
    let decoded = RmaRequest::decode(&req.front);
    let mut key = None;
    let (status, crc, data) = match &decoded {
        Err(_) => (RmaStatus::Malformed, 0, Bytes::new()),
        Ok(r) => match shared.regions.get(r.region) {
            // Ids are given in order from 1: one above the last given was
            // never a region here.
            None if (r.region == 0 || r.region > shared.regions.next.load(Ordering::Relaxed))
                && takes_figures(conn) =>
            {
                (RmaStatus::UnknownRegion, 0, Bytes::new())
            }
            None => (RmaStatus::Revoked, 0, Bytes::new()),
            Some(region) => {
                let peer = || conn.peer().map(|p| p.name);
                let figures = || takes_figures(conn);
                let served =
                    region.serve(peer, figures, r, &req.data, &shared.regions.read_buffers);
                if (served.0, r.op, &region.shared) == (RmaStatus::Ok, RmaOp::Read, &None) {
                    Counters::add(&counters.rma_bytes_copied, served.2.len() as u64);
                }
                // (Shared bytes are not registered: their reads are slices.)
                let native = native.filter(|_| region.shared.is_none());
                if let (RmaStatus::Ok, true, Some(native)) = (served.0, r.want_key, native) {
                    key = native(region.id, &region.mem, region.access).map(|key| {
                        Counters::add(&counters.rma_keys_given, 1);
                        RmaKey {
                            region: region.id,
                            key,
                        }
                    });
                }
                served
            }
        },
    };
    if status == RmaStatus::Ok {
        let c = match decoded.map(|r| r.op) {
            Ok(RmaOp::Read) => &counters.rma_reads_served,
            _ => &counters.rma_writes_served,
        };
        Counters::add(c, 1);
        Counters::add(
            &counters.rma_bytes_served,
            (data.len() + req.data.len()) as u64,
        );
    } else {
        Counters::add(&counters.rma_refused, 1);
        tracing::debug!(?status, "an RMA operation refused");
    }
    let reply = RmaReply {
        status,
        checksum: crc,
        key,
    };
    if let Err(e) = conn.reply(&req, Message::new(RMA_TYPE, reply.encode(), data)) {
        tracing::debug!(error = %e, "an RMA reply not sent");
    }
}

/// Whether the requester at the other end of `conn` takes a refusal's
/// figures (`features::RMA_FIGURES`): asked only on a refusal.
fn takes_figures(conn: &Connection) -> bool {
    conn.peer()
        .is_some_and(|p| p.features & msgr_proto::banner::features::RMA_FIGURES != 0)
}
