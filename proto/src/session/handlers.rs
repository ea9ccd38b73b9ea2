//! The engine's receive side: one handler per frame tag.
//!
//! [`Session::process`] takes each unit a link delivered (opened, if the
//! link is secure): the banner goes to [`Session::on_banner`], a message
//! decoded by the stream to [`Session::on_message`], and a frame to the
//! handler of its tag. Each handler first checks that the session's phase
//! ([`State`]) takes its tag — anything else is
//! [`ProtocolError::Unexpected`], naming the phase — and then does what
//! the tag asks. An error faults the link (in
//! [`Session::handle_inbound_with`]). What came in and was acknowledged
//! is the session's [`Incoming`] part, defined here.

use std::time::{Duration, Instant};

use msgr_addr::EntityName;

use super::{
    call_allowed, FaultReason, Hello, LinkId, ProtocolError, Session, SessionEvent, State,
};
use crate::auth::{AuthError, RecordError, RecordLayer, SecurityMode};
use crate::banner::{features, Banner, BANNER_LEN};
use crate::batch::BatchReader;
use crate::codec::{Codec, Postcard};
use crate::control::{
    control_frame, parse_control, Ack, Close, HelloOk, Keepalive, Limits, PacedKeepalive,
    ReconnectOk,
};
use crate::fragment::{Fragment, Reassembler, ReassemblyError};
use crate::frame::{Frame, Tag, FLAG_UNCHECKED_PAYLOAD};
use crate::link_failure::LinkFailure;
use crate::message::{Message, MessageFrame};
use crate::stream::{Inbound, Transmit};
use crate::view::ReceivedBatch;

impl Session {
    /// A secure link unseals every unit first (the record layer's `open`);
    /// nothing passes in the clear.
    pub(super) fn unseal(&mut self, unit: Inbound) -> Result<Inbound, ProtocolError> {
        Ok(match (self.link_security.record.as_mut(), unit) {
            (Some(record), Inbound::Frame(f)) => record.open(f, &self.cfg.limits)?,
            (Some(_), Inbound::Message(_)) => {
                return Err(RecordError::Plaintext(Tag::Message).into())
            }
            (_, unit) => unit,
        })
    }

    /// One unit received on `link`, dispatched to its handler.
    pub(super) fn process(
        &mut self,
        link: LinkId,
        unit: Inbound,
        now: Instant,
    ) -> Result<(), ProtocolError> {
        match unit {
            Inbound::Banner(raw) => self.on_banner(link, &raw),
            Inbound::Message(m) => self.on_message(m),
            Inbound::Frame(frame) => {
                if matches!(self.state, State::Banner(_)) {
                    // The banner comes first; nothing is read before it.
                    return Err(self.unexpected(frame.tag));
                }
                self.check_flags(frame.flags)?;
                match frame.tag {
                    Tag::Auth => self.on_auth(link, &frame),
                    Tag::Hello => self.on_hello(link, &frame),
                    Tag::HelloOk => self.on_hello_ok(link, &frame, now),
                    Tag::ReconnectOk => self.on_reconnect_ok(link, &frame, now),
                    Tag::SessionReset => self.on_session_reset(now),
                    Tag::Wait => self.on_wait(now),
                    Tag::Message => self.on_message_frame(frame),
                    Tag::MessageBatch => self.on_batch(frame),
                    Tag::Fragment => self.on_fragment(frame),
                    Tag::Ack => self.on_ack(&frame),
                    Tag::Keepalive => self.on_keepalive(&frame, now),
                    Tag::KeepaliveAck => self.on_keepalive_ack(&frame),
                    Tag::Close => self.on_close(&frame),
                    tag => Err(self.unexpected(tag)),
                }
            }
        }
    }

    /// The error for a `tag` this phase does not take.
    fn unexpected(&self, tag: Tag) -> ProtocolError {
        ProtocolError::Unexpected {
            tag,
            state: self.state.phase().as_str(),
        }
    }

    /// `Ok` if the phase `takes` this `tag`, else [`ProtocolError::Unexpected`].
    fn check_phase_takes(&self, tag: Tag, takes: bool) -> Result<(), ProtocolError> {
        if takes {
            Ok(())
        } else {
            Err(self.unexpected(tag))
        }
    }

