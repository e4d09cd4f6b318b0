"""Fair scheduling in the inference batcher, on its own device thread with a stand-in runner whose
forward takes a known time per token: a request larger than a turn runs one part per forward, its
rest behind the requests that arrived meanwhile, so a small request sent meanwhile runs before the
large one's next part; a cancelled large request runs no further part; the parts' answers join
back into exactly what one forward would have answered; the part size follows the speed the
forwards showed. The gateway forwards a large request's rows whole (no cutting there)."""
from __future__ import annotations

import asyncio
import threading
import time

import numpy as np

from laya_grpc.core.wire.packed_rows import PackedRows
from laya_grpc.inference.turns import TURN_MS
from laya_grpc.engine.coalesce import InferCoalescer
from laya_grpc.inference.batcher import Batcher

I32 = np.int32
MS_PER_TOKEN = TURN_MS / 1000.0   # 1,000 tokens take one turn


def rows_of(lengths, markers=2) -> PackedRows:
    lengths = np.asarray(lengths, I32)
    ids = np.concatenate([np.arange(1, n + 1, dtype=I32) for n in lengths])
    off = np.concatenate([[0], np.cumsum(lengths)]).astype(I32)
    mk = np.ones(markers * len(lengths), I32)
    moff = (np.arange(len(lengths) + 1) * markers).astype(I32)
    return PackedRows(ids=ids, row_offsets=off, markers=mk, marker_offsets=moff, qtypes=np.zeros(len(lengths), I32))


def tagged_rows(n: int, length: int, first: int = 0) -> PackedRows:
    """n rows of `length` tokens whose first token is the row's number (from `first`)."""
    rows = rows_of([length] * n)
    rows.ids[rows.row_offsets[:-1]] = np.arange(first, first + n, dtype=I32)
    return rows


class TimedRunner:
    """Sleeps as a forward of its padded cost would take at MS_PER_TOKEN; answers each row with its
    first token (its number), so a row answered from the wrong place shows; records each forward."""
    packing = None

    def __init__(self) -> None:
        self.forwards: list[tuple] = []   # (rows, first row's number)
        self._lock = threading.Lock()

    def run_rows(self, rows, pad_id, pad_to):
        tag = rows.ids[rows.row_offsets[:-1]].astype(np.float32)
        with self._lock:
            self.forwards.append((rows.n, int(tag[0])))
        time.sleep(rows.n * pad_to * MS_PER_TOKEN / 1e3)
        k = int(rows.marker_counts.max())
        return np.repeat(tag[:, None], k, axis=1), np.repeat(tag[:, None], 3, axis=1)


def run_batcher(runner, body, **kw) -> None:
    """`await body(batcher)` on a started Batcher over `runner`; stopped afterwards."""
    async def main():
        b = Batcher(lambda name: runner, lambda name: 0, length_multiple=1, **kw)
        b.start()
        try:
            await body(b)
        finally:
            b.stop()
    asyncio.run(main())


def test_small_request_runs_before_the_large_requests_next_part():
    runner = TimedRunner()

    async def body(b):
        await b.submit("m", tagged_rows(10, 100))   # one turn: the speed is learned from it
        runner.forwards.clear()
        large = asyncio.ensure_future(b.submit("m", tagged_rows(40, 100)))   # four turns
        await asyncio.sleep(TURN_MS / 2e3)   # its first part is running
        small = await b.submit("m", tagged_rows(1, 10, first=1000))
        res = await large
        assert [float(lg[0]) for lg in res.logits] == list(range(40))   # every row its own answer, in order
        assert small.logits[0][0] == 1000

    run_batcher(runner, body)
    # before: the large request held the device for its whole batch (all four turns ahead of it)
    assert [t for _, t in runner.forwards].index(1000) <= 1, runner.forwards
    assert max(n for n, _ in runner.forwards) <= 13, runner.forwards   # about a turn a forward


def test_cancelled_large_request_runs_no_further_part():
    runner = TimedRunner()

    async def body(b):
        await b.submit("m", tagged_rows(10, 100))
        runner.forwards.clear()
        large = asyncio.ensure_future(b.submit("m", tagged_rows(100, 100)))   # ten turns
        await asyncio.sleep(TURN_MS * 1.5 / 1e3)
        large.cancel()
        await asyncio.sleep(TURN_MS * 3 / 1e3)
        assert len(runner.forwards) <= 3, runner.forwards
        after = await b.submit("m", tagged_rows(1, 10, first=7))   # the device is free again
        assert after.batch_rows == 1

    run_batcher(runner, body)


def test_parts_answer_as_one_forward_and_follow_the_token_budget():
    runner = TimedRunner()

    async def body(b):
        res = await b.submit("m", tagged_rows(20, 10))   # 200 tokens, 50-token forwards (2 ms: no turn learned)
        assert b.turn_cost("m") is None
        assert [float(lg[0]) for lg in res.logits] == list(range(20))
        assert res.act_logits.shape == (20, 3) and list(res.act_logits[:, 0]) == list(range(20))
        assert res.batch_rows == 5

    run_batcher(runner, body, max_batch_tokens=50)
    assert [n for n, _ in runner.forwards] == [5, 5, 5, 5], runner.forwards


async def turn_learned(b, checkpoint: str = "m", timeout_s: float = 10.0) -> int:
    """The batcher's turn cost once it has learned it: the device thread records a forward's speed
    after it has woken the forward's waiters, so a waiter can run before the speed is known."""
    deadline = time.monotonic() + timeout_s
    while b.turn_cost(checkpoint) is None:
        assert time.monotonic() < deadline, "no speed learned"
        await asyncio.sleep(0.001)
    return b.turn_cost(checkpoint)


def test_part_size_follows_the_measured_speed():
    runner = TimedRunner()

    async def body(b):
        await b.submit("m", tagged_rows(20, 100))   # 2,000 tokens: two turns in one forward (budget)
        turn = await turn_learned(b)
        assert turn <= 1000, turn   # a sleep never undershoots; by how much it overshoots is the machine's
        runner.forwards.clear()
        await b.submit("m", tagged_rows(40, 100))

    run_batcher(runner, body, max_batch_tokens=2000)
    # a turn and a quarter at most per forward once the speed is known: 12 rows of 100 tokens
    assert all(n <= 12 for n, _ in runner.forwards) and sum(n for n, _ in runner.forwards) == 40, runner.forwards


def test_the_gateway_sends_a_large_request_whole_and_beside_the_lanes():
    calls = []

    async def call(checkpoint, rows):
        calls.append(rows.n)
        await asyncio.sleep(0.02)
        return rows.n

    async def go():
        co = InferCoalescer(call, max_inflight=1, max_rows=16)
        large = asyncio.ensure_future(co.submit("c", rows_of([5] * 4000)))
        await asyncio.sleep(0)
        small = await co.submit("c", rows_of([3]))   # not held behind the large one's slot
        return await large, small
    (resp, merged, start), small = asyncio.run(go())
    assert resp == 4000 and merged.n == 4000 and start == 0 and small[0] == 1
    assert sorted(calls) == [1, 4000], calls
