"""Per-hop latency of a running stack: tokenizer RPC, inference RPC, gRPC Decide, HTTP.

Sequential requests of one short one-question decision, the hops interleaved request by request
(so background load hits all of them alike); prints p50/p95 per hop, plus the inference
service's own model_ms/queue_ms. Point it at a `laya-grpc serve --run-dir DIR` stack:

    .venv/bin/python -m benchmarks.stack_hops --run-dir DIR --http 127.0.0.1:18000 --grpc 127.0.0.1:50551 \
        [--checkpoint english] [-n 500] [--inproc /path/to/checkpoint]

`--empty` instead measures one local hop's bare price: an empty call to a process that answers at
once, over a gRPC stream (what the gateway used) and over IPC unix sockets (`laya_grpc/core/wire/ipc.py`),
sequential p50/p95 and calls/s with 64 callers (no stack needed). `--transport grpc|ipc` adds
the two hops made the way the gateway makes them (`laya_grpc.bench.hop_timing.hop_breakdown`) over that
transport to the table (serve's children take both: IPC from their gateway, gRPC streams on their
sockets).

`--inproc` also times the same request in this process (`laya_grpc.cli.predictor.Predictor`, torch CPU).
On a small CPU-only machine start the stack with OMP_NUM_THREADS=1: torch's intra-op threads spin
between forwards (~10 ms of CPU per request measured on 2 cores) and take the cores the gateway
and tokenizer need, which then shows up as hop time. Requests use fresh-enough connections kept
alive for the whole run; the first request after ready is timed by `python -m laya_grpc.bench.service first`.
"""
from __future__ import annotations

import argparse
import json
import os
import time

import grpc
import numpy as np

from laya_grpc.bench import raw_http
from laya_grpc.core.wire import rpc
from laya_grpc.core.wire.question_wire import tokenize_request
from laya_proto.internal.v1 import inference_pb2, inference_pb2_grpc, tokenizer_pb2, tokenizer_pb2_grpc

STATE = "My phone arrived broken and I want my money back today."
QUESTIONS = {"angry": {"type": "noul", "instructions": "Is the customer angry?"}}


class RawHTTP(raw_http.Connection):
    """One keep-alive connection, minimal client cost (no client library): `post()` -> the body of a 200."""

    def post(self) -> bytes:
        status, _, body, _ = super().post()
        if status != 200:
            raise RuntimeError("HTTP %d: %s" % (status, body[:500]))
        return body


def pct(xs, q):
    return float(np.percentile(np.asarray(xs) * 1e3, q))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--empty", action="store_true", help="the empty hop over gRPC stream vs IPC; nothing else")
    p.add_argument("--transport", choices=["grpc", "ipc"], default=None,
                   help="also the tokenizer and inference hops over this transport (as the gateway makes them)")
    p.add_argument("--run-dir", default=None, help="the serve --run-dir (tokenizer-0.sock, inference.sock)")
    p.add_argument("--http", default=None)
    p.add_argument("--grpc", default=None)
    p.add_argument("--checkpoint", default="english")
    p.add_argument("-n", type=int, default=500)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--inproc", default=None, help="checkpoint directory: also time the request in this process")
    p.add_argument("--json", action="store_true", help="one JSON line instead of the table")
    a = p.parse_args()
    if a.empty:
        from laya_grpc.bench.hop_timing import empty_round_trips
        print("%-10s %9s %9s %14s   (empty call to another process, n=%d sequential)" % (
            "transport", "p50 ms", "p95 ms", "calls/s @64", a.n))
        for r in empty_round_trips(n=a.n):
            print("%-10s %9.3f %9.3f %14.0f" % (r["transport"], r["p50_ms"], r["p95_ms"], r["calls_per_s"]))
        return
    if not (a.run_dir and a.http and a.grpc):
        p.error("--run-dir, --http and --grpc are needed (or --empty)")

    from laya_grpc.client import LayaClient
    tok = tokenizer_pb2_grpc.TokenizerServiceStub(
        grpc.insecure_channel("unix:" + os.path.join(a.run_dir, "tokenizer-0.sock"), options=rpc.CHANNEL_OPTIONS))
    inf = inference_pb2_grpc.InferenceServiceStub(
        grpc.insecure_channel("unix:" + os.path.join(a.run_dir, "inference.sock"), options=rpc.CHANNEL_OPTIONS))
    treq = tokenize_request(tokenizer_pb2.TokenizeRequest, a.checkpoint, [STATE], QUESTIONS)
    ireq = inference_pb2.InferRequest(checkpoint=a.checkpoint)
    ireq.rows.CopyFrom(tok.Tokenize(treq).rows)
    client = LayaClient(a.grpc)
    http = RawHTTP(a.http, "/v1/systemone", json.dumps({"state": STATE, "questions": QUESTIONS}).encode())

    model_ms, queue_ms = [], []

    def infer():
        r = inf.Infer(ireq)
        model_ms.append(r.model_ms / 1e3)
        queue_ms.append(r.queue_ms / 1e3)

    hops = {"tokenizer RPC": lambda: tok.Tokenize(treq), "inference RPC": infer,
            "gRPC Decide": lambda: client.decide(STATE, QUESTIONS), "HTTP /v1/systemone": http.post}
    if a.inproc:
        from laya_grpc.cli.predictor import Predictor
        pred = Predictor(a.inproc, device="cpu")
        hops["in-process Predictor"] = lambda: pred.predict(STATE, QUESTIONS)
    times = {k: [] for k in hops}
    for i in range(a.warmup + a.n):
        for name, fn in hops.items():
            t0 = time.perf_counter()
            fn()
            dt = time.perf_counter() - t0
            if i >= a.warmup:
                times[name].append(dt)
    del model_ms[: a.warmup], queue_ms[: a.warmup]
    rows = {k: (pct(v, 50), pct(v, 95)) for k, v in times.items()}
    rows["  inference model_ms"] = (pct(model_ms, 50), pct(model_ms, 95))
    rows["  inference queue_ms"] = (pct(queue_ms, 50), pct(queue_ms, 95))
    m50 = rows["  inference model_ms"][0]
    for name in ("inference RPC", "gRPC Decide", "HTTP /v1/systemone"):   # serving overhead, roughly
        rows["  %s - model p50" % name.split()[0]] = (rows[name][0] - m50, float("nan"))
    if a.transport:
        from laya_grpc.bench.hop_timing import hop_breakdown
        for k, v in hop_breakdown(a.run_dir, a.transport, STATE, QUESTIONS, a.checkpoint, a.n).items():
            rows["%s %s" % (a.transport, k)] = (v["p50_ms"], v["p95_ms"])
    if a.json:
        print(json.dumps({k: {"p50_ms": round(v[0], 3), "p95_ms": round(v[1], 3)} for k, v in rows.items()}))
        return
    print("%-24s %9s %9s   (n=%d sequential)" % ("hop", "p50 ms", "p95 ms", a.n))
    for k, (p50, p95) in rows.items():
        print("%-24s %9.3f %9.3f" % (k, p50, p95))


if __name__ == "__main__":
    main()
