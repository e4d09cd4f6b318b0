"""SIGTERM on a service: NOT_SERVING first, in-flight work finished within a grace period, exit.

The order matters for replicas behind a health-checking balancer (the gateway's round_robin
channels, Kubernetes readiness probes): once health says NOT_SERVING they send no new calls;
calls already running finish; the server stops when none is left or the grace period is over,
whichever comes first. A call that reaches the server after it stopped fails UNAVAILABLE, which
the gateway retries on another replica.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable, Iterable

from ..wire import rpc
from .settings import DEFAULT_GRACE_S  # noqa: F401 - the services' default

log = logging.getLogger("laya_grpc.core.runtime.draining")

# time for clients' health watches to see NOT_SERVING before the server refuses new calls
SETTLE_S = 0.5


async def drain(server, hs, names: Iterable[str], grace_s: float, busy: Callable[[], int], what: str) -> None:
    """Flip health, wait for `busy()` to reach 0 (at most `grace_s`), stop the gRPC server."""
    deadline = time.monotonic() + max(0.0, grace_s)
    await rpc.set_health(hs, list(names), False)
    await wait_idle(grace_s, busy, what)
    await server.stop(grace=min(0.5, max(0.0, deadline - time.monotonic())))
    await settle_calls()


async def settle_calls(timeout_s: float = 1.0) -> None:
    """After a gRPC server stopped: let the tasks it ran calls in (grpc.aio names them `rpc_task` and
    `HandleExceptions[METHOD]`) see their calls end, rather than leave them to asyncio.run's exit,
    whose cancelling them makes grpc print a raw `CancelledError` traceback to stderr."""
    calls = [t for t in asyncio.all_tasks() if t.get_name() == "rpc_task" or t.get_name().startswith("HandleExceptions[")]
    if calls:
        await asyncio.wait(calls, timeout=timeout_s)


async def wait_idle(grace_s: float, busy: Callable[[], int], what: str) -> None:
    """After health went NOT_SERVING: let watchers see it, then wait for `busy()` to reach 0."""
    t0 = time.monotonic()
    deadline = t0 + max(0.0, grace_s)
    await asyncio.sleep(min(SETTLE_S, max(0.0, grace_s)))
    while busy() > 0 and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    left = busy()
    if left:
        log.warning("%s: %d calls still running after the %.0f s drain grace; stopping", what, left, grace_s)
    else:
        log.info("%s drained in %.2f s", what, time.monotonic() - t0)
