"""The HTTP contract of `laya serve` 0.4.15, probe for probe, against upstream itself.

Every probe body goes to two servers built on the same tiny checkpoints (english = tiny,
multilingual = tiny-ml, typed-decisions = tiny): upstream's own `laya.serve.create_app(Router(...))`
(in-process, through Starlette's TestClient) and our gateway over real HTTP. Status codes,
`detail` texts, `Allow`/`Retry-After`/`Location` headers, content type and, for 200s, the whole
body must agree: same keys in the same order (duplicate keys included), same strings and ints,
floats within 1e-4, `routing` identical. What TestClient cannot send (a stalled upload, a lying
Content-Length, a chunked upload) is checked on raw sockets against the texts of
docs systemone-contract.md §4.
"""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import warnings

import httpx
import pytest

laya = pytest.importorskip("laya")

from laya_grpc.cli.make_checkpoint import make_checkpoint  # noqa: E402

S = "I was charged twice for my order. Please refund the duplicate today."
CHOICE = {"type": "choice", "instructions": "Which team should handle this?",
          "criteria": {"billing": "Charges and refunds", "technical": "Software problems"}}
SCORE = {"type": "score", "instructions": "How urgent is the request?",
         "criteria": ["Not urgent", "Needs attention soon", "Needs attention immediately"]}
NOUL = {"type": "noul", "instructions": "Does the customer ask for a refund?"}
MIXED = {"a": CHOICE, "b": SCORE, "c": NOUL}
KEY = "k"
FLOAT_TOL = 1e-4 + 1e-9


def _q(**question) -> dict:
    return {"q": question}


def _choice(criteria) -> dict:
    return _q(type="choice", instructions="Which?", criteria=criteria)


def _body(**fields) -> dict:
    return {"state": S, "questions": {"q": CHOICE}, **fields}


# --------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("http_ckpt")
    tiny = make_checkpoint(str(root / "tiny"), "tiny")
    tiny_ml = make_checkpoint(str(root / "tiny-ml"), "tiny-ml")
    return {"english": tiny, "multilingual": tiny_ml, "typed-decisions": tiny}


@pytest.fixture(scope="module")
def upstream_router(checkpoints):
    from laya.router import Router
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Router(models=dict(checkpoints), device="cpu")


@pytest.fixture(scope="module")
def upstream(upstream_router):
    """env -> a TestClient on upstream's app built under that environment."""
    from laya.serve import create_app
    from starlette.testclient import TestClient
    clients: dict = {}

    def get(env: dict | None = None) -> "TestClient":
        key = tuple(sorted((env or {}).items()))
        if key not in clients:
            saved = {k: os.environ.get(k) for k in (env or {})}
            os.environ.update(env or {})
            try:
                client = TestClient(create_app(upstream_router), follow_redirects=False)
                client.__enter__()
            finally:
                for k, v in saved.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
            clients[key] = (client, env or {})
        return clients[key]

    yield get
    for client, _ in clients.values():
        client.__exit__(None, None, None)


def _backends():
    try:
        import mlx.core  # noqa: F401
        return ["torch", "mlx"]
    except ImportError:
        return ["torch"]


@pytest.fixture(scope="module", params=["torch"])
def gateway(request, checkpoints):
    """env -> base URL of the real `laya-grpc serve` (tokenizer + inference + gateway) under that env,
    on the torch backend; the decision tables also run against the app in process on the torch and
    the MLX backend (test_http_contract_inprocess.py), and test_services_e2e.py serves MLX for real."""
    from stack import Stack
    stacks: dict = {}

    def get(env: dict | None = None) -> str:
        key = tuple(sorted((env or {}).items()))
        if key not in stacks:
            stack = Stack(checkpoints, env=dict(env or {}), extra_args=["--backend", request.param])
            stacks[key] = stack.__enter__()
        return stacks[key].http

    yield get
    for stack in stacks.values():
        stack.__exit__(None, None, None)


# --------------------------------------------------------------------------------- comparison
def _pairs(raw: bytes):
    """JSON with every object as a list of (key, value) pairs: keeps order and duplicate keys."""
    return json.loads(raw, object_pairs_hook=list)


