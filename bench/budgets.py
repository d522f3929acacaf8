"""Memory of a server while a benchmark phase runs: its peak resident set,
and for Vela how full each of its memory budgets got (ARCHITECTURE.md,
"Memory model"), read from its own /metrics, next to the budget.

A background thread samples the server's VmRSS every 0.25 s and, for Vela,
scrapes /metrics every second (each budget's gauge and its bound); the
caller names the phase that runs (`phase`). At each scrape it also notes
the anonymous resident memory (RssAnon: heap, stacks; the binary's pages
are RssFile) beyond what the budgets' gauges count at that moment, and
keeps each phase's largest such excess with the parts of the RSS then.
Figures only: nothing here passes or fails a run.
"""

from __future__ import annotations

import re
import threading
import time
import urllib.request

import bench

RSS_SAMPLE_S = 0.25
METRICS_SAMPLE_S = 1.0
# Bytes one held entry costs (index in the subscription's B-trees), as
# ARCHITECTURE.md counts it for --max-unacked-entries-per-broker.
HELD_ENTRY_BYTES = 64
MIB = 1024 * 1024

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)$')
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def scrape(admin_url: str) -> list:
    """/metrics as (name, labels, value) samples; [] when it cannot be read."""
    try:
        with urllib.request.urlopen(f"{admin_url}/metrics", timeout=10) as answer:
            text = answer.read().decode(errors="replace")
    except OSError:
        return []
    samples = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = SAMPLE.match(line)
        if not match:
            continue
        try:
            value = float(match.group(3))
        except ValueError:
            continue
        samples.append((match.group(1), dict(LABEL.findall(match.group(2) or "")), value))
    return samples


def _sum(samples: list, name: str) -> float | None:
    values = [v for n, _, v in samples if n == name]
    return sum(values) if values else None


def _sum_label(samples: list, name: str, label: str) -> float | None:
    values = [float(l[label]) for n, l, _ in samples if n == name and label in l]
    return sum(values) if values else None


def rss_parts_mib(pid: int) -> dict | None:
    """RssAnon, RssFile and RssShmem of `pid` in MiB, None once it is gone."""
    parts = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key = line.split(":")[0]
                if key in ("RssAnon", "RssFile", "RssShmem"):
                    parts[key] = int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return parts or None


def vela_budgets(samples: list) -> dict:
    """Each budget's bound in bytes, as the server reports it (taken while
    idle: the publish buffer's free bytes are then its size). Bookie caches
    are summed over the process's bookies."""
    held_max = _sum(samples, "vela_subscription_held_entries_max")
    budgets = {
        "entry cache": _sum(samples, "vela_entry_cache_budget_bytes"),
        "publish buffer": _sum(samples, "vela_publish_buffer_available_bytes"),
        "read-ahead": _sum_label(samples, "vela_read_ahead_bytes", "max"),
        "held entries": held_max * HELD_ENTRY_BYTES if held_max is not None else None,
        "bookie write cache": _sum_label(samples, "vela_bookie_write_cache_bytes", "max"),
        "bookie read cache": _sum_label(samples, "vela_bookie_read_cache_bytes", "max"),
    }
    return {k: v for k, v in budgets.items() if v is not None}


def vela_usage(samples: list, budgets: dict) -> dict:
    """How many bytes of each budget are in use now."""
    held = _sum(samples, "vela_subscription_held_entries")
    available = _sum(samples, "vela_publish_buffer_available_bytes")
    publish = budgets.get("publish buffer")
    usage = {
        "entry cache": _sum(samples, "pulsar_ml_cache_used_size"),
        "publish buffer": publish - available if publish is not None and available is not None
        else None,
        "read-ahead": _sum(samples, "vela_read_ahead_bytes"),
        "held entries": held * HELD_ENTRY_BYTES if held is not None else None,
        "bookie write cache": _sum(samples, "vela_bookie_write_cache_bytes"),
        "bookie read cache": _sum(samples, "vela_bookie_read_cache_bytes"),
    }
    return {k: v for k, v in usage.items() if v is not None}


