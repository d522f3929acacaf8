#!/usr/bin/env python3
"""Topic loading at scale (issue 19): N topics created over REST, the
namespace listed, topics looked up, the broker stopped (SIGTERM) and
started again on the same data.

Prints, one line each: the time to ready, topics created per second (one
request at a time, or --concurrency requests in flight over as many
connections), the namespace listing's time, lookups per second, broker RSS,
the graceful shutdown's time, the time to ready after the restart, the
listing and RSS again.

  bench/many_topics.py VELA N [--concurrency C] [--store file|etcd]

--store file: `vela standalone` (the embedded metadata store). --store
etcd: an etcd (the `etcd` binary on PATH, as tests/cluster uses), one
`vela bookie` and one `vela broker` on it; the broker is what is stopped
and restarted. Data under /tmp/vela-many-topics, removed at the end.
Standard library only; not run by ./test.sh (a figure, not a test).
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
                    return proc, f"etcd://127.0.0.1:{client}"
        except OSError:
            pass
        time.sleep(0.1)
    raise SystemExit("etcd did not start")


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
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--store", choices=("file", "etcd"), default="file")
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
        etcd, url = etcd_start()
        bookie = Process("bookie", [args.vela, "bookie", "--journal-dir", f"{DATA}/journal",
                                    "--ledger-dir", f"{DATA}/ledgers", "--port", "0",
                                    "--metadata", url, "--bookie-id", "bookie-0"],
                         lambda line: "vela bookie listening on" in line)
        bookie.start()
        others.append(bookie)
        broker = Process("broker", [args.vela, "broker", "--metadata", url, "--port", "0",
                                    "--http-port", "0", "--ensemble-size", "1",
                                    "--write-quorum", "1", "--ack-quorum", "1"], ready)
    try:
        ready_s, match = broker.start()
        port = int(match.group(2))
        print(f"store {args.store}, {args.topics} topics, concurrency {args.concurrency}")
        print(f"ready {ready_s:.3f} s")
        seconds, failures = create(port, args.topics, args.concurrency)
        print(f"created {args.topics} in {seconds:.1f} s ({args.topics / seconds:.0f}/s), "
              f"failures {len(failures)} {failures[:3]}")
        print("list s, count", listing(port))
        rate, bad = lookups(port, args.topics)
        print(f"lookups {rate:.0f}/s, failed {bad}")
        print(f"rss MiB {rss_mib(broker.proc.pid)} (all loaded)")
        print(f"shutdown {broker.stop():.2f} s")
        ready_s, match = broker.start()
        port = int(match.group(2))
        print(f"restart ready {ready_s:.3f} s")
        print("list after restart s, count", listing(port))
        rate, bad = lookups(port, args.topics)
        print(f"lookups after restart {rate:.0f}/s, failed {bad}")
        print(f"rss MiB {rss_mib(broker.proc.pid)} (after restart)")
        print(f"shutdown {broker.stop():.2f} s")
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