def _assert_same(ours, theirs, path="$"):
    if isinstance(theirs, float) and not isinstance(ours, bool) and isinstance(ours, (int, float)):
        assert abs(ours - theirs) <= FLOAT_TOL, "%s: %r != %r" % (path, ours, theirs)
        return
    assert type(ours) is type(theirs), "%s: %r != %r" % (path, ours, theirs)
    if isinstance(theirs, list):
        assert len(ours) == len(theirs), "%s: %r != %r" % (path, ours, theirs)
        for i, (a, b) in enumerate(zip(ours, theirs)):
            _assert_same(a, b, "%s[%d]" % (path, i))
    elif isinstance(theirs, tuple):   # a (key, value) pair
        assert ours[0] == theirs[0], "%s: key %r != %r" % (path, ours[0], theirs[0])
        _assert_same(ours[1], theirs[1], "%s.%s" % (path, theirs[0]))
    else:
        assert ours == theirs, "%s: %r != %r" % (path, ours, theirs)


def _send(client_or_url, method, path, content, headers):
    if isinstance(client_or_url, str):
        with httpx.Client(base_url=client_or_url, timeout=60, follow_redirects=False) as c:
            return c.request(method, path, content=content, headers=headers)
    return client_or_url.request(method, path, content=content, headers=headers)


def _encode(body) -> bytes:
    if isinstance(body, bytes):
        return body
    return json.dumps(body, ensure_ascii=False, allow_nan=True).encode("utf-8", "surrogatepass")


def compare(gateway, upstream, body, path="/v1/systemone", method="POST", headers=None, env=None):
    """Send one probe to both servers; assert they answer alike; return our response."""
    content = None if body is None else _encode(body)
    headers = {"content-type": "application/json", **(headers or {})}
    client, up_env = upstream(env)
    saved = {k: os.environ.get(k) for k in up_env}
    os.environ.update(up_env)   # upstream re-reads some variables per request (LAYA_JEV_STRICT)
    try:
        theirs = _send(client, method, path, content, headers)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    ours = _send(gateway(env), method, path, content, headers)
    assert ours.status_code == theirs.status_code, (ours.status_code, ours.text, theirs.status_code, theirs.text)
    for name in ("allow", "retry-after", "www-authenticate"):
        assert ours.headers.get(name) == theirs.headers.get(name), name
    if theirs.status_code == 307:
        assert httpx.URL(ours.headers["location"]).path == httpx.URL(theirs.headers["location"]).path
        return ours
    assert ours.headers.get("content-type") == theirs.headers.get("content-type")
    timed = "server-timing" in theirs.headers
    assert ("server-timing" in ours.headers) == timed and ("x-inference-time-ms" in ours.headers) == timed
    if timed:
        assert re.fullmatch(r"inference;dur=\d+\.\d\d", ours.headers["server-timing"])
        assert re.fullmatch(r"\d+\.\d\d", ours.headers["x-inference-time-ms"])
    if theirs.status_code == 200:
        _assert_same(_pairs(ours.content), _pairs(theirs.content))
    else:
        assert ours.content == theirs.content, (ours.content, theirs.content)
    return ours


