//! The `auth_handshake` and `sealed_decode` targets: the Noise handshake
//! fed arbitrary messages, and the record layer opening arbitrary frames.

use bytes::Bytes;
use msgr_addr::EntityName;

use crate::banner::Banner;
use crate::frame::{Frame, FrameLimits, Tag, MAX_SEGMENTS};
use crate::message::{Message, MessageFrame};
use crate::stream::{Inbound, Transmit};

use super::frame::fuzz_limits;
use super::Reader;

/// Fixed credentials for the fuzz targets: `client.1` and `server.1` with
/// keys from fixed bytes, both in one keyring (the fuzzer needs no RNG for
/// them; snow's ephemeral keys still come from its own).
pub fn fuzz_credentials() -> (crate::auth::Credentials, crate::auth::Credentials) {
    use crate::auth::{Credentials, Keyring, StaticKeypair};
    let (c, s) = (
        StaticKeypair::from_private([0x11; 32]),
        StaticKeypair::from_private([0x22; 32]),
    );
    let mut ring = Keyring::new();
    ring.insert(EntityName::client(1), c.public());
    ring.insert(EntityName::server(1), s.public());
    let ring = std::sync::Arc::new(ring);
    (
        Credentials::new(EntityName::client(1), c, ring.clone()),
        Credentials::new(EntityName::server(1), s, ring),
    )
}

/// `auth_handshake`: the Noise handshake fed hostile messages.
///
/// Input: mode byte, then message bytes (u16-length-prefixed pieces).
/// Mode 0: a responder reads the first piece as the first message, answers,
/// reads the second as the third. Mode 1: an initiator writes the first
/// message and reads the first piece as the answer. Mode 2: an honest
/// handshake whose messages get the input XORed in: it may only succeed
/// when nothing was changed, and then both sides must agree on who is who
/// and on the keys. Never a panic; an error is always typed.
pub fn auth_handshake(data: &[u8]) {
    use crate::auth::{Handshake, Role};
    let mut r = Reader::new(data);
    let (client, server) = fuzz_credentials();
    let banner = Banner::default().encode();
    let piece = |r: &mut Reader| {
        let n = usize::from(r.u16());
        r.bytes(n).to_vec()
    };
    match r.u8() % 3 {
        0 => {
            let mut hs = Handshake::new(Role::Responder, &server, &banner, &banner)
                .expect("handshake starts");
            if hs.read_message(&piece(&mut r)).is_err() {
                return;
            }
            let _ = hs
                .write_message()
                .expect("our turn after the first message");
            if hs.read_message(&piece(&mut r)).is_ok() {
                // Only a peer holding client.1's key gets this far.
                let done = hs.finish().expect("finished after three messages");
                assert_eq!(done.peer_name, EntityName::client(1));
            }
        }
        1 => {
            let mut hs = Handshake::new(Role::Initiator, &client, &banner, &banner)
                .expect("handshake starts");
            let _ = hs.write_message().expect("the initiator writes first");
            if hs.read_message(&piece(&mut r)).is_ok() {
                assert!(hs.is_my_turn());
            }
        }
        _ => {
            let mut i = Handshake::new(Role::Initiator, &client, &banner, &banner)
                .expect("handshake starts");
            let mut s = Handshake::new(Role::Responder, &server, &banner, &banner)
                .expect("handshake starts");
            let mut changed = false;
            let mut mangle = |m: Vec<u8>, r: &mut Reader| {
                let x = piece(r);
                let mut m = m;
                for (b, k) in m.iter_mut().zip(&x) {
                    changed |= *k != 0;
                    *b ^= k;
                }
                m
            };
            let m1 = mangle(i.write_message().expect("first"), &mut r);
            if s.read_message(&m1).is_err() {
                return;
            }
            let m2 = mangle(s.write_message().expect("second"), &mut r);
            if i.read_message(&m2).is_err() {
                return;
            }
            let m3 = mangle(i.write_message().expect("third"), &mut r);
            let ok = s.read_message(&m3).is_ok();
            if !ok {
                return;
            }
            // Noise authenticates everything but the first message's
            // ephemeral key: a changed one can only fail later.
            let (a, b) = (i.finish().expect("done"), s.finish().expect("done"));
            assert_eq!(a.peer_name, EntityName::server(1));
            assert_eq!(b.peer_name, EntityName::client(1));
            let (mut ra, mut rb) = (
                crate::auth::RecordLayer::new(&a.keys),
                crate::auth::RecordLayer::new(&b.keys),
            );
            let probe = Transmit::Frame(Frame::single(Tag::Ack, Bytes::from_static(b"x")));
            let opened = rb.open(ra.seal(probe), &FrameLimits::default());
            assert!(
                opened.is_ok() || changed,
                "an untouched handshake gives both ends the same keys"
            );
        }
    }
}

/// `sealed_decode`: the secure mode's record layer opening hostile frames.
///
/// Input: mode byte, then data. Mode 0: a frame built from the input
/// (tag, flags, up to four segments) is opened: never a panic, and what
/// opens is a frame within the limits. Mode 1: a message built from the
/// input is sealed, then bytes of the sealed segments are XORed with the
/// input's rest: it opens only when nothing changed, and then to the
/// message itself.
pub fn sealed_decode(data: &[u8]) {
    use crate::auth::handshake::LinkKeys;
    use crate::auth::RecordLayer;
    let mut r = Reader::new(data);
    let keys = LinkKeys::from_secrets([3; 32], [4; 32]);
    let mut tx = RecordLayer::new(&keys);
    let mut rx = RecordLayer::new(&keys.mirrored());
    let limits = fuzz_limits();
    if r.u8() & 1 == 0 {
        let tag = Tag::from_u8(r.u8()).unwrap_or(Tag::Sealed);
        let flags = r.u8();
        let n = usize::from(r.u8()) % (MAX_SEGMENTS + 1);
        let segments: Vec<Bytes> = (0..n)
            .map(|_| Bytes::copy_from_slice(r.short_bytes()))
            .collect();
        let mut f = Frame::new(tag, segments);
        f.flags = flags;
        if let Ok(Inbound::Frame(inner)) = rx.open(f, &limits) {
            assert!(inner.tag != Tag::Sealed && inner.tag != Tag::Auth);
            for (i, seg) in inner.segments.iter().enumerate() {
                assert!(seg.len() <= limits.max_segment[i] as usize);
            }
        }
        return;
    }
    let mut m = Message::new(r.u16(), r.short_bytes().to_vec(), r.short_bytes().to_vec());
    m.seq = 1;
    let want = Transmit::Message(MessageFrame::new(m, 0))
        .into_frame()
        .expect("a frame");
    let mut sealed = tx.seal(Transmit::Frame(want.clone()));
    let mut changed = false;
    for seg in sealed.segments.iter_mut() {
        let mut b = seg.to_vec();
        for byte in b.iter_mut() {
            let k = r.u8();
            changed |= k != 0;
            *byte ^= k;
        }
        *seg = Bytes::from(b);
    }
    match rx.open(sealed, &FrameLimits::default()) {
        Ok(Inbound::Frame(got)) => {
            assert!(!changed, "a changed sealed frame opened");
            assert_eq!(
                (got.tag, got.flags, &got.segments),
                (want.tag, want.flags, &want.segments)
            );
        }
        Ok(other) => panic!("opened to {other:?}"),
        Err(_) => assert!(changed, "an untouched sealed frame failed to open"),
    }
}
