"""Where a served request's time goes, hop by hop, and what each local transport costs.

Two measurements, both against real processes:
- `empty_round_trips`: one call carrying an empty TokenizeRequest to a process that answers at
  once, through the one call multiplexer (core/wire/calls.py) over a gRPC stream and over IPC unix sockets:
  the bare price of one local hop, sequential and with many callers.
- `hop_breakdown`: the two internal calls of a request made from outside against the children
  of a running `serve` over the transport it uses: the tokenizer hop (its server-side encode
  `tokenize_ms`, and the rest: transport both ways and the handler), the inference hop (queue
  wait, model, and the rest). What the HTTP request costs beyond both hops is the gateway's own
  path: HTTP parse, admission, routing, decoding, rendering and its hand-offs.
"""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time

from laya_grpc.core.wire import calls, ipc, rpc
from laya_grpc.core.wire.question_wire import tokenize_request
from laya_proto.internal.v1 import inference_pb2, inference_pb2_grpc, tokenizer_pb2, tokenizer_pb2_grpc
from laya_proto.v1 import tokens_pb2

from . import raw_http
from .stats import summary_ms

TRANSPORTS = ("grpc", "ipc")


# ------------------------------------------------------------------ the empty hop (echo process)

class _Echo(tokenizer_pb2_grpc.TokenizerServiceServicer):
    async def TokenizeStream(self, request_iterator, context):
        await calls.serve_calls(request_iterator, context, _empty, tokenizer_pb2.TokenizeReply,
                                  tokens_pb2.CallError, "Tokenize")


async def _empty(request):
    return tokenizer_pb2.TokenizeResponse()


async def _echo_main(grpc_address: str, ipc_endpoint: str) -> None:
    srv = rpc.server()
    tokenizer_pb2_grpc.add_TokenizerServiceServicer_to_server(_Echo(), srv)
    rpc.bind(srv, grpc_address)
    await srv.start()
    ipc.IpcServer(ipc_endpoint, _empty, tokenizer_pb2.TokenizeCall, tokenizer_pb2.TokenizeReply,
                  tokens_pb2.CallError, "Tokenize").start()
    print("echo ready", flush=True)
    await asyncio.Event().wait()


_SERVICES = {"tokenizer": (tokenizer_pb2.TokenizeCall, tokenizer_pb2.TokenizeReply,
                           lambda ch: tokenizer_pb2_grpc.TokenizerServiceStub(ch).TokenizeStream),
             "inference": (inference_pb2.InferCall, inference_pb2.InferReply,
                           lambda ch: inference_pb2_grpc.InferenceServiceStub(ch).InferStream)}


def _mux(service: str, transport: str, grpc_address: str, ipc_endpoint: str):
    """(mux, channel or None) for the tokenizer or inference service at these addresses over `transport`."""
    call, reply, stream = _SERVICES[service]
    if transport == "ipc":
        return ipc.mux(ipc_endpoint, call, reply, service), None
    ch = rpc.channel(grpc_address)
    return calls.stream_mux(stream(ch), call, service), ch


async def _close(mux, ch) -> None:
    await mux.close()
    if ch is not None:
        await ch.close()


