"""A loaded network on a device, behind one call: padded numpy batch in, numpy outputs out.

The batcher never touches torch or mlx itself; each backend's runner owns its framework, its
device and its dtype, and reports them from the live weights (never from what was asked).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Optional, Protocol

import numpy as np

from laya_grpc.errors import Kind, LayaError

log = logging.getLogger("inference_svc.runners")


class Runner(Protocol):
    backend: str
    vocab_size: int
    max_positions: int
    n_act: int

    def forward(self, batch: dict) -> tuple[np.ndarray, np.ndarray]:
        """(logits float32 [B,K], act_logits float32 [B,n_act]) for a padded batch (see PackedRows.pad)."""

    def device(self) -> str: ...
    def dtype(self) -> str: ...
    def close(self) -> None: ...


@dataclass
class DevicePick:
    device: str            # what the runner will use
    requested: str         # what the operator asked for
    fallback: bool         # True when requested was unavailable and we fell back (loudly)
    reason: str


class TorchRunner:
    """The torch network. On CUDA every forward replays a captured graph of its shape bucket
    (cuda_graphs.py); on CPU and MPS it runs eagerly (CPU fp32 is the bit-exact reference path)."""
    backend = "torch"

    def __init__(self, ckpt_dir: str, device: str, dtype: Optional[str], max_rows: int = 256,
                 max_batch_tokens: int = 16384, graphs: bool = True):
        import torch
        from inference_svc.torch_model import LayaTorch
        self._torch = torch
        tdtype = _torch_dtype(torch, dtype, device)
        self.model = LayaTorch.from_checkpoint(ckpt_dir, device=device, dtype=tdtype).eval()
        spec = self.model.spec
        self.vocab_size = spec.vocab_size
        self.n_act = spec.n_act
        self.max_positions = 1 << 30   # RoPE has no hard table; budgets are enforced by the tokenizer
        self._dev = torch.device(device)
        self.max_batch_tokens = max_batch_tokens
        self.graphs = None
        if graphs and self._dev.type == "cuda":
            from inference_svc.cuda_graphs import BucketPlan, CudaGraphForward
            cfg = _read_agent_config(ckpt_dir)
            plan = BucketPlan(max_rows=max_rows, max_tokens=int(cfg.get("max_len", 512)))
            self.graphs = CudaGraphForward(self.model, self._dev, plan,
                                           parallel=cfg.get("option_layout", "sequential") == "parallel")

    def warm(self) -> int:
        """Capture the CUDA graph of every bucket a batch within the token budget can use (before
        ready, so live traffic never captures); returns how many graphs are resident."""
        if self.graphs is None:
            return 0
        self.graphs.warm(self.graphs.plan.warm_buckets(self.max_batch_tokens))
        return len(self.graphs.cache)

    def padded_tokens(self, rows: int, tokens: int) -> int:
        """What a batch really costs on this runner once padded to its bucket (the batcher's budget)."""
        if self.graphs is None:
            return rows * tokens
        b = self.graphs.plan.bucket(min(rows, self.graphs.plan.max_rows), min(tokens, self.graphs.plan.max_tokens), 1)
        return b.rows * b.tokens * -(-rows // b.rows)

    def forward(self, batch: dict) -> tuple[np.ndarray, np.ndarray]:
        if self.graphs is not None:
            n, step = batch["input_ids"].shape[0], self.graphs.plan.max_rows
            if n <= step:
                return self.graphs.forward(batch)
            parts = [self.graphs.forward({k: v[i: i + step] for k, v in batch.items()}) for i in range(0, n, step)]
            return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
        torch = self._torch
        non_blocking = self._dev.type == "cuda"
        t = {k: torch.from_numpy(v).to(self._dev, non_blocking=non_blocking) for k, v in batch.items()}
        with torch.inference_mode():
            logits, act = self.model(t["input_ids"], t["attention_mask"], t["marker_pos"], t["marker_mask"],
                                     t["qtype"], t.get("position_ids"), t.get("option_ids"))
        return logits.float().cpu().numpy(), act.float().cpu().numpy()

    def device(self) -> str:
        p = next(self.model.parameters())
        return str(p.device)

    def dtype(self) -> str:
        p = next(self.model.parameters())
        return str(p.dtype).replace("torch.", "")

    def close(self) -> None:
        torch = self._torch
        dev = self._dev
        if self.graphs is not None:
            self.graphs.close()
            self.graphs = None
        del self.model
        if dev.type == "cuda":
            torch.cuda.empty_cache()


def _read_agent_config(ckpt_dir: str) -> dict:
    from laya_grpc.pipeline import read_config
    return read_config(ckpt_dir)


class MlxRunner:
    backend = "mlx"

    def __init__(self, ckpt_dir: str, dtype: Optional[str]):
        import mlx.core as mx
        from inference_svc.mlx_model import LayaMLX
        if not dtype or dtype == "auto":
            # float32 on CPU is exact to upstream; on the Apple GPU fp16 is the ports' convention
            dtype = "float16" if mx.default_device().type == mx.gpu else "float32"
        self.model = LayaMLX.from_checkpoint(ckpt_dir, dtype=dtype)
        self.vocab_size = self.model.spec.vocab_size
        self.n_act = self.model.n_act
        self.max_positions = 1 << 30

    def forward(self, batch: dict) -> tuple[np.ndarray, np.ndarray]:
        return self.model.forward(**batch)

    def device(self) -> str:
        return self.model.device          # "mlx:gpu" or "mlx:cpu", from MLX itself

    def dtype(self) -> str:
        return str(self.model.dtype)

    def close(self) -> None:
        del self.model


def _torch_dtype(torch, name: Optional[str], device: str):
    """fp32 on CPU (exact to upstream); float16 on CUDA and MPS unless told otherwise.

    float16 rather than bfloat16 on CUDA: on the large checkpoint bf16 weights moved probabilities by
    up to 0.029 against CPU fp32, float16 by 0.0064, at the same speed (benchmarks/results)."""
    table = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16, "fp16": torch.float16,
             "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
    if name and name != "auto":
        if name not in table:
            raise LayaError(Kind.INVALID, "unknown dtype %r; choose auto, float32, float16 or bfloat16" % name)
        return table[name]
    if device.startswith(("cuda", "mps")):
        return torch.float16
    return torch.float32


def pick_device(requested: str, backend: str, require: bool) -> DevicePick:
    """auto = CUDA, then MPS, then CPU. An unavailable explicit device fails with --require-device,
    else falls back to CPU loudly (logged at WARNING and shown in status as device_fallback)."""
    requested = (requested or "auto").lower()
    if backend == "mlx":
        import mlx.core as mx
        real = "gpu" if mx.default_device() == mx.gpu else "cpu"
        if requested in ("auto", real, "mlx"):
            return DevicePick(real, requested, False, "mlx default device")
        want = "gpu" if requested in ("gpu", "mps", "cuda") else requested
        if want == real:
            return DevicePick(real, requested, False, "mlx default device")
        why = "MLX has no %s device here (it runs on %s)" % (want, real)
        if require:
            raise LayaError(Kind.DEVICE, why)
        log.warning("%s; falling back to %s", why, real)
        return DevicePick(real, requested, True, why)
    import torch
    cuda = torch.cuda.is_available()
    mps = bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())
    if requested == "auto":
        dev = "cuda:0" if cuda else "mps" if mps else "cpu"
        return DevicePick(dev, requested, False, "auto: first available of cuda, mps, cpu")
    if requested.startswith("cuda"):
        idx = int(requested.split(":")[1]) if ":" in requested else 0
        if cuda and idx < torch.cuda.device_count():
            return DevicePick("cuda:%d" % idx, requested, False, "requested")
        why = ("CUDA device %d is not available (torch %s, %d CUDA devices)"
               % (idx, torch.__version__, torch.cuda.device_count() if cuda else 0))
    elif requested == "mps":
        if mps:
            return DevicePick("mps", requested, False, "requested")
        why = "MPS is not available (needs Apple Silicon and a torch build with MPS)"
    elif requested == "cpu":
        return DevicePick("cpu", requested, False, "requested")
    else:
        raise LayaError(Kind.INVALID, "unknown device %r; choose auto, cpu, cuda, cuda:N or mps" % requested)
    if require:
        raise LayaError(Kind.DEVICE, why + "; refusing to start (--require-device)")
    log.warning("%s; FALLING BACK TO CPU (pass --require-device to fail instead)", why)
    return DevicePick("cpu", requested, True, why + "; fell back to cpu")


def load_runner(ckpt_dir: str, backend: str, device: str, dtype: Optional[str], max_rows: int = 256,
                max_batch_tokens: int = 16384):
    t0 = time.perf_counter()
    runner = (MlxRunner(ckpt_dir, dtype) if backend == "mlx"
              else TorchRunner(ckpt_dir, device, dtype, max_rows=max_rows, max_batch_tokens=max_batch_tokens))
    log.info("loaded %s on %s/%s in %.0f ms", ckpt_dir, runner.device(), runner.dtype(), (time.perf_counter() - t0) * 1e3)
    return runner
