//! Hostile peers: a peer that speaks the fabric wire through libfabric
//! itself (the safe layer, no msgr above it) and sends what no msgr peer
//! sends. Each bad message must end its link with a typed event (`Failed`
//! or `Corrupt`) and close its endpoint — no panic, no hang — and the
//! transport must go on serving the next peer.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use mio::Token;
use msgr_addr::{EntityAddr, FabricProvider};
use msgr_fabric::{CmEvent, Completion, Ep, EpType, Exposed, Net, RmaOp};
use msgr_proto::banner::BANNER_LEN;
use msgr_proto::{FrameLimits, LinkId, Transmit};

use super::msg::{
    FabricTransport, LAST, MORE, RNDV, RNDV_DONE, RNDV_EPILOGUE, RNDV_GRANT, RNDV_WRITTEN,
};
use super::rendezvous::{self, Described};
use super::tests::{accepted, drive_within, in_order, send_small_frames};
use super::SLOT_SIZE;
use crate::{FabricRendezvous, Transport, TransportContext, TransportEvent};

/// How long a bad message may take to end its link: more than the read
/// deadline set here (2 s: a descriptor of memory never exposed may end by
/// it), less than the 10 s set-up deadline (an end by that would be no
/// answer to the message).
const ENDS_WITHIN: Duration = Duration::from_secs(5);

/// A frame limit small enough that a unit that never ends passes it
/// within a few slots.
const MAX_FRAME: u64 = 256 << 10;

/// Context bit of the raw peer's receives.
const RECV_BIT: u64 = 1 << 32;

/// A connection made with libfabric alone: its own Net, one endpoint.
struct RawPeer {
    net: Net,
    ep: Ep,
    next_slot: usize,
    completions: Vec<Completion>,
    /// The other end closed the connection.
    closed: bool,
}

impl RawPeer {
    const SLOTS: usize = 8;

    /// Connects to `addr`, telling the acceptor `caps` (as a msgr peer's
    /// connection data would), and drives `t` until it accepts the link.
    fn connect(
        t: &mut FabricTransport,
        poll: &mut mio::Poll,
        addr: SocketAddr,
        caps: &[u8],
    ) -> (RawPeer, LinkId) {
        let mut net = Net::open("tcp", EpType::Msg, 64).expect("raw peer's Net");
        let mut ep = net
            .connect(addr, Self::SLOTS, SLOT_SIZE, caps)
            .expect("fi_connect");
        // Receives posted, as any peer's: the provider reads the
        // connection, and sees it end.
        for slot in 0..Self::SLOTS {
            ep.post_recv(slot, RECV_BIT | slot as u64).expect("fi_recv");
        }
        let mut peer = RawPeer {
            net,
            ep,
            next_slot: 0,
            completions: Vec::new(),
            closed: false,
        };
        let events = peer.drive(t, poll, |e| accepted(e).is_some());
        let link = accepted(&events).expect("accepted");
        (peer, link)
    }

