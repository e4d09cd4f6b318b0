"""Log set-up shared by the services: `--log-format text|json` (core/runtime/settings.py), the request id
on every line written while serving a request, and the gateway's access log.

JSON lines are one object each (`ts`, `level`, `service`, `logger`, `msg`, plus `request_id` and
`exc` where present, plus the access log's fields) so a log pipeline needs no parsing rules. The
access log (logger `laya_grpc.access`, INFO) is one line per decision request: api, route or RPC,
status, ms, request id, checkpoint. `--no-access-log` (LAYA_ACCESS_LOG=0) silences it.
"""
from __future__ import annotations

import contextlib
import io
import json
import logging
import sys
import threading
import time
from typing import Callable, Optional

from . import request_id

FORMATS = ("text", "json")
access_log = logging.getLogger("laya_grpc.access")
CLIENT_VALUE_CHARS = 200     # a value a client chose (model, task, id), as a log line or error detail shows it
MAX_LINE_CHARS = 4096        # any log message longer is cut (a client value that reached a line unclipped)


def clip(value, limit: int = CLIENT_VALUE_CHARS) -> str:
    """`value` as text of at most about `limit` characters: longer ones keep their head and say
    how much was cut, so a 2 MB name costs a log line or an error detail 200 characters."""
    text = value if isinstance(value, str) else str(value)
    if len(text) <= limit:
        return text
    return "%s...(%d more chars)" % (text[:limit], len(text) - limit)


def header_value(value) -> str:
    """A client's value as an HTTP header or gRPC metadata value: clipped, non-printable and
    non-ASCII characters escaped."""
    return "".join(c if " " <= c <= "~" else c.encode("unicode_escape").decode("ascii") for c in clip(value))


def clip_repr(value, limit: int = CLIENT_VALUE_CHARS) -> str:
    """repr(value), clipped the same way (for %r of client values)."""
    if isinstance(value, str) and len(value) > limit:
        return repr(value[:limit]) + "...(%d more chars)" % (len(value) - limit)
    return clip(repr(value), limit + 2)


class _RequestIdFilter(logging.Filter):
    """Stamps each record with the request id of the task that logged it ('' outside a request),
    and its trace id: the current span's when tracing is on, else the one the request arrived with."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = request_id.current_id()
        if not hasattr(record, "trace_id"):
            record.trace_id = _trace_id()
        return True


def _trace_id() -> str:
    from . import tracing
    parent = tracing.traceparent()
    if not parent:   # outside the request's span (its access line), or tracing off
        ctx = request_id.current()
        parent = (ctx.traceparent or ctx.origin_traceparent) if ctx is not None else ""
    parts = parent.split("-")
    return parts[1] if len(parts) == 4 else ""


class TextFormatter(logging.Formatter):
    def __init__(self, service: str):
        super().__init__("%(asctime)s " + service + " %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        rid = getattr(record, "request_id", "")
        if rid and record.name != access_log.name:
            line += " [request_id=%s]" % rid
        tid = getattr(record, "trace_id", "")
        if tid:
            line += " [trace_id=%s]" % tid
        return line


class JsonFormatter(logging.Formatter):
    FIELDS = ("api", "route", "status", "ms", "checkpoint", "peer")

    def __init__(self, service: str):
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        out = {"ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + ".%03dZ" % record.msecs,
               "level": record.levelname, "service": self.service, "logger": record.name,
               "msg": record.getMessage()}
        rid = getattr(record, "request_id", "")
        if rid:
            out["request_id"] = rid
        tid = getattr(record, "trace_id", "")
        if tid:
            out["trace_id"] = tid
        for k in self.FIELDS:
            v = record.__dict__.get(k)
            if v is not None:
                out[k] = v
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, default=str)


class _ClipLong(logging.Filter):
    """Cuts any message over MAX_LINE_CHARS: a client value that reached a log line unclipped
    cannot turn one request into megabytes of log."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            msg = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad format is logging's own error to report
            return True
        if len(msg) > MAX_LINE_CHARS:
            record.msg, record.args = clip(msg, MAX_LINE_CHARS), None
        return True


class _DropCancelled(logging.Filter):
    """grpc.aio logs a handler cancelled by the server's stop or a departed client ("Exception not
    handled ... CancelledError", with a traceback) as an ERROR; a cancelled call is no error."""

    def filter(self, record: logging.LogRecord) -> bool:
        import asyncio
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, asyncio.CancelledError)


