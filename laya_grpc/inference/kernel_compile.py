"""Compile every Triton kernel a warm-up will launch side by side, before the warm-up launches them.

Why: a forward compiles each Triton kernel variant the first time it reaches it, one after another.
On an empty kernel cache that was about 7 s of the 16 s an H200 took from process start to ready
(`docs/performance.md`, Start-up). Triton's compiler spends most of a compile outside the GIL (MLIR
and LLVM passes, ptxas, the C compiler that builds a launcher), so the variants compile on a thread
pool in about the time of the slowest one.

How (`ahead`): each warm-up step runs once as a dry pass, with Triton's `jit_cache_hook` set. The
hook sees every kernel variant this process has not loaded yet, hands it to Triton's asynchronous
compile mode (`preload` of its specialization, which takes the same path as a launch's compile),
and tells Triton to skip that launch. Until the dry passes end, the variant's entry in its
function's kernel cache is a stand-in that launches nothing, so its later launches skip cheaply:
the hook's own arguments cost ~0.1 ms a call, which over every launch of 36 buckets cost more than
the compiles saved on a filled cache. Leaving the compile mode puts each compiled kernel in place of
its stand-in; a stand-in still there afterwards (a failed compile) is removed, so a later launch
compiles again rather than doing nothing. The torch operations of a dry pass still run, on whatever
the skipped kernels left in their outputs (in every pass after the first, the GEMMs launch nothing
either: cuda_graphs.warm_graphs): nothing reads those results, and no index a dry pass uses comes
from a Triton kernel or a GEMM. Each pool thread also loads its kernel onto the device and builds
its launcher, so the passes after `ahead` compile and load nothing. A variant already in the disk
cache is read, not compiled, also on the pool. A compile error is raised by `ahead`, as it would
be by the launch.

The dry passes run on the stream the graphs are captured on, so what torch sets up per stream (the
cuBLAS workspace) is in place before the capture.

Triton's first kernel lookup in a process also hashes Triton itself: its compiler's sources and
its ~400 MB `libtriton.so` (`triton.runtime.cache.triton_key`, the first part of every kernel's
cache key), 0.35 s on an H100 host, with a filled cache as with an empty one. `hash_library_ahead`
starts that hash on a thread before the checkpoint load, which it overlaps (file reads and SHA-256
release the GIL); `ahead` waits for it before its first dry pass.
"""
from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Callable, Iterable

from laya_grpc.core.runtime import cpu_quota

log = logging.getLogger("laya_grpc.inference.kernel_compile")


class _LoadingPool(Executor):
    """An executor whose tasks also load the compiled kernel onto `device` and build its launcher
    (Triton does both lazily at a kernel's first launch: `CompiledKernel._init_handles`)."""

    def __init__(self, device, workers: int):
        self._device, self._pool = device, ThreadPoolExecutor(workers, thread_name_prefix="kernel-compile")

    def submit(self, fn, /, *args, **kwargs) -> Future:
        def compile_and_load():
            import torch
            with torch.cuda.device(self._device):   # Triton loads onto the thread's current device
                kernel = fn(*args, **kwargs)
                kernel._init_handles()
            return kernel
        return self._pool.submit(compile_and_load)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._pool.shutdown(wait=wait, cancel_futures=cancel_futures)


class _NoLaunch:
    """The kernel-cache stand-in of a variant compiling on the pool: Triton's launch path asks it for
    `result()`, `launch_metadata` and `run`, and nothing is launched."""
    function = packed_metadata = None

    def result(self):
        return self

    def launch_metadata(self, *args):
        return None

    def run(self, *args):
        return None


_NO_LAUNCH = _NoLaunch()
_library_hash: list = []   # the thread hashing Triton's library, once per process


def hash_library_ahead() -> None:
    """Start hashing Triton's library for its kernel cache key on a thread (module docstring); the
    first call only. Where this Triton has no `triton_key`, nothing starts and the first lookup
    hashes whatever its version hashes, as before."""
    if _library_hash:
        return
    try:
        from triton.runtime.cache import triton_key
    except ImportError as e:
        log.debug("Triton's library key is not hashed ahead: %s", e)
        return

    def run():
        try:
            triton_key()   # lru_cache'd: the lookups after it read the stored value
        except Exception as e:   # the first lookup computes it again and raises this itself
            log.debug("hashing Triton's library ahead failed: %s", e)

    thread = threading.Thread(target=run, name="triton-library-hash", daemon=True)
    _library_hash.append(thread)
    thread.start()


def _wait_library_hash() -> float:
    """Seconds spent waiting for `hash_library_ahead`'s thread (0 when none was started)."""
    t0 = time.perf_counter()
    for thread in _library_hash:
        thread.join()
    return time.perf_counter() - t0


def ahead(steps: Iterable[Callable[[], None]], device) -> int:
    """Run each step as a dry pass that compiles, loads and skips every Triton kernel variant it
    reaches (see the module docstring); returns the variants compiled or read. On the device thread,
    with the same device current as the real passes after it."""
    from triton import knobs
    from triton.runtime._async_compile import AsyncCompileMode

    if knobs.runtime.jit_cache_hook is not None:
        raise RuntimeError("Triton's jit_cache_hook is already set; kernels cannot compile ahead")
    seen: set = set()
    stand_ins = []   # (function's kernel cache, key) of every stand-in placed
    inside = []      # a preload's own compile calls the hook again: let it through

    def hook(*, key, fn, compile, **_):
        if inside:
            return False
        jit = fn.jit_function
        variant = (jit, key)   # the key is one function's: two kernels may share one
        if variant not in seen:
            seen.add(variant)
            inside.append(variant)
            try:
                jit.preload(compile["specialization_data"])
            finally:
                inside.pop()
            cache = jit.device_caches[compile["device"]][0]
            if key not in cache:
                cache[key] = _NO_LAUNCH
                stand_ins.append((cache, key))
        return True   # no launch: the variant is compiling on the pool

    waited = _wait_library_hash()
    t0 = time.perf_counter()
    pool = _LoadingPool(device, cpu_quota.pool_size(16))
    try:
        with AsyncCompileMode(pool):
            knobs.runtime.jit_cache_hook = hook
            try:
                for step in steps:
                    step()
            finally:
                knobs.runtime.jit_cache_hook = None
            t1 = time.perf_counter()
        # leaving the mode waited for every compile and put each kernel in place of its stand-in
    finally:
        for cache, key in stand_ins:
            if cache.get(key) is _NO_LAUNCH:
                del cache[key]
        pool.shutdown()
    if seen:
        log.info("compiled or read %d kernel variants side by side in %.0f ms (dry passes %.0f ms; waited %.0f ms "
                 "for Triton's library hash)", len(seen), (time.perf_counter() - t0) * 1e3, (t1 - t0) * 1e3, waited * 1e3)
    return len(seen)