    /// The peer's banner, the first thing on a link: agree on features and
    /// the security mode, then start the handshake or go on to the hello.
    fn on_banner(&mut self, link: LinkId, raw: &[u8; BANNER_LEN]) -> Result<(), ProtocolError> {
        if !matches!(self.state, State::Banner(_)) {
            return Err(ProtocolError::Malformed {
                what: "stream",
                detail: format!("second banner while {}", self.state.phase().as_str()),
            });
        }
        let peer = Banner::decode(raw)?;
        self.remote.features = self.banner().negotiate(&peer)?;
        let mode = self.cfg.security.modes.choose(self.remote.features)?;
        self.link_security.mode = mode;
        if mode == SecurityMode::Crc {
            self.after_banners(link);
            return Ok(());
        }
        self.start_handshake(link, raw)
    }

    /// `Auth`: one handshake message from the peer. Answer it, and once
    /// the handshake is done, go on to the hello.
    fn on_auth(&mut self, link: LinkId, frame: &Frame) -> Result<(), ProtocolError> {
        let State::Authenticating { handshake: hs, .. } = &mut self.state else {
            return Err(self.unexpected(Tag::Auth));
        };
        if frame.segments.len() != 1 {
            return Err(AuthError::Handshake("a handshake frame has one segment").into());
        }
        // A refusal (our keyring does not vouch for the peer) ends the
        // connector's session, and the acceptor tells the connector why
        // (`after_link_error`).
        hs.read_message(&frame.segments[0])?;
        if hs.is_my_turn() {
            let m = hs.write_message()?;
            self.tx
                .ctrl
                .push_back(Transmit::Frame(Frame::single(Tag::Auth, m)));
        }
        if !hs.is_finished() {
            return Ok(());
        }
        // The handshake is over: the link goes on to the hello (which
        // after_banners sends, once the peer is checked).
        let next = if self.side.is_connector() {
            State::HelloSent(link)
        } else {
            State::AwaitHello(link)
        };
        let hs = match std::mem::replace(&mut self.state, next) {
            State::Authenticating { handshake, .. } => handshake,
            other => {
                self.state = other;
                return Err(self.unexpected(Tag::Auth));
            }
        };
        let done = hs.finish()?;
        if self.link_security.mode == SecurityMode::Secure {
            self.link_security.record = Some(Box::new(RecordLayer::new(&done.keys)));
        }
        if self.side.is_connector() {
            // Before our hello goes: it is for the entity we dialled only.
            self.check_expected(&done.peer_name, true)?;
        }
        self.link_security.peer = Some((done.peer_name, done.peer_key));
        self.after_banners(link);
        Ok(())
    }

    /// `Hello`, on an acceptor's link: who the peer is and what it asks
    /// for. The owner routes it ([`SessionEvent::Identified`]).
    fn on_hello(&mut self, link: LinkId, frame: &Frame) -> Result<(), ProtocolError> {
        self.check_phase_takes(Tag::Hello, matches!(self.state, State::AwaitHello(_)))?;
        let (frame, first_dial) = self.split_first_dial(frame)?;
        let (mut hello, extras): (Hello, _) = self.parse_handshake(&frame, "hello")?;
        self.check_claimed(&hello.name)?;
        hello.limits = extras.limits;
        hello.dial = extras.dial;
        if self.first_dial_agreed() {
            // Exactly the hellos that start a session name their
            // attempt's first dial, made no later than this one.
            let fits = match (first_dial, hello.dial) {
                (Some(first), Some(dial)) => hello.cookie == 0 && first <= dial,
                (None, _) => hello.cookie != 0,
                (Some(_), None) => false,
            };
            if !fits {
                return Err(ProtocolError::Malformed {
                    what: "hello",
                    detail: format!(
                        "first dial {first_dial:?} with dial {:?} and cookie {:#x}",
                        hello.dial, hello.cookie
                    ),
                });
            }
        }
        self.events
            .push_back(SessionEvent::Identified(hello.clone()));
        self.state = State::Identified {
            link,
            hello: Box::new(hello),
            first_dial,
        };
        Ok(())
    }

