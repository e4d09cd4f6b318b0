"""Token rows and usage of `laya_grpc.tokenizer.encoding` vs upstream laya 0.4.15 on the same checkpoints.

For every case and every fixture (tiny: ModernBERT-like BPE; tiny-ml: Gemma-like; tiny-par: the
parallel option layout) the ids, markers, qtype, position/option ids must equal what upstream's
`Agent._encode_state` builds, the usage block must equal `Agent.predict(...)["usage"]`, and an
upstream ValueError must come back as the same text (LayaError INVALID).
"""
from __future__ import annotations


import pytest

laya = pytest.importorskip("laya")

from laya_grpc.core.errors import Kind, LayaError  # noqa: E402
from laya_grpc.core.decisions.questions import parse_questions  # noqa: E402
from laya_grpc.tokenizer.encoding import TextEncoder  # noqa: E402

PRESETS = ("tiny", "tiny-ml", "tiny-par")

LONG = "The customer was charged twice for order 4711 and wants a refund today. " * 40
UNICODE = "Café crème, naïve façade — 日本語のテキストです。中文也可以。😀🎉👍🏽 Ünïcödé ñandú."
BASIC = {
    "team": {"type": "choice", "instructions": "Which team should handle this?",
             "criteria": {"billing": "Charges and refunds", "technical": "Software problems"}},
    "urgency": {"type": "score", "instructions": "How urgent is the request?",
                "criteria": ["Not urgent", "Needs attention soon", "Needs attention immediately"]},
    "refund": {"type": "noul", "instructions": "Does the customer ask for a refund?"},
}


def _choice(n: int) -> dict:
    return {"q": {"type": "choice", "instructions": "Pick one of %d." % n,
                  "criteria": {"option_%d" % i: "description number %d" % i for i in range(n)}}}


