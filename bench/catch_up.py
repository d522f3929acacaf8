"""Catch-up read scenarios (issue 27), Vela beside Apache Pulsar in the same
run, both driven by the same client (`vela perf`):

  backlog-while-producing
                   a backlog (5 M x 1 KiB by default, so the drain lasts
                   seconds: --while-producing-messages), then a producer at
                   20k msg/s (batched) on the same topic: alone for 10 s,
                   then while one consumer (receiver queue 1,000) drains the
                   backlog; the producer's latency percentiles before and
                   during the drain and, for Vela, each write-path stage in
                   both windows (from /admin/v2/vela/write-path) and the
                   server's CPU.
  backlog-drain    a backlog of N x 1 KiB messages (batched, produced with
                   every subscription already there), then drained by one
                   exclusive consumer per receiver queue size (1,000, the
                   clients' default, and 10,000), each on its own
                   subscription, one after the other (the first drain reads
                   a cold backlog, the second one what the first left in
                   the page cache: the same order on both systems).

bench/run.sh backlog-drain [--systems vela] [--messages N]
(bench.py hands these scenario names to this module.)
Prints one table: msg/s and MB/s of each drain on each system, and the
ratio Vela / Pulsar; then each system's peak RSS per phase and, for Vela,
each memory budget's peak use against its bound (bench/budgets.py).
Figures only, never a pass/fail on timing.
"""

from __future__ import annotations

import json
import shutil
import statistics
import time
import urllib.request
from pathlib import Path

import bench
import budgets
import common
import disturbance

SCENARIOS = {
    "backlog-drain": "drain a backlog of 1 KiB messages, receiver queue 1,000 and 10,000",
    "backlog-while-producing": "drain a backlog while a producer writes 20k msg/s: "
                               "producer latency before and during",
}
# backlog-while-producing: the producer's rate and how long it runs alone.
PRODUCER_RATE = 20_000
PRODUCER_ALONE_S = 10
QUEUES = (1000, 10_000)
MESSAGES_DEFAULT = 1_500_000
# backlog-while-producing's backlog: large enough that the drain (and so the
# producer's "during" window) lasts several seconds on Vela (~1 M msg/s).
WHILE_PRODUCING_MESSAGES_DEFAULT = 5_000_000
MESSAGE_BYTES = 1024


def perf_json(opts: bench.Options, args: list, log: Path, timeout: float) -> dict:
    return common.perf_json([opts.vela, "perf"] + args + ["--json"], log, timeout)


def produce_backlog(opts: bench.Options, server: bench.Server, topic: str, messages: int,
                    system: str) -> float:
    """The backlog of `messages` x 1 KiB, batched: its produce msg/s."""
    produced = perf_json(opts, ["produce", topic, "-u", server.service_url, "-r", "0",
                                "-s", str(MESSAGE_BYTES), "-o", "1000",
                                "-m", str(messages), "-i", "5"],
                         opts.log_dir / f"{system}.drain.produce.log", timeout=1800)
    print(f"   {system}: produced {messages} at {produced['messages_per_s']:.0f} msg/s",
          flush=True)
    return produced["messages_per_s"]


def read_path(server: bench.Server, system: str, row: dict) -> None:
    """Vela's read-path breakdown into `row` (Pulsar has none)."""
    if not system.startswith("vela"):
        return
    try:
        with urllib.request.urlopen(f"{server.admin_url}/admin/v2/vela/read-path",
                                    timeout=30) as answer:
            row["read_path"] = json.loads(answer.read())
    except OSError as error:
        print(f"   {system}: no read-path breakdown: {error}")


def write_path_now(server: bench.Server) -> dict | None:
    """Vela's write-path stage histograms as they are now (bucket counts per
    stage and scope), to subtract from a later snapshot; None for Pulsar or
    when the endpoint cannot be read."""
    if not server.system.startswith("vela"):
        return None
    try:
        with urllib.request.urlopen(f"{server.admin_url}/admin/v2/vela/write-path",
                                    timeout=30) as answer:
            doc = json.loads(answer.read())
    except OSError:
        return None
    return {"bounds": doc["bucket_bounds_us"],
            "stages": {(r["stage"], r["scope"]): (r["buckets"], r["sum_us"])
                       for r in doc["stages"]}}


