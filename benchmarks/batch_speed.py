"""`predict_batch` of many short states in-process, and what its time is made of.

Prints one JSON line: decisions/s and p50 of `Predictor.predict_batch` over `--states` copies of the
bench's short input, then each stage timed alone on the same states: tokenizing (encode, rows packed),
the forwards (`run_rows` on all rows) and decoding, so the host's share of a batch is visible.

`--timeline 32,64,...` then prints, for each chunk size in rows (`Decider.PIPELINE_ROWS`), the p50 of
the pipelined call and when each stage of one call ran (ms from its start): every chunk's tokenizing,
each forward's start (`start_rows`: fill and launch) and every chunk's decoding, so the device's idle
gaps between chunks can be read off.

Runs against the `laya_grpc` on the path, so two builds compare by running it from each tree:

    PYTHONPATH=TREE:TREE/protos/gen python -m benchmarks.batch_speed --ckpt DIR [--states 256]
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np


def _median_ms(fn, n: int) -> float:
    from laya_grpc.bench.inproc import time_calls
    return float(np.median(time_calls(fn, n))) * 1e3


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ckpt", required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--states", type=int, default=256)
    p.add_argument("--iters", type=int, default=15)
    p.add_argument("--timeline", default="", help="comma list of chunk sizes (rows) to trace")
    a = p.parse_args(argv)
    import laya_grpc
    from laya_grpc.bench.inputs import named_cases
    from laya_grpc.cli.predictor import Predictor
    from laya_grpc.core.wire.packed_rows import PackedRows
    from laya_grpc.core.decisions.questions import parse_questions
    from laya_grpc.core.decisions.temperatures import Temperatures
    from laya_grpc.core.decisions.decode import decode_answer

    pred = Predictor(a.ckpt, device=a.device)
    pred.warm()
    case = named_cases()[0]
    states = [case.state] * a.states
    pred.predict_batch(states, case.questions)
    total = _median_ms(lambda: pred.predict_batch(states, case.questions), a.iters)
    questions = parse_questions(case.questions)

    def tokenize():
        enc = pred.encoder.encode_many(states, questions)
        return PackedRows.concat([PackedRows.from_rows(e.rows) for e in enc])
    rows = tokenize()
    temps = Temperatures.from_config(pred.checkpoint.config)
    logits, act = pred.runner.run_rows(rows, pred.encoder.pad_id)

    def decode():
        for r in range(rows.n):
            decode_answer(questions[r % len(questions)], logits[r, : rows.marker_counts[r]], act[r], temps)
    out = {"tree": laya_grpc.__file__, "states": a.states, "rows": int(rows.n), "tokens": int(len(rows.ids)),
           "decisions_per_s": a.states / total * 1e3, "p50_ms": total,
           "tokenize_ms": _median_ms(tokenize, a.iters),
           "forwards_ms": _median_ms(lambda: pred.runner.run_rows(rows, pred.encoder.pad_id), a.iters),
           "decode_ms": _median_ms(decode, a.iters)}
    print(json.dumps(out), flush=True)
    for rows_per_chunk in [int(x) for x in a.timeline.split(",") if x]:
        print(json.dumps(timeline(pred, states, case.questions, rows_per_chunk, a.iters)), flush=True)
    pred.close()
    return 0


def timeline(pred, states: list, questions: dict, rows_per_chunk: int, iters: int) -> dict:
    """The pipelined call with chunks of `rows_per_chunk` rows: its p50, and when each stage ran in
    the last call (stages wrapped for the measurement, then restored)."""
    from laya_grpc.engine import decider
    services, runner = pred.decider.services, pred.runner
    spans, t0 = [], [0.0]

    def traced(name, fn, is_async=False):
        if is_async:
            async def wrapper(*args, **kw):
                t = time.perf_counter()
                out = await fn(*args, **kw)
                spans.append((name, t - t0[0], time.perf_counter() - t0[0]))
                return out
            return wrapper

        def wrapper(*args, **kw):
            t = time.perf_counter()
            out = fn(*args, **kw)
            spans.append((name, t - t0[0], time.perf_counter() - t0[0]))
            return out
        return wrapper
    saved = (services.tokenize, runner.start_rows, decider._decode, decider.PIPELINE_ROWS)
    services.tokenize = traced("tokenize", saved[0], is_async=True)
    runner.start_rows = traced("start", saved[1])
    decider._decode, decider.PIPELINE_ROWS = traced("decode", saved[2]), rows_per_chunk
    try:
        times = []
        for _ in range(iters):
            spans.clear()
            t0[0] = time.perf_counter()
            pred.predict_batch(states, questions)
            times.append((time.perf_counter() - t0[0]) * 1e3)
    finally:
        services.tokenize, runner.start_rows, decider._decode, decider.PIPELINE_ROWS = saved
    return {"rows_per_chunk": rows_per_chunk, "p50_ms": float(np.median(times)),
            "spans_ms": [(n, round(a * 1e3, 2), round(b * 1e3, 2)) for n, a, b in sorted(spans, key=lambda s: s[1])]}


if __name__ == "__main__":
    raise SystemExit(main())
