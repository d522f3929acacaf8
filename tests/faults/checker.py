"""Offline checker of a fault run's history (workload.py's JSONL) and events
(the nemesis's JSONL).

Per producer, over the final read of the `audit` subscription (the whole
topic, as the brokers kept it):
- lost:       a send acknowledged (`ok`) that is not there; this is also how an
              acknowledgement by a fenced broker shows (its entry was not kept);
- duplicated: one value at two message ids (dedup failed);
- reordered:  a value read after a higher value of the same producer;
- unexpected: a value never sent, or whose send definitely failed;
- misplaced:  an acknowledged value read at another message id than its
              receipt gave (the receipt named an entry the log does not hold);
- recovered:  `info` sends (outcome unknown) that are there: allowed.
Over the `live` subscription (consumers acknowledging as they go):
- lost-from-subscription: an acknowledged send never delivered;
- unexpected deliveries; redeliveries are counted, not errors (at least once).
Availability per fault: the longest time no send of a producer was
acknowledged, from the fault's start until the next fault starts (at most
15 s past its heal), the worst producer of each topic.

Usage: checker.py HISTORY.jsonl EVENTS.jsonl  (prints the summary; exit 1 on
any anomaly).
"""

import json
import sys
from collections import defaultdict

ANOMALIES = ("lost", "duplicated", "reordered", "unexpected", "misplaced", "lost-from-subscription", "unexpected-delivery")
AFTER_HEAL_S = 15.0


def load(path):
    out = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass  # a torn last line of a killed writer
    return out


def check(history, events):
    sends = defaultdict(dict)  # producer -> value -> op (final outcome)
    invoked = defaultdict(set)
    ok_times = defaultdict(list)  # producer -> [t]
    audit = defaultdict(list)  # producer -> [(value, id)]
    live = defaultdict(list)  # producer -> [value]
    phases = {}
    topic_of = {}
    for op in history:
        f = op.get("f")
        if f == "connect" and op.get("topic"):
            topic_of[op["process"]] = op["topic"]
        if f == "send":
            p = op["process"]
            if op["type"] == "invoke":
                invoked[p].add(op["value"])
            else:
                sends[p][op["value"]] = op
                if op["type"] == "ok" and p.startswith("p"):
                    # Availability is the steady producers' (p0, p1, ...);
                    # the prober's short-lived ones (q...) send too rarely.
                    ok_times[p].append(op["t"] / 1000.0)
        elif f == "read" and op["type"] == "ok":
            audit[op["producer"]].append((op["value"], tuple(op["id"])))
        elif f == "receive" and op["type"] == "ok":
            live[op["producer"]].append(op["value"])
        elif f == "phase":
            phases[op["value"]] = op["t"] / 1000.0

    found = {k: [] for k in ANOMALIES}
    stats = defaultdict(int)
    producers = sorted(set(invoked) | set(audit))
    if "done" not in phases:
        found.setdefault("incomplete", []).append("the workload did not finish (no 'done' phase)")
    for p in producers:
        outcome = sends[p]
        ok = {v for v, op in outcome.items() if op["type"] == "ok"}
        failed = {v for v, op in outcome.items() if op["type"] == "fail"}
        info = {v for v, op in outcome.items() if op["type"] == "info"}
        # Invoked sends without a completion are `info` too.
        info |= invoked[p] - set(outcome)
        stats["sends ok"] += len(ok)
        stats["sends info"] += len(info)
        stats["sends fail"] += len(failed)

        ids_of = defaultdict(set)
        order = []
        for value, mid in audit[p]:
            if mid in ids_of[value]:
                stats["audit rereads"] += 1  # the same entry delivered again: not a second copy
                continue
            ids_of[value].add(mid)
            order.append((value, mid))
        high = -1
        for value, mid in order:
            if value < high:
                found["reordered"].append("%s:%d after %s:%d" % (p, value, p, high))
            high = max(high, value)
        for value, mids in ids_of.items():
            if len(mids) > 1:
                found["duplicated"].append("%s:%d at %s" % (p, value, sorted(mids)))
            if value not in invoked[p]:
                found["unexpected"].append("%s:%d never sent" % (p, value))
            elif value in failed:
                found["unexpected"].append("%s:%d failed definitely (%s) yet is there" % (p, value, outcome[value].get("error")))
        for value in sorted(ok - set(ids_of)):
            found["lost"].append("%s:%d acknowledged at %s (t=%dms), not in the topic" % (p, value, outcome[value].get("id"), outcome[value]["t"]))
        for value in sorted(ok & set(ids_of)):
            receipt = tuple(outcome[value].get("id") or ())
            if receipt and receipt[0] >= 0 and receipt[:2] not in {m[:2] for m in ids_of[value]}:
                found["misplaced"].append("%s:%d receipt %s, read at %s" % (p, value, list(receipt), sorted(ids_of[value])))
        stats["info sends found"] += len(info & set(ids_of))

        delivered = live[p]
        seen = set(delivered)
        stats["live deliveries"] += len(delivered)
        stats["live redeliveries"] += len(delivered) - len(seen)
        for value in sorted(ok - seen):
            found["lost-from-subscription"].append("%s:%d acknowledged, never delivered to 'live'" % (p, value))
        for value in sorted(seen - invoked[p]):
            found["unexpected-delivery"].append("%s:%d delivered, never sent" % (p, value))

    availability = availability_of(events, ok_times, phases, topic_of)
    return found, dict(stats), availability


