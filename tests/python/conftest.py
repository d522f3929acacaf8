"""Fixtures for the official-client suite.

The broker under test is the dev broker example (in-memory metadata and
ledgers) unless VELA_BROKER_CMD names another command (it must print a line
containing `pulsar://HOST:PORT` on stdout once it is ready, and listen on the
port given by `{port}` in the command, or on a port it prints).
"""

import os
import re
import socket
import subprocess
import threading
import time
import uuid

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
STARTUP_TIMEOUT_S = 120


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _build_dev_broker():
    env = dict(os.environ)
    env.setdefault("PROTOC", "/usr/bin/protoc")
    subprocess.run(
        ["cargo", "build", "-q", "-p", "vela-broker", "--example", "dev_broker"],
        cwd=ROOT,
        check=True,
        env=env,
    )
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    return os.path.join(target, "debug", "examples", "dev_broker")


class Broker:
    def __init__(self, proc, url, log_lines):
        self.proc = proc
        self.url = url
        self.log_lines = log_lines
        host, port = url[len("pulsar://"):].split(":")
        self.host = host
        self.port = int(port)

    def log_text(self):
        return "\n".join(self.log_lines)


def _start(extra_args=()):
    port = _free_port()
    custom = os.environ.get("VELA_BROKER_CMD")
    if custom:
        cmd = custom.format(port=port).split() + list(extra_args)
    else:
        cmd = [_build_dev_broker(), str(port), "--exit-on-stdin-close"] + list(extra_args)
    env = dict(os.environ)
    env.setdefault("RUST_LOG", "info")
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        stdin=subprocess.PIPE,
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
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        log_lines.append(line.rstrip("\n"))
        m = re.search(r"pulsar://[0-9A-Za-z.\-]+:\d+", line)
        if m:
            url = m.group(0)
            break
    if url is None:
        proc.kill()
        raise RuntimeError("broker did not start:\n" + "\n".join(log_lines[-50:]))
    threading.Thread(target=pump, args=(proc.stdout,), daemon=True).start()
    return Broker(proc, url, log_lines)


def _stop(broker):
    try:
        broker.proc.stdin.close()
    except Exception:
        pass
    try:
        broker.proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        broker.proc.kill()
        broker.proc.wait(timeout=10)


@pytest.fixture(scope="session")
def broker():
    b = _start(["--partitioned", "persistent://public/default/partitioned-keys=4"])
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
