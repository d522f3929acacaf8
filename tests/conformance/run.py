#!/usr/bin/env python3
"""Conformance runner: an official Pulsar client's own test suite against
Apache Pulsar 4.0.8 and against `vela standalone`, each configured as the
client's CI configures Pulsar. Prints a per-test table and "N passed, M
failed" for each system, and writes the results as JSON.

    tests/conformance/run.py python /work/.mirror/apache+pulsar-client-python/repo
    tests/conformance/run.py go /work/.mirror/apache+pulsar-client-go/repo \\
        --packages ./pulsaradmin/... --systems vela
    tests/conformance/run.py compare out/go-pulsar.json out/go-vela.json

The snapshot is a client repository as the search tool's `fetch` brings it
(a bare git dir) or a checkout. Ref: Python, the tag of the installed
`pulsar-client` (or its newest release candidate); Go, the newest release
tag. Everything runs on free loopback ports in a temporary directory that is
deleted at the end (`--keep` keeps it). Outside CI, like bench/.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from servers import ROOT, Fail, Ports, PulsarServer, VelaServer  # noqa: E402
from suites import GoSuite, PythonSuite, Result  # noqa: E402

PASSING = ("passed", "flaky")
NOT_COUNTED = ("skipped",)
MESSAGE_COLUMN_CHARS = 150


def counts(results: list) -> dict:
    out = {}
    for r in results:
        out[r["outcome"]] = out.get(r["outcome"], 0) + 1
    return out


def summary_line(system: str, results: list) -> str:
    c = counts(results)
    passed = sum(c.get(o, 0) for o in PASSING)
    skipped = c.get("skipped", 0)
    failed = len(results) - passed - skipped
    detail = ", ".join(f"{n} {o}" for o, n in sorted(c.items()) if o not in ("passed",))
    return f"{system}: {passed} passed, {failed} failed" + (f" ({detail})" if detail else "")


def print_table(runs: dict) -> None:
    """One row per test: each system's outcome, then the first failure line."""
    systems = list(runs)
    by_system = {s: {r["id"]: r for r in runs[s]["tests"]} for s in systems}
    ids = []
    for s in systems:
        ids += [r["id"] for r in runs[s]["tests"] if r["id"] not in ids]
    width = max([len(i) for i in ids] + [4])
    header = f"{'test':<{width}}  " + "  ".join(f"{s:<8}" for s in systems) + "  first failure"
    print(header)
    print("-" * len(header))
    for test_id in ids:
        cells, message = [], ""
        for s in systems:
            r = by_system[s].get(test_id)
            cells.append(f"{(r['outcome'] if r else '-'):<8}")
            if r and r["outcome"] not in PASSING + NOT_COUNTED and not message:
                message = f"[{s}] {r['message']}"
        print(f"{test_id:<{width}}  " + "  ".join(cells) + "  " + message[:MESSAGE_COLUMN_CHARS])
    print()
    for s in systems:
        print(summary_line(s, runs[s]["tests"]))


def rerun_failed(suite, results: dict, times: int, timeout_s: int, label: str) -> None:
    """Runs each failed test again, alone, up to `times` times: one that then
    passes is `flaky` (its first failure kept as the message)."""
    for test_id, result in list(results.items()):
        if result.outcome in ("passed", "skipped"):
            continue
        for attempt in range(times):
            again = suite.run([test_id], timeout_s, f"{label}-rerun{attempt + 1}").get(test_id)
            result.tries += 1
            if again is not None and again.outcome == "passed":
                result.outcome = "flaky"
                result.message = f"failed, then passed on try {result.tries}: {result.message}"
                break


def run_system(args, suite, setup, ids, system: str, work: Path, ports: Ports) -> dict:
    if system == "pulsar":
        server = PulsarServer(setup, ports, work)
    else:
        server = VelaServer(setup, ports, work, Path(args.vela_bin).resolve(), args.vela_auth)
    print(f"\n== {suite.name} suite ({suite.ref}) against {system} "
          f"(ports {ports.broker}/{ports.broker_tls}/{ports.web}/{ports.web_tls})", flush=True)
    started = time.monotonic()
    try:
        server.start()
        print(f"   started in {time.monotonic() - started:.0f} s; CI setup calls:")
        for line in server.setup_log:
            print(f"     {line}")
        for key, why in sorted(server.missing.items()):
            print(f"   not given to {system}: {key}={why}")
        results = suite.run(ids, args.test_timeout, f"{system}")
        if args.rerun_failed:
            rerun_failed(suite, results, args.rerun_failed, args.test_timeout, system)
    finally:
        server.stop()
    ordered = [results[i] for i in ids if i in results]
    return {
        "suite": suite.name, "system": system, "ref": suite.ref,
        "vela_auth": args.vela_auth if system == "vela" else None,
        "minutes": round((time.monotonic() - started) / 60, 1),
        "not_given": server.missing, "setup_calls": server.setup_log,
        "left_out": [{"id": i, "reason": r} for i, r in suite.left_out],
        "tests": [vars(r) for r in ordered],
    }


