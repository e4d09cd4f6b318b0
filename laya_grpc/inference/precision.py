"""Where the fused CUDA forward keeps float32, per weight dtype: one place, read by torch_model.py.

Why: served answers on CUDA fp16 moved by up to 0.146 in probability against CPU fp32 (the code was
right: CUDA fp32 matched to 2e-4). The error is 16-bit rounding that this network amplifies, so the
parts that are cheap in float32 and carry the error stay there (docs/precision.md has the figures):

- the residual stream and its LayerNorm statistics (16-bit only as the GEMMs' inputs);
- the outputs of the GEMMs that feed the residual (attention Wo, MLP Wo): fp32 accumulation and a
  float32 result, so nothing is rounded to 16 bits before the add;
- the scorer and the act head (a few rows a request: free);
- attention's softmax statistics (running max and sum) are float32 in cuda_attention.py already.

Measured on an H200 (benchmarks/results/2026-12-03-59434d2, docs/precision.md): the float32
residual halves the error and the alone-vs-beside shift for ~1% of latency; float32 decision-head
layers (split GEMMs) bought nothing measurable for 5-13% of latency, so with 16-bit weights the
head's two layers stay in the weights' dtype. With float32 weights every GEMM, the head's too, is
float32-accurate (split_gemm.py: fp16 tensor cores, ~2^-21 relative) and attention's dot products
run as 3xTF32: the exact mode (`--dtype float32`).
The product takes `Precision.for_weights`; other instances exist for measuring what each part buys
(benchmarks/precision_study.py), never as a serving switch.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Precision:
    residual: torch.dtype           # the residual stream x (and the final norm's output, the head's input)
    residual_gemm_out: torch.dtype  # the Wo GEMMs' outputs added to x
    split_head: bool                # the head's GEMMs float32-accurate (SplitLinear) on float32 activations
    split_encoder: bool             # every encoder GEMM float32-accurate (float32 weights only)
    reduced_precision_reduction: bool = False   # cuBLAS fp16 split-K reductions in fp16 (torch's default: allowed)

    @classmethod
    def for_weights(cls, dtype: torch.dtype, device_type: str) -> "Precision":
        """What serving runs: float32 wherever it is cheap; float32 weights on CUDA split every GEMM."""
        cuda = device_type == "cuda"
        return cls(residual=torch.float32, residual_gemm_out=torch.float32, split_head=cuda,
                   split_encoder=cuda and dtype == torch.float32)

    @classmethod
    def sixteen_bit(cls, dtype: torch.dtype) -> "Precision":
        """Everything in the weights' 16-bit dtype, as served before (measurement baseline only)."""
        return cls(residual=dtype, residual_gemm_out=dtype, split_head=False, split_encoder=False,
                   reduced_precision_reduction=True)


def apply_cublas_policy(p: Precision) -> None:
    """cuBLAS's fp16 GEMMs may reduce split-K partial sums in fp16 unless told not to; the product
    asks for fp32 reductions (process-wide: every runner of a process takes the same policy)."""
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = p.reduced_precision_reduction
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = p.reduced_precision_reduction
