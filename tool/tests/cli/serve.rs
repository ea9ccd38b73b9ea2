//! `msgr serve` with `ping` and `stream`: addresses, config files, secure mode, restarts, counters.

use super::*;

#[test]
fn serve_answers_ping_and_stream_then_prints_counters_on_sigint() {
    let (mut server, lines, addr) = serve("tcp://127.0.0.1:0");
    assert!(addr.starts_with("tcp://127.0.0.1:"), "{addr}");

    let samples = std::env::temp_dir().join(format!("msgr-cli-samples-{}", std::process::id()));
    let o = run(
        &[
            "ping",
            &addr,
            "--count",
            "200",
            "--warmup",
            "20",
            "--json",
            "--timeout",
            "30",
            "--samples",
            samples.to_str().expect("UTF-8 temp path"),
        ],
        Duration::from_secs(60),
    );
    assert!(o.status.success(), "ping failed: {}", o.stderr);
    let v: serde_json::Value = serde_json::from_str(&o.stdout).expect("ping JSON");
    assert_eq!(v["ping"]["count"], 200);
    // Every timed round trip, in order, in ns: as many as counted, none
    // below the fastest the summary saw.
    let text = std::fs::read_to_string(&samples).expect("samples file");
    let _ = std::fs::remove_file(&samples);
    let rtts: Vec<u64> = text.lines().map(|l| l.parse().expect("ns")).collect();
    assert_eq!(rtts.len(), 200);
    let min_ns = v["ping"]["rtt"]["min_us"].as_f64().expect("rtt min") * 1e3;
    assert!(
        rtts.iter().all(|&ns| ns as f64 >= min_ns - 1.0),
        "{min_ns} {rtts:?}"
    );
    assert_eq!(v["ping"]["size"], 64);
    assert_eq!(v["reply"], "own", "{v}");
    assert!(v["ping"]["one_way"]["p50_us"]
        .as_f64()
        .is_some_and(|x| x > 0.0));

    let o = run(
        &[
            "ping", &addr, "--count", "50", "--size", "4096", "--reply", "echo",
        ],
        Duration::from_secs(60),
    );
    assert!(o.status.success(), "ping failed: {}", o.stderr);
    assert!(
        o.stdout.contains("one-way") && o.stdout.contains("p99.9") && o.stdout.contains("echoed"),
        "{}",
        o.stdout
    );

    // Sealed and not: the server checks every payload's checksum either way.
    for (driver, seal) in [("callback", "true"), ("main", "false")] {
        let o = run(
            &[
                "stream", &addr, "--size", "65536", "--count", "300", "--driver", driver, "--seal",
                seal, "--json",
            ],
            Duration::from_secs(60),
        );
        assert!(o.status.success(), "stream failed: {}", o.stderr);
        let v: serde_json::Value = serde_json::from_str(&o.stdout).expect("stream JSON");
        assert_eq!(v["stream"]["messages"], 300, "{v}");
        assert_eq!(v["stream"]["bytes"], 300 * 65536);
    }

    // SIGINT: counters in Prometheus text, exit 0.
    let (status, rest) = stop(&mut server, &lines);
    assert!(status.success(), "{status:?}");
    let text = rest.join("\n");
    assert!(text.contains("# TYPE msgr_rx_messages counter"), "{text}");
    let rx: u64 = rest
        .iter()
        .find_map(|l| l.strip_prefix("msgr_rx_messages "))
        .and_then(|v| v.parse().ok())
        .expect("msgr_rx_messages value");
    assert!(rx >= 270 + 600, "server received {rx} messages");
}

