"""Cross-request dynamic batching on one device thread.

Requests that arrive while the device is busy share the next forward pass: the thread takes
queued jobs (same checkpoint, FIFO) until a padded-token budget or a row cap is reached, pads
once, runs, and hands each job its slice. There is no wait timer by default (TEI's policy: the
next batch forms as soon as the device frees); `max_wait_ms` adds a short one for bursty loads.
The budget counts tokens as the runner will really run them (packed: the real tokens rounded to a
token bucket; padded: rows x longest, rounded to its CUDA graph buckets), so a batch never lands in
a shape that was not captured during warmup.

Fairness (turns, inference/turns.py): a forward never holds more than the token budget, and once a
checkpoint's forwards have been seen to take long (at least half a turn), no more than about one
turn of work at the speed those forwards showed (beyond a forward's fixed cost, which no cut
saves: DeviceSpeed). A request larger than that runs one part per
forward: its first rows, then the rest goes back to the end of the queue, behind the requests
that arrived meanwhile. So a small request arriving behind any number of large ones waits about
one turn, and the rows of a request whose client went away (it is dropped from the queue when
cancelled) stop costing device time within about one turn: a running forward cannot be stopped.
Short forwards teach nothing: a GPU at ordinary load never reaches the cap, and its speed per token
at small batches (where a forward's fixed cost dominates) would underrate large ones and shrink
every later forward further. This is the one place where a request's rows are cut
by device time; the gateway forwards them whole.
All framework work stays on this thread (MLX requires it; torch releases the GIL in kernels),
with one exception: the inline turn.

Inline turn: a short batch that finds the device idle, and idle for at least INLINE_IDLE_S,
runs on the event loop's own thread, in the loop turn after the request's call (so every call
that arrived in the same read still joins it), when its runner says its forwards may
(`forwards_inline`: captured CUDA graphs, a few milliseconds a short batch) and its cost is at
most INLINE_MAX_COST tokens. Why: the hand-off to the device thread and back are two thread
wake-ups, each also waiting for the GIL; on the H200 host they took ~0.12 and ~0.18 ms of a ~4 ms
request. The loop is blocked for that forward. That costs nothing to a request that comes alone,
but under a stream of requests the loop would stop reading and preparing the next ones while the
device works (on the H200, 8 clients lost 13-20% of their throughput), so a device that ended a
forward less than INLINE_IDLE_S ago means a stream, and the device thread takes the batch. Larger
batches, loads and anything queued while the device thread works stay on the device thread, and
the two never run at once.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from laya_grpc.core.runtime import metrics, request_id
from laya_grpc.core.errors import Kind, LayaError
from laya_grpc.core.wire.packed_rows import PackedRows
from .turns import TURN_MS, DeviceSpeed

from .faults import FAULTS

log = logging.getLogger("laya_grpc.inference.batcher")
# the largest batch (in runner cost tokens) an inline turn runs: a few short requests; on an H200 a
# forward of this size takes ~1.3-2.5 ms, which the event loop then waits out
INLINE_MAX_COST = 1024
# how long the device must have been idle for a batch to run inline: requests one at a time leave
# gaps of the rest of their path (~2 ms on the H200 host), a stream of them leaves well under 1 ms
INLINE_IDLE_S = 0.001


@dataclass
class BatchResult:
    logits: list[np.ndarray]        # per row float32 [k]
    act_logits: np.ndarray          # [n_rows, n_act]
    queue_ms: float
    model_ms: float
    batch_rows: int


@dataclass
class _Job:
    """Rows of one request, to be batched with others of the same checkpoint; a large one runs in
    parts (`done` rows so far, their outputs in `logits`/`acts`)."""
    checkpoint: str
    rows: PackedRows
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    enqueued: float = field(default_factory=time.perf_counter)
    request_id: str = field(default_factory=request_id.current_id)   # the submitting call's (log lines)
    done: int = 0
    logits: list = field(default_factory=list)
    acts: list = field(default_factory=list)
    started: float = 0.0
    model_ms: float = 0.0
    batch_rows: int = 0

    @property
    def left(self) -> PackedRows:
        return self.rows if self.done == 0 else self.rows.take(range(self.done, self.rows.n))


@dataclass
class _Call:
    """Other device-thread work (load, warm up, evict), run in queue order between batches."""
    fn: Callable[[], object]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future


class Batcher:
    def __init__(self, get_runner: Callable[[str], object], pad_id_of: Callable[[str], int], *,
                 max_batch_tokens: int = 16384, max_batch_rows: int = 256, max_wait_ms: float = 0.0,
                 length_multiple: int = 8):
        self._get_runner = get_runner
        self._pad_id_of = pad_id_of
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_rows = max_batch_rows
        self.max_wait_s = max_wait_ms / 1e3
        self.length_multiple = max(1, length_multiple)
        self._queue: collections.deque = collections.deque()   # _Job | _Call
        self._cv = threading.Condition()
        self._stop = False
        self._device_busy = False   # the device thread is running a unit of work
        self._inline = False        # an inline turn is scheduled or running (the device thread waits)
        self._idle_since = 0.0      # perf_counter when the last forward ended
        self._thread = threading.Thread(target=self._loop, name="laya-device", daemon=True)
        self._speed = DeviceSpeed()   # a forward's fixed ms and ms per cost token, from long forwards only

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        """Queued work fails at once (BUSY: retry elsewhere or later), and so does a request running
        in parts when its forward ends (it gets no further part). The wait is
        short so that the process exits within its supervisor's grace period (5 s) even if one
        forward is long: the device thread is a daemon and dies with the process."""
        with self._cv:
            self._stop = True
            queued = list(self._queue)
            self._queue.clear()
            self._cv.notify_all()
        err = LayaError(Kind.BUSY, "inference service is shutting down")
        for job in queued:
            job.loop.call_soon_threadsafe(_set_exception, job.future, err)
        self._thread.join(timeout=timeout_s)

    @property
    def depth(self) -> int:
        return sum(j.rows.n - j.done for j in list(self._queue) if isinstance(j, _Job))

    def run_on_device(self, fn: Callable[[], object]) -> "asyncio.Future":
        """Run `fn` on the device thread (loading, warmup, eviction), in queue order."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        with self._cv:
            self._queue.append(_Call(fn, loop, fut))
            self._cv.notify()
        return fut

    async def submit(self, checkpoint: str, rows: PackedRows) -> BatchResult:
        loop = asyncio.get_running_loop()
        job = _Job(checkpoint, rows, loop, loop.create_future())
        with self._cv:
            if self._stop:
                raise LayaError(Kind.BUSY, "inference service is shutting down")
            self._queue.append(job)
            if (not self._inline and not self._device_busy and len(self._queue) == 1
                    and job.enqueued - self._idle_since >= INLINE_IDLE_S and self._may_inline(job)):
                self._inline = True
                loop.call_soon(self._inline_turn)
            elif not self._inline:
                self._cv.notify()
        try:
            return await job.future
        except asyncio.CancelledError:
            job.future.cancel()  # the device thread skips cancelled jobs
            raise

    # -- device thread --------------------------------------------------------------------
    def _cost(self, checkpoint: str) -> Callable[[int, int, int], int]:
        """cost(rows, longest row, total tokens): the tokens a batch really costs on the runner."""
        try:
            runner = self._get_runner(checkpoint)
        except LayaError:
            return lambda rows, longest, total: rows * longest   # not loaded: the forward reports why
        return getattr(runner, "batch_cost", lambda rows, longest, total: rows * longest)

    def turn_cost(self, checkpoint: str) -> int | None:
        """The cost (tokens as the runner runs them) of about one turn's work beyond a forward's
        fixed cost, once long forwards of this checkpoint showed its speed; None before, and while
        they show no time growing with their work."""
        cost = self._speed.units_in(checkpoint, TURN_MS)
        return None if cost is None else max(1, int(cost))

    def _learn(self, checkpoint: str, cost: int, model_ms: float) -> None:
        if model_ms >= TURN_MS / 2 and cost > 0:
            self._speed.observe(checkpoint, model_ms, cost)

    def _may_inline(self, job: _Job) -> bool:
        try:
            runner = self._get_runner(job.checkpoint)
        except LayaError:
            return False
        if not getattr(runner, "forwards_inline", False):
            return False
        return self._cost(job.checkpoint)(job.rows.n, int(job.rows.lengths.max()), len(job.rows.ids)) <= INLINE_MAX_COST

    def _inline_turn(self) -> None:
        """On the event loop's thread: the queued short jobs as one forward, if the device thread
        is still idle and they fit INLINE_MAX_COST; whatever is left goes to the device thread."""
        jobs = []
        try:
            with self._cv:
                if self._queue and not self._device_busy and not self._stop and isinstance(self._queue[0], _Job):
                    jobs = [p for p in self._merge(self._queue.popleft(), INLINE_MAX_COST) if not p[0].future.cancelled()]
            if jobs:
                self._run_batch(jobs)
        finally:
            with self._cv:
                self._inline = False
                if self._queue:
                    self._cv.notify()

    def _take(self):
        """The next unit of work: [_Call], a list of _Job for one forward, or [] to stop."""
        with self._cv:
            while (not self._queue or self._inline) and not self._stop:
                self._cv.wait()
            if self._stop:
                return []
            self._device_busy = True
            first = self._queue.popleft()
            if isinstance(first, _Call):
                return [first]
            if self.max_wait_s > 0 and len(self._queue) == 0:
                self._cv.wait(timeout=self.max_wait_s)
            return self._merge(first, self.max_batch_tokens)

    def _merge(self, first: _Job, max_cost: int) -> list:
        """(job, rows) parts for one forward of at most `max_cost` (and about one turn): the rows of
        `first` that fit (all of them, or its next rows: at least one), then the queued jobs of its
        checkpoint that fit whole, in queue order; the others stay queued. Under the lock. Cancelled
        jobs behind `first` leave the queue here; `first` itself is always returned (an empty list
        is `_take`'s stop signal), so the callers drop it if its caller has gone."""
        cost = self._cost(first.checkpoint)
        budget, turn = max_cost, self.turn_cost(first.checkpoint)
        if turn is not None:   # about one turn; a quarter turn more lets small rows ride along
            budget = min(budget, turn + turn // 4)
        rows = first.left
        lengths = rows.lengths.tolist()
        n, longest, total = 1, lengths[0], lengths[0]
        while (n < len(lengths) and n < self.max_batch_rows
               and cost(n + 1, max(longest, lengths[n]), total + lengths[n]) <= budget):
            longest, total = max(longest, lengths[n]), total + lengths[n]
            n += 1
        if n < len(lengths):   # a part of a large request: nothing else rides along
            return [(first, rows.take(range(n)))]
        jobs = [(first, rows)]
        n = rows.n
        keep = collections.deque()
        while self._queue:
            j = self._queue.popleft()
            if isinstance(j, _Call) or j.checkpoint != first.checkpoint:
                keep.append(j)
                continue
            if j.future.cancelled():
                continue
            jr = j.left
            cand_longest = max(longest, int(jr.lengths.max()))
            if n + jr.n > self.max_batch_rows or cost(n + jr.n, cand_longest, total + len(jr.ids)) > budget:
                keep.append(j)
                keep.extend(self._queue)
                self._queue.clear()
                break
            jobs.append((j, jr))
            n += jr.n
            longest, total = cand_longest, total + len(jr.ids)
        keep.extend(self._queue)
        self._queue.clear()
        self._queue.extend(keep)
        return jobs

    def _loop(self) -> None:
        while True:
            jobs = self._take()
            if not jobs:
                return
            try:
                if isinstance(jobs[0], _Call):
                    self._run_call(jobs[0])
                    continue
                jobs = [p for p in jobs if not p[0].future.cancelled()]
                if jobs:
                    self._run_batch(jobs)
            finally:
                with self._cv:
                    self._device_busy = False

    def _run_call(self, job: _Call) -> None:
        try:
            out = job.fn()
            job.loop.call_soon_threadsafe(_set_result, job.future, out)
        except BaseException as e:  # noqa: BLE001 - delivered to the awaiting coroutine
            job.loop.call_soon_threadsafe(_set_exception, job.future, e)

    def _forward(self, checkpoint: str, rows: PackedRows) -> tuple[list, np.ndarray]:
        """Per-row logits (float32 [k]) and act logits for `rows`, in one forward (`_merge` kept it
        within the token budget, so it lands in a shape the warmup prepared)."""
        counts = rows.marker_counts
        L = -(-int(rows.lengths.max()) // self.length_multiple) * self.length_multiple
        FAULTS.check()   # no-op unless a test set LAYA_TEST_FAULTS (inference/faults.py)
        lg, ac = self._get_runner(checkpoint).run_rows(rows, self._pad_id_of(checkpoint), pad_to=L)
        return ([lg[i, : int(counts[i])].astype(np.float32, copy=True) for i in range(rows.n)],
                ac[: rows.n].astype(np.float32, copy=True))

    def _run_batch(self, parts: list) -> None:
        """One forward of `parts` ((job, rows) from `_merge`); each job whose rows are all done gets
        its result, a job with rows left goes back to the end of the queue."""
        FAULTS.delay()   # no-op unless a test set LAYA_TEST_FAULTS; outside the forward's timing
        start = time.perf_counter()
        checkpoint = parts[0][0].checkpoint
        try:
            rows = parts[0][1] if len(parts) == 1 else PackedRows.concat([r for _, r in parts])
            logits, act = self._forward(checkpoint, rows)
        except BaseException as e:  # noqa: BLE001
            err = e if isinstance(e, LayaError) else LayaError(Kind.INTERNAL, "forward failed: %s: %s" % (type(e).__name__, e))
            if not isinstance(e, LayaError):
                log.exception("forward failed", extra={"request_id": ",".join(j.request_id for j, _ in parts if j.request_id)})
            for j, _ in parts:
                j.loop.call_soon_threadsafe(_set_exception, j.future, err)
            self._idle_since = time.perf_counter()
            return
        self._idle_since = end = time.perf_counter()
        model_ms = (end - start) * 1e3
        at, again = 0, []
        for j, r in parts:
            if j.done == 0:
                j.started = start
            j.logits += logits[at: at + r.n]
            j.acts.append(act[at: at + r.n])
            j.done += r.n
            j.model_ms += model_ms
            j.batch_rows = max(j.batch_rows, rows.n)
            at += r.n
            if j.done < j.rows.n:
                again.append(j)
                continue
            res = BatchResult(logits=j.logits, act_logits=j.acts[0] if len(j.acts) == 1 else np.concatenate(j.acts),
                              queue_ms=(j.started - j.enqueued) * 1e3, model_ms=j.model_ms, batch_rows=j.batch_rows)
            j.loop.call_soon_threadsafe(_set_result, j.future, res)
        if again:
            self._requeue(again)
        # bookkeeping after the waiters are woken, off their path
        self._learn(checkpoint, self._cost(checkpoint)(rows.n, int(rows.lengths.max()), len(rows.ids)), model_ms)
        metrics.FORWARD_SECONDS.labels(checkpoint).observe(model_ms / 1e3)
        metrics.BATCH_ROWS.observe(rows.n)
        metrics.QUEUE_DEPTH.set(self.depth)

    def _requeue(self, jobs: list) -> None:
        """Jobs with rows left go behind everything queued meanwhile (dropped if their caller has
        gone; failed if the service is stopping)."""
        with self._cv:
            stopping = self._stop
            if not stopping:
                self._queue.extend(j for j in jobs if not j.future.cancelled())
                self._cv.notify()
        if stopping:
            err = LayaError(Kind.BUSY, "inference service is shutting down")
            for j in jobs:
                j.loop.call_soon_threadsafe(_set_exception, j.future, err)


def _set_result(fut: asyncio.Future, value) -> None:
    if not fut.done():
        fut.set_result(value)


def _set_exception(fut: asyncio.Future, exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)
