#!/usr/bin/env python3
"""Writes docs/BENCHMARKS.md and docs/bench/*.svg from the JSON that
scripts/benchmarks.sh collected (msgr bench --json, msgr stream --json).
Plots are plain SVG written here: no plotting library to install."""
import datetime
import glob
import json
import os
import sys

src, docs = sys.argv[1], sys.argv[2]
plots = os.path.join(docs, "bench")
os.makedirs(plots, exist_ok=True)


def load(path):
    with open(path) as f:
        return json.load(f)


benches = {}
for p in sorted(glob.glob(os.path.join(src, "bench-*.json"))):
    b = load(p)
    benches[b["transport"]] = b
streams = {}
for p in sorted(glob.glob(os.path.join(src, "stream-*.json"))):
    mode, size = os.path.basename(p)[len("stream-"):-len(".json")].split("-")
    streams.setdefault(mode, {})[int(size)] = load(p)["stream"]

COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"]


def esc(s):
    return str(s).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def svg(width, height, body, title):
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="sans-serif" font-size="12">\n'
        f'<rect width="{width}" height="{height}" fill="white"/>\n'
        f'<text x="{width / 2}" y="20" text-anchor="middle" font-size="14">{esc(title)}</text>\n'
        + body
        + "</svg>\n"
    )


def bars(groups, series, title, unit, path, log=False):
    """Grouped bars: groups = [(label, [value per series])]."""
    import math

    w, h, left, bottom, top = 760, 360, 70, 60, 40
    vals = [v for _, vs in groups for v in vs if v is not None and v > 0]
    vmax = max(vals) if vals else 1
    vmin = min(vals) if vals else 1
    def y(v):
        if log:
            lo, hi = math.log10(vmin / 2), math.log10(vmax * 1.2)
            return h - bottom - (math.log10(v) - lo) / (hi - lo) * (h - bottom - top)
        return h - bottom - v / (vmax * 1.15) * (h - bottom - top)
    body = ""
    gw = (w - left - 20) / max(len(groups), 1)
    bw = gw * 0.8 / max(len(series), 1)
    for gi, (label, vs) in enumerate(groups):
        x0 = left + gi * gw + gw * 0.1
        for si, v in enumerate(vs):
            if v is None or v <= 0:
                continue
            yy = y(v)
            body += (f'<rect x="{x0 + si * bw:.1f}" y="{yy:.1f}" width="{bw * 0.95:.1f}" '
                     f'height="{h - bottom - yy:.1f}" fill="{COLORS[si % len(COLORS)]}"/>\n')
            body += (f'<text x="{x0 + si * bw + bw / 2:.1f}" y="{yy - 3:.1f}" text-anchor="middle" '
                     f'font-size="9">{v:.3g}</text>\n')
        body += (f'<text x="{x0 + gw * 0.4:.1f}" y="{h - bottom + 16}" text-anchor="middle">'
                 f'{esc(label)}</text>\n')
    body += f'<line x1="{left}" y1="{h - bottom}" x2="{w - 10}" y2="{h - bottom}" stroke="black"/>\n'
    body += f'<line x1="{left}" y1="{top}" x2="{left}" y2="{h - bottom}" stroke="black"/>\n'
    body += (f'<text x="16" y="{(h - bottom + top) / 2}" transform="rotate(-90 16 {(h - bottom + top) / 2})" '
             f'text-anchor="middle">{esc(unit)}</text>\n')
    for si, s in enumerate(series):
        body += f'<rect x="{left + 10 + si * 170}" y="{h - 24}" width="12" height="12" fill="{COLORS[si % len(COLORS)]}"/>\n'
        body += f'<text x="{left + 28 + si * 170}" y="{h - 14}">{esc(s)}</text>\n'
    with open(path, "w") as f:
        f.write(svg(w, h, body, title))


