"""Log set-up shared by the services: `--log-format text|json` (core/settings.py), the request id
on every line written while serving a request, and the gateway's access log.

JSON lines are one object each (`ts`, `level`, `service`, `logger`, `msg`, plus `request_id` and
`exc` where present, plus the access log's fields) so a log pipeline needs no parsing rules. The
access log (logger `laya_grpc.access`, INFO) is one line per decision request: api, route or RPC,
status, ms, request id, checkpoint. `--no-access-log` (LAYA_ACCESS_LOG=0) silences it.
"""
from __future__ import annotations

import json
import logging
import sys
import time

from . import request_id

FORMATS = ("text", "json")
access_log = logging.getLogger("laya_grpc.access")


class _RequestIdFilter(logging.Filter):
    """Stamps each record with the request id of the task that logged it ('' outside a request)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = request_id.current_id()
        return True


class TextFormatter(logging.Formatter):
    def __init__(self, service: str):
        super().__init__("%(asctime)s " + service + " %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        rid = getattr(record, "request_id", "")
        if rid and record.name != access_log.name:
            line += " [request_id=%s]" % rid
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
        for k in self.FIELDS:
            v = record.__dict__.get(k)
            if v is not None:
                out[k] = v
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, default=str)


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


def setup(service: str, fmt: str | None = None, level: str | None = None, access: bool = True) -> None:
    """Root handler on stderr in `fmt` (default text); grpc's own loggers only from WARNING up.
    Replaces any handler set before, so calling it twice is harmless."""
    fmt = (fmt or "text").lower()
    level = (level or "INFO").upper()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(service) if fmt == "json" else TextFormatter(service))
    handler.addFilter(_RequestIdFilter())
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


def access(api: str, route: str, status: int, ms: float, rid: str, checkpoint: str) -> None:
    """One line per request; the fields are attributes, so the JSON form has them as keys."""
    if access_log.disabled or not access_log.isEnabledFor(logging.INFO):
        return
    access_log.info("%s %s %d %.2f ms request_id=%s checkpoint=%s", api, route, status, ms, rid, checkpoint or "-",
                    extra={"api": api, "route": route, "status": status, "ms": round(ms, 3), "request_id": rid,
                           "checkpoint": checkpoint or None})
