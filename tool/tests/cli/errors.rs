//! Bad input, missing backends and closed pipes: a clear error, the right exit code, never a panic.

use super::*;

/// Without an RDMA device (or without the verbs feature), serve, ping and
/// stream over `verbs://` fail at once and say why, whatever the build.
#[test]
fn verbs_commands_without_rdma_fail_and_say_why() {
    if std::path::Path::new("/sys/class/infiniband").exists() {
        // A machine with RDMA: the guest tests (testsuite/tests/guest_bench.rs)
        // run these commands for real.
        eprintln!("SKIPPED: this machine has RDMA devices; see guest_bench");
        return;
    }
    let addr = "verbs://127.0.0.1:6800?dev=rxe0";
    for args in [
        vec!["serve", addr, "--duration", "1"],
        vec!["ping", addr, "--count", "1"],
        vec!["stream", addr, "--count", "1"],
    ] {
        let o = run(&args, Duration::from_secs(20));
        assert!(!o.status.success(), "{args:?} succeeded");
        assert!(
            o.stderr.contains("transport verbs is unavailable")
                && (o.stderr.contains("no RDMA device")
                    || o.stderr.contains("without the `verbs` cargo feature")),
            "{args:?}: {}",
            o.stderr
        );
        assert!(!o.stderr.contains("panicked"), "{}", o.stderr);
    }
}

#[test]
fn bad_input_gives_a_clear_error_and_nonzero_exit() {
    let o = run(&["ping", "127.0.0.1:6800"], Duration::from_secs(20));
    assert!(!o.status.success());
    assert!(
        o.stderr.contains("bad address `127.0.0.1:6800`"),
        "{}",
        o.stderr
    );
    assert!(!o.stderr.contains("panicked"), "{}", o.stderr);

    let o = run(
        &["serve", "tcp://localhost:6800", "--duration", "1"],
        Duration::from_secs(20),
    );
    assert!(!o.status.success());
    assert!(
        o.stderr.contains("host names are not resolved"),
        "{}",
        o.stderr
    );

    let o = run(
        &["bench", "--transport", "verbs", "--quick"],
        Duration::from_secs(20),
    );
    assert!(!o.status.success());
    assert!(
        o.stderr.contains("verbs") && o.stderr.contains("not usable"),
        "{}",
        o.stderr
    );

    let o = run(&["--workers", "0", "backends"], Duration::from_secs(20));
    assert!(o.status.success(), "backends needs no config");
    let o = run(
        &[
            "--workers",
            "zero",
            "serve",
            "tcp://127.0.0.1:0",
            "--duration",
            "1",
        ],
        Duration::from_secs(20),
    );
    assert!(!o.status.success());
    assert!(o.stderr.contains("workers"), "{}", o.stderr);

    // Nobody listens on port 1: the client waits for a server as long as
    // its --timeout, then fails with the cause of its last attempt.
    let o = run(
        &[
            "ping",
            "tcp://127.0.0.1:1",
            "--count",
            "1",
            "--timeout",
            "2",
        ],
        Duration::from_secs(60),
    );
    assert!(!o.status.success());
    assert!(o.stderr.contains("msgr: error:"), "{}", o.stderr);
    assert!(
        o.stderr.to_lowercase().contains("refused"),
        "no cause: {}",
        o.stderr
    );
}

/// No number on the command line makes the tool panic, hang or allocate
/// without bound: each is refused at once with a message saying why
/// (issue: `--count u64::MAX`, `--timeout 1e19`, `--count 1e10`,
/// `--duration 1e19`, a size over the data limit, `--config /dev/zero`).
#[test]
fn out_of_range_numbers_are_refused_at_once() {
    for (args, says) in [
        (
            &[
                "ping",
                "tcp://127.0.0.1:1",
                "--count",
                "18446744073709551615",
            ][..],
            "--count",
        ),
        (
            &["ping", "tcp://127.0.0.1:1", "--count", "10000000000"][..],
            "--count",
        ),
        (
            &[
                "ping",
                "tcp://127.0.0.1:1",
                "--size",
                "18446744073709551615",
            ][..],
            "--size",
        ),
        (
            &["ping", "tcp://127.0.0.1:1", "--size", "209715200"][..],
            "max_data_bytes",
        ),
        (
            &["ping", "tcp://127.0.0.1:1", "--timeout", "1e19"][..],
            "0.001..=86400",
        ),
        (
            &["stream", "tcp://127.0.0.1:1", "--timeout", "nan"][..],
            "--timeout",
        ),
        (
            &["stream", "tcp://127.0.0.1:1", "--duration", "1e19"][..],
            "0.001..=86400",
        ),
        (
            &["stream", "tcp://127.0.0.1:1", "--duration", "200"][..],
            "below --timeout",
        ),
        (
            &["stream", "tcp://127.0.0.1:1", "--size", "0"][..],
            "--size",
        ),
        (
            &["--config", "/dev/zero", "ping", "tcp://127.0.0.1:1"][..],
            "not a configuration file",
        ),
        (
            &[
                "--set",
                "handshake_timeout_ms=0",
                "ping",
                "tcp://127.0.0.1:1",
            ][..],
            "must be 1..=",
        ),
    ] {
        let out = run(args, Duration::from_secs(20));
        assert!(!out.status.success(), "msgr {args:?} succeeded");
        assert!(
            !out.stderr.contains("panicked"),
            "msgr {args:?} panicked:\n{}",
            out.stderr
        );
        assert!(
            out.stderr.contains(says),
            "msgr {args:?} does not say `{says}`:\n{}",
            out.stderr
        );
    }
}

