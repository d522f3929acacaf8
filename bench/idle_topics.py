#!/usr/bin/env python3
"""The per-topic fixed cost of an idle topic, measured on a real process.

Starts `vela standalone` (release build) on a fresh data directory, then one
client process (the official Python client, asyncio) creates N topics, each
with one producer and one subscription with one consumer, and holds them
idle. Prints the broker's resident memory per topic (/proc VmRSS after the
topics settled, minus VmRSS before the first one) and, with `--heaptrack`,
its heap per topic (the broker runs on glibc malloc,
`VELA_SYSTEM_ALLOCATOR=1`, under heaptrack; heap after the topics settled
minus heap before the first, from heaptrack's massif snapshots, and the
peak's growth over N).

    python3 bench/idle_topics.py                    # 10,000 topics, RSS
    python3 bench/idle_topics.py --heaptrack        # and the heap, glibc malloc
    python3 bench/idle_topics.py --topics 1000 --vela target/debug/vela

Figures only; nothing here is a pass/fail check (the bound checked by
./test.sh is crates/vela/tests/idle_topics.rs).
"""

import argparse
import asyncio
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

import pulsar
import pulsar.asyncio

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
READY_TIMEOUT_S = 120
# Quiet time after the last topic before the "after" figures are taken: the
# cursors' first persist and any deferred work are done by then.
SETTLE_S = 5


def alive_tasks(http):
    """The broker runtime's alive tasks (`vela_runtime_alive_tasks`), or None."""
    try:
        with urllib.request.urlopen(http.rstrip("/") + "/metrics", timeout=60) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("vela_runtime_alive_tasks{"):
                    return float(line.rsplit(" ", 1)[1])
    except OSError:
        pass
    return None


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def children(pid):
    out = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.split("/")[2]))
    return out


def vela_pid(root_pid):
    """The vela process: the spawned one, or (heaptrack) its descendant."""
    frontier = [root_pid]
    while frontier:
        pid = frontier.pop()
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip().startswith("vela"):
                    return pid
        except OSError:
            pass
        frontier.extend(children(pid))
    raise RuntimeError("no vela process found")


def start(vela, data_dir, heaptrack_out):
    cmd = [vela, "standalone", "--data-dir", data_dir, "--port", "0", "--http-port", "0"]
    env = dict(os.environ, VELA_LOG=os.environ.get("VELA_LOG", "warn"))
    if heaptrack_out:
        cmd = ["heaptrack", "-o", heaptrack_out] + cmd
        env["VELA_SYSTEM_ALLOCATOR"] = "1"
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env, text=True
    )
    spawned = time.monotonic()
    deadline = spawned + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError("vela standalone exited before its ready line")
        if "ready" in line and "pulsar://" in line:
            url = next(w for w in line.split() if w.startswith("pulsar://"))
            http = next(w for w in line.split() if w.startswith("http://"))
            return proc, (url, http), spawned
    raise RuntimeError("no ready line")


async def create_measure_close(url, http, args, pid, spawned):
    """Creates the topics, measures once they settled, closes the client
    (before the broker stops: no reconnect attempts). Returns the figures."""
    client = pulsar.asyncio.Client(
        url, operation_timeout_seconds=120,
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn),
    )
    gate = asyncio.Semaphore(args.concurrency)
    held = []

    async def one(i):
        topic = f"persistent://public/default/idle-{i}"
        async with gate:
            producer = await client.create_producer(topic, batching_enabled=False)
            consumer = await client.subscribe(topic, "idle")
            held.append((producer, consumer))

    await asyncio.sleep(2)
    rss_before = rss_kib(pid)
    tasks_before = alive_tasks(http)
    t_before = time.monotonic() - spawned
    began = time.monotonic()
    await asyncio.gather(*(one(i) for i in range(args.topics)))
    created_s = time.monotonic() - began
    await asyncio.sleep(SETTLE_S)
    rss_after = rss_kib(pid)
    tasks_after = alive_tasks(http)
    t_after = time.monotonic() - spawned
    await client.close()
    tasks = (tasks_before, tasks_after)
    return rss_before, rss_after, t_before, t_after, created_s, tasks


