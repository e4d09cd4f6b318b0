"""Status streams share their heartbeat timers (core/runtime/lifecycle.py ChangeFeed): waiters with one
heartbeat await one future, which the next change or tick resolves for all of them, and one
waiter leaving does not end the others' wait. Through a real `serve`: many `Watch` streams at
the shortest heartbeat each get their heartbeats. The cost figures: benchmarks/watch_streams.py.
"""
from __future__ import annotations

import asyncio
import time

import grpc

from laya_grpc.core.runtime.lifecycle import ChangeFeed
from laya_proto.v1 import decision_pb2_grpc, status_pb2
from stack import Stack


def test_waiters_with_one_heartbeat_share_one_timer_and_wake_together():
    async def main():
        feed = ChangeFeed()
        loop = asyncio.get_running_loop()
        timers_before = len(loop._scheduled)   # noqa: SLF001 - the count of timer handles is the point
        # a 1 s heartbeat: the timer is counted well before it fires, on a slow or shared CPU too.
        # t0 comes before the waiters, so before the timer starts: the tick is at least 1 s after
        # it (asyncio may run a timer early by its clock's resolution, far under 1 ms), however
        # long a loaded CPU takes to start the waiters
        t0 = time.monotonic()
        waiters = [asyncio.ensure_future(feed.wait(feed.sequence, 1.0)) for _ in range(1000)]
        await asyncio.sleep(0.05)                          # every waiter is waiting by now
        assert len(loop._scheduled) - timers_before == 1   # noqa: SLF001
        assert await asyncio.gather(*waiters) == [False] * 1000     # the tick
        assert 0.999 <= time.monotonic() - t0 < 5.0

        seen = feed.sequence
        waiters = [asyncio.ensure_future(feed.wait(seen, 60)) for _ in range(100)]
        await asyncio.sleep(0)
        waiters[0].cancel()                                         # one leaves: the rest still wait
        await asyncio.sleep(0.01)
        assert not any(w.done() for w in waiters[1:])
        feed.bump()
        assert await asyncio.gather(*waiters[1:]) == [True] * 99    # the change wakes them all
        assert await feed.wait(seen, 60) is True                    # already moved: at once
    asyncio.run(main())


def test_many_watch_streams_at_the_shortest_heartbeat_each_get_their_heartbeats(tiny_ckpt):
    with Stack({"english": tiny_ckpt}) as s:
        async def main():
            async with grpc.aio.insecure_channel(s.grpc) as ch:
                stub = decision_pb2_grpc.StatusServiceStub(ch)
                counts = [0] * 300

                async def watch(i):
                    async for ev in stub.Watch(status_pb2.StatusRequest(heartbeat_s=0.2)):
                        counts[i] += 1
                        assert ev.reason in ("initial", "heartbeat", "change") and ev.services
                tasks = [asyncio.ensure_future(watch(i)) for i in range(300)]
                await asyncio.sleep(3.0)
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                return counts
        counts = asyncio.run(main())
    # 3 s at 0.2 s is 15 heartbeats; on a loaded shared box each stream still gets well over half
    assert min(counts) >= 8, sorted(counts)[:10]
