"""Fast, exact token ids for long texts: cut at provably neutral spaces, encode the pieces in parallel.

`Tokenizer.encode_batch` of one long text runs on one core. For the configurations allow-listed
below, cutting the text just before a space whose left neighbour is a printable ASCII character
and whose right neighbour is an ASCII letter or digit changes nothing: the ids of the whole text
are the concatenation of the ids of the pieces (so the count is the sum). The pieces of all texts
of a call then go through ONE `encode_batch_fast` (the same pipeline minus offset tracking, which
ids never depend on), which runs them on the Rust (rayon) threads.

Why such a cut `p` is neutral (text[p-1] in `!`..`~`, text[p] == " ", text[p+1] in [A-Za-z0-9]):

* added tokens are found first, on the raw text (or, `normalized=True`, on the normalized pieces):
  we require every added token's content (and normalized content) to be non-empty and free of
  whitespace, so no match contains the space at `p`; no `rstrip` token (it would swallow the space
  into a match that ends at `p`); an `lstrip` token starting at `p+1` takes the space at `p` in both
  the whole text and the piece, and cannot reach further left (text[p-1] is not whitespace);
  `single_word` sees a space (whole text) or the text's end (piece) after `p-1`: both boundaries.
* normalizers: NFC/NFD/NFKC/NFKD have a normalization boundary before U+0020 (a starter that
  never composes with what precedes it), Lowercase is per character; their output at p-1..p+1 is
  the same ASCII. Strip, Prepend, Replace, Precompiled, BertNormalizer, ... are not allowed.
* "words" mode, pre_tokenizer ByteLevel with the GPT-2 regex
  `'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+`: no alternative
  has whitespace except as an optional FIRST character or in a whitespace run, so a match starting
  before `p` ends at or before `p` (text[p-1] is not whitespace); the only lookahead, `(?!\\S)`,
  ends whitespace runs, and no whitespace run ends at `p`; there is no lookbehind, so the match at
  `p` (" " + letters or digits) and all later ones depend only on text[p:]. The pre-tokenized
  words are therefore identical, and BPE runs per word. `add_prefix_space` only prepends to a
  split not starting with " ": the piece starts with " " and the whole text has no split at `p`.
* "sentencepiece" mode, no pre_tokenizer, normalizer exactly Replace(" " -> "▁"): the whole
  text is ONE BPE word. The symbol left of `p` ends in text[p-1] (or a byte-fallback `<0x..>`),
  never "▁"; the symbol right of it starts with "▁" (which must be in the vocabulary, so it is
  never unk/byte-fallback and never fused with an unk). We require that no merge joins a left
  part not ending in "▁" to a right part starting with "▁": then the pair across `p` is never
  mergeable, every merge happens on one side, and BPE's lowest-rank-first order restricted to one
  side is that side's own order. `continuing_subword_prefix`/`end_of_word_suffix` (per word) and
  `ignore_merges` (whole-word vocabulary lookup) would break this and are refused.

BPE `dropout` must be off; the post-processor must be one of the built-ins that add nothing with
`add_special_tokens=False` (Template/Bert/Roberta/ByteLevel). Anything else (other models, pre-tokenizers, normalizers) is encoded
whole, with a log line at load saying why. Independently of splitting, texts that are entirely
ASCII skip a Unicode-normal-form normalizer (NFC/NFD/NFKC/NFKD are the identity on ASCII) through
a normalizer-free copy of the tokenizer, when no `normalized=True` added token has non-ASCII
content (such content could normalize to ASCII, e.g. U+212A KELVIN SIGN -> "K").
"""
from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from typing import Optional

from tokenizers import Tokenizer

from laya_grpc.core.runtime import cpu_quota, flags

log = logging.getLogger("laya_grpc.tokenizer")

GPT2_REGEX_MODE = "words"
SENTENCEPIECE_MODE = "sentencepiece"

# Below MIN_SPLIT_CHARS a text is encoded whole; longer ones are cut into pieces of about
# PIECE_CHARS, at most one per rayon thread. Measured with benchmarks/tokenize_speed.py --sweep on
# the 16-core H200 host: splitting loses or ties up to ~1,250 chars (thread wake-ups), wins from
# ~1,500 (2,000 chars: 0.41 vs 0.70 ms unsplit); 512-char pieces beat 1,024 on the t512 case.
MIN_SPLIT_CHARS = 1536
PIECE_CHARS = 512

_UNICODE_FORMS = ("NFC", "NFD", "NFKC", "NFKD")
_WORDS_NORMALIZERS = _UNICODE_FORMS + ("Lowercase",)
_NEUTRAL_POST = (None, "TemplateProcessing", "BertProcessing", "RobertaProcessing", "ByteLevel")
_CUT = re.compile(r"[!-~] (?=[A-Za-z0-9])")   # the space of a match is a neutral cut
_FALSY = ("", "off", "false", "f", "no", "n", "0")   # tokenizers' own TOKENIZERS_PARALLELISM parsing


