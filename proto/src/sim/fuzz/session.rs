//! The `session_engine` target: a session driven by a script of
//! operations ([`Op`]) read from the input, its invariants checked after
//! each step.

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use msgr_addr::{EntityAddr, EntityName};

use crate::banner::{Banner, BANNER_LEN};
use crate::batch::{BatchReader, BatchWriter};
use crate::control::{
    control_frame, with_dial_number, with_limits, Ack, Close, HelloOk, Keepalive, Limits,
    ReconnectOk,
};
use crate::frame::{Frame, Tag};
use crate::link_failure::LinkFailure;
use crate::message::{Message, MessageFrame};
use crate::session::{
    Hello, LinkId, LocalIdentity, Policy, Session, SessionConfig, SessionEvent, Takeover,
};
use crate::stream::{Inbound, StreamDecoder, Transmit};

use super::frame::{fuzz_limits, pad};
use super::message::{read_frame, write_frame};
use super::Reader;

/// One step of the `session_engine` target. [`Op::read`] decodes any bytes;
/// [`Op::write`] is its inverse, used to build seeds.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// `link_up` (link 0..=3).
    LinkUp(u8),
    /// `link_failed`.
    LinkFailed(u8),
    /// The peer's valid banner arrives on a link.
    GoodBanner(u8),
    /// 32 raw bytes arrive as a banner.
    RawBanner(u8, [u8; BANNER_LEN]),
    /// A control frame with a valid payload built from the fields.
    Control {
        /// Link.
        link: u8,
        /// Which control payload (see [`Op::read`]).
        kind: u8,
        /// Cookie / seq / stamp.
        a: u64,
        /// Second number (in_seq).
        b: u64,
        /// Which address / name / policy variant.
        who: u8,
    },
    /// A message frame.
    Msg {
        /// Link.
        link: u8,
        /// Sequence number.
        seq: u64,
        /// Piggybacked ack.
        ack: u64,
        /// Front length.
        len: u8,
    },
    /// An arbitrary frame.
    RawFrame(u8, Frame),
    /// Raw bytes through a per-link stream decoder.
    Stream(u8, Vec<u8>),
    /// Advance the clock by this many milliseconds and fire timers.
    Advance(u16),
    /// Application send of a message with this many front bytes.
    Send(u8),
    /// Graceful close.
    Close,
    /// Mark down.
    MarkDown,
    /// Route the identified hello into this session with `take_link`.
    TakeLink {
        /// Link.
        link: u8,
        /// Cookie in the hello.
        cookie: u64,
        /// in_seq in the hello.
        in_seq: u64,
        /// Address variant.
        who: u8,
    },
    /// Accept a new session with this cookie.
    AcceptNew(u64),
    /// A decode error on a link.
    DecodeError(u8),
    /// Pause/resume the receive-silence check.
    RxPaused(bool),
    /// Take up to this many units from `poll_transmit` (0: all), as a
    /// transport that can write only so much at a time.
    Drain(u8),
}

impl Op {
    /// Decodes one op.
    pub fn read(r: &mut Reader<'_>) -> Op {
        let code = r.u8();
        let x = r.u8();
        let link = x % 4;
        match code % 17 {
            0 => Op::LinkUp(link),
            1 => Op::LinkFailed(link),
            2 => Op::GoodBanner(link),
            3 => Op::RawBanner(link, pad::<BANNER_LEN>(r.bytes(BANNER_LEN))),
            4 => Op::Control {
                link,
                kind: r.u8(),
                a: small(r.u64()),
                b: small(r.u64()),
                who: r.u8(),
            },
            5 => Op::Msg {
                link,
                seq: small(r.u64()),
                ack: small(r.u64()),
                len: r.u8(),
            },
            6 => Op::RawFrame(link, read_frame(r)),
            7 => Op::Stream(link, r.short_bytes().to_vec()),
            8 => Op::Advance(r.u16()),
            9 => Op::Send(x),
            10 => Op::Close,
            11 => Op::MarkDown,
            12 => Op::TakeLink {
                link,
                cookie: small(r.u64()),
                in_seq: small(r.u64()),
                who: r.u8(),
            },
            13 => Op::AcceptNew(small(r.u64())),
            14 => Op::DecodeError(link),
            15 => Op::RxPaused(link & 1 == 1),
            _ => Op::Drain(x),
        }
    }