/// `msgr serve`, `ping` and `stream` over libfabric's real `tcp` (MSG) and
/// `shm` (RDM) providers on loopback: small messages eagerly, 1 MiB through
/// the rendezvous, every payload checked by its receiver.
#[cfg(feature = "fabric")]
#[test]
fn serve_ping_and_stream_over_fabric_addresses() {
    for bind in [
        "fabric+tcp://127.0.0.1:0",
        "fabric+shm://127.0.0.1:0?ep=rdm",
    ] {
        let (_server, _lines, addr) = serve(bind);
        let scheme = bind.split("://").next().unwrap();
        assert!(
            addr.starts_with(&format!("{scheme}://127.0.0.1:")),
            "{addr}"
        );
        for size in ["64", "1048576"] {
            let o = run(
                &[
                    "ping",
                    &addr,
                    "--count",
                    "100",
                    "--warmup",
                    "10",
                    "--size",
                    size,
                    "--json",
                    "--timeout",
                    "30",
                ],
                Duration::from_secs(60),
            );
            assert!(o.status.success(), "ping {addr} {size} B: {}", o.stderr);
            let v: serde_json::Value = serde_json::from_str(&o.stdout).expect("ping JSON");
            assert_eq!(v["ping"]["count"], 100, "{v}");
            assert_eq!(v["ping"]["size"].to_string(), size, "{v}");
        }
        let o = run(
            &[
                "stream", &addr, "--size", "1048576", "--count", "40", "--seal", "false", "--json",
            ],
            Duration::from_secs(60),
        );
        assert!(o.status.success(), "stream {addr}: {}", o.stderr);
        let v: serde_json::Value = serde_json::from_str(&o.stdout).expect("stream JSON");
        assert_eq!(v["stream"]["messages"], 40, "{v}");
        assert_eq!(v["stream"]["bytes"], 40 << 20, "{v}");
    }
}

