"""decode.py / answers.py / temperatures.py / confidence_gate.py against upstream laya 0.4.15's own functions.

The same raw logits go through upstream's `Agent._decode_answers` (on a hand-built Agent carrying
only the temperatures) and through our numpy decoder; every field, its value and the key order must
agree. The one deliberate difference: upstream takes the act softmax from torch and we compute it in
numpy, so `act_probability` may differ by one unit in the 4th place when the float32 values straddle
a rounding boundary (about 1 value in 10^4); everything else is compared exactly.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
import shutil
import warnings

import numpy as np
import pytest
import torch

from laya import confidence as up_confidence
from laya import serve as up_serve
from laya.agent import Agent
from laya.common import clamp_temperature as up_clamp
from laya.common import temp_bucket as up_bucket

from laya_grpc.core.decisions.answers import Decision, Gate, Usage
from laya_grpc.core.decisions.confidence_gate import check_min_confidence
from laya_grpc.core.decisions.decode import decode_answer, jev_confidence
from laya_grpc.core.errors import Kind, LayaError
from laya_grpc.core.decisions.questions import parse_questions
from laya_grpc.core.decisions.routing import Routing
from laya_grpc.core.decisions.temperatures import Temperatures, clamp_temperature, option_bucket

CONFIGS = {
    "none": {},
    "tiny": {"temperature": [1.25, 0.9, 1.1],
             "temperature_by_options": {"choice:2": 1.2, "choice:3-5": 0.8, "choice:6-10": 1.5,
                                        "score:3-5": 0.7, "noul:2": 1.05}},
    "buckets": {"temperature": [2.0, 3.0, 0.7],
                "temperature_by_options": {"choice:11+": 0.1006, "score:2": 4.0, "score:6-10": 1.7,
                                           "score:11+": 2.5, "choice:6-10": 0.6, "noul:2": 1.9}},
    "clamped": {"temperature": [0.1, True, "abc"],
                "temperature_by_options": {"choice:11+": 0.1006, "score:6-10": 7, "noul:2": float("nan"),
                                           "choice:2": float("inf"), "choice:3-5": False, "score:3-5": None}},
}


def _quiet_temperatures(cfg: dict) -> Temperatures:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return Temperatures.from_config(cfg)


def _upstream_agent(cfg: dict) -> Agent:
    agent = Agent.__new__(Agent)
    agent.temperature = [up_clamp(t) for t in cfg.get("temperature", [1.0, 1.0, 1.0])]
    agent.temperature_by_options = {k: up_clamp(v) for k, v in cfg.get("temperature_by_options", {}).items()}
    agent.lang_temperatures = {}
    agent.binning_map = None
    return agent


def _both_typed(qdef: dict, slot_logits: np.ndarray, act_logits: np.ndarray, cfg: dict, min_confidence=None):
    """(ours, upstream's) answer for one question from the same raw outputs."""
    k = len(slot_logits)
    padded = np.full((1, k + 3), -1e4, dtype=np.float32)     # wider batch rows, as a collate makes
    padded[0, :k] = slot_logits
    act = torch.softmax(torch.from_numpy(act_logits[None].astype(np.float32)), -1).numpy()
    internal = {"q": Agent._to_internal(qdef)}
    theirs = _upstream_agent(cfg)._decode_answers(padded, act, [{"markers": list(range(k))}], ["q"],
                                                  internal, 0)["q"]
    question = parse_questions({"q": qdef})[0]
    ours = decode_answer(question, slot_logits, act_logits, _quiet_temperatures(cfg), min_confidence)
    return ours, theirs


def _both(qdef: dict, slot_logits: np.ndarray, act_logits: np.ndarray, cfg: dict):
    """(ours, upstream's) answer dict for one question, in `Agent.predict`'s form."""
    ours, theirs = _both_typed(qdef, slot_logits, act_logits, cfg)
    return ours.body(served=False), theirs


def _assert_same(ours: dict, theirs: dict) -> None:
    a_ours = ours["action"]["act_probability"]
    a_theirs = theirs["action"]["act_probability"]
    assert abs(a_ours - a_theirs) <= 1e-4 + 1e-12
    strip = lambda d: {**d, "action": None}   # noqa: E731 -- keeps key order
    assert json.dumps(strip(ours)) == json.dumps(strip(theirs))
    # JSON equality above also fixes the key order; the Python types of `choice` too:
    assert type(ours.get("choice")) is type(theirs.get("choice"))


def _question(qtype: str, k: int, rng: np.random.Generator) -> dict:
    if qtype == "noul":
        q = {"type": "noul", "instructions": "Is it so?"}
    elif qtype == "score":
        q = {"type": "score", "instructions": "How much?",
             "criteria": [[{"d": i}, "level %d" % i, 2.5 * i, "ünï %d" % i][i % 4] for i in range(k)]}
    else:
        labels = ["opt%d" % i for i in range(k)]
        q = {"type": "choice", "instructions": "Which one?",
             "criteria": labels if k % 2 else {lab: "desc %s" % lab for lab in labels}}
    if rng.random() < 0.4:
        q["option_order"] = [int(i) for i in rng.permutation(2 if qtype == "noul" else k)]
    return q


@pytest.mark.parametrize("cfg_name", sorted(CONFIGS))
def test_random_logits_match_upstream(cfg_name):
    rng = np.random.default_rng(1234 + len(cfg_name))
    cfg = CONFIGS[cfg_name]
    n = 0
    for qtype in ("choice", "score", "noul"):
        for k in ([2] if qtype == "noul" else range(1, 15)):
            for scale in (0.05, 1.0, 4.0, 30.0):
                for _ in range(6):
                    q = _question(qtype, k, rng)
                    logits = (rng.standard_normal(k) * scale).astype(np.float32)
                    act = (rng.standard_normal(2) * scale).astype(np.float32)
                    _assert_same(*_both(q, logits, act, cfg))
                    n += 1
    assert n == (14 + 14 + 1) * 4 * 6


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.parametrize("logits", [
    [0.0],                                  # k=1: softmax is exactly [1.0]
    [3.0, 3.0],                             # tie: argmax takes the first
    [1.0, 5.0, 5.0, 5.0],                   # three-way tie behind the first slot
    [0.0] * 14,                             # uniform over 14
    [1e4, -1e4, 0.0],                       # huge spread
    [3e38, -3e38],                          # near float32 max
    [-1e4] * 5,                             # all equal to the collate's pad value
    [1e-7, 0.0, -1e-7],                     # differences below float32 resolution after scaling
    [50.0, 49.99997, -80.0, 12.5, 12.5, 12.5, 0.0, 0.0, 1.0, 2.0, 3.0],   # 11+ bucket, ties
])
@pytest.mark.parametrize("qtype", ["choice", "score"])
def test_edge_logits_match_upstream(logits, qtype):
    k = len(logits)
    q = ({"type": "choice", "instructions": "x", "criteria": ["l%d" % i for i in range(k)]} if qtype == "choice"
         else {"type": "score", "instructions": "x", "criteria": ["s%d" % i for i in range(k)]})
    for cfg in CONFIGS.values():
        _assert_same(*_both(q, np.asarray(logits, dtype=np.float32), np.asarray([4700.0, -3800.0], np.float32), cfg))
        if k > 1:
            q2 = {**q, "option_order": list(range(k))[::-1]}
            _assert_same(*_both(q2, np.asarray(logits, dtype=np.float32), np.asarray([0.3, 0.2], np.float32), cfg))


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.parametrize("logits", [[0.0, 0.0], [1e4, -1e4], [-2.5, 7.25], [3e38, -3e38]])
def test_noul_edges_and_labels(logits):
    for qdef in ({"type": "noul", "instructions": "Refund?"},
                 {"type": "noul", "instructions": {"ask": "Refund?"}, "criteria": {"TRUE": "asks", "false": "no"},
                  "labels": {"true": " A ", "false": "B"}, "option_order": [1, 0]}):
        for cfg in CONFIGS.values():
            _assert_same(*_both(qdef, np.asarray(logits, np.float32), np.asarray([1.0, -1.0], np.float32), cfg))


def test_numeric_and_bool_labels_keep_their_type():
    qdef = {"type": "choice", "instructions": "pick", "criteria": [2, 2.5, False, "2", 7]}
    rng = np.random.default_rng(7)
    seen = set()
    for _ in range(60):
        logits = (rng.standard_normal(5) * 3).astype(np.float32)
        ours, theirs = _both(qdef, logits, np.asarray([0.1, 0.4], np.float32), CONFIGS["tiny"])
        _assert_same(ours, theirs)
        seen.add(type(ours["choice"]))
        assert list(ours["probabilities"]) == [2, 2.5, False, "2", 7]
    assert seen >= {int, float, bool, str}
    # JSON stringifies the keys; 2 and "2" are distinct labels that collide on the wire (upstream G12)
    wire = json.loads(json.dumps(ours), object_pairs_hook=lambda pairs: pairs)
    assert [k for k, _ in dict(wire)["probabilities"]] == ["2", "2.5", "false", "2", "7"]


def test_temperature_buckets_and_clamping_match_upstream():
    for cfg in CONFIGS.values():
        ours = _quiet_temperatures(cfg)
        theirs = _upstream_agent(cfg)
        for qtype in range(3):
            for k in range(1, 40):
                assert option_bucket(qtype, k) == up_bucket(qtype, k)
                want = theirs.temperature_by_options.get(up_bucket(qtype, k), theirs.temperature[qtype])
                assert ours.for_question(qtype, k) == want
    # the bucket edges, written out
    t = _quiet_temperatures(CONFIGS["buckets"])
    assert [t.for_question(0, k) for k in (1, 2, 3, 5, 6, 10, 11, 60)] == [2.0, 2.0, 2.0, 2.0, 0.6, 0.6, 0.5, 0.5]
    assert [t.for_question(1, k) for k in (2, 3, 6, 11)] == [4.0, 3.0, 1.7, 2.5]
    for raw in (0.1, 0.5, 5.0, 5.1, -3, True, False, None, "2", "abc", float("nan"), float("inf"), [1]):
        assert clamp_temperature(raw) == up_clamp(raw)


def test_clamping_warning_is_upstreams(tiny_ckpt, tmp_path):
    """Upstream warns at load, naming every replaced entry; compared with a real `laya.load`."""
    import laya
    ckpt = str(tmp_path / "ckpt")
    shutil.copytree(tiny_ckpt, ckpt)
    path = os.path.join(ckpt, "rl_agent_config.json")
    with open(path) as f:
        cfg = json.load(f)
    cfg.update(CONFIGS["clamped"])
    with open(path, "w") as f:
        json.dump(cfg, f)
    with warnings.catch_warnings(record=True) as up_w:
        warnings.simplefilter("always")
        laya.load(ckpt, device="cpu")
    with open(path) as f:
        reread = json.load(f)
    with warnings.catch_warnings(record=True) as our_w:
        warnings.simplefilter("always")
        Temperatures.from_config(reread)
    up_msgs = [str(w.message) for w in up_w if "invalid temperatures" in str(w.message)]
    our_msgs = [str(w.message) for w in our_w]
    assert len(up_msgs) == 1 and our_msgs == up_msgs
    assert all(w.category is RuntimeWarning for w in our_w)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Temperatures.from_config(CONFIGS["tiny"])           # valid values: no warning


def test_bad_temperature_shapes_are_checkpoint_errors():
    for cfg in ({"temperature": [1.0, 1.0]}, {"temperature": 1.0}, {"temperature_by_options": [1.0]}):
        with pytest.raises(LayaError) as e:
            Temperatures.from_config(cfg)
        assert e.value.kind is Kind.CHECKPOINT and "temperature" in e.value.detail


@pytest.mark.parametrize("cfg_name", sorted(CONFIGS))
def test_temperatures_cross_the_status_contract_as_applied(cfg_name):
    """CheckpointStatus.temperatures carries the clamped values the engine decodes with, every
    bucket override included, so the gateway reads no rl_agent_config.json."""
    from laya_proto.v1 import status_pb2
    applied = _quiet_temperatures(CONFIGS[cfg_name])
    st = status_pb2.CheckpointStatus()
    applied.to_proto(st.temperatures)
    got = Temperatures.from_proto(status_pb2.CheckpointStatus.FromString(st.SerializeToString()).temperatures)
    assert got == applied
    assert all(got.for_question(qt, k) == applied.for_question(qt, k) for qt in range(3) for k in (2, 4, 8, 12))


BAD_THRESHOLDS = [1.5, -0.1, True, False, "0.5", float("nan"), float("inf"), [0.5], {},
                  {"choice:7": 0.5}, {"default": 2}, {"noul:2": True}, {1: 0.5}, {"Choice:2": 0.5},
                  {"default": 0.5, "score:11+": "x"}]


@pytest.mark.parametrize("bad", BAD_THRESHOLDS, ids=repr)
def test_min_confidence_errors_are_upstreams(bad):
    with pytest.raises(ValueError) as up_err:
        up_confidence.check_min_confidence(bad)
    with pytest.raises(LayaError) as err:
        check_min_confidence(bad)
    assert err.value.kind is Kind.INVALID and err.value.kind.http_status == 422
    assert err.value.detail == str(up_err.value)


GOOD_THRESHOLDS = [0.0, 0.4, 0.5, 0.75, 1, 1.0, {"default": 0.6},
                   {"choice:2": 0.9, "default": 0.1}, {"choice:3-5": 0.5, "score:6-10": 0.3, "noul:2": 0.8},
                   {"choice:11+": 0.2, "score:2": 0.99}]


def _random_answers(rng: np.random.Generator, cfg: dict, min_confidence=None) -> tuple[Decision, dict]:
    """Ten answers, ours (as one Decision, with upstream's act probability for a JSON compare, gated at
    `min_confidence`) and upstream's (not gated)."""
    ours, theirs = [], {}
    for i, (qtype, k) in enumerate([("choice", 1), ("choice", 2), ("choice", 4), ("choice", 8), ("choice", 12),
                                    ("score", 2), ("score", 5), ("score", 7), ("score", 13), ("noul", 2)]):
        q = _question(qtype, k, rng)
        o, t = _both_typed(q, (rng.standard_normal(k) * 2).astype(np.float32), np.asarray([2.0, 0.0], np.float32),
                           cfg, min_confidence)
        ours.append(dataclasses.replace(o, qid="q%d" % i, act_probability=t["action"]["act_probability"]))
        theirs["q%d" % i] = t
    return Decision(tuple(ours), Usage(9, 0)), theirs


@pytest.mark.parametrize("threshold", GOOD_THRESHOLDS, ids=repr)
def test_gate_matches_upstream(threshold):
    rng = np.random.default_rng(99)
    states = set()
    for _ in range(20):
        ours, theirs = _random_answers(rng, CONFIGS["tiny"], check_min_confidence(threshold))
        gated = ours.body()["answers"]
        up = [{"answers": theirs}]
        up_confidence.apply_confidence_gate(up, up_confidence.check_min_confidence(threshold))
        assert json.dumps(gated) == json.dumps(up[0]["answers"])
        states |= {a["abstention"] for a in gated.values()}
    if threshold not in (0.0, 1):
        assert states == {"passed", "abstained"}


def test_gate_unset_writes_nothing_and_unevaluated_is_reported():
    ours, _ = _random_answers(np.random.default_rng(3), CONFIGS["none"], check_min_confidence(None))
    assert all(a.gate is None for a in ours.answers) and "abstention" not in json.dumps(ours.body())
    up = [{"answers": {"x": {"type": "choice", "probabilities": {"a": 0.5}, "answer_confidence": float("nan"),
                             "confidence": float("nan")}}}]
    up_confidence.apply_confidence_gate(up, 0.3)
    gate = Gate.of("choice", 1, float("nan"), float("nan"), 0.3)
    assert (gate.abstention, gate.threshold) == ("unevaluated", up[0]["answers"]["x"]["abstention_threshold"])
    assert up[0]["answers"]["x"]["abstention"] == "unevaluated" and "low_confidence" not in up[0]["answers"]["x"]


@pytest.mark.parametrize("gate", [None, 0.6, {"score:6-10": 0.9, "default": 0.2}], ids=repr)
def test_serve_fields_match_upstream(gate):
    rng = np.random.default_rng(5)
    for _ in range(30):
        ours, theirs = _random_answers(rng, CONFIGS["buckets"], check_min_confidence(gate))
        routing = Routing(model="english", repo=None, reason="r", detection=None, workflow=None)
        decision = dataclasses.replace(ours, routing=routing)
        up_result = {"model": "laya-rl-agent", "answers": theirs, "usage": ours.usage.body(), "routing": routing.block()}
        up_confidence.apply_confidence_gate([up_result], up_confidence.check_min_confidence(gate)
                                            if gate is not None else None)
        served = decision.body()
        assert json.dumps(served) == json.dumps(up_serve._add_jev_confidence(copy.deepcopy(up_result)))
        assert (json.dumps(dataclasses.replace(decision, strict=True).body())
                == json.dumps(up_serve._project_jev_strict(up_result)))
        for a in served["answers"].values():
            keys = list(a)
            if a["type"] == "noul":
                assert "x_jev_confidence" not in a
            else:
                assert keys[-1] == "x_jev_confidence"
                assert 0.0 <= a["x_jev_confidence"] <= 1.0
        assert "x_jev_confidence" not in json.dumps(ours.body())   # Agent.predict's form has none


def test_jev_confidence_single_option_and_rounding():
    assert jev_confidence("choice", [1.0]) == 1.0
    # computed from the ROUNDED probabilities, as upstream does
    score = {"type": "score", "probabilities": {"0": 0.1235, "1": 0.3333, "2": 0.5432}}
    got = jev_confidence("score", list(score["probabilities"].values()))
    assert got == round(up_confidence.jev_confidence(score), 4)
    assert not math.isnan(got)


def test_decode_refuses_a_logit_count_that_is_not_the_option_count():
    q = parse_questions({"q": {"type": "choice", "instructions": "x", "criteria": ["a", "b", "c"]}})[0]
    with pytest.raises(LayaError) as e:
        decode_answer(q, np.zeros(2, np.float32), np.zeros(2, np.float32), _quiet_temperatures({}))
    assert "2 option logits for 3 options" in e.value.detail


def test_decode_is_torch_free():
    """decode/temperatures/confidence_gate must import without torch (the gateway has none)."""
    import subprocess
    import sys
    code = ("import sys; sys.modules['torch'] = None; "
            "import laya_grpc.core.decisions.decode, laya_grpc.core.decisions.temperatures, laya_grpc.core.decisions.confidence_gate; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
