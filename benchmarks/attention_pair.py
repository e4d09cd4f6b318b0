"""Paired A/B of two builds of the packed attention kernel at the served shapes, on one GPU.

`python3 -m benchmarks.attention_pair --a-file A_TREE/laya_grpc/inference/cuda_attention.py` on the GPU
host (torch + triton, no checkpoint). B is this tree's `cuda_attention`; A is another tree's copy of that
module, loaded beside it (its `cuda_kernels` import is taken from this tree). Both run the same qkv
through the served plan's bucket and block table (`cuda_graphs.packed_plan`) for the `large`
checkpoint's shape (16 heads of 64, window 64): float32 with the output in Wo's split form (the exact
mode) and float16 (the fast mode); FULL and SLIDING layers.

Per case: A and B timed in alternation, ROUNDS times each (`attention_check.graph_time`: median us per
call of 20 calls in one CUDA graph); the line gives both medians and the median of the per-round A/B
ratios with their range, and max |B - A| over the real tokens' outputs (a split output as hi + lo): the
two builds must compute the same attention, to a rounding of the output (outputs are O(1): v ~ N(0, 1)).
bfloat16 gets the equality check only.
"""
from __future__ import annotations

import argparse
import importlib.util
import inspect
import statistics
import sys

from benchmarks.attention_check import _rope_table, graph_time

HEADS, HD, WINDOW = 16, 64, 64
SHAPES = ((1, 132), (1, 512), (6, 132), (64, 132))   # rows x tokens a row


def _load_a(path):
    """Build A's module from its file under another name, so both builds' kernels live in one process;
    its one relative import is rewritten to this tree's `cuda_kernels` (the split store both call)."""
    src = open(path).read().replace("from . import cuda_kernels as ck",
                                    "from laya_grpc.inference import cuda_kernels as ck")
    spec = importlib.util.spec_from_loader("attention_a", loader=None)
    mod = importlib.util.module_from_spec(spec)
    mod.__file__ = "attention_a.py"
    exec(compile(src, path, "exec"), mod.__dict__)
    return mod


def _value(out, split):
    """The attention output in float32: a split output's hi + lo (its third part repeats hi)."""
    if not split:
        return out.float()
    k = out.shape[1] // split
    return out[:, :k].float() + out[:, k:2 * k].float()


def main(argv=None) -> int:
    import torch

    from laya_grpc.inference import cuda_attention as cb
    from laya_grpc.inference.cuda_graphs import packed_plan
    from laya_grpc.inference.packing import fill
    from laya_grpc.inference.registry import synthetic_rows
    p = argparse.ArgumentParser(prog="python3 -m benchmarks.attention_pair")
    p.add_argument("--a-file", required=True, help="build A's cuda_attention.py")
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("attention_pair: no CUDA device")
        return 1
    ca = _load_a(a.a_file)
    # the bucket's keys a step go to a build whose kernel takes them (older builds step 64 keys)
    takes_keys = {mod: "block_n" in inspect.signature(mod.attention_packed).parameters for mod in (ca, cb)}
    print("device:", torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    g = torch.Generator(device="cuda").manual_seed(1)
    for dtype, split in ((torch.float32, 2), (torch.float16, 0), (torch.bfloat16, 0)):
        cos, sin = _rope_table(512, HD, torch.float16 if dtype == torch.float32 else dtype)
        plan = packed_plan(256, 512, 16384, dtype)
        for rows, length in SHAPES:
            b = plan.bucket(rows, rows * length, 1)
            flat = torch.zeros(sum(b.sizes().values()), dtype=torch.int32)
            fill(b.views(flat.numpy()), synthetic_rows(rows, length, 1, 1000), b, 0)
            v = {k: t.to("cuda") for k, t in b.views(flat).items()}
            qkv = torch.randn(b.tokens, 3 * HEADS * HD, device="cuda", generator=g).to(dtype)
            real = int(v["lengths"].sum())
            for sliding in (False, True):
                def run(mod):
                    keys = {"block_n": b.block_n} if takes_keys[mod] else {}
                    return mod.attention_packed(qkv, cos, sin, v["starts"], v["lengths"], v["blk_seg"], v["blk_m0"],
                                                HEADS, WINDOW, sliding, HD ** -0.5, split=split, block_m=b.block_m,
                                                **keys)
                kind = "sliding" if sliding else "full"
                diff = (_value(run(cb), split)[:real] - _value(run(ca), split)[:real]).abs().max().item()
                if dtype == torch.bfloat16:
                    print("attention bfloat16 %3dx%d %-7s max|B-A| %.2e" % (rows, length, kind, diff), flush=True)
                    continue
                ta, tb, ratio = [], [], []
                for _ in range(a.rounds):
                    ta.append(graph_time(torch, lambda: run(ca)))
                    tb.append(graph_time(torch, lambda: run(cb)))
                    ratio.append(ta[-1] / tb[-1])
                print("attention %-8s %3dx%d %-7s bm%-2d A %8.2f us  B %8.2f us  A/B %.3f (%.3f-%.3f)  max|B-A| %.2e"
                      % (str(dtype).split(".")[1], rows, length, kind, b.block_m, statistics.median(ta),
                         statistics.median(tb), statistics.median(ratio), min(ratio), max(ratio), diff), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
