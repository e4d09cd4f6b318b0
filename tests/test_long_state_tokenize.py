"""Split encoding of long texts (tokenizer/split_encode.py) gives exactly the whole-text ids.

Random long texts (words, punctuation, digits, runs of spaces, tabs/newlines, accents composed and
decomposed, CJK, emoji, the special-token strings) are encoded with cuts as dense as possible and
compared with one `encode_batch` of each whole text, for the tiny, tiny-ml and tiny-par tokenizers
and for allow-listed variants of their tokenizer.json; variants outside the allow-list must fall back
to whole-text encoding (and for several of them a cut would indeed change the ids). Full rows and
usage are compared with upstream laya through test_tokenization_parity's helpers.
"""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest

from laya_grpc.core.decisions.questions import parse_questions
from laya_grpc.tokenizer import split_encode
from laya_grpc.tokenizer.encoding import EncodeJob, TextEncoder
from laya_grpc.tokenizer.special_tokens import load_tokenizer
from laya_grpc.tokenizer.split_encode import FastEncoder, PieceIds, WholeTextEncoder, cut_points, split_text

from tokenizers import Tokenizer

WORDS = ("the customer order refund parcel was charged twice and wants money back today please help "
         "account invoice delivery broken screen address password login error").split()
PUNCT = (".", ",", "!", "?", ";", ":", "'s", "'t", "'re", "'ll", "n't", "--", "...", "(", ")", '"', "'", "/", "-",
         "#", "$5", "@", "&", "{", "}", "[", "]", "_", "*")
UNICODE = ("café", "cafe\u0301", "naïve", "Ünïcödé", "日本語のテキスト", "中文", "😀", "👍🏽", "🎉", "ñandú", "\u212a",
           "\u00a0", "\u2003", "Ω", "\u2581", "ǅ", "ß", "İ", "ΣΑΣ", "\u0301", "한국어", "\ufeff", "\u200b")
SPECIALS = ("[SEP]", "[CLS]", "[MASK]", "[PAD]", "[UNK]", "<bos>", "<eos>", "<mask>", "<pad>", "<unk>",
            "<start_of_turn>", "<end_of_turn>")
SEPARATORS = (" ",) * 12 + ("  ", "   ", "\t", "\n", "\n\n", " \n ", "", "\r\n", "\u3000", " \t")

# cuts as dense as the rule allows, whatever this machine's core count
DENSE = dict(max_pieces=64, piece_chars=40, min_split_chars=0)


def random_text(rng: random.Random, chars: int, ascii_only: bool = False) -> str:
    kinds = ["word"] * 10 + ["Word", "digits", "punct", "punct"] + ([] if ascii_only else ["unicode", "special"])
    out, n = [], 0
    while n < chars:
        kind = rng.choice(kinds)
        atom = {"word": lambda: rng.choice(WORDS), "Word": lambda: rng.choice(WORDS).upper(),
                "digits": lambda: str(rng.randint(0, 10 ** rng.randint(1, 9))), "punct": lambda: rng.choice(PUNCT),
                "unicode": lambda: rng.choice(UNICODE), "special": lambda: rng.choice(SPECIALS)}[kind]()
        sep = rng.choice(SEPARATORS) if not ascii_only else rng.choice([s for s in SEPARATORS if s.isascii()])
        out.append(atom + sep)
        n += len(atom) + len(sep)
    return "".join(out)


def texts(seed: int, n: int = 24) -> list[str]:
    rng = random.Random(seed)
    return [random_text(rng, rng.randint(300, 9000), ascii_only=i % 3 == 0) for i in range(n)]


def whole(tok: Tokenizer, batch: list[str]) -> list[list[int]]:
    return WholeTextEncoder(tok).encode(batch)


def naive_cut_ids(tok: Tokenizer, text: str) -> list[int]:
    """The cut encoding done blindly, without the allow-list: what a refused config would get."""
    return [i for e in tok.encode_batch(split_text(text, 64), add_special_tokens=False) for i in e.ids]


