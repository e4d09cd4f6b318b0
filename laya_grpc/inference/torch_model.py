"""The Laya network (ModernBERT encoder + typed decision head) in plain torch.

Built straight from a checkpoint's `model.safetensors` + its configs (parsed by `laya_grpc.core.checkpoints.model_shape`,
as `open_checkpoint` parses them) so the service needs neither `transformers` nor `laya`. The maths follow upstream laya 0.4.15 `DecisionModel`
over transformers 5.24 `ModernBertModel` (sdpa) op for op, so CPU fp32 matches to float
rounding (see tests/test_torch_model_parity.py). Laid out for speed: one fused Wqkv matmul,
SDPA, one mask per layer type per batch, cached RoPE tables, no host syncs in `forward`.
"""
from __future__ import annotations

import contextlib
import os
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from laya_grpc.core.errors import Kind, LayaError
from laya_grpc.core.checkpoints.model_shape import FULL, SLIDING, ModelShape, read_model_shape
from .weights import load_weights

# encoder/config.json `dtype` (ModelShape.encoder_dtype) -> the torch dtype upstream builds the encoder in
TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


# ----------------------------------------------------------------------------------- encoder

class _Attn(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.Wqkv = nn.Linear(d, 3 * d, bias=False)
        self.Wo = nn.Linear(d, d, bias=False)


class _Mlp(nn.Module):
    def __init__(self, d: int, inter: int):
        super().__init__()
        self.Wi = nn.Linear(d, 2 * inter, bias=False)
        self.Wo = nn.Linear(inter, d, bias=False)


class _EncoderLayer(nn.Module):
    def __init__(self, spec: ModelShape, first: bool):
        super().__init__()
        d = spec.hidden_size
        # layer 0 has no attn_norm (ModernBERT: the embedding norm already normalised its input)
        self.attn_norm = None if first else nn.LayerNorm(d, eps=spec.norm_eps, bias=False)
        self.attn = _Attn(d)
        self.mlp_norm = nn.LayerNorm(d, eps=spec.norm_eps, bias=False)
        self.mlp = _Mlp(d, spec.intermediate_size)


class _Embeddings(nn.Module):
    def __init__(self, spec: ModelShape):
        super().__init__()
        self.tok_embeddings = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.norm = nn.LayerNorm(spec.hidden_size, eps=spec.norm_eps, bias=False)


class _Encoder(nn.Module):
    def __init__(self, spec: ModelShape):
        super().__init__()
        self.embeddings = _Embeddings(spec)
        self.layers = nn.ModuleList(_EncoderLayer(spec, i == 0) for i in range(spec.num_layers))
        self.final_norm = nn.LayerNorm(spec.hidden_size, eps=spec.norm_eps, bias=False)


@contextlib.contextmanager
def _no_param_init():
    """Skip nn.Module's random initialisation while building on the meta device: every parameter
    is replaced by the checkpoint's tensor anyway, and on meta tensors `nn.init` goes through
    torch._refs, whose first use imports torch._dynamo (~1.1 s of every service start)."""
    names = ("normal_", "uniform_", "kaiming_uniform_", "xavier_uniform_", "ones_", "zeros_", "constant_")
    saved = {n: getattr(nn.init, n) for n in names}
    for n in names:
        setattr(nn.init, n, lambda tensor, *a, **k: tensor)
    try:
        yield
    finally:
        for n, fn in saved.items():
            setattr(nn.init, n, fn)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


# ------------------------------------------------------------------------------ decision head

class _HeadAttn(nn.Module):
    """Parameter layout of nn.MultiheadAttention (upstream `_DynamicMultiheadAttention`)."""

    def __init__(self, d: int):
        super().__init__()
        self.in_proj_weight = nn.Parameter(torch.empty(3 * d, d))
        self.in_proj_bias = nn.Parameter(torch.empty(3 * d))
        self.out_proj = nn.Linear(d, d)


class _HeadLayer(nn.Module):
    """Pre-norm nn.TransformerEncoderLayer(d, max(1, d//64), 4d, ReLU) parameter layout."""

    def __init__(self, d: int):
        super().__init__()
        self.self_attn = _HeadAttn(d)
        self.linear1 = nn.Linear(d, 4 * d)
        self.linear2 = nn.Linear(4 * d, d)
        self.norm1 = nn.LayerNorm(d)
        self.norm2 = nn.LayerNorm(d)


class _Head(nn.Module):
    def __init__(self, d: int, n: int):
        super().__init__()
        self.layers = nn.ModuleList(_HeadLayer(d) for _ in range(n))


# ------------------------------------------------------------------------------------ model

class LayaTorch(nn.Module):
    """DecisionModel.forward without transformers: (option logits [B,K] fp32, act logits [B,n_act] fp32)."""

    def __init__(self, spec: ModelShape):
        super().__init__()
        self.spec = spec
        d = spec.hidden_size
        self.encoder = _Encoder(spec)
        self.head = _Head(d, spec.head_layers) if spec.head_layers > 0 else None
        self.type_emb = nn.Embedding(3, d)
        self.scorer = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, d), nn.GELU(), nn.Linear(d, 1))
        self.act_head = nn.Sequential(nn.Linear(d + 4, 256), nn.GELU(), nn.Linear(256, spec.n_act))
        # unused by the maths; present in every upstream checkpoint (upstream loads strictly)
        self.register_buffer("temperature", torch.ones(3))
        self._rope_cache: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        # "reference" follows transformers op for op (CPU fp32: bit-exact to upstream); "fused"
        # is `encode_fused`, the CUDA path (use_fused_kernels)
        self.kernels = "reference"
        self.precision = None       # a precision.Precision once the fused kernels run
        self._split: dict = {}      # id(nn.Linear or head attention) -> split_gemm.SplitLinear

    # -- loading -----------------------------------------------------------------------------

    @classmethod
    def from_checkpoint(cls, ckpt: Any, device: str | torch.device = "cpu",
                        dtype: torch.dtype | None = None) -> "LayaTorch":
        """Build from a checkpoint directory (or an object with a `.path` to one).

        `dtype=None` reproduces upstream's CPU load: encoder in the dtype its config declares
        (float32 unless `encoder/config.json` says otherwise), head and scorers in float32.
        An explicit dtype puts the encoder and the decision head in it (the accelerator policy,
        devices.py); the scorer and the act head stay float32 (a few rows a request: precision.py).
        """
        ckpt_dir = os.fspath(getattr(ckpt, "path", ckpt))
        spec = read_model_shape(ckpt_dir)
        with torch.device("meta"), _no_param_init():
            model = cls(spec)
        enc_dtype = TORCH_DTYPES[spec.encoder_dtype] if dtype is None else dtype
        rest_dtype = torch.float32 if dtype is None else dtype
        expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
        dtypes = {k: enc_dtype if k.startswith("encoder.") else rest_dtype for k in expected}
        # the scorer and the act head read a few rows a request: float32 always (precision.py)
        dtypes.update({k: torch.float32 for k in expected if k.startswith(("scorer.", "act_head."))})
        dtypes["temperature"] = torch.float32
        tensors = load_weights(os.path.join(ckpt_dir, "model.safetensors"), expected, dtypes, device)
        model.load_state_dict(tensors, strict=True, assign=True)
        return model.eval().requires_grad_(False)

    # -- masks and rotary tables -------------------------------------------------------------

    def _rope(self, theta: float, length: int, device: torch.device, dtype: torch.dtype):
        """cos/sin [length, head_dim] for positions 0..length-1, exactly as ModernBERT computes them.

        One table per (theta, device, dtype), grown to the longest length seen and sliced: each
        position's value does not depend on the table's length, so slices are bit-identical to a
        fresh table, and captured CUDA graphs can keep pointing at it (prepare_rope)."""
        key = (theta, torch.device(device), dtype)
        hit = self._rope_cache.get(key)
        if hit is None or hit[0].shape[0] < length:
            dim = self.spec.head_dim
            inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).to(
                device=device, dtype=torch.float) / dim))
            freqs = torch.arange(length, device=device).float()[:, None] * inv_freq[None, :]
            emb = torch.cat((freqs, freqs), dim=-1)
            hit = (emb.cos().to(dtype), emb.sin().to(dtype))
            self._rope_cache[key] = hit
        return hit[0][:length], hit[1][:length]

    def prepare_rope(self, max_length: int) -> None:
        """Build the rotary tables at their final length before any CUDA graph is captured.

        Keyed by the weights' device (what `encode` sees as x.device: "cuda:0", never "cuda"), else
        forward would grow a second table lazily and earlier graphs would read freed memory."""
        weight = self.encoder.embeddings.tok_embeddings.weight
        for kind in set(self.spec.layer_types):
            self._rope(self.spec.rope_theta[kind], max_length, weight.device, weight.dtype)

    def _masks(self, attention_mask, position_ids, option_ids, length: int):
        """Boolean SDPA masks (True = may attend), one per layer type, built once per batch."""
        keys = attention_mask.bool()[:, None, None, :]                     # [B,1,1,L]
        w = self.spec.sliding_window
        if option_ids is None:
            idx = torch.arange(length, device=attention_mask.device)
            near = (idx[:, None] - idx[None, :]).abs() <= w                # [L,L]
            # every query also sees itself: a real token already does, and a padding query far
            # past the window would otherwise have no key at all (NaN in SDPA's fused GPU kernels)
            return {FULL: keys, SLIDING: (keys & near) | (idx[:, None] == idx[None, :])}
        # laya.common.parallel_option_masks: no attention between two different options; the
        # window is measured in position ids, because options share positions.
        opt_q, opt_k = option_ids[:, :, None], option_ids[:, None, :]
        other = (opt_q > 0) & (opt_k > 0) & (opt_q != opt_k)
        full = keys & ~other[:, None]
        near = (position_ids[:, :, None] - position_ids[:, None, :]).abs() <= w
        idx = torch.arange(length, device=attention_mask.device)
        return {FULL: full, SLIDING: (full & near[:, None]) | (idx[:, None] == idx[None, :])}

    # -- forward -----------------------------------------------------------------------------

    def use_fused_kernels(self, precision=None) -> None:
        """Run `encode_fused` from now on (Triton kernels: cuda_kernels.py, cuda_attention.py), keeping
        float32 where `precision` says (default: precision.Precision.for_weights, what serving runs)."""
        from .precision import Precision
        from .split_gemm import SplitLinear
        weight = self.encoder.embeddings.tok_embeddings.weight
        p = precision or Precision.for_weights(weight.dtype, weight.device.type)
        split = {}
        if p.split_head and self.head is not None:
            # the head's residual stream, norms and biases in float32 (its input: the encoder's float32
            # output plus the type embedding); its GEMMs float32-accurate through split fp16 pairs
            self.head.float()
            self.type_emb.float()
            for layer in self.head.layers:
                sa = layer.self_attn
                split[id(sa)] = SplitLinear(sa.in_proj_weight, sa.in_proj_bias)
                for lin in (sa.out_proj, layer.linear1, layer.linear2):   # their biases: in the next kernel
                    split[id(lin)] = SplitLinear(lin.weight)
        if p.split_encoder:
            for layer in self.encoder.layers:
                for lin in (layer.attn.Wqkv, layer.attn.Wo, layer.mlp.Wi, layer.mlp.Wo):
                    split[id(lin)] = SplitLinear(lin.weight)
        self.kernels, self.precision, self._split = "fused", p, split

    def _terms(self, lin, dtype) -> int:
        """How many fp16 parts lin's input is split into (split_gemm.py), when the kernel making that
        input writes it split: lin float32-accurate and the input float32; else 0."""
        sp = self._split.get(id(lin))
        return sp.terms if sp is not None and dtype == torch.float32 else 0

    def _gemm(self, lin, x, out_dtype=None, split: bool = False, stack: bool = False):
        """x lin.weight^T on the fused path, without lin's bias (the kernel after the GEMM adds it; the
        encoder's linears have none): float32-accurate where split (precision.py), else in the weights'
        dtype, with a float32 result when `out_dtype` asks for it (no rounding before the residual add).
        `split`: x is already in split form (its kernel wrote it so, `_terms`); `stack`: that form's halves
        stacked as row blocks, and the result the two products [2, N, M] (split_gemm.SplitLinear.on_stacked)."""
        sp = self._split.get(id(lin))
        if stack:
            return sp.on_stacked(x)
        if split:
            return sp.on_split(x)
        if sp is not None:
            return sp(x)
        from .split_gemm import mm16, mm_fp32_out
        if out_dtype is not None and out_dtype != x.dtype:
            return mm_fp32_out(x, lin.weight)
        return mm16(x, lin.weight)

    def encode(self, input_ids, attention_mask, position_ids=None, option_ids=None) -> torch.Tensor:
        """ModernBertModel(...).last_hidden_state."""
        spec, enc = self.spec, self.encoder
        B, L = input_ids.shape
        dtype = enc.embeddings.tok_embeddings.weight.dtype
        x = enc.embeddings.norm(enc.embeddings.tok_embeddings(input_ids))
        masks = self._masks(attention_mask, position_ids, option_ids, L)
        rope = {}
        for kind in set(spec.layer_types):
            if position_ids is None:
                cos, sin = self._rope(spec.rope_theta[kind], L, x.device, dtype)
                rope[kind] = (cos[None, None], sin[None, None])                 # [1,1,L,hd]
            else:
                # parallel layout: options share positions, so every id is < L (no host sync)
                cos, sin = self._rope(spec.rope_theta[kind], L, x.device, dtype)
                rope[kind] = (cos[position_ids][:, None], sin[position_ids][:, None])  # [B,1,L,hd]
        H, hd = spec.heads, spec.head_dim
        scale = hd ** -0.5
        for layer, kind in zip(enc.layers, spec.layer_types):
            y = x if layer.attn_norm is None else layer.attn_norm(x)
            q, k, v = layer.attn.Wqkv(y).view(B, L, 3, H, hd).transpose(1, 3).unbind(dim=2)  # [B,H,L,hd]
            cos, sin = rope[kind]
            # transformers applies RoPE in fp32 and casts back (apply_rotary_pos_emb)
            qf, kf = q.float(), k.float()
            q = (qf * cos + _rotate_half(qf) * sin).to(dtype)
            k = (kf * cos + _rotate_half(kf) * sin).to(dtype)
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=masks[kind], scale=scale)
            x = x + layer.attn.Wo(a.transpose(1, 2).reshape(B, L, -1))
            u, g = layer.mlp.Wi(layer.mlp_norm(x)).chunk(2, dim=-1)
            x = x + layer.mlp.Wo(F.gelu(u) * g)
        return enc.final_norm(x)

    def encode_fused(self, input_ids, attention_mask, position_ids=None, option_ids=None) -> torch.Tensor:
        """`encode` in about a third of the kernels, for CUDA graphs (same function, float rounding apart).

        Per layer: Wqkv, attention, Wo, one add + LayerNorm kernel (the residual updated in place, the
        MLP's normed input out), Wi, one GELU-gate kernel, Wo, add + the next layer's norm (the final
        norm after the last layer). Why: each residual add and the norm after it read and write the
        same row, so one launch does both. Attention, sequential layout: one kernel reading q/k/v from
        the Wqkv output, RoPE on load, masks from per-row lengths, output token-major for Wo
        (cuda_attention.py; rows must be prefix-contiguous, as the padded batches are). Parallel
        layout: one RoPE kernel for q and k, SDPA with a bias built once per forward, a layout copy.
        Same function as `encode` up to float rounding; the tolerance is the contract there
        (docs/performance.md), CPU fp32 serving keeps `encode`.
        """
        from . import cuda_kernels as ck
        spec = self.spec
        B, L = input_ids.shape
        N, d, H, hd = B * L, spec.hidden_size, spec.heads, spec.head_dim
        dtype = self.encoder.embeddings.tok_embeddings.weight.dtype
        one_kernel = position_ids is None
        if one_kernel:
            from . import cuda_attention as ca
            lengths = ca.lengths_of(attention_mask)                              # [B] int32, on the device
        else:
            bias = {kind: torch.zeros(m.shape, dtype=dtype, device=input_ids.device).masked_fill_(~m, float("-inf"))
                    for kind, m in self._masks(attention_mask, position_ids, option_ids, L).items()}
        tables = {kind: self._rope(spec.rope_theta[kind], L, input_ids.device, dtype) for kind in set(spec.layer_types)}
        pos = None if position_ids is None else position_ids.contiguous()
        scale = hd ** -0.5

        def attend(qkv, kind, split, stack):
            if one_kernel:
                return ca.attention(qkv, *tables[kind], lengths, B, L, H, spec.sliding_window, kind == SLIDING, scale,
                                    split=split, stack=stack)
            qk = ck.rope_qk(qkv, *tables[kind], pos, B, L, H)            # [2, N, H, hd]
            q = qk[0].view(B, L, H, hd).transpose(1, 2)
            k = qk[1].view(B, L, H, hd).transpose(1, 2)
            v = qkv.view(B, L, 3, H, hd)[:, :, 2].transpose(1, 2)
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=bias[kind], scale=scale).transpose(1, 2).reshape(N, d)
            return ck.split_fp16(a.contiguous(), split) if split else a

        return self._fused_stack(input_ids.reshape(N), attend, stacking=one_kernel).view(B, L, d)

    def _fused_stack(self, ids, attend, stacking: bool = True) -> torch.Tensor:
        """The encoder's layers over a flat token stream ids [N] -> final hidden states [N, d] (in the
        residual's dtype: float32 on the served path): every step is per token except
        `attend(qkv [N, 3d], layer kind, split, stack) -> [N, d]` (with `split`, Wo's split form of it;
        with `stack`, its halves as row blocks), which the padded and the packed forwards supply
        (encode_fused, forward_packed; `stacking`: whether their attend can stack). The residual stream x
        is `precision.residual` (float32); the GEMMs read y, its normed copy in the weights' dtype. In
        buckets of at most split_gemm.STACKED_MAX_TOKENS tokens the two Wo GEMMs take stacked halves
        and return two products, which the add + norm kernel after each sums."""
        from . import cuda_kernels as ck
        from .split_gemm import stacked
        enc, p = self.encoder, self.precision
        cdt = enc.embeddings.tok_embeddings.weight.dtype
        norm = enc.embeddings.norm
        x = ck.layer_norm(enc.embeddings.tok_embeddings(ids), norm.weight, norm.eps, out_dtype=p.residual)
        y = x if x.dtype == cdt else x.to(cdt)   # Wqkv's input; layer 0 has no attn_norm (the embedding norm ran)
        last = len(enc.layers) - 1
        qkv_terms = 0   # y is in split form for Wqkv (the norm before it wrote it so)
        for i, (layer, kind) in enumerate(zip(enc.layers, self.spec.layer_types)):
            # x += a Wo^T in place, y = mlp_norm(x); then x += MLP(y), y = the next norm of x. The kernel
            # whose output feeds a float32-accurate GEMM writes it in that GEMM's split form.
            ao_terms = self._terms(layer.attn.Wo, cdt)
            wi_terms, wo_terms = self._terms(layer.mlp.Wi, cdt), self._terms(layer.mlp.Wo, cdt)
            ao_stack, wo_stack = (stacking and stacked(t, len(ids)) for t in (ao_terms, wo_terms))
            a = attend(self._gemm(layer.attn.Wqkv, y, split=qkv_terms > 0), kind, ao_terms, ao_stack)   # [N, d]
            x, y = ck.add_layer_norm(x, self._gemm(layer.attn.Wo, a, p.residual_gemm_out, split=ao_terms > 0,
                                                   stack=ao_stack),
                                     layer.mlp_norm.weight, layer.mlp_norm.eps, out_dtype=cdt, split=wi_terms)
            gate = ck.gelu_gate(self._gemm(layer.mlp.Wi, y, split=wi_terms > 0), split=wo_terms, stack=wo_stack)
            o = self._gemm(layer.mlp.Wo, gate, p.residual_gemm_out, split=wo_terms > 0, stack=wo_stack)
            nxt = enc.layers[i + 1].attn_norm if i < last else enc.final_norm
            if nxt is None:                               # an identity norm (ModernBERT: layer 0's only)
                x = x.add_(o.sum(0) if wo_stack else o)
                y, qkv_terms = (x if x.dtype == cdt else x.to(cdt)), 0
            else:
                # the final norm's output is the head's input: in the residual's dtype
                qkv_terms = self._terms(enc.layers[i + 1].attn.Wqkv, cdt) if i < last else 0
                x, y = ck.add_layer_norm(x, o, nxt.weight, nxt.eps, out_dtype=p.residual if i == last else cdt,
                                         split=qkv_terms)
        return y

    def forward_packed(self, ids, tok_qtype, starts, lengths, blk_seg, blk_m0, marker_pos, marker_mask,
                       max_len: int, block_m: int, block_n: int):
        """`forward` over packed rows (inference/packing.py): rows laid end to end in one token
        stream, each a segment that attends only within itself, positions from its own start.

        ids, tok_qtype [T]; starts, lengths [S+1] (slot S empty); blk_seg, blk_m0: the attention block
        table; marker_pos [S, K] (token indices in the stream), marker_mask [S, K]; all int32 on the
        device. max_len: no segment is longer (the RoPE tables are read up to it); block_m, block_n: the block
        table's queries per entry and the keys a step (`PackedBucket`). Returns (option
        logits [S, K] fp32, act logits [S, n_act] fp32); spare slots give finite rows to discard.
        The fused encoder's kernels, with the attention of encoder and decision head both block-
        diagonal (cuda_attention.attention_packed); same function as `forward` on the padded rows up
        to float rounding (tests/test_row_packing.py)."""
        from . import cuda_attention as ca
        spec = self.spec
        H, hd, window = spec.heads, spec.head_dim, spec.sliding_window
        dtype = self.encoder.embeddings.tok_embeddings.weight.dtype
        tables = {kind: self._rope(spec.rope_theta[kind], max_len, ids.device, dtype) for kind in set(spec.layer_types)}
        scale = hd ** -0.5

        def attend(qkv, kind, split, stack):
            return ca.attention_packed(qkv, *tables[kind], starts, lengths, blk_seg, blk_m0, H, window,
                                       kind == SLIDING, scale, split=split, block_m=block_m,
                                       block_n=block_n, stack=stack)

        nh = spec.head_heads
        h = self._fused_head(self._fused_stack(ids, attend), self.type_emb(tok_qtype),
                             lambda qkv, split: ca.attention_packed(
                                 qkv, None, None, starts, lengths, blk_seg, blk_m0, nh, 0, False,
                                 (spec.hidden_size // nh) ** -0.5, rope=False, split=split, block_m=block_m,
                                 block_n=block_n))
        S = marker_pos.shape[0]
        sdt = self.scorer[1].weight.dtype
        logits = self.scorer(h[marker_pos.long()].to(sdt)).squeeze(-1).float()
        logits = logits.masked_fill(~marker_mask.bool(), -1e4)
        return logits, self._act(logits, marker_mask, h[starts[:S].long()])

    def _fused_head(self, h: torch.Tensor, types: torch.Tensor, attend) -> torch.Tensor:
        """The type embedding's add and the decision head's layers on the fused path, over a flat token
        stream: h [N, d] the encoder's output, types [N, d] each token's type embedding, `attend(qkv
        [N, 3d], split) -> [N, d]` (with `split`, in out_proj's split form) from the packed or the padded
        forward. Returns the head's output [N, d] in the head's dtype.

        Per layer: in_proj, attention, out_proj, one add + norm2 kernel (out_proj's bias, the residual
        add, the norm; its output in linear1's split form), linear1, one bias + ReLU kernel, linear2,
        one add + the next layer's norm1 (the last layer: the add only); the GEMMs float32-accurate
        through split fp16 operands where `use_fused_kernels` split them (the exact mode), else in the
        weights' dtype with a float32 result, so each bias is added in float32 before one rounding.
        Why not `_head_layer`: torch's fused layer runs float32 GEMMs on a GPU's CUDA cores (46 of 193
        ms of a 256-row padded forward on an H100), and in the exact mode eager ops take 17 launches a
        layer where this takes 9 (benchmarks/results/2026-12-06-a55faad)."""
        from . import cuda_kernels as ck
        hdt = self.type_emb.weight.dtype
        h = h if h.dtype == hdt and h.is_contiguous() else h.to(hdt).contiguous()
        if self.head is None:
            return h.add_(types)
        layers = self.head.layers
        first = layers[0].self_attn
        h, y = ck.add_layer_norm(h, types, layers[0].norm1.weight, layers[0].norm1.eps, bias=layers[0].norm1.bias,
                                 split=self._terms(first, hdt))
        for i, layer in enumerate(layers):
            sa = layer.self_attn
            sp = self._split.get(id(sa))
            if sp is None:
                from .split_gemm import mm16
                qkv = mm16(y, sa.in_proj_weight, sa.in_proj_bias)
            else:   # y came split from the norm before unless _terms says otherwise
                qkv = sp.on_split(y) if self._terms(sa, hdt) else sp(y)
            terms = self._terms(sa.out_proj, hdt)
            o = self._gemm(sa.out_proj, attend(qkv, terms), torch.float32, split=terms > 0)
            terms = self._terms(layer.linear1, hdt)
            h, y = ck.add_layer_norm(h, o, layer.norm2.weight, layer.norm2.eps, bias=layer.norm2.bias,
                                     o_bias=sa.out_proj.bias, split=terms)
            u = self._gemm(layer.linear1, y, torch.float32, split=terms > 0)
            terms = self._terms(layer.linear2, hdt)
            o = self._gemm(layer.linear2, ck.bias_relu(u, layer.linear1.bias, hdt, split=terms), torch.float32,
                           split=terms > 0)
            if i + 1 < len(layers):
                nxt = layers[i + 1]
                h, y = ck.add_layer_norm(h, o, nxt.norm1.weight, nxt.norm1.eps, bias=nxt.norm1.bias,
                                         o_bias=layer.linear2.bias, split=self._terms(nxt.self_attn, hdt))
            else:
                h = ck.add_bias(h, o, layer.linear2.bias)
        return h

    def _head_layer(self, layer: _HeadLayer, h: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        """One pre-norm nn.TransformerEncoderLayer step, on the kernel upstream's call reaches.

        Upstream runs `layer(h, src_key_padding_mask=pad)` under no_grad; torch then takes its fused
        `_transformer_encoder_layer_fwd` fast path whenever the head count is even and autocast is
        off, else `_DynamicMultiheadAttention` (SDPA). Same maths, different rounding (3e-4 on
        logits of magnitude 100), so we take the same branch for bit-equal fp32 results.
        """
        B, L, d = h.shape
        nh = self.spec.head_heads
        sa = layer.self_attn
        if nh % 2 == 0 and not torch.is_autocast_enabled(h.device.type) and h.dtype == torch.float32:
            return torch._transformer_encoder_layer_fwd(
                h, d, nh, sa.in_proj_weight, sa.in_proj_bias, sa.out_proj.weight, sa.out_proj.bias,
                False, True, layer.norm1.eps, layer.norm1.weight, layer.norm1.bias,
                layer.norm2.weight, layer.norm2.bias, layer.linear1.weight, layer.linear1.bias,
                layer.linear2.weight, layer.linear2.bias, pad, 1)
        y = layer.norm1(h)
        q, k, v = (t.view(B, L, nh, d // nh).transpose(1, 2)
                   for t in F.linear(y, sa.in_proj_weight, sa.in_proj_bias).chunk(3, dim=-1))
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=~pad[:, None, None, :])
        h = h + sa.out_proj(a.transpose(1, 2).reshape(B, L, d))
        return h + layer.linear2(F.relu(layer.linear1(layer.norm2(h))))

    def forward(self, input_ids, attention_mask, marker_pos, marker_mask, qtype,
                position_ids=None, option_ids=None):
        if (position_ids is None) != (option_ids is None):
            raise LayaError(Kind.INTERNAL, "position_ids and option_ids come together (parallel option layout)")
        if self.kernels == "fused":
            h = self.encode_fused(input_ids, attention_mask, position_ids, option_ids)
            B, L, d = h.shape
            nh = self.spec.head_heads
            keys = attention_mask.bool()[:, None, None, :]
            from . import cuda_kernels as ck

            def attend(qkv, split):
                q, k, v = qkv.view(B, L, 3, nh, d // nh).permute(2, 0, 3, 1, 4)   # each [B, nh, L, hd]
                a = F.scaled_dot_product_attention(q, k, v, attn_mask=keys).transpose(1, 2).reshape(B * L, d)
                return ck.split_fp16(a.contiguous(), split) if split else a
            types = self.type_emb(qtype)[:, None, :].expand(B, L, d).contiguous().view(B * L, d)
            h = self._fused_head(h.reshape(B * L, d), types, attend).view(B, L, d)
        else:
            h = self.encode(input_ids, attention_mask, position_ids, option_ids)
            h = h.to(self.type_emb.weight.dtype) + self.type_emb(qtype)[:, None, :]
            pad = ~attention_mask.bool()
            for layer in self.head.layers if self.head is not None else ():
                h = self._head_layer(layer, h, pad)
        idx = marker_pos.clamp(min=0)[:, :, None].expand(-1, -1, h.size(-1))
        logits = self.scorer(torch.gather(h, 1, idx).to(self.scorer[1].weight.dtype)).squeeze(-1).float()
        logits = logits.masked_fill(~marker_mask.bool(), -1e4)
        return logits, self._act(logits, marker_mask, h[:, 0])

    def _act(self, logits, marker_mask, cls) -> torch.Tensor:
        """The act head: [CLS after the head layers, top1, top1 - top2, normalised entropy, k / 255]."""
        p = torch.softmax(logits, -1)
        k = marker_mask.sum(-1).clamp(min=2).float()
        ent = -(p * torch.log(p.clamp_min(1e-9))).sum(-1) / torch.log(k)
        if p.size(-1) >= 2:
            top = p.topk(2, -1).values
            top1, top2 = top[:, 0], top[:, 1]
        else:  # one option: upstream pads the missing second probability with 0
            top1, top2 = p[:, 0], torch.zeros_like(p[:, 0])
        feats = torch.stack([top1, top1 - top2, ent, k / 255.0], -1)
        act_in = torch.cat([cls.float(), feats], -1).to(self.act_head[0].weight.dtype)
        return self.act_head(act_in).float()
