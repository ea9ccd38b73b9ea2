#!/usr/bin/env bash
# The whole msgr test suite, as README.md documents it. Installs what it needs
# (Debian packages, the QEMU guest kernel) when missing, so it is idempotent and
# runs on a fresh machine of this kind. CI calls exactly this (see .ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."

# Each step's wall time, printed at the end (and on failure): where the
# test command's minutes go.
timings=""
step_name="" step_start=$(date +%s) run_start=$(date +%s)
end_step() {
  [ -n "$step_name" ] && timings="$timings$(printf '%6d s  %s' $(($(date +%s) - step_start)) "${step_name:0:90}")"$'\n'
  step_name="" step_start=$(date +%s)
}
step() { end_step; step_name="$*"; printf '\n==> %s\n' "$*"; }
report_timings() {
  end_step
  printf '\n==> time per step (%d s in all)\n%s' $(($(date +%s) - run_start)) "$timings"
}
trap report_timings EXIT

# The release profile's whole-program LTO (Cargo.toml) is for the shipped
# binaries' speed; it more than doubles the build of the test binaries and
# changes no behaviour, so the tests build without it.
export CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16
# Nor with debug info (the profile keeps it for profilers): it lengthens every
# link of the many test binaries and no test reads it.
export CARGO_PROFILE_RELEASE_DEBUG=0

# Installs the Debian packages named that are not installed yet (idempotent;
# apt-get update runs only when something is missing).
ensure_packages() {
  local missing="" p
  for p in "$@"; do
    dpkg-query -W -f='${db:Status-Status}\n' "$p" 2>/dev/null | grep -qx installed || missing="$missing $p"
  done
  if [ -n "$missing" ]; then
    echo "installing:$missing"
    apt-get update -qq
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing
  fi
}

step "build dependencies (Debian packages for the RDMA and libfabric crates)"
ensure_packages libclang-dev libibverbs-dev librdmacm-dev libfabric-dev

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy (default features, then every feature: RDMA and libfabric crates too) -D warnings"
cargo clippy --workspace --all-targets -- -D warnings
cargo clippy --workspace --all-targets --all-features -- -D warnings

step "cargo doc (every feature, public and private items) -D warnings: no broken or private intra-doc links"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --all-features --no-deps -q
# Private items too: links inside crate-private modules resolve only here.
RUSTDOCFLAGS="-D warnings --document-private-items" cargo doc --workspace --all-features --no-deps -q

step "cargo package (every published crate packaged, its package checked with every feature) and cargo publish --dry-run"
./scripts/package-check.sh

step "cargo test (default features: TCP on loopback)"
cargo test --workspace --release

step "cargo test: the backends' own tests with every backend feature (libfabric's over real tcp, tcp;ofi_rxm and shm providers; the RDMA backends' that need no device)"
cargo test --release -p msgr-backends --all-features --lib -- --skip fabric::hostile
# Hostile peers on their own, with their output: how each bad message ended
# its link, and the forged and replayed RDM HELLOs.
cargo test --release -p msgr-backends --all-features --lib fabric::hostile -- --nocapture --test-threads 1

step "cargo test: the fabric backend with real libfabric providers on loopback (tcp MSG, tcp;ofi_rxm RDM, shm RDM)"
cargo test --release -p msgr --features fabric --test fabric -- --skip failover
# Failover with its output: the time from the fault to the session moving.
cargo test --release -p msgr --features fabric --test fabric failover -- --nocapture
# The msgr tool's serve, ping, stream and bench with fabric addresses (with the
# fault-injection feature: one test corrupts a client's frames by its fault plan).
cargo test --release -p msgr-tool --features fabric,fault-injection --test cli

