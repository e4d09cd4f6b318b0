"""An experiment, not on the served path: split-K for the encoder's two output projections
(attention's Wo, the MLP's Wo) at small token counts. K is cut into parts, each part's product is
written in float32, and the residual add's kernel sums the parts in order (cuda_kernels.add_layer_norm
takes `o` as [parts, N, d]). `install` puts it in a model's fused forward, for
benchmarks/split_k_study.py to time against cuBLAS.

Why: at one short row (132 tokens) these GEMMs have 1,024 output columns, so cuBLAS runs a few
dozen output tiles, each walking all of K on one SM while most of the GPU's 132 SMs idle. They took
5.8 and 10.6 us where reading their weights takes under 2 us (benchmarks/results/2026-12-06-8a418cd).
Cutting K gives `parts` times the programs, each reading a `1/parts` slice of the weight.

The exact mode's operands are split_gemm's fp16 pairs. cuBLAS multiplies [x_hi | x_lo | x_hi] by
[W_hi | W_hi | W_lo], so it reads W_hi twice. This kernel reads each slice of x_hi, x_lo, W_hi
(and W_lo) once and runs the two (three) dots from registers: half the weight traffic of the
concatenated GEMM where the weights are fp16-exact (`SplitLinear.terms` 2, Laya's checkpoints).
In the fast mode (fp16 operands, one term) the float32 parts are summed before the add, where cuBLAS
hands the add a float32 output too.

The parts are summed in order, with no atomics: the same inputs give the same bits on every run.
Which GEMMs split, and in how many parts, is `plan`; its constants are first guesses for the study
to set. The kernel runs on CPU through Triton's interpreter (tests/test_split_k.py).
"""
from __future__ import annotations

import functools

# split-K at this many tokens or fewer (the GEMM's N); beyond it the output tiles fill the GPU
MAX_TOKENS = 512
# each part walks at least this much of K (a multiple of BLOCK_K)
MIN_K_PER_PART = 256
# aim: about this many programs (output tiles x parts), two waves on an H100's or H200's 132 SMs
TARGET_PROGRAMS = 264
BLOCK_M, BLOCK_N, BLOCK_K = 64, 64, 64      # tokens, output features, K per step
NUM_WARPS, NUM_STAGES = 4, 3