CASES: list[tuple[str, object, dict, dict]] = [
    ("basic", "I was charged twice. Please refund the duplicate today.", BASIC, {}),
    *[("choice_%d" % n, "A short state.", _choice(n), {}) for n in range(1, 15)],
    ("choice_list", "state", {"q": {"type": "choice", "instructions": "Which?",
                                    "criteria": ["billing", "technical", "other"]}}, {}),
    ("choice_structured", "state", {"q": {"type": "choice", "instructions": "Which?", "criteria": {
        "a": {"desc": "dict", "n": [1, 2]}, "b": ["list", 3], "c": 0, "d": False, "e": "", "f": None, "g": 2.5}}}, {}),
    ("numeric_bool_labels", "state", {"q": {"type": "choice", "instructions": "Which number?",
                                            "criteria": [0.5, 2, False, "x", -7]}}, {}),
    ("numeric_dict_labels", "state", {"q": {"type": "choice", "instructions": "Which?",
                                            "criteria": {"1": "one", "2.0": "two"}}}, {}),
    ("score_structured", "state", {"q": {"type": "score", "instructions": "Rate",
                                         "criteria": [{"d": "low"}, 1, ["x"], "high", float("nan")]}}, {}),
    ("noul_labels_criteria", "state", {"q": {"type": "noul", "instructions": "Is it late?",
                                             "criteria": {"TRUE": "late", "False": {"why": "on time"}},
                                             "labels": {"false": " on-time ", "true": "LATE"}}}, {}),
    ("noul_partial_criteria", "state", {"q": {"type": "noul", "instructions": "Spam?",
                                              "criteria": {"true": ""}}}, {}),
    ("instructions_nonstr", "state", {
        "d": {"type": "noul", "instructions": {"ask": "refund?", "lang": "日本"}},
        "l": {"type": "noul", "instructions": ["a", 1, None]},
        "n": {"type": "noul", "instructions": 0}, "b": {"type": "noul", "instructions": True},
        "f": {"type": "noul", "instructions": 2.5}}, {}),
    ("many_questions", LONG, {**BASIC, **{"c%d" % i: _choice(i + 2)["q"] for i in range(6)}}, {}),
    ("long_string_truncates", LONG * 3, BASIC, {}),
    ("conversation_left_truncates", [{"role": "user", "text": "turn %d " % i + LONG[:200]} for i in range(30)],
     BASIC, {}),
    ("conversation_short", ["hello", "I need a refund", {"role": "agent", "text": "ok"}], BASIC, {}),
    ("dict_state", {"subject": "Refund", "body": LONG[:300], "meta": {"n": 3, "ok": True, "x": None}}, BASIC, {}),
    ("unicode", UNICODE, {"q": {"type": "choice", "instructions": "¿Qué equipo? 哪个团队？",
                                "criteria": {"facturación": "cobros 💳", "技术": "软件问题", "émoji": "😀"}}}, {}),
    ("unicode_dict_state", {"text": UNICODE}, BASIC, {}),
    ("number_state", 42, BASIC, {}),
    ("bool_state", True, BASIC, {}),
    ("empty_state", "", BASIC, {}),
    ("max_len_small", LONG, BASIC, {"max_len": 64}),
    ("head_max_len_small", LONG, BASIC, {"head_max_len": 24}),
    ("both_overrides", LONG, BASIC, {"max_len": 100, "head_max_len": 40}),
    ("max_len_large", LONG * 3, BASIC, {"max_len": 2000}),
    ("head_squeeze_collapse", "state", {"q": {"type": "choice", "instructions": "Which?", "criteria": {
        "prefix_shared_%d" % i: "the same long shared description text" for i in range(10)}}},
     {"head_max_len": 48}),
    ("head_squeeze_14", LONG, _choice(14), {"head_max_len": 60}),
    ("markers_dropped_error", "state", _choice(12), {"max_len": 30}),
    ("markers_dropped_second_q", "state", {"ok": BASIC["refund"], **_choice(12)}, {"max_len": 40}),
    ("max_len_1", "state", BASIC, {"max_len": 1}),
    ("long_option_cap", "state", {"q": {"type": "choice", "instructions": "Which?", "criteria": {
        "long": LONG[:600], "short": "x", "long2": UNICODE * 4}}}, {}),
    ("long_instructions", "state", {"q": {"type": "noul", "instructions": LONG}}, {}),
    ("mask_literals", "a [MASK] b <mask> c [MASK][MASK]", {"q": {
        "type": "choice", "instructions": "Which [MASK] <mask>?",
        "criteria": {"a[MASK]": "x <mask> y", "b": "[MASK]"}}}, {}),
    ("special_literals", "hello [SEP] world [CLS] x [PAD] <bos> <eos> <pad> [UNK] <unk>", {"q": {
        "type": "choice", "instructions": "[SEP] which <eos>?", "criteria": {"[CLS]": "<bos>", "b": "[SEP]"}}}, {}),
    ("option_order", "state", {"q": {"type": "choice", "instructions": "Which?",
                                     "criteria": {"a": "first", "b": "second", "c": "third", "d": "fourth"},
                                     "option_order": [2, 0, 3, 1]},
                               "s": {"type": "score", "instructions": "Rate", "criteria": ["lo", "hi"],
                                     "option_order": [1, 0]},
                               "n": {"type": "noul", "instructions": "Yes?", "option_order": [1, 0]}}, {}),
    ("option_order_squeezed", LONG, {"q": {**_choice(9)["q"], "option_order": [8, 7, 6, 5, 4, 3, 2, 1, 0]}},
     {"head_max_len": 50, "max_len": 120}),
    ("whitespace_text", "   \n\t  ", {"q": {"type": "noul", "instructions": "  padded  \n"}}, {}),
]


@pytest.fixture(scope="module", params=PRESETS)
def pair(request, tiny_ckpt, tiny_ml_ckpt, tiny_par_ckpt, upstream_agent):
    """(upstream Agent, our TextEncoder) on one session fixture checkpoint."""
    path = {"tiny": tiny_ckpt, "tiny-ml": tiny_ml_ckpt, "tiny-par": tiny_par_ckpt}[request.param]
    agent = upstream_agent(path)
    enc = TextEncoder(path + "/tokenizer", max_len=agent.cfg.get("max_len", 512),
                      head_max_len=agent.cfg.get("head_max_len", 192), parallel_layout=agent.parallel_options)
    return agent, enc


