//! The `msgr` tool inside the guest: one `msgr serve` and a series of
//! `msgr ping` / `msgr stream` clients against it in one guest command, each
//! client's `--json` result on a line of its own, parsed back on the host.
//!
//! Used to set msgr's figures beside the reference peers of
//! [`super::reference`] measured in the same guest boot (TCG figures mean
//! nothing on their own).

use super::{shell_quote, FiguresError, GuestCommand};
use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

/// One client run against the server.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ClientRun {
    /// `msgr ping --size SIZE --count COUNT --warmup WARMUP`.
    Ping {
        /// Message size, in bytes.
        size: u32,
        /// Pings measured.
        count: u32,
        /// Pings sent first and not measured.
        warmup: u32,
    },
    /// `msgr stream --size SIZE --duration SECS --seal false`.
    Stream {
        /// Message size, in bytes.
        size: u32,
        /// How long to stream, in seconds.
        secs: u32,
    },
}

impl ClientRun {
    /// The label of its result line, e.g. `ping-64`, `stream-65536`.
    pub fn label(&self) -> String {
        match self {
            ClientRun::Ping { size, .. } => format!("ping-{size}"),
            ClientRun::Stream { size, .. } => format!("stream-{size}"),
        }
    }

    fn args(&self) -> String {
        match *self {
            ClientRun::Ping {
                size,
                count,
                warmup,
            } => format!("ping \"$ADDR\" --size {size} --count {count} --warmup {warmup} --json"),
            // Checksummed on every send, as the guest's bandwidth rows have
            // been measured from the start (`msgr stream` seals by default).
            ClientRun::Stream { size, secs } => {
                format!("stream \"$ADDR\" --size {size} --duration {secs} --seal false --json")
            }
        }
    }
}

/// A guest command: `msgr serve ADDR` in the background (with `global`
/// options such as `--busy-poll-us 0` for server and clients alike), then each
/// run in order, each printing `result LABEL {json}`; then the server is
/// stopped (SIGTERM: it prints its counters) and its output follows a
/// `--- server ---` line. Fails if the server does not come up within 30 s,
/// if any client fails or if the server exits non-zero. `addr` must name a
/// fixed port (clients need it).
pub fn serve_and_run(
    name: impl Into<String>,
    tool: &Path,
    addr: &str,
    global: &[&str],
    runs: &[ClientRun],
) -> GuestCommand {
    let mut script = String::new();
    let tool = shell_quote(&tool.to_string_lossy());
    let global: Vec<String> = global.iter().map(|a| shell_quote(a)).collect();
    let global = global.join(" ");
    // `m` is the tool with the global options, for the clients; the server
    // is started directly so that `$!` is its pid (not a subshell's).
    let _ = writeln!(
        script,
        "m() {{ {tool} {global} \"$@\"; }}\n\
         ADDR={}\n\
         {tool} {global} serve \"$ADDR\" --duration 600 >$TMPDIR/serve.log 2>&1 &",
        shell_quote(addr)
    );
    script.push_str(
        "srv=$!\n\
         n=0\n\
         until grep -q '^listening on' $TMPDIR/serve.log; do\n\
         \x20 n=$((n + 1))\n\
         \x20 if [ $n -ge 300 ] || ! kill -0 $srv 2>/dev/null; then\n\
         \x20   echo \"msgr serve $ADDR did not come up within 30 s\"; cat $TMPDIR/serve.log\n\
         \x20   kill $srv 2>/dev/null; exit 1\n\
         \x20 fi\n\
         \x20 sleep 0.1\n\
         done\n\
         rc=0\n\
         client() {\n\
         \x20 label=$1; shift\n\
         \x20 out=$(m \"$@\")\n\
         \x20 r=$?\n\
         \x20 if [ $r -eq 0 ]; then echo \"result $label $out\"; else echo \"$label: exit $r: $out\"; rc=1; fi\n\
         }\n",
    );
    for run in runs {
        let _ = writeln!(script, "client {} {}", run.label(), run.args());
    }
    script.push_str(
        "kill -TERM $srv\n\
         wait $srv\n\
         src=$?\n\
         echo '--- server ---'\n\
         cat $TMPDIR/serve.log\n\
         if [ $src -ne 0 ]; then echo \"msgr serve: exit $src\"; rc=1; fi\n\
         exit $rc\n",
    );
    GuestCommand::shell(name, script).timeout(Duration::from_secs(180))
}

