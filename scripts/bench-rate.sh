#!/usr/bin/env bash
# 64 B message rate of msgr over tcp:// against ZeroMQ PUSH/PULL (libzmq,
# C: tool/reference/zmq_pushpull.c) on 127.0.0.1, in one run, rounds
# interleaved; msgr once with batch frames (the default) and once with a
# frame per message (batch_max_bytes=0), so the run shows what batching
# does. Medians and per-round ratios at the end; the machine's load before
# the run is printed, since these VMs' wall-clock figures swing with it.
#
#   scripts/bench-rate.sh                  # 5 rounds of 2,000,000 messages
#   ROUNDS=3 COUNT=1000000 SIZE=64 scripts/bench-rate.sh
#   JSON=out.jsonl scripts/bench-rate.sh   # one JSON object per measurement
#   CONNS=1,16,256 scripts/bench-rate.sh   # many connections instead (below)
#   SHM=1 scripts/bench-rate.sh            # the shared-memory path instead (below)
#
# With CONNS, the aggregate 64 B rate of each count of connections into one
# server: per round, ZeroMQ with as many PUSH sockets
# round robin into one PULL (COUNT messages in all), then `msgr bench
# --only conns` (a client messenger per connection, 1 s per count); each
# count's rate against one connection's in the same round, and msgr's
# against ZeroMQ's. CONNS must list 1.
#
# With SHM=1, libfabric's shm provider: per round, the
# raw provider's message rate (tool/reference/fi_rate.c: FI_EP_RDM,
# fi_inject, two processes, busy-polled CQs), msgr stream over
# fabric+shm?ep=rdm and over tcp://, then fi_pingpong -p shm -e rdm and
# msgr ping over fabric+shm (ITER round trips, default 20,000, of SIZE
# bytes). Bars: msgr's shm rate >= 1.5x its tcp:// rate, and its shm p50
# one-way <= 1.5x fi_pingpong's (which prints a mean only), in one round.
# BASE=/path/to/an/older/msgr adds, per round, that binary's shm stream and
# ping (server and client both), and msgr's ratios to it in each round:
# a before/after comparison interleaved with the rest.
#
# Installs libzmq3-dev when missing (not for SHM=1). Every process is bounded by `timeout`.
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-5}
COUNT=${COUNT:-2000000}
SIZE=${SIZE:-64}
PORT=${PORT:-7961}

if [ -n "${SHM:-}" ]; then
  ITER=${ITER:-20000}
  command -v fi_pingpong >/dev/null || { echo "fi_pingpong (libfabric-bin) is needed for SHM=1" >&2; exit 1; }
  mkdir -p target/bench
  cc -O2 -o target/bench/fi_rate tool/reference/fi_rate.c -lfabric
  cargo build --release -q -p msgr-tool --features fabric
  bin="${CARGO_TARGET_DIR:-$PWD/target}/release/msgr"
  out="$(mktemp)"
  log="$(mktemp)"
  trap 'rm -f "$out" "$log" "$log.fis" "$log.fic"' EXIT
  echo "load before the run: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) cores)"
  # Starts `msgr serve ADDR`; sets SRV and ADDR (the address it bound).
  # A second argument: the msgr binary to serve with (default: this one).
  serve() {
    timeout 300 "${2:-$bin}" serve "$1" --duration 280 >"$log" 2>&1 &
    SRV=$!
    ADDR=""
    for _ in $(seq 100); do
      ADDR=$(sed -n 's/^listening on //p' "$log" | head -1)
      [ -n "$ADDR" ] && return 0
      sleep 0.1
    done
    echo "msgr serve $1 did not start:" >&2; cat "$log" >&2; exit 1
  }
  stop() { kill -INT "$SRV" 2>/dev/null || true; wait "$SRV" 2>/dev/null || true; }
  for r in $(seq "$ROUNDS"); do
    raw=$(timeout 120 target/bench/fi_rate -p shm -n "$COUNT" -s "$SIZE")
    serve 'fabric+shm://127.0.0.1:0?ep=rdm'
    shm=$(timeout 120 "$bin" stream "$ADDR" --size "$SIZE" --count "$COUNT" --json | tail -n 1)
    stop
    serve tcp://127.0.0.1:0
    tcp=$(timeout 120 "$bin" stream "$ADDR" --size "$SIZE" --count "$COUNT" --json | tail -n 1)
    stop
    timeout 120 fi_pingpong -p shm -e rdm -I "$ITER" -S "$SIZE" -B "$PORT" >"$log.fis" 2>&1 &
    fis=$!
    sleep 0.3
    timeout 120 fi_pingpong -p shm -e rdm -I "$ITER" -S "$SIZE" -P "$PORT" 127.0.0.1 >"$log.fic" 2>&1 \
      || { echo "fi_pingpong -p shm failed:" >&2; cat "$log.fic" "$log.fis" >&2; exit 1; }
    wait "$fis" || true
    PORT=$((PORT + 2))
    # fabtests abbreviate sizes and counts (64, 64k; 20k): match the shape.
    fi_us=$(awk 'NF >= 8 && $1 ~ /^[0-9]+[kmg]?$/ && $7 ~ /^[0-9.]+$/ {v = $7} END {print v}' "$log.fic")
    serve 'fabric+shm://127.0.0.1:0?ep=rdm'
    ping=$(timeout 120 "$bin" ping "$ADDR" --size "$SIZE" --count "$ITER" --warmup 1000 --json | tail -n 1)
    stop
    base_shm=- base_ping=-
    if [ -n "${BASE:-}" ]; then
      serve 'fabric+shm://127.0.0.1:0?ep=rdm' "$BASE"
      base_shm=$(timeout 120 "$BASE" stream "$ADDR" --size "$SIZE" --count "$COUNT" --json | tail -n 1)
      stop
      serve 'fabric+shm://127.0.0.1:0?ep=rdm' "$BASE"
      base_ping=$(timeout 120 "$BASE" ping "$ADDR" --size "$SIZE" --count "$ITER" --warmup 1000 --json | tail -n 1)
      stop
    fi
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$raw" "$shm" "$tcp" "$fi_us" "$ping" "$base_shm" "$base_ping" >>"$out"
    python3 - "$raw" "$shm" "$tcp" "$fi_us" "$ping" "$r" <<'EOF'