# --------------------------------------------------------------------------------- probes
HAPPY = {
    "choice_dict": {"model": "english", "state": S, "questions": {"q": CHOICE}},
    "choice_list": {"state": S, "questions": _choice(["billing", "technical", "other"])},
    "choice_mixed_labels": {"state": S, "questions": _choice([1, 2.5, "x"])},
    "choice_bool_label": {"state": S, "questions": _choice([False, "x", -7, 0.5])},
    "choice_single": {"state": S, "questions": _choice(["only"])},
    "choice_dup_json_keys": {"state": S, "questions": _choice([1, "1"])},
    "choice_non_ascii": {"state": "Café crème 😀", "questions": _choice({"facturación": "cobros 💳", "技术": "软件"})},
    "score_strings": {"state": S, "questions": {"q": SCORE}},
    "score_structured": {"state": S, "questions": _q(type="score", instructions="Rate",
                                                     criteria=[1, {"d": "mid"}, ["x"]])},
    "noul_plain": {"state": S, "questions": {"q": NOUL}},
    "noul_labels": {"state": S, "questions": _q(type="noul", instructions="Refund?",
                                                criteria={"true": "asks for refund", "false": "no refund"},
                                                labels={"true": "A", "false": "B"})},
    "mixed": {"state": S, "questions": MIXED},
    "nouls_64": {"state": S, "questions": {"n%d" % i: NOUL for i in range(64)}},
    "empty_questions": {"state": S, "questions": {}},
    "auto_german_dict": {"state": {"betreff": "Rechnung", "text": "Ich wurde doppelt belastet und möchte "
                                   "bitte eine Rückerstattung für die Bestellung."}, "questions": {"q": CHOICE}},
    "model_jev": _body(model="jev-1"),
    "model_gpt": _body(model="gpt-4"),
    "model_int": _body(model=123),
    "model_false": _body(model=False),
    "model_bundle": _body(model="convaiinnovations/laya"),
    "model_alias": _body(model="ML"),
    "model_published": _body(model="convaiinnovations/laya-multilingual"),
    "model_pins_over_bad_task": _body(model="english", task="bogus"),
    "task": _body(task="typed_decisions"),
    "task_dash": _body(task="Typed-Decisions"),
    "lang": _body(lang="de"),
    "lang_abstains": _body(lang="und"),
    "lang_guess": {"state": "Quero cancelar", "questions": {"q": CHOICE}, "lang_guess": "en_US.UTF-8"},
    "undecided_default": {"state": "Quero cancelar", "questions": {"q": CHOICE}},
    "no_letters": {"state": "12345 !!", "questions": {"q": CHOICE}},
    "chinese": {"state": "我被重复收费了，请退款。", "questions": {"q": CHOICE}},
    "min_conf": {"state": S, "questions": MIXED, "min_confidence": 0.5},
    "min_conf_high": {"state": S, "questions": MIXED, "min_confidence": 1.0},
    "min_conf_map": {"state": S, "questions": MIXED, "min_confidence": {"choice:2": 0.9, "default": 0.1}},
    "max_len_truncates": _body(max_len=40),
    "head_max_len": {"state": S, "questions": MIXED, "head_max_len": 24, "max_len": 64},
    "list_state": {"state": ["hello", {"role": "user", "text": S}], "questions": MIXED},
    "number_state": {"state": 42, "questions": {"q": NOUL}},
    "bool_state": {"state": True, "questions": {"q": NOUL}},
    "nan_state": b'{"state":{"x":NaN,"y":"refund please"},"questions":{"q":{"type":"noul","instructions":"?"}}}',
    "instructions_dict": {"state": S, "questions": _q(type="noul", instructions={"ask": "refund?"})},
    "instructions_true": {"state": S, "questions": _q(type="noul", instructions=True)},
    "option_order": {"state": S, "questions": _q(type="choice", instructions="Which?",
                                                 criteria=["a", "b", "c"], option_order=[2, 0, 1])},
    "hooks_null": _body(hooks=None, hooks_timeout=None),
    "ignored_fields": _body(foo=1, batch_size=0, diagnostics={}),
    "paired_surrogate": b'{"state":"ok \\ud83d\\ude00","questions":{"q":{"type":"noul","instructions":"?"}}}',
    "utf8_bom": b"\xef\xbb\xbf" + json.dumps(_body()).encode(),
    "utf16": json.dumps(_body()).encode("utf-16"),
    "choice_100": {"state": S, "questions": _choice(["o%d" % i for i in range(100)])},
    "state_50000": {"state": "x" * 50000, "questions": {"q": NOUL}},
    "nan_score_level": b'{"state":"s","questions":{"q":{"type":"score","instructions":"?","criteria":["a",NaN]}}}',
}

