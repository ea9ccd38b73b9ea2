#!/usr/bin/env bash
# User-space instructions per message, sender and receiver counted apart:
# callgrind runs `msgr serve` (the receiver) and `msgr stream` (the sender)
# with N and then 3N messages; (I(3N) - I(N)) / 2N cancels start-up and
# shutdown. Deterministic where wall-clock time on these VMs is not: the
# figure to steer the per-message path by (docs/BENCHMARKS.md).
#
# Usage: scripts/instructions.sh [BACKEND...]   (default: tcp fabric+shm)
# Environment: N (default 100000), SIZE (default 64), PORT (default 7931),
#   SET ("key=value ..." passed as --set to both sides), JSON=FILE (one
#   JSON object per backend appended to FILE), OP=read|write: one-sided
#   operations of SIZE bytes instead of messages (`msgr serve --expose`, the
#   owner, is the receiver; `msgr rma --repeat`, the sender), and
#   TOP=K: the K costliest functions of each side's 3N run
#   (callgrind_annotate, inclusive of nothing: self cost), and BURST=B:
#   fixed batches of B messages (batch_max_bytes set to exactly B
#   entries of SIZE bytes on both sides; the sender hands over far more
#   than B per turn, so every batch is full), so that designs compare on
#   equal batches rather than on the batch sizes their timing produced;
#   BIN=PATH: count that msgr binary (one built before a change, say)
#   instead of building this tree's.
# Beside each count: messages per batch frame as the receiver counted
# them (rx_messages / rx_batches of the 3N run; "-" where the messenger
# does not count batches).
# Installs valgrind (and libfabric-dev for fabric) when missing. Builds the
# msgr tool with the shipped release profile (fat LTO), as users get it.
set -euo pipefail
cd "$(dirname "$0")/.."

N="${N:-100000}"
SIZE="${SIZE:-64}"
PORT="${PORT:-7931}"
SET="${SET:-}"
if [ -n "${BURST:-}" ]; then
  # A batch body: a 24-byte header, then per message a 6-byte entry head
  # (1-byte type, priority, flags, entry flags, 1-byte lengths) and SIZE bytes.
  [ "$SIZE" -lt 128 ] || { echo "BURST needs SIZE < 128 (one-byte length varints)" >&2; exit 1; }
  SET="$SET batch_max_bytes=$((24 + BURST * (6 + SIZE)))"
fi
backends=("$@")
[ "${#backends[@]}" -gt 0 ] || backends=(tcp fabric+shm)

need=()
command -v valgrind >/dev/null || need+=(valgrind)
for b in "${backends[@]}"; do
  case "$b" in fabric*) dpkg-query -W -f='${db:Status-Status}' libfabric-dev 2>/dev/null | grep -qx installed || need+=(libfabric-dev libclang-dev) ;; esac
done
if [ "${#need[@]}" -gt 0 ]; then
  echo "installing: ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
fi

features=""
for b in "${backends[@]}"; do case "$b" in fabric*) features="--features fabric" ;; esac; done
if [ -n "${BIN:-}" ]; then
  bin="$BIN"
else
  # shellcheck disable=SC2086
  cargo build --release -q -p msgr-tool $features
  bin="${CARGO_TARGET_DIR:-$PWD/target}/release/msgr"
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
sets=()
for kv in $SET; do sets+=(--set "$kv"); done

# Instructions of one callgrind output file.
total() { awk '/^summary:/ {print $2}' "$1"; }
# Messages per batch frame the receiver counted (serve's counters at exit).
per_batch() {
  awk '$1 == "msgr_rx_messages" {m = $2} $1 == "msgr_rx_batches" {b = $2}
    END {if (b > 0) printf "%.1f", m / b; else print "-"}' "$1"
}

