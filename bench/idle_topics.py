#!/usr/bin/env python3
"""The per-topic fixed cost of an idle topic, measured on a real process.

Starts `vela standalone` (release build) on a fresh data directory, then one
client process (the official Python client, asyncio) creates N topics, each
with what `--attach` says (one producer and one subscription with one
consumer; or the producer only; or the subscription and its consumer only),
and holds them idle. Prints the broker's resident memory per topic (/proc
VmRSS after the topics settled, minus VmRSS before the first one) and, with
`--heaptrack`, its heap per topic (the broker runs on glibc malloc,
`VELA_SYSTEM_ALLOCATOR=1`, under heaptrack; heap after the topics settled
minus heap before the first, from heaptrack's massif snapshots, and the
peak's growth over N). `--breakdown` (with `--heaptrack`) kills the broker
with SIGKILL once the figures are taken, so that what heaptrack sees as never
freed is what was live at that moment, and prints the allocation sites
holding the most of it (by the innermost frame in Vela's own crates), in
bytes per topic.

`--system pulsar` measures Apache Pulsar 4.0.8 standalone the same way (the
bench's `PulsarServer`: its JVM flags, 1 bookie): RSS per topic, and the
live Java heap per topic (`jcmd GC.class_histogram`, which collects first:
live objects after the topics settled minus before).

    python3 bench/idle_topics.py                    # 10,000 topics, RSS
    python3 bench/idle_topics.py --attach producer  # producers only
    python3 bench/idle_topics.py --heaptrack --breakdown  # heap, glibc malloc
    python3 bench/idle_topics.py --system pulsar --topics 10000
    python3 bench/idle_topics.py --topics 1000 --vela target/debug/vela

Figures only; nothing here is a pass/fail check (the bound checked by
./test.sh is crates/vela/tests/idle_topics.rs).
"""

import argparse
import asyncio
import collections
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
from pathlib import Path

import pulsar
import pulsar.asyncio

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
READY_TIMEOUT_S = 120
# Quiet time after the last topic before the "after" figures are taken: the
# cursors' first persist and any deferred work are done by then.
SETTLE_S = 5
# What each topic gets (--attach).
ATTACH = {
    "both": (True, True),
    "producer": (True, False),
    "consumer": (False, True),
}
# Clients left open after a `--breakdown` kill (see `create_measure_close`).
ABANDONED = []
# Allocation sites printed by --breakdown.
BREAKDOWN_SITES = 30


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
    return rss_parts_kib(pid)["VmRSS"]


def rss_parts_kib(pid):
    """VmRSS and its parts (RssAnon: heap and stacks; RssFile: mapped
    files; RssShmem: mapped shared memory, e.g. files on /dev/shm), KiB."""
    parts = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key = line.split(":")[0]
            if key in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
                parts[key] = int(line.split()[1])
    if "VmRSS" not in parts:
        raise RuntimeError("no VmRSS")
    return parts


def java_live_heap_bytes(pid):
    """Bytes of live objects in a JVM (`jcmd GC.class_histogram` collects
    first, also under -XX:+DisableExplicitGC), or None."""
    out = subprocess.run(["jcmd", str(pid), "GC.class_histogram"],
                         capture_output=True, text=True, check=False, timeout=600)
    for line in reversed(out.stdout.splitlines()):
        fields = line.split()
        if fields and fields[0] == "Total" and len(fields) >= 3:
            return int(fields[2])
    return None


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


def vela_pid(root_pid, binary):
    """The vela process (`binary`): the spawned one, or (heaptrack) its
    descendant."""
    comm = os.path.basename(binary)[:15]  # /proc/PID/comm keeps 15 bytes
    frontier = [root_pid]
    while frontier:
        pid = frontier.pop()
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() == comm:
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


