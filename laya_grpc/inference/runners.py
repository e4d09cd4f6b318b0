"""A loaded network on a device, behind one call: padded numpy batch in, numpy outputs out.

The batcher never touches torch or mlx itself; each backend's runner owns its framework, its
device and its dtype, and reports them from the live weights (never from what was asked).
"""
from __future__ import annotations

import logging
import os
import time
from typing import Optional, Protocol

import numpy as np

from laya_grpc.core.errors import Kind, LayaError
from laya_grpc.core.jsonfile import read_json_object

from .devices import mlx_dtype, torch_dtype

log = logging.getLogger("laya_grpc.inference.runners")


class Runner(Protocol):
    backend: str
    vocab_size: int
    max_positions: int
    n_act: int

    def forward(self, batch: dict) -> tuple[np.ndarray, np.ndarray]:
        """(logits float32 [B,K], act_logits float32 [B,n_act]) for a padded batch (see PackedRows.pad)."""

    def run_rows(self, rows, pad_id: int, pad_to: Optional[int] = None) -> tuple[np.ndarray, np.ndarray]:
        """The same for token rows (PackedRows): the serving path, which packs them where the runner can
        (else pads them, to at least `pad_to` tokens)."""

    def device(self) -> str: ...
    def dtype(self) -> str: ...
    def close(self) -> None: ...


CUDA_KERNELS = ("auto", "fused", "reference")


def resolve_kernels(requested: str, device_type: str) -> str:
    """The encoder kernels a torch runner on `device_type` runs: "fused" (Triton, CUDA only) or
    "reference". auto takes fused on CUDA when Triton works there, else says loudly why not."""
    if requested not in CUDA_KERNELS:
        raise LayaError(Kind.INVALID, "--cuda-kernels must be one of %s, got %r" % ("|".join(CUDA_KERNELS), requested))
    if requested == "reference" or (requested == "auto" and device_type != "cuda"):
        return "reference"
    if device_type != "cuda":
        raise LayaError(Kind.INVALID, "--cuda-kernels fused needs a CUDA device; this runner is on %s" % device_type)
    from . import cuda_attention, cuda_kernels
    ok, why = cuda_kernels.available()
    if ok:
        ok, why = cuda_attention.available()
    if ok:
        return "fused"
    if requested == "fused":
        raise LayaError(Kind.INVALID, "--cuda-kernels fused: %s" % why)
    log.warning("CUDA encoder falls back to the reference kernels (about 3x the launches): %s", why)
    return "reference"


