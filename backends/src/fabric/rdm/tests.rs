//! Tests of the RDM transport over real providers on loopback.

use super::*;
use crate::fabric::tests::{
    accepted, drive, in_order, progress_until_events, send_small_frames, small_frame,
    staged_descriptor_goes_when_a_slot_frees, stat,
};
use crate::{FabricRendezvous, FaultInjection, RealFault, SimulatedFault, Transport};
use bytes::Bytes;
use msgr_addr::FabricEndpoint;
use msgr_proto::banner::BANNER_LEN;
use msgr_proto::{Frame, Inbound};

/// With the rendezvous reads even where `Auto` withholds them
/// ([`msgr_fabric::rma_withheld`]): no test here closes an endpoint
/// while a read's response is arriving.
fn open(provider: &str, poll: &mio::Poll) -> RdmTransport {
    open_with(provider, poll, FabricRendezvous::On)
}

fn open_with(provider: &str, poll: &mio::Poll, rendezvous: FabricRendezvous) -> RdmTransport {
    let mut ctx = TransportContext::new(FrameLimits::default());
    ctx.rdma.fabric_rendezvous = rendezvous;
    let p = FabricProvider::new(provider).with_endpoint(FabricEndpoint::Rdm);
    RdmTransport::new(&p, poll.registry(), &ctx).unwrap()
}

/// Over `tcp;ofi_rxm`, where this libfabric's reads have the known bug,
/// `auto` keeps messages sent within ofi_rxm's eager limit (its own
/// rendezvous reads with them) and receives whole slots; `on` sends
/// whole slots. The same when RDM is asked of `tcp` by the core's name
/// (`fabric+tcp?ep=rdm`, which opens `tcp;ofi_rxm`): deciding by the
/// name asked for once let 64 KiB messages take ofi_rxm's reads there,
/// and the stress suite crashed closing endpoints.
#[test]
fn tcp_rxm_messages_stay_eager_where_reads_are_withheld() {
    let poll = mio::Poll::new().unwrap();
    let withheld = msgr_fabric::rma_withheld("tcp;ofi_rxm").is_some();
    for name in ["tcp;ofi_rxm", "tcp"] {
        let auto = open_with(name, &poll, FabricRendezvous::Auto);
        assert_eq!(auto.shared.net.provider_name(), "tcp;ofi_rxm");
        let want = if withheld { 16 << 10 } else { SLOT_SIZE };
        assert_eq!(
            (auto.sizes.send_limit, auto.sizes.slot_size),
            (want, SLOT_SIZE),
            "{name}: withheld: {withheld}"
        );
        // Where the reads are withheld, the writes stand in (`tcp`
        // checks keys).
        let op = if withheld { RmaOp::Write } else { RmaOp::Read };
        assert_eq!(auto.shared.rndv, Some(op), "{name}");
        let on = open_with(name, &poll, FabricRendezvous::On);
        let want = (SLOT_SIZE, Some(RmaOp::Read));
        assert_eq!((on.sizes.send_limit, on.shared.rndv), want, "{name}");
    }
}

/// Applications' one-sided reads over both providers' RDM endpoints
/// (reads on: native everywhere).
#[test]
fn user_reads_of_an_exposed_region() {
    let mut poll = mio::Poll::new().unwrap();
    for provider in ["shm", "tcp;ofi_rxm"] {
        let t = open(provider, &poll);
        let addr = format!("fabric+{provider}://127.0.0.1:0?ep=rdm");
        crate::fabric::tests::user_reads_of_an_exposed_region(t, &mut poll, &addr, true);
    }
}

/// Over `tcp;ofi_rxm` (keys checked) a payload sent again keeps its
/// registration; over `shm` (keys not checked: every exposure has its
/// own check word) nothing is kept.
#[test]
fn a_payload_sent_again_is_registered_once() {
    let mut poll = mio::Poll::new().unwrap();
    for (provider, kept) in [("tcp;ofi_rxm", true), ("shm", false)] {
        let t = open(provider, &poll);
        assert_eq!(t.shared.rndv, Some(RmaOp::Read), "{provider}");
        crate::fabric::tests::a_payload_sent_again_is_registered_once(
            t,
            &mut poll,
            &format!("fabric+{provider}://127.0.0.1:0?ep=rdm"),
            kept,
        );
    }
}

