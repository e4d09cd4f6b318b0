"""Admission: a bounded wait queue in front of slots and rows, shared by HTTP and gRPC.

Unit tests drive `Admission` on an event loop; the stack tests send real bursts through
`laya-grpc serve` with its defaults (timings are measured by benchmarks/admission_burst.py).
"""
from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import grpc
import httpx
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from laya_grpc.client import AsyncLayaClient, LayaClient
from laya_grpc.core.errors import Kind, LayaError
from laya_grpc.gateway.admission import Admission, Limits, rows_of
from laya_proto.v1 import decision_pb2, decision_pb2_grpc
from stack import Stack

NOUL = {"type": "noul", "instructions": "Is the customer angry?"}


def run(coro):
    return asyncio.run(coro)


async def _hold(adm: Admission, client: str, rows: int, release: asyncio.Event, log: list, name: str):
    async with adm.enter(client) as t:
        await t.charge(rows)
        log.append(name)
        await release.wait()


def test_a_full_gateway_queues_instead_of_refusing():
    async def main():
        adm = Admission(Limits(max_concurrent=2, max_queue=4, queue_timeout_s=5))
        release, log = asyncio.Event(), []
        holders = [asyncio.ensure_future(_hold(adm, "a", 1, release, log, "h%d" % i)) for i in range(2)]
        await asyncio.sleep(0.01)
        third = asyncio.ensure_future(_hold(adm, "a", 1, asyncio.Event(), log, "third"))
        await asyncio.sleep(0.01)
        assert log == ["h0", "h1"] and adm.waiting == 1 and not third.done()
        release.set()
        await asyncio.sleep(0.01)
        assert "third" in log and adm.taken == 1
        third.cancel()
        await asyncio.gather(*holders, third, return_exceptions=True)
        assert adm.taken == 0 and adm.rows == 0 and adm.per_client == {}
    run(main())


def test_past_the_queue_is_busy_at_once_and_after_the_queue_time():
    async def main():
        adm = Admission(Limits(max_concurrent=1, max_queue=1, queue_timeout_s=0.2))
        release, log = asyncio.Event(), []
        holder = asyncio.ensure_future(_hold(adm, "a", 1, release, log, "h"))
        await asyncio.sleep(0.01)
        waiter = asyncio.ensure_future(_hold(adm, "b", 1, release, log, "w"))
        await asyncio.sleep(0.01)
        with pytest.raises(LayaError) as full:          # the queue holds one: refused at once
            await _hold(adm, "c", 1, release, log, "x")
        assert full.value.kind is Kind.BUSY
        with pytest.raises(LayaError) as late:          # the waiter ran out of queue time
            await waiter
        assert late.value.kind is Kind.BUSY and adm.waiting == 0
        release.set()
        await holder
        assert adm.taken == 0
    run(main())


def test_small_requests_pass_heavy_ones_that_wait_for_rows():
    async def main():
        adm = Admission(Limits(max_concurrent=100, max_rows=rows_of(64, 64), small_rows=64, queue_timeout_s=5))
        release, log = asyncio.Event(), []
        heavy = [asyncio.ensure_future(_hold(adm, "grpc:h", rows_of(64, 64), release, log, "heavy%d" % i))
                 for i in range(16)]
        await asyncio.sleep(0.01)
        assert log == ["heavy0"] and adm.waiting == 15     # one heavy batch fits the row budget at a time
        small = [asyncio.ensure_future(_hold(adm, "http:s%d" % i, rows_of(1, 8), asyncio.Event(), log, "small%d" % i))
                 for i in range(8)]
        await asyncio.sleep(0.01)
        assert all("small%d" % i in log for i in range(8))   # not behind the heavy ones
        release.set()
        await asyncio.gather(*heavy)
        assert sum(n.startswith("heavy") for n in log) == 16
        for t in small:
            t.cancel()
        await asyncio.gather(*small, return_exceptions=True)
        assert adm.taken == 0 and adm.rows == 0
    run(main())


def test_a_request_over_the_whole_budget_runs_alone():
    async def main():
        adm = Admission(Limits(max_rows=100, small_rows=1))
        async with adm.enter("a") as t:
            await asyncio.wait_for(t.charge(1000), 1)
            assert adm.rows == 1000
    run(main())


