//! Test fixtures that the tests of both transports run (the MSG ones in
//! `msg`, the RDM ones in [`super::rdm`]): a transport driven as a worker
//! drives it, frames to send and checks on what arrives, and scenarios each
//! transport runs on its own endpoints. Also the test of the shared
//! provider probe.

use std::time::{Duration, Instant};

use bytes::Bytes;
use mio::Token;
use msgr_addr::{EntityAddr, FabricProvider};
use msgr_proto::banner::BANNER_LEN;
use msgr_proto::{Frame, Inbound, LinkId, Transmit};

use super::{probe, rdm};
use crate::{Availability, FabricRendezvous, Transport, TransportEvent};

/// A gauge or counter of `t`'s stats.
pub(crate) fn stat<T: Transport>(t: &T, name: &str) -> u64 {
    t.stats()
        .values
        .iter()
        .find(|(n, _)| *n == name)
        .map_or_else(|| panic!("no stat {name}"), |&(_, v)| v)
}

/// The link the first `Accepted` among `events` names.
pub(crate) fn accepted(events: &[TransportEvent]) -> Option<LinkId> {
    events.iter().find_map(|e| match e {
        TransportEvent::Accepted { link, .. } => Some(*link),
        _ => None,
    })
}

/// Runs `t` as a worker would until `until` holds (at most 20 s).
pub(crate) fn drive<T: Transport>(
    t: &mut T,
    poll: &mut mio::Poll,
    until: impl Fn(&[TransportEvent]) -> bool,
) -> Vec<TransportEvent> {
    drive_within(t, poll, Duration::from_secs(20), until)
        .unwrap_or_else(|events| panic!("timed out: {events:?}"))
}

/// [`drive`] for at most `within`: `Err` with the events so far if
/// `until` did not hold by then.
pub(crate) fn drive_within<T: Transport>(
    t: &mut T,
    poll: &mut mio::Poll,
    within: Duration,
    until: impl Fn(&[TransportEvent]) -> bool,
) -> Result<Vec<TransportEvent>, Vec<TransportEvent>> {
    let mut events = Vec::new();
    let mut ready = mio::Events::with_capacity(16);
    let deadline = std::time::Instant::now() + within;
    while !until(&events) {
        if std::time::Instant::now() >= deadline {
            return Err(events);
        }
        if !t.progress(std::time::Instant::now(), &mut events) && t.arm() {
            let mut timeout = std::time::Duration::from_millis(50);
            if let Some(at) = t.wake_at() {
                timeout = timeout.min(at.saturating_duration_since(std::time::Instant::now()));
            }
            poll.poll(&mut ready, Some(timeout)).unwrap();
            for ev in ready.iter() {
                t.ready(ev, std::time::Instant::now(), &mut events);
            }
        }
        t.flush(std::time::Instant::now(), &mut events);
    }
    Ok(events)
}

/// A frame well above the rendezvous threshold: a header, an empty
/// front and 300 000 bytes counting up.
pub(crate) fn large_frame() -> Frame {
    let data: Vec<u8> = (0..300_000u32).map(|i| i as u8).collect();
    let parts = vec![Bytes::from_static(b"header"), Bytes::new(), data.into()];
    Frame::new(msgr_proto::Tag::Message, parts)
}

/// A small frame `i`: a header, an empty front and 64 bytes of `i`.
pub(crate) fn small_frame(i: u8) -> Frame {
    let parts = vec![
        Bytes::from_static(b"header"),
        Bytes::new(),
        vec![i; 64].into(),
    ];
    Frame::new(msgr_proto::Tag::Message, parts)
}

