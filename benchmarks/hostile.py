"""Hostile clients and heavy load against a real `laya-grpc serve` (CPU, tiny checkpoint), with
the figures each target is judged by:

- hostile cases: HTTP bodies and gRPC requests from the hypothesis strategies of
  tests/hostile_clients.py plus undecodable bytes on every public RPC; counts of 5xx, INTERNAL
  and UNKNOWN, and whether a valid request is still answered right afterwards;
- memory: RSS of each process before and after the fuzzing and after large (2 MiB) bodies;
- head of line: a small request's latency while the largest batch upstream's limits admit in
  shape (64 states x 64 questions = 4,096 rows) runs, over HTTP and gRPC; and while the costliest
  one runs (`hol_max`: those 4,096 rows at up to 8,192 tokens each, a 2 MiB body), for 20 s before
  its client goes away, with its whole cost extrapolated from one state;
- cancellation: two such batches abandoned after 1 s (HTTP client closes; gRPC 1 s deadline),
  then a small request at once: its latency minus the idle one is how long the device still
  worked for the abandoned requests (an upper bound of "abandoned work stops within");
- slow clients: how long a silent, a request-line-only and a 2-bytes/s connection live;
- auth: which RPCs and routes answer without the key.

    python -m benchmarks.hostile [--http-cases 2000] [--grpc-cases 1000] [--out results.json]

The kill -9 figure comes from `pytest --soak tests/test_hostile_load.py -k kill` (24 clients).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import threading
import time

import grpc
import httpx
from hypothesis import HealthCheck, given, settings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from hostile_clients import (BAD_CODES, PUBLIC_METHODS, SMALL, grpc_batch_requests, grpc_decide_requests,  # noqa: E402
                             http_bodies, large_batch, open_until_closed, raw_call)
from stack import Stack  # noqa: E402

from laya_grpc.cli.make_checkpoint import make_checkpoint  # noqa: E402
from laya_proto.v1 import decision_pb2, decision_pb2_grpc, status_pb2  # noqa: E402

KEY = "bench-key"
AUTH = {"authorization": "Bearer " + KEY}
MD = (("authorization", "Bearer " + KEY),)
HEADER_TIMEOUT_S = 2.0


def rss_mb(pid: int) -> float:
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def memory(stack) -> dict:
    return {name: round(rss_mb(stack.child_pid(name)), 1) for name in ("gateway", "tokenizer", "inference")}


def small_http(stack, client) -> float:
    t0 = time.perf_counter()
    r = client.post(stack.http + "/v1/systemone", json=SMALL, headers=AUTH)
    assert r.status_code == 200, r.text
    return time.perf_counter() - t0


def small_grpc(stub) -> float:
    t0 = time.perf_counter()
    stub.Decide(decision_pb2.DecideRequest(request_json=json.dumps(SMALL)), metadata=MD, timeout=300)
    return time.perf_counter() - t0


def small_while(t: threading.Thread, stack, client, stub) -> tuple:
    """Small requests, HTTP then gRPC, every 0.2 s while `t` runs; (HTTP, gRPC) latencies."""
    during_http, during_grpc = [], []
    while t.is_alive():
        during_http.append(small_http(stack, client))
        during_grpc.append(small_grpc(stub))
        time.sleep(0.2)
    t.join()
    return during_http, during_grpc


def fuzz_http(stack, client, n: int) -> dict:
    seen = {"cases": 0, "5xx": 0, "codes": {}}

    @settings(max_examples=n, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(body=http_bodies)
    def one(body):
        route = "/v1/systemone" if seen["cases"] % 2 == 0 else "/v1/systemone/batch"
        r = client.post(stack.http + route, content=body, headers=dict(AUTH, **{"content-type": "application/json"}))
        seen["cases"] += 1
        seen["codes"][r.status_code] = seen["codes"].get(r.status_code, 0) + 1
        seen["5xx"] += r.status_code >= 500
    one()
    return seen


def fuzz_grpc(stack, n: int) -> dict:
    ch = grpc.insecure_channel(stack.grpc)
    stub = decision_pb2_grpc.DecisionServiceStub(ch)
    seen = {"cases": 0, "internal_or_unknown": 0, "codes": {}}

    def count(code):
        seen["cases"] += 1
        seen["codes"][code.name] = seen["codes"].get(code.name, 0) + 1
        seen["internal_or_unknown"] += code in BAD_CODES

    @settings(max_examples=n // 3 + 1, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(req=grpc_decide_requests(), batch=grpc_batch_requests())
    def one(req, batch):
        for call, msg in ((stub.Decide, req), (stub.DecideBatch, batch)):
            try:
                call(msg, metadata=MD, timeout=60)
                count(grpc.StatusCode.OK)
            except grpc.RpcError as e:
                count(e.code())
        [reply] = list(stub.DecideStream(iter([decision_pb2.DecideCall(id=1, request=req)]), metadata=MD, timeout=60))
        count(grpc.StatusCode.INTERNAL if reply.WhichOneof("result") == "error" and reply.error.kind == "INTERNAL"
              else grpc.StatusCode.OK)
    one()
    for payload in (b"\xff" * 8, b"\x0a\xff\xff\xff\xff\x0f", os.urandom(64), b"\x12\x80"):
        for method, rs, ss in PUBLIC_METHODS:
            count(raw_call(ch, method, rs, ss, payload, metadata=MD))
    ch.close()
    return seen


def head_of_line(stack, client, stub) -> dict:
    body = large_batch()
    out = {"rows": 64 * 64, "body_bytes": len(json.dumps(body))}
    done = {}

    def big():
        t0 = time.perf_counter()
        r = httpx.post(stack.http + "/v1/systemone/batch", json=body, headers=AUTH, timeout=600)
        done["s"], done["status"] = time.perf_counter() - t0, r.status_code

    out["small_idle_s"] = round(min(small_http(stack, client) for _ in range(5)), 4)
    t = threading.Thread(target=big)
    t.start()
    time.sleep(0.05)   # from the start: tokenizing the large request is covered too
    during_http, during_grpc = small_while(t, stack, client, stub)
    out.update(large_s=round(done["s"], 2), large_status=done["status"],
               small_during_http_max_s=round(max(during_http), 3), small_during_grpc_max_s=round(max(during_grpc), 3),
               small_during_samples=len(during_http))
    return out


def maximal_batch(n_questions: int = 64, n_states: int = 64) -> dict:
    """The costliest batch upstream's limits admit: 64 states filling the 2 MiB body (~32,000
    characters, ~8,000 tokens each), 64 questions, max_len at the 8,192-token budget: 4,096 rows
    of up to 8,192 tokens."""
    body = large_batch(n_states, n_questions)
    word = "delivery "
    body["states"] = [("%d " % i) + word * (31_000 // len(word)) for i in range(n_states)]
    body["max_len"] = 8192
    return body


def head_of_line_maximal(stack, client, stub, run_s: float = 20.0) -> dict:
    """The maximal batch for `run_s` seconds (it would take far longer: see `cost`), small requests
    meanwhile, then the client goes away: the small request after that shows it stopped."""
    t0 = time.perf_counter()
    r = client.post(stack.http + "/v1/systemone/batch", json=maximal_batch(8, 1), headers=AUTH)
    one_state_8q_s = time.perf_counter() - t0
    body = json.dumps(maximal_batch()).encode()
    out = {"body_bytes": len(body), "rows": 4096, "one_state_8_questions_s": round(one_state_8q_s, 2),
           "one_state_8_questions_status": r.status_code,
           "estimated_full_request_s": round(one_state_8q_s * 64 * 8, 0)}
    t = threading.Thread(target=_abandon_http, args=(stack, body, run_s))
    t.start()
    time.sleep(0.05)
    during_http, during_grpc = small_while(t, stack, client, stub)
    after = small_http(stack, client)
    out.update(small_during_http_max_s=round(max(during_http), 3), small_during_grpc_max_s=round(max(during_grpc), 3),
               small_during_samples=len(during_http), small_right_after_abandon_s=round(after, 3))
    return out


def _abandon_http(stack, body: bytes, after_s: float) -> None:
    host, port = stack.http[len("http://"):].split(":")
    s = socket.create_connection((host, int(port)))
    s.sendall(b"POST /v1/systemone/batch HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
              b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (KEY.encode(), len(body)) + body)
    time.sleep(after_s)
    s.close()


def cancellation(stack, client, stub, trials: int = 5) -> dict:
    """Two large batches abandoned after 1 s, then a small request at once, on each transport in
    the same way: over HTTP the client closes its connections; over gRPC a 1 s deadline passes
    (the small request goes out when both calls have ended DEADLINE_EXCEEDED). The small request's
    latency minus its idle latency bounds how long the device still worked for the abandoned rows.
    Repeated `trials` times with a quiet second between; median and max."""
    body = json.dumps(large_batch()).encode()
    req = decision_pb2.DecideBatchRequest(request_json=body.decode())
    codes = []

    def abandon_grpc():
        try:
            stub.DecideBatch(req, metadata=MD, timeout=1.0)
            codes.append("OK")
        except grpc.RpcError as e:
            codes.append(e.code().name)

    def abandon(target, args=()):
        threads = [threading.Thread(target=target, args=args) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    http_idle = min(small_http(stack, client) for _ in range(5))
    grpc_idle = min(small_grpc(stub) for _ in range(5))
    http_ran, grpc_ran = [], []
    for _ in range(trials):
        abandon(_abandon_http, (stack, body, 1.0))
        http_ran.append(max(0.0, small_http(stack, client) - http_idle) * 1e3)
        time.sleep(1.0)
        abandon(abandon_grpc)
        grpc_ran.append(max(0.0, small_grpc(stub) - grpc_idle) * 1e3)
        time.sleep(1.0)

    def stats(xs):
        return {"median": round(sorted(xs)[len(xs) // 2], 1), "max": round(max(xs), 1),
                "all": [round(x, 1) for x in xs]}
    return {"http_idle_s": round(http_idle, 4), "grpc_idle_s": round(grpc_idle, 4),
            "http_abandoned_work_ran_on_ms": stats(http_ran), "grpc_abandoned_work_ran_on_ms": stats(grpc_ran),
            "grpc_abandoned_codes": sorted(set(codes))}


def slow_clients(stack) -> dict:
    host, port = stack.http[len("http://"):].split(":")
    out = {"header_timeout_s": HEADER_TIMEOUT_S}
    cases = {"silent": (b"", 0.0), "request_line_only": (b"POST /v1/systemone HTTP/1.1\r\n", 0.0),
             "headers_2_bytes_per_s": (b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 400, 0.5)}
    for name, (send, drip) in cases.items():
        out[name + "_lived_s"] = round(open_until_closed(host, int(port), send, drip, limit_s=60.0), 2)
    return out


def auth(stack, client) -> dict:
    ch = grpc.insecure_channel(stack.grpc)
    stream_call = decision_pb2.DecideCall(id=1, request=decision_pb2.DecideRequest(request_json=json.dumps(SMALL)))
    answered = []
    for m, rs, ss in PUBLIC_METHODS:
        if m.endswith("/DecideStream"):   # answers each call with the 401 as a CallError
            [reply] = list(decision_pb2_grpc.DecisionServiceStub(ch).DecideStream(iter([stream_call]), timeout=30))
            if reply.WhichOneof("result") != "error" or reply.error.kind != "UNAUTHENTICATED":
                answered.append(m)
            continue
        payload = status_pb2.StatusRequest().SerializeToString() if "Status" in m or "Health" in m else b""
        if raw_call(ch, m, rs, ss, payload) != grpc.StatusCode.UNAUTHENTICATED:
            answered.append(m)
    ch.close()
    health = client.get(stack.http + "/health").json()
    routes = {r: client.post(stack.http + r, json=SMALL).status_code for r in ("/v1/systemone", "/v1/systemone/batch")}
    return {"grpc_answering_without_key": answered, "http_health_without_key": health, "http_routes_without_key": routes}


def fuzz_stage(stack, client, args, figures: dict, expected: dict) -> None:
    figures["memory_mb_before"] = before = memory(stack)
    figures["http_fuzz"] = fuzz_http(stack, client, args.http_cases)
    figures["grpc_fuzz"] = fuzz_grpc(stack, args.grpc_cases)
    big = maximal_batch(n_questions=1)   # ~2 MiB of text to tokenize, 64 rows of 512 tokens to run
    del big["max_len"]
    figures["large_bodies"] = [client.post(stack.http + "/v1/systemone/batch", json=big, headers=AUTH).status_code
                               for _ in range(10)]
    time.sleep(1.0)
    figures["memory_mb_after"] = after = memory(stack)
    figures["memory_growth_pct"] = {k: round(100.0 * (after[k] - before[k]) / before[k], 1) for k in before}
    figures["still_right_after_fuzz"] = client.post(stack.http + "/v1/systemone", json=SMALL,
                                                    headers=AUTH).json()["answers"] == expected["answers"]
    log = stack.full_log()
    figures["log_tracebacks"] = log.count("Traceback")
    figures["log_lines"] = log.count("\n")
    print(json.dumps({k: figures[k] for k in figures}, indent=1, default=str), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--http-cases", type=int, default=2000)
    ap.add_argument("--grpc-cases", type=int, default=1000)
    ap.add_argument("--checkpoint", default=None, help="default: a fresh tiny checkpoint")
    ap.add_argument("--out", default=None, help="also write the figures here as JSON")
    ap.add_argument("--stages", default="fuzz,hol,hol_max,cancel,slow,auth",
                    help="comma-separated subset of fuzz (with memory), hol, hol_max, cancel, slow, auth")
    args = ap.parse_args()
    ckpt = args.checkpoint or make_checkpoint(os.path.join(tempfile.mkdtemp(prefix="hostile-bench-"), "tiny"), "tiny")
    env = {"LAYA_API_KEY": KEY, "LAYA_HTTP_HEADER_TIMEOUT_SECONDS": str(HEADER_TIMEOUT_S), "LAYA_MAX_CONCURRENT": "64"}
    figures: dict = {"load_average_at_start": os.getloadavg()}
    with Stack({"english": ckpt}, env=env) as stack, httpx.Client(timeout=600) as client:
        ch = grpc.insecure_channel(stack.grpc)
        stub = decision_pb2_grpc.DecisionServiceStub(ch)
        expected = client.post(stack.http + "/v1/systemone", json=SMALL, headers=AUTH).json()
        for _ in range(20):
            small_http(stack, client)
        stages = set(args.stages.split(","))
        if "fuzz" in stages:
            fuzz_stage(stack, client, args, figures, expected)
        if "hol" in stages:
            figures["head_of_line"] = head_of_line(stack, client, stub)
            print(json.dumps(figures["head_of_line"]), flush=True)
        if "hol_max" in stages:
            figures["head_of_line_maximal"] = head_of_line_maximal(stack, client, stub)
            print(json.dumps(figures["head_of_line_maximal"]), flush=True)
        if "cancel" in stages:
            figures["cancellation"] = cancellation(stack, client, stub)
            print(json.dumps(figures["cancellation"]), flush=True)
        if "slow" in stages:
            figures["slow_clients"] = slow_clients(stack)
            print(json.dumps(figures["slow_clients"]), flush=True)
        if "auth" in stages:
            figures["auth"] = auth(stack, client)
            print(json.dumps(figures["auth"]), flush=True)
        ch.close()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(figures, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
