#!/usr/bin/env python3
"""Topic loading at scale (issue 19): N topics created (over REST, or by
a producer each), the namespace listed, topics looked up, the broker
stopped (SIGTERM) and started again on the same data, then topics that
load lazily are written and read back.

Prints, one line each: the time to ready, topics created per second, the
namespace listing's time (REST and `vela admin topics list`), lookups per
second, broker RSS, the graceful shutdown's time, the time to ready after
the restart, the listing, lookups and RSS again, and the check: --check K
topics (t-0 .. t-(K-1)), loaded after the restart, each get a message
that a consumer from the earliest position reads back. With --store etcd
also etcd's side: the gRPC requests per created topic by method (from
etcd's /metrics), its database size, keys and RSS.

  bench/many_topics.py VELA N [--create admin|producers] [--concurrency C]
                              [--store file|etcd] [--check K]

--create admin (the default): PUT /admin/v2/persistent/public/default/t-I,
one request at a time or --concurrency in flight over as many
connections. --create producers: `vela perf produce --idle -t N
--connections 16` (as the topics-100k-idle scenario): each topic
auto-created by its producer's lookup and PRODUCER, 256 at a time; the
producers close once all are created.

--store file: `vela standalone` (the embedded metadata store). --store
etcd: an etcd (the `etcd` binary on PATH, as tests/cluster uses), one
`vela bookie` and one `vela broker` on it; the broker is what is stopped
and restarted. The 100,000-topic etcd figure:
  bench/many_topics.py target/release/vela 100000 --store etcd --create producers
Data under /tmp/vela-many-topics, removed at the end. Standard library
only; not run by ./test.sh (a figure, not a test).
"""

import argparse
import http.client
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.request

DATA = "/tmp/vela-many-topics"
READY = re.compile(r"ready in \d+ ms: (pulsar://\S+) http://127\.0\.0\.1:(\d+)")
LOOKUPS = 2000


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(f.read().split("VmRSS:")[1].split()[0]) // 1024


class Process:
    def __init__(self, name, cmd, ready):
        self.name, self.cmd, self.ready = name, cmd, ready
        self.log = open(f"{DATA}/{name}.log", "ab")
        self.proc = None

    def start(self, timeout=120):
        started = time.monotonic()
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=self.log, text=True)
        match = None
        while match is None:
            line = self.proc.stdout.readline()
            if not line:
                raise SystemExit(f"{self.name} exited: see {DATA}/{self.name}.log")
            match = self.ready(line)
            if time.monotonic() - started > timeout:
                raise SystemExit(f"{self.name} not ready in {timeout} s")
        threading.Thread(target=lambda: [None for _ in self.proc.stdout], daemon=True).start()
        return time.monotonic() - started, match

    def stop(self):
        started = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=600)
        return time.monotonic() - started


