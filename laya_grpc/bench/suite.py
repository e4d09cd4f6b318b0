"""`laya-grpc bench`: upstream laya and our engine, gRPC Decide and HTTP gateway, in ONE run on
the same machine, checkpoint and inputs; JSONL + markdown report (+ PNG plots) under --out.

Each in-process target runs in its own child process so its load time and memory are its own;
the served stack is measured from outside, over HTTP and gRPC.
`--smoke` makes tiny checkpoints and runs every stage with a handful of iterations on CPU, which
is what CI runs.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Optional

from laya_grpc.core.runtime import flags
from laya_grpc.core.runtime.flags import setting

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STAGES = ("engine", "upstream", "upstream-compiled", "service", "parity", "replicas")


@dataclass
class BenchSettings:
    ENV_PREFIX = "LAYA_BENCH_"
    SECTION = "benchmark"
    smoke: bool = setting(False, "tiny checkpoints, CPU, a few iterations per figure: checks the suite end to "
                          "end (CI)")
    out: str = setting(os.path.join("benchmarks", "results", "latest"), "folder for results.jsonl, report.md "
                       "and the plots (under the current directory, never inside the installed package)",
                       metavar="DIR")
    work_dir: str = setting("/tmp/laya-bench", "where the random-weight checkpoints are made (reused when "
                            "present)", metavar="DIR")
    preset: Optional[str] = setting(None, "make-checkpoint preset (default: large; tiny with --smoke)")
    backend: str = setting("torch", "network implementation", choices=("torch", "mlx"))
    device: str = setting("auto", "auto, cpu, cuda, mps")
    dtype: str = setting("auto", "our engine's weight dtype (auto: the service's default for the device)")
    stages: str = setting("engine,upstream,service", "comma list of %s (upstream-compiled takes minutes to "
                          "load)" % ", ".join(STAGES))
    iters: Optional[int] = setting(None, "warm requests per input", type=int)
    duration: Optional[float] = setting(None, "time per concurrency level", type=float, unit="seconds",
                                        name="duration_seconds", deprecated=("--duration", "LAYA_BENCH_DURATION"))
    concurrency: str = setting("1,8,64", "comma list of concurrent clients")
    ab_pairs: Optional[int] = setting(None, "paired upstream/engine runs per input for the ratio and its "
                                      "bootstrap interval", type=int)
    idle_gaps: Optional[str] = setting(None, "comma list of quiet seconds before a request",
                                       name="idle_gaps_seconds", deprecated=("--idle-gaps", "LAYA_BENCH_IDLE_GAPS"))
    soak: Optional[int] = setting(None, "random-length requests the engine answers before its memory is read "
                                  "again (10,000 by default: ~30-60 s on an H200)", type=int)
    replicas: str = setting("1,2", "comma list of serve --inference-replicas values the replicas stage "
                            "compares, each run alone on --device: a second replica on the same device overlaps "
                            "one replica's host work with the other's forward, and each holds its own copy of "
                            "the weights")
    replica_clients: str = setting("8,64", "comma list of concurrent HTTP clients the replicas stage measures "
                                   "each replica count at (overlap can only pay when several requests are in "
                                   "flight)")
    max_concurrent: int = setting(256, "the gateway's --max-concurrent-requests during the run", type=int,
                                  name="max_concurrent_requests", deprecated=("--max-concurrent",
                                                                              "LAYA_BENCH_MAX_CONCURRENT"))


def add_arguments(p: argparse.ArgumentParser) -> None:
    flags.add_settings(p, BenchSettings)


def _defaults(a) -> None:
    smoke = a.smoke
    if smoke and a.device == "auto":
        a.device = "cpu"   # smoke mode is the CI check: tiny checkpoints on the CPU wherever it runs
    a.preset = a.preset or ("tiny" if smoke else "large")
    a.iters = a.iters or (5 if smoke else 200)
    a.duration = a.duration or (1.0 if smoke else 5.0)
    a.ab_pairs = a.ab_pairs if a.ab_pairs is not None else (4 if smoke else 100)
    a.idle_gaps = a.idle_gaps or ("0.2" if smoke else "1,3,8")
    a.soak = a.soak or (10 if smoke else 10000)
    a.parity_n = 4 if smoke else 32
    a.batch_states = (8, 32) if smoke else (64, 256)   # predict_batch sizes the engine stage times
    a.client_procs = 2 if smoke else 8
    a.ready_timeout = 300.0
    a.concurrency = [int(x) for x in str(a.concurrency).split(",") if x]
    a.replicas = [int(x) for x in str(a.replicas).split(",") if x]
    a.replica_clients = [int(x) for x in str(a.replica_clients).split(",") if x]
    if a.device == "auto":
        a.device = _auto_device(a.backend)


def _auto_device(backend: str) -> str:
    if backend == "mlx":
        return "gpu"
    import torch
    return "cuda" if torch.cuda.is_available() else "cpu"


def _checkout(root: str) -> tuple:
    """(commit, dirty) of the git checkout whose top level is `root`. A tree without its own .git
    (an archive unpacked inside another checkout, as the A/B trees are) has no commit ("unknown"; the
    environment's `tree` says which folder ran): git would name the enclosing checkout's, which is
    not the code that ran."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True).stdout.strip()
    top = git("rev-parse", "--show-toplevel")
    if not top or os.path.realpath(top) != os.path.realpath(root):
        return "unknown", False
    return git("rev-parse", "HEAD") or "unknown", bool(git("status", "--porcelain"))


def environment(a) -> dict:
    def ver(mod):
        try:
            return __import__(mod).__version__
        except Exception as e:  # noqa: BLE001 - recorded, not fatal: a missing package is a fact of the run
            return "absent (%s)" % type(e).__name__
    tree = os.path.dirname(ROOT)   # the folder that holds this laya_grpc
    commit, dirty = _checkout(tree)
    gpu = ""
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=10).stdout.strip()
    except OSError:
        gpu = "none (no nvidia-smi)"
    return {"commit": commit, "dirty": dirty, "tree": tree, "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count(),
            "torch": ver("torch"), "laya": ver("laya"), "grpc": ver("grpc"), "numpy": ver("numpy"), "gpu": gpu,
            "device": a.device, "backend": a.backend, "dtype": a.dtype, "preset": a.preset, "smoke": a.smoke}


