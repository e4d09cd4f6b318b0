"""Process lifecycle shared by the services: logging, signals, a change feed for status streams."""
from __future__ import annotations

import asyncio
import signal
import time
import uuid


def setup_logging(service: str, level: str | None = None, fmt: str | None = None, access_log: bool = True) -> None:
    """Text or JSON lines on stderr, each with its request id (core/runtime/logs.py)."""
    from . import logs
    logs.setup(service, fmt, level, access_log)


def setup_observability(service: str, settings) -> None:
    """Logging as the settings say (core/runtime/settings.py ObservabilitySettings), and tracing when an OTLP
    endpoint is given (the SDK flushes buffered spans at exit)."""
    from . import tracing
    setup_logging(service, settings.log_level, settings.log_format, settings.access_log)
    tracing.setup(service, settings.otlp_endpoint)


class ChangeFeed:
    """A sequence number that status streams wait on; bumped on every state change.

    Waiters share their timers: all that wait with one timeout await one future per timeout value,
    which the next change or that timeout's next tick resolves. A thousand `Watch` streams at a
    0.2 s heartbeat then cost one timer and one wake-up each per tick, not a timer, a task and a
    lock round each."""

    def __init__(self):
        self.instance_id = uuid.uuid4().hex[:12]
        self.started = time.time()
        self.sequence = 0
        self._beats: dict[float, asyncio.Future] = {}   # timeout -> the future its waiters await

    def bump(self) -> None:
        self.sequence += 1
        beats, self._beats = self._beats, {}
        for fut in beats.values():
            if not fut.done():
                fut.set_result(True)

    def beat(self, timeout: float) -> asyncio.Future:
        """The future shared by every waiter with this timeout: True at the next change, False at
        the timeout's next tick (at most `timeout` from now)."""
        fut = self._beats.get(timeout)
        if fut is None:
            loop = asyncio.get_running_loop()
            fut = self._beats[timeout] = loop.create_future()
            loop.call_later(timeout, self._tick, timeout, fut)
        return fut

    def _tick(self, timeout: float, fut: asyncio.Future) -> None:
        if self._beats.get(timeout) is fut:
            del self._beats[timeout]
        if not fut.done():
            fut.set_result(False)

    async def wait(self, seen: int, timeout: float) -> bool:
        """True if the sequence moved past `seen` within `timeout` seconds (False: a tick of the
        timeout shared with the other waiters, at most `timeout` from now)."""
        if self.sequence != seen:
            return True
        return await asyncio.shield(self.beat(timeout))   # shielded: one waiter leaving cancels only itself


def install_stop_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):
            pass


def clamp_heartbeat(value: float, default: float) -> float:
    return default if not value else min(60.0, max(0.2, value))
