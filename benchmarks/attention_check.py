"""The one-launch attention kernel (inference/cuda_attention.py) on a real GPU: right, then fast.

`python3 -m benchmarks.attention_check` on the GPU host; needs torch + triton only (no checkpoint).

1. Correctness: the kernel against the reference (RoPE through the eager ops in fp32, rounded to the
   storage dtype, then fp32 SDPA with the boolean masks of `LayaTorch._masks`, sequential layout),
   fresh random inputs, the real head shape (H=16, hd=64, window=64) at B x L in 1x160, 1x512, 8x160,
   64x160, 256x64 (rows of random lengths, the first full, one of length 1), plus small heads
   (hd 16 and 32) and bf16/fp32; the output buffer is poisoned with NaN first, so an element the
   kernel did not write fails. Prints max |err| per case.
2. Timing, per shape, FULL and SLIDING: each variant called 20 times inside one CUDA graph, the
   graph replayed several times (CUDA events), median per call:
     new      the kernel as the model calls it          m32  BLOCK_M 32 instead of 64
     for-sN   the for form of the key loop, num_stages N   while  the while form (what the CPU
     interpreter runs)   while-w8  with 8 warps
     sdpa     today's path: rope_qk + SDPA with the additive fp16 bias + transpose/reshape copy
   plus, once per forward (amortised over the layers in the model): the bias build (sdpa path) and
   the lengths reduction (new path). Every variant runs in its own try/except, so one failure
   hides no other. 3. The number of compiled kernel variants after all shapes (do_not_specialize).
Exits 1 if a correctness case failed.
"""
from __future__ import annotations

import statistics
import sys
import traceback

H, HD, WINDOW = 16, 64, 64
DEFAULT_TOKEN_BUCKETS = (16, 32, 64, 96, 128, 160, 192, 256, 384, 512)   # cuda_graphs.py's
SHAPES = ((1, 160), (1, 512), (8, 160), (64, 160), (256, 64))
CALLS_PER_GRAPH = 20
REPLAYS = 15


def _rotate_half(x):
    import torch
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _rope_table(L, hd, dtype, theta=10000.0):
    import torch
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, device="cuda").float() / hd))
    f = torch.arange(L, device="cuda").float()[:, None] * inv[None, :]
    emb = torch.cat((f, f), -1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _lengths(B, L, g):
    import torch
    lens = torch.randint(1, L + 1, (B,), device="cuda", generator=g)
    lens[0] = L
    if B > 2:
        lens[-1] = 1
    return lens.to(torch.int32)


def _bool_masks(lens, L, window):
    """LayaTorch._masks, sequential layout, for prefix-contiguous rows."""
    import torch
    idx = torch.arange(L, device=lens.device)
    keys = (idx[None, :] < lens[:, None])[:, None, None, :]
    near = (idx[:, None] - idx[None, :]).abs() <= window
    return {"full": keys, "sliding": (keys & near) | (idx[:, None] == idx[None, :])}


def reference(qkv, cos, sin, lens, B, L, heads, window, sliding, scale):
    import torch.nn.functional as F
    hd = qkv.shape[1] // (3 * heads)
    dt = qkv.dtype
    q, k, v = qkv.view(B, L, 3, heads, hd).transpose(1, 3).unbind(2)
    c, s = cos[:L].float(), sin[:L].float()
    qf, kf = q.float(), k.float()
    q = (qf * c + _rotate_half(qf) * s).to(dt)
    k = (kf * c + _rotate_half(kf) * s).to(dt)
    m = _bool_masks(lens, L, window)["sliding" if sliding else "full"]
    a = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=m, scale=scale)
    return a.transpose(1, 2).reshape(B * L, heads * hd)


