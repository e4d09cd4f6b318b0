"""Small, deterministic tokenizers shaped like the real Laya ones, for synthetic checkpoints.

`english()` mimics ModernBERT's byte-level BPE (special tokens `[UNK] [CLS] [SEP] [PAD] [MASK]`
at the end of the vocabulary, as in the real 50k vocabulary); `gemma()` mimics mmBERT's
Gemma tokenizer (`<pad>`=0, `<eos>`=1, `<bos>`=2, `<unk>`=3, `<mask>`=4, `▁` for spaces,
byte fallback). The merges are learned here by a plain BPE with a fixed tie order instead of
`tokenizers`' trainer, whose tie order is not guaranteed, so the same code gives the same
tokenizer.json everywhere (for one `tokenizers` version, which does the serialising).
Only the HF `tokenizers` library is used: no transformers.
"""
from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import dataclass

from tokenizers import AddedToken, Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import BPE

from . import synth_corpus


@dataclass(frozen=True)
class SynthTokenizer:
    """A built tokenizer plus the strings/ids Laya reads from it."""
    tokenizer_json: str           # tokenizer.json text
    tokenizer_config: dict        # tokenizer_config.json content (post-`_fix_tokenizer_config` form)
    special_tokens_map: dict      # special_tokens_map.json content
    size: int                     # number of ids the tokenizer can emit
    cls_id: int
    sep_id: int
    pad_id: int
    mask_id: int


def learn_merges(words: Counter, base: list[str], n_merges: int) -> list[tuple[str, str]]:
    """Plain BPE over `words` (symbol string -> frequency): merge the most frequent adjacent pair,
    ties broken by the smaller pair, until `n_merges` or no pair is left."""
    seqs = [list(w) for w in sorted(words)]
    freqs = [words[w] for w in sorted(words)]
    pair_count: Counter = Counter()
    where: dict[tuple[str, str], set[int]] = {}
    for i, s in enumerate(seqs):
        for p in zip(s, s[1:]):
            pair_count[p] += freqs[i]
            where.setdefault(p, set()).add(i)
    heap = [(-c, p) for p, c in pair_count.items()]
    heapq.heapify(heap)
    known = set(base)
    merges: list[tuple[str, str]] = []
    while heap and len(merges) < n_merges:
        neg, pair = heapq.heappop(heap)
        if pair_count.get(pair, 0) != -neg:
            continue  # stale entry; the current count was pushed when it changed
        merged = pair[0] + pair[1]
        merges.append(pair)
        known.add(merged)
        touched: set[tuple[str, str]] = set()
        for i in sorted(where.pop(pair, ())):
            s, f = seqs[i], freqs[i]
            for p in zip(s, s[1:]):
                pair_count[p] -= f
                touched.add(p)
            out, j = [], 0
            while j < len(s):
                if j + 1 < len(s) and s[j] == pair[0] and s[j + 1] == pair[1]:
                    out.append(merged)
                    j += 2
                else:
                    out.append(s[j])
                    j += 1
            seqs[i] = out
            for p in zip(out, out[1:]):
                pair_count[p] += f
                touched.add(p)
                where.setdefault(p, set()).add(i)
        pair_count.pop(pair, None)
        for p in touched:
            c = pair_count.get(p, 0)
            if c > 0:
                heapq.heappush(heap, (-c, p))
            else:
                pair_count.pop(p, None)
    return merges


def _vocab_from(base: list[str], merges: list[tuple[str, str]], first_id: int) -> dict[str, int]:
    vocab: dict[str, int] = {}
    for tok in base + [a + b for a, b in merges]:
        if tok not in vocab:
            vocab[tok] = first_id + len(vocab)
    return vocab


def _added(content: str, id_: int, lstrip: bool = False) -> dict:
    return {"id": id_, "content": content, "single_word": False, "lstrip": lstrip,
            "rstrip": False, "normalized": False, "special": True}


def _config(added: list[dict], special: dict[str, str], extra: dict | None, max_len: int) -> dict:
    """tokenizer_config.json as transformers 5 writes it, after laya's `_fix_tokenizer_config`."""
    cfg: dict = {"added_tokens_decoder": {str(a["id"]): {k: v for k, v in a.items() if k != "id"}
                                          for a in added}}
    cfg["clean_up_tokenization_spaces"] = False
    for key in ("bos_token", "cls_token", "eos_token", "mask_token", "pad_token", "sep_token", "unk_token"):
        if key in special:
            cfg[key] = special[key]
    if extra:
        cfg["extra_special_tokens"] = extra
    cfg["model_input_names"] = ["input_ids", "attention_mask"]
    cfg["model_max_length"] = max_len
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    return cfg


