#!/usr/bin/env python3
"""The OpenMessaging Benchmark (OMB) against Vela and Apache Pulsar, same run.

    bench/omb/run.py <omb-snapshot> [workload ...] [--systems vela,pulsar] [--long]

<omb-snapshot> is OMB's repository as the search tool's `fetch` brings it (a
bare git dir) or a checkout. OMB is never committed here: its files are
extracted at run time into target/omb/<commit>/ (git-ignored), its poms are
patched there (only driver-api, driver-pulsar and benchmark-framework are
built; driver-pulsar on the shaded pulsar-client-admin of the Pulsar version
under test instead of pulsar-client-all 2.11; Java 17 bytecode; OMB's style
and licence checks left out) and built with Maven once per commit.

For each workload and each system in turn: a fresh standalone (1 bookie,
fresh data directory under --data-root, free ports on 127.0.0.1, started by
bench/bench.py's server classes), then OMB in local mode (one JVM:
`bin/benchmark --drivers driver.yaml workload.yaml`, no workers) with OMB's
own driver-pulsar/pulsar.yaml pointed at the standalone, then the standalone
is stopped and its data deleted. Prints one table per workload with
Vela / Pulsar ratios. Workloads: `backlog` (OMB's backlog shape, scaled to
2 GiB), `tail-50k` (1 topic, 1 KiB, 50k msg/s: 2 minutes, 10 with --long),
or the path of any OMB workload yaml. See bench/omb/README.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCH = HERE.parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))
import bench  # noqa: E402  (bench/bench.py: servers, process care, tables)

WORKLOAD_DIR = HERE / "workloads"
WORKLOADS = {
    "backlog": ("backlog-1-topic-1-partition-1kb-2gb.yaml",) * 2,
    # (default, --long)
    "tail-50k": ("1-topic-1-partition-1kb-50k-2min.yaml",
                 "1-topic-1-partition-1kb-50k-10min.yaml"),
}
DEFAULT_WORKLOADS = ("backlog", "tail-50k")
SYSTEMS = ("vela", "pulsar")
# The Pulsar client OMB's driver is built on: the version of the Pulsar
# under test (bench/pulsar/pom.xml), shaded (its netty, jackson etc. are
# relocated, so nothing clashes with OMB's own dependencies).
PULSAR_CLIENT_ARTIFACT = "pulsar-client-admin"
PULSAR_CLIENT_VERSION = "4.0.8"
# What OMB's snapshot is built from; bump when the patching changes, so an
# old build is not reused.
PATCH_VERSION = "1"
OMB_PATHS = ("pom.xml", "driver-api", "driver-pulsar", "benchmark-framework", "bin", "payload")
KEPT_MODULES = ("driver-api", "driver-pulsar", "benchmark-framework")
# OMB's build checks (formatting, licence headers, static analysis, coverage,
# Maven version): left out of the extracted copy, they need plugins of
# their own and check nothing we run.
DROPPED_PLUGINS = ("spotless-maven-plugin", "spotbugs-maven-plugin", "license-maven-plugin",
                   "maven-checkstyle-plugin", "maven-enforcer-plugin", "maven-failsafe-plugin",
                   "jacoco-maven-plugin")
# Retention that lets the disk hold a run (applied to both systems alike):
# a full ledger rolls over after 1 minute instead of 10, so consumed ledgers
# are deleted during the run, and storage GC runs every 60 s (Vela's
# default; Pulsar's standalone waits 15 minutes); Pulsar's bookie keeps no
# journal files past a checkpoint (5 by default, 2 GB each).
LEDGER_MIN_ROLLOVER_MINUTES = 1
VELA_EXTRA_FLAGS = ["--ledger-min-rollover-minutes", str(LEDGER_MIN_ROLLOVER_MINUTES)]
PULSAR_EXTRA_CONF = (
    f"managedLedgerMinLedgerRolloverTimeMinutes={LEDGER_MIN_ROLLOVER_MINUTES}\n"
    "gcWaitTime=60000\n"
    "journalMaxBackups=0\n"
)
# A run stops when the data directory's disk gets this close to the point
# where Vela's bookies turn read-only (room_gib).
MIN_ROOM_DURING_GIB = 3.0
# A run also stops when the machine's MemAvailable falls below this: with
# --data-root on tmpfs the data is memory (Pulsar's data directory reached
# 15 GiB in a 10-minute 50k msg/s run), and the machine is shared.
MIN_MEM_AVAILABLE_GIB = 4.0
# What a run keeps on disk (space_needed_gib): minutes of writes in ledger
# storage, and the journals' share.
RETAINED_MINUTES = 2.5
JOURNAL_GIB = 2.0
# Vela's bookies turn read-only at this share of the disk in use
# (--disk-usage-max-percent), counted as `df` counts Use%.
BOOKIE_DISK_USAGE_MAX = 0.95
# Publish latencies over this count as stalls (issue 19's bound).
STALL_MS = 5.0


class OmbFail(bench.Fail):
    pass


# ------------------------------------------------------------------ build

def git(snapshot: Path, *args, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(snapshot), *args], check=True, **kwargs)


def replace_once(text: str, pattern: str, repl: str, what: str, count: int = 1) -> str:
    new, n = re.subn(pattern, repl, text, flags=re.S)
    if n < count:
        raise OmbFail(f"patching OMB: {what} not found (pattern {pattern!r}); "
                      "the snapshot's poms differ from what bench/omb/run.py knows")
    return new


def patch_poms(src: Path) -> None:
    """Trims the extracted copy to the Pulsar driver and the framework."""
    root_pom = src / "pom.xml"
    text = root_pom.read_text()
    modules = "".join(f"\n        <module>{m}</module>" for m in KEPT_MODULES)
    text = replace_once(text, r"<modules>.*?</modules>",
                        f"<modules>{modules}\n    </modules>", "<modules>")
    for plugin in DROPPED_PLUGINS:
        text = replace_once(
            text, r"\n\s*<plugin>(?:(?!</plugin>).)*?<artifactId>" + re.escape(plugin)
            + r"</artifactId>.*?</plugin>", "", f"plugin {plugin}")
    # The Pulsar 4 client is Java 17 bytecode: javac --release 8 cannot read it.
    for tag in ("source", "target", "release"):
        text = replace_once(text, f"<{tag}>8</{tag}>", f"<{tag}>17</{tag}>", f"<{tag}>8")
    root_pom.write_text(text)

    framework_pom = src / "benchmark-framework" / "pom.xml"
    text = framework_pom.read_text()

    def keep_driver(match: re.Match) -> str:
        name = match.group(1)
        return match.group(0) if name in KEPT_MODULES else ""

    text = re.sub(r"\n\s*<dependency>\s*<groupId>\$\{project\.groupId\}</groupId>\s*"
                  r"<artifactId>(driver-[\w-]+)</artifactId>.*?</dependency>",
                  keep_driver, text, flags=re.S)
    if "<artifactId>driver-pulsar</artifactId>" not in text:
        raise OmbFail("patching OMB: benchmark-framework no longer depends on driver-pulsar")
    framework_pom.write_text(text)

    driver_pom = src / "driver-pulsar" / "pom.xml"
    text = driver_pom.read_text()
    text = replace_once(text, r"<artifactId>pulsar-client-all</artifactId>",
                        f"<artifactId>{PULSAR_CLIENT_ARTIFACT}</artifactId>", "pulsar-client-all")
    text = replace_once(text, r"<pulsar\.version>[^<]*</pulsar\.version>",
                        f"<pulsar.version>{PULSAR_CLIENT_VERSION}</pulsar.version>",
                        "<pulsar.version>")
    driver_pom.write_text(text)


def build_omb(snapshot: Path, ref: str, log_dir: Path) -> Path:
    """Extracts OMB at `ref` into target/omb/<commit>/, patches and builds it
    (once per commit and patch version); returns that directory."""
    if not snapshot.exists():
        raise OmbFail(f"OMB snapshot {snapshot} does not exist")
    commit = git(snapshot, "rev-parse", "--verify", f"{ref}^{{commit}}",
                 capture_output=True, text=True).stdout.strip()
    src = ROOT / "target" / "omb" / commit[:12]
    stamp = src / f".built-{PATCH_VERSION}-{PULSAR_CLIENT_ARTIFACT}-{PULSAR_CLIENT_VERSION}"
    if stamp.exists():
        print(f"OMB {commit[:12]} already built in {src}")
        return src
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    archive = subprocess.Popen(["git", "-C", str(snapshot), "archive", commit, *OMB_PATHS],
                               stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(src)], stdin=archive.stdout, check=True)
    if archive.wait() != 0:
        raise OmbFail(f"git archive of {commit} in {snapshot} failed")
    patch_poms(src)
    log = log_dir / "omb-build.log"
    print(f"building OMB {commit[:12]} (driver-api, driver-pulsar, benchmark-framework; "
          f"{PULSAR_CLIENT_ARTIFACT} {PULSAR_CLIENT_VERSION}); log {log}", flush=True)
    with open(log, "wb") as out:
        # bench/pulsar/settings.xml: every repository the poms name (Pulsar's
        # name several) is mirrored to Maven Central.
        result = subprocess.run(["mvn", "-B", "-s", str(bench.PULSAR_HOME / "settings.xml"),
                                 "-Dmaven.test.skip=true", "package"],
                                cwd=src, stdout=out, stderr=subprocess.STDOUT)
    if result.returncode != 0:
        raise OmbFail(f"building OMB failed:\n{bench.tail(log, 30)}")
    if not (src / "benchmark-framework" / "target" / "classpath.txt").exists():
        raise OmbFail(f"OMB built without benchmark-framework/target/classpath.txt; see {log}")
    stamp.touch()
    return src


# ---------------------------------------------------------------- servers

class OmbVela(bench.VelaServer):
    """`vela standalone`, 1 bookie, with the run's retention flags."""

    def journal_args(self) -> list:
        # bench.VelaServer appends these to its command line.
        return super().journal_args() + VELA_EXTRA_FLAGS