/// A guest command: for each of `sizes`, `transport_ping serve ADDR` (the
/// backend's `Transport` alone, backends/examples/transport_ping.rs) in the
/// background and `transport_ping ping` against it, printing `result
/// tping-SIZE {json}`. Fails if a server does not come up within 30 s or a
/// ping fails. `addr` must name a fixed port; each size uses the next one.
pub fn transport_ping_runs(
    name: impl Into<String>,
    program: &Path,
    addr: &str,
    port: u16,
    sizes: &[u32],
    count: u32,
    warmup: u32,
) -> GuestCommand {
    let mut script = format!(
        "t={}
rc=0
",
        shell_quote(&program.to_string_lossy())
    );
    for (i, size) in sizes.iter().enumerate() {
        let addr = addr.replace("{port}", &(port + i as u16).to_string());
        let _ = write!(
            script,
            r#"ADDR={addr}
$t serve "$ADDR" --seconds 150 >$TMPDIR/tserve.log 2>&1 &
srv=$!
n=0
until grep -q '^listening ' $TMPDIR/tserve.log; do
  n=$((n + 1))
  if [ $n -ge 300 ] || ! kill -0 $srv 2>/dev/null; then
    echo "transport_ping serve $ADDR did not come up within 30 s"; cat $TMPDIR/tserve.log
    kill $srv 2>/dev/null; exit 1
  fi
  sleep 0.1
done
out=$($t ping "$ADDR" --size {size} --count {count} --warmup {warmup} --seconds 100)
r=$?
if [ $r -eq 0 ]; then echo "$out" | sed 's/^result /result tping-{size} /'; else echo "tping-{size}: exit $r: $out"; rc=1; fi
kill $srv 2>/dev/null
wait $srv
cat $TMPDIR/tserve.log
"#,
            addr = shell_quote(&addr)
        );
    }
    script.push_str(
        "exit $rc
",
    );
    GuestCommand::shell(name, script).timeout(Duration::from_secs(240))
}

/// Label of the result line [`bench_rma`] prints.
const BENCH_RMA: &str = "bench-rma";

/// A guest command: `msgr bench --transport TRANSPORT --quick --only rma
/// --json` (with `global` options first): msgr's 1 MiB one-sided reads and
/// writes of a region the bench's server exposed, beside its 1 MiB message
/// stream, in one process; prints `result bench-rma {json}` on one line.
/// Fails if the bench fails. Parse it with [`parse_bench_rma`].
pub fn bench_rma(
    name: impl Into<String>,
    tool: &Path,
    transport: &str,
    global: &[&str],
) -> GuestCommand {
    let global: Vec<String> = global.iter().map(|a| shell_quote(a)).collect();
    let script = format!(
        "out=$({tool} {global} bench --transport {transport} --quick --only rma --json 2>$TMPDIR/bench.log)
         rc=$?
         if [ $rc -eq 0 ]; then echo \"result {BENCH_RMA} $(printf '%s' \"$out\" | tr -d '\\n')\"; \
         else echo \"{BENCH_RMA}: exit $rc: $out\"; fi
         cat $TMPDIR/bench.log
         exit $rc
",
        tool = shell_quote(&tool.to_string_lossy()),
        global = global.join(" "),
        transport = shell_quote(transport),
    );
    GuestCommand::shell(name, script).timeout(Duration::from_secs(120))
}

/// msgr's one-sided RMA figures from `msgr bench --only rma`.
#[derive(Clone, Debug, PartialEq)]
pub struct RmaFigures {
    /// Operation size, in bytes.
    pub size: u64,
    /// Reads' throughput, in MiB/s.
    pub read_mib_per_s: f64,
    /// Reads done.
    pub reads: u64,
    /// Writes' throughput, in MiB/s.
    pub write_mib_per_s: f64,
    /// Writes done.
    pub writes: u64,
}

