"""What open `StatusService.Watch` streams cost the gateway: its CPU and a small request's latency
with N streams at a short heartbeat.

For each N (`--streams 0,1000`), a client process opens N `Watch` streams (spread over channels
of at most 500 streams each, under the gateway's 1,024 concurrent streams per connection) at
`--heartbeat` seconds and reads every event; once they are all open, the gateway process's CPU
(user + system, from /proc) is read over `--seconds` while small HTTP requests are sent one after
another. Prints, per N: the gateway's CPU in cores, events the streams received per second, and
the small requests' p50 and p99.

    python -m benchmarks.watch_streams [--streams 0,1000] [--heartbeat 0.2] [--seconds 10]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import sys
import time

import httpx

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from benchmarks.admission_burst import tiny_checkpoint  # noqa: E402
from stack import Stack  # noqa: E402


NOUL = {"type": "noul", "instructions": "Is the customer angry?"}
PER_CHANNEL = 500


def _cpu_s(pid: int) -> float:
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _watchers(address: str, n: int, heartbeat: float, opened, stop, counts) -> None:
    import grpc

    from laya_proto.v1 import decision_pb2_grpc, status_pb2
    channels = [grpc.aio.insecure_channel(address) for _ in range((n + PER_CHANNEL - 1) // PER_CHANNEL)]
    events = [0]

    async def one(i: int) -> None:
        stub = decision_pb2_grpc.StatusServiceStub(channels[i // PER_CHANNEL])
        call = stub.Watch(status_pb2.StatusRequest(heartbeat_s=heartbeat))
        async for _ in call:
            events[0] += 1
            if events[0] >= n:
                opened.set()   # every stream has had (at least) its first event, roughly

    tasks = [asyncio.ensure_future(one(i)) for i in range(n)]
    while not stop.is_set():
        counts.value = events[0]
        await asyncio.sleep(0.1)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for c in channels:
        await c.close()


def _watch_process(address, n, heartbeat, opened, stop, counts) -> None:
    asyncio.run(_watchers(address, n, heartbeat, opened, stop, counts))


def measure(stack: Stack, n: int, heartbeat: float, seconds: float) -> dict:
    ctx = multiprocessing.get_context("spawn")
    opened, stop, counts = ctx.Event(), ctx.Event(), ctx.Value("q", 0)
    proc = None
    if n:
        proc = ctx.Process(target=_watch_process, args=(stack.grpc, n, heartbeat, opened, stop, counts))
        proc.start()
        if not opened.wait(120):
            raise RuntimeError("the watch streams did not open")
        time.sleep(2.0)
    pid = stack.child_pid("gateway")
    lat = []
    with httpx.Client(timeout=30) as c:
        c.post(stack.http + "/v1/systemone", json={"state": "Order 1 arrived broken and I want my money back.", "questions": {"angry": NOUL}})
        cpu0, t0, events0 = _cpu_s(pid), time.monotonic(), counts.value
        while time.monotonic() - t0 < seconds:
            s = time.perf_counter()
            r = c.post(stack.http + "/v1/systemone", json={"state": "Order %d arrived broken and I want my money back." % len(lat),
                                                             "questions": {"angry": NOUL}})
            lat.append(time.perf_counter() - s)
            assert r.status_code == 200, r.text
            time.sleep(0.02)
        wall, cpu = time.monotonic() - t0, _cpu_s(pid) - cpu0
    stop.set()
    if proc is not None:
        proc.join(60)
    lat.sort()
    return {"streams": n, "heartbeat_s": heartbeat, "seconds": round(wall, 1),
            "gateway_cpu_cores": round(cpu / wall, 3),
            "events_per_s": round((counts.value - events0) / wall) if n else 0,
            "small_http": len(lat), "small_http_p50_ms": round(lat[len(lat) // 2] * 1e3, 1),
            "small_http_p99_ms": round(lat[int(len(lat) * 0.99)] * 1e3, 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--streams", default="0,1000")
    p.add_argument("--heartbeat", type=float, default=0.2)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--rounds", type=int, default=1)
    a = p.parse_args()
    ckpt = tiny_checkpoint()
    with Stack({"english": ckpt}) as s:
        for _ in range(a.rounds):
            for n in [int(x) for x in a.streams.split(",")]:
                print(json.dumps(measure(s, n, a.heartbeat, a.seconds)), flush=True)


if __name__ == "__main__":
    main()
