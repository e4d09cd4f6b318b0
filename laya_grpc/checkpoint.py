"""Open and strictly validate a Laya checkpoint directory (local, or a Hugging Face hub snapshot).

Every service reads the checkpoint through `open_checkpoint`, so a bad directory fails once, at
start-up, with a `CheckpointError` naming the file and the problem, instead of as a shape error
in the middle of a request. The checks are those upstream `Agent.__init__` makes (required
config keys, every tensor present with its shape, `temperature` a list of 3, a known
`option_layout`) plus what our engines need to know up front (ModernBERT encoder, special
tokens). Tensor shapes come from the safetensors header only; no weight is read here.
No torch, no transformers.
"""
from __future__ import annotations

import functools
import hashlib
import math
import os
import re
import threading
from dataclasses import dataclass, field
from typing import Any

from .checkpoint_shapes import Dims, tensor_shapes
from .errors import CheckpointError
from .jsonfile import read_json_object
from .temperatures import raw_temperatures

CONFIG_FILE = "rl_agent_config.json"
WEIGHTS_FILE = "model.safetensors"
ENCODER_CONFIG_FILE = os.path.join("encoder", "config.json")
TOKENIZER_FILE = os.path.join("tokenizer", "tokenizer.json")
TOKENIZER_CONFIG_FILE = os.path.join("tokenizer", "tokenizer_config.json")
SPECIAL_TOKENS_MAP_FILE = os.path.join("tokenizer", "special_tokens_map.json")

# What upstream's `snapshot_download` fetches (agent.py): nothing else of the repo.
HUB_FILES = ("rl_agent_config.json", "model.safetensors", "tokenizer/*", "encoder/*")
# Upstream's reviewed commits (laya/revisions.py PINNED_REVISIONS); `revision="reviewed"` picks one.
PINNED_REVISIONS = {
    "convaiinnovations/laya": "55cf4c4ebb4ebe31b2550e8bdf3bd21b99753851",
    "convaiinnovations/laya-multilingual": "e4e9ddf21a7b1903b7acffd8814ad4307bf63a67",
    "convaiinnovations/laya-typed-decisions": "1a793eb568e6718f15941d08f85432581df534e3",
}
REVIEWED = "reviewed"

OPTION_LAYOUTS = ("sequential", "parallel")
LAYER_TYPES = ("full_attention", "sliding_attention")
# Upstream defaults (agent.py / common.py) for optional rl_agent_config.json keys.
DEFAULT_MAX_LEN = 512
DEFAULT_HEAD_MAX_LEN = 192
# transformers' ModernBertConfig defaults for keys an older config may omit.
DEFAULT_GLOBAL_ROPE_THETA = 160000.0
DEFAULT_LOCAL_ROPE_THETA = 10000.0
DEFAULT_LOCAL_ATTENTION = 128
DEFAULT_GLOBAL_EVERY = 3
DEFAULT_NORM_EPS = 1e-5

_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class SpecialTokens:
    """The four special tokens Laya's sequences use, as strings (tokenizer_config.json) and ids."""
    cls: str
    sep: str
    pad: str
    mask: str
    cls_id: int
    sep_id: int
    pad_id: int
    mask_id: int


@dataclass(frozen=True)
class Checkpoint:
    path: str                    # the checkpoint directory (snapshot subfolder for hub sources)
    source: str                  # what the caller asked for (a path or a hub id)
    revision: str | None         # hub commit sha, None for a local directory
    config: dict                 # rl_agent_config.json
    encoder_config: dict         # encoder/config.json
    tokenizer_dir: str
    weights_path: str
    # rl_agent_config.json, with upstream's defaults applied
    max_len: int
    head_max_len: int
    head_layers: int
    n_act: int
    option_layout: str
    amp_dtype: str | None
    # encoder/config.json
    hidden_size: int
    num_layers: int
    heads: int
    intermediate_size: int
    local_attention: int
    global_rope_theta: float
    local_rope_theta: float
    layer_types: tuple[str, ...]
    vocab_size: int
    norm_eps: float
    encoder_dtype: str | None    # `dtype` (or 4.x `torch_dtype`): upstream builds the encoder in it (G2)
    head_heads: int              # decision-head attention heads: max(1, hidden // 64) as upstream
    special: SpecialTokens
    tensor_shapes: dict[str, tuple[int, ...]] = field(repr=False)

    @property
    def parallel(self) -> bool:
        return self.option_layout == "parallel"

    @functools.cached_property
    def sha256(self) -> str:
        """SHA-256 of model.safetensors, streamed and cached per (file, size, mtime) in this process."""
        return file_sha256(self.weights_path)