async def _sequential(call, n: int) -> list:
    for _ in range(max(5, n // 10)):   # warm: connection, first-use costs
        await call()
    out = []
    for _ in range(n):
        t = time.perf_counter()
        await call()
        out.append(time.perf_counter() - t)
    return out


async def _throughput(call, clients: int, seconds: float) -> float:
    done = 0
    deadline = time.perf_counter() + seconds

    async def one():
        nonlocal done
        while time.perf_counter() < deadline:
            await call()
            done += 1
    await asyncio.gather(*[one() for _ in range(clients)])
    return done / seconds


def empty_round_trips(n: int = 2000, clients: int = 64, seconds: float = 2.0) -> list:
    """[{transport, p50_ms, p95_ms, calls_per_s}] for an empty call to another process."""
    d = tempfile.mkdtemp(prefix="laya-hops-")
    g, i = "unix:" + os.path.join(d, "echo.sock"), "ipc://" + os.path.join(d, "echo.ipc")
    proc = subprocess.Popen([sys.executable, "-m", "laya_grpc.bench.hop_timing", "echo", g, i], stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline().startswith(b"echo ready"), "echo process did not start"

        async def main():
            out = []
            for t in TRANSPORTS:
                mux, ch = _mux("tokenizer", t, g, i)
                req = tokenizer_pb2.TokenizeRequest()
                call = lambda: mux.call(req, 10)  # noqa: E731
                lat = await _sequential(call, n)
                cps = await _throughput(call, clients, seconds)
                out.append({"transport": t, **summary_ms(lat), "clients": clients, "calls_per_s": cps})
                await _close(mux, ch)
            return out
        return asyncio.run(main())
    finally:
        proc.kill()
        proc.wait()


# ------------------------------------------------------------------ the two hops of a served request

def hop_breakdown(run_dir: str, transport: str, state, questions: dict, model: str, n: int) -> dict:
    """p50/p95 of each part of the two internal calls, made the way the gateway makes them, against
    `serve`'s children in `run_dir` (tokenizer-0 and inference)."""
    def addr(name):
        return "unix:" + os.path.join(run_dir, name + ".sock"), "ipc://" + os.path.join(run_dir, name + ".ipc")

    async def main():
        tmux, tch = _mux("tokenizer", transport, *addr("tokenizer-0"))
        imux, ich = _mux("inference", transport, *addr("inference"))
        treq = tokenize_request(tokenizer_pb2.TokenizeRequest, model, [state], questions)
        parts = {k: [] for k in ("tokenizer_hop", "tokenize_server", "tokenizer_transport", "inference_hop",
                                 "queue_wait", "model", "inference_transport")}
        try:
            for k in range(n + 5):
                t0 = time.perf_counter()
                tr = await tmux.call(treq, 30)
                t1 = time.perf_counter()
                ir = await imux.call(inference_pb2.InferRequest(checkpoint=model, rows=tr.rows), 60)
                t2 = time.perf_counter()
                if k < 5:
                    continue
                parts["tokenizer_hop"].append(t1 - t0)
                parts["tokenize_server"].append(tr.tokenize_ms / 1e3)
                parts["tokenizer_transport"].append(t1 - t0 - tr.tokenize_ms / 1e3)
                parts["inference_hop"].append(t2 - t1)
                parts["queue_wait"].append(ir.queue_ms / 1e3)
                parts["model"].append(ir.model_ms / 1e3)
                parts["inference_transport"].append(t2 - t1 - (ir.queue_ms + ir.model_ms) / 1e3)
        finally:
            await _close(tmux, tch)
            await _close(imux, ich)
        return {k: summary_ms(v) for k, v in parts.items()}
    return asyncio.run(main())


# ------------------------------------------------------------------ one HTTP request, stage by stage

APP_STAGES = ("admission_body", "parse", "route", "tokenizer_hop", "inference_hop", "decode", "render")


class TimedHTTP:
    """One kept-open connection posting one body (a decision, or a batch to `path`) with `x-laya-timing: 1` and a bare
    socket (no client library in the timing): `post()` -> (HTTP status, client ms, the gateway's
    stages; empty when the response carries none)."""

    def __init__(self, http: str, body: dict, path: str = "/v1/systemone"):
        from laya_grpc.core.runtime import timing
        self.conn = raw_http.Connection(http, path, json.dumps(body).encode(), [(timing.REQUEST_HEADER, "1")])

    def post(self) -> tuple:
        from laya_grpc.core.runtime import timing
        status, fields, _, total = self.conn.post()
        return status, total, timing.parse(fields[b"x-laya-timing"].decode()) if b"x-laya-timing" in fields else {}

    def close(self) -> None:
        self.conn.close()


def http_breakdown(http: str, body: dict, n: int, warm: int = 5) -> dict:
    """Sequential HTTP requests asking for `x-laya-timing`: p50/p95 of each gateway stage (auth,
    admission and body read; parse; routing; the tokenizer hop = tokenize on the server + the rest;
    the inference hop = queue wait + model + the rest; decoding; rendering) and `http_outside` =
    what the client saw beyond the app: HTTP parsing in uvicorn and the socket both ways."""
    conn = TimedHTTP(http, body)
    parts: dict = {}
    try:
        for k in range(n + warm):
            _, total, st = conn.post()
            if k < warm or not st:
                continue
            st["tokenizer_rest"] = st.get("tokenizer_hop", 0) - st.get("tokenize_server", 0)
            st["inference_rest"] = st.get("inference_hop", 0) - st.get("queue_wait", 0) - st.get("model", 0)
            st["http_outside"] = total - sum(st.get(x, 0) for x in APP_STAGES)
            st["client_total"] = total
            for name, ms in st.items():
                parts.setdefault(name, []).append(ms / 1e3)
    finally:
        conn.close()
    return {k: summary_ms(v) for k, v in parts.items()}


def gateway_own_ms(http_p50: float, hops: dict) -> float:
    """HTTP p50 beyond the two hops: parse, admission, routing, decode, render and hand-offs."""
    return http_p50 - hops["tokenizer_hop"]["p50_ms"] - hops["inference_hop"]["p50_ms"]


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["echo"]:
        asyncio.run(_echo_main(argv[1], argv[2]))
        return 0
    print(json.dumps(empty_round_trips()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
