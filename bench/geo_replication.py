"""Geo-replication (issue 23), Vela beside Apache Pulsar in the same run,
both driven by the same client (`vela perf`):

  geo-replication  two standalones per system, clusters `a` and `b`, each
                   registered in the other (no shared configuration store:
                   Pulsar takes clusters recorded in each cluster's own
                   store), tenant `geo` allowed on both, namespace
                   `geo/repl` replicated a <-> b, `geo/local` on `a` only.
                   A producer on `a` at 10k msg/s, 1 KiB (the e2e-10k
                   scenario's producer: batched), first on `geo/local`,
                   then on `geo/repl` with a consumer on `b`:
                   - replication lag: from the producer's µs send stamp
                     in the payload on `a` to the consumer on `b`
                     (`vela perf consume`'s end-to-end latency);
                   - `a`'s publish latency without and with replication.

bench/run.sh geo-replication [--systems vela] [--duration S --warmup S]
(bench.py hands this scenario name to this module.)
Prints one table with the ratio Vela / Pulsar. Figures only, never a
pass/fail on timing. Both standalones of a system run at once on this
machine, one system after the other.
"""

from __future__ import annotations

import json
import shutil
import time

import bench
import common

SCENARIOS = {
    "geo-replication": "replication lag at 10k msg/s 1 KiB (publish on a to receive on b), "
                       "and a's publish latency with and without replication",
}
PRODUCER = bench.SCENARIOS["e2e-10k"]
SETUP_TIMEOUT_S = 120


def admin(server: bench.Server, method: str, path: str, body=None) -> tuple:
    return common.http(method, server.admin_url + path, body)


def must(answer: tuple, what: str, also_ok=(409,)) -> None:
    status, body = answer
    if not (200 <= status < 300 or status in also_ok):
        raise bench.Fail(f"{what}: HTTP {status} {body[:300]}")


def replicate(a: bench.Server, b: bench.Server) -> None:
    """Each cluster recorded in the other; `geo/repl` replicated among
    both; `geo/local` on `a` only."""
    for server, other in ((a, b), (b, a)):
        must(admin(server, "PUT", f"/admin/v2/clusters/{other.cluster_name}",
                   {"serviceUrl": other.admin_url, "brokerServiceUrl": other.service_url}),
             f"{server.cluster_name} records {other.cluster_name}")
    for server in (a, b):
        must(admin(server, "PUT", "/admin/v2/tenants/geo",
                   {"adminRoles": [], "allowedClusters": ["a", "b"]}), "tenant geo")
        must(admin(server, "PUT", "/admin/v2/namespaces/geo/repl"), "namespace geo/repl")
        must(admin(server, "POST", "/admin/v2/namespaces/geo/repl/replication", ["a", "b"]),
             "replication of geo/repl", also_ok=())
    must(admin(a, "PUT", "/admin/v2/namespaces/geo/local"), "namespace geo/local")


def producer(opts: bench.Options, url: str, topic: str) -> list:
    return bench.vela_perf_produce_cmd(opts, PRODUCER, url, topic, opts.duration, opts.warmup)


def wait_connected(a: bench.Server, topic_path: str) -> None:
    """Until `a`'s stats of the topic show its replicator to `b` connected."""
    deadline = time.monotonic() + SETUP_TIMEOUT_S
    while True:
        status, body = admin(a, "GET", f"/admin/v2/persistent/{topic_path}/stats")
        if status == 200 and json.loads(body).get("replication", {}).get("b", {}).get("connected"):
            return
        if time.monotonic() > deadline:
            raise bench.Fail(f"the replicator of {topic_path} never connected: {status} {body[:300]}")
        time.sleep(0.2)


def run_system(opts: bench.Options, system: str) -> dict:
    row = {"system": system}
    servers = []
    try:
        with common.recording_failure(row, system):
            run_pair(opts, system, row, servers)
    finally:
        for server in servers:
            server.stop()
        if not opts.keep_data:
            for name in ("a", "b"):
                shutil.rmtree(opts.data_root / f"geo-{system}-{name}", ignore_errors=True)
    return row


