"""What the warm-up's dry passes cost, and what a capture does without them: fresh inference processes
warming the served CUDA graphs three ways, interleaved, each on the same filled Triton cache.

  served   as `warm_graphs` runs it: every bucket's dry pass (kernel_compile.ahead), the later ones
           with their GEMMs allocating outputs only (split_gemm.allocate_only), then the captures
  gemms    every dry pass with its GEMMs launched (`allocate_only` replaced by a null context in this
           process only): the warm-up before allocate_only
  first    the first bucket's dry pass only, then the captures: the variants the later buckets bring
           are read and loaded while capturing (counted)

Each child process runs `TorchRunner(ckpt, "cuda:0", dtype)` and `warm()` as the inference service
does, then the same fixed batches through the captured graphs (1, 6, 64 and 256 rows of 132 tokens,
one row of 512), and saves their logits. Per process: import to loaded, the warm-up, its dry passes
(the first one timed to a device synchronisation, the rest as one stretch) and the captures, the
variants the captures met; per variant against `gemms` of the same round: the largest |difference|
of every logit and act logit (0 where the graphs compute the same).

    python3 -m benchmarks.dry_pass_study --ckpt /tmp/lb/large --rounds 3
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

VARIANTS = ("served", "gemms", "first")
REFERENCE = "gemms"
SHAPES = ((1, 132, 1), (6, 132, 3), (64, 132, 3), (256, 132, 3), (1, 512, 6))   # rows, tokens a row, markers


def child(a) -> None:
    t0 = time.perf_counter()
    import torch

    from laya_grpc.inference import kernel_compile, split_gemm
    from laya_grpc.inference.devices import init_device
    from laya_grpc.inference.packing import rows_from_padded
    from laya_grpc.inference.torch_runner import TorchRunner
    from benchmarks.model_speed import rows
    init_device("cuda:0", "torch")
    runner = TorchRunner(a.ckpt, "cuda:0", a.dtype)
    torch.cuda.synchronize()
    loaded = time.perf_counter() - t0
    ahead, rec = kernel_compile.ahead, {}

    if a.child == "gemms":
        split_gemm.allocate_only = contextlib.nullcontext

    def wrapped(steps, device):
        steps = list(steps)

        def first():
            t = time.perf_counter()
            steps[0]()
            torch.cuda.synchronize()
            rec["first_dry_s"] = time.perf_counter() - t

        later = [] if a.child == "first" else steps[1:]
        t = time.perf_counter()
        n = ahead([first] + later, device)
        torch.cuda.synchronize()
        rec["dry_s"] = time.perf_counter() - t
        rec["variants_ahead"] = n
        return n

    from triton import knobs
    met = []

    def counting_hook(*, key, fn, **_):
        met.append(fn.jit_function.__name__)
        return False   # launch (and compile or read) as Triton would

    def ahead_then_count(steps, device):
        n = wrapped(steps, device)
        knobs.runtime.jit_cache_hook = counting_hook   # the captures follow in warm_graphs
        return n
    kernel_compile.ahead = ahead_then_count
    t1 = time.perf_counter()
    graphs = runner.warm()
    knobs.runtime.jit_cache_hook = None
    torch.cuda.synchronize()
    rec["warm_s"] = time.perf_counter() - t1
    rec["captures_s"] = rec["warm_s"] - rec["dry_s"]
    rec.update(loaded_s=loaded, graphs=graphs, variants_in_capture=len(met), variant_names_in_capture=sorted(set(met)))
    out = {}
    for r, tokens, markers in SHAPES:
        batch = rows_from_padded(rows([tokens] * r, markers, runner.vocab_size, seed=r + tokens))
        lg, ac = runner.run_rows(batch, 0)
        out["%dx%d-logits" % (r, tokens)], out["%dx%d-act" % (r, tokens)] = lg, ac
    np.savez(a.save, **out)
    rec["captures_after_ready"] = runner.graphs.cache.captures - graphs
    print(json.dumps(rec), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--child", choices=VARIANTS)
    ap.add_argument("--save")
    a = ap.parse_args()
    if a.child:
        return child(a)
    work = tempfile.mkdtemp(prefix="dry-pass-")
    env = dict(os.environ, TRITON_CACHE_DIR=os.path.join(work, "triton"))

    def run(variant, tag):
        save = os.path.join(work, "%s-%s.npz" % (variant, tag))
        p = subprocess.run([sys.executable, "-m", "benchmarks.dry_pass_study", "--ckpt", a.ckpt, "--dtype", a.dtype,
                            "--child", variant, "--save", save], env=env, capture_output=True, text=True, timeout=300)
        line = [x for x in p.stdout.splitlines() if x.startswith("{")]
        if p.returncode or not line:
            print("%s %s failed (rc %s): %s" % (variant, tag, p.returncode, p.stderr[-3000:]), flush=True)
            return None, None
        return json.loads(line[-1]), dict(np.load(save))

    t = time.perf_counter()
    run("served", "prime")   # fills the Triton cache every later process reads
    print("cache filled in %.1f s" % (time.perf_counter() - t), flush=True)
    got = {v: [] for v in VARIANTS}
    for r in range(a.rounds):
        order = VARIANTS if r % 2 == 0 else VARIANTS[::-1]
        outs = {}
        for v in order:
            rec, out = run(v, str(r))
            if rec is None:
                continue
            outs[v] = out
            got[v].append(rec)
        for v in VARIANTS:
            if v in outs and REFERENCE in outs:
                diff = max(float(np.max(np.abs(outs[v][k] - outs[REFERENCE][k]))) for k in outs[v])
                got[v][-1]["max_abs_vs_gemms"] = diff
        for v in order:
            if got[v]:
                print(json.dumps(dict(variant=v, round=r, **got[v][-1])), flush=True)
    print("\n| variant | loaded s | warm-up s | first dry pass s | dry passes s | captures s | variants ahead / in capture | max abs vs gemms |")
    print("|---|---|---|---|---|---|---|---|")
    for v in VARIANTS:
        rs = got[v]
        if not rs:
            print("| %s | failed |" % v)
            continue

        def med(k):
            return statistics.median(x[k] for x in rs)
        print("| %s | %.3f | %.3f (%s) | %.3f | %.3f | %.3f | %d / %d | %s |" % (
            v, med("loaded_s"), med("warm_s"), ", ".join("%.3f" % x["warm_s"] for x in rs), med("first_dry_s"),
            med("dry_s"), med("captures_s"), rs[-1]["variants_ahead"], rs[-1]["variants_in_capture"],
            max(x.get("max_abs_vs_gemms", float("nan")) for x in rs)))


if __name__ == "__main__":
    main()