/// Checks that `events` are a banner of 7s and then `n` small frames
/// 0, 1, … ([`small_frame`]), all received on `link`.
pub(crate) fn in_order(events: &[TransportEvent], link: LinkId, n: usize) {
    assert_eq!(events.len(), n + 1, "{events:?}");
    assert!(
        matches!(&events[0], TransportEvent::Received(l, Inbound::Banner(b)) if *l == link && b[0] == 7),
        "{events:?}"
    );
    for (i, e) in events[1..].iter().enumerate() {
        match e {
            TransportEvent::Received(l, Inbound::Frame(got)) if *l == link => {
                assert_eq!(got.segments[2][..], [i as u8; 64], "unit {i}");
            }
            other => panic!("unit {i}: {other:?}"),
        }
    }
}

/// Sends `n` small frames 0, 1, … ([`small_frame`]) on `link`, with no
/// poll in between.
pub(crate) fn send_small_frames<T: Transport>(t: &mut T, link: LinkId, n: usize) {
    for i in 0..n {
        t.send(link, Transmit::Frame(small_frame(i as u8))).unwrap();
    }
}

/// Polls `t` (progress only, no flush) until it reports something; at
/// most 20 s.
pub(crate) fn progress_until_events<T: Transport>(t: &mut T) -> Vec<TransportEvent> {
    let mut events = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while events.is_empty() {
        assert!(Instant::now() < deadline, "nothing received");
        t.progress(Instant::now(), &mut events);
    }
    events
}

/// A large unit whose descriptor was staged while the link could post
/// nothing more — `eager` small frames after the banner, sent with no
/// poll in between, hold every transmit slot (MSG) or credit (RDM) —
/// leaves as soon as one frees, though nothing is queued behind it to
/// mark the link (`staged` checks that it waits outside the queue).
/// It must not wait for a later send, nor (RDM) the keepalive a second
/// later: everything arrives within half of [`rdm::KEEP_AFTER`], the
/// large unit intact.
pub(crate) fn staged_descriptor_goes_when_a_slot_frees<T: Transport>(
    t: &mut T,
    poll: &mut mio::Poll,
    (client, server): (LinkId, LinkId),
    eager: usize,
    staged: impl Fn(&T) -> bool,
) {
    let big = large_frame();
    let want = big.encode_to_vec().unwrap();
    t.send(client, Transmit::Banner([7; BANNER_LEN])).unwrap();
    send_small_frames(t, client, eager);
    t.send(client, Transmit::Frame(big)).unwrap();
    // The worker's flush at the end of the pass that sent them, before
    // any completion is reaped: it finds nothing it can post.
    let mut early = Vec::new();
    t.flush(Instant::now(), &mut early);
    assert!(early.is_empty(), "{early:?}");
    assert!(staged(t), "the descriptor is not waiting outside the queue");
    let n = eager + 2;
    let received = |events: &[TransportEvent]| {
        events
            .iter()
            .filter(|e| matches!(e, TransportEvent::Received(l, _) if *l == server))
            .count()
    };
    let events = drive_within(t, poll, rdm::KEEP_AFTER / 2, |e| received(e) >= n)
        .unwrap_or_else(|events| panic!("{} of {n} units arrived: {events:?}", received(&events)));
    let last = events
        .iter()
        .filter_map(|e| match e {
            TransportEvent::Received(l, Inbound::Frame(f)) if *l == server => Some(f),
            _ => None,
        })
        .last()
        .expect("frames received");
    assert_eq!(last.encode_to_vec().unwrap(), want, "large unit corrupted");
}

