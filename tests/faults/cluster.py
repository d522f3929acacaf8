"""A real cluster for fault schedules: etcd, 3 bookies, 3 brokers, each
process on its own loopback address, every server endpoint behind a fault
proxy (netproxy.FaultNet).

Addresses (S = 100 + slot, so two runs side by side never share one):
  127.S.0.N   where process N listens (etcd .10, bookie-i .2i, broker-i .3i)
  127.S.1.N   its proxy: what the others dial (etcd URL, a bookie's
              advertised address, a broker's advertised host)
Ports are fixed (2379, 3181, 6650, 8080): the addresses are private to the run.

Clock faults: when libfaketime is installed, every vela process runs with it
preloaded, faking only the wall clock (CLOCK_REALTIME; the monotonic clock
never jumps on a real machine either), with an offset read from a file the
nemesis rewrites.
"""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import json

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "support"))

from velaproc import Proc, vela_binary  # noqa: E402
from netproxy import FaultNet  # noqa: E402

ETCD_PORT, ETCD_PEER_PORT, BOOKIE_PORT, PULSAR_PORT, HTTP_PORT = 2379, 2380, 3181, 6650, 8080
FAKETIME_PATHS = (
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1",
    "/usr/lib/faketime/libfaketimeMT.so.1",
)
SESSION_TTL_MS = 2000


def faketime_lib():
    return next((p for p in FAKETIME_PATHS if os.path.exists(p)), None)


class EtcdProc(Proc):
    def __init__(self, ip, data_dir):
        self.ip = ip
        client = "http://%s:%d" % (ip, ETCD_PORT)
        peer = "http://%s:%d" % (ip, ETCD_PEER_PORT)
        cmd = [
            shutil.which("etcd") or "etcd",
            "--name", "default", "--data-dir", data_dir,
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", "default=" + peer,
        ]  # fmt: skip
        super().__init__("etcd", cmd, r".")

    def start(self):
        self.proc = subprocess.Popen(
            self.cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            text=True, start_new_session=True,
        )  # fmt: skip
        threading.Thread(target=self._pump, args=(self.proc.stderr,), daemon=True).start()
        deadline = time.time() + 30
        url = "http://%s:%d/health" % (self.ip, ETCD_PORT)
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