def test_freed_room_goes_to_the_client_holding_least():
    async def main():
        adm = Admission(Limits(max_concurrent=3, queue_timeout_s=5))
        release_a, release_b, log = asyncio.Event(), asyncio.Event(), []
        a = [asyncio.ensure_future(_hold(adm, "grpc:a", 1, release_a, log, "a%d" % i)) for i in range(2)]
        b0 = asyncio.ensure_future(_hold(adm, "http:b", 1, release_b, log, "b0"))
        await asyncio.sleep(0.01)
        a_more = asyncio.ensure_future(_hold(adm, "grpc:a", 1, asyncio.Event(), log, "a-more"))   # waits first
        await asyncio.sleep(0.01)
        b_more = asyncio.ensure_future(_hold(adm, "http:b", 1, asyncio.Event(), log, "b-more"))
        await asyncio.sleep(0.01)
        release_b.set()          # b0 leaves: b holds 0 slots, a holds 2, so b's waiter goes first
        await asyncio.sleep(0.01)
        assert "b-more" in log and "a-more" not in log
        release_a.set()
        await asyncio.sleep(0.01)
        assert "a-more" in log
        for t in (a_more, b_more):
            t.cancel()
        await asyncio.gather(*a, b0, a_more, b_more, return_exceptions=True)
        assert adm.taken == 0
    run(main())


def test_a_waiter_cancelled_by_its_client_leaves_nothing_behind():
    async def main():
        adm = Admission(Limits(max_concurrent=1, queue_timeout_s=5))
        release, log = asyncio.Event(), []
        holder = asyncio.ensure_future(_hold(adm, "a", 1, release, log, "h"))
        await asyncio.sleep(0.01)
        waiter = asyncio.ensure_future(_hold(adm, "b", 1, release, log, "w"))
        await asyncio.sleep(0.01)
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        assert adm.waiting == 0
        release.set()
        await holder
        assert adm.taken == 0 and adm.per_client == {}
    run(main())


class _Clock:
    """The admission's clock, moved by hand: retry delays without sleeping through them."""

    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def _enter(adm: Admission, client: str, conn: str, release: asyncio.Event, log: list, name: str):
    async with adm.enter(client, conn):
        log.append(name)
        await release.wait()


async def _busy(coro) -> bool:
    try:
        await asyncio.wait_for(coro, 0.05)
    except LayaError as e:
        assert e.kind is Kind.BUSY
        return True
    except asyncio.TimeoutError:
        return False
    raise AssertionError("admitted")


def test_a_resend_before_the_retry_delay_gets_no_place_and_restarts_the_delay():
    async def main():
        clock = _Clock()
        adm = Admission(Limits(max_concurrent=1, max_queue=1, queue_timeout_s=30), retry_delay_s=1.0, clock=clock)
        release, log = asyncio.Event(), []
        holder = asyncio.ensure_future(_enter(adm, "http:h", "http:h:1", release, log, "holder"))
        await asyncio.sleep(0.01)
        waiter = asyncio.ensure_future(_enter(adm, "http:w", "http:w:1", release, log, "waiter"))
        await asyncio.sleep(0.01)
        assert await _busy(_enter(adm, "grpc:g", "grpc:g:1", release, log, "g"))   # the queue is full
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        assert adm.waiting == 0                                  # a place is free now, but:
        clock.now += 0.5
        assert await _busy(_enter(adm, "grpc:g", "grpc:g:1", release, log, "g"))   # too early: no place
        clock.now += 0.7                                         # 1.2 s after the first refusal,
        assert await _busy(_enter(adm, "grpc:g", "grpc:g:1", release, log, "g"))   # 0.7 after the last
        other = asyncio.ensure_future(_enter(adm, "grpc:g", "grpc:g:2", release, log, "g2"))
        await asyncio.sleep(0.01)
        assert adm.waiting == 1 and not other.done()             # another connection of the host: a place
        other.cancel()
        await asyncio.gather(other, return_exceptions=True)
        clock.now += 1.0                                         # waited the whole delay
        back = asyncio.ensure_future(_enter(adm, "grpc:g", "grpc:g:1", release, log, "g"))
        await asyncio.sleep(0.01)
        assert adm.waiting == 1 and not back.done()
        release.set()
        await asyncio.gather(holder, back)
        assert log == ["holder", "g"] and adm.taken == 0 and adm.per_client == {} and adm.queued_per_client == {}
    run(main())


def test_a_wait_cut_by_the_requests_own_deadline_is_a_timeout_and_starts_no_retry_delay():
    from laya_grpc.engine import deadline

    async def main():
        adm = Admission(Limits(max_concurrent=1, max_queue=4, queue_timeout_s=30))
        release, log = asyncio.Event(), []
        holder = asyncio.ensure_future(_enter(adm, "grpc:a", "grpc:a:1", release, log, "holder"))
        await asyncio.sleep(0.01)
        with deadline.within(0.1):
            with pytest.raises(LayaError) as e:
                await _enter(adm, "grpc:b", "grpc:b:1", release, log, "late")
        assert e.value.kind is Kind.TIMEOUT
        again = asyncio.ensure_future(_enter(adm, "grpc:b", "grpc:b:1", release, log, "again"))
        await asyncio.sleep(0.01)
        assert adm.waiting == 1 and not again.done()   # no retry delay: queued at once
        release.set()
        await asyncio.gather(holder, again)
    run(main())