def lines(xs, series, title, xunit, yunit, path):
    """Lines over a log2 x axis: series = [(name, [y per x])]."""
    import math

    w, h, left, bottom, top = 760, 360, 80, 60, 40
    ys = [v for _, vs in series for v in vs if v]
    ymax = max(ys) * 1.15 if ys else 1
    lx = [math.log2(x) for x in xs]
    def px(x):
        return left + (math.log2(x) - lx[0]) / max(lx[-1] - lx[0], 1) * (w - left - 30)
    def py(v):
        return h - bottom - v / ymax * (h - bottom - top)
    body = ""
    for x in xs:
        label = f"{x // 1048576} MiB" if x >= 1048576 else f"{x // 1024} KiB" if x >= 1024 else f"{x} B"
        body += f'<text x="{px(x):.1f}" y="{h - bottom + 16}" text-anchor="middle">{label}</text>\n'
    for si, (name, vs) in enumerate(series):
        pts = " ".join(f"{px(x):.1f},{py(v):.1f}" for x, v in zip(xs, vs) if v)
        c = COLORS[si % len(COLORS)]
        body += f'<polyline points="{pts}" fill="none" stroke="{c}" stroke-width="2"/>\n'
        for x, v in zip(xs, vs):
            if v:
                body += f'<circle cx="{px(x):.1f}" cy="{py(v):.1f}" r="3" fill="{c}"/>\n'
        body += f'<rect x="{left + 10 + si * 220}" y="{h - 24}" width="12" height="12" fill="{c}"/>\n'
        body += f'<text x="{left + 28 + si * 220}" y="{h - 14}">{esc(name)}</text>\n'
    for frac in (0.25, 0.5, 0.75, 1.0):
        v = ymax / 1.15 * frac
        body += f'<text x="{left - 6}" y="{py(v) + 4:.1f}" text-anchor="end" font-size="10">{v:.3g}</text>\n'
    body += f'<line x1="{left}" y1="{h - bottom}" x2="{w - 10}" y2="{h - bottom}" stroke="black"/>\n'
    body += f'<line x1="{left}" y1="{top}" x2="{left}" y2="{h - bottom}" stroke="black"/>\n'
    body += (f'<text x="16" y="{(h - bottom + top) / 2}" transform="rotate(-90 16 {(h - bottom + top) / 2})" '
             f'text-anchor="middle">{esc(yunit)}</text>\n')
    with open(path, "w") as f:
        f.write(svg(w, h, body, title))


