"""Hand heap that large calls freed back to the OS, once a service is idle (glibc `malloc_trim`).

Why: glibc's malloc keeps what a call frees. Freed chunks stay in their arena (one per thread
that allocated: the tokenizer's encode threads, torch's CPU threads), and after a large block is
freed its mmap threshold rises (up to 32 MiB), so the next large blocks come from the heap too
and stay there once freed. A process that served one 2 MiB batch keeps its high-water mark: the
tokenizer went from 67 to 113 MB RSS after ten of them and stayed there while idle; the same
process after `malloc_trim(0)` was back at 72 MB (`python -m benchmarks.hostile --stages fuzz`,
docs/hostile-input.md). Nothing leaks; the memory is just never returned.

`malloc_trim(0)` returns the free pages of every arena (also from the middle of a heap). It is
glibc's: elsewhere (macOS, where MLX and MPS run; musl) the symbol is missing and trimming is a
no-op, said once in the debug log. The torch CUDA caching allocator holds device memory and is
untouched here (its cache is what makes the next forward cheap).

`IdleTrim` decides when: after a service's calls added up to `threshold` units of work (bytes of
text, tokens) and then none was in flight for `idle_s`. A busy service never trims (its idle
timer is pushed back at every call's end, and a call in flight when it fires skips the trim),
small calls never cause a trim, and the trim runs on a worker thread of the service (it holds the
allocator's arena locks while it walks them: 1-3 ms after a 2 MiB batch), never on the event loop.
"""
from __future__ import annotations

import asyncio
import contextvars
import ctypes
import gc
import logging
import os
import time
from typing import Awaitable, Callable, Optional

log = logging.getLogger("laya_grpc.core.runtime.memory")

IDLE_S = 0.25   # no call in flight for this long: idle (a steady stream of calls keeps pushing it back)

_UNRESOLVED = object()
_malloc_trim = _UNRESOLVED


def _lookup():
    """glibc's `malloc_trim`, or None where the C library has none."""
    try:
        fn = ctypes.CDLL(None).malloc_trim   # the C library this process already runs on
    except (OSError, AttributeError, TypeError) as e:   # TypeError: no CDLL(None) (Windows)
        log.debug("no malloc_trim in this C library (%s): freed heap stays with the allocator", e)
        return None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return fn


def trim_available() -> bool:
    global _malloc_trim
    if _malloc_trim is _UNRESOLVED:
        _malloc_trim = _lookup()
    return _malloc_trim is not None


def trim_heap() -> bool:
    """Return the allocator's free pages to the OS; False where that is not possible (no glibc,
    or nothing to return). Blocks for as long as it walks the heap: call it off the event loop."""
    if not trim_available():
        return False
    return bool(_malloc_trim(0))


def freeze_warm_heap() -> None:
    """When a service is warm (the inference service: after each checkpoint's warm-up): collect,
    then move every object alive into the garbage collector's permanent generation (`gc.freeze`),
    so that later full collections scan only what serving allocated since. Without it a full
    collection walks the whole heap of modules and weights: in the inference service, with torch
    loaded, 90-306 ms on a loaded 2-core host, growing with every collection, with the GIL held
    (the event loop and the device thread stop), at whatever request set it off. Frozen objects
    are still freed when their last reference goes (an evicted checkpoint's tensors); only
    reference cycles among them would stay."""
    t0 = time.perf_counter()
    gc.collect()
    gc.freeze()
    log.info("start-up heap frozen: %d objects kept out of later collections (%.0f ms)", gc.get_freeze_count(),
             (time.perf_counter() - t0) * 1e3)


