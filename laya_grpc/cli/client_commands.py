"""`laya-grpc decide` and `laya-grpc watch`: readable output for people, `--json` for scripts."""
from __future__ import annotations

import argparse
import json
import sys
import time

from dataclasses import dataclass
from typing import Optional

from laya_grpc.core.runtime import flags
from laya_grpc.core.runtime.flags import setting
from laya_grpc.core.errors import LayaError
from laya_proto.v1 import status_pb2

from laya_grpc.client.client import LayaClient


DECIDE_HELP = """Ask a running gateway one decision over gRPC (DecisionService.Decide) and print the
answers: the checkpoint the router chose and why, each question's answer, confidence and
probabilities, and the token usage. --json prints the /v1/systemone response instead."""

WATCH_HELP = """Follow a running gateway's status stream (StatusService.Watch): readiness, each service
and each checkpoint's state, device and warm-up. On a terminal the block updates in place; when
output is a file or pipe, one line per change (heartbeats that change nothing print nothing), so
logs stay readable. --json prints every event as one JSON line."""


@dataclass
class ClientSettings:
    SECTION = "gateway"
    address: str = setting("127.0.0.1:50051", "the gateway's gRPC address (its --grpc)", env="LAYA_GRPC",
                           metavar="ADDRESS")
    api_key: Optional[str] = setting(None, "bearer key when the gateway requires one (its --api-key)",
                                     env="LAYA_API_KEY", secret=True, metavar="KEY")


def add_arguments(p: argparse.ArgumentParser, command: str) -> None:
    p.description = DECIDE_HELP if command == "decide" else WATCH_HELP
    flags.add_settings(p, ClientSettings)
    p.add_argument("--json", action="store_true", help="print JSON instead of readable text")
    if command == "decide":
        p.add_argument("text", help="the state: plain text, or JSON with --state-json; '-' reads stdin")
        p.add_argument("--questions", required=True, metavar="JSON|FILE",
                       help="the /v1/systemone 'questions' object: inline JSON ('{\"angry\": {\"type\": "
                            "\"noul\", \"instructions\": \"Is the customer angry?\"}}'), a JSON file, or '-' "
                            "for stdin")
        p.add_argument("--state-json", action="store_true", help="parse TEXT as a JSON state (object, conversation list)")
        p.add_argument("--model", default=None, help="pin a checkpoint (english, multilingual, ...)")
        p.add_argument("--lang", default=None, help="language code hint for routing")
        p.add_argument("--timeout-seconds", "--timeout", dest="timeout", type=float, default=60.0, metavar="SECONDS",
                       help="time to wait for the answer (a cold checkpoint may first need to load); "
                            "past it the call fails with DEADLINE_EXCEEDED")
    else:
        p.add_argument("--heartbeat-seconds", "--heartbeat", dest="heartbeat", type=float, default=2.0,
                       metavar="SECONDS", help="time between heartbeats when nothing changes")
        p.add_argument("--count", type=int, default=0,
                       help="stop after this many events, heartbeats included (0 = until interrupted)")


