"""CPU cost per request of the gateway's observability.

Default: the request bookkeeping alone (gateway/request_scope.py), in this process: minting the
request id, the two metric updates and the access-log line, in text and JSON, with tracing off
(the default), and with tracing on (the request span only, to an exporter that drops it). Logs go
to /dev/null so the figure is formatting, not the terminal.

--stack CHECKPOINT: the whole gateway, tracing off against tracing on. Two `laya-grpc serve`
stacks run side by side on the checkpoint (one gateway worker each; the second sends its spans
over OTLP/gRPC to a sink in this process that counts them), and the same request goes to them
in alternating blocks, one connection each, one request at a time. The figure is the gateway
process's CPU time (user + system, all threads, the span exporter's included) per request, read
from /proc before and after each block, so both stacks see the same load on the machine.

    python -m benchmarks.observability_cost [--n 20000]
    python -m benchmarks.observability_cost --stack .ckpt/english [--requests 300] [--rounds 6]
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent import futures

from laya_grpc.core.runtime import logs
from laya_grpc.gateway import request_scope

BODY = json.dumps({"state": "My phone arrived broken and I want my money back today.", "questions": {
    "intent": {"type": "choice", "instructions": "What does the customer want?",
               "criteria": {"refund": "money back", "exchange": "a new one", "info": "information"}},
    "urgency": {"type": "score", "instructions": "How urgent is it?", "criteria": ["low", "medium", "high"]},
    "angry": {"type": "noul", "instructions": "Is the customer angry?"}}}).encode()


# -- in process: the bookkeeping ---------------------------------------------------------------
def per_request_us(n: int, supplied: str | None) -> float:
    t0 = time.process_time()
    for _ in range(n):
        with request_scope.observed("http", "decide", supplied, operation="POST /v1/systemone") as scope:
            scope.context.checkpoint = "english"
    return (time.process_time() - t0) / n * 1e6


def bookkeeping(n: int) -> None:
    devnull = open(os.devnull, "w")
    rows = []
    for fmt in ("text", "json", "off"):
        os.environ["LAYA_ACCESS_LOG"] = "0" if fmt == "off" else "1"
        logs.access_log.disabled = False
        logs.setup("gateway", "json" if fmt == "json" else "text")
        logging.getLogger().handlers[0].stream = devnull
        per_request_us(1000, None)   # warm
        rows.append((fmt, per_request_us(n, None), per_request_us(n, "client-id-42")))
    rows.append(("json, tracing on (root span)",) + traced(n))
    print("%-28s %12s %16s" % ("access log", "minted id", "client's id"))
    for fmt, minted, given in rows:
        print("%-28s %9.1f us %13.1f us" % (fmt, minted, given))


def traced(n: int) -> tuple[float, float]:
    """The same with tracing on: the request span made, ended and handed to the batch exporter,
    whose thread encodes nothing (an exporter that drops): the SDK's part of the cost alone."""
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
    from laya_grpc.core.runtime import tracing

    class Drop(SpanExporter):
        def export(self, spans):
            return SpanExportResult.SUCCESS

    tracing.use(tracing._new_provider("gateway", BatchSpanProcessor(Drop())))
    try:
        per_request_us(1000, None)
        return per_request_us(n, None), per_request_us(n, "client-id-42")
    finally:
        tracing.shutdown()


