"""The exact mode's two costliest steps at the served shapes, each in several forms: which is fastest where.

`python3 -m benchmarks.exact_kernels_study` on the GPU host; torch + triton only (no checkpoint).
The `large` checkpoint's shapes (d 1024, 16 heads of 64, intermediate 2624, window 64), token counts of
the packed buckets one short row to a 256-row forward lands in.

1. The split GEMM (inference/split_gemm.py) of each of a layer's four linears, y = x W^T in float32 from
   x's split form [x_hi | x_lo] and fp16 W (two terms: Laya's weights are fp16), per form:
     fp16     mm(x16, W^T) with a float32 result: the fast mode's GEMM, a floor for the rest
     kcat     mm([x_hi | x_lo], [W | W]^T): today's (cuBLAS, W stored twice, K doubled)
     mstack   mm([x_hi ; x_lo], W^T) -> [2N, M], then the two halves added (W read once, M doubled)
     tri-...  one Triton kernel reading the split form and W once: acc += x_hi w + x_lo w per K
              block (tile BMxBNxBK, warps, stages)
   Each form's float32 result is compared with x W^T in float64; microseconds per call (20 calls in
   one CUDA graph, median of 15 replays), and per layer (the four linears) per form.
2. Packed attention in float32 (the exact mode: 3xTF32 dots, output in Wo's split form), by default one
   row of 132 tokens in the 160-token bucket's block table and 64 rows of 132 (`--attention-shapes`),
   FULL and SLIDING, per query block BLOCK_M, keys a step BLOCK_N, warps and pipeline stages
   (`--attention-configs`).
"""
from __future__ import annotations

import argparse
import functools
import math
import sys
import traceback

from benchmarks.attention_check import graph_time

D, HEADS, HD, INTER, WINDOW = 1024, 16, 64, 2624, 64
LINEARS = (("Wqkv", D, 3 * D), ("Wo", D, D), ("Wi", D, 2 * INTER), ("Wo2", INTER, D))   # name, K, M
TOKENS = (160, 512, 2048, 16384)
TRITON_CONFIGS = ((32, 64, 64, 4, 4), (64, 64, 64, 4, 4), (64, 128, 64, 4, 3), (128, 128, 64, 8, 3),
                  (128, 256, 64, 8, 3))   # BM, BN, BK, warps, stages
# BLOCK_M, BLOCK_N, warps, stages. The served ones (4 warps, 2 stages) take 64 keys a step at 16 and 32
# queries and 32 keys at 64 queries (cuda_attention.EXACT_BLOCKS, EXACT_LARGE_BLOCKS). A short row's 132
# keys are 3 blocks of 64 (192 keys, 31% of them padding) or 5 of 32 (160, 18%).
ATTENTION_CONFIGS = ((64, 64, 4, 2), (64, 64, 4, 3), (32, 64, 2, 2), (32, 64, 4, 2), (32, 64, 4, 3),
                     (16, 64, 2, 2), (16, 64, 4, 2), (64, 32, 4, 2), (32, 32, 4, 2), (16, 32, 4, 2),
                     (16, 32, 2, 2))