def bucket_quantile(buckets: list, bounds: list, q: float) -> float:
    """As vela_metrics::Snapshot::quantile: linear inside the bucket (µs)."""
    count = sum(buckets)
    if count == 0:
        return 0.0
    rank = max(q * count, 1.0)
    below = 0
    for i, n in enumerate(buckets):
        if n == 0:
            continue
        if below + n >= rank:
            lower = bounds[i - 1] if i > 0 else 0
            if i >= len(bounds):
                return float(lower)
            return lower + (bounds[i] - lower) * (rank - below) / n
        below += n
    return float(bounds[-1])


def write_path_window(before: dict | None, after: dict | None) -> list:
    """Each write-path stage's count, mean, p50 and p99 (ms) between two
    snapshots: where a phase's publishes spent their time."""
    if not before or not after:
        return []
    rows = []
    bounds = after["bounds"]
    for key, (buckets, total_us) in after["stages"].items():
        old, old_total = before["stages"].get(key, ([0] * len(buckets), 0))
        delta = [a - b for a, b in zip(buckets, old)]
        count = sum(delta)
        if count == 0:
            continue
        # The slowest sample's bucket, by its upper bound: a stall of a few
        # samples (one journal group holds many adds) moves no p99.
        top = max(i for i, n in enumerate(delta) if n)
        max_us = bounds[top] if top < len(bounds) else bounds[-1]
        rows.append({"stage": key[0], "scope": key[1], "count": count,
                     "mean_ms": (total_us - old_total) / count / 1000,
                     "p50_ms": bucket_quantile(delta, bounds, 0.5) / 1000,
                     "p99_ms": bucket_quantile(delta, bounds, 0.99) / 1000,
                     "max_ms": max_us / 1000})
    return rows


def run_drains_in_turns(opts: bench.Options, systems: list, messages: int,
                        repeats: int) -> list:
    """backlog-drain with every system up at once: each gets its backlog,
    then the systems take turns draining it (`repeats` rounds, each on
    fresh subscriptions, the order alternating), and the median of each
    system's drains is reported. On a shared machine the load drifts from
    one minute to the next; turns spread the drift over both alike."""
    topic_path = "public/default/backlog-drain"
    topic = f"persistent://{topic_path}"
    servers = {}
    watches = {}
    rows = {s: {"system": s, "messages": messages, "runs": {f"q{q}": [] for q in QUEUES}}
            for s in systems}
    try:
        for system in systems:
            data_dir = opts.data_root / f"backlog-drain-{system}"
            shutil.rmtree(data_dir, ignore_errors=True)
            server = bench.SERVERS[system](1, data_dir, opts)
            print(f"   {system}: starting", flush=True)
            server.start()
            servers[system] = server
            watches[system] = budgets.MemoryWatch(server)
            common.prepare_topic(server, topic_path,
                          [f"q{q}-r{r}" for r in range(repeats) for q in QUEUES])
            watches[system].phase("produce")
            rows[system]["produce_msg_s"] = produce_backlog(opts, server, topic, messages,
                                                            system)
            watches[system].phase(None)
        for r in range(repeats):
            order = systems if r % 2 == 0 else list(reversed(systems))
            for system in order:
                server = servers[system]
                for q in QUEUES:
                    watches[system].phase(f"drain q={q}")
                    summary = perf_json(opts, ["consume", topic, "-u", server.service_url,
                                               "-s", f"q{q}-r{r}",
                                               "--subscription-position", "earliest",
                                               "-q", str(q), "-m", str(messages), "-i", "5"],
                                        opts.log_dir / f"{system}.drain.q{q}.r{r}.log",
                                        timeout=1800)
                    watches[system].phase(None)
                    rows[system]["runs"][f"q{q}"].append(summary["messages_per_s"])
                    print(f"   round {r + 1}/{repeats} {system}: drain q={q}: "
                          f"{summary['messages_per_s']:.0f} msg/s", flush=True)
        for system in systems:
            for q in QUEUES:
                runs = rows[system]["runs"][f"q{q}"]
                rows[system][f"q{q}_msg_s"] = statistics.median(runs)
            read_path(servers[system], system, rows[system])
    except bench.Fail as error:
        print(f"   FAILED: {error}", flush=True)
        for row in rows.values():
            row["failed"] = str(error).splitlines()[0]
    finally:
        for system, watch in watches.items():
            rows[system]["memory"] = watch.stop()
        for system, server in servers.items():
            server.stop()
            if not opts.keep_data:
                shutil.rmtree(opts.data_root / f"backlog-drain-{system}", ignore_errors=True)
    return list(rows.values())


