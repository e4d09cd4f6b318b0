"""The Laya decision network in MLX: the Apple Silicon backend (Metal GPU on a Mac, CPU elsewhere).

Same maths as upstream laya 0.4.15 `DecisionModel` over transformers' `ModernBertModel`
(sdpa attention), written as plain functions over the checkpoint's own tensors: `mx.load` reads
`model.safetensors` directly, so there is no conversion step and no second weight format to
keep in sync. The configs are parsed by `laya_grpc.core.checkpoints.model_shape`, the parser `open_checkpoint` uses.

Precision choices mirror what upstream's torch model does in the same dtype: RoPE is applied in
float32 and cast back (transformers' `apply_rotary_pos_emb`), attention softmax runs in float32
(`mx.fast.scaled_dot_product_attention` always does), the option logits are upcast to float32
before the padded markers get -1e4, and the act-head features come from the untempered float32
softmax, then go through the act head in the model dtype (upstream's non-autocast path).
"""
from __future__ import annotations

import os
from typing import Dict, Optional, Tuple

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from laya_grpc.core.checkpoints.shapes import tensor_shapes
from laya_grpc.core.errors import CheckpointError, Kind, LayaError
from laya_grpc.core.checkpoints.model_shape import ModelShape, read_model_shape

DTYPES = {"float32": mx.float32, "float16": mx.float16}
_HEAD_LN_EPS = 1e-5          # nn.TransformerEncoderLayer / nn.LayerNorm default in the decision head
_PADDED_MARKER_LOGIT = -1e4  # upstream masked_fill value for markers a row does not have


def _rotate_half_rope(x: mx.array, cos: mx.array, sin: mx.array) -> mx.array:
    """transformers' rotate-half RoPE at arbitrary positions (parallel option layout)."""
    half = x.shape[-1] // 2
    rotated = mx.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


