//! A ping-pong over one backend's [`Transport`] alone: frames go through the
//! backend and the wire format (encode, CRC32C, decode) and nothing else —
//! no session engine, no worker loop, no dispatcher. Set beside `msgr ping`
//! (the whole messenger) and the provider's own tool (`ib_send_lat`,
//! `fi_pingpong`) in one run, it says which layer a latency gap is in.
//!
//! ```text
//! transport_ping serve ADDR [--seconds S] [--block 1] [--echo 1] [--seal 0] [--poll-cq 1]
//! transport_ping ping ADDR [--count N] [--warmup W] [--size BYTES] [--seconds S] [--block 1]
//!                     [--payload-crc 0] [--seal 0] [--poll-cq 1]
//! ```
//!
//! `serve` binds `ADDR` (port 0 picks one), prints `listening ADDR` and
//! answers every frame until its client goes or `--seconds` (default 120)
//! pass: with a frame of the same layout whose data is its own buffer, as
//! `fi_pingpong` and `ib_send_lat` answer from their own send buffers, or
//! with `--echo 1` with the frame it received (whose bytes the receive has
//! just written: the peer's copy of them then pulls modified cache lines
//! from this core, which an echo of a megabyte pays and the references do
//! not). `ping` sends `--count` frames (default 10 000, after `--warmup`
//! 1 000) laid out as msgr's messages are (a 32-byte header segment, an
//! empty front, `--size` bytes of data, default 64) one at a time and prints
//! `result {"count":…,"size":…,"p50_ns":…,"mean_ns":…,"p99_ns":…,"min_ns":…}`,
//! one-way = round trip / 2, or fails after `--seconds` (default 60). Both
//! poll without blocking, as a worker in its busy-poll window does; with
//! `--block 1` an idle pass arms the transport and blocks in epoll (10 ms at
//! most) instead, so a profiler such as callgrind counts the work per
//! message, not the spinning. `--payload-crc 0` sends frames whose data
//! carries no CRC (`FLAG_UNCHECKED_PAYLOAD`, what msgr sends with
//! `payload_crc = false` on both sides); the server echoes them as they came.
//! Each end sends the same data again and again and checksums it once
//! (`Message::with_data_checksum`; an echo reuses the checksum checked on
//! the way in), as `msgr ping` does by default; `--seal 0` on both makes
//! every send checksum its data again, as for fresh data. `--poll-cq 1`
//! opens a libfabric end's completion queue without a wait object
//! (`fabric_cq_wait = poll`), as fi_pingpong opens its own.
//!
//! Build with the backend's feature, e.g.
//! `cargo run --release -p msgr-backends --features fabric --example
//! transport_ping -- ping fabric+tcp://127.0.0.1:PORT`.

use std::collections::VecDeque;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use mio::{Events, Poll, Token};
use msgr_addr::{AddrParseError, EntityAddr};
use msgr_backends::{
    open_transport, AnyTransport, FabricCqWait, Inbound, LinkId, Transmit, Transport,
    TransportContext, TransportError, TransportEvent, LISTENER_TOKEN_BASE,
};
use msgr_proto::banner::BANNER_LEN;
use msgr_proto::frame::FLAG_UNCHECKED_PAYLOAD;
use msgr_proto::message::MessageFrame;
use msgr_proto::{FrameLimits, LinkFailure, Message, ProtocolError};

/// While no transport needs it every pass, epoll is asked on one pass in
/// this many (as the worker's busy-poll loop does).
const EPOLL_EVERY: u32 = 16;
/// A spinning pass reads the clock on one pass in this many: the time
/// serves the run's deadline and the transport's (a millisecond and more),
/// and a read on every pass was an eighth of a spinning server's samples
/// (64 B over shm) — the loop's cost, not the backend's.
const CLOCK_EVERY: u32 = 16;
const WAKER: Token = Token(0);

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
enum PingError {
    /// The command line is not one this example takes.
    #[error("{USAGE}")]
    Usage,
    /// A flag's value is not a whole number.
    #[error("{flag}: {value}")]
    NotANumber { flag: String, value: String },
    /// The address did not parse.
    #[error("{text}: {source}")]
    Addr {
        text: String,
        source: AddrParseError,
    },
    /// An epoll call failed.
    #[error("{what}: {source}")]
    Poll {
        what: &'static str,
        source: std::io::Error,
    },
    /// The transport refused a call: `what` says which, and where.
    #[error("{what}: {source}")]
    Transport {
        what: String,
        source: Box<TransportError>,
    },
    /// The link failed (the peer closed it or went away).
    #[error("link {} failed: {why}", link.0)]
    LinkFailed { link: LinkId, why: LinkFailure },
    /// A unit came in corrupt.
    #[error("link {} corrupt: {error}", link.0)]
    Corrupt { link: LinkId, error: ProtocolError },
    /// The run's `--seconds` passed.
    #[error("timed out; events not waited for: {pending:?}")]
    TimedOut { pending: VecDeque<TransportEvent> },
    /// An answer of another size than the frame sent.
    #[error("the answer to frame {frame} has {got} data bytes, not {want}")]
    WrongAnswer {
        frame: usize,
        got: usize,
        want: usize,
    },
}

