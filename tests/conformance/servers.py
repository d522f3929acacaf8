"""The two systems under test, each started as a client's CI starts Pulsar.

Owns: turning a client's CI broker configuration (a Pulsar `standalone.conf`
from the client's repository, plus the system properties its scripts set)
into a running Apache Pulsar 4.0.8 standalone, or into the closest `vela
standalone` command line; running the CI's setup calls (tenants, namespaces,
grants) against either; stopping them and removing their data.

Vela gets a flag for every CI key it has one for. Keys without a Vela flag are
reported (`VelaServer.missing`), never silently dropped: the suite's failures
then show what they cost.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PULSAR_HOME = ROOT / "bench" / "pulsar"
PULSAR_LIB = PULSAR_HOME / "dist" / "lib"

# Pulsar's JVM as bench/bench.py starts it (bin/pulsar's flags); the heap is
# the client CI's where its scripts set PULSAR_MEM.
PULSAR_MEM_DEFAULT = "-Xms2g -Xmx2g -XX:MaxDirectMemorySize=4g"
PULSAR_GC = ("-XX:+UseG1GC -XX:MaxGCPauseMillis=10 -XX:+ParallelRefProcEnabled "
             "-XX:+UnlockExperimentalVMOptions -XX:+DoEscapeAnalysis "
             "-XX:G1NewSizePercent=50 -XX:+DisableExplicitGC")
JVM_MODULE_FLAGS = [
    "--add-opens", "java.base/java.nio=ALL-UNNAMED",
    "--add-opens", "java.base/sun.nio.ch=ALL-UNNAMED",
    "--add-opens", "java.base/jdk.internal.misc=ALL-UNNAMED",
    "--add-opens", "java.base/java.lang=ALL-UNNAMED",
    "--add-opens", "java.base/java.util=ALL-UNNAMED",
    "--add-opens", "java.base/sun.net=ALL-UNNAMED",
    "--add-exports", "java.base/jdk.internal.platform=ALL-UNNAMED",
    "--add-opens", "java.management/sun.management=ALL-UNNAMED",
    "--add-opens", "jdk.management/com.sun.management.internal=ALL-UNNAMED",
]

# Startup on two busy cores: Pulsar's JVM, bookie and metadata store take a
# minute or more; Vela a second. Past these the run stops with the log's tail.
PULSAR_START_TIMEOUT_S = 300
VELA_START_TIMEOUT_S = 60
# How long the CI's setup waits for the default namespace to exist.
TENANT_WAIT_S = 60
STOP_GRACE_S = 20


class Fail(Exception):
    """A setup step failed; the message says what and where to look."""


@dataclass
class Ports:
    """The four listeners, on free loopback ports (the suites' sources are
    rewritten from Pulsar's defaults 6650/6651/8080/8443 to these)."""
    broker: int
    broker_tls: int
    web: int
    web_tls: int

    @staticmethod
    def pick() -> "Ports":
        socks, ports = [], []
        for _ in range(4):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
        for s in socks:
            s.close()
        return Ports(*ports)

    def default_to_picked(self) -> dict:
        return {6650: self.broker, 6651: self.broker_tls,
                8080: self.web, 8443: self.web_tls}

    def check_free(self) -> None:
        for port in self.default_to_picked().values():
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    raise Fail(f"port {port} is taken; run again (new ports are picked each run)")


@dataclass
class SetupCall:
    """One admin REST call of the client's CI setup script."""
    method: str
    path: str  # below /admin/v2/
    body: object | None
    why: str
    # When the call answers 409 (the resource exists already): the calls that
    # give it the state the CI's call gives it on Pulsar, where it does not
    # exist yet at that point. None: a conflict is left as it is.
    on_conflict: list | None = None


@dataclass
class CiSetup:
    """How a client's CI runs its broker, read from the client's repository."""
    name: str
    conf: dict  # the CI's standalone.conf, key -> value, paths made absolute
    jvm_properties: dict  # -D... the CI scripts set (PULSAR_EXTRA_OPTS)
    pulsar_mem: str
    secret_key: Path
    superuser_token: str
    calls: list  # SetupCall, in the CI script's order
    # The calls change tenant `public` and namespace `public/default`, which
    # the broker creates at start: wait for them (the CI scripts race with
    # the broker and mostly win).
    wait_for_public_default: bool = False
    notes: list = field(default_factory=list)


def parse_conf(text: str) -> dict:
    conf = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, value = line.split("=", 1)
        conf[key.strip()] = value.strip()
    return conf


def spawn(cmd: list, log_path: Path, **kwargs) -> subprocess.Popen:
    """Starts `cmd` in its own process group, output to log_path."""
    with open(log_path, "ab") as log:
        return subprocess.Popen([str(c) for c in cmd], stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, **kwargs)


def stop_group(proc: subprocess.Popen, grace: float = STOP_GRACE_S) -> None:
    """SIGTERM to the process group we started, SIGKILL after `grace` s."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def http(method: str, url: str, token: str | None, body=None, timeout: float = 30) -> tuple:
    """One HTTP request; returns (status, body text). Never raises for a status."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    request.add_header("Accept", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(errors="replace")
    except OSError as error:
        return 0, str(error)


class Server:
    system = "?"

    def __init__(self, setup: CiSetup, ports: Ports, work: Path):
        self.setup = setup
        self.ports = ports
        self.dir = work / self.system
        self.dir.mkdir(parents=True, exist_ok=True)
        self.log = self.dir / "server.log"
        self.proc: subprocess.Popen | None = None
        # What the CI configures that this system was not given, key -> why.
        self.missing: dict = {}
        self.setup_log: list = []

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.web}/admin/v2"

    def wait_ports(self, timeout_s: float, ports: list) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise Fail(f"{self.system} exited during startup (exit {self.proc.returncode}):\n"
                           f"{tail(self.log)}")
            if all(port_open(p) for p in ports):
                return
            time.sleep(0.5)
        raise Fail(f"{self.system} did not open ports {ports} within {timeout_s} s:\n{tail(self.log)}")

    def run_setup_calls(self) -> None:
        """The CI script's admin calls, in order. Like the scripts (curl
        without --fail; pulsar-admin under `set -e` only for its own
        errors), a refused call is logged and the run goes on."""
        token = self.setup.superuser_token
        deadline = time.monotonic() + TENANT_WAIT_S
        while self.setup.wait_for_public_default and time.monotonic() < deadline:
            status, text = http("GET", f"{self.admin_url}/namespaces/public", token)
            if status == 200 and "public/default" in text:
                break
            time.sleep(1)
        for call in self.setup.calls:
            status, text = http(call.method, f"{self.admin_url}/{call.path}", token, call.body)
            line = f"{call.method} /admin/v2/{call.path} -> {status} {text.strip()[:160]}"
            self.setup_log.append(line)
            if status == 409 and call.on_conflict:
                for then in call.on_conflict:
                    status, text = http(then.method, f"{self.admin_url}/{then.path}", token,
                                        then.body)
                    self.setup_log.append(f"  409, so {then.method} /admin/v2/{then.path} "
                                          f"-> {status} {text.strip()[:160]}")

    def stop(self) -> None:
        if self.proc is not None:
            stop_group(self.proc)
            self.proc = None


