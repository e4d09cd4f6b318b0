"""The MLX network behind the runner call (Apple GPU, or MLX's CPU): padded batches, eager."""
from __future__ import annotations

from typing import Optional

import numpy as np

from .devices import mlx_dtype


class MlxRunner:
    backend = "mlx"
    kernels = "mlx"

    def __init__(self, ckpt_dir: str, device: str, dtype: Optional[str]):
        import mlx.core as mx
        from .mlx_model import LayaMLX
        # MLX's default device is process-wide; the device thread is the only one using MLX
        mx.set_default_device(mx.gpu if device == "gpu" else mx.cpu)
        self.model = LayaMLX.from_checkpoint(ckpt_dir, dtype=mlx_dtype(dtype, device))
        self.vocab_size = self.model.spec.vocab_size
        self.n_act = self.model.n_act
        self.max_positions = 1 << 30
        self.forwards_inline = False   # MLX work stays on the device thread that owns it

    def forward(self, batch: dict) -> tuple[np.ndarray, np.ndarray]:
        return self.model.forward(**batch)

    def run_rows(self, rows, pad_id: int, pad_to: Optional[int] = None) -> tuple[np.ndarray, np.ndarray]:
        return self.forward(rows.pad(pad_id, pad_to=pad_to))

    def device(self) -> str:
        return self.model.device          # "mlx:gpu" or "mlx:cpu", from MLX itself

    def dtype(self) -> str:
        return str(self.model.dtype)

    def close(self) -> None:
        del self.model