def test_behind_a_proxy_a_connection_carries_no_retry_delay():
    """LAYA_PROXIED_CLIENTS: one connection carries many clients, so a refusal must not keep the
    next request on it (another client's) out of the queue."""
    async def main():
        adm = Admission(Limits(max_concurrent=1, max_queue=1, queue_timeout_s=30, connection_delays=False))
        release, log = asyncio.Event(), []
        holder = asyncio.ensure_future(_enter(adm, "http:proxy", "http:proxy:1", release, log, "holder"))
        await asyncio.sleep(0.01)
        waiter = asyncio.ensure_future(_enter(adm, "http:proxy", "http:proxy:2", release, log, "waiter"))
        await asyncio.sleep(0.01)
        assert await _busy(_enter(adm, "http:proxy", "http:proxy:3", release, log, "x"))   # the queue is full
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        again = asyncio.ensure_future(_enter(adm, "http:proxy", "http:proxy:3", release, log, "again"))
        await asyncio.sleep(0.01)
        assert adm.waiting == 1 and not again.done()   # queued at once, no delay
        release.set()
        await asyncio.gather(holder, again)
    run(main())


def test_a_client_back_after_its_delay_keeps_its_turn():
    async def main():
        clock = _Clock()
        adm = Admission(Limits(max_concurrent=1, max_queue=2, queue_timeout_s=30), retry_delay_s=1.0, clock=clock)
        release, log = asyncio.Event(), []
        holder = asyncio.ensure_future(_enter(adm, "h", "h", release, log, "holder"))
        await asyncio.sleep(0.01)
        early = [asyncio.ensure_future(_enter(adm, c, c, release, log, c)) for c in ("p", "s")]
        await asyncio.sleep(0.01)
        assert await _busy(_enter(adm, "q", "q", release, log, "q"))   # full, and nobody is heavier
        for t in early:
            t.cancel()
        await asyncio.gather(*early, return_exceptions=True)
        newer = asyncio.ensure_future(_enter(adm, "n", "n", release, log, "n"))   # arrived while q waited
        await asyncio.sleep(0.01)
        clock.now += 1.0
        back = asyncio.ensure_future(_enter(adm, "q", "q", release, log, "q"))
        await asyncio.sleep(0.01)
        release.set()
        await asyncio.gather(holder, newer, back)
        assert log == ["holder", "q", "n"]    # q's turn is the one it was refused in
    run(main())


def test_a_full_queue_takes_the_newest_place_of_the_heaviest_client_for_a_light_one():
    async def main():
        clock = _Clock()
        adm = Admission(Limits(max_concurrent=1, max_queue=4, queue_timeout_s=30), retry_delay_s=1.0, clock=clock)
        release, log = asyncio.Event(), []
        holder = asyncio.ensure_future(_enter(adm, "grpc:greedy", "grpc:greedy:1", release, log, "holder"))
        await asyncio.sleep(0.01)
        greedy = [asyncio.ensure_future(_enter(adm, "grpc:greedy", "grpc:greedy:1", release, log, "g%d" % i))
                  for i in range(4)]
        await asyncio.sleep(0.01)
        light = asyncio.ensure_future(_enter(adm, "http:light", "http:light:1", release, log, "light"))
        await asyncio.sleep(0.01)
        assert not light.done() and adm.waiting == 4
        assert greedy[3].done() and isinstance(greedy[3].exception(), LayaError)   # the newest greedy place
        assert greedy[3].exception().kind is Kind.BUSY and not any(g.done() for g in greedy[:3])
        # the evicted connection's retry delay started: at once it gets no place
        assert await _busy(_enter(adm, "grpc:greedy", "grpc:greedy:1", release, log, "again"))
        # light (1 place) against greedy (a slot and 3 places): two lighter, evicts again
        light2 = asyncio.ensure_future(_enter(adm, "http:light", "http:light:2", release, log, "light2"))
        await asyncio.sleep(0.01)
        assert greedy[2].done() and not light2.done()
        # greedy now holds 3 (a slot, two places), light 2: not two lighter, refused
        assert await _busy(_enter(adm, "http:light", "http:light:3", release, log, "light3"))
        release.set()
        await asyncio.gather(holder, light, light2, *greedy, return_exceptions=True)
        assert sorted(log) == sorted(["holder", "g0", "g1", "light", "light2"])
        assert adm.taken == 0 and adm.waiting == 0 and adm.queued_per_client == {}
    run(main())


# -- through the served stack, all defaults ------------------------------------------------------

@pytest.fixture(scope="module")
def stack(tiny_ckpt):
    with Stack({"english": tiny_ckpt}) as s:
        yield s


def _body(i: int) -> dict:
    return {"state": "Order %d arrived broken and I want my money back." % i, "questions": {"angry": NOUL}}


