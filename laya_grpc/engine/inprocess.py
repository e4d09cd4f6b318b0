"""`Services` with the tokenizer and the network in this process: no sockets, no child processes.

The engine's `Decider` runs on it exactly as on `RemoteServices`, so `laya-grpc predict`, the
in-process `Predictor` and contract tests share the served answer loop. The caller (the cli
layer, the one that wires the tokenizer and inference code together: `laya_grpc.cli.predictor`)
hands it each checkpoint's encoder and loaded runner, so this module imports neither.
"""
from __future__ import annotations

import asyncio
from typing import Any, Optional, Sequence

from laya_grpc.core.checkpoints.checkpoint import Checkpoint
from laya_grpc.core.errors import Kind, LayaError
from laya_grpc.core.wire.packed_rows import PackedRows
from laya_grpc.core.decisions.temperatures import Temperatures
from .services import Encoded, InferResult

# A forward of more tokens than this is started without waiting for it (`start_rows`: queued on the
# GPU, or on the runner's thread), so that this loop meanwhile tokenizes and decodes the neighbouring
# chunks of a large call (Decider._pipelined); a smaller one simply runs (a short forward is a few
# launches). Runners without start_rows (MLX, whose work stays on the thread that owns it) always run.
STARTED_TOKENS = 1024


class InProcessServices:
    """One or more checkpoints, each a TextEncoder and a loaded runner, by name."""

    def __init__(self):
        self._models: dict[str, tuple[Temperatures, Any, Any]] = {}

    def add(self, name: str, checkpoint: Checkpoint, encoder: Any, runner: Any) -> None:
        """`encoder`: the tokenizer's `TextEncoder` for the checkpoint; `runner`: its loaded network."""
        self._models[name] = (Temperatures.from_config(checkpoint.config), encoder, runner)

    def _get(self, name: str):
        try:
            return self._models[name]
        except KeyError:
            raise LayaError(Kind.NOT_FOUND, "checkpoint %r is not loaded here (loaded: %s)"
                            % (name, ", ".join(self._models) or "none")) from None

    async def tokenize(self, checkpoint: str, states: Sequence[Any], questions: Sequence[Any],
                       max_len: Optional[int], head_max_len: Optional[int]) -> list[Encoded]:
        _, encoder, _ = self._get(checkpoint)
        encoded = encoder.encode_many(list(states), list(questions), max_len=max_len, head_max_len=head_max_len)
        return [Encoded(PackedRows.from_rows(enc.rows), enc.usage) for enc in encoded]

    async def infer(self, checkpoint: str, rows: Sequence[PackedRows]) -> InferResult:
        _, encoder, runner = self._get(checkpoint)
        packed = PackedRows.concat(list(rows)) if isinstance(rows, (list, tuple)) else rows
        start = getattr(runner, "start_rows", None)
        if start is not None and len(packed.ids) > STARTED_TOKENS:
            started = start(packed, encoder.pad_id)
            if started.future is not None:
                await asyncio.wrap_future(started.future)
            while not started.done():
                await asyncio.sleep(0)   # the loop's other tasks (the next chunk's tokenizing) run meanwhile
            logits, act = started.result()
        else:
            logits, act = runner.run_rows(packed, encoder.pad_id)
        counts = packed.marker_counts
        return InferResult(logits=[logits[i, :counts[i]] for i in range(packed.n)],
                           act_logits=[act[i] for i in range(packed.n)])

    async def temperatures(self, name: str) -> Temperatures:
        return self._get(name)[0]

    def health(self) -> dict:
        return {"ready": True, "loaded": list(self._models)}
