"""A pytest plugin the conformance runner loads (`-p pytest_progress`): one
JSON line per test start and per test outcome, appended to the file named by
$CONFORMANCE_EVENTS, flushed at once. The runner reads it while pytest runs,
so it knows which test hangs (and can kill and resume after it) even when the
client library's own logging is mixed into pytest's output."""

import json
import os
import time

_path = os.environ.get("CONFORMANCE_EVENTS")


def _emit(event: dict) -> None:
    if not _path:
        return
    event["t"] = time.time()
    with open(_path, "a") as out:
        out.write(json.dumps(event) + "\n")


def _one_line(report) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        text = crash.message
    else:
        text = str(report.longrepr or "")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if lines else ""


def pytest_runtest_logstart(nodeid, location):
    _emit({"event": "start", "id": nodeid})


def pytest_runtest_logreport(report):
    # One outcome per test: the call's, or setup's/teardown's when they fail
    # (or skip, at setup).
    if report.when == "call" or report.outcome in ("failed", "skipped") and report.when != "call":
        outcome = report.outcome
        if report.when != "call" and outcome == "failed":
            outcome = "error"
        _emit({"event": "end", "id": report.nodeid, "outcome": outcome,
               "when": report.when, "duration": report.duration,
               "message": _one_line(report) if outcome != "passed" else ""})