/// HELLO and WELCOME carry whether their end reads rendezvous units
/// (see the MSG test this runs).
fn large_units_to_a_peer_that_does_not_read(provider: &str, in_place: bool) {
    let poll = mio::Poll::new().unwrap();
    crate::fabric::tests::large_units_to_a_peer_that_does_not_read(
        |r| open_with(provider, &poll, r),
        &format!("fabric+{provider}://127.0.0.1:0?ep=rdm"),
        in_place,
    );
}

/// Over `tcp;ofi_rxm` too (`shm` has no wait fd).
#[test]
fn tcp_rxm_cq_fd_is_in_the_poll_only_while_the_worker_sleeps() {
    crate::fabric::tests::cq_fd_in_the_poll_only_while_asleep(
        |poll| open("tcp;ofi_rxm", poll),
        |t| t.shared.cq_wait.token(),
        "fabric+tcp;ofi_rxm://127.0.0.1:0?ep=rdm",
    );
}

#[test]
fn tcp_rxm_large_units_to_a_peer_that_does_not_read_go_through_the_slots() {
    large_units_to_a_peer_that_does_not_read("tcp;ofi_rxm", true);
}

#[test]
fn shm_large_units_to_a_peer_that_does_not_read_go_through_the_slots() {
    large_units_to_a_peer_that_does_not_read("shm", false);
}

/// A transport listening on a loopback port of `provider` with link 1000
/// dialled to itself and its HELLO flushed; the listener's address.
fn listening_and_dialled(provider: &str) -> (mio::Poll, RdmTransport, EntityAddr) {
    let poll = mio::Poll::new().unwrap();
    let mut t = open(provider, &poll);
    let any: EntityAddr = format!("fabric+{provider}://127.0.0.1:0?ep=rdm")
        .parse()
        .unwrap();
    let bound = t.listen(&any, Token(crate::LISTENER_TOKEN_BASE)).unwrap();
    t.connect(LinkId(1000), &bound).unwrap();
    t.flush(Instant::now(), &mut Vec::new());
    (poll, t, bound)
}