def plan(tokens: int, k: int, m: int) -> int:
    """How many parts to cut K into for an [tokens, k] x [m, k]^T GEMM; 0: not split (cuBLAS)."""
    if tokens > MAX_TOKENS:
        return 0
    tiles = -(-tokens // BLOCK_M) * -(-m // BLOCK_N)
    parts = min(k // MIN_K_PER_PART, max(1, round(TARGET_PROGRAMS / tiles)))
    parts = -(-k // k_per_part(k, parts)) if parts > 1 else 0    # no part left empty by the rounding
    return parts if parts > 1 else 0


def k_per_part(k: int, parts: int) -> int:
    """K per part: k / parts rounded up to a whole BLOCK_K (the last part takes the rest)."""
    step = -(-k // parts)
    return -(-step // BLOCK_K) * BLOCK_K


@functools.lru_cache(maxsize=1)
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def _k_step(xrow, wcol, acc, kk, k1, k, rk, mm, mn, TERMS: tl.constexpr):
        ks = kk + rk
        km = ks < k1
        xm, wm = mm & km[None, :], mn & km[:, None]
        x_hi = tl.load(xrow + ks[None, :], mask=xm, other=0.0)                     # [BM, BK]
        w_hi = tl.load(wcol + ks[:, None], mask=wm, other=0.0)                     # [BK, BN]
        acc = tl.dot(x_hi, w_hi, acc, out_dtype=tl.float32)
        if TERMS >= 2:   # x_lo: split_gemm's layout puts it k columns after x_hi
            x_lo = tl.load(xrow + k + ks[None, :], mask=xm, other=0.0)
            acc = tl.dot(x_lo, w_hi, acc, out_dtype=tl.float32)
        if TERMS == 3:   # W_lo: 2k columns after W_hi in SplitLinear.w
            w_lo = tl.load(wcol + 2 * k + ks[:, None], mask=wm, other=0.0)
            acc = tl.dot(x_hi, w_lo, acc, out_dtype=tl.float32)
        return acc

    # the kernel finds its helper, and the helper `tl`, as module globals: Triton's interpreter and its
    # compiler's dependency scan resolve names through a jit function's __globals__, not its closure
    globals().update(_k_step=_k_step, tl=tl)

    # n (the tokens) changes with every CUDA-graph bucket and k_part with the plan: not specialised,
    # so one compiled variant per (TERMS, dtypes) serves every bucket
    @triton.jit(do_not_specialize=["n", "k_part"])
    def split_k_kernel(x_ptr, w_ptr, out_ptr, n, m, k, k_part, x_stride, w_stride, scale,
                       TERMS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                       FOR_LOOP: tl.constexpr):
        # program (token block, feature block, part): out[part, rows, cols] = x[rows, K_p] W[cols, K_p]^T
        rm = tl.program_id(0) * BM + tl.arange(0, BM)
        rn = tl.program_id(1) * BN + tl.arange(0, BN)
        part = tl.program_id(2)
        rk = tl.arange(0, BK)
        k0 = part * k_part
        k1 = tl.minimum(k0 + k_part, k)
        xrow = x_ptr + rm.to(tl.int64)[:, None] * x_stride
        wcol = w_ptr + rn.to(tl.int64)[None, :] * w_stride
        mm, mn = (rm < n)[:, None], (rn < m)[None, :]
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        if FOR_LOOP:         # compiled: a for loop, which Triton pipelines (NUM_STAGES)
            for kk in range(k0, k1, BK):
                acc = _k_step(xrow, wcol, acc, kk, k1, k, rk, mm, mn, TERMS)
        else:                # Triton's CPU interpreter takes no runtime bound in range()
            kk = k0
            while kk < k1:
                acc = _k_step(xrow, wcol, acc, kk, k1, k, rk, mm, mn, TERMS)
                kk += BK
        acc = acc * scale    # SplitLinear's power of two: exact
        off = part.to(tl.int64) * n * m + rm.to(tl.int64)[:, None] * m + rn[None, :]
        tl.store(out_ptr + off, acc, mask=mm & mn)

    return triton, split_k_kernel


def gemm(x, weight, k: int, terms: int, scale: float, parts: int):
    """The float32 partial products [parts, N, M] of x W^T, summing (in order) to x W^T.

    x: [N, k] fp16 (terms 1) or split_gemm's split form [N, >= 2k] fp16, [x_hi | x_lo | ...];
    weight: [M, k] fp16 (terms 1) or `SplitLinear.w` ([W_hi | W_hi] for terms 2, [W_hi | W_hi | W_lo]
    for terms 3), whose products are multiplied by `scale`. Both row-major with unit column stride."""
    import torch
    from laya_grpc.inference.cuda_attention import _interpreted
    triton, kernel = _kernel()
    n, m = x.shape[0], weight.shape[0]
    x_cols, w_cols = (k, k) if terms == 1 else (2 * k, terms * k)     # x_hi | x_lo; W_hi | W_hi (| W_lo)
    if terms not in (1, 2, 3) or parts < 1 or x.dtype != torch.float16 or weight.dtype != torch.float16 \
            or x.stride(1) != 1 or weight.stride(1) != 1 or x.shape[1] < x_cols or weight.shape[1] < w_cols:
        raise ValueError("split_k.gemm: fp16 x [N, terms*k], weight [M, terms*k], terms 1-3; got %s %s %s %s k=%d "
                         "terms=%d parts=%d" % (tuple(x.shape), x.dtype, tuple(weight.shape), weight.dtype, k, terms,
                                                parts))
    out = torch.empty((parts, n, m), dtype=torch.float32, device=x.device)
    kp = k_per_part(k, parts)
    kernel[(triton.cdiv(n, BLOCK_M), triton.cdiv(m, BLOCK_N), parts)](
        x, weight, out, n, m, k, kp, x.stride(0), weight.stride(0), float(scale),
        TERMS=terms, BM=BLOCK_M, BN=BLOCK_N, BK=BLOCK_K, FOR_LOOP=not _interpreted(), num_warps=NUM_WARPS,
        num_stages=NUM_STAGES)
    return out


def _output_linears(model) -> set:
    layers = model.encoder.layers
    if any(layer.attn_norm is None for layer in layers[1:]):
        # the fused stack's identity-norm add (`x.add_(o)`) takes a plain o only
        raise ValueError("split_k: a layer past the first without attn_norm")
    return {id(layer.attn.Wo) for layer in layers} | {id(layer.mlp.Wo) for layer in layers}


def split_k_gemm(real):
    """`LayaTorch._gemm` with the encoder's output GEMMs as split-K partial products where `plan`
    cuts K (fp16 operands, no bias); every other GEMM, and these beyond the plan, as `real` runs them."""
    import torch

    def _gemm(model, lin, x, out_dtype=None, split: bool = False):
        outputs = model.__dict__.get("_split_k_outputs")
        if outputs is None:
            outputs = model.__dict__["_split_k_outputs"] = _output_linears(model)
        if id(lin) in outputs:
            sp = model._split.get(id(lin))
            parts = plan(x.shape[0], lin.in_features, lin.out_features)
            w, terms, scale = (lin.weight, 1, 1.0) if sp is None else (sp.w, sp.terms, sp.scale)
            if parts and lin.bias is None and (split or sp is None) and x.dtype == w.dtype == torch.float16:
                return gemm(x, w, lin.in_features, terms, scale, parts)
        return real(model, lin, x, out_dtype, split)
    return _gemm


def install(model) -> None:
    """Split-K in this model's fused forward from now on (graphs captured after this call)."""
    import types
    from laya_grpc.inference.torch_model import LayaTorch
    model._gemm = types.MethodType(split_k_gemm(LayaTorch._gemm), model)
