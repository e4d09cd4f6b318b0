"""The exact mode's model time with the encoder's two Wo GEMMs on stacked halves, by bucket size.

In the exact mode a split GEMM multiplies x's two fp16 halves by fp16 W. Its served form up to
`split_gemm.STACKED_MAX_TOKENS` tokens stacks the halves as row blocks, [x_hi; x_lo] W^T, and the add +
LayerNorm kernel after each Wo GEMM adds the two products; beyond, it concatenates them along K,
[x_hi | x_lo] [W | W]^T. This study captures the packed forward's CUDA graphs once per limit over one
float32 model (0: the K form everywhere), and replays them in turn shape by shape, round after
round, so drift on the host touches all alike. Per shape: median over rounds of the mean of ITERS
replays (ms), each limit's ratio to the K form, and max |logit - the K form's logit| (float32
accumulation in another order: ~1e-5).

    python3 -m benchmarks.stacked_halves --ckpt /tmp/lb/large [--limits 0,512,2048,16384] [--rounds 7]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys

import numpy as np

SHAPES = ((1, 132, 3), (2, 132, 3), (3, 132, 4), (1, 256, 3), (1, 512, 5), (6, 132, 4), (12, 132, 4),
          (16, 132, 4), (64, 132, 3))   # rows, tokens a row, markers


@contextlib.contextmanager
def limit(tokens: int):
    """The Wo GEMMs take stacked halves in buckets of at most `tokens` tokens while inside."""
    from laya_grpc.inference import split_gemm
    served = split_gemm.STACKED_MAX_TOKENS
    split_gemm.STACKED_MAX_TOKENS = tokens
    try:
        yield
    finally:
        split_gemm.STACKED_MAX_TOKENS = served


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m benchmarks.stacked_halves", description=__doc__.split("\n\n")[0])
    p.add_argument("--ckpt", required=True, help="a checkpoint directory (made as `large` if missing)")
    p.add_argument("--limits", default="0,512,2048,16384", help="STACKED_MAX_TOKENS values, 0 (the K form) first")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--iters", type=int, default=50, help="graph replays per timing")
    p.add_argument("--shapes", default=",".join("%dx%d" % s[:2] for s in SHAPES),
                   help="rows x tokens a row, comma-separated, from the default set")
    a = p.parse_args(argv)
    limits = [int(v) for v in a.limits.split(",") if v]
    if not limits or limits[0] != 0:
        p.error("--limits must start with 0 (the K form, the ratios' base)")

    import torch
    from benchmarks.model_speed import ensure_large, replay_ms, rows
    from laya_grpc.inference import split_gemm
    from laya_grpc.inference.cuda_graphs import PackedForward, packed_plan
    from laya_grpc.inference.packing import rows_from_padded
    from laya_grpc.inference.torch_model import LayaTorch
    if not torch.cuda.is_available():
        print("stacked_halves: no CUDA device")
        return 1
    ensure_large(a.ckpt, lambda kind, **kw: print(json.dumps(dict(kind=kind, **kw)), flush=True))
    dev = torch.device("cuda:0")
    print("device:", torch.cuda.get_device_name(), "torch", torch.__version__, "served limit",
          split_gemm.STACKED_MAX_TOKENS, flush=True)
    shapes = [s for s in SHAPES if "%dx%d" % s[:2] in a.shapes.split(",")]
    model = LayaTorch.from_checkpoint(a.ckpt, str(dev), torch.float32)
    model.use_fused_kernels()
    forwards = {t: PackedForward(model, dev, packed_plan(256, 512, 16384, torch.float32), graphs=True) for t in limits}
    batches = {s: rows_from_padded(rows([s[1]] * s[0], s[2], model.spec.vocab_size, seed=s[0])) for s in shapes}

    def parts(t, s):
        """Shape s under limit t (its graphs captured on first use): each forward's (bucket tokens,
        graph), and the logits of the whole batch."""
        pf = forwards[t]
        graphs, logits = [], []
        with limit(t):
            for index in pf.plan.split(batches[s]):
                part = batches[s].take(index)
                lg, _ = pf.forward(part, 0)
                logits.append(lg)
                b = pf.plan.bucket(part.n, len(part.ids), int(part.marker_counts.max()))
                graphs.append((b.tokens, pf.cache.get(b).graph))
        return graphs, np.concatenate(logits)

    diffs, buckets = {}, {}
    for s in shapes:   # capture (and compile) first, outside the timed rounds
        ref = None
        for t in limits:
            graphs, lg = parts(t, s)
            ref = lg if ref is None else ref
            diffs[(t, s)] = float(np.nanmax(np.abs(lg - ref)))
            buckets[s] = [tokens for tokens, _ in graphs]
    times = {(t, s): [] for t in limits for s in shapes}
    for r in range(a.rounds):
        for s in shapes:
            for t in (limits if r % 2 == 0 else limits[::-1]):
                graphs, _ = parts(t, s)
                times[(t, s)].append(sum(replay_ms(torch, g, a.iters) for _, g in graphs))
    lines = ["| rows x tokens (buckets) | " + " | ".join("limit %d ms" % t for t in limits) + " | " +
             " | ".join("K form / limit %d" % t for t in limits[1:]) + " | max abs logit diff |",
             "|---|" + "---|" * (2 * len(limits))]
    for s in shapes:
        med = {t: statistics.median(times[(t, s)]) for t in limits}
        lines.append("| %d x %d (%s) | " % (s[0], s[1], ", ".join(map(str, buckets[s]))) +
                     " | ".join("%.3f" % med[t] for t in limits) + " | " +
                     " | ".join("%.3f" % (med[0] / med[t]) for t in limits[1:]) +
                     " | %.1e |" % max(diffs[(t, s)] for t in limits))
        print(json.dumps({"kind": "stacked_halves", "rows": s[0], "tokens": s[1], "buckets": buckets[s],
                          "median_ms": {str(t): med[t] for t in limits},
                          "runs_ms": {str(t): times[(t, s)] for t in limits},
                          "max_abs_logit_diff": {str(t): diffs[(t, s)] for t in limits}}), flush=True)
    print("\n".join(lines), flush=True)
    for pf in forwards.values():
        pf.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