    /// A hello without its last segment where that is the first dial of
    /// its attempt (`features::FIRST_DIAL`: one segment more than the
    /// other extras), and that number.
    fn split_first_dial(&self, frame: &Frame) -> Result<(Frame, Option<u64>), ProtocolError> {
        let others = 2 + usize::from(self.limits_agreed());
        if !self.first_dial_agreed() || frame.segments.len() != others + 1 {
            return Ok((frame.clone(), None));
        }
        let mut frame = frame.clone();
        let seg = frame.segments.pop().unwrap_or_default();
        let first = Postcard
            .decode::<u64>(&seg)
            .map_err(|e| ProtocolError::Malformed {
                what: "hello",
                detail: e.detail,
            })?;
        Ok((frame, Some(first)))
    }

    /// The acceptor's answer to our hello names `name` and brings its
    /// receive `limits`: the name must be the one the link proved and the
    /// one the application dialled.
    fn answered_by(
        &mut self,
        name: &EntityName,
        limits: Option<Limits>,
    ) -> Result<(), ProtocolError> {
        self.check_claimed(name)?;
        self.check_expected(name, false)?;
        self.remote.limits = limits;
        Ok(())
    }

    /// `HelloOk`: the acceptor opened a new session for our hello.
    fn on_hello_ok(
        &mut self,
        link: LinkId,
        frame: &Frame,
        now: Instant,
    ) -> Result<(), ProtocolError> {
        self.check_phase_takes(Tag::HelloOk, matches!(self.state, State::HelloSent(_)))?;
        let (ok, extras): (HelloOk, _) = self.parse_handshake(frame, "hello-ok")?;
        self.answered_by(&ok.name, extras.limits)?;
        if let Err(e) = self.check_peer(&ok.addr) {
            if !self.established {
                // We named an incarnation (nonce) that no longer lives
                // there: retrying cannot help. End the session and say
                // why; the application may dial the new incarnation.
                self.terminate(FaultReason::Protocol(e.clone()));
            }
            return Err(e);
        }
        if self.remote.cookie != 0 {
            // We asked to resume but got a new session: the old one is gone.
            self.remote_reset();
        }
        if self.remote.cookie == 0 {
            // A new session: whoever this link proved is its peer.
            self.remote.key = None;
        }
        self.bind_identity()?;
        self.remote.name = Some(ok.name);
        self.remote.dials.learn(ok.addr.nonce, extras.dial);
        // Our dial opened it: no hello of the peer's did.
        self.remote.dials.forget_opening();
        self.remote.addr = Some(ok.addr);
        self.remote.cookie = ok.cookie;
        self.state = State::open(link);
        self.tx.rewind_to_acked();
        self.on_open(now, 0);
        Ok(())
    }

    /// `ReconnectOk`: the acceptor resumes our session from what it
    /// received.
    fn on_reconnect_ok(
        &mut self,
        link: LinkId,
        frame: &Frame,
        now: Instant,
    ) -> Result<(), ProtocolError> {
        self.check_phase_takes(Tag::ReconnectOk, matches!(self.state, State::HelloSent(_)))?;
        let (ok, extras): (ReconnectOk, _) = self.parse_handshake(frame, "reconnect-ok")?;
        self.answered_by(&ok.name, extras.limits)?;
        self.check_peer(&ok.addr)?;
        self.bind_identity()?;
        if self.remote.cookie == 0 {
            return Err(ProtocolError::Unexpected {
                tag: Tag::ReconnectOk,
                state: "starting a new session",
            });
        }
        self.remote.dials.learn(ok.addr.nonce, extras.dial);
        // The peer knew the cookie: it saw its hello-ok.
        self.remote.dials.forget_opening();
        self.resume(link, ok.in_seq, now)
    }

    /// `SessionReset`: the acceptor refused our hello.
    fn on_session_reset(&mut self, now: Instant) -> Result<(), ProtocolError> {
        self.check_phase_takes(Tag::SessionReset, matches!(self.state, State::HelloSent(_)))?;
        // A refused resume: the peer lost our session. A refused new
        // session (cookie 0) lost nothing of ours — nothing queued
        // since the last reset was ever sent — so the queue waits
        // for the next attempt.
        if self.remote.cookie != 0 {
            self.remote_reset();
        }
        // Whatever we tried to open is gone: the next hello starts anew.
        self.redial.first_dial = None;
        // Either way the peer may have restarted: its next
        // incarnation (a new nonce) is the one to talk to, or
        // check_peer would refuse it forever.
        if let Some(a) = self.remote.addr.as_mut() {
            a.nonce = 0;
        }
        // Start afresh on a new link right away (lossless) or end (lossy).
        self.fault(
            FaultReason::Transport(LinkFailure::Reset("peer reset the session".into())),
            now,
        );
        if let State::Standby {
            reconnect_at: reconnect_at @ Some(_),
            ..
        } = &mut self.state
        {
            *reconnect_at = Some(now);
        }
        Ok(())
    }

