"""The decision flow behind both front ends: route -> tokenize -> infer -> decode -> assemble.

Transport-free: it takes the typed requests of `laya_grpc.engine.requests` and returns typed
answers (`laya_grpc.core.decisions.answers`): the HTTP front renders them to upstream `laya serve` 0.4.15's
JSON, the gRPC front packs them into its messages. Each step's failure is a LayaError from the layer
that found it.

A `Decision` carries the answers (with the min_confidence gate's verdicts when one was asked), the
usage and the routing, and renders as `Router.predict` + serve (or, under LAYA_JEV_STRICT, the Jev
projection). A `BatchDecision` holds the results in input order, each routed on its own state
exactly as upstream's `Router.predict_batch` does.
"""
from __future__ import annotations

import asyncio
from typing import Any, Optional, Protocol, Sequence

from laya_grpc.core.runtime import request_id, timing, tracing
from laya_grpc.core.decisions.answers import EMPTY, BatchDecision, Decision
from laya_grpc.core.decisions.confidence_gate import Threshold
from laya_grpc.core.decisions.decode import decode_answer
from laya_grpc.core.decisions.questions import Question
from laya_grpc.core.decisions.routing import RouteTable, Routing, route
from laya_grpc.core.decisions.temperatures import Temperatures

from .requests import BatchRequest, Controls, DecideRequest
from .services import Services

# rows (states x questions) per chunk when a call's states go through the pipeline in chunks
# (`Decider._pipelined`): enough for an efficient forward, few enough that the first chunk's
# tokenizing and the last one's decoding, the parts the pipeline cannot hide, stay short
PIPELINE_ROWS = 64


class AnswerSettings(Protocol):
    """The served settings the answer loop reads (the gateway's `GatewaySettings`)."""
    auto_task: bool     # LAYA_AUTO_TASK: workflow-id routing
    jev_strict: bool    # LAYA_JEV_STRICT: strict Jev projection


