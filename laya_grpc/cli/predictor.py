"""The whole decision path in one process: questions -> tokens -> network -> answers.

`Predictor.predict` returns exactly what upstream laya 0.4.15's `Agent.predict` returns
(`{"model", "answers", "usage"}`) through the gateway's own answer loop (`Decider.answer`) on
in-process services (laya_grpc/engine/inprocess.py, built here: `load_services`), so offline runs and tests exercise the served
code. Calls run on a private event loop (no new loop per call). The network backend is imported
only when a Predictor is built, keeping this module free of torch at import time.
"""
from __future__ import annotations

import asyncio
from typing import Any, Optional, Sequence

from laya_grpc.core.decisions.confidence_gate import check_min_confidence
from laya_grpc.core.errors import Kind, LayaError
from laya_grpc.core.decisions.questions import parse_questions
from laya_grpc.core.decisions.routing import RouteTable
from laya_grpc.core.checkpoints.sources import open_source
from laya_grpc.engine.decider import Decider
from laya_grpc.engine.inprocess import InProcessServices
from laya_grpc.gateway.settings import GatewaySettings
from laya_grpc.tokenizer.encoding import TextEncoder

BACKENDS = ("torch", "mlx")


def encoder_of(checkpoint) -> TextEncoder:
    """The tokenizer's encoder for a checkpoint, as its tokenizer service builds it."""
    return TextEncoder(checkpoint.tokenizer_dir, max_len=checkpoint.max_len,
                       head_max_len=checkpoint.head_max_len, parallel_layout=checkpoint.parallel)


def load_services(sources: dict, backend: str = "torch", device: str = "cpu",
                  dtype: Optional[str] = None) -> InProcessServices:
    """Every `name -> source` checkpoint opened and its runner loaded in this process (tests, tools)."""
    from laya_grpc.inference.devices import pick_device
    from laya_grpc.inference.runners import load_runner
    services = InProcessServices()
    dev = pick_device(device, backend, require=True).device
    for name, source in sources.items():
        ckpt = open_source(source)
        services.add(name, ckpt, encoder_of(ckpt), load_runner(ckpt.path, backend, dev, dtype))
    return services


class Predictor:
    """One checkpoint, loaded once, answering `Agent.predict`-shaped calls."""

    NAME = "checkpoint"   # its name among the in-process services

    def __init__(self, source: str, device: str = "cpu", backend: str = "torch",
                 dtype: Optional[str] = None):
        """`source`: a checkpoint directory or hub id (`org/repo[/sub][@rev]`), validated as the
        services validate it, so a bad checkpoint is one CheckpointError naming the file."""
        from laya_grpc.inference.devices import pick_device
        from laya_grpc.inference.runners import load_runner
        if backend not in BACKENDS:
            raise LayaError(Kind.INVALID, "backend must be one of %s, got %r" % (list(BACKENDS), backend))
        self.checkpoint = open_source(source)
        # Offline there is no operator to notice a quiet CPU fallback: an absent device is an error.
        # "auto" is each runner's own default precision (fp32 on CPU and MLX, exact to upstream).
        self.runner = load_runner(self.checkpoint.path, backend, pick_device(device, backend, require=True).device,
                                  None if dtype == "auto" else dtype)
        self.device = self.runner.device()
        services = InProcessServices()
        self.encoder = encoder_of(self.checkpoint)
        services.add(self.NAME, self.checkpoint, self.encoder, self.runner)
        # only Decider.answer is used: no routing, no serve fields, as Agent.predict answers
        self.decider = Decider(services, RouteTable.build(), GatewaySettings())
        self._loop = asyncio.new_event_loop()

    def close(self) -> None:
        if not self._loop.is_closed():
            self._loop.close()

    def warm(self) -> None:
        """Before the first real call: capture the CUDA graphs (as the inference service does before
        ready), then one request of each question type through every stage (tokenizer, forward,
        decoding), so the first call pays no first-use cost (lazy imports, caches, allocations)."""
        from laya_grpc.inference.registry import warm_runner
        warm_runner(self.runner, self.checkpoint, self.encoder.pad_id)
        self.predict("Warm-up: the parcel arrived late and the box was damaged.", {
            "intent": {"type": "choice", "instructions": "What does the customer want?",
                       "criteria": {"refund": "money back", "exchange": "a new item"}},
            "urgency": {"type": "score", "instructions": "How urgent is it?", "criteria": ["not", "somewhat", "very"]},
            "angry": {"type": "noul", "instructions": "Is the customer angry?"}})

    def predict(self, state: Any, questions: dict, max_len: Optional[int] = None,
                head_max_len: Optional[int] = None, min_confidence: Any = None) -> dict[str, Any]:
        """One state: `Agent.predict(state, questions, ...)`."""
        return self.predict_batch([state], questions, max_len=max_len, head_max_len=head_max_len,
                                  min_confidence=min_confidence)[0]

    def predict_batch(self, states: Sequence[Any], questions: dict, max_len: Optional[int] = None,
                      head_max_len: Optional[int] = None, min_confidence: Any = None,
                      batch_size: Optional[int] = None) -> list[dict[str, Any]]:
        """Many states, one question set: `Agent.predict_batch`; all rows of up to `batch_size`
        states (default: all) share one forward pass, results in input order."""
        threshold = check_min_confidence(min_confidence)
        if isinstance(states, (str, bytes, dict)):
            raise LayaError(Kind.BAD_REQUEST, "predict_batch expects a list of states; pass a single "
                                              "state to predict()")
        if not isinstance(questions, dict):
            raise LayaError(Kind.BAD_REQUEST, "'questions' must be an object")
        states = list(states)
        if any(state is None for state in states):
            raise LayaError(Kind.BAD_REQUEST, "'state' is required")
        if not states:
            return []
        parsed = parse_questions(questions)
        chunk = batch_size if batch_size and batch_size > 0 else max(1, len(states))
        results: list[dict[str, Any]] = []
        for start in range(0, len(states), chunk):
            results.extend(d.body() for d in self._loop.run_until_complete(
                self.decider.answer(self.NAME, states[start:start + chunk], parsed, max_len, head_max_len, threshold)))
        return results
