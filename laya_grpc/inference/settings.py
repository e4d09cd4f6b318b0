"""Typed settings of the inference service; every flag is also an environment variable."""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from laya_grpc.core import flags
from laya_grpc.core.sources import parse_checkpoint_specs


@dataclass
class InferenceSettings:
    checkpoints: dict = field(default_factory=dict)   # name -> source (dir or hub id[/subfolder][@rev])
    address: str = "127.0.0.1:50052"
    backend: str = "torch"
    device: str = "auto"
    dtype: str = "auto"
    require_device: bool = False
    max_loaded: int = 2
    preload: list = field(default_factory=list)       # names warmed before SERVING (default: all, up to max_loaded)
    max_batch_tokens: int = 16384
    max_batch_rows: int = 256
    max_wait_ms: float = 0.0
    warmup: bool = True
    heartbeat_s: float = 2.0
    metrics: str | None = None
    cuda_kernels: str = "auto"
    pack_rows: str = "auto"
    drain_grace_s: float = 20.0    # --drain-grace-s (core/draining.py)

    @classmethod
    def from_args(cls, a: argparse.Namespace) -> "InferenceSettings":
        device, require = resolve_require(a.device, a.require_device)
        return cls(checkpoints=parse_checkpoint_specs(a.checkpoint), address=a.listen, backend=a.backend,
                   device=device, dtype=a.dtype, require_device=require, max_loaded=a.max_loaded,
                   preload=list(a.preload or []), max_batch_tokens=a.max_batch_tokens,
                   max_batch_rows=a.max_batch_rows, max_wait_ms=a.max_wait_ms, warmup=not a.no_warmup,
                   metrics=getattr(a, "metrics", None), cuda_kernels=a.cuda_kernels, pack_rows=a.pack_rows,
                   drain_grace_s=getattr(a, "drain_grace_s", cls.drain_grace_s))


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


def resolve_require(device: str, require) -> tuple[str, bool]:
    """(device to use, whether it is required) from --device and --require-device [DEVICE]."""
    if require is None or str(require).lower() in _FALSE:
        return device, False
    if str(require).lower() in _TRUE:
        return device, True
    return str(require), True


def add_model_flags(p: argparse.ArgumentParser) -> None:
    """Flags shared by `inference` and `serve`."""
    flags.add(p, "--checkpoint", env="LAYA_CHECKPOINTS", append=True, metavar="NAME=SOURCE",
              help="a checkpoint to serve: NAME=DIR (local upstream layout) or NAME=ORG/REPO[/SUBFOLDER][@REVISION] "
                   "(Hugging Face hub, needs the 'hub' extra and a network). Default: upstream's english, "
                   "multilingual and typed-decisions from convaiinnovations/laya")
    flags.add(p, "--backend", env="LAYA_BACKEND", default="torch", choices=["torch", "mlx"],
              help="torch (CUDA, MPS or CPU) or mlx (Apple Silicon GPU; CPU on Linux)")
    flags.add(p, "--device", env="LAYA_DEVICE", default="auto",
              help="auto picks CUDA, then MPS, then CPU; or cpu, cuda, cuda:N, mps (mlx: gpu or cpu)")
    flags.add(p, "--dtype", env="LAYA_DTYPE", default="auto",
              help="auto = float32 on CPU (exact to upstream) and on CUDA (the exact mode: split-fp16 tensor-core "
                   "GEMMs, max |dp| 0.0006 against CPU fp32 on every checkpoint checked), float16 on MPS; or float32, "
                   "float16, bfloat16. float16 on CUDA is the fast mode (served p50 about 8%% lower for short requests and "
                   "22%% at 512 tokens on an H200), whose error grows with how sharp the checkpoint's answers are "
                   "(0.005 to 0.10 on random checkpoints of one shape): docs/precision.md")
    flags.add(p, "--require-device", env="LAYA_REQUIRE_DEVICE", nargs="?", const="yes", metavar="DEVICE",
              help="exit non-zero if the device is unavailable instead of falling back to CPU; alone it requires "
                   "--device, with a value (e.g. --require-device gpu, --require-device cuda:1) it requires that one")
    flags.add(p, "--max-loaded", env="LAYA_MAX_LOADED", default=2, type=flags.positive_int,
              help="checkpoints kept resident at once; the least recently used is evicted beyond this")
    flags.add(p, "--preload", env="LAYA_MODELS", append=True, metavar="NAME",
              help="checkpoints to load and warm before reporting ready (default: all configured, up to --max-loaded)")
    flags.add(p, "--max-batch-tokens", env="LAYA_INFERENCE_MAX_BATCH_TOKENS", default=16384, type=flags.positive_int,
              help="padded tokens per forward pass when requests are batched together")
    flags.add(p, "--max-batch-rows", env="LAYA_INFERENCE_MAX_BATCH_ROWS", default=256, type=flags.positive_int,
              help="rows (state x question) per forward pass")
    flags.add(p, "--max-wait-ms", env="LAYA_MAX_WAIT_MS", default=0.0, type=float,
              help="extra time to wait for more requests before a forward; 0 = batch only what queued while busy")
    flags.add(p, "--cuda-kernels", env="LAYA_CUDA_KERNELS", default="auto", choices=["auto", "fused", "reference"],
              help="CUDA only: the encoder inside the CUDA graphs. fused (auto's pick when Triton works) runs RoPE and "
                   "the GELU gate as one Triton kernel each and adds residuals in the GEMMs, about a third of the "
                   "reference's launches; reference follows transformers op for op. Both are checked against CPU "
                   "fp32 (docs/performance.md); auto without Triton logs a warning and /health shows the kernels")
    flags.add(p, "--pack-rows", env="LAYA_PACK_ROWS", default="auto", choices=["auto", "on", "off"],
              help="CUDA graphs of the fused kernels only: lay the rows of a batch end to end in one token stream "
                   "(each row attends only within itself) instead of padding every row to the longest. A batch then "
                   "costs its real tokens, and one graph per token bucket replaces one per rows x tokens pair (fewer "
                   "captures at start-up). auto packs wherever it can (not the parallel option layout); on refuses to "
                   "start where it cannot; off keeps the padded buckets (for A/B measurement)")
    flags.add(p, "--no-warmup", env="LAYA_NO_WARMUP", action="store_true",
              help="skip warmup forwards (first requests will be slow); for debugging only")
