"""How much of a hop is the OS waking a sleeping thread: round trips between two processes and two
threads, blocking against busy-polling, and a grpc.aio unary round trip with the event loop's selector
blocking against spinning (laya_grpc.busy_poll).

Why: on the H200 host one internal RPC cost ~1.4 ms over its work and ~0.6 ms on the 2-core CI box
(docs/performance.md). If waking a sleeping thread there costs ~100+ us (virtualised idle CPUs), a
request's ~10 wake-ups explain it, and polling for a short while before sleeping removes most.

`python -m benchmarks.wakeup [-n 2000] [--json]`; prints p50/p95 microseconds per round trip.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import threading
import time

import numpy as np


def _pipe_echo(r: int, w: int, spin: bool, n: int) -> None:
    if spin:
        os.set_blocking(r, False)
    for _ in range(n):
        while True:
            try:
                b = os.read(r, 1)
                break
            except BlockingIOError:
                continue
        os.write(w, b)


def pipe_rtt(n: int, spin: bool) -> list:
    a_r, a_w = os.pipe()
    b_r, b_w = os.pipe()
    p = mp.get_context("fork").Process(target=_pipe_echo, args=(a_r, b_w, spin, n))
    p.start()
    if spin:
        os.set_blocking(b_r, False)
    out = []
    for _ in range(n):
        t = time.perf_counter()
        os.write(a_w, b"x")
        while True:
            try:
                os.read(b_r, 1)
                break
            except BlockingIOError:
                continue
        out.append(time.perf_counter() - t)
        time.sleep(0.0002)          # let the echo side go idle, as between a request's hops
    p.join()
    return out


def thread_rtt(n: int) -> list:
    """A job handed to another thread and its answer handed back (the batcher's device thread).
    Blocking only: threads of one process spinning for each other would fight over the GIL."""
    req, rep = [None], [None]
    cv = threading.Condition()

    def worker():
        for _ in range(n):
            with cv:
                while req[0] is None:
                    cv.wait()
                rep[0], req[0] = req[0], None
                cv.notify_all()
    th = threading.Thread(target=worker)
    th.start()
    out = []
    for i in range(n):
        t = time.perf_counter()
        with cv:
            req[0] = i
            cv.notify_all()
            while rep[0] is None:
                cv.wait()
            rep[0] = None
        out.append(time.perf_counter() - t)
        time.sleep(0.0002)
    th.join()
    return out


def _grpc_server(addr: str, spin_us: int, ready) -> None:
    import grpc
    from grpc_health.v1 import health, health_pb2_grpc
    from laya_grpc import busy_poll

    async def main():
        srv = grpc.aio.server()
        health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), srv)
        srv.add_insecure_port(addr)
        await srv.start()
        ready.set()
        await srv.wait_for_termination()
    busy_poll.run(main(), spin_us)


def grpc_rtt(n: int, spin_us: int) -> list:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from laya_grpc import busy_poll
    addr = "unix:/tmp/laya-wakeup-%d.sock" % os.getpid()
    ready = mp.get_context("spawn").Event()
    p = mp.get_context("spawn").Process(target=_grpc_server, args=(addr, spin_us, ready), daemon=True)
    p.start()
    ready.wait(30)
    out = []

    async def main():
        async with grpc.aio.insecure_channel(addr) as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            req = health_pb2.HealthCheckRequest()
            for _ in range(50):
                await stub.Check(req)
            for _ in range(n):
                t = time.perf_counter()
                await stub.Check(req)
                out.append(time.perf_counter() - t)
                time.sleep(0.0002)
    busy_poll.run(main(), spin_us)
    p.terminate()
    p.join()
    return out


def summary(xs: list) -> dict:
    us = np.asarray(xs) * 1e6
    return {"p50_us": round(float(np.median(us)), 1), "p95_us": round(float(np.percentile(us, 95)), 1), "n": len(us)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.wakeup")
    p.add_argument("-n", type=int, default=2000)
    p.add_argument("--spin-us", type=int, default=2000, help="busy-poll window of the spinning grpc case")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    res = {"cpus": os.cpu_count()}
    res["pipe_block"] = summary(pipe_rtt(a.n, False))
    res["pipe_spin"] = summary(pipe_rtt(a.n, True))
    res["thread_block"] = summary(thread_rtt(a.n))
    res["grpc_block"] = summary(grpc_rtt(a.n, 0))
    res["grpc_spin_%dus" % a.spin_us] = summary(grpc_rtt(a.n, a.spin_us))
    if a.json:
        print(json.dumps(res))
    else:
        for k, v in res.items():
            print("%-22s %s" % (k, v))
    return 0


if __name__ == "__main__":
    sys.exit(main())
