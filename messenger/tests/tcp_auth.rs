//! Authentication and the secure mode over real TCP sockets on loopback:
//! impostors refused while a lossless session streams (which loses and
//! duplicates nothing), a bit flipped by a man in the middle detected, the
//! fault plan in secure mode, and configuration mistakes refused at start.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use common::*;
use msgr::auth::{Credentials, Keyring, StaticKeypair};

use msgr::{EntityAddr, EntityName, Messenger, MessengerConfig, Policy};
use msgr_proto::auth::{ModeSet, Security};
use msgr_proto::session::{LinkId, LocalIdentity, Session, SessionEvent};
use msgr_proto::{SessionConfig, StreamDecoder};

/// A client messenger with these credentials.
fn start(name: EntityName, cfg: MessengerConfig, creds: Credentials, bind: bool) -> Messenger {
    let d = Arc::new(msgr::NullDispatcher);
    if bind {
        return server_with(name, cfg, creds, d);
    }
    let b = Messenger::builder(name).config(cfg).credentials(creds);
    b.start(d).expect("start")
}

/// A messenger listening on loopback TCP with these credentials.
fn server_with(
    name: EntityName,
    cfg: MessengerConfig,
    creds: Credentials,
    d: Arc<dyn msgr::Dispatcher>,
) -> Messenger {
    Messenger::builder(name)
        .config(cfg)
        .credentials(creds)
        .bind("tcp://127.0.0.1:0".parse().unwrap())
        .start(d)
        .expect("start")
}