ERRORS = {
    "invalid_json": b"{not json",
    "empty_body": b"",
    "bad_utf8": b'{"state":"\xff\xfe","questions":{}}',
    "deep_nesting": b"[" * 5000,
    "huge_int": b'{"state":' + b"9" * 5000 + b',"questions":{}}',
    "body_list": [1, 2],
    "body_string": "hello",
    "no_questions": {"state": S},
    "questions_list": {"state": S, "questions": [1]},
    "questions_null": {"state": S, "questions": None},
    "state_missing": {"questions": {"q": NOUL}},
    "state_null": {"state": None, "questions": {"q": NOUL}},
    "surrogate_value": b'{"state":"x \\ud800","questions":{"q":{"type":"noul","instructions":"?"}}}',
    "surrogate_id": b'{"state":"x","questions":{"\\udc00":{"type":"noul","instructions":"?"}}}',
    "min_conf_nan": b'{"state":"x","questions":{},"min_confidence":NaN}',
    "nan_label": b'{"state":"x","questions":{"q":{"type":"choice","instructions":"?","criteria":[NaN,"a"]}}}',
    "inf_label": b'{"state":"x","questions":{"q":{"type":"choice","instructions":"?","criteria":["a",Infinity]}}}',
    "type_bogus": {"state": S, "questions": _q(type="bogus", instructions="?")},
    "type_missing": {"state": S, "questions": _q(instructions="?")},
    "type_case": {"state": S, "questions": _q(type="Choice", instructions="?", criteria=["a"])},
    "instructions_missing": {"state": S, "questions": _q(type="noul")},
    "instructions_blank": {"state": S, "questions": _q(type="noul", instructions="  ")},
    "instructions_null": {"state": S, "questions": _q(type="noul", instructions=None)},
    "instructions_empty_list": {"state": S, "questions": _q(type="noul", instructions=[])},
    "criteria_missing": {"state": S, "questions": _q(type="choice", instructions="?")},
    "criteria_string": {"state": S, "questions": _choice("a,b")},
    "criteria_empty_list": {"state": S, "questions": _choice([])},
    "criteria_empty_dict": {"state": S, "questions": _choice({})},
    "dup_labels": {"state": S, "questions": _choice(["a", "b", "a"])},
    "dup_numeric": {"state": S, "questions": _choice([1, 1.0])},
    "dup_bool": {"state": S, "questions": _choice([1, 2.5, True])},
    "null_label": {"state": S, "questions": _choice(["a", None])},
    "nested_label": {"state": S, "questions": _choice(["a", ["b"]])},
    "score_dict": {"state": S, "questions": _q(type="score", instructions="?", criteria={"a": 1})},
    "score_empty": {"state": S, "questions": _q(type="score", instructions="?", criteria=[])},
    "score_null_level": {"state": S, "questions": _q(type="score", instructions="?", criteria=["lo", None])},
    "noul_bad_key": {"state": S, "questions": _q(type="noul", instructions="?", criteria={"yes": "y"})},
    "noul_list": {"state": S, "questions": _q(type="noul", instructions="?", criteria=["a"])},
    "noul_labels_equal": {"state": S, "questions": _q(type="noul", instructions="?",
                                                      labels={"true": "A", "false": "A"})},
    "labels_on_choice": {"state": S, "questions": _q(type="choice", instructions="?", criteria=["a"],
                                                     labels={"true": "A", "false": "B"})},
    "option_order_repeat": {"state": S, "questions": _q(type="choice", instructions="?", criteria=["a", "b"],
                                                        option_order=[0, 0])},
    "option_order_bools": {"state": S, "questions": _q(type="choice", instructions="?", criteria=["a", "b"],
                                                       option_order=[True, False])},
    "definition_string": {"state": S, "questions": {"q": "choice"}},
    "blank_id": {"state": S, "questions": {" ": NOUL}},
    "second_question_bad": {"state": S, "questions": {"a": NOUL, "b": _q(type="zz")["q"], "c": {"type": "yy"}}},
    "max_len_string": _body(max_len="512"),
    "max_len_bool": _body(max_len=True),
    "max_len_float": _body(max_len=100.0),
    "max_len_zero": _body(max_len=0),
    "max_len_over": _body(max_len=8193),
    "markers_do_not_fit": _body(max_len=20, questions={"q": NOUL}),
    "head_max_len_negative": _body(head_max_len=-5),
    "lang_int": _body(lang=7),
    "lang_guess_bool": _body(lang_guess=True),
    "task_bogus": _body(task="bogus"),
    "task_bogus_empty_questions": {"state": S, "questions": {}, "task": "bogus"},
    "min_conf_over": _body(min_confidence=1.5),
    "min_conf_bool": _body(min_confidence=True),
    "min_conf_string": _body(min_confidence="0.5"),
    "min_conf_bad_bucket": _body(min_confidence={"choice:7": 0.5}),
    "min_conf_empty_map": _body(min_confidence={}),
    "hooks": _body(hooks=["x"], hooks_timeout=1),
    "on_predict_start": _body(on_predict_start="f"),
    "model_repo": _body(model="org/repo"),
    "model_path": _body(model="./ckpt"),
    "model_home": _body(model="~ckpt"),
    "model_backslash": _body(model="a\\b"),
    "questions_65": {"state": S, "questions": {"n%d" % i: NOUL for i in range(65)}},
    "choice_101": {"state": S, "questions": _choice(["o%d" % i for i in range(101)])},
    "score_33": {"state": S, "questions": _q(type="score", instructions="?", criteria=["l"] * 33)},
    "options_600": {"state": S, "questions": {"c%d" % j: _choice(["o%d" % i for i in range(100)])["q"]
                                              for j in range(6)}},
    "state_50001": {"state": "x" * 50001, "questions": {"q": NOUL}},
    "state_quotes": {"state": {"body": '"' * 30000}, "questions": {"q": NOUL}},
    "state_lower_bound": {"state": {"a": "x" * 40000, "b": "y" * 40000}, "questions": {"q": NOUL}},
    "body_over_2mib": b'{"state":"' + b"x" * (2 * 1024 * 1024) + b'","questions":{}}',
    # which error wins (systemone-contract.md §2.5)
    "order_surrogate_vs_hooks": b'{"state":"\\ud800","questions":{},"hooks":[1]}',
    "order_surrogate_vs_state_size": ('{"state":"\\ud800%s","questions":{}}' % ("x" * 50001)).encode(),
    "order_state_vs_65": {"questions": {"n%d" % i: NOUL for i in range(65)}},
    "order_max_len_vs_type": {"state": S, "questions": _q(type="bogus"), "max_len": "x"},
    "order_task_vs_question": {"state": S, "questions": _q(type="bogus"), "task": "zz"},
    "order_null_level_vs_state": {"state": "x" * 50001, "questions": _q(type="score", criteria=["a", None])},
    "order_choice_cap_vs_null": {"state": S, "questions": {"a": _choice(["o"] * 101)["q"],
                                                           "b": _q(type="score", criteria=[None])["q"]}},
    "order_model_vs_max_len": _body(model="org/repo", max_len="x"),
    "order_hooks_vs_model": _body(model="org/repo", hooks=1),
    "order_lang_vs_min_conf": _body(lang=1, min_confidence=2),
}

