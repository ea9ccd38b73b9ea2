#!/usr/bin/env bash
# Latency of msgr's TCP backend and of its fabric backend (fabric+tcp://, the
# same provider and endpoint type) against libfabric's busy-polling fi_pingpong
# (provider tcp, msg endpoints) and a blocking std::net ping-pong, all on
# 127.0.0.1 with the same message size, several runs interleaved, medians and
# ratios at the end. Every process is bounded by `timeout`.
#
#   scripts/bench-fabric.sh                 # 5 runs x 10000 round trips of 64 B
#   RUNS=9 ITER=20000 scripts/bench-fabric.sh
#
# Targets (docs/BENCHMARKS.md, DESIGN §7): msgr one-way latency within 1.2x of
# fi_pingpong and within 1.15x of std::net. On this kind of VM a blocking
# wake-up is cheap when the machine is busy and expensive when it is idle, and
# busy-polling peers suffer when the cores are shared: the output says whether
# the machine was quiet.
set -euo pipefail

RUNS=${RUNS:-5}
ITER=${ITER:-10000}
SIZE=${SIZE:-64}
WARMUP=${WARMUP:-1000}
# Below the ephemeral range: fi_pingpong binds without SO_REUSEADDR.
PORT_BASE=${PORT_BASE:-$((21000 + RANDOM % 500 * 20))}
cd "$(dirname "$0")/.."
TARGET_DIR=${CARGO_TARGET_DIR:-target}
MSGR="$TARGET_DIR/release/msgr"
WORK=$(mktemp -d /tmp/msgr-bench-fabric.XXXXXX)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT

need_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

if ! command -v fi_pingpong >/dev/null; then
    echo "installing libfabric-bin (fi_pingpong)..." >&2
    if ! need_root apt-get install -y -q libfabric-bin >/dev/null 2>&1; then
        need_root apt-get update -q >/dev/null
        need_root apt-get install -y -q libfabric-bin >/dev/null
    fi
fi
if ! pkg-config --exists libfabric 2>/dev/null; then
    echo "installing libfabric-dev (msgr's fabric backend links libfabric)..." >&2
    need_root apt-get install -y -q libfabric-dev libclang-dev pkg-config >/dev/null
fi
command -v python3 >/dev/null || { echo "python3 is needed to parse JSON" >&2; exit 1; }

echo "building msgr (release)..." >&2
cargo build --release -q -p msgr-tool --features fabric

# CPU time of the whole machine (busy, total) in jiffies.
cpu() { awk '/^cpu /{t=0; for(i=2;i<=9;i++) t+=$i; print t-$5-$6, t}' /proc/stat; }
CORES=$(nproc)
read -r B0 T0 < <(cpu); sleep 1; read -r B1 T1 < <(cpu)
PRE_OTHERS=$(awk -v b=$((B1-B0)) -v t=$((T1-T0)) -v c="$CORES" 'BEGIN{printf "%.2f", (t > 0) ? b / t * c : 0}')
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
echo "before the runs: other processes used $PRE_OTHERS of $CORES cores (1 s sample), loadavg $LOAD_BEFORE"

json() { python3 -c "import json,sys; d=json.load(open('$1')); print($2)"; }

