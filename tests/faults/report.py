"""Sums up a long run: python3 tests/faults/report.py OUT_DIR

Reads every OUT_DIR/seed-*/result.json and prints the failed seeds, then per
fault kind how long sends stalled (the worst producer of each topic, from the
fault's start until sends flowed again; see checker.py): events, median, 90th
percentile and maximum, for the E=3/Qw=3/Qa=2 topic and the E=Qw=Qa=2 topic.
"""

import glob
import json
import os
import re
import sys
from collections import defaultdict


def pct(values, q):
    values = sorted(values)
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(q * len(values)))]


def extend_kills_to_restart(events, run_log):
    """A killed process is down until its restart is ready, seconds after
    the heal that started it (a bookie waits for its old registration to
    expire): its fault lasts until then, from run.log's RESTARTED lines."""
    try:
        with open(run_log) as f:
            lines = f.read().splitlines()
    except OSError:
        return
    ready = []  # (t, node)
    for line in lines:
        line = line.split("] ", 1)[-1]
        m = re.match(r"t=(\d+)ms (\S+) RESTARTED", line)
        if m:
            ready.append((int(m.group(1)) / 1000.0, m.group(2)))
    for a in events:
        if a["kind"] != "kill9":
            continue
        after = [t for t, node in ready if node == a["target"] and t >= a["heal"] - 0.01]
        if after:
            a["heal"] = min(after)


def main():
    out = sys.argv[1]
    results = []
    for path in sorted(glob.glob(os.path.join(out, "seed-*", "result.json"))):
        with open(path) as f:
            results.append(json.load(f))
    results.sort(key=lambda r: r["seed"])
    bad = [r for r in results if not r.get("valid")]
    print("%d schedules, %d valid" % (len(results), len(results) - len(bad)))
    for r in bad:
        what = r.get("anomalies") or {"error": [r.get("error", "?").strip().splitlines()[-1]]}
        print("  seed %d FAILED: %s" % (r["seed"], "; ".join("%s %d (%s)" % (k, len(v), v[0]) for k, v in what.items())))
    totals = defaultdict(int)
    for r in results:
        for k, v in (r.get("stats") or {}).items():
            totals[k] += v
    print("totals: " + ", ".join("%s %d" % kv for kv in sorted(totals.items())))
    stalls = defaultdict(lambda: defaultdict(list))
    held = defaultdict(list)
    for r in results:
        events = r.get("availability") or []
        extend_kills_to_restart(events, os.path.join(out, "seed-%d" % r["seed"], "run.log"))
        for a in events:
            kind = a["kind"]
            # A fault on top of another (the plan's mixed faults) is counted
            # apart: its stall is the pair's.
            if any(b is not a and b["start"] < a["heal"] and a["start"] < b["heal"] for b in events):
                kind = "mixed (two at once)"
            elif kind in ("kill9", "pause", "loss", "delay", "reset", "clock", "asymmetric") and a.get("target"):
                kind += " " + a["target"].rstrip("0123456789").rstrip("-")
            held[kind].append(a["heal"] - a["start"])
            for topic, s in a.get("stall_by_topic", {}).items():
                stalls[kind][topic.split("/")[-2]].append(s)
    print()
    print("%-30s %6s %9s | %-28s | %-28s" % ("fault", "events", "held p50", "E3/Qw3/Qa2 stall p50/p90/max", "E2/Qw2/Qa2 stall p50/p90/max"))
    for kind in sorted(stalls):
        cells = []
        for ns in ("e3", "e2"):
            v = stalls[kind].get(ns, [])
            cells.append("%5.1f / %5.1f / %5.1f s" % (pct(v, 0.5), pct(v, 0.9), max(v) if v else float("nan")))
        print("%-30s %6d %8.1fs | %-28s | %-28s" % (kind, len(held[kind]), pct(held[kind], 0.5), cells[0], cells[1]))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
