"""In-process measurements, one target per process so load time and memory are its own.

`python -m laya_grpc.bench.inproc TARGET --ckpt DIR --out FILE ...` appends JSONL records.
TARGET: engine (our Predictor: tokenizer + runner + decode in one process), upstream
(laya.load(...).predict, eager, bf16 autocast on CUDA) or upstream-compiled (compile=True).
The engine run also does the idle-gap study, the memory soak and the parity check.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import warnings

import numpy as np

from .inputs import named_cases, random_cases
from .stats import paired_ratio, summary_ms

# Declared before anything is measured; written as the first parity record.
PARITY_TOL_DP = 1e-2
PARITY_TIE_MARGIN = 0.04


class Out:
    def __init__(self, path: str, target: str):
        self.f, self.target = open(path, "a", encoding="utf-8"), target

    def rec(self, kind: str, **fields) -> None:
        fields = {"target": self.target, "kind": kind, **fields}
        self.f.write(json.dumps(fields) + "\n")
        self.f.flush()
        print(json.dumps(fields), flush=True)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch
        torch.cuda.synchronize()


def memory(device: str) -> dict:
    """Host RSS and, on CUDA, what torch holds and what the driver says this process uses."""
    out = {"host_rss_mb": _rss_mb()}
    if device.startswith("cuda"):
        import torch
        out["gpu_allocated_mb"] = torch.cuda.memory_allocated() / 2**20
        out["gpu_reserved_mb"] = torch.cuda.memory_reserved() / 2**20
        free, total = torch.cuda.mem_get_info()
        out["gpu_used_total_mb"] = (total - free) / 2**20
    return out


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def time_calls(fn, iters: int) -> list:
    out = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


# -------------------------------------------------------------------------------- engine

def run_engine(a, out: Out) -> None:
    from laya_grpc.core.wire.packed_rows import PackedRows
    from laya_grpc.cli.predictor import Predictor
    t0 = time.perf_counter()
    pred = Predictor(a.ckpt, device=a.device, backend=a.backend, dtype=None if a.dtype == "auto" else a.dtype)
    load_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    pred.warm()
    _sync(a.device)
    warm_s = time.perf_counter() - t1
    graphs = getattr(pred.runner, "graphs", None)
    out.rec("startup", load_s=load_s, warmup_s=warm_s, device=pred.runner.device(), dtype=pred.runner.dtype(),
            graphs_captured=len(graphs.cache) if graphs else 0)
    out.rec("memory", phase="after_warmup", **memory(a.device))
    captures_at_ready = graphs.cache.captures if graphs else 0
    cases = named_cases()
    t = time.perf_counter()
    pred.predict(cases[0].state, cases[0].questions)
    out.rec("first_request", input=cases[0].name, ms=(time.perf_counter() - t) * 1e3)
    for c in cases:
        enc = pred.encoder.encode_many([c.state], _parse(c.questions))
        rows = [r for e in enc for r in e.rows]
        prows = PackedRows.from_rows(rows)
        pred.predict(c.state, c.questions)
        e2e = time_calls(lambda: pred.predict(c.state, c.questions), a.iters)
        model = time_calls(lambda: pred.runner.run_rows(prows, pred.encoder.pad_id), a.iters)
        tok = time_calls(lambda: PackedRows.from_rows(
            [r for e in pred.encoder.encode_many([c.state], _parse(c.questions)) for r in e.rows]).pad(
                pred.encoder.pad_id), a.iters)
        out.rec("latency", input=c.name, rows=len(rows), tokens=int(max(len(r.ids) for r in rows)),
                e2e=summary_ms(e2e), model=summary_ms(model), tokenize=summary_ms(tok))
    for n in a.batch_states:
        states = [cases[0].state] * n
        pred.predict_batch(states, cases[0].questions)
        bt = time_calls(lambda: pred.predict_batch(states, cases[0].questions), max(3, a.iters // 20))
        out.rec("batch", states=n, input="short", decisions_per_s=n / float(np.median(bt)), **summary_ms(bt))
    soak = random_cases(a.soak)
    for c in soak:
        pred.predict(c.state, c.questions)
    _sync(a.device)
    out.rec("memory", phase="after_%d_random" % len(soak), **memory(a.device))
    if graphs:
        out.rec("graph_cache", resident=len(graphs.cache), captures_after_ready=graphs.cache.captures - captures_at_ready,
                evictions=graphs.cache.evictions, hits=graphs.cache.hits)
    idle_gaps(a, out, pred, cases[0])
    parity(a, out, pred)


def _parse(questions):
    from laya_grpc.core.decisions.questions import parse_questions
    return parse_questions(questions)


def idle_gaps(a, out: Out, pred, case) -> None:
    """Latency of the first request after a quiet gap, without and with a keep-warm ticker."""
    gaps = [float(g) for g in a.idle_gaps.split(",") if g]
    for keep in (0.0, a.keep_warm_s):
        stop = threading.Event()
        lock = threading.Lock()
        ticks = [0]
        if keep > 0:
            enc = pred.encoder.encode_many([case.state], _parse(case.questions))
            from laya_grpc.core.wire.packed_rows import PackedRows
            b = PackedRows.from_rows([r for e in enc for r in e.rows])

            def tick():
                while not stop.wait(keep):
                    with lock:
                        pred.runner.run_rows(b, pred.encoder.pad_id)
                        ticks[0] += 1
            th = threading.Thread(target=tick, daemon=True)
            th.start()
        for gap in gaps:
            time.sleep(gap)
            with lock:
                t = time.perf_counter()
                pred.predict(case.state, case.questions)
                ms = (time.perf_counter() - t) * 1e3
            out.rec("idle_gap", gap_s=gap, keep_warm_s=keep, ms=ms)
        stop.set()
        if keep > 0:
            out.rec("keep_warm_cost", keep_warm_s=keep, forwards=ticks[0], seconds=sum(gaps))


def parity(a, out: Out, pred) -> None:
    """Decision agreement and max |dp| of this engine against the CPU fp32 network (equal to upstream
    laya's CPU fp32 forward bit for bit, tests/test_torch_model_parity.py), on the same padded rows."""
    from laya_grpc.inference.runners import TorchRunner
    from laya_grpc.core.wire.packed_rows import PackedRows
    out.rec("parity_declared", tol_dp=PARITY_TOL_DP, tie_margin=PARITY_TIE_MARGIN, reference="torch cpu float32")
    ref = TorchRunner(a.ckpt, "cpu", "float32")
    cases = named_cases() + random_cases(a.parity_n, seed=11)
    worst, agree, total, ties, bad = 0.0, 0, 0, 0, []
    for c in cases:
        enc = pred.encoder.encode_many([c.state], _parse(c.questions))
        rows = [r for e in enc for r in e.rows]
        prows = PackedRows.from_rows(rows)
        lg, act = pred.runner.run_rows(prows, pred.encoder.pad_id)
        lr, actr = ref.run_rows(prows, pred.encoder.pad_id)
        for i, r in enumerate(rows):
            k = len(r.markers)
            p, q = _softmax(lg[i, :k]), _softmax(lr[i, :k])
            dp = float(np.abs(p - q).max())
            srt = np.sort(q)[::-1]
            margin = float(srt[0] - srt[1]) if k > 1 else 1.0
            total += 1
            same = int(np.argmax(p)) == int(np.argmax(q))
            agree += same
            if margin < PARITY_TIE_MARGIN:
                ties += 1
            elif not same:
                bad.append(c.name)
            worst = max(worst, dp, float(np.abs(_softmax(act[i]) - _softmax(actr[i])).max()))
    out.rec("parity", rows=total, agree=agree, near_ties=ties, disagree_outside_ties=len(bad),
            max_abs_dp=worst, passed=bool(not bad and worst <= PARITY_TOL_DP))


def _softmax(x):
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(x - x.max())
    return e / e.sum()


# ------------------------------------------------------------------------------ upstream

def run_upstream(a, out: Out, compiled: bool) -> None:
    import laya
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        agent = laya.load(os.path.abspath(a.ckpt), device=a.device, compile=compiled)
    load_s = time.perf_counter() - t0
    out.rec("startup", load_s=load_s, warmup_s=0.0, device=a.device)
    out.rec("memory", phase="after_load", **memory(a.device))
    cases = named_cases()
    t = time.perf_counter()
    agent.predict(cases[0].state, cases[0].questions)
    out.rec("first_request", input=cases[0].name, ms=(time.perf_counter() - t) * 1e3)
    for c in cases:
        agent.predict(c.state, c.questions)
        e2e = time_calls(lambda: agent.predict(c.state, c.questions), a.iters)
        out.rec("latency", input=c.name, e2e=summary_ms(e2e))
    states = [cases[0].state] * 64
    agent.predict_batch(states, cases[0].questions)
    bt = time_calls(lambda: agent.predict_batch(states, cases[0].questions), max(3, a.iters // 20))
    out.rec("batch", states=64, input="short", decisions_per_s=64 / float(np.median(bt)), **summary_ms(bt))
    if a.ab_pairs and not compiled:
        ab(a, out, agent)


def ab(a, out: Out, agent) -> None:
    """Paired A/B in one process: upstream and engine alternate on the same input, pair by pair."""
    from laya_grpc.cli.predictor import Predictor
    pred = Predictor(a.ckpt, device=a.device, backend=a.backend, dtype=None if a.dtype == "auto" else a.dtype)
    pred.warm()
    for c in [x for x in named_cases() if x.name in ("short", "t512")]:
        ua, ea = [], []
        for i in range(a.ab_pairs):
            first, second = (agent.predict, pred.predict) if i % 2 == 0 else (pred.predict, agent.predict)
            t = {}
            for fn in (first, second):
                s = time.perf_counter()
                fn(c.state, c.questions)
                t[fn] = time.perf_counter() - s
            ua.append(t[agent.predict])
            ea.append(t[pred.predict])
        out.rec("ab", input=c.name, a="upstream_eager", b="engine", **paired_ratio(ua, ea))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m laya_grpc.bench.inproc")
    p.add_argument("target", choices=["engine", "upstream", "upstream-compiled"])
    p.add_argument("--ckpt", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--backend", default="torch")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--soak", type=int, default=300)
    p.add_argument("--parity-n", type=int, default=64)
    p.add_argument("--idle-gaps", default="1,3,8")
    p.add_argument("--keep-warm-s", type=float, default=0.5)
    p.add_argument("--ab-pairs", type=int, default=0)
    p.add_argument("--batch-states", default="64,256", help="comma list of predict_batch sizes to time")
    a = p.parse_args(argv)
    a.batch_states = [int(x) for x in a.batch_states.split(",") if x]
    out = Out(a.out, a.target)
    if a.target == "engine":
        run_engine(a, out)
    else:
        run_upstream(a, out, compiled=a.target == "upstream-compiled")
    return 0


if __name__ == "__main__":
    sys.exit(main())
