"""Gateway->backend calls multiplexed on one stream (TokenizeStream, InferStream; laya_grpc/core/wire/calls.py).

Against the real tokenizer and inference processes of a `serve` stack: a streamed call answers
exactly what the unary call answers, errors keep their kind and detail and leave the stream
serving, concurrent calls are matched to their callers, a killed backend fails the calls on its
stream as BUSY and the next call opens a new stream. (The gateway always calls its backends
this way; its answers equal upstream's in test_services_e2e.py.)
"""
from __future__ import annotations

import asyncio
import os
import signal
import time

import grpc
import numpy as np
import pytest

from laya_grpc.core.errors import Kind, LayaError
from laya_grpc.core.wire.calls import stream_mux
from laya_grpc.core.wire.question_wire import tokenize_request
from laya_proto.internal.v1 import inference_pb2, inference_pb2_grpc, tokenizer_pb2, tokenizer_pb2_grpc
from stack import Stack

STATES = ["My phone arrived broken and I want my money back today.", "Where is my parcel?",
          {"ticket": 3, "body": "the box was damaged " * 20}, "hello"]
QUESTIONS = {"intent": {"type": "choice", "instructions": "What does the customer want?",
                        "criteria": {"refund": "money back", "exchange": "a new one"}},
             "angry": {"type": "noul", "instructions": "Is the customer angry?"}}


@pytest.fixture(scope="module")
def stack(tiny_ckpt):
    with Stack({"english": tiny_ckpt}, extra_args=["--tokenizer-workers", "1", "--gateway-workers", "1"]) as s:
        yield s


def _tok_req(state, checkpoint="english") -> tokenizer_pb2.TokenizeRequest:
    return tokenize_request(tokenizer_pb2.TokenizeRequest, checkpoint, [state], QUESTIONS)


def _run(coro):
    return asyncio.run(coro)


def _sock(stack, name: str) -> str:
    return "unix:" + os.path.join(stack.run_dir, name)


async def _close(*things) -> None:
    for t in things:
        await t.close()


async def _clients(stack):
    tch = grpc.aio.insecure_channel(_sock(stack, "tokenizer-0.sock"))
    ich = grpc.aio.insecure_channel(_sock(stack, "inference.sock"))
    tok = tokenizer_pb2_grpc.TokenizerServiceStub(tch)
    inf = inference_pb2_grpc.InferenceServiceStub(ich)
    return (tch, ich, tok, inf, stream_mux(tok.TokenizeStream, tokenizer_pb2.TokenizeCall, "tokenizer service"),
                                           stream_mux(inf.InferStream, inference_pb2.InferCall, "inference service"))


def test_streamed_calls_equal_unary_calls_and_errors_keep_their_kind(stack):
    async def main():
        tch, ich, tok, inf, tmux, imux = await _clients(stack)
        try:
            unary = [await tok.Tokenize(_tok_req(s)) for s in STATES]
            streamed = await asyncio.gather(*[tmux.call(_tok_req(s), 30) for s in STATES * 3])
            for i, r in enumerate(streamed):   # concurrent calls each got their own answer
                assert r.rows.ids == unary[i % len(STATES)].rows.ids
                assert r.usage == unary[i % len(STATES)].usage

            # an error is the unary call's error, and the stream keeps serving
            with pytest.raises(grpc.aio.AioRpcError) as unary_err:
                await tok.Tokenize(_tok_req("x", checkpoint="nope"))
            with pytest.raises(LayaError) as streamed_err:
                await tmux.call(_tok_req("x", checkpoint="nope"), 30)
            assert streamed_err.value.kind == Kind.NOT_FOUND
            assert streamed_err.value.detail == unary_err.value.details()
            assert (await tmux.call(_tok_req(STATES[0]), 30)).rows.ids == unary[0].rows.ids

            ireqs = [inference_pb2.InferRequest(checkpoint="english", rows=r.rows) for r in unary]
            want = [await inf.Infer(q) for q in ireqs]
            got = await asyncio.gather(*[imux.call(q, 60) for q in ireqs * 4])
            for i, r in enumerate(got):   # concurrent calls share forwards: other batch shapes, fp32 rounding apart
                w = want[i % len(want)]
                np.testing.assert_allclose(np.frombuffer(r.logits, "<f4"), np.frombuffer(w.logits, "<f4"), atol=1e-5)
                np.testing.assert_allclose(np.frombuffer(r.act_logits, "<f4"), np.frombuffer(w.act_logits, "<f4"),
                                           atol=1e-5)
                assert (r.device, r.dtype) == (w.device, w.dtype)

            bad = inference_pb2.InferRequest(checkpoint="english")
            bad.rows.CopyFrom(unary[0].rows)
            bad.rows.tokenizer_fingerprint = "0" * 64
            with pytest.raises(grpc.aio.AioRpcError) as unary_err:
                await inf.Infer(bad)
            with pytest.raises(LayaError) as streamed_err:
                await imux.call(bad, 60)
            assert streamed_err.value.kind == Kind.INVALID
            assert streamed_err.value.detail == unary_err.value.details()
            r = await imux.call(ireqs[0], 60)
            np.testing.assert_allclose(np.frombuffer(r.logits, "<f4"), np.frombuffer(want[0].logits, "<f4"), atol=1e-5)
        finally:
            await _close(tmux, imux, tch, ich)
    _run(main())


