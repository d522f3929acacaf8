#!/usr/bin/env python3
"""Vela's seed benchmarks, and the same scenarios on Apache Pulsar.

Each scenario runs against a fresh standalone (fresh data directory, free
ports on 127.0.0.1), once with 1 bookie and once with 3 bookies at
E=2 Qw=2 Qa=2, and prints a table. Beside the figures: the raw
pwrite+fdatasync latency of the same data directory (`vela perf disk`),
measured at the start of the scenario. Run several scenarios (or `all`) to
get the combined table with ratios, startup time to the first acknowledged
message, and resident memory idle and under load.

With --with-pmem, every scenario also runs on Vela with its journal on the
persistent-memory backend, the region on tmpfs in emulation (memcpy + msync
per group: NOT persistent-memory durability), beside Vela's usual file
journal (O_DIRECT on the data directory's disk), in the same run.

Standard library only. `bench/run.sh` builds Vela (and installs Pulsar)
first; see bench/README.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
import plot  # noqa: E402  (bench/plot.py)

PULSAR_HOME = HERE / "pulsar"
PULSAR_LIB = PULSAR_HOME / "dist" / "lib"

# "As fast as possible" for pulsar-perf, whose rate limiter needs a rate.
PULSAR_PERF_UNLIMITED_RATE = 10_000_000
# Outstanding messages per producer in the batched scenarios (pulsar-perf's
# default of 0 means unbounded: latency then measures only the queue).
ASYNC_OUTSTANDING = 1000
# Pulsar's JVM flags as `bin/pulsar` uses them (heap as in pulsar_env.sh);
# PULSAR_MEM / PULSAR_GC override them as with `bin/pulsar`.
PULSAR_MEM_DEFAULT = "-Xms2g -Xmx2g -XX:MaxDirectMemorySize=4g"
PULSAR_GC_DEFAULT = (
    "-XX:+UseG1GC -XX:MaxGCPauseMillis=10 -XX:+ParallelRefProcEnabled "
    "-XX:+UnlockExperimentalVMOptions -XX:+DoEscapeAnalysis "
    "-XX:G1NewSizePercent=50 -XX:+DisableExplicitGC"
)
JVM_MODULE_FLAGS = [
    "--add-opens", "java.base/java.nio=ALL-UNNAMED",
    "--add-opens", "java.base/sun.nio.ch=ALL-UNNAMED",
    "--add-opens", "java.base/jdk.internal.misc=ALL-UNNAMED",
    "--add-opens", "java.base/java.lang=ALL-UNNAMED",
    "--add-opens", "java.base/java.util=ALL-UNNAMED",
    "--add-opens", "java.base/sun.net=ALL-UNNAMED",
    "--add-exports", "java.base/jdk.internal.platform=ALL-UNNAMED",
    "--add-opens", "java.management/sun.management=ALL-UNNAMED",
    "--add-opens", "jdk.management/com.sun.management.internal=ALL-UNNAMED",
]
PULSAR_PERF_MEM = "-Xms512m -Xmx1g"
# Free space a run needs in the data directory: a batched run writes several
# GB (journal and ledger storage, two copies with 3 bookies); a run stops
# when the disk gets down to MIN_FREE_DURING_GIB.
MIN_FREE_GIB = 10
MIN_FREE_DURING_GIB = 3
# Vela's bookies turn read-only past this share of the disk in use
# (`--disk-usage-max-percent`, default 95), counted against the blocks an
# unprivileged writer may use: on a filesystem with a large root reserve,
# "free" space runs out for them well before `df` shows the disk full.
BOOKIE_DISK_USAGE_MAX = 0.95
# The pmem journal's region per bookie (--journal-pmem-size-mb): the default,
# checkpointed from half full on; on tmpfs it takes as much memory.
PMEM_REGION_MIB = 1024
# Where the vela-pmem system's regions go: tmpfs (emulation), one directory
# per standalone, removed with it.
PMEM_ROOT_DEFAULT = Path("/dev/shm/vela-bench-pmem")
SYSTEMS = ("vela", "vela-pmem", "pulsar")


def room_gib(path: Path) -> float:
    """Space left to write in before the bookies on `path` turn read-only
    (or the disk fills, for Pulsar): what an unprivileged writer may use,
    minus the share Vela's bookies keep free."""
    st = os.statvfs(path)
    kept_free = (1.0 - BOOKIE_DISK_USAGE_MAX) * st.f_blocks
    return max(0.0, st.f_bavail - kept_free) * st.f_frsize / 2**30


# ---------------------------------------------------------------- scenarios

@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    kind: str  # "sync", "async", "e2e", "fanout" (non-persistent) or "idle"
    size: int
    compression: str = "none"
    rate: int = 0  # 0: as fast as possible (with topics > 1: over all topics)
    topics: int = 1  # `vela perf produce -t`: one producer per topic
    # fanout and e2e: subscriptions of the topic, one consumer each (e2e:
    # 0 means one).
    subscriptions: int = 0
    # The topic is created partitioned, this many partitions (vela perf
    # --partitions, through the admin API of the system under test).
    partitions: int = 0
    # Distinct message keys cycled over the messages (vela perf --keys).
    keys: int = 0
    # Clients that drive Pulsar in this scenario (Vela is always driven by
    # `vela perf`); see reference_client for the one the ratios use.
    pulsar_clients: tuple = ("pulsar-perf", "vela-perf")

    @property
    def batching(self) -> bool:
        return self.kind != "sync"

    @property
    def outstanding(self) -> int:
        return 1 if self.kind == "sync" else ASYNC_OUTSTANDING

    @property
    def reference_client(self) -> str:
        """The Pulsar row the ratios use. Batched throughput: pulsar-perf,
        the official tool. Sync and end-to-end latency: `vela perf` on both
        systems, because pulsar-perf measures them differently: with -o 1 it
        takes the send time before sendAsync blocks on the previous message's
        pending slot, so each latency includes the tail of the previous round
        trip; its consumer measures end-to-end latency in whole ms."""
        if self.kind == "async" and "pulsar-perf" in self.pulsar_clients:
            return "pulsar-perf"
        return "vela-perf"

    @property
    def topic_domain(self) -> str:
        return "non-persistent" if self.kind == "fanout" else "persistent"


SCENARIOS = {
    s.name: s
    for s in [
        Scenario("sync-1k", "sync 1 KiB", "sync", 1024),
        Scenario("sync-128", "sync 128 B", "sync", 128),
        Scenario("sync-16k", "sync 16 KiB", "sync", 16 * 1024),
        # At most 200 msg/s (100 MB/s): back to back it writes ~400 MB/s, 6 GB
        # of journal (and as much ledger storage) per 15 s run.
        Scenario("sync-512k", "sync 512 KiB (200 msg/s at most)", "sync", 512 * 1024, rate=200),
        Scenario("async-1k", "async batched 1 KiB", "async", 1024),
        Scenario("async-128-lz4", "async batched 128 B LZ4", "async", 128,
                 compression="lz4"),
        Scenario("e2e-10k", "end-to-end at 10k msg/s", "e2e", 1024, rate=10_000),
        # Catch-up issue 27: ten subscriptions at the tail of one persistent
        # topic, 50k msg/s batched 1 KiB, end-to-end latency over all ten.
        Scenario("fan-out-10", "10 subscriptions at the tail, 50k msg/s, end to end", "e2e",
                 1024, rate=50_000, subscriptions=10, pulsar_clients=("vela-perf",)),
        # Many topics (issue 19): one fixed aggregate rate spread over 1,
        # 1,000 and 10,000 topics, batched 1 KiB, `vela perf` driving both
        # systems (the same client, created 256 producers at a time).
        Scenario("topics-1", "1 topic, 20k msg/s batched 1 KiB", "async", 1024,
                 rate=20_000, pulsar_clients=("vela-perf",)),
        Scenario("topics-1k", "1,000 topics, 20k msg/s in all, batched 1 KiB", "async", 1024,
                 rate=20_000, topics=1_000, pulsar_clients=("vela-perf",)),
        # 2,000 topics at 40k msg/s: the point of the first trial
        # (Pulsar p99 744 ms there; Vela's tail cache then had no budget).
        Scenario("topics-2k", "2,000 topics, 40k msg/s in all, batched 1 KiB", "async", 1024,
                 rate=40_000, topics=2_000, pulsar_clients=("vela-perf",)),
        Scenario("topics-10k", "10,000 topics, 20k msg/s in all, batched 1 KiB", "async",
                 1024, rate=20_000, topics=10_000, pulsar_clients=("vela-perf",)),
        # Topic loading at scale: 100,000 topics, each auto-created by its
        # producer's lookup (`vela perf produce --idle`, 256 created at a
        # time), then held idle for the run; msg/s is topics created per
        # second, peak RSS the broker's (see run_idle_topics).
        Scenario("topics-100k-idle", "100,000 topics with a producer each, idle", "idle", 1024,
                 topics=100_000, pulsar_clients=("vela-perf",)),
        # Key-based routing over many partitions: one topic of 100 partitions,
        # 10,000 keys, batched 1 KiB at a fixed 20k msg/s.
        Scenario("partitions-100", "1 topic of 100 partitions, keyed 1 KiB at 20k msg/s", "async",
                 1024, rate=20_000, partitions=100, keys=10_000, pulsar_clients=("vela-perf",)),
        # Non-persistent fan-out: a batched producer as fast as it goes, one
        # consumer per subscription; msg/s is what the subscriptions received
        # in all (a message nobody can take is dropped, as in Pulsar), latency
        # end to end. Storage plays no part: one setup, driven by vela perf on
        # both systems.
        Scenario("np-fanout-1", "non-persistent 1 KiB fan-out to 1 subscription", "fanout",
                 1024, subscriptions=1, pulsar_clients=("vela-perf",)),
        Scenario("np-fanout-10", "non-persistent 1 KiB fan-out to 10 subscriptions", "fanout",
                 1024, subscriptions=10, pulsar_clients=("vela-perf",)),
    ]
}

