"""Float32-accurate GEMMs on fp16 tensor cores: each float32 operand as a sum of two fp16 halves.

Why: on an H200 a float32 GEMM without TF32 runs on the CUDA cores (about 1/15 of the fp16 tensor-
core rate), and TF32 keeps only fp16's 10 mantissa bits, so it brings back the 16-bit error. With
x = x_hi + x_lo and W = W_hi + W_lo (hi = fp16(v), lo = fp16(v - hi)), the product

    x W^T ~= x_hi W_hi^T + x_lo W_hi^T + x_hi W_lo^T      (x_lo W_lo^T, ~2^-22 relative, dropped)

is ONE fp16 GEMM with float32 accumulation and a float32 output over a K three times as long:
[x_hi | x_lo | x_hi] times [W_hi | W_hi | W_lo]^T. Where W is exactly fp16 already (Laya
checkpoints store fp16 weights, so W_lo = 0) the third term vanishes and K doubles only: twice an
fp16 GEMM's work for a float32 result good to ~2^-21 relative (float32 is 2^-24).

Weights are scaled by a power of two before splitting, so W_lo stays out of fp16's subnormal range
(the output is scaled back; powers of two are exact). Activations are split by one Triton kernel
(cuda_kernels.split_fp16); they must stay within fp16's range (|x| < 65504), as the fp16 path's do.
On CPU (tests, through Triton's interpreter) the GEMM runs in float32 on the same fp16 operands.
"""
from __future__ import annotations

import functools
import logging
import math

import torch

log = logging.getLogger("laya_grpc.inference.split_gemm")
# torch.mm(a16, b16, out_dtype=torch.float32): CUDA only (torch >= 2.8); without it, a float32 GEMM
_MM_DTYPE = hasattr(torch.ops.aten.mm, "dtype")
if not _MM_DTYPE:
    log.warning("torch %s has no mm(out_dtype=...): the float32-output GEMMs run in float32 (slower)",
                torch.__version__)


def _mm16_fp32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if a.is_cuda and _MM_DTYPE:
        return torch.mm(a, b, out_dtype=torch.float32)
    return torch.mm(a.float(), b.float())


# At most this many rows (tokens), the split GEMM runs as one Triton kernel that reads the split form
# and W once (`split_mm`); more, as one cuBLAS GEMM over the stacked operands, K two or three times
# as long (W stored so too). Measured per linear of the large checkpoint
# (benchmarks/exact_kernels_study.py, docs/performance.md).
TRITON_MAX_ROWS = 2048


def _tile(n: int) -> tuple:
    """(BM, BN, BK, warps, stages) of split_mm for n rows."""
    return (64, 64, 64, 4, 4) if n <= 512 else (128, 128, 64, 8, 3)


@functools.lru_cache(maxsize=1)
def _split_mm_kernel():
    import triton
    import triton.language as tl

    # N changes with every CUDA-graph bucket: not specialised; K is a constexpr (a few widths a model)
    @triton.jit(do_not_specialize=["N"])
    def split_mm(a_ptr, w_ptr, bias_ptr, y_ptr, N, M, scale, K: tl.constexpr, TERMS: tl.constexpr,
                 HAS_BIAS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr):
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
        a = a_ptr + offs_n[:, None].to(tl.int64) * (TERMS * K) + offs_k[None, :]
        w = w_ptr + offs_m[None, :].to(tl.int64) * ((TERMS - 1) * K) + offs_k[:, None]
        acc = tl.zeros((BM, BN), tl.float32)
        for k0 in range(0, K, BK):
            k_ok = (k0 + offs_k) < K
            am = n_ok[:, None] & k_ok[None, :]
            wm = k_ok[:, None] & m_ok[None, :]
            hi = tl.load(a + k0, mask=am, other=0.0)
            lo = tl.load(a + K + k0, mask=am, other=0.0)
            b = tl.load(w + k0, mask=wm, other=0.0)
            acc = tl.dot(hi, b, acc)
            acc = tl.dot(lo, b, acc)
            if TERMS == 3:
                acc = tl.dot(hi, tl.load(w + K + k0, mask=wm, other=0.0), acc)
        acc = acc * scale                       # a power of two: exact
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offs_m, mask=m_ok, other=0.0)[None, :]
        tl.store(y_ptr + offs_n[:, None].to(tl.int64) * M + offs_m[None, :], acc, mask=n_ok[:, None] & m_ok[None, :])

    return triton, split_mm


