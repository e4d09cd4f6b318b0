"""The bench's parity stage: answers of the SERVED path against upstream laya on CPU float32.

Requests go through `laya-grpc serve` (gateway, tokenizer, inference with its batching, packing and
CUDA graphs, decoding with temperatures) as HTTP `/v1/systemone` bodies; the reference is upstream
`laya.load(ckpt, device="cpu").predict(...)` on the same bodies, float32. Every number under
`answers` is compared (probabilities, score, noul, confidence, answer_confidence, act_probability),
and every decision (choice) is checked for a flip, with upstream's top-2 margin beside it.

The declared set spans the three question types; 1 to 8 questions; 2 to 12 options; text, object
and conversation states; lengths up to the checkpoint's max_len (long states truncate there); and
the same questions alone and beside others (the answer must not depend on its neighbours, which
change the GEMM shapes it runs in). Tolerances are recorded before the first request
(`parity_served_declared`), per served dtype; the result names the worst body and field.

The stage runs on several checkpoints of one shape that span conditioning (make-checkpoint's
conditionings: default, flat, sharp, heavy: option logits from near-uniform to sharp, temperatures
down to upstream's 0.5 clamp, normal, uniform and Laplace weights), since 16-bit rounding errors
grow with the logits' scale: one checkpoint passing says little about another. Each result names
its checkpoint and its worst body; a summary line per checkpoint and dtype comes last.
"""
from __future__ import annotations

import http.client
import json
import random
import time
import warnings

from .service import Served

# max |dp| allowed, per served dtype (the GPU targets). CPU float32: one quantum of the 4 decimals
# served (last-bit float32 differences between batch shapes can move one rounding on a sharp checkpoint)
TOL = {"float32": 0.001, "float16": 0.02, "bfloat16": 0.02}
TOL_CPU_FLOAT32 = 1.5e-4
TOL_ALONE_VS_BESIDE = 0.005

_WORDS = ("order parcel refund broken phone screen delivery late customer account invoice charge twice please "
          "help today address change password login error shipping box damaged warranty replacement store credit "
          "card payment declined subscription cancel renew plan upgrade").split()


def _text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(n)) + "."


def _question(rng: random.Random, qtype: str, k: int) -> dict:
    ins = "Q: " + _text(rng, rng.randint(3, 9))
    if qtype == "noul":
        return {"type": "noul", "instructions": ins}
    crit = ["%s %d" % (rng.choice(_WORDS), i) for i in range(k)]
    if qtype == "choice" and rng.random() < 0.5:
        crit = {c: _text(rng, rng.randint(1, 6)) for c in crit}
    return {"type": qtype, "instructions": ins, "criteria": crit}


def _state(rng: random.Random, kind: str):
    if kind == "short":
        return _text(rng, rng.randint(5, 25))
    if kind == "long":                                   # past max_len: truncated there (the longest rows)
        return _text(rng, 900)
    if kind == "medium":
        return {"ticket": {"subject": _text(rng, 6), "body": _text(rng, rng.randint(60, 180)), "id": 7}}
    return [{"role": ("user", "agent")[i % 2], "content": _text(rng, rng.randint(5, 40))}
            for i in range(rng.randint(3, 14))]          # a conversation


def declared_bodies(seed: int = 5) -> list[tuple[str, dict]]:
    """(name, body) pairs: the declared set. Deterministic for a seed."""
    rng = random.Random(seed)
    out = []
    types = ("choice", "score", "noul")
    kinds = ("short", "medium", "conversation", "long")
    for n_q in range(1, 9):                              # 1..8 questions, options 2..12, every type and state kind
        qs = {}
        for j in range(n_q):
            qtype = types[(n_q + j) % 3]
            qs["q%d_%s" % (j, qtype)] = _question(rng, qtype, 2 + (n_q * 3 + j * 5) % 11)
        kind = kinds[n_q % 4]
        out.append(("%dq-%s" % (n_q, kind), {"state": _state(rng, kind), "questions": qs}))
    for k in (2, 4, 5, 8, 12):                           # one question of each option count, long and short
        for kind in ("short", "long"):
            out.append(("choice%d-%s" % (k, kind), {"state": _state(rng, kind),
                                                     "questions": {"c": _question(rng, "choice", k)}}))
    # the same question alone and beside others (same state): compared against each other too
    for t, qtype in enumerate(types):
        for kind in ("short", "conversation", "long"):
            state = _state(rng, kind)
            probe = _question(rng, qtype, 5)
            others = {"o%d" % j: _question(rng, types[(t + j) % 3], 3 + j) for j in range(1, 6)}
            out.append(("alone-%s-%s" % (qtype, kind), {"state": state, "questions": {"probe": probe}}))
            out.append(("beside-%s-%s" % (qtype, kind), {"state": state, "questions": {"probe": probe, **others}}))
    return out


