"""An experiment for the inference process's start: the CUDA driver and the device's context made on
a thread while torch imports, against the service's order (after the import).

Why it might pay: on a GPU host the inference process imports torch (2.95-3.26 s alone on the H100
host of `2026-12-07-5c14a40`), then `torch.cuda.is_available()` starts the driver and `devices.init_device` makes the
context and a cuBLAS handle, one after another: 0.42 s with 0.19 s before the context itself in one
H100 start (docs/performance.md, Start-up). Driver calls through ctypes release the GIL, so a thread
that calls cuInit and retains the device's primary context (the one torch's runtime uses) could
overlap the import, and torch's own initialisation would then find that context active.

The service does not do this; the experiment is here until a GPU run shows what it gives. Both ways
run the service's sequence (import torch, `devices.pick_device`, `devices.init_device`) in fresh
processes, in turn, and the table gives per phase and in all the seconds from the interpreter's
start to a usable device, and the parent's wall time per process.

`python -m benchmarks.context_overlap [--rounds 8] [--device auto] [--out DIR]`. Needs a CUDA host and
a CUDA build of torch; elsewhere the thread has nothing to start and both ways measure the same.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

WAYS = ("after", "overlap")


def start_context(index: int) -> threading.Thread:
    """cuInit, then retain device `index`'s primary context, on a daemon thread. CUDA_MODULE_LOADING is
    set first, on this thread (torch sets it before its own cuInit, and the driver reads it there)."""
    os.environ.setdefault("CUDA_MODULE_LOADING", "LAZY")

    def retain() -> None:
        import ctypes
        try:
            cuda = ctypes.CDLL("libcuda.so.1")
        except OSError:
            return
        dev, ctx = ctypes.c_int(), ctypes.c_void_p()
        status = cuda.cuInit(0) or cuda.cuDeviceGet(ctypes.byref(dev), index) \
            or cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
        if status:
            print("early context: driver status %d" % status, file=sys.stderr, flush=True)

    t = threading.Thread(target=retain, name="cuda-context", daemon=True)
    t.start()
    return t


def child(way: str, device: str) -> dict:
    t0 = time.perf_counter()
    if way == "overlap":
        start_context(int(device.split(":")[1]) if device.startswith("cuda:") else 0)
    from laya_grpc.inference import devices
    t_mod = time.perf_counter()
    import torch
    t_torch = time.perf_counter()
    pick = devices.pick_device(device, "torch", False)
    t_pick = time.perf_counter()
    devices.init_device(pick.device, "torch")
    t_ctx = time.perf_counter()
    return {"way": way, "device": pick.device, "torch": torch.__version__, "import_torch_s": t_torch - t_mod,
            "pick_s": t_pick - t_torch, "context_s": t_ctx - t_pick, "to_device_s": t_ctx - t0}


def run_child(way: str, device: str) -> dict:
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "benchmarks.context_overlap", "--child", way, "--device", device],
                       capture_output=True, text=True, timeout=120)
    wall = time.perf_counter() - t0
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        raise SystemExit("child %s failed:\n%s" % (way, (p.stderr or p.stdout)[-1500:]))
    return dict(json.loads(lines[-1]), wall_s=wall)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=8, help="processes per way, the ways in turn")
    ap.add_argument("--device", default="auto", help="auto or cuda:N (auto: device 0)")
    ap.add_argument("--out", default=None, help="folder for context_overlap.jsonl")
    ap.add_argument("--child", choices=WAYS, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(child(a.child, a.device)), flush=True)
        return 0
    run_child("after", a.device)   # the libraries read from disk once, before either way is timed
    recs = []
    for r in range(a.rounds):
        for way in (WAYS if r % 2 == 0 else WAYS[::-1]):
            rec = dict(run_child(way, a.device), round=r, kind="context_overlap")
            recs.append(rec)
            print(json.dumps(rec), flush=True)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "context_overlap.jsonl"), "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in recs)
    cols = ("import_torch_s", "pick_s", "context_s", "to_device_s", "wall_s")
    print("device %s, torch %s; median (min-max) of %d processes a way, seconds"
          % (recs[0]["device"], recs[0]["torch"], a.rounds))
    print("| way | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    med = {}
    for way in WAYS:
        rows = [r for r in recs if r["way"] == way]
        cells = []
        for c in cols:
            v = [r[c] for r in rows]
            med[way, c] = statistics.median(v)
            cells.append("%.3f (%.3f-%.3f)" % (med[way, c], min(v), max(v)))
        print("| %s | %s |" % (way, " | ".join(cells)))
    print("to a usable device: after - overlap = %.3f s (medians); wall: %.3f s"
          % (med["after", "to_device_s"] - med["overlap", "to_device_s"], med["after", "wall_s"] - med["overlap", "wall_s"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
