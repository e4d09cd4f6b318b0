"""Static-shape buckets and a bounded cache of captured CUDA graphs for the torch runner.

At one short row the 421M encoder is hundreds of small kernels, so launched eagerly the CPU is
the bottleneck; replayed from a CUDA graph only the GPU time is left (3.0 ms on an H200,
docs/performance.md). Graphs need fixed shapes, so
every batch is padded up to a bucket (rows: powers of two; tokens: a short list of steps;
markers: powers of two from `min_markers`), and each bucket is captured once, with its own
static device input buffer and a pinned host twin, so a request costs one host->device copy,
one replay, one device->host copy and one sync. The padding logic is plain numpy and the cache
takes the capture function as a parameter, so both run (and are tested) without a GPU.

Two plans: `PackedForward` (the default where the fused kernels run the sequential layout) lays the
rows of a batch end to end in one token stream, one graph per token bucket (packing.py);
`CudaGraphForward` pads every row to the batch's longest, one graph per rows x tokens bucket (the
parallel layout, the reference kernels, --pack-rows off).

Padding is exact for the real rows: extra token columns are masked keys, extra marker slots are
masked options, and extra rows are discarded. Extra rows get one attended token so no attention
row of theirs is fully masked (a fully masked row would be NaN, and NaN keys poison 0-weight sums).
"""
from __future__ import annotations

import collections
import contextlib
import threading
from dataclasses import dataclass
from typing import Callable, Hashable, Optional

import numpy as np

from laya_grpc.core.errors import Kind, LayaError
from laya_grpc.core.wire.packed_rows import PackedRows

from .packing import FIELDS, fill
from .runner_protocol import Started

# int64 fields laid end to end in one host buffer and one device buffer, in this order
_FIELDS_SEQ = ("input_ids", "attention_mask", "marker_pos", "marker_mask", "qtype")
_FIELDS_PAR = _FIELDS_SEQ + ("position_ids", "option_ids")


@dataclass(frozen=True)
class Bucket:
    rows: int
    tokens: int
    markers: int


DEFAULT_TOKEN_BUCKETS = (16, 32, 64, 96, 128, 160, 192, 256, 384, 512)


