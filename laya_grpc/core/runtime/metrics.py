"""Every Prometheus metric the services export, named in one place (docs/metrics.md lists them).

Each family is created on first use, so a process exports only the families of the service it
runs: the inference service has no `laya_gateway_*` series (an alert on `laya_gateway_ready`
would otherwise fire on every process that is not a gateway).

Two ways to scrape:
- a standalone service serves its own families on `--metrics HOST:PORT` (off by default);
- `laya-grpc serve --metrics HOST:PORT` is one endpoint for the whole deployment: serve sets
  PROMETHEUS_MULTIPROC_DIR (under its run dir) for every child, children write their samples
  there (prometheus-client's multiprocess mode) and serve exports them aggregated across
  processes; children open no port of their own.
Upstream's HTTP API has no /metrics route, so neither does the gateway's API port.
"""
from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
# doubling from 0.5 ms to past the gateway's default request timeout (60 s)
_LATENCY = (0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.024, 2.048, 4.096,
            8.192, 16.384, 32.768, 65.536)


class _Family:
    """A metric created in the default registry the first time its process uses it."""

    _lock = threading.Lock()

    def __init__(self, cls, name: str, doc: str, labels=(), **kw):
        self.cls, self.name, self.doc, self.labelnames, self.kw = cls, name, doc, tuple(labels), kw
        self._metric = None

    def get(self):
        m = self._metric
        if m is None:
            with self._lock:   # the device thread and the event loop may both be first
                if self._metric is None:
                    self._metric = self.cls(self.name, self.doc, self.labelnames, **self.kw)
                m = self._metric
        return m

    def labels(self, *values):
        return self.get().labels(*values)

    def inc(self, amount: float = 1) -> None:
        self.get().inc(amount)

    def set(self, value: float) -> None:
        self.get().set(value)

    def observe(self, value: float) -> None:
        self.get().observe(value)


# gateway
REQUESTS = _Family(Counter, "laya_gateway_requests_total", "Decision requests answered, by API, route and HTTP status",
                   ["api", "route", "status"])
REQUEST_SECONDS = _Family(Histogram, "laya_gateway_request_seconds", "Decision request time inside the gateway",
                          ["api", "route"], buckets=_LATENCY)
INFER_CALL_REQUESTS = _Family(Histogram, "laya_gateway_requests_per_infer_call",
                              "Requests whose rows shared one gateway->inference call (coalescing under load)",
                              buckets=(1, 2, 4, 8, 16, 32, 64, 128))
REJECTED = _Family(Counter, "laya_gateway_rejected_total", "Requests refused before any work, by API and reason",
                   ["api", "reason"])
ADMISSION_WAIT_SECONDS = _Family(Histogram, "laya_gateway_admission_wait_seconds",
                                 "Time a decision request waited in the admission queue (slots or rows)",
                                 buckets=_LATENCY)
CANCELLED = _Family(Counter, "laya_gateway_cancelled_total", "Decision requests abandoned by their client, by API",
                    ["api"])
BACKEND_ERRORS = _Family(Counter, "laya_gateway_backend_errors_total", "Failed calls to a backend service, by "
                         "service, replica (its address; the target for a balanced channel) and error kind",
                         ["service", "replica", "kind"])
BACKEND_RETRIES = _Family(Counter, "laya_gateway_backend_retries_total", "Calls to a backend service run once more "
                          "on another replica, by service and the first attempt's error kind", ["service", "kind"])
GATEWAY_HEAP_TRIMS = _Family(Counter, "laya_gateway_heap_trims_total", "Times freed heap went back to the OS "
                             "after large requests, once idle (glibc malloc_trim)")
# several gateway workers under serve: ready only when every live one is
GATEWAY_READY = _Family(Gauge, "laya_gateway_ready", "1 when every service is up and every preloaded checkpoint warm",
                        multiprocess_mode="livemin")

