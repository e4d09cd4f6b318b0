"""The bench's parity stage on CPU: the served stack (real `laya-grpc serve` subprocess) against
upstream laya on CPU float32 over the declared set. CPU float32 serving must be exact to the served
4 decimals, and an answer must not move when other questions share its request."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from laya_grpc.bench.parity import compare, declared_bodies, numbers

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_declared_set_spans_the_issue():
    bodies = dict(declared_bodies())
    qs = [q for b in bodies.values() for q in b["questions"].values()]
    assert {q["type"] for q in qs} == {"choice", "score", "noul"}
    assert {len(b["questions"]) for b in bodies.values()} >= set(range(1, 9))
    options = {len(q["criteria"]) for q in qs if "criteria" in q}
    assert min(options) == 2 and max(options) == 12
    assert any(isinstance(b["state"], list) for b in bodies.values())          # conversations
    alone = [n for n in bodies if n.startswith("alone-")]
    assert len(alone) == 9 and all("beside-" + n[6:] in bodies for n in alone)
    assert declared_bodies() == declared_bodies()                              # deterministic


def test_compare_names_the_worst_field_and_flips():
    theirs = {"answers": {"c": {"choice": "a", "probabilities": {"a": 0.6, "b": 0.4}, "action": {"act_probability": 0.5}}}}
    ours = {"answers": {"c": {"choice": "b", "probabilities": {"a": 0.45, "b": 0.58}, "action": {"act_probability": 0.52},
                              "x_extra": 0.1}}}
    c = compare(ours, theirs)
    assert c["worst_field"] == "c.probabilities.b" and abs(c["max_abs_dp"] - 0.18) < 1e-12
    assert c["flips"] == [{"question": "c", "margin": pytest.approx(0.2)}]
    assert set(numbers(ours["answers"])) == set(numbers(theirs["answers"])) | {"c.x_extra"}
    with pytest.raises(AssertionError, match="missing"):
        compare({"answers": {"c": {"choice": "a"}}}, theirs)


def test_served_cpu_float32_equals_upstream(tiny_ckpt, tmp_path):
    out = tmp_path / "parity.jsonl"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "laya_grpc.bench.parity", "--ckpt", tiny_ckpt, "--device", "cpu",
                           "--dtypes", "auto", "--out", str(out), "--latency-n", "2"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    kinds = [r["kind"] for r in recs]
    assert kinds.index("parity_served_declared") < kinds.index("parity_served"), kinds   # declared first
    r = next(r for r in recs if r["kind"] == "parity_served")
    assert proc.returncode == 0, proc.stderr[-3000:]
    # CPU float32 against upstream's CPU float32: the same arithmetic up to the order of float32 sums,
    # which another CPU's kernels (ATEN_CPU_CAPABILITY) change; a probability on a rounding boundary
    # can then land one served 4-decimal quantum away (1e-4, plus the float error of the difference)
    assert r["passed"] and r["max_abs_dp"] <= 1.5e-4 and r["alone_vs_beside_max_dp"] <= 1.5e-4, r
    assert r["bodies"] == len(declared_bodies()) and r["choice_flips"] == []
    assert r["max_usage_input_tokens"] > 512                   # rows up to max_len, several questions a body
