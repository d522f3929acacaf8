"""The official clients' own test suites, prepared and run as their CI runs them.

Owns: unpacking a client snapshot (a bare git dir from the search tool's
`fetch`, or a checkout) into a temporary directory; pointing its sources at
the runner's free ports; the credentials its CI makes; reading its CI broker
configuration and setup calls (`CiSetup`); listing its tests and what is left
out (Docker, separate CI jobs); running the tests with a per-test timeout,
resuming after a test that hangs or crashes the run.

Nothing of a client repository is copied into Vela's tree: it lives under the
run's temporary directory and is deleted with it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from servers import CiSetup, Fail, Ports, SetupCall, parse_conf, stop_group

HERE = Path(__file__).resolve().parent

# A hung test is killed this long after its own timeout should have fired
# (pytest-timeout's), or at the per-test timeout where there is none (Go).
HANG_GRACE_S = 60
# Output kept per test for its failure line and the log (bytes): a test that
# logs in a loop must not fill the memory of the runner.
TEST_OUTPUT_BYTES_MAX = 256 * 1024
POLL_S = 0.5

# Pulsar's default ports in the clients' sources, replaced by the run's ports.
DEFAULT_PORT_RE = re.compile(r"\b(localhost|127\.0\.0\.1):(6650|6651|8080|8443)\b")


def default_signals() -> None:
    """In the test process: SIGINT as an interactive shell leaves it. A runner
    started in the background inherits SIGINT ignored, and Python then never
    raises KeyboardInterrupt (interrupted_test.py sends itself SIGINT)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def exit_status(returncode: int) -> str:
    if returncode is not None and returncode < 0:
        return f"killed by {signal.Signals(-returncode).name}"
    return f"exit code {returncode}"


@dataclass
class Result:
    id: str
    outcome: str  # passed failed error skipped timeout crashed flaky not-run
    duration_s: float = 0.0
    message: str = ""
    tries: int = 1
    tags: list = field(default_factory=list)


