"""The inference service's health from the outcome of its forward passes.

A forward that fails for a reason of its own (a lost device, a CUDA error, out of memory: the
batcher's INTERNAL "forward failed") makes the service run a probe: one forward of a fixed, known
good shape (the first warm-up shape) on the device thread. If the probe fails as well, the device
is broken: grpc.health.v1 turns NOT_SERVING, so balancers (the gateway's health-checked channels,
a Kubernetes readiness probe) send no more calls here, and the status says why. While broken, a
probe runs every PROBE_INTERVAL_S; the first one that succeeds turns the service SERVING again.
A failure the probe does not reproduce (one batch the device could not run) changes nothing.

Time to NOT_SERVING after the device breaks: the failing forward, plus the probe's wait behind the
device thread's queue, plus one small forward; on an idle replica that is milliseconds
(tests/test_replica_health.py measures it).
"""
from __future__ import annotations

import asyncio
import contextvars
import logging
from typing import Awaitable, Callable, Optional

from laya_grpc.core.runtime import metrics

log = logging.getLogger("laya_grpc.inference.health")

PROBE_INTERVAL_S = 1.0


class ForwardHealth:
    """`failed()` after a forward failed for an internal reason; `probe()` runs one forward and
    raises if the device cannot; `set_serving(ok, detail)` flips health and status."""

    def __init__(self, probe: Callable[[], Awaitable[None]], set_serving: Callable[[bool, str], Awaitable[None]]):
        self._probe, self._set_serving = probe, set_serving
        self._task: Optional[asyncio.Task] = None
        self.broken = False

    def failed(self) -> None:
        if self._task is None:   # one check at a time; failures meanwhile are what it is checking
            # in a context of its own: its lines are about the replica, not the request that failed
            self._task = asyncio.get_running_loop().create_task(self._check(), context=contextvars.Context())

    async def _probe_error(self) -> str:
        try:
            await self._probe()
            return ""
        except asyncio.CancelledError:
            raise
        except Exception as e:   # noqa: BLE001 - any failure of the probe forward is the finding
            return "%s: %s" % (type(e).__name__, getattr(e, "detail", None) or e)

    async def _check(self) -> None:
        try:
            err = await self._probe_error()
            if not err:
                return
            self.broken = True
            metrics.INFERENCE_HEALTHY.set(0)
            log.error("forwards are failing (probe: %s): NOT_SERVING until a probe forward succeeds", err)
            await self._set_serving(False, "forwards failing: %s" % err)
            while err:
                await asyncio.sleep(PROBE_INTERVAL_S)
                err = await self._probe_error()
            self.broken = False
            metrics.INFERENCE_HEALTHY.set(1)
            log.info("a probe forward succeeded: SERVING again")
            await self._set_serving(True, "")
        finally:
            self._task = None

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
