"""The network's shape, read once from a checkpoint's two configs: the one parser of them.

`open_checkpoint` (validation), the torch model and the MLX model all build from the `ModelShape`
made here, so they cannot disagree on a layer type, a RoPE theta or a head count. The encoder
config is read the way transformers 5 `ModernBertConfig` reads it (defaults, legacy 4.x keys);
every ModernBERT variant our engines do not implement is refused. No torch, no mlx.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

from .shapes import Dims
from ..errors import CheckpointError
from .jsonfile import read_json_object

AGENT_CONFIG_FILE = "rl_agent_config.json"
ENCODER_CONFIG_FILE = os.path.join("encoder", "config.json")

FULL, SLIDING = "full_attention", "sliding_attention"
LAYER_TYPES = (FULL, SLIDING)
# transformers' ModernBertConfig defaults, for keys an older config may omit.
DEFAULT_ROPE_THETA = {FULL: 160000.0, SLIDING: 10000.0}        # ModernBertConfig.default_theta
LEGACY_ROPE_THETA_KEY = {FULL: "global_rope_theta", SLIDING: "local_rope_theta"}   # 4.x configs
DEFAULT_LOCAL_ATTENTION = 128
DEFAULT_GLOBAL_EVERY = 3
DEFAULT_NORM_EPS = 1e-5
# encoder/config.json `dtype` values the engines can build the encoder in
ENCODER_DTYPES = ("float32", "bfloat16", "float16")
# settings whose other values would need maths we do not implement
_FIXED = (("hidden_activation", "gelu"), ("attention_bias", False), ("mlp_bias", False), ("norm_bias", False))


@dataclass(frozen=True)
class ModelShape:
    """Everything about the network that the two config files fix."""
    vocab_size: int
    hidden_size: int
    num_layers: int
    heads: int
    intermediate_size: int
    layer_types: tuple[str, ...]     # FULL | SLIDING per encoder layer
    rope_theta: dict[str, float]     # per layer type
    local_attention: int
    norm_eps: float
    encoder_dtype: str               # one of ENCODER_DTYPES; upstream builds the encoder in it
    head_layers: int
    n_act: int

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.heads

    @property
    def sliding_window(self) -> int:
        """ModernBertConfig.sliding_window: a token sees |i-j| <= local_attention // 2."""
        return self.local_attention // 2

    @property
    def head_heads(self) -> int:
        """Decision-head attention heads: upstream's nn.TransformerEncoderLayer(d, max(1, d // 64))."""
        return max(1, self.hidden_size // 64)

    @property
    def dims(self) -> Dims:
        return Dims(vocab_size=self.vocab_size, hidden_size=self.hidden_size, num_layers=self.num_layers,
                    intermediate_size=self.intermediate_size, head_layers=self.head_layers, n_act=self.n_act)


def read_model_shape(ckpt_dir: str) -> ModelShape:
    """Read and parse `rl_agent_config.json` + `encoder/config.json` of a checkpoint directory."""
    agent_path = os.path.join(ckpt_dir, AGENT_CONFIG_FILE)
    enc_path = os.path.join(ckpt_dir, ENCODER_CONFIG_FILE)
    return parse_model_shape(agent_path, read_json_object(agent_path), enc_path, read_json_object(enc_path))


def parse_model_shape(agent_path: str, cfg: dict, enc_path: str, e: dict) -> ModelShape:
    """The configs' JSON objects -> ModelShape; a CheckpointError names the file and key at fault."""
    head_layers = config_int(agent_path, cfg, "head_layers", minimum=0)
    act_costs = cfg.get("act_costs", {})
    if not isinstance(act_costs, (dict, list)):
        raise CheckpointError(agent_path, "'act_costs' must be a mapping (only its length is used), found %r"
                              % (act_costs,))
    if e.get("model_type") != "modernbert":
        raise CheckpointError(enc_path, "model_type must be 'modernbert', found %r" % (e.get("model_type"),))
    for key, supported in _FIXED:
        if e.get(key, supported) != supported:
            raise CheckpointError(enc_path, "%s=%r is not supported (only %r)" % (key, e[key], supported))
    hidden = config_int(enc_path, e, "hidden_size")
    layers = config_int(enc_path, e, "num_hidden_layers")
    heads = config_int(enc_path, e, "num_attention_heads")
    if hidden % heads:
        raise CheckpointError(enc_path, "hidden_size %d is not divisible by num_attention_heads %d"
                              % (hidden, heads))
    layer_types = e.get("layer_types")
    if layer_types is None:  # transformers 4.x configs: a full layer every `global_attn_every_n_layers`
        every = config_int(enc_path, e, "global_attn_every_n_layers", DEFAULT_GLOBAL_EVERY)
        layer_types = [FULL if i % every == 0 else SLIDING for i in range(layers)]
    if not isinstance(layer_types, list) or len(layer_types) != layers or \
            any(t not in LAYER_TYPES for t in layer_types):
        raise CheckpointError(enc_path, "'layer_types' must list %d entries of %s, found %r"
                              % (layers, "/".join(LAYER_TYPES), layer_types))
    dtype = e.get("dtype", e.get("torch_dtype")) or "float32"
    if dtype not in ENCODER_DTYPES:
        raise CheckpointError(enc_path, "dtype %r is not supported (only %s)" % (dtype, ", ".join(ENCODER_DTYPES)))
    spec = ModelShape(
        vocab_size=config_int(enc_path, e, "vocab_size"), hidden_size=hidden, num_layers=layers, heads=heads,
        intermediate_size=config_int(enc_path, e, "intermediate_size"), layer_types=tuple(layer_types),
        rope_theta=_rope_thetas(enc_path, e),
        local_attention=config_int(enc_path, e, "local_attention", DEFAULT_LOCAL_ATTENTION),
        norm_eps=positive_float(enc_path, "norm_eps", e.get("norm_eps", DEFAULT_NORM_EPS)),
        encoder_dtype=dtype, head_layers=head_layers, n_act=len(act_costs) + 1)
    if hidden % spec.head_heads:
        raise CheckpointError(enc_path, "hidden_size %d is not divisible by the decision head's %d attention "
                              "heads" % (hidden, spec.head_heads))
    return spec


def _rope_thetas(path: str, e: dict) -> dict[str, float]:
    """Per layer type, as ModernBertConfig: `rope_parameters[type]["rope_theta"]`, else the 4.x key, else
    the default. transformers 5 refuses a `rope_parameters` not keyed by layer type; so do we."""
    rope = e.get("rope_parameters")
    rope = {} if rope is None else rope
    if not isinstance(rope, dict) or any(k not in LAYER_TYPES or not isinstance(v, dict) for k, v in rope.items()):
        raise CheckpointError(path, "'rope_parameters' must map %s to parameter objects, found %r"
                              % ("/".join(LAYER_TYPES), rope))
    thetas = {}
    for kind in LAYER_TYPES:
        params = rope.get(kind, {})
        if params.get("rope_type", "default") != "default":
            raise CheckpointError(path, "rope_type %r for %s is not supported (only 'default')"
                                  % (params["rope_type"], kind))
        theta = params.get("rope_theta", e.get(LEGACY_ROPE_THETA_KEY[kind], DEFAULT_ROPE_THETA[kind]))
        thetas[kind] = positive_float(path, "rope_theta of %s" % kind, theta)
    return thetas


def config_int(path: str, obj: dict, key: str, default: int | None = None, minimum: int = 1) -> int:
    """`obj[key]` as an integer >= minimum (bools refused); `default` when absent, else an error."""
    if key not in obj:
        if default is None:
            raise CheckpointError(path, "missing required key %r" % key)
        return default
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise CheckpointError(path, "%r must be an integer >= %d, found %r" % (key, minimum, v))
    return v


def positive_float(path: str, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise CheckpointError(path, "%r must be a positive number, found %r" % (key, value))
    return float(value)