def rss_bytes(pid: Optional[int] = None) -> Optional[int]:
    """The resident set size of this process or of `pid` (Linux /proc), None elsewhere."""
    try:
        with open("/proc/%s/statm" % (pid or "self"), "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _trim_and_measure() -> tuple:
    before, t0 = rss_bytes(), time.perf_counter()
    released = trim_heap()
    return released, before, rss_bytes(), time.perf_counter() - t0


class IdleTrim:
    """Trims the heap once a service goes idle after large work.

    The service tells it about its calls: `add(work)` while a call runs (its size, in the unit of
    `threshold`), `ended()` after the call left the service's own in-flight count. `inflight()`
    reads that count; `run(fn)` runs `fn` on the service's worker thread and returns an awaitable
    (the tokenizer's encode pool, the inference device thread). All methods run on the event loop.
    """

    def __init__(self, inflight: Callable[[], int], run: Callable[[Callable], Awaitable], threshold: int,
                 counter=None, idle_s: float = IDLE_S):
        self.inflight, self.run, self.counter = inflight, run, counter
        self.threshold, self.idle_s = threshold, idle_s
        self.enabled = trim_available()
        self.work = 0    # since the last trim
        self._timer: Optional[asyncio.TimerHandle] = None
        self._task: Optional[asyncio.Future] = None

    def add(self, work: int) -> None:
        self.work += work

    def ended(self) -> None:
        """A call ended: (re)arm the idle timer when nothing else is in flight and enough work
        piled up since the last trim."""
        if not self.enabled or self.work < self.threshold or self.inflight() > 0:
            return
        if self._timer is not None:
            self._timer.cancel()
        # an empty context: the trim is no call's work (its log line carries no request id)
        self._timer = asyncio.get_running_loop().call_later(self.idle_s, self._idle, context=contextvars.Context())

    def _idle(self) -> None:
        self._timer = None
        if self.inflight() > 0 or (self._task is not None and not self._task.done()):
            return   # busy again: the call in flight re-arms the timer when it ends
        self.work = 0
        self._task = asyncio.ensure_future(self._trim())

    async def _trim(self) -> None:
        try:
            released, before, after, took = await self.run(_trim_and_measure)
        except Exception as e:  # noqa: BLE001 - e.g. the worker thread is shutting down: nothing to give back then
            log.debug("heap trim skipped: %s", e)
            return
        if self.counter is not None:
            self.counter.inc()
        if before is not None and after is not None:
            log.debug("heap trimmed after large work: RSS %.1f -> %.1f MB in %.1f ms%s", before / 2**20,
                      after / 2**20, took * 1e3, "" if released else " (nothing to return)")

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class GrowthTrim:
    """Trims the heap while RSS stays `growth_bytes` above its low-water mark, checked on the
    event loop (one read of /proc/self/statm). For memory that no call accounts for: the
    gateway's connections (a flood of 20,000 silent connections left the gateway at 140-157 MB
    from 72 MB: heap freed when they closed, but kept by the allocator). A trim that returns
    little (the memory is still in use) doubles the wait before the next one, up to
    `max_period_s`, so a process that keeps its memory in use trims at most that often; the trim
    runs on `run`'s thread, never on the event loop."""

    def __init__(self, run: Callable[[Callable], Awaitable], growth_bytes: int = 16 << 20,
                 period_s: float = 5.0, max_period_s: float = 60.0, counter=None):
        self.run, self.growth_bytes, self.counter = run, growth_bytes, counter
        self.period_s, self.max_period_s = period_s, max_period_s
        self._task: Optional[asyncio.Task] = None

    def start(self) -> None:
        if trim_available() and rss_bytes() is not None:
            self._task = asyncio.ensure_future(self._watch())

    async def _watch(self) -> None:
        low = rss_bytes() or 0
        wait = self.period_s
        while True:
            await asyncio.sleep(wait)
            now = rss_bytes() or 0
            if now - low < self.growth_bytes:
                low, wait = min(low, now), self.period_s
                continue
            try:
                released, before, after, took = await self.run(_trim_and_measure)
            except Exception as e:  # noqa: BLE001 - e.g. the executor is shutting down
                log.debug("heap trim skipped: %s", e)
                continue
            if self.counter is not None:
                self.counter.inc()
            after = after if after is not None else now
            returned = (before or now) - after
            wait = self.period_s if returned >= self.growth_bytes // 4 else min(self.max_period_s, wait * 2)
            low = min(low, after)
            log.debug("heap trimmed after RSS growth: %.1f -> %.1f MB in %.1f ms (next check in %.0f s)",
                      (before or now) / 2**20, after / 2**20, took * 1e3, wait)

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