BOOKIE_SETUPS = {1: "1 bookie", 3: "3 bookies E2/Qw2/Qa2"}


@dataclass
class Options:
    duration: int
    warmup: int
    disk_seconds: int
    data_root: Path
    vela: Path
    keep_data: bool
    verbose: bool
    log_dir: Path
    pmem_root: Path = PMEM_ROOT_DEFAULT
    # Fan-out scenarios: runs per system, taken in turns (median reported).
    repeat: int = 3


# ------------------------------------------------------------ process care

CHILDREN: set = set()


def spawn(cmd, log_path: Path, **kwargs) -> subprocess.Popen:
    """Starts `cmd` in its own process group with stdout+stderr in log_path."""
    log = open(log_path, "ab")
    proc = subprocess.Popen(
        [str(c) for c in cmd], stdout=log, stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL, start_new_session=True, **kwargs)
    log.close()
    CHILDREN.add(proc)
    return proc


def stop(proc: subprocess.Popen, grace: float = 20.0) -> None:
    """SIGTERM to the process group we started, SIGKILL after `grace` s."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    CHILDREN.discard(proc)


def stop_all_children(*_args) -> None:
    for proc in list(CHILDREN):
        stop(proc, grace=5.0)


def on_signal(signum, _frame):
    stop_all_children()
    sys.exit(128 + signum)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, proc: subprocess.Popen, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.settimeout(0.2)
            try:
                s.connect(("127.0.0.1", port))
                return True
            except OSError:
                time.sleep(0.002)
    return False


def rss_mib(pid: int) -> float | None:
    """VmRSS of `pid` in MiB, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time `pid` used so far, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    # After the command: state is field 3, utime 14 and stime 15 (1-based).
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Fail(Exception):
    """A step of the benchmark failed; the message says which and why."""


def tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join("    " + line[:300] for line in text[-lines:])


# ----------------------------------------------------------------- servers

class Server:
    """A running standalone: its URLs, pid and the startup figures."""

    system = ""

    def __init__(self, bookies: int, data_dir: Path, opts: Options):
        self.bookies = bookies
        self.data_dir = data_dir
        self.opts = opts
        self.proc: subprocess.Popen | None = None
        self.service_url = ""
        self.admin_url = ""
        self.ready_ms: float | None = None  # first acknowledged message
        self.idle_rss_mib: float | None = None
        self.log_path = opts.log_dir / f"{data_dir.name}.server.log"
        # Geo-replication (bench/geo_replication.py): the cluster's name and
        # more command-line flags.
        self.cluster_name: str | None = None
        self.extra_args: list = []

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> None:
        raise NotImplementedError

    def probe_first_ack(self, started: float, timeout: float) -> None:
        """Sends one message until it is acknowledged; ready_ms is from the
        spawn of the server to that acknowledgement."""
        deadline = started + timeout
        attempts = 0
        while True:
            attempts += 1
            result = subprocess.run(
                [str(self.opts.vela), "perf", "produce",
                 "persistent://public/default/startup-probe",
                 "-u", self.service_url, "-m", "1", "-r", "0", "-o", "1",
                 "--disable-batching", "--json"],
                capture_output=True, text=True, timeout=max(5.0, timeout))
            if result.returncode == 0:
                try:
                    summary = json.loads(result.stdout.strip().splitlines()[-1])
                except (ValueError, IndexError):
                    summary = {}
                if summary.get("messages") == 1:
                    self.ready_ms = (time.monotonic() - started) * 1000.0
                    return
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise Fail(
                    f"{self.system} never acknowledged a first message "
                    f"({attempts} attempts): {result.stderr.strip()[-300:]}\n"
                    f"  server log {self.log_path}:\n{tail(self.log_path)}")
            time.sleep(0.05)

    def settle_and_measure_idle(self) -> None:
        time.sleep(3.0)
        self.idle_rss_mib = rss_mib(self.pid)

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc, grace=20.0)
        if not self.opts.keep_data:
            shutil.rmtree(self.data_dir, ignore_errors=True)


class VelaServer(Server):
    system = "vela"

    def journal_args(self) -> list:
        """Flags of the journal backend (the default: auto, O_DIRECT where the
        data directory takes it)."""
        return []

    def start(self) -> None:
        flush_dirty_page_cache(self.system)
        cmd = [self.opts.vela, "standalone", "--data-dir", self.data_dir,
               "--port", "0", "--http-port", "0", "--bookies", str(self.bookies)]
        cmd += self.journal_args()
        if self.cluster_name:
            cmd += ["--cluster-name", self.cluster_name]
        cmd += self.extra_args
        if self.bookies == 3:
            cmd += ["--ensemble-size", "2", "--write-quorum", "2", "--ack-quorum", "2"]
        started = time.monotonic()
        self.proc = spawn(cmd, self.log_path)
        deadline = started + 60
        pattern = re.compile(r"ready in \d+ ms: (pulsar://\S+) (http://\S+)")
        while True:
            match = pattern.search(self.log_path.read_text(errors="replace"))
            if match:
                self.service_url, self.admin_url = match.group(1), match.group(2)
                break
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise Fail(f"vela standalone did not get ready:\n{tail(self.log_path)}")
            time.sleep(0.001)
        self.probe_first_ack(started, timeout=60)
        self.settle_and_measure_idle()


class VelaPmemServer(VelaServer):
    """Vela with the journal on the pmem backend, its region on tmpfs in
    emulation: what this measures is memcpy + msync (a no-op on tmpfs), not a
    cache-line flush to persistent memory."""

    system = "vela-pmem"

    @property
    def pmem_dir(self) -> Path:
        return self.opts.pmem_root / self.data_dir.name

    def journal_args(self) -> list:
        return ["--journal-backend", "pmem", "--journal-pmem-path", str(self.pmem_dir),
                "--journal-pmem-size-mb", str(PMEM_REGION_MIB),
                "--journal-pmem-allow-emulation"]

    def start(self) -> None:
        self.opts.pmem_root.mkdir(parents=True, exist_ok=True)
        st = os.statvfs(self.opts.pmem_root)
        free_mib = st.f_bavail * st.f_frsize / 2**20
        needed_mib = (PMEM_REGION_MIB + 64) * self.bookies
        if free_mib < needed_mib:
            raise Fail(f"only {free_mib:.0f} MiB free in {self.opts.pmem_root}; the pmem journal "
                       f"regions need {needed_mib} MiB (--pmem-root elsewhere)")
        shutil.rmtree(self.pmem_dir, ignore_errors=True)
        super().start()

    def stop(self) -> None:
        super().stop()
        shutil.rmtree(self.pmem_dir, ignore_errors=True)


class PulsarServer(Server):
    system = "pulsar"

    def write_config(self, broker_port: int, web_port: int) -> Path:
        quorum = 2 if self.bookies == 3 else 1
        conf = self.data_dir / "standalone.conf"
        template = (PULSAR_HOME / "standalone.conf.in").read_text()
        text = template.format(broker_port=broker_port, web_port=web_port, quorum=quorum)
        if self.cluster_name:
            text = text.replace("clusterName=standalone", f"clusterName={self.cluster_name}")
        conf.write_text(text)
        return conf

    def start(self) -> None:
        if not PULSAR_LIB.is_dir():
            raise Fail("Apache Pulsar is not installed: run bench/pulsar/install.sh")
        flush_dirty_page_cache(self.system)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        for attempt in range(3):
            broker_port, web_port = free_port(), free_port()
            conf = self.write_config(broker_port, web_port)
            cmd = (["java"] + os.environ.get("PULSAR_MEM", PULSAR_MEM_DEFAULT).split()
                   + os.environ.get("PULSAR_GC", PULSAR_GC_DEFAULT).split()
                   + JVM_MODULE_FLAGS
                   + ["-Dpulsar.allocator.exit_on_oom=true",
                      "-Dio.netty.recycler.maxCapacityPerThread=4096",
                      f"-Dlog4j2.configurationFile={PULSAR_HOME / 'log4j2.xml'}",
                      "-cp", f"{PULSAR_LIB}/*",
                      "org.apache.pulsar.PulsarStandaloneStarter",
                      "--config", conf, "--no-functions-worker", "--no-stream-storage",
                      "--num-bookies", str(self.bookies),
                      "--metadata-dir", self.data_dir / "metadata",
                      "--bookkeeper-dir", self.data_dir / "bookkeeper"]
                   + self.extra_args)
            started = time.monotonic()
            self.proc = spawn(cmd, self.log_path, cwd=self.data_dir)
            if wait_for_port(broker_port, self.proc, timeout=180):
                break
            log = self.log_path.read_text(errors="replace")
            stop(self.proc)
            if "Address already in use" in log and attempt < 2:
                continue  # a port taken between our check and Pulsar's bind
            raise Fail(f"Pulsar standalone did not open its port:\n{tail(self.log_path, 30)}")
        self.service_url = f"pulsar://127.0.0.1:{broker_port}"
        self.admin_url = f"http://127.0.0.1:{web_port}"
        self.probe_first_ack(started, timeout=180)
        self.settle_and_measure_idle()


# ----------------------------------------------------------------- clients

@dataclass
class Figures:
    """One measured run, normalized across tools."""
    system: str
    bookies: int
    client: str
    messages_per_s: float | None = None
    mb_per_s: float | None = None
    latency_ms: dict = field(default_factory=dict)  # mean p50 p95 p99 p999 p9999 max
    curve: list = field(default_factory=list)  # (percentile, ms)
    peak_rss_mib: float | None = None
    ready_ms: float | None = None
    idle_rss_mib: float | None = None
    disk_ms: dict = field(default_factory=dict)  # `vela perf disk` right before
    disk_after_ms: dict = field(default_factory=dict)  # and right after
    server_cpu_pct: float | None = None  # fan-out: the server's CPU while loaded
    note: str = ""
    client_cpu_cores: float | None = None  # the client's CPU s per wall s
    stages_ms: dict = field(default_factory=dict)  # Vela's write-path stages: p50 p99 max
    # The server's CPU ms per 1,000 entries (Vela: ledger adds counted by its
    # write-path stage; Pulsar: messages sent, the client's rate x time) from
    # the moment every producer was created to the client's end: per-entry
    # cost, less sensitive to other load on the machine than latency.
    server_cpu_ms_per_1k: float | None = None


