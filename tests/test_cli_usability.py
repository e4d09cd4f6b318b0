"""What a newcomer meets first: help texts, predict's early file check, watch's output, the
warning for an unknown `model`, bench's default output folder. Fast: no services started."""
from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
import time

from laya_grpc.cli.client_commands import _Printer
from laya_grpc.core.decisions.routing import RouteTable, resolve_model
from laya_proto.v1 import decision_pb2, status_pb2
from stack import ROOT

ENV = {k: v for k, v in os.environ.items() if not k.startswith("LAYA_")}


def cli(*argv: str, cwd: str = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "laya_grpc.cli", *argv], capture_output=True, text=True,
                          env=ENV, cwd=cwd, timeout=120)


def test_decide_and_watch_have_their_own_help_and_decide_timeout_is_explained():
    decide, watch = cli("decide", "--help").stdout, cli("watch", "--help").stdout
    assert "one decision" in decide and "status stream" in watch
    assert "one decision" not in watch and "status stream" not in decide
    timeout_help = " ".join(decide.rsplit("--timeout SECONDS", 1)[1].split())
    assert timeout_help.startswith("time to wait for the answer")


def test_predict_help_gives_the_requests_format():
    out = cli("predict", "--help").stdout
    assert '"state":' in out and '"questions":' in out and "min_confidence" in out


def test_predict_checks_the_requests_file_before_loading(tiny_ckpt, tmp_path):
    r = cli("predict", "--checkpoint", tiny_ckpt, "--device", "cpu", str(tmp_path / "missing.jsonl"))
    assert r.returncode == 2 and "cannot read" in r.stderr
    assert "loaded" not in r.stderr, r.stderr   # the model was never loaded


def _event(sequence: int, ready: bool, state=status_pb2.STATE_READY) -> decision_pb2.StatusEvent:
    ev = decision_pb2.StatusEvent(sequence=sequence, ready=ready, reason="r", time_unix=time.time())
    s = ev.services.add(service="inference", state=state, address="unix:x")
    s.checkpoints.add(name="english", state=state, device="cpu", dtype="float32")
    return ev


class _Out(io.StringIO):
    def __init__(self, tty: bool):
        super().__init__()
        self._tty = tty

    def isatty(self) -> bool:
        return self._tty


def test_watch_prints_one_line_per_change_when_not_a_terminal():
    out = _Out(tty=False)
    p = _Printer(out, as_json=False)
    for ev in (_event(1, False, status_pb2.STATE_WARMING), _event(2, True), _event(2, True), _event(2, True)):
        p.show(ev)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and "NOT READY" in lines[0] and "english=warming" in lines[0]
    assert " READY seq 2" in lines[1] and "english=ready" in lines[1]


def test_watch_redraws_in_place_on_a_terminal():
    out = _Out(tty=True)
    p = _Printer(out, as_json=False)
    p.show(_event(1, False, status_pb2.STATE_WARMING))
    first = out.getvalue()
    p.show(_event(2, True))
    second = out.getvalue()[len(first):]
    height = first.count("\n")
    assert "\x1b[" not in first and second.startswith("\x1b[%dF\x1b[J" % height)


def test_an_unknown_model_name_is_auto_routed_with_a_warning(caplog):
    table = RouteTable.build()
    with caplog.at_level(logging.WARNING, logger="laya_grpc.core.decisions.routing"):
        assert resolve_model("englsh", table) is None   # upstream's answer: auto-route
    assert any("'englsh'" in r.getMessage() and "english" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="laya_grpc.core.decisions.routing"):
        assert resolve_model("english", table) == "english"
    assert not caplog.records


def test_bench_out_defaults_under_the_current_directory(tmp_path):
    from laya_grpc.bench.suite import add_arguments
    from laya_grpc.core.runtime import flags
    p = flags.Parser()
    add_arguments(p)
    out = flags.finish(p, p.parse_args([]), env={}).out
    assert not os.path.isabs(out) and out == os.path.join("benchmarks", "results", "latest")


def test_watch_json_uses_the_proto_field_names_like_health():
    out = _Out(tty=False)
    _Printer(out, as_json=True).show(_event(1, True))
    ev = json.loads(out.getvalue())
    assert "time_unix" in ev and "timeUnix" not in ev
    assert ev["services"][0]["checkpoints"][0]["state"] == "STATE_READY"


def test_decide_questions_take_inline_json_or_a_file(tmp_path):
    from laya_grpc.cli.client_commands import _questions_text
    inline = '{"q": {"type": "noul", "instructions": "ok?"}}'
    assert _questions_text(inline) == inline
    (tmp_path / "q.json").write_text(inline)
    assert _questions_text(str(tmp_path / "q.json")) == inline


def test_a_port_in_use_is_one_message_without_a_traceback():
    import socket
    from stack import free_port
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        r = cli("gateway", "--port", str(taken.getsockname()[1]), "--grpc-port", str(free_port()))
    assert r.returncode == 2 and "Address already in use" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and "Event loop is closed" not in r.stderr, r.stderr