class FaultCluster:
    def __init__(self, slot, seed, bookies=3, brokers=3, workdir=None, live_groups=None):
        self.s = 100 + slot
        self.dir = workdir or tempfile.mkdtemp(prefix="vela-faults-")
        os.makedirs(self.dir, exist_ok=True)
        self.vela = vela_binary()
        self.procs = _Registry(self, live_groups if live_groups is not None else {})
        self.clock_files = {}
        self.faketime = faketime_lib()
        self.net = FaultNet(seed ^ 0x5EED, self.pids)
        self.workload_pid = None
        try:
            self._start(bookies, brokers)
        except BaseException:
            self.close()
            raise

    def real(self, n):
        return "127.%d.0.%d" % (self.s, n)

    def proxied(self, n):
        return "127.%d.1.%d" % (self.s, n)

    def pids(self):
        out = {p.proc.pid: name for name, p in list(self.procs.items()) if p.proc is not None and p.proc.poll() is None}
        if self.workload_pid is not None:
            out[self.workload_pid] = "client"
        return out

    @property
    def etcd_url(self):
        return "etcd://%s:%d" % (self.proxied(10), ETCD_PORT)

    def _vela_env(self, name):
        if not self.faketime:
            return None
        path = os.path.join(self.dir, "clock-%s" % name)
        with open(path, "w") as f:
            f.write("+0\n")
        self.clock_files[name] = path
        return {
            "LD_PRELOAD": self.faketime,
            "FAKETIME_TIMESTAMP_FILE": path,
            "FAKETIME_CACHE_DURATION": "1",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        }

    def _start(self, bookies, brokers):
        etcd = EtcdProc(self.real(10), os.path.join(self.dir, "etcd"))
        self.procs["etcd"] = etcd
        self.net.add_proxy("etcd", (self.proxied(10), ETCD_PORT), (self.real(10), ETCD_PORT))
        for i in range(bookies):
            n = 20 + i
            name = "bookie-%d" % i
            self.net.add_proxy(name, (self.proxied(n), BOOKIE_PORT), (self.real(n), BOOKIE_PORT))
            data = os.path.join(self.dir, name)
            cmd = [
                self.vela, "bookie",
                "--journal-dir", os.path.join(data, "journal"),
                "--ledger-dir", os.path.join(data, "ledgers"),
                "--bind", self.real(n), "--port", str(BOOKIE_PORT),
                "--advertised-address", "%s:%d" % (self.proxied(n), BOOKIE_PORT),
                "--metadata", self.etcd_url, "--bookie-id", name,
                "--lost-bookie-grace-s", "5", "--autorecovery-interval-s", "2",
                "--write-cache-mb", "16", "--read-cache-mb", "8",
            ]  # fmt: skip
            _GroupProc(name, cmd, r"vela bookie listening on", self._vela_env(name), self.procs)
        for i in range(brokers):
            n = 30 + i
            name = "broker-%d" % i
            self.net.add_proxy(name, (self.proxied(n), PULSAR_PORT), (self.real(n), PULSAR_PORT))
            cmd = [
                self.vela, "broker", "--metadata", self.etcd_url,
                "--bind", self.real(n), "--port", str(PULSAR_PORT), "--http-port", str(HTTP_PORT),
                "--advertised-host", self.proxied(n),
                "--session-ttl-ms", str(SESSION_TTL_MS),
                "--ensemble-size", "3", "--write-quorum", "3", "--ack-quorum", "2",
            ]  # fmt: skip
            _GroupProc(name, cmd, r"vela broker ready", self._vela_env(name), self.procs)

    # --- names -------------------------------------------------------------------

    @property
    def bookies(self):
        return sorted(n for n in self.procs if n.startswith("bookie-"))

    @property
    def brokers(self):
        return sorted(n for n in self.procs if n.startswith("broker-"))

    def service_url(self):
        return "pulsar://" + ",".join("%s:%d" % (self.proxied(30 + int(b.split("-")[1])), PULSAR_PORT) for b in self.brokers)

    def broker_urls(self):
        """One service URL per broker (its proxy)."""
        return ["pulsar://%s:%d" % (self.proxied(30 + int(b.split("-")[1])), PULSAR_PORT) for b in self.brokers]

    def broker_of_host(self, host):
        for b in self.brokers:
            if self.proxied(30 + int(b.split("-")[1])) == host:
                return b
        return None

    # --- admin -------------------------------------------------------------------

    def http(self, method, path, body=None, broker=None, timeout_s=10):
        targets = [broker] if broker else [b for b in self.brokers if self.procs[b].alive()]
        last = None
        for b in targets:
            url = "http://%s:%d%s" % (self.real(30 + int(b.split("-")[1])), HTTP_PORT, path)
            data = None if body is None else body.encode()
            req = urllib.request.Request(url, data=data, method=method)
            if data is not None:
                req.add_header("Content-Type", "application/json")
            try:
                with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                    raw, status = resp.read(), resp.status
            except urllib.error.HTTPError as e:
                raw, status = e.read(), e.code
            except (urllib.error.URLError, OSError) as e:
                last = e
                continue
            try:
                return status, json.loads(raw) if raw else None
            except ValueError:
                return status, raw
        raise RuntimeError("no broker answered %s %s: %s" % (method, path, last))

    def owner_of(self, topic, timeout_s=3):
        """The broker serving `topic` per an HTTP lookup, or None."""
        name = topic.replace("persistent://", "persistent/")
        try:
            status, answer = self.http("GET", "/lookup/v2/topic/" + name, timeout_s=timeout_s)
        except RuntimeError:
            return None
        if status != 200 or not isinstance(answer, dict):
            return None
        host = answer.get("brokerUrl", "")[len("pulsar://"):].rsplit(":", 1)[0]
        return self.broker_of_host(host)

    # --- processes -----------------------------------------------------------------

    def kill9(self, name):
        p = self.procs[name]
        if p.alive():
            os.killpg(p.proc.pid, signal.SIGKILL)
            p.proc.wait(timeout=10)

    def restart(self, name):
        self.procs[name].start()
        self.procs[name] = self.procs[name]  # its new process group

    def stop_signal(self, name):
        os.killpg(self.procs[name].proc.pid, signal.SIGSTOP)

    def cont_signal(self, name):
        p = self.procs[name]
        if p.alive():
            os.killpg(p.proc.pid, signal.SIGCONT)

    def set_clock(self, name, offset_s):
        path = self.clock_files[name]
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            f.write("%+d\n" % offset_s)
        os.replace(tmp, path)

    def close(self, keep_dir=False):
        for name, p in self.procs.items():
            if p.proc is not None and p.alive():
                try:
                    os.killpg(p.proc.pid, signal.SIGCONT)
                except OSError:
                    pass
        for name, p in self.procs.items():
            if p.proc is None or not p.alive():
                continue
            try:
                os.killpg(p.proc.pid, signal.SIGTERM)
                p.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                try:
                    os.killpg(p.proc.pid, signal.SIGKILL)
                    p.proc.wait(timeout=10)
                except (OSError, subprocess.TimeoutExpired):
                    pass
        self.net.close()
        self.procs.forget()
        if not keep_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def logs(self, lines=200):
        return "\n".join("---- %s ----\n%s" % (n, "\n".join(p.log_lines[-lines:])) for n, p in self.procs.items())


class _Registry(dict):
    """name -> process; each process group also entered in `live_groups`
    (the harness's list of what to kill if it is stopped)."""

    def __init__(self, cluster, live_groups):
        super().__init__()
        self.key = id(cluster)
        self.live_groups = live_groups

    def __setitem__(self, name, proc):
        super().__setitem__(name, proc)
        if proc.proc is not None:
            self.live_groups[(self.key, name)] = proc.proc.pid

    def forget(self):
        for name in self:
            self.live_groups.pop((self.key, name), None)


class _GroupProc(Proc):
    """A Proc in its own process group (kill -9 and SIGSTOP reach all of it;
    cleanup kills the group), entered in `registry` as soon as it is spawned
    so the proxies can name its connections from the first one on."""

    def __init__(self, name, cmd, ready, env, registry):
        self.registry = registry
        super().__init__(name, cmd, ready, env)

    def popen_options(self):
        # Its own session, and the harness's working directory.
        return {"start_new_session": True}

    def spawned(self):
        self.registry[self.name] = self

