"""The gateway's warm-up: requests through its own HTTP app before it reports ready.

Sent straight into the ASGI app (no socket), so they run everything a client request runs
(auth, body reading, parsing, routing, tokenizer, inference, decoding, rendering) and the first
real request pays no first-use cost. Only the response status is kept.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time

from laya_grpc.core.runtime import memory

log = logging.getLogger("gateway")


WARMUP_QUESTIONS = {"c": {"type": "choice", "instructions": "warm-up", "criteria": ["a", "b", "c"]},
                    "s": {"type": "score", "instructions": "warm-up", "criteria": ["low", "high"]},
                    "n": {"type": "noul", "instructions": "warm-up"}}


async def warm_up(app, checkpoints: list, api_key, n_tokenizers: int = 1) -> str:
    """Requests through the HTTP app itself (auth, body, parse, routing, tokenizer, inference,
    decode, render): one per warm checkpoint plus one auto-routed, each sent once to every tokenizer
    worker (the n copies go at once: a call goes to the first idle worker, so n calls in flight
    together reach all n). Failures are logged, not fatal. Returns what was done, for the status
    stream."""
    t0 = time.perf_counter()
    headers = [(b"content-type", b"application/json")]
    if api_key:
        headers.append((b"authorization", b"Bearer " + api_key.encode()))
    bodies = [{"model": name} for name in checkpoints] + [{}]
    n_tok = max(1, n_tokenizers)
    n_http = n_ok = 0
    for extra in bodies:
        body = json.dumps(dict({"state": "A short warm-up text for the gateway.", "questions": WARMUP_QUESTIONS},
                               **extra)).encode()
        ids = range(n_http + 1, n_http + n_tok + 1)   # a request id says what it is in the access log and traces
        n_http += n_tok
        for status in await asyncio.gather(*(_asgi_post(app, "/v1/systemone", body,
                                                        headers + [(b"x-request-id", b"warmup-%d" % i)]) for i in ids)):
            n_ok += status == 200
            if status != 200:
                log.warning("warm-up request %s answered %d", extra or "(auto-routed)", status)
    detail = "warm-up: %d/%d requests answered, through %d tokenizers, checkpoints %s + auto-routed, %.0f ms" % (
        n_ok, n_http, n_tok, ",".join(checkpoints) or "-", (time.perf_counter() - t0) * 1e3)
    log.info("gateway %s", detail)
    memory.freeze_warm_heap()
    return detail


async def _asgi_post(app, path: str, body: bytes, headers: list) -> int:
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": headers + [(b"content-length", str(len(body)).encode())],
             "client": ("127.0.0.1", 0), "server": ("127.0.0.1", 0)}
    sent = {"status": 0}
    chunks = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive():
        if chunks:
            return chunks.pop(0)
        await asyncio.Event().wait()   # a client that stays: http.disconnect would abandon the request

    async def send(message):
        if message["type"] == "http.response.start":
            sent["status"] = message["status"]
    await app(scope, receive, send)
    return sent["status"]