def run_drain(opts: bench.Options, system: str, messages: int) -> dict:
    row = {"system": system, "messages": messages}
    topic_path = "public/default/backlog-drain"
    topic = f"persistent://{topic_path}"
    with common.recording_failure(row, system), \
            common.fresh_server(opts, bench.SERVERS[system], f"backlog-drain-{system}",
                                system) as server:
        watch = budgets.MemoryWatch(server)
        try:
            common.prepare_topic(server, topic_path, [f"q{q}" for q in QUEUES])
            watch.phase("produce")
            row["produce_msg_s"] = produce_backlog(opts, server, topic, messages, system)
            for q in QUEUES:
                watch.phase(f"drain q={q}")
                started = time.monotonic()
                summary = perf_json(opts, ["consume", topic, "-u", server.service_url,
                                           "-s", f"q{q}", "--subscription-position", "earliest",
                                           "-q", str(q), "-m", str(messages), "-i", "5"],
                                    opts.log_dir / f"{system}.drain.q{q}.log", timeout=1800)
                row[f"q{q}_msg_s"] = summary["messages_per_s"]
                row[f"q{q}_mb_s"] = summary["mb_per_s"]
                row[f"q{q}_wall_s"] = time.monotonic() - started
                print(f"   {system}: drain q={q}: {summary['messages_per_s']:.0f} msg/s "
                      f"({row[f'q{q}_wall_s']:.1f} s wall)", flush=True)
            read_path(server, system, row)
        finally:
            row["memory"] = watch.stop()
    return row


def run_while_producing(opts: bench.Options, system: str, messages: int) -> dict:
    row = {"system": system, "messages": messages}
    topic_path = "public/default/backlog-while-producing"
    topic = f"persistent://{topic_path}"
    logs = opts.log_dir
    with common.recording_failure(row, system), \
            common.fresh_server(opts, bench.SERVERS[system],
                                f"backlog-while-producing-{system}", system) as server:
        watch = budgets.MemoryWatch(server)
        try:
            common.prepare_topic(server, topic_path, ["catch-up"])
            watch.phase("produce the backlog")
            perf_json(opts, ["produce", topic, "-u", server.service_url, "-r", "0",
                             "-s", str(MESSAGE_BYTES), "-o", "1000", "-m", str(messages), "-i", "5"],
                      logs / f"{system}.bwp.backlog.log", timeout=1800)
            rate = ["-r", str(PRODUCER_RATE), "-s", str(MESSAGE_BYTES), "-i", "5"]
            watch.phase("producer alone")
            stages_before = write_path_now(server)
            cpu_before = bench.cpu_seconds(server.pid)
            alone_started = time.monotonic()
            alone = perf_json(opts, ["produce", topic, "-u", server.service_url, *rate,
                                     "--test-duration", str(PRODUCER_ALONE_S), "--warmup", "2"],
                              logs / f"{system}.bwp.alone.log", timeout=300)
            row["alone_latency_ms"] = alone["latency_ms"]
            row["write_path"] = {"alone": write_path_window(stages_before,
                                                            write_path_now(server))}
            row["server_cpu"] = {"alone": cpu_share(server, cpu_before, alone_started)}
            during_log = logs / f"{system}.bwp.during.log"
            # The producer warms up (connects, first batches) for 2 s, left out
            # of its figures, before the drain starts: its summary covers the
            # drain only.
            producer = bench.spawn([opts.vela, "perf", "produce", topic, "-u", server.service_url,
                                    *rate, "--warmup", "2", "--json"], during_log)
            time.sleep(2.2)
            watch.phase("drain while producing")
            stages_before = write_path_now(server)
            cpu_before = bench.cpu_seconds(server.pid)
            started = time.monotonic()
            drain_started_unix = time.time()
            foreign = disturbance.ForeignActivity()
            drained = perf_json(opts, ["consume", topic, "-u", server.service_url,
                                       "-s", "catch-up", "--subscription-position", "earliest",
                                       "-q", "1000", "-m", str(messages), "-i", "5"],
                                logs / f"{system}.bwp.drain.log", timeout=1800)
            row["drain_wall_s"] = time.monotonic() - started
            drain_ended_unix = time.time()
            row["drain_unix_s"] = [drain_started_unix, drain_ended_unix]
            # Other processes during the drain: a stall then may be theirs.
            row["foreign_during_drain"] = foreign.stop()
            row["write_path"]["during"] = write_path_window(stages_before,
                                                            write_path_now(server))
            row["server_cpu"]["during"] = cpu_share(server, cpu_before, started)
            watch.phase(None)
            producer.send_signal(bench.signal.SIGINT)
            producer.wait(timeout=60)
            during = bench.parse_vela_json(during_log)
            row["during_latency_ms"] = during["latency_ms"]
            row["during_msg_s"] = during["messages_per_s"]
            row["drain_msg_s"] = drained["messages_per_s"]
            print(f"   {system}: producer p99 alone {alone['latency_ms']['p99']:.2f} ms, during the "
                  f"drain {during['latency_ms']['p99']:.2f} ms (max {alone['latency_ms']['max']:.2f} "
                  f"-> {during['latency_ms']['max']:.2f} ms); drain "
                  f"{drained['messages_per_s']:.0f} msg/s ({row['drain_wall_s']:.1f} s, "
                  f"{time.strftime('%H:%M:%S', time.gmtime(drain_started_unix))}-"
                  f"{time.strftime('%H:%M:%S', time.gmtime(drain_ended_unix))} UTC)\n"
                  f"   {system}: other processes during the drain: "
                  f"{disturbance.describe(row['foreign_during_drain'])}", flush=True)
        finally:
            row["memory"] = watch.stop()
    return row