BATCH = {
    "two_states": {"states": [{"body": "billed twice, refund please"}, {"body": "cannot login, getting 500 error"}],
                   "questions": {"dept": CHOICE, "urgent": NOUL}, "model": "english"},
    "per_state_routing": {"states": [S, "Ich wurde doppelt belastet, bitte erstatten Sie den Betrag.",
                                     "我被重复收费了，请退款。"], "questions": MIXED},
    "controls": {"states": [S, "short"], "questions": MIXED, "max_len": 40, "min_confidence": {"default": 0.6},
                 "lang_guess": "de"},
    "batch_size_sort": {"states": [S, "a", S * 3], "questions": {"q": NOUL}, "batch_size": 2,
                        "sort_by_length": True},
    "empty_questions": {"states": [S, "x"], "questions": {}},
    "states_empty": {"states": [], "questions": {}},
    "states_string": {"states": "abc", "questions": {}},
    "states_missing": {"questions": {}},
    "questions_missing": {"states": [S]},
    "states_65": {"states": ["s"] * 65, "questions": {}},
    "state_null": {"states": ["a", None], "questions": {}},
    "state_too_large": {"states": ["a", "x" * 50001], "questions": {}},
    "diagnostics": {"states": [S], "questions": {}, "diagnostics": {}},
    "diagnostics_vs_hooks": {"states": [S], "questions": {}, "diagnostics": {}, "hooks_raise": True},
    "batch_size_zero": {"states": [S], "questions": {}, "batch_size": 0},
    "batch_size_string": {"states": [S], "questions": {}, "batch_size": "2"},
    "batch_size_bool": {"states": [S], "questions": {}, "batch_size": True},
    "sort_by_length_string": {"states": [S], "questions": {}, "sort_by_length": "yes"},
    "model_repo": {"states": [S], "questions": {}, "model": "org/repo"},
    "task_bogus": {"states": [S], "questions": {}, "task": "bogus"},
    "bad_question": {"states": [S, S], "questions": _q(type="bogus")},
    "surrogate": b'{"states":["ok","\\udfff"],"questions":{}}',
    "min_conf_vs_batch_size": {"states": [S], "questions": {}, "min_confidence": 3, "batch_size": 0},
}