def _read(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    with open(path, encoding="utf-8") as f:
        return f.read()


def _questions_text(value: str) -> str:
    """--questions: inline JSON when it starts like a JSON object, else a file ('-': stdin)."""
    return value if value.lstrip().startswith("{") else _read(value)


def run(args: argparse.Namespace) -> int:
    return _decide(args) if args.command == "decide" else _watch(args)


def _decide(args) -> int:
    try:
        text = _read("-") if args.text == "-" else args.text
        state = json.loads(text) if args.state_json else text
        questions = json.loads(_questions_text(args.questions))
    except (OSError, ValueError) as e:
        print("laya-grpc decide: %s" % e, file=sys.stderr)
        return 2
    with LayaClient(args.address, args.api_key, args.timeout) as client:
        try:
            result = client.decide(state, questions, model=args.model, lang=args.lang)
        except LayaError as e:
            print("laya-grpc decide: error %d: %s" % (e.kind.http_status, e.detail), file=sys.stderr)
            return 1
    if args.json:
        print(json.dumps(result, ensure_ascii=False))
        return 0
    routing = result.get("routing") or {}
    print("checkpoint: %s (%s)" % (routing.get("model"), routing.get("reason")))
    for qid, a in result["answers"].items():
        if a["type"] == "choice":
            head = "choice %s" % json.dumps(a["choice"], ensure_ascii=False)
        elif a["type"] == "score":
            legend = a.get("legend") or {}
            nearest = legend.get(str(int(round(a["score"]))))
            head = "score %.4f" % a["score"] + (" (~%s)" % nearest if nearest else "")
        else:
            head = "noul P(true)=%.4f" % a["noul"]
        print("  %-20s %-28s confidence %.4f" % (qid, head, a["confidence"]))
        legend = a.get("legend") or {}
        for label, p in (a.get("probabilities") or {}).items():
            name = "%s %s" % (label, legend[label]) if label in legend else label   # score levels by name
            print("      %-24s %6.4f %s" % (name[:24], p, "#" * int(round(p * 30))))
    u = result["usage"]
    print("usage: %d input tokens%s" % (u["input_tokens"], ", state truncated" if u.get("truncated") else ""))
    return 0


def _fmt_event(ev) -> str:
    S = status_pb2
    lines = ["%s  %s  seq %d  %s" % (time.strftime("%H:%M:%S", time.localtime(ev.time_unix)),
                                     "READY" if ev.ready else "NOT READY", ev.sequence, ev.reason)]
    for s in ev.services:
        lines.append("  %-10s %-9s %s%s%s" % (s.service, S.State.Name(s.state).removeprefix("STATE_").lower(), s.address,
                                            "  restarts %d" % s.restarts if s.restarts else "",
                                            "  queue %d" % s.queue_depth if s.queue_depth else "")
                     + ("  (%s)" % s.detail if s.detail else ""))
        for c in s.checkpoints:
            lines.append("    %-16s %-10s %s %s%s%s" % (
                c.name, S.State.Name(c.state).removeprefix("STATE_").lower(), c.device or "-", c.dtype or "",
                "  warmup %.0f ms" % c.warmup_ms if c.warmup_ms else "",
                "  FALLBACK from %s" % c.device_requested if c.device_fallback else ""))
    return "\n".join(lines)


def _fmt_line(ev) -> str:
    """One line for logs: readiness, then each service and checkpoint state (no time, no reason:
    equal lines mean nothing changed)."""
    S = status_pb2
    parts = []
    for s in ev.services:
        cps = " ".join("%s=%s" % (c.name, S.State.Name(c.state).removeprefix("STATE_").lower()) for c in s.checkpoints)
        parts.append("%s %s%s%s" % (s.service, S.State.Name(s.state).removeprefix("STATE_").lower(),
                                    " restarts %d" % s.restarts if s.restarts else "", " [%s]" % cps if cps else ""))
    return "%s seq %d | %s" % ("READY" if ev.ready else "NOT READY", ev.sequence, "; ".join(parts))


class _Printer:
    """Where watch output goes: a terminal block redrawn in place, or one line per change."""

    def __init__(self, out, as_json: bool):
        self.out, self.as_json = out, as_json
        self.tty = not as_json and out.isatty()
        self._height = 0
        self._last = None

    def show(self, ev) -> None:
        if self.as_json:
            from google.protobuf.json_format import MessageToDict
            # the proto's field names (snake_case), as /health writes them
            self.out.write(json.dumps(MessageToDict(ev, preserving_proto_field_name=True)) + "\n")
        elif self.tty:
            block = _fmt_event(ev)
            # cursor up over the previous block, clear to the end of the screen, redraw
            self.out.write(("\x1b[%dF\x1b[J" % self._height if self._height else "") + block + "\n")
            self._height = block.count("\n") + 1
        else:
            line = _fmt_line(ev)
            if line == self._last:   # a heartbeat: nothing changed
                return
            self._last = line
            self.out.write("%s %s\n" % (time.strftime("%H:%M:%S", time.localtime(ev.time_unix)), line))
        self.out.flush()


def _watch(args) -> int:
    import grpc
    n = 0
    printer = _Printer(sys.stdout, args.json)
    with LayaClient(args.address, args.api_key) as client:
        try:
            for ev in client.watch(args.heartbeat):
                printer.show(ev)
                n += 1
                if args.count and n >= args.count:
                    return 0
        except grpc.RpcError as e:
            print("laya-grpc watch: %s: %s" % (e.code().name, e.details()), file=sys.stderr)
            return 1
    return 0