def run_label(args) -> str:
    """The results' file name: the suite, and the Go packages when chosen."""
    packages = getattr(args, "packages", None) or []
    scope = "+".join(p.strip("./").replace("/...", "").replace("/", "_") for p in packages)
    return f"{args.suite}-{scope}" if scope else args.suite


def run(args) -> int:
    work = Path(tempfile.mkdtemp(prefix=f"vela-conformance-{args.suite}-"))
    out_dir = Path(args.out).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    ports = Ports.pick()
    runs = {}
    try:
        snapshot = Path(args.snapshot).resolve()
        if args.suite == "python":
            suite = PythonSuite(snapshot, args.ref, work, ports)
            setup = suite.prepare()
        else:
            suite = GoSuite(snapshot, args.ref, work, ports)
            setup = suite.prepare(args.packages)
            print(f"compiling test binaries of {len(suite.packages)} packages...", flush=True)
            suite.compile()
        ids = suite.list_tests()
        if args.tests:
            ids = [i for i in ids if any(pattern in i for pattern in args.tests)]
        print(f"{suite.name} client {suite.ref}: {len(ids)} tests; "
              f"{len(suite.left_out)} left out:")
        for test_id, reason in suite.left_out:
            print(f"   {test_id}: {reason}")
        for note in setup.notes:
            print(f"   note: {note}")
        for system in args.systems.split(","):
            result = run_system(args, suite, setup, ids, system, work, ports)
            runs[system] = result
            suffix = f"-auth-{args.vela_auth}" if system == "vela" and args.vela_auth != "ci" else ""
            path = out_dir / f"{run_label(args)}-{system}{suffix}.json"
            path.write_text(json.dumps(result, indent=1) + "\n")
            print(summary_line(system, result["tests"]) + f"  ({result['minutes']} min; {path})",
                  flush=True)
        print()
        print_table(runs)
    except Fail as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


def compare(args) -> int:
    """Tests the first run passes and the second does not."""
    runs = {}
    for path in args.results:
        data = json.loads(Path(path).read_text())
        label = data["system"] + (f"(auth {data['vela_auth']})" if data.get("vela_auth") not in (None, "ci") else "")
        # Two runs of one system (before and after a change): both kept.
        while label in runs:
            label += "'"
        runs[label] = data
    print_table(runs)
    first, second = list(runs.values())[:2]
    seconds = {r["id"]: r for r in second["tests"]}
    regressions = [r for r in first["tests"] if r["outcome"] in PASSING
                   and seconds.get(r["id"], {}).get("outcome") not in PASSING + NOT_COUNTED]
    print(f"\n{len(regressions)} tests pass on {first['system']} and fail on {second['system']}:")
    for r in regressions:
        other = seconds.get(r["id"], {})
        print(f"  {r['id']}: {other.get('outcome', 'absent')}: {other.get('message', '')[:200]}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for suite_name in ("python", "go"):
        p = sub.add_parser(suite_name, help=f"run the {suite_name} client's suite")
        p.add_argument("snapshot", help="the client repository: a bare git dir (fetch) or checkout")
        p.add_argument("--ref", help="tag or commit to test (default: see above)")
        p.add_argument("--systems", default="pulsar,vela", help="pulsar, vela or both, in order")
        p.add_argument("--vela-bin", default=str(ROOT / "target" / "release" / "vela"))
        p.add_argument("--vela-auth", choices=["ci", "none"], default="ci",
                       help="ci: the CI's authentication (providers, anonymous role, grants); "
                            "none: a diagnostic run of Vela without authentication")
        p.add_argument("--test-timeout", type=int, default=180 if suite_name == "go" else 300,
                       help="seconds one test may run")
        p.add_argument("--rerun-failed", type=int, default=1,
                       help="run each failed test again this many times (flaky detection)")
        p.add_argument("--tests", nargs="*", help="only tests whose id contains one of these")
        if suite_name == "go":
            p.add_argument("--packages", nargs="*", help="go package patterns "
                           "(default: ./pulsar/... ./pulsaradmin/...)")
        p.add_argument("--out", default=str(HERE / "out"), help="directory for the JSON results")
        p.add_argument("--keep", action="store_true", help="keep the temporary directory")
        p.set_defaults(suite=suite_name)
    c = sub.add_parser("compare", help="table of two result files; tests the first passes "
                       "and the second fails")
    c.add_argument("results", nargs=2)
    args = parser.parse_args()
    # A Ctrl-C or kill stops the servers and test processes through `finally`.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.command == "compare":
        return compare(args)
    if "vela" in args.systems.split(",") and not Path(args.vela_bin).exists():
        print(f"error: no Vela binary at {args.vela_bin}: cargo build --release -p vela",
              file=sys.stderr)
        return 1
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
