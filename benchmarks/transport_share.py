"""HTTP and gRPC clients overloading one `laya-grpc serve` together, each honouring the retry
hints: how many requests each transport gets answered.

N HTTP clients (each its own kept-alive connection, bare HTTP/1.1; a 503 is retried after its
`Retry-After`) and N gRPC
clients (each its own channel: `AsyncLayaClient` or, `--grpc blocking`, `LayaClient` on threads;
both wait out the RetryInfo delay themselves) send
small requests back to back for `--seconds`. The admission limits are lowered (`--env`, default
8 slots, 16 queue places, 1 s of queue time) so that a shared 2-core box is overloaded by a few
dozen clients; the rules are the defaults' rules at any size. Each transport's clients run in a
process of their own, so that neither's client-side CPU slows the other. Prints OK per transport,
the refusals each client saw (HTTP) and the gateway counted (`laya_gateway_rejected_total` by
transport and reason), and the ratio of the two OK counts (the target: within 20%).

    python -m benchmarks.transport_share [--clients 32] [--seconds 20] [--grpc stream|unary|blocking]
"""
from __future__ import annotations

import argparse
import asyncio
import functools
import json
import multiprocessing
import os
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from benchmarks.admission_burst import tiny_checkpoint  # noqa: E402
from stack import Stack, free_port  # noqa: E402

from laya_grpc.bench import raw_http  # noqa: E402
from laya_grpc.client import AsyncLayaClient, LayaClient  # noqa: E402
from laya_grpc.core.errors import LayaError  # noqa: E402

NOUL = {"type": "noul", "instructions": "Is the customer angry?"}
DEFAULT_ENV = "LAYA_MAX_CONCURRENT=8,LAYA_MAX_QUEUE=16,LAYA_QUEUE_TIMEOUT_SECONDS=1"


def _small(i: int) -> dict:
    return {"state": "Order %d arrived broken and I want my money back." % i, "questions": {"angry": NOUL}}


async def _exchange(reader, writer, request: bytes) -> tuple[int, dict]:
    """One request on a kept-alive connection, without a client library (whose CPU on a shared
    2-core box would slow the HTTP clients against the gRPC ones): its status and headers."""
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict((k.strip().lower(), v.strip()) for k, _, v in (ln.partition(":") for ln in lines[1:] if ln))
    await reader.readexactly(int(headers.get("content-length", "0")))
    return int(lines[0].split()[1]), headers


async def _clients(transport: str, http: str, grpc_addr: str, clients: int, start: float, seconds: float,
                   grpc_mode: str) -> dict:
    out = {"ok": 0, "refused": 0, "failed": 0, "latency": []}
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(clients))   # a thread per blocking client
    await asyncio.sleep(max(0.0, start - time.time()))
    end = time.monotonic() + seconds

    async def http_client(i: int) -> None:
        host, _, port = http.replace("http://", "").rpartition(":")
        reader, writer = await asyncio.open_connection(host, int(port))   # one kept-alive connection
        request = raw_http.post_bytes(http, "/v1/systemone", json.dumps(_small(i)).encode())
        try:
            while time.monotonic() < end:
                t0 = time.monotonic()
                while True:
                    status, headers = await _exchange(reader, writer, request)
                    if status != 503 or time.monotonic() >= end:
                        break
                    out["refused"] += 1
                    await asyncio.sleep(float(headers.get("retry-after", "1")))
                if status == 200:
                    out["ok"] += 1
                    out["latency"].append(time.monotonic() - t0)
                elif status != 503:
                    out["failed"] += 1
        finally:
            writer.close()

    async def grpc_client(i: int) -> None:
        if grpc_mode == "blocking":   # LayaClient, on a thread of its own
            c = LayaClient(grpc_addr, timeout=30)
            decide = functools.partial(asyncio.to_thread, c.decide)
        else:
            c = AsyncLayaClient(grpc_addr, timeout=30, stream=grpc_mode == "stream")
            decide = c.decide
        try:
            while time.monotonic() < end:
                t0 = time.monotonic()
                try:
                    await decide(_small(i)["state"], _small(i)["questions"])
                    out["ok"] += 1
                    out["latency"].append(time.monotonic() - t0)
                except LayaError:
                    out["failed"] += 1
        finally:
            closed = c.close()
            if closed is not None:
                await closed

    one = http_client if transport == "http" else grpc_client
    await asyncio.gather(*(one(i) for i in range(clients)))
    lat = sorted(out.pop("latency")) or [0.0]
    out["p50_s"], out["p99_s"] = round(lat[len(lat) // 2], 3), round(lat[int(len(lat) * 0.99)], 3)
    return out


def _client_process(transport: str, args: tuple, results) -> None:
    results.put((transport, asyncio.run(_clients(transport, *args))))


def _refusals(metrics_url: str) -> dict:
    """laya_gateway_rejected_total by api and reason, from serve's metrics endpoint."""
    counts = {}
    for line in httpx.get(metrics_url, timeout=10).text.splitlines():
        m = re.match(r'laya_gateway_rejected_total\{api="(\w+)",reason="(\w+)"\} ([0-9.e+]+)', line)
        if m:
            counts["%s/%s" % m.group(1, 2)] = int(float(m.group(3)))
    return counts


def _share(stack: Stack, metrics_url: str, clients: int, seconds: float, grpc_mode: str) -> dict:
    """One process of clients per transport (their client-side CPU apart), started together."""
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    start = time.time() + 3.0
    before = _refusals(metrics_url)
    procs = [ctx.Process(target=_client_process, args=(t, (stack.http, stack.grpc, clients, start, seconds, grpc_mode),
                                                         results)) for t in ("http", "grpc")]
    for p in procs:
        p.start()
    out = dict(results.get() for _ in procs)
    for p in procs:
        p.join()
    after = _refusals(metrics_url)
    out["gateway_refusals"] = {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}
    hi, lo = max(out["http"]["ok"], out["grpc"]["ok"]), min(out["http"]["ok"], out["grpc"]["ok"])
    out["ratio"] = round(hi / lo, 2) if lo else None
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=32, help="clients per transport")
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--grpc", dest="grpc_mode", choices=("stream", "unary", "blocking"), default="stream",
                   help="AsyncLayaClient over DecideStream (its default), its unary Decide, or the blocking "
                        "LayaClient on threads")
    p.add_argument("--env", default=DEFAULT_ENV, help="comma-separated LAYA_ settings for the served stack")
    p.add_argument("--rounds", type=int, default=1)
    a = p.parse_args()
    ckpt = tiny_checkpoint()
    env = dict(kv.split("=", 1) for kv in a.env.split(",") if kv)
    metrics = "127.0.0.1:%d" % free_port()
    with Stack({"english": ckpt}, env=env, extra_args=["--metrics", metrics]) as s:
        for r in range(a.rounds):
            res = _share(s, "http://%s/metrics" % metrics, a.clients, a.seconds, a.grpc_mode)
            print(json.dumps({"round": r, "clients_per_transport": a.clients, "seconds": a.seconds,
                              "grpc_client": a.grpc_mode, "env": env, **res}), flush=True)


if __name__ == "__main__":
    main()
