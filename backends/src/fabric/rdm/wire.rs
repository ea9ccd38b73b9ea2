//! The wire format of RDM messages: kinds, the header, control message bodies.

use msgr_fabric::{BellId, Landing, RmaOp};

use crate::fabric::rendezvous::{self, OwedKinds};
use crate::fabric::OutOfSlot;

use super::{CREDITS, MAX_WINDOW};

/// Bytes of the header every RDM message starts with.
pub const HEADER_LEN: usize = 24;

// Message kinds (first header byte).
pub(super) const HELLO: u8 = 1;
pub(super) const WELCOME: u8 = 2;
pub(super) const DATA_MORE: u8 = 3;
pub(super) const DATA_LAST: u8 = 4;
pub(super) const KEEP: u8 = 5;
pub(super) const CLOSE: u8 = 6;
/// A data piece that describes a unit to fetch with fi_read.
pub(super) const RNDV: u8 = 7;
/// The unit of a RNDV was read (or written into a grant): its buffer may go.
pub(super) const RNDV_DONE: u8 = 8;
/// The answer to a RNDV whose unit is held for a write: the buffer to
/// write it into ([`rendezvous::encode_grant`]).
pub(super) const RNDV_GRANT: u8 = 9;
/// The unit of a RNDV_GRANT was written (posted after the write, which it
/// does not overtake).
pub(super) const RNDV_WRITTEN: u8 = 10;
/// The epilogue of a RNDV flagged `LATE_EPILOGUE`
/// ([`rendezvous::encode_epilogue`]).
pub(super) const RNDV_EPILOGUE: u8 = 11;
/// A listener's answer to a HELLO without a good token: the token, in the
/// header's `seq`, for the connector to send its HELLO again with
/// (`super::challenge`).
pub(super) const CHALLENGE: u8 = 12;
/// The rendezvous messages besides descriptors, as this wire numbers them.
pub(super) const OWED_KINDS: OwedKinds = OwedKinds {
    epilogue: RNDV_EPILOGUE,
    grant: RNDV_GRANT,
    written: RNDV_WRITTEN,
    done: RNDV_DONE,
};

/// Bytes of a HELLO body before the name: link id, cookie, name length.
pub(super) const HELLO_FIXED: usize = 8 + 4 + 2;

/// The receiving end of a message: a link id and its cookie.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Dest {
    pub(super) link: u64,
    pub(super) cookie: u32,
}

pub(super) struct Header {
    pub(super) kind: u8,
    pub(super) credits: u16,
    pub(super) dest: Dest,
    /// Data pieces: the piece's number on its link (from 0). `HELLO` and
    /// `CHALLENGE`: the challenge's token (0 in a first HELLO).
    pub(super) seq: u64,
}

pub(super) fn write_header(buf: &mut [u8], kind: u8, credits: u16, dest: Dest, seq: u64) {
    buf[0] = kind;
    buf[1] = 0;
    buf[2..4].copy_from_slice(&credits.to_le_bytes());
    buf[4..8].copy_from_slice(&dest.cookie.to_le_bytes());
    buf[8..16].copy_from_slice(&dest.link.to_le_bytes());
    buf[16..24].copy_from_slice(&seq.to_le_bytes());
}

pub(super) fn read_header(msg: &[u8]) -> Option<Header> {
    let h = msg.get(..HEADER_LEN)?;
    Some(Header {
        kind: h[0],
        credits: u16::from_le_bytes([h[2], h[3]]),
        dest: Dest {
            cookie: u32::from_le_bytes([h[4], h[5], h[6], h[7]]),
            link: u64::from_le_bytes(h[8..16].try_into().ok()?),
        },
        seq: u64::from_le_bytes(h[16..24].try_into().ok()?),
    })
}

/// What a received control message carries after its header, taken out
/// of the receive slot (reposted before the message is handled) and
/// parsed for its kind alone; data pieces stay where they are.
pub(super) enum Body {
    /// Nothing to take (data pieces, `KEEP`, `CLOSE`).
    Empty,
    /// `HELLO`: the connector's ids, name and capabilities.
    Hello(Vec<u8>),
    /// `WELCOME` (`None`: too short).
    Welcome(Option<Welcome>),
    /// `RNDV_DONE` and `RNDV_WRITTEN`: a unit's id.
    Done(Option<u32>),
    /// `RNDV_GRANT`: a unit's id and the buffer granted it.
    Grant(Option<(u32, Landing)>),
    /// `RNDV_EPILOGUE`: its bytes.
    Epilogue(OutOfSlot<{ rendezvous::EPILOGUE_MSG_MAX }>),
}

