"""A large call's states go through tokenize -> infer -> decode in pipelined chunks
(`Decider._pipelined`): the next chunk is tokenized while the network runs the current one, one
forward at a time, and the answers are the ones each chunk gets alone, in input order.

The services are the real in-process ones (tokenizer and tiny network on CPU, where a started
forward runs on the runner's thread), with each call's start and end recorded on its way through.
The GPU's form of `start_rows` (queued on the stream) is checked on a GPU by benchmarks/cuda_check.py."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

from laya_grpc.core.errors import Kind, LayaError
from laya_grpc.core.decisions.questions import parse_questions
from laya_grpc.core.decisions.routing import RouteTable
from laya_grpc.core.checkpoints.sources import open_source
from laya_grpc.engine import decider as decider_mod
from laya_grpc.engine.decider import Decider
from laya_grpc.engine.inprocess import InProcessServices
from laya_grpc.cli.predictor import encoder_of
from laya_grpc.gateway.settings import GatewaySettings
from laya_grpc.inference.runners import load_runner

QUESTIONS = {"intent": {"type": "choice", "instructions": "What does the customer want?",
                        "criteria": {"refund": "money back", "exchange": "a new item", "info": "an answer"}},
             "angry": {"type": "noul", "instructions": "Is the customer angry?"}}


def _states(n: int) -> list:
    return ["Order %d: the parcel came late and the box was damaged, %s." % (i, "again " * (i % 7))
            for i in range(n)]


class RecordingServices(InProcessServices):
    """The in-process services, each tokenize and forward logged as (what, chunk, start, end)."""

    def __init__(self):
        super().__init__()
        self.log: list = []
        self.fail_tokenize_at = None   # the call number whose tokenize raises
        self.hold_tokenize_at = None   # the call number whose tokenize never ends (until cancelled)
        self._lock = threading.Lock()
        self._calls = 0

    async def tokenize(self, checkpoint, states, questions, max_len, head_max_len):
        k, self._calls = self._calls, self._calls + 1
        t0 = time.perf_counter()
        if k == self.hold_tokenize_at:
            await asyncio.sleep(3600)
        if k == self.fail_tokenize_at:
            raise LayaError(Kind.BAD_REQUEST, "chunk %d refused" % k)
        out = await super().tokenize(checkpoint, states, questions, max_len, head_max_len)
        self._record("tokenize", t0, len(states))
        return out

    def _record(self, what, t0, n):
        with self._lock:
            self.log.append((what, n, t0, time.perf_counter()))


@pytest.fixture(scope="module")
def services(tiny_ckpt):
    s = RecordingServices()
    ckpt = open_source(tiny_ckpt)
    runner = load_runner(ckpt.path, "torch", "cpu", None)
    run_rows = runner.run_rows

    def recorded(rows, pad_id, pad_to=None):   # start_rows' thread calls it too (eager CPU)
        t0 = time.perf_counter()
        out = run_rows(rows, pad_id, pad_to)
        s._record("forward", t0, rows.n)
        return out
    runner.run_rows = recorded
    s.add("english", ckpt, encoder_of(ckpt), runner)
    yield s
    runner.close()


def _answer(services, states, questions=QUESTIONS):
    d = Decider(services, RouteTable.build({"english": "x"}), GatewaySettings())
    return asyncio.new_event_loop().run_until_complete(d.answer("english", states, parse_questions(questions)))


def test_chunks_overlap_and_answers_keep_their_order(services, monkeypatch):
    monkeypatch.setattr(decider_mod, "PIPELINE_ROWS", 16)   # 8 states (x 2 questions) a chunk
    monkeypatch.setattr("laya_grpc.engine.inprocess.STARTED_TOKENS", 0)   # every forward started, none run inline
    states = _states(40)
    services.log.clear()
    got = _answer(services, states)
    toks = [e for e in services.log if e[0] == "tokenize"]
    fwds = sorted((e for e in services.log if e[0] == "forward"), key=lambda e: e[2])
    assert [e[1] for e in toks] == [8] * 5 and [e[1] for e in fwds] == [16] * 5
    for k in range(4):
        assert toks[k + 1][2] < fwds[k][3], "chunk %d was tokenized only after forward %d ended" % (k + 1, k)
        assert fwds[k][3] <= fwds[k + 1][2], "two forwards ran at once"
    # each chunk's answers are the ones it gets alone (same rows in one forward), in input order
    monkeypatch.setattr(decider_mod, "PIPELINE_ROWS", 1 << 20)
    alone = [r for i in range(0, 40, 8) for r in _answer(services, states[i: i + 8])]
    assert got == alone
    assert [r.usage.state_tokens for r in got] == [r.usage.state_tokens for r in alone]


def test_a_call_below_one_chunk_is_one_tokenize_and_one_forward(services, monkeypatch):
    monkeypatch.setattr(decider_mod, "PIPELINE_ROWS", 16)
    services.log.clear()
    _answer(services, _states(8))
    assert [e[:2] for e in services.log] == [("tokenize", 8), ("forward", 16)]


def test_a_failing_chunk_fails_the_call_and_leaves_nothing_running(services, monkeypatch):
    monkeypatch.setattr(decider_mod, "PIPELINE_ROWS", 16)
    services._calls, services.fail_tokenize_at = 0, 2
    loop = asyncio.new_event_loop()
    errors = []
    loop.set_exception_handler(lambda lp, ctx: errors.append(ctx))
    d = Decider(services, RouteTable.build({"english": "x"}), GatewaySettings())
    try:
        with pytest.raises(LayaError, match="chunk 2 refused"):
            loop.run_until_complete(d.answer("english", _states(40), parse_questions(QUESTIONS)))
        loop.run_until_complete(asyncio.sleep(0.05))
        assert not [t for t in asyncio.all_tasks(loop) if not t.done()]
        assert d.inflight == 0
    finally:
        services.fail_tokenize_at = None
        loop.close()
    assert not errors, errors
    assert len(_answer(services, _states(3))) == 3   # and the services still answer


def test_a_cancelled_call_cancels_its_pending_chunk(services, monkeypatch):
    monkeypatch.setattr(decider_mod, "PIPELINE_ROWS", 16)
    services._calls, services.hold_tokenize_at = 0, 1
    loop = asyncio.new_event_loop()
    d = Decider(services, RouteTable.build({"english": "x"}), GatewaySettings())

    async def main():
        task = asyncio.ensure_future(d.answer("english", _states(40), parse_questions(QUESTIONS)))
        deadline = time.monotonic() + 10
        while services._calls < 2:      # chunk 1's tokenize is held
            assert time.monotonic() < deadline and not task.done(), "the call never tokenized a second chunk"
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.01)
        return [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]

    try:
        assert loop.run_until_complete(main()) == []
        assert d.inflight == 0
    finally:
        services.hold_tokenize_at = None
        loop.close()
