"""`laya-grpc inference`: the resident model service.

It loads and warms its checkpoints before it reports SERVING on grpc.health.v1, batches
concurrent requests into shared forward passes on one device thread, and reports device and
dtype read from the live weights.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
import weakref

import numpy as np

from laya_grpc.core.runtime import draining, flags, logs, memory, metrics, request_id, tracing
from laya_grpc.core.wire import ipc, rpc
from laya_grpc.core.wire.calls import serve_calls
from laya_grpc.core.errors import Kind, LayaError
from laya_grpc.core.runtime.lifecycle import ChangeFeed, clamp_heartbeat, install_stop_signals, setup_observability
from laya_grpc.core.wire.packed_rows import PackedRows
from laya_proto.internal.v1 import inference_pb2, inference_pb2_grpc
from laya_proto.v1 import status_pb2, tokens_pb2

from . import kernel_cache
from .batcher import Batcher
from .faults import FAULTS
from .outcomes import ForwardHealth
from .registry import Registry, shape_forward
from .devices import init_device, pick_device
from .settings import InferenceSettings

log = logging.getLogger("laya_grpc.inference")
SERVICE_NAME = inference_pb2.DESCRIPTOR.services_by_name["InferenceService"].full_name
S = status_pb2
# tokens after which an idle inference service gives freed heap back (core/runtime/memory.py): a CPU forward's
# activations are freed to glibc, which keeps them (the CUDA caching allocator is a separate, device cache)
TRIM_AFTER_TOKENS = 16384


class InferenceServicer(inference_pb2_grpc.InferenceServiceServicer):
    def __init__(self, registry: Registry, batcher: Batcher, feed: ChangeFeed, settings: InferenceSettings):
        self.registry, self.batcher, self.feed, self.settings = registry, batcher, feed, settings
        self.state, self.detail = S.STATE_STARTING, "loading checkpoints"
        self.inflight = 0   # calls here, queued or on the device (the heap is trimmed once none is)
        # the trim runs on the device thread, between forwards, like loading and eviction
        self.trim = memory.IdleTrim(lambda: self.inflight, batcher.run_on_device, TRIM_AFTER_TOKENS,
                                    metrics.INFERENCE_HEAP_TRIMS)
        self._calls = {True: metrics.INFERENCE_CALLS.labels("yes"), False: metrics.INFERENCE_CALLS.labels("no")}
        # device and dtype of each live runner, read from its weights once (not on every response;
        # status() still reads them live); weak keys, so an evicted runner is not kept alive
        self._runner_facts: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
        self.health: "ForwardHealth | None" = None   # set by serve() once the device thread runs

    def _facts(self, runner) -> tuple:
        facts = self._runner_facts.get(runner)
        if facts is None:
            facts = self._runner_facts[runner] = (runner.device(), runner.dtype())
        return facts

    @rpc.servicer_errors
    async def Infer(self, request, context):
        return await self.infer(request)

    async def InferStream(self, request_iterator, context):
        await serve_calls(request_iterator, context, self.infer, inference_pb2.InferReply,
                          tokens_pb2.CallError, "Infer")

    async def infer(self, request) -> inference_pb2.InferResponse:
        request_id.begin(",".join(o.request_id for o in request.origins),   # this call's own task
                         next((o.traceparent for o in request.origins if o.traceparent), ""))
        self._calls[self.state == S.STATE_READY].inc()
        self.inflight += 1
        try:
            with logs.call_failures(log, "Infer", metrics.INFERENCE_ERRORS, self.settings.listen, self._internal_failure):
                async with self.registry.pinned(request.checkpoint) as slot:
                    return await self._infer(slot, request)
        finally:
            self.inflight -= 1
            self.trim.ended()

    def _internal_failure(self) -> None:
        """Not the request's fault: a probe forward checks the device (inference/outcomes.py)."""
        if self.health is not None:
            self.health.failed()

    async def _infer(self, slot, request) -> inference_pb2.InferResponse:
        runner = slot.runner
        rows = PackedRows.from_proto(request.rows, vocab_size=runner.vocab_size, max_len=runner.max_positions)
        if rows.fingerprint and rows.fingerprint != slot.fingerprint:
            raise LayaError(Kind.INVALID, "token rows were made by another tokenizer (fingerprint %s..., checkpoint "
                            "%r has %s...)" % (rows.fingerprint[:12], slot.name, slot.fingerprint[:12]))
        device, dtype = self._facts(runner)
        self.trim.add(len(rows.ids))
        if rows.n == 0:
            return inference_pb2.InferResponse(n_act=runner.n_act, device=device, dtype=dtype)
        call_start = time.time_ns() if tracing.enabled() else 0
        res = await self.batcher.submit(slot.name, rows)
        metrics.QUEUE_SECONDS.observe(res.queue_ms / 1e3)
        if log.isEnabledFor(logging.DEBUG):   # LAYA_LOG_LEVEL=DEBUG: one line per call
            log.debug("Infer %s: %d rows (batch of %d), queue %.2f ms, model %.2f ms", slot.name, rows.n,
                      res.batch_rows, res.queue_ms, res.model_ms)
        tracing.record_batched([o.traceparent for o in request.origins], call_start, res.queue_ms, res.model_ms,
                               checkpoint=slot.name, batch_rows=res.batch_rows, call_rows=rows.n)
        return inference_pb2.InferResponse(
            logits=np.concatenate(res.logits).astype("<f4").tobytes(),
            act_logits=res.act_logits.astype("<f4").tobytes(), n_act=int(res.act_logits.shape[1]),
            device=device, dtype=dtype, queue_ms=res.queue_ms,
            model_ms=res.model_ms, batch_rows=res.batch_rows)

    @rpc.servicer_errors
    async def ListCheckpoints(self, request, context):
        return inference_pb2.ListCheckpointsResponse(
            checkpoints=[self.registry.status(s) for s in self.registry.slots.values()])

    @rpc.servicer_errors
    async def LoadCheckpoint(self, request, context):
        slot = await self.registry.ensure(request.checkpoint)
        return self.registry.status(slot)

    def snapshot(self) -> status_pb2.ServiceStatus:
        return S.ServiceStatus(
            service="inference", state=self.state, detail=self.detail, instance_id=self.feed.instance_id,
            sequence=self.feed.sequence, time_unix=time.time(), started_unix=self.feed.started,
            queue_depth=self.batcher.depth, inflight=self.inflight, address=self.settings.listen,
            checkpoints=[self.registry.status(s) for s in self.registry.slots.values()])

    @rpc.servicer_errors
    async def GetStatus(self, request, context):
        return self.snapshot()

    async def WatchStatus(self, request, context):
        heartbeat = clamp_heartbeat(request.heartbeat_s, self.settings.heartbeat_s)
        seen = -1
        while True:
            await self.feed.wait(seen, heartbeat)
            seen = self.feed.sequence
            await context.write(self.snapshot())