def assert_exact(fast: FastEncoder, batch: list[str]) -> None:
    want = whole(fast.tok, batch)
    assert fast.encode(batch) == want
    for text, ids in zip(batch, want):   # one at a time too: other texts must not matter
        assert fast.encode([text]) == [ids]
        assert fast.tok.encode(text, add_special_tokens=False).ids == ids


@pytest.fixture(scope="module")
def tokenizer_dirs(tiny_ckpt, tiny_ml_ckpt, tiny_par_ckpt) -> dict:
    return {p: os.path.join(d, "tokenizer") for p, d in
            (("tiny", tiny_ckpt), ("tiny-ml", tiny_ml_ckpt), ("tiny-par", tiny_par_ckpt))}


def config(tokenizer_dir: str) -> dict:
    with open(os.path.join(tokenizer_dir, "tokenizer.json"), encoding="utf-8") as f:
        return json.load(f)


def build(cfg: dict, encode_special_tokens: bool = False) -> Tokenizer:
    tok = Tokenizer.from_str(json.dumps(cfg))
    tok.encode_special_tokens = encode_special_tokens
    return tok


def add_token(cfg: dict, content: str, **flags) -> None:
    entry = {"id": 1 + max(t["id"] for t in cfg["added_tokens"]), "content": content, "single_word": False,
             "lstrip": False, "rstrip": False, "normalized": False, "special": False}
    entry.update(flags)
    cfg["added_tokens"].append(entry)


# -- the checkpoints' own tokenizers ------------------------------------------------------------

@pytest.mark.parametrize("preset,mode", [("tiny", "words"), ("tiny-ml", "sentencepiece"), ("tiny-par", "words")])
def test_checkpoint_tokenizers_split_exactly(tokenizer_dirs, preset, mode):
    tok = load_tokenizer(tokenizer_dirs[preset]).tokenizer
    fast = FastEncoder(tok, preset, **DENSE)
    assert fast.policy.mode == mode
    batch = texts(seed=len(preset))
    assert sum(len(cut_points(t, 64)) for t in batch) > 500   # the comparison below does cut
    assert_exact(fast, batch)


@pytest.mark.parametrize("preset", ["tiny", "tiny-ml"])
def test_default_settings_and_ascii_twin(tokenizer_dirs, preset):
    """The service's own settings (threshold, piece size, this machine's threads), and the
    normalizer-free twin on all-ASCII batches (English tokenizer only: NFC is identity on ASCII)."""
    fast = FastEncoder(load_tokenizer(tokenizer_dirs[preset]).tokenizer, preset, max_pieces=8)
    assert (fast.twin is not None) == (preset == "tiny")
    rng = random.Random(5)
    ascii_batch = [random_text(rng, n, ascii_only=True) for n in (50, 1535, 1536, 5000, 20000)]
    assert all(t.isascii() for t in ascii_batch)
    assert fast.pieces_for(ascii_batch[-1]) == 8
    assert_exact(fast, ascii_batch)
    assert_exact(fast, ascii_batch + ["non-ASCII café " * 300])


def test_piece_ids_slices_equal_list_slices(tokenizer_dirs):
    tok = load_tokenizer(tokenizer_dirs["tiny"]).tokenizer
    fast = FastEncoder(tok, "tiny", **DENSE)
    text = texts(seed=11, n=1)[0] * 3
    lazy, = fast.encode([text], lazy=True)
    full = whole(tok, [text])[0]
    assert isinstance(lazy, PieceIds) and len(lazy) == len(full)
    rng = random.Random(0)
    n = len(full)
    for _ in range(300):
        a, b = rng.randint(-n - 5, n + 5), rng.randint(-n - 5, n + 5)
        assert lazy[a:b] == full[a:b]
        assert lazy[:b] == full[:b] and lazy[a:] == full[a:]
    assert lazy[:] == full
    with pytest.raises(TypeError):
        lazy[3]


