//! One-sided RMA over real loopback sockets: reads and writes of exposed
//! regions (blocking, async, checksummed), every refusal the owner makes
//! (forged capability, another peer, out of range, rights, revoked,
//! dropped), exactly-once across link faults on a lossless connection, a
//! reset failing what a lossy one had in flight, and secure mode.

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use msgr::{
    Access, CallError, Connection, EntityName, Messenger, NullDispatcher, Policy, RealFault,
    RmaError, RmaHandle, RmaOp, RmaOptions,
};

const T: Duration = Duration::from_secs(30);

/// An owner (server.1) and a peer (client.N) connected to it.
fn pair(n: u64, policy: Policy) -> (Messenger, Messenger, Connection) {
    let owner = server(fast_config(), Arc::new(NullDispatcher));
    let peer = client_named(n, fast_config(), Arc::new(NullDispatcher));
    let conn = peer
        .connect_with(owner.addr().expect("bound"), policy)
        .unwrap();
    conn.wait_connected(T).unwrap();
    (owner, peer, conn)
}

fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn refused(owner: &Messenger) -> u64 {
    owner.counters().rma_refused.load(Ordering::Relaxed)
}

#[test]
fn reads_and_writes_move_the_bytes_asked() {
    let (owner, _peer, conn) = pair(1, Policy::LosslessClient);
    let original = noise(3 << 20, 1);
    let region = owner.expose(original.clone(), Access::ReadWrite);
    let h = region.handle();
    assert_eq!(h.len, 3 << 20);
    // Every size class: empty, small, a batch entry's, a message's own
    // frame, megabytes; at the ends of the region too.
    for (offset, len) in [
        (0, 0),
        (0, 1),
        (5, 64),
        (1000, 4096),
        (3 << 19, 1 << 20),
        ((3 << 20) - 7, 7),
        (0, 3 << 20),
    ] {
        let got = conn.read(&h, offset, len, T).unwrap();
        assert_eq!(
            &got[..],
            &original[offset as usize..(offset + len) as usize]
        );
        let checked = conn
            .read(&h, offset, len, RmaOptions::from(T).checksum())
            .unwrap();
        assert_eq!(got, checked);
    }
    let mut buf = vec![0u8; 100];
    conn.read_into(&h, 200, &mut buf, T).unwrap();
    assert_eq!(buf[..], original[200..300]);

    let fresh = noise(1 << 20, 2);
    conn.write(&h, 12345, fresh.clone(), T).unwrap();
    conn.write(&h, 7, &b"abc"[..], RmaOptions::from(T).checksum())
        .unwrap();
    let bytes = region.bytes();
    assert_eq!(bytes[12345..12345 + (1 << 20)], fresh[..]);
    assert_eq!(&bytes[7..10], b"abc");
    assert_eq!(bytes[..7], original[..7]);
    drop(bytes);
    // The owner's own changes are what peers read next.
    region.bytes_mut()[0] = 0xee;
    assert_eq!(&conn.read(&h, 0, 1, T).unwrap()[..], &[0xee]);
    let c = owner.counters();
    assert_eq!(c.rma_writes_served.load(Ordering::Relaxed), 2);
    // 16 reads, the two of 3 MiB in three parts each (rma_part_bytes).
    assert_eq!(c.rma_reads_served.load(Ordering::Relaxed), 20);
    assert_eq!(refused(&owner), 0);
    let back = region.revoke();
    assert_eq!(back.len(), 3 << 20);
    assert_eq!(back[7..10], *b"abc");
}

#[test]
fn async_reads_and_writes_many_in_flight() {
    let (owner, _peer, conn) = pair(1, Policy::LosslessClient);
    let region = owner.expose(vec![0u8; 64 << 10], Access::ReadWrite);
    let h = region.handle();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        // 64 writes of 1 KiB in flight at once, then 64 reads.
        let writes: Vec<_> = (0..64u64)
            .map(|i| conn.write_async(&h, i * 1024, vec![i as u8; 1024], T))
            .collect();
        for w in writes {
            w.await.unwrap();
        }
        let reads: Vec<_> = (0..64u64)
            .map(|i| conn.read_async(&h, i * 1024, 1024, RmaOptions::from(T).checksum()))
            .collect();
        for (i, r) in reads.into_iter().enumerate() {
            assert!(r.await.unwrap().iter().all(|&b| b == i as u8));
        }
        // A refusal before sending comes out of the future too.
        let r = conn.read_async(&h, 64 << 10, 1, T).await;
        assert!(matches!(r, Err(RmaError::OutOfRange { .. })), "{r:?}");
    });
}

