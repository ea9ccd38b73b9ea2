#!/usr/bin/env bash
# 64 B ping-pong latency of msgr over tcp:// against a tokio ping-pong
# (tool/examples/tokio_pingpong.rs: current-thread runtimes, TCP_NODELAY,
# a length-prefixed echo), two processes each, on 127.0.0.1, rounds
# interleaved; one-way p50 and mean, medians and per-round ratios at the
# end. (fi_pingpong, busy-polling, is the other reference:
# scripts/bench-fabric.sh.) The machine's load before the run is printed.
#
#   scripts/bench-latency.sh                       # 5 rounds of 10,000 round trips of 64 B
#   ROUNDS=3 ITER=20000 SIZE=64 scripts/bench-latency.sh
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-5}
ITER=${ITER:-10000}
WARMUP=${WARMUP:-1000}
SIZE=${SIZE:-64}
PORT=${PORT:-7991}

cargo build --release -q -p msgr-tool --example tokio_pingpong
cargo build --release -q -p msgr-tool
msgr="$PWD/target/release/msgr"
tokio="$PWD/target/release/examples/tokio_pingpong"
out="$(mktemp)"
log="$(mktemp)"
trap 'rm -f "$out" "$log"' EXIT
echo "load before the run: $(cut -d' ' -f1-3 /proc/loadavg) (2 cores)"

# Starts a server command in the background and waits for its "listening" line.
start_server() {
  "$@" >"$log" 2>&1 &
  server=$!
  for _ in $(seq 200); do
    grep -q 'listening on' "$log" && return 0
    sleep 0.05
  done
  echo "server did not start: $*" >&2
  cat "$log" >&2
  return 1
}

stop_server() {
  kill -INT "$server" 2>/dev/null || true
  wait "$server" 2>/dev/null || true
}

for r in $(seq "$ROUNDS"); do
  start_server timeout 120 "$tokio" serve "127.0.0.1:$PORT"
  t=$(timeout 120 "$tokio" ping "127.0.0.1:$PORT" "$SIZE" "$ITER" "$WARMUP")
  stop_server
  PORT=$((PORT + 1))
  start_server timeout 120 "$msgr" serve "tcp://127.0.0.1:$PORT"
  m=$(timeout 120 "$msgr" ping "tcp://127.0.0.1:$PORT" --size "$SIZE" --count "$ITER" --warmup "$WARMUP" --json | tail -n 1)
  stop_server
  PORT=$((PORT + 1))
  echo "round $r: tokio $t"
  echo "round $r: msgr $m"
  printf '%s\t%s\n' "$t" "$m" >>"$out"
done

python3 - "$out" <<'EOF'
import json, statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
t = [json.loads(r[0]) for r in rows]
m = [json.loads(r[1])["ping"]["one_way"] for r in rows]
tp = [x["one_way_p50_us"] for x in t]
mp = [x["p50_us"] for x in m]
ratio = [a / b for a, b in zip(mp, tp)]
med = statistics.median
print(f"\n64 B ping-pong one-way p50, {len(rows)} rounds (median, per-round min-max):")
print(f"  tokio   {med(tp):7.2f} us")
print(f"  msgr    {med(mp):7.2f} us   {med(ratio):.2f}x tokio ({min(ratio):.2f}-{max(ratio):.2f})   target <= 1.2x")
EOF
