//! Property tests: every valid value round-trips through its string form and
//! through serde; no input string panics a parser; parsing is idempotent.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6};

use msgr_addr::*;
use proptest::prelude::*;

fn arb_provider_name() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "tcp",
            "shm",
            "verbs",
            "efa",
            "udp",
            "tcp;ofi_rxm",
            "verbs;ofi_rxm",
            "udp;ofi_rxd",
        ])
        .prop_map(str::to_owned),
        "[a-z0-9_]{1,12}(;[a-z0-9_]{1,12}){0,3}",
    ]
}

fn arb_endpoint() -> impl Strategy<Value = FabricEndpoint> {
    prop_oneof![Just(FabricEndpoint::Msg), Just(FabricEndpoint::Rdm)]
}

fn arb_transport() -> impl Strategy<Value = TransportKind> {
    prop_oneof![
        Just(TransportKind::Tcp),
        Just(TransportKind::Verbs),
        Just(TransportKind::RdmaCm),
        (arb_provider_name(), arb_endpoint()).prop_map(|(name, endpoint)| {
            TransportKind::Fabric(FabricProvider { name, endpoint })
        }),
    ]
}

fn arb_socket() -> impl Strategy<Value = SocketAddr> {
    prop_oneof![
        (any::<u32>(), any::<u16>())
            .prop_map(|(ip, port)| SocketAddr::from((Ipv4Addr::from(ip), port))),
        (
            any::<u128>(),
            any::<u16>(),
            prop_oneof![Just(0u32), any::<u32>()]
        )
            .prop_map(|(ip, port, scope)| SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(ip),
                port,
                0,
                scope
            ))),
        // interesting IPv6 shapes: mapped v4, loopback, unspecified
        (any::<u32>(), any::<u16>()).prop_map(|(ip, port)| {
            SocketAddr::from((IpAddr::V6(Ipv4Addr::from(ip).to_ipv6_mapped()), port))
        }),
        prop::sample::select(vec!["[::1]:6800", "[::]:0", "0.0.0.0:0", "[fe80::1%1]:1"])
            .prop_map(|s| s.parse().unwrap()),
    ]
}

fn arb_rdma() -> impl Strategy<Value = RdmaLocation> {
    (
        proptest::option::of("[A-Za-z0-9_.-]{1,64}"),
        proptest::option::of(any::<u8>()),
        proptest::option::of(any::<u8>()),
    )
        .prop_map(|(device, port, gid_index)| RdmaLocation {
            device,
            port,
            gid_index,
        })
}

/// Arbitrary *valid* addresses (every value `validate` accepts is reachable).
fn arb_addr() -> impl Strategy<Value = EntityAddr> {
    (
        arb_transport(),
        arb_socket(),
        prop_oneof![Just(0u64), any::<u64>()],
        arb_rdma(),
    )
        .prop_map(|(transport, socket, nonce, rdma)| {
            let rdma = if transport.allows_rdma_location() {
                rdma
            } else {
                RdmaLocation::default()
            };
            EntityAddr {
                transport,
                socket,
                nonce,
                rdma,
            }
        })
}

fn arb_addrvec() -> impl Strategy<Value = AddrVec> {
    prop::collection::vec(arb_addr(), 0..=MAX_ADDRVEC_ENTRIES).prop_map(AddrVec)
}

fn arb_name() -> impl Strategy<Value = EntityName> {
    (
        prop_oneof![
            Just(EntityKind::Client),
            Just(EntityKind::Server),
            Just(EntityKind::Peer)
        ],
        prop_oneof![Just(0u64), any::<u64>()],
    )
        .prop_map(|(kind, id)| EntityName { kind, id })
}

/// Arbitrary, mostly *invalid*, values: any provider/device strings, flow
/// info, RDMA details on any transport.
fn arb_any_addr() -> impl Strategy<Value = EntityAddr> {
    (
        prop_oneof![
            arb_transport(),
            (".{0,70}", arb_endpoint()).prop_map(|(name, endpoint)| TransportKind::Fabric(
                FabricProvider { name, endpoint }
            )),
        ],
        arb_socket(),
        prop_oneof![Just(0u32), any::<u32>()],
        any::<u64>(),
        (
            proptest::option::of(prop_oneof![".{0,70}", "[A-Za-z0-9_.&=?-]{0,70}"]),
            proptest::option::of(any::<u8>()),
            proptest::option::of(any::<u8>()),
        ),
    )
        .prop_map(
            |(transport, socket, flow, nonce, (device, port, gid_index))| {
                let socket = match socket {
                    SocketAddr::V6(v6) => {
                        SocketAddr::V6(SocketAddrV6::new(*v6.ip(), v6.port(), flow, v6.scope_id()))
                    }
                    v4 => v4,
                };
                EntityAddr {
                    transport,
                    socket,
                    nonce,
                    rdma: RdmaLocation {
                        device,
                        port,
                        gid_index,
                    },
                }
            },
        )
}

/// Strings built from the syntax's own alphabet, so the fuzzing reaches deep
/// into the parser instead of failing at the scheme.
fn arb_syntaxish() -> impl Strategy<Value = String> {
    let piece = prop::sample::select(vec![
        "tcp",
        "verbs",
        "rdmacm",
        "fabric+",
        "tcp;ofi_rxm",
        "://",
        ":",
        "/",
        "?",
        "&",
        "=",
        "[",
        "]",
        ",",
        "%",
        ".",
        "dev",
        "port",
        "gid",
        "ep",
        "rdm",
        "msg",
        "rxe0",
        "0",
        "1",
        "255",
        "256",
        "6800",
        "127.0.0.1",
        "::1",
        "::",
        "ffff",
        "18446744073709551616",
        "client",
        "peer",
        "é",
        "\n",
        " ",
    ]);
    prop::collection::vec(piece, 0..24).prop_map(|v| v.concat())
}

