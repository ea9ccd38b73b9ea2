//! The seed corpus of every target: inputs that reach past the first
//! checks, written by `examples/gen_fuzz_corpus.rs`.

use bytes::BytesMut;
use msgr_addr::{EntityAddr, EntityName};

use crate::banner::Banner;
use crate::batch::BatchWriter;
use crate::codec::{Codec, Postcard};
use crate::control::{control_frame, Ack, Close, HelloOk, Keepalive, ReconnectOk};
use crate::frame::{Frame, Tag};
use crate::message::Message;
use crate::session::{Hello, Policy};

use super::fragment::fragment_seeds;
use super::message::{write_frame, SampleKind, SamplePayload};
use super::session::{fuzz_addr, Op};

/// Seed inputs for every target, built from valid encodings: `(target, file
/// name, bytes)`. `examples/gen_fuzz_corpus.rs` writes them to `fuzz/corpus/`.
pub fn seed_corpus() -> Vec<(&'static str, String, Vec<u8>)> {
    let mut out = Vec::new();
    // Handshakes: empty and random-looking messages, and an honest run.
    out.push(("auth_handshake", "responder-empty".into(), vec![0]));
    let mut v = vec![0u8, 32, 0];
    v.extend_from_slice(&[0x5a; 32]);
    out.push(("auth_handshake", "responder-32-bytes".into(), v));
    out.push((
        "auth_handshake",
        "initiator-short-answer".into(),
        vec![1, 4, 0, 1, 2, 3, 4],
    ));
    out.push(("auth_handshake", "honest".into(), vec![2]));
    out.push((
        "auth_handshake",
        "flip-third".into(),
        vec![2, 0, 0, 0, 0, 2, 0, 0, 1],
    ));
    // RMA: a read and a checksummed write request, a reply, a handle.
    let req = |op, checksum| crate::rma::RmaRequest {
        op,
        region: 3,
        capability: [7; 16],
        offset: 4096,
        len: 64,
        checksum,
        want_key: false,
    };
    let want_key = crate::rma::RmaRequest {
        want_key: true,
        ..req(crate::rma::RmaOp::Read, None)
    };
    for (name, r) in [
        ("read", req(crate::rma::RmaOp::Read, None)),
        ("read-want-key", want_key),
        ("read-checked", req(crate::rma::RmaOp::Read, Some(0))),
        ("write-checked", req(crate::rma::RmaOp::Write, Some(9))),
    ] {
        out.push((
            "rma_decode",
            format!("request-{name}"),
            [&[0][..], &r.encode()].concat(),
        ));
    }
    let reply = crate::rma::RmaReply {
        status: crate::rma::RmaStatus::OutOfRange,
        checksum: 1,
        key: None,
    };
    let keyed = crate::rma::RmaReply {
        status: crate::rma::RmaStatus::Ok,
        checksum: 0,
        key: Some(crate::rma::RmaKey {
            region: 2,
            key: vec![9; 48],
        }),
    };
    for (name, r) in [("reply", reply), ("reply-keyed", keyed)] {
        out.push(("rma_decode", name.into(), [&[1][..], &r.encode()].concat()));
    }
    let handle = crate::rma::RmaHandle {
        region: 1,
        len: 1 << 20,
        access: crate::rma::Access::ReadWrite,
        capability: [5; 16],
    };
    let h = postcard::to_allocvec(&handle).expect("a handle encodes");
    out.push(("rma_decode", "handle".into(), [&[2][..], &h].concat()));
    // Sealed frames: a plain frame, a garbage sealed one, an honest seal.
    out.push(("sealed_decode", "plain-ack".into(), vec![0, 7, 0, 1, 1, 0]));
    let mut v = vec![0u8, 16, 0x80, 1, 64];
    v.extend_from_slice(&[0xa5; 64]);
    out.push(("sealed_decode", "garbage-sealed".into(), v));
    out.push((
        "sealed_decode",
        "honest".into(),
        vec![1, 3, 0, 4, b'f', b'r', b'n', b't', 2, 1, 2],
    ));
    out.push((
        "sealed_decode",
        "one-bit".into(),
        vec![1, 3, 0, 1, b'x', 0, 0, 0, 0, 1],
    ));
    let frames = sample_frames();

    for (i, f) in frames.iter().enumerate() {
        let mut v = vec![0u8];
        v.extend_from_slice(&f.preamble().expect("sample preamble").encode());
        out.push(("frame_preamble", format!("valid-{i:02}-{:?}", f.tag), v));
    }
    out.push(("frame_preamble", "crc-fixup-zeros".into(), vec![1; 1]));

    let mut all = Vec::new();
    for (i, f) in frames.iter().enumerate() {
        let enc = f.encode_to_vec().expect("sample encodes");
        all.extend_from_slice(&enc);
        let mut v = vec![0u8, i as u8];
        v.extend_from_slice(&enc);
        out.push(("frame_decode", format!("frame-{i:02}-{:?}", f.tag), v));
    }
    let mut v = vec![1u8, 3];
    v.extend_from_slice(&Banner::default().encode());
    v.extend_from_slice(&all);
    out.push(("frame_decode", "banner-then-all-frames".into(), v));
    let mut v = vec![2u8, 5];
    v.extend_from_slice(&all);
    out.push(("frame_decode", "all-frames-crc-fixup".into(), v));

    let mut v = vec![0u8];
    v.extend_from_slice(&Banner::default().encode());
    out.push(("banner", "default".into(), v));
    let odd = Banner {
        version: 2,
        supported: 1 << 40 | 1,
        required: 1 << 41,
    };
    let mut v = vec![0u8];
    v.extend_from_slice(&odd.encode());
    out.push(("banner", "incompatible".into(), v));

    for (i, f) in frames.iter().enumerate() {
        let mut v = Vec::new();
        write_frame(f, &mut v);
        out.push(("message_decode", format!("frame-{i:02}-{:?}", f.tag), v));
    }
    let payload = SamplePayload {
        id: 7,
        name: "osd".into(),
        tags: vec![1, 2, 3],
        offset: Some(-5),
        kind: SampleKind::Named {
            name: EntityName::client(4),
            flag: true,
        },
        blob: vec![0, 255],
        addr: Some(EntityAddr::tcp(([127, 0, 0, 1], 6800).into()).with_nonce(3)),
    };
    let mut m = Message::encode(42, &payload).expect("sample payload");
    m.seq = 3;
    let mut v = Vec::new();
    write_frame(&m.to_frame(2), &mut v);
    v.extend_from_slice(&Postcard.encode(&payload).expect("sample payload"));
    out.push(("message_decode", "typed-payload".into(), v));

    for (i, s) in [
        "tcp://127.0.0.1:6800",
        "tcp://[::1]:6800/42",
        "tcp://[fe80::1%2]:6800",
        "verbs://198.51.100.1:6800/7?dev=rxe0&port=1&gid=1",
        "rdmacm://198.51.100.1:7471",
        "fabric+tcp;ofi_rxm://127.0.0.1:6800?ep=rdm",
        "fabric+verbs;ofi_rxm://10.0.0.1:1?dev=mlx5_0",
        "fabric+shm://127.0.0.1:1",
        "[verbs://198.51.100.1:6800,tcp://198.51.100.1:6801]",
        "[]",
        "client.4123",
        "server.0",
    ]
    .iter()
    .enumerate()
    {
        out.push(("addr_parse", format!("text-{i:02}"), s.as_bytes().to_vec()));
    }
    let a = EntityAddr::tcp(([127, 0, 0, 1], 6800).into()).with_nonce(9);
    out.push((
        "addr_parse",
        "postcard-addr".into(),
        Postcard.encode(&a).expect("addr encodes").to_vec(),
    ));

    let mut buf = BytesMut::new();
    let mut w = BatchWriter::begin(&mut buf, 5, 4, 1 << 12);
    w.push(&m);
    w.push(&Message::new(7, &b"front"[..], &b"data"[..]));
    w.push(&Message::default());
    let mut v = vec![0u8];
    v.extend_from_slice(&w.finish());
    out.push(("batch_decode", "body-three-entries".into(), v));
    let mut v = vec![1u8];
    v.extend(9u64.to_le_bytes());
    v.extend(3u64.to_le_bytes());
    v.extend(600u16.to_le_bytes());
    for i in 0..8u8 {
        v.extend(u16::from(i).pow(5).to_le_bytes());
        v.push(i * 9);
        v.extend(std::iter::repeat_n(i, usize::from(i * 9)));
        v.push(i);
        v.extend(std::iter::repeat_n(!i, usize::from(i)));
        v.extend([i, i * 3]);
    }
    out.push(("batch_decode", "structured-eight".into(), v));

    for (name, v) in fragment_seeds() {
        out.push(("fragment_decode", name, v));
    }

    for (name, setup, ops) in session_scripts() {
        let mut v = vec![setup];
        for op in &ops {
            op.write(&mut v);
            Op::Drain(0).write(&mut v);
        }
        out.push(("session_engine", name.into(), v));
    }
    out
}

