"""Load a checkpoint's `tokenizer/` with the raw `tokenizers` library, as transformers 5 would see it.

Upstream loads it with `AutoTokenizer.from_pretrained`, which reads `tokenizer.json` and then, from
`tokenizer_config.json` (+ `special_tokens_map.json` when the config has no `added_tokens_decoder`),
takes the special-token strings, the truncation side and `split_special_tokens`, drops the
truncation/padding baked into `tokenizer.json`, and ADDS any named or extra special token that
`tokenizer.json` does not register. Everything but that last step is reproduced here; a checkpoint
that needs it (or a tokenizer class that rebuilds the backend) is refused, because emulating it would
be a guess and a wrong guess shifts every token id silently.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

from tokenizers import AddedToken, Tokenizer

from laya_grpc.core.errors import CheckpointError
from laya_grpc.core.checkpoints.jsonfile import read_json_object

# Classes whose transformers-5 tokenizer is exactly the `tokenizer.json` backend (laya's own
# `_fix_tokenizer_config` rewrites "TokenizersBackend"/missing to "PreTrainedTokenizerFast").
_BACKEND_CLASSES = (None, "TokenizersBackend", "PreTrainedTokenizerFast")
# transformers' SPECIAL_TOKENS_ATTRIBUTES: named tokens it adds to the backend when missing.
_NAMED = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


@dataclass(frozen=True)
class ResolvedTokenizer:
    tokenizer: Tokenizer
    fingerprint: str          # sha256 of tokenizer.json bytes
    cls_token: str
    sep_token: str
    pad_token: str
    mask_token: str
    cls_id: int
    sep_id: int
    pad_id: int
    mask_id: int
    truncation_side: str      # where `truncation=True, max_length=48` cuts: "right" keeps the head


def _content(value) -> str | None:
    if value is None:
        return None
    if isinstance(value, dict):
        return value.get("content")
    return str(value)


def load_tokenizer(tokenizer_dir: str) -> ResolvedTokenizer:
    """Parse `tokenizer_dir` into a ready `Tokenizer` plus its resolved special tokens."""
    tok_file = os.path.join(tokenizer_dir, "tokenizer.json")
    cfg_file = os.path.join(tokenizer_dir, "tokenizer_config.json")
    try:
        with open(tok_file, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise CheckpointError(tok_file, "cannot read (%s)" % e) from None
    try:
        tok = Tokenizer.from_str(raw.decode("utf-8"))
    except Exception as e:  # the Rust parser raises plain Exception subclasses
        raise CheckpointError(tok_file, "not a tokenizers serialization (%s)" % e) from None
    cfg = read_json_object(cfg_file)
    if cfg.get("tokenizer_class") not in _BACKEND_CLASSES:
        raise CheckpointError(cfg_file, "tokenizer_class %r makes transformers rebuild the tokenizer instead of "
                              "reading tokenizer.json; only %s are supported"
                              % (cfg.get("tokenizer_class"), [c for c in _BACKEND_CLASSES if c]))
    specials = dict(cfg)
    map_file = os.path.join(tokenizer_dir, "special_tokens_map.json")
    if "added_tokens_decoder" not in cfg and os.path.exists(map_file):
        # transformers' legacy path: the map's entries override the config's
        specials.update(read_json_object(map_file))

    backend_decoder = tok.get_added_tokens_decoder()
    backend_added = {t.content for t in backend_decoder.values()}
    for idx, entry in (cfg.get("added_tokens_decoder") or {}).items():
        wanted = AddedToken(**entry) if isinstance(entry, dict) else None
        have = backend_decoder.get(int(idx))
        if wanted is None or have is None or repr(wanted) != repr(have):
            raise CheckpointError(cfg_file, "added_tokens_decoder entry %s (%r) differs from tokenizer.json's "
                                  "added tokens; transformers would re-add it" % (idx, entry))
    extra = specials.get("extra_special_tokens") or specials.get("additional_special_tokens") or []
    extra = list(extra.values()) if isinstance(extra, dict) else list(extra)
    for value in [specials.get(k) for k in _NAMED] + extra:
        content = _content(value)
        if content is not None and content not in backend_added:
            raise CheckpointError(tok_file, "special token %r from tokenizer_config.json is not an added token "
                                  "of tokenizer.json; transformers would add it and shift tokenization" % content)

    strings = {}
    ids = {}
    for name in ("cls_token", "sep_token", "pad_token", "mask_token"):
        content = _content(specials.get(name))
        if content is None:
            raise CheckpointError(cfg_file, "no %s; laya needs cls, sep, pad and mask tokens" % name)
        strings[name] = content
        ids[name] = tok.token_to_id(content)

    json_trunc = tok.truncation
    side = cfg.get("truncation_side") or (json_trunc or {}).get("direction") or "right"
    if side not in ("left", "right"):
        raise CheckpointError(cfg_file, "truncation_side must be 'left' or 'right', got %r" % side)
    # transformers disables tokenizer.json's own truncation/padding unless a call asks for them
    tok.no_truncation()
    tok.no_padding()
    tok.encode_special_tokens = bool(cfg.get("split_special_tokens", False))
    return ResolvedTokenizer(
        tokenizer=tok, fingerprint=hashlib.sha256(raw).hexdigest(),
        cls_token=strings["cls_token"], sep_token=strings["sep_token"],
        pad_token=strings["pad_token"], mask_token=strings["mask_token"],
        cls_id=ids["cls_token"], sep_id=ids["sep_token"], pad_id=ids["pad_token"], mask_id=ids["mask_token"],
        truncation_side=side)