/// One link over a real provider: handshake, units far beyond one
/// link's credits arrive whole and in order (credits come back), then an
/// abort is reported on both ends and nothing is left.
fn link_units_and_abort(provider: &str) {
    let (mut poll, mut t, bound) = listening_and_dialled(provider);
    assert_ne!(bound.socket.port(), 0);
    let events = drive(&mut t, &mut poll, |e| e.len() >= 2);
    let server =
        accepted(&events).unwrap_or_else(|| panic!("{provider}: no Accepted in {events:?}"));
    assert!(events
        .iter()
        .any(|e| matches!(e, TransportEvent::Connected(LinkId(1000)))));
    // A hung read needs a read to hang: refused without rendezvous.
    match t.simulate(server, SimulatedFault::HungRead) {
        Ok(()) => assert!(
            t.shared.rndv.is_some(),
            "{provider}: hung read accepted without rendezvous"
        ),
        Err(TransportError::Unavailable { reason, .. }) => {
            assert!(
                t.shared.rndv.is_none() && reason.contains("rendezvous"),
                "{provider}: {reason}"
            );
        }
        Err(e) => panic!("{provider}: {e}"),
    }
    // Undone where accepted, so every unit below is read.
    if let Some(l) = t.links.get_mut(&server) {
        l.common.receiving.reads_to_hang = 0;
    }
    t.send(LinkId(1000), Transmit::Banner([7; BANNER_LEN]))
        .unwrap();
    // 6 units of 5 pieces each: 30 messages, twice a link's credits.
    let frames: Vec<Frame> = (0..6u8)
        .map(|i| {
            Frame::new(
                msgr_proto::Tag::Message,
                vec![
                    Bytes::from_static(b"header"),
                    Bytes::new(),
                    Bytes::from(vec![i; 300_000]),
                ],
            )
        })
        .collect();
    for f in &frames {
        t.send(LinkId(1000), Transmit::Frame(f.clone())).unwrap();
    }
    t.flush(Instant::now(), &mut Vec::new());
    let events = drive(&mut t, &mut poll, |e| e.len() > frames.len());
    assert!(
        matches!(&events[0], TransportEvent::Received(l, Inbound::Banner(b)) if *l == server && b[0] == 7),
        "{events:?}"
    );
    for (f, e) in frames.iter().zip(&events[1..]) {
        match e {
            TransportEvent::Received(l, Inbound::Frame(got)) => {
                assert_eq!(*l, server);
                assert_eq!(got.encode_to_vec().unwrap(), f.encode_to_vec().unwrap());
            }
            other => panic!("{other:?}"),
        }
    }
    // Every frame is above the threshold: fetched by fi_read (both
    // providers have RMA).
    assert!(t.shared.rndv.is_some(), "{provider}: rendezvous enabled");
    let expect = frames.len() as u64;
    assert_eq!(
        t.shared.rndv_counters.read, expect,
        "{provider}: rendezvous reads"
    );
    assert_eq!(
        t.shared.rndv_counters.sent, expect,
        "{provider}: rendezvous sent"
    );
    assert_eq!(
        t.shared.rndv_counters.late_epilogues, expect,
        "{provider}: epilogues after their descriptors"
    );
    t.inject(LinkId(1000), RealFault::Abort).unwrap();
    let events = drive(&mut t, &mut poll, |e| e.len() >= 2);
    for id in [server, LinkId(1000)] {
        assert!(
            events
                .iter()
                .any(|e| matches!(e, TransportEvent::Failed(l, _) if *l == id)),
            "{id:?} {events:?}"
        );
    }
    assert_eq!(t.link_count(), 0);
}

/// A unit sent to a link with nothing queued is posted by `send` itself,
/// units sent behind queued ones wait their turn (three links' worth of
/// credits without a poll in between: all arrive, in order), and a
/// received piece's slot is posted again and its credit owed by the flush
/// after it, or within the poll where pieces came in bulk.
fn units_leave_from_send(provider: &str) {
    let (mut poll, mut t, _) = listening_and_dialled(provider);
    let events = drive(&mut t, &mut poll, |e| e.len() >= 2);
    let server =
        accepted(&events).unwrap_or_else(|| panic!("{provider}: no Accepted in {events:?}"));
    t.send(LinkId(1000), Transmit::Banner([7; BANNER_LEN]))
        .unwrap();
    assert!(
        t.links[&LinkId(1000)].common.outbox.is_empty(),
        "{provider}: not posted by send"
    );
    let n = 3 * t.sizes.window as usize;
    send_small_frames(&mut t, LinkId(1000), n);
    assert!(
        !t.links[&LinkId(1000)].common.outbox.is_empty(),
        "{provider}: beyond the credits, queued"
    );
    // Pieces that arrive in bulk have their slots posted again and their
    // credits owed within the poll (RETURN_AT_ONCE); a few are left to the
    // flush after the worker answered them. Without either, the units
    // beyond the credits would never come.
    let owed = t.links[&server].flow.to_return;
    let mut events = progress_until_events(&mut t);
    let l = t
        .links
        .get(&server)
        .unwrap_or_else(|| panic!("{provider}: {events:?}"));
    if events.len() < RETURN_AT_ONCE {
        assert_eq!(l.flow.to_return, owed, "{provider}");
        assert_eq!(t.handled.len(), events.len(), "{provider}: {events:?}");
    } else {
        assert!(t.handled.is_empty(), "{provider}: {events:?}");
    }
    t.flush(Instant::now(), &mut Vec::new());
    assert!(t.handled.is_empty());
    let got = events.len();
    events.extend(drive(&mut t, &mut poll, |e| got + e.len() > n));
    in_order(&events, server, n);
}

