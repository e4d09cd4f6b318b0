"""CPU cost per request of the gateway's request bookkeeping (core/request_scope.py): minting
the request id, the two metric updates and the access-log line, in text and JSON, with tracing
off (the default). Logs go to /dev/null so the figure is formatting, not the terminal.

    python -m benchmarks.observability_cost [--n 20000]
"""
from __future__ import annotations

import argparse
import logging
import os
import time

from laya_grpc.core import logs, request_scope


def per_request_us(n: int, supplied: str | None) -> float:
    t0 = time.process_time()
    for _ in range(n):
        with request_scope.observed("http", "decide", supplied) as scope:
            scope.context.checkpoint = "english"
    return (time.process_time() - t0) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20000)
    n = ap.parse_args().n
    devnull = open(os.devnull, "w")
    rows = []
    for fmt in ("text", "json", "off"):
        os.environ["LAYA_ACCESS_LOG"] = "0" if fmt == "off" else "1"
        logs.access_log.disabled = False
        logs.setup("gateway", "json" if fmt == "json" else "text")
        logging.getLogger().handlers[0].stream = devnull
        per_request_us(1000, None)   # warm
        rows.append((fmt, per_request_us(n, None), per_request_us(n, "client-id-42")))
    print("%-28s %12s %16s" % ("access log", "minted id", "client's id"))
    for fmt, minted, given in rows:
        print("%-28s %9.1f us %13.1f us" % (fmt, minted, given))


if __name__ == "__main__":
    main()