@dataclass(frozen=True)
class BucketPlan:
    """Which padded shapes exist: rows in powers of two up to max_rows, tokens in the listed steps
    (beyond the last listed step: multiples of 128) up to max_tokens, markers in powers of two."""
    max_rows: int
    max_tokens: int
    token_buckets: tuple = DEFAULT_TOKEN_BUCKETS
    min_markers: int = 8

    def __post_init__(self):
        if self.max_rows < 1 or self.max_tokens < 1:
            raise LayaError(Kind.INVALID, "bucket plan needs positive max_rows and max_tokens, got %r" % (self,))

    def bucket(self, rows: int, tokens: int, markers: int) -> Bucket:
        """The smallest bucket holding this batch; a batch beyond the plan is refused by name."""
        if rows > self.max_rows or tokens > self.max_tokens:
            raise LayaError(Kind.INVALID, "batch of %d rows x %d tokens exceeds the graph plan (%d rows x %d tokens)"
                            % (rows, tokens, self.max_rows, self.max_tokens))
        return Bucket(min(self.max_rows, _pow2_at_least(max(1, rows))), self.token_bucket(tokens),
                      _pow2_at_least(max(self.min_markers, markers)))

    def token_bucket(self, tokens: int) -> int:
        for t in self.token_buckets:
            if tokens <= t:
                return min(t, self.max_tokens)
        return min(self.max_tokens, -(-tokens // 128) * 128)

    def warm_buckets(self, max_batch_tokens: int) -> list[Bucket]:
        """Every row x token bucket a batch within `max_batch_tokens` padded tokens can land in."""
        toks = sorted({self.token_bucket(t) for t in self.token_buckets + (self.max_tokens,) if t <= self.max_tokens})
        out, r = [], 1
        while True:
            rows = min(r, self.max_rows)
            out += [Bucket(rows, t, self.min_markers) for t in toks if rows * t <= max(max_batch_tokens, t)]
            if rows >= self.max_rows:
                return out
            r *= 2


def _pow2_at_least(n: int) -> int:
    return 1 << (int(n) - 1).bit_length()


def field_names(parallel: bool) -> tuple:
    return _FIELDS_PAR if parallel else _FIELDS_SEQ


def field_sizes(b: Bucket, parallel: bool) -> dict:
    """Element count of each int64 field of a bucket, in buffer order."""
    sizes = {"input_ids": b.rows * b.tokens, "attention_mask": b.rows * b.tokens,
             "marker_pos": b.rows * b.markers, "marker_mask": b.rows * b.markers, "qtype": b.rows}
    if parallel:
        sizes["position_ids"] = sizes["option_ids"] = b.rows * b.tokens
    return {k: sizes[k] for k in field_names(parallel)}


def field_views(flat, b: Bucket, parallel: bool) -> dict:
    """Shaped views into one flat int64 buffer (numpy array or torch tensor alike)."""
    shapes = {"input_ids": (b.rows, b.tokens), "attention_mask": (b.rows, b.tokens),
              "marker_pos": (b.rows, b.markers), "marker_mask": (b.rows, b.markers), "qtype": (b.rows,),
              "position_ids": (b.rows, b.tokens), "option_ids": (b.rows, b.tokens)}
    out, at = {}, 0
    for name, n in field_sizes(b, parallel).items():
        out[name] = flat[at: at + n].reshape(shapes[name])
        at += n
    return out


def fill_bucket(views: dict, batch: dict, b: Bucket) -> int:
    """Write a padded batch (PackedRows.pad output) into a bucket's views; returns the real row count.

    Every element is written on every call (the buffers are reused across requests)."""
    ids = batch["input_ids"]
    n, L = ids.shape
    K = batch["marker_pos"].shape[1]
    if n > b.rows or L > b.tokens or K > b.markers:
        raise LayaError(Kind.INTERNAL, "batch %dx%d (K=%d) does not fit bucket %r" % (n, L, K, b))
    for name, v in views.items():
        src = batch[name]
        v[...] = 0
        if src.ndim == 1:
            v[:n] = src
        else:
            v[:n, : src.shape[1]] = src
    # rows beyond the batch: one attended token, so no attention row is fully masked
    views["attention_mask"][n:, 0] = 1
    return n


def warm_graphs(cache: "GraphCache", buckets: list, buffers: Callable, stream, pool, device) -> int:
    """Capture the graph of each bucket missing from `cache`. Every bucket's buffers come first, then
    one dry pass of each bucket's step on the capture stream compiles and loads the Triton kernels
    they launch, side by side (kernel_compile.ahead), then the captures. The dry passes stand in for
    the eager pass a capture otherwise runs first: every Triton kernel is compiled and loaded, and the
    first bucket's pass ran every torch operation of the step on the capture stream (cuBLAS's handle
    and workspace are set up there). The later passes' GEMMs only allocate their outputs
    (split_gemm.allocate_only): nothing reads a dry pass's results, and with a filled kernel cache the
    GEMMs were 0.39 s of the dry passes' 0.88 s on an H100 (benchmarks/results/2026-12-07-7ea8a66). A
    capture may then meet a GEMM shape cuBLAS has not run yet; its kernel is loaded while capturing,
    which CUDA drivers allow since 12.3 (the captures took 0.15 s longer, the graphs' answers were the
    same bit for bit). Returns the kernel variants compiled or read from the disk cache."""
    import torch
    from . import kernel_compile, split_gemm
    entries = {b: buffers(b) for b in dict.fromkeys(buckets) if b not in cache}
    if not entries:
        return 0
    stream.wait_stream(torch.cuda.current_stream(device))   # the buffers' fills are on the current stream

    def dry(step, gemms: bool):
        def run():
            with torch.inference_mode(), torch.cuda.stream(stream), \
                    (contextlib.nullcontext() if gemms else split_gemm.allocate_only()):
                step()
        return run
    variants = kernel_compile.ahead([dry(e.step, i == 0) for i, e in enumerate(entries.values())], device)
    torch.cuda.current_stream(device).wait_stream(stream)
    for b, entry in entries.items():
        def capture(_b, entry=entry):
            entry.graph = capture_graph(entry.step, stream, pool, device, eager_first=False)
            return entry
        cache.get(b, capture)
    return variants


def capture_graph(step: Callable[[], None], stream, pool, device, eager_first: bool = True):
    """`step` captured as a CUDA graph on `stream` in memory `pool`, after one eager pass on that stream
    (kernels, library handles and workspaces are set up outside the capture). eager_first=False: the
    step's operations already ran on `stream` with every kernel loaded (warm_graphs)."""
    import torch
    stream.wait_stream(torch.cuda.current_stream(device))
    if eager_first:
        with torch.inference_mode(), torch.cuda.stream(stream):
            step()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.inference_mode(), torch.cuda.graph(graph, pool=pool, stream=stream):
        step()
    torch.cuda.synchronize(device)
    return graph


class GraphCache:
    """Least-recently-used map bucket -> captured graph, at most `capacity` entries.

    `capture(key)` builds an entry; `release(entry)` frees it when it is evicted. Hits and
    captures are counted so a benchmark can assert that nothing is captured after ready."""

    def __init__(self, capacity: int, capture: Callable[[Hashable], object],
                 release: Callable[[object], None] = lambda entry: None):
        if capacity < 1:
            raise LayaError(Kind.INVALID, "graph cache capacity must be >= 1, got %d" % capacity)
        self.capacity = capacity
        self._capture, self._release = capture, release
        self._entries: "collections.OrderedDict[Hashable, object]" = collections.OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.captures = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    def keys(self) -> list:
        return list(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def get(self, key: Hashable, capture: Optional[Callable[[Hashable], object]] = None):
        """The entry of `key`, built by `capture` (default: the cache's own) when it is missing."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
                self.hits += 1
                return entry
        entry = (capture or self._capture)(key)
        with self._lock:
            self.captures += 1
            self._entries[key] = entry
            while len(self._entries) > self.capacity:
                _, old = self._entries.popitem(last=False)
                self.evictions += 1
                self._release(old)
        return entry

    def clear(self) -> None:
        with self._lock:
            while self._entries:
                self._release(self._entries.popitem(last=False)[1])


class CudaGraphForward:
    """The torch model behind bucketed CUDA graphs: forward(padded numpy batch) -> numpy outputs."""

    def __init__(self, model, device, plan: BucketPlan, parallel: bool, capacity: int = 96):
        import torch
        self._torch = torch
        self.model, self.dev, self.plan, self.parallel = model, device, plan, parallel
        self.n_act = model.spec.n_act
        self._pool = torch.cuda.graph_pool_handle()
        self._stream = torch.cuda.Stream(device=device)
        model.prepare_rope(plan.max_tokens)   # one table per theta, sliced by every graph
        self.cache = GraphCache(capacity, self._capture, self._release)

    # -- capture ---------------------------------------------------------------------------
    def _capture(self, b: Bucket):
        entry = self._buffers(b)
        entry.graph = capture_graph(entry.step, self._stream, self._pool, self.dev)
        return entry

    def _buffers(self, b: Bucket):
        """A bucket's static buffers and forward step, not captured yet."""
        torch = self._torch
        n_in = sum(field_sizes(b, self.parallel).values())
        # zeros, not empty: reused pinned memory holds old bytes, and a stale token id past the vocabulary
        # makes the capture pass index out of bounds (a device-side assert that poisons the CUDA context)
        host_in = torch.zeros(n_in, dtype=torch.int64, pin_memory=True)
        dev_in = torch.zeros(n_in, dtype=torch.int64, device=self.dev)
        hv = field_views(host_in.numpy(), b, self.parallel)
        # a valid dummy batch for the warm-up and capture passes: one real token per row
        hv["attention_mask"][:, 0] = 1
        hv["marker_mask"][:, 0] = 1
        dev_in.copy_(host_in)
        dv = field_views(dev_in, b, self.parallel)
        out = torch.empty(b.rows, b.markers + self.n_act, dtype=torch.float32, device=self.dev)
        host_out = torch.empty(b.rows, b.markers + self.n_act, dtype=torch.float32, pin_memory=True)

        def step():
            logits, act = self.model(dv["input_ids"], dv["attention_mask"], dv["marker_pos"], dv["marker_mask"],
                                     dv["qtype"], dv.get("position_ids"), dv.get("option_ids"))
            out[:, : b.markers].copy_(logits)
            out[:, b.markers:].copy_(act)

        return _Captured(b, None, host_in, dev_in, hv, out, host_out, step)

    @staticmethod
    def _release(entry) -> None:
        entry.graph.reset()

    def warm(self, buckets: list) -> int:
        return warm_graphs(self.cache, buckets, self._buffers, self._stream, self._pool, self.dev)

    # -- hot path ---------------------------------------------------------------------------
    def forward(self, batch: dict) -> tuple[np.ndarray, np.ndarray]:
        n, L = batch["input_ids"].shape
        K = batch["marker_pos"].shape[1]
        b = self.plan.bucket(n, L, K)
        c = self.cache.get(b)
        fill_bucket(c.host_views, batch, b)
        c.dev_in.copy_(c.host_in, non_blocking=True)
        c.graph.replay()
        c.host_out.copy_(c.out, non_blocking=True)
        torch = self._torch
        torch.cuda.current_stream(self.dev).synchronize()
        res = c.host_out.numpy()
        return res[:n, :K].copy(), res[:n, b.markers:].copy()

    def close(self) -> None:
        self.cache.clear()


def _outputs(c, n: int, b) -> tuple[np.ndarray, np.ndarray]:
    res = c.host_out.numpy()
    return res[:n, : b.markers].copy(), res[:n, b.markers:].copy()


@dataclass
class _Captured:
    bucket: Bucket
    graph: object
    host_in: object       # pinned int64 [n_in]
    dev_in: object        # device int64 [n_in]; the graph reads its views
    host_views: dict      # numpy views of host_in by field
    out: object           # device float32 [rows, markers + n_act]; the graph writes it
    host_out: object      # pinned twin of out
    step: object = None   # the forward the graph captures (PackedForward without graphs runs it eagerly)


def packed_plan(max_rows: int, max_row_tokens: int, max_batch_tokens: int, dtype):
    """The packed plan serving runs for weights of `dtype` (the packed forward's qkv dtype): float32
    attention (the exact mode) takes the blocks of cuda_attention.EXACT_BLOCKS by bucket size, then
    EXACT_LARGE_BLOCKS; 16-bit attention BLOCK_M and BLOCK_N everywhere."""
    import torch

    from . import cuda_attention as ca
    from .packing import PackedPlan
    if dtype == torch.float32:
        (block_m, block_n), table = ca.EXACT_LARGE_BLOCKS, ca.EXACT_BLOCKS
    else:
        (block_m, block_n), table = (ca.BLOCK_M, ca.BLOCK_N), ()
    return PackedPlan(max_rows=max_rows, max_row_tokens=max_row_tokens, max_batch_tokens=max_batch_tokens,
                      block_m=block_m, block_n=block_n, query_blocks=table)


class PackedForward:
    """The torch model over packed rows (packing.py): rows in, (logits [n, K], act [n, n_act]) out.

    graphs=True (CUDA): one captured graph per packed bucket in a bounded cache, fed like
    CudaGraphForward (one int32 host->device copy, one replay, one device->host copy, one sync).
    graphs=False runs `forward_packed` eagerly on the same filled buffers (any device where the
    fused kernels run: the CPU tests, through Triton's interpreter)."""

    def __init__(self, model, device, plan, graphs: bool = True, capacity: int = 96):
        import torch
        self._torch = torch
        self.model, self.dev, self.plan, self.use_graphs = model, device, plan, graphs
        self.n_act = model.spec.n_act
        model.prepare_rope(plan.max_row_tokens)   # one table per theta, read by every graph
        if graphs:
            self._pool = torch.cuda.graph_pool_handle()
            self._stream = torch.cuda.Stream(device=device)
        self.cache = GraphCache(capacity, self._build, self._release)
        self._lock = threading.Lock()             # one fill and launch at a time, whichever thread calls
        self._started: Optional[Started] = None   # the forward `start` queued last, until its outputs are kept

    def _build(self, b):
        entry = self._buffers(b)
        if self.use_graphs:
            entry.graph = capture_graph(entry.step, self._stream, self._pool, self.dev)
        return entry

    def _buffers(self, b):
        """A bucket's static buffers, filled with a valid empty batch, and its forward step."""
        torch = self._torch
        n_in = sum(b.sizes().values())
        pinned = self.dev.type == "cuda"
        host_in = torch.zeros(n_in, dtype=torch.int32, pin_memory=pinned)
        dev_in = torch.zeros(n_in, dtype=torch.int32, device=self.dev)
        hv = b.views(host_in.numpy())
        dv = b.views(dev_in)
        width = b.markers + self.n_act
        out = torch.empty(b.segments, width, dtype=torch.float32, device=self.dev)
        host_out = torch.empty(b.segments, width, dtype=torch.float32, pin_memory=pinned)

        def step():
            logits, act = self.model.forward_packed(*(dv[k] for k in FIELDS), max_len=self.plan.max_row_tokens,
                                                    block_m=b.block_m, block_n=b.block_n)
            out[:, : b.markers].copy_(logits)
            out[:, b.markers:].copy_(act)

        # a valid dummy batch for the warm-up and capture passes: every slot empty, spare blocks only
        fill(hv, PackedRows.from_rows([]), b, 0)
        dev_in.copy_(host_in)
        return _Captured(b, None, host_in, dev_in, hv, out, host_out, step)

    @staticmethod
    def _release(entry) -> None:
        if entry.graph is not None:
            entry.graph.reset()

    def warm(self, buckets: list) -> int:
        return warm_graphs(self.cache, buckets, self._buffers, self._stream, self._pool, self.dev)

    def forward(self, rows, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
        """One bucket's worth of rows (PackedPlan.split) -> (logits [n, K bucket], act [n, n_act])."""
        with self._lock:
            self._finish_started()
            n, b, c = self._fill(rows, pad_id)
            torch = self._torch
            if c.graph is None:
                c.dev_in.copy_(c.host_in)
                with torch.inference_mode():
                    c.step()
                c.host_out.copy_(c.out)
            else:
                self._launch(c)
                torch.cuda.current_stream(self.dev).synchronize()
            return _outputs(c, n, b)

    def start(self, rows, pad_id: int) -> Started:
        """`forward` queued on the device without waiting for it (captured graphs only); `result()`
        waits. The next forward or start first waits for this one and keeps its outputs, since both
        may use the same bucket's buffers."""
        if not self.use_graphs:
            raise LayaError(Kind.INTERNAL, "start queues a captured CUDA graph; without graphs call forward")
        with self._lock:
            self._finish_started()
            n, b, c = self._fill(rows, pad_id)
            self._launch(c)
            event = self._torch.cuda.Event()
            event.record(self._torch.cuda.current_stream(self.dev))
            kept = []

            def result():
                if not kept:
                    event.synchronize()
                    kept.append(_outputs(c, n, b))
                return kept[0]
            self._started = Started(lambda: bool(kept) or event.query(), result)
            return self._started

    def _finish_started(self) -> None:
        if self._started is not None:
            self._started.result()
            self._started = None

    def _fill(self, rows, pad_id: int) -> tuple:
        n = rows.n
        b = self.plan.bucket(n, len(rows.ids), int(rows.marker_counts.max()) if n else 1)
        c = self.cache.get(b)
        fill(c.host_views, rows, b, pad_id)
        return n, b, c

    @staticmethod
    def _launch(c) -> None:
        c.dev_in.copy_(c.host_in, non_blocking=True)
        c.graph.replay()
        c.host_out.copy_(c.out, non_blocking=True)

    def close(self) -> None:
        self.cache.clear()