    /// Encodes the op so that [`Op::read`] returns it again.
    pub fn write(&self, out: &mut Vec<u8>) {
        let big = |v: u64| v.to_le_bytes();
        match self {
            Op::LinkUp(l) => out.extend([0, *l]),
            Op::LinkFailed(l) => out.extend([1, *l]),
            Op::GoodBanner(l) => out.extend([2, *l]),
            Op::RawBanner(l, b) => {
                out.extend([3, *l]);
                out.extend_from_slice(b);
            }
            Op::Control {
                link,
                kind,
                a,
                b,
                who,
            } => {
                out.extend([4, *link, *kind]);
                out.extend(big(*a));
                out.extend(big(*b));
                out.push(*who);
            }
            Op::Msg {
                link,
                seq,
                ack,
                len,
            } => {
                out.extend([5, *link]);
                out.extend(big(*seq));
                out.extend(big(*ack));
                out.push(*len);
            }
            Op::RawFrame(l, f) => {
                out.extend([6, *l]);
                write_frame(f, out);
            }
            Op::Stream(l, b) => {
                out.extend([7, *l, b.len().min(255) as u8]);
                out.extend_from_slice(&b[..b.len().min(255)]);
            }
            Op::Advance(ms) => {
                out.extend([8, 0]);
                out.extend(ms.to_le_bytes());
            }
            Op::Send(n) => out.extend([9, *n]),
            Op::Close => out.extend([10, 0]),
            Op::MarkDown => out.extend([11, 0]),
            Op::TakeLink {
                link,
                cookie,
                in_seq,
                who,
            } => {
                out.extend([12, *link]);
                out.extend(big(*cookie));
                out.extend(big(*in_seq));
                out.push(*who);
            }
            Op::AcceptNew(c) => {
                out.extend([13, 0]);
                out.extend(big(*c));
            }
            Op::DecodeError(l) => out.extend([14, *l]),
            Op::RxPaused(p) => out.extend([15, u8::from(*p)]),
            Op::Drain(n) => out.extend([16, *n]),
        }
    }
}

/// Keeps most numbers small (so sequence numbers and cookies hit the
/// interesting comparisons) while still allowing any u64.
fn small(v: u64) -> u64 {
    if v >> 63 == 1 {
        v
    } else {
        v % 32
    }
}

/// Identities the `session_engine` target plays with.
pub(super) fn fuzz_addr(who: u8) -> EntityAddr {
    let port = if who & 4 == 0 { 6800 } else { 0 };
    let ip = if who & 8 == 0 {
        [10, 0, 0, 2]
    } else {
        [10, 0, 0, 1]
    };
    EntityAddr::tcp((ip, port).into()).with_nonce(u64::from(who & 3))
}

fn fuzz_policy(who: u8) -> Policy {
    match (who >> 4) % 4 {
        0 => Policy::LossyClient,
        1 => Policy::LosslessClient,
        2 => Policy::LosslessPeer,
        _ => Policy::Server,
    }
}

fn fuzz_name(who: u8) -> EntityName {
    EntityName::peer(u64::from(who >> 6))
}