def quiet_grpc_core() -> None:
    """gRPC's C core writes its own lines to stderr (e.g. `I1203 ... fork_posix.cc:71] Other threads
    are currently calling into gRPC, skipping fork() handlers` when serve restarts a child): only
    errors, unless GRPC_VERBOSITY says otherwise. Must run before grpc is imported."""
    from . import flags
    flags.external_default("GRPC_VERBOSITY", "ERROR")


class _StderrAsJson(io.TextIOBase):
    """sys.stderr in JSON mode: what code writes there directly (a library's print_exc, a warning)
    becomes one JSON object per line, logger `stderr`, so the stream stays parseable. The log handler
    writes to the real stream."""

    def __init__(self, formatter: logging.Formatter, real):
        self._formatter, self._real, self._buf = formatter, real, ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self._buf += text
        *lines, self._buf = self._buf.split("\n")
        for line in lines:
            if line.strip():
                record = logging.LogRecord("stderr", logging.WARNING, "", 0, line.rstrip(), None, None)
                record.request_id, record.trace_id = "", ""
                self._real.write(self._formatter.format(record) + "\n")
        self._real.flush()
        return len(text)

    def flush(self) -> None:
        self._real.flush()

    def fileno(self) -> int:
        return self._real.fileno()


def _log_uncaught(exc_type, exc, tb) -> None:
    logging.getLogger("laya_grpc").critical("uncaught %s: %s", exc_type.__name__, exc, exc_info=(exc_type, exc, tb))


def setup(service: str, fmt: str | None = None, level: str | None = None, access: bool = True) -> None:
    """Root handler on stderr in `fmt` (default text); grpc's own loggers only from WARNING up.
    Replaces any handler set before, so calling it twice is harmless."""
    fmt = (fmt or "text").lower()
    level = (level or "INFO").upper()
    real = sys.__stderr__ if isinstance(sys.stderr, _StderrAsJson) else sys.stderr
    handler = logging.StreamHandler(real)
    handler.setFormatter(JsonFormatter(service) if fmt == "json" else TextFormatter(service))
    if fmt == "json":   # nothing reaches the stream unformatted: direct writes, uncaught exceptions
        sys.stderr = _StderrAsJson(handler.formatter, real)
        sys.excepthook = _log_uncaught
        threading.excepthook = lambda a: _log_uncaught(a.exc_type, a.exc_value, a.exc_traceback)
        sys.unraisablehook = lambda u: logging.getLogger("laya_grpc").error(
            "%s: %s", u.err_msg or "exception ignored", u.exc_value, exc_info=(u.exc_type, u.exc_value, u.exc_traceback))
    handler.addFilter(_RequestIdFilter())
    handler.addFilter(_ClipLong())
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level, logging.INFO))
    logging.getLogger("grpc").setLevel(logging.WARNING)
    cygrpc = logging.getLogger("grpc._cython.cygrpc")
    if not any(isinstance(f, _DropCancelled) for f in cygrpc.filters):
        cygrpc.addFilter(_DropCancelled())
    access_log.disabled = not access


@contextlib.contextmanager
def call_failures(logger: logging.Logger, call: str, counter, replica: str,
                  on_internal: Optional[Callable[[], None]] = None):
    """Around a service's handling of one internal call: a failure is counted (`counter` by replica
    and kind), logged with the request id (ERROR when internal, INFO for a refusal) and re-raised;
    `on_internal()` runs after an internal one."""
    from ..errors import Kind, LayaError
    try:
        yield
    except Exception as e:
        kind, detail = (e.kind, e.detail) if isinstance(e, LayaError) else (Kind.INTERNAL, "%s: %s" % (type(e).__name__, e))
        counter.labels(replica, kind.name.lower()).inc()
        if kind is Kind.INTERNAL:
            logger.error("%s failed: %s", call, detail)
            if on_internal is not None:
                on_internal()
        else:
            logger.info("%s refused (%s): %s", call, kind.name.lower(), detail)
        raise


def access(api: str, route: str, status: int, ms: float, rid: str, checkpoint: str) -> None:
    """One line per request; the fields are attributes, so the JSON form has them as keys."""
    if access_log.disabled or not access_log.isEnabledFor(logging.INFO):
        return
    access_log.info("%s %s %d %.2f ms request_id=%s checkpoint=%s", api, route, status, ms, rid, checkpoint or "-",
                    extra={"api": api, "route": route, "status": status, "ms": round(ms, 3), "request_id": rid,
                           "checkpoint": checkpoint or None})
