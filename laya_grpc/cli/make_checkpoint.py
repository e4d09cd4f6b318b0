"""`laya-grpc make-checkpoint`: a random-weight checkpoint in upstream's exact on-disk layout.

Tests and benchmarks need checkpoints without the Hub. The files are what upstream's own
`laya.train.save_checkpoint` writes (fp16 `model.safetensors` including the `temperature`
buffer, transformers-5.24-format `encoder/config.json`, `tokenizer/`, `rl_agent_config.json`),
so `laya.load(DIR)` loads them strictly and parity tests compare like with like. Only numpy,
safetensors and tokenizers are used; the same preset and seed give the same bytes.

The weights are scaled so that option logits differ by about one unit across options: with
near-uniform probabilities a parity test would pass whatever the engine computed. A conditioning
(`--conditioning`) moves that: how sharp the option logits are (the scorer's gain), the temperatures
(down to upstream's 0.5 clamp) and the distribution the weights are drawn from, so a precision check
can span checkpoints from flat to sharp without a real one. `default` is the preset's own scale and
temperatures (the same bytes for a preset and seed whether or not it is named).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass, replace
from typing import Optional

import numpy as np

from laya_grpc.core.runtime import flags
from . import synth_tokenizer
from laya_grpc.core.runtime.flags import setting
from laya_grpc.core.checkpoints.shapes import Dims, tensor_shapes


@dataclass(frozen=True)
class Preset:
    name: str
    tokenizer: str               # "english" (ModernBERT-like) or "gemma" (mmBERT-like)
    encoder_id: str              # `encoder` key of rl_agent_config.json (a Hub id; unused when encoder/ exists)
    hidden_size: int
    num_layers: int
    heads: int
    intermediate_size: int
    local_attention: int
    global_theta: float
    local_theta: float
    max_len: int
    head_max_len: int
    vocab_size: int | None = None  # None: the tokenizer's size rounded up to a multiple of 64
    option_layout: str | None = None
    scorer_gain: float = 5.0       # scales scorer.3 so option logits spread by ~1 (measured on tiny, tiny-ml)


PRESETS = {
    "tiny": Preset("tiny", "english", "answerdotai/ModernBERT-large", 64, 4, 4, 96, 16,
                   160000.0, 10000.0, 512, 192),
    "tiny-ml": Preset("tiny-ml", "gemma", "jhu-clsp/mmBERT-base", 64, 4, 4, 80, 16,
                      160000.0, 160000.0, 1024, 256),
    "large": Preset("large", "english", "answerdotai/ModernBERT-large", 1024, 28, 16, 2624, 128,
                    160000.0, 10000.0, 512, 192, vocab_size=50368),
    "ml-base": Preset("ml-base", "gemma", "jhu-clsp/mmBERT-base", 768, 22, 12, 1152, 128,
                      160000.0, 160000.0, 1024, 256, vocab_size=256000),
}
PRESETS["tiny-par"] = replace(PRESETS["tiny"], name="tiny-par", option_layout="parallel")

MAX_POSITIONS = 8192
ACT_COSTS = {"escalate": 0.05}           # one entry -> n_act = 2, like the shipped checkpoints
TEMPERATURE = [1.25, 0.9, 1.1]           # [choice, score, noul], all inside upstream's [0.5, 5]
TEMPERATURE_BY_OPTIONS = {"choice:2": 1.2, "choice:3-5": 0.8, "choice:6-10": 1.5,
                          "score:3-5": 0.7, "noul:2": 1.05}


@dataclass(frozen=True)
class Conditioning:
    """How sharp a checkpoint's answers are: same layout and shapes, other weights and temperatures."""
    name: str
    distribution: str = "normal"      # normal | uniform | laplace (matrices, embeddings and biases; unit variance)
    scorer_gain_x: float = 1.0        # times the preset's scorer_gain (option-logit spread)
    temperature: float | None = None  # every temperature (list and by-options) set to this; None: the defaults
    scorer_gain: float | None = None  # an absolute scorer gain instead of the preset's times scorer_gain_x

    def gain(self, preset: "Preset") -> float:
        return self.scorer_gain if self.scorer_gain is not None else preset.scorer_gain * self.scorer_gain_x