# -- whole stacks: gateway CPU with tracing off and on ---------------------------------------------
class SpanSink:
    """An OTLP/gRPC trace receiver that only counts what it is sent."""

    def __init__(self):
        import grpc
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
        self.spans, lock, outer = 0, threading.Lock(), self

        class Service(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request, context):
                n = sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
                with lock:
                    outer.spans += n
                return trace_service_pb2.ExportTraceServiceResponse()

        self.server = grpc.server(futures.ThreadPoolExecutor(2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    """One `laya-grpc serve` with one gateway worker; `gateway_cpu_s()` reads that worker's CPU time."""

    def __init__(self, checkpoint: str, extra: list[str]):
        self.port = _free_port()
        self.run_dir = tempfile.mkdtemp(prefix="laya-obs-")
        env = {k: v for k, v in os.environ.items() if not k.startswith("LAYA_")}
        env.update({"LAYA_ACCESS_LOG": "1", "OTEL_BSP_SCHEDULE_DELAY": "500"})
        self.log = open(os.path.join(self.run_dir, "serve.log"), "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "laya_grpc.cli", "serve", "--checkpoint", "english=" + checkpoint,
             "--http", "127.0.0.1:%d" % self.port, "--grpc", "127.0.0.1:%d" % _free_port(),
             "--run-dir", self.run_dir, "--gateway-workers", "1", "--tokenizer-workers", "1"] + extra,
            env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self.gateway_pid = None

    def wait_ready(self, timeout: float = 600.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("serve exited: see %s/serve.log" % self.run_dir)
            try:
                with urllib.request.urlopen("http://127.0.0.1:%d/ready" % self.port, timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            time.sleep(0.5)
        else:
            raise TimeoutError("not ready: see %s/serve.log" % self.run_dir)
        kids = [int(p) for p in os.listdir("/proc") if p.isdigit() and self._is_gateway_child(int(p))]
        assert len(kids) == 1, kids
        self.gateway_pid = kids[0]

    def _is_gateway_child(self, pid: int) -> bool:
        try:
            with open("/proc/%d/stat" % pid) as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            return False
        return ppid == self.proc.pid and b"gateway" in argv

    def gateway_cpu_s(self) -> float:
        with open("/proc/%d/stat" % self.gateway_pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")   # utime + stime

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def stacks(checkpoint: str, requests: int, rounds: int) -> None:
    from laya_grpc.bench import raw_http
    sink = SpanSink()
    served = {"off": Served(checkpoint, []),
              "on": Served(checkpoint, ["--otlp-endpoint", "http://127.0.0.1:%d" % sink.port])}
    try:
        for s in served.values():
            s.wait_ready()
        def block(k: str, n: int) -> None:
            # a connection per block: one left idle while the other stack runs would time out
            conn = raw_http.Connection("127.0.0.1:%d" % served[k].port, "/v1/systemone", BODY)
            try:
                for _ in range(n):
                    status = conn.post()[0]
                    assert status == 200, status
            finally:
                conn.close()

        for k in served:   # warm both: first-use costs are not the steady state
            block(k, 50)
        cpu_ms = {k: [] for k in served}
        wall_ms = {k: [] for k in served}
        for r in range(rounds):
            for k in (("off", "on") if r % 2 == 0 else ("on", "off")):
                c0, t0 = served[k].gateway_cpu_s(), time.perf_counter()
                block(k, requests)
                wall_ms[k].append((time.perf_counter() - t0) / requests * 1e3)
                cpu_ms[k].append((served[k].gateway_cpu_s() - c0) / requests * 1e3)
        time.sleep(1.5)   # the batch exporter's last flush
        tick_ms = 1e3 / os.sysconf("SC_CLK_TCK") / requests
        print("gateway CPU per request, %d rounds x %d requests (one at a time), CPU time read in %.3f ms steps"
              % (rounds, requests, tick_ms))
        print("%-10s %14s %14s %14s %16s" % ("tracing", "median ms", "min ms", "max ms", "latency p50 ms"))
        for k in served:
            print("%-10s %14.3f %14.3f %14.3f %16.3f" % (k, statistics.median(cpu_ms[k]), min(cpu_ms[k]),
                                                        max(cpu_ms[k]), statistics.median(wall_ms[k])))
        diffs = [on - off for on, off in zip(cpu_ms["on"], cpu_ms["off"])]
        print("tracing on - off, paired by round: median %+.3f ms (rounds: %s)"
              % (statistics.median(diffs), " ".join("%+.3f" % d for d in diffs)))
        n_req = 50 + rounds * requests
        print("spans received from the traced stack: %d (%.1f a request; its tokenizer and inference send theirs too)"
              % (sink.spans, sink.spans / n_req))
    finally:
        for s in served.values():
            s.close()
        sink.server.stop(0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20000, help="in-process iterations")
    ap.add_argument("--stack", metavar="CHECKPOINT", help="measure two served stacks on this checkpoint directory")
    ap.add_argument("--requests", type=int, default=300, help="requests per block (--stack)")
    ap.add_argument("--rounds", type=int, default=6, help="blocks per stack (--stack)")
    a = ap.parse_args()
    if a.stack:
        stacks(a.stack, a.requests, a.rounds)
    else:
        bookkeeping(a.n)


if __name__ == "__main__":
    main()