const USAGE: &str = "usage: transport_ping serve ADDR [--seconds S] [--block 1] [--echo 1] [--seal 0] \
                     [--poll-cq 1] | ping ADDR [--count N] [--warmup W] [--size BYTES] [--seconds S] \
                     [--block 1] [--payload-crc 0] [--seal 0] [--poll-cq 1]";

/// One end: a transport, its Poll and what it has reported.
struct End {
    poll: Poll,
    transport: AnyTransport,
    ready: Events,
    /// The link-id allocator the transport shares (its own tokens come
    /// from it too, so a link id must not be made up).
    link_ids: Arc<AtomicU64>,
    events: Vec<TransportEvent>,
    /// Events reported and not yet waited for, oldest first.
    pending: VecDeque<TransportEvent>,
    pass: u32,
    /// The clock as last read (see [`CLOCK_EVERY`]).
    now: Instant,
    /// Block in epoll on an idle pass instead of spinning (`--block 1`).
    block: bool,
    deadline: Instant,
    // Kept alive: backends that lend buffers to other threads wake through it.
    _waker: Arc<mio::Waker>,
}

impl End {
    fn open(addr: &EntityAddr, seconds: u64, block: bool, poll_cq: bool) -> Result<End, PingError> {
        let poll = Poll::new().map_err(|source| PingError::Poll {
            what: "epoll",
            source,
        })?;
        let waker = mio::Waker::new(poll.registry(), WAKER).map_err(|source| PingError::Poll {
            what: "waker",
            source,
        })?;
        let waker = Arc::new(waker);
        let mut ctx = TransportContext::new(FrameLimits::default());
        ctx.waker = Some(waker.clone());
        if poll_cq {
            ctx.rdma.fabric_cq_wait = FabricCqWait::Poll;
        }
        let transport =
            open_transport(&addr.transport, poll.registry(), &ctx).map_err(|source| {
                PingError::Transport {
                    what: addr.to_string(),
                    source: Box::new(source),
                }
            })?;
        Ok(End {
            poll,
            transport,
            ready: Events::with_capacity(64),
            link_ids: ctx.link_ids.clone(),
            events: Vec::new(),
            pending: VecDeque::new(),
            pass: 0,
            now: Instant::now(),
            block,
            deadline: Instant::now() + Duration::from_secs(seconds),
            _waker: waker,
        })
    }

    /// One busy-poll pass: queued output, completions, readiness, and what
    /// they queued.
    fn pass(&mut self) -> Result<(), PingError> {
        if self.block || self.pass.is_multiple_of(CLOCK_EVERY) {
            self.now = Instant::now();
        }
        let mut now = self.now;
        if now >= self.deadline {
            return Err(PingError::TimedOut {
                pending: std::mem::take(&mut self.pending),
            });
        }
        // Out before a blocking poll can delay it.
        self.transport.flush(now, &mut self.events);
        self.pass = self.pass.wrapping_add(1);
        let busy = self.transport.progress(now, &mut self.events);
        let idle = !busy && self.events.is_empty();
        let timeout = if self.block && idle && self.transport.arm() {
            Some(Duration::from_millis(10))
        } else if self.transport.ready_every_pass() || self.pass.is_multiple_of(EPOLL_EVERY) {
            Some(Duration::ZERO)
        } else {
            None
        };
        if timeout.is_some() {
            self.poll
                .poll(&mut self.ready, timeout)
                .map_err(|source| PingError::Poll {
                    what: "epoll_wait",
                    source,
                })?;
            if self.block {
                now = Instant::now();
                self.now = now;
            }
            for ev in self.ready.iter() {
                if ev.token() != WAKER {
                    self.transport.ready(ev, now, &mut self.events);
                }
            }
        }
        self.transport.flush(now, &mut self.events);
        Ok(())
    }