@functools.lru_cache(maxsize=1)
def _dual_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def dual_gemm(a_ptr, w_ptr, y_ptr, N, M, K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                  GROUP: tl.constexpr):
        pid = tl.program_id(0)
        grid_n, grid_m = tl.cdiv(N, BM), tl.cdiv(M, BN)
        width = GROUP * grid_m                  # GROUP row blocks share the W columns they read (L2)
        first = (pid // width) * GROUP
        rows = tl.minimum(grid_n - first, GROUP)
        pn = first + (pid % width) % rows
        pm = (pid % width) // rows
        offs_n = pn * BM + tl.arange(0, BM)
        offs_m = pm * BN + tl.arange(0, BN)
        offs_k = tl.arange(0, BK)
        n_ok, m_ok = offs_n < N, offs_m < M
        a = a_ptr + offs_n[:, None].to(tl.int64) * (2 * K) + offs_k[None, :]
        w = w_ptr + offs_m[None, :].to(tl.int64) * K + offs_k[:, None]
        acc = tl.zeros((BM, BN), tl.float32)
        for k0 in range(0, K, BK):
            k_ok = (k0 + offs_k) < K
            am = n_ok[:, None] & k_ok[None, :]
            b = tl.load(w + k0, mask=k_ok[:, None] & m_ok[None, :], other=0.0)
            acc = tl.dot(tl.load(a + k0, mask=am, other=0.0), b, acc)
            acc = tl.dot(tl.load(a + K + k0, mask=am, other=0.0), b, acc)
        tl.store(y_ptr + offs_n[:, None].to(tl.int64) * M + offs_m[None, :], acc, mask=n_ok[:, None] & m_ok[None, :])

    return triton, dual_gemm


def dual_mm(a2, w, out, cfg):
    """[x_hi | x_lo] [N, 2K] fp16 and W [M, K] fp16 -> out [N, M] float32 in one Triton launch at tile cfg."""
    triton, kernel = _dual_kernel()
    bm, bn, bk, warps, stages = cfg
    n, m, k = a2.shape[0], w.shape[0], w.shape[1]
    kernel[(triton.cdiv(n, bm) * triton.cdiv(m, bn),)](a2, w, out, n, m, K=k, BM=bm, BN=bn, BK=bk, GROUP=8,
                                                       num_warps=warps, num_stages=stages)
    return out


def gemm_study(torch) -> dict:
    from laya_grpc.inference import cuda_kernels as ck
    g = torch.Generator(device="cuda").manual_seed(0)
    per_layer = {}
    for n in TOKENS:
        for name, k, m in LINEARS:
            x = torch.randn(n, k, device="cuda", generator=g) * 0.5
            w = (torch.randn(m, k, device="cuda", generator=g) * k ** -0.5).half()
            ref = (x.double() @ w.double().t())
            x16 = x.half()
            a2 = ck.split_fp16(x.contiguous(), 2)                     # [N, 2K]: [hi | lo]
            wcat = torch.cat([w, w], 1).contiguous()
            ast = torch.cat([a2[:, :k], a2[:, k:]], 0).contiguous()    # [2N, K]
            y = torch.empty(n, m, device="cuda")
            y2 = torch.empty(2 * n, m, device="cuda")
            forms = {
                "fp16": lambda: torch.mm(x16, w.t(), out_dtype=torch.float32, out=y),
                "kcat": lambda: torch.mm(a2, wcat.t(), out_dtype=torch.float32, out=y),
                "mstack": lambda: torch.add(torch.mm(ast, w.t(), out_dtype=torch.float32, out=y2)[:n], y2[n:], out=y),
            }
            for cfg in TRITON_CONFIGS:
                forms["tri-%dx%dx%d-w%d-s%d" % cfg] = (lambda c=cfg: dual_mm(a2, w, y, c))
            for form, fn in forms.items():
                try:
                    fn()
                    torch.cuda.synchronize()
                    err = float(((y.double() - ref).abs() / (ref.abs() + 1e-3 * float(ref.abs().max()))).max())
                    us = graph_time(torch, fn)
                except Exception as e:  # noqa: BLE001 - one form's failure hides no other
                    print("gemm %5d %-5s %-22s ERROR %s: %s" % (n, name, form, type(e).__name__, str(e)[:200]), flush=True)
                    continue
                per_layer.setdefault((n, form), []).append(us)
                tb = (m * k * (1 if form != "kcat" else 2) * 2) / (us * 1e-6) / 1e12
                print("gemm %5d %-5s %-22s %9.2f us  weights %5.2f TB/s  max rel err %.2e (%.1f bits)"
                      % (n, name, form, us, tb, err, -math.log2(err) if err > 0 else 99), flush=True)
    return per_layer


def attention_study(torch, shapes, configs=ATTENTION_CONFIGS) -> None:
    from benchmarks.attention_check import _rope_table
    from laya_grpc.inference import cuda_attention as ca
    from laya_grpc.inference.packing import PackedPlan, fill
    from laya_grpc.inference.registry import synthetic_rows
    g = torch.Generator(device="cuda").manual_seed(1)
    cos, sin = _rope_table(512, HD, torch.float16)
    for rows, length in shapes:
        batch = synthetic_rows(rows, length, 1, 1000)
        for bm, bn, warps, stages in configs:
            # the served plan's bucket and block table, every bucket at this query block
            plan = PackedPlan(max_rows=256, max_row_tokens=512, max_batch_tokens=16384, block_m=bm)
            b = plan.bucket(rows, rows * length, 1)
            flat = torch.zeros(sum(b.sizes().values()), dtype=torch.int32)
            fill(b.views(flat.numpy()), batch, b, 0)
            v = {k: t.to("cuda") for k, t in b.views(flat).items()}
            starts, lengths, blk_seg, blk_m0 = v["starts"], v["lengths"], v["blk_seg"], v["blk_m0"]
            qkv = torch.randn(b.tokens, 3 * HEADS * HD, device="cuda", generator=g)
            for sliding in (False, True):
                def fn():
                    return ca.attention_packed(qkv, cos, sin, starts, lengths, blk_seg, blk_m0, HEADS, WINDOW,
                                               sliding, HD ** -0.5, split=2, num_warps=warps,
                                               num_stages=stages, block_m=bm, block_n=bn)
                kind = "sliding" if sliding else "full"
                try:
                    us = graph_time(torch, fn)
                except Exception as e:  # noqa: BLE001
                    print("attention %dx%d %s bm%d bn%d w%d s%d ERROR %s: %s" % (
                        rows, length, kind, bm, bn, warps, stages, type(e).__name__, str(e)[:200]), flush=True)
                    continue
                print("attention %3dx%d %-7s bm%-2d bn%-2d w%d s%d %8.2f us" % (rows, length, kind, bm, bn, warps,
                                                                              stages, us), flush=True)


def main(argv=None) -> int:
    import torch
    p = argparse.ArgumentParser(prog="python3 -m benchmarks.exact_kernels_study")
    p.add_argument("--studies", default="gemm,attention")
    p.add_argument("--attention-shapes", default="1x132,64x132",
                   help="the attention study's batches, rows x tokens a row, comma-separated")
    p.add_argument("--attention-configs", default=None,
                   help="the attention study's launches, BLOCK_M:BLOCK_N:warps:stages, comma-separated "
                        "(default: %s)" % ",".join(":".join(map(str, c)) for c in ATTENTION_CONFIGS))
    a = p.parse_args(argv)
    configs = ATTENTION_CONFIGS if not a.attention_configs else \
        [tuple(int(v) for v in c.split(":")) for c in a.attention_configs.split(",")]
    if not torch.cuda.is_available():
        print("exact_kernels_study: no CUDA device")
        return 1
    print("device:", torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    if "attention" in a.studies:
        try:
            attention_study(torch, [tuple(int(v) for v in s.split("x")) for s in a.attention_shapes.split(",")],
                            configs)
        except Exception:  # noqa: BLE001
            traceback.print_exc()
    if "gemm" in a.studies:
        per_layer = gemm_study(torch)
        print("\nper layer (the four linears), us:")
        for n in TOKENS:
            forms = sorted((sum(v), f) for (t, f), v in per_layer.items() if t == n and len(v) == len(LINEARS))
            print("%5d tokens: " % n + ", ".join("%s %.1f" % (f, s) for s, f in forms))
    return 0


if __name__ == "__main__":
    sys.exit(main())