@pytest.mark.parametrize("name", sorted(HAPPY))
def test_answers_match_upstream(gateway, upstream, name):
    ours = compare(gateway, upstream, HAPPY[name])
    assert ours.status_code == 200


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_errors_match_upstream(gateway, upstream, name):
    ours = compare(gateway, upstream, ERRORS[name])
    assert ours.status_code in (400, 413, 422)
    assert list(ours.json()) == ["detail"] and isinstance(ours.json()["detail"], str)


@pytest.mark.parametrize("name", sorted(BATCH))
def test_batch_matches_upstream(gateway, upstream, name):
    compare(gateway, upstream, BATCH[name], path="/v1/systemone/batch")


@pytest.mark.parametrize("env", [{}, {"LAYA_JEV_STRICT": "1"}], ids=["full", "strict"])
@pytest.mark.parametrize("name", ["mixed", "min_conf_map", "choice_mixed_labels", "empty_questions"])
def test_strict_projection_matches_upstream(gateway, upstream, env, name):
    ours = compare(gateway, upstream, HAPPY[name], env=env)
    if env:
        assert list(ours.json()) == ["model", "answers", "usage"]
        assert list(ours.json()["usage"]) == ["input_tokens", "output_tokens"]


def test_strict_batch_matches_upstream(gateway, upstream):
    compare(gateway, upstream, BATCH["two_states"], path="/v1/systemone/batch", env={"LAYA_JEV_STRICT": "1"})


def test_key_orders_and_semantics(gateway):
    """Spot checks of §4 happy paths beyond 'equal to upstream': the shape a client relies on."""
    r = httpx.post(gateway() + "/v1/systemone", json={"model": "english", "state": S, "questions": MIXED},
                   timeout=60)
    assert r.headers["content-type"] == "application/json"
    body = r.json()
    assert list(body) == ["model", "answers", "usage", "routing"] and body["model"] == "laya-rl-agent"
    a, b, c = body["answers"]["a"], body["answers"]["b"], body["answers"]["c"]
    assert list(a) == ["type", "choice", "probabilities", "confidence", "answer_confidence", "action",
                       "x_jev_confidence"]
    assert list(b) == ["type", "score", "legend", "probabilities", "confidence", "answer_confidence",
                       "action", "x_jev_confidence"]
    assert list(c) == ["type", "noul", "confidence", "answer_confidence", "action"]
    assert abs(sum(a["probabilities"].values()) - 1) <= 1e-3 and a["answer_confidence"] == max(a["probabilities"].values())
    assert abs(b["score"] - sum(i * p for i, p in enumerate(b["probabilities"].values()))) <= 1e-3
    assert c["confidence"] == round(max(c["noul"], 1 - c["noul"]), 4)
    assert body["routing"] == {"model": "english", "repo": body["routing"]["repo"],
                               "reason": "explicit model='english'", "detection": None, "workflow": None}
    raw = httpx.post(gateway() + "/v1/systemone", timeout=60,
                     json={"state": S, "questions": _choice({"技术": "x", "é": "y"})}).content
    assert "技术".encode() in raw and b"\\u" not in raw and b'": ' not in raw


