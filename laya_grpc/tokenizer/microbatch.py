"""Concurrent Tokenize requests share one `encode_batch` call.

No wait timer: the first request starts a batch at once; requests that arrive while it runs
queue up and all go in the next one (one call to the tokenizers library is cheaper than many:
it parallelises across texts inside Rust, and per-call overhead is paid once).
"""
from __future__ import annotations

import asyncio
from concurrent.futures import Executor
from typing import Optional

from laya_grpc.core.runtime import metrics
from laya_grpc.core.wire.question_wire import StateText

from .encoding import EncodeJob, TextEncoder


# Below this much text a batch is encoded on the event loop (tens of microseconds) instead of
# paying a thread hop (~0.1 ms); above it the loop stays free for other requests.
INLINE_CHARS = 8192


def _chars(job: EncodeJob) -> int:
    return sum(len(s.text) if isinstance(s, StateText) else len(s) if isinstance(s, str) else 256 for s in job.states)


class MicroBatcher:
    def __init__(self, encoder: TextEncoder, pool: Executor, max_jobs: int = 64):
        self.encoder, self.pool, self.max_jobs = encoder, pool, max_jobs
        self._pending: list[tuple[EncodeJob, asyncio.Future]] = []
        self._running: Optional[asyncio.Task] = None
        self.batches = 0

    async def encode(self, job: EncodeJob):
        fut = asyncio.get_running_loop().create_future()
        self._pending.append((job, fut))
        if self._running is None or self._running.done():
            self._running = asyncio.ensure_future(self._drain())
        out = await fut
        if isinstance(out, BaseException):
            raise out
        return out

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending:
            batch, self._pending = self._pending[: self.max_jobs], self._pending[self.max_jobs:]
            batch = [(j, fut) for j, fut in batch if not fut.cancelled()]   # their callers are gone
            if not batch:
                continue
            jobs = [j for j, _ in batch]
            try:
                if sum(_chars(j) for j in jobs) <= INLINE_CHARS:
                    results = self.encoder.encode_jobs(jobs)   # cheaper than a thread hop
                else:
                    results = await loop.run_in_executor(self.pool, self.encoder.encode_jobs, jobs)
            except Exception as e:  # noqa: BLE001 - a bug in one batch fails its own requests only
                results = [e] * len(batch)
            self.batches += 1
            metrics.TOKENIZE_JOBS.observe(len(batch))
            for (_, fut), res in zip(batch, results):
                if not fut.done():
                    fut.set_result(res)