def availability_of(events, ok_times, phases, topic_of):
    """[{fault, kind, target, start, heal, stall_s, stall_by_topic}] per
    fault; a topic's stall is its worst producer's."""
    starts = {}
    heals = {}
    for e in events:
        if e.get("phase") == "start":
            starts[e["fault"]] = e
        elif e.get("phase") == "heal":
            heals.setdefault(e["fault"], e)
        elif e.get("phase") == "ready":
            # A killed process is down until its restart is ready.
            heals[e["fault"]] = e
    order = sorted(starts.values(), key=lambda e: e["t"])
    end_of_run = phases.get("flush", max([t for ts in ok_times.values() for t in ts] or [0]))
    out = []
    for i, e in enumerate(order):
        start = e["t"] / 1000.0
        heal = heals.get(e["fault"], {}).get("t", end_of_run * 1000) / 1000.0
        window_end = min(heal + AFTER_HEAL_S, end_of_run)
        if i + 1 < len(order):
            window_end = min(window_end, max(heal, order[i + 1]["t"] / 1000.0))
        worst = 0.0
        by_topic = {}
        for p, times in ok_times.items():
            times = sorted(times)
            points = [start] + [t for t in times if start < t <= window_end]
            if points[-1] < window_end:
                # No acknowledgement until the window closed: stalled at least to its end.
                points.append(window_end)
            stall = max((b - a for a, b in zip(points, points[1:])), default=0.0)
            worst = max(worst, stall)
            topic = topic_of.get(p, p)
            by_topic[topic] = round(max(by_topic.get(topic, 0.0), stall), 3)
        out.append(
            {"fault": e["fault"], "kind": e["kind"], "target": e.get("target"), "what": e["what"],
             "start": start, "heal": heal, "stall_s": round(worst, 3), "stall_by_topic": by_topic}
        )  # fmt: skip
    return out


def summary(found, stats, availability):
    lines = []
    bad = {k: v for k, v in found.items() if v}
    lines.append("checker: %s" % ("VALID" if not bad else "INVALID: " + ", ".join("%s %d" % (k, len(v)) for k, v in bad.items())))
    lines.append("  " + ", ".join("%s %d" % kv for kv in sorted(stats.items())))
    for k, v in bad.items():
        for item in v[:10]:
            lines.append("  %s: %s" % (k, item))
        if len(v) > 10:
            lines.append("  %s: ... %d more" % (k, len(v) - 10))
    for a in availability:
        topics = ", ".join("%s %.2fs" % (t.split("/")[-2], s) for t, s in sorted(a.get("stall_by_topic", {}).items()))
        lines.append(
            "  availability: fault %d %-24s %-9s held %4.1fs, sends stalled %5.2fs (%s)"
            % (a["fault"], a["kind"], a["target"] or "-", a["heal"] - a["start"], a["stall_s"], topics)
        )
    return "\n".join(lines)


def main():
    history, events = load(sys.argv[1]), load(sys.argv[2])
    found, stats, availability = check(history, events)
    print(summary(found, stats, availability))
    sys.exit(1 if any(found.values()) else 0)


if __name__ == "__main__":
    main()