def check(torch, ca) -> list[str]:
    bad = []
    g = torch.Generator(device="cuda").manual_seed(0)
    cases = [(B, L, H, HD, torch.float16) for B, L in SHAPES]
    cases += [(2, 100, 4, 16, torch.float16), (3, 70, 4, 32, torch.float16), (4, 200, 16, 64, torch.bfloat16),
              (2, 130, 16, 64, torch.float32), (3, 33, 2, 128, torch.float16)]
    for B, L, heads, hd, dt in cases:
        for sliding in (False, True):
            name = "%s B=%d L=%d H=%d hd=%d %s" % ("sliding" if sliding else "full", B, L, heads, hd,
                                                   str(dt).replace("torch.", ""))
            try:
                qkv = torch.randn(B * L, 3 * heads * hd, device="cuda", generator=g).to(dt)
                cos, sin = _rope_table(max(L, 512), hd, dt)
                lens = _lengths(B, L, g)
                scale = hd ** -0.5
                out = torch.full((B * L, heads * hd), float("nan"), device="cuda", dtype=dt)
                ca.attention(qkv, cos, sin, lens, B, L, heads, WINDOW, sliding, scale, out=out)
                ref = reference(qkv, cos, sin, lens, B, L, heads, WINDOW, sliding, scale)
                torch.cuda.synchronize()
                written = bool(torch.isfinite(out).all())
                err = float((out.float() - ref).abs().max())
                tol = {torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 3e-2}[dt]
                ok = written and err <= tol * (1 + float(ref.abs().max()))
                print("check %-40s max|err| %.3g%s%s" % (name, err, "" if written else "  NOT ALL WRITTEN",
                                                         "" if ok else "  FAIL"), flush=True)
                if not ok:
                    bad.append(name)
            except Exception:  # noqa: BLE001 - reported, the other cases still run
                print("check %s ERROR\n%s" % (name, traceback.format_exc()), flush=True)
                bad.append(name)
    return bad


