"""The one call the batcher makes on a loaded network, whatever the backend.

The batcher never touches torch or mlx itself; each backend's runner (torch_runner.py,
mlx_runner.py) owns its framework, its device and its dtype, and reports them from the live
weights (never from what was asked).
"""
from __future__ import annotations

from concurrent.futures import Future
from typing import Callable, Optional, Protocol

import numpy as np


class Started:
    """A forward started without waiting for it (`start_rows`): `done()` says whether it has
    finished, without blocking; `result()` waits for it and gives `run_rows`'s value. `future` is
    set where a thread runs it, so an event loop can await it instead of polling `done()`."""

    def __init__(self, done: Callable[[], bool], result: Callable[[], tuple], future: Optional[Future] = None):
        self.done, self.result, self.future = done, result, future

    @classmethod
    def on_thread(cls, future: Future) -> "Started":
        return cls(future.done, future.result, future)


class Runner(Protocol):
    backend: str
    vocab_size: int
    max_positions: int
    n_act: int
    # whether a short forward may run on the calling event loop's thread (the batcher's inline
    # turn); False for MLX (its work stays on the thread that owns it) and for eager forwards
    forwards_inline: bool

    def forward(self, batch: dict) -> tuple[np.ndarray, np.ndarray]:
        """(logits float32 [B,K], act_logits float32 [B,n_act]) for a padded batch (see PackedRows.pad)."""

    def run_rows(self, rows, pad_id: int, pad_to: Optional[int] = None) -> tuple[np.ndarray, np.ndarray]:
        """The same for token rows (PackedRows): the serving path, which packs them where the runner can
        (else pads them, to at least `pad_to` tokens)."""

    # Optional (torch): `start_rows(rows, pad_id) -> Started`, the same forward without waiting for
    # it, so the caller's thread tokenizes and decodes meanwhile (in-process pipelining,
    # engine/inprocess.py). Runners without it (MLX) are called with run_rows only.

    def device(self) -> str: ...
    def dtype(self) -> str: ...
    def close(self) -> None: ...
