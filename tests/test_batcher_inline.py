"""The batcher's inline turn: a short batch that finds the device idle runs on the event loop's
thread (no hand-off to the device thread and back), every call of the same loop turn joins it,
large batches and anything that finds the device busy stay on the device thread, and the two
threads never run a forward at the same time. A stand-in runner records where and when each
forward ran; the same Batcher serves the inference service (tests/test_services_e2e.py runs it
with a CPU runner, which never inlines)."""
from __future__ import annotations

import asyncio
import threading
import time

import numpy as np

from laya_grpc.inference.batcher import INLINE_MAX_COST
from test_fair_chunks import rows_of, run_batcher


class RecordingRunner:
    """Each forward: its rows, its thread, and its start and end; answers row i with logits
    1000 x its length + i, so a row answered from the wrong place shows."""
    packing = None

    def __init__(self, inline: bool, ms: float = 2.0) -> None:
        self.forwards_inline = inline
        self.ms = ms
        self.forwards: list[tuple] = []   # (rows, thread name, start, end)
        self._lock = threading.Lock()

    def run_rows(self, rows, pad_id, pad_to):
        t0 = time.perf_counter()
        time.sleep(self.ms / 1e3)
        with self._lock:
            self.forwards.append((rows.n, threading.current_thread().name, t0, time.perf_counter()))
        k = int(rows.marker_counts.max())
        tag = 1000 * rows.lengths.astype(np.float32) + np.arange(rows.n, dtype=np.float32)
        return np.repeat(tag[:, None], k, axis=1), np.repeat(tag[:, None], 3, axis=1)


def _check_answer(res, lengths):
    for i, (lg, n) in enumerate(zip(res.logits, lengths)):
        assert lg[0] % 1000 < res.batch_rows and lg[0] // 1000 == n, (i, lg, n)


def test_a_lone_short_request_runs_on_the_loop_thread():
    runner = RecordingRunner(inline=True)

    async def body(b):
        res = await b.submit("m", rows_of([40, 7]))
        _check_answer(res, [40, 7])
    run_batcher(runner, body)
    assert [(n, t) for n, t, _, _ in runner.forwards] == [(2, "MainThread")], runner.forwards


def test_calls_of_one_loop_turn_share_one_inline_forward():
    runner = RecordingRunner(inline=True)

    async def body(b):
        lengths = [[30], [12, 5], [60]]
        results = await asyncio.gather(*[b.submit("m", rows_of(ls)) for ls in lengths])
        for res, ls in zip(results, lengths):
            _check_answer(res, ls)
    run_batcher(runner, body)
    assert [(n, t) for n, t, _, _ in runner.forwards] == [(4, "MainThread")], runner.forwards


def test_large_batches_and_runners_that_may_not_stay_on_the_device_thread():
    big, eager = RecordingRunner(inline=True), RecordingRunner(inline=False)

    for runner, lengths in ((big, [INLINE_MAX_COST // 2 + 1] * 2), (eager, [10])):
        async def body(b, lengths=lengths):
            _check_answer(await b.submit("m", rows_of(lengths)), lengths)
        run_batcher(runner, body)
    assert [t for _, t, _, _ in big.forwards] == ["laya-device"], big.forwards
    assert [t for _, t, _, _ in eager.forwards] == ["laya-device"], eager.forwards


def test_the_loop_and_the_device_thread_never_run_forwards_at_once():
    """Under a mixed stream (large batches on the device thread, short requests arriving while it
    works and while it is idle), forwards never overlap in time and every answer is right."""
    runner = RecordingRunner(inline=True, ms=3.0)

    async def body(b):
        async def one(i):
            await asyncio.sleep(i * 0.004 + (i % 3) * 0.001)   # bursts and idle gaps
            ls = [INLINE_MAX_COST] * 2 if i % 5 == 0 else [10 + i % 13]
            _check_answer(await b.submit("m", rows_of(ls)), ls)
        await asyncio.gather(*[one(i) for i in range(60)])
    run_batcher(runner, body)
    spans = sorted((s, e) for _, _, s, e in runner.forwards)
    assert all(e1 <= s2 for (_, e1), (s2, _) in zip(spans, spans[1:])), "two forwards overlapped"
    threads = {t for _, t, _, _ in runner.forwards}
    assert threads == {"MainThread", "laya-device"}, threads


def test_work_queued_for_the_device_thread_is_not_overtaken():
    """A load (run_on_device) queued before a short request keeps its place: the request does not
    run inline ahead of it, and runs after it."""
    runner = RecordingRunner(inline=True)
    order = []

    async def body(b):
        gate = threading.Event()
        held = b.run_on_device(lambda: (gate.wait(10), order.append("held")))
        await asyncio.sleep(0.05)     # the device thread is inside the held call
        load = b.run_on_device(lambda: order.append("load"))
        req = asyncio.ensure_future(b.submit("m", rows_of([10])))
        await asyncio.sleep(0.05)
        assert not req.done() and runner.forwards == []
        gate.set()
        await held
        await load
        _check_answer(await req, [10])
        order.append("request")
    run_batcher(runner, body)
    assert order == ["held", "load", "request"], order
    assert [t for _, t, _, _ in runner.forwards] == ["laya-device"], runner.forwards


def test_a_stream_of_requests_keeps_the_device_thread(monkeypatch):
    """A request that comes right after a forward ended (a stream: the loop should keep reading and
    preparing requests while the device works) goes to the device thread; one after a quiet gap
    runs inline again. The idle threshold is raised to 20 ms so a slow test host cannot make a
    back-to-back request look like one after a gap."""
    from laya_grpc.inference import batcher
    monkeypatch.setattr(batcher, "INLINE_IDLE_S", 0.02)
    runner = RecordingRunner(inline=True)

    async def body(b):
        for i in range(3):   # back to back: each submitted as soon as the previous answer came
            _check_answer(await b.submit("m", rows_of([10 + i])), [10 + i])
        await asyncio.sleep(0.1)
        _check_answer(await b.submit("m", rows_of([20])), [20])
    run_batcher(runner, body)
    assert [t for _, t, _, _ in runner.forwards] == ["MainThread", "laya-device", "laya-device", "MainThread"], \
        runner.forwards
