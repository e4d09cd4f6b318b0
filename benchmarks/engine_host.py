"""Where one short in-process answer's time goes on CUDA: the whole answer, the runner alone, the
host alone, and each under cProfile.

`Predictor.predict` (tokenize -> the answer loop -> run_rows -> decode) is timed end to end; then
`run_rows` on the same packed rows (the model stage of `laya-grpc bench --stages engine`); then the
tokenizer's `encode_many`; then the answer again with `run_rows` answering from a memo of its first
result, which leaves the host's own work (tokenizing, packing, the answer loop, decoding). The four
alternate in rounds (medians of `--n` calls each), since the host's CPU state moves between rounds
and a few percent would otherwise read as a change in the code. Last, cProfile of 2,000 answers
and of 2,000 `run_rows` calls, by own time: the stream synchronisation is the GPU forward, the rest
the host.

Runs the `laya_grpc` on PYTHONPATH, so two builds compare by running it from each tree in turn:

    PYTHONPATH=/tmp/site:$T:$T/protos/gen python3 benchmarks/engine_host.py --ckpt /tmp/lb/large --tag T
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--dtype", default="auto", help="auto (the runner's default) or a dtype name")
    ap.add_argument("--tag", default="", help="a name for this tree in the output")
    ap.add_argument("--n", type=int, default=500, help="calls per median")
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    from laya_grpc.bench.inputs import named_cases
    from laya_grpc.cli.predictor import Predictor
    try:
        from laya_grpc.core.decisions.questions import parse_questions
        from laya_grpc.core.wire.packed_rows import PackedRows
    except ImportError:   # the module layout of releases before the core split (5bc85e5)
        from laya_grpc.core.packed_rows import PackedRows
        from laya_grpc.core.questions import parse_questions
    p = Predictor(a.ckpt, device="cuda", dtype=None if a.dtype == "auto" else a.dtype)
    p.warm()
    case = named_cases()[0]
    enc = p.encoder.encode_many([case.state], parse_questions(case.questions))
    rows = [r for e in enc for r in e.rows]
    packed = PackedRows.from_rows(rows)
    real, memo = p.runner.run_rows, {}

    def memoised(r, pad_id, pad_to=None):
        key = (len(r.ids), r.n)
        if key not in memo:
            memo[key] = real(r, pad_id)
        return memo[key]

    def median_ms(fn) -> float:
        out = []
        for _ in range(a.n):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
        return round(statistics.median(out) * 1e3, 4)

    answer = lambda: p.predict(case.state, case.questions)   # noqa: E731
    res = {"e2e": [], "model": [], "tokenize": [], "host": []}
    for _ in range(a.rounds):
        p.runner.run_rows = real
        res["e2e"].append(median_ms(answer))
        res["model"].append(median_ms(lambda: real(packed, p.encoder.pad_id)))
        res["tokenize"].append(median_ms(lambda: p.encoder.encode_many([case.state], parse_questions(case.questions))))
        p.runner.run_rows = memoised
        res["host"].append(median_ms(answer))
    p.runner.run_rows = real
    print(json.dumps({"tag": a.tag, "dtype": p.runner.dtype(), "rows": len(rows), "tokens": len(packed.ids), **res}))
    for name, fn in (("e2e", answer), ("run_rows", lambda: real(packed, p.encoder.pad_id))):
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(2000):
            fn()
        prof.disable()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(22)
        print("== %s %s: cProfile of 2000 calls, by own time" % (a.tag, name))
        print(s.getvalue())


if __name__ == "__main__":
    main()