# --------------------------------------------------------------------------------- protocol surface
@pytest.mark.parametrize("method,path", [
    ("GET", "/v1/systemone"), ("GET", "/v1/systemone/batch"), ("PUT", "/v1/systemone"),
    ("OPTIONS", "/v1/systemone"), ("POST", "/health"), ("HEAD", "/health"), ("GET", "/v1/models"),
    ("GET", "/metrics"), ("GET", "/healthz"), ("POST", "/v1/systemone/"), ("POST", "/v1/systemone/batch/"),
])
def test_protocol_surface_matches_upstream(gateway, upstream, method, path):
    ours = compare(gateway, upstream, _body() if method == "POST" else None, path=path, method=method)
    assert ours.status_code in (307, 404, 405)


@pytest.mark.parametrize("content_type", ["text/plain", ""])
def test_content_type_is_not_checked(gateway, upstream, content_type):
    compare(gateway, upstream, _body(), headers={"content-type": content_type})


# --------------------------------------------------------------------------------- auth
AUTH = {"LAYA_API_KEY": KEY}


@pytest.mark.parametrize("headers", [
    {}, {"authorization": "Bearer wrong"}, {"authorization": "bearer k"}, {"authorization": "Bearer  k"},
    {"x-api-key": "k"}, {"authorization": "Bearer k"}, {"authorization": "Bearer K"},
], ids=["none", "wrong", "lowercase", "two_spaces", "x_api_key", "right", "key_case"])
@pytest.mark.parametrize("path", ["/v1/systemone", "/v1/systemone/batch"])
def test_auth_matches_upstream(gateway, upstream, headers, path):
    body = _body() if path == "/v1/systemone" else {"states": [S], "questions": {"q": NOUL}}
    ours = compare(gateway, upstream, body, path=path, headers=headers, env=AUTH)
    if headers.get("authorization") != "Bearer k":
        assert ours.status_code == 401 and ours.json() == {"detail": "invalid or missing bearer token"}


@pytest.mark.parametrize("body", [b"{not json", b"x" * (3 * 1024 * 1024), b'{"state":null,"questions":{}}'],
                         ids=["invalid_json", "3MiB", "null_state"])
def test_auth_is_checked_first(gateway, upstream, body):
    ours = compare(gateway, upstream, body, env=AUTH)
    assert ours.status_code == 401


def test_non_latin1_authorization_is_401(gateway):
    url = gateway(AUTH)
    status, _, _ = raw_request(url, b"POST /v1/systemone HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer s\xe9cret\r\n"
                                    b"Content-Length: 2\r\nConnection: close\r\n\r\n{}")
    assert status == 401


@pytest.mark.parametrize("headers", [{}, {"authorization": "Bearer wrong"}, {"authorization": "Bearer k"}])
def test_health_with_key(gateway, headers):
    r = httpx.get(gateway(AUTH) + "/health", headers=headers)
    assert r.status_code == 200
    if headers.get("authorization") == "Bearer k":
        _assert_full_health(r.json())
    else:
        assert r.content == b'{"status":"ok"}'


def test_health_without_key(gateway):
    r = httpx.get(gateway() + "/health")
    assert r.status_code == 200 and "server-timing" not in r.headers
    _assert_full_health(r.json())


def _assert_full_health(h: dict) -> None:
    assert list(h)[:8] == ["status", "loaded", "revisions", "device", "device_is_preference",
                           "checkpoint_devices", "cpu_fallbacks", "ready"]
    assert h["status"] == "ok" and h["ready"] is True and isinstance(h["loaded"], list)
    assert set(h["revisions"]) == set(h["checkpoint_devices"]) == set(h["loaded"])


@pytest.mark.parametrize("path", ["/docs", "/redoc", "/openapi.json"])
def test_docs_are_not_served(gateway, path):
    r = httpx.get(gateway() + path)
    assert r.status_code == 404 and r.json() == {"detail": "Not Found"}


