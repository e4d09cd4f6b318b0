"""The model's time with our Triton kernels launched as programmatic dependents, against plain launches.

On an sm_90 or newer GPU every Triton kernel of the forward is launched with programmatic dependent
launch and waits for the kernel before it as its first instruction (`cuda_kernels.launch_options`):
its launch overlaps the tail of the GEMM before it. This study captures the served packed forward's
CUDA graphs twice over one model, once as served and once with that launch turned off (the kernels'
plain variants, what the code before launched), and replays the two in turn shape by shape, round
after round, so drift on the host touches both alike. Per dtype (float32 is the exact mode, float16
the fast one) and shape: median over rounds of the mean of ITERS replays (ms), the ratio plain /
dependent, and max |logit difference| between the two (expected 0: the same kernels in the same
order).

    python3 -m benchmarks.dependent_launch --ckpt /tmp/lb/large [--rounds 7] [--dtypes float32,float16]

Off an sm_90 GPU both captures are plain launches and the ratio says nothing.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys

import numpy as np

SHAPES = ((1, 132, 3), (2, 132, 3), (3, 132, 4), (1, 256, 3), (1, 512, 5), (6, 132, 4), (16, 132, 4),
          (64, 132, 3))   # rows, tokens a row, markers
WAYS = ("dependent", "plain")


@contextlib.contextmanager
def plain_launches():
    """Every Triton launch inside is a plain one (GDC off), as on a GPU older than sm_90."""
    from laya_grpc.inference import cuda_kernels as ck
    served = ck._dependent_launch
    ck._dependent_launch = lambda device: False
    try:
        yield
    finally:
        ck._dependent_launch = served


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m benchmarks.dependent_launch", description=__doc__.split("\n\n")[0])
    p.add_argument("--ckpt", required=True, help="a checkpoint directory (made as `large` if missing)")
    p.add_argument("--dtypes", default="float32,float16", help="float32 (the exact mode) and/or float16 (the fast one)")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--iters", type=int, default=50, help="graph replays per timing")
    p.add_argument("--shapes", default=",".join("%dx%d" % s[:2] for s in SHAPES),
                   help="rows x tokens a row, comma-separated, from the default set")
    a = p.parse_args(argv)

    import torch
    from benchmarks.model_speed import ensure_large, replay_ms, rows
    from laya_grpc.inference import cuda_kernels as ck
    from laya_grpc.inference.cuda_graphs import PackedForward, packed_plan
    from laya_grpc.inference.packing import rows_from_padded
    from laya_grpc.inference.torch_model import LayaTorch
    if not torch.cuda.is_available():
        print("dependent_launch: no CUDA device")
        return 1
    ensure_large(a.ckpt, lambda kind, **kw: print(json.dumps(dict(kind=kind, **kw)), flush=True))
    dev = torch.device("cuda:0")
    print("device:", torch.cuda.get_device_name(), "capability", torch.cuda.get_device_capability(),
          "torch", torch.__version__, "dependent launch served:", ck.launch_options(torch.zeros(1, device=dev)),
          flush=True)
    shapes = [s for s in SHAPES if "%dx%d" % s[:2] in a.shapes.split(",")]
    lines = []
    for dtype_name in [d for d in a.dtypes.split(",") if d]:
        dtype = getattr(torch, dtype_name)
        model = LayaTorch.from_checkpoint(a.ckpt, str(dev), dtype)
        model.use_fused_kernels()
        forwards = {w: PackedForward(model, dev, packed_plan(256, 512, 16384, dtype), graphs=True) for w in WAYS}
        batches = {s: rows_from_padded(rows([s[1]] * s[0], s[2], model.spec.vocab_size, seed=s[0])) for s in shapes}

        def parts(way, s):
            """Run shape s the served way (its graphs captured on first use): the graph of each
            forward, and the logits of the whole batch."""
            pf = forwards[way]
            graphs, logits = [], []
            with plain_launches() if way == "plain" else contextlib.nullcontext():
                for index in pf.plan.split(batches[s]):
                    part = batches[s].take(index)
                    lg, _ = pf.forward(part, 0)
                    logits.append(lg)
                    graphs.append(pf.cache.get(pf.plan.bucket(part.n, len(part.ids), int(part.marker_counts.max()))).graph)
            return graphs, np.concatenate(logits)

        diffs = {}
        for s in shapes:   # capture (and compile) first, outside the timed rounds
            _, dep = parts("dependent", s)
            _, plain = parts("plain", s)
            diffs[s] = float(np.nanmax(np.abs(dep - plain)))
        times = {(w, s): [] for w in WAYS for s in shapes}
        for r in range(a.rounds):
            for s in shapes:
                for w in (WAYS if r % 2 == 0 else WAYS[::-1]):
                    graphs, _ = parts(w, s)
                    times[(w, s)].append(sum(replay_ms(torch, g, a.iters) for g in graphs))
        for s in shapes:
            med = {w: statistics.median(times[(w, s)]) for w in WAYS}
            lines.append("| %s | %d x %d | %.3f | %.3f | %.3f | %.1e |" % (
                dtype_name, s[0], s[1], med["dependent"], med["plain"], med["plain"] / med["dependent"], diffs[s]))
            print(json.dumps({"kind": "dependent_launch", "dtype": dtype_name, "rows": s[0], "tokens": s[1],
                              "median_ms": med, "runs_ms": {w: times[(w, s)] for w in WAYS},
                              "max_abs_logit_diff": diffs[s]}), flush=True)
        for pf in forwards.values():
            pf.close()
        forwards.clear()
        model = None
        torch.cuda.empty_cache()
    print("| dtype | rows x tokens | dependent ms | plain ms | plain / dependent | max abs logit diff |\n"
          "|---|---|---|---|---|---|\n" + "\n".join(lines), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
