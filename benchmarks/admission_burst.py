"""Bursts against a real `laya-grpc serve` with ALL admission defaults (CPU, tiny checkpoints):
the figures the admission targets are judged by.

- burst N (64, 256, ...): N concurrent clients, half HTTP (one request each, no retries), half
  gRPC unary Decide (raw stub, no retries), all released at once; counts of 200/OK and of
  refusals, refusals with a retry hint (HTTP Retry-After, gRPC UNAVAILABLE + RetryInfo), and
  the slowest answer;
- burst N with retries: the same N clients through `LayaClient` (retries within its timeout)
  and an HTTP loop honouring Retry-After: how many end answered;
- heavy: H batches of S states x Q questions held in flight (over HTTP, gRPC `DecideBatch`, or
  half on each: `--heavy-over`), then small requests on both transports, one after the other:
  each one's latency (target: every one within 1 s).

    python -m benchmarks.admission_burst [--bursts 64,256,1024] [--heavy 16 --states 64 --questions 64]

Figures on a shared CPU are noisy; the counts are what the targets state.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

import grpc
import httpx

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from stack import Stack  # noqa: E402

from laya_grpc.cli.make_checkpoint import make_checkpoint  # noqa: E402
from laya_grpc.client import LayaClient  # noqa: E402
from laya_proto.v1 import decision_pb2, decision_pb2_grpc  # noqa: E402

NOUL = {"type": "noul", "instructions": "Is the customer angry?"}


def tiny_checkpoint() -> str:
    """The tiny random-weight checkpoint these CPU benchmarks serve, made once under $TMPDIR."""
    ckpt = os.path.join(os.environ.get("TMPDIR", "/tmp"), "laya-admission-bench", "tiny")
    if not os.path.exists(ckpt):
        make_checkpoint(ckpt, "tiny")
    return ckpt


def _small(i: int) -> dict:
    return {"state": "Order %d arrived broken and I want my money back." % i, "questions": {"angry": NOUL}}


def burst(stack: Stack, n: int, retry: bool) -> dict:
    out = {"clients": n, "ok": 0, "refused": 0, "refused_with_hint": 0, "other": [], "slowest_s": 0.0}
    lock = threading.Lock()
    go = threading.Event()

    def note(ok: bool, hint: bool, took: float, other=None):
        with lock:
            out["slowest_s"] = max(out["slowest_s"], took)
            if ok:
                out["ok"] += 1
            elif other is not None:
                out["other"].append(other)
            else:
                out["refused"] += 1
                out["refused_with_hint"] += int(hint)

    def http(i):
        with httpx.Client(timeout=120) as c:
            go.wait()
            t0 = time.perf_counter()
            while True:
                r = c.post(stack.http + "/v1/systemone", json=_small(i))
                if r.status_code == 503 and retry and time.perf_counter() - t0 < 60:
                    time.sleep(float(r.headers.get("retry-after", "1")))
                    continue
                break
            if r.status_code in (200, 503):
                note(r.status_code == 200, "retry-after" in r.headers, time.perf_counter() - t0)
            else:
                note(False, False, time.perf_counter() - t0, r.status_code)

    def grpc_call(i, stub, client):
        go.wait()
        t0 = time.perf_counter()
        if retry:
            try:
                client.decide(_small(i)["state"], _small(i)["questions"])
                note(True, False, time.perf_counter() - t0)
            except Exception as e:  # noqa: BLE001 - counted
                note(False, False, time.perf_counter() - t0, repr(e)[:120])
            return
        try:
            stub.Decide(decision_pb2.DecideRequest(request_json=json.dumps(_small(i))), timeout=120)
            note(True, False, time.perf_counter() - t0)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.UNAVAILABLE:
                md = dict(e.trailing_metadata() or ())
                note(False, "retry-after" in md, time.perf_counter() - t0)
            else:
                note(False, False, time.perf_counter() - t0, e.code().name)

    channel = grpc.insecure_channel(stack.grpc)
    stub = decision_pb2_grpc.DecisionServiceStub(channel)
    client = LayaClient(stack.grpc, timeout=60)
    threads = [threading.Thread(target=http, args=(i,)) for i in range(n // 2)]
    threads += [threading.Thread(target=grpc_call, args=(i, stub, client)) for i in range(n - n // 2)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    go.set()
    for t in threads:
        t.join()
    channel.close()
    client.close()
    out["slowest_s"] = round(out["slowest_s"], 2)
    return out


def heavy(stack: Stack, held: int, states: int, questions: int, smalls: int, over: str = "http") -> dict:
    body = {"states": ["state %d of a heavy batch, a customer complaint" % i for i in range(states)],
            "questions": {"q%d" % j: NOUL for j in range(questions)}}
    statuses = []
    channel = grpc.insecure_channel(stack.grpc)
    stub = decision_pb2_grpc.DecisionServiceStub(channel)

    def over_http():
        statuses.append(httpx.post(stack.http + "/v1/systemone/batch", json=body, timeout=600).status_code)

    def over_grpc():   # a raw call, no retries: its status as the HTTP status it maps to
        try:
            stub.DecideBatch(decision_pb2.DecideBatchRequest(request_json=json.dumps(body)), timeout=600)
            statuses.append(200)
        except grpc.RpcError as e:
            statuses.append({grpc.StatusCode.UNAVAILABLE: 503, grpc.StatusCode.DEADLINE_EXCEEDED: 408}.get(
                e.code(), e.code().name))

    kinds = {"http": [over_http] * held, "grpc": [over_grpc] * held,
             "both": [over_http, over_grpc] * (held // 2) + [over_http] * (held % 2)}[over]
    threads = [threading.Thread(target=fn) for fn in kinds]
    for t in threads:
        t.start()
    time.sleep(2.0)
    http_s, grpc_s, refused = [], [], 0
    with LayaClient(stack.grpc, timeout=60) as c, httpx.Client(timeout=60) as h:
        for i in range(smalls):
            t0 = time.perf_counter()
            r = h.post(stack.http + "/v1/systemone", json=_small(i))
            http_s.append(time.perf_counter() - t0)
            refused += r.status_code != 200
            t0 = time.perf_counter()
            c.decide(_small(i)["state"], _small(i)["questions"])
            grpc_s.append(time.perf_counter() - t0)
    in_flight = held - len(statuses)
    for t in threads:
        t.join()
    channel.close()
    return {"held": held, "over": over, "shape": "%dx%d" % (states, questions), "heavy_still_in_flight_after_smalls": in_flight,
            "small_http_max_s": round(max(http_s), 3), "small_grpc_max_s": round(max(grpc_s), 3),
            "small_http_p50_s": round(sorted(http_s)[len(http_s) // 2], 3),
            "small_grpc_p50_s": round(sorted(grpc_s)[len(grpc_s) // 2], 3),
            "small_http_refused": refused, "heavy_statuses": sorted(statuses)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bursts", default="64,256,1024")
    p.add_argument("--retry-bursts", default="1024")
    p.add_argument("--heavy", type=int, default=16)
    p.add_argument("--states", type=int, default=64)
    p.add_argument("--questions", type=int, default=64)
    p.add_argument("--smalls", type=int, default=10)
    p.add_argument("--heavy-over", choices=("http", "grpc", "both"), default="both")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    ckpt = tiny_checkpoint()
    results = {}
    with Stack({"english": ckpt}) as s:
        for n in [int(x) for x in a.bursts.split(",") if x]:
            results["burst_%d" % n] = burst(s, n, retry=False)
            print(json.dumps({"burst_%d" % n: results["burst_%d" % n]}), flush=True)
        for n in [int(x) for x in a.retry_bursts.split(",") if x]:
            results["burst_%d_retrying" % n] = burst(s, n, retry=True)
            print(json.dumps({"burst_%d_retrying" % n: results["burst_%d_retrying" % n]}), flush=True)
        if a.heavy:
            results["heavy"] = heavy(s, a.heavy, a.states, a.questions, a.smalls, a.heavy_over)
            print(json.dumps({"heavy": results["heavy"]}), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