    /// Sends `bytes` as one message (a free slot's turn: the peer waits
    /// for nothing, so its sends complete as the transport reposts).
    fn send(&mut self, bytes: &[u8]) {
        let deadline = Instant::now() + ENDS_WITHIN;
        loop {
            self.progress();
            let slot = self.next_slot % Self::SLOTS;
            if let Some(buf) = self.ep.tx_slot(slot) {
                buf[..bytes.len()].copy_from_slice(bytes);
                match self.ep.send(slot, bytes.len(), slot as u64) {
                    Ok(()) => {
                        self.next_slot += 1;
                        return;
                    }
                    Err(e) if msgr_fabric::is_again(&e) => {}
                    Err(e) => panic!("raw fi_send: {e}"),
                }
            }
            assert!(Instant::now() < deadline, "raw peer: no slot came free");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Reads the raw peer's own queues: its sends complete, the provider
    /// answers what the transport asks of its memory, and an end of the
    /// connection is noted.
    fn progress(&mut self) {
        self.completions.clear();
        // An error entry (a send to an endpoint that went) is expected.
        let _ = self.net.read_cq(&mut self.completions, 16);
        for c in &self.completions {
            if c.context & RECV_BIT == 0 {
                self.ep.send_done(c.context as usize);
            } else if c.error.is_some() {
                // The provider cancels the receives of a connection that
                // ended (tcp: -FI_ECANCELED, without an FI_SHUTDOWN).
                self.closed = true;
            }
        }
        let key = self.ep.key();
        if let Ok(Some(CmEvent::Shutdown(k))) = self.net.read_eq() {
            self.closed |= k == key;
        }
    }

    /// Drives `t` until `until` holds of its events, the raw peer's
    /// queues read in between; at most 20 s.
    fn drive(
        &mut self,
        t: &mut FabricTransport,
        poll: &mut mio::Poll,
        until: impl Fn(&[TransportEvent]) -> bool,
    ) -> Vec<TransportEvent> {
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut events = Vec::new();
        while !until(&events) {
            assert!(Instant::now() < deadline, "timed out: {events:?}");
            let more = drive_within(t, poll, Duration::from_millis(5), |e| !e.is_empty())
                .unwrap_or_else(|e| e);
            events.extend(more);
            self.progress();
        }
        events
    }

    /// Waits (while `t` runs) for the connection to be closed by the other
    /// end: `FI_SHUTDOWN`, or the receives posted on it cancelled.
    fn sees_close(&mut self, t: &mut FabricTransport, poll: &mut mio::Poll) -> bool {
        let deadline = Instant::now() + ENDS_WITHIN;
        while !self.closed && Instant::now() < deadline {
            let _ = drive_within(t, poll, Duration::from_millis(5), |_| false);
            self.progress();
        }
        self.closed
    }
}

/// A `tcp` MSG transport with rendezvous reads, a small frame limit and
/// a short read deadline, listening on loopback.
fn listening() -> (mio::Poll, FabricTransport, SocketAddr) {
    let poll = mio::Poll::new().unwrap();
    let limits = FrameLimits {
        max_frame: MAX_FRAME,
        ..FrameLimits::default()
    };
    let mut ctx = TransportContext::new(limits);
    ctx.rdma.fabric_rendezvous = FabricRendezvous::On;
    ctx.rdma.read_timeout = Duration::from_secs(2);
    let mut t = FabricTransport::new(&FabricProvider::new("tcp"), poll.registry(), &ctx).unwrap();
    let at: EntityAddr = "fabric+tcp://127.0.0.1:0".parse().unwrap();
    let bound = t.listen(&at, Token(crate::LISTENER_TOKEN_BASE)).unwrap();
    (poll, t, bound.socket)
}

/// A descriptor (`RNDV` and its body) of `len` bytes at an address and
/// key the transport was never given.
fn descriptor(len: u64) -> Vec<u8> {
    let d = Described {
        x: Exposed {
            id: 1,
            addr: 0x10_0000,
            len,
            key: 0xdead_beef,
            check: 0x5eed,
            word: None,
            write: false,
        },
        inline: Vec::new(),
        at: 0,
        in_place: false,
        late: None,
    };
    let mut buf = vec![RNDV; 1 + rendezvous::DESC_MAX];
    let n = rendezvous::encode(&mut buf[1..], &d);
    buf.truncate(1 + n);
    buf
}

fn with_kind(kind: u8, body: &[u8]) -> Vec<u8> {
    [&[kind][..], body].concat()
}

/// What a hostile peer sends, message by message, on one connection.
fn hostile_cases() -> Vec<(&'static str, Vec<Vec<u8>>)> {
    let epilogue = |unit: u32| {
        let mut body = [0u8; rendezvous::EPILOGUE_MSG_MAX];
        let n = rendezvous::encode_epilogue(&mut body, unit, &[1, 2, 3, 4]);
        with_kind(RNDV_EPILOGUE, &body[..n])
    };
    let piece = with_kind(MORE, &vec![0x5a; SLOT_SIZE - 1]);
    vec![
        ("an empty message", vec![vec![]]),
        ("an unknown header byte", vec![vec![0x7f, 1, 2, 3]]),
        ("a unit of garbage", vec![with_kind(LAST, &[0xab; 64])]),
        (
            "a unit longer than a frame may be",
            vec![piece; (MAX_FRAME as usize).div_ceil(SLOT_SIZE - 1) + 1],
        ),
        ("a short descriptor", vec![with_kind(RNDV, &[1, 2, 3])]),
        (
            "a descriptor beyond the frame limit",
            vec![descriptor(u64::MAX)],
        ),
        (
            "a descriptor of memory never exposed",
            vec![descriptor(100_000)],
        ),
        (
            "an answer for no unit",
            vec![with_kind(RNDV_DONE, &7u32.to_le_bytes())],
        ),
        (
            "a grant for no unit",
            vec![with_kind(RNDV_GRANT, &[9; rendezvous::GRANT_LEN])],
        ),
        (
            "\"written\" with nothing granted",
            vec![with_kind(RNDV_WRITTEN, &3u32.to_le_bytes())],
        ),
        (
            "a garbled epilogue",
            vec![with_kind(RNDV_EPILOGUE, &[1, 0, 0, 0, 0xff])],
        ),
        (
            "more early epilogues than units may be exposed",
            (0..=rendezvous::RNDV_MAX as u32).map(epilogue).collect(),
        ),
    ]
}

/// Over `tcp` MSG: each hostile message ends its link with `Failed` or
/// `Corrupt` and closes the connection; afterwards the transport holds no
/// link and still carries a well-behaved peer's units.
#[test]
fn tcp_msg_bad_messages_end_their_link() {
    let (mut poll, mut t, addr) = listening();
    let caps = rendezvous::caps(Some(RmaOp::Read));
    for (what, messages) in hostile_cases() {
        let (mut peer, link) = RawPeer::connect(&mut t, &mut poll, addr, &caps);
        for m in &messages {
            peer.send(m);
        }
        let ended = |e: &[TransportEvent]| {
            e.iter().any(|e| {
                matches!(e, TransportEvent::Failed(l, _) | TransportEvent::Corrupt(l, _) if *l == link)
            })
        };
        let started = Instant::now();
        let events = peer.drive(&mut t, &mut poll, ended);
        assert!(
            started.elapsed() < ENDS_WITHIN,
            "{what}: ended only after {:?}: {events:?}",
            started.elapsed()
        );
        let end = events.iter().find(|e| ended(std::slice::from_ref(e)));
        eprintln!("{what}: {end:?}");
        assert!(
            !events
                .iter()
                .any(|e| matches!(e, TransportEvent::Received(l, _) if *l == link)),
            "{what}: something was handed up: {events:?}"
        );
        assert!(
            peer.sees_close(&mut t, &mut poll),
            "{what}: the connection stayed open"
        );
        assert_eq!(t.link_count(), 0, "{what}: its link is still there");
    }
    // A msgr peer still gets through.
    let (mut poll2, mut dialer, _) = listening();
    let link = LinkId(1 << 40);
    let to = format!("fabric+tcp://{addr}").parse().unwrap();
    dialer.connect(link, &to).unwrap();
    dialer
        .send(link, Transmit::Banner([7; BANNER_LEN]))
        .unwrap();
    send_small_frames(&mut dialer, link, 3);
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut events = Vec::new();
    while events.len() < 5 {
        assert!(Instant::now() < deadline, "a good peer's units: {events:?}");
        let _ = drive_within(&mut dialer, &mut poll2, Duration::from_millis(5), |_| false);
        events.extend(
            drive_within(&mut t, &mut poll, Duration::from_millis(5), |e| {
                !e.is_empty()
            })
            .unwrap_or_else(|e| e),
        );
    }
    let server = accepted(&events).expect("accepted");
    in_order(&events[1..], server, 3);
}