/// See [`staged_descriptor_goes_when_a_slot_frees`]: here the banner
/// and the small frames take every credit of the link.
fn staged_descriptor_goes_when_credits_return(provider: &str) {
    let (mut poll, mut t, _) = listening_and_dialled(provider);
    let events = drive(&mut t, &mut poll, |e| e.len() >= 2);
    let server =
        accepted(&events).unwrap_or_else(|| panic!("{provider}: no Accepted in {events:?}"));
    let window = t.sizes.window as usize;
    staged_descriptor_goes_when_a_slot_frees(
        &mut t,
        &mut poll,
        (LinkId(1000), server),
        window - 1,
        |t| {
            let l = &t.links[&LinkId(1000)];
            l.flow.credits == 0 && l.common.outbox.is_empty() && l.common.exposures.owes_posts()
        },
    );
}

#[test]
fn shm_staged_descriptor_goes_when_credits_return() {
    staged_descriptor_goes_when_credits_return("shm");
}

#[test]
fn tcp_rxm_staged_descriptor_goes_when_credits_return() {
    staged_descriptor_goes_when_credits_return("tcp;ofi_rxm");
}

#[test]
fn shm_units_leave_from_send() {
    units_leave_from_send("shm");
}

#[test]
fn tcp_rxm_units_leave_from_send() {
    units_leave_from_send("tcp;ofi_rxm");
}

/// An endpoint that keeps more than [`ABANDONED_MAX`] bytes of grants
/// given up by links that went takes no more writes: a new link hears
/// so at set-up, and its large units go eagerly, both ways, intact.
#[test]
fn tcp_rxm_abandoned_grants_stop_the_writes() {
    let poll = mio::Poll::new().unwrap();
    let mut t = open_with("tcp", &poll, FabricRendezvous::Write);
    assert_eq!(t.shared.rndv, Some(RmaOp::Write));
    let any: EntityAddr = "fabric+tcp://127.0.0.1:0?ep=rdm".parse().unwrap();
    let bound = t.listen(&any, Token(crate::LISTENER_TOKEN_BASE)).unwrap();
    // The listener's endpoint gives up a grant as large as the bound
    // (zeroed memory: not touched until written).
    let port = t
        .ports
        .iter_mut()
        .flatten()
        .next()
        .expect("the listener's endpoint");
    let offered = msgr_fabric::Exposed {
        id: 0,
        addr: 0,
        len: ABANDONED_MAX as u64,
        key: 0,
        check: 0,
        word: None,
        write: true,
    };
    port.ep.rma().grant(&offered, 1, &[], 0).unwrap();
    port.ep.rma().abandon(1);
    assert!(port.ep.rma().abandoned_bytes() >= ABANDONED_MAX);
    t.connect(LinkId(1000), &bound).unwrap();
    t.flush(Instant::now(), &mut Vec::new());
    let mut poll = poll;
    let events = drive(&mut t, &mut poll, |e| e.len() >= 2);
    let server = accepted(&events).unwrap_or_else(|| panic!("no Accepted in {events:?}"));
    let big = Frame::new(
        msgr_proto::Tag::Message,
        vec![
            Bytes::from_static(b"header"),
            Bytes::from(vec![3u8; 300_000]),
        ],
    );
    // A link's first unit is its banner.
    for from in [LinkId(1000), server] {
        t.send(from, Transmit::Banner([7; BANNER_LEN])).unwrap();
        t.send(from, Transmit::Frame(big.clone())).unwrap();
    }
    t.flush(Instant::now(), &mut Vec::new());
    let events = drive(&mut t, &mut poll, |e| e.len() >= 4);
    for to in [server, LinkId(1000)] {
        let got = events.iter().find_map(|e| match e {
            TransportEvent::Received(l, Inbound::Frame(f)) if *l == to => Some(f),
            _ => None,
        });
        let got = got.unwrap_or_else(|| panic!("nothing for {to:?}: {events:?}"));
        assert_eq!(got.encode_to_vec().unwrap(), big.encode_to_vec().unwrap());
    }
    assert_eq!(
        (t.shared.rndv_counters.sent, t.shared.rndv_counters.writes),
        (0, 0),
        "no unit offered by rendezvous"
    );
}