CONDITIONINGS = {
    "default": Conditioning("default"),
    # near-uniform probabilities: small logit spread, hot temperatures
    "flat": Conditioning("flat", scorer_gain_x=0.4, temperature=2.0),
    # sharp: uniform draws, four times the logit spread, temperatures at upstream's 0.5 clamp
    "sharp": Conditioning("sharp", distribution="uniform", scorer_gain_x=4.0, temperature=0.5),
    # heavy-tailed (Laplace) weights, twice the logit spread, temperatures at the clamp
    "heavy": Conditioning("heavy", distribution="laplace", scorer_gain_x=2.0, temperature=0.5),
}
TEMPERATURE_MIN = 0.5     # upstream clamps temperatures to [0.5, 5]


@dataclass
class MakeCheckpointSettings:
    ENV_PREFIX = "LAYA_MAKE_CHECKPOINT_"
    SECTION = "checkpoint"
    preset: Optional[str] = setting(None, "shapes and tokenizer", choices=tuple(sorted(PRESETS)), required=True)
    seed: int = setting(0, "weights seed (same seed, same bytes)", type=int)
    option_layout: Optional[str] = setting(None, "write this option_layout into rl_agent_config.json "
                                           "(default: the preset's)", choices=("sequential", "parallel"))
    conditioning: str = setting("default", "how sharp the answers are: default (option logits about one unit "
                                "apart), flat (near-uniform probabilities, temperature 2), sharp (uniform weights, "
                                "4x the logit spread, temperature 0.5) or heavy (Laplace weights, 2x the spread, "
                                "temperature 0.5); same layout and shapes", choices=tuple(sorted(CONDITIONINGS)))
    scorer_gain: Optional[float] = setting(None, "the scorer's output gain (option-logit spread; default: the "
                                           "preset's times the conditioning's)", type=float)
    temperature: Optional[float] = setting(None, "set every temperature to this (0.5 to 5, upstream's clamp; "
                                           "default: the conditioning's)", type=float)
    distribution: Optional[str] = setting(None, "what the weights are drawn from, at the same variance (default: "
                                          "the conditioning's)", choices=("normal", "uniform", "laplace"))
    force: bool = setting(False, "replace DIR if it exists")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dir", help="directory to write (created; must not exist unless --force)")
    flags.add_settings(parser, MakeCheckpointSettings)