#[test]
fn the_owner_refuses_what_the_handle_does_not_allow() {
    let (owner, peer, conn) = pair(1, Policy::LosslessClient);
    let ro = owner.expose(noise(4096, 3), Access::Read);
    let wo = owner.expose(vec![0u8; 4096], Access::Write);
    let h = ro.handle();

    // Caught before sending: the handle's own rights and length.
    assert_eq!(
        conn.write(&h, 0, &b"x"[..], T),
        Err(RmaError::Forbidden(RmaOp::Write))
    );
    assert!(matches!(
        conn.read(&h, 4000, 97, T),
        Err(RmaError::OutOfRange {
            region_len: 4096,
            ..
        })
    ));
    assert!(matches!(
        conn.read(&h, u64::MAX, 2, T),
        Err(RmaError::OutOfRange { .. })
    ));
    assert_eq!(
        conn.read(&wo.handle(), 0, 1, T),
        Err(RmaError::Forbidden(RmaOp::Read))
    );
    assert_eq!(refused(&owner), 0, "nothing reached the owner");

    // Handles a peer forged: the owner checks everything itself.
    let forged = |f: &dyn Fn(&mut RmaHandle)| {
        let mut h = ro.handle();
        f(&mut h);
        h
    };
    let wrong_cap = forged(&|h| h.capability[3] ^= 1);
    assert_eq!(conn.read(&wrong_cap, 0, 1, T), Err(RmaError::Denied));
    let more_rights = forged(&|h| h.access = Access::ReadWrite);
    assert_eq!(
        conn.write(&more_rights, 0, &b"x"[..], T),
        Err(RmaError::Forbidden(RmaOp::Write))
    );
    let longer = forged(&|h| h.len = 1 << 30);
    assert!(matches!(
        conn.read(&longer, 4096, 1, T),
        Err(RmaError::OutOfRange { .. })
    ));
    let no_region = forged(&|h| h.region = 999_999);
    assert_eq!(conn.read(&no_region, 0, 1, T), Err(RmaError::UnknownRegion));
    assert_eq!(refused(&owner), 4);
    assert!(
        ro.bytes().iter().eq(noise(4096, 3).iter()),
        "the read-only region changed"
    );

    // Exposed to another peer only: the handle alone does not do.
    let theirs = owner.expose_to(vec![1u8; 16], Access::ReadWrite, &[EntityName::client(2)]);
    assert_eq!(conn.read(&theirs.handle(), 0, 1, T), Err(RmaError::Denied));
    let (_p2, c2) = {
        let p2 = client_named(2, fast_config(), Arc::new(NullDispatcher));
        let c2 = p2.connect(owner.addr().expect("bound")).unwrap();
        (p2, c2)
    };
    assert_eq!(&c2.read(&theirs.handle(), 0, 2, T).unwrap()[..], &[1, 1]);

    // Revoked, then dropped: later operations fail, the buffer comes back.
    let h = ro.handle();
    assert_eq!(conn.read(&h, 0, 4, T).unwrap().len(), 4);
    let back = ro.revoke();
    assert_eq!(back, noise(4096, 3));
    assert_eq!(conn.read(&h, 0, 4, T), Err(RmaError::Revoked));
    let hw = wo.handle();
    drop(wo);
    assert_eq!(conn.write(&hw, 0, &b"late"[..], T), Err(RmaError::Revoked));
    assert_eq!(refused(&owner), 7);
    drop(peer);
}