# inference
FORWARD_SECONDS = _Family(Histogram, "laya_inference_forward_seconds", "Time of one forward pass (batch)",
                          ["checkpoint"], buckets=_LATENCY)
QUEUE_SECONDS = _Family(Histogram, "laya_inference_queue_seconds", "Time a request waited for the device",
                        buckets=_LATENCY)
BATCH_ROWS = _Family(Histogram, "laya_inference_batch_rows", "Rows (state x question) per forward pass",
                     buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512))
QUEUE_DEPTH = _Family(Gauge, "laya_inference_queue_rows", "Rows waiting for the device", multiprocess_mode="livesum")
CHECKPOINT_READY = _Family(Gauge, "laya_inference_checkpoint_ready", "1 when the checkpoint is loaded and warm",
                           ["checkpoint"], multiprocess_mode="livemax")

INFERENCE_CALLS = _Family(Counter, "laya_inference_calls_total", "Infer calls this replica received, by whether it "
                          "reported SERVING when each arrived (calls while not serving mean a client ignored its "
                          "health)", ["serving"])
INFERENCE_ERRORS = _Family(Counter, "laya_inference_errors_total", "Infer calls this replica failed, by replica "
                           "(its listen address) and error kind (internal: the device's fault)", ["replica", "kind"])
INFERENCE_HEALTHY = _Family(Gauge, "laya_inference_forwards_healthy", "0 while this replica's forwards fail and it "
                            "reports NOT_SERVING (a probe forward failed too), else 1", multiprocess_mode="livemin")
DEVICE_MEMORY = _Family(Gauge, "laya_inference_device_memory_bytes", "CUDA device memory, by device and kind "
                        "(allocated and reserved by torch; used and total on the device)", ["device", "kind"],
                        multiprocess_mode="livemax")
INFERENCE_HEAP_TRIMS = _Family(Counter, "laya_inference_heap_trims_total", "Times freed heap went back to the OS "
                               "after large calls, once idle (glibc malloc_trim)")

# tokenizer
TOKENIZER_CALLS = _Family(Counter, "laya_tokenizer_calls_total", "Tokenize calls this replica received, by whether "
                          "it reported SERVING when each arrived", ["serving"])
TOKENIZE_JOBS = _Family(Histogram, "laya_tokenizer_jobs_per_batch", "Requests sharing one encode_batch call",
                        buckets=(1, 2, 4, 8, 16, 32, 64))
TOKENIZE_SECONDS = _Family(Histogram, "laya_tokenizer_tokenize_seconds", "Time of one Tokenize call that succeeded, "
                           "in this replica", buckets=_LATENCY)
TOKENIZER_ERRORS = _Family(Counter, "laya_tokenizer_errors_total", "Tokenize calls this replica failed, by replica "
                           "(its listen address) and error kind", ["replica", "kind"])
TOKENIZER_HEAP_TRIMS = _Family(Counter, "laya_tokenizer_heap_trims_total", "Times freed heap went back to the OS "
                               "after large calls, once idle (glibc malloc_trim)")

FAMILIES = [v for v in list(globals().values()) if isinstance(v, _Family)]


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host or "127.0.0.1", int(port)


def serve_metrics(address: str | None) -> str | None:
    """Start this process's /metrics endpoint on HOST:PORT; None keeps metrics off."""
    if not address:
        return None
    host, port = _split(address)
    start_http_server(port, addr=host)
    return "%s:%d" % (host, port)


def serve_aggregated(address: str, directory: str) -> str:
    """`serve`'s one endpoint: every child's samples in `directory`, summed across processes."""
    from prometheus_client import multiprocess
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=directory)
    host, port = _split(address)
    start_http_server(port, addr=host, registry=registry)
    return "%s:%d" % (host, port)


def process_gone(pid: int, directory: str | None) -> None:
    """A child of serve exited: its live gauges (ready, queue depth) stop counting."""
    if directory:
        from prometheus_client import multiprocess
        multiprocess.mark_process_dead(pid, directory)