class OmbPulsar(bench.PulsarServer):
    """Pulsar standalone from bench/pulsar/standalone.conf.in, with the
    run's retention settings appended."""

    def write_config(self, broker_port: int, web_port: int) -> Path:
        conf = super().write_config(broker_port, web_port)
        with open(conf, "a") as out:
            out.write("\n# bench/omb/run.py: retention that fits the disk\n" + PULSAR_EXTRA_CONF)
        return conf


SERVERS = {"vela": OmbVela, "pulsar": OmbPulsar}


def cluster_name(server: bench.Server) -> str:
    with urllib.request.urlopen(f"{server.admin_url}/admin/v2/clusters", timeout=30) as answer:
        clusters = json.load(answer)
    if not clusters:
        raise OmbFail(f"{server.system} lists no cluster at /admin/v2/clusters")
    return clusters[0]


def driver_yaml(omb: Path, server: bench.Server, out: Path) -> Path:
    """OMB's driver-pulsar/pulsar.yaml, pointed at `server` (service and HTTP
    URL, its cluster, E=Qw=Qa=1 for one bookie); every other setting as OMB
    ships it."""
    text = (omb / "driver-pulsar" / "pulsar.yaml").read_text()
    settings = {
        "serviceUrl": server.service_url, "httpUrl": server.admin_url,
        "clusterName": cluster_name(server),
        "ensembleSize": "1", "writeQuorum": "1", "ackQuorum": "1",
    }
    for key, value in settings.items():
        text = replace_once(text, rf"(\n\s*{key}:)[^\n]*", rf"\g<1> {value}",
                            f"driver setting {key}")
    text = replace_once(text, r"\nname: [^\n]*", f"\nname: {server.system}", "driver name")
    out.write_text(text)
    return out


