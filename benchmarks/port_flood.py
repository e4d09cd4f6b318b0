"""Silent-connection floods on both public ports of a real `laya-grpc serve` (CPU, tiny checkpoint).

One attacker process per port opens up to `--silent` TCP connections that never send a byte and
opens a new one whenever the gateway closes one, for the whole run. Meanwhile normal clients
send decisions: HTTP over a fresh connection each time, gRPC over a channel opened before the
flood and over a fresh channel each time. Printed: the normal requests' outcome and p50/p99, how
many silent connections each port held open and how many it closed, and how many lines the
stack logged during the flood (the gateway folds accept errors into one line a minute), and the
gateway's RSS before, right after and `--idle` seconds after the flood.

    python -m benchmarks.port_flood [--silent 20000] [--duration 20]

Each attacker process may hold only as many descriptors as its RLIMIT_NOFILE allows (raised to
the hard limit); the gateway's own limit is what `serve` inherits.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import resource
import socket
import sys
import tempfile
import time

import grpc
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from stack import Stack  # noqa: E402

from laya_grpc.cli.make_checkpoint import make_checkpoint  # noqa: E402
from laya_grpc.client.requests import build_decide  # noqa: E402
from laya_grpc.core.runtime import memory  # noqa: E402
from laya_grpc.core.wire import rpc  # noqa: E402
from laya_proto.v1 import decision_pb2_grpc  # noqa: E402

STATE = "My parcel is late again."
QUESTIONS = {"n": {"type": "noul", "instructions": "Is the customer angry?"}}


def _raise_nofile() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def _attacker(port: int, n: int, duration: float, q) -> None:
    n = min(n, _raise_nofile() - 64)
    stats = {"port": port, "opened": 0, "closed_by_server": 0, "connect_failed": 0, "held_max": 0}
    held = [0]

    async def one(deadline, gate):
        while time.monotonic() < deadline:
            try:
                async with gate:   # at most 256 connects at a time: a loaded host still ramps up
                    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 5)
            except (OSError, asyncio.TimeoutError):
                stats["connect_failed"] += 1
                await asyncio.sleep(0.5)
                continue
            stats["opened"] += 1
            held[0] += 1
            stats["held_max"] = max(stats["held_max"], held[0])
            try:
                while True:   # gRPC sends SETTINGS first; read until the close
                    left = deadline - time.monotonic()
                    if left <= 0 or not await asyncio.wait_for(reader.read(65536), left):
                        break
                if time.monotonic() < deadline:
                    stats["closed_by_server"] += 1
            except (OSError, asyncio.TimeoutError):
                if time.monotonic() < deadline:
                    stats["closed_by_server"] += 1
            finally:
                held[0] -= 1
                writer.close()
            await asyncio.sleep(0.05)

    async def main():
        deadline = time.monotonic() + duration
        gate = asyncio.Semaphore(256)
        await asyncio.gather(*[one(deadline, gate) for _ in range(n)])

    asyncio.run(main())
    q.put(stats)


def _http_once(port: int, body: bytes) -> tuple:
    t = time.perf_counter()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.settimeout(5)
            s.sendall(b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n" % len(body) + body)
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = s.recv(65536)
                if not chunk:
                    return "closed", time.perf_counter() - t
                head += chunk
        return head.split(b" ", 2)[1].decode(), time.perf_counter() - t
    except OSError as e:
        return type(e).__name__, time.perf_counter() - t


def _grpc_once(stub, req) -> tuple:
    t = time.perf_counter()
    try:
        stub.Decide(req, timeout=5)
        return "OK", time.perf_counter() - t
    except grpc.RpcError as e:
        return e.code().name, time.perf_counter() - t


def _summary(samples: list) -> dict:
    codes = {}
    for code, _ in samples:
        codes[code] = codes.get(code, 0) + 1
    ms = np.array([t for _, t in samples]) * 1e3
    return {"n": len(samples), "codes": codes, "p50_ms": round(float(np.percentile(ms, 50)), 1) if len(ms) else None,
            "p99_ms": round(float(np.percentile(ms, 99)), 1) if len(ms) else None}


def _rss_mb(pid: int) -> float:
    return round((memory.rss_bytes(pid) or 0) / 2**20, 1)


def _log_lines(log: str) -> int:
    """Lines the stack logged, less the access log (one INFO line per request, off in production)."""
    return sum(1 for line in log.splitlines() if "laya_grpc.access" not in line)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--silent", type=int, default=20000, help="silent connections per port")
    p.add_argument("--duration", type=float, default=20.0)
    p.add_argument("--settle", type=float, default=15.0, help="seconds the flood runs before measuring")
    p.add_argument("--idle", type=float, default=5.0, help="seconds idle before the last RSS reading")
    a = p.parse_args(argv)
    tmp = tempfile.mkdtemp(prefix="laya-port-flood-")
    ckpt = make_checkpoint(os.path.join(tmp, "english"), "tiny")
    body = json.dumps({"state": STATE, "questions": QUESTIONS}).encode()
    req = build_decide(STATE, QUESTIONS)
    with Stack({"english": ckpt}, env={"LAYA_MAX_CONCURRENT": "256"}) as s:
        with grpc.insecure_channel(s.grpc, options=rpc.CHANNEL_OPTIONS) as ch:
            kept = decision_pb2_grpc.DecisionServiceStub(ch)
            kept.Decide(req, timeout=30)
            baseline = {"http": _summary([_http_once(s.http_port, body) for _ in range(20)]),
                        "grpc_kept": _summary([_grpc_once(kept, req) for _ in range(20)])}
            gw = s.child_pid("gateway")
            baseline["gateway_rss_mb"] = _rss_mb(gw)
            print(json.dumps({"before_flood": baseline}), flush=True)
            lines0 = _log_lines(s.full_log())
            ctx = mp.get_context("spawn")
            q = ctx.Queue()
            attackers = [ctx.Process(target=_attacker, args=(port, a.silent, a.duration + a.settle, q))
                         for port in (s.http_port, s.grpc_port)]
            for proc in attackers:
                proc.start()
            time.sleep(a.settle)
            http, kept_s, fresh = [], [], []
            end = time.monotonic() + a.duration
            while time.monotonic() < end:
                http.append(_http_once(s.http_port, body))
                kept_s.append(_grpc_once(kept, req))
                with grpc.insecure_channel(s.grpc, options=rpc.CHANNEL_OPTIONS) as fresh_ch:
                    fresh.append(_grpc_once(decision_pb2_grpc.DecisionServiceStub(fresh_ch), req))
                time.sleep(0.05)
            attacks = [q.get() for _ in attackers]
            for proc in attackers:
                proc.join()
            log = s.full_log()
            during = _log_lines(log) - lines0
            print(json.dumps({"during_flood": {"http_fresh_connection": _summary(http),
                                               "grpc_kept_channel": _summary(kept_s),
                                               "grpc_fresh_channel": _summary(fresh)},
                              "attackers": attacks, "log_lines_during_flood": during}, indent=1), flush=True)
            tail = [line for line in log.splitlines() if "laya_grpc.access" not in line][-during:] if during else []
            for line in tail[:10]:
                print("  log: " + line[:200])
            after = {"http": _summary([_http_once(s.http_port, body) for _ in range(20)]),
                     "grpc_kept": _summary([_grpc_once(kept, req) for _ in range(20)])}
            after["gateway_rss_mb_at_end"] = _rss_mb(gw)
            time.sleep(a.idle)
            after["gateway_rss_mb_after_idle"] = _rss_mb(gw)
            print(json.dumps({"after_flood": after}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
