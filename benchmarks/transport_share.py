"""HTTP and gRPC clients overloading one `laya-grpc serve` together, each honouring the retry
hints: how many requests each transport gets answered.

N HTTP clients (each its own connection; a 503 is retried after its `Retry-After`) and N gRPC
clients (each its own channel, `AsyncLayaClient`, which waits out the RetryInfo delay itself) send
small requests back to back for `--seconds`. The admission limits are lowered (`--env`, default
8 slots, 16 queue places, 1 s of queue time) so that a shared 2-core box is overloaded by a few
dozen clients; the rules are the defaults' rules at any size. Prints OK per transport, refusals
seen, and the ratio of the two OK counts (the target: within 20%).

    python -m benchmarks.transport_share [--clients 32] [--seconds 20] [--grpc stream|unary]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time

import httpx

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from stack import Stack  # noqa: E402

from laya_grpc.cli.make_checkpoint import make_checkpoint  # noqa: E402
from laya_grpc.client import AsyncLayaClient  # noqa: E402
from laya_grpc.core.errors import LayaError  # noqa: E402

NOUL = {"type": "noul", "instructions": "Is the customer angry?"}
DEFAULT_ENV = "LAYA_MAX_CONCURRENT=8,LAYA_MAX_QUEUE=16,LAYA_QUEUE_TIMEOUT_SECONDS=1"


def _small(i: int) -> dict:
    return {"state": "Order %d arrived broken and I want my money back." % i, "questions": {"angry": NOUL}}


async def _share(stack: Stack, clients: int, seconds: float, grpc_mode: str) -> dict:
    out = {t: {"ok": 0, "refused": 0, "failed": 0, "latency": []} for t in ("http", "grpc")}
    end = time.monotonic() + seconds

    async def http_client(i: int) -> None:
        s = out["http"]
        async with httpx.AsyncClient(timeout=60) as c:
            while time.monotonic() < end:
                t0 = time.monotonic()
                while True:
                    r = await c.post(stack.http + "/v1/systemone", json=_small(i))
                    if r.status_code != 503 or time.monotonic() >= end:
                        break
                    s["refused"] += 1
                    await asyncio.sleep(float(r.headers.get("retry-after", "1")))
                if r.status_code == 200:
                    s["ok"] += 1
                    s["latency"].append(time.monotonic() - t0)
                elif r.status_code != 503:
                    s["failed"] += 1

    async def grpc_client(i: int) -> None:
        s = out["grpc"]
        async with AsyncLayaClient(stack.grpc, timeout=30, stream=grpc_mode == "stream") as c:
            while time.monotonic() < end:
                t0 = time.monotonic()
                try:
                    await c.decide(_small(i)["state"], _small(i)["questions"])
                    if time.monotonic() < end + 1:
                        s["ok"] += 1
                        s["latency"].append(time.monotonic() - t0)
                except LayaError:
                    s["failed"] += 1

    await asyncio.gather(*(http_client(i) for i in range(clients)), *(grpc_client(i) for i in range(clients)))
    for s in out.values():
        lat = sorted(s.pop("latency")) or [0.0]
        s["p50_s"], s["p99_s"] = round(lat[len(lat) // 2], 3), round(lat[int(len(lat) * 0.99)], 3)
    hi, lo = max(out["http"]["ok"], out["grpc"]["ok"]), min(out["http"]["ok"], out["grpc"]["ok"])
    out["ratio"] = round(hi / lo, 2) if lo else None
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=32, help="clients per transport")
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--grpc", dest="grpc_mode", choices=("stream", "unary"), default="stream",
                   help="AsyncLayaClient over DecideStream (its default) or unary Decide")
    p.add_argument("--env", default=DEFAULT_ENV, help="comma-separated LAYA_ settings for the served stack")
    p.add_argument("--rounds", type=int, default=1)
    a = p.parse_args()
    root = os.path.join(os.environ.get("TMPDIR", "/tmp"), "laya-admission-bench")
    ckpt = os.path.join(root, "tiny")
    if not os.path.exists(ckpt):
        make_checkpoint(ckpt, "tiny")
    env = dict(kv.split("=", 1) for kv in a.env.split(",") if kv)
    with Stack({"english": ckpt}, env=env) as s:
        for r in range(a.rounds):
            res = asyncio.run(_share(s, a.clients, a.seconds, a.grpc_mode))
            print(json.dumps({"round": r, "clients_per_transport": a.clients, "seconds": a.seconds,
                              "grpc": a.grpc_mode, "env": env, **res}), flush=True)


if __name__ == "__main__":
    main()