#[test]
fn tcp_rxm_link_units_and_abort() {
    link_units_and_abort("tcp");
}

#[test]
fn shm_link_units_and_abort() {
    link_units_and_abort("shm");
}

/// An established link whose peer stops answering (frozen: no data, no
/// keepalives, as a hung or vanished process) fails within the link
/// deadline, not earlier than it and not never.
fn silent_peer_fails_by_the_deadline(provider: &str) {
    let (mut poll, mut t, _) = listening_and_dialled(provider);
    let events = drive(&mut t, &mut poll, |e| e.len() >= 2);
    let server =
        accepted(&events).unwrap_or_else(|| panic!("{provider}: no Accepted in {events:?}"));
    t.inject(LinkId(1000), RealFault::Freeze).unwrap();
    let frozen_at = Instant::now();
    let events = drive(&mut t, &mut poll, |e| {
        e.iter()
            .any(|e| matches!(e, TransportEvent::Failed(l, _) if *l == server))
    });
    let took = frozen_at.elapsed();
    println!("{provider}: silent peer failed after {took:?}: {events:?}");
    assert!(
        took >= LINK_DEADLINE - KEEP_AFTER,
        "{provider}: failed too early ({took:?})"
    );
    // Late only by what a busy machine adds to the housekeeping pass: the
    // bound tells "by the deadline" from "never".
    assert!(
        took <= 3 * LINK_DEADLINE + KEEP_AFTER + HOUSEKEEPING,
        "{provider}: failed too late ({took:?})"
    );
}

#[test]
fn tcp_rxm_silent_peer_fails_by_the_deadline() {
    silent_peer_fails_by_the_deadline("tcp");
}

#[test]
fn shm_silent_peer_fails_by_the_deadline() {
    silent_peer_fails_by_the_deadline("shm");
}

/// Nobody at the address: the connect fails (at once or as an event
/// within the link deadline), never hangs.
fn connect_to_nobody_fails(provider: &str) {
    let mut poll = mio::Poll::new().unwrap();
    let mut t = open(provider, &poll);
    // A port just released: nothing listens there.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dead: EntityAddr = format!("fabric+{provider}://127.0.0.1:{port}?ep=rdm")
        .parse()
        .unwrap();
    if let Err(e) = t.connect(LinkId(1000), &dead) {
        println!("{provider}: connect refused at once: {e}");
        return;
    }
    t.flush(Instant::now(), &mut Vec::new());
    let events = drive(&mut t, &mut poll, |e| !e.is_empty());
    assert!(
        matches!(&events[0], TransportEvent::Failed(LinkId(1000), _)),
        "{events:?}"
    );
    println!("{provider}: {events:?}");
    assert_eq!(t.link_count(), 0);
}

/// A HELLO the provider refuses until the link deadline moves later
/// connects to a new outgoing endpoint, while the old endpoint's other
/// links go on. SIMULATED trigger: the refusal is `ofi_rxm`'s wedged
/// connection to a restarted name, which the stress suite meets only
/// now and then, so the link is made to look as if its HELLO waited
/// past the deadline (its clock set back before the first flush).
fn refused_hello_moves_connects_to_a_new_endpoint(provider: &str) {
    let (mut poll, mut t, bound) = listening_and_dialled(provider);
    drive(&mut t, &mut poll, |e| {
        e.iter()
            .any(|e| matches!(e, TransportEvent::Connected(LinkId(1000))))
    });
    let first = t.links[&LinkId(1000)].port;
    t.connect(LinkId(1001), &bound).unwrap();
    let now = Instant::now();
    let stale = t.links.get_mut(&LinkId(1001)).unwrap();
    assert_eq!(stale.port, first, "{provider}: connects share one endpoint");
    stale.common.last_heard = now - LINK_DEADLINE - HOUSEKEEPING;
    t.next_housekeeping = now;
    let mut events = Vec::new();
    t.progress(now, &mut events);
    assert!(
        events.iter().any(
            |e| matches!(e, TransportEvent::Failed(LinkId(1001), why) if why.to_string().contains(REFUSED_HELLO))
        ),
        "{provider}: {events:?}"
    );
    assert_eq!(stat(&t, "out_port_replacements"), 1);
    t.connect(LinkId(1002), &bound).unwrap();
    t.flush(Instant::now(), &mut Vec::new());
    drive(&mut t, &mut poll, |e| {
        e.iter()
            .any(|e| matches!(e, TransportEvent::Connected(LinkId(1002))))
    });
    assert_ne!(
        t.links[&LinkId(1002)].port,
        first,
        "{provider}: a new endpoint"
    );
    // The old endpoint's link still carries units.
    t.send(LinkId(1000), Transmit::Banner([9; BANNER_LEN]))
        .unwrap();
    t.flush(Instant::now(), &mut Vec::new());
    let events = drive(&mut t, &mut poll, |e| {
        e.iter().any(|e| matches!(e, TransportEvent::Received(..)))
    });
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, TransportEvent::Failed(..))),
        "{provider}: {events:?}"
    );
}

