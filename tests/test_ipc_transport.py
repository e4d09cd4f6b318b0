"""Tokenize and Infer calls over IPC unix sockets (laya_grpc/core/wire/ipc.py).

Against the real tokenizer and inference processes of a `serve` stack (which gives its children
IPC sockets): a call over IPC answers exactly what the gRPC unary call answers, errors keep their
kind and detail and the socket keeps serving, concurrent calls are matched to their callers, and
a backend killed with a call in flight fails that call BUSY at once (HTTP 503), not after the
call's timeout. The gateway's answers over IPC equal upstream's in test_services_e2e.py.
"""
from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import grpc
import numpy as np
import pytest

from laya_grpc.core.wire import ipc
from laya_grpc.core.errors import Kind, LayaError
from laya_grpc.core.wire.question_wire import tokenize_request
from laya_proto.internal.v1 import inference_pb2, inference_pb2_grpc, tokenizer_pb2, tokenizer_pb2_grpc
from stack import Stack

QUESTIONS = {"intent": {"type": "choice", "instructions": "What does the customer want?",
                        "criteria": {"refund": "money back", "exchange": "a new one"}},
             "angry": {"type": "noul", "instructions": "Is the customer angry?"}}
STATES = ["My phone arrived broken and I want my money back today.", "Where is my parcel?",
          {"ticket": 3, "body": "the box was damaged " * 20}, "hello"]


@pytest.fixture(scope="module")
def stack(tiny_ckpt):
    with Stack({"english": tiny_ckpt}, extra_args=["--tokenizer-workers", "1", "--gateway-workers", "1"]) as s:
        yield s


def _tok_req(state, checkpoint="english") -> tokenizer_pb2.TokenizeRequest:
    return tokenize_request(tokenizer_pb2.TokenizeRequest, checkpoint, [state], QUESTIONS)


def _ipc(stack, name: str) -> str:
    return "ipc://" + os.path.join(stack.run_dir, name + ".ipc")


def _grpc(stack, name: str) -> str:
    return "unix:" + os.path.join(stack.run_dir, name + ".sock")


def test_serve_gives_its_children_ipc_sockets_and_keeps_grpc_for_health(stack):
    log = stack.full_log()
    assert "tokenizer ipc://%s.ipc?grpc=unix:" % os.path.join(stack.run_dir, "tokenizer-0") in log
    assert os.path.exists(_ipc(stack, "inference")[len("ipc://"):])
    assert stack.health()["ready"] is True   # readiness came through each backend's gRPC health


def test_ipc_calls_equal_unary_calls_and_errors_keep_their_kind(stack):
    async def main():
        tch, ich = grpc.aio.insecure_channel(_grpc(stack, "tokenizer-0")), grpc.aio.insecure_channel(_grpc(stack, "inference"))
        tok, inf = tokenizer_pb2_grpc.TokenizerServiceStub(tch), inference_pb2_grpc.InferenceServiceStub(ich)
        tmux = ipc.mux(_ipc(stack, "tokenizer-0"), tokenizer_pb2.TokenizeCall, tokenizer_pb2.TokenizeReply, "tokenizer service")
        imux = ipc.mux(_ipc(stack, "inference"), inference_pb2.InferCall, inference_pb2.InferReply, "inference service")
        try:
            unary = [await tok.Tokenize(_tok_req(s)) for s in STATES]
            got = await asyncio.gather(*[tmux.call(_tok_req(s), 30) for s in STATES * 3])
            for i, r in enumerate(got):   # concurrent calls each got their own answer
                assert r.rows.ids == unary[i % len(STATES)].rows.ids
                assert r.usage == unary[i % len(STATES)].usage

            with pytest.raises(grpc.aio.AioRpcError) as unary_err:
                await tok.Tokenize(_tok_req("x", checkpoint="nope"))
            with pytest.raises(LayaError) as ipc_err:
                await tmux.call(_tok_req("x", checkpoint="nope"), 30)
            assert ipc_err.value.kind == Kind.NOT_FOUND
            assert ipc_err.value.detail == unary_err.value.details()
            assert (await tmux.call(_tok_req(STATES[0]), 30)).rows.ids == unary[0].rows.ids

            ireqs = [inference_pb2.InferRequest(checkpoint="english", rows=r.rows) for r in unary]
            want = [await inf.Infer(q) for q in ireqs]
            got = await asyncio.gather(*[imux.call(q, 60) for q in ireqs * 4])
            for i, r in enumerate(got):   # concurrent calls share forwards: fp32 rounding apart
                w = want[i % len(want)]
                np.testing.assert_allclose(np.frombuffer(r.logits, "<f4"), np.frombuffer(w.logits, "<f4"), atol=1e-5)
                np.testing.assert_allclose(np.frombuffer(r.act_logits, "<f4"), np.frombuffer(w.act_logits, "<f4"),
                                           atol=1e-5)

            bad = inference_pb2.InferRequest(checkpoint="english")
            bad.rows.CopyFrom(unary[0].rows)
            bad.rows.tokenizer_fingerprint = "0" * 64
            with pytest.raises(grpc.aio.AioRpcError) as unary_err:
                await inf.Infer(bad)
            with pytest.raises(LayaError) as ipc_err:
                await imux.call(bad, 60)
            assert ipc_err.value.kind == Kind.INVALID
            assert ipc_err.value.detail == unary_err.value.details()
            assert (await imux.call(ireqs[0], 60)).logits == (await imux.call(ireqs[0], 60)).logits
        finally:
            await tmux.close()
            await imux.close()
            await tch.close()
            await ich.close()
    asyncio.run(main())