def numbers(answers: dict, path: str = "") -> dict:
    """Every float under an answers object, by dotted path (ints and strings are not probabilities)."""
    out = {}
    for k, v in answers.items():
        p = "%s.%s" % (path, k) if path else k
        if isinstance(v, dict):
            out.update(numbers(v, p))
        elif isinstance(v, float) and not isinstance(v, bool):
            out[p] = v
    return out


def field_kind(path: str) -> str:
    """probabilities / score / noul / confidence / answer_confidence / act_probability."""
    parts = path.split(".")
    return "probabilities" if "probabilities" in parts else parts[-1]


def compare(ours: dict, theirs: dict) -> dict:
    """max |d| per field kind, the worst field, and choice flips (with upstream's top-2 margin)."""
    a, b = numbers(ours["answers"]), numbers(theirs["answers"])
    if set(b) - set(a):     # fields of our own beside upstream's (x_ extensions) are not compared
        raise AssertionError("fields missing from the served answer: %s" % sorted(set(b) - set(a)))
    per, worst = {}, ("", 0.0)
    for p in b:
        d = abs(a[p] - b[p])
        kind = field_kind(p)
        per[kind] = max(per.get(kind, 0.0), d)
        if d > worst[1]:
            worst = (p, d)
    flips = []
    for q, ans in theirs["answers"].items():
        if "choice" in ans and ours["answers"][q].get("choice") != ans["choice"]:
            pr = sorted(ans.get("probabilities", {}).values(), reverse=True)
            flips.append({"question": q, "margin": pr[0] - pr[1] if len(pr) > 1 else 1.0})
    return {"per_kind": per, "worst_field": worst[0], "max_abs_dp": worst[1], "flips": flips}


