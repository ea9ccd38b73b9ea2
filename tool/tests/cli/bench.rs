//! `msgr backends` and `msgr bench`: every part in its quick run, its rows checked.

use super::*;

#[test]
fn backends_lists_tcp_available_and_verbs_unavailable_with_a_reason() {
    let o = run(&["backends"], Duration::from_secs(20));
    assert!(o.status.success(), "{}", o.stderr);
    let line = |kind: &str| {
        o.stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(kind))
            .unwrap_or_else(|| panic!("no `{kind}` line in:\n{}", o.stdout))
            .to_owned()
    };
    assert!(line("tcp").contains(" available"), "{}", o.stdout);
    let verbs = line("verbs");
    assert!(verbs.contains("unavailable"), "{verbs}");
    assert!(
        verbs.split("unavailable").nth(1).unwrap().trim().len() > 5,
        "no reason: {verbs}"
    );
    for kind in [
        "rdmacm",
        "fabric+tcp",
        "fabric+tcp?ep=rdm",
        "fabric+shm",
        "fabric+shm?ep=rdm",
    ] {
        line(kind);
    }

    let o = run(&["backends", "--json"], Duration::from_secs(20));
    let v: serde_json::Value = serde_json::from_str(&o.stdout).expect("backends JSON");
    let rows = v.as_array().expect("array");
    let tcp = rows.iter().find(|r| r["kind"] == "tcp").expect("tcp row");
    assert_eq!(tcp["available"], true);
    let verbs = rows
        .iter()
        .find(|r| r["kind"] == "verbs")
        .expect("verbs row");
    assert_eq!(verbs["available"], false);
    assert!(verbs["reason"].as_str().is_some_and(|r| !r.is_empty()));
}

/// `msgr bench --rma`: one-sided reads and writes of a region the server
/// exposed, against the message stream, with operations counted.
#[test]
fn bench_rma_reads_and_writes_an_exposed_region() {
    let o = run(
        &["bench", "--quick", "--json", "--only", "latency", "--rma"],
        Duration::from_secs(120),
    );
    assert!(o.status.success(), "stderr:\n{}", o.stderr);
    let v: serde_json::Value =
        serde_json::from_str(&o.stdout).unwrap_or_else(|e| panic!("not JSON ({e}):\n{}", o.stdout));
    for part in ["rma_read", "rma_write"] {
        let c = &v[part];
        assert!(c["ratio"].is_number(), "{part} missing in {v}");
        let m = &c["rounds"][0]["msgr"];
        assert!(
            m["messages"].as_u64().is_some_and(|n| n > 0),
            "{part}: no operation done: {m}"
        );
        assert_eq!(m["size"], 1 << 20);
    }
    // An operation of many parts beside them (64 MiB in a quick run).
    let huge = v["rma_huge"].as_array().expect("rma_huge");
    assert_eq!(huge.len(), 2, "{v}");
    for c in huge {
        assert!(c["ratio"].is_number(), "{c}");
        assert_eq!(c["rounds"][0]["msgr"]["size"], 64 << 20);
    }
    assert!(v["latency"]["ratio"].is_number(), "--only's part ran too");
}

