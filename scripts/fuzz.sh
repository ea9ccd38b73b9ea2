#!/usr/bin/env bash
# Runs every cargo-fuzz target (fuzz/) for a bounded time; fails on the first
# crash. Usage: scripts/fuzz.sh [SECONDS_PER_TARGET=30] [TARGET...]
# Works on stable Rust (--sanitizer none). New coverage goes to a scratch
# corpus under fuzz/target/ (the committed seeds in fuzz/corpus/ stay as they
# are); a crash is written to fuzz/artifacts/<target>/ — keep it under
# fuzz/regressions/<target>/ with the fix. See docs/FUZZING.md.
set -euo pipefail
cd "$(dirname "$0")/.."

secs="${1:-30}"
shift || true
if [ "$#" -gt 0 ]; then
    targets=("$@")
else
    targets=(frame_preamble frame_decode banner session_engine message_decode addr_parse batch_decode auth_handshake sealed_decode rma_decode)
fi

if ! command -v cargo-fuzz >/dev/null 2>&1; then
    echo "installing cargo-fuzz"
    cargo install cargo-fuzz --locked
fi

cd fuzz
for t in "${targets[@]}"; do
    work="target/work-corpus/$t"
    mkdir -p "$work"
    echo "==> fuzzing $t for ${secs}s"
    cargo fuzz run --sanitizer none "$t" "$work" "corpus/$t" -- \
        -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
done
