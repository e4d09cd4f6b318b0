"""Every Prometheus metric the services export, named in one place.

Each process serves its own registry on `--metrics HOST:PORT` (off by default; `laya-grpc serve
--metrics HOST:PORT` gives the gateway PORT, the inference service PORT+1 and tokenizer i
PORT+2+i). Upstream's HTTP API has no /metrics route, so neither does the gateway's API port.
"""
from __future__ import annotations

import contextlib
import time

from prometheus_client import Counter, Gauge, Histogram, start_http_server

_LATENCY = (0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.024, 2.048, 4.096)

# gateway
REQUESTS = Counter("laya_gateway_requests_total", "Decision requests answered, by API, route and HTTP status",
                   ["api", "route", "status"])
REQUEST_SECONDS = Histogram("laya_gateway_request_seconds", "Decision request time inside the gateway",
                            ["api", "route"], buckets=_LATENCY)
INFER_CALL_REQUESTS = Histogram("laya_gateway_requests_per_infer_call",
                                "Requests whose rows shared one gateway->inference call (coalescing under load)",
                                buckets=(1, 2, 4, 8, 16, 32, 64, 128))
GATEWAY_READY = Gauge("laya_gateway_ready", "1 when every service is up and every preloaded checkpoint warm")

# inference
FORWARD_SECONDS = Histogram("laya_inference_forward_seconds", "Time of one forward pass (batch)", ["checkpoint"],
                            buckets=_LATENCY)
QUEUE_SECONDS = Histogram("laya_inference_queue_seconds", "Time a request waited for the device", buckets=_LATENCY)
BATCH_ROWS = Histogram("laya_inference_batch_rows", "Rows (state x question) per forward pass",
                       buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512))
QUEUE_DEPTH = Gauge("laya_inference_queue_rows", "Rows waiting for the device")
CHECKPOINT_READY = Gauge("laya_inference_checkpoint_ready", "1 when the checkpoint is loaded and warm", ["checkpoint"])

# tokenizer and inference replicas
CALLS = Counter("laya_backend_calls_total", "Tokenize and Infer calls this replica received, by whether it reported "
                "SERVING when each arrived (calls while not serving mean a client ignored its health)",
                ["service", "serving"])

# tokenizer
TOKENIZE_JOBS = Histogram("laya_tokenizer_jobs_per_batch", "Requests sharing one encode_batch call",
                          buckets=(1, 2, 4, 8, 16, 32, 64))


@contextlib.contextmanager
def measured(api: str, route: str):
    """Count and time one decision request; the status is the HTTP one (200 or its error's kind)."""
    from .errors import LayaError
    t0, status = time.perf_counter(), 500
    try:
        yield
        status = 200
    except LayaError as e:
        status = e.kind.http_status
        raise
    finally:
        REQUESTS.labels(api, route, str(status)).inc()
        REQUEST_SECONDS.labels(api, route).observe(time.perf_counter() - t0)


def add_flag(parser, env: str) -> None:
    from . import flags
    flags.add(parser, "--metrics", env=env, default=None, metavar="HOST:PORT",
              help="serve Prometheus metrics on this address (off by default)")


def serve_metrics(address: str | None, offset: int = 0) -> str | None:
    """Start the /metrics HTTP endpoint on HOST:PORT(+offset); None keeps metrics off."""
    if not address:
        return None
    host, _, port = address.rpartition(":")
    port_n = int(port) + offset
    start_http_server(port_n, addr=host or "127.0.0.1")
    return "%s:%d" % (host or "127.0.0.1", port_n)