/// `msgr bench --only conns`: several connections' aggregate 64 B rate,
/// each count in a row against one connection's, every message counted.
#[test]
fn bench_conns_measures_each_connection_count_against_one() {
    let args = [
        "bench",
        "--quick",
        "--only",
        "conns",
        "--connections",
        "4,2",
    ];
    let table = run(&args, Duration::from_secs(120));
    assert!(table.status.success(), "stderr:\n{}", table.stderr);
    let lines: Vec<&str> = table.stdout.lines().collect();
    for c in [2, 4] {
        let at = |title: String| {
            lines
                .iter()
                .position(|l| l.starts_with(&title))
                .unwrap_or_else(|| panic!("no row `{title}` in:\n{}", table.stdout))
        };
        // The server's CPU per message beside each rate.
        let rate = at(format!("64 B aggregate rate, {c} connections"));
        assert_eq!(
            at(format!("server CPU/msg, {c} connections")),
            rate + 1,
            "{}",
            table.stdout
        );
    }
    // And the server's turns: frames and messages per turn.
    assert!(
        table.stdout.contains("the server's worker turns")
            && table.stdout.contains("4 connections: "),
        "{}",
        table.stdout
    );
    // The JSON run at an equal window on every connection.
    let json = ["--json", "--conns-window", "32"];
    let o = run(&[&args[..], &json].concat(), Duration::from_secs(120));
    assert!(o.status.success(), "stderr:\n{}", o.stderr);
    let v: serde_json::Value =
        serde_json::from_str(&o.stdout).unwrap_or_else(|e| panic!("not JSON ({e}):\n{}", o.stdout));
    let rows = v["conns"].as_array().expect("conns rows");
    assert_eq!(rows.len(), 2, "{v}");
    for (row, c) in rows.iter().zip([2, 4]) {
        assert_eq!(
            row["metric"],
            format!("64 B aggregate rate, {c} connections")
        );
        let round = &row["rounds"][0];
        for who in ["msgr", "reference"] {
            assert_eq!(round[who]["size"], 64);
            assert!(
                round[who]["messages"].as_u64().is_some_and(|n| n > 0),
                "{who}: nothing streamed: {round}"
            );
        }
        assert!(row["ratio"].as_f64().is_some_and(|r| r > 0.0), "{row}");
    }
    // Beside each rate, the server's own CPU per message against one
    // connection's: its workers' threads only (never more than a core
    // each, where the clients' threads would add more), over the stretch
    // it was receiving.
    let workers = v["workers"].as_f64().expect("workers");
    let cpu = v["conns_server_cpu"].as_array().expect("server CPU rows");
    assert_eq!(cpu.len(), 2, "{v}");
    for ((row, rate), c) in cpu.iter().zip(rows).zip([2, 4]) {
        assert_eq!(row["metric"], format!("server CPU/msg, {c} connections"));
        assert_eq!(row["target_kind"], "max");
        let round = &row["rounds"][0];
        for who in ["msgr", "reference"] {
            let r = &round[who];
            let streamed = rate["rounds"][0][who]["messages"]
                .as_u64()
                .expect("streamed");
            let seen = r["messages"].as_u64().expect("messages");
            assert!(
                seen > 0 && seen <= streamed,
                "{who}: {seen} of {streamed} messages seen: {r}"
            );
            for f in [
                "cpu_s",
                "ns_per_message",
                "window_s",
                "frames_per_turn",
                "messages_per_turn",
            ] {
                assert!(r[f].as_f64().is_some_and(|x| x > 0.0), "{who}.{f}: {r}");
            }
            let cores = r["cores"].as_f64().expect("cores");
            assert!(
                cores > 0.0 && cores <= workers + 0.2,
                "{who}: {workers} worker(s) used {cores} cores: {r}"
            );
        }
    }
    assert_eq!(v["conns_window"], 32, "{v}");
    assert!(v["latency"].is_null(), "only the conns part ran");
}

/// The fields every row of a bench comparison carries; `targeted`: the
/// row has a target (else a figure for the record: null target and met).
fn assert_row(row: &serde_json::Value, targeted: bool) {
    for f in ["msgr", "reference", "ratio"] {
        assert!(row[f].as_f64().is_some_and(|x| x > 0.0), "{f} in {row}");
    }
    assert!(row["reference_name"].is_string(), "{row}");
    if targeted {
        assert!(row["target"].as_f64().is_some_and(|t| t > 0.0), "{row}");
        assert!(row["met"].is_boolean(), "{row}");
    } else {
        assert_eq!(row["target_kind"], "none", "{row}");
        assert!(row["target"].is_null() && row["met"].is_null(), "{row}");
    }
    assert!(!row["rounds"].as_array().expect("rounds").is_empty());
}

/// `msgr bench --only hol`: 64 B calls at the highest priority and at the
/// default beside 1 MiB and 64 MiB bulk messages, each p50 and p99 against
/// the same calls idle, and the bulk's rate beside either kind of call.
#[test]
fn bench_hol_times_calls_beside_bulk_against_the_idle_connection() {
    let o = run(
        &["bench", "--quick", "--json", "--only", "hol"],
        Duration::from_secs(180),
    );
    assert!(o.status.success(), "stderr:\n{}", o.stderr);
    let v: serde_json::Value =
        serde_json::from_str(&o.stdout).unwrap_or_else(|e| panic!("not JSON ({e}):\n{}", o.stdout));
    let rows = v["hol"].as_array().expect("hol rows");
    let mut want = Vec::new();
    for size in ["1 MiB", "64 MiB"] {
        for prio in [255, 0] {
            for p in ["p50", "p99"] {
                want.push(format!("hol {p}: {size} bulk, call prio {prio}"));
            }
        }
    }
    let got: Vec<&str> = rows.iter().filter_map(|r| r["metric"].as_str()).collect();
    assert_eq!(got, want, "{v}");
    for row in rows {
        let high_p99 = row["metric"]
            .as_str()
            .is_some_and(|m| m.starts_with("hol p99") && m.ends_with("prio 255"));
        assert_row(row, high_p99);
        if high_p99 {
            // The bar: twice the idle p99 and a fragment's time.
            assert!(row["target"].as_f64().is_some_and(|t| t > 2.0), "{row}");
        }
        let round = &row["rounds"][0];
        let (loaded, idle) = (&round["msgr"], &round["reference"]);
        // The bench promises one call at least beside each load (it stops
        // after LOADED_CAP windows): on a busy machine a default-class call
        // behind 64 MiB messages can take the whole cap.
        assert!(loaded["count"].as_u64().is_some_and(|n| n >= 1), "{loaded}");
        assert_eq!(idle["count"], 2000, "{idle}");
        for r in [loaded, idle] {
            assert_eq!(r["size"], 64);
            for f in ["p50_us", "p99_us"] {
                assert!(r["rtt"][f].as_f64().is_some_and(|x| x > 0.0), "{f}: {r}");
            }
        }
    }
    let bulk = v["hol_bulk"].as_array().expect("hol_bulk rows");
    assert_eq!(bulk.len(), 2, "{v}");
    for (row, size) in bulk.iter().zip([1u64 << 20, 64 << 20]) {
        assert_row(row, true);
        assert_eq!(row["target_kind"], "min");
        for who in ["msgr", "reference"] {
            let r = &row["rounds"][0][who];
            assert_eq!(r["size"], size, "{r}");
            assert!(r["messages"].as_u64().is_some_and(|n| n > 0), "{who}: {r}");
        }
    }
    assert!(v["latency"].is_null() && v["mixed"].as_array().is_some_and(|m| m.is_empty()));
}