def etcd_start():
    client, peer = free_port(), free_port()
    cmd = [shutil.which("etcd") or "etcd", "--name", "default", "--data-dir", f"{DATA}/etcd",
           "--listen-client-urls", f"http://127.0.0.1:{client}",
           "--advertise-client-urls", f"http://127.0.0.1:{client}",
           "--listen-peer-urls", f"http://127.0.0.1:{peer}",
           "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
           "--initial-cluster", f"default=http://127.0.0.1:{peer}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                            stderr=open(f"{DATA}/etcd.log", "ab"))
    for _ in range(300):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{client}/health", timeout=1) as r:
                if b"true" in r.read():
                    return proc, client
        except OSError:
            pass
        time.sleep(0.1)
    raise SystemExit("etcd did not start")


def etcd_metrics(client_port):
    """etcd's gRPC requests handled so far by method, its database size
    (bytes) and key count, from its /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{client_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    calls, db_bytes, keys = {}, None, None
    for line in text.splitlines():
        if line.startswith("grpc_server_handled_total{"):
            method = re.search(r'grpc_method="(\w+)"', line).group(1)
            calls[method] = calls.get(method, 0) + float(line.split()[-1])
        elif line.startswith("etcd_mvcc_db_total_size_in_bytes "):
            db_bytes = float(line.split()[-1])
        elif line.startswith("etcd_debugging_mvcc_keys_total "):
            keys = float(line.split()[-1])
    return calls, db_bytes, keys


def per_topic(before, after, n):
    """gRPC requests per topic between two `etcd_metrics` calls, by method."""
    return {m: round((after[0].get(m, 0) - before[0].get(m, 0)) / n, 2)
            for m in sorted(after[0]) if after[0].get(m, 0) - before[0].get(m, 0) >= n / 100}


def request(conn, method, path):
    conn.request(method, path)
    response = conn.getresponse()
    return response.status, response.read()


def create(http_port, n, concurrency):
    """Creates t-0 .. t-(n-1); returns (seconds, failures)."""
    next_index = iter(range(n))
    lock = threading.Lock()
    failures = []

    def worker():
        conn = http.client.HTTPConnection("127.0.0.1", http_port, timeout=120)
        while True:
            with lock:
                i = next(next_index, None)
            if i is None:
                return
            status, body = request(conn, "PUT", f"/admin/v2/persistent/public/default/t-{i}")
            if status not in (200, 204):
                with lock:
                    failures.append((i, status, body[:200]))

    started = time.monotonic()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.monotonic() - started, failures


def create_with_producers(vela, service_url, admin_url, n):
    """One idle producer per topic, each topic auto-created (vela perf
    produce --idle); returns (seconds, failures) as `vela perf` reports."""
    log = f"{DATA}/create.log"
    with open(log, "w") as out:
        proc = subprocess.run([vela, "perf", "produce", "persistent://public/default/t",
                               "-u", service_url, "--admin-url", admin_url, "-t", str(n),
                               "--idle", "--test-duration", "1", "--connections", "16"],
                              stdout=out, stderr=subprocess.STDOUT)
    text = open(log, errors="replace").read()
    match = re.search(r"created (\d+) producer\(s\) in ([\d.]+) s", text)
    if proc.returncode != 0 or match is None:
        raise SystemExit(f"vela perf produce --idle failed: see {log}\n{text[-2000:]}")
    return float(match.group(2)), n - int(match.group(1))


def cli_listing(vela, admin_url):
    """`vela admin topics list public/default`: (seconds, topics printed)."""
    started = time.monotonic()
    out = subprocess.run([vela, "admin", "--admin-url", admin_url, "topics", "list",
                          "public/default"], capture_output=True, text=True)
    seconds = time.monotonic() - started
    if out.returncode != 0:
        return seconds, f"failed: {out.stderr.strip()[:200]}"
    return seconds, out.stdout.count("persistent://")


def perf_summary(cmd, log):
    with open(log, "w") as out:
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT)
    for line in reversed(open(log, errors="replace").read().splitlines()):
        if line.startswith("{") and '"messages"' in line:
            return proc.returncode, json.loads(line)
    return proc.returncode, None


def check_lazy(vela, service_url, admin_url, k):
    """Topics t-0 .. t-(k-1), not loaded since the restart: one message
    each, then a consumer from the earliest position on each reads them.
    Returns (seconds to send, sent, failures, received)."""
    topic = "persistent://public/default/t"
    started = time.monotonic()
    rc, sent = perf_summary([vela, "perf", "produce", topic, "-u", service_url,
                             "--admin-url", admin_url, "-t", str(k), "-m", str(k), "-r", "0",
                             "--connections", "4", "--json"], f"{DATA}/check-produce.log")
    seconds = time.monotonic() - started
    if rc != 0 or sent is None:
        return seconds, 0, f"produce failed: see {DATA}/check-produce.log", 0
    rc, got = perf_summary([vela, "perf", "consume", topic, "-u", service_url, "-t", str(k),
                            "-m", str(sent["messages"]), "--subscription-position", "earliest",
                            "--test-duration", "20", "--json"], f"{DATA}/check-consume.log")
    return seconds, sent["messages"], sent["failures"], got["messages"] if got else 0


def listing(http_port):
    started = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", http_port, timeout=600)
    status, body = request(conn, "GET", "/admin/v2/persistent/public/default")
    count = len(json.loads(body)) if status == 200 else f"status {status}"
    return time.monotonic() - started, count


def lookups(http_port, n):
    conn = http.client.HTTPConnection("127.0.0.1", http_port, timeout=120)
    picks = [random.randrange(n) for _ in range(min(LOOKUPS, n))]
    started = time.monotonic()
    bad = 0
    for i in picks:
        status, _ = request(conn, "GET", f"/lookup/v2/topic/persistent/public/default/t-{i}")
        bad += status != 200
    return len(picks) / (time.monotonic() - started), bad


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("vela")
    parser.add_argument("topics", type=int)
    parser.add_argument("--create", choices=("admin", "producers"), default="admin")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--store", choices=("file", "etcd"), default="file")
    parser.add_argument("--session-ttl-ms", type=int,
                        help="the broker's etcd session TTL (its default when not given)")
    parser.add_argument("--check", type=int, default=1000,
                        help="topics written and read back after the restart (0: none)")
    args = parser.parse_args()
    shutil.rmtree(DATA, ignore_errors=True)
    os.makedirs(DATA)
    ready = READY.search
    etcd = None
    others = []
    if args.store == "file":
        broker = Process("standalone", [args.vela, "standalone", "--data-dir", f"{DATA}/vela",
                                        "--port", "0", "--http-port", "0"], ready)
    else:
        etcd, etcd_port = etcd_start()
        url = f"etcd://127.0.0.1:{etcd_port}"
        bookie = Process("bookie", [args.vela, "bookie", "--journal-dir", f"{DATA}/journal",
                                    "--ledger-dir", f"{DATA}/ledgers", "--port", "0",
                                    "--metadata", url, "--bookie-id", "bookie-0"],
                         lambda line: "vela bookie listening on" in line)
        bookie.start()
        others.append(bookie)
        broker = Process("broker", [args.vela, "broker", "--metadata", url, "--port", "0",
                                    "--http-port", "0", "--ensemble-size", "1",
                                    "--write-quorum", "1", "--ack-quorum", "1"]
                         + (["--session-ttl-ms", str(args.session_ttl_ms)]
                            if args.session_ttl_ms else []), ready)

    def etcd_state(label):
        if etcd:
            _, db_bytes, keys = etcd_metrics(etcd_port)
            print(f"etcd {label}: db {db_bytes / 2**20:.0f} MiB, keys {keys:.0f}, "
                  f"rss {rss_mib(etcd.pid)} MiB", flush=True)

    try:
        ready_s, match = broker.start()
        service_url, port = match.group(1), int(match.group(2))
        admin_url = f"http://127.0.0.1:{port}"
        print(f"store {args.store}, {args.topics} topics, create {args.create}, "
              f"concurrency {args.concurrency}", flush=True)
        print(f"ready {ready_s:.3f} s", flush=True)
        before = etcd_metrics(etcd_port) if etcd else None
        if args.create == "admin":
            seconds, failures = create(port, args.topics, args.concurrency)
        else:
            seconds, failures = create_with_producers(args.vela, service_url, admin_url,
                                                      args.topics)
        print(f"created {args.topics} in {seconds:.1f} s ({args.topics / seconds:.0f}/s), "
              f"failures {len(failures) if isinstance(failures, list) else failures} "
              f"{failures[:3] if isinstance(failures, list) else ''}", flush=True)
        if etcd:
            print("etcd gRPC requests per topic:",
                  per_topic(before, etcd_metrics(etcd_port), args.topics), flush=True)
            etcd_state("after creation")
        print("list s, count", listing(port), flush=True)
        print("cli list s, count", cli_listing(args.vela, admin_url), flush=True)
        rate, bad = lookups(port, args.topics)
        print(f"lookups {rate:.0f}/s, failed {bad}", flush=True)
        print(f"rss MiB {rss_mib(broker.proc.pid)} (all loaded)", flush=True)
        print(f"shutdown {broker.stop():.2f} s", flush=True)
        ready_s, match = broker.start()
        service_url, port = match.group(1), int(match.group(2))
        admin_url = f"http://127.0.0.1:{port}"
        print(f"restart ready {ready_s:.3f} s", flush=True)
        print(f"rss MiB {rss_mib(broker.proc.pid)} (restarted, nothing loaded)", flush=True)
        print("list after restart s, count", listing(port), flush=True)
        print("cli list after restart s, count", cli_listing(args.vela, admin_url), flush=True)
        rate, bad = lookups(port, args.topics)
        print(f"lookups after restart {rate:.0f}/s, failed {bad}", flush=True)
        if args.check:
            k = min(args.check, args.topics)
            before = etcd_metrics(etcd_port) if etcd else None
            seconds, sent, failures, received = check_lazy(args.vela, service_url, admin_url, k)
            print(f"lazy check: {k} topics loaded and written in {seconds:.1f} s "
                  f"({k / seconds:.0f}/s), sent {sent}, failed {failures}, "
                  f"read back {received}", flush=True)
            if etcd:
                print("etcd gRPC requests per reloaded topic (produce + consume):",
                      per_topic(before, etcd_metrics(etcd_port), k), flush=True)
        print(f"rss MiB {rss_mib(broker.proc.pid)} (after restart)", flush=True)
        etcd_state("at the end")
        print(f"shutdown {broker.stop():.2f} s", flush=True)
    finally:
        for p in [broker] + others:
            if p.proc and p.proc.poll() is None:
                p.proc.kill()
                p.proc.wait()
        if etcd:
            etcd.terminate()
            etcd.wait()
        subprocess.run(["du", "-sh", DATA])
        shutil.rmtree(DATA, ignore_errors=True)


if __name__ == "__main__":
    main()
