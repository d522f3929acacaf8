"""A real cluster on 127.0.0.1: one etcd, N bookies (`vela bookie`) and M
brokers (`vela broker`), each a separate process on free ports, with helpers
to kill -9, freeze (SIGSTOP/SIGCONT) and restart any of them.

Bookies are registered as `bookie-I` (a stable id across restarts) and run
auto-recovery with a short grace period so tests can watch it work.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "support"))

from velaproc import Proc, free_port, vela_binary  # noqa: E402

ETCD_READY_TIMEOUT_S = 30


class Etcd(Proc):
    """A single-member etcd on free ports with its own data directory."""

    def __init__(self, data_dir):
        self.client_port = free_port()
        self.peer_port = free_port()
        peer = "http://127.0.0.1:%d" % self.peer_port
        client = "http://127.0.0.1:%d" % self.client_port
        cmd = [
            shutil.which("etcd") or "etcd",
            "--name",
            "default",
            "--data-dir",
            data_dir,
            "--listen-client-urls",
            client,
            "--advertise-client-urls",
            client,
            "--listen-peer-urls",
            peer,
            "--initial-advertise-peer-urls",
            peer,
            "--initial-cluster",
            "default=" + peer,
        ]
        # etcd logs to stderr; its stdout never announces readiness: the
        # ready check polls the client port instead (see `start`).
        super().__init__("etcd", cmd, r".")

    def start(self):
        self.proc = subprocess.Popen(
            self.cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        threading.Thread(target=self._pump, args=(self.proc.stderr,), daemon=True).start()
        deadline = time.time() + ETCD_READY_TIMEOUT_S
        url = "http://127.0.0.1:%d/health" % self.client_port
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(url, timeout=1) as resp:
                    if b"true" in resp.read():
                        self.ready_line = "etcd ready"
                        return self
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            time.sleep(0.1)
        self.proc.kill()
        raise RuntimeError("etcd did not start:\n" + self.log_text()[-3000:])

    @property
    def url(self):
        return "etcd://127.0.0.1:%d" % self.client_port


class Cluster:
    def __init__(self, bookies=3, brokers=2, broker_args=(), bookie_args=()):
        self.dir = tempfile.mkdtemp(prefix="vela-cluster-")
        self.etcd = Etcd(os.path.join(self.dir, "etcd"))
        self.vela = vela_binary()
        self.bookie_args = list(bookie_args)
        self.broker_args = list(broker_args)
        self.bookies = [self._bookie(i) for i in range(bookies)]
        self.brokers = [self._broker(i) for i in range(brokers)]

    def _bookie(self, index):
        data = os.path.join(self.dir, "bookie-%d" % index)
        cmd = [
            self.vela,
            "bookie",
            "--journal-dir",
            os.path.join(data, "journal"),
            "--ledger-dir",
            os.path.join(data, "ledgers"),
            "--port",
            "0",
            "--metadata",
            self.etcd.url,
            "--bookie-id",
            "bookie-%d" % index,
            "--lost-bookie-grace-s",
            "2",
            "--autorecovery-interval-s",
            "1",
        ] + self.bookie_args
        return Proc("bookie-%d" % index, cmd, r"vela bookie listening on")

    def _broker(self, index):
        cmd = [
            self.vela,
            "broker",
            "--metadata",
            self.etcd.url,
            "--port",
            "0",
            "--http-port",
            "0",
        ] + self.broker_args
        proc = Proc("broker-%d" % index, cmd, r"vela broker ready")
        return proc

    @staticmethod
    def url_of(broker, scheme):
        """`SCHEME://H:P` that the broker logged (pulsar, http, and pulsar+ssl
        or https when it has TLS ports)."""
        return broker.find(re.escape(scheme) + r"://[0-9.]+:\d+")

    def service_url(self, brokers=None):
        """`pulsar://h:p1,h:p2`: the client tries each."""
        hosts = [self.url_of(b, "pulsar")[len("pulsar://"):] for b in (brokers or self.brokers) if b.alive()]
        return "pulsar://" + ",".join(hosts)

    def http(self, method, path, body=None, broker=None):
        """An admin request to a live broker; returns (status, parsed JSON or bytes)."""
        target = broker or next(b for b in self.brokers if b.alive())
        data = None if body is None else (body if isinstance(body, bytes) else body.encode())
        req = urllib.request.Request(self.url_of(target, "http") + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                raw = resp.read()
                status = resp.status
        except urllib.error.HTTPError as e:
            raw, status = e.read(), e.code
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, raw

    def owner_of(self, topic):
        """The broker process serving `topic` (after an HTTP lookup)."""
        name = topic.replace("persistent://", "persistent/")
        status, answer = self.http("GET", "/lookup/v2/topic/" + name)
        assert status == 200, (status, answer)
        url = answer["brokerUrl"]
        return next(b for b in self.brokers if self.url_of(b, "pulsar") == url)

    def ledgers(self, *args):
        """`vela ledgers --metadata ... ARGS`: (exit status, output)."""
        done = subprocess.run(
            [self.vela, "ledgers", "--metadata", self.etcd.url] + list(args),
            capture_output=True,
            text=True,
            timeout=120,
        )
        return done.returncode, done.stdout + done.stderr

    def close(self):
        for proc in self.brokers + self.bookies:
            proc.terminate(10)
        self.etcd.terminate(10)
        shutil.rmtree(self.dir, ignore_errors=True)

    def logs(self):
        parts = []
        for proc in self.brokers + self.bookies:
            parts.append("---- %s ----\n%s" % (proc.name, "\n".join(proc.log_lines[-80:])))
        return "\n".join(parts)
