"""Start the real `laya-grpc serve` (three processes) on free ports for integration tests."""
from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The run directories and logs of the processes tests start, in the system's temporary directory (a
# short path: their unix sockets live there). tests/conftest.py removes them when the session passes;
# a session with a failure keeps them, the logs of what failed.
CREATED: list = []


def temp_dir(prefix: str) -> str:
    path = tempfile.mkdtemp(prefix=prefix)
    CREATED.append(path)
    return path


def temp_file(prefix: str, suffix: str) -> tuple:
    """(fd, path) as tempfile.mkstemp."""
    fd, path = tempfile.mkstemp(prefix=prefix, suffix=suffix)
    CREATED.append(path)
    return fd, path


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768   # Linux's default; elsewhere (macOS 49152) it is higher still


_BLOCK = 400   # ports per pytest-xdist worker
_STRIDE = 7


def _port_block() -> range:
    """The ports this test process hands out: below the kernel's ephemeral range, so no outgoing
    connection (of any test, or of the services under test) takes one between its pick and the
    server's bind, and a block of its own per xdist worker, so two workers never pick the same."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:]
    start = 12000 + _BLOCK * (int(worker) if worker.isdigit() else 0)
    if start + _BLOCK > _ephemeral_low():
        return range(0)
    return range(start, start + _BLOCK)


_block = _port_block()
_picks = itertools.count(int.from_bytes(os.urandom(2), "little") % _BLOCK)   # another session on the host starts elsewhere


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def free_port() -> int:
    """A port no server listens on, that nothing else is handed (see `_port_block`). Each call
    steps 7 ports on through the block (7 and its size are coprime: every port comes once before
    any comes again), leaving the ports just above a pick free: a test may check that nothing
    answers at a port's neighbours (test_prometheus_metrics)."""
    for _ in range(len(_block)):
        port = _block[(next(_picks) * _STRIDE) % len(_block)]
        if _bindable(port):
            return port
    with socket.socket() as s:   # no block below the ephemeral range on this host
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_ports(n: int) -> list:
    """n distinct free ports (the block gives distinct ones; the fallback may repeat itself)."""
    ports: list = []
    while len(ports) < n:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


class Stack:
    """`with Stack({"english": dir, ...}) as s:` -> s.http (base URL), s.grpc (address)."""

    def __init__(self, checkpoints: dict, env: dict | None = None, extra_args: list | None = None,
                 ready_timeout: float = 180.0, wait: bool = True, cwd: str = ROOT,
                 python: list | None = None):
        self.cwd, self.python = cwd, python or [sys.executable]
        self.checkpoints, self.env, self.extra_args = checkpoints, env or {}, extra_args or []
        self.ready_timeout, self.wait = ready_timeout, wait
        self.http_port, self.grpc_port = free_port(), free_port()
        self.http = "http://127.0.0.1:%d" % self.http_port
        self.grpc = "127.0.0.1:%d" % self.grpc_port
        self.run_dir = temp_dir("laya-test-")
        self.log_path = os.path.join(self.run_dir, "serve.log")
        self.proc = None

    def __enter__(self) -> "Stack":
        argv = self.python + ["-m", "laya_grpc.cli", "serve", "--http", "127.0.0.1:%d" % self.http_port,
                "--grpc", self.grpc, "--run-dir", self.run_dir] + self.extra_args
        for name, path in self.checkpoints.items():
            argv += ["--checkpoint", "%s=%s" % (name, path)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("LAYA_")}
        env.update(self.env)
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(argv, cwd=self.cwd, env=env, stdout=self._log, stderr=subprocess.STDOUT)
        try:
            if self.wait:
                self.wait_ready(self.ready_timeout)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def health(self, key: str | None = None) -> dict:
        req = urllib.request.Request(self.http + "/health")
        if key:
            req.add_header("Authorization", "Bearer " + key)
        with urllib.request.urlopen(req, timeout=5) as r:
            return json.loads(r.read())

    def wait_ready(self, timeout: float) -> None:
        """Ready as `serve` announces it: once EVERY gateway worker serves (its "laya-grpc: ready"
        line; a /health poll reaches one worker of several), and /health agrees."""
        deadline = time.monotonic() + timeout
        key = self.env.get("LAYA_API_KEY")
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("laya-grpc serve exited with %s:\n%s" % (self.proc.returncode, self.log()))
            try:
                if "laya-grpc: ready" in self.full_log() and self.health(key).get("ready") is True:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise TimeoutError("not ready after %.0f s:\n%s" % (timeout, self.log()))

    def full_log(self) -> str:
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def log(self) -> str:
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")[-6000:]

    def child_pid(self, name: str) -> int:
        """pid of a child process (tokenizer / inference / gateway) from the process table."""
        out = subprocess.run(["ps", "-eo", "pid,ppid,args"], capture_output=True, text=True).stdout
        for line in out.splitlines()[1:]:
            pid, ppid, args = line.strip().split(None, 2)
            if int(ppid) == self.proc.pid and (" %s " % name) in args + " ":
                return int(pid)
        raise LookupError("no %s child of %d" % (name, self.proc.pid))

    def post(self, path: str, body, headers: dict | None = None, raw: bytes | None = None):
        data = raw if raw is not None else json.dumps(body).encode()
        req = urllib.request.Request(self.http + path, data=data, method="POST", headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, json.loads(r.read()), dict(r.headers)
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null"), dict(e.headers)

    def __exit__(self, *exc) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if getattr(self, "_log", None):
            self._log.close()