class PulsarServer(Server):
    system = "pulsar"

    def start(self) -> None:
        if not PULSAR_LIB.is_dir():
            subprocess.run([str(PULSAR_HOME / "install.sh")], check=True)
        conf = dict(self.setup.conf)
        conf.update({
            "brokerServicePort": str(self.ports.broker),
            "brokerServicePortTls": str(self.ports.broker_tls),
            "webServicePort": str(self.ports.web),
            "webServicePortTls": str(self.ports.web_tls),
            # The CI binds 0.0.0.0 inside a container; here only loopback.
            "bindAddress": "127.0.0.1",
        })
        conf_path = self.dir / "standalone.conf"
        conf_path.write_text("".join(f"{k}={v}\n" for k, v in conf.items()))
        props = [f"-D{k}={v}" for k, v in self.setup.jvm_properties.items()]
        cmd = (["java"] + self.setup.pulsar_mem.split() + PULSAR_GC.split() + JVM_MODULE_FLAGS
               + ["-Dpulsar.allocator.exit_on_oom=true",
                  f"-Dlog4j2.configurationFile={PULSAR_HOME / 'log4j2.xml'}"]
               + props
               + ["-cp", f"{PULSAR_LIB}/*", "org.apache.pulsar.PulsarStandaloneStarter",
                  "--config", conf_path, "--no-functions-worker", "--no-stream-storage",
                  "--metadata-dir", self.dir / "metadata",
                  "--bookkeeper-dir", self.dir / "bookkeeper"])
        self.ports.check_free()
        self.proc = spawn(cmd, self.log, cwd=self.dir)
        self.wait_ports(PULSAR_START_TIMEOUT_S, [self.ports.broker, self.ports.broker_tls,
                                                 self.ports.web, self.ports.web_tls])
        # The CI scripts wait for /metrics before their setup calls.
        deadline = time.monotonic() + PULSAR_START_TIMEOUT_S
        while http("GET", f"http://127.0.0.1:{self.ports.web}/metrics", None, timeout=10)[0] != 200:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise Fail(f"Pulsar's /metrics did not answer:\n{tail(self.log)}")
            time.sleep(1)
        self.run_setup_calls()


