"""`laya_grpc.core.decisions.questions` vs upstream laya 0.4.15: every validation text, every limit, the normal form.

Upstream references: `Agent._check_question` (422 texts), `laya.serve._check_request_limits`
(400/413 and the null-level 422, with their order), `Agent._to_internal` + `render_options` (the text
the model reads) and `_decode_answers`' labels / legend.
"""
from __future__ import annotations

import json

import pytest

laya_agent = pytest.importorskip("laya.agent")
laya_common = pytest.importorskip("laya.common")
laya_serve = pytest.importorskip("laya.serve")
HTTPException = pytest.importorskip("fastapi").HTTPException

from laya_grpc.core.errors import Kind, LayaError  # noqa: E402
from laya_grpc.core.decisions.questions import (  # noqa: E402
    MAX_TOURNAMENT_CHOICE_OPTIONS, check_request_limits, parse_questions)

Agent = laya_agent.Agent
NAN = json.loads("NaN")  # json.loads shares one NaN object, exactly as a parsed request body does

OK_CHOICE = {"type": "choice", "instructions": "Which?", "criteria": {"a": "x", "b": "y"}}

# (questions dict) -> upstream raises a ValueError from `_check_question`; ids are request order.
BAD_QUESTIONS = {
    "blank_id": {" ": OK_CHOICE},
    "empty_id": {"": OK_CHOICE},
    "not_dict": {"q": "choice"},
    "list_def": {"q": [1]},
    "no_type": {"q": {"instructions": "x", "criteria": ["a"]}},
    "bad_type": {"q": {"type": "bogus", "instructions": "x"}},
    "type_case": {"q": {"type": "Choice", "instructions": "x", "criteria": ["a"]}},
    "type_not_str": {"q": {"type": 1, "instructions": "x"}},
    "type_list": {"q": {"type": ["noul"], "instructions": "x"}},
    "no_instructions": {"q": {"type": "noul"}},
    "null_instructions": {"q": {"type": "noul", "instructions": None}},
    "blank_instructions": {"q": {"type": "noul", "instructions": "  \n "}},
    "empty_list_instructions": {"q": {"type": "noul", "instructions": []}},
    "empty_dict_instructions": {"q": {"type": "noul", "instructions": {}}},
    "choice_no_criteria": {"q": {"type": "choice", "instructions": "x"}},
    "choice_str_criteria": {"q": {"type": "choice", "instructions": "x", "criteria": "a,b"}},
    "choice_num_criteria": {"q": {"type": "choice", "instructions": "x", "criteria": 3}},
    "choice_empty_list": {"q": {"type": "choice", "instructions": "x", "criteria": []}},
    "choice_empty_dict": {"q": {"type": "choice", "instructions": "x", "criteria": {}}},
    "choice_list_label": {"q": {"type": "choice", "instructions": "x", "criteria": ["a", ["b"]]}},
    "choice_dict_label": {"q": {"type": "choice", "instructions": "x", "criteria": ["a", {"b": 1}]}},
    "choice_null_label": {"q": {"type": "choice", "instructions": "x", "criteria": ["a", None]}},
    "choice_repeat": {"q": {"type": "choice", "instructions": "x", "criteria": ["a", "b", "a"]}},
    "choice_repeat_numeric": {"q": {"type": "choice", "instructions": "x", "criteria": [1, 1.0]}},
    "choice_repeat_bool": {"q": {"type": "choice", "instructions": "x", "criteria": ["z", True, 1]}},
    "choice_repeat_nan": {"q": {"type": "choice", "instructions": "x", "criteria": [NAN, NAN]}},
    "score_dict": {"q": {"type": "score", "instructions": "x", "criteria": {"0": "low"}}},
    "score_missing": {"q": {"type": "score", "instructions": "x"}},
    "score_empty": {"q": {"type": "score", "instructions": "x", "criteria": []}},
    "score_null_level": {"q": {"type": "score", "instructions": "x", "criteria": ["a", None]}},
    "noul_list": {"q": {"type": "noul", "instructions": "x", "criteria": ["yes", "no"]}},
    "noul_str": {"q": {"type": "noul", "instructions": "x", "criteria": "yes"}},
    "noul_bad_keys": {"q": {"type": "noul", "instructions": "x", "criteria": {"yes": "a", "TRUE": "b"}}},
    "order_dup": {"q": {**OK_CHOICE, "option_order": [0, 0]}},
    "order_short": {"q": {**OK_CHOICE, "option_order": [0]}},
    "order_bool": {"q": {**OK_CHOICE, "option_order": [False, True]}},
    "order_str": {"q": {**OK_CHOICE, "option_order": "01"}},
    "order_float": {"q": {**OK_CHOICE, "option_order": [0.0, 1]}},
    "order_noul": {"q": {"type": "noul", "instructions": "x", "option_order": [0, 1, 2]}},
    "order_missing_criteria": {"q": {"type": "choice", "instructions": "x", "criteria": ["a"],
                                     "option_order": None}},
    "labels_on_choice": {"q": {**OK_CHOICE, "labels": {"false": "n", "true": "y"}}},
    "labels_same": {"q": {"type": "noul", "instructions": "x", "labels": {"false": "a", "true": " a "}}},
    "labels_blank": {"q": {"type": "noul", "instructions": "x", "labels": {"false": "", "true": "y"}}},
    "labels_keys": {"q": {"type": "noul", "instructions": "x", "labels": {"no": "n", "yes": "y"}}},
    "labels_list": {"q": {"type": "noul", "instructions": "x", "labels": ["n", "y"]}},
    "labels_nonstr": {"q": {"type": "noul", "instructions": "x", "labels": {"false": 0, "true": 1}}},
    "first_failure_wins": {"ok": OK_CHOICE, "b1": {"type": "zz", "instructions": "x"},
                           "b2": {"type": "noul"}},
}