def english(n_merges: int = 760, max_len: int = 8192) -> SynthTokenizer:
    """ModernBERT-like byte-level BPE; special tokens take the last five ids."""
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet(), key=lambda ch: _byte_of(ch))
    words = Counter(piece for line in synth_corpus.ENGLISH.splitlines(keepends=True)
                    for piece, _ in byte_level.pre_tokenize_str(line))
    merges = learn_merges(words, alphabet, n_merges)
    vocab = _vocab_from(alphabet, merges, 0)
    names = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]
    ids = {name: len(vocab) + i for i, name in enumerate(names)}
    tok = Tokenizer(BPE(vocab=vocab, merges=merges, dropout=None, unk_token=None,
                        continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False,
                        byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", ids["[CLS]"]), ("[SEP]", ids["[SEP]"])])
    added = [_added(n, ids[n], lstrip=(n == "[MASK]")) for n in names]
    tok.add_special_tokens([AddedToken(a["content"], lstrip=a["lstrip"], rstrip=False,
                                       normalized=False, special=True) for a in added])
    special = {"cls_token": "[CLS]", "mask_token": "[MASK]", "pad_token": "[PAD]",
               "sep_token": "[SEP]", "unk_token": "[UNK]"}
    return _finish(tok, added, special, None, max_len, ids["[CLS]"], ids["[SEP]"], ids["[PAD]"],
                   ids["[MASK]"])


def gemma(n_merges: int = 900, max_len: int = 8192) -> SynthTokenizer:
    """mmBERT/Gemma-like BPE: spaces become `▁`, no pre-tokenizer, unknown characters fall back
    to `<0xNN>` byte tokens."""
    names = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>"]
    specials = {n: i for i, n in enumerate(names)}
    byte_tokens = ["<0x%02X>" % b for b in range(256)]
    text = synth_corpus.MULTILINGUAL
    words = Counter("▁" + w for w in text.split())
    chars = sorted({ch for w in words for ch in w})
    merges = learn_merges(words, chars, n_merges)
    vocab = dict(specials)
    for t in byte_tokens:
        vocab[t] = len(vocab)
    vocab.update(_vocab_from(chars, merges, len(vocab)))
    tok = Tokenizer(BPE(vocab=vocab, merges=merges, dropout=None, unk_token="<unk>", fuse_unk=True,
                        byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse()])
    tok.post_processor = processors.TemplateProcessing(
        single="<bos>:0 $A:0 <eos>:0", pair="<bos>:0 $A:0 <eos>:0 $B:1 <eos>:1",
        special_tokens=[("<bos>", specials["<bos>"]), ("<eos>", specials["<eos>"])])
    added = [_added(n, specials[n]) for n in names]
    tok.add_special_tokens([AddedToken(n, lstrip=False, rstrip=False, normalized=False, special=True)
                            for n in names])
    special = {"bos_token": "<bos>", "cls_token": "<bos>", "eos_token": "<eos>", "mask_token": "<mask>",
               "pad_token": "<pad>", "sep_token": "<eos>", "unk_token": "<unk>"}
    extra = {"extra_0": "<start_of_turn>", "extra_1": "<end_of_turn>"}
    return _finish(tok, added, special, extra, max_len, specials["<bos>"], specials["<eos>"],
                   specials["<pad>"], specials["<mask>"])


def _finish(tok: Tokenizer, added, special, extra, max_len, cls_id, sep_id, pad_id, mask_id):
    smap = dict(special)
    if extra:
        smap["additional_special_tokens"] = list(extra.values())
    return SynthTokenizer(tokenizer_json=tok.to_str(pretty=True),
                          tokenizer_config=_config(added, special, extra, max_len),
                          special_tokens_map=smap, size=tok.get_vocab_size(with_added_tokens=True),
                          cls_id=cls_id, sep_id=sep_id, pad_id=pad_id, mask_id=mask_id)


def _byte_of(ch: str) -> int:
    """Byte value a GPT-2 byte-level alphabet character stands for (orders the base vocabulary)."""
    return _BYTE_OF[ch]


def _gpt2_bytes_to_unicode() -> dict[str, int]:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


_BYTE_OF = _gpt2_bytes_to_unicode()