@dataclass(frozen=True)
class Policy:
    mode: Optional[str]        # GPT2_REGEX_MODE, SENTENCEPIECE_MODE or None (encode whole)
    reason: str


# -- load-time analysis -------------------------------------------------------------------------

def _steps(node: Optional[dict], key: str) -> list:
    """A normalizer/pre-tokenizer/post-processor as its list of steps (Sequence flattened)."""
    if node is None:
        return []
    if node.get("type") == "Sequence":
        return [s for child in node.get(key) or [] for s in _steps(child, key)]
    return [node]


def _added_tokens_problem(cfg: dict, tok: Tokenizer) -> Optional[str]:
    for t in cfg.get("added_tokens") or []:
        content = t.get("content") or ""
        normalized = tok.normalizer.normalize_str(content) if t.get("normalized") and tok.normalizer else content
        if not content or any(c.isspace() for c in content + normalized):
            return "added token %r is empty or contains whitespace" % content
        if t.get("rstrip"):
            return "added token %r has rstrip=True (it would take the space at a cut)" % content
    return None


def _normalizer_problem(cfg: dict, allowed: tuple) -> Optional[str]:
    for step in _steps(cfg.get("normalizer"), "normalizers"):
        if step.get("type") not in allowed:
            return "normalizer %s is not known to keep a cut before a space neutral" % step.get("type")
    return None


def _words_problem(cfg: dict) -> Optional[str]:
    pre = _steps(cfg.get("pre_tokenizer"), "pretokenizers")
    if len(pre) != 1 or pre[0].get("type") != "ByteLevel":
        return "pre_tokenizer is not a single ByteLevel"
    if not pre[0].get("use_regex", True):
        return "ByteLevel has use_regex=false (the whole text is one word)"
    return _normalizer_problem(cfg, _WORDS_NORMALIZERS)


def _sentencepiece_problem(cfg: dict) -> Optional[str]:
    norm = _steps(cfg.get("normalizer"), "normalizers")
    if len(norm) != 1 or norm[0].get("type") != "Replace" or norm[0].get("pattern") != {"String": " "} \
            or norm[0].get("content") != "\u2581":
        return "no pre_tokenizer and the normalizer is not exactly Replace(' ' -> '\u2581')"
    model = cfg["model"]
    if model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        return "BPE with a subword prefix/suffix (applied per word, and the text is one word)"
    if model.get("ignore_merges"):
        return "BPE ignore_merges=true (a whole-word vocabulary lookup)"
    if "\u2581" not in (model.get("vocab") or {}):
        return "'\u2581' is not in the vocabulary"
    for merge in model.get("merges") or []:
        left, right = merge.split(" ", 1) if isinstance(merge, str) else merge
        if right.startswith("\u2581") and not left.endswith("\u2581"):
            return "merge %r + %r joins across a space" % (left, right)
    return None


def _config(tok: Tokenizer) -> dict:
    return json.loads(tok.to_str())


def analyse(tok: Tokenizer, cfg: Optional[dict] = None) -> Policy:
    """Which split mode, if any, is exact for this tokenizer (from its serialized config)."""
    cfg = _config(tok) if cfg is None else cfg
    model = cfg.get("model") or {}
    if model.get("type") != "BPE":
        return Policy(None, "model %s is not analysed (only BPE)" % model.get("type"))
    if model.get("dropout"):
        return Policy(None, "BPE dropout is random")
    problem = _added_tokens_problem(cfg, tok)
    if problem is None:
        post = [s.get("type") for s in _steps(cfg.get("post_processor"), "processors")]
        if any(t not in _NEUTRAL_POST for t in post):
            problem = "post_processor %s is not analysed" % post
    if problem is not None:
        return Policy(None, problem)
    if cfg.get("pre_tokenizer") is None and cfg.get("normalizer") is not None:
        problem = _sentencepiece_problem(cfg)
        return Policy(None, problem) if problem else Policy(SENTENCEPIECE_MODE, "one BPE word, no merge across '\u2581'")
    problem = _words_problem(cfg)
    return Policy(None, problem) if problem else Policy(GPT2_REGEX_MODE, "ByteLevel GPT-2 regex words")


def ascii_twin(tok: Tokenizer, cfg: Optional[dict] = None) -> Optional[Tokenizer]:
    """`tok` without its normalizer when that normalizer is the identity on ASCII text, else None.
    (`cfg`, the parsed serialized tokenizer, is modified.)"""
    cfg = _config(tok) if cfg is None else cfg
    steps = _steps(cfg.get("normalizer"), "normalizers")
    if not steps or any(s.get("type") not in _UNICODE_FORMS for s in steps):
        return None
    if any(t.get("normalized") and not (t.get("content") or "").isascii() for t in cfg.get("added_tokens") or []):
        return None
    cfg["normalizer"] = None
    twin = Tokenizer.from_str(json.dumps(cfg))
    twin.encode_special_tokens = tok.encode_special_tokens
    return twin