/// A lossless connection whose link is aborted again and again while
/// writes and reads run: every write served exactly once, every read's
/// bytes right, the region as the writes left it.
#[test]
fn operations_are_exactly_once_across_link_faults() {
    let (owner, _peer, conn) = pair(1, Policy::LosslessClient);
    const BLOCKS: u64 = 400;
    const BLOCK: u64 = 3000;
    let region = owner.expose(vec![0u8; (BLOCKS * BLOCK) as usize], Access::ReadWrite);
    let h = region.handle();
    let c2 = conn.clone();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop2 = stop.clone();
    let breaker = std::thread::spawn(move || {
        let mut n = 0;
        while !stop2.load(Ordering::Relaxed) && n < 20 {
            std::thread::sleep(Duration::from_millis(20));
            c2.inject_fault(RealFault::Abort);
            n += 1;
        }
    });
    for b in 0..BLOCKS {
        let bytes = Bytes::from(noise(BLOCK as usize, b + 10));
        conn.write(&h, b * BLOCK, bytes.clone(), RmaOptions::from(T).checksum())
            .unwrap();
        let back = conn.read(&h, b * BLOCK, BLOCK, T).unwrap();
        assert_eq!(back, bytes, "block {b}");
    }
    stop.store(true, Ordering::Relaxed);
    breaker.join().unwrap();
    let c = owner.counters();
    assert_eq!(
        c.rma_writes_served.load(Ordering::Relaxed),
        BLOCKS,
        "a write served twice or never"
    );
    assert_eq!(c.rma_reads_served.load(Ordering::Relaxed), BLOCKS);
    assert!(conn.status().faults >= 1, "no fault was injected");
    let bytes = region.bytes();
    for b in 0..BLOCKS {
        let at = (b * BLOCK) as usize;
        assert_eq!(
            bytes[at..at + BLOCK as usize],
            noise(BLOCK as usize, b + 10)[..]
        );
    }
    println!(
        "{BLOCKS} writes and reads through {} link faults; {} messages replayed",
        conn.status().faults,
        _peer.counters().replayed_messages.load(Ordering::Relaxed)
    );
}

/// On a lossy connection an operation in flight when the connection is
/// reset fails with the reset.
#[test]
fn a_reset_fails_what_a_lossy_connection_had_in_flight() {
    let (owner, _peer, conn) = pair(1, Policy::LossyClient);
    let region = owner.expose(vec![0u8; 16], Access::Read);
    let h = region.handle();
    assert_eq!(conn.read(&h, 0, 16, T).unwrap().len(), 16);
    // The owner holds its region: its worker, serving the next read,
    // waits for it, so the read stays in flight.
    let held = region.bytes_mut();
    let sent = || _peer.counters().tx_messages.load(Ordering::Relaxed);
    let before = sent();
    let c2 = conn.clone();
    let h2 = h.clone();
    let waiting = std::thread::spawn(move || c2.read(&h2, 0, 16, T));
    // In flight once its request went to the transport.
    assert!(wait_until(T, || sent() > before), "the request never left");
    conn.mark_down();
    let r = waiting.join().unwrap();
    drop(held);
    assert!(
        matches!(r, Err(RmaError::Call(CallError::Reset(_)))),
        "{r:?}"
    );
}

/// Secure mode: operations go sealed like every frame.
#[test]
fn secure_mode_carries_operations() {
    let ids = Ids::new(&[EntityName::server(1), EntityName::client(1)]);
    let owner = Messenger::builder(EntityName::server(1))
        .config(secure_config("secure"))
        .credentials(ids.creds(&EntityName::server(1)))
        .bind("tcp://127.0.0.1:0".parse().unwrap())
        .start(Arc::new(NullDispatcher))
        .unwrap();
    let peer = Messenger::builder(EntityName::client(1))
        .config(secure_config("secure"))
        .credentials(ids.creds(&EntityName::client(1)))
        .start(Arc::new(NullDispatcher))
        .unwrap();
    let region = owner.expose(noise(100_000, 5), Access::ReadWrite);
    let conn = peer.connect(owner.addr().expect("bound")).unwrap();
    let got = conn.read(&region.handle(), 0, 100_000, T).unwrap();
    assert_eq!(&got[..], &noise(100_000, 5)[..]);
    conn.write(&region.handle(), 0, &b"sealed"[..], T).unwrap();
    assert_eq!(&region.bytes()[..6], b"sealed");
}

/// Issue 60: the owner's refusal carries its own figures (the region's
/// real length, the length asked: `len` was 0 for a write, `region_len`
/// the handle's claim); a region id never exposed is not "revoked"; a read
/// larger than one message carries was refused at once, saying the limit
/// (it timed out, the owner counting `messages_too_large`; now it moves
/// in parts: `operations_larger_than_a_message_move_in_parts`).
#[test]
fn refusals_say_the_owners_figures_and_limits_at_once() {
    let (owner, _peer, conn) = pair(1, Policy::LosslessClient);
    let region = owner.expose(vec![0u8; 4096], Access::ReadWrite);
    let mut longer = region.handle();
    longer.len = 1 << 20;
    assert_eq!(
        conn.read(&longer, 4000, 200, T),
        Err(RmaError::OutOfRange {
            offset: 4000,
            len: 200,
            region_len: 4096
        })
    );
    assert_eq!(
        conn.write(&longer, 8192, vec![1u8; 100], T),
        Err(RmaError::OutOfRange {
            offset: 8192,
            len: 100,
            region_len: 4096
        })
    );
    let mut unknown = region.handle();
    unknown.region = 999_999;
    assert_eq!(conn.read(&unknown, 0, 1, T), Err(RmaError::UnknownRegion));
    let h = region.handle();
    drop(region);
    assert_eq!(conn.read(&h, 0, 1, T), Err(RmaError::Revoked));

    // The default limit is well above 1 MiB: 2 MiB moves in one request.
    let big = owner.expose(vec![7u8; 3 << 20], Access::ReadWrite);
    assert_eq!(
        conn.read(&big.handle(), 0, 2 << 20, T).unwrap().len(),
        2 << 20
    );
}