# ------------------------------------------------------------------ runs

def room_gib(path: Path) -> float:
    """Space left on `path` before Vela's bookies turn read-only: used is
    counted against used + available, as `df`'s Use% and the bookie's disk
    check (crates/bookie/src/disk.rs) count it."""
    st = os.statvfs(path)
    used = st.f_blocks - st.f_bfree
    total = used + st.f_bavail
    return max(0.0, st.f_bavail - (1.0 - BOOKIE_DISK_USAGE_MAX) * total) * st.f_frsize / 2**30


def mem_available_gib() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        return None
    return None


def dir_gib(path: Path) -> float:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
            except OSError:
                pass
    return total / 2**30


def workload_settings(path: Path) -> dict:
    """The flat `key: value` lines of an OMB workload yaml (all it uses)."""
    out = {}
    for line in path.read_text().splitlines():
        match = re.match(r"^(\w+):\s*(.*?)\s*$", line)
        if match:
            out[match.group(1)] = match.group(2).strip('"')
    return out


def space_needed_gib(wl: dict) -> float:
    """Room a run needs before it starts. With ledgers rolling over after a
    minute and GC every minute, ledger storage holds about the last 2.5
    minutes of writes (the ledger being written, a consumed one waiting for
    the GC pass) plus any backlog; the journals hold up to 2 GiB more."""
    rate_bps = float(wl.get("producerRate", 0)) * float(wl.get("messageSize", 1024))
    minutes = float(wl.get("warmupDurationMinutes", 1)) + float(wl.get("testDurationMinutes", 1))
    backlog = float(wl.get("consumerBacklogSizeGB", 0))
    retained = rate_bps * 60 * min(minutes, RETAINED_MINUTES) / 2**30
    return retained + backlog + JOURNAL_GIB + 1.0


