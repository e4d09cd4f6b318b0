"""The exact mode's split GEMM inputs written by the kernels that make them, against a `split_fp16`
launch before every GEMM: the same model, both forms captured as CUDA graphs side by side in one
process, replayed in turn (A, B, A, B ...) per packed shape.

Prints per shape: graph replay ms of each (median of `--rounds` rounds of `--iters` replays, each
after 10 unmeasured ones), the median ratio A/B with a bootstrap 95% interval, kernel launches per
forward of each (one eager forward under torch.profiler), whether the two forms' outputs are equal
bit for bit and their largest difference. In Triton's interpreter they are equal
(tests/test_precision.py); compiled, lo may carry an FMA's extra bits (cuda_kernels.split_store).

A is the separate `split_fp16` launch (the model's `_terms` answering 0), B the served form.
`python -m benchmarks.split_inputs --ckpt DIR --out DIR`; makes the `large` checkpoint in DIR when
it is missing. Writes split_inputs.jsonl.
"""
from __future__ import annotations

import argparse
import os

import numpy as np

from benchmarks.model_speed import Out, ensure_large, replay_ms

SHAPES = ((1, 132, 3), (1, 512, 5), (8, 132, 3), (64, 132, 3), (120, 132, 3))   # rows, tokens, markers


def packed_rows(n: int, tokens: int, markers: int, vocab: int, seed: int):
    from laya_grpc.core.wire.packed_rows import PackedRows
    rng = np.random.default_rng(seed)
    lengths = np.full(n, tokens, dtype=np.int32)
    return PackedRows(ids=rng.integers(5, vocab, size=int(lengths.sum()), dtype=np.int32),
                      row_offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32),
                      markers=np.tile(np.arange(1, markers + 1, dtype=np.int32) * 2, n),
                      marker_offsets=(np.arange(n + 1) * markers).astype(np.int32),
                      qtypes=rng.integers(0, 3, size=n).astype(np.int32))


def launches(torch, fwd, rows) -> int:
    from torch.profiler import ProfilerActivity, profile
    fwd.forward(rows, 0)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fwd.forward(rows, 0)
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type.name == "CUDA")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.split_inputs", description=__doc__.splitlines()[0])
    p.add_argument("--ckpt", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--iters", type=int, default=20, help="replays a round")
    p.add_argument("--rounds", type=int, default=60, help="rounds per form and shape, interleaved")
    a = p.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    rec = Out(os.path.join(a.out, "split_inputs.jsonl"))
    ensure_large(a.ckpt, rec)
    import torch
    from laya_grpc.inference.cuda_graphs import PackedForward, packed_plan
    from laya_grpc.inference.torch_model import LayaTorch
    dev = torch.device("cuda:0")
    model = LayaTorch.from_checkpoint(a.ckpt, dev, torch.float32)
    model.use_fused_kernels()   # the CUDA default for float32 weights: the exact mode
    plan = packed_plan(256, 512, 16384, torch.float32)
    served_terms = model._terms
    forms = {}
    for name, terms in (("A", lambda lin, dtype: 0), ("B", served_terms)):
        model._terms = terms        # read while each form's graphs are captured and its eager forward runs
        forms[name] = (terms, PackedForward(model, dev, plan, graphs=True), PackedForward(model, dev, plan, graphs=False))
    rng = np.random.default_rng(0)
    for n, tokens, markers in SHAPES:
        rows = packed_rows(n, tokens, markers, model.spec.vocab_size, seed=n)
        outs, graphs, counts = {}, {}, {}
        for name, (terms, graphed, eager) in forms.items():
            model._terms = terms
            outs[name] = graphed.forward(rows, 0)
            graphs[name] = graphed.cache.get(plan.bucket(n, len(rows.ids), markers)).graph
            with torch.inference_mode():
                counts[name] = launches(torch, eager, rows)
        same = all(np.array_equal(x, y) for x, y in zip(outs["A"], outs["B"]))
        diff = max(float(np.abs(x - y).max()) for x, y in zip(outs["A"], outs["B"]))
        t = {"A": [], "B": []}
        for r in range(a.rounds):
            for name in (("A", "B") if r % 2 == 0 else ("B", "A")):
                t[name].append(replay_ms(torch, graphs[name], a.iters))
        ratios = np.array(t["A"]) / np.array(t["B"])
        boot = [float(np.median(rng.choice(ratios, len(ratios)))) for _ in range(2000)]
        r = rec("split_inputs", rows=n, tokens=tokens, a_ms=float(np.median(t["A"])), b_ms=float(np.median(t["B"])),
                ratio_median=float(np.median(ratios)), ci=[float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))],
                a_launches=counts["A"], b_launches=counts["B"], bit_identical=same, max_abs_diff=diff)
        print("%3d x %-4d A %.3f ms  B %.3f ms  A/B %.3f (95%% CI %.3f-%.3f)  launches %d -> %d  bit-identical %s (max diff %g)"
              % (n, tokens, r["a_ms"], r["b_ms"], r["ratio_median"], *r["ci"], counts["A"], counts["B"], same, diff),
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