def massif_heap(path, at_s):
    """Heap bytes in heaptrack's massif snapshots (`time=` in seconds since
    the program started): the last at or before each of `at_s`."""
    out = subprocess.run(
        ["heaptrack_print", "--print-massif", path + ".massif", "-f", path,
         "--print-peaks", "0", "--print-allocators", "0", "--print-temporary", "0",
         "--print-leaks", "0"],
        capture_output=True, text=True, check=False,
    )
    peak = re.search(r"peak heap memory consumption:\s*([\d.]+)([KMG]?)", out.stdout)
    snapshots = []
    with open(path + ".massif") as f:
        time_s = None
        for line in f:
            if line.startswith("time="):
                time_s = float(line.split("=")[1])
            elif line.startswith("mem_heap_B=") and time_s is not None:
                snapshots.append((time_s, int(line.split("=")[1])))
    values = []
    for t in at_s:
        before = [b for (s, b) in snapshots if s <= t]
        values.append(before[-1] if before else None)
    peak_bytes = None
    if peak:
        scale = {"": 1, "K": 1e3, "M": 1e6, "G": 1e9}[peak.group(2)]
        peak_bytes = float(peak.group(1)) * scale
    return values, peak_bytes


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--topics", type=int, default=10_000)
    parser.add_argument("--vela", default=os.path.join(ROOT, "target/release/vela"))
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--heaptrack", action="store_true")
    parser.add_argument("--data-root", default=None,
                        help="where the data directory goes (e.g. /dev/shm: topic creation "
                             "waits for no fsync; memory figures are the process's either way)")
    args = parser.parse_args()

    data_dir = tempfile.mkdtemp(prefix="vela-idle-topics-", dir=args.data_root)
    heaptrack_out = os.path.join(data_dir, "heaptrack") if args.heaptrack else None
    proc = None
    try:
        proc, (url, http), spawned = start(args.vela, data_dir, heaptrack_out)
        pid = vela_pid(proc.pid)
        rss_before, rss_after, t_before, t_after, created_s, tasks = asyncio.run(
            create_measure_close(url, http, args, pid, spawned)
        )
        per_topic_rss = (rss_after - rss_before) * 1024 / args.topics
        print(f"topics: {args.topics} (one producer, one subscription with one consumer each), "
              f"created in {created_s:.1f} s")
        print(f"broker RSS: {rss_before / 1024:.1f} MiB before, {rss_after / 1024:.1f} MiB after: "
              f"{per_topic_rss / 1024:.2f} KiB per topic")
        if None not in tasks:
            print(f"broker runtime tasks: {tasks[0]:.0f} before, {tasks[1]:.0f} after: "
                  f"{(tasks[1] - tasks[0]) / args.topics:.2f} per topic")
        os.kill(pid, signal.SIGTERM)
        proc.wait(timeout=120)
        if heaptrack_out:
            files = glob.glob(heaptrack_out + "*.zst") + glob.glob(heaptrack_out + "*.gz")
            if not files:
                print("heaptrack wrote no data file")
                return
            (before, after), peak = massif_heap(files[0], [t_before, t_after])
            if before is not None and after is not None:
                print(f"broker heap (glibc malloc): {before / 2**20:.1f} MiB before, "
                      f"{after / 2**20:.1f} MiB after: "
                      f"{(after - before) / args.topics / 1024:.2f} KiB per topic")
            if peak is not None and before is not None:
                print(f"broker heap peak: {peak / 2**20:.1f} MiB: "
                      f"{(peak - before) / args.topics / 1024:.2f} KiB per topic above the start")
            print(f"heaptrack data: {files[0]} (kept; delete when done)")
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        for path in os.listdir(data_dir):
            if not path.startswith("heaptrack"):
                full = os.path.join(data_dir, path)
                shutil.rmtree(full, ignore_errors=True) if os.path.isdir(full) else os.remove(full)
        if not args.heaptrack:
            shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