def _upstream(agent, state, questions, overrides):
    """(rows, usage) or the ValueError text, as upstream builds them."""
    internal = {qid: agent._to_internal(q) for qid, q in questions.items()}
    try:
        rows = agent._encode_state(state, list(questions), internal, **overrides)
    except ValueError as e:
        return None, None, str(e)
    usage = agent.predict(state, questions, **overrides)["usage"]
    return rows, usage, None


def _assert_rows_equal(up_rows, rows):
    assert len(up_rows) == len(rows)
    for u, r in zip(up_rows, rows):
        assert r.ids == u["ids"]
        assert r.markers == u["markers"]
        assert r.qtype == u["qtype"]
        if "layout" in u:
            assert r.position_ids == u["layout"]["position_ids"]
            assert r.option_ids == u["layout"]["option_ids"]
        else:
            assert r.position_ids is None and r.option_ids is None


def test_special_tokens_match_autotokenizer(pair):
    agent, enc = pair
    tok = agent.tok
    assert (enc.cls_id, enc.sep_id, enc.pad_id, enc.mask_id) == (
        tok.cls_token_id, tok.sep_token_id, tok.pad_token_id, tok.mask_token_id)
    assert enc.mask_token == tok.mask_token
    assert len(enc.fingerprint) == 64


@pytest.mark.parametrize("name,state,questions,overrides", CASES, ids=[c[0] for c in CASES])
def test_rows_and_usage_match_upstream(pair, name, state, questions, overrides):
    agent, enc = pair
    up_rows, up_usage, up_error = _upstream(agent, state, questions, overrides)
    parsed = parse_questions(questions)
    if up_error is not None:
        with pytest.raises(LayaError) as info:
            enc.encode(state, parsed, overrides.get("max_len"), overrides.get("head_max_len"))
        assert info.value.kind is Kind.INVALID
        assert info.value.detail == up_error
        return
    got = enc.encode(state, parsed, overrides.get("max_len"), overrides.get("head_max_len"))
    _assert_rows_equal(up_rows, got.rows)
    assert got.usage.body() == up_usage
    # the second call is served from the head cache and must not differ
    again = enc.encode(state, parsed, overrides.get("max_len"), overrides.get("head_max_len"))
    assert again == got


def test_empty_questions_usage(pair):
    agent, enc = pair
    assert enc.encode("anything", []).usage.body() == agent.predict("anything", {})["usage"]
    assert enc.encode("anything", []).rows == []


def test_encode_many_matches_predict_batch(pair):
    agent, enc = pair
    states = ["short one", LONG * 2, ["a", "b", LONG], {"k": UNICODE}, "", 7]
    results = agent.predict_batch(states, BASIC, max_len=300)
    encoded = enc.encode_many(states, parse_questions(BASIC), max_len=300)
    internal = {qid: agent._to_internal(q) for qid, q in BASIC.items()}
    for state, res, got in zip(states, results, encoded):
        assert got.usage.body() == res["usage"]
        _assert_rows_equal(agent._encode_state(state, list(BASIC), internal, max_len=300), got.rows)


def test_option_cap_equals_transformers_truncation(pair):
    """`tok(text, truncation=True, max_length=48)` == raw encode + first 48, specials included."""
    agent, enc = pair
    texts = [" " + LONG, " " + UNICODE * 5, " [SEP] <bos> " * 40, " x", " " + "[CLS]" * 60]
    for text in texts:
        want = agent.tok(text, add_special_tokens=False, truncation=True, max_length=48)["input_ids"]
        full = agent.tok(text, add_special_tokens=False)["input_ids"]
        got = enc._cap_option(enc._encode_texts([text])[0])
        assert got == want
        assert enc._encode_texts([text])[0] == full
