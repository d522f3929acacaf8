#!/usr/bin/env python3
"""Latency percentile curves of several runs in one SVG (standard library).

X: percentile on a "nines" scale (p0, p90, p99, p99.9, ... evenly spaced);
Y: latency in ms, log scale. Used by bench.py for the sync 1 KiB overlay of
Vela and Pulsar; runnable on its own over a results.json:

    bench/plot.py target/bench-results/results.json out.svg [SCENARIO]
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

WIDTH, HEIGHT = 960.0, 560.0
LEFT, RIGHT, TOP, BOTTOM = 80.0, 30.0, 44.0, 60.0
NINES_MAX = 6.0  # p99.9999; the max is drawn there
COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#17becf"]


def nines(percentile: float) -> float:
    rest = 1.0 - percentile / 100.0
    return NINES_MAX if rest <= 10 ** -NINES_MAX else -math.log10(rest)


def esc(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def label_of(value: float) -> str:
    return f"{value:.4f}".rstrip("0").rstrip(".")


def write_svg(path: Path, title: str, series: list) -> None:
    """series: [(label, [(percentile, ms), ...]), ...]"""
    values = [ms for _, pts in series for _, ms in pts if ms and ms > 0]
    low, high = (min(values), max(values)) if values else (0.01, 1.0)
    y_min = 10 ** math.floor(math.log10(low))
    y_max = 10 ** max(math.ceil(math.log10(high)), math.log10(y_min) + 1)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x_of(p):
        return LEFT + nines(p) / NINES_MAX * plot_w

    def y_of(ms):
        ms = max(ms, y_min)
        span = math.log10(y_max) - math.log10(y_min)
        return TOP + plot_h * (1 - (math.log10(ms) - math.log10(y_min)) / span)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH:.0f}" height="{HEIGHT:.0f}" '
           'font-family="sans-serif" font-size="12">',
           '<rect width="100%" height="100%" fill="white"/>',
           f'<text x="{WIDTH / 2:.0f}" y="26" font-size="15" text-anchor="middle">{esc(title)}</text>']
    for n in range(int(NINES_MAX) + 1):
        p = 100.0 * (1 - 10.0 ** -n)
        x = x_of(p)
        label = "p0" if n == 0 else ("max" if n == NINES_MAX else f"p{label_of(p)}")
        out.append(f'<line x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{TOP + plot_h:.1f}" stroke="#ddd"/>'
                   f'<text x="{x:.1f}" y="{TOP + plot_h + 18:.1f}" text-anchor="middle">{label}</text>')
    tick = y_min
    while tick <= y_max * 1.0001:
        y = y_of(tick)
        out.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{LEFT + plot_w:.1f}" y2="{y:.1f}" stroke="#ddd"/>'
                   f'<text x="{LEFT - 6:.1f}" y="{y + 4:.1f}" text-anchor="end">{label_of(tick)} ms</text>')
        tick *= 10
    out.append(f'<text x="{LEFT + plot_w / 2:.1f}" y="{HEIGHT - 16:.0f}" text-anchor="middle">'
               'percentile (nines scale)</text>')
    for i, (label, pts) in enumerate(series):
        color = COLORS[i % len(COLORS)]
        # Pulsar driven by `vela perf`: dashed, beside Pulsar with pulsar-perf.
        dash = ' stroke-dasharray="6,4"' if label.startswith("pulsar") and "vela-perf" in label else ""
        coords = " ".join(f"{x_of(p):.1f},{y_of(ms):.1f}" for p, ms in pts if ms and ms > 0)
        out.append(f'<polyline fill="none" stroke="{color}" stroke-width="2"{dash} points="{coords}"/>')
        ly = TOP + 16 + 18 * i
        out.append(f'<rect x="{LEFT + 12:.0f}" y="{ly - 5:.0f}" width="16" height="4" fill="{color}"/>'
                   f'<text x="{LEFT + 34:.0f}" y="{ly:.0f}">{esc(label)}</text>')
    out.append("</svg>")
    Path(path).write_text("\n".join(out) + "\n")


def main() -> int:
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    data = json.loads(Path(sys.argv[1]).read_text())
    scenario = sys.argv[3] if len(sys.argv) > 3 else "sync-1k"
    res = next((r for r in data["results"] if r["scenario"] == scenario), None)
    if res is None:
        print(f"no scenario {scenario} in {sys.argv[1]}", file=sys.stderr)
        return 1
    series = [(f"{r['system']} {r['bookies']} bookie(s) ({r['client']})", [tuple(p) for p in r["curve"]])
              for r in res["rows"] if r["curve"]]
    write_svg(Path(sys.argv[2]), f"{res['title']}: latency percentiles", series)
    return 0


if __name__ == "__main__":
    sys.exit(main())
