"""`laya-grpc predict` (a real subprocess) against upstream `laya.load(path).predict(...)`.

One JSONL file of generated requests (every question type, 1-14 options, dict/list criteria,
numeric/bool labels, noul labels, option orders, dict/list/string states that truncate, unicode,
max_len/head_max_len overrides, min_confidence scalars and bucket maps) plus bad lines, on the tiny,
tiny-ml and tiny-par fixtures and on a tiny copy whose temperatures need clamping. Per line: the
same keys in the same order, every decision (choice label, gate state, usage) identical, every
number within 1e-4 (our network is an independent implementation: ~1e-6 apart before rounding).
Bad lines give error lines with the status/detail upstream's HTTP server would give, and the good
lines around them are still answered.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

laya = pytest.importorskip("laya")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOL = 1e-4 + 1e-9
CLAMPED_TEMPERATURES = {"temperature": [0.1, True, 7.5],
                        "temperature_by_options": {"choice:11+": 0.1006, "score:6-10": 2.5, "choice:3-5": 0.3,
                                                   "score:2": 1.7, "noul:2": 0.9}}
WORDS = ("refund", "billing", "crash", "login", "urgent", "thanks", "Rückerstattung", "返金", "задержка",
         "[SEP]", "<mask>", "[MASK]", "naïve", "🙂", "order", "42", "shipping", "cancel")


def _text(rng: np.random.Generator, n: int) -> str:
    return " ".join(WORDS[i] for i in rng.integers(0, len(WORDS), n))


def _question(rng: np.random.Generator, qtype: str, k: int) -> dict:
    ins = _text(rng, int(rng.integers(1, 8))) + "?"
    if rng.random() < 0.15:
        ins = {"ask": ins, "lang": "de"} if rng.random() < 0.7 else 12.5
    if qtype == "noul":
        q = {"type": "noul", "instructions": ins}
        if rng.random() < 0.5:
            q["criteria"] = {["true", "TRUE", "True"][int(rng.integers(3))]: _text(rng, 3), "false": _text(rng, 2)}
        if rng.random() < 0.4:
            q["labels"] = {"true": " ja ", "false": "nein"}
    elif qtype == "score":
        q = {"type": "score", "instructions": ins,
             "criteria": [[_text(rng, 2), {"d": _text(rng, 1), "n": i}, i * 1.5, [i, "x"]][i % 4] for i in range(k)]}
    else:
        style = int(rng.integers(4))
        if style == 0:
            crit = {"lab%d %s" % (i, WORDS[i % len(WORDS)]): _text(rng, int(rng.integers(0, 5))) for i in range(k)}
        elif style == 1:
            crit = {"l%d" % i: [None, "", {"why": _text(rng, 2)}, 3][i % 4] for i in range(k)}
        elif style == 2:
            crit = ["opt %d %s" % (i, _text(rng, 1)) for i in range(k)]
        else:   # numeric / bool / string labels that stay distinct under Python equality
            crit = ([False, True] if k == 2 else [2.5, "2", 3, True][:k] if k <= 4
                    else [i + 10 for i in range(k - 1)] + [0.25])
        q = {"type": "choice", "instructions": ins, "criteria": crit}
    if rng.random() < 0.3:
        q["option_order"] = [int(i) for i in rng.permutation(2 if qtype == "noul" else k)]
    return q


def _state(rng: np.random.Generator):
    kind = int(rng.integers(4))
    if kind == 0:
        return _text(rng, int(rng.integers(1, 30)))
    if kind == 1:
        return _text(rng, int(rng.integers(300, 700)))           # truncates at max_len 512
    if kind == 2:
        return [{"role": ["user", "agent"][i % 2], "content": _text(rng, int(rng.integers(5, 60)))}
                for i in range(int(rng.integers(1, 25)))]           # conversation: keeps the newest turns
    return {"ticket": {"subject": _text(rng, 5), "body": _text(rng, int(rng.integers(10, 200))), "id": 7,
                       "vip": True, "score": 0.5}}


def _requests(seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for k in range(1, 15):                                          # every option count, each type
        out.append({"state": _state(rng), "questions": {"c": _question(rng, "choice", k),
                                                        "s": _question(rng, "score", k)}})
    for i in range(30):
        qs = {}
        for j in range(int(rng.integers(1, 6))):
            qtype = ["choice", "score", "noul"][int(rng.integers(3))]
            qs["q%d_%s" % (j, qtype)] = _question(rng, qtype, int(rng.integers(1, 15)))
        body = {"state": _state(rng), "questions": qs}
        if i % 3 == 0:
            body["max_len"] = int(rng.integers(64, 200))
        if i % 5 == 0:
            body["head_max_len"] = int(rng.integers(40, 120))
        if i % 4 == 1:
            body["min_confidence"] = [0.05, 0.37, 0.61, 0.93, 1.0, 0][i % 6]
        if i % 4 == 3:
            body["min_confidence"] = {"choice:2": 0.7, "choice:3-5": 0.4, "score:6-10": 0.2, "noul:2": 0.55,
                                      "default": 0.33} if i % 8 == 3 else {"score:11+": 0.15}
        out.append(body)
    # head squeeze: many long options in a small head budget (collapsed spans -> usage.options)
    out.append({"state": "short", "questions": {"big": {"type": "choice", "instructions": "pick one of these",
                                                        "criteria": {"option %d %s" % (i, _text(rng, 30)): None
                                                                     for i in range(14)}}},
                "head_max_len": 60})
    out.append({"state": "unicode ünïcödé 日本語 🙂", "questions": {"é": {"type": "noul", "instructions": "¿sí?"}},
                "max_len": 90})
    out.append({"state": 12345, "questions": {"n": {"type": "score", "instructions": "n?", "criteria": ["a"]}}})
    return out


# (line text, expected status, expected detail or None = upstream's exception text for that body)
BAD_LINES = [
    ("{not json", 400, "invalid JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
    (json.dumps({"questions": {}}), 400, "'state' is required"),
    (json.dumps({"state": "x"}), 400, "request body must be an object with a 'questions' field"),
    (json.dumps({"state": "x", "questions": []}), 400, "'questions' must be an object"),
    (json.dumps({"state": "x", "questions": {"a": {"type": "choices", "instructions": "y"}}}), 422, None),
    (json.dumps({"state": "x", "questions": {"a": {"type": "score", "instructions": "y", "criteria": []}}}), 422, None),
    (json.dumps({"state": "x", "questions": {"a": {"type": "noul", "instructions": "y"}},
                 "min_confidence": {"choice:7": 0.5}}), 422, None),
    (json.dumps({"state": "x", "questions": {"a": {"type": "noul", "instructions": "y"}},
                 "min_confidence": True}), 422, None),
    (json.dumps({"state": "x", "questions": {"a": {"type": "noul", "instructions": "y"}}, "max_len": "9"}),
     422, "max_len must be an integer"),
    (json.dumps({"state": "x", "questions": {"a": {"type": "noul", "instructions": "y"}}, "head_max_len": 0}),
     422, "head_max_len must be a positive integer"),
    (json.dumps({"state": "x", "questions": {"a": {"type": "choice", "instructions": "pick",
                                                   "criteria": ["o%d" % i for i in range(12)]}}, "max_len": 30}),
     422, None),                                                    # markers past max_len: upstream's text
]


def _compare(ours, theirs, path, dps):
    """Same structure and key order; numbers within TOL; decisions and everything else exact."""
    if isinstance(theirs, list) and theirs and all(isinstance(p, tuple) for p in theirs):
        assert [k for k, _ in ours] == [k for k, _ in theirs], path
        for (k, a), (_, b) in zip(ours, theirs):
            _compare(a, b, path + "." + k, dps)
    elif isinstance(theirs, list) and theirs and isinstance(theirs[0], list):
        assert len(ours) == len(theirs), path
        for i, (a, b) in enumerate(zip(ours, theirs)):
            _compare(a, b, "%s[%d]" % (path, i), dps)
    elif isinstance(theirs, float) and not path.endswith(".choice"):
        assert isinstance(ours, float), path
        dps.append(abs(ours - theirs))
        assert abs(ours - theirs) <= TOL, (path, ours, theirs)
    else:
        assert ours == theirs and type(ours) is type(theirs), (path, ours, theirs)


def _pairs(text: str):
    return json.loads(text, object_pairs_hook=lambda p: [tuple(x) for x in p])


def _env(**extra) -> dict:
    """Subprocess env: the repo importable, one torch thread (the test machine is shared)."""
    return {**os.environ, "OMP_NUM_THREADS": "1",
            "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), **extra}


@pytest.fixture(scope="module")
def upstream_threads():
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def ckpts(tiny_ckpt, tiny_ml_ckpt, tiny_par_ckpt, tmp_path_factory) -> dict:
    """The session fixtures by name, plus `tiny-clamped`: a tiny copy whose temperatures need clamping."""
    clamped = str(tmp_path_factory.mktemp("ckpt") / "tiny-clamped")
    shutil.copytree(tiny_ckpt, clamped)
    cfg_path = os.path.join(clamped, "rl_agent_config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg.update(CLAMPED_TEMPERATURES)
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    return {"tiny": tiny_ckpt, "tiny-ml": tiny_ml_ckpt, "tiny-par": tiny_par_ckpt, "tiny-clamped": clamped}


@pytest.fixture(scope="module", params=["tiny", "tiny-ml", "tiny-par", "tiny-clamped", "tiny-ml/mlx"])
def checkpoint(request, ckpts, upstream_threads):
    """(name, checkpoint dir, backend); `/mlx` runs our MLX network instead of torch."""
    name, _, backend = request.param.partition("/")
    if backend == "mlx":
        pytest.importorskip("mlx.core")
    return request.param, ckpts[name], backend or "torch"


def test_predict_matches_upstream(checkpoint, tmp_path, upstream_agent):
    name, path, backend = checkpoint
    requests = _requests(seed=sum(map(ord, name)))
    lines, expect = [], []          # expect: ("ok", body) or ("error", status, detail)
    for i, body in enumerate(requests):
        lines.append(json.dumps(body, ensure_ascii=bool(i % 2)))
        expect.append(("ok", body))
        if i % 5 == 2 and BAD_LINES:
            bad = BAD_LINES[(i // 5) % len(BAD_LINES)]
            lines.append(bad[0])
            expect.append(("error",) + bad[1:])
    for bad in BAD_LINES:
        lines.append(bad[0])
        expect.append(("error",) + bad[1:])
    lines.insert(3, "")                                              # blank line: skipped, no output
    src = tmp_path / "requests.jsonl"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")

    proc = subprocess.run([sys.executable, "-m", "laya_grpc.cli", "predict", "--checkpoint", path,
                           "--backend", backend, "--device", "cpu", str(src)],
                          capture_output=True, timeout=600, cwd=REPO, env=_env())
    assert proc.returncode == 1, proc.stderr.decode()[-3000:]       # some lines failed
    out = proc.stdout.decode("utf-8").splitlines()
    assert len(out) == len(expect), proc.stderr.decode()[-3000:]
    assert b"loaded" in proc.stderr

    agent = upstream_agent(path)
    dps: list[float] = []
    n_ok = n_err = n_refused = 0
    line_numbers = [n for n, text in enumerate(lines, start=1) if text.strip()]
    for n, text, want in zip(line_numbers, out, expect):
        got = json.loads(text)
        if want[0] == "ok":
            body = want[1]
            try:
                theirs = agent.predict(body["state"], body["questions"], max_len=body.get("max_len"),
                                       head_max_len=body.get("head_max_len"),
                                       min_confidence=body.get("min_confidence"))
            except ValueError as e:  # e.g. a max_len override too small for the options: same refusal
                assert got == {"error": {"line": n, "status": 422, "detail": str(e)}}, (n, got)
                n_refused += 1
                continue
            assert "error" not in got, (n, got)
            _compare(_pairs(text), _pairs(json.dumps(theirs, ensure_ascii=False)), "line%d" % n, dps)
            n_ok += 1
        else:
            _, status, detail = want
            assert got["error"]["line"] == n and got["error"]["status"] == status, (n, got)
            if detail is None:       # a body upstream's Agent refuses: same text
                body = json.loads(lines[n - 1])
                with pytest.raises(ValueError) as up_err:
                    agent.predict(body["state"], body["questions"], max_len=body.get("max_len"),
                                  min_confidence=body.get("min_confidence"))
                detail = str(up_err.value)
            assert got["error"]["detail"] == detail, (n, got)
            n_err += 1
    assert n_ok + n_refused == len(requests) and n_err == len(expect) - len(requests)
    assert n_ok >= 0.9 * len(requests)
    print("%s: %d requests answered (%d refused as upstream does), %d numbers, max |dp| %.2e, %d error lines"
          % (name, n_ok, n_refused, len(dps), max(dps), n_err))


def test_predict_reads_stdin_and_exits_zero_when_all_answered(ckpts, upstream_threads, upstream_agent):
    path = ckpts["tiny"]
    body = {"state": "refund please", "questions": {"r": {"type": "noul", "instructions": "Refund?"}},
            "min_confidence": 0.2}
    proc = subprocess.run([sys.executable, "-m", "laya_grpc.cli", "predict", "-"],
                          input=(json.dumps(body) + "\n").encode(), capture_output=True, timeout=300, cwd=REPO,
                          env=_env(LAYA_CHECKPOINT=path, LAYA_DEVICE="cpu"))
    assert proc.returncode == 0, proc.stderr.decode()
    (line,) = proc.stdout.decode().splitlines()
    theirs = upstream_agent(path).predict(body["state"], body["questions"], min_confidence=0.2)
    _compare(_pairs(line), _pairs(json.dumps(theirs)), "stdin", [])
    assert list(json.loads(line)["answers"]["r"])[-2:] == ["abstention", "abstention_threshold"]


@pytest.mark.parametrize("corrupt, problem", [
    ('{not json', "rl_agent_config.json: invalid JSON"),
    ('{"encoder": "x", "head_layers": 2, "option_layout": "diagonal"}', "rl_agent_config.json: 'option_layout'"),
])
def test_bad_checkpoint_is_exit_2_naming_the_file(tiny_ckpt, tmp_path, capsys, corrupt, problem):
    """Checked as strictly as the services check it (an unknown layout is no quiet fallback)."""
    from laya_grpc import cli
    root = str(tmp_path / "bad")
    shutil.copytree(tiny_ckpt, root)
    with open(os.path.join(root, "rl_agent_config.json"), "w") as f:
        f.write(corrupt)
    assert cli.main(["predict", "--checkpoint", root, "--device", "cpu", "-"]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("laya-grpc predict: %s/%s" % (root, problem)), captured.err
    assert captured.out == ""
    assert cli.main(["predict", "--checkpoint", str(tmp_path / "nope"), "-"]) == 2
    assert "no such checkpoint directory" in capsys.readouterr().err


def test_predictor_batch_matches_upstream_batch(ckpts, upstream_threads, upstream_agent):
    """In process: `Predictor.predict_batch` (all states in one forward) vs `Agent.predict_batch`."""
    from laya_grpc.cli.predictor import Predictor
    path = ckpts["tiny-ml"]
    rng = np.random.default_rng(11)
    states = [_state(rng) for _ in range(7)]
    questions = {"c": _question(rng, "choice", 6), "s": _question(rng, "score", 4), "n": _question(rng, "noul", 2)}
    ours = Predictor(path, device="cpu").predict_batch(states, questions, max_len=300,
                                                       min_confidence={"default": 0.4})
    theirs = upstream_agent(path).predict_batch(states, questions, max_len=300, min_confidence={"default": 0.4})
    dps: list[float] = []
    _compare(_pairs(json.dumps(ours)), _pairs(json.dumps(theirs)), "batch", dps)
    assert len(ours) == 7 and len(dps) > 100
    print("predict_batch: 7 states x 3 questions, %d numbers, max |dp| %.2e" % (len(dps), max(dps)))