def test_cut_points_follow_the_rule():
    rng = random.Random(1)
    for _ in range(200):
        text = random_text(rng, rng.randint(1, 3000))
        k = rng.randint(1, 40)
        cuts = cut_points(text, k)
        assert len(cuts) <= k - 1 and cuts == sorted(set(cuts))
        for p in cuts:
            assert text[p] == " " and "!" <= text[p - 1] <= "~" and text[p + 1].isascii() and text[p + 1].isalnum()
        assert "".join(split_text(text, k)) == text
    assert cut_points("日本語のテキスト" * 500, 8) == []          # no neutral space: one piece
    assert cut_points("a  b\tc \nd", 4) == []                  # runs and other whitespace are never cut


# -- allow-listed variants ---------------------------------------------------------------------

def _english_variants(cfg: dict) -> dict:
    out = {}

    def variant(name, edit, **kw):
        c = json.loads(json.dumps(cfg))
        edit(c)
        out[name] = (c, kw)
    variant("add_prefix_space", lambda c: c["pre_tokenizer"].update(add_prefix_space=True))
    variant("no_normalizer", lambda c: c.update(normalizer=None))
    variant("nfkc", lambda c: c.update(normalizer={"type": "NFKC"}))
    variant("nfd_lowercase", lambda c: c.update(normalizer={"type": "Sequence", "normalizers": [
        {"type": "NFD"}, {"type": "Lowercase"}]}))
    variant("sequence_bytelevel", lambda c: c.update(pre_tokenizer={"type": "Sequence", "pretokenizers": [
        dict(c["pre_tokenizer"], add_prefix_space=True)]}))
    variant("lstrip_word_token", lambda c: add_token(c, "refund", lstrip=True))
    variant("single_word_token", lambda c: add_token(c, "order", single_word=True, normalized=True))
    variant("normalized_specials", lambda c: [t.update(normalized=True) for t in c["added_tokens"]])
    variant("kelvin_token", lambda c: add_token(c, "\u212a", normalized=True))
    variant("split_special_tokens", lambda c: None, encode_special_tokens=True)
    return out


def test_allow_listed_variants_split_exactly(tokenizer_dirs):
    base = config(tokenizer_dirs["tiny"])
    batch = texts(seed=3, n=12) + ["we refund  refund\trefund order, order's ORDER K \u212a k" * 60]
    for name, (cfg, kw) in _english_variants(base).items():
        fast = FastEncoder(build(cfg, **kw), name, **DENSE)
        assert fast.policy.mode == "words", (name, fast.policy)
        assert_exact(fast, batch)


def test_ascii_twin_refused_when_a_normalized_token_is_not_ascii(tokenizer_dirs):
    """U+212A KELVIN SIGN, normalized: NFC makes it "K", so it matches plain ASCII "K" text; a
    normalizer-free twin would miss it. The twin must be off, and would indeed be wrong."""
    cfg = config(tokenizer_dirs["tiny"])
    add_token(cfg, "\u212a", normalized=True)
    tok = build(cfg)
    fast = FastEncoder(tok, "kelvin", **DENSE)
    assert fast.twin is None
    text = "OK Kelvin K " * 400
    assert_exact(fast, [text])
    cfg["normalizer"] = None
    assert build(cfg).encode(text, add_special_tokens=False).ids != whole(tok, [text])[0]


# -- configurations that must fall back --------------------------------------------------------

