"""Clients that ignore the retry hint, against clients that honour it, through one real `serve`.

The gateway's admission (gateway/admission.py) gives a queue place only to a request whose
connection has waited out its retry delay; a re-send before it is refused at once and the delay
starts again. So clients that re-send the moment they are refused cannot take the places that
well-behaved clients come back to. The stack runs with one slot and a small queue so that a few
client threads overload it on a shared 2-core box.
"""
from __future__ import annotations

import asyncio
import collections
import json
import threading
import time

import grpc
import httpx

from laya_grpc.client import AsyncLayaClient, LayaClient
from laya_grpc.core.wire import calls
from laya_proto.v1 import decision_pb2, decision_pb2_grpc
from stack import Stack

NOUL = {"type": "noul", "instructions": "Is the customer angry?"}
ENV = {"LAYA_MAX_CONCURRENT": "1", "LAYA_MAX_QUEUE": "8", "LAYA_QUEUE_TIMEOUT_SECONDS": "5"}
GREEDY = 6   # threads per transport
SECONDS = 8.0


def _body(i: int) -> dict:
    return {"state": "Order %d arrived broken and I want my money back." % i, "questions": {"angry": NOUL}}


def _overload(stack: Stack, seconds: float) -> dict:
    """Greedy clients (6 over HTTP, each on its own kept-alive connection, 6 over one gRPC channel)
    re-send at once when refused; polite ones (3 over HTTP waiting `Retry-After`, 3 `LayaClient`s,
    which wait out RetryInfo) send one request after another. Counts per kind."""
    out = {k: {"ok": 0, "refused": 0} for k in ("greedy", "polite_http", "polite_grpc")}
    first_try = []   # polite HTTP requests: refusals before the answer
    lock = threading.Lock()
    stop = threading.Event()

    def count(kind: str, key: str) -> None:
        with lock:
            out[kind][key] += 1

    def greedy_http(i: int) -> None:
        with httpx.Client(timeout=30) as c:
            while not stop.is_set():
                try:
                    r = c.post(stack.http + "/v1/systemone", json=_body(i))
                except httpx.TransportError:   # a refusal sent before its body was read closes the connection
                    count("greedy", "refused")
                    continue
                count("greedy", "ok" if r.status_code == 200 else "refused")

    def greedy_grpc(stub, i: int) -> None:
        req = decision_pb2.DecideRequest(request_json=json.dumps(_body(i)))
        while not stop.is_set():
            try:
                stub.Decide(req, timeout=30)
                count("greedy", "ok")
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.UNAVAILABLE, e
                count("greedy", "refused")

    def polite_http(i: int) -> None:
        with httpx.Client(timeout=30) as c:
            while not stop.is_set():
                refusals = 0
                while True:
                    r = c.post(stack.http + "/v1/systemone", json=_body(i))
                    if r.status_code != 503:
                        break
                    refusals += 1
                    count("polite_http", "refused")
                    time.sleep(float(r.headers["retry-after"]))
                assert r.status_code == 200, r.text
                count("polite_http", "ok")
                with lock:
                    first_try.append(refusals)

    def polite_grpc(i: int) -> None:
        with LayaClient(stack.grpc, timeout=30) as c:
            while not stop.is_set():
                c.decide(_body(i)["state"], _body(i)["questions"])
                count("polite_grpc", "ok")

    channel = grpc.insecure_channel(stack.grpc)
    stub = decision_pb2_grpc.DecisionServiceStub(channel)
    greedy = [threading.Thread(target=greedy_http, args=(i,)) for i in range(GREEDY)]
    greedy += [threading.Thread(target=greedy_grpc, args=(stub, i)) for i in range(GREEDY)]
    polite = [threading.Thread(target=polite_http, args=(i,)) for i in range(3)]
    polite += [threading.Thread(target=polite_grpc, args=(i,)) for i in range(3)]
    for t in greedy:
        t.start()
    time.sleep(1.0)   # the greedy clients hold the queue first
    for t in polite:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in greedy + polite:
        t.join(60)
    channel.close()
    out["polite_http_refusals_per_answer"] = dict(sorted(collections.Counter(first_try).items()))
    return out


def test_clients_that_resend_at_once_do_not_crowd_out_those_that_wait(tiny_ckpt):
    with Stack({"english": tiny_ckpt}, env=ENV) as s:
        out = _overload(s, SECONDS)
    print(out)
    assert out["greedy"]["refused"] > 100, out          # the greedy clients did overload it
    # a polite client comes back to a place: mostly answered after at most one refusal (the one
    # that told it to wait; 87-100% measured, more refusals when other work slows the box) ...
    refusals = out["polite_http_refusals_per_answer"]
    answered = sum(refusals.values())
    assert answered and sum(n for r, n in refusals.items() if r <= 1) >= 0.5 * answered, out
    # ... so each polite client gets at least half the answers a greedy one gets (without the rules:
    # a seventh of them, the queue places going to whoever re-sends first)
    polite = (out["polite_http"]["ok"] + out["polite_grpc"]["ok"]) / 6
    assert polite >= 0.5 * out["greedy"]["ok"] / (2 * GREEDY), out