    /// Passes until an event `pick` accepts arrives; events before it are
    /// dropped, those after it kept, and a failure of the link ends the wait
    /// with an error.
    fn wait<T>(&mut self, mut pick: impl FnMut(TransportEvent) -> Option<T>) -> Result<T, Stop> {
        loop {
            while let Some(ev) = self.pending.pop_front() {
                match ev {
                    TransportEvent::Failed(link, why) => {
                        return Err(Stop::Gone(PingError::LinkFailed { link, why }))
                    }
                    TransportEvent::Corrupt(link, error) => {
                        return Err(Stop::Error(PingError::Corrupt { link, error }))
                    }
                    ev => {
                        if let Some(t) = pick(ev) {
                            return Ok(t);
                        }
                    }
                }
            }
            self.pass().map_err(Stop::Error)?;
            if !self.events.is_empty() {
                self.pending.extend(self.events.drain(..));
            }
        }
    }

    fn send(&mut self, link: LinkId, unit: Transmit) -> Result<(), PingError> {
        self.transport
            .send(link, unit)
            .map_err(|source| PingError::Transport {
                what: "send".into(),
                source: Box::new(source),
            })
    }
}

/// Why [`End::wait`] ended without the event it waited for.
enum Stop {
    /// The link failed: the peer closed it or went away.
    Gone(PingError),
    /// Anything else: a corrupt unit, the deadline, a failed poll.
    Error(PingError),
}

impl From<Stop> for PingError {
    fn from(stop: Stop) -> PingError {
        match stop {
            Stop::Gone(why) | Stop::Error(why) => why,
        }
    }
}

/// The message a received unit carries (as every receive path decodes
/// it, or as a frame some path assembled), with its ack and flags.
fn message_of(inbound: Inbound) -> Option<MessageFrame> {
    match inbound {
        Inbound::Message(m) => Some(m),
        Inbound::Frame(f) => {
            let flags = f.flags;
            let (msg, ack) = Message::from_frame(f).ok()?;
            Some(MessageFrame { msg, ack, flags })
        }
        Inbound::Banner(_) => None,
    }
}

/// The wire unit of a msgr message: an empty front, the payload as data
/// (checksummed now, once, if `seal`), sent as the session sends one.
fn message_unit(payload: Bytes, payload_crc: bool, seal: bool) -> MessageFrame {
    let mut msg = Message::new(0, Bytes::new(), payload);
    if payload_crc && seal {
        msg = msg.with_data_checksum();
    }
    let flags = if payload_crc {
        0
    } else {
        FLAG_UNCHECKED_PAYLOAD
    };
    MessageFrame { msg, ack: 0, flags }
}

fn serve(
    addr: &EntityAddr,
    seconds: u64,
    block: bool,
    echo: bool,
    seal: bool,
    poll_cq: bool,
) -> Result<(), PingError> {
    let mut end = End::open(addr, seconds, block, poll_cq)?;
    let bound = end
        .transport
        .listen(addr, Token(LISTENER_TOKEN_BASE))
        .map_err(|source| PingError::Transport {
            what: format!("listen on {addr}"),
            source: Box::new(source),
        })?;
    println!("listening {bound}");
    let link = end.wait(|ev| match ev {
        TransportEvent::Accepted { link, .. } => Some(link),
        _ => None,
    })?;
    end.send(link, Transmit::Banner([0; BANNER_LEN]))?;
    let mut echoed = 0u64;
    // The answer (`--echo 0`), made again when its layout changes.
    let mut own = message_unit(Bytes::new(), true, false);
    loop {
        let next = end.wait(|ev| match ev {
            TransportEvent::Received(_, inbound) => Some(message_of(inbound)),
            _ => None,
        });
        match next {
            Ok(Some(got)) => {
                let answer = if echo && seal {
                    got // with the checksum checked on the way in
                } else if echo {
                    let m = got.msg;
                    MessageFrame {
                        msg: Message::new(m.msg_type, m.front, m.data),
                        ..got
                    }
                } else {
                    let len = got.msg.data.len();
                    if own.msg.data.len() != len || own.flags != got.flags {
                        let crc = got.flags & FLAG_UNCHECKED_PAYLOAD == 0;
                        own = message_unit(Bytes::from(vec![0xa5; len]), crc, seal);
                    }
                    own.clone()
                };
                if let Err(why) = end.send(link, Transmit::Message(answer)) {
                    // The client went between its frame and our reply.
                    println!("served {echoed} frames ({why})");
                    return Ok(());
                }
                echoed += 1;
            }
            Ok(None) => {}
            // The client closing its link ends the run.
            Err(Stop::Gone(why)) => {
                println!("served {echoed} frames ({why})");
                return Ok(());
            }
            Err(Stop::Error(why)) => return Err(why),
        }
    }
}

