"""Transactional produce (issue 22), Vela beside Apache Pulsar in the same
run, both driven by the same client: bench/txnperf, on the official Go
client (github.com/apache/pulsar-client-go; our Rust client has no
transactions):

  txn-produce   WORKERS loops, each: open a transaction, send 10 x 1 KiB
                messages in it, wait for their receipts, commit. Figures:
                transactions/s, commit latency (END_TXN to its answer)
                p50/p99, the whole transaction's latency. Beside it, on the
                same server, the same loop without a transaction (10 plain
                sends, wait): a transaction's cost over plain sends.

bench/run.sh txn-produce [--systems vela] [--workers N]
(bench.py hands this scenario name to this module.) Each system gets a
fresh standalone with transactions on (Vela: --transaction-coordinator-
enabled; Pulsar: transactionCoordinatorEnabled=true, its standalone then
creates the coordinator's assign topic). Figures only, never a pass/fail
on timing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import bench
import common

SCENARIOS = {
    "txn-produce": "transactions of 10 x 1 KiB messages, commit each; "
                   "plain sends of 10 beside them",
}
MESSAGES_PER_TXN = 10
MESSAGE_BYTES = 1024
WORKERS_DEFAULT = 16


class VelaTxnServer(bench.VelaServer):
    def journal_args(self) -> list:
        # The hook that adds flags to `vela standalone`: the journal's
        # default plus the transaction coordinator.
        return super().journal_args() + ["--transaction-coordinator-enabled"]


class PulsarTxnServer(bench.PulsarServer):
    def write_config(self, broker_port: int, web_port: int) -> Path:
        conf = super().write_config(broker_port, web_port)
        with conf.open("a") as out:
            out.write("\ntransactionCoordinatorEnabled=true\n")
        return conf


SERVERS = {"vela": VelaTxnServer, "pulsar": PulsarTxnServer}


def build_txnperf() -> Path:
    go = shutil.which("go")
    if go is None:
        raise bench.Fail("txn-produce needs go (the client is the official Go client)")
    target = Path(os.environ.get("CARGO_TARGET_DIR", bench.ROOT / "target"))
    env = dict(os.environ, GOPATH=str(target / "go"), GOMODCACHE=str(target / "go" / "mod"),
               GOCACHE=str(target / "go" / "cache"))
    out = target / "go" / "bin" / "txnperf"
    print("building bench/txnperf (go build)...", flush=True)
    subprocess.run([go, "build", "-o", str(out), "."], cwd=bench.ROOT / "bench" / "txnperf",
                   env=env, check=True, timeout=1800)
    return out


def txnperf(binary: Path, opts: bench.Options, server: bench.Server, mode: str,
            workers: int, log: Path) -> dict:
    topic = f"persistent://public/default/txn-produce-{mode}"
    cmd = [binary, "-url", server.service_url, "-topic", topic, "-mode", mode,
           "-duration", f"{opts.duration}s", "-warmup", f"{opts.warmup}s",
           "-size", str(MESSAGE_BYTES), "-per-txn", str(MESSAGES_PER_TXN),
           "-workers", str(workers)]
    proc = bench.spawn(cmd, log)
    try:
        proc.wait(timeout=opts.duration + opts.warmup + 180)
    except subprocess.TimeoutExpired:
        bench.stop(proc)
        raise bench.Fail(f"txnperf {mode} did not finish; see {log}")
    for line in reversed(log.read_text(errors="replace").splitlines()):
        if line.startswith("{") and '"rounds_per_s"' in line:
            summary = json.loads(line)
            if proc.returncode != 0:
                break
            if summary["failures"]:
                raise bench.Fail(f"txnperf {mode}: {summary['failures']} rounds failed; see {log}")
            return summary
    raise bench.Fail(f"txnperf {mode} failed:\n{bench.tail(log)}")


def run_system(binary: Path, opts: bench.Options, system: str, workers: int) -> dict:
    row = {"system": system, "workers": workers}
    with common.recording_failure(row, system), \
            common.fresh_server(opts, SERVERS[system], f"txn-produce-{system}", system) as server:
        # Plain first, then transactions, on the same server.
        for mode in ("plain", "txn"):
            summary = txnperf(binary, opts, server, mode, workers,
                              opts.log_dir / f"{system}.txn-produce.{mode}.log")
            row[mode] = summary
            extra = (f", commit p50 {summary['commit_ms']['p50']:.2f} ms "
                     f"p99 {summary['commit_ms']['p99']:.2f} ms" if mode == "txn" else "")
            print(f"   {system} {mode}: {summary['rounds_per_s']:,.0f} rounds/s "
                  f"({summary['messages_per_s']:,.0f} msg/s), round p50 "
                  f"{summary['round_ms']['p50']:.2f} ms p99 {summary['round_ms']['p99']:.2f} ms"
                  + extra, flush=True)
    return row


def table(rows: list) -> str:
    by = {r["system"]: r for r in rows if "failed" not in r}
    headers = ["figure", *[r["system"] for r in rows]]
    both = "vela" in by and "pulsar" in by
    if both:
        headers.append("vela / pulsar")

    def get(row, mode, *path):
        value = row.get(mode)
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        return value

    figures = [
        ("transactions/s", "txn", ("rounds_per_s",), "{:,.0f}", True),
        ("commit p50 (ms)", "txn", ("commit_ms", "p50"), "{:.2f}", False),
        ("commit p99 (ms)", "txn", ("commit_ms", "p99"), "{:.2f}", False),
        ("transaction p50 (ms)", "txn", ("round_ms", "p50"), "{:.2f}", False),
        ("transaction p99 (ms)", "txn", ("round_ms", "p99"), "{:.2f}", False),
        ("plain rounds of 10/s", "plain", ("rounds_per_s",), "{:,.0f}", True),
        ("plain round p50 (ms)", "plain", ("round_ms", "p50"), "{:.2f}", False),
        ("plain round p99 (ms)", "plain", ("round_ms", "p99"), "{:.2f}", False),
    ]
    lines = [headers]
    for label, mode, path, form, higher_better in figures:
        line = [label]
        for r in rows:
            v = get(r, mode, *path) if "failed" not in r else None
            line.append(form.format(v) if v is not None else "failed")
        if both:
            v, p = get(by["vela"], mode, *path), get(by["pulsar"], mode, *path)
            line.append(f"{v / p:.2f}x" if v and p else "-")
        lines.append(line)
    line = ["txn/s over plain rounds/s"]
    for r in rows:
        t, p = get(r, "txn", "rounds_per_s"), get(r, "plain", "rounds_per_s")
        line.append(f"{t / p:.2f}" if t and p else "-")
    if both:
        line.append("")
    lines.append(line)
    return common.plain_table(lines)


def main(argv: list) -> int:
    parser = common.run_parser(__doc__, SCENARIOS)
    parser.add_argument("--workers", type=int, default=WORKERS_DEFAULT,
                        help=f"concurrent transaction loops (default {WORKERS_DEFAULT})")
    parser.add_argument("--duration", type=int, default=int(os.environ.get("BENCH_DURATION", 15)))
    parser.add_argument("--warmup", type=int, default=int(os.environ.get("BENCH_WARMUP", 5)))
    args = parser.parse_args(argv)
    systems = common.systems_of(args)
    opts = common.start_run(args, args.duration, args.warmup)
    binary = build_txnperf()
    rows = []
    try:
        for name in args.scenarios:
            print(f"\n== {name}: {SCENARIOS[name]} ({args.workers} workers, "
                  f"{args.duration} s after {args.warmup} s) ==", flush=True)
            for system in systems:
                rows.append(run_system(binary, opts, system, args.workers))
    finally:
        bench.stop_all_children()
    print(f"\ntxn-produce (bench/txnperf, the Go client, on both systems, 1 bookie; "
          f"{args.workers} loops; a round = {MESSAGES_PER_TXN} x {MESSAGE_BYTES} B):")
    print(table(rows))
    common.write_results(args.out, "txn-results.json", rows)
    return 1 if any("failed" in r for r in rows) else 0