class SplitLinear:
    """y = x W^T (+ b) in float32 for float32 x [N, K], W [M, K]: one fp16 GEMM over the split operands.

    Two forms of the same sum, by the number of rows. A few rows (a short request: 160 tokens) are
    bound by reading W: `split_mm` reads each fp16 part of W once and multiplies it by both halves of
    x, where the stacked cuBLAS GEMM reads W_hi twice over a K twice as long. Many rows are bound by
    the tensor cores, where cuBLAS is faster than the Triton kernel. Both accumulate the same
    products in float32 (in other orders), so they agree to float32 rounding."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        w = weight.detach().float()
        hi = w.half()
        if torch.equal(hi.float(), w):                        # fp16-exact weights: two terms, no scaling
            self.terms, self.scale = 2, 1.0
            self.parts = hi.contiguous()                      # [M, K]: W_hi
            self.w = torch.cat([hi, hi], dim=1).contiguous()
        else:
            top = float(w.abs().max())
            shift = 14 - math.ceil(math.log2(top)) if top > 0 else 0   # largest |W * 2^shift| <= 2^14
            ws = w * 2.0 ** shift
            hi = ws.half()
            lo = (ws - hi.float()).half()
            self.terms, self.scale = 3, 2.0 ** -shift
            self.parts = torch.cat([hi, lo], dim=1).contiguous()       # [M, 2K]: W_hi | W_lo
            self.w = torch.cat([hi, hi, lo], dim=1).contiguous()
        self.bias = None if bias is None else bias.detach().float().contiguous()
        self.out_features, self.in_features = weight.shape

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        from . import cuda_kernels as ck
        return self.on_split(ck.split_fp16(x.float().contiguous(), self.terms))

    def on_split(self, x3: torch.Tensor) -> torch.Tensor:
        """y for an input already in split form, [N, terms * K] fp16 (what `split_fp16` makes; the
        fused encoder's norm, GELU-gate and attention kernels write it so themselves)."""
        if x3.is_cuda and x3.shape[0] <= TRITON_MAX_ROWS:
            return self._small(x3)
        y = _mm16_fp32(x3, self.w.t())          # fp16 tensor cores, fp32 accumulation and output
        if self.scale != 1.0:
            y.mul_(self.scale)
        if self.bias is not None:
            y.add_(self.bias)
        return y

    def _small(self, x3: torch.Tensor) -> torch.Tensor:
        triton, kernel = _split_mm_kernel()
        n, (m, k) = x3.shape[0], (self.out_features, self.in_features)
        if x3.shape[1] != self.terms * k or not x3.is_contiguous():
            raise ValueError("split GEMM: input %s is not the contiguous [N, %d] split form" % (tuple(x3.shape), self.terms * k))
        y = torch.empty((n, m), dtype=torch.float32, device=x3.device)
        bm, bn, bk, warps, stages = _tile(n)
        bias = self.bias if self.bias is not None else y
        kernel[(triton.cdiv(n, bm) * triton.cdiv(m, bn),)](
            x3, self.parts, bias, y, n, m, self.scale, K=k, TERMS=self.terms, HAS_BIAS=self.bias is not None,
            BM=bm, BN=bn, BK=bk, GROUP=8, num_warps=warps, num_stages=stages)
        return y


def mm_fp32_out(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x W^T for 16-bit x and W with a float32 result (fp32 accumulation, no rounding of the output
    to 16 bits): what the residual stream adds on CUDA."""
    return _mm16_fp32(x, weight.t())