class TorchRunner:
    """The torch network. On CUDA every forward replays a captured graph of its shape bucket
    (cuda_graphs.py), by default of the fused encoder (cuda_kernels.py); on CPU and MPS it runs
    eagerly (CPU fp32 is the bit-exact reference path)."""
    backend = "torch"

    def __init__(self, ckpt_dir: str, device: str, dtype: Optional[str], max_rows: int = 256,
                 max_batch_tokens: int = 16384, graphs: bool = True, cuda_kernels: str = "auto",
                 pack_rows: str = "auto"):
        import torch
        from .torch_model import LayaTorch
        self._torch = torch
        tdtype = torch_dtype(dtype, device)
        self.kernels = resolve_kernels(cuda_kernels, torch.device(device).type)
        self.model = LayaTorch.from_checkpoint(ckpt_dir, device=device, dtype=tdtype).eval()
        if self.kernels == "fused":
            self.model.use_fused_kernels()
        spec = self.model.spec
        self.vocab_size = spec.vocab_size
        self.n_act = spec.n_act
        self.max_positions = 1 << 30   # eager: RoPE has no hard table; budgets come from the tokenizer
        self._dev = torch.device(device)
        self.max_batch_tokens = max_batch_tokens
        self.graphs = None
        self.packing = None        # a PackedPlan while rows are packed (packing.py), else padded buckets
        cfg = read_json_object(os.path.join(ckpt_dir, "rl_agent_config.json"))
        parallel = cfg.get("option_layout", "sequential") == "parallel"
        max_len = int(cfg.get("max_len", 512))
        pack = resolve_pack_rows(pack_rows, graphs and self._dev.type == "cuda", self.kernels, parallel)
        if pack:
            from .cuda_graphs import PackedForward
            from .packing import PackedPlan
            self.packing = PackedPlan(max_rows=max_rows, max_row_tokens=max_len, max_batch_tokens=max_batch_tokens)
            self.graphs = PackedForward(self.model, self._dev, self.packing, graphs=graphs and self._dev.type == "cuda")
            self.max_positions = max_len
        elif graphs and self._dev.type == "cuda":
            from .cuda_graphs import BucketPlan, CudaGraphForward
            plan = BucketPlan(max_rows=max_rows, max_tokens=max_len)
            self.graphs = CudaGraphForward(self.model, self._dev, plan, parallel=parallel)
            # the graphs and the RoPE tables they read are sized for the checkpoint's max_len; a longer
            # row (a per-request max_len above it) is refused per request by the inference service
            self.max_positions = plan.max_tokens

    def warm(self) -> int:
        """Capture the CUDA graph of every bucket a batch within the token budget can use (before
        ready; the batcher keeps batches within that budget); returns how many graphs are resident."""
        if self.graphs is None or (self.packing is not None and not self.graphs.use_graphs):
            return 0
        buckets = (self.packing.warm_buckets() if self.packing is not None
                   else self.graphs.plan.warm_buckets(self.max_batch_tokens))
        t0 = time.perf_counter()
        self.graphs.warm(buckets[:1])   # the first capture also compiles/loads the kernels: timed apart
        t1 = time.perf_counter()
        self.graphs.warm(buckets[1:])
        t2 = time.perf_counter()
        log.info("captured %d CUDA graphs in %.0f ms (the first, with kernel compiles, %.0f ms; %s kernels, %s rows)",
                 len(buckets), (t2 - t0) * 1e3, (t1 - t0) * 1e3, self.kernels,
                 "packed" if self.packing is not None else "padded")
        return len(self.graphs.cache)

    def batch_cost(self, rows: int, longest: int, total: int) -> int:
        """Tokens a batch really costs on this runner (the batcher's budget): packed, its real tokens
        rounded up to a token bucket; padded, rows x its longest row rounded up to a bucket."""
        if self.packing is not None:
            return self.packing.round_tokens(total)
        if self.graphs is None:
            return rows * longest
        b = self.graphs.plan.bucket(min(rows, self.graphs.plan.max_rows), min(longest, self.graphs.plan.max_tokens), 1)
        return b.rows * b.tokens * -(-rows // b.rows)

    def run_rows(self, rows, pad_id: int, pad_to: Optional[int] = None) -> tuple[np.ndarray, np.ndarray]:
        """(logits float32 [n, K], act_logits [n, n_act]) for token rows, K >= every row's marker count;
        packed in as few forwards as the plan allows, else padded like upstream's collate (to at least
        `pad_to` tokens; packed rows have no padding to round)."""
        if self.packing is None:
            return self.forward(rows.pad(pad_id, pad_to=pad_to))
        K = max(1, int(rows.marker_counts.max())) if rows.n else 1
        logits = np.full((rows.n, K), -1e4, dtype=np.float32)
        act = np.empty((rows.n, self.n_act), dtype=np.float32)
        for part in self.packing.split(rows):
            lg, ac = self.graphs.forward(rows.take(part), pad_id)
            k = min(K, lg.shape[1])
            logits[part.start: part.stop, :k] = lg[:, :k]
            act[part.start: part.stop] = ac
        return logits, act

    def forward(self, batch: dict) -> tuple[np.ndarray, np.ndarray]:
        if self.packing is not None:      # a padded batch from a caller that holds one: packed all the same
            from .packing import rows_from_padded
            lg, ac = self.run_rows(rows_from_padded(batch), pad_id=0)
            K = batch["marker_pos"].shape[1]
            out = np.full((lg.shape[0], K), -1e4, dtype=np.float32)
            out[:, : min(K, lg.shape[1])] = lg[:, :K]
            return out, ac
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


PACK_ROWS = ("auto", "on", "off")


def resolve_pack_rows(requested: str, cuda_graphs: bool, kernels: str, parallel: bool) -> bool:
    """Whether a torch runner packs rows (packing.py): auto packs wherever it can (CUDA graphs of the
    fused kernels, sequential option layout), on insists and says why it cannot, off keeps padding."""
    if requested not in PACK_ROWS:
        raise LayaError(Kind.INVALID, "--pack-rows must be one of %s, got %r" % ("|".join(PACK_ROWS), requested))
    why = ("it needs the fused CUDA kernels (this runner has %s)" % kernels if kernels != "fused"
           else "the parallel option layout is not packed" if parallel
           else "it needs CUDA graphs" if not cuda_graphs else "")
    if requested == "on" and why:
        raise LayaError(Kind.INVALID, "--pack-rows on: " + why)
    return requested != "off" and not why


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


def load_runner(ckpt_dir: str, backend: str, device: str, dtype: Optional[str], max_rows: int = 256,
                max_batch_tokens: int = 16384, cuda_kernels: str = "auto", pack_rows: str = "auto"):
    t0 = time.perf_counter()
    runner = (MlxRunner(ckpt_dir, device, dtype) if backend == "mlx"
              else TorchRunner(ckpt_dir, device, dtype, max_rows=max_rows, max_batch_tokens=max_batch_tokens,
                               cuda_kernels=cuda_kernels, pack_rows=pack_rows))
    log.info("loaded %s on %s/%s (%s kernels) in %.0f ms", ckpt_dir, runner.device(), runner.dtype(), runner.kernels,
             (time.perf_counter() - t0) * 1e3)
    return runner