SERVERS = {"vela": VelaServer, "vela-pmem": VelaPmemServer, "pulsar": PulsarServer}


def watch(proc: subprocess.Popen, server: Server, timeout: float,
          log_path: Path | None = None, done_marker: str | None = None,
          done_grace: float = 3.0, on_marker: tuple | None = None) -> float | None:
    """Waits for a client, sampling the server's RSS every 0.25 s; returns
    the peak. With done_marker: once that text is in the log, waits
    done_grace s more, then stops the client (pulsar-perf idles up to 10 s
    after its test duration before it prints its summary and exits). With
    on_marker (text, callback) and log_path: calls callback() once, when the
    text first shows in the log."""
    peak = None
    deadline = time.monotonic() + timeout
    done_at = None
    while proc.poll() is None:
        if on_marker is not None and log_path is not None:
            if on_marker[0] in log_path.read_text(errors="replace"):
                on_marker[1]()
                on_marker = None
        cpu = cpu_seconds(proc.pid)
        if cpu is not None:
            CLIENT_CPU[proc.pid] = (cpu, time.monotonic())
        rss = rss_mib(server.pid)
        if rss is not None:
            peak = rss if peak is None else max(peak, rss)
        if time.monotonic() > deadline:
            stop(proc, grace=10.0)
            raise Fail(f"client ran past {timeout:.0f} s")
        free_gib = room_gib(server.data_dir)
        if free_gib < MIN_FREE_DURING_GIB:
            # Stop before the disk fills or the bookies turn read-only.
            stop(proc, grace=5.0)
            raise Fail(f"stopped: only {free_gib:.1f} GiB left on the data dir's disk "
                       f"before {BOOKIE_DISK_USAGE_MAX:.0%} use")
        if done_marker and log_path is not None and done_at is None:
            if done_marker in log_path.read_text(errors="replace"):
                done_at = time.monotonic()
        if done_at is not None and time.monotonic() - done_at > done_grace:
            stop(proc, grace=15.0)
            break
        time.sleep(0.25)
    CHILDREN.discard(proc)
    return peak


# Client pid -> (CPU seconds, when sampled): the last sample before it ended.
CLIENT_CPU: dict = {}


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of `pid` so far, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def client_cpu_cores(proc: subprocess.Popen, started: float) -> float | None:
    """The client's CPU seconds per wall second from its start to its last
    sample (creating producers included): near 1.0 or above, the run was
    bound by the client, not the server (they share the machine's cores)."""
    sample = CLIENT_CPU.pop(proc.pid, None)
    if sample is None or sample[1] <= started:
        return None
    return sample[0] / (sample[1] - started)


# broker_issue + broker_append + broker_receipt make up broker_publish;
# ledger_add_wait is the first part of ledger_add (the writer task's turn).
STAGES_SHOWN = ("broker_publish", "broker_issue", "broker_append", "broker_receipt",
                "ledger_add", "ledger_add_wait", "bookie_add", "journal_queue_wait",
                "journal_fdatasync")


def write_path_buckets(server: Server) -> tuple:
    """Vela's write-path stage histograms now: (bucket bounds in µs,
    {stage: bucket counts}), the stage's merged row where it has several
    instances; ({}, {}) when not available."""
    try:
        with urllib.request.urlopen(f"{server.admin_url}/admin/v2/vela/write-path",
                                    timeout=10) as response:
            body = json.load(response)
    except (OSError, ValueError):
        return [], {}
    stages: dict = {}
    for row in body.get("stages", []):
        stages.setdefault(row["stage"], row["buckets"])
    return body.get("bucket_bounds_us", []), stages


def stage_percentiles(bounds: list, before: dict, after: dict) -> dict:
    """p50, p99 and max (ms, bucket upper bounds) of each stage's samples
    recorded between two `write_path_buckets` snapshots (taken around the
    whole client run: producer creation and warm-up included)."""
    out = {}
    for stage in STAGES_SHOWN:
        if stage not in after:
            continue
        old = before.get(stage, [0] * len(after[stage]))
        counts = [a - b for a, b in zip(after[stage], old)]
        total = sum(counts)
        if total == 0:
            continue

        def bound_ms(index: int) -> float:
            return bounds[index] / 1000.0 if index < len(bounds) else float("inf")

        figures, seen = {}, 0
        for index, count in enumerate(counts):
            seen += count
            for name, q in (("p50", 0.5), ("p99", 0.99)):
                if name not in figures and seen >= q * total:
                    figures[name] = bound_ms(index)
            if count:
                figures["max"] = bound_ms(index)
        out[stage] = figures
    return out


def vela_perf_produce_cmd(opts: Options, sc: Scenario, url: str, topic: str,
                          duration: int, warmup: int) -> list:
    cmd = [opts.vela, "perf", "produce", topic, "-u", url,
           "-r", str(sc.rate), "-s", str(sc.size), "-o", str(sc.outstanding),
           "-z", sc.compression, "--test-duration", str(duration),
           "--warmup", str(warmup), "-i", "5", "--json"]
    if sc.topics > 1:
        cmd += ["-t", str(sc.topics)]
    if sc.keys:
        cmd += ["--keys", str(sc.keys)]
    if not sc.batching:
        cmd.append("--disable-batching")
    return cmd


def parse_vela_json(path: Path) -> dict:
    """The --json summary in a vela perf log. A run whose sends failed (e.g.
    bookies turned read-only) measured something else: it is a Fail, so its
    rate and latencies never stand as a result."""
    for line in reversed(path.read_text(errors="replace").splitlines()):
        line = line.strip()
        if line.startswith("{") and '"latency_ms"' in line:
            summary = json.loads(line)
            if summary.get("failures", 0):
                raise Fail(f"{summary['failures']} sends failed; see {path}")
            return summary
    raise Fail(f"no --json summary from vela perf:\n{tail(path)}")


def figures_from_vela(summary: dict, fig: Figures) -> Figures:
    fig.messages_per_s = summary["messages_per_s"]
    fig.mb_per_s = summary["mb_per_s"]
    fig.latency_ms = summary["latency_ms"]
    fig.curve = [tuple(p) for p in summary.get("latency_curve_ms", [])]
    return fig


def run_idle_topics(opts: Options, sc: Scenario, server: Server, tag: str) -> Figures:
    """An "idle" scenario: `vela perf produce --idle -t N` creates N topics,
    one producer each (each topic auto-created at its producer's lookup,
    CREATE_IN_FLIGHT_MAX of vela perf at a time), and holds them idle for
    the run's duration. msg/s is topics created per second; peak RSS the
    broker's, creation included; the note has the time and the RSS at the
    end of the idle hold. A system that cannot create them all fails the
    run with the client's error."""
    fig = Figures(server.system, server.bookies, "vela-perf")
    topic = f"persistent://public/default/{sc.name}-{tag}"
    out = opts.log_dir / f"{server.data_dir.name}.{tag}.produce.log"
    rss_before = rss_mib(server.pid)
    started = time.monotonic()
    proc = spawn([opts.vela, "perf", "produce", topic, "-u", server.service_url,
                  "-t", str(sc.topics), "--idle", "--test-duration", str(opts.duration),
                  # 16 connections: a Vela broker takes 10,000 producers per
                  # connection by default; Pulsar's clients can spread too.
                  "--connections", "16"], out)
    # Creating 100,000 producers takes minutes on a loaded machine (Pulsar
    # far longer, if at all): one hour at most.
    deadline = time.monotonic() + 3600 + opts.duration
    peak, idle_rss = None, None
    created = re.compile(r"created (\d+) producer\(s\) in ([\d.]+) s")
    while proc.poll() is None:
        rss = rss_mib(server.pid)
        if rss is not None:
            peak = rss if peak is None else max(peak, rss)
            if created.search(out.read_text(errors="replace")):
                idle_rss = rss  # the last sample while held idle
        if time.monotonic() > deadline:
            stop(proc, grace=10.0)
            raise Fail(f"{sc.topics:,} producers not created within an hour:\n{tail(out)}")
        time.sleep(0.5)
    CHILDREN.discard(proc)
    fig.client_cpu_cores = None  # mostly idle: not a load figure
    match = created.search(out.read_text(errors="replace"))
    if proc.returncode != 0 or match is None:
        raise Fail(f"vela perf produce --idle failed after {time.monotonic() - started:.0f} s "
                   f"(broker RSS {fmt(rss_mib(server.pid), 0)} MiB):\n{tail(out)}")
    count, seconds = int(match.group(1)), float(match.group(2))
    fig.messages_per_s = count / seconds if seconds > 0 else None
    fig.peak_rss_mib = peak
    fig.note = (f"idle: {count:,} topics with a producer each created in {seconds:.1f} s "
                f"({fmt(fig.messages_per_s, 0)} topics/s); broker RSS {fmt(rss_before, 0)} MiB "
                f"before, {fmt(idle_rss, 0)} MiB held idle, {fmt(peak, 0)} MiB peak")
    return fig


