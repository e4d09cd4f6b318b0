"""`laya-grpc warm-kernels`: compile the GPU kernels the inference service will run, into
--kernel-cache-dir, ahead of time (an image build on a GPU builder, a Job before a rollout).

Each checkpoint is loaded on the device and warmed exactly as the inference service warms it
before it reports ready (inference/registry.py: CUDA graphs captured, forwards of the warm-up
shapes), with the same settings (--dtype, --cuda-kernels, --pack-rows, the batch limits and their
LAYA_* variables), so the kernels it compiles are the ones a service started with those settings
looks up. Kernels depend on the checkpoint's shapes, not its weights: a random-weight checkpoint
of the same preset (`laya-grpc make-checkpoint DIR --preset large`) fills the cache for the real
ones. On a CPU nothing is compiled: the warm-up runs and the cache stays as it was (the command
says so). Exit status: 0 warmed, 1 a checkpoint failed to load or warm, 2 a usage problem or a
checkpoint that is not there, 3 a required device that is not available.
"""
from __future__ import annotations

import argparse
import asyncio
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from laya_grpc.core.runtime import flags, logs
from laya_grpc.core.errors import Kind, LayaError
from laya_grpc.core.runtime.settings import CheckpointSettings
from laya_grpc.inference import kernel_cache
from laya_grpc.inference.settings import RunnerSettings

PROG = "laya-grpc warm-kernels"


@dataclass
class WarmKernelsSettings(RunnerSettings, CheckpointSettings):
    """The checkpoints to warm and the settings they are served with (the inference service's
    variables, so a container warms what it will serve)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    flags.add_settings(p, WarmKernelsSettings)


def run(args: argparse.Namespace) -> int:
    settings: WarmKernelsSettings = args.settings
    logs.setup("warm-kernels", level="WARNING")   # progress goes to stdout; problems to stderr
    kernel_cache.use(settings.kernel_cache_dir)    # before torch loads, let alone compiles a kernel
    try:
        sources = settings.checkpoint_sources()
        _check_sources(sources)
        from laya_grpc.inference.devices import pick_device
        device, required = settings.device_choice()
        pick = pick_device(device, settings.backend, required)
    except LayaError as e:
        print("%s: %s" % (PROG, e.detail), file=sys.stderr)
        return 3 if e.kind is Kind.DEVICE else 2
    return asyncio.run(_warm(settings, pick, sources))


def _check_sources(sources: dict) -> None:
    """Every checkpoint opens (files present, config valid) before any is loaded: a typo fails in a
    second, not after minutes of warming the others."""
    from laya_grpc.core.checkpoints.sources import open_source
    for name, source in sources.items():
        try:
            open_source(source)
        except LayaError as e:
            raise LayaError(Kind.INVALID, "checkpoint %s=%s: %s" % (name, source, e.detail)) from None
        except OSError as e:
            raise LayaError(Kind.INVALID, "checkpoint %s=%s: %s" % (name, source, e)) from None


async def _warm(settings: WarmKernelsSettings, pick, sources: dict) -> int:
    from laya_grpc.inference.devices import init_device
    from laya_grpc.inference.registry import Registry
    t0 = time.perf_counter()
    cache = kernel_cache.triton_dir()
    before = kernel_cache.contents(cache)
    compiles = str(pick.device).startswith("cuda")
    print("%s: device %s (%s), Triton cache %s: %d kernels before" % (
        PROG, pick.device, settings.backend, cache or "none (Triton is not installed)", before.kernels), flush=True)
    device = ThreadPoolExecutor(1, thread_name_prefix="device")   # one thread owns the device, as in the service
    loop = asyncio.get_running_loop()
    on_device = lambda fn: loop.run_in_executor(device, fn)
    # max_loaded=1: each checkpoint is evicted (its memory freed) when the next one loads
    registry = Registry(sources, settings.backend, pick, settings.dtype, 1, True, on_device, lambda: None,
                        runner_options=settings.runner_options())
    failed = []
    try:
        await on_device(lambda: init_device(pick.device, settings.backend))
        for name in sources:
            try:
                slot = await registry.ensure(name)
            except LayaError as e:
                print("%s: %s" % (PROG, e.detail), file=sys.stderr)
                failed.append(name)
                continue
            r = slot.runner
            print("  %s: %s/%s, %s kernels: load %.0f ms, warm-up %.0f ms" % (
                name, r.device(), r.dtype(), r.kernels, slot.load_ms, slot.warmup_ms), flush=True)
    finally:
        for slot in registry.slots.values():
            if slot.runner is not None:
                await on_device(slot.runner.close)
        device.shutdown()
    after = kernel_cache.contents(cache)
    print("%s: %d of %d checkpoints warmed in %.1f s; Triton cache %s: %d kernels (%+d), %d files, %.1f MB" % (
        PROG, len(sources) - len(failed), len(sources), time.perf_counter() - t0, cache or "none",
        after.kernels, after.kernels - before.kernels, after.files, after.bytes / 1e6))
    if not compiles:
        print("%s: only CUDA compiles kernels into this cache; on %s the warm-up forwards ran and the kernel "
              "cache is unchanged (fill it on the GPU the service will run on)" % (PROG, pick.device))
    return 1 if failed else 0