struct PingOpts {
    count: usize,
    warmup: usize,
    size: usize,
    seconds: u64,
    block: bool,
    payload_crc: bool,
    seal: bool,
    poll_cq: bool,
}

fn ping(addr: &EntityAddr, o: &PingOpts) -> Result<(), PingError> {
    let mut end = End::open(addr, o.seconds, o.block, o.poll_cq)?;
    let link = LinkId(end.link_ids.fetch_add(1, Ordering::Relaxed));
    end.transport
        .connect(link, addr)
        .map_err(|source| PingError::Transport {
            what: format!("connect to {addr}"),
            source: Box::new(source),
        })?;
    end.wait(|ev| matches!(ev, TransportEvent::Connected(l) if l == link).then_some(()))?;
    end.send(link, Transmit::Banner([0; BANNER_LEN]))?;
    let unit = message_unit(Bytes::from(vec![0x5a; o.size]), o.payload_crc, o.seal);
    let mut one_way = Vec::with_capacity(o.count);
    for i in 0..o.warmup + o.count {
        let start = Instant::now();
        end.send(link, Transmit::Message(unit.clone()))?;
        let back = end.wait(|ev| match ev {
            TransportEvent::Received(_, inbound) => message_of(inbound),
            _ => None,
        })?;
        let rtt = start.elapsed();
        let got = back.msg.data.len();
        if got != o.size {
            return Err(PingError::WrongAnswer {
                frame: i,
                got,
                want: o.size,
            });
        }
        if i >= o.warmup {
            one_way.push(rtt.as_nanos() as u64 / 2);
        }
    }
    end.transport.close(link, true);
    one_way.sort_unstable();
    let pct = |p: usize| one_way[(one_way.len() - 1) * p / 100];
    let mean = one_way.iter().sum::<u64>() / one_way.len() as u64;
    println!(
        "result {{\"count\":{},\"size\":{},\"p50_ns\":{},\"mean_ns\":{mean},\"p99_ns\":{},\"min_ns\":{}}}",
        o.count,
        o.size,
        pct(50),
        pct(99),
        pct(0)
    );
    Ok(())
}

fn run(args: &[String]) -> Result<(), PingError> {
    let (role, addr) = match args {
        [role, addr, ..] => (role.as_str(), addr),
        _ => return Err(PingError::Usage),
    };
    let addr: EntityAddr = addr.parse().map_err(|source| PingError::Addr {
        text: addr.clone(),
        source,
    })?;
    let mut o = PingOpts {
        count: 10_000,
        warmup: 1_000,
        size: 64,
        seconds: if role == "serve" { 120 } else { 60 },
        block: false,
        payload_crc: true,
        seal: true,
        poll_cq: false,
    };
    let mut echo = false;
    let mut rest = args[2..].iter();
    while let Some(flag) = rest.next() {
        let value = rest.next().ok_or(PingError::Usage)?;
        let n: u64 = value.parse().map_err(|_| PingError::NotANumber {
            flag: flag.clone(),
            value: value.clone(),
        })?;
        match flag.as_str() {
            "--count" if n > 0 => o.count = n as usize,
            "--warmup" => o.warmup = n as usize,
            "--size" => o.size = n as usize,
            "--seconds" => o.seconds = n,
            "--block" => o.block = n != 0,
            "--payload-crc" => o.payload_crc = n != 0,
            "--seal" => o.seal = n != 0,
            "--poll-cq" => o.poll_cq = n != 0,
            "--echo" if role == "serve" => echo = n != 0,
            _ => return Err(PingError::Usage),
        }
    }
    match role {
        "serve" => serve(&addr, o.seconds, o.block, echo, o.seal, o.poll_cq),
        "ping" => ping(&addr, &o),
        _ => Err(PingError::Usage),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("transport_ping: {e}");
            ExitCode::FAILURE
        }
    }
}
