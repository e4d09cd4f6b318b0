"""Fault injection, for tests only: `LAYA_TEST_FAULTS`, read once when the inference service starts.

Never set it in production. It lets the test suite prove what the service does when its device
misbehaves, with real processes and no mocks. Comma-separated `key=value` items:

- `forward_delay_s=SECONDS`: every forward pass (and health probe) first sleeps this long, so
  requests stay in flight long enough to be caught by a SIGTERM;
- `forward_fixed_s=SECONDS`: every forward pass (and health probe) also takes this long inside its
  timing, whatever its rows: the fixed cost that a loaded host adds to each forward, which the
  batcher reads as device time (the wait of `forward_delay_s` it never sees);
- `fail_while=PATH`: while the file PATH exists, every forward pass (and health probe) fails the way
  a lost device does (`RuntimeError: CUDA error: ...`); remove the file and they succeed again.
"""
from __future__ import annotations

import os
import time

from laya_grpc.core.runtime import flags

ENV = "LAYA_TEST_FAULTS"


class Faults:
    def __init__(self, spec: str = ""):
        self.delay_s, self.fixed_s, self.fail_while = 0.0, 0.0, ""
        for item in filter(None, (p.strip() for p in spec.split(","))):
            key, _, value = item.partition("=")
            if key == "forward_delay_s":
                self.delay_s = float(value)
            elif key == "forward_fixed_s":
                self.fixed_s = float(value)
            elif key == "fail_while":
                self.fail_while = value
            else:
                raise ValueError("%s: unknown item %r (forward_delay_s=SECONDS, forward_fixed_s=SECONDS, "
                                 "fail_while=PATH)" % (ENV, item))

    def delay(self) -> None:
        """On the device thread, before a forward pass and outside its timing (the injected wait
        must not teach the batcher a slower device speed, which would cut requests finer)."""
        if self.delay_s:
            time.sleep(self.delay_s)

    def check(self) -> None:
        """Inside a forward pass: its fixed cost, if one is set; fail it as a lost device does while
        the file exists."""
        if self.fixed_s:
            time.sleep(self.fixed_s)
        if self.fail_while and os.path.exists(self.fail_while):
            raise RuntimeError("CUDA error: an illegal memory access was encountered (injected by %s)" % ENV)


FAULTS = Faults(flags.external(ENV) or "")
