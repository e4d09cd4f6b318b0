"""The inference batcher's turns, on its own device thread with a stand-in runner whose forward
takes a known time per token: once long forwards showed the speed, queued rows merge only up to
about one turn (two large requests' chunks no longer make one forward twice as long, and a small
request still rides along with a chunk), and a batch split into several forwards stops between
them once every request in it is cancelled."""
from __future__ import annotations

import asyncio
import time

import numpy as np

from laya_grpc.core.turns import TURN_MS
from laya_grpc.inference.batcher import Batcher
from test_fair_chunks import rows_of

MS_PER_TOKEN = TURN_MS / 1000.0   # a chunk of 10 rows x 100 tokens takes one turn


class TimedRunner:
    """Sleeps as a forward of its padded cost would take at MS_PER_TOKEN; records each forward."""
    packing = None

    def __init__(self) -> None:
        self.forwards: list[int] = []   # rows per forward

    def run_rows(self, rows, pad_id, pad_to):
        self.forwards.append(rows.n)
        time.sleep(rows.n * pad_to * MS_PER_TOKEN / 1e3)
        return np.zeros((rows.n, int(rows.marker_counts.max())), np.float32), np.zeros((rows.n, 3), np.float32)


def chunk():
    return rows_of([100] * 10)


def test_queued_chunks_of_two_large_requests_take_separate_forwards():
    runner = TimedRunner()

    async def main():
        b = Batcher(lambda name: runner, lambda name: 0, length_multiple=1)
        b.start()
        try:
            await b.submit("m", chunk())   # one turn long: the speed is learned from it
            assert b.turn_cost("m") is not None and 800 <= b.turn_cost("m") <= 1000, b.turn_cost("m")
            runner.forwards.clear()
            first = asyncio.ensure_future(b.submit("m", chunk()))
            await asyncio.sleep(0.01)   # the first forward runs; the rest queue behind it
            rest = [asyncio.ensure_future(b.submit("m", r)) for r in (chunk(), chunk(), rows_of([100]))]
            await asyncio.gather(first, *rest)
        finally:
            b.stop()

    asyncio.run(main())
    # one chunk each; the one-row request rides along with the last chunk (within a quarter turn)
    assert runner.forwards == [10, 10, 11], runner.forwards


def test_short_forwards_never_cap_merging():
    """A device whose forwards stay short (a GPU at ordinary load) learns no turn: merging is
    bounded by the token budget alone."""
    fast = TimedRunner()

    async def main():
        b = Batcher(lambda name: fast, lambda name: 0, length_multiple=1)
        b.start()
        try:
            await b.submit("m", rows_of([100] * 3))   # 15 ms: shorter than half a turn
            assert b.turn_cost("m") is None
            fast.forwards.clear()
            first = asyncio.ensure_future(b.submit("m", rows_of([100] * 3)))
            await asyncio.sleep(0.005)
            rest = [asyncio.ensure_future(b.submit("m", rows_of([100] * 3))) for _ in range(3)]
            await asyncio.gather(first, *rest)
        finally:
            b.stop()

    asyncio.run(main())
    assert fast.forwards == [3, 9], fast.forwards


def test_cancelled_batch_stops_between_its_forwards():
    runner = TimedRunner()

    async def main():
        b = Batcher(lambda name: runner, lambda name: 0, length_multiple=1, max_batch_tokens=200)
        b.start()
        try:
            job = asyncio.ensure_future(b.submit("m", chunk()))   # five forwards of 2 rows, 10 ms each
            await asyncio.sleep(0.015)
            job.cancel()
            await asyncio.sleep(0.1)
            after = await b.submit("m", rows_of([10]))   # the device is free again
            assert after.batch_rows == 1
        finally:
            b.stop()

    asyncio.run(main())
    assert runner.forwards[-1] == 1 and len(runner.forwards) - 1 < 5, runner.forwards