/// `msgr bench --only mixed`: several clients' calls, heartbeats and bulk
/// at once; each class's p50 and p99 against an idle connection's, the
/// bulk's throughput against the bulk alone.
#[test]
fn bench_mixed_reports_each_class_and_the_bulk() {
    let o = run(
        &["bench", "--quick", "--json", "--only", "mixed"],
        Duration::from_secs(120),
    );
    assert!(o.status.success(), "stderr:\n{}", o.stderr);
    let v: serde_json::Value =
        serde_json::from_str(&o.stdout).unwrap_or_else(|e| panic!("not JSON ({e}):\n{}", o.stdout));
    let rows = v["mixed"].as_array().expect("mixed rows");
    let got: Vec<&str> = rows.iter().filter_map(|r| r["metric"].as_str()).collect();
    assert_eq!(
        got,
        [
            "mixed p50: calls, 3 clients",
            "mixed p99: calls, 3 clients",
            "mixed p50: heartbeats, 3 clients",
            "mixed p99: heartbeats, 3 clients",
        ],
        "{v}"
    );
    for row in rows {
        let p99 = row["metric"]
            .as_str()
            .is_some_and(|m| m.starts_with("mixed p99"));
        assert_row(row, p99);
        for who in ["msgr", "reference"] {
            let r = &row["rounds"][0][who];
            assert!(r["count"].as_u64().is_some_and(|n| n > 0), "{who}: {r}");
            assert!(r["rtt"]["p99_us"].as_f64().is_some_and(|x| x > 0.0), "{r}");
        }
    }
    let bulk = &v["mixed_bulk"];
    assert_row(bulk, true);
    assert_eq!(bulk["metric"], "mixed bulk: 3 clients, with calls");
    for who in ["msgr", "reference"] {
        let r = &bulk["rounds"][0][who];
        assert_eq!(r["size"], 1 << 20, "{r}");
        assert!(r["messages"].as_u64().is_some_and(|n| n > 0), "{who}: {r}");
    }
    assert!(
        v["hol"].as_array().is_some_and(|h| h.is_empty()),
        "only the mixed part ran"
    );
}

#[test]
fn bench_quick_json_has_the_expected_fields() {
    let o = run(&["bench", "--quick", "--json"], Duration::from_secs(120));
    assert!(
        o.status.success(),
        "stderr:\n{}\nstdout:\n{}",
        o.stderr,
        o.stdout
    );
    let v: serde_json::Value =
        serde_json::from_str(&o.stdout).unwrap_or_else(|e| panic!("not JSON ({e}):\n{}", o.stdout));
    assert_eq!(v["transport"], "tcp");
    assert_eq!(v["quick"], true);
    assert_eq!(
        v["pinned"],
        expected_pinning(&v, true),
        "{}",
        v["placement"]
    );
    assert!(v["machine"]["quiet"].is_boolean());
    assert!(v["machine"]["cores"].as_u64().is_some_and(|c| c >= 1));
    assert!(v["machine"]["loadavg_before"].is_array());
    for part in [
        "latency",
        "bandwidth",
        "message_rate",
        "secure_bandwidth",
        "secure_rate",
    ] {
        let c = &v[part];
        for field in ["msgr", "reference", "ratio", "target"] {
            assert!(c[field].is_number(), "{part}.{field} missing in {c}");
        }
        assert!(c["met"].is_boolean(), "{part}.met");
        assert!(c["reference_name"].is_string());
        assert!(!c["rounds"].as_array().expect("rounds").is_empty());
    }
    let r = &v["latency"]["rounds"][0];
    for who in ["msgr", "reference"] {
        for f in ["min_us", "p50_us", "p99_us", "p999_us", "mean_us"] {
            assert!(r[who]["one_way"][f].is_number(), "{who}.one_way.{f}");
            assert!(r[who]["rtt"][f].is_number(), "{who}.rtt.{f}");
        }
    }
    let s = &v["bandwidth"]["rounds"][0]["msgr"];
    for f in ["mib_per_s", "gbit_per_s", "msgs_per_s", "messages", "bytes"] {
        assert!(s[f].is_number(), "bandwidth msgr {f}");
    }
    assert_eq!(v["bandwidth"]["rounds"][0]["msgr"]["size"], 1 << 20);
    assert_eq!(v["message_rate"]["rounds"][0]["msgr"]["size"], 64);
}