# Plot 1: latency percentiles per backend, msgr against its reference.
groups = []
for t, b in benches.items():
    lat = b.get("latency")
    if not lat:
        continue
    r = lat["rounds"][len(lat["rounds"]) // 2]
    for p in ("p50_us", "p99_us", "p999_us"):
        short = {"tcp": "tcp", "fabric+tcp": "f-tcp"}.get(t, t.replace("fabric+", "f-").split("?")[0])
        groups.append((f"{short} {p[:-3]}", [r["msgr"]["one_way"][p], r["reference"]["one_way"][p]]))
bars(groups, ["msgr", "reference (std::net ping-pong)"],
     "64 B one-way latency percentiles (median round; f- = fabric+)", "µs (log scale)",
     os.path.join(plots, "latency.svg"), log=True)

# Plot 2: message rate and bandwidth by size, crc and secure.
sizes = sorted(set().union(*[set(v) for v in streams.values()])) if streams else []
if sizes:
    lines(sizes, [(f"{m} msg/s (millions)", [streams[m].get(s, {}).get("msgs_per_s", 0) / 1e6 for s in sizes])
                  for m in sorted(streams)],
          "One-way message rate by size, tcp loopback", "size", "million messages/s",
          os.path.join(plots, "rate_by_size.svg"))
    lines(sizes, [(f"{m} MiB/s", [streams[m].get(s, {}).get("mib_per_s", 0) for s in sizes])
                  for m in sorted(streams)],
          "One-way bandwidth by size, tcp loopback", "size", "MiB/s",
          os.path.join(plots, "bandwidth_by_size.svg"))

# Plot 3: each backend's ratios against its references.
metrics = [("latency", "latency p50 (≤)"), ("bandwidth", "1 MiB bandwidth"), ("message_rate", "64 B rate"),
           ("secure_bandwidth", "secure/crc 1 MiB"), ("secure_rate", "secure/crc 64 B")]
groups = []
for key, label in metrics:
    vs = [benches[t].get(key, {}).get("ratio") if benches[t].get(key) else None for t in benches]
    if any(v for v in vs):
        groups.append((label, vs))
bars(groups, list(benches), "msgr / reference, per backend (median of rounds)", "ratio",
     os.path.join(plots, "backends.svg"))

def fmt(v, unit):
    """A figure as people read it: 10.3 M msg/s, 4,900 MiB/s, 3.81 µs."""
    if unit == "msg/s":
        return f"{v / 1e6:.2f} M msg/s"
    if unit == "MiB/s":
        return f"{v:,.0f} MiB/s"
    return f"{v:.2f} {unit}"


# The report.
md = ["# Benchmarks",
      "",
      "Generated by `scripts/benchmarks.sh` (which runs `msgr bench --json` per backend and "
      "`msgr stream --json` by size, then `scripts/benchmarks_report.py`): run it again to "
      "measure this machine. Every figure is a ratio against a reference measured in the same "
      "run, on the same machine, so a slower or busier machine moves both. The raw JSON is in "
      "`target/bench/` after a run; earlier measurements are in docs/HISTORY.md and the git history.",
      ""]
any_bench = next(iter(benches.values()), None)
if any_bench:
    m = any_bench["machine"]
    measured = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    md += [f"Measured {measured}. Machine: {m.get('cores', '?')} cores; {'quiet' if m.get('quiet') else 'busy'} around the first run "
           f"(other processes used {m.get('other_cores_before', 0):.2f} cores before it, "
           f"{m.get('other_cores_during', 0):.2f} during it). Workers: "
           f"{any_bench.get('placement', '?')}.", ""]
md += ["## Against references", "",
       "| backend | metric | msgr | reference | ratio (spread over rounds) | target |",
       "|---|---|---|---|---|---|"]
for t, b in benches.items():
    for key, _ in metrics:
        c = b.get(key)
        if not c:
            continue
        kind = "≤" if c["target_kind"] == "max" else "≥"
        md.append(f"| {t} | {c['metric']} | {fmt(c['msgr'], c['unit'])} | {fmt(c['reference'], c['unit'])} "
                  f"({c['reference_name']}) | {c['ratio']:.2f}× ({c['ratio_spread'][0]:.2f}–{c['ratio_spread'][1]:.2f}) "
                  f"| {kind} {c['target']}× {'met' if c['met'] else 'missed'} |")
md += ["", "![latency](bench/latency.svg)", "", "![per backend](bench/backends.svg)", ""]
if sizes:
    md += ["## By message size (tcp loopback)", "",
           "`msgr stream` against `msgr serve`, one connection, callback sender, "
           "each size for the same time; crc mode and secure mode.", "",
           "| size | " + " | ".join(f"{m} msg/s | {m} MiB/s" for m in sorted(streams)) + " |",
           "|---|" + "---|---|" * len(streams)]
    for s in sizes:
        row = [f"{s} B"]
        for m in sorted(streams):
            st = streams[m].get(s, {})
            row += [f"{st.get('msgs_per_s', 0):,.0f}", f"{st.get('mib_per_s', 0):,.0f}"]
        md.append("| " + " | ".join(row) + " |")
    md += ["", "![rate by size](bench/rate_by_size.svg)", "", "![bandwidth by size](bench/bandwidth_by_size.svg)", ""]
md += ["## How it is measured", "",
       "- **Latency**: 64 B ping-pong, one connection, the server answering from its own buffer; "
       "one-way = round trip / 2; the reference is a blocking `std::net` ping-pong over the same "
       "loopback (an unfair reference: no framing, no sessions).",
       "- **Bandwidth**: 1 MiB messages streamed one way for a fixed time, checksummed on every "
       "send; the reference writes 1 MiB buffers to a plain socket.",
       "- **Message rate**: 64 B messages one way; the reference is a raw length-prefixed stream "
       "over `std::net` (no sessions, no checksums).",
       "- **Secure mode**: the same streams in `secure` mode (every frame sealed with AES-256-GCM) "
       "against `crc` mode, same run.",
       "- Each part runs msgr then its reference once per round; the table shows medians over "
       "rounds and the spread of the per-round ratios. `msgr bench` pins the two messengers' "
       "workers to a CPU each where the machine has two and is quiet.",
       "- Deterministic figures (instructions per message, callgrind): `scripts/instructions.sh`; "
       "ZeroMQ and tokio references: `scripts/bench-rate.sh`, `scripts/bench-latency.sh`; the RDMA "
       "backends in the QEMU guest: docs/GUEST.md (emulated, so only ratios to perftest mean "
       "anything there).", ""]
# Sections measured by hand (figures from other scripts, runs too long for
# this one) follow the marker in the current page; they are kept.
MARKER = "<!-- measured by hand: kept by scripts/benchmarks_report.py -->"
page = os.path.join(docs, "BENCHMARKS.md")
kept = ""
if os.path.exists(page):
    with open(page) as f:
        old = f.read()
    if MARKER in old:
        kept = old[old.index(MARKER):]
with open(page, "w") as f:
    f.write("\n".join(md))
    if kept:
        f.write("\n" + kept)