def run_omb(omb: Path, system: str, workload: Path, opts: bench.Options, tag: str) -> dict:
    wl = workload_settings(workload)
    need = space_needed_gib(wl)
    room = room_gib(opts.data_root)
    if room < need:
        raise OmbFail(f"{room:.1f} GiB left on {opts.data_root} before the bookies' 95% "
                      f"limit; {workload.name} needs about {need:.0f} GiB")
    data_dir = opts.data_root / f"omb-{tag}-{system}"
    shutil.rmtree(data_dir, ignore_errors=True)
    server = SERVERS[system](1, data_dir, opts)
    row = {"system": system, "workload": workload.name, "load_before": os.getloadavg(),
           "room_gib_before": round(room, 1)}
    try:
        server.start()
        row["ready_ms"] = server.ready_ms
        drivers = driver_yaml(omb, server, opts.log_dir / f"{tag}-{system}.driver.yaml")
        result_path = opts.log_dir / f"{tag}-{system}.result.json"
        result_path.unlink(missing_ok=True)
        log = opts.log_dir / f"{tag}-{system}.omb.log"
        log.unlink(missing_ok=True)
        stages_before = bench.write_path_buckets(server) if system == "vela" else ([], {})
        env = dict(os.environ, HEAP_OPTS=os.environ.get("OMB_HEAP_OPTS", "-Xms2G -Xmx2G"))
        proc = bench.spawn(["bash", "bin/benchmark", "--drivers", drivers,
                            "--output", result_path, workload], log, cwd=omb, env=env)
        timeout = 60 * (float(wl.get("warmupDurationMinutes", 1))
                        + float(wl.get("testDurationMinutes", 1))) + 300
        if float(wl.get("consumerBacklogSizeGB", 0)) > 0:
            timeout += 1800
        row.update(watch(proc, server, opts, timeout, log))
        if system == "vela":
            bounds, after = bench.write_path_buckets(server)
            row["vela_stages_ms"] = bench.stage_percentiles(bounds, stages_before[1], after)
        row["load_after"] = os.getloadavg()
        row["omb_log"] = str(log)
        row.update(parse_log(log))
        if not result_path.exists():
            raise OmbFail(f"OMB wrote no result for {system}:\n{bench.tail(log, 25)}")
        row.update(figures(json.loads(result_path.read_text()), wl, row))
    finally:
        server.stop()
    return row


