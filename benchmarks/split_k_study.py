"""Split-K for the encoder's output GEMMs (benchmarks/split_k.py, an experiment) against cuBLAS, on CUDA.

1. Kernels (skip with --skip-kernels). Per token count and output linear of a `large` layer
   (attention's Wo: K 1024; the MLP's Wo: K 2624; 1024 outputs), and per form (exact: split fp16
   pairs, 2 terms; fast: fp16 operands, 1 term): the GEMM plus the residual add and norm after it
   (cuda_kernels.add_layer_norm), as cuBLAS with a float32 output, and as split-K in each number of
   parts. Microseconds per pair of launches (20 pairs in one CUDA graph, median of 15 replays:
   attention_check.graph_time), the ratio to cuBLAS, which `plan` serves, and max |y - cuBLAS y|.
2. The model. PackedForwards over the same model, each capturing its graphs under one setting of
   the plan: `cublas` (no split-K), `plan` (split_k.s constants as they are) and the named
   TARGET_PROGRAMS variants. Graph replays per shape, the variants taking turns round after round;
   model time per shape (median over rounds of the mean of ITERS replays) and max |logit - cublas|.

    python3 -m benchmarks.split_k_study --ckpt /tmp/lb/large [--dtype float32|float16] [--rounds 5]
        [--targets 132,528] [--skip-kernels] [--shapes 1x132,1x512]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys

import numpy as np

TOKENS = (132, 264, 396, 512)
LINEARS = (("attn.Wo", 1024, 1024), ("mlp.Wo", 2624, 1024))
PARTS = (2, 3, 4, 6, 8, 11)
DEVICE = "cuda"
SHAPES = ((1, 132, 3), (2, 132, 3), (1, 256, 3), (3, 132, 4), (1, 512, 5), (6, 132, 4))


def kernel_study(torch) -> None:
    from benchmarks.attention_check import graph_time
    from laya_grpc.inference import cuda_kernels as ck
    from benchmarks import split_k
    from laya_grpc.inference.split_gemm import SplitLinear, mm_fp32_out
    torch.manual_seed(0)
    print("| linear | tokens | form | cuBLAS us | " + " | ".join("%d parts" % p for p in PARTS)
          + " | plan | best / cuBLAS | max abs diff |")
    print("|---|---|---|---|" + "---|" * len(PARTS) + "---|---|---|")
    for n in TOKENS:
        for name, k, m in LINEARS:
            w = (torch.randn(m, k, device=DEVICE) * k ** -0.5).half()
            sp = SplitLinear(w.float())                                # fp16-exact: two terms
            x = torch.randn(n, k, device=DEVICE)
            res = torch.randn(n, m, device=DEVICE)
            gamma = torch.ones(m, device=DEVICE)
            forms = {"exact": (ck.split_fp16(x, 2), sp.w, 2, 2),   # x operand, weight, terms, y split
                     "fast": (x.half(), w, 1, 0)}
            for form, (xo, wo, terms, ysplit) in forms.items():
                ydt = torch.float32 if ysplit else torch.float16
                cublas_o = (lambda: sp.on_split(xo)) if terms == 2 else (lambda: mm_fp32_out(xo, wo))

                def run(make_o):   # the residual is updated in place: a fresh copy for each call to compare
                    r = res.clone()
                    return lambda: ck.add_layer_norm(r, make_o(), gamma, 1e-5, out_dtype=ydt, split=ysplit)[1]
                def value(y):      # a split y as the float32 it stands for (hi + lo)
                    return y[:, :m].float() + y[:, m: 2 * m].float() if ysplit else y.float()
                base = graph_time(torch, run(cublas_o))
                ref = value(run(cublas_o)())
                us, diff = {}, 0.0
                for parts in PARTS:
                    if k // parts < split_k.BLOCK_K:
                        continue
                    make = lambda parts=parts: split_k.gemm(xo, wo, k, terms, 1.0, parts)   # noqa: E731
                    us[parts] = graph_time(torch, run(make))
                    diff = max(diff, float((value(run(make)()) - ref).abs().max()))
                plan = split_k.plan(n, k, m)
                print("| %s | %d | %s | %.2f | %s | %s | %.3f | %.1e |" % (
                    name, n, form, base, " | ".join("%.2f" % us[p] if p in us else "" for p in PARTS),
                    plan or "cuBLAS", min(us.values()) / base, diff), flush=True)
                print(json.dumps({"kind": "split_k_kernel", "linear": name, "tokens": n, "form": form,
                                  "cublas_us": base, "parts_us": us, "plan": plan, "max_abs_diff": diff}), flush=True)


@contextlib.contextmanager
def setting(split_k, name: str):
    """split_k's plan as variant `name` sets it, while its graphs are captured."""
    saved = (split_k.MAX_TOKENS, split_k.TARGET_PROGRAMS)
    if name == "cublas":
        split_k.MAX_TOKENS = 0
    elif name != "plan":
        split_k.TARGET_PROGRAMS = int(name.split("-")[1])
    try:
        yield
    finally:
        split_k.MAX_TOKENS, split_k.TARGET_PROGRAMS = saved