/// One sample of every frame type the protocol sends.
pub fn sample_frames() -> Vec<Frame> {
    let a = EntityAddr::tcp(([10, 0, 0, 1], 6800).into()).with_nonce(1);
    let mut m = Message::new(5, &b"front"[..], vec![9u8; 100]);
    m.seq = 1;
    vec![
        control_frame(
            Tag::Hello,
            &Hello {
                name: EntityName::client(1),
                addr: a.clone(),
                target: a.clone(),
                policy: Policy::LosslessClient,
                cookie: 0,
                in_seq: 0,
                limits: None,
                dial: None,
            },
        ),
        control_frame(
            Tag::HelloOk,
            &HelloOk {
                name: EntityName::server(1),
                addr: a.clone(),
                cookie: 99,
            },
        ),
        control_frame(
            Tag::ReconnectOk,
            &ReconnectOk {
                name: EntityName::server(1),
                addr: a,
                in_seq: 4,
            },
        ),
        control_frame(Tag::SessionReset, &()),
        control_frame(Tag::Wait, &()),
        m.to_frame(0),
        control_frame(Tag::Ack, &Ack { seq: 3 }),
        control_frame(Tag::Keepalive, &Keepalive { stamp: 1234 }),
        control_frame(Tag::KeepaliveAck, &Keepalive { stamp: 1234 }),
        Frame::single(Tag::CreditGrant, vec![1, 2, 3, 4]),
        Frame::single(Tag::RendezvousRequest, vec![0; 24]),
        Frame::single(Tag::RendezvousFinish, vec![0; 8]),
        control_frame(
            Tag::Close,
            &Close {
                reason: "bye".into(),
            },
        ),
        Frame::new(Tag::Ack, vec![]),
    ]
}