/// The figures of a [`bench_rma`] command's output (median over the
/// bench's rounds). A run that did no operation is an error.
pub fn parse_bench_rma(out: &str) -> Result<RmaFigures, FiguresError> {
    let v = result_json(out, BENCH_RMA)?;
    let f = |p: &[&str]| num(&v, p, BENCH_RMA);
    let figures = RmaFigures {
        size: f(&["rma_read", "rounds", "0", "msgr", "size"])? as u64,
        read_mib_per_s: f(&["rma_read", "msgr"])?,
        reads: f(&["rma_read", "rounds", "0", "msgr", "messages"])? as u64,
        write_mib_per_s: f(&["rma_write", "msgr"])?,
        writes: f(&["rma_write", "rounds", "0", "msgr", "messages"])? as u64,
    };
    if figures.reads == 0 || figures.writes == 0 {
        return Err(FiguresError::NoOperation {
            label: BENCH_RMA.into(),
            figures: format!("{figures:?}"),
        });
    }
    Ok(figures)
}

/// The figures of `transport_ping ping --size size` in `out` (a
/// [`transport_ping_runs`] command's output), as [`PingFigures`].
pub fn parse_transport_ping(out: &str, size: u32) -> Result<PingFigures, FiguresError> {
    let label = format!("tping-{size}");
    let v = result_json(out, &label)?;
    let f = |key: &str| num(&v, &[key], &label);
    let figures = PingFigures {
        size: f("size")? as u64,
        count: f("count")? as u64,
        one_way_p50_us: f("p50_ns")? / 1e3,
        one_way_mean_us: f("mean_ns")? / 1e3,
        one_way_p99_us: f("p99_ns")? / 1e3,
        one_way_min_us: f("min_ns")? / 1e3,
    };
    if figures.count == 0 || figures.size != u64::from(size) {
        return Err(FiguresError::Implausible {
            label,
            figures: format!("{figures:?}"),
        });
    }
    Ok(figures)
}

/// `msgr ping` figures (µs, one-way = RTT / 2).
#[derive(Clone, Debug, PartialEq)]
pub struct PingFigures {
    /// Message size, in bytes.
    pub size: u64,
    /// Pings measured (warm-up excluded).
    pub count: u64,
    /// Median one-way latency.
    pub one_way_p50_us: f64,
    /// Mean one-way latency.
    pub one_way_mean_us: f64,
    /// 99th percentile one-way latency.
    pub one_way_p99_us: f64,
    /// Lowest one-way latency.
    pub one_way_min_us: f64,
}

/// `msgr stream` figures.
#[derive(Clone, Debug, PartialEq)]
pub struct StreamFigures {
    /// Message size, in bytes.
    pub size: u64,
    /// Messages sent.
    pub messages: u64,
    /// Throughput, in MiB/s.
    pub mib_per_s: f64,
    /// Message rate, in messages per second.
    pub msgs_per_s: f64,
    /// The sender's send work requests per message, where its transport
    /// counts them (RDMA: `sends_posted`).
    pub send_wrs_per_message: Option<f64>,
    /// The sender's completion-queue polls that found completions, per
    /// message (RDMA: `cq_polls`).
    pub cq_polls_per_message: Option<f64>,
}

fn result_json(out: &str, label: &str) -> Result<serde_json::Value, FiguresError> {
    let prefix = format!("result {label} ");
    let line = out
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .ok_or_else(|| FiguresError::NoResultLine(label.into()))?;
    serde_json::from_str(line).map_err(|e| FiguresError::BadJson {
        label: label.into(),
        reason: e.to_string(),
        line: line.into(),
    })
}

fn num(v: &serde_json::Value, path: &[&str], label: &str) -> Result<f64, FiguresError> {
    // A JSON pointer: array elements by index too (`rounds`, `0`).
    let x = v
        .pointer(&format!("/{}", path.join("/")))
        .ok_or_else(|| FiguresError::Missing {
            label: label.into(),
            path: path.join("."),
        })?
        .as_f64()
        .ok_or_else(|| FiguresError::NotNumber {
            label: label.into(),
            path: path.join("."),
        })?;
    if x.is_finite() {
        Ok(x)
    } else {
        Err(FiguresError::NotFinite {
            label: label.into(),
            path: path.join("."),
        })
    }
}