def run(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    big = args.preset in ("large", "ml-base")
    try:
        cond = pick_conditioning(args.conditioning, args.scorer_gain, args.temperature, args.distribution)
        path = make_checkpoint(args.dir, args.preset, seed=args.seed, force=args.force,
                               option_layout=args.option_layout, progress=big, conditioning=cond)
    except (FileExistsError, ValueError) as e:
        print("laya-grpc make-checkpoint: %s" % e, file=sys.stderr)
        return 2
    print("wrote %s (preset %s, conditioning %s, seed %d) in %.2fs"
          % (path, args.preset, cond.name, args.seed, time.perf_counter() - t0))
    return 0


def pick_conditioning(name: str = "default", scorer_gain: float | None = None, temperature: float | None = None,
                      distribution: str | None = None) -> Conditioning:
    """A named conditioning with overrides (`make-checkpoint --scorer-gain/--temperature/--distribution`)."""
    if name not in CONDITIONINGS:
        raise ValueError("unknown conditioning %r (choose from %s)" % (name, ", ".join(sorted(CONDITIONINGS))))
    c = CONDITIONINGS[name]
    if temperature is not None:
        if not TEMPERATURE_MIN <= temperature <= 5.0:
            raise ValueError("temperature %g is outside upstream's clamp [0.5, 5]" % temperature)
        c = replace(c, name=c.name + "+t%g" % temperature, temperature=temperature)
    if distribution not in (None, "normal", "uniform", "laplace"):
        raise ValueError("unknown distribution %r (normal, uniform or laplace)" % distribution)
    if distribution is not None:
        c = replace(c, name=c.name + "+" + distribution, distribution=distribution)
    if scorer_gain is not None:
        if not scorer_gain > 0:
            raise ValueError("scorer gain must be positive, got %g" % scorer_gain)
        c = replace(c, name=c.name + "+gain%g" % scorer_gain, scorer_gain=scorer_gain)
    return c


def make_checkpoint(dir: str, preset: str, seed: int = 0, force: bool = False,
                    option_layout: str | None = None, progress: bool = False,
                    conditioning: Conditioning | str = "default") -> str:
    """Write a checkpoint for `preset` into `dir` and return its absolute path.

    Written into a sibling temporary directory and renamed into place, so a reader polling `dir`
    never sees half a checkpoint.
    """
    if preset not in PRESETS:
        raise ValueError("unknown preset %r (choose from %s)" % (preset, ", ".join(sorted(PRESETS))))
    p = PRESETS[preset]
    cond = pick_conditioning(conditioning) if isinstance(conditioning, str) else conditioning
    if option_layout is not None:
        p = replace(p, option_layout=option_layout)
    final = os.path.abspath(dir)
    if os.path.exists(final) and not force:
        raise FileExistsError("%s exists (pass force=True / --force to replace it)" % final)
    tmp = "%s.tmp-%d" % (final, os.getpid())
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(os.path.join(tmp, "encoder"))
    os.makedirs(os.path.join(tmp, "tokenizer"))
    try:
        _write(tmp, p, seed, progress, cond)
        for root, dirs, files in os.walk(tmp):
            os.chmod(root, 0o755)
            for f in files:
                os.chmod(os.path.join(root, f), 0o644)
        if os.path.exists(final):
            shutil.rmtree(final)
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def _write(path: str, p: Preset, seed: int, progress: bool, cond: Conditioning) -> None:
    tok = synth_tokenizer.english() if p.tokenizer == "english" else synth_tokenizer.gemma()
    vocab = p.vocab_size if p.vocab_size is not None else -(-tok.size // 64) * 64
    if tok.size > vocab:
        raise ValueError("tokenizer has %d ids but vocab_size is %d" % (tok.size, vocab))
    _write_text(os.path.join(path, "tokenizer", "tokenizer.json"), tok.tokenizer_json)
    _write_text(os.path.join(path, "tokenizer", "tokenizer_config.json"),
                json.dumps(tok.tokenizer_config, indent=2, ensure_ascii=False))
    _write_text(os.path.join(path, "tokenizer", "special_tokens_map.json"),
                json.dumps(tok.special_tokens_map, indent=2, ensure_ascii=False))
    _write_text(os.path.join(path, "encoder", "config.json"),
                json.dumps(encoder_config(p, vocab, tok), indent=2, sort_keys=True) + "\n")
    _write_text(os.path.join(path, "rl_agent_config.json"), json.dumps(agent_config(p, cond), indent=2))
    dims = Dims(vocab_size=vocab, hidden_size=p.hidden_size, num_layers=p.num_layers,
                intermediate_size=p.intermediate_size, head_layers=2, n_act=len(ACT_COSTS) + 1)
    tensors = random_weights(dims, cond.gain(p), seed, progress, cond.distribution)
    from safetensors.numpy import save_file
    if progress:
        print("  saving model.safetensors ...", file=sys.stderr, flush=True)
    save_file(tensors, os.path.join(path, "model.safetensors"))


def agent_config(p: Preset, cond: Conditioning = CONDITIONINGS["default"]) -> dict:
    """rl_agent_config.json: the keys inference reads (laya-format.md §1.1)."""
    temps, by_options = list(TEMPERATURE), dict(TEMPERATURE_BY_OPTIONS)
    if cond.temperature is not None:
        temps = [cond.temperature] * len(temps)
        by_options = {k: cond.temperature for k in by_options}
    cfg = {
        "encoder": p.encoder_id,
        "head_layers": 2,
        "act_costs": dict(ACT_COSTS),
        "max_len": p.max_len,
        "head_max_len": p.head_max_len,
        "temperature": temps,
        "temperature_by_options": by_options,
        "amp_dtype": "bf16",
    }
    if p.option_layout is not None:
        cfg["option_layout"] = p.option_layout
    return cfg


def encoder_config(p: Preset, vocab: int, tok: synth_tokenizer.SynthTokenizer) -> dict:
    """encoder/config.json exactly as transformers 5.24 saves a ModernBertModel's config."""
    return {
        "architectures": ["ModernBertModel"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": tok.cls_id,
        "classifier_activation": "gelu",
        "classifier_bias": False,
        "classifier_dropout": 0.0,
        "classifier_pooling": "cls",
        "cls_token_id": tok.cls_id,
        "decoder_bias": True,
        "deterministic_flash_attn": False,
        "dtype": "float32",
        "embedding_dropout": 0.0,
        "eos_token_id": tok.sep_id,
        "hidden_activation": "gelu",
        "hidden_size": p.hidden_size,
        "initializer_cutoff_factor": 2.0,
        "initializer_range": 0.02,
        "intermediate_size": p.intermediate_size,
        "layer_types": ["full_attention" if i % 3 == 0 else "sliding_attention" for i in range(p.num_layers)],
        "local_attention": p.local_attention,
        "max_position_embeddings": MAX_POSITIONS,
        "mlp_bias": False,
        "mlp_dropout": 0.0,
        "model_type": "modernbert",
        "norm_bias": False,
        "norm_eps": 1e-05,
        "num_attention_heads": p.heads,
        "num_hidden_layers": p.num_layers,
        "pad_token_id": tok.pad_id,
        "rope_parameters": {
            "full_attention": {"rope_theta": p.global_theta, "rope_type": "default"},
            "sliding_attention": {"rope_theta": p.local_theta, "rope_type": "default"},
        },
        "sep_token_id": tok.sep_id,
        "sparse_pred_ignore_index": -100,
        "sparse_prediction": False,
        "tie_word_embeddings": True,
        "transformers_version": "5.24.0",
        "vocab_size": vocab,
    }


def _init_spec(name: str, shape: tuple[int, ...], scorer_gain: float) -> tuple[str, float]:
    """(kind, scale) for one tensor: "one" = 1 + scale*N (norm gains), "normal" = scale*N.

    Matrices get std 1/sqrt(fan_in) so every residual branch matters as much as its input;
    embeddings have unit std (they are layer-normed at once); biases and norm offsets are small
    but non-zero so an engine that drops one is caught by parity tests.
    """
    if name == "temperature":
        return "const1", 0.0
    if len(shape) == 1 and name.endswith(".weight"):  # LayerNorm gains
        return "one", 0.1
    if name.endswith("bias"):  # incl. self_attn.in_proj_bias
        return "normal", 0.05
    if name == "encoder.embeddings.tok_embeddings.weight":
        return "normal", 1.0
    if name == "type_emb.weight":
        return "normal", 0.5
    if name == "scorer.3.weight":
        return "normal", scorer_gain / np.sqrt(shape[1])
    return "normal", 1.0 / np.sqrt(shape[1])


def _draw(rng: np.random.Generator, shape: tuple[int, ...], distribution: str) -> np.ndarray:
    """Unit-variance float32 draws."""
    if distribution == "normal":
        return rng.standard_normal(shape, dtype=np.float32)
    if distribution == "uniform":
        return rng.random(shape, dtype=np.float32) * np.float32(2 * np.sqrt(3.0)) - np.float32(np.sqrt(3.0))
    if distribution == "laplace":
        return rng.laplace(0.0, np.sqrt(0.5), shape).astype(np.float32)
    raise ValueError("unknown distribution %r" % distribution)


def random_weights(dims: Dims, scorer_gain: float, seed: int, progress: bool = False,
                   distribution: str = "normal") -> dict[str, np.ndarray]:
    """fp16 tensors for every state_dict entry, drawn from one seeded generator in table order
    (norm gains stay 1 + 0.1 N whatever the distribution: they scale, they do not mix)."""
    rng = np.random.default_rng(seed)
    shapes = tensor_shapes(dims)
    out: dict[str, np.ndarray] = {}
    done = 0
    total = sum(int(np.prod(s)) for s in shapes.values())
    last = time.perf_counter()
    for name, shape in shapes.items():
        kind, scale = _init_spec(name, shape, scorer_gain)
        if kind == "const1":
            arr = np.ones(shape, dtype=np.float16)
        else:
            x = _draw(rng, shape, "normal" if kind == "one" else distribution)
            x *= np.float32(scale)
            if kind == "one":
                x += np.float32(1.0)
            arr = x.astype(np.float16)
        out[name] = arr
        done += arr.size
        if progress and time.perf_counter() - last > 2.0:
            last = time.perf_counter()
            print("  %5.1f%% of %d values" % (100.0 * done / total, total), file=sys.stderr, flush=True)
    return out


def _write_text(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)