def cpu_share(server: bench.Server, before: float | None, since: float) -> float | None:
    """The server's CPU seconds per second of wall time since `since`."""
    now = bench.cpu_seconds(server.pid)
    if before is None or now is None:
        return None
    return (now - before) / max(time.monotonic() - since, 1e-6)


def write_path_lines(row: dict) -> list:
    """Vela's write-path stages of the producer alone and during the drain."""
    windows = row.get("write_path", {})
    alone = {(r["stage"], r["scope"]): r for r in windows.get("alone", [])}
    during = {(r["stage"], r["scope"]): r for r in windows.get("during", [])}
    if not alone or not during:
        return []
    lines = [["stage", "scope", "p50 alone", "p99 alone", "p50 during", "p99 during",
              "mean alone", "mean during", "max alone", "max during"]]
    for key, a in alone.items():
        d = during.get(key)
        if d is None:
            continue
        lines.append([key[0], key[1], f"{a['p50_ms']:.3f}", f"{a['p99_ms']:.3f}",
                      f"{d['p50_ms']:.3f}", f"{d['p99_ms']:.3f}",
                      f"{a['mean_ms']:.3f}", f"{d['mean_ms']:.3f}",
                      f"<{a.get('max_ms', 0):.1f}", f"<{d.get('max_ms', 0):.1f}"])
    cpu = row.get("server_cpu", {})
    out = ["   " + line for line in common.plain_table(lines).splitlines()]
    if cpu.get("alone") is not None and cpu.get("during") is not None:
        out.append(f"   server CPU: {cpu['alone']:.2f} cores alone, "
                   f"{cpu['during']:.2f} during the drain")
    return out


def while_producing_table(rows: list) -> str:
    headers = ["system", "p50 alone", "p99 alone", "p50 during", "p99 during",
               "p99 during / alone", "max alone", "max during", "drain msg/s"]
    lines = [headers]
    for r in rows:
        if "failed" in r:
            lines.append([r["system"], "failed", "", "", "", "", "", "", ""])
            continue
        a, d = r["alone_latency_ms"], r["during_latency_ms"]
        lines.append([r["system"], f"{a['p50']:.2f} ms", f"{a['p99']:.2f} ms",
                      f"{d['p50']:.2f} ms", f"{d['p99']:.2f} ms",
                      f"{d['p99'] / a['p99']:.2f}x" if a["p99"] else "-",
                      f"{a['max']:.2f} ms", f"{d['max']:.2f} ms",
                      f"{r['drain_msg_s']:,.0f}"])
    return common.plain_table(lines)


