"""Model time on CUDA of the serving network behind the bucketed CUDA graphs, as TorchRunner runs
it, per encoder mode (reference: transformers op for op; fused: the Triton kernels, attention in
one launch a layer (cuda_attention.py), residual add + LayerNorm in one kernel; packed: fused
with the rows of a batch packed into one token stream, packing.py): weight
load, CUDA init, capture and replay per shape, the warm set's capture time (the ready-time cost),
parity against CPU fp32 (the bit-exact-to-upstream path), steady state, and which SDPA kernels our
mask shapes reach.

`python -m benchmarks.model_speed --ckpt DIR --out DIR [--modes packed,fused,reference]`
(makes a `large` checkpoint in DIR if it is missing). Needs only torch, numpy, safetensors,
tokenizers and (fused) triton, so it runs on a bare GPU machine. Writes model_speed.jsonl (every
record) and prints a summary table last.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

SHAPES = ((1, 132, 3), (1, 512, 5), (6, 132, 4), (64, 132, 3))   # rows, tokens, markers
MIXED = 64      # a batch of this many rows of mixed lengths (24..512): what padding costs most
PARITY_TOL_DP, PARITY_TIE_MARGIN = 1e-2, 0.04


def rows(lengths, markers, vocab, seed):
    """Padded batch of rows with the given token counts (random ids, markers at 2, 4, ...)."""
    from laya_grpc.core.wire.packed_rows import PackedRows
    rng = np.random.default_rng(seed)
    lengths = np.asarray(lengths, dtype=np.int32)
    ks = np.full(len(lengths), markers, dtype=np.int32) if np.isscalar(markers) else np.asarray(markers, np.int32)
    pr = PackedRows(ids=rng.integers(5, vocab, size=int(lengths.sum()), dtype=np.int32),
                    row_offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32),
                    markers=np.concatenate([np.arange(1, k + 1, dtype=np.int32) * 2 for k in ks]),
                    marker_offsets=np.concatenate([[0], np.cumsum(ks)]).astype(np.int32),
                    qtypes=rng.integers(0, 3, size=len(lengths)).astype(np.int32))
    return pr.pad(0)


def ensure_large(ckpt: str, rec) -> None:
    """The random-weight `large` checkpoint at `ckpt`, made (and timed) when it is missing."""
    if not os.path.exists(os.path.join(ckpt, "model.safetensors")):
        from laya_grpc.cli.make_checkpoint import make_checkpoint
        t = time.perf_counter()
        make_checkpoint(ckpt, "large")
        rec("make_checkpoint", s=time.perf_counter() - t)


class Out:
    def __init__(self, path):
        self.f = open(path, "a", encoding="utf-8")

    def __call__(self, kind, **kw):
        rec = {"kind": kind, **kw}
        self.f.write(json.dumps(rec) + "\n")
        self.f.flush()
        print(json.dumps(rec), flush=True)
        return rec


def replay_ms(torch, graph, iters):
    for _ in range(10):
        graph.replay()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(iters):
        graph.replay()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) / iters


def host_ms(gf, batch, iters):
    out = []
    for _ in range(iters):
        t = time.perf_counter()
        gf.forward(batch)
        out.append((time.perf_counter() - t) * 1e3)
    return float(np.median(out)), float(np.percentile(out, 95))


def parity(gf, refs, batches):
    worst, total, agree, ties, bad = 0.0, 0, 0, 0, 0
    for b, ref in zip(batches, refs):
        lg, act = gf.forward(b)
        lr, ar = ref
        K = b["marker_mask"].sum(1)
        for i in range(len(K)):
            k = int(K[i])
            p, q = softmax(lg[i, :k]), softmax(lr[i, :k])
            srt = np.sort(q)[::-1]
            margin = float(srt[0] - srt[1]) if k > 1 else 1.0
            same = int(np.argmax(p)) == int(np.argmax(q))
            total, agree = total + 1, agree + same
            ties += margin < PARITY_TIE_MARGIN
            bad += (not same) and margin >= PARITY_TIE_MARGIN
            worst = max(worst, float(np.abs(p - q).max()), float(np.abs(softmax(act[i]) - softmax(ar[i])).max()))
    return dict(rows=total, agree=agree, near_ties=ties, disagree_outside_ties=bad, max_abs_dp=worst,
                passed=bool(bad == 0 and worst <= PARITY_TOL_DP))


def softmax(x):
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(x - x.max())
    return e / e.sum()


def attention_probe(torch, rec):
    """Which SDPA kernels run our shapes (boolean mask, True = may attend, broadcast over heads,
    as torch_model._masks builds it), and how fast."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    for B, L in ((1, 160), (64, 160), (1, 512)):
        q, k, v = (torch.randn(B, L, 16, 64, device="cuda", dtype=torch.float16).transpose(1, 2) for _ in range(3))
        allowed = torch.ones(B, 1, L, L, device="cuda", dtype=torch.bool)
        allowed[..., L - 20:] = False
        for name, backends, mask in (("default", None, allowed), ("efficient", [SDPBackend.EFFICIENT_ATTENTION], allowed),
                                     ("cudnn", [SDPBackend.CUDNN_ATTENTION], allowed), ("math", [SDPBackend.MATH], allowed),
                                     ("flash_nomask", [SDPBackend.FLASH_ATTENTION], None)):
            try:
                def call():
                    if backends is None:
                        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
                    with sdpa_kernel(backends):
                        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
                for _ in range(3):
                    call()
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                for _ in range(50):
                    call()
                e.record()
                torch.cuda.synchronize()
                rec("sdpa", B=B, L=L, backend=name, us=s.elapsed_time(e) / 50 * 1e3)
            except Exception as ex:  # an unsupported backend is a finding, not a failure
                rec("sdpa", B=B, L=L, backend=name, error=str(ex).splitlines()[0][:160])