/// Drives one session of our own over a real socket to `target` until
/// the server closes the link or `deadline` passes: how an impostor that
/// controls what its hello says talks. Returns the events it saw.
fn drive_raw(
    local: LocalIdentity,
    security: Security,
    target: &EntityAddr,
    deadline: Duration,
) -> Vec<SessionEvent> {
    let cfg = SessionConfig {
        security,
        ..SessionConfig::default()
    };
    let now = Instant::now();
    let mut s = Session::connect(cfg, local, target.clone(), Policy::LossyClient, now);
    let link = LinkId(1);
    let mut sock = TcpStream::connect(target.socket).expect("connect");
    sock.set_read_timeout(Some(Duration::from_millis(5)))
        .unwrap();
    s.link_up(link, Instant::now());
    let mut dec = StreamDecoder::new(SessionConfig::default().limits);
    let mut buf = BytesMut::new();
    let mut events = Vec::new();
    let end = Instant::now() + deadline;
    while Instant::now() < end && !s.is_closed() {
        while let Some((_, unit)) = s.poll_transmit(Instant::now()) {
            if sock.write_all(&unit.encode_to_vec().unwrap()).is_err() {
                break;
            }
        }
        let mut chunk = [0u8; 4096];
        match sock.read(&mut chunk) {
            Ok(0) => s.link_failed(
                link,
                msgr::LinkFailure::ClosedByPeer("closed by the server".into()),
                Instant::now(),
            ),
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                while let Ok(Some(unit)) = dec.decode(&mut buf) {
                    let _ = s.handle_inbound(link, unit, Instant::now());
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(e) => s.link_failed(link, msgr::LinkFailure::io("read", &e), Instant::now()),
        }
        s.handle_timeout(Instant::now());
        loop {
            // Messages (none are expected) hold back the events after them.
            while s.poll_message().is_some() {}
            let Some(e) = s.poll_event() else {
                break;
            };
            events.push(e);
        }
    }
    events
}

fn count(m: &Messenger, f: impl Fn(&msgr::Counters) -> &std::sync::atomic::AtomicU64) -> u64 {
    f(m.counters()).load(Ordering::Relaxed)
}

/// One impostor's attempt against `srv`: it never gets a session, and the
/// server counts it in `counter`.
fn refused(
    srv: &Messenger,
    counter: fn(&msgr::Counters) -> &std::sync::atomic::AtomicU64,
    local: LocalIdentity,
    security: Security,
) {
    let before = count(srv, counter);
    let ev = drive_raw(
        local,
        security,
        srv.addr().expect("bound"),
        Duration::from_secs(3),
    );
    assert!(
        !ev.iter().any(|e| matches!(e, SessionEvent::Established(_))),
        "{ev:?}"
    );
    assert!(
        wait_until(Duration::from_secs(3), || count(srv, counter) > before),
        "the server did not count the attempt"
    );
}

/// While client.1 streams lossless messages to server.1 in secure mode,
/// four impostors try to speak in its name: with their own key under its
/// name, authenticated as themselves but naming it in the hello, claiming
/// its session (its address and nonce) under their own name, and in the
/// clear. Each is refused and counted; client.1's session never notices:
/// no reconnect, no reset, every message once, in order.
#[test]
fn impostors_are_refused_while_a_lossless_session_streams() {
    init_tracing();
    let (srv_name, victim, other) = (
        EntityName::server(1),
        EntityName::client(1),
        EntityName::client(2),
    );
    let ids = Ids::new(&[srv_name.clone(), victim.clone(), other.clone()]);
    let rec = Recorder::new();
    let mut srv = server_with(
        srv_name.clone(),
        secure_config("secure"),
        ids.creds(&srv_name),
        rec.clone(),
    );
    let mut cli = start(
        victim.clone(),
        secure_config("secure"),
        ids.creds(&victim),
        false,
    );
    let conn = cli
        .connect_with(srv.addr().expect("bound"), Policy::LosslessClient)
        .unwrap();
    conn.wait_connected(Duration::from_secs(10)).unwrap();
    assert!(
        conn.peer().and_then(|p| p.key).is_some(),
        "server.1 proved its key"
    );

    const N: u64 = 20_000;
    let streaming = Arc::new(AtomicBool::new(true));
    let sender = {
        let conn = conn.clone();
        let streaming = streaming.clone();
        std::thread::spawn(move || {
            for n in 1..=N {
                send(&conn, probe_message(1, n, (n as usize * 13) % 2000));
                if n % 2000 == 0 {
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
            streaming.store(false, Ordering::Relaxed);
        })
    };

    let secure = |creds: Credentials| Security {
        modes: "secure".parse::<ModeSet>().unwrap(),
        credentials: Some(Arc::new(creds)),
    };
    // 1. client.1's name with a key of its own (its keyring says so; the
    //    server's does not).
    let forged = Credentials::new(victim.clone(), StaticKeypair::generate(), ids.ring.clone());
    let anywhere = |nonce| EntityAddr::tcp(([127, 0, 0, 1], 0).into()).with_nonce(nonce);
    let as_who = |name: &EntityName, addr| LocalIdentity {
        name: name.clone(),
        addr,
        dials: Default::default(),
    };
    refused(
        &srv,
        |c| &c.auth_failures,
        as_who(&victim, anywhere(7)),
        secure(forged),
    );
    // 2. Authenticated as client.2, then "I am client.1" in the hello.
    let other_creds = || secure(ids.creds(&other));
    refused(
        &srv,
        |c| &c.auth_failures,
        as_who(&victim, anywhere(8)),
        other_creds(),
    );
    // 3. Authenticated as client.2, claiming client.1's session: its
    //    address and nonce, a new session (which would reset the old one).
    let victims_addr = announced_addr(&srv, &victim).expect("the victim's session");
    refused(
        &srv,
        |c| &c.impostors_refused,
        as_who(&other, victims_addr.clone()),
        other_creds(),
    );
    // 4. In the clear, as client.1: the server allows secure only.
    refused(
        &srv,
        |c| &c.protocol_errors,
        as_who(&victim, victims_addr),
        Security::default(),
    );
    assert!(
        streaming.load(Ordering::Relaxed),
        "the attacks ran while client.1 streamed (raise N if this machine is faster)"
    );

    sender.join().unwrap();
    assert!(
        wait_until(Duration::from_secs(60), || rec.delivered(1) == N),
        "delivered {} of {N}",
        rec.delivered(1)
    );
    rec.assert_clean();
    assert!(rec.resets.lock().unwrap().is_empty());
    assert_eq!(rec.remote_resets.load(Ordering::Relaxed), 0);
    assert_eq!(
        count(&cli, |c| &c.reconnects),
        0,
        "client.1's session never moved"
    );
    assert_eq!(count(&cli, |c| &c.session_resets), 0);
    assert_eq!(count(&srv, |c| &c.session_resets), 0);
    cli.shutdown(Duration::from_secs(5));
    srv.shutdown(Duration::from_secs(5));
}

/// A proxy between client and server that flips one bit of the first
/// connection's client-to-server bytes at `offset`, then passes
/// everything through untouched (later connections too).
fn bit_flipping_proxy(target: std::net::SocketAddr, offset: usize) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut first = true;
        for inbound in listener.incoming().take(64) {
            let Ok(inbound) = inbound else { return };
            let Ok(outbound) = TcpStream::connect(target) else {
                return;
            };
            let flip_at = first.then_some(offset);
            first = false;
            let (ri, ro) = (inbound.try_clone().unwrap(), outbound.try_clone().unwrap());
            std::thread::spawn(move || pump(ri, outbound, flip_at));
            std::thread::spawn(move || pump(ro, inbound, None));
        }
    });
    addr
}