import json, sys
raw, shm, tcp = (json.loads(a) for a in sys.argv[1:4])
ping = json.loads(sys.argv[5])["ping"]["one_way"]
print(f"round {sys.argv[6]}: raw shm {raw['msgs_per_s']/1e6:.2f} M msg/s, msgr shm {shm['stream']['msgs_per_s']/1e6:.2f},"
      f" msgr tcp {tcp['stream']['msgs_per_s']/1e6:.2f}; fi_pingpong shm {sys.argv[4]} us, msgr shm p50 {ping['p50_us']:.2f} us")
EOF
  done
  python3 - "$out" "${JSON:-}" <<'EOF'
import json, statistics, sys
rows = [line.rstrip("\n").split("\t") for line in open(sys.argv[1])]
raw = [json.loads(r[0])["msgs_per_s"] for r in rows]
shm = [json.loads(r[1])["stream"]["msgs_per_s"] for r in rows]
tcp = [json.loads(r[2])["stream"]["msgs_per_s"] for r in rows]
fi = [float(r[3]) for r in rows]
p50 = [json.loads(r[4])["ping"]["one_way"]["p50_us"] for r in rows]
m = statistics.median
def ratios(a, b): return [x / y for x, y in zip(a, b)]
def show(v): return f"{m(v):.2f}x ({min(v):.2f}-{max(v):.2f})"
print(f"\n{rows and json.loads(rows[0][0])['size']} B over shared memory, {len(rows)} rounds (median; per-round ratios: median, min-max):")
for label, figure in [
    ("raw libfabric shm (fi_inject)", f"{m(raw)/1e6:6.2f} M msg/s"),
    ("msgr fabric+shm?ep=rdm", f"{m(shm)/1e6:6.2f} M msg/s  {show(ratios(shm, tcp))} msgr tcp://  target >= 1.5x;"
                               f"  {show(ratios(shm, raw))} raw shm"),
    ("msgr tcp://", f"{m(tcp)/1e6:6.2f} M msg/s"),
    ("fi_pingpong -p shm one-way", f"{m(fi):6.2f} us (its mean)"),
    ("msgr ping fabric+shm, p50", f"{m(p50):6.2f} us  {show(ratios(p50, fi))} fi_pingpong  target <= 1.5x"),
]:
    print(f"  {label:<30} {figure}")
if rows and rows[0][5] != "-":
    base = [json.loads(r[5])["stream"]["msgs_per_s"] for r in rows]
    base_p50 = [json.loads(r[6])["ping"]["one_way"]["p50_us"] for r in rows]
    print(f"  {'BASE msgr fabric+shm':<30} {m(base)/1e6:6.2f} M msg/s  msgr shm {show(ratios(shm, base))} of it")
    print(f"  {'BASE msgr ping shm, p50':<30} {m(base_p50):6.2f} us  msgr shm {show(ratios(p50, base_p50))} of it")
if sys.argv[2]:
    with open(sys.argv[2], "a") as o:
        o.write(json.dumps({"bench": "shm", "raw": raw, "shm": shm, "tcp": tcp,
                            "fi_pingpong_us": fi, "shm_p50_us": p50}) + "\n")
EOF
  exit 0
fi

if ! dpkg-query -W -f='${db:Status-Status}' libzmq3-dev 2>/dev/null | grep -qx installed; then
  echo "installing libzmq3-dev"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libzmq3-dev
fi
mkdir -p target/bench
cc -O2 -o target/bench/zmq_pushpull tool/reference/zmq_pushpull.c -lzmq -lpthread
cargo build --release -q -p msgr-tool
bin="${CARGO_TARGET_DIR:-$PWD/target}/release/msgr"
zmq="$PWD/target/bench/zmq_pushpull"
out="$(mktemp)"
trap 'rm -f "$out"' EXIT

echo "load before the run: $(cut -d' ' -f1-3 /proc/loadavg) (2 cores)"

