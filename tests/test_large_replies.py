"""Large batches and the internal message limit.

A batch's token ids can outgrow one internal message (the largest batch the HTTP limits admit is
about 134 MB of ids; the limit is 64 MiB). The gateway tokenizes such a batch in several calls,
by states, and an IPC server that would still send an oversize reply answers that call with an
error instead: a too-large message would drop the connection, and every other call on it.
Here the limit is lowered (LAYA_GRPC_MAX_MESSAGE_BYTES) so small batches exercise both paths.
"""
from __future__ import annotations

import asyncio
import os

import httpx
import pytest

from laya_grpc.core.wire import ipc
from laya_grpc.core.errors import Kind, LayaError
from laya_grpc.core.wire.question_wire import state_of, tokenize_request
from laya_proto.internal.v1 import tokenizer_pb2
from stack import Stack

LIMIT = 300_000   # bytes per internal message in this stack
QUESTIONS = {"q%d" % j: {"type": "choice", "instructions": "Which option fits number %d?" % j,
                         "criteria": ["yes", "no", "maybe"]} for j in range(8)}
STATES = [("State %d: the customer wrote about a late delivery and a refund request. " % i) * 12 for i in range(48)]


@pytest.fixture(scope="module")
def stack(tiny_ckpt):
    with Stack({"english": tiny_ckpt}, env={"LAYA_GRPC_MAX_MESSAGE_BYTES": str(LIMIT)},
               extra_args=["--tokenizer-workers", "1", "--gateway-workers", "1"]) as s:
        yield s


def _same(a: dict, b: dict, tol: float = 1e-4) -> bool:
    if a["usage"] != b["usage"] or a["answers"].keys() != b["answers"].keys():
        return False
    for q in a["answers"]:
        pa, pb = a["answers"][q]["probabilities"], b["answers"][q]["probabilities"]
        if pa.keys() != pb.keys() or any(abs(pa[k] - pb[k]) > tol for k in pa):
            return False
    return True


def test_a_batch_over_the_message_limit_is_answered_state_by_state_right(stack):
    from laya_grpc.engine.remote_services import reply_groups
    texts = [tokenizer_pb2.QuestionText(id=q, type="choice", instructions=v["instructions"], options=v["criteria"])
             for q, v in QUESTIONS.items()]
    states = [state_of(s) for s in STATES]
    assert len(reply_groups(states, texts, 0)) == 1   # the default budget: one call
    assert len(reply_groups(states, texts, 0, budget=LIMIT // 4)) > 1   # this stack's: several
    with httpx.Client(timeout=120) as c:
        r = c.post(stack.http + "/v1/systemone/batch", json={"model": "english", "states": STATES, "questions": QUESTIONS})
        assert r.status_code == 200, r.text
        batch = r.json()["results"]
        assert len(batch) == len(STATES)
        for i in (0, 23, 47):   # each state's answers equal the state asked alone
            alone = c.post(stack.http + "/v1/systemone",
                           json={"model": "english", "state": STATES[i], "questions": QUESTIONS}).json()
            assert _same(batch[i], alone), (i, batch[i], alone)


def test_an_oversize_ipc_reply_fails_only_its_call(stack):
    big = tokenize_request(tokenizer_pb2.TokenizeRequest, "english", STATES, QUESTIONS)
    small = tokenize_request(tokenizer_pb2.TokenizeRequest, "english", ["hello"], QUESTIONS)

    async def main():
        mux = ipc.mux("ipc://" + os.path.join(stack.run_dir, "tokenizer-0.ipc"), tokenizer_pb2.TokenizeCall,
                      tokenizer_pb2.TokenizeReply, "tokenizer service")
        try:
            with pytest.raises(LayaError) as err:
                await mux.call(big, 30)
            assert err.value.kind is Kind.TOO_LARGE and "message limit" in err.value.detail
            again = await mux.call(small, 30)   # the same connection still serves
            assert again.rows_per_state == len(QUESTIONS)
        finally:
            await mux.close()
    asyncio.run(main())