@pytest.mark.parametrize("name", sorted(BAD_QUESTIONS))
def test_validation_text_matches_upstream(name):
    questions = BAD_QUESTIONS[name]
    with pytest.raises(ValueError) as up:
        for qid, qdef in questions.items():
            Agent._check_question(qid, qdef)
    with pytest.raises(LayaError) as ours:
        parse_questions(questions)
    assert ours.value.kind is Kind.INVALID
    assert ours.value.detail == str(up.value)


def test_questions_not_an_object_is_400():
    for bad in (None, [], "x", 3):
        with pytest.raises(LayaError) as info:
            parse_questions(bad)
        assert info.value.kind is Kind.BAD_REQUEST
        assert info.value.detail == "'questions' must be an object"


GOOD_QUESTIONS = {
    "c_dict": {"type": "choice", "instructions": "Which team?", "criteria": {
        "billing": "refunds", "tech": {"d": "bugs", "n": [1, 2]}, "x": None, "y": "", "z": 0, "f": False,
        "g": ["a", 1.5], "u": "日本 😀"}},
    "c_list": {"type": "choice", "instructions": "Which?", "criteria": [1, 2.5, False, "1", -0.5, 1e20, NAN]},
    "c_order": {"type": "choice", "instructions": {"k": "日本"}, "criteria": ["a", "b", "c"],
                "option_order": [2, 0, 1]},
    "s": {"type": "score", "instructions": ["how", 1], "criteria": ["low", {"d": "mid"}, 3, NAN, ["x"]]},
    "n_default": {"type": "noul", "instructions": 0},
    "n_labels": {"type": "noul", "instructions": True, "criteria": {"TRUE": {"w": 1}, "False": ""},
                 "labels": {"false": " No ", "true": "Yes"}, "option_order": [1, 0]},
    "n_bool_keys": {"type": "noul", "instructions": 2.5, "criteria": {"True": "t", "true": "t2"}},
    "n_null_criteria": {"type": "noul", "instructions": "x", "criteria": None},
    "extra_keys_ignored": {"type": "noul", "instructions": "x", "foo": 1},
}