/// `session_engine`: one [`Session`] (connector or acceptor, any policy) fed
/// an arbitrary sequence of [`Op`]s: inbound units on several links, timers,
/// application calls and routing decisions. After every step the engine must
/// keep its invariants: bounded queue, transmits that encode and decode back,
/// messages delivered in order without duplicates, nothing after the end.
///
/// Input: a setup byte (bit 0: acceptor; bits 1-2: connector policy; bit 3:
/// unchecked payloads offered; bit 4: no batch frames sent; bit 5: a
/// connect timeout; bit 6: no lanes; bit 7: acks at once, not delayed),
/// then ops.
pub fn session_engine(data: &[u8]) {
    let mut r = Reader::new(data);
    let setup = r.u8();
    let t0 = Instant::now();
    let mut now = t0;
    let cfg = SessionConfig {
        limits: fuzz_limits(),
        keepalive_interval: Duration::from_millis(100),
        keepalive_timeout: Duration::from_millis(500),
        handshake_timeout: Duration::from_millis(300),
        banner_timeout: Duration::from_millis(200),
        backoff_min: Duration::from_millis(5),
        backoff_max: Duration::from_millis(80),
        wait_retry: Duration::from_millis(50),
        server_linger: Duration::from_millis(2000),
        max_queued_messages: 8,
        max_queued_bytes: 2048,
        max_in_flight_messages: 4,
        max_in_flight_bytes: 1024,
        ack_delay: if setup & 128 == 0 {
            Duration::from_millis(3)
        } else {
            Duration::ZERO
        },
        payload_crc: setup & 8 == 0,
        batch_max_bytes: if setup & 16 == 0 { 512 } else { 0 },
        // Bit 6: no lanes; else fragments of at most 128 bytes.
        max_fragment: if setup & 64 == 0 { 128 } else { 0 },
        // Bit 5: a connect timeout (the fuzzed clock reaches it).
        connect_timeout: (setup & 32 != 0).then(|| Duration::from_millis(700)),
        security: Default::default(),
    };
    let local = LocalIdentity {
        name: EntityName::peer(9),
        addr: EntityAddr::tcp(([10, 0, 0, 3], 6800).into()).with_nonce(5),
        dials: Default::default(),
    };
    let mut s = if setup & 1 == 1 {
        Session::accept(cfg.clone(), local, LinkId(0), now)
    } else {
        let policy = [
            Policy::LossyClient,
            Policy::LosslessClient,
            Policy::LosslessPeer,
            Policy::LosslessClient,
        ][usize::from((setup >> 1) & 3)];
        Session::connect(cfg.clone(), local, fuzz_addr(setup >> 3), policy, now)
    };
    let mut decoders: Vec<(StreamDecoder, BytesMut)> = (0..4)
        .map(|_| (StreamDecoder::new(cfg.limits), BytesMut::new()))
        .collect();
    let mut check = Invariants::default();
    let mut steps = 0;
    while !r.is_empty() && steps < 512 {
        steps += 1;
        let op = Op::read(&mut r);
        if let Op::Drain(n) = op {
            check.transmit(&mut s, &cfg, now, usize::from(n));
        } else {
            apply(&mut s, &op, &mut now, &mut decoders);
        }
        check.events(&mut s, &cfg);
    }
    // Let every timer run out: the engine must settle (no endless timers
    // that do nothing, no transmits after the end).
    for _ in 0..64 {
        match s.poll_timeout() {
            Some(t) => {
                now = now.max(t);
                s.handle_timeout(now);
                check.transmit(&mut s, &cfg, now, 0);
                check.events(&mut s, &cfg);
            }
            None => break,
        }
    }
}