# --------------------------------------------------------------------------------- raw-socket limits
def raw_request(url: str, data: bytes, send_more: bytes | None = None, timeout: float = 30.0):
    """Send bytes, read one response: (status, headers dict, body bytes)."""
    host, port = httpx.URL(url).host, httpx.URL(url).port
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(data)
        if send_more:
            try:
                s.sendall(send_more)
            except OSError:
                pass   # the server may answer and close before the rest is sent
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
        head, _, rest = buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
        length = int(headers.get("content-length", 0))
        while len(rest) < length:
            chunk = s.recv(65536)
            if not chunk:
                break
            rest += chunk
        return status, headers, rest[:length]


def test_declared_length_over_cap_refused_before_body(gateway):
    status, _, body = raw_request(gateway(), b"POST /v1/systemone HTTP/1.1\r\nHost: t\r\n"
                                             b"Content-Length: 3000000\r\n\r\n")
    assert (status, body) == (413, b'{"detail":"request body too large"}')


def test_chunked_upload_over_cap(gateway):
    chunk = b"x" * 65536
    frames = (b"%x\r\n" % len(chunk) + chunk + b"\r\n") * 33 + b"0\r\n\r\n"
    status, _, body = raw_request(gateway(), b"POST /v1/systemone HTTP/1.1\r\nHost: t\r\n"
                                             b"Transfer-Encoding: chunked\r\n\r\n", send_more=frames)
    assert (status, body) == (413, b'{"detail":"request body too large"}')


def test_chunked_upload_under_cap_answers(gateway):
    payload = json.dumps(_body(questions={"q": NOUL})).encode()
    frames = b"%x\r\n" % len(payload) + payload + b"\r\n0\r\n\r\n"
    status, headers, body = raw_request(gateway(), b"POST /v1/systemone HTTP/1.1\r\nHost: t\r\n"
                                                   b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n" + frames)
    assert status == 200 and json.loads(body)["answers"]["q"]["type"] == "noul"


# one slot and no queue: upstream's refuse-at-once (LAYA_MAX_QUEUE=0)
SLOW = {"LAYA_MAX_CONCURRENT": "1", "LAYA_MAX_QUEUE": "0", "LAYA_BODY_READ_TIMEOUT": "1.5"}


def test_stalled_upload_holds_the_only_slot_then_gets_408(gateway):
    url = gateway(SLOW)
    host, port = httpx.URL(url).host, httpx.URL(url).port
    stalled = socket.create_connection((host, port), timeout=10)
    try:
        stalled.sendall(b"POST /v1/systemone HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n0123456789")
        time.sleep(0.3)
        started = time.time()
        busy = httpx.post(url + "/v1/systemone", json=_body())
        assert busy.status_code == 503 and busy.headers["retry-after"] == "1"
        assert busy.json() == {"detail": "server busy, try again later"}
        assert httpx.get(url + "/health").status_code == 200
        reply = b""
        while b"\r\n\r\n" not in reply or not reply.endswith(b"}"):
            chunk = stalled.recv(65536)
            if not chunk:
                break
            reply += chunk
        assert reply.startswith(b"HTTP/1.1 408 ")
        assert reply.endswith(b'{"detail":"request body was not received in time"}')
        assert 0.8 <= time.time() - started <= 5
    finally:
        stalled.close()
    assert httpx.post(url + "/v1/systemone", json=_body(), timeout=60).status_code == 200


def test_unauthorized_gets_401_while_saturated(gateway):
    url = gateway({**SLOW, **AUTH})
    host, port = httpx.URL(url).host, httpx.URL(url).port
    with socket.create_connection((host, port), timeout=10) as stalled:
        stalled.sendall(b"POST /v1/systemone HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer k\r\n"
                        b"Content-Length: 100\r\n\r\n01234")
        time.sleep(0.3)
        assert httpx.post(url + "/v1/systemone", json=_body()).status_code == 401
        assert httpx.post(url + "/v1/systemone", json=_body(),
                          headers={"authorization": "Bearer k"}).status_code == 503


# --------------------------------------------------------------------------------- import hygiene
def test_gateway_never_imports_torch_or_mlx():
    code = ("import sys, laya_grpc.gateway.http_app, laya_grpc.engine.decider, laya_grpc.gateway.http_body; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'mlx')); "
            "print(bad); sys.exit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert out.returncode == 0, out.stdout + out.stderr
