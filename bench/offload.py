"""Tiered storage (issue 24): catch-up reads from offloaded ledgers beside
catch-up reads from the bookies, in the same run, on the same broker.

  offload-catch-up
                 one `vela standalone` (release) offloading to SeaweedFS
                 (`weed server -s3` on loopback, built by
                 tests/support/seaweedfs.sh), deletion lag 0. Two topics get
                 the same backlog (N x 1 KiB messages, batched, in ledgers
                 of --ledger-mb MiB); one is offloaded (Pulsar's PUT
                 .../offload, its bookie copies then deleted), the other
                 stays on the bookie. Then one exclusive consumer (receiver
                 queue 1,000) drains each from the earliest message, the
                 two taking turns (--repeat rounds, fresh subscriptions, the
                 order alternating), median reported.

bench/run.sh offload-catch-up [--messages N] [--repeat R]
Prints MB/s and msg/s of each drain, the ratio offloaded / bookies, and the
broker's peak RSS during each. Figures only, never a pass/fail on timing.
Both stores are on this machine's disk (and page cache): this compares the
read paths (ranged GETs over HTTP vs the bookie's entry logs), not a
network-distant object store.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import time
from pathlib import Path

import bench
import common

SCENARIOS = {
    "offload-catch-up": "drain a backlog from offloaded ledgers (S3, SeaweedFS) and "
                        "from the bookie, same run: MB/s and broker peak RSS",
}
MESSAGES_DEFAULT = 1_000_000
MESSAGE_BYTES = 1024
LEDGER_MB_DEFAULT = 32
QUEUE = 1000
SEAWEEDFS = bench.ROOT / "tests" / "support" / "seaweedfs.sh"
# The identity tests/support/seaweedfs.sh configures (loopback test server).
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "vela-test-key", "AWS_SECRET_ACCESS_KEY": "vela-test-secret"}
OFFLOAD_TIMEOUT_S = 1800


def start_seaweedfs(opts: bench.Options, data_dir: Path):
    """`seaweedfs.sh serve`: (process, endpoint, bucket) once the bucket is there."""
    build = bench.spawn(["bash", SEAWEEDFS, "build"], opts.log_dir / "seaweedfs.build.log")
    build.wait()
    if build.returncode != 0:
        raise bench.Fail(f"building SeaweedFS failed:\n"
                         f"{bench.tail(opts.log_dir / 'seaweedfs.build.log')}")
    log = opts.log_dir / "seaweedfs.log"
    proc = bench.spawn(["bash", SEAWEEDFS, "serve", data_dir], log)
    deadline = time.monotonic() + 180
    while True:
        for line in log.read_text(errors="replace").splitlines():
            words = line.split()
            if words[:2] == ["ready", "s3"] and len(words) == 5:
                return proc, words[2], words[4]
        if proc.poll() is not None or time.monotonic() > deadline:
            raise bench.Fail(f"SeaweedFS did not start:\n{bench.tail(log)}")
        time.sleep(0.2)


class VelaOffloadServer(bench.VelaServer):
    """Vela with the S3 offload driver on SeaweedFS, deletion lag 0."""

    def __init__(self, data_dir: Path, opts: bench.Options, endpoint: str, bucket: str,
                 ledger_mb: int):
        super().__init__(1, data_dir, opts)
        self.endpoint = endpoint
        self.bucket = bucket
        self.ledger_mb = ledger_mb

    def journal_args(self) -> list:
        return ["--offload-driver", "s3", "--offload-bucket", self.bucket,
                "--offload-service-endpoint", self.endpoint,
                "--offload-deletion-lag-ms", "0",
                "--ledger-max-size-mb", str(self.ledger_mb),
                # Batches of up to 128 KiB: this caps ledgers near the size
                # too, whichever comes first.
                "--ledger-max-entries", str(max(self.ledger_mb * 8, 16)),
                "--ledger-min-rollover-minutes", "0"]


def drain(opts: bench.Options, server, topic: str, sub: str, messages: int, log: Path) -> dict:
    proc = bench.spawn([opts.vela, "perf", "consume", topic, "-u", server.service_url,
                        "-s", sub, "--subscription-position", "earliest", "-q", str(QUEUE),
                        "-m", str(messages), "-i", "5", "--json"], log)
    peak = bench.watch(proc, server, timeout=OFFLOAD_TIMEOUT_S)
    if proc.returncode != 0:
        raise bench.Fail(f"vela perf consume failed:\n{bench.tail(log)}")
    summary = bench.parse_vela_json(log)
    summary["peak_rss_mib"] = peak
    return summary


def offload(server, topic_path: str) -> dict:
    """PUT .../offload up to the last entry, then polls the status."""
    base = f"{server.admin_url}/admin/v2/persistent/{topic_path}"
    status, body = common.http("GET", f"{base}/internalStats")
    if status != 200:
        raise bench.Fail(f"internalStats answered {status}: {body[:200]}")
    ledger, entry = json.loads(body)["lastConfirmedEntry"].split(":")
    status, body = common.http("PUT", f"{base}/offload",
                        json.dumps({"ledgerId": int(ledger), "entryId": int(entry)}).encode())
    if status != 204:
        raise bench.Fail(f"PUT offload answered {status}: {body[:200]}")
    deadline = time.monotonic() + OFFLOAD_TIMEOUT_S
    while True:
        status, body = common.http("GET", f"{base}/offload")
        doc = json.loads(body) if status == 200 else {}
        if doc.get("status") == "SUCCESS":
            break
        if doc.get("status") == "ERROR" and time.monotonic() > deadline:
            raise bench.Fail(f"offload failed: {doc}")
        if time.monotonic() > deadline:
            raise bench.Fail(f"offload still {doc} after {OFFLOAD_TIMEOUT_S} s")
        time.sleep(0.5)
    status, body = common.http("GET", f"{base}/internalStats?metadata=true")
    ledgers = json.loads(body)["ledgers"]
    offloaded = [l for l in ledgers if l.get("offloaded")]
    on_bookies = [l for l in offloaded if l.get("metadata") is not None]
    return {"ledgers": len(ledgers), "offloaded": len(offloaded),
            "offloaded_still_on_bookie": len(on_bookies)}


def run(opts: bench.Options, messages: int, repeats: int, ledger_mb: int) -> dict:
    root = opts.data_root / "offload-catch-up"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    row = {"messages": messages, "message_bytes": MESSAGE_BYTES, "ledger_mb": ledger_mb,
           "runs": {"bookies": [], "offloaded": []}}
    weed = None
    server = None
    try:
        with common.recording_failure(row, "offload-catch-up"):
            weed, endpoint, bucket = start_seaweedfs(opts, root / "seaweedfs")
            print(f"   SeaweedFS at {endpoint}, bucket {bucket}", flush=True)
            os.environ.update(CREDENTIALS)
            server = VelaOffloadServer(root / "vela", opts, endpoint, bucket, ledger_mb)
            server.start()
            topics = {"bookies": "public/default/catch-up-bookies",
                      "offloaded": "public/default/catch-up-offloaded"}
            for kind, path in topics.items():
                # The topic and its subscriptions before anything is
                # written, so the backlog is kept.
                common.prepare_topic(server, path, [f"r{r}" for r in range(repeats)])
                log = opts.log_dir / f"offload.produce.{kind}.log"
                proc = bench.spawn([opts.vela, "perf", "produce", f"persistent://{path}", "-u",
                                    server.service_url, "-r", "0", "-s", str(MESSAGE_BYTES),
                                    "-o", "1000", "-m", str(messages), "-i", "5", "--json"], log)
                bench.watch(proc, server, timeout=OFFLOAD_TIMEOUT_S)
                if proc.returncode != 0:
                    raise bench.Fail(f"vela perf produce failed:\n{bench.tail(log)}")
                produced = bench.parse_vela_json(log)
                print(f"   produced {messages:,} into {kind} at "
                      f"{produced['messages_per_s']:,.0f} msg/s", flush=True)
            started = time.monotonic()
            row["offload"] = offload(server, topics["offloaded"])
            row["offload_s"] = time.monotonic() - started
            print(f"   offloaded in {row['offload_s']:.1f} s: {row['offload']}", flush=True)
            if row["offload"]["offloaded"] == 0:
                raise bench.Fail("nothing was offloaded")
            for r in range(repeats):
                order = ["bookies", "offloaded"] if r % 2 == 0 else ["offloaded", "bookies"]
                for kind in order:
                    summary = drain(opts, server, f"persistent://{topics[kind]}", f"r{r}",
                                    messages, opts.log_dir / f"offload.drain.{kind}.r{r}.log")
                    row["runs"][kind].append(summary)
                    print(f"   round {r + 1}/{repeats} {kind}: {summary['mb_per_s']:.1f} MB/s, "
                          f"{summary['messages_per_s']:,.0f} msg/s, broker peak RSS "
                          f"{summary['peak_rss_mib'] or 0:.0f} MiB", flush=True)
            status, body = common.http("GET", f"{server.admin_url}/metrics")
            row["offload_metrics"] = [line for line in body.splitlines()
                                      if line.startswith("vela_offload_")]
    finally:
        if server is not None:
            server.stop()
        if weed is not None:
            bench.stop(weed)
        if not opts.keep_data:
            shutil.rmtree(root, ignore_errors=True)
    return row


def table(row: dict) -> str:
    lines = [["drain (receiver queue 1,000)", "MB/s", "msg/s", "broker peak RSS"]]
    medians = {}
    for kind in ("bookies", "offloaded"):
        runs = row["runs"][kind]
        if not runs:
            lines.append([kind, "failed", "", ""])
            continue
        mb = statistics.median(r["mb_per_s"] for r in runs)
        msg = statistics.median(r["messages_per_s"] for r in runs)
        rss = max((r["peak_rss_mib"] or 0) for r in runs)
        medians[kind] = (mb, msg)
        lines.append([f"from {kind}", f"{mb:.1f}", f"{msg:,.0f}", f"{rss:.0f} MiB"])
    if len(medians) == 2 and medians["bookies"][0]:
        lines.append(["offloaded / bookies", f"{medians['offloaded'][0] / medians['bookies'][0]:.2f}x",
                      f"{medians['offloaded'][1] / medians['bookies'][1]:.2f}x", ""])
    return common.plain_table(lines)


def main(argv: list) -> int:
    parser = common.run_parser(__doc__, SCENARIOS, systems_default="vela",
                               systems_help="(accepted for bench/run.sh; Vela only)")
    parser.add_argument("--messages", type=int, default=MESSAGES_DEFAULT,
                        help=f"1 KiB messages in each backlog (default {MESSAGES_DEFAULT:,})")
    parser.add_argument("--repeat", type=int, default=3,
                        help="rounds of turns, the median reported (default 3)")
    parser.add_argument("--ledger-mb", type=int, default=LEDGER_MB_DEFAULT,
                        help=f"ledger size cap, MiB (default {LEDGER_MB_DEFAULT})")
    args = parser.parse_args(argv)
    opts = common.start_run(args)
    try:
        print(f"\n== offload-catch-up: {SCENARIOS['offload-catch-up']} "
              f"({args.messages:,} x {MESSAGE_BYTES} B per topic) ==", flush=True)
        row = run(opts, args.messages, max(args.repeat, 1), args.ledger_mb)
    finally:
        bench.stop_all_children()
    print(f"\noffload-catch-up (vela perf, 1 bookie, SeaweedFS on loopback; median of "
          f"{max(args.repeat, 1)} rounds):")
    print(table(row))
    for line in row.get("offload_metrics", []):
        print(f"   {line}")
    common.write_results(args.out, "offload-results.json", row)
    return 1 if "failed" in row else 0
