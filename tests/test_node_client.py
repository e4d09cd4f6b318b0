"""A non-Python client on the real stack: tests/node/client_test.js (Node, @grpc/grpc-js, the
contract loaded from protos/) calls Decide for every question type, DecideBatch, DecideStream,
a failing Decide, grpc.health.v1 Check and Watch, and GetStatus and Watch, through typed fields.
Every value it read must equal the HTTP route's answer to the same request.

Needs node and tests/node/node_modules (`scripts/setup.sh --dev` runs `npm ci` there). Without
them the test skips on a developer machine and fails in CI (CI=true), so CI cannot pass silently.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess

import httpx
import pytest

from laya_grpc.core.wire.json_labels import json_key
from stack import ROOT, Stack

NODE_DIR = os.path.join(ROOT, "tests", "node")
KEY = "node-key"
STATE = "I was charged twice for my order. Please refund the duplicate today."
QUESTIONS = {
    "dept": {"type": "choice", "instructions": "Which department should handle this?",
             "criteria": {"billing": "charges, invoices and refunds", "technical": None, "other": None}},
    "pick": {"type": "choice", "instructions": "Pick one", "criteria": [1, 2.5, False, "x"]},
    "urgency": {"type": "score", "instructions": "How urgent is it?", "criteria": ["not urgent", "soon", "right now"]},
    "refund": {"type": "noul", "instructions": "Does the customer ask for a refund?",
               "criteria": {"true": "asks for money back"}, "labels": {"false": "no", "true": "yes"}},
}
DECIDE = {"state": STATE, "questions": QUESTIONS, "model": "english", "min_confidence": 0.5}
BATCH = {"states": [STATE, {"subject": "login", "body": "cannot login, getting 500 error"}], "questions": QUESTIONS,
         "model": "english"}
BAD_MODEL = {"state": STATE, "questions": {"refund": QUESTIONS["refund"]}, "model": "org/repo"}
KIND_OF = {"choice": "choice", "score": "score", "noul": "noul"}
LABEL_KIND = {str: "string_value", bool: "bool_value", int: "int_value", float: "number_value"}


def _node():
    node = shutil.which("node")
    missing = None
    if node is None:
        missing = "node is not installed (Node 18+ is needed for the non-Python client test)"
    elif not os.path.isdir(os.path.join(NODE_DIR, "node_modules", "@grpc", "grpc-js")):
        missing = "tests/node/node_modules is missing: run `npm ci` in tests/node (scripts/setup.sh --dev does)"
    if missing:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(missing)
        pytest.skip(missing)
    return node


@pytest.fixture(scope="module")
def node_run(tiny_ckpt, tiny_ml_ckpt):
    node = _node()
    with Stack({"english": tiny_ckpt, "multilingual": tiny_ml_ckpt}, env={"LAYA_API_KEY": KEY}) as s:
        p = subprocess.run([node, os.path.join(NODE_DIR, "client_test.js"), s.grpc, KEY], capture_output=True,
                           text=True, timeout=180, cwd=ROOT)
        assert p.returncode == 0, "node client failed:\n%s\n%s" % (p.stderr[-4000:], s.log())
        auth = {"authorization": "Bearer " + KEY}
        http = {name: httpx.post(s.http + route, json=body, headers=auth, timeout=60)
                for name, route, body in (("decide", "/v1/systemone", DECIDE),
                                          ("batch", "/v1/systemone/batch", BATCH),
                                          ("bad_model", "/v1/systemone", BAD_MODEL),
                                          ("score_only", "/v1/systemone",
                                           dict(DECIDE, questions={"urgency": QUESTIONS["urgency"]})))}
        yield json.loads(p.stdout), http


def check_answer(view: dict, want: dict) -> None:
    """One answer as the Node client read it == the HTTP answer, value for value."""
    t = want["type"]
    assert view["type"] == "QUESTION_TYPE_" + t.upper() and view["answer"] == t and view["present"] == [t]
    if t == "choice":
        assert view["choice"] == want["choice"] and view["choice_kind"] == LABEL_KIND[type(want["choice"])]
        assert {json_key(label): p for label, _, p in view["probabilities"]} == want["probabilities"]
        assert [kind for _, kind, _ in view["probabilities"]] == [
            LABEL_KIND[type(x)] for x in ([1, 2.5, False, "x"] if view["id"] == "pick" else ["b", "t", "o"])]
    elif t == "score":
        assert view["score"] == want["score"]
        assert view["legend"] == list(want["legend"].values())
        assert view["probabilities"] == list(want["probabilities"].values())
    else:
        assert view["noul"] == want["noul"]
    for k in ("confidence", "answer_confidence", "low_confidence", "abstention_threshold", "x_jev_confidence"):
        assert view.get(k) == want.get(k), k
    assert view["act_probability"] == want["action"]["act_probability"]
    assert view["abstention"] == ("ABSTENTION_" + want["abstention"].upper() if "abstention" in want
                                  else "ABSTENTION_UNSPECIFIED")


def check_response(view: dict, want: dict) -> None:
    assert view["model"] == want["model"]
    assert [a["id"] for a in view["answers"]] == list(want["answers"])
    for a in view["answers"]:
        check_answer(a, want["answers"][a["id"]])
    u = want["usage"]
    assert view["usage"] == {"input_tokens": u["input_tokens"], "output_tokens": u["output_tokens"],
                             "state_tokens": u.get("state_tokens"), "truncated": u.get("truncated")}
    r = want["routing"]
    assert view["routing"] == {"model": r["model"], "reason": r["reason"], "repo": r["repo"]}


def test_decide_every_question_type(node_run):
    got, http = node_run
    assert http["decide"].status_code == 200
    check_response(got["decide"], http["decide"].json())
    assert not got["decide"]["has_json"]                        # rendered only on include_json
    assert json.loads(got["decide_json"]) == http["decide"].json()
    types = {a["answer"] for a in got["decide"]["answers"]}
    assert types == {"choice", "score", "noul"}


def test_decide_batch(node_run):
    got, http = node_run
    want = http["batch"].json()
    assert len(got["batch"]["results"]) == len(want["results"]) == 2
    for view, w in zip(got["batch"]["results"], want["results"]):
        check_response(view, w)
    assert got["batch"]["total_usage"] == want["total_usage"]


def test_decide_stream(node_run):
    got, http = node_run
    stream = got["stream"]
    assert sorted(stream) == ["1", "2", "3"]
    check_response(stream["1"]["response"], http["decide"].json())
    err = stream["2"]["error"]
    assert {k: err[k] for k in ("kind", "detail")} == {"kind": "INVALID", "detail": http["bad_model"].json()["detail"]}
    assert len(err["status"]["data"]) > 0   # the serialized google.rpc.Status, as a Node Buffer
    check_response(stream["3"]["response"], http["score_only"].json())


def test_errors(node_run):
    got, http = node_run
    bad = got["errors"]["bad_model"]
    assert http["bad_model"].status_code == 422
    assert bad == {"code": 3, "details": http["bad_model"].json()["detail"], "kind": "INVALID",
                   "has_status_details": True}
    conflict = got["errors"]["conflict"]
    assert conflict["code"] == 3 and conflict["kind"] == "BAD_REQUEST" and conflict["has_status_details"]
    assert "request_json" in conflict["details"] and "state" in conflict["details"]


def test_health_and_status(node_run):
    got, _ = node_run
    assert got["health_check"] == got["health_check_decisions"] == got["health_watch"] == "SERVING"
    st = got["status"]
    assert st["ready"] is True and st["reason"] == "initial"
    services = dict(st["services"])
    assert set(services) == {"gateway", "tokenizer", "inference"}
    assert set(services.values()) == {"STATE_READY"}
    assert got["status_watch"] == "initial"