/// Valid canonical strings with random edits (cut, insert, replace).
fn arb_mutated() -> impl Strategy<Value = String> {
    (
        arb_addrvec(),
        any::<prop::sample::Index>(),
        any::<prop::sample::Index>(),
        ".{0,3}",
    )
        .prop_map(|(v, a, b, ins)| {
            let s = v.to_string();
            let chars: Vec<char> = s.chars().collect();
            let (mut i, mut j) = (a.index(chars.len() + 1), b.index(chars.len() + 1));
            if i > j {
                std::mem::swap(&mut i, &mut j);
            }
            let mut out: String = chars[..i].iter().collect();
            out.push_str(&ins);
            out.extend(&chars[j..]);
            out
        })
}

/// Parsing `s` with every parser must not panic, and whatever parses must be
/// valid and reach a fixed point after one print.
fn check_parsers(s: &str) -> Result<(), TestCaseError> {
    if let Ok(a) = s.parse::<EntityAddr>() {
        prop_assert_eq!(a.validate(), Ok(()));
        let c = a.to_string();
        prop_assert_eq!(c.parse::<EntityAddr>(), Ok(a.clone()));
        prop_assert_eq!(c.parse::<EntityAddr>().map(|x| x.to_string()), Ok(c));
    }
    if let Ok(v) = s.parse::<AddrVec>() {
        prop_assert_eq!(v.validate(), Ok(()));
        prop_assert_eq!(v.to_string().parse::<AddrVec>(), Ok(v));
    }
    if let Ok(n) = s.parse::<EntityName>() {
        prop_assert_eq!(n.to_string().parse::<EntityName>(), Ok(n));
    }
    let _ = serde_json::from_str::<EntityAddr>(&serde_json::to_string(s).unwrap());
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn addr_roundtrips(a in arb_addr()) {
        prop_assert_eq!(a.validate(), Ok(()));
        let s = a.to_string();
        prop_assert!(s.len() < 256, "{} is {} bytes", s, s.len());
        let back: EntityAddr = s.parse().map_err(|e| TestCaseError::fail(format!("{s:?}: {e}")))?;
        prop_assert_eq!(&back, &a);
        prop_assert_eq!(back.to_string(), s);
        let j = serde_json::to_string(&a).unwrap();
        prop_assert_eq!(serde_json::from_str::<EntityAddr>(&j).unwrap(), a.clone());
        let b = postcard::to_allocvec(&a).unwrap();
        prop_assert_eq!(postcard::from_bytes::<EntityAddr>(&b).unwrap(), a);
    }

    #[test]
    fn addrvec_roundtrips(v in arb_addrvec()) {
        let s = v.to_string();
        prop_assert!(s.len() <= MAX_ADDRVEC_LEN);
        let back: AddrVec = s.parse().map_err(|e| TestCaseError::fail(format!("{s:?}: {e}")))?;
        prop_assert_eq!(&back, &v);
        prop_assert_eq!(back.to_string(), s);
        let j = serde_json::to_string(&v).unwrap();
        prop_assert_eq!(serde_json::from_str::<AddrVec>(&j).unwrap(), v);
    }

    #[test]
    fn name_roundtrips(n in arb_name()) {
        let s = n.to_string();
        prop_assert_eq!(s.parse::<EntityName>(), Ok(n.clone()));
        let j = serde_json::to_string(&n).unwrap();
        prop_assert_eq!(serde_json::from_str::<EntityName>(&j).unwrap(), n.clone());
        let j = serde_json::to_string(&n.kind).unwrap();
        prop_assert_eq!(serde_json::from_str::<EntityKind>(&j).unwrap(), n.kind);
    }

    /// `validate` is exactly "prints to text that parses back to the value".
    #[test]
    fn validate_iff_roundtrips(a in arb_any_addr()) {
        let roundtrips = a.to_string().parse::<EntityAddr>() == Ok(a.clone());
        prop_assert_eq!(a.validate().is_ok(), roundtrips, "{:?} -> {}", a, a);
        prop_assert_eq!(serde_json::to_string(&a).is_ok(), roundtrips);
    }

    #[test]
    fn arbitrary_strings_never_panic(s in ".{0,300}") {
        check_parsers(&s)?;
    }

    #[test]
    fn syntax_like_strings_never_panic(s in arb_syntaxish()) {
        check_parsers(&s)?;
        check_parsers(&format!("tcp://{s}"))?;
        check_parsers(&format!("fabric+verbs://1.2.3.4:5{s}"))?;
        check_parsers(&format!("[{s}"))?;
    }

    #[test]
    fn mutated_valid_strings_never_panic(s in arb_mutated()) {
        check_parsers(&s)?;
    }

    #[test]
    fn same_endpoint_ignores_nonce_and_rdma(a in arb_addr(), nonce in any::<u64>()) {
        let b = a.clone().with_nonce(nonce).with_rdma(RdmaLocation::default());
        prop_assert!(a.same_endpoint(&b));
        prop_assert!(!a.same_endpoint(&b.clone().with_port(a.socket.port().wrapping_add(1))));
    }
}