FI=(); MSGR_MEAN=(); MSGR_P50=(); FAB_MEAN=(); FAB_P50=(); STD_MEAN=(); STD_P50=(); QUIET=()
for run in $(seq 1 "$RUNS"); do
    port=$((PORT_BASE + 10 * run))  # fi_pingpong also uses the next port for data
    # 1. fi_pingpong, busy-polling, provider tcp, msg endpoints.
    timeout 120 fi_pingpong -p tcp -e msg -I "$ITER" -S "$SIZE" -B "$port" >"$WORK/fis" 2>&1 &
    srv=$!; PIDS+=("$srv")
    sleep 0.3
    if ! timeout 120 fi_pingpong -p tcp -e msg -I "$ITER" -S "$SIZE" -P "$port" 127.0.0.1 >"$WORK/fic" 2>&1; then
        echo "fi_pingpong failed:" >&2; cat "$WORK/fic" "$WORK/fis" >&2; exit 1
    fi
    wait "$srv" || true
    # usec/xfer is the one-way time (fabtests count both directions as transfers).
    fi_us=$(awk -v s="$SIZE" '$1==s {print $7}' "$WORK/fic")
    FI+=("$fi_us")

    # 2. msgr ping against msgr serve (two processes, like fi_pingpong).
    timeout 300 "$MSGR" serve tcp://127.0.0.1:0 --duration 240 >"$WORK/serve" 2>"$WORK/serve.err" &
    srv=$!; PIDS+=("$srv")
    addr=""
    for _ in $(seq 1 100); do
        addr=$(sed -n 's/^listening on //p' "$WORK/serve" | head -1)
        [ -n "$addr" ] && break
        sleep 0.1
    done
    [ -n "$addr" ] || { echo "msgr serve did not start:" >&2; cat "$WORK/serve.err" >&2; exit 1; }
    timeout 120 "$MSGR" ping "$addr" --size "$SIZE" --count "$ITER" --warmup "$WARMUP" --json >"$WORK/ping.json"
    kill -INT "$srv"; wait "$srv" || true
    MSGR_MEAN+=("$(json "$WORK/ping.json" "d['ping']['one_way']['mean_us']")")
    MSGR_P50+=("$(json "$WORK/ping.json" "d['ping']['one_way']['p50_us']")")

    # 2b. msgr ping over its libfabric backend (provider tcp, msg endpoints).
    timeout 300 "$MSGR" serve fabric+tcp://127.0.0.1:0 --duration 240 >"$WORK/fserve" 2>"$WORK/fserve.err" &
    srv=$!; PIDS+=("$srv")
    addr=""
    for _ in $(seq 1 100); do
        addr=$(sed -n 's/^listening on //p' "$WORK/fserve" | head -1)
        [ -n "$addr" ] && break
        sleep 0.1
    done
    [ -n "$addr" ] || { echo "msgr serve (fabric) did not start:" >&2; cat "$WORK/fserve.err" >&2; exit 1; }
    timeout 120 "$MSGR" ping "$addr" --size "$SIZE" --count "$ITER" --warmup "$WARMUP" --json >"$WORK/fping.json"
    kill -INT "$srv"; wait "$srv" || true
    FAB_MEAN+=("$(json "$WORK/fping.json" "d['ping']['one_way']['mean_us']")")
    FAB_P50+=("$(json "$WORK/fping.json" "d['ping']['one_way']['p50_us']")")

    # 3. blocking std::net ping-pong (msgr bench's reference, same size).
    timeout 120 "$MSGR" bench --only latency --rounds 1 --json >"$WORK/bench.json"
    STD_MEAN+=("$(json "$WORK/bench.json" "d['latency']['rounds'][0]['reference']['one_way']['mean_us']")")
    STD_P50+=("$(json "$WORK/bench.json" "d['latency']['rounds'][0]['reference']['one_way']['p50_us']")")
    QUIET+=("$(json "$WORK/bench.json" "'quiet' if d['machine']['quiet'] else 'loaded'")")
    printf 'run %d: one-way µs  fi_pingpong %s | msgr ping mean %s p50 %s | msgr fabric+tcp mean %s p50 %s | std mean %s p50 %s | %s\n' \
        "$run" "$fi_us" "${MSGR_MEAN[-1]}" "${MSGR_P50[-1]}" "${FAB_MEAN[-1]}" "${FAB_P50[-1]}" "${STD_MEAN[-1]}" "${STD_P50[-1]}" "${QUIET[-1]}"
done

python3 - "$SIZE" "$ITER" "$RUNS" "$PRE_OTHERS" "$CORES" "$LOAD_BEFORE" "$(cut -d' ' -f1-3 /proc/loadavg)" \
    "${FI[*]}" "${MSGR_MEAN[*]}" "${MSGR_P50[*]}" "${STD_MEAN[*]}" "${STD_P50[*]}" "${QUIET[*]}" "${FAB_MEAN[*]}" "${FAB_P50[*]}" <<'EOF'
import statistics as st, sys
size, it, runs, pre, cores, lb, la = sys.argv[1:8]
fi, mm, mp, sm, sp = ([float(x) for x in a.split()] for a in sys.argv[8:13])
quiet = sys.argv[13].split()
fm, fp = ([float(x) for x in a.split()] for a in sys.argv[14:16])
med = st.median
def spread(v): return f"{min(v):.2f}–{max(v):.2f}"
state = "quiet" if float(pre) < 0.2 and all(q == "quiet" for q in quiet) else "LOADED"
print()
print(f"{size} B ping-pong on 127.0.0.1, {runs} runs x {it} round trips; one-way µs, median (spread)")
print(f"machine {state}: others used {pre} of {cores} cores before; msgr bench saw {' '.join(quiet)}; loadavg {lb} before, {la} after")
print(f"  fi_pingpong -p tcp -e msg (busy-poll, mean) {med(fi):9.2f}  ({spread(fi)})")
print(f"  msgr ping, mean                           {med(mm):9.2f}  ({spread(mm)})")
print(f"  msgr ping, p50                            {med(mp):9.2f}  ({spread(mp)})")
print(f"  msgr ping fabric+tcp (FI_EP_MSG), mean    {med(fm):9.2f}  ({spread(fm)})")
print(f"  msgr ping fabric+tcp (FI_EP_MSG), p50     {med(fp):9.2f}  ({spread(fp)})")
print(f"  std::net blocking, mean                   {med(sm):9.2f}  ({spread(sm)})")
print(f"  std::net blocking, p50                    {med(sp):9.2f}  ({spread(sp)})")
r_fi = med(mm) / med(fi)
r_std = med(mp) / med(sp)
print(f"  msgr/fi_pingpong (means) {r_fi:.2f}x  target <= 1.20x  {'met' if r_fi <= 1.2 else 'MISSED'}")
print(f"  msgr fabric+tcp/fi_pingpong (means) {med(fm) / med(fi):.2f}x  (same provider and endpoint type)")
print(f"  msgr/std (p50s)          {r_std:.2f}x  target <= 1.15x  {'met' if r_std <= 1.15 else 'MISSED'}")
EOF
