"""The CUDA context made while torch imports (`devices.start_cuda_context`) against after it.

An inference process on a GPU host imports torch, picks the device (`torch.cuda.is_available()`
starts the driver) and makes the device's context and a cuBLAS handle (`devices.init_device`), one
after another. The service starts the driver and the primary context on a thread first, so they
overlap the import. This benchmark runs that sequence in fresh processes, `after` (no thread) and
`overlap` (the service's way) in turn, and prints per phase and in all: seconds from the
interpreter's start to a usable device, and the parent's wall time per process.

`python -m benchmarks.context_overlap [--rounds 8] [--device auto] [--out DIR]`; needs a CUDA host
(elsewhere the thread does nothing and both ways measure the same).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

WAYS = ("after", "overlap")


def child(way: str, device: str) -> dict:
    t0 = time.perf_counter()
    from laya_grpc.inference import devices
    if way == "overlap":
        devices.start_cuda_context(device, "torch")
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
    ap.add_argument("--device", default="auto")
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
    print("device %s, torch %s; median (min-max) of %d processes a way, seconds" % (recs[0]["device"], recs[0]["torch"],
                                                                                  a.rounds))
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
