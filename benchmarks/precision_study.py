"""What each float32 part of the fused CUDA forward buys in accuracy and costs in time (precision.py).

On the `large` random-weight checkpoint, behind packed CUDA graphs exactly as the runner serves:
per precision variant, the max |dp| (softmax of the option logits, and of the act logits) against
the CPU float32 network (bit-equal to upstream laya's CPU forward, tests/test_torch_model_parity.py)
over mixed rows of 24..512 tokens; the same rows alone and beside others (the answer must not
depend on its batch); and graph-replay and host ms for one short row, three short rows and one
512-token row. Variants, fp16 weights: `before` (everything 16-bit, cuBLAS fp16 split-K reductions
allowed: what was served), each change alone on top of `before` (`+head fp32`: the head's layers
through split GEMMs, scorer and act head float32), and the product. Float32 weights:
`before` (plain fp32 cuBLAS, no TF32, "ieee" attention dots), TF32 GEMMs (for comparison, not
served), and the product (split fp16 GEMMs, 3xTF32 attention).

Probabilities are softmax(logits / T) with the checkpoint's temperature for the row's question type
and option count, as decoding serves them. `--ckpt` is repeatable (`NAME=DIR`): the variants run on
each checkpoint (make-checkpoint's conditionings span flat to sharp logits); times are taken on the
first only (weights do not change them).

`python -m benchmarks.precision_study --ckpt DIR --out DIR` (makes `large` in DIR if missing);
writes precision_study.jsonl and prints a table last.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from benchmarks.model_speed import Out, ensure_large, replay_ms, rows, softmax

TIMED = {"1x short": ([60], 3), "3x short": ([60, 62, 58], 4), "1x512": ([512], 5)}


def variants(torch):
    from laya_grpc.inference.precision import Precision
    f16, f32 = torch.float16, torch.float32
    before = Precision.sixteen_bit(f16)
    s16 = {"scorer16": True}
    return [
        ("fp16 before", f16, before, s16),
        ("fp16 +residual fp32", f16, Precision(f32, f16, False, False, True), s16),
        ("fp16 +Wo out fp32", f16, Precision(f16, f32, False, False, True), s16),
        ("fp16 +head fp32", f16, Precision(f16, f16, True, False, True), {}),
        ("fp16 +fp32 split-K", f16, Precision(f16, f16, False, False, False), s16),
        ("fp16 residual+Wo", f16, Precision(f32, f32, False, False, True), s16),
        ("fp16 16-bit head", f16, Precision(f32, f32, False, False), {}),
        ("fp16 product", f16, Precision.for_weights(f16, "cuda"), {}),
        ("fp32 before", f32, Precision(f32, f32, False, False), {"dot": "ieee"}),
        ("fp32 tf32", f32, Precision(f32, f32, False, False), {"dot": "tf32", "tf32": True}),
        ("fp32 split only", f32, Precision(f32, f32, True, True), {"dot": "ieee"}),
        ("fp32 product", f32, Precision.for_weights(f32, "cuda"), {}),
    ]


def head_dtype(model, head, scorer) -> None:
    """The decision head (and type embedding) in `head`, the scorer and act head in `scorer` (the
    16-bit `before` ran all of them in fp16; float32 split GEMMs need a float32 head)."""
    for m in (model.head, model.type_emb):
        if m is not None:
            m.to(head)
    for m in (model.scorer, model.act_head):
        m.to(scorer)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.precision_study")
    p.add_argument("--ckpt", action="append", required=True, metavar="[NAME=]DIR")
    p.add_argument("--out", required=True)
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--parity-batches", type=int, default=4)
    p.add_argument("--only", default="", help="comma list of variant names (default: all)")
    a = p.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    rec = Out(os.path.join(a.out, "precision_study.jsonl"))
    ckpts = [tuple(c.split("=", 1)) if "=" in c else ("large", c) for c in a.ckpt]
    ensure_large(ckpts[0][1], rec)
    import torch
    dev = torch.device("cuda:0")
    rec("env", torch=torch.__version__, gpu=torch.cuda.get_device_name())
    table = []
    for n, (cname, ckpt) in enumerate(ckpts):
        table += study(a, rec, torch, dev, cname, ckpt, timing=n == 0)
    print("\n%-8s %-22s %9s %9s %9s | %s" % ("ckpt", "variant", "max|dp|", "act dp", "alone/bes",
                                              " | ".join("%s replay/host ms" % t for t in TIMED)))
    for r in table:
        print("%-8s %-22s %9.5f %9.5f %9.5f | %s" % (
            r["checkpoint"], r["name"], r["max_abs_dp"], r["max_abs_dp_act"], r["alone_vs_beside_dp"],
            " | ".join("%6.3f / %6.3f" % (r["times"][t]["replay_ms"], r["times"][t]["host_p50_ms"])
                       if t in r["times"] else "-" for t in TIMED)))
    return 0


def study(a, rec, torch, dev, cname: str, ckpt: str, timing: bool) -> list:
    """The variants on one checkpoint: a record per variant."""
    import json
    from laya_grpc.core.decisions.temperatures import Temperatures
    from laya_grpc.inference import cuda_attention as ca
    from laya_grpc.inference.cuda_graphs import PackedForward, packed_plan
    from laya_grpc.inference.packing import rows_from_padded
    from laya_grpc.inference.precision import apply_cublas_policy
    from laya_grpc.inference.torch_model import LayaTorch
    with open(os.path.join(ckpt, "rl_agent_config.json"), encoding="utf-8") as f:
        temps = Temperatures.from_config(json.load(f))

    # parity rows: mixed lengths in batches of 8 (one 512), and each batch's rows alone
    cpu = LayaTorch.from_checkpoint(ckpt, "cpu", torch.float32)
    vocab = cpu.spec.vocab_size
    rng = np.random.default_rng(7)
    batches = []
    for i in range(a.parity_batches):
        lengths = rng.integers(24, 512, size=8)
        lengths[0] = 512 if i % 2 == 0 else lengths[0]
        batches.append(rows(lengths, rng.integers(2, 13, size=8), vocab, seed=100 + i))
    torch.set_num_threads(os.cpu_count() or 1)
    t = time.perf_counter()
    refs = []
    with torch.inference_mode():
        for b in batches:
            tb = {k: torch.from_numpy(v) for k, v in b.items()}
            lg, act = cpu(tb["input_ids"], tb["attention_mask"], tb["marker_pos"], tb["marker_mask"], tb["qtype"])
            refs.append((lg.numpy(), act.numpy()))
    rec("cpu_reference", checkpoint=cname, s=time.perf_counter() - t, rows=8 * len(batches))
    del cpu
    packed = [rows_from_padded(b) for b in batches]
    timed = {name: rows_from_padded(rows(L, k, vocab, seed=len(L))) for name, (L, k) in TIMED.items()}

    models = {}
    table = []
    only = {s for s in a.only.split(",") if s}
    real_dot = ca.dot_precision
    for name, dtype, prec, opt in variants(torch):
        if only and name not in only:
            continue
        try:
            if dtype not in models:
                models[dtype] = LayaTorch.from_checkpoint(ckpt, "cuda", dtype)
            model = models[dtype]
            f32 = torch.float32
            head_dtype(model, f32 if prec.split_head else dtype, dtype if opt.get("scorer16") else f32)
            model.use_fused_kernels(prec)
            apply_cublas_policy(prec)
            torch.backends.cuda.matmul.allow_tf32 = bool(opt.get("tf32"))
            if "dot" in opt:
                ca.dot_precision = lambda dt, _d=opt["dot"]: None if dt != torch.float32 else _d
            plan = packed_plan(256, 512, 16384, dtype)
            pf = PackedForward(model, dev, plan)
            worst = worst_act = shift = 0.0
            for pr, (lr, ar) in zip(packed, refs):
                lg, act = pf.forward(pr, 0)
                K = pr.marker_counts
                for i in range(pr.n):
                    k = int(K[i])
                    tq = temps.for_question(int(pr.qtypes[i]), k)
                    p = softmax(lg[i, :k] / tq)
                    worst = max(worst, float(np.abs(p - softmax(lr[i, :k] / tq)).max()))
                    worst_act = max(worst_act, float(np.abs(softmax(act[i]) - softmax(ar[i])).max()))
                    alone, _ = pf.forward(pr.take([i]), 0)
                    shift = max(shift, float(np.abs(softmax(alone[0, :k] / tq) - p).max()))
            times = {}
            for tname, tr in (timed.items() if timing else ()):
                pf.forward(tr, 0)
                b = plan.bucket(tr.n, len(tr.ids), int(tr.marker_counts.max()))
                g = pf.cache.get(b).graph
                host = []
                for _ in range(a.iters):
                    t0 = time.perf_counter()
                    pf.forward(tr, 0)
                    host.append((time.perf_counter() - t0) * 1e3)
                times[tname] = {"replay_ms": replay_ms(torch, g, a.iters), "host_p50_ms": float(np.median(host))}
            r = rec("variant", checkpoint=cname, name=name, dtype=str(dtype)[6:], precision=repr(prec), options=opt,
                    max_abs_dp=worst, max_abs_dp_act=worst_act, alone_vs_beside_dp=shift, times=times)
            table.append(r)
            pf.close()
        except Exception:  # a failing variant is a finding; the others still run
            import traceback
            rec("error", checkpoint=cname, name=name, error=traceback.format_exc()[-1500:])
        finally:
            ca.dot_precision = real_dot
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.cuda.empty_cache()

    del models
    torch.cuda.empty_cache()
    return table


if __name__ == "__main__":
    sys.exit(main())