def run_vela_perf(opts: Options, sc: Scenario, server: Server, tag: str) -> Figures:
    if sc.kind == "idle":
        return run_idle_topics(opts, sc, server, tag)
    fig = Figures(server.system, server.bookies, "vela-perf")
    topic = f"{sc.topic_domain}://public/default/{sc.name}-{tag}"
    base = opts.log_dir / f"{server.data_dir.name}.{tag}"
    if sc.kind not in ("e2e", "fanout"):
        out = Path(f"{base}.produce.log")
        bounds, stages_before = write_path_buckets(server)
        started = time.monotonic()
        cmd = vela_perf_produce_cmd(opts, sc, server.service_url, topic, opts.duration,
                                    opts.warmup)
        if sc.partitions:
            cmd += ["--partitions", str(sc.partitions), "--admin-url", server.admin_url]
        proc = spawn(cmd, out)
        # Creating producers comes before the measured run: 10,000 of them
        # take tens of seconds on a loaded Pulsar.
        creating_s = sc.topics // 50
        created: dict = {}

        def at_created() -> None:
            created["cpu"], created["at"] = cpu_seconds(server.pid), time.monotonic()
            if server.system != "pulsar":
                created["stages"] = write_path_buckets(server)[1]

        fig.peak_rss_mib = watch(proc, server, timeout=opts.duration + 120 + creating_s,
                                 log_path=out, on_marker=("produce: created", at_created))
        cpu_end, ended = cpu_seconds(server.pid), time.monotonic()
        fig.client_cpu_cores = client_cpu_cores(proc, started)
        if proc.returncode != 0:
            raise Fail(f"vela perf produce failed:\n{tail(out)}")
        entries = None
        if server.system != "pulsar":
            _, stages_after = write_path_buckets(server)
            fig.stages_ms = stage_percentiles(bounds, stages_before, stages_after)
            if "stages" in created and "ledger_add" in stages_after:
                entries = (sum(stages_after["ledger_add"])
                           - sum(created["stages"].get("ledger_add", [])))
        fig = figures_from_vela(parse_vela_json(out), fig)
        if server.system == "pulsar" and "at" in created and fig.messages_per_s:
            entries = fig.messages_per_s * (ended - created["at"])
        if created.get("cpu") is not None and cpu_end is not None and entries:
            fig.server_cpu_ms_per_1k = 1e6 * (cpu_end - created["cpu"]) / entries
        return fig
    # End to end: the consumer subscribes first, then the producer runs.
    cons_out = Path(f"{base}.consume.log")
    prod_out = Path(f"{base}.produce.log")
    # e2e takes its rate from the producer: the consumer outlasts it to see
    # the last messages. Fan-out takes its rate from the consumer: its window
    # ([warm-up + 1, duration + 1] from its start, the producer starting about
    # 1 s later) is the producer's, so no idle tail dilutes the rate.
    slack = 1 if sc.kind == "fanout" else 3
    consumer = spawn([opts.vela, "perf", "consume", topic, "-u", server.service_url,
                      "--subscription-position", "latest",
                      "-n", str(max(sc.subscriptions, 1)),
                      "--test-duration", str(opts.duration + slack),
                      "--warmup", str(opts.warmup + 1), "-i", "5", "--json"], cons_out)
    time.sleep(1.0)
    cpu_before, started = cpu_seconds(server.pid), time.monotonic()
    producer = spawn(vela_perf_produce_cmd(opts, sc, server.service_url, topic,
                                           opts.duration, opts.warmup), prod_out)
    fig.peak_rss_mib = watch(producer, server, timeout=opts.duration + 120)
    cpu_after, elapsed = cpu_seconds(server.pid), time.monotonic() - started
    watch(consumer, server, timeout=slack + 60)
    if producer.returncode != 0:
        raise Fail(f"vela perf produce failed:\n{tail(prod_out)}")
    if consumer.returncode != 0:
        raise Fail(f"vela perf consume failed:\n{tail(cons_out)}")
    fig = figures_from_vela(parse_vela_json(cons_out), fig)
    sent = parse_vela_json(prod_out)
    if sc.kind == "fanout":
        # What the subscriptions received in all, per second of the measured
        # window (the producer's rate times the subscriptions, less drops).
        fig.note = (f"fan-out: msg/s received over {sc.subscriptions} subscription(s); "
                    f"producer sent {sent['messages_per_s']:,.0f} msg/s; e2e from a µs send stamp")
        if cpu_before is not None and cpu_after is not None and elapsed > 0:
            # The server's whole process (broker, bookies, metadata) while
            # the producer ran: how much of the shared CPU the server took.
            used = cpu_after - cpu_before
            fig.server_cpu_pct = 100.0 * used / elapsed
            per_msg = (1e6 * used / (fig.messages_per_s * elapsed)
                       if fig.messages_per_s else None)
            fig.note += (f"; server CPU {fig.server_cpu_pct:.0f}% of a core"
                         + (f", {per_msg:.2f} µs per message received" if per_msg else ""))
        return fig
    # The consumer's own rate spans its longer run; report what was sent.
    fig.messages_per_s, fig.mb_per_s = sent["messages_per_s"], sent["mb_per_s"]
    fig.note = "e2e: from a µs send stamp in the payload; msg/s: the producer's"
    return fig


def pulsar_perf_cmd(opts: Options, sub: str, args: list) -> list:
    return (["java"] + PULSAR_PERF_MEM.split() + JVM_MODULE_FLAGS
            + [f"-Dlog4j2.configurationFile={PULSAR_HOME / 'log4j2-perf.xml'}",
               "-cp", f"{PULSAR_LIB}/*",
               "org.apache.pulsar.testclient.PulsarPerfTestTool",
               PULSAR_HOME / "client.conf", sub] + args)


LATENCY_LINE = re.compile(
    r"Aggregated latency stats --- Latency: mean:\s*([\d.]+) ms - med:\s*([\d.]+)"
    r" - 95pct:\s*([\d.]+) - 99pct:\s*([\d.]+) - 99\.9pct:\s*([\d.]+)"
    r" - 99\.99pct:\s*([\d.]+) - 99\.999pct:\s*([\d.]+) - Max:\s*([\d.]+)")
CLIENT_STATS_LINE = re.compile(r"^(\d{13}) .*Ack received rate: ([\d.]+) ack/s")
PRODUCERS_CREATED = re.compile(r"^(\d{13}) Created \d+ producers")


def parse_pulsar_latency(path: Path) -> tuple:
    match = None
    for match in LATENCY_LINE.finditer(path.read_text(errors="replace")):
        pass
    if match is None:
        raise Fail(f"no aggregated latency line from pulsar-perf:\n{tail(path)}")
    mean, p50, p95, p99, p999, p9999, p99999, mx = (float(g) for g in match.groups())
    latency = {"mean": mean, "p50": p50, "p95": p95, "p99": p99, "p999": p999,
               "p9999": p9999, "max": mx}
    curve = [(50.0, p50), (95.0, p95), (99.0, p99), (99.9, p999), (99.99, p9999),
             (99.999, p99999), (100.0, mx)]
    return latency, curve


def pulsar_throughput(path: Path, duration: int, warmup: int) -> float | None:
    """Acknowledged msg/s after the warm-up, from the client's own stats
    lines (-i 1: one line a second with its ack rate). pulsar-perf's
    "Aggregated throughput" counts the warm-up and the idle time until its
    10 s report loop notices the end, so it is not used."""
    created = None
    points = []
    for line in path.read_text(errors="replace").splitlines():
        m = PRODUCERS_CREATED.match(line)
        if m and created is None:
            created = int(m.group(1)) / 1000.0
            continue
        m = CLIENT_STATS_LINE.match(line)
        if m:
            points.append((int(m.group(1)) / 1000.0, float(m.group(2))))
    if created is None or len(points) < 2:
        return None
    start, end = created + warmup, created + duration
    acked = 0.0
    span = 0.0
    for (t0, _), (t1, rate) in zip(points, points[1:]):
        if t0 >= start and t1 <= end:
            acked += rate * (t1 - t0)
            span += t1 - t0
    return acked / span if span > 0 else None


def run_pulsar_perf(opts: Options, sc: Scenario, server: Server, tag: str) -> Figures:
    fig = Figures(server.system, server.bookies, "pulsar-perf")
    topic = f"persistent://public/default/{sc.name}-{tag}"
    base = opts.log_dir / f"{server.data_dir.name}.{tag}"
    rate = sc.rate or PULSAR_PERF_UNLIMITED_RATE
    produce_args = ["-u", server.service_url, "-r", str(rate), "-s", str(sc.size),
                    "-o", str(sc.outstanding), "-z", sc.compression.upper(),
                    "-time", str(opts.duration), "--warmup-time", str(opts.warmup),
                    "-i", "1", topic]
    if not sc.batching:
        produce_args.insert(0, "-db")
    prod_out = Path(f"{base}.produce.log")
    if sc.kind != "e2e":
        proc = spawn(pulsar_perf_cmd(opts, "produce", produce_args), prod_out)
        fig.peak_rss_mib = watch(proc, server, timeout=opts.duration + 180,
                                 log_path=prod_out, done_marker="DONE (reached")
        fig.latency_ms, fig.curve = parse_pulsar_latency(prod_out)
        fig.messages_per_s = pulsar_throughput(prod_out, opts.duration, opts.warmup)
        if fig.messages_per_s is not None:
            fig.mb_per_s = fig.messages_per_s * sc.size / 1e6
        return fig
    cons_out = Path(f"{base}.consume.log")
    slack = 8  # the consumer's JVM starts, then the producer's
    consumer = spawn(pulsar_perf_cmd(opts, "consume", [
        "-u", server.service_url, "-ss", "sub", "-sp", "Latest",
        "-time", str(opts.duration + slack), "-i", "0", topic]), cons_out)
    deadline = time.monotonic() + 120
    while "Start receiving" not in cons_out.read_text(errors="replace") \
            and "Created 1 consumers" not in cons_out.read_text(errors="replace"):
        if consumer.poll() is not None or time.monotonic() > deadline:
            raise Fail(f"pulsar-perf consume did not subscribe:\n{tail(cons_out)}")
        time.sleep(0.1)
    producer = spawn(pulsar_perf_cmd(opts, "produce", produce_args), prod_out)
    fig.peak_rss_mib = watch(producer, server, timeout=opts.duration + 180,
                             log_path=prod_out, done_marker="DONE (reached")
    watch(consumer, server, timeout=slack + 120)
    fig.latency_ms, fig.curve = parse_pulsar_latency(cons_out)
    fig.messages_per_s = pulsar_throughput(prod_out, opts.duration, opts.warmup)
    if fig.messages_per_s is not None:
        fig.mb_per_s = fig.messages_per_s * sc.size / 1e6
    fig.note = "e2e: from the publish time, in whole ms (pulsar-perf's consumer); msg/s: the producer's"
    return fig