# CI keys (Pulsar's ServiceConfiguration) that `vela standalone` takes, and how.
# The value is the flag, or a function of the value returning flag arguments.
def _file_url_path(value: str) -> str:
    return value[len("file://"):] if value.startswith("file://") else value


VELA_FLAGS = {
    "brokerServicePort": None,  # ports: from Ports, below
    "brokerServicePortTls": None,
    "webServicePort": None,
    "webServicePortTls": None,
    "bindAddress": None,  # loopback, below
    "advertisedAddress": lambda v: ["--advertised-host", v],
    "tlsCertificateFilePath": lambda v: ["--tls-cert-file", v],
    "tlsKeyFilePath": lambda v: ["--tls-key-file", v],
    "tokenSecretKey": lambda v: ["--auth-token-secret-key", _file_url_path(v)],
    "tokenPublicKey": lambda v: ["--auth-token-public-key", _file_url_path(v)],
    "superUserRoles": lambda v: ["--superuser-roles", v],
    "maxMessageSize": lambda v: ["--max-message-size", v],
    "managedLedgerMaxEntriesPerLedger": lambda v: ["--ledger-max-entries", v],
    "managedLedgerMaxSizePerLedgerMbytes": lambda v: ["--ledger-max-size-mb", v],
    "managedLedgerMinLedgerRolloverTimeMinutes": lambda v: ["--ledger-min-rollover-minutes", v],
    "managedLedgerMaxLedgerRolloverTimeMinutes": lambda v: ["--ledger-max-rollover-minutes", v],
    "keepAliveIntervalSeconds": lambda v: ["--keepalive-s", v],
    # Vela's one policy pass applies TTL, backlog quotas and retention.
    "backlogQuotaCheckIntervalInSeconds": lambda v: ["--policy-check-interval-s", v],
    "managedLedgerDefaultEnsembleSize": lambda v: ["--ensemble-size", v],
    "managedLedgerDefaultWriteQuorum": lambda v: ["--write-quorum", v],
    "managedLedgerDefaultAckQuorum": lambda v: ["--ack-quorum", v],
    "tlsEnabled": None,  # implied by the TLS ports
    "authenticationEnabled": None,  # implied by the token key
    "authorizationEnabled": lambda v: [] if v == "true" else ["--no-authorization"],
    # Pulsar's provider class names are taken as they are.
    "authenticationProviders": lambda v: ["--authentication-providers", v],
    "anonymousUserRole": lambda v: ["--anonymous-user-role", v],
    "basicAuthConf": lambda v: ["--basic-auth-conf", _file_url_path(v)],
    "tlsTrustCertsFilePath": lambda v: ["--tls-trust-certs-file", v],
    "clusterName": None,  # Vela's standalone cluster is `standalone`, as here
    "transactionCoordinatorEnabled": lambda v: ["--transaction-coordinator-enabled"] if v == "true" else [],
}