def rayon_threads() -> int:
    """How many threads `encode_batch` can use: 1 when TOKENIZERS_PARALLELISM turns it off, else
    rayon's RAYON_NUM_THREADS (or legacy RAYON_RS_NUM_CPUS), else the CPUs this process may use
    (affinity mask and cgroup quota, as rayon's own default counts them)."""
    if flags.external("TOKENIZERS_PARALLELISM", "true").lower() in _FALSY:
        return 1
    for name in ("RAYON_NUM_THREADS", "RAYON_RS_NUM_CPUS"):
        value = flags.external(name) or ""
        if value.isdigit():
            if int(value) > 0:
                return int(value)
            break   # rayon: an explicit 0 means its default
    return cpu_quota.available_cpus()


# -- cutting and encoding -----------------------------------------------------------------------

def cut_points(text: str, pieces: int) -> list[int]:
    """Up to `pieces - 1` neutral cut positions (text[p] == " "), near i * len / pieces, increasing."""
    n, cuts, last = len(text), [], 0
    for i in range(1, pieces):
        m = _CUT.search(text, max(i * n // pieces, last + 1) - 1)
        if m is None:
            break
        last = m.start() + 1
        cuts.append(last)
    return cuts


def split_text(text: str, pieces: int) -> list[str]:
    bounds = [0] + cut_points(text, pieces) + [len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:])]


class WholeTextEncoder:
    """The reference the fast path must equal: one `encode_batch` of each whole text (what
    encoding.py did before split encoding; kept for tests and benchmarks/tokenize_speed.py)."""

    def __init__(self, tok: Tokenizer):
        self.tok = tok

    def encode(self, texts: list[str], lazy: bool = False) -> list[list[int]]:
        return [e.ids for e in self.tok.encode_batch(texts, add_special_tokens=False)] if texts else []


class FastEncoder:
    """`encode(texts)` == `WholeTextEncoder(tok).encode(texts)`, faster (module docstring)."""

    def __init__(self, tok: Tokenizer, name: str = "", *, min_split_chars: int = MIN_SPLIT_CHARS,
                 piece_chars: int = PIECE_CHARS, max_pieces: Optional[int] = None):
        self.tok = tok
        cfg = _config(tok)   # serialized and parsed once (a large vocabulary takes a while)
        self.policy = analyse(tok, cfg)
        self.twin = ascii_twin(tok, cfg)   # last: it edits cfg
        self.min_split_chars, self.piece_chars = min_split_chars, piece_chars
        self.max_pieces = max_pieces if max_pieces is not None else rayon_threads()
        self._batch = getattr(tok, "encode_batch_fast", tok.encode_batch)
        self._twin_batch = getattr(self.twin, "encode_batch_fast", None) if self.twin else None
        if self.policy.mode is None:
            log.info("tokenizer %s: long texts are encoded whole (%s)", name, self.policy.reason)
        else:
            log.info("tokenizer %s: long texts are split for parallel encoding (%s; up to %d pieces)",
                     name, self.policy.reason, self.max_pieces)

    @property
    def splits(self) -> bool:
        return self.policy.mode is not None and self.max_pieces > 1

    def pieces_for(self, text: str) -> int:
        if not self.splits or len(text) < self.min_split_chars:
            return 1
        return min(self.max_pieces, -(-len(text) // self.piece_chars))

    def encode(self, texts: list[str], lazy: bool = False) -> list:
        """The ids of each text; `lazy`: a split text's as `PieceIds` (sliced on demand), not a list."""
        if not texts:
            return []
        pieces: list[str] = []
        counts: list[int] = []
        for text in texts:
            k = self.pieces_for(text)
            part = split_text(text, k) if k > 1 else [text]
            pieces.extend(part)
            counts.append(len(part))
        batch = self._batch
        if self._twin_batch is not None and all(p.isascii() for p in pieces):
            batch = self._twin_batch
        encoded = batch(pieces, add_special_tokens=False)
        if len(pieces) == len(texts):
            return [e.ids for e in encoded]
        out, i = [], 0
        for k in counts:
            ids = PieceIds(encoded[i:i + k]) if k > 1 else encoded[i].ids
            out.append(ids if lazy or k == 1 else ids[:])
            i += k
        return out


class PieceIds:
    """A split text's ids: the length at once, Python ints only for the slices asked for (a row
    keeps at most max_len of a long state's tokens)."""
    __slots__ = ("_encodings", "_starts", "_lists")

    def __init__(self, encodings: list):
        starts = [0]
        for e in encodings:
            starts.append(starts[-1] + len(e))
        self._encodings, self._starts, self._lists = encodings, starts, [None] * len(encodings)

    def __len__(self) -> int:
        return self._starts[-1]

    def __getitem__(self, index: slice) -> list[int]:
        if not isinstance(index, slice) or index.step not in (None, 1):
            raise TypeError("PieceIds supports contiguous slices only")
        a, b, _ = index.indices(len(self))
        out: list[int] = []
        for i, (s, t) in enumerate(zip(self._starts, self._starts[1:])):
            if s < b and t > a:
                ids = self._lists[i]
                if ids is None:
                    ids = self._lists[i] = self._encodings[i].ids
                out += ids[max(a - s, 0):b - s]
        return out
