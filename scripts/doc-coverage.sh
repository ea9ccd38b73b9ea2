#!/usr/bin/env bash
# How much of the msgr facade a user meets with an example: the share of
# its public items (types, traits, functions, re-exports included) and of
# the public methods of its own types whose docs hold an example (every
# example there is a doctest of the msgr crate). Fails under the minimum.
#
#   scripts/doc-coverage.sh [--list] [MIN_PERCENT]   (default 80)
#
# rustdoc's own `--show-coverage` is printed too, but it counts only items
# whose path is public where they are defined (here the `rma` module and
# those that already have an example), not the re-exported facade nor any
# method, so the figure that decides is this script's.
# Needs a nightly toolchain (rustdoc's JSON output is unstable) and python3.
set -euo pipefail
cd "$(dirname "$0")/.."

list=0
if [ "${1:-}" = "--list" ]; then list=1; shift; fi
min="${1:-80}"
target="${CARGO_TARGET_DIR:-target}"

cargo +nightly rustdoc -q -p msgr --all-features -- -Z unstable-options --show-coverage \
  | awk -F'|' '/^\| Total/ { gsub(/ /, ""); print "rustdoc --show-coverage: documented " $4 ", examples " $5 " (" $6 ")" }'
cargo +nightly rustdoc -q -p msgr --all-features -- -Z unstable-options --output-format json

python3 - "$target/doc/msgr.json" "$min" "$list" <<'PY'
import json, sys

doc = json.load(open(sys.argv[1]))
minimum, show_missing = float(sys.argv[2]), sys.argv[3] == "1"
index, paths = doc["index"], doc["paths"]
KINDS = ("struct", "enum", "trait", "function", "union")
items, methods, seen = [], [], set()


def has_example(docs):
    return "```" in (docs or "")


def kind_of(item):
    return next(iter(item["inner"].items()))


def walk(module_id, prefix):
    for child in index[str(module_id)]["inner"]["module"]["items"]:
        item = index[str(child)]
        if item["visibility"] != "public":
            continue
        kind, inner = kind_of(item)
        if kind == "use":
            target = inner["id"]
            if str(target) in index:
                consider(index[str(target)], prefix + inner["name"], item["docs"])
            elif paths.get(str(target), {}).get("kind") in KINDS and target not in seen:
                # Defined in another crate: only the re-export's own docs
                # (on its `pub use`) are msgr's doctests.
                seen.add(target)
                items.append((prefix + inner["name"], has_example(item["docs"])))
        else:
            consider(item, prefix + (item["name"] or ""), None)


def consider(item, path, reexport_docs):
    kind, inner = kind_of(item)
    if kind == "module":
        walk(item["id"], path + "::")
        return
    if kind not in KINDS or item["id"] in seen:
        return
    seen.add(item["id"])
    items.append((path, has_example((item["docs"] or "") + (reexport_docs or ""))))
    if kind == "trait":
        fns = inner["items"]
    else:
        fns = [f for i in inner.get("impls", [])
               for f in (lambda imp: imp["items"] if imp["trait"] is None
                         and not imp["is_synthetic"] and imp["blanket_impl"] is None
                         else [])(index[str(i)]["inner"]["impl"])]
    for f in fns:
        fn = index[str(f)]
        if "function" in fn["inner"] and (kind == "trait" or fn["visibility"] == "public"):
            methods.append((path + "::" + fn["name"], has_example(fn["docs"])))


walk(doc["root"], "")
worst = 100.0
for label, rows in (("public items (types, traits, functions)", items),
                    ("public methods of msgr's own types", methods)):
    with_example = sum(1 for _, ok in rows if ok)
    pct = 100.0 * with_example / len(rows) if rows else 100.0
    worst = min(worst, pct)
    print(f"{label}: {with_example}/{len(rows)} with an example ({pct:.1f}%)")
    if show_missing:
        for name, ok in rows:
            if not ok:
                print(f"  no example: {name}")
if worst < minimum:
    sys.exit(f"doc-coverage: under {minimum:g}%")
PY