def test_normal_form_matches_upstream():
    for qid in GOOD_QUESTIONS:
        Agent._check_question(qid, GOOD_QUESTIONS[qid])
    parsed = parse_questions(GOOD_QUESTIONS)
    assert [q.qid for q in parsed] == list(GOOD_QUESTIONS)
    for q in parsed:
        internal = Agent._to_internal(GOOD_QUESTIONS[q.qid])
        assert q.type == internal["t"]
        assert q.qtype == laya_common.QTYPES[internal["t"]]
        assert q.instructions == internal["ins"]
        assert list(q.options) == laya_common.render_options(internal)
        assert q.option_order == (tuple(internal["option_order"]) if "option_order" in internal else None)
        if q.type == "choice":
            assert list(q.labels) == list(internal["crit"].keys())
            assert [type(v) for v in q.labels] == [type(v) for v in internal["crit"].keys()]
            assert q.legend is None
        elif q.type == "score":
            assert q.labels == tuple(range(len(internal["crit"])))
            assert q.legend == {str(i): laya_common.render_criterion(c) for i, c in enumerate(internal["crit"])}
        else:
            assert q.labels == (False, True) and q.legend is None


def _upstream_limits(state, questions, cap=100):
    try:
        laya_serve._check_request_limits(state, questions, cap)
    except HTTPException as e:
        return e.status_code, e.detail
    return None


def _our_limits(state, questions, cap=100):
    try:
        check_request_limits(state, questions, cap)
    except LayaError as e:
        return e.kind.http_status, e.detail
    return None


def _many(n):
    return {"q%d" % i: {"type": "noul", "instructions": "x"} for i in range(n)}


LIMIT_CASES = {
    "ok": ("s", {"q": OK_CHOICE}),
    "null_state": (None, {"q": OK_CHOICE}),
    "null_state_and_65": (None, _many(65)),
    "questions_list": ("s", []),
    "questions_null": ("s", None),
    "64_questions": ("s", _many(64)),
    "65_questions": ("s", _many(65)),
    "choice_100": ("s", {"q": {"type": "choice", "criteria": ["o%d" % i for i in range(100)]}}),
    "choice_101": ("s", {"q": {"type": "choice", "criteria": ["o%d" % i for i in range(101)]}}),
    "choice_101_dict": ("s", {"q": {"type": "choice", "criteria": {"o%d" % i: None for i in range(101)}}}),
    "score_32": ("s", {"q": {"type": "score", "criteria": list(range(32))}}),
    "score_33": ("s", {"q": {"type": "score", "criteria": list(range(33))}}),
    "score_null": ("s", {"q": {"type": "score", "criteria": ["a", None, None]}}),
    "score_null_before_413": ("x" * 60000, {"q": {"type": "score", "criteria": ["a", None]}}),
    "total_513": ("s", {"q%d" % j: {"type": "choice", "criteria": list(range(100))} for j in range(5)}
                  | {"s": {"type": "score", "criteria": list(range(13))}}),
    "total_512": ("s", {"q%d" % j: {"type": "choice", "criteria": list(range(100))} for j in range(5)}
                  | {"s": {"type": "score", "criteria": list(range(12))}}),
    "non_dict_question_skipped": ("s", {"q": "junk", "r": {"type": "bogus", "criteria": [1] * 200}}),
    "state_50000": ("x" * 50000, {}),
    "state_50001": ("x" * 50001, {}),
    "state_unicode_points": ("😀" * 50001, {}),
    "state_escaped_quotes": ({"body": '"' * 30000}, {}),
    "state_lower_bound": ({"a": "x" * 40000, "b": "y" * 40000}, {}),
    "state_list": (["x" * 30000, "y" * 30000], {}),
    "state_number": (12345, {}),
    "state_nan_inside": ({"v": NAN, "t": "x" * 49990}, {}),
    "state_many_values": ({"k%d" % i: "x" * 1000 for i in range(60)}, {}),
}


@pytest.mark.parametrize("name", sorted(LIMIT_CASES))
def test_request_limits_match_upstream(name):
    state, questions = LIMIT_CASES[name]
    assert _our_limits(state, questions) == _upstream_limits(state, questions)


def test_tournament_choice_cap_matches_upstream():
    qs = {"q": {"type": "choice", "criteria": ["o%d" % i for i in range(256)]}}
    cap = MAX_TOURNAMENT_CHOICE_OPTIONS
    assert _our_limits("s", qs, cap) == _upstream_limits("s", qs, cap) == (413, "too many choice options for 'q' (256 > 255)")
