"""Fixtures for the official-client suite.

The broker under test is `vela standalone` (embedded metadata, an in-process
bookie with a real journal, the broker) on a fresh data directory, unless
VELA_BROKER_CMD names another command: it must print a line containing
`pulsar://HOST:PORT` (and, for admin calls, `http://HOST:PORT`) on stdout once
ready; `{port}` in it is replaced by a free port.
"""

import os
import shutil
import sys
import tempfile
import urllib.error
import urllib.request
import uuid

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "support"))

from velaproc import Proc, free_port, vela_binary  # noqa: E402

STOP_TIMEOUT_S = 30


class Broker(Proc):
    """A broker process (`vela standalone` unless VELA_BROKER_CMD says
    otherwise) with its URLs and data directory."""

    def __init__(self, cmd, data_dir, args):
        self.data_dir = data_dir
        self.args = list(args)
        super().__init__("broker", cmd, r"pulsar://[0-9A-Za-z.\-]+:\d+")

    def start(self):
        super().start()
        self.url = self.find(r"pulsar://[0-9A-Za-z.\-]+:\d+")
        self.http_url = self.find(r"http://[0-9A-Za-z.\-]+:\d+")
        host, port = self.url[len("pulsar://"):].split(":")
        self.host = host
        self.port = int(port)
        return self


def _start(extra_args=(), data_dir=None):
    """Starts a broker; `data_dir` reuses a directory (a restart)."""
    custom = os.environ.get("VELA_BROKER_CMD")
    if custom:
        cmd = custom.format(port=free_port()).split() + list(extra_args)
    else:
        if data_dir is None:
            data_dir = tempfile.mkdtemp(prefix="vela-standalone-")
        cmd = [vela_binary(), "standalone", "--data-dir", data_dir]
        # Free ports unless the test names its own.
        for flag in ("--port", "--http-port"):
            if flag not in extra_args:
                cmd += [flag, "0"]
        cmd += list(extra_args)
    return Broker(cmd, data_dir, extra_args)


def _stop(broker, remove_data=True):
    """SIGTERM (a clean stop), then SIGKILL if it hangs."""
    clean = broker.terminate(STOP_TIMEOUT_S)
    if remove_data and broker.data_dir:
        shutil.rmtree(broker.data_dir, ignore_errors=True)
    if not clean:
        raise AssertionError("broker did not stop within %d s of SIGTERM" % STOP_TIMEOUT_S)


def kill9(broker):
    """kill -9: no chance to sync or close anything."""
    broker.kill9()


def restart(broker):
    """A new process on the same data directory and flags."""
    return _start(broker.args, data_dir=broker.data_dir)


def http(broker, method, path, body=None, content_type="application/json"):
    """One admin HTTP request; returns (status, body bytes)."""
    data = None if body is None else (body if isinstance(body, bytes) else body.encode())
    req = urllib.request.Request(broker.http_url + path, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@pytest.fixture(scope="session")
def broker():
    b = _start()
    status, body = http(b, "PUT", "/admin/v2/persistent/public/default/partitioned-keys/partitions", "4")
    assert status == 204, (status, body)
    yield b
    _stop(b)


@pytest.fixture
def client(broker):
    import pulsar

    c = pulsar.Client(
        broker.url,
        operation_timeout_seconds=10,
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn),
    )
    yield c
    c.close()


@pytest.fixture
def topic():
    return "persistent://public/default/t-" + uuid.uuid4().hex[:12]


def start_broker(extra_args=(), data_dir=None):
    """Starts a private broker (for tests that need their own settings),
    on `data_dir` if given (removed by `stop_broker`)."""
    return _start(extra_args, data_dir=data_dir)


def stop_broker(b):
    _stop(b)


# A broker that frees storage within a test's patience: ledgers roll over
# every POLICY_BROKER_LEDGER_ENTRIES_MAX entries with no minimum age (the
# default waits 10 minutes) and policies apply every second. Shared by the
# lifecycle and topic-policy modules.
POLICY_BROKER_LEDGER_ENTRIES_MAX = 10
POLICY_BROKER_CHECK_INTERVAL_S = 1


def start_policy_broker():
    return _start(
        [
            "--ledger-max-entries",
            str(POLICY_BROKER_LEDGER_ENTRIES_MAX),
            "--ledger-min-rollover-minutes",
            "0",
            "--policy-check-interval-s",
            str(POLICY_BROKER_CHECK_INTERVAL_S),
        ]
    )


def quiet_client(b):
    """A client with a 10 s operation timeout that logs errors only."""
    import pulsar

    return pulsar.Client(
        b.url,
        operation_timeout_seconds=10,
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
    )


def create_namespace(b, prefix):
    """A fresh namespace public/<prefix>-<random>."""
    ns = "public/%s-%s" % (prefix, uuid.uuid4().hex[:8])
    status, body = http(b, "PUT", "/admin/v2/namespaces/" + ns)
    assert status == 204, (status, body)
    return ns
