"""What the answer loop needs from the tokenizer and inference services.

The decision logic (`Decider`) only sees this interface. Two implementations:
`laya_grpc.engine.remote_services.RemoteServices` over the internal contract (unix sockets in `laya-grpc
serve`, gRPC across hosts), and `laya_grpc.engine.inprocess.InProcessServices` with the tokenizer and the network
in the calling process (`laya-grpc predict`, `Predictor`, contract tests without processes).
Types on this boundary are `PackedRows` and numpy arrays, so the engine never imports torch or mlx.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence

import numpy as np

from laya_grpc.core.decisions.answers import Usage
from laya_grpc.core.wire.packed_rows import PackedRows
from laya_grpc.core.decisions.temperatures import Temperatures


@dataclass
class Encoded:
    """One state as tokenized: its rows in question order and upstream's usage block."""
    rows: PackedRows
    usage: Usage


@dataclass
class InferResult:
    """Raw network outputs for a list of rows, in row order."""
    logits: list[np.ndarray]        # per row: float32 [k] option logits in slot order
    act_logits: list[np.ndarray]    # per row: float32 [n_act]


class Services(Protocol):
    async def tokenize(self, checkpoint: str, states: Sequence[Any], questions: Sequence[Any],
                       max_len: int | None, head_max_len: int | None) -> list[Encoded]:
        """One Encoded per state (rows in question order, upstream's usage block)."""

    async def infer(self, checkpoint: str, rows: Sequence[Any]) -> InferResult:
        """Forward the rows of every state (`[encoded.rows for encoded in tokenize(...)]`), in order;
        the inference service may batch them with other requests' rows."""

    async def temperatures(self, name: str) -> Temperatures:
        """The temperatures a served checkpoint's answers are decoded with; loads it if needed."""

    def health(self) -> dict:
        """Live facts for /health and the status stream (ready, device, dtype, revisions, ...)."""
