//! `msgr rma` against the region `msgr serve --expose` offers.

use super::*;

/// What `msgr serve --expose` fills its region with: byte `i` is `i % 251`.
fn expose_pattern(range: std::ops::Range<usize>) -> Vec<u8> {
    range.map(|i| (i % 251) as u8).collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex"))
        .collect()
}

/// The handle `msgr serve --expose` prints after its address (`region HANDLE`).
fn region_handle(s: &Served) -> String {
    let line = s
        .lines
        .recv_timeout(Duration::from_secs(20))
        .expect("a region line");
    line.strip_prefix("region ")
        .unwrap_or_else(|| panic!("unexpected line after the address: {line:?}"))
        .to_owned()
}

/// `handle` (hex of its postcard bytes) changed by `forge`.
fn forged(handle: &str, forge: impl FnOnce(&mut msgr::RmaHandle)) -> String {
    use msgr::Codec;
    let mut h: msgr::RmaHandle = msgr::Postcard.decode(&unhex(handle)).expect("a handle");
    forge(&mut h);
    hex(&msgr::Postcard.encode(&h).expect("encodes"))
}

/// `msgr serve BIND --expose 64K`, then `msgr rma` against it from other
/// processes: a range read shows the serve's pattern, a write reads back
/// (with and without the end-to-end checksum, from hex and from a file),
/// and each refusal exits with its own code and says why. SIGTERM then
/// stops the server as SIGINT does: counters, exit 0.
fn rma_against_serve_expose(bind: &str) {
    let mut s = serve_args(&["serve", bind, "--duration", "60", "--expose", "64K"]);
    let handle = region_handle(&s);
    let addr = s.addr.clone();
    let rma = |args: &[&str]| {
        let all = [
            &["rma", &addr, "--handle", &handle, "--timeout", "30"],
            args,
        ]
        .concat();
        run(&all, Duration::from_secs(60))
    };
    let ok = |args: &[&str]| {
        let o = rma(args);
        assert!(o.status.success(), "rma {args:?} at {addr}: {}", o.stderr);
        o.stdout.trim().to_owned()
    };

    // Reads, twice over each range (over fabric the second may be native).
    for _ in 0..2 {
        assert_eq!(
            ok(&["--read", "1000:300"]),
            hex(&expose_pattern(1000..1300))
        );
        assert_eq!(
            ok(&["--read", "65000:536", "--checksum"]),
            hex(&expose_pattern(65000..65536))
        );
    }

    // Writes read back, and only the range written changed.
    assert_eq!(
        ok(&["--write", "4094", "--data", "C0FFEE", "--checksum"]),
        "wrote 3 bytes at offset 4094"
    );
    let dir = std::env::temp_dir();
    // One pair of files per run: the tcp and shm runs of this test go on
    // at once in this process (a name from the pid alone was shared, and
    // one run removed the other's input).
    let scheme = bind.split("://").next().unwrap_or("x").replace('+', "-");
    let tag = format!("{}-{scheme}", std::process::id());
    let from = dir.join(format!("msgr-cli-rma-in-{tag}"));
    let out = dir.join(format!("msgr-cli-rma-out-{tag}"));
    std::fs::write(&from, b"from a file").expect("write the input");
    let said = ok(&["--write", "8", "--from", from.to_str().expect("UTF-8")]);
    assert_eq!(said, "wrote 11 bytes at offset 8");
    let mut want = expose_pattern(4090..4100);
    want[4..7].copy_from_slice(&[0xc0, 0xff, 0xee]);
    assert_eq!(ok(&["--read", "4090:10"]), hex(&want));
    let said = ok(&["--read", "6:15", "--out", out.to_str().expect("UTF-8")]);
    assert!(said.starts_with("read 15 bytes to "), "{said}");
    let got = std::fs::read(&out).expect("the output file");
    let _ = (std::fs::remove_file(&from), std::fs::remove_file(&out));
    assert_eq!(&got, b"\x06\x07from a file\x13\x14");

    // --repeat: many operations on one connection, a rate, how many went
    // natively (over fabric+shm the reads after the first; none over tcp).
    let o = rma(&["--read", "8192:4096", "--repeat", "50"]);
    assert!(o.status.success(), "{}", o.stderr);
    assert!(
        o.stdout.trim() == hex(&expose_pattern(8192..12288)),
        "the bytes read"
    );
    let summary = o
        .stderr
        .lines()
        .find(|l| l.starts_with("50 operations of 4096 bytes in "))
        .unwrap_or_else(|| panic!("no summary: {}", o.stderr));
    let native: u64 = summary
        .rsplit("; ")
        .next()
        .and_then(|n| n.strip_suffix(" native"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{summary}"));
    assert_eq!(
        native,
        if bind.starts_with("fabric+shm") {
            49
        } else {
            0
        },
        "{summary}"
    );
    let o = rma(&["--read", "0:1", "--repeat", "0"]);
    assert_eq!(o.status.code(), Some(2), "{}", o.stderr);

    // --ranges: one call, several ranges in flight, one completion; the
    // bytes land in order (written in 3 ranges, read back in 7 and in 1).
    let data: Vec<u8> = (0..1000u32).map(|i| (i * 7 % 256) as u8).collect();
    assert_eq!(
        ok(&["--write", "20000", "--data", &hex(&data), "--ranges", "3"]),
        "wrote 1000 bytes at offset 20000"
    );
    let mut want = expose_pattern(19990..20000);
    want.extend_from_slice(&data);
    assert_eq!(ok(&["--read", "19990:1010", "--ranges", "7"]), hex(&want));
    assert_eq!(ok(&["--read", "19990:1010"]), hex(&want));
    let o = rma(&["--read", "0:4", "--ranges", "0"]);
    assert_eq!(o.status.code(), Some(2), "{}", o.stderr);
    // A range outside the region fails the whole call with its code.
    let o = rma(&["--read", "65000:600", "--ranges", "2"]);
    assert_eq!(o.status.code(), Some(5), "{}", o.stderr);

    // Refusals: the code of each, and what it says.
    let denied = forged(&handle, |h| h.capability[0] ^= 1);
    let unknown = forged(&handle, |h| h.region += 1);
    let read_only = forged(&handle, |h| h.access = msgr::Access::Read);
    for (handle, args, code, says) in [
        (&denied, &["--read", "0:4"][..], 3, "refused the handle"),
        (&unknown, &["--read", "0:4"][..], 4, "no such region"),
        (
            &handle,
            &["--read", "65530:7"][..],
            5,
            "not inside the region",
        ),
        (
            &handle,
            &["--write", "65535", "--data", "0102"][..],
            5,
            "not inside",
        ),
        (
            &read_only,
            &["--write", "0", "--data", "00"][..],
            6,
            "does not allow Write",
        ),
    ] {
        let all = [&["rma", &addr, "--handle", handle, "--timeout", "30"], args].concat();
        let o = run(&all, Duration::from_secs(60));
        assert_eq!(o.status.code(), Some(code), "rma {args:?}: {}", o.stderr);
        assert!(o.stderr.contains(says), "rma {args:?}: {}", o.stderr);
        assert!(!o.stderr.contains("panicked"), "{}", o.stderr);
    }
    // The region is untouched by the refused write.
    assert_eq!(ok(&["--read", "0:4"]), hex(&expose_pattern(0..4)));

    let (status, rest) = stop_with(&mut s.guard, &s.lines, libc::SIGTERM);
    assert!(status.success(), "{status:?}");
    assert!(
        rest.iter().any(|l| l.starts_with("# msgr serve")),
        "{rest:?}"
    );
}

#[test]
fn rma_reads_and_writes_a_region_serve_exposes_over_tcp() {
    rma_against_serve_expose("tcp://127.0.0.1:0");
}

#[cfg(feature = "fabric")]
#[test]
fn rma_reads_and_writes_a_region_serve_exposes_over_fabric_shm() {
    rma_against_serve_expose("fabric+shm://127.0.0.1:0?ep=rdm");
}

/// `msgr rma` refuses bad handles, ranges and sizes before connecting.
#[test]
fn rma_bad_input_is_refused_at_once() {
    let h = {
        use msgr::Codec;
        let h = msgr::RmaHandle {
            region: 1,
            len: 4096,
            access: msgr::Access::ReadWrite,
            capability: [7; 16],
        };
        hex(&msgr::Postcard.encode(&h).expect("encodes"))
    };
    let h = h.as_str();
    for (args, says) in [
        (&["--handle", "zz", "--read", "0:1"][..], "--handle"),
        (
            &["--handle", "0102", "--read", "0:1"][..],
            "not a region handle",
        ),
        (&["--handle", h, "--read", "0"][..], "OFFSET:LEN"),
        (&["--handle", h][..], "--read"),
        (&["--handle", h, "--write", "0"][..], "--data"),
    ] {
        let all = [&["rma", "tcp://127.0.0.1:1"], args].concat();
        let o = run(&all, Duration::from_secs(20));
        assert_eq!(o.status.code(), Some(2), "rma {args:?}: {}", o.stderr);
        assert!(o.stderr.contains(says), "rma {args:?}: {}", o.stderr);
    }
    let o = run(
        &[
            "serve",
            "tcp://127.0.0.1:0",
            "--expose",
            "2G",
            "--duration",
            "1",
        ],
        Duration::from_secs(20),
    );
    assert_eq!(o.status.code(), Some(2), "{}", o.stderr);
    assert!(o.stderr.contains("--expose"), "{}", o.stderr);
}

/// The value of the counter `msgr_NAME` in serve's closing lines.
fn counter(rest: &[String], name: &str) -> u64 {
    let key = format!("msgr_{name} ");
    rest.iter()
        .find_map(|l| l.strip_prefix(&key))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no counter {name} in {rest:?}"))
}

/// `msgr serve --expose 1M --shared` exposes bytes it keeps: reads (in
/// one range and in several) return the pattern, a write is refused for
/// its rights, and the owner copied nothing (`rma_bytes_copied` 0). The
/// same reads of a region the messenger owns count their copies, so the
/// 0 is the shared path's, not a counter that never moves.
#[test]
fn serve_shared_answers_reads_without_a_copy() {
    let mut copied = Vec::new();
    for shared in [true, false] {
        let mut args = vec!["serve", "tcp://127.0.0.1:0", "--duration", "60"];
        args.extend(["--expose", "1M"]);
        if shared {
            args.push("--shared");
        }
        let mut s = serve_args(&args);
        let handle = region_handle(&s);
        let rma = |args: &[&str]| {
            let all = [
                &["rma", &s.addr, "--handle", &handle, "--timeout", "30"],
                args,
            ]
            .concat();
            run(&all, Duration::from_secs(60))
        };
        for ranges in ["1", "5"] {
            let o = rma(&["--read", "1000:200000", "--ranges", ranges]);
            assert!(o.status.success(), "{}", o.stderr);
            assert!(
                o.stdout.trim() == hex(&expose_pattern(1000..201000)),
                "the bytes read"
            );
        }
        if shared {
            let o = rma(&["--write", "0", "--data", "00"]);
            assert_eq!(o.status.code(), Some(6), "{}", o.stderr);
            assert!(o.stderr.contains("does not allow Write"), "{}", o.stderr);
        }
        let (status, rest) = stop_with(&mut s.guard, &s.lines, libc::SIGTERM);
        assert!(status.success(), "{status:?}");
        copied.push(counter(&rest, "rma_bytes_copied"));
    }
    assert_eq!(copied[0], 0, "the shared region's reads were copied");
    assert!(
        copied[1] >= 400_000,
        "the owned region's copies: {copied:?}"
    );
}
