"""Fixtures for the official-client suite.

The broker under test is `vela standalone` (embedded metadata, an in-process
bookie with a real journal, the broker) on a fresh data directory, unless
VELA_BROKER_CMD names another command: it must print a line containing
`pulsar://HOST:PORT` (and, for admin calls, `http://HOST:PORT`) on stdout once
ready; `{port}` in it is replaced by a free port.
"""

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
STARTUP_TIMEOUT_S = 120
STOP_TIMEOUT_S = 30


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_VELA = None


def vela_binary():
    """Builds (once per session) and returns the `vela` binary."""
    global _VELA
    if _VELA is None:
        env = dict(os.environ)
        env.setdefault("PROTOC", shutil.which("protoc") or "/usr/bin/protoc")
        subprocess.run(["cargo", "build", "-q", "-p", "vela"], cwd=ROOT, check=True, env=env)
        target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
        _VELA = os.path.join(target, "debug", "vela")
    return _VELA


class Broker:
    def __init__(self, proc, url, http_url, log_lines, data_dir, args):
        self.proc = proc
        self.url = url
        self.http_url = http_url
        self.log_lines = log_lines
        self.data_dir = data_dir
        self.args = args
        host, port = url[len("pulsar://"):].split(":")
        self.host = host
        self.port = int(port)

    def log_text(self):
        return "\n".join(self.log_lines)


def _start(extra_args=(), data_dir=None):
    """Starts a broker; `data_dir` reuses a directory (a restart)."""
    custom = os.environ.get("VELA_BROKER_CMD")
    if custom:
        cmd = custom.format(port=_free_port()).split() + list(extra_args)
    else:
        if data_dir is None:
            data_dir = tempfile.mkdtemp(prefix="vela-standalone-")
        cmd = [
            vela_binary(),
            "standalone",
            "--data-dir",
            data_dir,
            "--port",
            "0",
            "--http-port",
            "0",
        ] + list(extra_args)
    env = dict(os.environ)
    env.setdefault("VELA_LOG", "info")
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    log_lines = []

    def pump(stream):
        for line in stream:
            log_lines.append(line.rstrip("\n"))

    threading.Thread(target=pump, args=(proc.stderr,), daemon=True).start()
    deadline = time.time() + STARTUP_TIMEOUT_S
    url = None
    http_url = None
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        log_lines.append(line.rstrip("\n"))
        m = re.search(r"pulsar://[0-9A-Za-z.\-]+:\d+", line)
        if m:
            url = m.group(0)
            h = re.search(r"http://[0-9A-Za-z.\-]+:\d+", line)
            http_url = h.group(0) if h else None
            break
    if url is None:
        proc.kill()
        raise RuntimeError("broker did not start:\n" + "\n".join(log_lines[-50:]))
    threading.Thread(target=pump, args=(proc.stdout,), daemon=True).start()
    return Broker(proc, url, http_url, log_lines, data_dir, list(extra_args))


def _stop(broker, remove_data=True):
    """SIGTERM (a clean stop), then SIGKILL if it hangs."""
    if broker.proc.poll() is None:
        broker.proc.send_signal(signal.SIGTERM)
        try:
            broker.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            broker.proc.kill()
            broker.proc.wait(timeout=10)
            raise AssertionError("broker did not stop within %d s of SIGTERM" % STOP_TIMEOUT_S)
    if remove_data and broker.data_dir:
        shutil.rmtree(broker.data_dir, ignore_errors=True)


def kill9(broker):
    """kill -9: no chance to sync or close anything."""
    broker.proc.send_signal(signal.SIGKILL)
    broker.proc.wait(timeout=10)


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


def start_broker(extra_args=()):
    """Starts a private broker (for tests that need their own settings)."""
    return _start(extra_args)


def stop_broker(b):
    _stop(b)