def open_checkpoint(source: str, revision: str | None = None, subfolder: str | None = None) -> Checkpoint:
    """Resolve `source` (a local directory, else a hub repo id) and validate it strictly.

    As upstream: an existing path is used as is; a path-looking string that does not exist
    (`/`, `./`, `../`, absolute) is an error, never a hub lookup; anything else shaped like
    `owner/name` is downloaded with huggingface_hub (only the checkpoint's own files).
    """
    if os.path.exists(source):
        if revision:
            raise CheckpointError(source, "revision=%r applies to hub sources only; this is a local path"
                                  % revision)
        path, rev = os.path.abspath(source), None
    elif source.startswith(("/", "./", "../", "~")) or os.path.isabs(source) or not _HUB_ID.match(source):
        raise CheckpointError(source, "no such checkpoint directory (and not a hub id like owner/name)")
    else:
        path, rev = _download(source, revision, subfolder)
    if subfolder:
        path = os.path.join(path, subfolder)
        if not os.path.isdir(path):
            raise CheckpointError(path, "subfolder %r not found in %s" % (subfolder, source))
    return _validate(path, source, rev)


def resolve_revision(repo: str, revision: str | None) -> str | None:
    """`"reviewed"` -> upstream's reviewed commit for `repo` (case-insensitive); else `revision`."""
    value = (revision or "").strip()
    if not value:
        return None
    if value == REVIEWED:
        for name, sha in PINNED_REVISIONS.items():
            if name == repo.lower():
                return sha
        raise CheckpointError(repo, "revision 'reviewed' asked for, but upstream has no reviewed commit "
                              "for this repository; pass a commit, branch or tag")
    return value


def _download(repo: str, revision: str | None, subfolder: str | None) -> tuple[str, str | None]:
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise CheckpointError(repo, "not a local directory, and huggingface_hub is not installed to fetch "
                              "it from the hub (pip install 'laya-grpc[hub]')") from None
    rev = resolve_revision(repo, revision)
    prefix = subfolder + "/" if subfolder else ""
    kw: dict[str, Any] = {"allow_patterns": [prefix + name for name in HUB_FILES]}
    if os.environ.get("HF_TOKEN"):
        kw["token"] = os.environ["HF_TOKEN"]
    if rev:
        kw["revision"] = rev
    try:
        path = snapshot_download(repo, **kw)
    except Exception as e:  # offline, unknown repo, bad revision, auth: all one failure for the caller
        raise CheckpointError(repo, "could not fetch from the Hugging Face hub%s: %s: %s"
                              % (" at revision %s" % rev if rev else "", type(e).__name__, e)) from None
    return path, _snapshot_revision(path) or rev


def _snapshot_revision(path: str) -> str | None:
    """Commit sha of a hub cache snapshot (`.../snapshots/<sha>`), None for other directories."""
    parent, base = os.path.split(os.path.realpath(path).rstrip(os.sep))
    return base if os.path.basename(parent) == "snapshots" and base else None


# --------------------------------------------------------------------------- validation