#[test]
fn tcp_rxm_refused_hello_moves_connects_to_a_new_endpoint() {
    refused_hello_moves_connects_to_a_new_endpoint("tcp");
}

#[test]
fn shm_refused_hello_moves_connects_to_a_new_endpoint() {
    refused_hello_moves_connects_to_a_new_endpoint("shm");
}

#[test]
fn tcp_rxm_connect_to_nobody_fails() {
    connect_to_nobody_fails("tcp");
}

#[test]
fn shm_connect_to_nobody_fails() {
    connect_to_nobody_fails("shm");
}

/// Runs `t` until nothing is pending and it says it sleeps (`arm`), as a
/// worker at the end of its busy-poll window; at most 10 s.
fn fall_asleep(t: &mut RdmTransport) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        assert!(Instant::now() < deadline, "never idle");
        let mut events = Vec::new();
        let busy = t.progress(Instant::now(), &mut events);
        t.flush(Instant::now(), &mut events);
        if !busy && events.is_empty() && t.arm() {
            return;
        }
    }
}

/// Blocks `t`'s worker as a worker would once its busy-poll window is over
/// (`arm`, then its Poll until an event), at most 10 s — a deadline, not a
/// timing assertion: over `shm`, whose CQ has no wait object, only the
/// peer's ring wakes it before then. Returns what the wake-up delivered.
fn sleep_until_rung(t: &mut RdmTransport, poll: &mut mio::Poll) -> Vec<TransportEvent> {
    let mut events = Vec::new();
    let mut ready = mio::Events::with_capacity(8);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !t.progress(Instant::now(), &mut events) {
        assert!(t.arm(), "nothing pending, yet the worker may not sleep");
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "never rung: {events:?}");
        poll.poll(&mut ready, Some(left)).unwrap();
        assert!(
            ready.iter().any(|ev| t.owns(ev.token())),
            "the Poll woke for nothing of the transport's within 10 s"
        );
        for ev in ready.iter() {
            t.ready(ev, Instant::now(), &mut events);
        }
    }
    events
}

/// A sparse ping-pong over `shm` where both workers block between
/// messages: each message wakes its receiver by the doorbell (the CQ has no
/// wait object, so nothing else would before the backstop), which rings
/// only the peer that said it sleeps. Each side's `doorbell_wakes` and the
/// other's `doorbell_rings` move once per message.
/// Two `shm` transports (server, client), each with its own Poll, with one
/// link up between them and both banners queued; `server_bell`: false
/// stands for a server from before the doorbell (it announces none).
struct ShmPair {
    poll_s: mio::Poll,
    s: RdmTransport,
    server: LinkId,
    poll_c: mio::Poll,
    c: RdmTransport,
    client: LinkId,
}