    /// `Wait`: both sides dialled, and the peer's link wins.
    fn on_wait(&mut self, now: Instant) -> Result<(), ProtocolError> {
        self.check_phase_takes(Tag::Wait, matches!(self.state, State::HelloSent(_)))?;
        // The peer's own connection to us wins the race; it will arrive
        // as an accepted link. Retry later in case it never does.
        self.close_link_now();
        self.state = State::Standby {
            reconnect_at: Some(now + self.cfg.wait_retry),
            since: now,
        };
        Ok(())
    }

    /// A message the stream decoded from a `Message` frame, on the open link.
    fn on_message(&mut self, m: MessageFrame) -> Result<(), ProtocolError> {
        self.check_phase_takes(Tag::Message, self.is_open())?;
        self.check_flags(m.flags)?;
        self.receive_message(m.msg, m.ack)
    }

    /// A `Message` frame the stream left whole, on the open link.
    fn on_message_frame(&mut self, frame: Frame) -> Result<(), ProtocolError> {
        self.check_phase_takes(Tag::Message, self.is_open())?;
        let (msg, ack) = Message::from_frame(frame)?;
        self.receive_message(msg, ack)
    }

    /// `Ack`: the peer received up to a seq and had nothing to send.
    fn on_ack(&mut self, frame: &Frame) -> Result<(), ProtocolError> {
        self.check_phase_takes(Tag::Ack, self.is_open())?;
        let ack: Ack = parse_control(frame, "ack")?;
        self.apply_ack(ack.seq)
    }

    /// `Keepalive`: paced ones say the peer's timeout (and take this
    /// side's along if it is due soon), older ones are answered.
    fn on_keepalive(&mut self, frame: &Frame, now: Instant) -> Result<(), ProtocolError> {
        self.check_phase_takes(Tag::Keepalive, self.is_open())?;
        if self.remote.features & features::PACED_KEEPALIVE == 0 {
            let ka: Keepalive = parse_control(frame, "keepalive")?;
            self.tx
                .ctrl
                .push_back(Transmit::Frame(control_frame(Tag::KeepaliveAck, &ka)));
            return Ok(());
        }
        // Not answered: this side's own keepalives, paced by the
        // peer's timeout, tell the peer it is alive.
        let ka: PacedKeepalive = parse_control(frame, "keepalive")?;
        // A timeout under 3 ms would pace keepalives 0 ms apart.
        let timeout = Duration::from_millis(ka.timeout_ms.max(3));
        if let State::Open {
            peer_keepalive_timeout,
            ..
        } = &mut self.state
        {
            *peer_keepalive_timeout = Some(timeout);
        }
        self.keepalive_along(now);
        Ok(())
    }

    /// `KeepaliveAck`: the answer to an unpaced keepalive; arriving was
    /// its purpose.
    fn on_keepalive_ack(&mut self, frame: &Frame) -> Result<(), ProtocolError> {
        self.check_phase_takes(Tag::KeepaliveAck, self.is_open())?;
        let _: Keepalive = parse_control(frame, "keepalive-ack")?;
        Ok(())
    }

    /// `Close`: the peer ends the session.
    fn on_close(&mut self, frame: &Frame) -> Result<(), ProtocolError> {
        self.check_phase_takes(
            Tag::Close,
            matches!(self.state, State::Open { .. } | State::HelloSent(_)),
        )?;
        if self.is_refusal(frame) {
            return self.on_refused(frame);
        }
        let c: Close = parse_control(frame, "close")?;
        if self.closing && self.tx.outbox.messages() == 0 {
            // Both sides closed at once: that is a clean close.
            self.close_link_now();
            self.state = State::Closed;
            self.events.push_back(SessionEvent::Closed);
        } else {
            self.terminate(FaultReason::PeerClosed(c.reason));
        }
        Ok(())
    }