# ------------------------------------------------------------ measurement

def measure_disk(opts: Options, where: Path) -> dict:
    where.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        [str(opts.vela), "perf", "disk", "--dir", str(where), "--size", "1024",
         "--test-duration", str(opts.disk_seconds), "--json"],
        capture_output=True, text=True, timeout=opts.disk_seconds + 120)
    if result.returncode != 0:
        raise Fail(f"vela perf disk failed: {result.stderr.strip()}")
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    return summary["latency_ms"]


def space_needed_gib(sc: Scenario, opts: Options, bookies: int) -> float:
    """Free space a run needs: MIN_FREE_GIB when it sends as fast as it can;
    at a fixed rate, what it writes (journal and entry logs, per copy) plus
    the MIN_FREE_DURING_GIB a run stops at."""
    if sc.kind == "idle":
        return MIN_FREE_DURING_GIB  # nothing is sent
    if sc.rate == 0:
        return MIN_FREE_GIB
    copies = 2 if bookies == 3 else 1
    written = sc.rate * sc.size * opts.duration * 2 * copies / 2**30
    return min(MIN_FREE_GIB, written + MIN_FREE_DURING_GIB)
def run_fanout(opts: Options, sc: Scenario, systems: list, bookies: int) -> list:
    """A fan-out scenario: every system's standalone runs at once and the
    systems take turns, `opts.repeat` runs each; the run of median msg/s is
    reported, every run's figures in its note. On a machine shared with
    other work the load drifts from one minute to the next; turns spread
    the drift over both systems alike (one system's idle server beside the
    other's run is the price)."""
    servers = {}
    runs = {system: [] for system in systems}
    rows = []
    try:
        for system in systems:
            data_dir = opts.data_root / f"{sc.name}-{system}-{bookies}b"
            shutil.rmtree(data_dir, ignore_errors=True)
            server = SERVERS[system](bookies, data_dir, opts)
            label = f"{system} {BOOKIE_SETUPS[bookies]}"
            print(f"   {label}: starting", flush=True)
            try:
                server.start()
            except Fail as error:
                server.stop()
                print(f"   {label}: FAILED: {error}", flush=True)
                rows.append(Figures(system, bookies, "vela-perf",
                                    note=f"failed: {str(error).splitlines()[0]}"))
                continue
            servers[system] = server
            print(f"   {label}: first ack after {server.ready_ms:.0f} ms, "
                  f"idle RSS {server.idle_rss_mib:.0f} MiB", flush=True)
        for turn in range(max(opts.repeat, 1)):
            for system, server in servers.items():
                try:
                    fig = run_vela_perf(opts, sc, server, f"vela-perf-{turn + 1}")
                except Fail as error:
                    print(f"   {system} run {turn + 1}: FAILED: {error}", flush=True)
                    continue
                fig.ready_ms, fig.idle_rss_mib = server.ready_ms, server.idle_rss_mib
                runs[system].append(fig)
                cpu = f", server CPU {fig.server_cpu_pct:.0f}%" if fig.server_cpu_pct else ""
                print(f"   {system} run {turn + 1}: " + one_line(fig) + cpu, flush=True)
    finally:
        for server in servers.values():
            server.stop()
    for system in servers:
        done = sorted(runs[system], key=lambda f: f.messages_per_s or 0.0)
        if not done:
            rows.append(Figures(system, bookies, "vela-perf", note="failed: every run failed"))
            continue
        fig = done[(len(done) - 1) // 2]
        fig.peak_rss_mib = max((f.peak_rss_mib or 0.0) for f in done) or None
        each = "; ".join(f"{f.messages_per_s:,.0f} msg/s p99 {f.latency_ms['p99']:.1f} ms"
                         for f in runs[system])
        fig.note += f"; median of {len(done)} runs taken in turns with the other system ({each})"
        rows.append(fig)
    return rows


def run_scenario(opts: Options, sc: Scenario, systems: list, bookie_setups: list) -> dict:
    print(f"\n== {sc.name}: {sc.title} ==", flush=True)
    started_at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    if sc.kind == "fanout":
        # Nothing is stored: the journal and the bookies play no part, so
        # one setup, no pmem, and no disk measurement.
        systems = [s for s in systems if s != "vela-pmem"]
        rows = run_fanout(opts, sc, systems, bookie_setups[0])
        result = {"scenario": sc.name, "title": sc.title, "kind": sc.kind,
                  "started_at": started_at, "rows": [fig.__dict__ for fig in rows]}
        print()
        print(scenario_table(result))
        return result
    rows = []
    for system in systems:
        for bookies in bookie_setups:
            # The disk's own latency right before this standalone runs on it:
            # on a shared machine it drifts from one minute to the next.
            free_gib = room_gib(opts.data_root)
            needed_gib = space_needed_gib(sc, opts, bookies)
            if free_gib < needed_gib:
                raise Fail(f"only {free_gib:.1f} GiB free in {opts.data_root} before "
                           f"{BOOKIE_DISK_USAGE_MAX:.0%} use (where Vela's bookies turn "
                           f"read-only); this run needs {needed_gib:.1f} GiB "
                           f"(BENCH_DATA=dir elsewhere)")
            disk = measure_disk(opts, opts.data_root)
            print(f"   raw fdatasync of {opts.data_root} (4 KiB blocks, depth 1): "
                  f"p50 {disk['p50']:.3f} ms  p99 {disk['p99']:.3f} ms  p99.9 {disk['p999']:.3f} ms",
                  flush=True)
            data_dir = opts.data_root / f"{sc.name}-{system}-{bookies}b"
            shutil.rmtree(data_dir, ignore_errors=True)
            server = SERVERS[system](bookies, data_dir, opts)
            clients = ["vela-perf"] if system != "pulsar" else list(sc.pulsar_clients)
            label = f"{system} {BOOKIE_SETUPS[bookies]}"
            try:
                print(f"   {label}: starting", flush=True)
                server.start()
                print(f"   {label}: first ack after {server.ready_ms:.0f} ms, "
                      f"idle RSS {server.idle_rss_mib:.0f} MiB", flush=True)
                for client in clients:
                    runner = run_vela_perf if client == "vela-perf" else run_pulsar_perf
                    fig = runner(opts, sc, server, client)
                    fig.ready_ms, fig.idle_rss_mib = server.ready_ms, server.idle_rss_mib
                    fig.disk_ms = disk
                    rows.append(fig)
                    print(f"   {label} ({client}): " + one_line(fig), flush=True)
            except Fail as error:
                print(f"   {label}: FAILED: {error}", flush=True)
                rows.append(Figures(system, bookies, clients[0], disk_ms=disk,
                                    note=f"failed: {str(error).splitlines()[0]}"))
            finally:
                server.stop()
            # And once more after it: the lower p50 of the two is the floor
            # the targets compare with.
            after = measure_disk(opts, opts.data_root)
            for fig in rows:
                if fig.system == system and fig.bookies == bookies:
                    fig.disk_after_ms = after
            print(f"   raw fdatasync after: p50 {after['p50']:.3f} ms  p99 {after['p99']:.3f} ms",
                  flush=True)
    result = {"scenario": sc.name, "title": sc.title, "kind": sc.kind,
              "started_at": started_at,
              "rows": [fig.__dict__ for fig in rows]}
    print()
    print(scenario_table(result))
    return result


# ------------------------------------------------------------------ output

def fmt(value, digits=3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and digits == 0:
        return f"{value:,.0f}"
    return f"{value:.{digits}f}"


def one_line(fig: Figures) -> str:
    lat = fig.latency_ms
    return (f"{fmt(fig.messages_per_s, 0)} msg/s, {fmt(fig.mb_per_s, 1)} MB/s, "
            f"p50 {fmt(lat.get('p50'))} p99 {fmt(lat.get('p99'))} "
            f"p99.9 {fmt(lat.get('p999'))} max {fmt(lat.get('max'))} ms"
            + (f", peak RSS {fmt(fig.peak_rss_mib, 0)} MiB" if fig.peak_rss_mib else "")
            + (f", client CPU {fmt(fig.client_cpu_cores, 2)} cores"
               if fig.client_cpu_cores is not None else "")
            + (f", server CPU {fmt(fig.server_cpu_ms_per_1k, 1)} ms per 1k entries"
               if fig.server_cpu_ms_per_1k is not None else "")
            + "".join(f"; {stage} p50 {fmt(v.get('p50'))} p99 {fmt(v.get('p99'))} "
                      f"max {fmt(v.get('max'))} ms" for stage, v in fig.stages_ms.items()))


def text_table(headers: list, rows: list) -> str:
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) if rows else len(str(h))
              for i, h in enumerate(headers)]
    def line(cells):
        return "  ".join(str(c).rjust(w) if i else str(c).ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths)))
    out = [line(headers), line(["-" * w for w in widths])]
    out += [line(r) for r in rows]
    return "\n".join(out)