/// An owner and a peer whose messages carry at most `max_data` bytes.
fn small_pair(max_data: u32) -> (Messenger, Messenger, Connection) {
    let mut cfg = fast_config();
    cfg.set("max_data_bytes", &max_data.to_string()).unwrap();
    let owner = server(cfg.clone(), Arc::new(NullDispatcher));
    let peer = client_named(2, cfg, Arc::new(NullDispatcher));
    let conn = peer.connect(owner.addr().expect("bound")).unwrap();
    conn.wait_connected(T).unwrap();
    (owner, peer, conn)
}

/// An operation longer than one message carries moves in parts, pipelined
/// (it was refused with `TooLarge`, or timed out): reads and writes,
/// blocking and async, checksummed, verified byte for byte; at an offset
/// that is no multiple of the part.
#[test]
fn operations_larger_than_a_message_move_in_parts() {
    let part = 64 << 10;
    let (owner, _peer, conn) = small_pair(part);
    let len = 21 * part as usize + 123;
    let original = noise(len, 7);
    let region = owner.expose(original.clone(), Access::ReadWrite);
    let h = region.handle();
    let got = conn.read(&h, 0, len as u64, T).unwrap();
    assert!(got[..] == original[..], "read in parts differs");
    let checked = conn
        .read(
            &h,
            1001,
            (len - 2000) as u64,
            RmaOptions::from(T).checksum(),
        )
        .unwrap();
    assert!(checked[..] == original[1001..len - 999]);
    let served = owner.counters().rma_reads_served.load(Ordering::Relaxed);
    assert!(served >= 2 * 21, "{served} requests served");

    let fresh = noise(len - 5000, 8);
    conn.write(&h, 5000, fresh.clone(), RmaOptions::from(T).checksum())
        .unwrap();
    assert!(
        region.bytes()[5000..] == fresh[..],
        "write in parts differs"
    );
    assert!(region.bytes()[..5000] == original[..5000]);

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let back = rt
        .block_on(conn.read_async(&h, 5000, fresh.len() as u64, T))
        .unwrap();
    assert!(back[..] == fresh[..]);
    rt.block_on(conn.write_async(&h, 0, Bytes::from(original.clone()), T))
        .unwrap();
    assert!(region.bytes()[..] == original[..]);
}

/// A part that fails fails the operation at once, with a typed error
/// naming the part (here the last, out of the region the owner really
/// has); the operation's timeout is its own, not a part's.
#[test]
fn a_part_that_fails_names_itself() {
    let part = 64u64 << 10;
    let (owner, _peer, conn) = small_pair(part as u32);
    let region = owner.expose(vec![3u8; 10 * part as usize], Access::ReadWrite);
    let mut longer = region.handle();
    longer.len = 10 * part + 100;
    let started = std::time::Instant::now();
    let err = conn.read(&longer, 0, longer.len, T).unwrap_err();
    assert_eq!(
        err,
        RmaError::Part {
            offset: 10 * part,
            len: 100,
            error: Box::new(RmaError::OutOfRange {
                offset: 10 * part,
                len: 100,
                region_len: 10 * part
            })
        }
    );
    assert!(err.to_string().contains(&format!("part at {}", 10 * part)));
    let err = conn
        .write(&longer, 5, vec![1u8; (10 * part) as usize], T)
        .unwrap_err();
    assert!(
        matches!(&err, RmaError::Part { offset, error, .. }
            if *offset == 5 + 9 * part && matches!(**error, RmaError::OutOfRange { .. })),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));

    // The timeout is the operation's: it says its own length.
    let tiny = Duration::from_nanos(1);
    let err = conn.read(&longer, 0, 10 * part, tiny).unwrap_err();
    assert!(
        matches!(err, RmaError::Call(CallError::Timeout { after, .. }) if after == tiny),
        "{err}"
    );

    // A region revoked: the part that meets it says so.
    let h = region.handle();
    drop(region);
    let err = conn.read(&h, 0, h.len, T).unwrap_err();
    assert!(
        matches!(&err, RmaError::Part { error, .. } if **error == RmaError::Revoked),
        "{err}"
    );
}

