"""The inference service's settings; its flags and environment variables are generated from them."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

from laya_grpc.core.runtime.flags import USE_DEFAULT, positive_int, setting
from laya_grpc.core.runtime.settings import (ServiceSettings, ipc_setting, listen_setting, metrics_setting,
                                              upstream_positive_int)

LISTEN = "127.0.0.1:50052"


def upstream_names(raw: str):
    """`LAYA_MODELS` as upstream reads it: a comma list; blank is every checkpoint."""
    names = [m.strip() for m in raw.split(",") if m.strip()]
    return names or USE_DEFAULT


@dataclass
class RunnerSettings:
    """How the network runs on its device: what the service loads and warms with, and what
    `laya-grpc warm-kernels` warms with, so the kernels it compiles are the ones served."""
    SECTION = "inference"

    backend: str = setting("torch", "torch (CUDA, MPS or CPU) or mlx (Apple Silicon GPU; CPU on Linux)",
                           choices=("torch", "mlx"))
    device: str = setting("auto", "auto picks CUDA, then MPS, then CPU; or cpu, cuda, cuda:N, mps (mlx: gpu "
                          "or cpu). 'serve' takes a comma list (cuda:0,cuda:1): one inference replica per device")
    dtype: str = setting("auto", "auto = float32 on CPU (exact to upstream) and on CUDA (the exact mode: "
                         "split-fp16 tensor-core GEMMs, max |dp| 0.0006 against CPU fp32 on every checkpoint "
                         "checked), float16 on MPS; or float32, float16, bfloat16. float16 on CUDA is the fast "
                         "mode (on an H200 19% less served time for short requests, 22% at 512 tokens, 1.9x the "
                         "decisions/s at 64 clients), "
                         "whose error grows with how sharp the checkpoint's answers are (0.005 to 0.10 on random "
                         "checkpoints of one shape): docs/precision.md")
    require_device: Optional[str] = setting(None, "exit non-zero if the device is unavailable instead of "
                                            "falling back to CPU; alone it requires --device, with a value "
                                            "(e.g. --require-device gpu, --require-device cuda:1) it requires "
                                            "that one", nargs="?", const="yes", metavar="DEVICE")
    max_batch_tokens: int = setting(16384, "padded tokens per forward pass when requests are batched "
                                    "together (upstream laya's variable of the same meaning)",
                                    type=positive_int, unit="tokens", env_parse=upstream_positive_int,
                                    deprecated=("LAYA_INFERENCE_MAX_BATCH_TOKENS",))
    max_batch_rows: int = setting(256, "rows (state x question) per forward pass", type=positive_int,
                                  unit="rows", deprecated=("LAYA_INFERENCE_MAX_BATCH_ROWS",))
    cuda_kernels: str = setting("auto", "CUDA only: the encoder inside the CUDA graphs. fused (auto's pick "
                                "when Triton works) runs RoPE and the GELU gate as one Triton kernel each and "
                                "adds residuals in the GEMMs, about a third of the reference's launches; "
                                "reference follows transformers op for op. Both are checked against CPU fp32 "
                                "(docs/performance.md); auto without Triton logs a warning and /health shows "
                                "the kernels", choices=("auto", "fused", "reference"))
    pack_rows: str = setting("auto", "CUDA graphs of the fused kernels only: lay the rows of a batch end to end "
                             "in one token stream (each row attends only within itself) instead of padding "
                             "every row to the longest. A batch then costs its real tokens, and one graph per "
                             "token bucket replaces one per rows x tokens pair (fewer captures at start-up). "
                             "auto packs wherever it can (not the parallel option layout); on refuses to start "
                             "where it cannot; off keeps the padded buckets (for A/B measurement)",
                             choices=("auto", "on", "off"))
    kernel_cache_dir: Optional[str] = setting(None, "keep compiled GPU kernels here (Triton's in DIR/triton, "
                                              "TorchInductor's in DIR/inductor), so a restart or another replica "
                                              "reads them instead of compiling again; fill it ahead of time with "
                                              "'laya-grpc warm-kernels'. Unset: the libraries' own defaults "
                                              "(TRITON_CACHE_DIR, else ~/.triton/cache)", metavar="DIR")

    def device_choice(self) -> tuple[str, bool]:
        return resolve_require(self.device, self.require_device)

    def runner_options(self) -> dict:
        """What `load_runner` takes besides the checkpoint, backend, device and dtype."""
        return {"max_rows": self.max_batch_rows, "max_batch_tokens": self.max_batch_tokens,
                "cuda_kernels": self.cuda_kernels, "pack_rows": self.pack_rows}


@dataclass
class ResidencySettings:
    """What only the service decides: which checkpoints stay loaded, how long a forward waits for
    more requests, whether to warm up."""
    SECTION = "inference"

    max_loaded: int = setting(2, "checkpoints kept resident at once; the least recently used is evicted beyond "
                              "this", type=positive_int, env_parse=upstream_positive_int)
    preload: list = setting([], "checkpoints to load and warm before reporting ready (default: all configured, "
                            "up to --max-loaded); the variable is upstream laya's comma list",
                            repeatable=True, metavar="NAME", env="LAYA_MODELS", env_parse=upstream_names)
    max_wait_ms: float = setting(0.0, "extra time to wait for more requests before a forward; 0 = batch only "
                                 "what queued while busy", type=float, unit="ms")
    no_warmup: bool = setting(False, "skip warmup forwards (first requests will be slow); for debugging only")


@dataclass
class EngineSettings(RunnerSettings, ResidencySettings):
    """How the network runs and what stays resident; `serve` passes these to each inference replica."""


@dataclass
class InferenceSettings(EngineSettings, ServiceSettings):
    SECTION = "this process"

    listen: str = listen_setting(LISTEN, "inference")
    metrics: Optional[str] = metrics_setting("inference")
    ipc: Optional[str] = ipc_setting("inference", "Infer")

    heartbeat_s: ClassVar[float] = 2.0

    @property
    def warmup(self) -> bool:
        return not self.no_warmup

    @property
    def checkpoints(self) -> dict:
        return self.checkpoint_sources()


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


def resolve_require(device: str, require) -> tuple[str, bool]:
    """(device to use, whether it is required) from --device and --require-device [DEVICE]."""
    if require is None or str(require).lower() in _FALSE:
        return device, False
    if str(require).lower() in _TRUE:
        return device, True
    return str(require), True
