"""Loading a checkpoint onto a runner: `load_runner` picks the backend's runner, and the names the
services, the CLI and the benchmarks import live here too (the protocol in runner_protocol.py, the
kernel and layout policy in kernel_choice.py, the runners in torch_runner.py and mlx_runner.py)."""
from __future__ import annotations

import logging
import time
from typing import Optional

from .kernel_choice import CUDA_KERNELS, PACK_ROWS, resolve_kernels, resolve_pack_rows
from .mlx_runner import MlxRunner
from .runner_protocol import Runner
from .torch_runner import TorchRunner

__all__ = ["CUDA_KERNELS", "PACK_ROWS", "MlxRunner", "Runner", "TorchRunner", "load_runner", "resolve_kernels",
           "resolve_pack_rows"]

log = logging.getLogger("laya_grpc.inference.runners")


def load_runner(ckpt_dir: str, backend: str, device: str, dtype: Optional[str], max_rows: int = 256,
                max_batch_tokens: int = 16384, cuda_kernels: str = "auto", pack_rows: str = "auto"):
    t0 = time.perf_counter()
    runner = (MlxRunner(ckpt_dir, device, dtype) if backend == "mlx"
              else TorchRunner(ckpt_dir, device, dtype, max_rows=max_rows, max_batch_tokens=max_batch_tokens,
                               cuda_kernels=cuda_kernels, pack_rows=pack_rows))
    log.info("loaded %s on %s/%s (%s kernels) in %.0f ms", ckpt_dir, runner.device(), runner.dtype(), runner.kernels,
             (time.perf_counter() - t0) * 1e3)
    return runner
