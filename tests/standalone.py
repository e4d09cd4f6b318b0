"""Each service started on its own over TCP on loopback (as a multi-host deployment runs them),
for tests that signal, break or add one process of a running deployment."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request

from stack import ROOT, free_port, temp_file

ME = [sys.executable, "-m", "laya_grpc.cli"]


def base_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAYA_")}
    env.update(extra)
    return env


class Proc:
    """One service process; its stderr goes to a file (read with .log())."""

    def __init__(self, argv: list, env: dict):
        fd, self.log_path = temp_file("laya-test-", ".log")
        with os.fdopen(fd, "wb") as f:
            self.proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)

    def log(self) -> str:
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def tokenizer(ckpt: str, port: int, *extra, env: dict | None = None) -> Proc:
    return Proc(ME + ["tokenizer", "--listen", "127.0.0.1:%d" % port, "--checkpoint", "english=" + ckpt] + list(extra),
                env or base_env())


def inference(ckpt: str, listen: str, *extra, env: dict | None = None) -> Proc:
    return Proc(ME + ["inference", "--listen", listen, "--device", "cpu", "--checkpoint", "english=" + ckpt]
                + list(extra), env or base_env())


def gateway(ckpt: str, http: int, grpc_port: int, tokenizer: str, inference: str, *extra,
            env: dict | None = None) -> Proc:
    return Proc(ME + ["gateway", "--http", "127.0.0.1:%d" % http, "--grpc", "127.0.0.1:%d" % grpc_port,
                      "--tokenizer", tokenizer, "--inference", inference, "--checkpoint", "english=" + ckpt]
                + list(extra), env or base_env())


def wait_ready(http: int, procs: list, timeout: float = 120.0) -> dict:
    deadline, health = time.monotonic() + timeout, {}
    while time.monotonic() < deadline:
        for p in procs:
            assert p.proc.poll() is None, p.log()[-3000:]
        try:
            with urllib.request.urlopen("http://127.0.0.1:%d/health" % http, timeout=2) as r:
                health = json.loads(r.read())
            if health.get("ready"):
                return health
        except OSError:
            pass
        time.sleep(0.2)
    raise TimeoutError("not ready: %s\n%s" % (health, "\n".join(p.log()[-2000:] for p in procs)))


def free_ports(n: int) -> list:
    from stack import free_ports as pick
    return pick(n)


__all__ = ["Proc", "base_env", "free_port", "free_ports", "gateway", "inference", "tokenizer", "wait_ready"]