/// Bytes the application holds, exposed without a copy: reads are
/// answered with slices of them (the owner copies nothing, where a region
/// it owns is copied out of for each read), of any length, checksummed;
/// read-only; revoked, the bytes come back.
#[test]
fn shared_bytes_are_read_without_a_copy() {
    let (owner, _peer, conn) = pair(3, Policy::LosslessClient);
    let copied = |m: &Messenger| m.counters().rma_bytes_copied.load(Ordering::Relaxed);
    let held = Bytes::from(noise(5 << 20, 11));
    let region = owner.expose_shared(held.clone());
    let h = region.handle();
    assert_eq!((h.len, h.access), (5 << 20, Access::Read));
    for (offset, len) in [(0u64, 1u64), (777, 64 << 10), (0, 5 << 20)] {
        let got = conn.read(&h, offset, len, T).unwrap();
        assert!(got[..] == held[offset as usize..(offset + len) as usize]);
    }
    let checked = conn
        .read(&h, 3, 100_000, RmaOptions::from(T).checksum())
        .unwrap();
    assert!(checked[..] == held[3..100_003]);
    assert_eq!(copied(&owner), 0, "the owner copied shared bytes");
    assert_eq!(
        conn.write(&h, 0, &b"no"[..], T),
        Err(RmaError::Forbidden(RmaOp::Write))
    );
    // A region the messenger owns is copied out of for each read.
    let owned = owner.expose(vec![1u8; 4096], Access::Read);
    conn.read(&owned.handle(), 0, 4096, T).unwrap();
    assert_eq!(copied(&owner), 4096);
    let back = region.revoke();
    assert_eq!(back, held);
    assert_eq!(conn.read(&h, 0, 1, T), Err(RmaError::Revoked));
}

/// Many operations, one completion: scattered reads of two regions (one
/// range in parts) and gathered writes, in flight together, blocking and
/// async; a range that fails fails the whole, naming itself.
#[test]
fn many_operations_complete_as_one() {
    let part = 64u64 << 10;
    let (owner, _peer, conn) = small_pair(part as u32);
    let a_bytes = noise(10 * part as usize, 21);
    let a = owner.expose(a_bytes.clone(), Access::ReadWrite);
    let b = owner.expose_shared(Bytes::from(noise(1000, 22)));
    let (ha, hb) = (a.handle(), b.handle());
    let ranges = [
        (&ha, 0, 10),
        (&hb, 990, 10),
        (&ha, 5, 3 * part),
        (&hb, 0, 1),
    ];
    let got = conn.read_many(ranges, T).unwrap();
    assert_eq!(got.len(), 4);
    for ((h, offset, len), bytes) in ranges.iter().zip(&got) {
        let whole: &[u8] = if h.region == ha.region {
            &a_bytes
        } else {
            b.bytes()
        };
        assert!(bytes[..] == whole[*offset as usize..(offset + len) as usize]);
    }
    let writes = (0..20u64).map(|i| (&ha, i * 1000, Bytes::from(vec![i as u8; 100])));
    conn.write_many(writes, T).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let back = rt
        .block_on(conn.read_many_async((0..20u64).map(|i| (&ha, i * 1000, 100)), T))
        .unwrap();
    for (i, r) in back.iter().enumerate() {
        assert!(r.iter().all(|&x| x == i as u8), "range {i}");
    }
    let big = Bytes::from(noise(4 * part as usize, 23));
    rt.block_on(conn.write_many_async([(&ha, 0, big.clone())], T))
        .unwrap();
    assert!(a.bytes()[..big.len()] == big[..]);

    let mut longer = hb.clone();
    longer.len = 5000;
    let err = conn
        .read_many([(&ha, 0, 10), (&longer, 2000, 10)], T)
        .unwrap_err();
    assert_eq!(
        err,
        RmaError::Part {
            offset: 2000,
            len: 10,
            error: Box::new(RmaError::OutOfRange {
                offset: 2000,
                len: 10,
                region_len: 1000
            })
        }
    );
}