# Runs one serve/stream (or serve --expose/rma) pair of `count` messages
# (operations); prints "receiver sender".
run_pair() {
  local addr="$1" count="$2" tag="$3"
  local expose=()
  [ -z "${OP:-}" ] || expose=(--expose "$((SIZE > 4096 ? SIZE : 4096))")
  valgrind --tool=callgrind --callgrind-out-file="$work/serve.$tag" \
    "$bin" serve "$addr" --busy-poll-us 0 "${expose[@]}" "${sets[@]}" >"$work/serve.$tag.log" 2>&1 &
  local server=$!
  local waited=0
  until grep -qs '^listening on' "$work/serve.$tag.log"; do  # (-s: the file may not be there yet)
    sleep 0.2
    waited=$((waited + 1))
    if [ "$waited" -gt 300 ] || ! kill -0 "$server" 2>/dev/null; then
      echo "msgr serve did not start:" >&2
      cat "$work/serve.$tag.log" >&2
      kill "$server" 2>/dev/null || true
      return 1
    fi
  done
  local client=(stream "$addr" --size "$SIZE" --count "$count")
  if [ -n "${OP:-}" ]; then
    local handle
    handle="$(sed -n 's/^region //p' "$work/serve.$tag.log" | head -1)"
    head -c "$SIZE" /dev/urandom >"$work/data"
    case "$OP" in
      read) client=(rma "$addr" --handle "$handle" --read "0:$SIZE" --out "$work/out" --repeat "$count") ;;
      write) client=(rma "$addr" --handle "$handle" --write 0 --from "$work/data" --repeat "$count") ;;
      *) echo "OP must be read or write, not $OP" >&2; return 1 ;;
    esac
  fi
  if ! valgrind --tool=callgrind --callgrind-out-file="$work/stream.$tag" \
    "$bin" "${client[@]}" --busy-poll-us 0 --timeout 600 "${sets[@]}" \
    >"$work/stream.$tag.log" 2>&1; then
    echo "msgr stream failed:" >&2
    grep -v '^==' "$work/stream.$tag.log" >&2
    kill "$server" 2>/dev/null || true
    return 1
  fi
  kill -INT "$server"
  wait "$server" || true
  echo "$(total "$work/serve.$tag") $(total "$work/stream.$tag")"
}

printf '%-12s %8s %6s %14s %14s %10s\n' backend N size "sent/msg" "received/msg" "msgs/batch"
for b in "${backends[@]}"; do
  case "$b" in
    tcp) addr="tcp://127.0.0.1:$PORT" ;;
    fabric+shm) addr="fabric+shm://127.0.0.1:$PORT?ep=rdm" ;;
    *) addr="$b://127.0.0.1:$PORT" ;;
  esac
  read -r r1 s1 < <(run_pair "$addr" "$N" "$b.1")
  PORT=$((PORT + 1))
  case "$b" in tcp) addr="tcp://127.0.0.1:$PORT" ;; fabric+shm) addr="fabric+shm://127.0.0.1:$PORT?ep=rdm" ;; *) addr="$b://127.0.0.1:$PORT" ;; esac
  read -r r3 s3 < <(run_pair "$addr" "$((3 * N))" "$b.3")
  PORT=$((PORT + 1))
  sent=$(( (s3 - s1) / (2 * N) ))
  recv=$(( (r3 - r1) / (2 * N) ))
  per="$(per_batch "$work/serve.$b.3.log")"
  printf '%-12s %8s %6s %14s %14s %10s\n' "$b" "$N" "$SIZE" "$sent" "$recv" "$per"
  if [ -n "${TOP:-}" ]; then
    for side in serve stream; do
      echo "-- $side ($b, ${OP:-messages}, 3N run): the $TOP costliest functions (self)"
      # (head closes the pipe early: not a failure)
      callgrind_annotate --threshold=100 "$work/$side.$b.3" 2>/dev/null |
        grep -E '^ *[0-9,]+ \(' | head -n "$TOP" || true
    done
  fi
  if [ -n "${JSON:-}" ]; then
    printf '{"backend":"%s","n":%s,"size":%s,"op":"%s","set":"%s","sent_per_message":%s,"received_per_message":%s,"messages_per_batch":"%s"}\n' \
      "$b" "$N" "$SIZE" "${OP:-message}" "$SET" "$sent" "$recv" "$per" >>"$JSON"
  fi
done