def test_a_stream_full_of_calls_is_answered_whole(tiny_ckpt):
    """300 calls at once on one DecideStream, more than the 128 a stream runs at a time: the
    stream reads the rest as calls end, and every call is answered."""
    with Stack({"english": tiny_ckpt}) as s:
        async def main():
            async with AsyncLayaClient(s.grpc, timeout=120) as c:
                return await asyncio.gather(*(c.decide(_body(i)["state"], _body(i)["questions"])
                                              for i in range(300)))
        answers = asyncio.run(main())
    assert len(answers) == 300 and all(a["answers"]["angry"]["type"] == "noul" for a in answers)


def test_a_stream_runs_at_most_its_bound_of_calls_and_reads_on_as_they_end():
    """serve_calls with a bound: a client that sends 300 calls (and reads nothing) gets 128 running;
    each one that ends lets the next be read."""
    from laya_proto.v1 import tokens_pb2

    async def main():
        release, running, peak, written = asyncio.Event(), [0], [0], []

        async def handle(request):
            running[0] += 1
            peak[0] = max(peak[0], running[0])
            await release.wait()
            running[0] -= 1
            return decision_pb2.DecideResponse(model="m")

        async def sent():
            for i in range(300):
                yield decision_pb2.DecideCall(id=i + 1, request=decision_pb2.DecideRequest())

        class Context:   # what serve_calls asks of grpc.aio's servicer context
            async def send_initial_metadata(self, metadata):
                pass

            async def write(self, reply):
                written.append(reply.id)

        served = asyncio.ensure_future(calls.serve_calls(sent(), Context(), handle, decision_pb2.DecideReply,
                                                         tokens_pb2.CallError, "Decide", 128))
        await asyncio.sleep(0.05)
        assert peak[0] == 128 and not served.done()
        release.set()
        await asyncio.wait_for(served, 10)
        assert sorted(written) == list(range(1, 301)) and peak[0] <= 128
    asyncio.run(main())


_KILLED_MID_STREAM = r"""
import json, os, sys, time
import grpc
from laya_proto.v1 import decision_pb2, decision_pb2_grpc
body = json.dumps({"state": "Order 1 arrived broken.", "questions": {"angry": {"type": "noul", "instructions": "Angry?"}}})
def calls():
    for i in range(200):
        yield decision_pb2.DecideCall(id=i + 1, request=decision_pb2.DecideRequest(request_json=body))
    time.sleep(60)
stub = decision_pb2_grpc.DecisionServiceStub(grpc.insecure_channel(sys.argv[1]))
for n, _ in enumerate(stub.DecideStream(calls())):
    if n == 5:
        os.kill(os.getpid(), 9)
"""


def test_a_stream_whose_client_leaves_mid_call_logs_no_traceback(tiny_ckpt):
    """Streams left with calls running and queued (one slot): a client killed (-9), one that cancels
    its stream, one whose channel closes. Each call ends as cancelled; the log has no traceback
    (gRPC's ExecuteBatchError for a status sent on an ended call, an unretrieved task) and the
    gateway serves on."""
    import subprocess
    import sys

    env = {"LAYA_MAX_CONCURRENT": "1", "LAYA_MAX_QUEUE": "256"}
    with Stack({"english": tiny_ckpt}, env=env) as s:
        for _ in range(3):
            subprocess.run([sys.executable, "-c", _KILLED_MID_STREAM, s.grpc], timeout=120)

        async def leave(close_channel: bool) -> None:
            async with grpc.aio.insecure_channel(s.grpc) as ch:
                call = decision_pb2_grpc.DecisionServiceStub(ch).DecideStream()
                for i in range(100):
                    await call.write(decision_pb2.DecideCall(id=i + 1, request=decision_pb2.DecideRequest(
                        request_json=json.dumps(_body(i)))))
                for _ in range(3):
                    await call.read()
                if not close_channel:
                    call.cancel()
        for close_channel in (False, True, False, True):
            asyncio.run(leave(close_channel))
        time.sleep(1.0)
        assert httpx.post(s.http + "/v1/systemone", json=_body(0), timeout=30).status_code == 200
        log = s.full_log()
    for bad in ("Traceback", "ExecuteBatchError", "never retrieved", "grpc decide 500"):
        assert bad not in log, log[-4000:]