    /// Refuses a frame whose payload went unchecked on a link that never
    /// agreed to that.
    fn check_flags(&self, flags: u8) -> Result<(), ProtocolError> {
        if flags & FLAG_UNCHECKED_PAYLOAD != 0
            && self.remote.features & features::UNCHECKED_PAYLOAD == 0
        {
            return Err(ProtocolError::Malformed {
                what: "frame",
                detail: "payload without CRC on a link that checks payloads".into(),
            });
        }
        Ok(())
    }

    /// A message received on the open link, with the ack it carried.
    fn receive_message(&mut self, msg: Message, ack: u64) -> Result<(), ProtocolError> {
        self.apply_ack(ack)?;
        self.deliver(msg)
    }

    /// `MessageBatch`, on the open link of a session that agreed to
    /// batches: its ack once, then each
    /// message in turn, checked and counted as if each had come in a
    /// frame of its own; those in sequence go to the owner together, as
    /// views of the body ([`ReceivedBatch`]), no message built. An
    /// entry that does not parse faults the link after the ones before
    /// it were delivered (the body passed its CRC: the peer wrote it so).
    fn on_batch(&mut self, frame: Frame) -> Result<(), ProtocolError> {
        self.check_phase_takes(
            Tag::MessageBatch,
            self.is_open() && self.remote.features & features::BATCH != 0,
        )?;
        let mut segments = frame.segments.into_iter();
        let (Some(body), None) = (segments.next(), segments.next()) else {
            return Err(ProtocolError::Malformed {
                what: "batch frame",
                detail: "expected 1 segment".into(),
            });
        };
        let mut batch = BatchReader::new(body)?;
        self.stats.rx_batches += 1;
        self.apply_ack(batch.ack())?;
        // Duplicates can only lead (sequence numbers are consecutive):
        // what is delivered is one run of entries, from `first` to `end`.
        let mut first = None;
        let (mut count, mut bytes, mut end) = (0u32, 0u64, 0);
        let r = loop {
            let at = batch.position();
            let (seq, head) = match batch.next_entry() {
                Ok(Some(entry)) => entry,
                Ok(None) => break Ok(()),
                Err(e) => break Err(e.into()),
            };
            if let Err(e) = self.check_call(head.call) {
                break Err(e);
            }
            match self.next_in_sequence(seq) {
                Ok(true) => {}
                Ok(false) => continue,
                Err(e) => break Err(e),
            }
            self.rx.in_seq = seq;
            first.get_or_insert((at, seq));
            count += 1;
            bytes += (head.front_len + head.data_len) as u64;
            end = batch.position();
        };
        if let Some((at, seq)) = first {
            self.stats.rx_messages += u64::from(count);
            self.stats.rx_bytes += bytes;
            let run = ReceivedBatch::new(batch.into_body(), at, end, seq, count);
            self.events.push_batch(run);
        }
        r
    }

    /// `Fragment`, on the open link of a session that agreed to lanes:
    /// its ack, then the fragment once and in sequence (as a message),
    /// into its class's reassembly; the message once whole. What is in
    /// progress outlives a link fault: the sequence numbers received are
    /// the session's, so the peer replays from the next fragment.
    fn on_fragment(&mut self, frame: Frame) -> Result<(), ProtocolError> {
        self.check_phase_takes(
            Tag::Fragment,
            self.is_open() && self.remote.features & features::LANES != 0,
        )?;
        let piece_crc = frame.known_crc(2);
        let f = Fragment::from_frame(frame).map_err(ReassemblyError::from)?;
        self.stats.rx_fragments += 1;
        self.apply_ack(f.ack)?;
        if !self.next_in_sequence(f.seq)? {
            return Ok(());
        }
        let seq = f.seq;
        let limits = &self.cfg.limits;
        let lanes = self
            .rx
            .reassembly
            .get_or_insert_with(|| Box::new(Reassembler::for_limits(limits)));
        // An error leaves the reassembly as it was (and the link faults).
        let whole = lanes.push_checked(f, piece_crc)?;
        self.rx.in_seq = seq;
        let Some((mut msg, _)) = whole else {
            return Ok(());
        };
        self.check_call(msg.call)?;
        // Its number in the session: where it became whole.
        msg.seq = seq;
        self.delivered(msg);
        Ok(())
    }

