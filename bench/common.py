"""What the scenario modules beside bench.py share (catch_up, geo_replication,
offload, txn): their common command-line flags and the run they set up
(log directory, `bench.Options`), a standalone started on a fresh data
directory and stopped whatever happens, a step's failure recorded in its
result row, the admin REST calls, `vela perf ... --json` runs, and plain
text tables. bench.py keeps the servers, process care and clients these
use.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import bench


def run_parser(description: str, scenarios: dict, systems_default: str = "vela,pulsar",
               systems_help: str | None = None) -> argparse.ArgumentParser:
    """A scenario module's command line (its docstring as the help) with the
    flags every one takes: its scenario names, --systems, --data-root,
    --out, --vela, --keep-data and --update-results."""
    parser = argparse.ArgumentParser(description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scenarios", nargs="+", choices=list(scenarios))
    parser.add_argument("--systems", default=systems_default, help=systems_help)
    parser.add_argument("--data-root", type=Path,
                        default=bench.ROOT / "target" / "bench-data")
    parser.add_argument("--out", type=Path, default=bench.ROOT / "target" / "bench-results")
    parser.add_argument("--vela", type=Path, default=bench.ROOT / "target" / "release" / "vela")
    parser.add_argument("--keep-data", action="store_true")
    parser.add_argument("--update-results", action="store_true",
                        help="(accepted for bench/run.sh; these scenarios write no RESULTS.md)")
    return parser


def systems_of(args: argparse.Namespace) -> list:
    return [s.strip() for s in args.systems.split(",") if s.strip()]


def start_run(args: argparse.Namespace, duration: int = 15, warmup: int = 5) -> bench.Options:
    """A log directory for this run under --out, the data root, the options;
    prints where the logs go and what else keeps the machine busy."""
    run_id = time.strftime("%Y%m%d-%H%M%S")
    log_dir = args.out / f"logs-{run_id}"
    log_dir.mkdir(parents=True, exist_ok=True)
    args.data_root.mkdir(parents=True, exist_ok=True)
    opts = bench.Options(duration, warmup, 5, args.data_root.resolve(), args.vela.resolve(),
                         args.keep_data, False, log_dir)
    print(f"logs in {log_dir}")
    for heavy in bench.machine_state()["heavy"]:
        print(f"  busy: {heavy}")
    return opts


def write_results(out: Path, file_name: str, results) -> None:
    path = out / file_name
    path.write_text(json.dumps(results, indent=1))
    print(f"\nraw results: {path}")


@contextmanager
def recording_failure(row: dict, who: str):
    """A `bench.Fail` inside is printed and kept in `row["failed"]` (its
    first line); the run goes on with the next system or scenario."""
    try:
        yield
    except bench.Fail as error:
        print(f"   {who}: FAILED: {error}", flush=True)
        row["failed"] = str(error).splitlines()[0]


@contextmanager
def fresh_server(opts: bench.Options, server_class, data_name: str, system: str):
    """A standalone of `server_class` (1 bookie) on the fresh data directory
    `data_name` under the data root, started; stopped (its data removed
    unless --keep-data) however the block ends."""
    data_dir = opts.data_root / data_name
    shutil.rmtree(data_dir, ignore_errors=True)
    server = server_class(1, data_dir, opts)
    try:
        print(f"   {system}: starting", flush=True)
        server.start()
        yield server
    finally:
        server.stop()
        if not opts.keep_data:
            shutil.rmtree(data_dir, ignore_errors=True)


def http(method: str, url: str, body=None) -> tuple:
    """One admin REST call: (status, body text). `body`: None, bytes as they
    are, anything else as JSON."""
    data = None
    if body is not None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, answer.read().decode(errors="replace")
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(errors="replace")


def prepare_topic(server: bench.Server, topic_path: str, subscriptions: list) -> None:
    """Creates the topic and its subscriptions before anything is written,
    so the backlog is retained on both systems."""
    base = f"{server.admin_url}/admin/v2/persistent/{topic_path}"
    status, _ = http("PUT", base, b"")
    if status not in (200, 204, 409):
        raise bench.Fail(f"creating {topic_path} answered {status}")
    for sub in subscriptions:
        status, _ = http("PUT", f"{base}/subscription/{sub}", b"")
        if status not in (200, 204, 409):
            raise bench.Fail(f"creating subscription {sub} answered {status}")


def perf_json(cmd: list, log: Path, timeout: float) -> dict:
    """Runs a `vela perf <mode> ... --json` command to its end: its summary."""
    what = f"vela perf {cmd[2]}" if len(cmd) > 2 else "vela perf"
    proc = bench.spawn(cmd, log)
    try:
        proc.wait(timeout=timeout)
    except Exception:
        bench.stop(proc)
        raise bench.Fail(f"{what} did not finish in {timeout:.0f} s; see {log}")
    if proc.returncode != 0:
        raise bench.Fail(f"{what} failed:\n{bench.tail(log)}")
    return bench.parse_vela_json(log)


def plain_table(lines: list) -> str:
    """Rows of cells as aligned text: the first column to the left, the
    others to the right."""
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(lines[0]))]
    return "\n".join("  ".join(str(c).rjust(w) if i else str(c).ljust(w)
                               for i, (c, w) in enumerate(zip(line, widths)))
                     for line in lines)
