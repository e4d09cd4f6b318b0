"""`predict_batch` of many short states in-process, and what its time is made of.

Prints one JSON line: decisions/s and p50 of `Predictor.predict_batch` over `--states` copies of the
bench's short input, then each stage timed alone on the same states: tokenizing (encode, rows packed),
the forwards (`run_rows` on all rows) and decoding, so the host's share of a batch is visible.

Runs against the `laya_grpc` on the path, so two builds compare by running it from each tree:

    PYTHONPATH=TREE:TREE/protos/gen python -m benchmarks.batch_speed --ckpt DIR [--states 256]
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np


def _median_ms(fn, n: int) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times)) * 1e3


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ckpt", required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--states", type=int, default=256)
    p.add_argument("--iters", type=int, default=15)
    a = p.parse_args(argv)
    import laya_grpc
    from laya_grpc.bench.inputs import named_cases
    from laya_grpc.cli.predictor import Predictor
    from laya_grpc.core.packed_rows import PackedRows
    from laya_grpc.core.questions import parse_questions
    from laya_grpc.core.temperatures import Temperatures
    from laya_grpc.core.decode import decode_answer

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
    pred.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