class Decider:
    """Routes, answers and finishes requests on any `Services`: `RemoteServices` (gRPC, the gateway)
    or the in-process one (`laya_grpc.engine.inprocess`, `laya-grpc predict` and contract tests)."""

    def __init__(self, services: Services, route_table: RouteTable, settings: AnswerSettings):
        self.services = services
        self.route_table = route_table
        self.settings = settings
        self.inflight = 0   # answers waiting on the services (a draining gateway waits for them)

    # -- public -------------------------------------------------------------------------------
    async def decide(self, req: DecideRequest) -> Decision:
        """One state: the answer of upstream's `/v1/systemone`."""
        decision = self._route(req.state, req.raw_questions, req.controls)
        timing.mark("route")
        [result] = await self.answer(decision.model, [req.state], req.questions, req.controls.max_len,
                                     req.controls.head_max_len, req.controls.min_confidence)
        result = Decision(result.answers, result.usage, decision, self.settings.jev_strict)
        timing.mark("decode")
        return result

    async def decide_batch(self, req: BatchRequest) -> BatchDecision:
        """Many states, one question set: the answer of upstream's `/v1/systemone/batch`.

        Every state is routed before anything runs (an unknown task fails the whole batch); states
        routed to the same checkpoint share one tokenize and one infer call, in first-seen order.
        `batch_size` / `sort_by_length` only shape upstream's forward passes; the inference
        service batches on its own, so they are validated and otherwise have no effect here.
        """
        decisions = [self._route(state, req.raw_questions, req.controls) for state in req.states]
        groups: dict[str, list[int]] = {}
        for i, decision in enumerate(decisions):
            groups.setdefault(decision.model, []).append(i)
        results: list[Optional[Decision]] = [None] * len(req.states)
        for name, indices in groups.items():
            answered = await self.answer(name, [req.states[i] for i in indices], req.questions,
                                         req.controls.max_len, req.controls.head_max_len, req.controls.min_confidence)
            for i, result in zip(indices, answered):
                results[i] = Decision(result.answers, result.usage, decisions[i], self.settings.jev_strict)
        return BatchDecision(tuple(results))

    # -- steps --------------------------------------------------------------------------------
    def _route(self, state: Any, raw_questions: dict, controls: Controls) -> Routing:
        return route(self.route_table, state, raw_questions.keys(), model=controls.model,
                     task=controls.task, lang=controls.lang, lang_guess=controls.lang_guess,
                     auto_task=self.settings.auto_task)

    async def answer(self, checkpoint: str, states: Sequence[Any], questions: list[Question],
                     max_len: Optional[int] = None, head_max_len: Optional[int] = None,
                     min_confidence: Optional[Threshold] = None) -> list[Decision]:
        """`Agent.predict_batch` for states routed to one checkpoint: a Decision per state (answers,
        gated when `min_confidence` is given, and usage; no routing). The one answer loop: the
        services' routes and the in-process `Predictor` (laya_grpc/cli/predictor.py) both end here.

        More than PIPELINE_ROWS rows go in chunks of states, pipelined: the next chunk is tokenized,
        and the one before decoded, while the network runs the current one (`_pipelined`)."""
        if not questions:
            # Upstream answers without tokenizing or running the network.
            return [EMPTY] * len(states)
        per = max(1, PIPELINE_ROWS // len(questions))
        self.inflight += 1
        try:
            request_id.note_checkpoint(checkpoint)
            decoding = (await self.services.temperatures(checkpoint), min_confidence)
            timing.mark("route")
            if len(states) > per:
                return await self._pipelined(checkpoint, [states[i: i + per] for i in range(0, len(states), per)],
                                             questions, max_len, head_max_len, decoding)
            encoded = await self._tokenize(checkpoint, states, questions, max_len, head_max_len)
            timing.mark("tokenizer_hop")
            out = await self._infer(checkpoint, encoded)
            timing.mark("inference_hop")
        finally:
            self.inflight -= 1
        return _decode(questions, encoded, out, *decoding)

    async def _pipelined(self, checkpoint: str, chunks: list, questions: list[Question], max_len: Optional[int],
                         head_max_len: Optional[int], decoding: tuple) -> list[Decision]:
        """Chunks of states through tokenize -> infer -> decode, the stages of neighbouring chunks at
        once: while the network runs chunk k, chunk k+1 is tokenized and chunk k-1 decoded.

        Why: done one after the other, the host's tokenizing and decoding leave the device idle
        (docs/performance.md gives their share of a 256-state `predict_batch`). One infer call is
        in flight at a time, so a large request still takes the device in turns with others
        (coalesce.py); results keep input order."""
        results: list[Decision] = []
        tok = asyncio.ensure_future(self._tokenize(checkpoint, chunks[0], questions, max_len, head_max_len))
        inf = None
        done = None   # (encoded, InferResult) of the chunk before
        try:
            for k in range(len(chunks)):
                encoded = await tok
                inf = asyncio.ensure_future(self._infer(checkpoint, encoded))
                await asyncio.sleep(0)   # the forward starts first (sent, or queued on the device)
                if k + 1 < len(chunks):
                    tok = asyncio.ensure_future(self._tokenize(checkpoint, chunks[k + 1], questions, max_len,
                                                               head_max_len))
                if done is not None:
                    results += _decode(questions, *done, *decoding)
                done = (encoded, await inf)
        finally:
            for task in (tok, inf):
                _discard(task)
        timing.mark("inference_hop")
        return results + _decode(questions, *done, *decoding)

    async def _tokenize(self, checkpoint: str, states: Sequence[Any], questions: list[Question],
                        max_len: Optional[int], head_max_len: Optional[int]) -> list:
        with tracing.span("tokenize", checkpoint=checkpoint, states=len(states)):
            return await self.services.tokenize(checkpoint, list(states), questions, max_len, head_max_len)

    async def _infer(self, checkpoint: str, encoded: list):
        with tracing.span("infer", checkpoint=checkpoint):
            return await self.services.infer(checkpoint, [enc.rows for enc in encoded])


def _decode(questions: list[Question], encoded: list, out, temperatures: Temperatures,
            min_confidence: Optional[Threshold]) -> list[Decision]:
    """The answers of tokenized states from their rows' network outputs (rows in state, then question order)."""
    results, r = [], 0
    with tracing.span("decode"):
        for enc in encoded:
            answers = tuple(decode_answer(q, out.logits[r + i], out.act_logits[r + i], temperatures, min_confidence)
                            for i, q in enumerate(questions))
            r += len(questions)
            results.append(Decision(answers, enc.usage))
    return results


def _discard(task: Optional[asyncio.Future]) -> None:
    """A pipeline task no longer wanted: cancelled if still running, its error (if any) retrieved
    so that asyncio does not report it as never retrieved."""
    if task is None:
        return
    if not task.done():
        task.cancel()
    elif not task.cancelled():
        task.exception()