def test_64_concurrent_clients_on_both_transports_are_all_answered(stack):
    """Upstream's 16 slots refused most of such a burst; the defaults queue it instead."""
    statuses = []

    def http(i):
        statuses.append(httpx.post(stack.http + "/v1/systemone", json=_body(i), timeout=60).status_code)

    async def grpc_burst():
        async with AsyncLayaClient(stack.grpc) as c:
            return await asyncio.gather(*(c.decide(_body(i)["state"], _body(i)["questions"]) for i in range(64)),
                                        return_exceptions=True)
    threads = [threading.Thread(target=http, args=(i,)) for i in range(64)]
    for t in threads:
        t.start()
    answers = asyncio.run(grpc_burst())
    for t in threads:
        t.join()
    assert statuses == [200] * 64
    assert [a for a in answers if isinstance(a, Exception)] == []


def test_heavy_batches_holding_the_rows_leave_room_for_small_requests(tiny_ckpt):
    """16 "heavy" batches (2 states x 8 questions; LAYA_SMALL_REQUEST_ROWS=8, the row budget one
    such batch, so the test runs in seconds on a shared CPU) sent at once: one runs, the others
    wait their queue time (2 s) for rows and are then refused 503 (retry); small requests on both
    transports meanwhile all get in (a limit of 16 requests refused them all)."""
    heavy = {"states": ["state %d of the heavy batch" % i for i in range(2)],
             "questions": {"q%d" % j: NOUL for j in range(8)}}
    env = {"LAYA_SMALL_REQUEST_ROWS": "8", "LAYA_MAX_ROWS_IN_FLIGHT": "16",
           "LAYA_QUEUE_TIMEOUT_SECONDS": "2"}
    with Stack({"english": tiny_ckpt}, env=env) as s:
        done = []
        threads = [threading.Thread(target=lambda: done.append(
            httpx.post(s.http + "/v1/systemone/batch", json=heavy, timeout=120).status_code)) for _ in range(16)]
        for t in threads:
            t.start()
        time.sleep(0.5)
        with LayaClient(s.grpc, timeout=30) as c:
            for i in range(3):
                assert httpx.post(s.http + "/v1/systemone", json=_body(i), timeout=30).status_code == 200
                assert c.decide(_body(i)["state"], _body(i)["questions"])["answers"]["angry"]["type"] == "noul"
        for t in threads:
            t.join()
        assert 200 in done and set(done) <= {200, 503} and len(done) == 16, done


def test_past_the_queue_grpc_says_unavailable_with_retry_info_and_the_client_retries(tiny_ckpt):
    """One slot, one waiting place, 0.3 s of queue: a stalled HTTP upload holds the slot. A raw
    gRPC call past the queue gets UNAVAILABLE + RetryInfo + retry-after; LayaClient retries it
    within its deadline and is answered once the upload's 408 frees the slot."""
    env = {"LAYA_MAX_CONCURRENT": "1", "LAYA_MAX_QUEUE": "1", "LAYA_QUEUE_TIMEOUT_SECONDS": "0.3",
           "LAYA_BODY_READ_TIMEOUT": "2"}
    with Stack({"english": tiny_ckpt}, env=env) as s:
        host, port = s.http[len("http://"):].split(":")
        with socket.create_connection((host, int(port))) as stalled:
            stalled.sendall(b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
            time.sleep(0.3)
            with grpc.insecure_channel(s.grpc) as ch:
                with pytest.raises(grpc.RpcError) as e:
                    decision_pb2_grpc.DecisionServiceStub(ch).Decide(decision_pb2.DecideRequest(
                        request_json=json.dumps(_body(0))), timeout=10)
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE
            trailers = dict(e.value.trailing_metadata())
            assert trailers.get("retry-after") == "1" and trailers.get("grpc-retry-pushback-ms") == "1000"
            assert any(d.Is(error_details_pb2.RetryInfo.DESCRIPTOR) for d in rpc_status.from_call(e.value).details)
            r = httpx.post(s.http + "/v1/systemone", json=_body(0), timeout=10)
            assert r.status_code == 503 and r.headers["retry-after"] == "1"
            t0 = time.monotonic()
            with LayaClient(s.grpc, timeout=20) as c:
                out = c.decide(_body(0)["state"], _body(0)["questions"])
            assert out["answers"]["angry"]["type"] == "noul" and time.monotonic() - t0 > 0.5   # it had to retry


def test_the_client_says_nothing_listens_not_retry_shortly():
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    with LayaClient("127.0.0.1:%d" % port, timeout=1.0) as c:
        with pytest.raises(LayaError) as e:
            c.decide("x", {"angry": NOUL})
    assert e.value.kind is Kind.BUSY and "no gateway answered at 127.0.0.1:%d" % port in e.value.detail
    assert "retry shortly" not in e.value.detail