def test_a_killed_backend_fails_its_stream_busy_and_the_next_stream_serves(stack):
    async def main():
        tch, ich, tok, inf, tmux, imux = await _clients(stack)
        try:
            assert (await tmux.call(_tok_req(STATES[1]), 30)).rows.ids
            os.kill(stack.child_pid("tokenizer"), signal.SIGKILL)
            with pytest.raises(LayaError) as err:
                await tmux.call(_tok_req(STATES[1]), 30)
            assert err.value.kind == Kind.BUSY, err.value
            deadline = time.monotonic() + 60   # the supervisor restarts it; the mux opens a new stream
            while True:
                try:
                    r = await tmux.call(_tok_req(STATES[1]), 30)
                    break
                except LayaError as e:
                    assert e.kind == Kind.BUSY, e
                    assert time.monotonic() < deadline, "tokenizer never came back: %s" % e
                    await asyncio.sleep(0.2)
            assert r.rows.ids == (await tok.Tokenize(_tok_req(STATES[1]))).rows.ids
        finally:
            await _close(tmux, imux, tch, ich)
    _run(main())
    stack.wait_ready(60)


def test_a_call_that_gets_no_answer_times_out_and_the_caller_is_freed():
    """A peer that reads calls and never answers (not one of our services: the client's own timeout)."""
    async def main():
        async def silent(calls, context):
            async for _ in calls:
                pass
        srv = grpc.aio.server()
        srv.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("laya_proto.internal.v1.TokenizerService", {
            "TokenizeStream": grpc.stream_stream_rpc_method_handler(
                silent, tokenizer_pb2.TokenizeCall.FromString, tokenizer_pb2.TokenizeReply.SerializeToString)})])
        port = srv.add_insecure_port("127.0.0.1:0")
        await srv.start()
        ch = grpc.aio.insecure_channel("127.0.0.1:%d" % port)
        mux = stream_mux(tokenizer_pb2_grpc.TokenizerServiceStub(ch).TokenizeStream, tokenizer_pb2.TokenizeCall,
                         "tokenizer service")
        try:
            t0 = time.monotonic()
            with pytest.raises(LayaError) as err:
                await mux.call(_tok_req("x"), 0.3)
            assert err.value.kind == Kind.TIMEOUT and "did not answer within" in err.value.detail
            assert time.monotonic() - t0 < 5
            assert not mux._pending
        finally:
            await mux.close()
            await ch.close()
            await srv.stop(0)
    _run(main())


def test_loads_under_max_loaded_never_evict_a_checkpoint_in_use(tiny_ckpt, tiny_ml_ckpt):
    """--max-loaded 1, three checkpoints, concurrent Infer calls alternating between them: a load
    must wait for the other checkpoints' calls in flight instead of evicting them under them, and
    never evict one that is still warming (calls used to fail with 'not loaded', an INTERNAL
    TypeError or AttributeError)."""
    with Stack({"english": tiny_ckpt, "multilingual": tiny_ml_ckpt, "third": tiny_ckpt},
               extra_args=["--tokenizer-workers", "1", "--gateway-workers", "1", "--max-loaded", "1",
                           "--preload", "english"]) as s:
        async def main():
            tch = grpc.aio.insecure_channel(_sock(s, "tokenizer-0.sock"))
            ich = grpc.aio.insecure_channel(_sock(s, "inference.sock"))
            tok = tokenizer_pb2_grpc.TokenizerServiceStub(tch)
            imux = stream_mux(inference_pb2_grpc.InferenceServiceStub(ich).InferStream, inference_pb2.InferCall,
                              "inference service")
            try:
                reqs = []
                for name in ("english", "multilingual", "third"):
                    rows = (await tok.Tokenize(_tok_req(STATES[0], checkpoint=name))).rows
                    reqs.append(inference_pb2.InferRequest(checkpoint=name, rows=rows))
                for _ in range(3):
                    got = await asyncio.gather(*[imux.call(reqs[i % 3], 60) for i in range(36)],
                                               return_exceptions=True)
                    bad = [g for g in got if isinstance(g, BaseException)]
                    assert not bad, bad[:3]
            finally:
                await _close(imux, tch, ich)
        _run(main())
        assert "evicted checkpoint" in s.full_log()