impl Body {
    pub(super) fn of(kind: u8, body: &[u8]) -> Body {
        match kind {
            HELLO => Body::Hello(body.to_vec()),
            WELCOME => Body::Welcome(read_dest(body).map(|remote| {
                let caps = body.get(12..).unwrap_or(&[]);
                Welcome {
                    remote,
                    rndv: rendezvous::peer_op(caps),
                    late: rendezvous::peer_late_epilogue(caps),
                    window: peer_window(caps),
                    bell: peer_bell(caps),
                }
            })),
            RNDV_DONE | RNDV_WRITTEN => Body::Done(rendezvous::decode_done(body)),
            RNDV_GRANT => Body::Grant(rendezvous::decode_grant(body)),
            RNDV_EPILOGUE => Body::Epilogue(OutOfSlot::new(body)),
            _ => Body::Empty,
        }
    }

    /// The unit id of a `Done` body.
    pub(super) fn done(&self) -> Option<u32> {
        match self {
            Body::Done(id) => *id,
            _ => None,
        }
    }
}

/// What follows the rendezvous capabilities in a HELLO or WELCOME: the
/// sender's receive window (data pieces it takes unconsumed per link), so
/// each end sends within the other's. A peer from before it says nothing
/// there and takes [`CREDITS`]; a window is taken as at most
/// [`MAX_WINDOW`] and at least 1.
pub(super) fn write_window(buf: &mut [u8], window: u32) -> usize {
    let w = u16::try_from(window).unwrap_or(u16::MAX);
    buf[..WINDOW_LEN].copy_from_slice(&w.to_le_bytes());
    WINDOW_LEN
}

/// The window a peer's HELLO or WELCOME announced after its capabilities
/// `caps` (see [`write_window`]).
pub(super) fn peer_window(caps: &[u8]) -> u32 {
    match caps.get(rendezvous::CAPS_LEN..rendezvous::CAPS_LEN + WINDOW_LEN) {
        Some(&[a, b]) => u32::from(u16::from_le_bytes([a, b])).clamp(1, MAX_WINDOW),
        _ => CREDITS,
    }
}

/// The doorbell a peer's HELLO or WELCOME announced after its window
/// (`doorbell`; a peer without one, or from before it, says nothing).
pub(super) fn peer_bell(caps: &[u8]) -> Option<BellId> {
    BellId::decode(caps.get(rendezvous::CAPS_LEN + WINDOW_LEN..)?)
}

/// Writes this end's doorbell after its window, if it has one; returns the
/// bytes written.
pub(super) fn write_bell(buf: &mut [u8], bell: Option<BellId>) -> usize {
    let Some(bell) = bell else {
        return 0;
    };
    buf[..BellId::LEN].copy_from_slice(&bell.encode());
    BellId::LEN
}

/// What a `WELCOME` says: the acceptor's ids, its rendezvous capabilities,
/// its receive window ([`peer_window`]) and its doorbell ([`peer_bell`]).
#[derive(Debug)]
pub(super) struct Welcome {
    pub(super) remote: Dest,
    pub(super) rndv: Option<RmaOp>,
    pub(super) late: bool,
    pub(super) window: u32,
    pub(super) bell: Option<BellId>,
}

/// Bytes of the window after the capabilities.
pub(super) const WINDOW_LEN: usize = 2;

/// (link id, cookie) of a body that starts with them (HELLO, WELCOME).
pub(super) fn read_dest(body: &[u8]) -> Option<Dest> {
    let b = body.get(..12)?;
    Some(Dest {
        link: u64::from_le_bytes(b[..8].try_into().ok()?),
        cookie: u32::from_le_bytes(b[8..12].try_into().ok()?),
    })
}

pub(super) fn write_dest(buf: &mut [u8], d: Dest) -> usize {
    buf[..8].copy_from_slice(&d.link.to_le_bytes());
    buf[8..12].copy_from_slice(&d.cookie.to_le_bytes());
    12
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::rdm::context::{context, decode_context};

    #[test]
    fn header_and_context_round_trip() {
        let mut buf = [0u8; HEADER_LEN];
        let d = Dest {
            link: (1 << 40) - 3,
            cookie: 0xdead_beef,
        };
        write_header(&mut buf, DATA_LAST, 513, d, u64::MAX - 1);
        let h = read_header(&buf).unwrap();
        assert_eq!(
            (h.kind, h.credits, h.dest, h.seq),
            (DATA_LAST, 513, d, u64::MAX - 1)
        );
        assert!(read_header(&buf[..HEADER_LEN - 1]).is_none());
        let caps = rendezvous::caps(None);
        let mut body = [0u8; rendezvous::CAPS_LEN + WINDOW_LEN];
        body[..caps.len()].copy_from_slice(&caps);
        write_window(&mut body[caps.len()..], 48);
        assert_eq!(peer_window(&body), 48);
        // A peer from before the window, and one that says too much.
        assert_eq!(peer_window(&caps), CREDITS);
        write_window(&mut body[caps.len()..], 60_000);
        assert_eq!(peer_window(&body), MAX_WINDOW);
        write_window(&mut body[caps.len()..], 0);
        assert_eq!(peer_window(&body), 1);
        assert_eq!(decode_context(context(3, true, 77)), (3, true, 77));
        assert_eq!(decode_context(context(0, false, 0)), (0, false, 0));
    }
}