def _validate(path: str, source: str, revision: str | None) -> Checkpoint:
    if not os.path.isdir(path):
        raise CheckpointError(path, "not a directory")
    files = {rel: os.path.join(path, rel) for rel in (CONFIG_FILE, WEIGHTS_FILE, ENCODER_CONFIG_FILE,
                                                     TOKENIZER_FILE, TOKENIZER_CONFIG_FILE)}
    for rel, full in files.items():
        if not os.path.isfile(full):
            raise CheckpointError(full, "missing (a Laya checkpoint needs %s)" % ", ".join(files))
    cfg = read_json_object(files[CONFIG_FILE])
    ecfg = read_json_object(files[ENCODER_CONFIG_FILE])
    head = _agent_fields(files[CONFIG_FILE], cfg)
    enc = _encoder_fields(files[ENCODER_CONFIG_FILE], ecfg)
    special = _special_tokens(path, enc["vocab_size"])
    dims = Dims(vocab_size=enc["vocab_size"], hidden_size=enc["hidden_size"], num_layers=enc["num_layers"],
                intermediate_size=enc["intermediate_size"], head_layers=head["head_layers"], n_act=head["n_act"])
    head_heads = max(1, enc["hidden_size"] // 64)
    if enc["hidden_size"] % head_heads:
        raise CheckpointError(files[ENCODER_CONFIG_FILE], "hidden_size %d is not divisible by the decision "
                              "head's %d attention heads" % (enc["hidden_size"], head_heads))
    shapes = tensor_shapes(dims)
    _check_tensors(files[WEIGHTS_FILE], shapes)
    return Checkpoint(path=path, source=source, revision=revision, config=cfg, encoder_config=ecfg,
                      tokenizer_dir=os.path.join(path, "tokenizer"), weights_path=files[WEIGHTS_FILE],
                      special=special, head_heads=head_heads, tensor_shapes=shapes, **head, **enc)


def _int(path: str, obj: dict, key: str, default: int | None = None, minimum: int = 1) -> int:
    if key not in obj:
        if default is None:
            raise CheckpointError(path, "missing required key %r" % key)
        return default
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise CheckpointError(path, "%r must be an integer >= %d, found %r" % (key, minimum, v))
    return v


def _float(path: str, obj: dict, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise CheckpointError(path, "%r must be a positive number, found %r" % (key, value))
    return float(value)


def _agent_fields(path: str, cfg: dict) -> dict:
    """rl_agent_config.json: the keys upstream requires (`encoder`, `head_layers`) and reads."""
    if "encoder" not in cfg:
        raise CheckpointError(path, "missing required key 'encoder'")
    head_layers = _int(path, cfg, "head_layers", minimum=0)
    act_costs = cfg.get("act_costs", {})
    if not isinstance(act_costs, (dict, list)):
        raise CheckpointError(path, "'act_costs' must be a mapping (only its length is used), found %r" % (act_costs,))
    raw_temperatures(cfg, path)   # shape only; the clamp (and its warning) is Temperatures.from_config's
    layout = cfg.get("option_layout", "sequential")
    if layout not in OPTION_LAYOUTS:
        raise CheckpointError(path, "'option_layout' must be one of %s, found %r" % (", ".join(OPTION_LAYOUTS),
                                                                                    layout))
    amp = cfg.get("amp_dtype")
    if amp is not None and not isinstance(amp, str):
        raise CheckpointError(path, "'amp_dtype' must be a string, found %r" % (amp,))
    return {"max_len": _int(path, cfg, "max_len", DEFAULT_MAX_LEN),
            "head_max_len": _int(path, cfg, "head_max_len", DEFAULT_HEAD_MAX_LEN),
            "head_layers": head_layers, "n_act": len(act_costs) + 1,
            "option_layout": layout, "amp_dtype": amp}


def _encoder_fields(path: str, e: dict) -> dict:
    """encoder/config.json: a ModernBERT config, read the way transformers 5 / upstream read it."""
    if e.get("model_type") != "modernbert":
        raise CheckpointError(path, "model_type must be 'modernbert', found %r" % (e.get("model_type"),))
    if e.get("hidden_activation", "gelu") != "gelu":
        raise CheckpointError(path, "hidden_activation %r is not supported (ModernBERT uses 'gelu')"
                              % (e.get("hidden_activation"),))
    hidden = _int(path, e, "hidden_size")
    layers = _int(path, e, "num_hidden_layers")
    heads = _int(path, e, "num_attention_heads")
    if hidden % heads:
        raise CheckpointError(path, "hidden_size %d is not divisible by num_attention_heads %d" % (hidden, heads))
    layer_types = e.get("layer_types")
    if layer_types is None:
        every = _int(path, e, "global_attn_every_n_layers", DEFAULT_GLOBAL_EVERY)
        layer_types = ["full_attention" if i % every == 0 else "sliding_attention" for i in range(layers)]
    if not isinstance(layer_types, list) or len(layer_types) != layers or \
            any(t not in LAYER_TYPES for t in layer_types):
        raise CheckpointError(path, "'layer_types' must list %d entries of %s, found %r"
                              % (layers, "/".join(LAYER_TYPES), layer_types))
    thetas = []
    rope = e.get("rope_parameters")
    for layer_type, legacy, default in (("full_attention", "global_rope_theta", DEFAULT_GLOBAL_ROPE_THETA),
                                        ("sliding_attention", "local_rope_theta", DEFAULT_LOCAL_ROPE_THETA)):
        theta = None
        if isinstance(rope, dict):
            params = rope.get(layer_type)
            theta = params.get("rope_theta") if isinstance(params, dict) else rope.get("rope_theta")
        if theta is None:
            theta = e.get(legacy, default)
        thetas.append(_float(path, e, "rope_theta of %s" % layer_type, theta))
    norm_eps = _float(path, e, "norm_eps", e.get("norm_eps", DEFAULT_NORM_EPS))
    dtype = e.get("dtype", e.get("torch_dtype"))
    return {"hidden_size": hidden, "num_layers": layers, "heads": heads,
            "intermediate_size": _int(path, e, "intermediate_size"),
            "local_attention": _int(path, e, "local_attention", DEFAULT_LOCAL_ATTENTION),
            "global_rope_theta": thetas[0], "local_rope_theta": thetas[1],
            "layer_types": tuple(layer_types), "vocab_size": _int(path, e, "vocab_size"),
            "norm_eps": norm_eps, "encoder_dtype": dtype if isinstance(dtype, str) else None}


def _special_tokens(path: str, vocab_size: int) -> SpecialTokens:
    """cls/sep/pad/mask strings from tokenizer_config.json (else special_tokens_map.json), ids from
    tokenizer.json (added tokens first, then the model vocabulary)."""
    cfg_path = os.path.join(path, TOKENIZER_CONFIG_FILE)
    tcfg = read_json_object(cfg_path)
    map_path = os.path.join(path, SPECIAL_TOKENS_MAP_FILE)
    smap = read_json_object(map_path) if os.path.isfile(map_path) else {}
    tok_path = os.path.join(path, TOKENIZER_FILE)
    tok = read_json_object(tok_path)
    ids: dict[str, int] = {}
    vocab = (tok.get("model") or {}).get("vocab")
    if isinstance(vocab, dict):
        ids.update({k: v for k, v in vocab.items() if isinstance(v, int)})
    elif isinstance(vocab, list):  # Unigram: [[piece, score], ...]
        ids.update({p[0]: i for i, p in enumerate(vocab) if isinstance(p, list) and p})
    for added in tok.get("added_tokens") or []:
        if isinstance(added, dict) and isinstance(added.get("content"), str) and isinstance(added.get("id"), int):
            ids[added["content"]] = added["id"]
    out: dict[str, Any] = {}
    for role in ("cls", "sep", "pad", "mask"):
        key = role + "_token"
        raw = tcfg.get(key, smap.get(key))
        text = raw.get("content") if isinstance(raw, dict) else raw
        if not isinstance(text, str) or not text:
            raise CheckpointError(cfg_path, "special token %r is missing (Laya needs cls, sep, pad and mask)" % key)
        if text not in ids:
            raise CheckpointError(tok_path, "%s %r is not in the tokenizer's vocabulary" % (key, text))
        if not 0 <= ids[text] < vocab_size:
            raise CheckpointError(tok_path, "%s %r has id %d, outside the encoder's vocab_size %d"
                                  % (key, text, ids[text], vocab_size))
        out[role], out[role + "_id"] = text, ids[text]
    return SpecialTokens(**out)


def _check_tensors(path: str, expected: dict[str, tuple[int, ...]]) -> None:
    """Every expected tensor present with its shape, nothing else (upstream loads strict=True)."""
    from safetensors import safe_open
    try:
        with safe_open(path, framework="numpy") as f:
            found = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
    except Exception as e:  # safetensors raises its own SafetensorError for a bad header
        raise CheckpointError(path, "not a readable safetensors file: %s" % e) from None
    missing = [n for n in expected if n not in found]
    unexpected = sorted(n for n in found if n not in expected)
    wrong = ["%s: expected %s, found %s" % (n, list(s), list(found[n]))
             for n, s in expected.items() if n in found and found[n] != s]
    problems = []
    if missing:
        problems.append("%d missing tensor(s): %s" % (len(missing), ", ".join(missing[:5])))
    if unexpected:
        problems.append("%d unexpected tensor(s): %s" % (len(unexpected), ", ".join(unexpected[:5])))
    if wrong:
        problems.append("%d tensor(s) with the wrong shape for the configs: %s" % (len(wrong), "; ".join(wrong[:5])))
    if problems:
        raise CheckpointError(path, " / ".join(problems))


# --------------------------------------------------------------------------- digests

_SHA_CACHE: dict[tuple[str, int, int], str] = {}
_SHA_LOCK = threading.Lock()


def file_sha256(path: str) -> str:
    """Streaming SHA-256 of a file, remembered per (real path, size, mtime) for the process."""
    st = os.stat(path)
    key = (os.path.realpath(path), st.st_size, st.st_mtime_ns)
    with _SHA_LOCK:
        if key in _SHA_CACHE:
            return _SHA_CACHE[key]
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    digest = h.hexdigest()
    with _SHA_LOCK:
        _SHA_CACHE[key] = digest
    return digest
