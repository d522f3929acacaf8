"""Real processes for the suites under tests/: building the `vela` binary
once, free ports, and a `Proc` that starts a command, waits for its ready
line, keeps its output, and can be stopped, killed (-9), frozen
(SIGSTOP/SIGCONT) and restarted with the same arguments."""

import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
STARTUP_TIMEOUT_S = 120
STOP_TIMEOUT_S = 30
LOG_LINES_MAX = 20000

_VELA = None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def vela_binary():
    """Builds (once per session) and returns the debug `vela` binary."""
    global _VELA
    if _VELA is None:
        env = dict(os.environ)
        env.setdefault("PROTOC", shutil.which("protoc") or "/usr/bin/protoc")
        subprocess.run(["cargo", "build", "-q", "-p", "vela"], cwd=ROOT, check=True, env=env)
        target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
        _VELA = os.path.join(target, "debug", "vela")
    return _VELA


class Proc:
    """A process whose stdout announces readiness with a line matching `ready`."""

    def __init__(self, name, cmd, ready, env=None):
        self.name = name
        self.cmd = list(cmd)
        self.ready = re.compile(ready)
        self.env = env
        self.log_lines = []
        self.ready_line = None
        self.proc = None
        self.start()

    def start(self):
        env = dict(os.environ)
        env.setdefault("VELA_LOG", "info")
        if self.env:
            env.update(self.env)
        self.proc = subprocess.Popen(
            self.cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            **self.popen_options(),
        )
        self.spawned()
        threading.Thread(target=self._pump, args=(self.proc.stderr,), daemon=True).start()
        deadline = time.time() + STARTUP_TIMEOUT_S
        self.ready_line = None
        while time.time() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self._keep(line)
            if self.ready.search(line):
                self.ready_line = line.strip()
                break
        if self.ready_line is None:
            self.proc.kill()
            raise RuntimeError("%s did not start:\n%s" % (self.name, "\n".join(self.log_lines[-50:])))
        threading.Thread(target=self._pump, args=(self.proc.stdout,), daemon=True).start()
        return self

    def popen_options(self):
        """Where and how the process is spawned (a subclass may run it in a
        session of its own)."""
        return {"cwd": ROOT}

    def spawned(self):
        """Called once the process exists, before it is ready."""

    def _keep(self, line):
        self.log_lines.append(line.rstrip("\n"))
        if len(self.log_lines) > LOG_LINES_MAX:
            del self.log_lines[: LOG_LINES_MAX // 2]

    def _pump(self, stream):
        for line in stream:
            self._keep(line)

    def log_text(self):
        return "\n".join(self.log_lines)

    def find(self, pattern):
        """First match of `pattern` in the ready line."""
        m = re.search(pattern, self.ready_line or "")
        return m.group(0) if m else None

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def terminate(self, timeout_s=STOP_TIMEOUT_S):
        """SIGTERM (a clean stop), SIGKILL if it hangs; True if it stopped cleanly."""
        if not self.alive():
            return True
        self.proc.send_signal(signal.SIGCONT)
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout_s)
            return True
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
            return False

    def kill9(self):
        """kill -9: no chance to sync or close anything."""
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def freeze(self):
        self.proc.send_signal(signal.SIGSTOP)

    def thaw(self):
        self.proc.send_signal(signal.SIGCONT)

    def restart(self):
        """A new process with the same arguments (same data directories)."""
        self.kill9()
        return self.start()