def _refused(tokenizer_dirs) -> dict:
    en, ml = config(tokenizer_dirs["tiny"]), config(tokenizer_dirs["tiny-ml"])
    out = {}

    def variant(name, base, edit):
        c = json.loads(json.dumps(base))
        edit(c)
        out[name] = c

    def cross_merge(c):
        c["model"]["vocab"]["s\u2581"] = len(c["model"]["vocab"]) + 100
        c["model"]["merges"].insert(0, ["s", "\u2581"])
    variant("strip_normalizer", en, lambda c: c.update(normalizer={"type": "Strip", "strip_left": True,
                                                                    "strip_right": True}))
    variant("rstrip_token", en, lambda c: add_token(c, "refund", rstrip=True))
    variant("space_in_token", en, lambda c: add_token(c, "money back"))
    variant("no_regex", en, lambda c: c["pre_tokenizer"].update(use_regex=False))
    variant("whitespace_pre_tokenizer", en, lambda c: c.update(pre_tokenizer={"type": "Whitespace"}))
    variant("replace_normalizer", en, lambda c: c.update(normalizer={"type": "Replace", "pattern": {"String": "e"},
                                                                     "content": "E"}))
    variant("dropout", en, lambda c: c["model"].update(dropout=0.5))
    variant("ml_prepend", ml, lambda c: c.update(normalizer={"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "\u2581"}, c["normalizer"]]}))
    variant("ml_cross_space_merge", ml, cross_merge)
    variant("ml_end_of_word_suffix", ml, lambda c: c["model"].update(end_of_word_suffix="</w>"))
    variant("ml_metaspace", ml, lambda c: c.update(normalizer=None, pre_tokenizer={
        "type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True}))
    return out


def test_refused_configurations_fall_back_to_whole_text(tokenizer_dirs):
    batch = texts(seed=4, n=6) + ["this is the refund order. " * 200]
    harmful = set()
    for name, cfg in _refused(tokenizer_dirs).items():
        tok = build(cfg)
        fast = FastEncoder(tok, name, **DENSE)
        assert fast.policy.mode is None, name
        assert all(fast.pieces_for(t) == 1 for t in batch)
        if name != "dropout":   # BPE dropout is random: no two encodes agree anyway
            assert_exact(fast, batch)
            if any(naive_cut_ids(tok, t) != whole(tok, [t])[0] for t in batch):
                harmful.add(name)
    # for these the cut is not just unproven but wrong: the allow-list is what keeps ids exact
    assert {"strip_normalizer", "rstrip_token", "ml_prepend", "ml_cross_space_merge", "ml_end_of_word_suffix"} <= harmful


# -- through the TextEncoder ---------------------------------------------------------------------

QUESTIONS = parse_questions({
    "team": {"type": "choice", "instructions": "Which team should handle this?",
             "criteria": {"billing": "Charges and refunds", "technical": "Software problems"}},
    "urgency": {"type": "score", "instructions": "How urgent?", "criteria": ["low", "mid", "high"]},
    "refund": {"type": "noul", "instructions": "Does the customer ask for a refund?"}})


def _states(seed: int) -> list:
    rng = random.Random(seed)
    out = []
    for i in range(10):
        if i % 3 == 0:
            out.append([{"role": rng.choice(["user", "agent"]), "text": random_text(rng, rng.randint(50, 900))}
                        for _ in range(rng.randint(2, 20))])
        elif i % 3 == 1:
            out.append({"subject": random_text(rng, 40), "body": random_text(rng, rng.randint(500, 6000))})
        else:
            out.append(random_text(rng, rng.randint(100, 12000)))
    return out


@pytest.mark.parametrize("preset", ["tiny", "tiny-ml", "tiny-par"])
def test_encode_jobs_equal_whole_text_path(tokenizer_dirs, preset):
    """Rows, markers and usage of many jobs (str, dict and list states; left truncation) equal the
    whole-text path's, with dense cuts and lazily sliced ids."""
    kw = dict(max_len=512, head_max_len=192, parallel_layout=preset == "tiny-par")
    new, old = TextEncoder(tokenizer_dirs[preset], **kw), TextEncoder(tokenizer_dirs[preset], **kw)
    new._fast = FastEncoder(new._fast.tok, preset, **DENSE)
    old._fast = WholeTextEncoder(old._fast.tok)
    states = _states(seed=8)
    jobs = [EncodeJob(states[:4], QUESTIONS), EncodeJob(states[4:], QUESTIONS, 2000, 64),
            EncodeJob(states[2:5], QUESTIONS[:1], 128, None), EncodeJob(states[:2], [])]
    got, want = new.encode_jobs(jobs), old.encode_jobs(jobs)
    assert got == want
    assert any(e.usage.truncated for e in got[0]) and any(isinstance(s, list) for s in states[:4])


# -- against upstream laya -----------------------------------------------------------------------

try:
    import laya  # noqa: F401
except ImportError:   # the parity module skips itself without it; the tests above still run
    laya = None
if laya is not None:   # tests/ is on sys.path under pytest
    from test_tokenization_parity import BASIC, _assert_rows_equal, _upstream, pair  # noqa: E402,F401


@pytest.mark.skipif(laya is None, reason="upstream laya is not installed")
def test_rows_and_usage_match_upstream_with_dense_cuts(pair):
    """Upstream's `_encode_state` rows and `predict` usage, with this encoder cutting every long state."""
    agent, enc = pair
    enc._fast = FastEncoder(enc._fast.tok, "dense", **DENSE)
    rng = random.Random(21)
    long_text = random_text(rng, 9000).replace("[MASK]", "x").replace("<mask>", "x")
    conversation = [{"role": "user", "text": random_text(rng, 600)} for _ in range(12)] + ["last turn, no cut"]
    cases = [(long_text, {}), (long_text, {"max_len": 2000}), (conversation, {}), (conversation, {"max_len": 1500}),
             ({"body": long_text[:5000], "n": 3}, {})]
    for state, overrides in cases:
        up_rows, up_usage, up_error = _upstream(agent, state, BASIC, overrides)
        assert up_error is None
        got = enc.encode(state, parse_questions(BASIC), overrides.get("max_len"))
        _assert_rows_equal(up_rows, got.rows)
        assert got.usage.body() == up_usage
        assert got.usage.state_tokens > 1000 and got.usage.truncated


# -- parallelism where the service runs ----------------------------------------------------------

_CHILD = """
import os, sys
from tokenizers import Tokenizer
from laya_grpc.tokenizer.split_encode import FastEncoder, rayon_threads
tok = Tokenizer.from_file(sys.argv[1])
tok.encode_batch_fast(["some text to encode"] * 256, add_special_tokens=False)
print(rayon_threads(), len(os.listdir("/proc/self/task")))
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task") or (os.cpu_count() or 1) < 2, reason="needs Linux, 2+ CPUs")
def test_service_child_keeps_rayon_threads_after_parent_used_them(tokenizer_dirs):
    """The supervisor starts the tokenizer service by fork+exec (preexec_fn forces a real fork):
    tokenizers' after-fork hook disables parallelism only in a fork that is not followed by exec,
    so a child started that way still encodes on several threads."""
    tok = load_tokenizer(tokenizer_dirs["tiny"]).tokenizer
    tok.encode_batch_fast(["warm the parent's rayon pool"] * 256, add_special_tokens=False)
    env = {k: v for k, v in os.environ.items() if k not in ("TOKENIZERS_PARALLELISM", "RAYON_NUM_THREADS")}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", _CHILD, os.path.join(tokenizer_dirs["tiny"], "tokenizer.json")],
                         env=env, cwd=root, preexec_fn=lambda: None, capture_output=True, text=True, check=True)
    threads, tasks = map(int, out.stdout.split()[-2:])
    assert threads >= 2 and tasks > 1, out.stdout + out.stderr


def test_rayon_threads_follows_tokenizers_environment(monkeypatch):
    monkeypatch.delenv("RAYON_RS_NUM_CPUS", raising=False)
    monkeypatch.setenv("RAYON_NUM_THREADS", "3")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "true")
    assert split_encode.rayon_threads() == 3
    monkeypatch.setenv("RAYON_RS_NUM_CPUS", "5")
    assert split_encode.rayon_threads() == 3
    monkeypatch.delenv("RAYON_NUM_THREADS")
    assert split_encode.rayon_threads() == 5
    for off in ("false", "0", "OFF", ""):
        monkeypatch.setenv("TOKENIZERS_PARALLELISM", off)
        assert split_encode.rayon_threads() == 1