def watch(proc: subprocess.Popen, server: bench.Server, opts: bench.Options,
          timeout: float, log: Path) -> dict:
    """Waits for OMB, sampling the server's RSS; stops OMB when it overruns
    or the disk runs out of room."""
    peak_rss, least_room, peak_data = None, None, 0.0
    deadline = time.monotonic() + timeout
    ticks = 0
    while proc.poll() is None:
        ticks += 1
        if ticks % 5 == 0:
            peak_data = max(peak_data, dir_gib(server.data_dir))
        rss = bench.rss_mib(server.pid)
        if rss is not None:
            peak_rss = max(peak_rss or 0.0, rss)
        room = room_gib(opts.data_root)
        least_room = room if least_room is None else min(least_room, room)
        if room < MIN_ROOM_DURING_GIB:
            bench.stop(proc)
            raise OmbFail(f"stopped OMB: {room:.1f} GiB left before the bookies' disk limit")
        mem = mem_available_gib()
        if mem is not None and mem < MIN_MEM_AVAILABLE_GIB:
            bench.stop(proc)
            raise OmbFail(f"stopped OMB: the machine has {mem:.1f} GiB of memory available "
                          f"(at least {MIN_MEM_AVAILABLE_GIB:g} kept free)")
        if time.monotonic() > deadline:
            bench.stop(proc)
            raise OmbFail(f"OMB did not finish in {timeout:.0f} s:\n{bench.tail(log, 25)}")
        time.sleep(1.0)
    bench.CHILDREN.discard(proc)
    return {"server_peak_rss_mib": peak_rss, "least_room_gib": least_room,
            "data_peak_gib": peak_data,
            "omb_exit": proc.returncode}


BUILD_RE = re.compile(r"Completed backlog build in ([\d.]+) s")
DRAIN_RE = re.compile(r"Completed backlog draining in ([\d.]+) s")
# What OMB or the Pulsar client logged as a failure (a request the broker
# refused shows up here).
ERROR_RE = re.compile(r"\b(ERROR|Exception)\b")


def parse_log(log: Path) -> dict:
    text = log.read_text(errors="replace")
    out: dict = {"errors": []}
    if m := BUILD_RE.search(text):
        out["backlog_build_s"] = float(m.group(1))
    if m := DRAIN_RE.search(text):
        out["backlog_drain_s"] = float(m.group(1))
    for line in text.splitlines():
        if ERROR_RE.search(line) and len(out["errors"]) < 20:
            out["errors"].append(line.strip()[:400])
    if "Failed to run the workload" in text:
        raise OmbFail(f"OMB failed to run the workload:\n{bench.tail(log, 30)}")
    return out


def figures(result: dict, wl: dict, row: dict) -> dict:
    """The figures of one OMB result JSON (rates from its 10-s periods
    after warm-up; latencies from its aggregated histograms)."""
    def mean(values):
        return statistics.fmean(values) if values else None

    periods_max = result.get("publishLatencyMax", [])
    out = {
        "publish_rate": mean(result.get("publishRate", [])),
        "publish_errors": sum(r * 10 for r in result.get("publishErrorRate", [])),
        "consume_rate": mean(result.get("consumeRate", [])),
        "consume_rate_peak": max(result.get("consumeRate", []), default=None),
        "publish_ms": {q: result.get(f"aggregatedPublishLatency{k}") for q, k in
                       (("p50", "50pct"), ("p99", "99pct"), ("p99.9", "999pct"),
                        ("p99.99", "9999pct"), ("max", "Max"))},
        "publish_delay_max_ms": result.get("aggregatedPublishDelayLatencyMax", 0) / 1000.0,
        "e2e_ms": {q: result.get(f"aggregatedEndToEndLatency{k}") for q, k in
                   (("p50", "50pct"), ("p99", "99pct"), ("max", "Max"))},
        "periods": len(periods_max),
        "periods_publish_max_ms": periods_max,
        "periods_over_stall": sum(1 for v in periods_max if v > STALL_MS),
    }
    backlog_gib = float(wl.get("consumerBacklogSizeGB", 0))
    if backlog_gib > 0:
        messages = backlog_gib * 2**30 / float(wl.get("messageSize", 1024))
        out["backlog_messages"] = messages
        if row.get("backlog_build_s"):
            out["backlog_build_rate"] = messages / row["backlog_build_s"]
        if row.get("backlog_drain_s"):
            # How fast the backlog shrank while the producer went on; what
            # the consumer took is that plus the publish rate.
            out["backlog_drain_rate"] = messages / row["backlog_drain_s"]
            if out["publish_rate"]:
                out["drain_consume_rate"] = out["backlog_drain_rate"] + out["publish_rate"]
    return out


# ----------------------------------------------------------------- report

def cell(value, digits: int = 1) -> str:
    if value is None:
        return "-"
    if digits == 0:
        return f"{value:,.0f}"
    return f"{value:,.{digits}f}"