async def create_measure_close(url, args, measure, before_close=None):
    """Creates the topics, takes `measure()` before the first and once they
    settled, calls `before_close()` (`--breakdown`: the SIGKILL, so that
    what is live at the kill is the idle topics' state, not what closing
    their producers and consumers wakes), closes the client (otherwise
    before the broker stops: no reconnect attempts). Returns the two
    samples and the creation time. After a `before_close` the client is
    not closed (its close would wait for the dead broker): it is kept in
    `ABANDONED` and the process ends with `os._exit`."""
    client = pulsar.asyncio.Client(
        url, operation_timeout_seconds=120,
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn),
    )
    gate = asyncio.Semaphore(args.concurrency)
    held = []
    with_producer, with_consumer = ATTACH[args.attach]

    async def one(i):
        topic = f"persistent://public/default/idle-{i}"
        async with gate:
            producer = consumer = None
            if with_producer:
                producer = await client.create_producer(topic, batching_enabled=False)
            if with_consumer:
                consumer = await client.subscribe(topic, "idle")
            held.append((producer, consumer))

    await asyncio.sleep(2)
    before = measure()
    began = time.monotonic()
    await asyncio.gather(*(one(i) for i in range(args.topics)))
    created_s = time.monotonic() - began
    await asyncio.sleep(SETTLE_S)
    after = measure()
    if before_close is not None:
        before_close()
        ABANDONED.append(client)
        return before, after, created_s
    await client.close()
    return before, after, created_s


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
    os.remove(path + ".massif")
    return values, peak_bytes


def own_frame(frame):
    """A frame of Vela's own crates, shortened (no hash, no closure
    suffixes), or None."""
    if "vela_" not in frame:
        return None
    frame = re.sub(r"::h[0-9a-f]{16}$", "", frame)
    frame = re.sub(r"::\{\{closure\}\}", "", frame)
    return frame


def breakdown(path, topics):
    """What was never freed (live at the SIGKILL), by the innermost frame of
    Vela's own crates on each allocation's stack, largest first."""
    stacks = path + ".stacks"
    subprocess.run(
        ["heaptrack_print", "-f", path, "--print-flamegraph", stacks,
         "--flamegraph-cost-type", "leaked", "--print-peaks", "0",
         "--print-allocators", "0", "--print-temporary", "0", "--print-leaks", "0"],
        capture_output=True, text=True, check=False,
    )
    sites = collections.Counter()
    total = 0
    with open(stacks) as f:
        for line in f:
            stack, _, cost = line.rstrip("\n").rpartition(" ")
            if not cost.isdigit():
                continue
            bytes_ = int(cost)
            total += bytes_
            frames = stack.split(";")
            site = next((own for own in map(own_frame, reversed(frames)) if own), None)
            sites[site or "(no Vela frame)"] += bytes_
    os.remove(stacks)
    print(f"live at the kill: {total / 2**20:.1f} MiB ({total / topics / 1024:.2f} KiB per topic, "
          f"the broker's start included); by the allocating frame of Vela's crates:")
    for site, bytes_ in sites.most_common(BREAKDOWN_SITES):
        print(f"  {bytes_ / topics:9.0f} B/topic  {site}")


def run_vela(args):
    data_dir = tempfile.mkdtemp(prefix="vela-idle-topics-", dir=args.data_root)
    heaptrack_out = os.path.join(data_dir, "heaptrack") if args.heaptrack else None
    proc = None
    try:
        proc, (url, http), spawned = start(args.vela, data_dir, heaptrack_out)
        pid = vela_pid(proc.pid, args.vela)

        def measure():
            return rss_parts_kib(pid), alive_tasks(http), time.monotonic() - spawned

        def kill():
            os.kill(pid, signal.SIGKILL)

        before, after, created_s = asyncio.run(
            create_measure_close(url, args, measure, kill if args.breakdown else None)
        )
        (parts_before, tasks_before, t_before), (parts_after, tasks_after, t_after) = before, after
        rss_before, rss_after = parts_before["VmRSS"], parts_after["VmRSS"]
        per_topic_rss = (rss_after - rss_before) * 1024 / args.topics
        print(f"vela: {args.topics} topics ({args.attach}: {describe(args.attach)}), "
              f"created in {created_s:.1f} s")
        print(f"broker RSS: {rss_before / 1024:.1f} MiB before, {rss_after / 1024:.1f} MiB after: "
              f"{per_topic_rss / 1024:.2f} KiB per topic")
        print("  of which: " + ", ".join(
            f"{key} {(parts_after.get(key, 0) - parts_before.get(key, 0)) / args.topics:.2f}"
            for key in ("RssAnon", "RssFile", "RssShmem")) + " KiB per topic")
        if None not in (tasks_before, tasks_after):
            print(f"broker runtime tasks: {tasks_before:.0f} before, {tasks_after:.0f} after: "
                  f"{(tasks_after - tasks_before) / args.topics:.2f} per topic")
        if not args.breakdown:
            os.kill(pid, signal.SIGTERM)
        proc.wait(timeout=300)
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
            if args.breakdown:
                breakdown(files[0], args.topics)
            if args.keep_heaptrack:
                print(f"heaptrack data: {files[0]} (kept; delete when done)")
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        if args.keep_heaptrack:
            for path in os.listdir(data_dir):
                if not path.startswith("heaptrack"):
                    full = os.path.join(data_dir, path)
                    shutil.rmtree(full, ignore_errors=True) if os.path.isdir(full) else os.remove(full)
        else:
            shutil.rmtree(data_dir, ignore_errors=True)


