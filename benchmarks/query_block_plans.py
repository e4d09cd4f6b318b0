"""The exact mode's model time per attention block plan: which BLOCK_M and BLOCK_N each packed bucket should take.

The packed attention kernel runs one program per BLOCK_M queries of one (row, head), over the keys
BLOCK_N at a time; the plan picks both per bucket (packing.PackedPlan: `query_blocks`, the blocks of
buckets up to a size, and `block_m`, `block_n` beyond). `keys-64` is the served table with 64 keys a
step everywhere, `keys-32-from-257` with 32 keys from 257 tokens on. Each candidate plan below builds
its own PackedForward over the same float32 model, captures the buckets the shapes land in, and
times their graph replays; the plans take turns
shape by shape, round after round, so drift on the host touches all of them alike. Model time per
shape: median over rounds of the mean of ITERS replays (ms), each plan's ratio to the served plan,
and max |logit - served plan's logit| (expected ~1e-6: only which queries share a program changes).

    python3 -m benchmarks.query_block_plans --ckpt /tmp/lb/large [--rounds 5] [--plans served,keys-64,...]

On a machine without CUDA (`--device cpu`, tiny checkpoints, Triton's interpreter) it runs every
plan eagerly once, for the arithmetic and the figures' format, not for time.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np

SHAPES = ((1, 132, 3), (1, 256, 3), (1, 512, 5), (3, 400, 4), (6, 132, 4), (12, 132, 4), (16, 132, 4),
          (32, 132, 4), (64, 132, 3))   # rows, tokens a row, markers
PLANS = {   # name: PackedPlan's block fields (None: the served plan, cuda_graphs.packed_plan)
    "served": None,
    "keys-64": {"block_m": 64, "block_n": 64, "query_blocks": ((256, 16, 64), (2048, 32, 64))},
    "keys-32-from-257": {"block_m": 64, "block_n": 32, "query_blocks": ((256, 16, 64), (2048, 32, 32))},
    "16-256": {"block_m": 64, "query_blocks": ((256, 16, 64),)},
    "16-512": {"block_m": 64, "query_blocks": ((512, 16, 64),)},
    "16-1024": {"block_m": 64, "query_blocks": ((1024, 16, 64),)},
    "16-4096": {"block_m": 64, "query_blocks": ((4096, 16, 64),)},
    "16-all": {"block_m": 16},
    "32-above-256": {"block_m": 32, "query_blocks": ((256, 16, 64),)},
    "32-to-4096": {"block_m": 64, "query_blocks": ((256, 16, 64), (4096, 32, 64))},
    "32-to-2048": {"block_m": 64, "query_blocks": ((2048, 32, 64),)},   # no 16-query variants: 2 compiles fewer
}


def build_plan(name: str, dtype, max_rows: int = 256, max_row_tokens: int = 512, max_batch_tokens: int = 16384):
    from laya_grpc.inference.cuda_graphs import packed_plan
    from laya_grpc.inference.packing import PackedPlan
    fields = PLANS[name]
    if fields is None:
        return packed_plan(max_rows, max_row_tokens, max_batch_tokens, dtype)
    return PackedPlan(max_rows=max_rows, max_row_tokens=max_row_tokens, max_batch_tokens=max_batch_tokens, **fields)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m benchmarks.query_block_plans", description=__doc__.split("\n\n")[0])
    p.add_argument("--ckpt", required=True, help="a float32-served checkpoint directory (made as `large` if missing)")
    p.add_argument("--plans", default="served,keys-64",
                   help="comma-separated, served among them, from: " + ", ".join(PLANS))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--iters", type=int, default=50, help="graph replays per timing")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--max-batch-tokens", type=int, default=16384)
    p.add_argument("--shapes", default=",".join("%dx%d" % s[:2] for s in SHAPES),
                   help="rows x tokens a row, comma-separated, from the default set")
    a = p.parse_args(argv)
    plans = [n for n in a.plans.split(",") if n]
    unknown = [n for n in plans if n not in PLANS]
    if unknown or "served" not in plans:
        p.error("plans must include served and come from %s (got %s)" % (", ".join(PLANS), ", ".join(unknown)))

    import torch
    from benchmarks.model_speed import ensure_large, replay_ms, rows
    from laya_grpc.inference.cuda_graphs import PackedForward
    from laya_grpc.inference.packing import rows_from_padded
    from laya_grpc.inference.torch_model import LayaTorch
    cuda = a.device == "cuda"
    if cuda and not torch.cuda.is_available():
        print("query_block_plans: no CUDA device")
        return 1
    if cuda:
        ensure_large(a.ckpt, lambda kind, **kw: print(json.dumps(dict(kind=kind, **kw)), flush=True))
        print("device:", torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    dev = torch.device("cuda:0" if cuda else "cpu")
    model = LayaTorch.from_checkpoint(a.ckpt, str(dev), torch.float32)
    model.use_fused_kernels()
    max_row_tokens = 512
    forwards = {n: PackedForward(model, dev, build_plan(n, torch.float32, max_row_tokens=max_row_tokens,
                                                        max_batch_tokens=a.max_batch_tokens), graphs=cuda)
                for n in plans}
    shapes = [s for s in SHAPES if "%dx%d" % s[:2] in a.shapes.split(",")]
    batches = {s: rows_from_padded(rows([s[1]] * s[0], s[2], model.spec.vocab_size, seed=s[0])) for s in shapes}

    def parts(name, s):
        """The served split of shape s under plan `name`: (bucket, graph entry or None off CUDA) per
        forward, the part left in the entry's buffers, and the logits of the whole batch."""
        pf = forwards[name]
        out, logits = [], []
        for index in pf.plan.split(batches[s]):
            part = batches[s].take(index)
            lg, _ = pf.forward(part, 0)
            logits.append(lg)
            b = pf.plan.bucket(part.n, len(part.ids), int(part.marker_counts.max()))
            out.append((b, pf.cache.get(b) if cuda else None))
        return out, np.concatenate(logits)

    times = {(n, s): [] for n in plans for s in shapes}
    diffs, blocks = {}, {}
    t0 = time.perf_counter()
    for s in shapes:   # capture (and compile) first, outside the timed rounds
        ref = None
        for n in plans:
            entries, lg = parts(n, s)
            ref = lg if ref is None else ref
            diffs[(n, s)] = float(np.nanmax(np.abs(lg - ref))) if lg.size else 0.0
            blocks[(n, s)] = sorted({"%d/%d" % (b.block_m, b.block_n) for b, _ in entries})
    print("captured in %.1f s" % (time.perf_counter() - t0), flush=True)
    for r in range(a.rounds if cuda else 0):
        for s in shapes:
            for n in (plans if r % 2 == 0 else plans[::-1]):
                entries, _ = parts(n, s)
                times[(n, s)].append(sum(replay_ms(torch, e.graph, a.iters) for _, e in entries))
    lines = ["| rows x tokens | " + " | ".join("%s ms (BLOCK_M/N)" % n for n in plans) + " | " +
             " | ".join("served/%s" % n for n in plans[1:]) + " | max abs logit diff |",
             "|---|" + "---|" * (2 * len(plans))]
    for s in shapes:
        med = {n: statistics.median(times[(n, s)]) if times[(n, s)] else float("nan") for n in plans}
        lines.append("| %d x %d | " % s[:2] + " | ".join(
            "%.3f (%s)" % (med[n], ", ".join(blocks[(n, s)])) for n in plans) + " | " +
            " | ".join("%.3f" % (med["served"] / med[n]) for n in plans[1:]) + " | %.1e |"
            % max(diffs[(n, s)] for n in plans))
        print(json.dumps({"kind": "query_block_plans", "rows": s[0], "tokens": s[1], "median_ms": med,
                          "runs_ms": {n: times[(n, s)] for n in plans}, "blocks": {n: blocks[(n, s)] for n in plans},
                          "max_abs_diff": {n: diffs[(n, s)] for n in plans}}), flush=True)
    print("\n".join(lines), flush=True)
    for pf in forwards.values():
        pf.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
