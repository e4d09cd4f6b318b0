"""Child processes that are restarted when they die, and always cleaned up.

vLLM-style lifecycle object: `async with Supervisor(...)` starts the children and, whatever
happens, terminates them (SIGTERM, then SIGKILL after a grace period) on exit.
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from laya_grpc.core.runtime.restart_counts import RESTARTS_ENV, format_restarts

log = logging.getLogger("laya_grpc.cli.supervisor")

# exit codes that mean "restarting will not help": bad flags, a required device is missing
FATAL_EXIT_CODES = {2, 3}


@dataclass
class Child:
    name: str
    argv: list
    env: dict = field(default_factory=dict)
    proc: Optional[asyncio.subprocess.Process] = None
    restarts: int = 0
    started: float = 0.0
    stop_stage: int = 0   # on close, lower stages stop first (the front before what it calls)


class FatalChildExit(Exception):
    def __init__(self, child: Child, code: int):
        super().__init__("%s exited with code %d" % (child.name, code))
        self.child, self.code = child, code


def _die_with_parent() -> None:
    """Linux: the child gets SIGTERM if the supervisor dies without cleaning up (kill -9)."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class Supervisor:
    def __init__(self, children: list, max_backoff_s: float = 10.0, on_exit: Optional[Callable[[int], None]] = None):
        self.children, self.on_exit = children, on_exit   # on_exit(pid) after any child ends
        self.max_backoff_s = max_backoff_s
        self._watchers: list[asyncio.Task] = []
        self._closing = False
        self.fatal: asyncio.Future = None  # type: ignore[assignment]

    async def __aenter__(self) -> "Supervisor":
        self.fatal = asyncio.get_running_loop().create_future()
        for c in self.children:
            await self._spawn(c)
            self._watchers.append(asyncio.ensure_future(self._watch(c)))
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def _spawn(self, c: Child) -> None:
        # every child learns how often each was restarted so far, so a restarted gateway keeps
        # reporting the counts instead of starting again from 0 (laya_grpc.core.runtime.restart_counts)
        env = dict(c.env)   # the child's whole environment (serve.child_env)
        env[RESTARTS_ENV] = format_restarts({k.name: k.restarts for k in self.children})
        c.proc = await asyncio.create_subprocess_exec(*c.argv, env=env, start_new_session=True,
                                                      preexec_fn=_die_with_parent)
        c.started = time.monotonic()
        log.info("started %s (pid %d)", c.name, c.proc.pid)

    async def _watch(self, c: Child) -> None:
        backoff = 0.5
        while not self._closing:
            code = await c.proc.wait()
            if self.on_exit is not None:
                self.on_exit(c.proc.pid)
            if self._closing:
                return
            if code in FATAL_EXIT_CODES:
                log.error("%s exited with code %d; not restarting", c.name, code)
                if not self.fatal.done():
                    self.fatal.set_exception(FatalChildExit(c, code))
                return
            if time.monotonic() - c.started > 60:
                backoff = 0.5
            c.restarts += 1
            log.warning("%s (pid %d) died with code %s; restart #%d in %.1f s", c.name, c.proc.pid, code,
                        c.restarts, backoff)
            await asyncio.sleep(backoff)
            backoff = min(self.max_backoff_s, backoff * 2)
            if not self._closing:
                await self._spawn(c)

    async def close(self, grace_s: float = 5.0) -> None:
        """Stop the children stage by stage (`Child.stop_stage`, lowest first): SIGTERM to every child
        of a stage, then up to `grace_s` for them to exit (SIGKILL after that), before the next stage
        gets its SIGTERM. So the front drains while the services it calls still answer."""
        if self._closing:
            return
        self._closing = True
        for w in self._watchers:
            w.cancel()
        for stage in sorted({c.stop_stage for c in self.children}):
            await self._stop([c for c in self.children if c.stop_stage == stage], grace_s)

    async def _stop(self, children: list, grace_s: float) -> None:
        for c in children:
            if c.proc and c.proc.returncode is None:
                try:
                    c.proc.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + grace_s
        for c in children:
            if c.proc is None:
                continue
            try:
                await asyncio.wait_for(c.proc.wait(), max(0.1, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                log.warning("%s did not stop in %.0f s; killing", c.name, grace_s)
                try:
                    os.killpg(c.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                await c.proc.wait()
