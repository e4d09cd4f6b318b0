"""The resident checkpoints: load on demand, warm before use, evict least recently used.

Every state a checkpoint passes through (configured, loading, warming, ready, preparing, failed)
is recorded here and pushed to status watchers; device and dtype are read from the live runner
on every status read, never from what was requested.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

from laya_grpc.core.runtime import memory, metrics
from laya_grpc.core.errors import Kind, LayaError
from laya_grpc.core.checkpoints.checkpoint import file_sha256
from laya_grpc.core.wire.packed_rows import PackedRows
from laya_grpc.core.checkpoints.sources import open_source
from laya_grpc.core.decisions.temperatures import Temperatures
from laya_proto.v1 import status_pb2

from .devices import DevicePick
from .runners import load_runner

log = logging.getLogger("laya_grpc.inference.registry")
S = status_pb2


@dataclass
class Slot:
    name: str
    source: str
    state: int = S.STATE_CONFIGURED
    detail: str = ""
    ckpt: object = None               # laya_grpc.core.checkpoints.checkpoint.Checkpoint
    runner: object = None
    fingerprint: str = ""
    sha256: str = ""
    config_json: str = ""
    temperatures: Optional[Temperatures] = None   # clamped at load; the engine decodes with them
    pad_id: int = 0
    load_ms: float = 0.0
    warmup_ms: float = 0.0
    last_used: float = 0.0
    task: Optional[asyncio.Task] = None
    pins: int = 0                     # requests between ensure and their answer: never evicted meanwhile
    draining: bool = False            # chosen for eviction: new requests wait, the ones in flight finish
    loading: bool = False             # admitted under --max-loaded, weights on their way: holds a place


@dataclass
class Registry:
    sources: dict
    backend: str
    pick: DevicePick
    dtype: str
    max_loaded: int
    warmup: bool
    run_on_device: Callable            # Batcher.run_on_device
    on_change: Callable[[], None]
    runner_options: dict = field(default_factory=dict)   # max_rows, max_batch_tokens
    slots: dict = field(default_factory=dict)
    started: bool = False              # True once startup preloading finished

    def __post_init__(self):
        self.slots = {n: Slot(n, s) for n, s in self.sources.items()}
        # one load admitted at a time: making room and taking the place happen together, else two
        # loads starting at once would each see room for one and both load (past --max-loaded)
        self._admit = asyncio.Lock()

    def slot(self, name: str) -> Slot:
        s = self.slots.get(name)
        if s is None:
            raise LayaError(Kind.NOT_FOUND, "checkpoint %r is not served here (served: %s); pin a served one with "
                            "\"model\", or start the server with --checkpoint %s=SOURCE" % (name, sorted(self.slots), name))
        return s

    def ready_runner(self, name: str):
        """For the device thread: the runner of a READY checkpoint."""
        s = self.slots[name]
        if s.runner is None:
            raise LayaError(Kind.BUSY, "checkpoint %r is not loaded" % name)
        return s.runner

    async def ensure(self, name: str) -> Slot:
        """The checkpoint, loaded and warm; concurrent callers share one load. One evicted right
        after it loaded (a load of another under --max-loaded) is loaded again."""
        s = self.slot(name)
        s.last_used = time.time()
        while s.state != S.STATE_READY:
            if s.task is None or s.task.done():
                s.task = asyncio.ensure_future(self._load(s))
            await asyncio.shield(s.task)
            if s.state == S.STATE_FAILED:
                raise LayaError(Kind.CHECKPOINT, "checkpoint %r failed to load: %s" % (name, s.detail))
        return s

    @contextlib.asynccontextmanager
    async def pinned(self, name: str):
        """The checkpoint, loaded and warm, and kept resident until the block ends: a concurrent
        load of another checkpoint (--max-loaded) must not evict it between the batcher taking its
        rows and the answer being built."""
        s = await self.ensure(name)
        while s.draining:   # being evicted for another checkpoint: let that happen, then reload it
            await asyncio.sleep(0.005)
            s = await self.ensure(name)
        s.pins += 1
        try:
            yield s
        finally:
            s.pins -= 1

    async def _load(self, s: Slot) -> None:
        async with self._admit:
            await self._evict_for(s.name)
            s.loading = True
        try:
            await self._load_admitted(s)
        finally:
            s.loading = False

    async def _load_admitted(self, s: Slot) -> None:
        preparing = self.started
        self._set(s, S.STATE_PREPARING if preparing else S.STATE_LOADING, "reading weights from %s" % s.source)
        t0 = time.perf_counter()
        try:
            loop = asyncio.get_running_loop()
            ckpt = await loop.run_in_executor(None, open_source, s.source)
            # the digests (0.5-2 s for 842 MB, by the CPU's sha256 speed) stream on a worker thread
            # while the device thread loads and warms: they are wanted by READY, not by the warm-up
            digests = loop.run_in_executor(None, _digests, ckpt)
            runner = None
            try:
                runner = await self.run_on_device(lambda: load_runner(ckpt.path, self.backend, self.pick.device,
                                                                      self.dtype, **self.runner_options))
                s.temperatures = Temperatures.from_config(ckpt.config)   # a bad config fails the load, not a request
                s.ckpt, s.runner, s.pad_id = ckpt, runner, int(ckpt.special.pad_id)
                s.load_ms = (time.perf_counter() - t0) * 1e3
                if self.warmup:
                    self._set(s, S.STATE_PREPARING if preparing else S.STATE_WARMING, "warmup forwards")
                    t1 = time.perf_counter()
                    await self.run_on_device(lambda: warm_runner(runner, ckpt, s.pad_id))
                    s.warmup_ms = (time.perf_counter() - t1) * 1e3
                sha, fingerprint = await digests
            except BaseException:
                # the load's or warm-up's error is the one to report; an unreadable file after a
                # good load leaves no half-registered runner behind
                await asyncio.gather(digests, return_exceptions=True)
                if runner is not None:
                    s.runner = None
                    await self.run_on_device(runner.close)
                raise
            s.sha256, s.fingerprint, s.config_json = sha, fingerprint, json.dumps(ckpt.config)
            self._set(s, S.STATE_READY, "")
            log.info("checkpoint %s ready on %s/%s (load %.0f ms, warmup %.0f ms)", s.name, runner.device(),
                     runner.dtype(), s.load_ms, s.warmup_ms)
        except Exception as e:  # noqa: BLE001 - becomes FAILED with its message, service keeps serving others
            detail = e.detail if isinstance(e, LayaError) else "%s: %s" % (type(e).__name__, e)
            log.error("checkpoint %s failed: %s", s.name, detail)
            s.runner = None
            self._set(s, S.STATE_FAILED, detail)

    async def _evict_for(self, name: str) -> None:
        """Make room under --max-loaded: evict the least recently used READY checkpoint with no
        request in flight; if every one is answering requests, the least recently used drains first
        (its calls in flight finish, new ones wait for its reload), so a checkpoint under constant
        load cannot keep another from ever loading. One still loading counts against the limit but
        is never a victim: the admission waits until it is ready (and then it may be the victim)."""
        while True:
            resident = [x for x in self.slots.values() if (x.runner is not None or x.loading) and x.name != name]
            if len(resident) < self.max_loaded:
                return
            loaded = [x for x in resident if x.state == S.STATE_READY]
            if not loaded:   # the others are still loading: evict once one of them is ready
                await asyncio.sleep(0.005)
                continue
            victim = min([x for x in loaded if x.pins == 0] or loaded, key=lambda x: x.last_used)
            victim.draining = True
            try:
                while victim.pins:
                    await asyncio.sleep(0.005)
            finally:
                victim.draining = False
            if victim.runner is None:   # a concurrent load evicted it meanwhile
                continue
            runner, victim.runner = victim.runner, None
            self._set(victim, S.STATE_CONFIGURED, "evicted (least recently used; --max-loaded %d)" % self.max_loaded)
            await self.run_on_device(runner.close)
            log.info("evicted checkpoint %s", victim.name)

    def _set(self, s: Slot, state: int, detail: str) -> None:
        s.state, s.detail = state, detail
        metrics.CHECKPOINT_READY.labels(s.name).set(1 if state == S.STATE_READY else 0)
        self.on_change()

    def status(self, s: Slot) -> status_pb2.CheckpointStatus:
        st = S.CheckpointStatus(name=s.name, state=s.state, detail=s.detail, source=s.source, backend=self.backend,
                                load_ms=s.load_ms, warmup_ms=s.warmup_ms, last_used_unix=s.last_used,
                                device_requested=self.pick.requested, device_fallback=self.pick.fallback,
                                tokenizer_fingerprint=s.fingerprint)
        if s.ckpt is not None:
            st.revision = s.ckpt.revision or "local"
            st.sha256, st.config_json = s.sha256, s.config_json
            s.temperatures.to_proto(st.temperatures)
            st.max_len, st.head_max_len = int(s.ckpt.max_len), int(s.ckpt.head_max_len)
        runner = s.runner
        if runner is not None:   # live facts, read from the weights now
            st.device, st.dtype, st.kernels = runner.device(), runner.dtype(), runner.kernels
            st.row_layout = "packed" if getattr(runner, "packing", None) is not None else "padded"
            st.max_row_tokens = runner.max_positions if runner.max_positions < (1 << 30) else 0
        return st


def _digests(ckpt) -> tuple:
    """Off the event loop: the weights' sha256 (1-3 s for 842 MB; hashlib drops the GIL) and the
    tokenizer fingerprint, computed once per load rather than on a status read."""
    return ckpt.sha256, file_sha256(os.path.join(ckpt.path, "tokenizer", "tokenizer.json"))


def warmup_shapes(max_len: int) -> list[tuple[int, int, int]]:
    """(rows, tokens, markers): a short question, several questions, a long state, a small batch."""
    return [(1, min(64, max_len), 3), (6, min(128, max_len), 4), (1, max_len, 5), (16, min(128, max_len), 2)]


def synthetic_rows(rows: int, tokens: int, markers: int, vocab: int, seed: int = 0) -> PackedRows:
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, max(6, vocab), size=rows * tokens, dtype=np.int32)
    mk = np.tile(np.arange(1, markers + 1, dtype=np.int32) * 2, rows)
    return PackedRows(ids=ids, row_offsets=np.arange(rows + 1, dtype=np.int32) * tokens, markers=mk,
                      marker_offsets=np.arange(rows + 1, dtype=np.int32) * markers,
                      qtypes=np.arange(rows, dtype=np.int32) % 3)


def warm_runner(runner, ckpt, pad_id: int) -> None:
    """Before a checkpoint serves: its CUDA graphs captured, then forwards of a few request shapes
    (first-use costs paid here, not by the first request)."""
    warm = getattr(runner, "warm", None)   # TorchRunner on CUDA: capture every bucket's graph now
    if warm is not None:
        warm()
    for i in range(len(warmup_shapes(int(ckpt.max_len)))):
        shape_forward(runner, ckpt, pad_id, i)
    memory.freeze_warm_heap()   # later full collections skip the modules and this checkpoint


def shape_forward(runner, ckpt, pad_id: int, i: int = 0) -> None:
    """One forward of warm-up shape i (0: a short question), on the device thread; also the health
    probe's forward (inference/outcomes.py)."""
    r, t, m = warmup_shapes(int(ckpt.max_len))[i]
    rows = synthetic_rows(r, t, m, runner.vocab_size, seed=i)
    if getattr(ckpt, "option_layout", "sequential") == "parallel":
        rows.position_ids = np.tile(np.arange(t, dtype=np.int32), r)
        rows.option_ids = np.zeros_like(rows.ids)
    runner.run_rows(rows, pad_id, pad_to=-(-t // 8) * 8)
