#!/usr/bin/env bash
# Regenerates docs/BENCHMARKS.md and its plots (docs/bench/*.svg) from
# msgr's own benchmark JSON, measured now on this machine:
#   - `msgr bench --json` per backend (tcp; fabric+tcp and fabric+shm RDM
#     where libfabric is installed): latency, bandwidth and 64 B rate
#     against their references, secure mode against crc mode;
#   - `msgr stream --json` against `msgr serve` over tcp at sizes from 64 B
#     to 1 MiB, in crc and secure mode: rate and bandwidth by size.
# The raw JSON stays in target/bench/ for anyone who wants more than the
# report shows. Usage: scripts/benchmarks.sh [--quick]
set -euo pipefail
cd "$(dirname "$0")/.."

quick=()
secs=2
if [ "${1:-}" = "--quick" ]; then
    quick=(--quick)
    secs=0.5
fi
out=target/bench
mkdir -p "$out" docs/bench
rm -f "$out"/*.json

features=()
if pkg-config --exists libfabric 2>/dev/null || [ -e /usr/include/rdma/fabric.h ]; then
    features=(--features fabric)
fi
cargo build --release -q -p msgr-tool "${features[@]}"
msgr=target/release/msgr

backends=(tcp)
if [ "${#features[@]}" -gt 0 ]; then
    backends+=(fabric+tcp 'fabric+shm?ep=rdm')
fi
for b in "${backends[@]}"; do
    name=$(echo "$b" | tr '+?=' '__-')
    parts=latency,bandwidth,rate
    [ "$b" = tcp ] && parts=latency,bandwidth,rate,secure
    echo "==> msgr bench --transport $b"
    "$msgr" bench --transport "$b" --only "$parts" --json "${quick[@]}" > "$out/bench-$name.json"
done

# Rate and bandwidth by size over tcp, crc and secure: one server each.
keys=$(mktemp -d)
trap 'rm -rf "$keys"; kill $(jobs -p) 2>/dev/null || true' EXIT
"$msgr" keygen server.1 --out "$keys/s.key" --add-to "$keys/ring" > /dev/null
"$msgr" keygen client.1 --out "$keys/c.key" --add-to "$keys/ring" > /dev/null
for mode in crc secure; do
    sargs=() cargs=()
    if [ "$mode" = secure ]; then
        sargs=(--security secure --name server.1 --key-file "$keys/s.key" --keyring "$keys/ring")
        cargs=(--security secure --name client.1 --key-file "$keys/c.key" --keyring "$keys/ring")
    fi
    "$msgr" serve tcp://127.0.0.1:0 --duration 600 "${sargs[@]}" > "$keys/serve-$mode.out" 2> /dev/null &
    for _ in $(seq 100); do
        [ -s "$keys/serve-$mode.out" ] && break
        sleep 0.1
    done
    addr=$(head -1 "$keys/serve-$mode.out" | sed 's/^listening on //')
    for size in 64 256 1024 4096 16384 65536 262144 1048576; do
        echo "==> msgr stream $mode $size B"
        "$msgr" stream "$addr" --size "$size" --duration "$secs" --json "${cargs[@]}" \
            > "$out/stream-$mode-$size.json"
    done
done

python3 scripts/benchmarks_report.py "$out" docs
echo "wrote docs/BENCHMARKS.md and docs/bench/*.svg"