class LayaMLX:
    """Upstream `DecisionModel` forward in MLX. Build with `from_checkpoint`; call `forward`."""

    def __init__(self, weights: Dict[str, mx.array], spec: ModelShape, dtype: str, compile: bool = False):
        self.w = weights
        self.spec = spec
        self.dtype = dtype
        self.compiled = compile
        self._fn = mx.compile(self._forward) if compile else self._forward

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_checkpoint(cls, path: str, dtype: str = "float32", compile: bool = False) -> "LayaMLX":
        """Load `path/model.safetensors` as is; parameters are cast once to `dtype` (float32|float16)."""
        if dtype not in DTYPES:
            raise LayaError(Kind.INVALID, "MLX dtype must be one of %s, got %r" % (", ".join(DTYPES), dtype))
        spec = read_model_shape(path)
        wpath = os.path.join(path, "model.safetensors")
        if not os.path.isfile(wpath):
            raise CheckpointError(wpath, "file is missing")
        try:
            raw = mx.load(wpath)
        except Exception as e:  # mlx raises plain RuntimeError/ValueError on a bad file
            raise CheckpointError(wpath, "cannot read safetensors: %s" % e) from None
        cls._check_weights(wpath, raw, spec)
        weights = {k: v.astype(DTYPES[dtype]) for k, v in raw.items() if k != "temperature"}
        mx.eval(weights)
        return cls(weights, spec, dtype, compile=compile)

    @staticmethod
    def _check_weights(wpath: str, w: Dict[str, mx.array], spec: ModelShape) -> None:
        """Upstream's strict load: exactly the tensors the configs imply, each with its shape."""
        want = tensor_shapes(spec.dims)
        missing = sorted(set(want) - set(w))
        unexpected = sorted(set(w) - set(want))
        wrong = ["%s %s (expected %s)" % (k, tuple(w[k].shape), want[k])
                 for k in want if k in w and tuple(w[k].shape) != want[k]]
        problems = [label + ", ".join(names[:5]) + (" ..." if len(names) > 5 else "")
                    for label, names in (("missing tensors: ", missing), ("unexpected tensors: ", unexpected),
                                         ("wrong shapes: ", wrong)) if names]
        if problems:
            raise CheckpointError(wpath, "weights do not match the network described by the config; "
                                  + "; ".join(problems))

    @property
    def device(self) -> str:
        """Where MLX really runs: 'mlx:gpu' (Metal, Apple Silicon) or 'mlx:cpu' (e.g. Linux)."""
        return "mlx:gpu" if mx.default_device().type == mx.gpu else "mlx:cpu"

    @property
    def n_act(self) -> int:
        return self.spec.n_act

    # ------------------------------------------------------------------ forward
    def forward(self, input_ids: np.ndarray, attention_mask: np.ndarray, marker_pos: np.ndarray,
                marker_mask: np.ndarray, qtype: np.ndarray, position_ids: Optional[np.ndarray] = None,
                option_ids: Optional[np.ndarray] = None) -> Tuple[np.ndarray, np.ndarray]:
        """One batch (the numpy arrays of a collate) -> (logits float32 [B,K], act_logits float32 [B,n_act]).

        `position_ids` + `option_ids` (both or neither) select the parallel option layout.
        """
        ids = np.asarray(input_ids)
        if ids.ndim != 2 or ids.shape[0] == 0 or ids.shape[1] == 0:
            raise LayaError(Kind.INVALID, "input_ids must be a non-empty [batch, tokens] array, got shape %s"
                            % (ids.shape,))
        B, L = ids.shape
        att, mpos, mmask, qt = (np.asarray(a) for a in (attention_mask, marker_pos, marker_mask, qtype))
        if att.shape != (B, L) or mpos.ndim != 2 or mpos.shape[0] != B or mmask.shape != mpos.shape \
                or qt.shape != (B,) or mpos.shape[1] == 0:
            raise LayaError(Kind.INVALID, "inconsistent batch shapes: input_ids %s attention_mask %s marker_pos %s "
                            "marker_mask %s qtype %s" % (ids.shape, att.shape, mpos.shape, mmask.shape, qt.shape))
        # MLX gathers do not bounds-check; an out-of-range index would read garbage instead of failing.
        if ids.min() < 0 or ids.max() >= self.spec.vocab_size:
            raise LayaError(Kind.INVALID, "token id out of range [0, %d)" % self.spec.vocab_size)
        if mpos.max() >= L:
            raise LayaError(Kind.INVALID, "marker position %d is past the %d tokens of the batch" % (mpos.max(), L))
        if qt.min() < 0 or qt.max() > 2:
            raise LayaError(Kind.INVALID, "qtype must be 0 (choice), 1 (score) or 2 (noul)")
        if (position_ids is None) != (option_ids is None):
            raise LayaError(Kind.INVALID, "position_ids and option_ids come together (parallel layout) or not at all")
        args = [mx.array(ids.astype(np.int32)), mx.array(att != 0), mx.array(np.maximum(mpos, 0).astype(np.int32)),
                mx.array(mmask.astype(bool)), mx.array(qt.astype(np.int32))]
        if option_ids is not None:
            pos, opt = np.asarray(position_ids), np.asarray(option_ids)
            if pos.shape != (B, L) or opt.shape != (B, L):
                raise LayaError(Kind.INVALID, "position_ids %s / option_ids %s must match input_ids %s"
                                % (pos.shape, opt.shape, ids.shape))
            args += [mx.array(pos.astype(np.int32)), mx.array(opt.astype(np.int32))]
        logits, act = self._fn(*args)
        mx.eval(logits, act)
        return np.array(logits, dtype=np.float32), np.array(act, dtype=np.float32)

    def _forward(self, ids, att, mpos, mmask, qtype, pos=None, opt=None):
        h = self._encode(ids, att, pos, opt)
        return self._decide(h, att, mpos, mmask, qtype)

    def _masks(self, att, pos, opt) -> Dict[str, mx.array]:
        """Boolean [B,1,L,L] masks per layer type (True = may attend), as ModernBERT/laya build them.

        Sequential: padding for full layers, padding and |i-j| <= local_attention//2 for sliding ones.
        Parallel (`laya.common.parallel_option_masks`): no attention between different options, and
        the window is measured in position ids. The diagonal is always allowed: real tokens see
        themselves anyway, and a padded query far from every real token would otherwise have an
        all-False row, whose softmax is undefined; padded rows are never read.
        """
        L = att.shape[1]
        keys = att[:, None, None, :]
        idx = mx.arange(L)
        eye = (idx[:, None] == idx[None, :])[None, None]
        if opt is None:
            near = (mx.abs(idx[:, None] - idx[None, :]) <= self.spec.sliding_window)[None, None]
            full = keys
        else:
            a, b = opt[:, :, None], opt[:, None, :]
            other_option = (a > 0) & (b > 0) & (a != b)
            full = keys & ~other_option[:, None]
            near = (mx.abs(pos[:, :, None] - pos[:, None, :]) <= self.spec.sliding_window)[:, None]
        return {"full_attention": full | eye, "sliding_attention": (full & near) | eye}

    def _rope_tables(self, pos) -> Dict[str, Tuple[mx.array, mx.array]]:
        """cos/sin [B,1,L,hd] per layer type for explicit position ids (fp32, like transformers)."""
        hd = self.spec.head_dim
        out = {}
        for kind, theta in self.spec.rope_theta.items():
            inv = 1.0 / (theta ** (mx.arange(0, hd, 2, dtype=mx.float32) / hd))
            f = pos.astype(mx.float32)[:, :, None] * inv
            emb = mx.concatenate([f, f], axis=-1)[:, None]
            out[kind] = (mx.cos(emb), mx.sin(emb))
        return out

    def _encode(self, ids, att, pos, opt):
        s, w = self.spec, self.w
        B, L = ids.shape
        H, hd = s.heads, s.head_dim
        ln = lambda x, name: mx.fast.layer_norm(x, w[name], None, s.norm_eps)
        x = ln(w["encoder.embeddings.tok_embeddings.weight"][ids], "encoder.embeddings.norm.weight")
        masks = self._masks(att, pos, opt)
        tables = self._rope_tables(pos) if pos is not None else None
        for i, kind in enumerate(s.layer_types):
            p = "encoder.layers.%d." % i
            y = x if i == 0 else ln(x, p + "attn_norm.weight")
            qkv = (y @ w[p + "attn.Wqkv.weight"].T).reshape(B, L, 3, H, hd).transpose(2, 0, 3, 1, 4)
            # RoPE in float32, cast back: what transformers' apply_rotary_pos_emb does in fp16.
            q, k, v = qkv[0].astype(mx.float32), qkv[1].astype(mx.float32), qkv[2]
            if tables is None:
                q = mx.fast.rope(q, hd, traditional=False, base=s.rope_theta[kind], scale=1.0, offset=0)
                k = mx.fast.rope(k, hd, traditional=False, base=s.rope_theta[kind], scale=1.0, offset=0)
            else:
                q, k = (_rotate_half_rope(t, *tables[kind]) for t in (q, k))
            a = mx.fast.scaled_dot_product_attention(q.astype(v.dtype), k.astype(v.dtype), v,
                                                     scale=hd ** -0.5, mask=masks[kind])
            x = x + a.transpose(0, 2, 1, 3).reshape(B, L, -1) @ w[p + "attn.Wo.weight"].T
            u, g = mx.split(ln(x, p + "mlp_norm.weight") @ w[p + "mlp.Wi.weight"].T, 2, axis=-1)
            x = x + (nn.gelu(u) * g) @ w[p + "mlp.Wo.weight"].T
        return ln(x, "encoder.final_norm.weight")

    def _decide(self, h, att, mpos, mmask, qtype):
        w, d = self.w, self.spec.hidden_size
        B, L, _ = h.shape
        lin = lambda x, name, sep=".": mx.addmm(w[name + sep + "bias"], x, w[name + sep + "weight"].T)
        ln = lambda x, name: mx.fast.layer_norm(x, w[name + ".weight"], w[name + ".bias"], _HEAD_LN_EPS)
        h = h + w["type_emb.weight"][qtype][:, None, :]
        H = self.spec.head_heads
        hd = d // H
        keys = att[:, None, None, :]
        for i in range(self.spec.head_layers):
            p = "head.layers.%d." % i
            y = ln(h, p + "norm1")
            qkv = lin(y, p + "self_attn.in_proj", "_").reshape(B, L, 3, H, hd).transpose(2, 0, 3, 1, 4)
            a = mx.fast.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], scale=hd ** -0.5, mask=keys)
            h = h + lin(a.transpose(0, 2, 1, 3).reshape(B, L, d), p + "self_attn.out_proj")
            h = h + lin(nn.relu(lin(ln(h, p + "norm2"), p + "linear1")), p + "linear2")
        m = mx.take_along_axis(h, mpos[:, :, None], axis=1)
        m = lin(nn.gelu(lin(ln(m, "scorer.0"), "scorer.1")), "scorer.3")[..., 0]
        logits = mx.where(mmask, m.astype(mx.float32), _PADDED_MARKER_LOGIT)

        # Act-head features from the untempered float32 softmax (upstream DecisionModel.forward).
        p = mx.softmax(logits, axis=-1, precise=True)
        k = mx.maximum(mmask.sum(axis=-1), 2).astype(mx.float32)
        ent = -(p * mx.log(mx.maximum(p, 1e-9))).sum(axis=-1) / mx.log(k)
        top = -mx.sort(-p, axis=-1)
        top1 = top[:, 0]
        top2 = top[:, 1] if p.shape[-1] >= 2 else mx.zeros_like(top1)
        feats = mx.stack([top1, top1 - top2, ent, k / 255.0], axis=-1)
        act_in = mx.concatenate([h[:, 0].astype(mx.float32), feats], axis=-1).astype(h.dtype)
        act = lin(nn.gelu(lin(act_in, "act_head.0")), "act_head.2")
        return logits, act.astype(mx.float32)
