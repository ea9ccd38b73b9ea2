//! Device-free tests of the verbs and rdma_cm backends.

use super::*;

/// On a host without RDMA (this project's development machines) the
/// backends say why they cannot run, in words an operator can act on.
#[test]
fn unavailable_without_a_device_says_why() {
    if std::path::Path::new("/dev/infiniband/uverbs0").exists() {
        return; // a machine with a device: nothing to check
    }
    for kind in [TransportKind::Verbs, TransportKind::RdmaCm] {
        match crate::availability(&kind) {
            crate::Availability::Unavailable(reason) => {
                assert!(reason.contains("no RDMA device"), "{reason}")
            }
            crate::Availability::Available => panic!("{kind:?} available without a device"),
        }
        let poll = mio::Poll::new().unwrap();
        let ctx = TransportContext::new(FrameLimits::default());
        match crate::open_transport(&kind, poll.registry(), &ctx) {
            Err(TransportError::Unavailable { reason, .. }) => {
                assert!(reason.contains("no RDMA device"), "{reason}")
            }
            Err(e) => panic!("unexpected error: {e}"),
            Ok(_) => panic!("opened {kind:?} without a device"),
        }
    }
}

#[test]
fn link_params_round_trip_and_reject_mismatches() {
    let p = LinkParams {
        credits: 32,
        chunk: 32 << 10,
        rd_atomic: 8,
    };
    assert_eq!(LinkParams::decode(&p.encode(), 32 << 10).unwrap(), p);
    // iWARP may pad private data.
    let mut padded = p.encode().to_vec();
    padded.extend_from_slice(&[0; 40]);
    assert_eq!(LinkParams::decode(&padded, 32 << 10).unwrap(), p);
    assert!(LinkParams::decode(&p.encode(), 16 << 10).is_err());
    assert!(LinkParams::decode(&p.encode()[..10], 32 << 10).is_err());
    let zero = LinkParams { credits: 0, ..p };
    assert!(LinkParams::decode(&zero.encode(), 32 << 10).is_err());
}

#[test]
fn parts_cover_the_unit() {
    // Pure logic of cutting units into parts (no device needed).
    let b = Bytes::from((0..100_000u32).map(|i| i as u8).collect::<Vec<_>>());
    let max = (32 << 10) - HDR;
    let n = b.len().div_ceil(max);
    let mut joined = Vec::new();
    let mut rest = b.clone();
    for i in 0..n {
        let part = rest.split_to(rest.len().min(max));
        assert_eq!(i + 1 < n, !rest.is_empty());
        joined.extend_from_slice(&part);
    }
    assert_eq!(joined, b);
}