/// What `msgr bench --pin PIN` reports as `pinned` in its JSON `v`: each
/// messenger's worker on a CPU of its own where there are two and the
/// machine was quiet before the run (as the report itself says), else null.
fn expected_pinning(v: &serde_json::Value, pin: bool) -> serde_json::Value {
    assert!(
        v["placement"].as_str().is_some_and(|p| !p.is_empty()),
        "{v}"
    );
    let quiet_before = v["machine"]["other_cores_before"]
        .as_f64()
        .is_some_and(|o| o < 0.2);
    match msgr::allowed_cpus()[..] {
        [a, b, ..] if pin && quiet_before => serde_json::json!([a, b]),
        _ => serde_json::Value::Null,
    }
}

/// `msgr bench` over an address with options (`?ep=rdm`), and the
/// placement it reports: each messenger's worker on a CPU of its own where
/// there are two and the machine was quiet, nothing pinned with `--pin false`.
#[cfg(feature = "fabric")]
#[test]
fn bench_over_fabric_shm_pins_server_and_client_apart() {
    for pin in ["true", "false"] {
        let o = run(
            &[
                "bench",
                "--transport",
                "fabric+shm?ep=rdm",
                "--quick",
                "--only",
                "latency",
                "--pin",
                pin,
                "--json",
            ],
            Duration::from_secs(120),
        );
        assert!(o.status.success(), "bench: {}", o.stderr);
        let v: serde_json::Value = serde_json::from_str(&o.stdout).expect("bench JSON");
        assert_eq!(v["transport"], "fabric+shm?ep=rdm");
        assert!(
            v["latency"]["msgr"].as_f64().is_some_and(|x| x > 0.0),
            "{v}"
        );
        assert_eq!(
            v["pinned"],
            expected_pinning(&v, pin == "true"),
            "--pin {pin}: {}",
            v["placement"]
        );
    }
}

/// `msgr bench --rma` over `fabric+shm?ep=rdm`: each size's RMA reads and
/// writes have a row against the raw libfabric loop measured in the same
/// run, both figures above zero, and the references line names that loop.
#[cfg(feature = "fabric")]
#[test]
fn bench_rma_over_shm_is_measured_against_the_raw_fabric_loop() {
    let args = [
        "bench",
        "--transport",
        "fabric+shm?ep=rdm",
        "--quick",
        "--only",
        "rma",
    ];
    let o = run(&args, Duration::from_secs(180));
    assert!(o.status.success(), "bench: {}\n{}", o.stderr, o.stdout);
    let references = o
        .stdout
        .lines()
        .find(|l| l.starts_with("references:"))
        .unwrap_or_else(|| panic!("no references line in:\n{}", o.stdout));
    assert!(
        references.contains("raw libfabric fi_read/fi_write loop, shm RDM"),
        "{references}"
    );
    for size in ["4 KiB", "64 KiB", "1 MiB", "4 MiB"] {
        for op in ["read", "write"] {
            let metric = format!("RMA {size} {op}s vs raw fi_{op}");
            let row = o
                .stdout
                .lines()
                .find(|l| l.starts_with(&metric))
                .unwrap_or_else(|| panic!("no `{metric}` row in:\n{}", o.stdout));
            // `<metric>  <msgr> MiB/s  <raw loop> MiB/s  <ratio>× ...`
            let figures: Vec<f64> = row[metric.len()..]
                .split("MiB/s")
                .take(2)
                .map(|f| f.trim().parse().unwrap_or(f64::NAN))
                .collect();
            assert!(
                figures.len() == 2 && figures.iter().all(|&f| f > 0.0),
                "`{metric}`: msgr and raw loop figures should be > 0: {row}"
            );
        }
    }
}
