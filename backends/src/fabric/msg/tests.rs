//! Tests of the MSG transport over real providers on loopback.

use super::*;
use crate::{FaultInjection, RealFault, Transport};
use bytes::Bytes;
use msgr_fabric::{RmaOp, SendSlots};
use msgr_proto::banner::BANNER_LEN;
use msgr_proto::Frame;
use msgr_proto::FrameLimits;

use crate::fabric::tests::{
    accepted, cq_fd_in_the_poll_only_while_asleep, drive, in_order,
    large_units_to_a_peer_that_does_not_read, progress_until_events, send_small_frames,
    staged_descriptor_goes_when_a_slot_frees, stat,
};
use crate::FabricRendezvous;

#[test]
fn context_round_trips() {
    for (id, rx, slot) in [(1u64, true, 0usize), ((1 << 40) - 1, false, SLOTS - 1)] {
        assert_eq!(
            decode_context(context(LinkId(id), rx, slot)),
            (LinkId(id), rx, slot)
        );
        assert!(!is_read(context(LinkId(id), rx, slot)));
    }
    assert!(is_read(read_context(LinkId(5))));
    assert_eq!(decode_context(read_context(LinkId(5))).0, LinkId(5));
}

/// Listens on 127.0.0.1 (a port of its own), connects `LinkId(1000)`
/// to it and drives both ends up; returns the accepted link.
fn dial_itself(t: &mut FabricTransport, poll: &mut mio::Poll) -> LinkId {
    let any: EntityAddr = "fabric+tcp://127.0.0.1:0".parse().unwrap();
    let bound = t.listen(&any, Token(crate::LISTENER_TOKEN_BASE)).unwrap();
    assert_ne!(bound.socket.port(), 0);
    t.connect(LinkId(1000), &bound).unwrap();
    let events = drive(t, poll, |e| e.len() >= 2);
    assert!(
        events
            .iter()
            .any(|e| matches!(e, TransportEvent::Connected(LinkId(1000)))),
        "{events:?}"
    );
    accepted(&events).expect("accepted")
}

/// A unit sent to a link with nothing queued is posted by `send` itself,
/// units sent behind queued ones wait their turn (three times the
/// transmit slots without a poll in between: all arrive, in order), and
/// a received message's slot is posted again only by the flush after it.
#[test]
fn units_leave_from_send() {
    let (mut poll, mut t) = tcp_transport();
    let server = dial_itself(&mut t, &mut poll);
    t.send(LinkId(1000), Transmit::Banner([7; BANNER_LEN]))
        .unwrap();
    assert!(
        t.links[&LinkId(1000)].common.outbox.is_empty(),
        "not posted by send"
    );
    let n = 3 * SLOTS;
    send_small_frames(&mut t, LinkId(1000), n);
    assert!(
        !t.links[&LinkId(1000)].common.outbox.is_empty(),
        "beyond the slots, queued"
    );
    let mut events = progress_until_events(&mut t);
    assert_eq!(t.handled.len(), events.len(), "{events:?}");
    t.flush(Instant::now(), &mut Vec::new());
    assert!(t.handled.is_empty());
    let got = events.len();
    events.extend(drive(&mut t, &mut poll, |e| got + e.len() > n));
    in_order(&events, server, n);
}

#[test]
fn staged_descriptor_goes_when_a_transmit_slot_frees() {
    let (mut poll, mut t) = tcp_transport();
    let server = dial_itself(&mut t, &mut poll);
    staged_descriptor_goes_when_a_slot_frees(
        &mut t,
        &mut poll,
        (LinkId(1000), server),
        SLOTS - 1,
        |t| {
            let l = &t.links[&LinkId(1000)];
            l.free_tx.is_empty() && l.common.outbox.is_empty() && l.common.exposures.owes_posts()
        },
    );
}

/// A `tcp` MSG transport and the Poll its wait fds are in, with the
/// rendezvous reads even where `Auto` withholds them
/// ([`msgr_fabric::rma_withheld`]): no test here closes an endpoint
/// while a read's response is arriving.
fn tcp_transport() -> (mio::Poll, FabricTransport) {
    tcp_transport_with(FabricRendezvous::On)
}

