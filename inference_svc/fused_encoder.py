"""The encoder with fewer, larger kernels, for the CUDA graphs (cuda_graphs.py).

Why: replayed from a graph, the reference `LayaTorch.encode` is still launch-bound at small
batches (~30 kernels a layer, RoPE alone ~14) and moves fp32 RoPE temporaries at large ones.
The reference follows transformers op for op because CPU fp32 must stay bit-exact to upstream;
this path computes the same function in fewer passes and is used only on CUDA (16-bit weights,
where the contract is a tolerance, not bits):
- q and k are rotated together in one pass over the fused qkv output, in fp32 as transformers
  does; `rotate_half(x) * sin == cat(x2, x1) * sin_signed` exactly (a sign flip is exact);
- the residual add happens in the GEMM (`addmm_`, beta=1, into the residual stream);
- the GELU gate is one op; masks are turned into additive biases and RoPE tables gathered once
  per forward, not once per layer.
With `compile_ops` the two elementwise helpers go through `torch.compile(dynamic=True)` (one
Triton kernel each). Their tensors are flattened to [tokens, ...], and a bucket has >= 16 tokens,
so one compilation serves every bucket: nothing recompiles after the first forward.
Not enabled by TorchRunner yet: its first H200 run stopped on a device-side assert
(benchmarks/results/h200-model-speed-run1.md); `python -m benchmarks.model_speed` checks it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F


def rope_qk(qkv: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor, heads: int) -> torch.Tensor:
    """Rotated q and k [N, 2, H, hd] (qkv's dtype) from the fused projection qkv [N, 3*H*hd];
    cos / sin_signed are fp32 [N, hd] (sin with its first half negated)."""
    n = qkv.shape[0]
    x = qkv.view(n, 3, heads, -1)[:, :2].float()
    half = x.shape[-1] // 2
    swapped = torch.cat((x[..., half:], x[..., :half]), dim=-1)
    return (x * cos[:, None, None, :] + swapped * sin_signed[:, None, None, :]).to(qkv.dtype)


def gelu_gate(ug: torch.Tensor) -> torch.Tensor:
    """ModernBERT's GLU: gelu(first half) * second half."""
    u, g = ug.chunk(2, dim=-1)
    return F.gelu(u) * g


@dataclass(frozen=True)
class FusedOps:
    rope: Callable[..., torch.Tensor]
    gate: Callable[[torch.Tensor], torch.Tensor]


def fused_ops(compile_ops: bool) -> FusedOps:
    if not compile_ops:
        return FusedOps(rope_qk, gelu_gate)
    return FusedOps(torch.compile(rope_qk, dynamic=True, fullgraph=True),
                    torch.compile(gelu_gate, dynamic=True, fullgraph=True))


def _tables(model, kind: str, B: int, L: int, position_ids, device, dtype):
    """fp32 cos and signed sin [B*L, hd] for every token, from the model's cached 16-bit tables."""
    cos, sin = model._rope(model.spec.rope_theta[kind], L, device, dtype)
    if position_ids is None:
        cos, sin = cos.expand(B, L, -1), sin.expand(B, L, -1)
    else:
        cos, sin = cos[position_ids], sin[position_ids]
    half = sin.shape[-1] // 2
    sin = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)
    return cos.reshape(B * L, -1).float(), sin.reshape(B * L, -1).float()


def fused_encode(model, ops: FusedOps, input_ids, attention_mask, position_ids=None, option_ids=None):
    """Same result as `model.encode` (to float rounding): ModernBertModel(...).last_hidden_state."""
    spec, enc = model.spec, model.encoder
    B, L = input_ids.shape
    N, d, H, hd = B * L, spec.hidden, spec.heads, spec.head_dim
    dtype = enc.embeddings.tok_embeddings.weight.dtype
    x = enc.embeddings.norm(enc.embeddings.tok_embeddings(input_ids)).view(N, d)
    bias, rope = {}, {}
    for kind, mask in model._masks(attention_mask, position_ids, option_ids, L).items():
        bias[kind] = torch.zeros(mask.shape, dtype=dtype, device=x.device).masked_fill_(~mask, float("-inf"))
        rope[kind] = _tables(model, kind, B, L, position_ids, x.device, dtype)
    scale = hd ** -0.5
    for layer, kind in zip(enc.layers, spec.layer_types):
        y = x if layer.attn_norm is None else layer.attn_norm(x)
        qkv = layer.attn.Wqkv(y)                                                # [N, 3d]
        qk = ops.rope(qkv, *rope[kind], H)                                      # [N, 2, H, hd]
        q = qk[:, 0].view(B, L, H, hd).transpose(1, 2)
        k = qk[:, 1].view(B, L, H, hd).transpose(1, 2)
        v = qkv.view(B, L, 3, H, hd)[:, :, 2].transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=bias[kind], scale=scale)
        x = x.addmm_(a.transpose(1, 2).reshape(N, d), layer.attn.Wo.weight.t())
        x = x.addmm_(ops.gate(layer.mlp.Wi(layer.mlp_norm(x))), layer.mlp.Wo.weight.t())
    return enc.final_norm(x).view(B, L, d)
