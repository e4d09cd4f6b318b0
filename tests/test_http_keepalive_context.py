"""A request on a kept-alive HTTP connection starts clean: nothing of the request before it
(its deadline, its scope) carries over.

Reading a body over 64 KiB pauses the socket; the request's own `receive()` resumes it, and
asyncio then runs the connection's reader, and so starts the next request, in that request's
context (CPython #140947). The deadline set for that request then bound every later request on
the connection: once it passed, each was answered 408 at once."""
from __future__ import annotations

import time

import httpx

from hostile_clients import SMALL
from stack import Stack

TIMEOUT_S = 3.0   # the large request itself must finish within it, on a slow or shared CPU too


def test_next_request_on_a_kept_alive_connection_has_its_own_deadline(tiny_ckpt):
    words = "the parcel arrived late and the refund never came "
    # ~120 KiB: over the 64 KiB that pauses the socket, in 4 rows of work
    big = {"model": "english", "states": [("%d " % i) + words * 600 for i in range(4)],
           "questions": {"late": SMALL["questions"]["late"]}}
    with Stack({"english": tiny_ckpt}, env={"LAYA_REQUEST_TIMEOUT_SECONDS": str(TIMEOUT_S)}) as s, \
            httpx.Client(timeout=60) as client:   # one connection, kept alive
        r = client.post(s.http + "/v1/systemone/batch", json=big)
        assert r.status_code == 200, r.text
        time.sleep(TIMEOUT_S + 0.5)   # the large request's deadline has passed
        for _ in range(2):
            r = client.post(s.http + "/v1/systemone", json=SMALL)
            assert r.status_code == 200, r.text