/// Scripted, meaningful sessions for the `session_engine` seeds.
pub(super) fn session_scripts() -> Vec<(&'static str, u8, Vec<Op>)> {
    // Connector, LosslessClient, dialling fuzz_addr(0) (who=0: 10.0.0.2:6800 nonce 0).
    let connector = 1 << 1;
    let msg = |seq, ack| Op::Msg {
        link: 1,
        seq,
        ack,
        len: 3,
    };
    let hello_ok = |link| Op::Control {
        link,
        kind: 1,
        a: 7,
        b: 0,
        who: 0,
    };
    vec![
        (
            "connect-open-exchange",
            connector,
            vec![
                Op::Send(2),
                Op::LinkUp(1),
                Op::GoodBanner(1),
                hello_ok(1),
                msg(1, 1),
                msg(2, 1),
                Op::Control {
                    link: 1,
                    kind: 3,
                    a: 1,
                    b: 0,
                    who: 0,
                },
                Op::Advance(150),
                Op::Close,
            ],
        ),
        (
            "connect-open-batches",
            connector,
            vec![
                Op::Send(2),
                Op::Send(3),
                Op::Send(200),
                Op::LinkUp(1),
                Op::GoodBanner(1),
                hello_ok(1),
                // Four messages in a batch, then the last two again (a
                // replay's overlap) with three more.
                Op::Msg {
                    link: 1,
                    seq: 1,
                    ack: 1,
                    len: 0x83,
                },
                Op::Msg {
                    link: 1,
                    seq: 3,
                    ack: 3,
                    len: 0x84,
                },
                Op::Advance(150),
                Op::Close,
            ],
        ),
        (
            "connect-fault-reconnect",
            connector,
            vec![
                Op::Send(1),
                Op::Send(2),
                Op::LinkUp(1),
                Op::GoodBanner(1),
                hello_ok(1),
                Op::LinkFailed(1),
                Op::Advance(10),
                Op::LinkUp(2),
                Op::GoodBanner(2),
                Op::Control {
                    link: 2,
                    kind: 2,
                    a: 0,
                    b: 1,
                    who: 0,
                },
                msg(1, 2),
            ],
        ),
        (
            "accept-new-and-take-link",
            1,
            vec![
                Op::GoodBanner(0),
                Op::Control {
                    link: 0,
                    kind: 0,
                    a: 0,
                    b: 0,
                    who: 0x20,
                },
                Op::AcceptNew(5),
                Op::Msg {
                    link: 0,
                    seq: 1,
                    ack: 0,
                    len: 1,
                },
                Op::Send(1),
                Op::LinkFailed(0),
                Op::TakeLink {
                    link: 3,
                    cookie: 5,
                    in_seq: 0,
                    who: 0x20,
                },
                Op::GoodBanner(3),
                Op::Advance(600),
            ],
        ),
        (
            "stream-bytes",
            connector,
            vec![
                Op::LinkUp(0),
                Op::Stream(0, {
                    let mut v = Banner::default().encode().to_vec();
                    v.extend(
                        control_frame(
                            Tag::HelloOk,
                            &HelloOk {
                                name: EntityName::server(1),
                                addr: fuzz_addr(0),
                                cookie: 3,
                            },
                        )
                        .encode_to_vec()
                        .expect("encodes"),
                    );
                    v
                }),
                Op::Send(1),
                Op::Advance(200),
            ],
        ),
        (
            "simultaneous-wait",
            2 << 1,
            vec![
                Op::LinkUp(1),
                Op::GoodBanner(1),
                Op::TakeLink {
                    link: 2,
                    cookie: 0,
                    in_seq: 0,
                    who: 0x20 | 8,
                },
                Op::Control {
                    link: 1,
                    kind: 8,
                    a: 0,
                    b: 0,
                    who: 0,
                },
                Op::Advance(100),
            ],
        ),
    ]
}