def test_a_call_to_a_socket_nobody_listens_on_fails_busy_quickly(tmp_path):
    async def main():
        mux = ipc.mux("ipc://%s/none.ipc" % tmp_path, tokenizer_pb2.TokenizeCall, tokenizer_pb2.TokenizeReply,
                      "tokenizer service")
        t0 = time.monotonic()
        with pytest.raises(LayaError) as err:
            await mux.call(_tok_req("x"), 30)
        assert err.value.kind == Kind.BUSY and "nothing listening" in err.value.detail
        assert str(tmp_path) not in err.value.detail   # the socket path stays in the log
        assert time.monotonic() - t0 < 5
        await mux.close()
    asyncio.run(main())


def test_ipc_addresses_need_the_grpc_address_for_health():
    link = ipc.Link.parse("ipc:///run/x/tokenizer-0.ipc?grpc=unix:/run/x/tokenizer-0.sock")
    assert (link.ipc, link.grpc) == ("ipc:///run/x/tokenizer-0.ipc", "unix:/run/x/tokenizer-0.sock")
    assert ipc.Link.parse("10.0.0.5:50053") == ipc.Link("10.0.0.5:50053", None)
    with pytest.raises(LayaError) as err:
        ipc.Link.parse("ipc:///run/x/tokenizer-0.ipc")
    assert err.value.kind == Kind.INVALID and "grpc=" in err.value.detail


def test_a_backend_killed_with_a_request_in_flight_answers_503_at_once_and_then_serves(stack):
    """The inference process is stopped (the call is sent and never answered), then killed with -9:
    the HTTP request in flight gets 503 within seconds (the Infer timeout is 600 s), the supervisor
    restarts the child and the next requests are answered over a new connection."""
    body = {"state": STATES[0], "questions": QUESTIONS}
    assert stack.post("/v1/systemone", body)[0] == 200
    pid = stack.child_pid("inference")
    os.kill(pid, signal.SIGSTOP)
    result = {}

    def request():
        t0 = time.monotonic()
        result["status"], result["body"], _ = stack.post("/v1/systemone", body)
        result["s"] = time.monotonic() - t0
    t = threading.Thread(target=request)
    t.start()
    time.sleep(1.0)          # the request is now waiting on the stopped inference process
    assert t.is_alive(), result
    t_kill = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    t.join(30)
    assert not t.is_alive(), "the request in flight hung after its backend died"
    assert result["status"] == 503, result
    assert time.monotonic() - t_kill < 10
    deadline = time.monotonic() + 120   # the supervisor restarts it; the gateway reconnects
    while (status := stack.post("/v1/systemone", body)[0]) != 200:
        assert status == 503 and time.monotonic() < deadline, status
        time.sleep(0.3)


def test_timing_header_only_when_asked_and_each_hop_covers_its_server_figures(stack):
    from laya_grpc.core.runtime import timing
    body = {"state": STATES[0], "questions": QUESTIONS}
    status, _, headers = stack.post("/v1/systemone", body)
    assert status == 200 and not any(k.lower() == "x-laya-timing" for k in headers)
    status, _, headers = stack.post("/v1/systemone", body, headers={"x-laya-timing": "1"})
    assert status == 200
    st = timing.parse(next(v for k, v in headers.items() if k.lower() == "x-laya-timing"))
    assert list(st) == ["admission_body", "parse", "route", "tokenize_server", "tokenizer_hop", "queue_wait", "model",
                        "inference_hop", "decode", "render"], st
    assert all(v >= 0 for v in st.values()), st
    assert st["tokenizer_hop"] >= st["tokenize_server"] > 0   # the hop includes the server's own time
    assert st["inference_hop"] >= st["model"] > 0


