"""Connection caps on both public ports: a flood of silent connections costs a bounded number of
descriptors and locks no client out (gateway/conn_limits.py)."""
import json
import socket
import time

import grpc
import pytest

from laya_grpc.core.wire import rpc
from laya_grpc.client.requests import build_decide
from laya_proto.v1 import decision_pb2_grpc
from stack import Stack

CAP = 40
SILENT = 200
BODY = {"state": "My parcel is late again.",
        "questions": {"n": {"type": "noul", "instructions": "Is the customer angry?"}}}


def _silent(port: int, n: int) -> list:
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        socks.append(s)
    return socks


def _closed_by_peer(s: socket.socket, wait_s: float) -> bool:
    """True when the peer closed `s` (EOF or reset) within wait_s."""
    s.settimeout(wait_s)
    try:
        data = s.recv(65536)
        while data:   # gRPC sends its SETTINGS first; read on until the close
            data = s.recv(65536)
        return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def _http_request(port: int) -> tuple:
    body = json.dumps(BODY).encode()
    t = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"POST /v1/systemone HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = s.recv(65536)
            assert chunk, "connection closed without an answer"
            head += chunk
    return int(head.split(b" ", 2)[1]), time.perf_counter() - t


@pytest.fixture(scope="module")
def capped(tiny_ckpt):
    env = {"LAYA_HTTP_MAX_CONNECTIONS": str(CAP), "LAYA_GRPC_MAX_CONNECTIONS": str(CAP)}
    with Stack({"english": tiny_ckpt}, env=env) as s:
        yield s


def test_silent_http_connections_are_shed_not_clients(capped):
    """Five times the cap of silent connections: each new client still gets its answer (the
    oldest silent connection is closed for it), where a plain cap refused every new client
    until the silent ones timed out."""
    socks = _silent(capped.http_port, 5 * CAP)
    try:
        times = []
        for _ in range(10):
            status, took = _http_request(capped.http_port)
            assert status == 200
            times.append(took)
        shed = sum(_closed_by_peer(s, 0.05) for s in socks[:CAP])
        assert shed == CAP, "the oldest silent connections were not the ones closed"
    finally:
        for s in socks:
            s.close()


def test_grpc_port_caps_connections_and_closes_silent_ones(capped):
    with grpc.insecure_channel(capped.grpc, options=rpc.CHANNEL_OPTIONS) as ch:
        stub = decision_pb2_grpc.DecisionServiceStub(ch)
        req = build_decide(BODY["state"], BODY["questions"])
        assert len(stub.Decide(req, timeout=30).answers) == 1
        socks = _silent(capped.grpc_port, CAP + 20)
        try:
            # past the cap, gRPC closes a new connection at once
            assert sum(_closed_by_peer(s, 1.0) for s in socks[CAP:]) >= 15
            # a client already connected is still served
            assert len(stub.Decide(req, timeout=30).answers) == 1
            # a connection that never starts HTTP/2 is closed after the handshake timeout (10 s)
            assert all(_closed_by_peer(s, 20.0) for s in socks[:5])
        finally:
            for s in socks:
                s.close()


def test_growth_trim_follows_the_low_water_mark(monkeypatch):
    """The gateway's trim after connection churn: none while RSS stays near its low-water mark;
    while it is above by the threshold, a trim, and the wait doubles while trims return nothing
    (memory in use) and resets once one does."""
    import asyncio
    from laya_grpc.core.runtime import memory
    clock = {"t": 0.0}
    rss = {"mb": 100}
    trims = []

    def fake_trim():
        before = rss["mb"]
        if clock["t"] >= 30:       # the connections closed: their memory can be returned
            rss["mb"] = 101
        trims.append((clock["t"], before, rss["mb"]))
        return True, before << 20, rss["mb"] << 20, 0.001

    async def fake_sleep(s):
        clock["t"] += s
        if clock["t"] >= 2:
            rss["mb"] = max(rss["mb"], 140) if clock["t"] < 30 else rss["mb"]
        await real_sleep(0)

    real_sleep = asyncio.sleep
    monkeypatch.setattr(memory, "rss_bytes", lambda: rss["mb"] << 20)
    monkeypatch.setattr(memory, "trim_available", lambda: True)
    monkeypatch.setattr(memory, "_trim_and_measure", fake_trim)

    async def run():
        async def on_thread(fn):
            return fn()
        monkeypatch.setattr(memory.asyncio, "sleep", fake_sleep)
        g = memory.GrowthTrim(on_thread, growth_bytes=16 << 20, period_s=1.0, max_period_s=8.0)
        g.start()
        while clock["t"] < 80:
            await real_sleep(0)
        g.close()
    asyncio.run(run())
    times = [t for t, _, _ in trims]
    # in use until t=30: trims at 2, then the waits double (2, 4, 8, 8 ...); the first after 30 returns it
    assert times[:4] == [2.0, 4.0, 8.0, 16.0], trims
    assert trims[-1][2] == 101 and all(t < 40 for t in times), trims


def test_accept_errors_are_folded_into_one_line(caplog):
    """asyncio reports every refused accept when descriptors run out (up to 2,048 a second);
    the gateway logs one warning for them, and other loop errors as before."""
    import asyncio
    import errno
    import logging
    from laya_grpc.gateway import conn_limits
    conn_limits._accept_state.update(count=0, since=0.0, logged=-1e18)
    loop = asyncio.new_event_loop()
    try:
        conn_limits.quiet_accept_errors(loop)
        with caplog.at_level(logging.WARNING):
            for _ in range(5000):
                loop.call_exception_handler({"message": "socket.accept() out of system resource",
                                             "exception": OSError(errno.EMFILE, "Too many open files")})
            loop.call_exception_handler({"message": "something else broke"})
    finally:
        loop.close()
    lines = [r.getMessage() for r in caplog.records]
    assert sum("out of descriptors" in m for m in lines) == 1, lines[:5]
    assert not any("socket.accept() out of system resource" in m for m in lines)
    assert any("something else broke" in m for m in lines)