def md_table(headers: list, rows: list) -> str:
    out = ["| " + " | ".join(headers) + " |",
           "|" + "|".join("---" if i == 0 else "---:" for i in range(len(headers))) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


SCENARIO_HEADERS = ["system", "bookies", "client", "msg/s", "MB/s", "mean", "p50",
                    "p95", "p99", "p99.9", "p99.99", "max", "disk p50 before/after",
                    "disk p99 before/after"]


def scenario_rows(result: dict) -> list:
    rows = []
    for r in result["rows"]:
        lat, disk, after = r["latency_ms"], r["disk_ms"], r.get("disk_after_ms") or {}
        rows.append([r["system"], r["bookies"], r["client"] + (" *" if r["note"].startswith("failed") else ""),
                     fmt(r["messages_per_s"], 0), fmt(r["mb_per_s"], 1),
                     *(fmt(lat.get(k)) for k in ("mean", "p50", "p95", "p99", "p999", "p9999", "max")),
                     f"{fmt(disk.get('p50'))}/{fmt(after.get('p50'))}",
                     f"{fmt(disk.get('p99'))}/{fmt(after.get('p99'))}"])
    return rows


def scenario_table(result: dict, markdown: bool = False) -> str:
    title = (f"{result['scenario']}: {result['title']} "
             f"(latency ms{'; end-to-end, from the consumer' if result['kind'] in ('e2e', 'fanout') else ''})")
    table = (md_table if markdown else text_table)(SCENARIO_HEADERS, scenario_rows(result))
    notes = [f"{r['system']} {r['bookies']}b {r['client']}: {r['note']}"
             for r in result["rows"] if r["note"]]
    body = title + "\n\n" + table if markdown else title + "\n" + table
    if notes:
        body += ("\n\n" if markdown else "\n") + "\n".join(
            ("- " if markdown else "  note: ") + n for n in notes)
    return body


def find_row(result: dict, system: str, bookies: int, client: str | None = None):
    for r in result["rows"]:
        if r["system"] == system and r["bookies"] == bookies and (client is None or r["client"] == client) \
                and r["latency_ms"]:
            return r
    return None


def disk_floor(row) -> float | None:
    """The lower fdatasync p50 of the measurements before and after a run."""
    if not row:
        return None
    values = [d["p50"] for d in (row.get("disk_ms"), row.get("disk_after_ms")) if d]
    return min(values) if values else None


def ratio(a, b) -> str:
    if a is None or b is None or b == 0:
        return "-"
    return f"{a / b:.1f}x"


def combined_rows(results: list, bookie_setups: list) -> list:
    rows = []
    for res in results:
        sc = SCENARIOS[res["scenario"]]
        for bookies in bookie_setups:
            vela = find_row(res, "vela", bookies)
            pulsar = find_row(res, "pulsar", bookies, sc.reference_client)
            if sc.kind == "fanout" and not vela and not pulsar:
                continue  # fan-out runs one setup only: nothing is stored
            vl = vela["latency_ms"] if vela else {}
            pl = pulsar["latency_ms"] if pulsar else {}
            v_rate = vela["messages_per_s"] if vela else None
            p_rate = pulsar["messages_per_s"] if pulsar else None
            rows.append([
                res["scenario"], bookies, sc.reference_client,
                fmt(disk_floor(vela)),
                fmt(vl.get("p50")), fmt(vl.get("p99")), fmt(vl.get("p999")), fmt(v_rate, 0),
                fmt(pl.get("p50")), fmt(pl.get("p99")), fmt(pl.get("p999")), fmt(p_rate, 0),
                ratio(pl.get("p50"), vl.get("p50")), ratio(pl.get("p999"), vl.get("p999")),
                ratio(v_rate, p_rate),
            ])
    return rows


def journal_rows(results: list, bookie_setups: list) -> list:
    """Vela's file journal beside its pmem journal (emulated), per scenario."""
    rows = []
    for res in results:
        for bookies in bookie_setups:
            file_row = find_row(res, "vela", bookies)
            pmem_row = find_row(res, "vela-pmem", bookies)
            if not pmem_row:
                continue
            fl = file_row["latency_ms"] if file_row else {}
            pl = pmem_row["latency_ms"]
            f_rate = file_row["messages_per_s"] if file_row else None
            rows.append([
                res["scenario"], bookies, fmt(disk_floor(file_row)),
                fmt(fl.get("p50")), fmt(fl.get("p99")), fmt(fl.get("p999")), fmt(f_rate, 0),
                fmt(pl.get("p50")), fmt(pl.get("p99")), fmt(pl.get("p999")),
                fmt(pmem_row["messages_per_s"], 0),
                ratio(fl.get("p50"), pl.get("p50")), ratio(fl.get("p999"), pl.get("p999")),
            ])
    return rows


JOURNAL_HEADERS = ["scenario", "bk", "disk p50", "file p50", "file p99", "file p99.9", "file msg/s",
                   "pmem p50", "pmem p99", "pmem p99.9", "pmem msg/s", "F/P p50", "F/P p99.9"]
JOURNAL_NOTE = ("file: Vela's usual journal (backend auto: O_DIRECT where the data directory takes "
                "it, + fdatasync). pmem: the persistent-memory backend with its region on tmpfs in "
                "emulation: a group costs a memcpy and an msync that tmpfs makes a no-op, so this "
                "is the journal with its disk taken away, NOT persistent-memory durability and not "
                "a measurement of Optane or CXL memory (README: the journal on persistent memory).")


COMBINED_HEADERS = ["scenario", "bk", "pulsar client", "disk p50", "vela p50", "vela p99", "vela p99.9",
                    "vela msg/s", "pulsar p50", "pulsar p99", "pulsar p99.9", "pulsar msg/s",
                    "P/V p50", "P/V p99.9", "V/P msg/s"]


def startup_memory(results: list, systems: list, bookie_setups: list) -> dict:
    """Per (system, bookies): median time to first ack and idle RSS over all
    the fresh starts of the run; RSS under load = peak while the async 1 KiB
    producer ran (else the peak of any run)."""
    out = {}
    for system in systems:
        for bookies in bookie_setups:
            rows = [r for res in results for r in res["rows"]
                    if r["system"] == system and r["bookies"] == bookies and r["ready_ms"]]
            if not rows:
                continue
            load = [r["peak_rss_mib"] for res in results if res["scenario"] == "async-1k"
                    for r in res["rows"] if r["system"] == system and r["bookies"] == bookies
                    and r["peak_rss_mib"]]
            source = "async-1k"
            if not load:
                load = [r["peak_rss_mib"] for r in rows if r["peak_rss_mib"]]
                source = "any run"
            out[(system, bookies)] = {
                "ready_ms": statistics.median(r["ready_ms"] for r in rows),
                "ready_ms_all": sorted(round(r["ready_ms"]) for r in rows),
                "idle_rss_mib": statistics.median(r["idle_rss_mib"] for r in rows if r["idle_rss_mib"]),
                "load_rss_mib": max(load) if load else None,
                "load_source": source,
            }
    return out


def startup_rows(sm: dict, bookie_setups: list) -> list:
    rows = []
    for bookies in bookie_setups:
        v, p = sm.get(("vela", bookies)), sm.get(("pulsar", bookies))
        rows.append([
            BOOKIE_SETUPS[bookies],
            fmt(v and v["ready_ms"], 0), fmt(p and p["ready_ms"], 0),
            ratio(p and p["ready_ms"], v and v["ready_ms"]),
            fmt(v and v["idle_rss_mib"], 0), fmt(p and p["idle_rss_mib"], 0),
            fmt(v and v["load_rss_mib"], 0), fmt(p and p["load_rss_mib"], 0),
            ratio(p and p["load_rss_mib"], v and v["load_rss_mib"]),
        ])
    return rows


STARTUP_HEADERS = ["setup", "vela ready ms", "pulsar ready ms", "P/V ready",
                   "vela idle MiB", "pulsar idle MiB", "vela load MiB", "pulsar load MiB",
                   "P/V load RSS"]


def targets(results: list, sm: dict, bookie_setups: list) -> list:
    """Issue 5's targets: (target, setup, measured, met)."""
    by = {res["scenario"]: res for res in results}
    out = []
    def verdict(ok):
        return "-" if ok is None else ("met" if ok else "NOT met")
    for bookies in bookie_setups:
        setup = BOOKIE_SETUPS[bookies]
        sync = by.get("sync-1k")
        if sync:
            v = find_row(sync, "vela", bookies)
            p = find_row(sync, "pulsar", bookies, SCENARIOS["sync-1k"].reference_client)
            pp = find_row(sync, "pulsar", bookies, "pulsar-perf")
            budget = 0.100 if bookies == 1 else 0.150
            if v:
                disk = disk_floor(v)
                vp50 = v["latency_ms"]["p50"]
                before = v["disk_ms"]["p50"]
                after = (v.get("disk_after_ms") or {}).get("p50")
                out.append([f"sync 1 KiB p50 <= fdatasync p50 + {budget * 1000:.0f} us"
                            + ("" if bookies == 1 else " (DESIGN: 2 copies)"), setup,
                            f"{vp50:.3f} ms vs {disk:.3f} + {budget:.3f} ms (fdatasync p50 "
                            f"{before:.3f} before, {fmt(after)} after)",
                            verdict(vp50 <= disk + budget)])
            if v and p:
                r50 = p["latency_ms"]["p50"] / v["latency_ms"]["p50"]
                r999 = p["latency_ms"]["p999"] / v["latency_ms"]["p999"]
                def with_pp(key):
                    if not pp:
                        return ""
                    return (f"; with pulsar-perf {pp['latency_ms'][key] / v['latency_ms'][key]:.1f}x"
                            f" ({pp['latency_ms'][key]:.3f} ms)")
                out.append(["sync 1 KiB p50 >= 3x lower than Pulsar", setup,
                            f"{r50:.1f}x ({v['latency_ms']['p50']:.3f} vs {p['latency_ms']['p50']:.3f} ms"
                            f"{with_pp('p50')})", verdict(r50 >= 3)])
                out.append(["sync 1 KiB p99.9 >= 10x lower than Pulsar", setup,
                            f"{r999:.1f}x ({v['latency_ms']['p999']:.3f} vs {p['latency_ms']['p999']:.3f} ms"
                            f"{with_pp('p999')})", verdict(r999 >= 10)])
        for name in ("np-fanout-1", "np-fanout-10"):
            fan = by.get(name)
            v = fan and find_row(fan, "vela", bookies)
            p = fan and find_row(fan, "pulsar", bookies, "vela-perf")
            if v and p and v["messages_per_s"] and p["messages_per_s"]:
                r = v["messages_per_s"] / p["messages_per_s"]
                vp99, pp99 = v["latency_ms"]["p99"], p["latency_ms"]["p99"]
                vc, pc = v.get("server_cpu_pct"), p.get("server_cpu_pct")
                cpu = f", server CPU {vc:.0f}% vs {pc:.0f}% of a core" if vc and pc else ""
                out.append([f"{name}: msg/s >= 2x Pulsar at a lower p99", setup,
                            f"{r:.1f}x ({v['messages_per_s']:,.0f} vs {p['messages_per_s']:,.0f} msg/s), "
                            f"p99 {vp99:.3f} vs {pp99:.3f} ms{cpu}", verdict(r >= 2 and vp99 < pp99)])
        asyn = by.get("async-1k")
        if asyn:
            v = find_row(asyn, "vela", bookies)
            p = find_row(asyn, "pulsar", bookies, "pulsar-perf")
            pv = find_row(asyn, "pulsar", bookies, "vela-perf")
            if v and p and v["messages_per_s"] and p["messages_per_s"]:
                r = v["messages_per_s"] / p["messages_per_s"]
                extra = ""
                if pv and pv["messages_per_s"]:
                    extra = (f"; Pulsar driven by vela perf: {v['messages_per_s'] / pv['messages_per_s']:.1f}x"
                             f" ({pv['messages_per_s']:,.0f} msg/s)")
                out.append(["async batched 1 KiB throughput >= 2x Pulsar", setup,
                            f"{r:.1f}x ({v['messages_per_s']:,.0f} vs {p['messages_per_s']:,.0f} msg/s{extra})",
                            verdict(r >= 2)])
        v, p = sm.get(("vela", bookies)), sm.get(("pulsar", bookies))
        if v and p:
            if v["load_rss_mib"] and p["load_rss_mib"]:
                r = p["load_rss_mib"] / v["load_rss_mib"]
                out.append(["RSS under load <= 1/10 of Pulsar", setup,
                            f"{r:.1f}x ({v['load_rss_mib']:.0f} vs {p['load_rss_mib']:.0f} MiB)",
                            verdict(r >= 10)])
            r = p["ready_ms"] / v["ready_ms"]
            out.append(["ready >= 50x sooner (to first ack)", setup,
                        f"{r:.0f}x ({v['ready_ms']:.0f} vs {p['ready_ms']:.0f} ms)",
                        verdict(r >= 50)])
    return out


TARGET_HEADERS = ["target", "setup", "measured", "verdict"]


def machine_state() -> dict:
    """Load and the busiest processes other than this benchmark's."""
    ps = subprocess.run(["ps", "-eo", "pid,pcpu,rss,comm,args", "--sort=-pcpu"],
                        capture_output=True, text=True).stdout.splitlines()[1:]
    ours = {str(p.pid) for p in CHILDREN} | {str(os.getpid())}
    heavy = []
    for line in ps[:12]:
        parts = line.split(None, 4)
        if len(parts) < 5 or parts[0] in ours:
            continue
        if float(parts[1]) >= 10.0:
            heavy.append(f"{parts[3]} ({parts[1]}% CPU): {parts[4][:100]}")
    return {"loadavg": os.getloadavg(), "heavy": heavy,
            "at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


# The 1-minute load average left by run.sh's own release build (or an
# earlier run) must fall below this before the first measurement; waits at
# most SETTLE_WAIT_MAX_S, so a machine that stays busy is reported as busy.
SETTLE_LOAD_MAX = 1.0
SETTLE_WAIT_MAX_S = 180


def settle_load() -> None:
    deadline = time.monotonic() + SETTLE_WAIT_MAX_S
    announced = False
    while os.getloadavg()[0] >= SETTLE_LOAD_MAX and time.monotonic() < deadline:
        if not announced:
            print(f"waiting up to {SETTLE_WAIT_MAX_S} s for the load average "
                  f"({os.getloadavg()[0]:.2f}) to fall below {SETTLE_LOAD_MAX}...")
            announced = True
        time.sleep(2)


def dirty_mib() -> float:
    """Page cache waiting for write-back (Dirty + Writeback in /proc/meminfo)."""
    total = 0
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(("Dirty:", "Writeback:")):
                    total += int(line.split()[1])
    except OSError:
        return 0.0
    return total / 1024


def flush_dirty_page_cache(who: str) -> None:
    """Writes back every dirty page (sync) before a measurement: a build or
    benchmark that ended just before leaves hundreds of MiB dirty, and the
    kernel writes them back ~30 s later (vm.dirty_expire_centisecs), in the
    middle of the next run: ~400 MiB of write-back in one second held a
    journal fdatasync 33 ms and a journal write 80-90 ms
    (bench/RESULTS-catch-up.md, session 9)."""
    before = dirty_mib()
    started = time.monotonic()
    os.sync()
    print(f"   {who}: wrote back {before:.0f} MiB of dirty page cache first "
          f"({time.monotonic() - started:.1f} s)", flush=True)


def command_output(cmd: list) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def machine_description(opts: Options) -> dict:
    cpu = ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        mem_kib = next(int(l.split()[1]) for l in open("/proc/meminfo") if l.startswith("MemTotal"))
    except (OSError, StopIteration):
        mem_kib = 0
    df = command_output(["df", "-T", "-h", str(opts.data_root)]).splitlines()
    fs = " ".join(df[1].split()[:3]) if len(df) > 1 else ""
    mount = command_output(["findmnt", "-n", "-o", "SOURCE,FSTYPE,OPTIONS", "-T", str(opts.data_root)])
    dev = (mount.split() or [""])[0]
    rotational = ""
    if dev.startswith("/dev/"):
        name = Path(dev).name
        rot = Path(f"/sys/block/{name}/queue/rotational")
        if rot.exists():
            rotational = (f"{dev}, block device flag rotational={rot.read_text().strip()}"
                          + (" (a virtio disk: the host's storage behind it is not visible)"
                             if name.startswith("vd") else ""))
    pulsar_jar = sorted(PULSAR_LIB.glob("pulsar-broker-[0-9]*.jar")) if PULSAR_LIB.is_dir() else []
    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()
    return {
        "cpu": cpu, "cores": os.cpu_count(), "ram_gib": round(mem_kib / 1024 / 1024, 1),
        "data_dir": str(opts.data_root), "filesystem": fs, "mount": mount, "disk": rotational,
        "kernel": platform.release(),
        "vela": f"{command_output([str(opts.vela), '--version'])} ({opts.vela}; checkout at "
        f"{command_output(['git', '-C', str(ROOT), 'rev-parse', '--short', 'HEAD'])})"
        + (f"; {os.environ['BENCH_NOTE']}" if os.environ.get("BENCH_NOTE") else ""),
        "rustc": command_output(["rustc", "--version"]),
        "java": java[0] if java else "",
        "pulsar": pulsar_jar[0].stem.replace("pulsar-broker-", "Apache Pulsar ") if pulsar_jar else "not installed",
        "python": platform.python_version(),
    }


def report(results, sm, bookie_setups, opts, machine, before, after, markdown) -> str:
    parts = []
    table = md_table if markdown else text_table
    if markdown:
        parts.append("# Vela vs Apache Pulsar: the seed benchmarks\n")
        parts.append("Generated by `bench/run.sh` (bench/bench.py); every figure below comes from "
                     "one run on one machine. Latencies in ms; `P/V` = Pulsar / Vela "
                     "(latency: how many times lower Vela's is), `V/P` = Vela / Pulsar (throughput).\n")
        parts.append("## Machine\n")
        parts.append("\n".join(f"- {k}: {v}" for k, v in machine.items()) + "\n")
        parts.append(f"- run: {opts.duration} s per scenario run, of which {opts.warmup} s "
                     f"warm-up left out; disk test {opts.disk_seconds} s right before each "
                     "standalone starts and right after it stops; `disk p50` in the combined "
                     "table is the lower of the two\n")
        parts.append("## Machine state during the run\n")
        for label, state in (("start", before), ("end", after)):
            la = ", ".join(f"{x:.2f}" for x in state["loadavg"])
            parts.append(f"- {label} ({state['at']}): load average {la}")
            for h in state["heavy"]:
                parts.append(f"  - busy: {h}")
        # The end's load average is this benchmark's own last minute (both
        # cores busy in the batched scenarios): only other processes count there.
        parts.append("- the load average at the end includes this benchmark's own last "
                     "minute; other busy processes are listed as `busy`")
        busy = before["heavy"] or after["heavy"] or before["loadavg"][0] > 1.5
        parts.append("\n" + ("**Other heavy processes shared this 2-core machine during the run: "
                             "latencies (tails above all) are inflated and noisy. Re-run "
                             "`bench/run.sh` on a quiet machine before quoting these numbers.**"
                             if busy else "The machine was quiet (no other heavy process seen).") + "\n")
        parts.append("## Targets (issue 5)\n")
    else:
        parts.append("== Targets (issue 5) ==")
    parts.append(table(TARGET_HEADERS, targets(results, sm, bookie_setups)))
    parts.append("" if not markdown else "")
    parts.append("## Combined\n" if markdown else "\n== Combined (latency ms) ==")
    parts.append(table(COMBINED_HEADERS, combined_rows(results, bookie_setups)))
    if markdown:
        parts.append("\nPulsar columns: the row named in `pulsar client`. Batched throughput: "
                     "pulsar-perf, Pulsar's own tool. Sync and end-to-end latency: `vela perf` on both "
                     "systems, because pulsar-perf measures these differently (with `-o 1` its send "
                     "time is taken before `sendAsync` blocks on the previous message's pending slot, "
                     "so each latency includes the tail of the previous round trip; its consumer "
                     "measures end-to-end latency from the publish time in whole ms). Every row of "
                     "both clients is in the per-scenario tables below.\n")
    pmem_rows = journal_rows(results, bookie_setups)
    if pmem_rows:
        parts.append("\n## Journal backends (same run)\n" if markdown
                     else "\n== Journal backends, same run (latency ms) ==")
        parts.append(table(JOURNAL_HEADERS, pmem_rows))
        parts.append(("\n" if markdown else "") + JOURNAL_NOTE + ("\n" if markdown else ""))
    parts.append("## Startup and memory\n" if markdown else "\n== Startup (spawn to first acknowledged message) and resident memory ==")
    parts.append(table(STARTUP_HEADERS, startup_rows(sm, bookie_setups)))
    if markdown:
        parts.append("\nready: median over every fresh start of the run (one per scenario), from "
                     "spawning the process to the first acknowledged message (probe: `vela perf "
                     "produce -m 1`, retried every 50 ms). idle: VmRSS 3 s after that. load: peak "
                     "VmRSS (sampled every 250 ms) while the async batched 1 KiB producer ran. "
                     f"Pulsar's JVM runs with `{os.environ.get('PULSAR_MEM', PULSAR_MEM_DEFAULT)}` "
                     "(bin/pulsar's default heap; PULSAR_MEM overrides).\n")
        for key, v in sorted(sm.items()):
            parts.append(f"- {key[0]} {BOOKIE_SETUPS[key[1]]}: ready ms per start {v['ready_ms_all']}")
        parts.append("\n## Scenarios\n")
        for res in results:
            parts.append("### " + scenario_table(res, markdown=True) + "\n")
    return "\n".join(parts)


# ------------------------------------------------------------------- main

def main() -> int:
    # Catch-up scenarios (bench/catch_up.py) run apart: a backlog, then drains.
    if len(sys.argv) > 1 and sys.argv[1] in catch_up.SCENARIOS:
        return catch_up.main(sys.argv[1:])
    # Geo-replication (bench/geo_replication.py): two standalones per system.
    if len(sys.argv) > 1 and sys.argv[1] in geo_replication.SCENARIOS:
        return geo_replication.main(sys.argv[1:])
    if len(sys.argv) > 1 and sys.argv[1] in offload.SCENARIOS:
        return offload.main(sys.argv[1:])
    if len(sys.argv) > 1 and sys.argv[1] in txn.SCENARIOS:
        return txn.main(sys.argv[1:])
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scenarios", nargs="*", default=["all"],
                        help=f"scenarios to run: all, or any of {', '.join(SCENARIOS)}")
    parser.add_argument("--systems", default=os.environ.get("BENCH_SYSTEMS", "vela,pulsar"),
                        help="comma-separated: vela, vela-pmem, pulsar (default: vela,pulsar)")
    parser.add_argument("--with-pmem", action="store_true",
                        help="also run vela-pmem: Vela with the pmem journal backend, its region "
                             "on tmpfs in emulation (--pmem-root)")
    parser.add_argument("--pmem-root", type=Path,
                        default=Path(os.environ.get("BENCH_PMEM", PMEM_ROOT_DEFAULT)),
                        help="where vela-pmem's journal regions go, a tmpfs "
                             f"(default {PMEM_ROOT_DEFAULT}; BENCH_PMEM)")
    parser.add_argument("--bookies", default=os.environ.get("BENCH_BOOKIES", "1,3"),
                        help="comma-separated bookie setups: 1, 3 (default: both)")
    parser.add_argument("--duration", type=int, default=int(os.environ.get("BENCH_DURATION", 15)),
                        help="seconds per run, warm-up included (default 15; BENCH_DURATION)")
    parser.add_argument("--warmup", type=int, default=int(os.environ.get("BENCH_WARMUP", 5)),
                        help="seconds of warm-up left out of the figures (default 5; BENCH_WARMUP)")
    parser.add_argument("--long", action="store_true",
                        help="longer runs: 120 s each with 20 s of warm-up, 30 s disk test")
    parser.add_argument("--repeat", type=int, default=int(os.environ.get("BENCH_REPEAT", 3)),
                        help="fan-out scenarios: runs per system, in turns (default 3; BENCH_REPEAT)")
    parser.add_argument("--disk-seconds", type=int,
                        default=int(os.environ.get("BENCH_DISK_SECONDS", 5)))
    parser.add_argument("--data-root", type=Path,
                        default=Path(os.environ.get("BENCH_DATA", ROOT / "target" / "bench-data")),
                        help="where the standalones keep their data (default target/bench-data)")
    parser.add_argument("--out", type=Path, default=ROOT / "target" / "bench-results",
                        help="where results, logs and the plot go (default target/bench-results)")
    parser.add_argument("--markdown", type=Path, help="also write the report as Markdown here")
    parser.add_argument("--update-results", action="store_true",
                        help="after a full run (every scenario, both systems, both setups) "
                             "write bench/RESULTS.md and bench/sync-1k-latency.svg")
    parser.add_argument("--vela", type=Path, default=ROOT / "target" / "release" / "vela")
    parser.add_argument("--keep-data", action="store_true")
    parser.add_argument("--report-from", type=Path, metavar="RESULTS_JSON",
                        help="print (and with --markdown write) the report of an earlier "
                             "run's results.json again, measuring nothing")
    args = parser.parse_args()

    names = list(SCENARIOS) if "all" in args.scenarios else args.scenarios
    full_run = False
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s) {unknown}; known: all, {', '.join(SCENARIOS)}")
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    if args.with_pmem and "vela-pmem" not in systems:
        systems.insert(systems.index("vela") + 1 if "vela" in systems else 0, "vela-pmem")
    if any(s not in SYSTEMS for s in systems):
        parser.error(f"--systems takes {', '.join(SYSTEMS)}")
    bookie_setups = [int(b) for b in args.bookies.split(",") if b.strip()]
    if any(b not in BOOKIE_SETUPS for b in bookie_setups):
        parser.error("--bookies takes 1 and/or 3")
    if args.long:
        args.duration, args.warmup, args.disk_seconds = 120, 20, 30
    full_run = (set(names) == set(SCENARIOS) and set(systems) == {"vela", "pulsar"}
                and set(bookie_setups) == set(BOOKIE_SETUPS))
    if args.update_results and full_run and not args.markdown:
        args.markdown = HERE / "RESULTS.md"
    elif args.update_results:
        print("note: not a full run (every scenario, both systems, both setups): "
              "bench/RESULTS.md is left as it is")
    if args.report_from:
        return report_again(args)
    if args.warmup >= args.duration:
        parser.error("--warmup must be shorter than --duration")
    if not args.vela.is_file():
        parser.error(f"{args.vela} not found: cargo build --release -p vela (bench/run.sh does it)")
    if "pulsar" in systems and not PULSAR_LIB.is_dir():
        parser.error("Apache Pulsar is not installed: run bench/pulsar/install.sh "
                     "(or --systems vela)")

    run_id = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    log_dir = args.out / f"logs-{run_id}"
    log_dir.mkdir(parents=True, exist_ok=True)
    args.data_root.mkdir(parents=True, exist_ok=True)
    opts = Options(args.duration, args.warmup, args.disk_seconds, args.data_root.resolve(),
                   args.vela.resolve(), args.keep_data, False, log_dir, args.pmem_root,
                   args.repeat)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    machine = machine_description(opts)
    settle_load()
    before = machine_state()
    if before["heavy"]:
        print("warning: other busy processes on this machine; latencies will be noisy:")
        for h in before["heavy"]:
            print("  " + h)
    print(f"logs in {log_dir}")
    results = []
    try:
        for name in names:
            results.append(run_scenario(opts, SCENARIOS[name], systems, bookie_setups))
    except Fail as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    finally:
        stop_all_children()
    after = machine_state()

    sm = startup_memory(results, systems, bookie_setups)
    print()
    print(report(results, sm, bookie_setups, opts, machine, before, after, markdown=False))

    raw = {"machine": machine, "state_before": before, "state_after": after,
           "options": {"duration": opts.duration, "warmup": opts.warmup,
                       "disk_seconds": opts.disk_seconds},
           "results": results,
           "startup_memory": {f"{k[0]}-{k[1]}": v for k, v in sm.items()}}
    json_path = args.out / "results.json"
    json_path.write_text(json.dumps(raw, indent=1))
    svg_path = args.out / "sync-1k-latency.svg"
    sync = next((r for r in results if r["scenario"] == "sync-1k"), None)
    if sync:
        series = [(f"{r['system']} {BOOKIE_SETUPS[r['bookies']]} ({r['client']})", r["curve"])
                  for r in sync["rows"] if r["curve"]]
        plot.write_svg(svg_path, "sync 1 KiB publish latency (fsync on; lower is better)", series)
        print(f"\nplot: {svg_path}")
    if args.markdown:
        md = report(results, sm, bookie_setups, opts, machine, before, after, markdown=True)
        if sync:
            md += ("\n## Plot\n\n![sync 1 KiB latency percentiles](sync-1k-latency.svg)\n")
        args.markdown.write_text(md + "\n")
        if sync and args.markdown.parent.resolve() != args.out.resolve():
            shutil.copy(svg_path, args.markdown.parent / svg_path.name)
        print(f"markdown: {args.markdown}")
    print(f"raw results: {json_path}")
    failed = [r for res in results for r in res["rows"] if r["note"].startswith("failed")]
    return 1 if failed else 0