def test_a_call_given_up_is_cancelled_on_the_server(tmp_path):
    """A call past its timeout or cancelled by its caller stops on the server too (its work leaves
    the queues), as over a gRPC stream; the socket keeps serving the next call."""
    from laya_proto.v1 import tokens_pb2
    running, stopped = [], []

    async def handle(request):
        running.append(request.checkpoint)
        try:
            await asyncio.sleep(30)   # work that never finishes by itself
        except asyncio.CancelledError:
            stopped.append(request.checkpoint)
            raise
        return inference_pb2.InferResponse()

    async def quick(request):
        return inference_pb2.InferResponse(device=request.checkpoint)

    async def main():
        endpoint = "ipc://" + str(tmp_path / "calls.ipc")
        server = ipc.IpcServer(endpoint, lambda r: quick(r) if r.checkpoint == "quick" else handle(r),
                               inference_pb2.InferCall, inference_pb2.InferReply, tokens_pb2.CallError, "Infer").start()
        mux = ipc.mux(endpoint, inference_pb2.InferCall, inference_pb2.InferReply, "inference service")
        try:
            with pytest.raises(LayaError) as timed_out:
                await mux.call(inference_pb2.InferRequest(checkpoint="timeout"), 0.2)
            assert timed_out.value.kind == Kind.TIMEOUT
            task = asyncio.ensure_future(mux.call(inference_pb2.InferRequest(checkpoint="cancel"), 30))
            await asyncio.sleep(0.2)
            task.cancel()
            t0 = time.monotonic()
            while len(stopped) < 2 and time.monotonic() - t0 < 5:
                await asyncio.sleep(0.01)
            assert sorted(stopped) == ["cancel", "timeout"], (running, stopped)   # before the server closes
            assert (await mux.call(inference_pb2.InferRequest(checkpoint="quick"), 5)).device == "quick"
        finally:
            await mux.close()
            await server.close()
    asyncio.run(main())
    assert running == ["timeout", "cancel"], running


def _echo_server(endpoint, started, stopped):
    from laya_proto.v1 import tokens_pb2

    async def handle(request):
        started.append(request.checkpoint)
        if request.checkpoint.startswith("slow"):
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                stopped.append(request.checkpoint)
                raise
        return inference_pb2.InferResponse(device=request.checkpoint)

    return ipc.IpcServer(endpoint, handle, inference_pb2.InferCall, inference_pb2.InferReply, tokens_pb2.CallError,
                         "Infer")


def test_a_caller_that_goes_away_has_its_calls_cancelled_and_others_keep_theirs(tmp_path):
    """A gateway that exits (its connection closes) leaves no work behind on the service: its calls
    are cancelled there, while another caller's call on its own connection still gets its answer."""
    started, stopped = [], []

    async def main():
        endpoint = "ipc://" + str(tmp_path / "calls.ipc")
        server = _echo_server(endpoint, started, stopped).start()
        gone = ipc.mux(endpoint, inference_pb2.InferCall, inference_pb2.InferReply, "inference service")
        stays = ipc.mux(endpoint, inference_pb2.InferCall, inference_pb2.InferReply, "inference service")
        try:
            lost = [asyncio.ensure_future(gone.call(inference_pb2.InferRequest(checkpoint="slow-%d" % i), 30))
                    for i in range(3)]
            assert (await stays.call(inference_pb2.InferRequest(checkpoint="quick"), 5)).device == "quick"
            while len(started) < 4:
                await asyncio.sleep(0.01)
            await gone.close()          # the caller's connection closes with its calls in flight
            for t in lost:
                with pytest.raises(LayaError) as err:
                    await t
                assert err.value.kind is Kind.BUSY
            t0 = time.monotonic()
            while len(stopped) < 3 and time.monotonic() - t0 < 5:
                await asyncio.sleep(0.01)
            assert sorted(stopped) == ["slow-0", "slow-1", "slow-2"]
            assert (await stays.call(inference_pb2.InferRequest(checkpoint="again"), 5)).device == "again"
        finally:
            await stays.close()
            await server.close()
    asyncio.run(main())