/// A server killed and restarted under a running stream or ping: the
/// client hears that the server lost the session and exits non-zero with
/// that reason, for both stream drivers and for ping, instead of waiting
/// out its timeout or reporting a transfer that dropped messages.
#[test]
fn clients_exit_with_the_reason_when_the_server_restarts() {
    for client in [
        &[
            "stream",
            "--size",
            "64",
            "--duration",
            "20",
            "--timeout",
            "40",
        ][..],
        &[
            "stream",
            "--size",
            "64",
            "--duration",
            "20",
            "--timeout",
            "40",
            "--driver",
            "main",
        ][..],
        &["ping", "--count", "100000000", "--timeout", "40"][..],
    ] {
        let (mut server, _lines, addr) = serve("tcp://127.0.0.1:0");
        let mut args = vec![client[0], addr.as_str()];
        args.extend_from_slice(&client[1..]);
        let mut child = Guard(
            Command::new(MSGR)
                .args(&args)
                .env_remove("MSGR_CONFIG")
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn the client"),
        );
        let err = reader(child.0.stderr.take().expect("stderr"));
        std::thread::sleep(Duration::from_millis(1500));
        let _ = server.0.kill();
        let _ = server.0.wait();
        // The same address again: a new incarnation, without the session.
        let (_again, _l, again_addr) = serve(&addr);
        assert_eq!(again_addr, addr);
        let started = Instant::now();
        let status = loop {
            if let Some(s) = child.0.try_wait().expect("try_wait") {
                break s;
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "msgr {args:?} went on for 60 s after the server restarted"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        let stderr = err.recv_timeout(Duration::from_secs(5)).unwrap_or_default();
        assert!(!status.success(), "msgr {args:?} exited 0:\n{stderr}");
        assert!(
            stderr.contains("lost the session") || stderr.contains("reset"),
            "msgr {args:?} gives no reason:\n{stderr}"
        );
    }
}

/// `msgr keygen` writes a private key (mode 0600, never over an existing
/// file) and a keyring line; `serve`, `ping` and `stream` take the keys and
/// run in secure mode; a client whose key the server's keyring does not
/// list gets nowhere and says so.
#[test]
fn keygen_then_secure_serve_ping_and_stream() {
    let dir = std::env::temp_dir().join(format!("msgr-cli-keys-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = |f: &str| dir.join(f).to_str().unwrap().to_owned();
    for (who, key, ring) in [
        ("server.1", "s.key", "ring"),
        ("client.1", "c.key", "ring"),
        ("client.2", "stranger.key", "other-ring"),
    ] {
        let o = run(
            &["keygen", who, "--out", &path(key), "--add-to", &path(ring)],
            Duration::from_secs(20),
        );
        assert!(o.status.success(), "keygen {who}: {}", o.stderr);
        assert!(o.stdout.starts_with(&format!("{who} ")), "{}", o.stdout);
    }
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path("s.key"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "the private key is its owner's only");
    let again = run(
        &["keygen", "server.1", "--out", &path("s.key")],
        Duration::from_secs(20),
    );
    assert!(
        !again.status.success(),
        "an existing key file is never overwritten"
    );
    let ring_text = std::fs::read_to_string(path("ring")).unwrap();
    assert_eq!(ring_text.lines().count(), 2, "{ring_text}");

    let secure = |name: &'static str, key: &str| -> Vec<String> {
        vec![
            "--security".into(),
            "secure".into(),
            "--name".into(),
            name.into(),
            "--key-file".into(),
            path(key),
            "--keyring".into(),
            path("ring"),
        ]
    };
    let server_args = secure("server.1", "s.key");
    let server_args: Vec<&str> = server_args.iter().map(String::as_str).collect();
    let (_server, _lines, addr) = serve_with("tcp://127.0.0.1:0", &server_args);
    let client = secure("client.1", "c.key");
    let mut ping: Vec<&str> = vec!["ping", &addr, "--count", "200", "--warmup", "10"];
    ping.extend(client.iter().map(String::as_str));
    let o = run(&ping, Duration::from_secs(60));
    assert!(
        o.status.success(),
        "secure ping: {}\n{}",
        o.stderr,
        o.stdout
    );
    let mut stream: Vec<&str> = vec!["stream", &addr, "--size", "100000", "--count", "200"];
    stream.extend(client.iter().map(String::as_str));
    let o = run(&stream, Duration::from_secs(60));
    assert!(
        o.status.success(),
        "secure stream: {}\n{}",
        o.stderr,
        o.stdout
    );

    // client.2's key is in a keyring of its own, not the server's.
    let stranger = secure("client.2", "stranger.key");
    let mut ping: Vec<&str> = vec!["ping", &addr, "--count", "10", "--timeout", "3"];
    ping.extend(stranger.iter().map(String::as_str));
    // Its own keyring must list it to start at all: use the other one.
    let last = ping.len() - 1;
    let other = path("other-ring");
    ping[last] = &other;
    let o = run(&ping, Duration::from_secs(60));
    assert!(
        !o.status.success(),
        "an unlisted client got through: {}",
        o.stdout
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A client's target as the library takes it: an address vector (`A,B`
/// and `[A,B]`: a refused first address, then the server's), and `--peer`
/// pinning the entity that may answer (another name is refused with the
/// reason).
#[test]
fn ping_takes_address_vectors_and_a_pinned_peer() {
    let (_server, _lines, addr) = serve_with("tcp://127.0.0.1:0", &["--name", "server.42"]);
    // Port 1 on loopback: nothing listens (refused at once).
    let dead = "tcp://127.0.0.1:1";
    for target in [format!("{dead},{addr}"), format!("[{dead},{addr}]")] {
        let o = run(
            &[
                "ping",
                &target,
                "--count",
                "200",
                "--warmup",
                "10",
                "--json",
                "--timeout",
                "60",
            ],
            Duration::from_secs(90),
        );
        assert!(o.status.success(), "ping {target}: {}", o.stderr);
        let v: serde_json::Value = serde_json::from_str(&o.stdout).expect("JSON");
        assert_eq!(v["ping"]["count"], 200, "{v}");
    }
    let o = run(
        &[
            "ping",
            &addr,
            "--peer",
            "server.42",
            "--count",
            "50",
            "--warmup",
            "0",
        ],
        Duration::from_secs(90),
    );
    assert!(o.status.success(), "the named server answers: {}", o.stderr);
    let o = run(
        &[
            "ping",
            &addr,
            "--peer",
            "server.7",
            "--count",
            "50",
            "--timeout",
            "20",
        ],
        Duration::from_secs(90),
    );
    assert!(!o.status.success(), "another name answered");
    assert!(
        o.stderr.contains("server.7") || o.stderr.contains("server.42"),
        "the reason names who answered or who was expected: {}",
        o.stderr
    );
    let o = run(
        &["ping", "tcp://127.0.0.1:5,nonsense"],
        Duration::from_secs(20),
    );
    assert!(!o.status.success());
    assert!(o.stderr.contains("nonsense"), "{}", o.stderr);
}

/// `msgr serve ... | head -1`: a reader that goes after the first line is
/// no error and no panic; the server ends as asked, exit status 0.
#[test]
fn serve_survives_a_reader_that_went() {
    let args = ["serve", "tcp://127.0.0.1:0", "--duration", "1"];
    let mut child = spawn(&args);
    let err = reader(child.0.stderr.take().expect("stderr"));
    let mut first = String::new();
    BufReader::new(child.0.stdout.take().expect("stdout"))
        .read_line(&mut first)
        .expect("the first line");
    assert!(first.starts_with("listening on"), "{first}");
    // The pipe's reader is gone now (dropped above).
    let status = exit_within(&mut child, &args, Duration::from_secs(60));
    let stderr = err.recv_timeout(Duration::from_secs(5)).unwrap_or_default();
    assert!(status.success(), "exit {status:?}: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// `msgr serve A,B` listens on both (one `listening on` line each) and a
/// client reaches it at each.
#[test]
fn serve_listens_on_every_address_given() {
    let mut s = serve_args(&[
        "serve",
        "tcp://127.0.0.1:0,tcp://127.0.0.1:0",
        "--duration",
        "60",
    ]);
    let second = s
        .lines
        .recv_timeout(Duration::from_secs(20))
        .expect("a second address");
    let second = second
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected second line {second:?}"))
        .to_owned();
    assert_ne!(s.addr, second, "two listeners");
    for a in [&s.addr, &second] {
        ping_ok(a);
    }
    let (status, rest) = stop(&mut s.guard, &s.lines);
    assert!(status.success(), "{status:?}");
    let summary = rest
        .iter()
        .find(|l| l.starts_with("# msgr serve"))
        .expect("summary");
    assert!(summary.contains("2 connections accepted"), "{summary}");
}

/// `msgr --config FILE serve`: the file's `bind` (a TOML array) gives the
/// addresses; without an address anywhere serve says what it needs.
#[test]
fn serve_takes_its_addresses_from_a_config_file() {
    let path = std::env::temp_dir().join(format!("msgr-cli-serve-{}.toml", std::process::id()));
    std::fs::write(
        &path,
        "workers = 2\nbind = [\"tcp://127.0.0.1:0\", \"tcp://127.0.0.1:0\"]\n",
    )
    .expect("config file");
    let file = path.to_str().expect("UTF-8 temp path");
    let mut s = serve_args(&["--config", file, "serve", "--duration", "60"]);
    let second = s
        .lines
        .recv_timeout(Duration::from_secs(20))
        .expect("the file's second address");
    for a in [s.addr.as_str(), second.trim_start_matches("listening on ")] {
        assert!(a.starts_with("tcp://127.0.0.1:"), "{a}");
        ping_ok(a);
    }
    let (status, _) = stop(&mut s.guard, &s.lines);
    assert!(status.success(), "{status:?}");

    // An unquoted address: the fix is in the message.
    std::fs::write(&path, "bind = tcp://127.0.0.1:0\n").expect("config file");
    let o = run(&["--config", file, "serve"], Duration::from_secs(20));
    assert_eq!(o.status.code(), Some(2), "{}", o.stderr);
    assert!(
        o.stderr
            .contains("strings must be quoted: bind = \"tcp://127.0.0.1:0\""),
        "{}",
        o.stderr
    );
    let _ = std::fs::remove_file(&path);
    let o = run(&["serve"], Duration::from_secs(20));
    assert_eq!(o.status.code(), Some(2), "{}", o.stderr);
    assert!(o.stderr.contains("serve needs an address"), "{}", o.stderr);
}

/// Frames a client corrupts on the wire (its fault plan) fail their
/// links' CRC at the server: said at the default log level and counted in
/// the summary; the lossless stream still delivers every message. The
/// fault plan needs the tool's `fault-injection` feature: scripts/test.sh
/// runs the CLI tests with it.
#[cfg(feature = "fault-injection")]
#[test]
fn serve_reports_checksum_mismatches() {
    let mut s = serve_args(&["serve", "tcp://127.0.0.1:0", "--duration", "60"]);
    let o = run(
        &[
            "stream",
            &s.addr,
            "--size",
            "1024",
            "--count",
            "3000",
            "--driver",
            "main",
            "--timeout",
            "60",
            "--set",
            "faults=seed=7,corrupt=200",
            "--set",
            "batch_max_bytes=0",
        ],
        Duration::from_secs(90),
    );
    assert!(o.status.success(), "stream: {}", o.stderr);
    let (status, rest) = stop(&mut s.guard, &s.lines);
    assert!(status.success(), "{status:?}");
    let stderr = s
        .stderr
        .recv_timeout(Duration::from_secs(5))
        .unwrap_or_default();
    let summary = rest
        .iter()
        .find(|l| l.starts_with("# msgr serve"))
        .expect("summary");
    let failures: u64 = summary
        .split(", ")
        .find_map(|p| p.strip_suffix(" links closed for checksum mismatches"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no checksum count in {summary}"));
    assert!(failures >= 1, "{summary}");
    let warned = stderr.matches("checksum mismatch").count() as u64;
    assert_eq!(warned, failures, "a warning per link closed:\n{stderr}");
    assert!(stderr.contains("WARN"), "{stderr}");
}

/// A stream whose server counts fewer messages than were sent fails, and
/// says so: here a stand-in server (the library, answering the tool's
/// stream messages) that loses one.
#[test]
fn stream_fails_when_the_server_got_fewer_messages_than_sent() {
    use msgr::{Connection, Dispatcher, Message, Messenger};
    use std::sync::atomic::{AtomicU64, Ordering};
    // The tool's stream protocol (tool/src/net.rs).
    const STREAM: u16 = 0x6d03;
    const STREAM_END: u16 = 0x6d04;
    const STREAM_DONE: u16 = 0x6d05;
    const CREDIT: u16 = 0x6d06;
    #[derive(Default)]
    struct LosesOne(AtomicU64);
    impl Dispatcher for LosesOne {
        fn on_message(&self, conn: &Connection, msg: Message) {
            match msg.msg_type {
                STREAM => {
                    self.0.fetch_add(1, Ordering::Relaxed);
                    if !msg.front.is_empty() {
                        let _ = conn.send(Message::new(CREDIT, msg.front, Vec::new()));
                    }
                }
                STREAM_END => {
                    let n = self.0.swap(0, Ordering::Relaxed);
                    // Totals: pings, stream messages, bytes, this stream's.
                    if let Ok(m) = Message::encode(STREAM_DONE, &(0u64, n, 0u64, n - 1)) {
                        let _ = conn.send(m);
                    }
                }
                _ => {}
            }
        }
    }
    let mut m = Messenger::builder(msgr::EntityName::server(1))
        .without_env()
        .bind("tcp://127.0.0.1:0".parse().expect("address"))
        .start(std::sync::Arc::new(LosesOne::default()))
        .expect("stand-in server");
    let addr = m.addr().expect("bound").clone().with_nonce(0).to_string();
    for driver in ["main", "callback"] {
        let o = run(
            &[
                "stream",
                &addr,
                "--size",
                "64",
                "--count",
                "100",
                "--driver",
                driver,
                "--timeout",
                "30",
            ],
            Duration::from_secs(60),
        );
        assert_eq!(o.status.code(), Some(1), "{driver}: {}", o.stderr);
        assert!(
            o.stderr
                .contains("incomplete: 100 messages sent, 99 delivered"),
            "{driver}: {}",
            o.stderr
        );
    }
    m.shutdown(Duration::from_secs(1));
}

/// `msgr serve` prints its entity name (what `--peer` pins) after its
/// addresses; a ping over an address vector names who answered, and where.
#[test]
fn serve_names_itself_and_ping_names_the_address_that_answered() {
    let s = serve_args(&[
        "serve",
        "tcp://127.0.0.1:0",
        "--duration",
        "60",
        "--name",
        "server.42",
    ]);
    let entity = line_with(&s.lines, "entity ", Duration::from_secs(5));
    assert_eq!(entity.as_deref(), Some("entity server.42"));
    let plain = serve_args(&["serve", "tcp://127.0.0.1:0", "--duration", "60"]);
    let entity = line_with(&plain.lines, "entity ", Duration::from_secs(5)).unwrap_or_default();
    let name = entity.strip_prefix("entity ").unwrap_or_default();
    assert!(name.starts_with("server."), "{entity:?}");
    // The name printed is the one to pin.
    let o = run(
        &[
            "ping",
            &plain.addr,
            "--peer",
            name,
            "--count",
            "5",
            "--warmup",
            "0",
        ],
        Duration::from_secs(60),
    );
    assert!(o.status.success(), "ping --peer {name}: {}", o.stderr);

    let dead = "tcp://127.0.0.1:1";
    let o = run(
        &[
            "ping",
            &format!("{dead},{}", s.addr),
            "--count",
            "5",
            "--warmup",
            "0",
            "--json",
        ],
        Duration::from_secs(90),
    );
    assert!(o.status.success(), "{}", o.stderr);
    assert!(
        o.stderr
            .lines()
            .any(|l| l.contains(&format!("connected to server.42 at {}", s.addr))),
        "who answered, and where: {}",
        o.stderr
    );
}

/// `msgr serve`'s counters at the end include its backends' own
/// (`msgr_transport_…`, fabric's `hello_challenges` among them).
#[cfg(feature = "fabric")]
#[test]
fn serve_counters_include_the_transport_counters() {
    let (mut server, lines, addr) = serve("fabric+shm://127.0.0.1:0?ep=rdm");
    ping_ok(&addr);
    let (status, rest) = stop(&mut server, &lines);
    assert!(status.success(), "{status:?}");
    assert!(
        rest.iter()
            .any(|l| l.starts_with("msgr_transport_hello_challenges{")),
        "{rest:#?}"
    );
}