fn pump(mut from: TcpStream, mut to: TcpStream, mut flip_at: Option<usize>) {
    let mut seen = 0usize;
    let mut buf = vec![0u8; 64 << 10];
    // Bounded: the test's connections end within its deadline.
    from.set_read_timeout(Some(Duration::from_secs(120)))
        .unwrap();
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if let Some(at) = flip_at {
            if at >= seen && at < seen + n {
                buf[at - seen] ^= 0x10;
                flip_at = None;
            }
        }
        seen += n;
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Both);
    let _ = from.shutdown(std::net::Shutdown::Both);
}

/// One bit flipped on the way, deep inside a message's payload — a
/// segment the outer frame does not checksum in secure mode — is caught by
/// the AEAD tag: the link closes, the session resumes through the proxy
/// and replays; every message arrives once and intact.
#[test]
fn a_bit_flipped_in_flight_is_detected_in_secure_mode() {
    let (srv_name, cli_name) = (EntityName::server(1), EntityName::client(1));
    let ids = Ids::new(&[srv_name.clone(), cli_name.clone()]);
    let rec = Recorder::new();
    let mut srv = server_with(
        srv_name.clone(),
        secure_config("secure"),
        ids.creds(&srv_name),
        rec.clone(),
    );
    let proxy = bit_flipping_proxy(srv.addr().expect("bound").socket, 300_000);
    let creds = ids.creds(&cli_name);
    let mut cli = start(cli_name, secure_config("secure"), creds, false);
    let via = EntityAddr::tcp(proxy);
    let conn = cli.connect_with(&via, Policy::LosslessClient).unwrap();
    const N: u64 = 40;
    for n in 1..=N {
        // 64 KiB payloads: large enough for a data segment of their own.
        send(&conn, probe_message(1, n, 64 << 10));
    }
    assert!(
        wait_until(Duration::from_secs(60), || rec.delivered(1) == N),
        "delivered {} of {N}",
        rec.delivered(1)
    );
    rec.assert_clean();
    assert!(
        count(&srv, |c| &c.sealed_frames_refused) >= 1,
        "the flipped bit was caught by the AEAD tag (sealed_frames_refused)"
    );
    assert!(count(&cli, |c| &c.reconnects) >= 1);
    cli.shutdown(Duration::from_secs(5));
    srv.shutdown(Duration::from_secs(5));
}