def report_again(args) -> int:
    """The report of an earlier run, from its results.json (after a change to
    the report itself: the figures stay those measured)."""
    raw = json.loads(args.report_from.read_text())
    o = raw["options"]
    opts = Options(o["duration"], o["warmup"], o["disk_seconds"], Path(raw["machine"]["data_dir"]),
                   args.vela, False, False, args.out)
    sm = {}
    for key, value in raw["startup_memory"].items():
        system, bookies = key.rsplit("-", 1)
        sm[(system, int(bookies))] = value
    bookie_setups = sorted({b for _, b in sm})
    before, after, results = raw["state_before"], raw["state_after"], raw["results"]
    print(report(results, sm, bookie_setups, opts, raw["machine"], before, after, markdown=False))
    if args.markdown:
        md = report(results, sm, bookie_setups, opts, raw["machine"], before, after, markdown=True)
        if any(r["scenario"] == "sync-1k" for r in results):
            md += ("\n## Plot\n\n![sync 1 KiB latency percentiles](sync-1k-latency.svg)\n")
        args.markdown.write_text(md + "\n")
        print(f"markdown: {args.markdown}")
    return 0


if __name__ == "__main__":
    import catch_up  # noqa: E402  (bench/catch_up.py; it imports this module)
    import geo_replication  # noqa: E402  (bench/geo_replication.py; likewise)
    import offload  # noqa: E402  (bench/offload.py; likewise)
    import txn  # noqa: E402  (bench/txn.py, transactional produce; likewise)
    sys.exit(main())