def run_pulsar(args):
    """Apache Pulsar standalone as bench.py starts it (1 bookie)."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import bench  # noqa: E402  (bench/bench.py: the servers)

    data_root = Path(tempfile.mkdtemp(prefix="pulsar-idle-topics-", dir=args.data_root))
    opts = bench.Options(0, 0, 0, data_root, Path(args.vela).resolve(), False, False, data_root)
    server = bench.PulsarServer(1, data_root / "pulsar", opts)
    try:
        server.start()

        def measure():
            return rss_kib(server.pid), java_live_heap_bytes(server.pid)

        before, after, created_s = asyncio.run(
            create_measure_close(server.service_url, args, measure))
        (rss_before, heap_before), (rss_after, heap_after) = before, after
        print(f"pulsar: {args.topics} topics ({args.attach}: {describe(args.attach)}), "
              f"created in {created_s:.1f} s")
        print(f"broker RSS: {rss_before / 1024:.1f} MiB before, {rss_after / 1024:.1f} MiB after: "
              f"{(rss_after - rss_before) / args.topics:.2f} KiB per topic "
              f"(a JVM: its heap is reserved at start, {bench.PULSAR_MEM_DEFAULT})")
        if None not in (heap_before, heap_after):
            print(f"live Java heap: {heap_before / 2**20:.1f} MiB before, "
                  f"{heap_after / 2**20:.1f} MiB after: "
                  f"{(heap_after - heap_before) / args.topics / 1024:.2f} KiB per topic")
    finally:
        server.stop()
        shutil.rmtree(data_root, ignore_errors=True)


def describe(attach):
    return {
        "both": "one producer and one subscription with one consumer each",
        "producer": "one producer each, no subscription",
        "consumer": "one subscription with one consumer each, no producer",
    }[attach]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--topics", type=int, default=10_000)
    parser.add_argument("--attach", choices=list(ATTACH), default="both",
                        help="what each topic gets (default: a producer and a consumer)")
    parser.add_argument("--system", choices=("vela", "pulsar"), default="vela")
    parser.add_argument("--vela", default=os.path.join(ROOT, "target/release/vela"))
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--heaptrack", action="store_true")
    parser.add_argument("--breakdown", action="store_true",
                        help="with --heaptrack: the live heap by allocation site (SIGKILLs the "
                             "broker once measured)")
    parser.add_argument("--keep-heaptrack", action="store_true",
                        help="keep heaptrack's data file (large)")
    parser.add_argument("--data-root", default=None,
                        help="where the data directory goes (e.g. /dev/shm: topic creation "
                             "waits for no fsync; memory figures are the process's either way)")
    args = parser.parse_args()
    if args.breakdown and not args.heaptrack:
        parser.error("--breakdown needs --heaptrack")
    if args.system == "pulsar":
        if args.heaptrack:
            parser.error("--heaptrack is for vela")
        run_pulsar(args)
    else:
        run_vela(args)
    if ABANDONED:
        sys.stdout.flush()
        os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