class MemoryWatch:
    """Samples `server` in the background until `stop`; peaks per phase."""

    def __init__(self, server: bench.Server):
        self.server = server
        self.vela = server.system.startswith("vela")
        self.budgets = vela_budgets(scrape(server.admin_url)) if self.vela else {}
        self.idle_rss_mib = bench.rss_mib(server.pid)
        self.phases: dict = {}
        self._current: str | None = None
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def phase(self, name: str | None) -> None:
        """From now on samples count for phase `name` (None: for none)."""
        with self._lock:
            self._current = name
            if name is not None:
                self.phases.setdefault(name, {"rss_peak_mib": None, "usage_peak_mib": {},
                                          "beyond_gauges": None})

    def _record(self, rss: float | None, usage: dict, parts: dict | None = None) -> None:
        with self._lock:
            if self._current is None:
                return
            figures = self.phases[self._current]
            if usage and parts and "RssAnon" in parts:
                counted = sum(usage.values()) / MIB
                beyond = parts["RssAnon"] - counted
                seen = figures.get("beyond_gauges")
                if seen is None or beyond > seen["anon_beyond_mib"]:
                    figures["beyond_gauges"] = {"anon_beyond_mib": beyond,
                                                "gauges_mib": counted, **parts}
            if rss is not None:
                peak = figures["rss_peak_mib"]
                figures["rss_peak_mib"] = rss if peak is None else max(peak, rss)
            for name, used in usage.items():
                mib = used / MIB
                peaks = figures["usage_peak_mib"]
                peaks[name] = max(peaks.get(name, mib), mib)

    def _run(self) -> None:
        next_scrape = 0.0
        while not self._stopped.is_set():
            usage = {}
            parts = None
            if self.vela and time.monotonic() >= next_scrape:
                next_scrape = time.monotonic() + METRICS_SAMPLE_S
                usage = vela_usage(scrape(self.server.admin_url), self.budgets)
                parts = rss_parts_mib(self.server.pid)
            self._record(bench.rss_mib(self.server.pid), usage, parts)
            self._stopped.wait(RSS_SAMPLE_S)

    def stop(self) -> dict:
        """Stops sampling; the figures (JSON-ready)."""
        self._stopped.set()
        self._thread.join(timeout=30)
        return {
            "idle_rss_mib": self.idle_rss_mib,
            "budgets_mib": {k: v / MIB for k, v in self.budgets.items()},
            "phases": self.phases,
        }


def lines(system: str, memory: dict) -> list:
    """The report: per phase the peak RSS against the sum of the budgets,
    and each budget's peak use against its bound."""
    out = []
    budgets = memory.get("budgets_mib", {})
    total = sum(budgets.values())
    idle = memory.get("idle_rss_mib")
    head = f"   {system} memory: idle RSS {bench.fmt(idle, 0)} MiB"
    if budgets:
        head += (f"; budgets {total:,.0f} MiB in all ("
                 + ", ".join(f"{k} {v:,.0f}" for k, v in budgets.items()) + ")")
    out.append(head)
    for phase, figures in memory.get("phases", {}).items():
        rss = figures.get("rss_peak_mib")
        line = f"     {phase:<22} peak RSS {bench.fmt(rss, 0)} MiB"
        if budgets and rss is not None:
            line += f" ({rss / total:.0%} of the budgets)"
        used = figures.get("usage_peak_mib", {})
        if used:
            line += "; peak use: " + ", ".join(
                f"{k} {v:,.1f}/{budgets[k]:,.0f}" if k in budgets else f"{k} {v:,.1f}"
                for k, v in used.items())
        out.append(line)
        beyond = figures.get("beyond_gauges")
        if beyond:
            out.append(f"     {'':<22} anonymous RSS beyond the gauges at most "
                       f"{beyond['anon_beyond_mib']:,.0f} MiB (then: RssAnon "
                       f"{beyond.get('RssAnon', 0):,.0f}, gauges {beyond['gauges_mib']:,.0f}, "
                       f"RssFile {beyond.get('RssFile', 0):,.0f}, RssShmem "
                       f"{beyond.get('RssShmem', 0):,.0f})")
    return out