step "stress suite: msgr-stress 30 s per available backend with faults, the network-namespace run, and a cluster of 8 nodes in namespaces 60 s with every fault kind (docs/STRESS.md)"
ensure_packages nftables iproute2
cargo run --release -p msgr-testsuite --bin msgr-stress -- --duration 30 --backend all --quiet
cargo test --release -p msgr-testsuite --test stress_netns --test stress_cluster -- --ignored --nocapture
# 8 node processes on a bridge, lossless-peer sessions between all: kill -9,
# partitions, a slow node, SIGSTOP, a rolling restart.
cargo run --release -p msgr-testsuite --bin msgr-stress -- --cluster 8 --duration 60 --quiet

step "stress suite in secure mode: every frame sealed, every link authenticated, the same faults (msgr-stress 15 s over tcp)"
cargo run --release -p msgr-testsuite --bin msgr-stress -- --duration 15 --backend tcp --set security=secure --quiet

step "stress suite over the libfabric backends: msgr-stress 15 s each with faults (real tcp, tcp;ofi_rxm and shm providers, loopback; tcp MSG once more with its CQ polled)"
for backend in fabric+tcp 'fabric+tcp?ep=rdm' 'fabric+shm?ep=rdm'; do
  cargo run --release -p msgr-testsuite --features fabric --bin msgr-stress -- --duration 15 --backend "$backend" --quiet
done
cargo run --release -p msgr-testsuite --features fabric --bin msgr-stress -- --duration 15 --backend fabric+tcp --set fabric_cq_wait=poll --quiet
# And in secure mode, over an RDM endpoint (rendezvous units sealed).
cargo run --release -p msgr-testsuite --features fabric --bin msgr-stress -- --duration 10 --backend 'fabric+tcp?ep=rdm' --set security=secure --quiet

step "stress suite, transport change: servers on a backend and tcp, clients dial both (an address vector), every link fault moves sessions between them (msgr-stress 8 s per pair)"
for backend in tcp fabric+tcp 'fabric+tcp?ep=rdm' 'fabric+shm?ep=rdm'; do
  cargo run --release -p msgr-testsuite --features fabric --bin msgr-stress -- --duration 8 --backend "$backend" --transport-change --quiet
done

step "stress suite with one-sided RMA: random-range writes and reads of each server's region beside the messages, checked byte for byte (msgr-stress --rma 10 s each: tcp, tcp with transport change, fabric+tcp RDM, shm RDM; docs/STRESS.md)"
cargo run --release -p msgr-testsuite --features fabric --bin msgr-stress -- --duration 10 --backend tcp --rma --quiet
cargo run --release -p msgr-testsuite --features fabric --bin msgr-stress -- --duration 10 --backend tcp --transport-change --rma --quiet
for backend in 'fabric+tcp?ep=rdm' 'fabric+shm?ep=rdm'; do
  cargo run --release -p msgr-testsuite --features fabric --bin msgr-stress -- --duration 10 --backend "$backend" --rma --quiet
done

step "RDMA guest: setup (packages, kernel, siw, initramfs; cached in \${MSGR_GUEST_CACHE:-/var/cache/msgr-guest})"
guest_start=$(date +%s)
bash testsuite/guest/setup.sh

step "RDMA guest: tests in the QEMU guest (verbs and rdma_cm smoke on rxe and siw, reference peers, netem, the verbs and rdmacm backends, msgr tool vs perftest, stress over verbs, the fabric backend over libfabric's verbs provider, and rdma_cm stress between two hosts on a lossy, flapping veth wire)"
# One round of the reference-peer comparison (3 by default): here it checks
# that every msgr run over verbs, rdmacm and TCP works and parses beside its
# perftest peer; the figures for docs/BENCHMARKS.md come from 3 rounds by
# hand (docs/GUEST.md).
MSGR_GUEST_BENCH_ROUNDS=1 cargo test --release -p msgr-testsuite --features rdma,fabric --test guest_rdma --test guest_verbs --test guest_bench --test guest_stress --test guest_fabric --test guest_twohosts -- --nocapture --test-threads 1
echo "RDMA guest part took $(($(date +%s) - guest_start)) s"

step "fuzz: every cargo-fuzz target for 5 s, a smoke run (stable, --sanitizer none; longer runs by hand: docs/FUZZING.md)"
./scripts/fuzz.sh 5