def test_a_frame_over_the_message_limit_closes_only_that_connection(tmp_path):
    """A local peer that announces a frame longer than the internal message limit is cut off before
    anything is buffered for it; the service keeps answering its other callers."""
    import socket
    import struct
    from laya_grpc.core.wire.rpc import MAX_MESSAGE_BYTES
    started, stopped = [], []

    async def main():
        endpoint = "ipc://" + str(tmp_path / "calls.ipc")
        server = _echo_server(endpoint, started, stopped).start()
        mux = ipc.mux(endpoint, inference_pb2.InferCall, inference_pb2.InferReply, "inference service")
        try:
            assert (await mux.call(inference_pb2.InferRequest(checkpoint="before"), 5)).device == "before"
            loop = asyncio.get_running_loop()
            raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            raw.setblocking(False)
            await loop.sock_connect(raw, str(tmp_path / "calls.ipc"))
            await loop.sock_sendall(raw, struct.pack("<I", MAX_MESSAGE_BYTES + 1) + b"\0" * 1024)
            closed = await asyncio.wait_for(loop.sock_recv(raw, 16), 5)
            assert closed == b""        # the service closed this connection
            raw.close()
            assert (await mux.call(inference_pb2.InferRequest(checkpoint="after"), 5)).device == "after"
        finally:
            await mux.close()
            await server.close()
    asyncio.run(main())


def test_a_stale_socket_file_is_replaced_and_a_live_one_refused(tmp_path):
    """A socket file left by a killed process does not stop a restarted service from listening;
    a path another live service listens on is refused with a clear error, not taken over."""
    import socket
    path = tmp_path / "calls.ipc"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()                       # the file stays, nobody listens
    assert path.exists()

    async def main():
        endpoint = "ipc://" + str(path)
        server = _echo_server(endpoint, [], []).start()
        mux = ipc.mux(endpoint, inference_pb2.InferCall, inference_pb2.InferReply, "inference service")
        try:
            assert (await mux.call(inference_pb2.InferRequest(checkpoint="x"), 5)).device == "x"
            with pytest.raises(LayaError) as err:
                _echo_server(endpoint, [], [])
            assert err.value.kind is Kind.INVALID and "cannot listen" in err.value.detail
            assert (await mux.call(inference_pb2.InferRequest(checkpoint="y"), 5)).device == "y"
        finally:
            await mux.close()
            await server.close()
    asyncio.run(main())


def test_replicas_keep_a_lone_caller_on_one_and_spread_calls_in_flight(tmp_path):
    """The gateway's replica picker (engine/remote_services.py, Replicas) over IPC: one call at a time always goes to
    the first replica of the list (the others stay idle, not woken in turn); calls in flight together
    go to different replicas; once the first stops listening its calls are retried on the other."""
    from laya_grpc.engine.remote_services import Replicas
    from laya_proto.v1 import tokens_pb2
    seen: dict = {0: [], 1: []}
    gate = asyncio.Event()

    def handler(k):
        async def handle(request):
            seen[k].append(request.checkpoint)
            if request.checkpoint.startswith("hold"):
                await gate.wait()
            return inference_pb2.InferResponse(device=str(k))
        return handle

    async def main():
        endpoints = ["ipc://" + str(tmp_path / ("replica-%d.ipc" % k)) for k in range(2)]
        servers = [ipc.IpcServer(e, handler(k), inference_pb2.InferCall, inference_pb2.InferReply, tokens_pb2.CallError,
                                 "Infer").start() for k, e in enumerate(endpoints)]
        replicas = Replicas([ipc.mux(e, inference_pb2.InferCall, inference_pb2.InferReply, "inference service")
                             for e in endpoints], [], "inference service")
        try:
            for n in range(6):
                assert (await replicas.call(inference_pb2.InferRequest(checkpoint="one-%d" % n), 5)).device == "0"
            assert seen == {0: ["one-%d" % n for n in range(6)], 1: []}, seen
            held = [asyncio.ensure_future(replicas.call(inference_pb2.InferRequest(checkpoint="hold-%d" % n), 5))
                    for n in range(2)]
            t0 = time.monotonic()
            while len(seen[0]) + len(seen[1]) < 8 and time.monotonic() - t0 < 5:
                await asyncio.sleep(0.01)
            gate.set()
            assert sorted(r.device for r in await asyncio.gather(*held)) == ["0", "1"]
            assert seen[0][-1] == "hold-0" and seen[1] == ["hold-1"], seen
            await servers[0].close()
            assert (await replicas.call(inference_pb2.InferRequest(checkpoint="after"), 5)).device == "1"
        finally:
            await replicas.close()
            for s in servers:
                await s.close()
    asyncio.run(main())
