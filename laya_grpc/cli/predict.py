"""`laya-grpc predict`: answer /v1/systemone-shaped JSONL requests offline, in one process.

One request body per input line (`state`, `questions`, optional `max_len`, `head_max_len`,
`min_confidence`), one JSON line out per request: upstream `Agent.predict`'s
`{"model","answers","usage"}`. A line that cannot be answered gets
`{"error":{"line":n,"status":<http status>,"detail":"..."}}` and the rest are still answered, so
a long file is never lost to one bad line. stdout carries only results; progress goes to stderr.
"""
from __future__ import annotations

import argparse
import io
import json
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Any, BinaryIO, Optional, TextIO

from laya_grpc.core.runtime import flags
from laya_grpc.core.runtime.flags import setting
from laya_grpc.core.decisions.controls import LONE_SURROGATE_DETAIL, has_lone_surrogate, token_budget
from laya_grpc.core.errors import Kind, LayaError

EPILOG = """\
REQUESTS.jsonl: UTF-8 text, one JSON object per line (blank lines are skipped), each a
/v1/systemone request body:
  {"state": "<text, or any JSON state>", "questions": {"<id>": {"type": "choice"|"score"|"noul",
   "instructions": "...", "criteria": [...] or {...}}}, "max_len": 512, "head_max_len": 256,
   "min_confidence": 0.6}
state and questions are required; max_len, head_max_len and min_confidence are optional.
Example line:
  {"state": "The parcel arrived broken.", "questions": {"refund": {"type": "noul",
   "instructions": "Does the customer want a refund?"}}}

Output: one compact JSON line per non-blank input line, in input order: {"model", "answers",
"usage"} as upstream Agent.predict returns, or {"error": {"line", "status", "detail"}}.
Exit status: 0 when every line was answered, 1 when any line got an error line, 2 on a usage or
checkpoint problem (a missing requests file is found before the model loads)."""


@dataclass
class PredictSettings:
    SECTION = "model"
    checkpoint: Optional[str] = setting(None, "checkpoint directory (rl_agent_config.json, model.safetensors, "
                                        "encoder/, tokenizer/) or hub id org/repo[/subfolder][@revision]",
                                        metavar="DIR", required=True)
    device: str = setting("auto", "auto (cuda, then mps, then cpu), cpu, cuda, cuda:N or mps (mlx: gpu or cpu); "
                          "an unavailable device is an error")
    backend: str = setting("torch", "network implementation", choices=("torch", "mlx"))
    dtype: str = setting("auto", "auto = float32 on CPU and CUDA (exact to upstream), float16 on MPS; or float32, "
                         "float16 (the fast mode on CUDA: docs/precision.md), bfloat16")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    flags.add_settings(parser, PredictSettings)
    parser.add_argument("requests", metavar="REQUESTS.jsonl|-",
                        help="file with one request body per line (format below), or - for stdin")


def answer_line(predictor: Any, text: bytes) -> dict:
    """The response to one request line; LayaError for a request that cannot be answered."""
    try:
        body = json.loads(text)
    except ValueError as e:
        raise LayaError(Kind.BAD_REQUEST, "invalid JSON: %s" % e) from None
    if not isinstance(body, dict) or "questions" not in body:
        raise LayaError(Kind.BAD_REQUEST, "request body must be an object with a 'questions' field")
    if has_lone_surrogate(body):
        raise LayaError(Kind.BAD_REQUEST, LONE_SURROGATE_DETAIL)
    if body.get("state") is None:
        raise LayaError(Kind.BAD_REQUEST, "'state' is required")
    if not isinstance(body["questions"], dict):
        raise LayaError(Kind.BAD_REQUEST, "'questions' must be an object")
    return predictor.predict(body["state"], body["questions"], max_len=token_budget(body, "max_len"),
                             head_max_len=token_budget(body, "head_max_len"),
                             min_confidence=body.get("min_confidence"))


def _dump(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def answer_stream(predictor: Any, lines: BinaryIO, out: TextIO, err: TextIO) -> int:
    """Answer every non-blank line (bytes, parsed as serve parses a body); returns the failures."""
    failed = 0
    for n, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            result = answer_line(predictor, text)
        except LayaError as e:
            failed += 1
            result = {"error": {"line": n, "status": e.kind.http_status, "detail": e.detail}}
            print("line %d: %d %s" % (n, e.kind.http_status, e.detail), file=err)
        except Exception as e:  # a bug, not a bad request: report it on its line and keep going
            failed += 1
            result = {"error": {"line": n, "status": 500, "detail": "%s: %s" % (type(e).__name__, e)}}
            traceback.print_exc(file=err)
        out.write(_dump(result) + "\n")
        out.flush()
    return failed


def run(args: argparse.Namespace) -> int:
    requests = sys.stdin.buffer if args.requests == "-" else None
    if requests is None:
        try:   # before the model loads: a typo in the path costs no load time
            requests = open(args.requests, "rb")
        except OSError as e:
            print("laya-grpc predict: cannot read %s: %s" % (args.requests, e.strerror), file=sys.stderr)
            return 2
    with requests:
        return _answer_all(args, requests)


def _answer_all(args: argparse.Namespace, requests: BinaryIO) -> int:
    from .predictor import Predictor
    t0 = time.perf_counter()
    try:
        predictor = Predictor(args.checkpoint, device=args.device, backend=args.backend, dtype=args.dtype)
    except LayaError as e:
        print("laya-grpc predict: %s" % e.detail, file=sys.stderr)
        return 2
    print("loaded %s on %s (%s, %s) in %.1fs" % (args.checkpoint, predictor.device, args.backend,
                                                predictor.runner.dtype(), time.perf_counter() - t0),
          file=sys.stderr)
    # Bytes in (json.loads detects UTF-8/16/32 as serve does), UTF-8 out whatever the locale says.
    out = io.TextIOWrapper(sys.stdout.buffer, encoding="utf-8", newline="\n", write_through=True)
    failed = answer_stream(predictor, requests, out, sys.stderr)
    return 1 if failed else 0