# CI keys about parts Vela does not have (ZooKeeper, BookKeeper's client, the
# load manager, geo-replication, functions), or about Pulsar's own process:
# nothing to pass and nothing a client can see.
NOT_APPLICABLE_PREFIXES = (
    "zookeeper", "zooKeeper", "configurationStore", "globalZookeeper", "bookkeeperClient",
    "loadBalancer", "replication", "managedLedgerCache", "statusFilePath",
    "brokerClient", "brokerShutdownTimeoutMs", "managedLedgerCursor",
    "managedLedgerDefaultMarkDeleteRateLimit", "brokerServicePurgeInactiveFrequencyInSeconds",
    "transactionMetadataStoreProviderClassName", "transactionBufferSnapshot",
)


class VelaServer(Server):
    system = "vela"

    def __init__(self, setup: CiSetup, ports: Ports, work: Path, vela_bin: Path, auth: str):
        super().__init__(setup, ports, work)
        self.vela_bin = vela_bin
        self.auth = auth  # "ci": the CI's authentication; "none": diagnostic, off

    def command(self) -> list:
        conf = self.setup.conf
        cmd = [self.vela_bin, "standalone", "--data-dir", self.dir / "data",
               "--bind", "127.0.0.1",
               "--port", self.ports.broker, "--http-port", self.ports.web]
        tls = conf.get("tlsCertificateFilePath") and conf.get("tlsKeyFilePath")
        if tls:
            cmd += ["--tls-port", self.ports.broker_tls, "--https-port", self.ports.web_tls]
        auth_keys = {"tokenSecretKey", "tokenPublicKey", "superUserRoles", "authorizationEnabled",
                     "authenticationEnabled", "authenticationProviders", "anonymousUserRole",
                     "basicAuthConf", "tlsTrustCertsFilePath"}
        for key, value in conf.items():
            if self.auth == "none" and key in auth_keys:
                self.missing[key] = "left out: --vela-auth none (diagnostic run without authentication)"
                continue
            if key in VELA_FLAGS:
                translate = VELA_FLAGS[key]
                if translate is not None and value != "":
                    cmd += translate(value)
            elif key.startswith(NOT_APPLICABLE_PREFIXES):
                continue
            else:
                self.missing[key] = f"{value} (no Vela flag)"
        for key, value in self.setup.jvm_properties.items():
            # The Basic provider's file, when the CI gives it as a system
            # property (Pulsar reads `basicAuthConf` or this one).
            if key == "pulsar.auth.basic.conf" and "basicAuthConf" not in conf:
                if self.auth == "ci":
                    cmd += ["--basic-auth-conf", _file_url_path(value)]
                else:
                    self.missing[f"-D{key}"] = "left out: --vela-auth none"
                continue
            self.missing[f"-D{key}"] = f"{value} (no Vela flag)"
        return cmd

    def start(self) -> None:
        cmd = self.command()
        self.ports.check_free()
        self.proc = spawn(cmd, self.log, cwd=self.dir)
        ports = [self.ports.broker, self.ports.web]
        if "--tls-port" in cmd:
            ports += [self.ports.broker_tls, self.ports.web_tls]
        self.wait_ports(VELA_START_TIMEOUT_S, ports)
        self.run_setup_calls()
