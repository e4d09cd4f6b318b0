"""Process lifecycle shared by the services: logging, signals, a change feed for status streams."""
from __future__ import annotations

import asyncio
import signal
import time
import uuid


def setup_logging(service: str, level: str | None = None, fmt: str | None = None, access_log: bool = True) -> None:
    """Text or JSON lines on stderr, each with its request id (core/logs.py)."""
    from . import logs
    logs.setup(service, fmt, level, access_log)


def setup_observability(service: str, settings) -> None:
    """Logging as the settings say (core/settings.py ObservabilitySettings), and tracing when an OTLP
    endpoint is given (the SDK flushes buffered spans at exit)."""
    from . import tracing
    setup_logging(service, settings.log_level, settings.log_format, settings.access_log)
    tracing.setup(service, settings.otlp_endpoint)


class ChangeFeed:
    """A sequence number that status streams wait on; bumped on every state change."""

    def __init__(self):
        self.instance_id = uuid.uuid4().hex[:12]
        self.started = time.time()
        self.sequence = 0
        self._cond = asyncio.Condition()

    def bump(self) -> None:
        self.sequence += 1
        loop = asyncio.get_running_loop()
        loop.create_task(self._notify())

    async def _notify(self) -> None:
        async with self._cond:
            self._cond.notify_all()

    async def wait(self, seen: int, timeout: float) -> bool:
        """True if the sequence moved past `seen` within `timeout` seconds."""
        if self.sequence != seen:
            return True
        try:
            async with self._cond:
                await asyncio.wait_for(self._cond.wait_for(lambda: self.sequence != seen), timeout)
            return True
        except asyncio.TimeoutError:
            return False


def install_stop_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):
            pass


def clamp_heartbeat(value: float, default: float) -> float:
    return default if not value else min(60.0, max(0.2, value))
