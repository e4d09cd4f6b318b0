"""The inference batcher's turns, on its own device thread with a stand-in runner whose forward
takes a known time per token: once long forwards showed the speed, queued rows merge only up to
about one turn (two large requests' chunks no longer make one forward twice as long, and a small
request still rides along with a chunk), a forward's fixed cost (one its rows do not change) does
not cut a large request finer, and a batch split into several forwards stops between them once
every request in it is cancelled.

Where a test asserts what the batcher learned from the forwards' speed, the batcher reads a clock
that only the stand-in forwards advance (`FakeClock`): a real sleep overshoots by whatever the
machine's scheduler adds, so the learned speed, and with it the merging, would depend on the load.
"""
from __future__ import annotations

import asyncio
import threading
import time
import types

import numpy as np
import pytest

from laya_grpc.inference.turns import TURN_MS
from laya_grpc.inference import batcher as batcher_module
from laya_grpc.inference.batcher import Batcher
from test_fair_chunks import rows_of, turn_learned

MS_PER_TOKEN = TURN_MS / 1000.0   # a chunk of 10 rows x 100 tokens takes one turn


class FakeClock:
    """The batcher's perf_counter, advanced only by TimedRunner's forwards (exactly their cost)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    c = FakeClock()
    monkeypatch.setattr(batcher_module, "time", types.SimpleNamespace(perf_counter=c.perf_counter))
    return c


class TimedRunner:
    """Takes as long as a forward of its padded cost would at MS_PER_TOKEN, plus `fixed_ms` a
    forward (sleeping, or advancing `clock` by exactly that); records each forward."""
    packing = None

    def __init__(self, clock: FakeClock | None = None, fixed_ms: float = 0.0) -> None:
        self.forwards: list[int] = []   # rows per forward
        self.clock = clock
        self.fixed_ms = fixed_ms

    def run_rows(self, rows, pad_id, pad_to):
        self.forwards.append(rows.n)
        seconds = (self.fixed_ms + rows.n * pad_to * MS_PER_TOKEN) / 1e3
        if self.clock is None:
            time.sleep(seconds)
        else:
            self.clock.now += seconds
        return np.zeros((rows.n, int(rows.marker_counts.max())), np.float32), np.zeros((rows.n, 3), np.float32)


def chunk():
    return rows_of([100] * 10)


async def queued_behind_a_gate(b: Batcher, jobs: list) -> list:
    """Submit `jobs` while the device thread is held, then let it go: they are all queued when it
    takes the next batch (no timing involved)."""
    gate = threading.Event()
    held = b.run_on_device(lambda: gate.wait(10))
    await asyncio.sleep(0.05)   # the device thread took the gate (it is first in the queue either way)
    futs = [asyncio.ensure_future(b.submit("m", r)) for r in jobs]
    await asyncio.sleep(0)      # every submit ran up to its queue append
    gate.set()
    await held
    return await asyncio.gather(*futs)


def test_queued_chunks_of_two_large_requests_take_separate_forwards(clock):
    runner = TimedRunner(clock)

    async def main():
        b = Batcher(lambda name: runner, lambda name: 0, length_multiple=1)
        b.start()
        try:
            await b.submit("m", chunk())   # one turn long: the speed is learned from it
            assert await turn_learned(b) in (999, 1000)   # one chunk is one turn (float rounding)
            runner.forwards.clear()
            await queued_behind_a_gate(b, [chunk(), chunk(), rows_of([100])])
        finally:
            b.stop()

    asyncio.run(main())
    # one chunk each; the one-row request rides along with the last chunk (within a quarter turn)
    assert runner.forwards == [10, 11], runner.forwards


def test_short_forwards_never_cap_merging(clock):
    """A device whose forwards stay short (a GPU at ordinary load) learns no turn: merging is
    bounded by the token budget alone."""
    fast = TimedRunner(clock)

    async def main():
        b = Batcher(lambda name: fast, lambda name: 0, length_multiple=1)
        b.start()
        try:
            await b.submit("m", rows_of([100] * 2))   # 10 ms: shorter than half a turn
            assert b.turn_cost("m") is None
            fast.forwards.clear()
            await queued_behind_a_gate(b, [rows_of([100] * 2)] * 3)
        finally:
            b.stop()

    asyncio.run(main())
    assert fast.forwards == [6], fast.forwards


def test_a_forwards_fixed_cost_does_not_cut_rows_finer(clock):
    """A device whose every forward also costs a fixed time of two turns, whatever its rows (a
    loaded CPU host: thread wake-ups and the scheduler's delays): a large request still runs in
    parts of about a turn of work each (12 rows of 100 tokens), not one row a forward. Read as
    work, the fixed cost made each smaller part look slower per token, which cut the next part
    smaller still, down to a row a forward: 56 rows took 53 forwards, each paying the fixed cost
    (and, with a fault delay a forward, a drain's in-flight requests outlasted its grace)."""
    runner = TimedRunner(clock, fixed_ms=2 * TURN_MS)

    async def main():
        b = Batcher(lambda name: runner, lambda name: 0, length_multiple=1)
        b.start()
        try:
            await b.submit("m", rows_of([100] * 8))   # 140 ms: long, the speed is learned from it
            await turn_learned(b)
            runner.forwards.clear()
            await b.submit("m", rows_of([100] * 56))
        finally:
            b.stop()

    asyncio.run(main())
    # the first part follows the one forward seen (all of its time read as work: 3 rows); once a
    # second size has shown what the rows themselves cost, about a turn of their work a forward
    assert sum(runner.forwards) == 56 and len(runner.forwards) <= 7, runner.forwards
    assert all(10 <= n <= 12 for n in runner.forwards[1:-1]), runner.forwards


def test_cancelled_batch_stops_between_its_forwards():
    runner = TimedRunner()

    async def main():
        b = Batcher(lambda name: runner, lambda name: 0, length_multiple=1, max_batch_tokens=200)
        b.start()
        try:
            job = asyncio.ensure_future(b.submit("m", rows_of([100] * 20)))   # ten forwards of 2 rows, 10 ms each
            await asyncio.sleep(0.015)
            job.cancel()
            await asyncio.sleep(0.1)
            after = await b.submit("m", rows_of([10]))   # the device is free again
            assert after.batch_rows == 1
        finally:
            b.stop()

    asyncio.run(main())
    assert runner.forwards[-1] == 1 and len(runner.forwards) - 1 < 10, runner.forwards