if [ -n "${CONNS:-}" ]; then
  for r in $(seq "$ROUNDS"); do
    for c in ${CONNS//,/ }; do
      z=$(timeout 120 "$zmq" "$PORT" "$COUNT" "$SIZE" "$c")
      PORT=$((PORT + 1))
      echo "round $r: zmq, $c connections: $z"
      printf 'zmq\t%s\t%s\n' "$c" "$z" >>"$out"
    done
    m=$(timeout 300 "$bin" bench --only conns --rounds 1 --connections "$CONNS" --json | tr -d '\n')
    printf 'msgr\t%s\t%s\n' "$r" "$m" >>"$out"
  done
  python3 - "$out" "${JSON:-}" <<'EOF'
import json, statistics, sys
zmq, msgr = {}, []
for line in open(sys.argv[1]):
    who, key, text = line.rstrip("\n").split("\t")
    if who == "zmq":
        zmq.setdefault(int(key), []).append(json.loads(text)["msgs_per_s"])
        continue
    rows = json.loads(text)["conns"]
    # Each row: a count's rate, and one connection's (the reference) in that round.
    rates = {int(c["metric"].split(", ")[1].split()[0]): c["rounds"][0]["msgr"]["msgs_per_s"] for c in rows}
    rates[1] = rows[0]["rounds"][0]["reference"]["msgs_per_s"]
    print(f"round {len(msgr) + 1}: msgr {json.dumps(rates)}")
    msgr.append(rates)
m = statistics.median
print(f"\naggregate 64 B rate into one server, {len(msgr)} rounds "
      "(median; ratio to one connection in the same round: median, min-max):")
for c in sorted(zmq):
    z, g = zmq[c], [r[c] for r in msgr]
    zr = [a / b for a, b in zip(z, zmq[1])]
    gr = [r[c] / r[1] for r in msgr]
    print(f"  {c:>4} connections  ZeroMQ {m(z)/1e6:5.2f} M msg/s {m(zr):.2f}x ({min(zr):.2f}-{max(zr):.2f})"
          f"   msgr {m(g)/1e6:5.2f} M msg/s {m(gr):.2f}x ({min(gr):.2f}-{max(gr):.2f})  msgr/zmq {m(g)/m(z):.2f}")
print("  bar: msgr's 256 connections >= 0.70x one connection's")
if sys.argv[2]:
    with open(sys.argv[2], "a") as o:
        o.write(json.dumps({"bench": "conns", "zmq": zmq, "msgr": msgr}) + "\n")
EOF
  exit 0
fi

# One msgr stream against a fresh `msgr serve`; prints msgr stream's JSON.
msgr_rate() {
  local port=$1
  shift
  timeout 120 "$bin" serve "tcp://127.0.0.1:$port" "$@" >/dev/null 2>&1 &
  local server=$!
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
    sleep 0.05
  done
  timeout 120 "$bin" stream "tcp://127.0.0.1:$port" --size "$SIZE" --count "$COUNT" --json "$@" \
    | tail -n 1
  kill -INT "$server" 2>/dev/null || true
  wait "$server" 2>/dev/null || true
}

for r in $(seq "$ROUNDS"); do
  z=$(timeout 120 "$zmq" "$PORT" "$COUNT" "$SIZE")
  PORT=$((PORT + 1))
  b=$(msgr_rate "$PORT")
  PORT=$((PORT + 1))
  f=$(msgr_rate "$PORT" --set batch_max_bytes=0)
  PORT=$((PORT + 1))
  echo "round $r: zmq $z"
  echo "round $r: msgr (batched) $b"
  echo "round $r: msgr (frame per message) $f"
  printf '%s\t%s\t%s\n' "$z" "$b" "$f" >>"$out"
done

python3 - "$out" "${JSON:-}" <<'EOF'
import json, statistics, sys
rows = [line.rstrip("\n").split("\t") for line in open(sys.argv[1])]
def rate(s):
    d = json.loads(s)
    return d["stream"]["msgs_per_s"] if "stream" in d else d["msgs_per_s"]
z = [rate(r[0]) for r in rows]
b = [rate(r[1]) for r in rows]
f = [rate(r[2]) for r in rows]
rb = [x / y for x, y in zip(b, z)]
rf = [x / y for x, y in zip(f, z)]
m = statistics.median
print(f"\n64 B message rate, {len(rows)} rounds (median, per-round min-max):")
print(f"  ZeroMQ PUSH/PULL          {m(z)/1e6:6.2f} M msg/s")
print(f"  msgr, batch frames        {m(b)/1e6:6.2f} M msg/s  {m(rb):.2f}x zmq ({min(rb):.2f}-{max(rb):.2f})  target >= 3x")
print(f"  msgr, frame per message   {m(f)/1e6:6.2f} M msg/s  {m(rf):.2f}x zmq ({min(rf):.2f}-{max(rf):.2f})")
if sys.argv[2]:
    with open(sys.argv[2], "a") as o:
        o.write(json.dumps({"bench": "rate", "size": json.loads(rows[0][0])["size"],
                            "zmq": z, "msgr_batched": b, "msgr_per_message": f}) + "\n")
EOF