def run(a) -> int:
    _defaults(a)
    from .report import hop_summary, write_report
    from .service import run_service
    from laya_grpc.cli.make_checkpoint import make_checkpoint
    a.out = os.path.abspath(a.out)   # the stage processes run from the package's folder
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "results.jsonl")
    open(path, "w").close()

    def rec(target: str, kind: str, **fields) -> None:
        line = json.dumps({"target": target, "kind": kind, **fields})
        with open(path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
        print(line, flush=True)

    rec("suite", "environment", **environment(a))
    t0 = time.perf_counter()
    ckpt = os.path.join(a.work_dir, a.preset)
    ckpt = ckpt if os.path.isfile(os.path.join(ckpt, "model.safetensors")) else make_checkpoint(ckpt, a.preset)
    rec("suite", "checkpoint", path=ckpt, preset=a.preset, seconds=time.perf_counter() - t0)
    stages = [s for s in a.stages.split(",") if s]
    bad = set(stages) - set(STAGES)
    if bad:
        print("laya-grpc bench: unknown stage(s) %s; choose from %s" % (sorted(bad), ", ".join(STAGES)), file=sys.stderr)
        return 2
    failed = []
    for st in stages:
        if st == "parity":            # the served path against upstream CPU fp32 (parity.py)
            try:
                from .parity import run_stage, stage_checkpoints
                if not run_stage(a, rec, stage_checkpoints(a.work_dir, a.preset), [a.dtype]):
                    failed.append(st)
            except Exception as e:  # noqa: BLE001 - recorded in the results and the exit code
                rec("parity", "error", detail="%s: %s" % (type(e).__name__, e))
                failed.append(st)
            continue
        if st == "replicas":          # serve --inference-replicas N on one device, N side by side (replicas.py)
            try:
                from .replicas import run_replicas
                if not run_replicas(a, rec, ckpt, "english"):
                    failed.append(st)
            except Exception as e:  # noqa: BLE001 - recorded in the results and the exit code
                rec("replicas", "error", detail="%s: %s" % (type(e).__name__, e))
                failed.append(st)
            continue
        if st == "service":
            try:
                run_service(a, lambda target, kind, **f: rec(target, kind, transport="ipc", **f), ckpt, "english")
            except Exception as e:  # noqa: BLE001 - recorded in the results and the exit code
                rec("service", "error", transport="ipc", detail="%s: %s" % (type(e).__name__, e))
                failed.append(st)
            continue
        cmd = [sys.executable, "-m", "laya_grpc.bench.inproc", st, "--ckpt", ckpt, "--out", path, "--device", a.device,
               "--backend", a.backend, "--dtype", a.dtype, "--iters", str(a.iters), "--soak", str(a.soak), "--parity-n", str(a.parity_n),
               "--idle-gaps", a.idle_gaps, "--ab-pairs", str(a.ab_pairs if st == "upstream" else 0),
               "--batch-states", ",".join(map(str, a.batch_states))]
        t = time.perf_counter()
        r = subprocess.run(cmd, cwd=ROOT)
        rec(st, "process", seconds=time.perf_counter() - t, returncode=r.returncode)
        if r.returncode:
            failed.append(st)
    md = write_report(path, a.out)
    print(hop_summary(path))
    print("report: %s" % md)
    if failed:
        print("laya-grpc bench: stage(s) failed: %s (see %s)" % (", ".join(failed), path), file=sys.stderr)
        return 1
    return 0