    /// Delivers a received message once and in order: a duplicate of one
    /// delivered is dropped, a gap is a protocol error.
    fn deliver(&mut self, msg: Message) -> Result<(), ProtocolError> {
        self.check_call(msg.call)?;
        if !self.next_in_sequence(msg.seq)? {
            return Ok(());
        }
        self.rx.in_seq = msg.seq;
        self.delivered(msg);
        Ok(())
    }

    /// A message received in sequence (whole, or made whole from its
    /// fragments): counted and handed to the application.
    #[inline]
    fn delivered(&mut self, msg: Message) {
        self.stats.rx_messages += 1;
        self.stats.rx_bytes += msg.payload_len() as u64;
        self.events.push_message(msg);
    }

    /// Refuses a call (or an RMA operation) on a link that did not agree
    /// to them.
    #[inline]
    fn check_call(&self, call: u64) -> Result<(), ProtocolError> {
        if call_allowed(call, self.remote.features) {
            return Ok(());
        }
        Err(ProtocolError::Malformed {
            what: "message",
            detail: "a call (or an RMA operation) on a link that did not agree to them".into(),
        })
    }

    /// Whether `seq` (a message's or a fragment's) is the next to
    /// receive: `false` for a duplicate of one received (counted), a gap
    /// is a protocol error.
    #[inline]
    fn next_in_sequence(&mut self, seq: u64) -> Result<bool, ProtocolError> {
        if seq <= self.rx.in_seq {
            self.stats.duplicates += 1;
            return Ok(false);
        }
        if seq != self.rx.in_seq + 1 {
            return Err(ProtocolError::SequenceGap {
                last: self.rx.in_seq,
                got: seq,
            });
        }
        Ok(true)
    }
}

/// The incoming side: what was received and what this side acknowledged.
#[derive(Debug, Default)]
pub(super) struct Incoming {
    /// The last sequence number received in order.
    pub(super) in_seq: u64,
    /// The last sequence number this side acknowledged.
    pub(super) acked_in_seq: u64,
    /// While something received is unacknowledged: when an `Ack` frame
    /// of its own must go at the latest, if no message carried it
    /// first (`SessionConfig::ack_delay` after the first such arrival).
    /// (`None` with something unacknowledged: at once.)
    pub(super) ack_due: Option<Instant>,
    /// Bytes of the units received since the last ack went out.
    pub(super) unacked_bytes: usize,
    /// When the last unit that moved `in_seq` on arrived: one arriving
    /// within `ack_delay` of it is part of a stream, whose acks wait.
    pub(super) last_arrival: Option<Instant>,
    /// The owner holds back reading (a throttle): silence is not the peer's.
    pub(super) paused: bool,
    /// Messages arriving in fragments, per class (made at the first).
    pub(super) reassembly: Option<Box<Reassembler>>,
}

impl Incoming {
    /// Numbers from 0 again (the peer lost the session).
    pub(super) fn restart(&mut self) {
        self.in_seq = 0;
        self.acked_in_seq = 0;
        self.ack_due = None;
        self.unacked_bytes = 0;
        self.last_arrival = None;
        self.reassembly = None;
    }

    /// A unit of `len` bytes moved `in_seq` on at `now`: its ack is due
    /// `delay` after the first unacknowledged arrival of a stream (units
    /// at most `delay` apart), at once for one after a silence — a lone
    /// request, the last messages before a close — so that whoever waits
    /// for that ack waits no longer than before.
    pub(super) fn arrived_unacked(&mut self, len: usize, now: Instant, delay: Duration) {
        self.unacked_bytes += len;
        let streaming = self.last_arrival.is_some_and(|t| now < t + delay);
        self.last_arrival = Some(now);
        let due = if streaming { now + delay } else { now };
        self.ack_due = Some(self.ack_due.map_or(due, |d| d.min(due)));
    }

    /// What went out carries the ack of everything received.
    #[inline]
    pub(super) fn acked(&mut self) {
        self.acked_in_seq = self.in_seq;
        self.ack_due = None;
        self.unacked_bytes = 0;
    }
}
