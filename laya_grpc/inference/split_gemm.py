"""Float32-accurate GEMMs on fp16 tensor cores: each float32 operand as a sum of two fp16 halves.

Why: on an H200 a float32 GEMM without TF32 runs on the CUDA cores (about 1/15 of the fp16 tensor-
core rate), and TF32 keeps only fp16's 10 mantissa bits, so it brings back the 16-bit error. With
x = x_hi + x_lo and W = W_hi + W_lo (hi = fp16(v), lo = fp16(v - hi)), the product

    x W^T ~= x_hi W_hi^T + x_lo W_hi^T + x_hi W_lo^T      (x_lo W_lo^T, ~2^-22 relative, dropped)

is ONE fp16 GEMM with float32 accumulation and a float32 output over a K three times as long:
[x_hi | x_lo | x_hi] times [W_hi | W_hi | W_lo]^T. Where W is exactly fp16 already (Laya
checkpoints store fp16 weights, so W_lo = 0) the third term vanishes and K doubles only: twice an
fp16 GEMM's work for a float32 result good to ~2^-21 relative (float32 is 2^-24).

In small buckets the encoder's Wo GEMMs take the halves stacked as rows instead, [x_hi; x_lo] W^T, and
the kernel after them adds the two products (`SplitLinear.on_stacked`).

Weights are scaled by a power of two before splitting, so W_lo stays out of fp16's subnormal range
(the output is scaled back; powers of two are exact). Activations are split by one Triton kernel
(cuda_kernels.split_fp16); they must stay within fp16's range (|x| < 65504), as the fp16 path's do.
On CPU (tests, through Triton's interpreter) the GEMM runs in float32 on the same fp16 operands.
"""
from __future__ import annotations

import contextlib
import contextvars
import logging
import math

import torch
import torch.nn.functional as F

log = logging.getLogger("laya_grpc.inference.split_gemm")
# torch.mm(a16, b16, out_dtype=torch.float32): CUDA only (torch >= 2.8); without it, a float32 GEMM
_MM_DTYPE = hasattr(torch.ops.aten.mm, "dtype")
if not _MM_DTYPE:
    log.warning("torch %s has no mm(out_dtype=...): the float32-output GEMMs run in float32 (slower)",
                torch.__version__)


# set by `allocate_only` (per thread and task: a context variable)
_ALLOCATE_ONLY = contextvars.ContextVar("laya_gemms_allocate_only", default=False)


@contextlib.contextmanager
def allocate_only():
    """Within this, the fused path's GEMMs (`_mm16_fp32`, `mm16`: every GEMM of the encoder and the
    decision head's layers; the scorer and act head are not on it) allocate their outputs and launch
    nothing. For the warm-up's later dry passes (cuda_graphs.warm_graphs), whose results nothing reads
    and whose GEMMs were almost half their time."""
    token = _ALLOCATE_ONLY.set(True)
    try:
        yield
    finally:
        _ALLOCATE_ONLY.reset(token)


def _mm16_fp32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if _ALLOCATE_ONLY.get():
        return a.new_empty((a.shape[0], b.shape[1]), dtype=torch.float32)
    if a.is_cuda and _MM_DTYPE:
        return torch.mm(a, b, out_dtype=torch.float32)
    return torch.mm(a.float(), b.float())


class SplitLinear:
    """y = x W^T (+ b) in float32 for float32 x [N, K], W [M, K]: one fp16 GEMM over the split operands."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        w = weight.detach().float()
        hi = w.half()
        if torch.equal(hi.float(), w):                        # fp16-exact weights: two terms, no scaling
            self.terms, self.scale = 2, 1.0
            self.w = torch.cat([hi, hi], dim=1).contiguous()
        else:
            top = float(w.abs().max())
            shift = 14 - math.ceil(math.log2(top)) if top > 0 else 0   # largest |W * 2^shift| <= 2^14
            ws = w * 2.0 ** shift
            hi = ws.half()
            lo = (ws - hi.float()).half()
            self.terms, self.scale = 3, 2.0 ** -shift
            self.w = torch.cat([hi, hi, lo], dim=1).contiguous()
        self.bias = None if bias is None else bias.detach().float().contiguous()
        self.out_features, self.in_features = weight.shape

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        from . import cuda_kernels as ck
        return self.on_split(ck.split_fp16(x.float().contiguous(), self.terms))

    def on_split(self, x3: torch.Tensor) -> torch.Tensor:
        """y for an input already in split form, [N, terms * K] fp16 (what `split_fp16` makes; the
        fused encoder's norm, GELU-gate and attention kernels write it so themselves)."""
        y = _mm16_fp32(x3, self.w.t())          # fp16 tensor cores, fp32 accumulation and output
        if self.scale != 1.0:
            y.mul_(self.scale)
        if self.bias is not None:
            y.add_(self.bias)
        return y

    def on_stacked(self, x2: torch.Tensor) -> torch.Tensor:
        """The two products x_hi W^T and x_lo W^T, [2, N, M] float32, for the input's halves stacked as
        row blocks, [x_hi; x_lo] [2N, K] fp16 (two terms only: fp16 weights, no bias); the kernel after
        the GEMM adds them (cuda_kernels.add_layer_norm with a [2, N, d] o).

        Why: at a few hundred tokens a GEMM's output is a few dozen of cuBLAS's tiles for 132
        multiprocessors, and `on_split`'s K, twice the input's, makes each tile's loop twice as long.
        Stacked, the same work is twice the tiles over half the K, and W is read once."""
        if self.terms != 2 or self.bias is not None:
            raise ValueError("on_stacked: two terms and no bias only (terms %d)" % self.terms)
        n2, k = x2.shape
        return _mm16_fp32(x2, self.w[:, :k].t()).view(2, n2 // 2, self.out_features)


# Buckets of at most this many tokens run the encoder's two Wo GEMMs on stacked halves (`on_stacked`):
# in the exact mode's model on an H100 one short row took 1.869 against 1.994 ms, and two or three short
# rows, 1 x 256 and 1 x 512 tokens 3.6-5.4% less time; stacked in the 896- and 1,792-token buckets they
# were 1.2% and 2.0% slower (benchmarks/stacked_halves.py, run 2026-12-08-13efc1c).
STACKED_MAX_TOKENS = 512


def stacked(terms: int, tokens: int) -> bool:
    """Whether a split GEMM of `terms` (LayaTorch._terms: 0 where the input is not split) over `tokens`
    rows takes its input as stacked halves (`on_stacked`): two terms only (fp16 weights), in buckets of
    at most STACKED_MAX_TOKENS tokens."""
    return terms == 2 and tokens <= STACKED_MAX_TOKENS


def mm16(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x W^T (+ b) in the weights' dtype: the fast mode's Wqkv and Wi GEMMs and its head's in_proj."""
    if _ALLOCATE_ONLY.get():
        return x.new_empty((*x.shape[:-1], weight.shape[0]))
    return F.linear(x, weight, bias)


def mm_fp32_out(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x W^T for 16-bit x and W with a float32 result (fp32 accumulation, no rounding of the output
    to 16 bits): what the residual stream adds on CUDA."""
    return _mm16_fp32(x, weight.t())