fn apply(s: &mut Session, op: &Op, now: &mut Instant, decoders: &mut [(StreamDecoder, BytesMut)]) {
    let l = |x: &u8| LinkId(u64::from(*x));
    match op {
        Op::LinkUp(x) => s.link_up(l(x), *now),
        Op::LinkFailed(x) => s.link_failed(l(x), LinkFailure::Reset("fuzz".into()), *now),
        Op::GoodBanner(x) => {
            let _ = s.handle_inbound(l(x), Inbound::Banner(Banner::default().encode()), *now);
        }
        Op::RawBanner(x, b) => {
            let _ = s.handle_inbound(l(x), Inbound::Banner(*b), *now);
        }
        Op::Control {
            link,
            kind,
            a,
            b,
            who,
        } => {
            let f = control(*kind, *a, *b, *who);
            let _ = s.handle_inbound(l(link), Inbound::Frame(f), *now);
        }
        Op::Msg {
            link,
            seq,
            ack,
            len,
        } => {
            let mut m = Message::new(1, vec![*len; usize::from(*len)], Bytes::new());
            m.seq = *seq;
            // Every way a message arrives: decoded straight (what every
            // transport's receive path gives), as a frame (assembled), or
            // (length bit 7) in a batch of up to four from `seq` on.
            let unit = if len & 0x80 != 0 {
                let mut buf = BytesMut::new();
                let mut w = BatchWriter::begin(&mut buf, *seq, *ack, 4096);
                for i in 0..=(len & 3) {
                    w.push(&Message::new(
                        1,
                        vec![i; usize::from(len & 0x1f)],
                        Bytes::new(),
                    ));
                }
                Inbound::Frame(Frame::single(Tag::MessageBatch, w.finish()))
            } else if seq % 2 == 0 {
                Inbound::Message(MessageFrame::new(m, *ack))
            } else {
                Inbound::Frame(m.to_frame(*ack))
            };
            let _ = s.handle_inbound(l(link), unit, *now);
        }
        Op::RawFrame(x, f) => {
            let _ = s.handle_inbound(l(x), Inbound::Frame(f.clone()), *now);
        }
        Op::Stream(x, bytes) => {
            let (dec, buf) = &mut decoders[usize::from(*x) % 4];
            buf.extend_from_slice(bytes);
            loop {
                match dec.decode(buf) {
                    Ok(Some(unit)) => {
                        let _ = s.handle_inbound(l(x), unit, *now);
                    }
                    Ok(None) => break,
                    Err(e) => {
                        s.handle_decode_error(l(x), e.into(), *now);
                        buf.clear();
                        *dec = StreamDecoder::new(fuzz_limits());
                        break;
                    }
                }
            }
        }
        Op::Advance(ms) => {
            *now += Duration::from_millis(u64::from(*ms) % 4096);
            s.handle_timeout(*now);
        }
        Op::Send(n) => {
            let _ = s.send(Message::new(
                2,
                vec![0xab; usize::from(*n) * 4],
                Bytes::new(),
            ));
        }
        Op::Close => s.close(*now),
        Op::MarkDown => s.mark_down(*now),
        Op::TakeLink {
            link,
            cookie,
            in_seq,
            who,
        } => {
            let hello = Hello {
                name: fuzz_name(*who),
                addr: fuzz_addr(*who),
                target: fuzz_addr(0),
                policy: fuzz_policy(*who),
                cookie: *cookie,
                in_seq: *in_seq,
                limits: None,
                dial: None,
            };
            // The accepted link's own session, past the banners (crc).
            let local = LocalIdentity {
                name: EntityName::peer(9),
                addr: fuzz_addr(0),
                dials: Default::default(),
            };
            let mut pending = Session::accept(SessionConfig::default(), local, l(link), *now);
            let banner = crate::stream::Inbound::Banner(crate::Banner::default().encode());
            let _ = pending.handle_inbound(l(link), banner, *now);
            let t = s.take_link(l(link), &hello, &mut pending, 77, *now);
            if let Takeover::Rejected(f) | Takeover::Impostor { frame: f, .. } = t {
                assert!(matches!(f.tag, Tag::SessionReset | Tag::Wait), "{f:?}");
            }
        }
        Op::AcceptNew(c) => s.accept_new((*c).max(1), *now),
        Op::DecodeError(x) => {
            s.handle_decode_error(l(x), crate::error::FrameError::UnknownTag(0).into(), *now)
        }
        Op::RxPaused(p) => s.set_rx_paused(*p, *now),
        Op::Drain(_) => {}
    }
}

/// A control frame of kind `kind` with a valid payload (kinds >= 9: an empty
/// or unit payload on an arbitrary tag).
fn control(kind: u8, a: u64, b: u64, who: u8) -> Frame {
    let f = control_payload_frame(kind, a, b, who);
    // Hello, hello-ok and reconnect-ok carry limits and a dial number
    // where the banners agreed (the default banner offers both); bit 5 of
    // `who` leaves them out, so both shapes reach the engine. Small limits
    // (from `b`) make queued messages too large now and then; the dial
    // number (from `a`) is now and then one the session has seen.
    if kind % 12 < 3 && who & 0x20 == 0 {
        let limits = Limits {
            max_front: (b as u32 % 64) * 16,
            max_data: 1 << 20,
        };
        let f = with_dial_number(with_limits(f, &limits), a % 4);
        // A hello that starts a session names its attempt's first dial
        // (`FIRST_DIAL`, offered by default); bit 6 of `who` leaves it
        // out, and `b` makes it now and then later than the dial.
        if kind.is_multiple_of(12) && a == 0 && who & 0x40 == 0 {
            return with_dial_number(f, b % 2);
        }
        return f;
    }
    f
}

