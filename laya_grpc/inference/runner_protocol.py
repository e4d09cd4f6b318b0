"""The one call the batcher makes on a loaded network, whatever the backend.

The batcher never touches torch or mlx itself; each backend's runner (torch_runner.py,
mlx_runner.py) owns its framework, its device and its dtype, and reports them from the live
weights (never from what was asked).
"""
from __future__ import annotations

from typing import Optional, Protocol

import numpy as np


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

    def device(self) -> str: ...
    def dtype(self) -> str: ...
    def close(self) -> None: ...