/// Applications' one-sided reads over `tcp` MSG endpoints: native
/// where the endpoints read (reads on), served by the owner where
/// they write (`auto` on a libfabric whose reads are withheld).
#[test]
fn user_reads_of_an_exposed_region() {
    for mode in [FabricRendezvous::On, FabricRendezvous::Auto] {
        let (mut poll, t) = tcp_transport_with(mode);
        let native = t.shared.rndv == Some(RmaOp::Read);
        let addr = "fabric+tcp://127.0.0.1:0";
        crate::fabric::tests::user_reads_of_an_exposed_region(t, &mut poll, addr, native);
    }
}

fn tcp_transport_with(rendezvous: FabricRendezvous) -> (mio::Poll, FabricTransport) {
    let poll = mio::Poll::new().unwrap();
    let mut ctx = TransportContext::new(FrameLimits::default());
    ctx.rdma.fabric_rendezvous = rendezvous;
    let t = FabricTransport::new(&FabricProvider::new("tcp"), poll.registry(), &ctx).unwrap();
    (poll, t)
}

/// Over `tcp` the CQ's wait object is the provider's list of fds
/// (`FI_WAIT_POLLFD`), not an epoll set holding them.
#[test]
fn cq_fd_is_in_the_poll_only_while_the_worker_sleeps() {
    let ctx = TransportContext::new(FrameLimits::default());
    let (_poll, t) = tcp_transport();
    assert!(!t.shared.net.cq_polled() && t.shared.net.cq_fd().unwrap().is_none());
    cq_fd_in_the_poll_only_while_asleep(
        |poll| FabricTransport::new(&FabricProvider::new("tcp"), poll.registry(), &ctx).unwrap(),
        |t| t.shared.cq_wait.token(),
        "fabric+tcp://127.0.0.1:0",
    );
}

#[test]
fn large_units_to_a_peer_that_does_not_read_go_through_the_slots() {
    large_units_to_a_peer_that_does_not_read(
        |r| tcp_transport_with(r).1,
        "fabric+tcp://127.0.0.1:0",
        true,
    );
}

/// `fabric_rendezvous`: `auto` withholds the reads exactly where this
/// libfabric has a known bug in them and writes instead (`tcp` checks
/// keys), `off` has neither, `on` reads, `write` writes.
#[test]
fn rendezvous_follows_the_configuration() {
    let withheld = msgr_fabric::rma_withheld("tcp");
    let auto = if withheld.is_none() {
        RmaOp::Read
    } else {
        RmaOp::Write
    };
    for (mode, want) in [
        (FabricRendezvous::Auto, Some(auto)),
        (FabricRendezvous::Off, None),
        (FabricRendezvous::On, Some(RmaOp::Read)),
        (FabricRendezvous::Write, Some(RmaOp::Write)),
    ] {
        let (_poll, t) = tcp_transport_with(mode);
        assert_eq!(t.shared.rndv, want, "{mode:?} (withheld: {withheld:?})");
        let enabled = u64::from(want.is_some());
        assert_eq!(stat(&t, "rendezvous_enabled"), enabled, "{mode:?}");
    }
}