async def serve(settings: InferenceSettings, ipc_endpoint: str | None = None) -> int:
    try:
        device, required = settings.device_choice()
        pick = pick_device(device, settings.backend, required)
    except LayaError as e:
        log.error("%s", e.detail)
        print("laya-grpc inference: %s" % e.detail, file=sys.stderr)
        return 3
    metrics.serve_metrics(settings.metrics)
    feed = ChangeFeed()
    registry_ref = {}
    batcher = Batcher(lambda name: registry_ref["r"].ready_runner(name), lambda name: registry_ref["r"].slots[name].pad_id,
                      max_batch_tokens=settings.max_batch_tokens, max_batch_rows=settings.max_batch_rows,
                      max_wait_ms=settings.max_wait_ms)
    registry = Registry(settings.checkpoints, settings.backend, pick, settings.dtype, settings.max_loaded,
                        settings.warmup, batcher.run_on_device, feed.bump, runner_options=settings.runner_options())
    registry_ref["r"] = registry
    servicer = InferenceServicer(registry, batcher, feed, settings)
    srv = rpc.server()
    inference_pb2_grpc.add_InferenceServiceServicer_to_server(servicer, srv)
    hs = rpc.add_health_and_reflection(srv, [SERVICE_NAME])
    await rpc.set_health(hs, [SERVICE_NAME], False)
    try:
        settings.listen = rpc.bind(srv, settings.listen)
    except RuntimeError as e:
        print("laya-grpc inference: cannot listen on %s: %s (address in use?)" % (settings.listen, e), file=sys.stderr)
        return 2
    await srv.start()
    servicer.health = ForwardHealth(lambda: _probe_forward(registry, batcher),
                                    lambda ok, detail: _set_serving(servicer, hs, feed, ok, detail))
    gpu_memory = asyncio.ensure_future(memory_gauges(pick.device, settings.backend))
    calls = ipc_endpoint and ipc.IpcServer(ipc_endpoint, servicer.infer, inference_pb2.InferCall,
                                           inference_pb2.InferReply, tokens_pb2.CallError, "Infer").start()
    batcher.start()
    # first in the device thread's queue: the CUDA context comes up while checkpoints are read and hashed
    device_init = batcher.run_on_device(lambda: init_device(pick.device, settings.backend))
    device_init.add_done_callback(lambda fut: _log_device_init(fut, pick.device))
    log.info("inference listening on %s (backend %s, device %s%s)", settings.listen, settings.backend, pick.device,
             " FALLBACK: " + pick.reason if pick.fallback else "")
    stop = asyncio.Event()
    install_stop_signals(stop)

    preload = settings.preload or list(settings.checkpoints)[: settings.max_loaded]
    loading = asyncio.ensure_future(_preload(servicer, registry, hs, feed, preload))
    await stop.wait()
    loading.cancel()
    gpu_memory.cancel()
    servicer.health.close()
    servicer.state, servicer.detail = S.STATE_DRAINING, "shutting down"
    feed.bump()
    await draining.drain(srv, hs, [SERVICE_NAME], settings.drain_grace_s,
                         lambda: servicer.inflight + batcher.depth, "inference")
    servicer.trim.close()
    if calls:   # IPC calls in flight were counted in inflight, so none is cut off here
        await calls.close()
    # a forward still running ends at its next sub-forward; 1.5 s keeps the exit inside the
    # 5 s the supervisor allows after the drain grace before SIGKILL
    batcher.stop(timeout_s=1.5)
    return 0