def table_rows(rows: dict) -> list:
    """One line per figure: each system's value, then Vela / Pulsar."""
    def get(row, *path):
        value = row
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        return value

    lines = [
        ("publish rate (msg/s)", ("publish_rate",), 0),
        ("publish errors (10-s rates x 10 s)", ("publish_errors",), 0),
        ("publish p50 (ms)", ("publish_ms", "p50"), 2),
        ("publish p99 (ms)", ("publish_ms", "p99"), 2),
        ("publish p99.9 (ms)", ("publish_ms", "p99.9"), 2),
        ("publish p99.99 (ms)", ("publish_ms", "p99.99"), 2),
        ("publish max (ms)", ("publish_ms", "max"), 1),
        (f"10-s periods with a publish > {STALL_MS:g} ms", ("periods_over_stall",), 0),
        ("publish delay max (ms)", ("publish_delay_max_ms",), 1),
        ("end-to-end p50 (ms)", ("e2e_ms", "p50"), 1),
        ("end-to-end p99 (ms)", ("e2e_ms", "p99"), 1),
        ("consume rate, mean of 10-s periods (msg/s)", ("consume_rate",), 0),
        ("backlog build (s)", ("backlog_build_s",), 1),
        ("backlog build rate (msg/s)", ("backlog_build_rate",), 0),
        ("backlog drain (s)", ("backlog_drain_s",), 1),
        ("backlog drain rate (backlog msg/s)", ("backlog_drain_rate",), 0),
        ("consume rate during drain (msg/s)", ("drain_consume_rate",), 0),
        ("consume rate, best 10-s period (msg/s)", ("consume_rate_peak",), 0),
        ("server peak RSS (MiB)", ("server_peak_rss_mib",), 0),
        ("data directory peak (GiB, sampled every 5 s)", ("data_peak_gib",), 1),
    ]
    out = []
    for label, path, digits in lines:
        values = {s: get(r, *path) for s, r in rows.items()}
        if all(v is None for v in values.values()):
            continue
        cells = [cell(values.get(s), digits) for s in SYSTEMS if s in rows]
        ratio = (bench.ratio(values.get("vela"), values.get("pulsar"))
                 if "vela" in rows and "pulsar" in rows else "-")
        out.append([label, *cells, ratio])
    return out


def report(tag: str, title: str, rows: dict) -> str:
    systems = [s for s in SYSTEMS if s in rows]
    parts = [f"\n== {tag}: {title} ==",
             bench.text_table(["figure", *systems, "vela/pulsar"], table_rows(rows))]
    for system in systems:
        row = rows[system]
        if "error" in row:
            parts.append(f"{system}: FAILED: {row['error']}")
            continue
        lb, la = row.get("load_before"), row.get("load_after")
        parts.append(
            f"{system}: load average {lb[0]:.2f} before, {la[0]:.2f} after (1 min); "
            f"{row.get('periods')} 10-s periods; per-period publish max (ms): "
            + " ".join(f"{v:.0f}" for v in row.get("periods_publish_max_ms", [])))
        stages = row.get("vela_stages_ms") or {}
        if stages:
            parts.append("  vela write-path stages over the OMB run (bucket bounds, ms): "
                         + "; ".join(f"{s} p50 {v.get('p50')} p99 {v.get('p99')} "
                                     f"max {v.get('max')}" for s, v in stages.items()))
        if row.get("errors"):
            parts.append(f"  {len(row['errors'])} ERROR/Exception lines in {row['omb_log']}, "
                         f"first: {row['errors'][0][:300]}")
    parts.append("rates: higher is better; latencies: lower is better; the ratio is "
                 "Vela's figure over Pulsar's")
    return "\n".join(parts)


# ------------------------------------------------------------------- main