/// Without rendezvous, a large segment's pieces go from the
/// application's bytes (`fi_sendv`, no copy into the slot) where the
/// provider allows, and arrive intact and in order with the pieces that
/// were copied around them. The test keeps no handle of the frames
/// (they are moved into `send`) and a unit leaves the queue once its
/// last piece is posted, so the endpoint's hold is what keeps the bytes
/// alive until the sends complete.
#[test]
fn large_segments_are_sent_in_place() {
    let (mut poll, mut t) = tcp_transport_with(FabricRendezvous::Off);
    let server = dial_itself(&mut t, &mut poll);
    assert_eq!(t.shared.rndv, None, "rendezvous is off");
    t.send(LinkId(1000), Transmit::Banner([7; BANNER_LEN]))
        .unwrap();
    let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7) as u8).collect();
    let sizes = [300_000, 100, 70_000];
    let frames: Vec<Frame> = sizes
        .iter()
        .map(|&n| {
            Frame::new(
                msgr_proto::Tag::Message,
                vec![
                    Bytes::from_static(b"header"),
                    Bytes::new(),
                    Bytes::copy_from_slice(&data[..n]),
                ],
            )
        })
        .collect();
    let want: Vec<Vec<u8>> = frames.iter().map(|f| f.encode_to_vec().unwrap()).collect();
    for f in frames {
        t.send(LinkId(1000), Transmit::Frame(f)).unwrap();
    }
    t.flush(Instant::now(), &mut Vec::new());
    let events = drive(&mut t, &mut poll, |e| e.len() > sizes.len());
    let got: Vec<Vec<u8>> = events[1..]
        .iter()
        .map(|e| match e {
            TransportEvent::Received(l, Inbound::Frame(f)) if *l == server => {
                f.encode_to_vec().unwrap()
            }
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(got, want);
    // 300 000 bytes of data in pieces of SLOT_SIZE - 1: the first holds
    // the preamble and the last the epilogue (copied); the 3 between
    // lie inside the segment. 70 000 bytes: 2 pieces, neither inside.
    assert!(
        t.links[&LinkId(1000)].ep.sends_in_place(),
        "tcp wants no local registration and gathers iovecs"
    );
    assert_eq!(stat(&t, "pieces_in_place"), 3);
}

/// A peer that is not there fails the connect (an event, not a hang).
#[test]
fn connect_to_a_dead_port_fails() {
    let (mut poll, mut t) = tcp_transport();
    let dead: EntityAddr = "fabric+tcp://127.0.0.1:1".parse().unwrap();
    t.connect(LinkId(1000), &dead).unwrap();
    let events = drive(&mut t, &mut poll, |e| !e.is_empty());
    assert!(
        matches!(&events[0], TransportEvent::Failed(LinkId(1000), _)),
        "{events:?}"
    );
    assert_eq!(t.link_count(), 0);
}

/// Units bigger than a slot go by fi_read rendezvous (tcp has FI_RMA);
/// an aborted endpoint is reported on both sides.
#[test]
fn large_units_by_read_and_abort() {
    large_units_by_rendezvous_and_abort(FabricRendezvous::On, true);
}

/// To a peer that did not say it takes late epilogues (an msgr from
/// before them), units go with the epilogue in the descriptor, by
/// reads and by writes.
#[test]
fn large_units_to_a_peer_without_late_epilogues() {
    large_units_by_rendezvous_and_abort(FabricRendezvous::On, false);
    large_units_by_rendezvous_and_abort(FabricRendezvous::Write, false);
}

/// The same by the write rendezvous: the receiver grants a buffer, the
/// sender writes the unit into it and says so.
#[test]
fn large_units_by_write_and_abort() {
    large_units_by_rendezvous_and_abort(FabricRendezvous::Write, true);
}

fn large_units_by_rendezvous_and_abort(mode: FabricRendezvous, late: bool) {
    let (mut poll, mut t) = tcp_transport_with(mode);
    let server = dial_itself(&mut t, &mut poll);
    if let Some(l) = t.links.get_mut(&LinkId(1000)) {
        l.common.peer_late = late;
    }
    t.send(LinkId(1000), Transmit::Banner([7; BANNER_LEN]))
        .unwrap();
    let big = Frame::new(
        msgr_proto::Tag::Message,
        vec![
            Bytes::from_static(b"header"),
            Bytes::new(),
            Bytes::from(vec![9u8; 300_000]),
        ],
    );
    t.send(LinkId(1000), Transmit::Frame(big.clone())).unwrap();
    t.flush(Instant::now(), &mut Vec::new());
    let events = drive(&mut t, &mut poll, |e| e.len() >= 2);
    assert!(
        matches!(&events[0], TransportEvent::Received(l, Inbound::Banner(b)) if *l == server && b[0] == 7)
    );
    match &events[1] {
        TransportEvent::Received(l, Inbound::Frame(f)) => {
            assert_eq!(*l, server);
            assert_eq!(f.encode_to_vec().unwrap(), big.encode_to_vec().unwrap());
        }
        other => panic!("{other:?}"),
    }
    let by_write = mode == FabricRendezvous::Write;
    assert!(t.shared.rndv.is_some(), "tcp MSG endpoints have FI_RMA");
    assert_eq!(stat(&t, "rendezvous_sent"), 1);
    assert_eq!(stat(&t, "rendezvous_late_epilogues"), u64::from(late));
    assert_eq!(stat(&t, "rendezvous_read"), u64::from(!by_write));
    assert_eq!(stat(&t, "rendezvous_writes"), u64::from(by_write));
    assert_eq!(stat(&t, "rendezvous_landed"), u64::from(by_write));
    assert_eq!(stat(&t, "rendezvous_fallbacks"), 0);
    // The sender frees the unit once told it was read.
    let deadline = Instant::now() + Duration::from_secs(10);
    while stat(&t, "rendezvous_exposed") > 0 {
        assert!(Instant::now() < deadline, "unit still exposed");
        let mut events = Vec::new();
        t.progress(Instant::now(), &mut events);
        t.flush(Instant::now(), &mut events);
        assert!(events.is_empty(), "{events:?}");
    }
    assert_eq!(stat(&t, "rendezvous_reading"), 0);
    // A small unit after it still comes eagerly, in order.
    let small = Frame::new(msgr_proto::Tag::Message, vec![Bytes::from_static(b"x")]);
    t.send(LinkId(1000), Transmit::Frame(small.clone()))
        .unwrap();
    t.flush(Instant::now(), &mut Vec::new());
    let events = drive(&mut t, &mut poll, |e| !e.is_empty());
    assert!(
        matches!(&events[0], TransportEvent::Received(l, Inbound::Frame(f)) if *l == server && f.encode_to_vec().unwrap() == small.encode_to_vec().unwrap()),
        "{events:?}"
    );
    t.inject(LinkId(1000), RealFault::Abort).unwrap();
    let events = drive(&mut t, &mut poll, |e| e.len() >= 2);
    assert!(
        events
            .iter()
            .any(|e| matches!(e, TransportEvent::Failed(l, _) if *l == server)),
        "{events:?}"
    );
    assert!(
        events
            .iter()
            .any(|e| matches!(e, TransportEvent::Failed(LinkId(1000), _))),
        "{events:?}"
    );
    assert_eq!(t.link_count(), 0);
}

/// Over `tcp` with the reads on (it checks keys): the payload's
/// registration is kept for its next send.
#[test]
fn a_payload_sent_again_is_registered_once() {
    let (mut poll, t) = tcp_transport_with(FabricRendezvous::On);
    assert_eq!(t.shared.rndv, Some(RmaOp::Read));
    crate::fabric::tests::a_payload_sent_again_is_registered_once(
        t,
        &mut poll,
        "fabric+tcp://127.0.0.1:0",
        true,
    );
}

/// A listener that takes the TCP connection but never answers
/// libfabric's connection request: the connect fails by the set-up
/// deadline instead of hanging.
#[test]
fn unanswered_connect_fails_by_the_deadline() {
    let (mut poll, mut t) = tcp_transport();
    let mute = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr: EntityAddr = format!("fabric+tcp://{}", mute.local_addr().unwrap())
        .parse()
        .unwrap();
    let t0 = Instant::now();
    t.connect(LinkId(1000), &addr).unwrap();
    let events = drive(&mut t, &mut poll, |e| !e.is_empty());
    assert!(
        matches!(&events[0], TransportEvent::Failed(LinkId(1000), why) if why.to_string().contains("not connected")),
        "{events:?}"
    );
    assert!(t0.elapsed() >= SETUP_TIMEOUT, "{:?}", t0.elapsed());
    assert_eq!(t.link_count(), 0);
}