fn shm_pair(server_bell: bool) -> ShmPair {
    let (poll_s, poll_c) = (mio::Poll::new().unwrap(), mio::Poll::new().unwrap());
    let (mut s, mut c) = (open("shm", &poll_s), open("shm", &poll_c));
    assert!(s.bells.is_some() && c.bells.is_some(), "shm has a doorbell");
    if !server_bell {
        s.bells = None;
    }
    let any: EntityAddr = "fabric+shm://127.0.0.1:0?ep=rdm".parse().unwrap();
    let bound = s.listen(&any, Token(crate::LISTENER_TOKEN_BASE)).unwrap();
    let client = LinkId(1000);
    c.connect(client, &bound).unwrap();
    // Set-up: both ends awake, polling each other.
    let (mut server, mut connected) = (None, false);
    let deadline = Instant::now() + Duration::from_secs(20);
    while server.is_none() || !connected {
        assert!(Instant::now() < deadline, "no link");
        let mut events = Vec::new();
        for t in [&mut s, &mut c] {
            t.progress(Instant::now(), &mut events);
            t.flush(Instant::now(), &mut events);
        }
        server = server.or(accepted(&events));
        connected |= events
            .iter()
            .any(|e| matches!(e, TransportEvent::Connected(l) if *l == client));
    }
    let server = server.unwrap();
    // Each unit stream starts with a banner.
    c.send(client, Transmit::Banner([7; BANNER_LEN])).unwrap();
    s.send(server, Transmit::Banner([7; BANNER_LEN])).unwrap();
    ShmPair {
        poll_s,
        s,
        server,
        poll_c,
        c,
        client,
    }
}

#[test]
fn shm_sleeping_workers_are_woken_by_the_doorbell() {
    let ShmPair {
        mut poll_s,
        mut s,
        server,
        mut poll_c,
        mut c,
        client,
    } = shm_pair(true);
    assert!(s.links[&server].peer_bell.is_some() && c.links[&client].peer_bell.is_some());
    assert!(s.wakes_the_worker() && c.wakes_the_worker());
    const ROUNDS: u64 = 5;
    for i in 0..ROUNDS {
        // The server sleeps; the client pings.
        let (rings_c, wakes_s) = (stat(&c, "doorbell_rings"), stat(&s, "doorbell_wakes"));
        fall_asleep(&mut s);
        c.send(client, Transmit::Frame(small_frame(i as u8)))
            .unwrap();
        c.flush(Instant::now(), &mut Vec::new());
        assert_eq!(
            stat(&c, "doorbell_rings"),
            rings_c + 1,
            "round {i}: ping rang"
        );
        let got = sleep_until_rung(&mut s, &mut poll_s);
        assert!(
            got.iter().any(
                |e| matches!(e, TransportEvent::Received(l, Inbound::Frame(_)) if *l == server)
            ),
            "{got:?}"
        );
        assert!(
            stat(&s, "doorbell_wakes") > wakes_s,
            "round {i}: woken by the ring"
        );
        // The client sleeps; the server answers.
        let rings_s = stat(&s, "doorbell_rings");
        fall_asleep(&mut c);
        s.send(server, Transmit::Frame(small_frame(i as u8)))
            .unwrap();
        s.flush(Instant::now(), &mut Vec::new());
        assert!(stat(&s, "doorbell_rings") > rings_s, "round {i}: pong rang");
        let got = sleep_until_rung(&mut c, &mut poll_c);
        assert!(
            got.iter().any(
                |e| matches!(e, TransportEvent::Received(l, Inbound::Frame(_)) if *l == client)
            ),
            "{got:?}"
        );
    }
    assert!(stat(&c, "doorbell_wakes") >= ROUNDS && stat(&s, "doorbell_sleeps") >= ROUNDS);
    // Awake, a send rings nobody.
    let rings_c = stat(&c, "doorbell_rings");
    s.progress(Instant::now(), &mut Vec::new());
    c.send(client, Transmit::Frame(small_frame(9))).unwrap();
    c.flush(Instant::now(), &mut Vec::new());
    assert_eq!(stat(&c, "doorbell_rings"), rings_c);
}

