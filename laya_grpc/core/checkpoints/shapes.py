"""The tensors a Laya checkpoint must hold, derived from its two configs.

One table for the writer (`make_checkpoint`) and the reader (`checkpoint.open_checkpoint`), so a
checkpoint we generate and one we accept are described by the same code. Names and shapes follow
upstream's `DecisionModel.state_dict()` (ModernBERT encoder + `nn.TransformerEncoder` head +
scorer + act head + the `temperature` buffer); see laya-format.md §2.1.
"""
from __future__ import annotations

from dataclasses import dataclass

ACT_HIDDEN = 256   # width of upstream's act head (`nn.Linear(d + 4, 256)`)
ACT_FEATURES = 4   # [top1, top1 - top2, normalised entropy, k / 255]


@dataclass(frozen=True)
class Dims:
    vocab_size: int
    hidden_size: int
    num_layers: int
    intermediate_size: int
    head_layers: int
    n_act: int


def tensor_shapes(dims: Dims) -> dict[str, tuple[int, ...]]:
    """Every state_dict entry (parameters and the `temperature` buffer) with its shape, in a fixed order."""
    d, i_sz = dims.hidden_size, dims.intermediate_size
    s: dict[str, tuple[int, ...]] = {
        "temperature": (3,),
        "encoder.embeddings.tok_embeddings.weight": (dims.vocab_size, d),
        "encoder.embeddings.norm.weight": (d,),
    }
    for n in range(dims.num_layers):
        p = "encoder.layers.%d." % n
        if n > 0:  # layer 0 reuses the embedding norm (attn_norm is an Identity there)
            s[p + "attn_norm.weight"] = (d,)
        s[p + "attn.Wqkv.weight"] = (3 * d, d)
        s[p + "attn.Wo.weight"] = (d, d)
        s[p + "mlp_norm.weight"] = (d,)
        s[p + "mlp.Wi.weight"] = (2 * i_sz, d)
        s[p + "mlp.Wo.weight"] = (d, i_sz)
    s["encoder.final_norm.weight"] = (d,)
    for n in range(dims.head_layers):
        p = "head.layers.%d." % n
        s[p + "self_attn.in_proj_weight"] = (3 * d, d)
        s[p + "self_attn.in_proj_bias"] = (3 * d,)
        s[p + "self_attn.out_proj.weight"] = (d, d)
        s[p + "self_attn.out_proj.bias"] = (d,)
        s[p + "linear1.weight"] = (4 * d, d)
        s[p + "linear1.bias"] = (4 * d,)
        s[p + "linear2.weight"] = (d, 4 * d)
        s[p + "linear2.bias"] = (d,)
        for norm in ("norm1", "norm2"):
            s[p + norm + ".weight"] = (d,)
            s[p + norm + ".bias"] = (d,)
    s["type_emb.weight"] = (3, d)
    s["scorer.0.weight"] = (d,)
    s["scorer.0.bias"] = (d,)
    s["scorer.1.weight"] = (d, d)
    s["scorer.1.bias"] = (d,)
    s["scorer.3.weight"] = (1, d)
    s["scorer.3.bias"] = (1,)
    s["act_head.0.weight"] = (ACT_HIDDEN, d + ACT_FEATURES)
    s["act_head.0.bias"] = (ACT_HIDDEN,)
    s["act_head.2.weight"] = (dims.n_act, ACT_HIDDEN)
    s["act_head.2.bias"] = (dims.n_act,)
    return s


def parameter_count(shapes: dict[str, tuple[int, ...]]) -> int:
    """Number of parameters (the `temperature` buffer is not one)."""
    total = 0
    for name, shape in shapes.items():
        if name == "temperature":
            continue
        n = 1
        for x in shape:
            n *= x
        total += n
    return total