/// Large units between an end with the rendezvous reads (`reader`) and
/// one without (`plain`, as under a libfabric that withholds them),
/// either end dialling: the reader learns at set-up that its peer does
/// not read and sends through the slots (a descriptor would fail the
/// link), and the frame arrives intact both ways. `addr`: a loopback
/// address with port 0 of the transports' kind.
/// `in_place`: whether the eager pieces of the large segment are sent
/// from the application's bytes ([`super::IN_PLACE_MIN`]; not over shm, whose
/// pieces are smaller).
pub(crate) fn large_units_to_a_peer_that_does_not_read<T: Transport>(
    open: impl Fn(FabricRendezvous) -> T,
    addr: &str,
    in_place: bool,
) {
    let any: EntityAddr = addr.parse().unwrap();
    let big = large_frame();
    let want = big.encode_to_vec().unwrap();
    for reader_dials in [true, false] {
        let (mut reader, mut plain) = (open(FabricRendezvous::On), open(FabricRendezvous::Off));
        let mut ev = [Vec::new(), Vec::new()];
        // Both ends run as workers would until `until` holds (20 s at most).
        let pump = |reader: &mut T,
                    plain: &mut T,
                    ev: &mut [Vec<TransportEvent>; 2],
                    until: &dyn Fn(&[Vec<TransportEvent>; 2]) -> bool| {
            let deadline = Instant::now() + Duration::from_secs(20);
            while !until(ev) {
                assert!(Instant::now() < deadline, "{addr}: timed out: {ev:?}");
                let now = Instant::now();
                let busy = reader.progress(now, &mut ev[0]) | plain.progress(now, &mut ev[1]);
                reader.flush(now, &mut ev[0]);
                plain.flush(now, &mut ev[1]);
                if !busy {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        };
        let token = Token(crate::LISTENER_TOKEN_BASE);
        let bound = if reader_dials {
            plain.listen(&any, token)
        } else {
            reader.listen(&any, token)
        }
        .unwrap();
        let (dialler, listener) = if reader_dials { (0, 1) } else { (1, 0) };
        if reader_dials {
            reader.connect(LinkId(1000), &bound).unwrap();
        } else {
            plain.connect(LinkId(1000), &bound).unwrap();
        }
        pump(&mut reader, &mut plain, &mut ev, &|ev| {
            ev[dialler]
                .iter()
                .any(|e| matches!(e, TransportEvent::Connected(LinkId(1000))))
                && accepted(&ev[listener]).is_some()
        });
        let served = accepted(&ev[listener]).unwrap();
        let (at_reader, at_plain) = if reader_dials {
            (LinkId(1000), served)
        } else {
            (served, LinkId(1000))
        };
        ev = [Vec::new(), Vec::new()];
        // A link's first unit is its banner.
        reader
            .send(at_reader, Transmit::Banner([7; BANNER_LEN]))
            .unwrap();
        reader
            .send(at_reader, Transmit::Frame(big.clone()))
            .unwrap();
        plain
            .send(at_plain, Transmit::Banner([7; BANNER_LEN]))
            .unwrap();
        plain.send(at_plain, Transmit::Frame(big.clone())).unwrap();
        let got = |e: &[TransportEvent], link: LinkId| {
            e.iter().find_map(|e| match e {
                TransportEvent::Received(l, Inbound::Frame(f)) if *l == link => {
                    Some(f.encode_to_vec().unwrap())
                }
                _ => None,
            })
        };
        pump(&mut reader, &mut plain, &mut ev, &|ev| {
            got(&ev[0], at_reader).is_some() && got(&ev[1], at_plain).is_some()
        });
        assert_eq!(
            got(&ev[1], at_plain).unwrap(),
            want,
            "{addr}: at the end without reads"
        );
        assert_eq!(
            got(&ev[0], at_reader).unwrap(),
            want,
            "{addr}: at the reader"
        );
        let failed: Vec<_> = ev
            .iter()
            .flatten()
            .filter(|e| matches!(e, TransportEvent::Failed(..) | TransportEvent::Corrupt(..)))
            .collect();
        assert!(failed.is_empty(), "{addr}: {failed:?}");
        assert_eq!(stat(&reader, "rendezvous_enabled"), 1, "{addr}");
        assert_eq!(
            stat(&reader, "rendezvous_sent"),
            0,
            "{addr}: offered to a peer that does not read (reader dials: {reader_dials})"
        );
        assert_eq!(
            stat(&plain, "pieces_in_place") > 0,
            in_place,
            "{addr}: pieces sent in place: {}",
            stat(&plain, "pieces_in_place")
        );
    }
}

/// The CQ's wait fd is in the worker's Poll only while the worker
/// sleeps ([`super::wait_fd`]): an armed end is woken by a message, and an end
/// that has polled its queues since gets no readiness for the next one
/// (it reads the CQ itself; kept in the Poll, the fd made every arriving
/// message cost ~0.5 µs over `tcp`). `open` makes a transport on a Poll,
/// `cq` says its CQ's token; `addr`: a loopback address with port 0.
pub(crate) fn cq_fd_in_the_poll_only_while_asleep<T: Transport>(
    open: impl Fn(&mio::Poll) -> T,
    cq: impl Fn(&T) -> Token,
    addr: &str,
) {
    let mut polls = [mio::Poll::new().unwrap(), mio::Poll::new().unwrap()];
    let (mut tx, mut rx) = (open(&polls[0]), open(&polls[1]));
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut ev = [Vec::new(), Vec::new()];
    // Both ends spin until `until` holds.
    let spin = |tx: &mut T,
                rx: &mut T,
                ev: &mut [Vec<TransportEvent>; 2],
                until: &dyn Fn(&[Vec<TransportEvent>; 2]) -> bool| {
        while !until(ev) {
            assert!(Instant::now() < deadline, "{addr}: timed out: {ev:?}");
            let now = Instant::now();
            tx.progress(now, &mut ev[0]);
            rx.progress(now, &mut ev[1]);
            tx.flush(now, &mut ev[0]);
            rx.flush(now, &mut ev[1]);
        }
    };
    // Whether `rx`'s Poll reports its CQ within `wait`, while only `tx` runs.
    let mut woken = |tx: &mut T, rx: &T, ev: &mut [Vec<TransportEvent>; 2], wait: Duration| {
        let mut ready = mio::Events::with_capacity(16);
        let until = Instant::now() + wait;
        while Instant::now() < until {
            tx.progress(Instant::now(), &mut ev[0]);
            tx.flush(Instant::now(), &mut ev[0]);
            polls[1]
                .poll(&mut ready, Some(Duration::from_millis(10)))
                .unwrap();
            if ready.iter().any(|e| e.token() == cq(rx)) {
                return true;
            }
        }
        false
    };
    let frames = |e: &[TransportEvent]| {
        e.iter()
            .filter(|e| matches!(e, TransportEvent::Received(_, Inbound::Frame(_))))
            .count()
    };
    let token = Token(crate::LISTENER_TOKEN_BASE);
    let bound = rx.listen(&addr.parse().unwrap(), token).unwrap();
    tx.connect(LinkId(1000), &bound).unwrap();
    spin(&mut tx, &mut rx, &mut ev, &|ev| {
        ev[0]
            .iter()
            .any(|e| matches!(e, TransportEvent::Connected(_)))
            && accepted(&ev[1]).is_some()
    });
    tx.send(LinkId(1000), Transmit::Banner([7; BANNER_LEN]))
        .unwrap();
    spin(&mut tx, &mut rx, &mut ev, &|ev| ev[1].len() > 1);
    // The receiver goes to sleep.
    while !rx.arm() {
        assert!(Instant::now() < deadline, "{addr}: never armed");
        rx.progress(Instant::now(), &mut ev[1]);
        rx.flush(Instant::now(), &mut ev[1]);
    }
    tx.send(LinkId(1000), Transmit::Frame(small_frame(0)))
        .unwrap();
    assert!(
        woken(&mut tx, &rx, &mut ev, Duration::from_secs(20)),
        "{addr}: a sleeping end was not woken"
    );
    spin(&mut tx, &mut rx, &mut ev, &|ev| frames(&ev[1]) == 1);
    // Awake and spinning: no readiness, though the message arrives.
    tx.send(LinkId(1000), Transmit::Frame(small_frame(1)))
        .unwrap();
    assert!(
        !woken(&mut tx, &rx, &mut ev, Duration::from_millis(300)),
        "{addr}: a spinning end's Poll reports its CQ"
    );
    spin(&mut tx, &mut rx, &mut ev, &|ev| frames(&ev[1]) == 2);
}

#[test]
fn missing_provider_is_named() {
    match probe(&FabricProvider::new("nosuchprov")) {
        Availability::Unavailable(r) => assert!(r.contains("nosuchprov"), "{r}"),
        Availability::Available => panic!("nosuchprov available"),
    }
}

/// Listens on `addr` (a loopback address with port 0 of its kind) and
/// connects `LinkId(1000)` to it: the accepted end's link, once both are
/// up.
fn link_to_itself<T: Transport>(t: &mut T, poll: &mut mio::Poll, addr: &str) -> LinkId {
    let any: EntityAddr = addr.parse().unwrap();
    let bound = t.listen(&any, Token(crate::LISTENER_TOKEN_BASE)).unwrap();
    t.connect(LinkId(1000), &bound).unwrap();
    let ev = drive(t, poll, |ev| {
        ev.iter()
            .any(|e| matches!(e, TransportEvent::Connected(LinkId(1000))))
            && accepted(ev).is_some()
    });
    accepted(&ev).unwrap()
}

/// Sends one payload (a clone of the same `Bytes`) again and again and
/// one of equal bytes elsewhere, each a unit large enough for the
/// rendezvous, over a link `t` (registered in `poll`) makes to itself on
/// `addr` (a loopback address with port 0 of its kind). Where `kept` (the
/// endpoints read and the provider checks keys) the payload is registered
/// by its first send only and the other anew; elsewhere nothing is kept.
/// Every unit arrives intact and no exposure outlives its read.
pub(crate) fn a_payload_sent_again_is_registered_once<T: Transport>(
    mut t: T,
    poll: &mut mio::Poll,
    addr: &str,
    kept: bool,
) {
    let served = link_to_itself(&mut t, poll, addr);
    t.send(LinkId(1000), Transmit::Banner([7; BANNER_LEN]))
        .unwrap();
    let data: Bytes = (0..300_000u32)
        .map(|i| (i * 7) as u8)
        .collect::<Vec<_>>()
        .into();
    let elsewhere = Bytes::from(data.to_vec());
    let got = |ev: &[TransportEvent]| {
        ev.iter().find_map(|e| match e {
            TransportEvent::Received(l, Inbound::Frame(f)) if *l == served => {
                Some(f.encode_to_vec().unwrap())
            }
            _ => None,
        })
    };
    for (i, payload) in [&data, &data, &elsewhere, &data].into_iter().enumerate() {
        let parts = vec![Bytes::from_static(b"header"), Bytes::new(), payload.clone()];
        let unit = Frame::new(msgr_proto::Tag::Message, parts);
        let want = unit.encode_to_vec().unwrap();
        t.send(LinkId(1000), Transmit::Frame(unit)).unwrap();
        let ev = drive(&mut t, poll, |ev| got(ev).is_some());
        assert!(got(&ev) == Some(want), "{addr}: unit {i} not intact");
    }
    // The sender lets each exposure go once told it was read.
    let deadline = Instant::now() + Duration::from_secs(10);
    while stat(&t, "rendezvous_exposed") > 0 {
        assert!(Instant::now() < deadline, "{addr}: a unit still exposed");
        let mut events = Vec::new();
        t.progress(Instant::now(), &mut events);
        t.flush(Instant::now(), &mut events);
        assert!(events.is_empty(), "{addr}: {events:?}");
    }
    assert_eq!(stat(&t, "rendezvous_sent"), 4, "{addr}");
    assert_eq!(stat(&t, "rendezvous_fallbacks"), 0, "{addr}");
    let cache = [
        stat(&t, "reg_cache_hits"),
        stat(&t, "reg_cache_misses"),
        stat(&t, "reg_cache_bytes"),
    ];
    let want = if kept {
        [2, 2, 2 * data.len() as u64]
    } else {
        [0, 0, 0]
    };
    assert_eq!(cache, want, "{addr}: hits, misses, bytes");
}

/// Applications' one-sided reads ([`Transport::rma_expose`],
/// [`Transport::rma_read`]; `msgr::rma`): a region opened on the link
/// `addr` sets up is read in ranges, many at once, byte for byte; a key
/// for the same region comes back the same; a range outside it is
/// refused before anything is posted; once the region is withdrawn
/// ([`Transport::rma_unexpose`]) no read returns its bytes. Where the
/// endpoint has no native reads (`native` false) nothing is opened.
pub(crate) fn user_reads_of_an_exposed_region<T: Transport>(
    mut t: T,
    poll: &mut mio::Poll,
    addr: &str,
    native: bool,
) {
    let owner = link_to_itself(&mut t, poll, addr);
    let mem = crate::RegionMemory::new((0..(1u32 << 20)).map(|i| (i % 251) as u8).collect());
    let region = mem.view();
    let rw = msgr_proto::rma::Access::ReadWrite;
    let key = t.rma_expose(owner, 5, &mem, rw);
    assert_eq!(key.is_some(), native, "{addr}: native reads");
    let Some(key) = key else {
        let refused = t.rma_read(LinkId(1000), &[0; 48], 0, 1, 1);
        assert!(refused.is_err(), "{addr}: a read without native reads");
        return;
    };
    assert_eq!(
        t.rma_expose(owner, 5, &mem, rw),
        Some(key.clone()),
        "{addr}"
    );
    let refused = t.rma_write(LinkId(1000), &key, 0, &Bytes::from_static(b"x"), 1);
    assert!(refused.is_err(), "{addr}: native writes are the owner's");
    let ranges: Vec<(u64, u64)> = (0..8u64).map(|i| (i * 70_001, 4096 + i * 9_000)).collect();
    for (token, &(offset, len)) in ranges.iter().enumerate() {
        t.rma_read(LinkId(1000), &key, offset, len, token as u64)
            .unwrap_or_else(|e| panic!("{addr}: read {token}: {e}"));
    }
    let reads = |ev: &[TransportEvent]| {
        ev.iter()
            .filter(|e| matches!(e, TransportEvent::RmaRead { .. }))
            .count()
    };
    let ev = drive(&mut t, poll, |ev| reads(ev) == ranges.len());
    for e in &ev {
        if let TransportEvent::RmaRead {
            link,
            token,
            result,
        } = e
        {
            assert_eq!(*link, LinkId(1000));
            let (offset, len) = ranges[*token as usize];
            let want = &region[offset as usize..(offset + len) as usize];
            match result {
                Ok(got) => assert!(got[..] == *want, "{addr}: read {token} not intact"),
                Err(e) => panic!("{addr}: read {token}: {e}"),
            }
        }
    }
    let outside = t.rma_read(LinkId(1000), &key, region.len() as u64 - 10, 11, 99);
    assert!(outside.is_err(), "{addr}: a range past the end");
    assert!(t.rma_read(LinkId(1000), &key[1..], 0, 1, 99).is_err());
    // Withdrawn: a read of it fails (or its link does), never Ok.
    t.rma_unexpose(5);
    if t.rma_read(LinkId(1000), &key, 0, 4096, 100).is_ok() {
        let ended = |ev: &[TransportEvent]| {
            ev.iter().any(|e| {
                matches!(
                    e,
                    TransportEvent::RmaRead { token: 100, .. } | TransportEvent::Failed(..)
                )
            })
        };
        let ev = drive(&mut t, poll, ended);
        for e in &ev {
            if let TransportEvent::RmaRead {
                token: 100, result, ..
            } = e
            {
                assert!(result.is_err(), "{addr}: a withdrawn region read");
            }
        }
    }
}