def graph_time(torch, fn) -> float:
    """Median microseconds per call of fn, CALLS_PER_GRAPH calls captured in one CUDA graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()               # compile / autotune / workspace outside the capture
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS_PER_GRAPH):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(REPLAYS):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / CALLS_PER_GRAPH)
    del graph
    return statistics.median(times)


def timings(torch, ca) -> list[tuple]:
    import torch.nn.functional as F
    from laya_grpc.inference import cuda_kernels as ck
    rows = []
    g = torch.Generator(device="cuda").manual_seed(1)
    dt = torch.float16
    for B, L in SHAPES:
        N, d = B * L, H * HD
        qkv = torch.randn(N, 3 * d, device="cuda", generator=g).to(dt)
        cos, sin = _rope_table(512, HD, dt)
        cos, sin = cos[:L], sin[:L]
        lens = _lengths(B, L, g)
        mask = (torch.arange(L, device="cuda")[None, :] < lens[:, None]).long()
        scale = HD ** -0.5
        out = torch.empty(N, d, device="cuda", dtype=dt)
        copy = torch.empty(N, d, device="cuda", dtype=dt)
        for kind in ("full", "sliding"):
            sliding = kind == "sliding"
            bm = _bool_masks(lens, L, WINDOW)[kind]
            bias = torch.zeros(bm.shape, dtype=dt, device="cuda").masked_fill_(~bm, float("-inf"))

            def sdpa():
                qk = ck.rope_qk(qkv, cos, sin, None, B, L, H)
                q = qk[0].view(B, L, H, HD).transpose(1, 2)
                k = qk[1].view(B, L, H, HD).transpose(1, 2)
                v = qkv.view(B, L, 3, H, HD)[:, :, 2].transpose(1, 2)
                a = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale)
                copy.copy_(a.transpose(1, 2).reshape(N, d))

            def bias_build():
                m = _bool_masks(mask.sum(1), L, WINDOW)[kind]
                torch.zeros(m.shape, dtype=dt, device="cuda").masked_fill_(~m, float("-inf"))

            def new(**kw):
                return lambda: ca.attention(qkv, cos, sin, lens, B, L, H, WINDOW, sliding, scale, out=out, **kw)

            variants = {
                "new": new(),
                "m32": new(block_m=32),
                "for-s1": new(loop="for", num_stages=1),
                "for-s2": new(loop="for", num_stages=2),
                "for-s3": new(loop="for", num_stages=3),
                "while": new(loop="while"),
                "while-w8": new(loop="while", num_warps=8),
                "sdpa": sdpa,
                "bias/fwd": bias_build,
                "lengths/fwd": lambda: ca.lengths_of(mask),
            }
            for name, fn in variants.items():
                try:
                    us = graph_time(torch, fn)
                    print("time %-8s %dx%-4d %-12s %8.2f us" % (kind, B, L, name, us), flush=True)
                except Exception as e:  # noqa: BLE001
                    print("time %s %dx%d %s ERROR %s: %s" % (kind, B, L, name, type(e).__name__, e), flush=True)
                    us = float("nan")
                rows.append((kind, "%dx%d" % (B, L), name, us))
    return rows


def compiled_variants(ca) -> str:
    _, kernel = ca._kernel()
    try:
        n = sum(len(c[0]) for c in kernel.device_caches.values())
    except Exception as e:  # noqa: BLE001
        return "unknown (%s)" % e
    return str(n)


def specialisation_check(torch, ca) -> None:
    """Every bucket shape (tokens 16..512 x rows 1..256) x FULL/SLIDING: how many variants the sweep
    compiles (the kernel as the model calls it; 4 at most, FULL/SLIDING x 2 or 3 stages, if nothing
    else ran)."""
    qkv_all = torch.randn(256 * 512, 3 * H * HD, device="cuda").half()
    cos, sin = _rope_table(512, HD, torch.float16)
    before = compiled_variants(ca)
    for sliding in (False, True):
        for rows in (1, 2, 4, 8, 16, 32, 64, 128, 256):
            for L in DEFAULT_TOKEN_BUCKETS:
                lens = torch.full((rows,), L, dtype=torch.int32, device="cuda")
                ca.attention(qkv_all[: rows * L], cos, sin, lens, rows, L, H, WINDOW, sliding, HD ** -0.5)
    torch.cuda.synchronize()
    print("compiled attention-kernel variants: %s before a sweep of %d bucket shapes x FULL/SLIDING, %s after"
          % (before, 9 * len(DEFAULT_TOKEN_BUCKETS), compiled_variants(ca)), flush=True)


def main(argv=None) -> int:
    import argparse
    import torch
    from laya_grpc.inference import cuda_attention as ca
    p = argparse.ArgumentParser(prog="python3 -m benchmarks.attention_check")
    p.parse_args(argv)
    if not torch.cuda.is_available():
        print("attention_check: no CUDA device")
        return 1
    print("device:", torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    try:
        specialisation_check(torch, ca)
    except Exception:  # noqa: BLE001
        traceback.print_exc()
    bad = check(torch, ca)
    rows = []
    try:
        rows = timings(torch, ca)
    except Exception:  # noqa: BLE001
        traceback.print_exc()
    # the table, last: per shape and layer type, microseconds per call
    names = ["new", "m32", "for-s1", "for-s2", "for-s3", "while", "while-w8", "sdpa", "bias/fwd", "lengths/fwd"]
    table = {(k, s, n): us for k, s, n, us in rows}
    shapes = list(dict.fromkeys(s for _, s, _, _ in rows))
    print("\nus per call (median of %d graph replays of %d calls), H=%d hd=%d window=%d fp16"
          % (REPLAYS, CALLS_PER_GRAPH, H, HD, WINDOW))
    print("%-8s %-8s " % ("layer", "BxL") + " ".join("%11s" % n for n in names) + "  sdpa/new")
    for kind in ("full", "sliding"):
        for s in shapes:
            vals = [table.get((kind, s, n), float("nan")) for n in names]
            print("%-8s %-8s " % (kind, s) + " ".join("%11.2f" % v for v in vals)
                  + "  %8.2f" % (vals[7] / vals[0] if vals[0] == vals[0] and vals[0] > 0 else float("nan")))
    if bad:
        print("FAILED: %s" % ", ".join(bad))
        return 1
    print("all correctness checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