def _post(port: int, body: dict) -> tuple[int, dict, float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    t = time.perf_counter()
    conn.request("POST", "/v1/systemone", json.dumps(body), {"Content-Type": "application/json"})
    r = conn.getresponse()
    data = r.read()
    ms = (time.perf_counter() - t) * 1e3
    conn.close()
    return r.status, json.loads(data), ms


def upstream_answers(ckpt: str, bodies: list) -> dict:
    """name -> upstream laya 0.4.15's answer on CPU float32 (the reference)."""
    import laya
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        agent = laya.load(ckpt, device="cpu")
    return {name: json.loads(json.dumps(agent.predict(b["state"], b["questions"]))) for name, b in bodies}


STAGE_CONDITIONINGS = ("default", "flat", "sharp", "heavy")


def stage_checkpoints(work_dir: str, preset: str, conditionings=STAGE_CONDITIONINGS) -> list[tuple[str, str]]:
    """(name, path) of the stage's checkpoints of `preset`, made in work_dir where missing: the
    default conditioning at work_dir/preset (the checkpoint the other stages use), the others at
    work_dir/preset-conditioning."""
    import os
    from laya_grpc.cli.make_checkpoint import make_checkpoint
    out = []
    for c in conditionings:
        path = os.path.join(work_dir, preset if c == "default" else "%s-%s" % (preset, c))
        if not os.path.isfile(os.path.join(path, "model.safetensors")):
            make_checkpoint(path, preset, conditioning=c, force=True)
        out.append((c, path))
    return out


def served_dtype(dtype: str, device: str) -> str:
    """What `--dtype auto` serves on `device` (inference/devices.py: torch_dtype)."""
    if dtype != "auto":
        return dtype
    from laya_grpc.inference.devices import AUTO_DTYPE
    return AUTO_DTYPE.get(device.split(":")[0], "float32")


def run_parity(a, rec, ckpt: str, model: str, reference: dict | None = None, latency_n: int = 50,
               checkpoint: str = "") -> tuple:
    """One served dtype (a.dtype) against upstream CPU float32 on the declared set; returns (the
    reference answers, so a second dtype reuses them; the result record)."""
    bodies = declared_bodies()
    dtype = served_dtype(a.dtype, a.device)
    tol = TOL_CPU_FLOAT32 if a.device == "cpu" and dtype == "float32" else TOL[dtype]
    rec("parity", "parity_served_declared", checkpoint=checkpoint, dtype=dtype, requested=a.dtype, device=a.device,
        tol_dp=tol,
        tol_alone_vs_beside=TOL_ALONE_VS_BESIDE, bodies=len(bodies), reference="upstream laya cpu float32",
        fields="every float under answers; choice flips with upstream's top-2 margin")
    extra = ["--backend", a.backend, "--dtype", a.dtype] + (["--device", a.device] if a.device != "auto" else [])
    s = Served({model: ckpt}, extra, {})
    try:
        ref = reference if reference is not None else upstream_answers(ckpt, bodies)
        s.wait_ready(a.ready_timeout)
        conn = http.client.HTTPConnection("127.0.0.1", s.http_port, timeout=30)
        conn.request("GET", "/health")
        health = json.loads(conn.getresponse().read())
        conn.close()
        served = health.get("checkpoints", {}).get(model, {})       # what the server says it runs
        ours, worst, per_kind, flips, tokens = {}, {"body": "", "field": "", "dp": 0.0}, {}, [], {}
        for name, body in bodies:
            status, got, _ = _post(s.http_port, {**body, "model": model})
            if status != 200:
                raise RuntimeError("%s: HTTP %d %s" % (name, status, got))
            ours[name] = got
            tokens[name] = got.get("usage", {}).get("input_tokens")
            c = compare(got, ref[name])
            for k, v in c["per_kind"].items():
                per_kind[k] = max(per_kind.get(k, 0.0), v)
            flips += [dict(f, body=name) for f in c["flips"]]
            if c["max_abs_dp"] >= worst["dp"]:
                worst = {"body": name, "field": c["worst_field"], "dp": c["max_abs_dp"]}
        # the same question alone and beside others, served against served
        shift, shift_at = 0.0, ""
        for name, _ in bodies:
            if name.startswith("alone-"):
                twin = "beside-" + name[len("alone-"):]
                a_n = numbers(ours[name]["answers"]["probe"])
                b_n = numbers(ours[twin]["answers"]["probe"])
                for p in a_n:
                    d = abs(a_n[p] - b_n[p])
                    if d >= shift:
                        shift, shift_at = d, "%s probe.%s" % (name[len("alone-"):], p)
        lat = {}
        for name in ("choice2-short", "choice5-long"):
            body = dict(next(b for n, b in bodies if n == name), model=model)
            ms = sorted(_post(s.http_port, body)[2] for _ in range(latency_n))
            lat[name] = {"p50_ms": ms[len(ms) // 2], "p90_ms": ms[int(len(ms) * 0.9)], "input_tokens": tokens[name]}
        result = dict(checkpoint=checkpoint, dtype=dtype, requested=a.dtype, health_dtype=served.get("dtype"),
                      health_device=served.get("device"), bodies=len(bodies), max_abs_dp=worst["dp"], worst_body=worst["body"],
                      worst_field=worst["field"], per_kind=per_kind, choice_flips=flips,
                      alone_vs_beside_max_dp=shift, alone_vs_beside_at=shift_at,
                      max_usage_input_tokens=max(t for t in tokens.values() if t is not None), latency=lat,
                      passed=bool(worst["dp"] <= tol and shift <= TOL_ALONE_VS_BESIDE))
        rec("parity", "parity_served", **result)
        return ref, result
    finally:
        s.close()


def run_stage(a, rec, checkpoints: list[tuple[str, str]], dtypes: list[str], model: str = "english",
              latency_n: int = 50) -> bool:
    """Every dtype on every checkpoint (upstream's reference computed once per checkpoint); a
    `parity_summary` record per checkpoint and dtype last. True when all passed."""
    ok, rows = True, []
    for name, path in checkpoints:
        ref = None
        for dtype in dtypes:
            a.dtype = dtype
            t = time.perf_counter()
            try:
                ref, r = run_parity(a, rec, path, model, ref, latency_n, checkpoint=name)
                rows.append(r)
            except Exception as e:  # noqa: BLE001 - recorded; the next dtype still runs
                rec("parity", "error", checkpoint=name, dtype=dtype, detail="%s: %s" % (type(e).__name__, e))
                r = {"checkpoint": name, "dtype": dtype, "requested": dtype, "passed": False, "error": str(e)[:300]}
                rows.append(r)
            ok = ok and r["passed"]
            rec("parity", "process", checkpoint=name, dtype=dtype, seconds=time.perf_counter() - t)
    for r in rows:
        lat = r.get("latency", {})
        rec("parity", "parity_summary", checkpoint=r["checkpoint"], requested=r["requested"], dtype=r["dtype"],
            health_dtype=r.get("health_dtype"),
            max_abs_dp=r.get("max_abs_dp"), worst_body=r.get("worst_body"), worst_field=r.get("worst_field"),
            alone_vs_beside_max_dp=r.get("alone_vs_beside_max_dp"), flips=len(r.get("choice_flips", [])),
            p50_short_ms=lat.get("choice2-short", {}).get("p50_ms"), p50_512_ms=lat.get("choice5-long", {}).get("p50_ms"),
            passed=r["passed"])
    return ok


def main(argv=None) -> int:
    """`python -m laya_grpc.bench.parity --ckpt DIR --dtypes auto,float32 --out FILE`: the stage for
    several served dtypes in one call, upstream's reference computed once per checkpoint;
    `--work-dir DIR --preset large` runs it on the stage's conditionings of that preset instead."""
    import argparse
    p = argparse.ArgumentParser(prog="python -m laya_grpc.bench.parity")
    p.add_argument("--ckpt", action="append", default=[], metavar="[NAME=]DIR",
                   help="a checkpoint (repeatable); default: the stage's conditionings made in --work-dir")
    p.add_argument("--work-dir", help="where the stage's checkpoints are made (with --preset)")
    p.add_argument("--preset", default="large")
    p.add_argument("--conditionings", default=",".join(STAGE_CONDITIONINGS))
    p.add_argument("--dtypes", default="auto")
    p.add_argument("--device", default="auto")
    p.add_argument("--backend", default="torch")
    p.add_argument("--out", required=True, help="JSONL file the records are appended to")
    p.add_argument("--latency-n", type=int, default=50)
    a = p.parse_args(argv)
    if a.device == "auto":
        import torch
        a.device = "cuda" if torch.cuda.is_available() else "cpu"
    a.ready_timeout = 600.0

    def rec(target, kind, **fields):
        line = json.dumps({"target": target, "kind": kind, **fields})
        with open(a.out, "a", encoding="utf-8") as f:
            f.write(line + "\n")
        print(line, flush=True)

    if a.ckpt:
        ckpts = [tuple(c.split("=", 1)) if "=" in c else (c.rstrip("/").rsplit("/", 1)[-1], c) for c in a.ckpt]
    elif a.work_dir:
        ckpts = stage_checkpoints(a.work_dir, a.preset, [c for c in a.conditionings.split(",") if c])
    else:
        p.error("give --ckpt or --work-dir")
    ok = run_stage(a, rec, ckpts, [d for d in a.dtypes.split(",") if d], latency_n=a.latency_n)
    return 0 if ok else 1


if __name__ == "__main__":
    import sys
    sys.exit(main())
