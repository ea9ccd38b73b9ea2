#!/usr/bin/env bash
# Every published crate packaged (`cargo package --workspace`), then its
# package — only what the .crate file holds — checked with every feature,
# build scripts (bindgen) included. Then `cargo publish --dry-run`.
#
# Why not cargo package's own verification: it builds every package and the
# whole dependency graph in the dev profile, which nothing else here uses:
# ~9 minutes on a clean clone (2 cores), a third of the test command. A
# packaging mistake (a file left out, a path dependency without a version, a
# build script reading outside the crate) shows in a type check of the
# unpacked packages as in a build, and the type check reuses the dependency
# graph clippy has just checked: ~1 minute.
set -euo pipefail
cd "$(dirname "$0")/.."

target="${CARGO_TARGET_DIR:-$PWD/target}"
rm -f "$target"/package/*.crate   # no stale package of a renamed crate
cargo package --workspace --exclude msgr-testsuite --all-features --allow-dirty --no-verify

# The packages unpacked side by side into a workspace of their own, the
# siblings patched in by path (none of them is on crates.io yet), with the
# repository's lock file so the same dependency versions resolve.
check="$target/package-check"
rm -rf "$check"
mkdir -p "$check"
members="" patches=""
for crate in "$target"/package/*.crate; do
  dir="$(basename "$crate" .crate)"   # name-version
  name="${dir%-*}"
  # -m: extracted files dated now, so a target dir that checked an older
  # package of the same version checks this one again.
  tar -xzmf "$crate" -C "$check"
  members="$members\"$dir\", "
  patches="$patches$name = { path = \"$dir\" }"$'\n'
done
cat >"$check/Cargo.toml" <<EOF
[workspace]
resolver = "2"
members = [$members]

[patch.crates-io]
$patches
EOF
cp Cargo.lock "$check/Cargo.lock"
cargo check --manifest-path "$check/Cargo.toml" --target-dir "$target" --workspace --all-features

# The publish checks, on the same packages.
cargo publish --dry-run --workspace --no-verify --allow-dirty