fn control_payload_frame(kind: u8, a: u64, b: u64, who: u8) -> Frame {
    match kind % 12 {
        0 => control_frame(
            Tag::Hello,
            &Hello {
                name: fuzz_name(who),
                addr: fuzz_addr(who),
                target: fuzz_addr(0),
                policy: fuzz_policy(who),
                cookie: a,
                in_seq: b,
                limits: None,
                dial: None,
            },
        ),
        1 => control_frame(
            Tag::HelloOk,
            &HelloOk {
                name: fuzz_name(who),
                addr: fuzz_addr(who),
                cookie: a,
            },
        ),
        2 => control_frame(
            Tag::ReconnectOk,
            &ReconnectOk {
                name: fuzz_name(who),
                addr: fuzz_addr(who),
                in_seq: b,
            },
        ),
        3 => control_frame(Tag::Ack, &Ack { seq: a }),
        4 => control_frame(Tag::Keepalive, &Keepalive { stamp: a }),
        5 => control_frame(Tag::KeepaliveAck, &Keepalive { stamp: a }),
        6 => control_frame(
            Tag::Close,
            &Close {
                reason: "fuzz".into(),
            },
        ),
        7 => control_frame(Tag::SessionReset, &()),
        8 => control_frame(Tag::Wait, &()),
        _ => Frame::single(
            Tag::from_u8((a % 14) as u8 + 1).unwrap_or(Tag::Ack),
            Bytes::new(),
        ),
    }
}

/// What the `session_engine` target checks after every step.
#[derive(Default)]
struct Invariants {
    /// Sequence number of the last delivered message in this session epoch.
    last_delivered: u64,
    /// A terminal event (Reset / Closed) was seen.
    ended: bool,
    /// `Established` was seen (and no `RemoteReset` since): messages may
    /// come.
    established: bool,
}

impl Invariants {
    /// Takes up to `max` transmits (0: all) and checks each.
    fn transmit(&mut self, s: &mut Session, cfg: &SessionConfig, now: Instant, max: usize) {
        let mut n = 0;
        while let Some((_link, t)) = s.poll_transmit(now) {
            n += 1;
            assert!(n < 10_000, "poll_transmit does not run dry");
            assert!(!self.ended, "transmit after the session ended: {t:?}");
            if let Transmit::Frame(f) = t {
                let enc = f.encode_to_vec().expect("engine frame encodes");
                let back = Frame::decode_exact(Bytes::from(enc), &cfg.limits);
                assert_eq!(back.as_ref(), Ok(&f), "engine frame does not decode back");
                if f.tag == Tag::MessageBatch {
                    assert!(cfg.batch_max_bytes > 0, "a batch where batches are off");
                    assert!(f.segments[0].len() <= cfg.batch_max_bytes);
                    let batch = BatchReader::new(f.segments[0].clone()).expect("batch header");
                    let claimed = batch.entry_count() as usize;
                    let entries: Vec<Message> = batch
                        .collect::<Result<_, _>>()
                        .expect("engine batch entries");
                    assert_eq!(claimed, entries.len());
                }
            }
            if n == max {
                break;
            }
        }
    }

    fn events(&mut self, s: &mut Session, cfg: &SessionConfig) {
        assert!(s.queued_messages() <= cfg.max_queued_messages);
        loop {
            while let Some(m) = s.poll_message() {
                assert!(!self.ended, "message after the session ended");
                assert!(self.established, "message before Established");
                assert_eq!(m.seq, self.last_delivered + 1, "delivered out of order");
                self.last_delivered = m.seq;
            }
            let Some(ev) = s.poll_event() else {
                break;
            };
            match ev {
                SessionEvent::Established(_) => {
                    assert!(!self.ended, "Established after the session ended");
                    self.established = true;
                }
                SessionEvent::RemoteReset { .. } => {
                    self.last_delivered = 0;
                    self.established = false;
                }
                SessionEvent::Reset { .. } | SessionEvent::Closed => {
                    assert!(!self.ended, "two terminal events");
                    self.ended = true;
                }
                SessionEvent::CloseLink(_) => {}
                other => assert!(!self.ended, "{other:?} after the session ended"),
            }
        }
        if self.ended {
            assert!(s.is_closed());
        }
    }
}