/// The transport fault plan (failed links, corrupted and delayed units,
/// failed handshakes) in secure mode: lossless delivery holds, and every
/// corruption is caught.
#[test]
fn lossless_delivery_holds_under_a_fault_plan_in_secure_mode() {
    let seed: u64 = rand::random();
    println!("seed {seed}");
    let (srv_name, cli_name) = (EntityName::server(1), EntityName::client(1));
    let ids = Ids::new(&[srv_name.clone(), cli_name.clone()]);
    let plan = |s: u64| -> msgr::FaultPlan {
        format!("seed={s},fail=300,corrupt=200,delay=40,delay_max_ms=3,handshake=6")
            .parse()
            .unwrap()
    };
    let mut scfg = secure_config("secure");
    scfg.faults = Some(plan(seed));
    let mut ccfg = secure_config("auth,secure");
    ccfg.faults = Some(plan(seed.wrapping_add(1)));
    let rec = Recorder::new();
    let mut srv = server_with(srv_name.clone(), scfg, ids.creds(&srv_name), rec.clone());
    let mut cli = start(cli_name.clone(), ccfg, ids.creds(&cli_name), false);
    let conn = cli
        .connect_with(srv.addr().expect("bound"), Policy::LosslessClient)
        .unwrap();
    // Rounds of 2,000 messages until the plan has corrupted a few units and
    // failed a few links (how many units carry the messages depends on the
    // batching, so on timing).
    let injected =
        || count(&cli, |c| &c.corruptions_injected) + count(&srv, |c| &c.corruptions_injected);
    let reconnects = || count(&cli, |c| &c.reconnects);
    let mut sent = 0u64;
    while sent < 10_000 || ((injected() < 3 || reconnects() <= 5) && sent < 100_000) {
        for n in sent + 1..=sent + 2_000 {
            send(&conn, probe_message(1, n, (n as usize * 7) % 3000));
        }
        sent += 2_000;
        assert!(
            wait_until(Duration::from_secs(120), || rec.delivered(1) == sent),
            "seed {seed}: delivered {} of {sent}",
            rec.delivered(1)
        );
    }
    rec.assert_clean();
    assert!(rec.resets.lock().unwrap().is_empty(), "seed {seed}");
    // A corrupted unit ends its link (one that was failing already may go
    // first, and a second corruption on a closing link is not read): so at
    // least one caught of the several injected, never a corrupt delivery.
    let caught = count(&cli, |c| &c.protocol_errors) + count(&srv, |c| &c.protocol_errors);
    let injected = injected();
    assert!(
        injected >= 3,
        "seed {seed}: the plan corrupted {injected} units in {sent} messages"
    );
    assert!(
        caught >= 1,
        "seed {seed}: corruptions caught ({caught} of {injected} injected)"
    );
    assert!(reconnects() > 5, "seed {seed}: {} reconnects", reconnects());
    cli.shutdown(Duration::from_secs(5));
    srv.shutdown(Duration::from_secs(5));
}

