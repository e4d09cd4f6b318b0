"""`laya-grpc doctor`: what a user pastes into an issue.

Machine, OS, Python and library versions, the devices each backend sees, and the time of a
short one-question request on each backend/device that is really available here (a tiny
random-weight checkpoint is made in a temporary directory, so no download is needed).
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Optional

from laya_grpc import __version__
from laya_grpc.core.runtime import flags
from laya_grpc.core.runtime.flags import setting

QUESTIONS = {"q": {"type": "choice", "instructions": "Is the customer asking for a refund?",
                   "criteria": {"yes": "refund", "no": "something else", "unsure": ""}}}
STATE = "Hello, my phone arrived broken and I would like my money back, please."


def _version(module: str) -> str:
    try:
        m = importlib.import_module(module)
        return getattr(m, "__version__", "installed")
    except Exception as e:  # noqa: BLE001 - report, don't fail
        return "not installed (%s)" % type(e).__name__


def facts() -> dict:
    out = {
        "laya-grpc": __version__,
        "machine": platform.machine(), "processor": platform.processor() or "", "cpus": os.cpu_count(),
        "os": platform.platform(), "python": sys.version.split()[0],
        "versions": {m: _version(m) for m in ("torch", "mlx.core", "tokenizers", "safetensors", "numpy", "grpc",
                                              "google.protobuf", "starlette", "uvicorn")},
        "torch_devices": [], "mlx_devices": [],
    }
    try:
        import torch
        out["torch_devices"].append("cpu")
        if torch.cuda.is_available():
            for i in range(torch.cuda.device_count()):
                p = torch.cuda.get_device_properties(i)
                out["torch_devices"].append("cuda:%d %s (%.0f GiB, cc %d.%d)" % (i, p.name, p.total_memory / 2**30,
                                                                               p.major, p.minor))
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            out["torch_devices"].append("mps")
    except ImportError:
        pass
    try:
        import mlx.core as mx
        out["mlx_devices"].append("default: %s" % mx.default_device())
        out["mlx_metal"] = bool(getattr(mx, "metal", None) and mx.metal.is_available())
    except ImportError:
        pass
    return out


def time_backend(ckpt: str, backend: str, device: str, n: int) -> dict:
    from .predictor import Predictor
    t0 = time.perf_counter()
    p = Predictor(ckpt, device=device, backend=backend)
    load_ms = (time.perf_counter() - t0) * 1e3
    p.predict(STATE, QUESTIONS)
    times = []
    for _ in range(n):
        t = time.perf_counter()
        p.predict(STATE, QUESTIONS)
        times.append((time.perf_counter() - t) * 1e3)
    return {"backend": backend, "device": p.device, "load_ms": round(load_ms, 1),
            "p50_ms": round(statistics.median(times), 3), "min_ms": round(min(times), 3), "n": n}


@dataclass
class DoctorSettings:
    ENV_PREFIX = "LAYA_DOCTOR_"
    checkpoint: Optional[str] = setting(None, "time this checkpoint directory instead of a generated tiny one",
                                        metavar="DIR")
    repeat: int = setting(20, "timed requests per backend", type=flags.positive_int)


def add_arguments(p: argparse.ArgumentParser) -> None:
    flags.add_settings(p, DoctorSettings)
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    report = facts()
    f = report
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = args.checkpoint
        if ckpt is None:
            from .make_checkpoint import make_checkpoint
            ckpt = make_checkpoint(os.path.join(tmp, "tiny"), "tiny")
        targets = []
        if not f["versions"]["torch"].startswith("not installed"):
            targets.append(("torch", "cpu"))
            targets += [("torch", d.split()[0]) for d in f["torch_devices"] if d != "cpu"]
        if f["mlx_devices"]:
            targets.append(("mlx", "auto"))
        report["timings"] = []
        for backend, device in targets:
            try:
                report["timings"].append(time_backend(ckpt, backend, device, args.repeat))
            except Exception as e:  # noqa: BLE001 - one broken backend must not hide the others
                report["timings"].append({"backend": backend, "device": device, "error": "%s: %s" % (type(e).__name__, e)})
    report["checkpoint"] = args.checkpoint or "generated tiny (random weights)"
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print("laya-grpc %s doctor" % report["laya-grpc"])
    print("machine   %s, %s CPUs, %s" % (f["machine"], f["cpus"], f["os"]))
    print("python    %s" % f["python"])
    for k, v in f["versions"].items():
        print("  %-16s %s" % (k, v))
    print("torch devices: %s" % (", ".join(f["torch_devices"]) or "none"))
    print("mlx devices:   %s" % (", ".join(f["mlx_devices"]) or "none"))
    print("short one-question request on %s:" % report["checkpoint"])
    for t in report["timings"]:
        if "error" in t:
            print("  %-6s %-8s ERROR %s" % (t["backend"], t["device"], t["error"]))
        else:
            print("  %-6s %-8s p50 %.2f ms (min %.2f, n=%d), load %.0f ms" % (
                t["backend"], t["device"], t["p50_ms"], t["min_ms"], t["n"], t["load_ms"]))
    return 0