/// How `msgr ARGS` ended with its stdout's reader gone: exit 0, or the
/// conventional 141 (killed by SIGPIPE), never a panic (101).
fn assert_quiet_end(args: &[&str], status: ExitStatus, stderr: &str) {
    use std::os::unix::process::ExitStatusExt;
    assert!(
        status.success() || status.signal() == Some(libc::SIGPIPE),
        "msgr {args:?} with stdout closed: {status:?}: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "msgr {args:?}: {stderr}");
}

/// `msgr … | true` and `msgr … | head -1`: a reader that went before the
/// first line, or after it, ends every subcommand quietly (`println!`
/// panicked on the closed pipe: exit 101).
#[test]
fn every_subcommand_survives_a_closed_stdout() {
    let (_server, _lines, addr) = serve("tcp://127.0.0.1:0");
    let keys = std::env::temp_dir().join(format!("msgr-cli-closed-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&keys);
    std::fs::create_dir_all(&keys).expect("key dir");
    let key = keys.join("k.key");
    let key = key.to_str().expect("UTF-8 path");
    let ping: &[&str] = &["ping", &addr, "--count", "20", "--warmup", "0"];
    let stream: &[&str] = &["stream", &addr, "--count", "100", "--size", "1024"];
    let commands: Vec<Vec<&str>> = vec![
        ping.to_vec(),
        [ping, &["--json"]].concat(),
        stream.to_vec(),
        [stream, &["--json"]].concat(),
        vec!["backends"],
        vec!["backends", "--json"],
        vec!["keygen", "client.9", "--out", key],
    ];
    for args in &commands {
        // `| true`: nobody reads at all.
        let mut child = spawn(args);
        drop(child.0.stdout.take());
        let err = reader(child.0.stderr.take().expect("stderr"));
        let status = exit_within(&mut child, args, Duration::from_secs(60));
        let stderr = err.recv_timeout(Duration::from_secs(5)).unwrap_or_default();
        assert_quiet_end(args, status, &stderr);
        let _ = std::fs::remove_file(key);
    }
    // `| head -1`: the reader takes a line and goes.
    let mut child = spawn(ping);
    let err = reader(child.0.stderr.take().expect("stderr"));
    let mut first = String::new();
    BufReader::new(child.0.stdout.take().expect("stdout"))
        .read_line(&mut first)
        .expect("the first line");
    assert!(first.starts_with("msgr ping"), "{first}");
    let status = exit_within(&mut child, ping, Duration::from_secs(60));
    let stderr = err.recv_timeout(Duration::from_secs(5)).unwrap_or_default();
    assert_quiet_end(ping, status, &stderr);
    let _ = std::fs::remove_dir_all(&keys);
}

/// `msgr ping`/`stream` to a dead port say at once what they are
/// connecting to, and each failed attempt as it fails (they were silent
/// for their whole timeout).
#[test]
fn clients_of_a_dead_port_say_so_at_once_and_retry_visibly() {
    // Port 1 on loopback: nothing listens (refused at once).
    let dead = "tcp://127.0.0.1:1";
    for cmd in ["ping", "stream"] {
        let args = [cmd, dead, "--timeout", "20"];
        let mut child = spawn(&args);
        let err = lines_of(child.0.stderr.take().expect("stderr"));
        let first = line_with(&err, "connecting to", Duration::from_secs(2));
        assert!(
            first.as_deref().is_some_and(|l| l.contains(dead)),
            "msgr {args:?}: no `connecting to {dead}` within 2 s"
        );
        let retry = line_with(&err, "attempt 1 failed", Duration::from_secs(5));
        assert!(
            retry.is_some(),
            "msgr {args:?}: no failed attempt told within 5 s"
        );
        let again = line_with(&err, "attempt 2 failed", Duration::from_secs(10));
        assert!(again.is_some(), "msgr {args:?}: the retry was not told");
    }
}

/// Errors as users read them: a bind that fails names the address, and
/// 100 KB of bad address is cut in the message (it was echoed whole).
#[test]
fn errors_name_the_address_and_cut_long_input() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let addr = format!("tcp://{}", taken.local_addr().expect("its address"));
    let o = run(
        &["serve", &addr, "--duration", "5"],
        Duration::from_secs(30),
    );
    assert!(!o.status.success());
    assert!(
        o.stderr.contains(&format!("bind {addr}: ")),
        "the address that could not be bound: {}",
        o.stderr
    );
    let long = format!("tcp://{}", "1".repeat(100_000));
    let o = run(&["ping", &long], Duration::from_secs(30));
    assert_eq!(o.status.code(), Some(2), "{:.300}", o.stderr);
    assert!(o.stderr.contains("… (100006 bytes)"), "{:.300}", o.stderr);
    assert!(o.stderr.len() < 1000, "{} bytes of error", o.stderr.len());
}

/// A client the server's keyring does not vouch for — a name it does not
/// list (secure mode), a listed name with another key (auth mode) — and a
/// client without a key against a server that requires one: `ping` and
/// `stream` print why at once and exit non-zero, instead of redialling
/// into the same refusal until their 15 s connect timeout.
#[test]
fn a_refused_client_prints_the_servers_reason_and_exits_at_once() {
    let dir = std::env::temp_dir().join(format!("msgr-cli-refused-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("key dir");
    let path = |f: &str| dir.join(f).to_str().expect("UTF-8 path").to_owned();
    // The server's keyring lists itself only; the client's lists both;
    // the impostor's keyring (the second server's) lists client.1 under
    // another key.
    for (who, key, ring) in [
        ("server.1", "s.key", "server-ring"),
        ("client.1", "c.key", "client-ring"),
        ("client.1", "other.key", "impostor-ring"),
    ] {
        let o = run(
            &["keygen", who, "--out", &path(key), "--add-to", &path(ring)],
            Duration::from_secs(20),
        );
        assert!(o.status.success(), "keygen {who}: {}", o.stderr);
    }
    let server_line = std::fs::read_to_string(path("server-ring")).expect("ring");
    for ring in ["client-ring", "impostor-ring"] {
        let mut text = std::fs::read_to_string(path(ring)).expect("ring");
        text.push_str(&server_line);
        std::fs::write(path(ring), text).expect("ring");
    }
    let keys = |mode: &str, name: &str, key: &str, ring: &str| -> Vec<String> {
        ["--security", mode, "--name", name, "--key-file"]
            .iter()
            .map(|s| s.to_string())
            .chain([path(key), "--keyring".into(), path(ring)])
            .collect()
    };
    let cases: Vec<(&str, Vec<String>, Vec<String>, &str)> = vec![
        (
            "an unknown client, secure",
            keys("secure", "server.1", "s.key", "server-ring"),
            keys("secure", "client.1", "c.key", "client-ring"),
            "refused client.1: our name is not in the peer's keyring",
        ),
        (
            "an impostor, auth",
            keys("auth", "server.1", "s.key", "impostor-ring"),
            keys("auth", "client.1", "c.key", "client-ring"),
            "refused client.1: the peer's keyring lists another key for our name",
        ),
        (
            "a keyless client",
            keys("auth", "server.1", "s.key", "server-ring"),
            vec!["--name".into(), "client.1".into()],
            "could not connect to tcp://127.0.0.1:",
        ),
    ];
    for (what, server, client, says) in cases {
        let server: Vec<&str> = server.iter().map(String::as_str).collect();
        let (_server, _lines, addr) = serve_with("tcp://127.0.0.1:0", &server);
        for cmd in ["ping", "stream"] {
            let mut argv: Vec<&str> = vec![cmd, &addr, "--count", "10"];
            argv.extend(client.iter().map(String::as_str));
            let started = Instant::now();
            let o = run(&argv, Duration::from_secs(60));
            if what == "a keyless client" {
                assert!(
                    o.stderr.contains("requires security mode auth"),
                    "{}",
                    o.stderr
                );
            }
            let took = started.elapsed();
            assert!(
                !o.status.success(),
                "{what}: {cmd} got through: {}",
                o.stdout
            );
            assert!(
                o.stderr.contains(says) && !o.stderr.contains("timed out"),
                "{what}: {cmd} said: {}",
                o.stderr
            );
            // Within a second on an idle machine; 5 s leaves room for a
            // busy one, and is far from the 15 s of a redialling client.
            assert!(took < Duration::from_secs(5), "{what}: {cmd} took {took:?}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
