"""Throughput of a real `laya-grpc serve` (CPU, tiny checkpoint) when its CPUs are shared.

Phases, each `--clients` closed-loop HTTP clients for `--duration` seconds:

- quiet: nothing else runs beside the stack (besides whatever else the host runs);
- busy: one `while True: pass` process beside it;
- limit1 / limit1+busy: the same with the whole stack in a cgroup limited to one CPU (cgroup v1
  `cpu.cfs_quota_us` or v2 `cpu.max`, when this process may create one), else pinned to CPU 0
  with `taskset` (then the stack sees one CPU in its affinity mask instead of a quota).

quiet and busy run back to back, `--rounds` times, so that the noise of a shared host shows in
the spread of the figures. Each phase also prints the CPU seconds the inference process used.

    python -m benchmarks.shared_cpu [--rounds 3] [--duration 10] [--clients 4] [--no-limit]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from cpu_cgroup import make_cpu_cgroup, remove_cgroup  # noqa: E402
from stack import Stack  # noqa: E402

from laya_grpc.bench.inputs import named_cases  # noqa: E402
from laya_grpc.bench.service import load  # noqa: E402
from laya_grpc.cli.make_checkpoint import make_checkpoint  # noqa: E402

BUSY = "while True: pass"


def cpu_seconds(pid: int) -> float:
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_count(pid: int) -> int:
    return len(os.listdir("/proc/%d/task" % pid))


def phase(stack: Stack, name: str, clients: int, duration: float, busy: bool) -> dict:
    hog = subprocess.Popen([sys.executable, "-c", BUSY]) if busy else None
    try:
        pid = stack.child_pid("inference")
        c0, t0 = cpu_seconds(pid), time.perf_counter()
        out = load("http", stack.http, [named_cases()[0]], "english", clients, duration, 1)
        used = cpu_seconds(pid) - c0
        wall = time.perf_counter() - t0
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
    rec = {"phase": name, "requests": out["requests"], "codes": out["codes"], "p50_ms": round(out["p50_ms"], 1),
           "p95_ms": round(out["p95_ms"], 1), "inference_cpu_s": round(used, 2),
           "inference_cores": round(used / wall, 2), "inference_threads": thread_count(pid)}
    print(json.dumps(rec), flush=True)
    return rec


def one_cpu_launcher() -> tuple:
    """(argv prefix that starts the stack limited to one CPU, how, cleanup)."""
    made = make_cpu_cgroup("laya-bench", 1.0)
    if made is None:
        return ["taskset", "-c", "0", sys.executable], "taskset -c 0", lambda: None
    group, prefix = made
    return prefix + [sys.executable], "cgroup %s (quota 1 CPU)" % group, lambda: remove_cgroup(group)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--no-limit", action="store_true", help="skip the one-CPU phases")
    p.add_argument("--variant", action="append", default=[], metavar="NAME:K=V,K=V",
                   help="also run a stack with these environment variables (e.g. "
                        "passive:OMP_WAIT_POLICY=PASSIVE); the variants' phases are interleaved")
    a = p.parse_args(argv)
    tmp = tempfile.mkdtemp(prefix="laya-shared-cpu-")
    ckpt = make_checkpoint(os.path.join(tmp, "english"), "tiny")
    env = {"LAYA_MAX_CONCURRENT": "256"}
    variants = [("", {})]
    for v in a.variant:
        name, _, pairs = v.partition(":")
        variants.append((name + " ", dict(kv.split("=", 1) for kv in pairs.split(",") if kv)))
    recs = []
    stacks = [Stack({"english": ckpt}, env={**env, **extra}) for _, extra in variants]
    try:
        for s in stacks:
            s.__enter__()
        for _ in range(a.rounds):
            for (name, _), s in zip(variants, stacks):
                recs.append(phase(s, name + "quiet", a.clients, a.duration, False))
                recs.append(phase(s, name + "busy", a.clients, a.duration, True))
    finally:
        for s in stacks:
            s.__exit__(None, None, None)
    if not a.no_limit:
        prefix, how, cleanup = one_cpu_launcher()
        print(json.dumps({"limit": how}), flush=True)
        try:
            with Stack({"english": ckpt}, env=env, python=prefix) as s:
                for _ in range(a.rounds):
                    recs.append(phase(s, "limit1", a.clients, a.duration, False))
                    recs.append(phase(s, "limit1+busy", a.clients, a.duration, True))
        finally:
            cleanup()
    summary = {}
    for r in recs:
        summary.setdefault(r["phase"], []).append(r["requests"])
    for name, counts in summary.items():
        print("%-12s requests in %.0f s: %s" % (name, a.duration, counts))
    for name, _ in variants:
        quiet, busy = summary.get(name + "quiet", []), summary.get(name + "busy", [])
        print("%sbusy / quiet (pairs): %s" % (name, [round(b / q, 2) for q, b in zip(quiet, busy) if q]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