/// Mistakes in the security configuration are refused when the messenger
/// starts, saying which: no key, another entity's key, a keyring without
/// us, and a mode that does not exist.
#[test]
fn security_configuration_mistakes_are_refused_at_start() {
    let dir = std::env::temp_dir().join(format!("msgr-auth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let me = EntityName::server(4);
    let kp = StaticKeypair::generate();
    let key_file = dir.join("server.4.key");
    std::fs::write(&key_file, kp.to_key_file(&me).as_bytes()).unwrap();
    let ring_file = dir.join("keyring");
    std::fs::write(&ring_file, Keyring::line(&me, &kp.public())).unwrap();
    let other_ring = dir.join("other-keyring");
    std::fs::write(
        &other_ring,
        Keyring::line(&EntityName::client(1), &kp.public()),
    )
    .unwrap();

    let try_start = |name: EntityName, kv: &[(&str, &str)]| {
        let mut cfg = MessengerConfig::default();
        for (k, v) in kv {
            cfg.set(k, v)?;
        }
        Messenger::builder(name)
            .config(cfg)
            .start(Arc::new(msgr::NullDispatcher))
            .map(|mut m| m.shutdown(Duration::from_secs(1)))
            .map_err(|e| msgr::ConfigError::BadValue {
                key: "start".into(),
                value: String::new(),
                why: e.to_string(),
            })
    };
    let (k, r) = (key_file.to_str().unwrap(), ring_file.to_str().unwrap());
    try_start(
        me.clone(),
        &[("security", "secure"), ("key_file", k), ("keyring", r)],
    )
    .expect("a complete configuration starts");
    for (name, kv, says) in [
        (
            me.clone(),
            vec![("security", "secure")],
            "needs key_file and keyring",
        ),
        (
            EntityName::server(5),
            vec![("security", "auth"), ("key_file", k), ("keyring", r)],
            "server.4's",
        ),
        (
            me.clone(),
            vec![
                ("security", "secure"),
                ("key_file", k),
                ("keyring", other_ring.to_str().unwrap()),
            ],
            "does not list server.4",
        ),
        (
            me.clone(),
            vec![("security", "tls")],
            "unknown security mode",
        ),
    ] {
        let e = try_start(name, &kv).expect_err("refused").to_string();
        assert!(e.contains(says), "{kv:?}: {e}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A client that names the entity it dials talks to that entity only. In
/// secure mode another entity at that address — one whose key *is* in the
/// keyring — ends the connection at the handshake, before the client's
/// hello leaves; in crc mode the answer's name is checked. The right
/// server is reached as usual.
#[test]
fn a_named_connection_refuses_whoever_else_answers() {
    let (s1, s9, c1) = (
        EntityName::server(1),
        EntityName::server(9),
        EntityName::client(1),
    );
    let ids = Ids::new(&[s1.clone(), s9.clone(), c1.clone()]);
    for modes in ["secure", "crc"] {
        let srv =
            |name: &EntityName| start(name.clone(), secure_config(modes), ids.creds(name), true);
        let (mut right, mut wrong) = (srv(&s1), srv(&s9));
        let rec = Recorder::new();
        let mut cli = Messenger::builder(c1.clone())
            .config(secure_config(modes))
            .credentials(ids.creds(&c1))
            .start(rec.clone())
            .unwrap();
        let bad = cli
            .connect_to(&s1, wrong.addr().expect("bound"), Policy::LosslessClient)
            .unwrap();
        assert!(
            wait_until(Duration::from_secs(10), || !rec
                .resets
                .lock()
                .unwrap()
                .is_empty()),
            "{modes}: the connection to the wrong entity ended"
        );
        let why = rec.resets.lock().unwrap()[0].1.clone();
        let says = if modes == "secure" {
            "dialled server.1 but server.9 answered"
        } else {
            "connected to server.1 but peer says it is server.9"
        };
        assert!(why.contains(says), "{modes}: {why}");
        assert_eq!(bad.state(), msgr::ConnectionState::Closed);
        if modes == "secure" {
            // Our hello never reached it: no session there. (In crc mode
            // the answer's name comes after the hello: the wrong server
            // holds a session the client then leaves.)
            assert_eq!(wrong.counters().sessions_active.load(Ordering::Relaxed), 0);
        }
        let good = cli
            .connect_to(&s1, right.addr().expect("bound"), Policy::LosslessClient)
            .unwrap();
        good.wait_connected(Duration::from_secs(10)).unwrap();
        assert_eq!(good.peer().unwrap().name, s1);
        for m in [&mut cli, &mut right, &mut wrong] {
            m.shutdown(Duration::from_secs(2));
        }
    }
}

/// A client the server's keyring does not vouch for — a name it does not
/// list, or a listed name with another key (an impostor) — hears why at
/// once in `auth` and in `secure` mode: the connection ends within a
/// second with the server's reason, typed, and never redials (the server
/// sees one attempt). Before, it redialled into the same refusal until
/// its `connect_timeout`, knowing only that the link closed.
#[test]
fn a_refused_client_hears_why_at_once_and_stops() {
    use msgr::auth::Refusal;
    use msgr::{ConnectError, FaultReason};
    let (s1, c1) = (EntityName::server(1), EntityName::client(1));
    let ids = Ids::new(&[s1.clone(), c1.clone()]);
    let mut server_ring = Keyring::new();
    server_ring.insert(s1.clone(), ids.keys[0].1.public());
    let impostor_ring = {
        let mut r = server_ring.clone();
        r.insert(c1.clone(), StaticKeypair::generate().public());
        r
    };
    for modes in ["auth", "secure"] {
        for (ring, want) in [
            (&server_ring, Refusal::UnknownPeer),
            (&impostor_ring, Refusal::WrongKey),
        ] {
            let creds = Credentials::new(s1.clone(), ids.keys[0].1.clone(), Arc::new(ring.clone()));
            let mut srv = start(s1.clone(), secure_config(modes), creds, true);
            let mut cli = start(c1.clone(), secure_config(modes), ids.creds(&c1), false);
            let started = Instant::now();
            let conn = cli
                .connect_with(srv.addr().expect("bound"), Policy::LosslessClient)
                .unwrap();
            let err = conn.wait_connected(Duration::from_secs(10)).unwrap_err();
            let took = started.elapsed();
            let why = FaultReason::Refused(want.clone());
            assert_eq!(err, ConnectError::Closed(Some(why)), "{modes}");
            assert!(took < Duration::from_secs(1), "{modes} {want:?}: {took:?}");
            assert!(
                err.to_string().contains(&want.to_string()),
                "{modes}: {err}"
            );
            // No redial: the server saw one attempt, and sees no more.
            std::thread::sleep(Duration::from_millis(300));
            assert_eq!(count(&srv, |c| &c.auth_failures), 1, "{modes} {want:?}");
            assert_eq!(conn.status().attempts, 0, "{modes}: {:?}", conn.status());
            cli.shutdown(Duration::from_secs(2));
            srv.shutdown(Duration::from_secs(2));
        }
    }
}
