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
import os
import re
import threading
from dataclasses import dataclass, field
from typing import Any

from .shapes import tensor_shapes
from ..errors import CheckpointError
from .jsonfile import read_json_object
from .model_shape import AGENT_CONFIG_FILE, ENCODER_CONFIG_FILE, ModelShape, config_int, parse_model_shape
from ..decisions.temperatures import raw_temperatures

CONFIG_FILE = AGENT_CONFIG_FILE
WEIGHTS_FILE = "model.safetensors"
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
# Upstream defaults (agent.py / common.py) for optional rl_agent_config.json keys.
DEFAULT_MAX_LEN = 512
DEFAULT_HEAD_MAX_LEN = 192

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
    option_layout: str
    amp_dtype: str | None
    net: ModelShape              # the network both configs describe (model_shape.py, shared with the engines)
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
    net = parse_model_shape(files[CONFIG_FILE], cfg, files[ENCODER_CONFIG_FILE], ecfg)
    special = _special_tokens(path, net.vocab_size)
    shapes = tensor_shapes(net.dims)
    _check_tensors(files[WEIGHTS_FILE], shapes)
    return Checkpoint(path=path, source=source, revision=revision, config=cfg, encoder_config=ecfg,
                      tokenizer_dir=os.path.join(path, "tokenizer"), weights_path=files[WEIGHTS_FILE],
                      net=net, special=special, tensor_shapes=shapes, **head)


def _agent_fields(path: str, cfg: dict) -> dict:
    """rl_agent_config.json beyond the network (model_shape.py): the keys upstream requires and reads."""
    if "encoder" not in cfg:
        raise CheckpointError(path, "missing required key 'encoder'")
    raw_temperatures(cfg, path)   # shape only; the clamp (and its warning) is Temperatures.from_config's
    layout = cfg.get("option_layout", "sequential")
    if layout not in OPTION_LAYOUTS:
        raise CheckpointError(path, "'option_layout' must be one of %s, found %r" % (", ".join(OPTION_LAYOUTS),
                                                                                    layout))
    amp = cfg.get("amp_dtype")
    if amp is not None and not isinstance(amp, str):
        raise CheckpointError(path, "'amp_dtype' must be a string, found %r" % (amp,))
    return {"max_len": config_int(path, cfg, "max_len", DEFAULT_MAX_LEN),
            "head_max_len": config_int(path, cfg, "head_max_len", DEFAULT_HEAD_MAX_LEN),
            "option_layout": layout, "amp_dtype": amp}


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