def set_mode(torch, model, mode: str) -> None:
    if mode == "reference":
        model.kernels = "reference"
    elif mode in ("fused", "packed"):
        model.use_fused_kernels()
    else:
        raise SystemExit("unknown mode %r" % mode)


class Packed:
    """PackedForward (the rows of a batch in one token stream, packing.py) behind CudaGraphForward's
    padded-batch interface, so every figure here is taken the same way for both."""

    def __init__(self, model, dev):
        from laya_grpc.inference.cuda_graphs import PackedForward, packed_plan
        self.plan = packed_plan(256, 512, 16384, model.encoder.embeddings.tok_embeddings.weight.dtype)
        self.pf = PackedForward(model, dev, self.plan)
        self.cache = self.pf.cache

    def bucket(self, b):
        from laya_grpc.inference.packing import rows_from_padded
        r = rows_from_padded(b)
        return self.plan.bucket(r.n, len(r.ids), int(r.marker_counts.max()))

    def forward(self, b):
        from laya_grpc.inference.packing import rows_from_padded
        lg, act = self.pf.forward(rows_from_padded(b), 0)
        return lg[:, : b["marker_pos"].shape[1]], act

    def warm(self, buckets):
        self.pf.warm(buckets)

    def close(self):
        self.pf.close()


def measure(a, rec, torch, model, plan, bench, refs, par_batches, rng, vocab, mode):
    """Capture the bench buckets, time each, check parity, then check steady state."""
    from functools import partial
    from laya_grpc.inference.cuda_graphs import CudaGraphForward
    rec = partial(rec, mode=mode)
    set_mode(torch, model, mode)
    packed = mode == "packed"
    gf = Packed(model, torch.device("cuda:0")) if packed else CudaGraphForward(model, torch.device("cuda:0"), plan,
                                                                                parallel=False)
    caps = []
    for b in bench.values():
        t = time.perf_counter()
        gf.forward(b)
        caps.append(time.perf_counter() - t)
    rec("capture", first_s=caps[0], rest_s=caps[1:])
    times = []
    for s, b in bench.items():
        bk = gf.bucket(b) if packed else plan.bucket(s[0], s[1], s[2])
        lg, act = gf.forward(b)
        assert np.isfinite(lg).all() and np.isfinite(act).all(), s
        times.append(rec("time", rows=s[0], tokens=s[1], bucket=[bk.segments if packed else bk.rows, bk.tokens],
                         replay_ms=replay_ms(torch, gf.cache.get(bk).graph, a.iters),
                         host_ms=host_ms(gf, b, a.iters)))
    par = rec("parity", **parity(gf, refs, par_batches))
    if packed:   # the steady traffic below lands in token buckets of its own: capture them all first
        gf.warm([b for b in gf.plan.warm_buckets() if b not in set(gf.cache.keys())])
    captures = gf.cache.captures
    torch.cuda.synchronize()
    mem0 = torch.cuda.memory_allocated()
    for i in range(40):   # traffic inside the bench buckets: no capture and no growth
        s = SHAPES[i % len(SHAPES)]
        top = plan.bucket(s[0], s[1], s[2]).tokens
        gf.forward(rows(rng.integers(top - 31, top + 1, size=s[0]), s[2], vocab, seed=i))
    torch.cuda.synchronize()
    rec("steady", new_captures=gf.cache.captures - captures, alloc_growth_bytes=torch.cuda.memory_allocated() - mem0)
    if a.warm_set:
        # what TorchRunner.warm() does before ready: every bucket within the default token budget
        every = gf.plan.warm_buckets() if packed else plan.warm_buckets(16384)
        buckets = [b for b in every if b not in set(gf.cache.keys())]
        t = time.perf_counter()
        gf.warm(buckets)
        torch.cuda.synchronize()
        rec("warm_set", graphs=len(gf.cache), captured_now=len(buckets), s=time.perf_counter() - t,
            reserved_bytes=torch.cuda.memory_reserved())
    gf.close()
    return times, par


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.model_speed")
    p.add_argument("--ckpt", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--iters", type=int, default=300)
    p.add_argument("--parity-rows", type=int, default=96)
    p.add_argument("--modes", default="packed,fused,reference")
    p.add_argument("--dtype", choices=("float16", "float32"), default="float16",
                   help="the weights: float16 is the fast mode; float32 the exact mode `--dtype auto` serves on "
                        "CUDA (its split GEMMs need the fused kernels: modes packed and fused)")
    p.add_argument("--warm-set", action="store_true", help="also time the capture of the whole warm set per mode")
    p.add_argument("--token-buckets", default=None,
                   help="comma list of token bucket sizes (default: cuda_graphs.DEFAULT_TOKEN_BUCKETS)")
    a = p.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    rec = Out(os.path.join(a.out, "model_speed.jsonl"))
    ensure_large(a.ckpt, rec)

    t = time.perf_counter()
    import torch
    from laya_grpc.inference.cuda_graphs import BucketPlan
    from laya_grpc.inference.torch_model import LayaTorch
    torch.zeros(1, device="cuda")
    rec("cuda_init", s=time.perf_counter() - t, torch=torch.__version__, gpu=torch.cuda.get_device_name())

    t = time.perf_counter()
    model = LayaTorch.from_checkpoint(a.ckpt, "cuda", getattr(torch, a.dtype))
    torch.cuda.synchronize()
    rec("load", how="direct_to_cuda", dtype=a.dtype, s=time.perf_counter() - t, bytes=os.path.getsize(os.path.join(a.ckpt, "model.safetensors")))
    vocab = model.spec.vocab_size

    # CPU fp32 reference outputs for the parity rows (the bit-exact-to-upstream path)
    rng = np.random.default_rng(7)
    par_batches = []
    for i in range(a.parity_rows // 8):
        n = 1 if i % 4 == 0 else 8
        lengths = rng.integers(24, 512 if i % 3 == 0 else 200, size=n)
        par_batches.append(rows(lengths, rng.integers(2, 10, size=n), vocab, seed=100 + i))
    t = time.perf_counter()
    torch.set_num_threads(os.cpu_count() or 1)
    cpu = LayaTorch.from_checkpoint(a.ckpt, "cpu", torch.float32)
    refs = []
    with torch.inference_mode():
        for b in par_batches:
            tb = {k: torch.from_numpy(v) for k, v in b.items()}
            lg, act = cpu(tb["input_ids"], tb["attention_mask"], tb["marker_pos"], tb["marker_mask"], tb["qtype"])
            refs.append((lg.numpy(), act.numpy()))
    rec("cpu_reference", s=time.perf_counter() - t, rows=sum(len(b["input_ids"]) for b in par_batches))
    del cpu

    plan = BucketPlan(max_rows=256, max_tokens=512) if not a.token_buckets else BucketPlan(
        max_rows=256, max_tokens=512, token_buckets=tuple(int(t) for t in a.token_buckets.split(",")))
    bench = {s: rows([s[1]] * s[0], s[2], vocab, seed=s[0]) for s in SHAPES}
    mixed = np.random.default_rng(3).integers(24, 513, size=MIXED)
    bench[(MIXED, int(mixed.max()), 3)] = rows(mixed, 3, vocab, seed=5)     # padded: 64 x 512
    summary = {}
    for mode in a.modes.split(","):
        try:
            summary[mode] = measure(a, rec, torch, model, plan, bench, refs, par_batches, rng, vocab, mode)
        except Exception as ex:  # a failing mode is a finding; the others still run
            rec("error", mode=mode, error=repr(ex)[:300])
        torch.cuda.empty_cache()
    attention_probe(torch, rec)

    for mode, (times, par) in summary.items():
        print("\n[%s %s]\n%-10s %10s %14s" % (mode, a.dtype, "shape", "replay ms", "host p50/p95"))
        for r in times:
            print("%-10s %10.3f %8.3f/%.3f" % ("%dx%d" % (r["rows"], r["tokens"]), r["replay_ms"], *r["host_ms"]))
        print("parity max|dp| %.4f disagree_outside_ties %d passed %s"
              % (par["max_abs_dp"], par["disagree_outside_ties"], par["passed"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