/// A peer without a doorbell (an msgr from before it) announces none: the
/// link works, its end with a doorbell maps nothing, rings nothing and
/// keeps polling (`wakes_the_worker` false, a wake-up within
/// `POLL_INTERVAL`).
#[test]
fn shm_peer_without_a_doorbell_is_polled() {
    let ShmPair {
        mut s,
        server,
        mut c,
        client,
        ..
    } = shm_pair(false);
    assert!(c.links[&client].peer_bell.is_none() && s.links[&server].peer_bell.is_none());
    assert!(!c.wakes_the_worker() && !s.wakes_the_worker());
    let rings = stat(&c, "doorbell_rings");
    c.send(client, Transmit::Frame(small_frame(1))).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut got = Vec::new();
    while !got
        .iter()
        .any(|e| matches!(e, TransportEvent::Received(l, Inbound::Frame(_)) if *l == server))
    {
        assert!(Instant::now() < deadline, "nothing received: {got:?}");
        c.progress(Instant::now(), &mut Vec::new());
        c.flush(Instant::now(), &mut Vec::new());
        s.progress(Instant::now(), &mut got);
        s.flush(Instant::now(), &mut got);
    }
    assert_eq!(stat(&c, "doorbell_rings"), rings, "no bell to ring");
    fall_asleep(&mut c);
    let wake = c.wake_at().expect("a polled transport asks to be woken");
    assert!(wake <= Instant::now() + POLL_INTERVAL);
}

/// A connect to a sleeping `shm` listener rings it until the link is
/// accepted, whatever address the listener is bound to (a concrete one or
/// the unspecified `0.0.0.0` / `[::]`: over `shm` a listener is reached by
/// the address it is bound to, which names its region). `shm` refuses the
/// connector's first post until the listener's progress has taken the
/// connection request that post left it, so the HELLO cannot go — and be
/// rung after — before the listener wakes: it is rung for the refused
/// HELLO too. The listener runs only when rung or at its own retries,
/// never at its backstop; without that ring the HELLO never goes.
#[test]
fn shm_connect_rings_a_sleeping_listener_until_accepted() {
    for bind in ["127.0.0.1", "0.0.0.0", "[::1]", "[::]"] {
        let (mut poll_s, poll_c) = (mio::Poll::new().unwrap(), mio::Poll::new().unwrap());
        let (mut s, mut c) = (open("shm", &poll_s), open("shm", &poll_c));
        let at: EntityAddr = format!("fabric+shm://{bind}:0?ep=rdm").parse().unwrap();
        let bound = s.listen(&at, Token(crate::LISTENER_TOKEN_BASE)).unwrap();
        fall_asleep(&mut s);
        let rings = stat(&c, "doorbell_rings");
        c.connect(LinkId(1000), &bound).unwrap();
        c.flush(Instant::now(), &mut Vec::new());
        assert_eq!(
            stat(&c, "doorbell_rings"),
            rings + 1,
            "{bind}: the connect rang the listener (its HELLO posted or refused)"
        );
        // The connector runs throughout (it polls while it connects); the
        // listener only when its Poll says it was rung, or its own retry
        // of a refused post is due, and sleeps again after.
        let mut ready = mio::Events::with_capacity(8);
        let deadline = Instant::now() + Duration::from_secs(10);
        let (mut got, mut connected) = (Vec::new(), false);
        while accepted(&got).is_none() || !connected {
            assert!(Instant::now() < deadline, "{bind}: not connected: {got:?}");
            let mut events = Vec::new();
            c.progress(Instant::now(), &mut events);
            c.flush(Instant::now(), &mut events);
            connected |= events
                .iter()
                .any(|e| matches!(e, TransportEvent::Connected(LinkId(1000))));
            poll_s
                .poll(&mut ready, Some(Duration::from_micros(100)))
                .unwrap();
            let retry = s.retry_at.is_some_and(|t| t <= Instant::now());
            if ready.is_empty() && !retry {
                continue;
            }
            for ev in ready.iter() {
                s.ready(ev, Instant::now(), &mut got);
            }
            s.progress(Instant::now(), &mut got);
            s.flush(Instant::now(), &mut got);
            while !s.arm() {
                s.progress(Instant::now(), &mut got);
                s.flush(Instant::now(), &mut got);
            }
        }
        assert!(stat(&s, "doorbell_wakes") >= 2, "{bind}: woken by rings");
    }
}