async def _probe_forward(registry: Registry, batcher: Batcher) -> None:
    """One small forward on the device thread with a checkpoint that is ready (the health probe);
    nothing to probe (none ready) counts as a success."""
    slot = next((s for s in registry.slots.values() if s.state == S.STATE_READY and s.runner is not None), None)
    if slot is None:
        return
    runner, ckpt, pad_id = slot.runner, slot.ckpt, slot.pad_id

    def probe() -> None:
        FAULTS.delay()
        FAULTS.check()
        shape_forward(runner, ckpt, pad_id)
    await batcher.run_on_device(probe)


async def _set_serving(servicer: InferenceServicer, hs, feed: ChangeFeed, ok: bool, detail: str) -> None:
    """Health from the forwards' outcome; a draining or never-ready service stays as it is."""
    if servicer.state not in (S.STATE_READY, S.STATE_FAILED) or (ok and servicer.state == S.STATE_READY):
        return
    servicer.state, servicer.detail = (S.STATE_READY, "") if ok else (S.STATE_FAILED, detail)
    await rpc.set_health(hs, [SERVICE_NAME], ok)
    feed.bump()


async def memory_gauges(device: str, backend: str, every_s: float = 5.0) -> None:
    """`laya_inference_device_memory_bytes` of a CUDA device, every few seconds (nothing elsewhere)."""
    if backend != "torch" or not str(device).startswith("cuda"):
        return
    import torch
    index = torch.device(device).index or 0
    while True:
        await asyncio.sleep(every_s)   # the first read after the device thread made the context
        try:
            metrics.DEVICE_MEMORY.labels(device, "allocated").set(torch.cuda.memory_allocated(index))
            metrics.DEVICE_MEMORY.labels(device, "reserved").set(torch.cuda.memory_reserved(index))
            free, total = torch.cuda.mem_get_info(index)
            metrics.DEVICE_MEMORY.labels(device, "used").set(total - free)
            metrics.DEVICE_MEMORY.labels(device, "total").set(total)
        except RuntimeError as e:   # a lost device: the forwards' health says so; keep the last values
            log.debug("device memory not readable: %s", e)


def _log_device_init(fut: "asyncio.Future", device: str) -> None:
    if fut.cancelled():
        return
    if fut.exception() is not None:   # the checkpoint load on the same device will fail and say why
        log.error("device init failed: %s", fut.exception())
    elif fut.result() > 0.01:
        log.info("device %s initialised in %.0f ms", device, fut.result() * 1e3)


async def _preload(servicer: InferenceServicer, registry: Registry, hs, feed: ChangeFeed, preload: list) -> None:
    """Load and warm the preloaded checkpoints; SERVING once at least one is ready."""
    servicer.state, servicer.detail = S.STATE_LOADING, "loading %s" % ", ".join(preload)
    feed.bump()
    for name in preload:
        try:
            await registry.ensure(name)
        except LayaError as e:
            log.error("preload of %s failed: %s", name, e.detail)
    registry.started = True
    ok = [n for n in preload if registry.slots[n].state == S.STATE_READY]
    if ok:
        servicer.state = S.STATE_READY
        failed = [n for n in preload if n not in ok]
        servicer.detail = ("failed: %s" % ", ".join(failed)) if failed else ""
        await rpc.set_health(hs, [SERVICE_NAME], True)
        metrics.INFERENCE_HEALTHY.set(1)
    else:
        servicer.state, servicer.detail = S.STATE_FAILED, "no checkpoint could be loaded"
    feed.bump()


def add_arguments(p: argparse.ArgumentParser) -> None:
    flags.add_settings(p, InferenceSettings)


def run(args: argparse.Namespace) -> int:
    settings = args.settings
    setup_observability("inference", settings)
    kernel_cache.use(settings.kernel_cache_dir)   # before torch loads, let alone compiles a kernel
    try:
        settings.checkpoints
    except LayaError as e:
        print("laya-grpc inference: %s" % e.detail, file=sys.stderr)
        return 2
    return asyncio.run(serve(settings, settings.ipc))