def unpack_snapshot(snapshot: Path, ref: str | None, dest: Path) -> str:
    """Puts the client's files at `ref` into dest; returns the ref used.
    `snapshot` is a bare git dir (`git archive`) or a checkout (copied)."""
    dest.mkdir(parents=True)
    git_dir = snapshot if (snapshot / "objects").is_dir() else snapshot / ".git"
    if (git_dir / "objects").is_dir() and ref:
        archive = subprocess.run(["git", "--git-dir", str(git_dir), "archive", ref],
                                 check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
        return ref
    if ref:
        raise Fail(f"{snapshot} is not a git directory: cannot check out {ref}")
    subprocess.run(["cp", "-a", f"{snapshot}/.", str(dest)], check=True)
    return "(working tree as given)"


def git_tags(snapshot: Path) -> list:
    git_dir = snapshot if (snapshot / "objects").is_dir() else snapshot / ".git"
    out = subprocess.run(["git", "--git-dir", str(git_dir), "tag"], capture_output=True, text=True)
    return out.stdout.split()


def version_key(tag: str) -> tuple:
    nums = re.findall(r"\d+", tag)
    return tuple(int(n) for n in nums)


def rewrite_ports(files: list, ports: Ports) -> int:
    """Points every `localhost:6650`-style address in `files` at the run's ports."""
    mapping = ports.default_to_picked()
    changed = 0
    for path in files:
        text = path.read_text(errors="surrogateescape")
        new = DEFAULT_PORT_RE.sub(lambda m: f"{m.group(1)}:{mapping[int(m.group(2))]}", text)
        if new != text:
            path.write_text(new, errors="surrogateescape")
            changed += 1
    return changed


def hs256_token(secret: bytes, subject: str) -> str:
    """A JWT as `pulsar tokens create --secret-key` makes it (HS256, `sub` only)."""
    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()
    signing_input = b64(b'{"alg":"HS256"}') + "." + b64(json.dumps({"sub": subject}).encode())
    signature = hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
    return signing_input + "." + b64(signature)


def absolute_paths(conf: dict, prefixes: dict) -> dict:
    """The CI's container paths (`/pulsar/certs/...`) as paths in our copy."""
    out = {}
    for key, value in conf.items():
        for old, new in prefixes.items():
            value = value.replace(old, str(new))
        out[key] = value
    return out


class Suite:
    """One client's suite in one temporary copy, run against any server."""
    name = "?"

    def __init__(self, snapshot: Path, ref: str | None, work: Path, ports: Ports):
        self.snapshot = snapshot
        self.work = work
        self.ports = ports
        self.src = work / "src"
        is_git = (snapshot / "objects").is_dir() or (snapshot / ".git" / "objects").is_dir()
        # A plain copy of the sources is taken as it is; a git dir at the
        # ref asked for, else at the client's release (see default_ref).
        self.ref = unpack_snapshot(snapshot, ref or (self.default_ref() if is_git else None),
                                   self.src)
        self.left_out: list = []  # (id, reason)
        self.tags: dict = {}  # id -> [tag]
        self.output: dict = {}  # id -> accumulated output (Go)
        self.logs = work / "logs"
        self.logs.mkdir(exist_ok=True)

    def default_ref(self) -> str | None:
        return None

    # -- running, with a per-test timeout and resumption ------------------------

    def run(self, ids: list, timeout_s: int, label: str) -> dict:
        """Runs `ids` (in order); returns id -> Result. A test still running
        past its timeout (plus grace) is killed with the whole run, recorded
        as `timeout`, and the run resumes after it; a run that dies inside a
        test records it as `crashed`."""
        results: dict = {}
        remaining = list(ids)
        launch = 0
        while remaining:
            launch += 1
            events = self.logs / f"{label}-{launch}.events"
            events.write_text("")
            proc, launched = self.launch(remaining, timeout_s, events,
                                         self.logs / f"{label}-{launch}.log")
            current, started, done_before = None, 0.0, len(results)
            position = 0
            hung = False
            try:
                while True:
                    exited = proc.poll() is not None
                    with open(events, "rb") as f:
                        f.seek(position)
                        chunk = f.read()
                    complete = chunk[:chunk.rfind(b"\n") + 1]
                    position += len(complete)
                    for line in complete.decode(errors="replace").splitlines():
                        for kind, test_id, result in self.parse_event(line):
                            if kind == "start" and test_id in remaining:
                                current, started = test_id, time.monotonic()
                            elif kind == "end" and test_id in remaining:
                                result.tags = self.tags.get(test_id, [])
                                previous = results.get(test_id)
                                if previous is None or previous.outcome in ("passed", "skipped"):
                                    results[test_id] = result
                                if test_id == current:
                                    current = None
                    if exited:
                        break
                    if current is not None and time.monotonic() - started > self.hang_limit(timeout_s):
                        stop_group(proc, grace=5)
                        hung = True
                        break
                    time.sleep(POLL_S)
            finally:
                # Interrupted (Ctrl-C): the test run goes too.
                stop_group(proc, grace=5)
            if current is not None and current not in results:
                outcome = "timeout" if hung else "crashed"
                elapsed = time.monotonic() - started
                message = (f"still running after {elapsed:.0f} s: killed" if hung
                           else self.crash_message(current, proc.returncode))
                results[current] = Result(current, outcome, elapsed, message,
                                          tags=self.tags.get(current, []))
            if len(results) == done_before:
                # The run ended without running anything more: do not loop.
                for test_id in (i for i in launched if i not in results):
                    results[test_id] = Result(test_id, "not-run", 0.0,
                                              f"the test run exited (code {proc.returncode}) "
                                              f"before it; see {events.with_suffix('.log')}")
            remaining = [i for i in remaining if i not in results]
        return results

    def hang_limit(self, timeout_s: int) -> float:
        return timeout_s + HANG_GRACE_S

    def crash_message(self, test_id: str, returncode: int) -> str:
        return f"the test process died during this test ({exit_status(returncode)})"


class PythonSuite(Suite):
    """apache/pulsar-client-python: tests/*.py (unittest), run here with pytest
    and pytest-timeout, as CI's tests/run-unit-tests.sh lists them."""
    name = "python"

    def default_ref(self) -> str | None:
        # The release of the installed client (`pip show pulsar-client`): its
        # tag, or its newest release candidate's (the voted candidate).
        try:
            from importlib.metadata import version
            installed = version("pulsar-client")
        except Exception as error:  # noqa: BLE001 (any failure: say so)
            raise Fail(f"pulsar-client is not installed ({error}): "
                       "pip install 'pulsar-client[avro,protobuf]' pytest pytest-timeout requests")
        tags = git_tags(self.snapshot)
        exact = f"v{installed}"
        if exact in tags:
            return exact
        candidates = sorted((t for t in tags if t.startswith(exact + "-candidate-")), key=version_key)
        if candidates:
            return candidates[-1]
        raise Fail(f"no tag v{installed} (or a candidate of it) in {self.snapshot}")

    def prepare(self) -> CiSetup:
        tests = self.src / "tests"
        ci_list = (tests / "run-unit-tests.sh").read_text()
        self.files = re.findall(r"^python3 (\w+\.py)\s*$", ci_list, re.M)
        for path in sorted(tests.glob("*_test.py")):
            if path.name not in self.files:
                self.left_out.append((path.name, "not in tests/run-unit-tests.sh: CI runs it "
                                      "apart, against an OAuth2 server in docker compose"))
        for name in list(self.files):
            if "testcontainers" in (tests / name).read_text():
                self.files.remove(name)
                self.left_out.append((name, "needs Docker (testcontainers starts Pulsar clusters)"))
        rewrite_ports(sorted(tests.glob("*.py")), self.ports)

        # build-support/start-test-service-inside-container.sh
        secret = secrets.token_bytes(32)
        key_path = self.work / "secret.key"
        key_path.write_bytes(secret)
        (tests / ".test-token.txt").write_text(hs256_token(secret, "token-principal") + "\n")
        conf_text = (tests / "test-conf" / "standalone-ssl.conf").read_text()
        conf = absolute_paths(parse_conf(conf_text), {"test-conf/": f"{tests}/test-conf/"})
        conf["tokenSecretKey"] = f"file://{key_path}"
        namespace_grant = {"auth_policies": {"namespace_auth": {"anonymous": ["produce", "consume"]}},
                           "replication_clusters": ["standalone"]}
        # On Pulsar these PUTs create tenant `public` and `public/default`
        # (its standalone cannot: its internal admin client has no
        # credentials here). A broker that created them at start answers 409;
        # the same state then comes from the update and grant calls.
        public_tenant = {"adminRoles": ["anonymous"], "allowedClusters": ["standalone"]}

        def grant_anonymous(namespace: str) -> list:
            return [SetupCall("POST", f"namespaces/{namespace}/permissions/anonymous",
                              ["produce", "consume"], "the grant of the PUT's body")]
        calls = [
            SetupCall("PUT", "clusters/standalone", {
                "serviceUrl": f"http://localhost:{self.ports.web}/",
                "serviceUrlTls": f"https://localhost:{self.ports.web_tls}/",
                "brokerServiceUrl": f"pulsar://localhost:{self.ports.broker}/",
                "brokerServiceUrlTls": f"pulsar+ssl://localhost:{self.ports.broker_tls}/"},
                "cluster URLs"),
            SetupCall("PUT", "tenants/public", public_tenant, "anonymous administers tenant public",
                      on_conflict=[SetupCall("POST", "tenants/public", public_tenant, "update")]),
            SetupCall("PUT", "namespaces/public/default", namespace_grant,
                      "anonymous may produce and consume",
                      on_conflict=grant_anonymous("public/default")),
            SetupCall("PUT", "namespaces/public/default-2", namespace_grant,
                      "anonymous may produce and consume",
                      on_conflict=grant_anonymous("public/default-2")),
            SetupCall("PUT", "tenants/private", {"adminRoles": [], "allowedClusters": ["standalone"]},
                      "tenant private"),
            SetupCall("PUT", "namespaces/private/auth", {
                "auth_policies": {"namespace_auth": {"token-principal": ["produce", "consume"]}},
                "replication_clusters": ["standalone"]}, "token-principal may produce and consume"),
        ]
        return CiSetup(
            name="python", conf=conf,
            jvm_properties={"pulsar.auth.basic.conf": str(tests / "test-conf" / ".htpasswd")},
            pulsar_mem=os.environ.get("PULSAR_MEM", "-Xms2g -Xmx2g -XX:MaxDirectMemorySize=4g"),
            secret_key=key_path, superuser_token=hs256_token(secret, "superUser"), calls=calls)

    def list_tests(self) -> list:
        out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                              "-p", "no:cacheprovider", "--rootdir", ".", *self.files],
                             cwd=self.src / "tests", capture_output=True, text=True)
        ids = [line.strip() for line in out.stdout.splitlines() if "::" in line]
        if not ids:
            raise Fail(f"pytest collected no tests:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
        return ids

    def launch(self, ids: list, timeout_s: int, events: Path, log: Path) -> subprocess.Popen:
        env = dict(os.environ, CONFORMANCE_EVENTS=str(events), PYTHONUNBUFFERED="1",
                   PYTHONDONTWRITEBYTECODE="1",
                   PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
        args_file = self.logs / f"{events.stem}.args"
        args_file.write_text("\n".join(ids) + "\n")
        cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "pytest_progress",
               "--rootdir", ".", "-q", "-rN", f"--timeout={timeout_s}",
               "--timeout-method=signal",
               f"@{args_file}"]
        with open(log, "ab") as out:
            proc = subprocess.Popen(cmd, cwd=self.src / "tests", env=env, stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, preexec_fn=default_signals)
        return proc, list(ids)

    def parse_event(self, line: str):
        try:
            event = json.loads(line)
        except ValueError:
            return
        if event.get("event") == "start":
            yield "start", event["id"], None
        elif event.get("event") == "end":
            message = event.get("message", "")
            outcome = event["outcome"]
            if outcome == "failed" and message.startswith("Failed: Timeout"):
                outcome = "timeout"
            yield "end", event["id"], Result(event["id"], outcome, event.get("duration", 0.0),
                                             message)


GO_FAIL_LINE_RES = [
    re.compile(r"^\s*Error:\s+(.*\S)"),          # testify
    re.compile(r"^(panic: .*\S)"),
    re.compile(r"^\s*(\w+_test\.go:\d+: .*\S)"),  # t.Error / t.Fatal
]


class GoSuite(Suite):
    """apache/pulsar-client-go: `go test` of the packages under pulsar/ and
    pulsaradmin/ as scripts/run-ci.sh runs them (without -race), one compiled
    test binary per package, top-level tests one after another."""
    name = "go"
    PACKAGE_ROOTS = ("./pulsar/...", "./pulsaradmin/...")

    def default_ref(self) -> str | None:
        releases = [t for t in git_tags(self.snapshot) if re.fullmatch(r"v\d+\.\d+\.\d+", t)]
        if not releases:
            raise Fail(f"no release tag vX.Y.Z in {self.snapshot}")
        return max(releases, key=version_key)

    def go_env(self) -> dict:
        # CI: CGO on (DataDog/zstd), GODEBUG as .github/workflows/ci.yml sets it.
        return dict(os.environ, CGO_ENABLED="1", GODEBUG="urlstrictcolons=1")

    def prepare(self, packages: list | None = None) -> CiSetup:
        roots = packages or list(self.PACKAGE_ROOTS)
        listed = subprocess.run(["go", "list", "-f", "{{.ImportPath}} {{.Dir}}", *roots],
                                cwd=self.src, capture_output=True, text=True, env=self.go_env())
        if listed.returncode != 0:
            raise Fail(f"go list failed:\n{listed.stderr[-3000:]}")
        self.packages = [tuple(line.split(" ", 1)) for line in listed.stdout.splitlines()]
        go_files = [p for root in ("pulsar", "pulsaradmin") for p in (self.src / root).rglob("*.go")]
        rewrite_ports(go_files, self.ports)
        selected = {Path(directory) for _, directory in self.packages}
        self.scan_sources([p for p in go_files if p.parent in selected])

        # Dockerfile, integration-tests/conf/standalone.conf and
        # scripts/pulsar-test-service-start.sh
        it = self.src / "integration-tests"
        conf = parse_conf((it / "conf" / "standalone.conf").read_text())
        conf = absolute_paths(conf, {"/pulsar/certs/": f"{it}/certs/",
                                     "/pulsar/tokens/": f"{it}/tokens/",
                                     "/pulsar/conf/": f"{it}/conf/"})
        grant = ["produce", "consume"]
        calls = [
            SetupCall("POST", "tenants/public", {"adminRoles": ["anonymous"],
                                                 "allowedClusters": ["standalone"]},
                      "pulsar-admin tenants update public -r anonymous"),
            SetupCall("POST", "namespaces/public/default/permissions/anonymous", grant,
                      "pulsar-admin namespaces grant-permission public/default"),
            SetupCall("PUT", "tenants/private", {"adminRoles": [], "allowedClusters": ["standalone"]},
                      "pulsar-admin tenants create private"),
            SetupCall("PUT", "namespaces/private/auth", {},
                      "pulsar-admin namespaces create private/auth"),
            SetupCall("POST", "namespaces/private/auth/permissions/token-principal", grant,
                      "pulsar-admin namespaces grant-permission private/auth"),
        ]
        return CiSetup(
            name="go", conf=conf,
            jvm_properties={"pulsar.auth.basic.conf": str(it / "conf" / ".htpasswd")},
            pulsar_mem=os.environ.get("PULSAR_MEM", "-Xms1g -Xmx1g -XX:MaxDirectMemorySize=1g"),
            secret_key=it / "tokens" / "secret.key",
            superuser_token=(it / "tokens" / "admin-token").read_text().strip(),
            calls=calls, wait_for_public_default=True,
            notes=["CI sets PULSAR_STANDALONE_USE_ZOOKEEPER=1 (ZooKeeper as Pulsar's metadata "
                   "store); here Pulsar keeps its default store: clients cannot see the difference"])

    def scan_sources(self, go_files: list) -> None:
        """Tags tests by what their bodies use (or the helpers they call, one
        level down), and leaves out those CI runs only against Docker
        containers or clusters."""
        func_re = re.compile(r"^func (\([^)]*\) )?(\w+)\(.*?\{$(.*?)^\}$", re.M | re.S)
        bodies = {}  # name -> (path, body); helpers share names across files rarely
        for path in go_files:
            if path.name.endswith("_test.go"):
                for _, name, body in func_re.findall(path.read_text(errors="replace")):
                    bodies[name] = (path, body)
        uses_docker = {n for n, (_, body) in bodies.items() if "testcontainers." in body}
        for path in go_files:
            if not path.name.endswith("_test.go"):
                continue
            text = path.read_text(errors="replace")
            package = path.parent.relative_to(self.src)
            build_tag = re.search(r"^//go:build (clustered|extensible_load_manager)", text, re.M)
            for receiver, name, body in func_re.findall(text):
                if receiver or not name.startswith("Test"):
                    continue  # suite methods run inside their suite's Test function
                test_id = f"{package}.{name}"
                if build_tag:
                    self.left_out.append((test_id, f"build tag {build_tag.group(1)}: CI runs it "
                                          "against a docker compose cluster"))
                    continue
                called = set(re.findall(r"\b(\w+)\(", body))
                tags = []
                if "testcontainers." in body or called & uses_docker:
                    tags.append("docker")
                if re.search(r"EnableTransaction|NewTransaction\(|\.Transaction", body) \
                        or path.name.startswith("transaction"):
                    tags.append("transactions")
                if tags:
                    self.tags[test_id] = tags

    def compile(self) -> None:
        self.binaries = {}
        bin_dir = self.work / "bin"
        bin_dir.mkdir(exist_ok=True)
        for import_path, directory in self.packages:
            out = bin_dir / (import_path.replace("/", "_") + ".test")
            built = subprocess.run(["go", "test", "-c", "-o", str(out), import_path],
                                   cwd=self.src, capture_output=True, text=True, env=self.go_env())
            if built.returncode != 0:
                raise Fail(f"go test -c {import_path} failed:\n{built.stderr[-3000:]}")
            if out.exists():  # packages without tests produce no binary
                self.binaries[import_path] = (out, Path(directory))

    def package_dir(self, import_path: str) -> str:
        return str(Path(self.binaries[import_path][1]).relative_to(self.src))

    def list_tests(self) -> list:
        ids = []
        for import_path, (binary, directory) in self.binaries.items():
            out = subprocess.run([str(binary), "-test.list", ".*"], cwd=directory,
                                 capture_output=True, text=True, env=self.go_env())
            package = self.package_dir(import_path)
            for name in out.stdout.split():
                if not re.match(r"(Test|Example|Fuzz)", name):
                    continue
                test_id = f"{package}.{name}"
                if "docker" in self.tags.get(test_id, []):
                    self.left_out.append((test_id, "needs Docker (testcontainers)"))
                    continue
                ids.append(test_id)
        return ids

    def launch(self, ids: list, timeout_s: int, events: Path, log: Path) -> subprocess.Popen:
        # One package per launch: the first remaining test's.
        package = ids[0].rsplit(".", 1)[0]
        names = [i.rsplit(".", 1)[1] for i in ids if i.rsplit(".", 1)[0] == package]
        import_path = next(p for p in self.binaries if self.package_dir(p) == package)
        binary, directory = self.binaries[import_path]
        self.current_package = package
        pattern = "^(" + "|".join(names) + ")$"
        cmd = ["go", "tool", "test2json", "-t", "-p", import_path, str(binary),
               "-test.v=test2json", "-test.run", pattern, "-test.timeout", "0", "-test.count", "1"]
        with open(events, "ab") as out, open(log, "ab") as err:
            proc = subprocess.Popen(cmd, cwd=directory, env=self.go_env(), stdout=out, stderr=err,
                                    stdin=subprocess.DEVNULL, start_new_session=True,
                                    preexec_fn=default_signals)
        return proc, [f"{package}.{name}" for name in names]

    def hang_limit(self, timeout_s: int) -> float:
        return timeout_s

    def parse_event(self, line: str):
        try:
            event = json.loads(line)
        except ValueError:
            return
        name = event.get("Test")
        if not name:
            return
        top = name.split("/", 1)[0]
        test_id = f"{self.current_package}.{top}"
        action = event.get("Action")
        if action == "output":
            kept = self.output.setdefault(test_id, [])
            if sum(len(x) for x in kept) < TEST_OUTPUT_BYTES_MAX:
                kept.append(event.get("Output", ""))
            return
        if "/" in name:
            return
        if action == "run":
            self.output[test_id] = []
            yield "start", test_id, None
        elif action in ("pass", "fail", "skip"):
            outcome = {"pass": "passed", "fail": "failed", "skip": "skipped"}[action]
            message = self.failure_line(test_id) if outcome != "passed" else ""
            self.save_output(test_id)
            yield "end", test_id, Result(test_id, outcome, float(event.get("Elapsed", 0.0)), message)

    def save_output(self, test_id: str) -> None:
        with open(self.logs / "go-tests.log", "a") as log:
            log.write(f"=== {test_id}\n{''.join(self.output.get(test_id, []))}")

    def failure_line(self, test_id: str) -> str:
        lines = "".join(self.output.get(test_id, [])).splitlines()
        for pattern in GO_FAIL_LINE_RES:
            for index, line in enumerate(lines):
                found = pattern.search(line)
                if not found:
                    continue
                text = found.group(1)
                # testify continues the message on the next, deeper-indented lines.
                if pattern is GO_FAIL_LINE_RES[0]:
                    for more in lines[index + 1:index + 3]:
                        if re.match(r"^\s+\t\s+\t", more) or re.match(r"^\s{20,}\S", more):
                            text += " " + more.strip()
                        else:
                            break
                trace = next((re.search(r"(\w+_test\.go:\d+)", x).group(1) for x in lines[max(0, index - 3):index + 1]
                              if re.search(r"Error Trace:.*_test\.go:\d+", x)), None)
                return f"{trace}: {text}" if trace else text
        for line in lines:
            if line.startswith("--- SKIP") or line.startswith("--- FAIL"):
                continue
            if "skip" in line.lower() and "_test.go" in line:
                return line.strip()
        return lines[-1].strip() if lines else ""

    def crash_message(self, test_id: str, returncode: int) -> str:
        self.save_output(test_id)
        return (f"the test binary died during this test ({exit_status(returncode)}): "
                + (self.failure_line(test_id) or "no output"))
