"""Busy-polling event loops: poll for a short window before sleeping, so a reply that comes back
within it is picked up without waking a sleeping thread.

Why: a request crosses gateway -> tokenizer -> gateway -> inference -> gateway, and each crossing
wakes a process that went to sleep in epoll a few hundred microseconds earlier. Where waking a
sleeping thread is slow (virtualised or deeply idle CPUs) those wake-ups are most of a hop
(benchmarks/wakeup.py measures it on the host). Polling costs CPU while it spins: a busy process
spins between its events, an idle one only for one window after its last event.
"""
from __future__ import annotations

import asyncio
import selectors
import time


class SpinSelector(selectors.DefaultSelector):
    """The platform selector, asked with timeout 0 for up to `spin_s` before it blocks."""

    def __init__(self, spin_s: float):
        super().__init__()
        self._spin = spin_s

    def select(self, timeout=None):
        if self._spin <= 0 or (timeout is not None and timeout <= 0):
            return super().select(timeout)
        window = self._spin if timeout is None else min(self._spin, timeout)
        end = time.monotonic() + window
        while True:
            ready = super().select(0)
            if ready:
                return ready
            if time.monotonic() >= end:
                break
        return super().select(None if timeout is None else max(0.0, timeout - window))


def loop_factory(spin_us: int):
    """A zero-argument event loop factory (asyncio.Runner's loop_factory), or None for asyncio's own."""
    if spin_us <= 0:
        return None
    return lambda: asyncio.SelectorEventLoop(SpinSelector(spin_us / 1e6))


def run(coro, spin_us: int = 0):
    """asyncio.run(coro) on a busy-polling loop when spin_us > 0."""
    with asyncio.Runner(loop_factory=loop_factory(spin_us)) as runner:
        return runner.run(coro)


def add_flag(p) -> None:
    from laya_grpc import flags
    flags.add(p, "--busy-poll-us", env="LAYA_BUSY_POLL_US", default=0, type=flags.non_negative_int,
              help="microseconds the event loop keeps polling after its last event before it sleeps (0 = off). "
                   "Saves the OS wake-up on replies that come back within the window, at the cost of CPU spent "
                   "spinning; benchmarks/wakeup.py measures whether this host's wake-ups are worth it")