def model_study(torch, a) -> None:
    from benchmarks.model_speed import ensure_large, replay_ms, rows
    from benchmarks import split_k
    from laya_grpc.inference.cuda_graphs import PackedForward, packed_plan
    from laya_grpc.inference.packing import rows_from_padded
    from laya_grpc.inference.torch_model import LayaTorch
    ensure_large(a.ckpt, lambda kind, **kw: print(json.dumps(dict(kind=kind, **kw)), flush=True))
    dev = torch.device("cuda:0")
    dtype = getattr(torch, a.dtype)
    model = LayaTorch.from_checkpoint(a.ckpt, str(dev), dtype)
    model.use_fused_kernels()
    split_k.install(model)          # the variants differ by the plan in force while their graphs capture
    variants = ["cublas", "plan"] + ["target-%d" % int(t) for t in a.targets.split(",") if t]
    forwards = {v: PackedForward(model, dev, packed_plan(256, 512, 16384, dtype), graphs=True) for v in variants}
    shapes = [s for s in SHAPES if "%dx%d" % s[:2] in a.shapes.split(",")]
    batches = {s: rows_from_padded(rows([s[1]] * s[0], s[2], model.spec.vocab_size, seed=s[0])) for s in shapes}

    def entries(v, s):
        pf = forwards[v]
        out, logits = [], []
        with setting(split_k, v):
            for index in pf.plan.split(batches[s]):
                part = batches[s].take(index)
                lg, _ = pf.forward(part, 0)
                logits.append(lg)
                b = pf.plan.bucket(part.n, len(part.ids), int(part.marker_counts.max()))
                out.append((b, pf.cache.get(b)))
        return out, np.concatenate(logits)

    diffs, parts = {}, {}
    for s in shapes:
        ref = None
        for v in variants:
            es, lg = entries(v, s)
            ref = lg if ref is None else ref
            live = np.abs(ref) < 1e3
            diffs[(v, s)] = float(np.abs(lg - ref)[live].max())
            with setting(split_k, v):
                parts[(v, s)] = [split_k.plan(b.tokens, k, 1024) for b, _ in es for k in (1024, 2624)]
    times = {(v, s): [] for v in variants for s in shapes}
    for r in range(a.rounds):
        for s in shapes:
            for v in (variants if r % 2 == 0 else variants[::-1]):
                es, _ = entries(v, s)
                times[(v, s)].append(sum(replay_ms(torch, e.graph, a.iters) for _, e in es))
    print("\nmodel, %s weights (ms per forward; parts of attn.Wo/mlp.Wo)" % a.dtype)
    print("| rows x tokens | " + " | ".join(variants) + " | " + " | ".join("%s/cublas" % v for v in variants[1:])
          + " | max abs logit diff |")
    print("|---|" + "---|" * (2 * len(variants)))
    for s in shapes:
        med = {v: statistics.median(times[(v, s)]) for v in variants}
        print("| %d x %d | " % s[:2] + " | ".join("%.3f (%s)" % (med[v], "/".join(map(str, parts[(v, s)])))
                                                   for v in variants)
              + " | " + " | ".join("%.3f" % (med[v] / med["cublas"]) for v in variants[1:])
              + " | %.1e |" % max(diffs[(v, s)] for v in variants), flush=True)
        print(json.dumps({"kind": "split_k_model", "dtype": a.dtype, "rows": s[0], "tokens": s[1], "median_ms": med,
                          "runs_ms": {v: times[(v, s)] for v in variants}, "max_abs_diff": {v: diffs[(v, s)] for v in variants},
                          "parts": {v: parts[(v, s)] for v in variants}}), flush=True)
    for pf in forwards.values():
        pf.close()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m benchmarks.split_k_study", description=__doc__.split("\n\n")[0])
    p.add_argument("--ckpt", required=True, help="checkpoint directory (made as `large` if missing)")
    p.add_argument("--dtype", default="float32", choices=("float32", "float16"))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--iters", type=int, default=50, help="graph replays per timing")
    p.add_argument("--targets", default="132,528", help="TARGET_PROGRAMS variants of the model study")
    p.add_argument("--shapes", default=",".join("%dx%d" % s[:2] for s in SHAPES))
    p.add_argument("--skip-kernels", action="store_true")
    a = p.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("split_k_study: no CUDA device")
        return 1
    print("device:", torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    if not a.skip_kernels:
        kernel_study(torch)
    model_study(torch, a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
