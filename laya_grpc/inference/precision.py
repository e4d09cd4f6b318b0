"""Where the fused CUDA forward keeps float32, per weight dtype: one place, read by torch_model.py.

CUDA serves float32 weights by default (devices.AUTO_DTYPE): every GEMM, the decision head's too, is
float32-accurate (split_gemm.py: fp16 tensor cores, ~2^-21 relative) and attention's dot products run
as 3xTF32: the exact mode, max |dp| 0.0006 against CPU fp32 on every checkpoint of the parity stage.

With 16-bit weights (`--dtype float16`, the fast mode) the parts that are cheap in float32 stay there:

- the residual stream and its LayerNorm statistics (16-bit only as the GEMMs' inputs);
- the outputs of the GEMMs that feed the residual (attention Wo, MLP Wo): fp32 accumulation and a
  float32 result, so nothing is rounded to 16 bits before the add;
- the scorer and the act head (a few rows a request: free);
- attention's softmax statistics (running max and sum) are float32 in cuda_attention.py already.

What remains is the rounding of the encoder GEMMs' inputs and of the Wqkv and Wi outputs to fp16,
which the network carries to the logits; its effect on probabilities scales with the logits over
the temperature, so it depends on the checkpoint: 0.005 on the `large` random checkpoint, 0.10 on a
sharper one of the same shape (H200, benchmarks/results/2026-12-04-1d77f01). Float32 decision-head
layers (split GEMMs) brought that to 0.066 on the served path and nothing at model level (0.0083
against 0.0086) for 4% (short) to 10% (512 tokens) of model time: still over any 16-bit tolerance,
so with 16-bit weights the head stays in the weights' dtype. docs/precision.md has the figures and the decision.
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
        exact = dtype == torch.float32 and device_type == "cuda"
        return cls(residual=torch.float32, residual_gemm_out=torch.float32, split_head=exact, split_encoder=exact)

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