def table(rows: list) -> str:
    by = {r["system"]: r for r in rows}
    headers = ["drain", *[r["system"] for r in rows]]
    if "vela" in by and "pulsar" in by:
        headers.append("vela / pulsar")
    lines = [headers]
    for q in QUEUES:
        key = f"q{q}_msg_s"
        line = [f"receiver queue {q:,} (msg/s)"]
        for r in rows:
            line.append(f"{r[key]:,.0f}" if key in r else "failed")
        if "vela" in by and "pulsar" in by:
            v, p = by["vela"].get(key), by["pulsar"].get(key)
            line.append(f"{v / p:.2f}x" if v and p else "-")
        lines.append(line)
    line = ["produce, batched (msg/s)"]
    for r in rows:
        line.append(f"{r['produce_msg_s']:,.0f}" if "produce_msg_s" in r else "failed")
    if "vela" in by and "pulsar" in by:
        v, p = by["vela"].get("produce_msg_s"), by["pulsar"].get("produce_msg_s")
        line.append(f"{v / p:.2f}x" if v and p else "-")
    lines.append(line)
    return common.plain_table(lines)


def read_path_lines(row: dict) -> list:
    out = []
    for stage in row.get("read_path", {}).get("stages", []):
        out.append(f"     {stage['stage']:<22} {stage['scope']:<22} n={stage['count']:<8} "
                   f"p50 {stage['p50_us'] / 1000:.2f} ms  p99 {stage['p99_us'] / 1000:.2f} ms")
    return out


def main(argv: list) -> int:
    parser = common.run_parser(__doc__, SCENARIOS)
    parser.add_argument("--messages", type=int, default=MESSAGES_DEFAULT,
                        help=f"messages in the backlog (default {MESSAGES_DEFAULT:,})")
    parser.add_argument("--while-producing-messages", type=int,
                        default=WHILE_PRODUCING_MESSAGES_DEFAULT,
                        help="messages in backlog-while-producing's backlog (default "
                             f"{WHILE_PRODUCING_MESSAGES_DEFAULT:,})")
    parser.add_argument("--repeat", type=int, default=3,
                        help="backlog-drain: rounds of turns, the median reported (default 3; "
                             "1: one system after the other, each on its own)")
    args = parser.parse_args(argv)
    systems = common.systems_of(args)
    opts = common.start_run(args)
    rows = []
    producing = []
    try:
        for name in args.scenarios:
            messages = (args.while_producing_messages if name == "backlog-while-producing"
                        else args.messages)
            print(f"\n== {name}: {SCENARIOS[name]} ({messages:,} messages) ==", flush=True)
            for system in systems:
                if name == "backlog-while-producing":
                    producing.append(run_while_producing(opts, system,
                                                         args.while_producing_messages))
                elif args.repeat <= 1:
                    rows.append(run_drain(opts, system, args.messages))
            if name == "backlog-drain" and args.repeat > 1:
                rows.extend(run_drains_in_turns(opts, systems, args.messages, args.repeat))
    finally:
        bench.stop_all_children()
    if rows:
        print("\nbacklog-drain (vela perf on both systems, 1 bookie; median of "
              f"{max(args.repeat, 1)} rounds):")
        print(table(rows))
        for row in rows:
            for key, runs in row.get("runs", {}).items():
                print(f"   {row['system']} {key}: " + ", ".join(f"{v:,.0f}" for v in runs))
    if producing:
        print(f"\nbacklog-while-producing: producer at {PRODUCER_RATE:,} msg/s, latency "
              "before and during a drain (receiver queue 1,000):")
        print(while_producing_table(producing))
        for row in producing:
            lines = write_path_lines(row)
            if lines:
                print(f"\n   {row['system']} write path (ms), producer alone and during the drain:")
                print("\n".join(lines))
    for row in rows:
        lines = read_path_lines(row)
        if lines:
            print(f"\n   {row['system']} read path (both drains):")
            print("\n".join(lines))
    memory_rows = [r for r in rows + producing if "memory" in r]
    if memory_rows:
        print("\nmemory (peak RSS sampled every 0.25 s; Vela's budgets and their peak use "
              "from its /metrics every 1 s, MiB):")
        for row in memory_rows:
            print("\n".join(budgets.lines(row["system"], row["memory"])))
    common.write_results(args.out, "catch-up-results.json",
                         {"backlog-drain": rows, "backlog-while-producing": producing})
    return 1 if any("failed" in r for r in rows + producing) else 0
