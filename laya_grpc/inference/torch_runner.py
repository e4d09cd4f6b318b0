"""The torch network behind the runner call, in one of three modes picked at load (kernel_choice.py):
CUDA graphs over packed rows (the fused kernels, sequential layout: what `serve` runs on CUDA),
CUDA graphs over padded buckets (the parallel layout, the reference kernels, --pack-rows off), or
eager (CPU and MPS; CPU fp32 is the bit-exact reference path)."""
from __future__ import annotations

import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

import numpy as np

from laya_grpc.core.errors import Kind, LayaError
from laya_grpc.core.checkpoints.jsonfile import read_json_object

from .devices import torch_dtype
from .kernel_choice import resolve_kernels, resolve_pack_rows
from .runner_protocol import Started

log = logging.getLogger("laya_grpc.inference.torch_runner")


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
        if self.kernels == "fused":   # Triton's own hash runs while the weights load (kernel_compile.py)
            from .kernel_compile import hash_library_ahead
            hash_library_ahead()
        self.model = LayaTorch.from_checkpoint(ckpt_dir, device=device, dtype=tdtype).eval()
        if self.kernels == "fused":
            self.model.use_fused_kernels()
        if torch.device(device).type == "cuda":
            from .precision import Precision, apply_cublas_policy
            apply_cublas_policy(self.model.precision or Precision.for_weights(tdtype, "cuda"))
        spec = self.model.spec
        self.vocab_size = spec.vocab_size
        self.n_act = spec.n_act
        self.max_positions = 1 << 30   # eager: RoPE has no hard table; budgets come from the tokenizer
        self._dev = torch.device(device)
        self.max_batch_tokens = max_batch_tokens
        self.graphs = None
        self._thread = None        # start_rows' thread for forwards it cannot queue on the GPU, made on first use
        self.packing = None        # a PackedPlan while rows are packed (packing.py), else padded buckets
        cfg = read_json_object(os.path.join(ckpt_dir, "rl_agent_config.json"))
        parallel = cfg.get("option_layout", "sequential") == "parallel"
        max_len = int(cfg.get("max_len", 512))
        pack = resolve_pack_rows(pack_rows, graphs and self._dev.type == "cuda", self.kernels, parallel)
        if pack:
            from .cuda_graphs import PackedForward, packed_plan
            self.packing = packed_plan(max_rows, max_len, max_batch_tokens, tdtype)
            self.graphs = PackedForward(self.model, self._dev, self.packing, graphs=graphs and self._dev.type == "cuda")
            self.max_positions = max_len
        elif graphs and self._dev.type == "cuda":
            from .cuda_graphs import BucketPlan, CudaGraphForward
            plan = BucketPlan(max_rows=max_rows, max_tokens=max_len)
            self.graphs = CudaGraphForward(self.model, self._dev, plan, parallel=parallel)
            # the graphs and the RoPE tables they read are sized for the checkpoint's max_len; a longer
            # row (a per-request max_len above it) is refused per request by the inference service
            self.max_positions = plan.max_tokens
        # a short batch may run on the event loop's thread when the device is idle (batcher.py, inline
        # turn): a captured graph is a few launches and one sync; eager forwards (CPU, MPS) are long
        self.forwards_inline = self._dev.type == "cuda" and self.graphs is not None and getattr(
            self.graphs, "use_graphs", True)

    def warm(self) -> int:
        """Capture the CUDA graph of every bucket a batch within the token budget can use (before
        ready; the batcher keeps batches within that budget); returns how many graphs are resident."""
        if self.graphs is None or (self.packing is not None and not self.graphs.use_graphs):
            return 0
        buckets = (self.packing.warm_buckets() if self.packing is not None
                   else self.graphs.plan.warm_buckets(self.max_batch_tokens))
        t0 = time.perf_counter()
        variants = self.graphs.warm(buckets)
        log.info("captured %d CUDA graphs in %.0f ms (%d Triton kernel variants compiled or read first; %s kernels, "
                 "%s rows)", len(buckets), (time.perf_counter() - t0) * 1e3, variants, self.kernels,
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
        return self._rows_out(rows, [(part, self.graphs.forward(rows.take(part), pad_id))
                                     for part in self.packing.split(rows)])

    def start_rows(self, rows, pad_id: int) -> Started:
        """`run_rows` without waiting for it: rows that fit one captured graph are queued on the GPU
        (the caller's thread is free at once); anything else runs on this runner's own thread
        (torch releases the GIL in its kernels). In-process callers tokenize and decode meanwhile."""
        if self.packing is not None and self.graphs.use_graphs:
            parts = self.packing.split(rows)
            if len(parts) == 1:
                started = self.graphs.start(rows, pad_id)
                return Started(started.done, lambda: self._rows_out(rows, [(parts[0], started.result())]))
        if self._thread is None:
            self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="laya-forward")
        return Started.on_thread(self._thread.submit(self.run_rows, rows, pad_id))

    def _rows_out(self, rows, parts: list) -> tuple[np.ndarray, np.ndarray]:
        """run_rows' value from (row range, (logits, act)) of each packed forward."""
        K = max(1, int(rows.marker_counts.max())) if rows.n else 1
        logits = np.full((rows.n, K), -1e4, dtype=np.float32)
        act = np.empty((rows.n, self.n_act), dtype=np.float32)
        for part, (lg, ac) in parts:
            k = min(K, lg.shape[1])
            logits[part.start: part.stop, :k] = lg[:, :k]
            act[part.start: part.stop] = ac
        return logits, act

    def forward(self, batch: dict) -> tuple[np.ndarray, np.ndarray]:
        """(logits, act_logits) for a padded batch: the padded graphs or eager modes. A packing runner
        takes rows only (run_rows), so no padded batch is ever unpadded again on the serving path."""
        if self.packing is not None:
            raise LayaError(Kind.INTERNAL, "this runner packs rows: call run_rows, not forward(padded batch)")
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
        if self._thread is not None:
            self._thread.shutdown(wait=True)
            self._thread = None
        if self.graphs is not None:
            self.graphs.close()
            self.graphs = None
        del self.model
        if dev.type == "cuda":
            torch.cuda.empty_cache()