/// The figures of `msgr ping --size size` in `out` (a [`serve_and_run`]
/// command's output). A run with no samples is an error.
pub fn parse_ping(out: &str, size: u32) -> Result<PingFigures, FiguresError> {
    let label = ClientRun::Ping {
        size,
        count: 0,
        warmup: 0,
    }
    .label();
    let v = result_json(out, &label)?;
    let f = |p: &[&str]| num(&v, p, &label);
    let figures = PingFigures {
        size: f(&["ping", "size"])? as u64,
        count: f(&["ping", "count"])? as u64,
        one_way_p50_us: f(&["ping", "one_way", "p50_us"])?,
        one_way_mean_us: f(&["ping", "one_way", "mean_us"])?,
        one_way_p99_us: f(&["ping", "one_way", "p99_us"])?,
        one_way_min_us: f(&["ping", "one_way", "min_us"])?,
    };
    if figures.count == 0 || figures.size != u64::from(size) {
        return Err(FiguresError::Implausible {
            label,
            figures: format!("{figures:?}"),
        });
    }
    Ok(figures)
}

/// The figures of `msgr stream --size size` in `out`. A run that moved
/// nothing is an error.
pub fn parse_stream(out: &str, size: u32) -> Result<StreamFigures, FiguresError> {
    let label = ClientRun::Stream { size, secs: 0 }.label();
    let v = result_json(out, &label)?;
    let f = |p: &[&str]| num(&v, p, &label);
    let messages = f(&["stream", "messages"])?;
    let per_message = |counter: &str| {
        v.pointer(&format!("/stream/sender_transport/{counter}"))
            .and_then(serde_json::Value::as_f64)
            .map(|n| n / messages.max(1.0))
    };
    let figures = StreamFigures {
        size: f(&["stream", "size"])? as u64,
        messages: messages as u64,
        mib_per_s: f(&["stream", "mib_per_s"])?,
        msgs_per_s: f(&["stream", "msgs_per_s"])?,
        send_wrs_per_message: per_message("sends_posted"),
        cq_polls_per_message: per_message("cq_polls"),
    };
    if figures.messages == 0 || figures.size != u64::from(size) {
        return Err(FiguresError::Implausible {
            label,
            figures: format!("{figures:?}"),
        });
    }
    Ok(figures)
}

#[cfg(test)]
mod tests {
    use super::*;

    const OUT: &str = r#"result ping-64 {"target":"verbs://127.0.0.1:18700?dev=rxe0","ping":{"size":64,"count":2000,"warmup":200,"rtt":{"samples":2000,"min_us":80.0,"p50_us":100.0,"p99_us":300.0,"p999_us":900.0,"mean_us":120.0,"max_us":1000.0},"one_way":{"samples":2000,"min_us":40.0,"p50_us":50.0,"p99_us":150.0,"p999_us":450.0,"mean_us":60.0,"max_us":500.0},"elapsed_s":0.24}}
ping-2: exit 1: msgr: error: timed out
result stream-65536 {"target":"tcp://127.0.0.1:18701","driver":"callback","stream":{"size":65536,"messages":1000,"bytes":65536000,"elapsed_s":1.0,"mib_per_s":62.5,"gbit_per_s":0.52,"msgs_per_s":1000.0},"server_totals":{"pings":0,"stream_messages":1000,"stream_bytes":65536000}}
"#;

    #[test]
    fn parses_the_result_lines() {
        let p = parse_ping(OUT, 64).unwrap();
        assert_eq!((p.size, p.count), (64, 2000));
        assert_eq!((p.one_way_p50_us, p.one_way_mean_us), (50.0, 60.0));
        let s = parse_stream(OUT, 65536).unwrap();
        assert_eq!((s.messages, s.mib_per_s), (1000, 62.5));
        assert_eq!(s.send_wrs_per_message, None, "TCP counts no work requests");
        let verbs = r#"result stream-64 {"stream":{"size":64,"messages":4000,"mib_per_s":1.0,"msgs_per_s":9.0,"sender_transport":{"sends_posted":20,"cq_polls":10}}}"#;
        let s = parse_stream(verbs, 64).unwrap();
        assert_eq!(
            (s.send_wrs_per_message, s.cq_polls_per_message),
            (Some(0.005), Some(0.0025))
        );
        // A failed client has no result line: an error, never a figure.
        assert!(parse_ping(OUT, 2)
            .unwrap_err()
            .to_string()
            .contains("no result line"));
        assert!(parse_ping("result ping-64 {\"ping\":{}}", 64).is_err());
        assert!(parse_ping("result ping-64 not json", 64).is_err());
    }