def run_pair(opts: bench.Options, system: str, row: dict, servers: list) -> None:
    """Starts `a` and `b` of `system` (into `servers`), replicates, and
    measures into `row`."""
    for name in ("a", "b"):
        data_dir = opts.data_root / f"geo-{system}-{name}"
        shutil.rmtree(data_dir, ignore_errors=True)
        server = bench.SERVERS[system](1, data_dir, opts)
        server.cluster_name = name
        if system == "pulsar":
            # Two standalones on one machine: their bookies and (unused
            # with the RocksDB metadata store) ZooKeeper need ports of
            # their own.
            server.extra_args = ["--bookkeeper-port", str(bench.free_port()),
                                 "--zookeeper-port", str(bench.free_port())]
        print(f"   {system}: starting {name}", flush=True)
        server.start()
        servers.append(server)
    a, b = servers
    replicate(a, b)
    logs = opts.log_dir
    # a's publish latency without replication.
    local = common.perf_json(producer(opts, a.service_url, "persistent://geo/local/t"),
                             logs / f"geo-{system}.local.log", timeout=opts.duration + 120)
    row["local_ms"] = local["latency_ms"]
    # The replicated topic: made, its replicator connected, before the run.
    topic_path = "geo/repl/t"
    topic = f"persistent://{topic_path}"
    common.perf_json([opts.vela, "perf", "produce", topic, "-u", a.service_url, "-m", "100",
                      "-r", "0", "--json"],
                     logs / f"geo-{system}.prime.log", timeout=SETUP_TIMEOUT_S)
    wait_connected(a, topic_path)
    cons_log = logs / f"geo-{system}.consume-b.log"
    consumer = bench.spawn([opts.vela, "perf", "consume", topic, "-u", b.service_url,
                            "--subscription-position", "latest",
                            "--test-duration", str(opts.duration + 3),
                            "--warmup", str(opts.warmup + 1), "-i", "5", "--json"],
                           cons_log)
    time.sleep(1.0)
    replicated = common.perf_json(producer(opts, a.service_url, topic),
                                  logs / f"geo-{system}.replicated.log",
                                  timeout=opts.duration + 120)
    try:
        consumer.wait(timeout=60)
    except Exception:
        bench.stop(consumer)
        raise bench.Fail(f"the consumer on b did not finish; see {cons_log}")
    received = bench.parse_vela_json(cons_log)
    row["replicated_ms"] = replicated["latency_ms"]
    row["lag_ms"] = received["latency_ms"]
    row["sent_msg_s"] = replicated["messages_per_s"]
    row["received_msg_s"] = received["messages_per_s"]
    print(f"   {system}: lag p50 {row['lag_ms']['p50']:.2f} ms p99 {row['lag_ms']['p99']:.2f} ms;"
          f" publish p99 {row['local_ms']['p99']:.2f} ms local, "
          f"{row['replicated_ms']['p99']:.2f} ms replicated", flush=True)


def table(rows: list) -> str:
    by = {r["system"]: r for r in rows}
    both = "vela" in by and "pulsar" in by
    headers = ["", *[r["system"] for r in rows]] + (["vela / pulsar"] if both else [])
    lines = [headers]
    figures = [
        ("replication lag p50", "lag_ms", "p50"),
        ("replication lag p99", "lag_ms", "p99"),
        ("replication lag p99.9", "lag_ms", "p999"),
        ("publish on a p50, not replicated", "local_ms", "p50"),
        ("publish on a p99, not replicated", "local_ms", "p99"),
        ("publish on a p50, replicated", "replicated_ms", "p50"),
        ("publish on a p99, replicated", "replicated_ms", "p99"),
    ]
    for title, key, pct in figures:
        line = [title]
        for r in rows:
            value = r.get(key, {}).get(pct)
            line.append(f"{value:.2f} ms" if value is not None else "failed")
        if both:
            v = by["vela"].get(key, {}).get(pct)
            p = by["pulsar"].get(key, {}).get(pct)
            line.append(f"{v / p:.2f}x" if v and p else "-")
        lines.append(line)
    # The consumer's window is longer than the producer's (it outlasts it
    # to see the last messages): its msg/s is lower for that alone.
    line = ["msg/s sent on a / received on b (longer window)"]
    for r in rows:
        line.append(f"{r['sent_msg_s']:,.0f} / {r['received_msg_s']:,.0f}"
                    if "sent_msg_s" in r else "failed")
    if both:
        line.append("")
    lines.append(line)
    return common.plain_table(lines)


def main(argv: list) -> int:
    parser = common.run_parser(__doc__, SCENARIOS)
    parser.add_argument("--duration", type=int, default=15,
                        help="seconds per run, warm-up included (default 15)")
    parser.add_argument("--warmup", type=int, default=5,
                        help="seconds of warm-up left out of the figures (default 5)")
    args = parser.parse_args(argv)
    if args.warmup >= args.duration:
        parser.error("--warmup must be shorter than --duration")
    systems = common.systems_of(args)
    opts = common.start_run(args, args.duration, args.warmup)
    rows = []
    try:
        print(f"\n== geo-replication: {SCENARIOS['geo-replication']} ==", flush=True)
        for system in systems:
            rows.append(run_system(opts, system))
    finally:
        bench.stop_all_children()
    print(f"\ngeo-replication ({PRODUCER.rate:,} msg/s, {PRODUCER.size} B, batched; "
          "vela perf on both systems; 1 bookie per standalone):")
    print(table(rows))
    common.write_results(args.out, "geo-replication-results.json", rows)
    return 1 if any("failed" in r for r in rows) else 0