def resolve_workloads(names: list, long: bool) -> list:
    out = []
    for name in names or DEFAULT_WORKLOADS:
        if name in WORKLOADS:
            path = WORKLOAD_DIR / WORKLOADS[name][1 if long else 0]
            out.append((name, path))
        else:
            path = Path(name).resolve()
            if not path.is_file():
                raise OmbFail(f"unknown workload {name!r}: one of {', '.join(WORKLOADS)} "
                              "or the path of an OMB workload yaml")
            out.append((path.stem, path))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("snapshot", type=Path, help="OMB's repository (bare git dir or checkout)")
    parser.add_argument("workloads", nargs="*",
                        help=f"{', '.join(WORKLOADS)} or OMB workload yaml paths "
                             f"(default: {' '.join(DEFAULT_WORKLOADS)})")
    parser.add_argument("--ref", default="HEAD", help="OMB commit to build (default HEAD)")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--long", action="store_true",
                        help="tail-50k for 10 minutes instead of 2 (issue 19's stall check)")
    parser.add_argument("--vela", type=Path,
                        default=Path(os.environ.get("VELA_BIN", ROOT / "target/release/vela")),
                        help="vela binary (default $VELA_BIN or target/release/vela)")
    parser.add_argument("--pulsar-dist", type=Path, default=bench.PULSAR_HOME / "dist",
                        help="Pulsar install (lib/ of jars; default bench/pulsar/dist, "
                             "installed by bench/pulsar/install.sh when missing)")
    parser.add_argument("--data-root", type=Path, default=Path("/tmp/vela-omb"))
    parser.add_argument("--out", type=Path, default=ROOT / "target" / "omb" / "results")
    parser.add_argument("--keep-data", action="store_true")
    parser.add_argument("--build-only", action="store_true",
                        help="extract, patch and build OMB, then stop")
    args = parser.parse_args()

    systems = [s for s in args.systems.split(",") if s]
    for s in systems:
        if s not in SYSTEMS:
            parser.error(f"--systems: unknown system {s!r} (vela, pulsar)")
    signal.signal(signal.SIGINT, bench.on_signal)
    signal.signal(signal.SIGTERM, bench.on_signal)
    try:
        workloads = resolve_workloads(args.workloads, args.long)
        if "vela" in systems and not os.access(args.vela, os.X_OK):
            raise OmbFail(f"no vela binary at {args.vela} (cargo build --release -p vela, "
                          "or --vela / VELA_BIN)")
        if "pulsar" in systems:
            if not (args.pulsar_dist / "lib").is_dir():
                if args.pulsar_dist != bench.PULSAR_HOME / "dist":
                    raise OmbFail(f"no Pulsar jars in {args.pulsar_dist}/lib")
                subprocess.run([str(bench.PULSAR_HOME / "install.sh")], check=True)
            bench.PULSAR_LIB = args.pulsar_dist / "lib"
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
        log_dir = args.out / stamp
        log_dir.mkdir(parents=True, exist_ok=True)
        args.data_root.mkdir(parents=True, exist_ok=True)
        omb = build_omb(args.snapshot.resolve(), args.ref, log_dir)
        if args.build_only:
            print(f"OMB built in {omb}")
            return 0
        opts = bench.Options(duration=0, warmup=0, disk_seconds=0, data_root=args.data_root,
                             vela=args.vela.resolve(), keep_data=args.keep_data, verbose=False,
                             log_dir=log_dir)
    except (OmbFail, bench.Fail, subprocess.CalledProcessError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1

    print(f"machine: {os.cpu_count()} cores, load average "
          + " ".join(f"{v:.2f}" for v in os.getloadavg()) + f"; logs and results in {log_dir}")
    results, reports = [], []
    for tag, path in workloads:
        title = workload_settings(path).get("name", path.name)
        rows = {}
        for system in systems:
            print(f"-- {tag} on {system} ({path.name}) ...", flush=True)
            started = time.monotonic()
            try:
                rows[system] = run_omb(omb, system, path, opts, tag)
            except bench.Fail as error:
                print(f"   {system} failed: {error}", flush=True)
                rows[system] = {"system": system, "workload": path.name, "error": str(error)}
            print(f"   {system} done in {time.monotonic() - started:.0f} s", flush=True)
        results.append({"tag": tag, "workload": str(path), "title": title, "rows": rows})
        reports.append(report(tag, title, rows))
        print(reports[-1], flush=True)
        (log_dir / "results.json").write_text(json.dumps(results, indent=1))
    print("\n".join(reports))
    print(f"\nresults: {log_dir / 'results.json'}")
    return 0 if all("error" not in r for res in results for r in res["rows"].values()) else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    finally:
        bench.stop_all_children()
