"""What else ran on the machine during a measurement window: every process
outside this benchmark's own process tree (kernel threads left out) that
used CPU or did disk I/O in the window, from /proc, sampled every 0.25 s by
a background thread. A latency figure taken while another engineer's server
or build ran is a loaded-machine figure: `bench.machine_state()` looks only
at the start of a run, this covers the whole window.

    watch = ForeignActivity()   # starts sampling
    ... the measured phase ...
    found = watch.stop()        # [{"pid", "comm", "cpu_s", "io_mib"}, ...]
    print(describe(found))

Linux only (an empty list elsewhere). Figures only, never a pass/fail.
"""

from __future__ import annotations

import os
import threading
import time

SAMPLE_INTERVAL_S = 0.25
# Below these a process is noise (a shell, a sampler, an idle daemon).
CPU_S_MIN = 0.05
IO_MIB_MIN = 1.0


def _read_procs() -> dict:
    """pid -> (ppid, comm, cpu ticks, read+write bytes, is a kernel thread)."""
    procs = {}
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return procs
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
            comm = stat[stat.index("(") + 1:stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2:].split()
            ppid = int(fields[1])
            ticks = int(fields[11]) + int(fields[12])
            kernel = ppid == 2 or pid == "2"
            io = 0
            try:
                with open(f"/proc/{pid}/io") as f:
                    for line in f:
                        if line.startswith(("read_bytes:", "write_bytes:")):
                            io += int(line.split()[1])
            except OSError:
                pass
            procs[int(pid)] = (ppid, comm, ticks, io, kernel)
        except (OSError, ValueError, IndexError):
            continue
    return procs


def _ours(procs: dict, root: int) -> set:
    """`root` and its descendants."""
    children: dict = {}
    for pid, (ppid, *_rest) in procs.items():
        children.setdefault(ppid, []).append(pid)
    ours, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid in ours:
            continue
        ours.add(pid)
        todo.extend(children.get(pid, []))
    return ours


class ForeignActivity:
    """Samples /proc until `stop()`; sums each foreign process's CPU time and
    disk bytes between consecutive samples (a process first seen counts from
    then on)."""

    def __init__(self, root_pid: int | None = None):
        self.root = root_pid if root_pid is not None else os.getpid()
        self.hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self.totals: dict = {}
        self.started = time.monotonic()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        before = _read_procs()
        while not self.done.wait(SAMPLE_INTERVAL_S):
            now = _read_procs()
            ours = _ours(now, self.root)
            for pid, (_ppid, comm, ticks, io, kernel) in now.items():
                old = before.get(pid)
                if kernel or pid in ours or old is None:
                    continue
                cpu, moved = ticks - old[2], io - old[3]
                if cpu <= 0 and moved <= 0:
                    continue
                total = self.totals.setdefault(pid, [comm, 0, 0])
                total[1] += max(cpu, 0)
                total[2] += max(moved, 0)
            before = now

    def stop(self) -> list:
        """The foreign processes that used CPU or did I/O, busiest first."""
        self.done.set()
        self.thread.join(timeout=5)
        seconds = max(time.monotonic() - self.started, 1e-6)
        found = []
        for pid, (comm, ticks, io) in self.totals.items():
            cpu_s = ticks / self.hz
            io_mib = io / (1 << 20)
            if cpu_s >= CPU_S_MIN or io_mib >= IO_MIB_MIN:
                found.append({"pid": pid, "comm": comm, "cpu_s": round(cpu_s, 2),
                              "cpu_share": round(cpu_s / seconds, 3),
                              "io_mib": round(io_mib, 1)})
        found.sort(key=lambda f: (f["cpu_s"], f["io_mib"]), reverse=True)
        return found


def describe(found: list, limit: int = 6) -> str:
    """One line: 'none', or the busiest foreign processes."""
    if not found:
        return "none"
    return ", ".join(f"{f['comm']} (pid {f['pid']}: {f['cpu_share'] * 100:.0f}% CPU, "
                     f"{f['io_mib']:.0f} MiB I/O)" for f in found[:limit])