    #[test]
    fn parses_transport_ping_lines() {
        let out = "result tping-64 {\"count\":2000,\"size\":64,\"p50_ns\":15000,\"mean_ns\":20000,\"p99_ns\":90000,\"min_ns\":9000}\ntping-2: exit 1: timed out";
        let p = parse_transport_ping(out, 64).unwrap();
        assert_eq!(
            (p.count, p.one_way_p50_us, p.one_way_min_us),
            (2000, 15.0, 9.0)
        );
        assert!(parse_transport_ping(out, 2)
            .unwrap_err()
            .to_string()
            .contains("no result line"));
        let c = transport_ping_runs(
            "x",
            Path::new("/t/transport_ping"),
            "rdmacm://198.51.100.2:{port}",
            19200,
            &[2, 64],
            10,
            1,
        );
        assert!(c.script.contains("ADDR=rdmacm://198.51.100.2:19201\n"));
        let out = std::process::Command::new("sh")
            .args(["-n", "-c", &c.script])
            .output()
            .expect("sh");
        assert!(out.status.success(), "{out:?}\n{}", c.script);
    }

    /// The bench command's script turns the bench's pretty JSON into one
    /// result line that parses; a bench that fails, or did no operation,
    /// gives no figures.
    #[test]
    fn bench_rma_prints_one_result_line_that_parses() {
        let dir = std::env::temp_dir().join(format!("msgr-bench-rma-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let run = |json: &str, exit: i32| {
            let fake = dir.join("msgr");
            std::fs::write(
                &fake,
                format!("#!/bin/sh\necho \"$*\" >&2\ncat <<'EOF'\n{json}\nEOF\nexit {exit}\n"),
            )
            .unwrap();
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
            let c = bench_rma("x", &fake, "verbs?dev=rxe0", &["--set", "a=b"]);
            let out = std::process::Command::new("sh")
                .args(["-c", &c.script])
                .env("TMPDIR", &dir)
                .output()
                .expect("sh");
            (
                out.status.success(),
                String::from_utf8_lossy(&out.stdout).into_owned(),
            )
        };
        let json = |reads: u64| {
            format!(
                "{{\n  \"rma_read\": {{\n    \"msgr\": 80.5,\n    \"rounds\": [{{\"msgr\": {{\"size\": 1048576, \"messages\": {reads}}}}}]\n  }},\n  \"rma_write\": {{\"msgr\": 70.0, \"rounds\": [{{\"msgr\": {{\"size\": 1048576, \"messages\": 9}}}}]}}\n}}"
            )
        };
        let (ok, out) = run(&json(12), 0);
        assert!(ok, "{out}");
        assert!(
            out.contains("--set a=b bench --transport verbs?dev=rxe0 --quick --only rma --json"),
            "{out}"
        );
        let f = parse_bench_rma(&out).unwrap();
        assert_eq!(
            (
                f.size,
                f.reads,
                f.writes,
                f.read_mib_per_s,
                f.write_mib_per_s
            ),
            (1 << 20, 12, 9, 80.5, 70.0)
        );
        let (_, out) = run(&json(0), 0);
        assert!(
            parse_bench_rma(&out)
                .unwrap_err()
                .to_string()
                .contains("no operation"),
            "{out}"
        );
        let (ok, out) = run("", 3);
        assert!(!ok && parse_bench_rma(&out).is_err(), "{out}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_script_is_valid_sh() {
        let c = serve_and_run(
            "x",
            Path::new("/work/target/release/msgr"),
            "verbs://127.0.0.1:18700?dev=rxe0",
            &["--busy-poll-us", "0"],
            &[
                ClientRun::Ping {
                    size: 2,
                    count: 10,
                    warmup: 1,
                },
                ClientRun::Stream {
                    size: 65536,
                    secs: 1,
                },
            ],
        );
        assert!(c.script.contains("ADDR='verbs://127.0.0.1:18700?dev=rxe0'"));
        assert!(c.script.contains("client ping-2 ping \"$ADDR\" --size 2"));
        assert!(c.script.contains("client stream-65536 stream"));
        let out = std::process::Command::new("sh")
            .args(["-n", "-c", &c.script])
            .output()
            .expect("sh");
        assert!(out.status.success(), "{out:?}\n{}", c.script);
    }
}
