"""JSON logs stay JSON: a watched replica stopped under its gateway (SIGTERM while the gateway's
health and status watches and call streams are open) writes no raw traceback, and neither does
anything else; every line of the three processes parses."""
from __future__ import annotations

import json
import time

import standalone as sa


def test_sigterm_of_watched_replicas_writes_only_json_lines(tiny_ckpt):
    tok, inf, http, grpc_port = sa.free_ports(4)
    env = sa.base_env(LAYA_LOG_FORMAT="json")
    procs = [sa.tokenizer(tiny_ckpt, tok, env=env), sa.inference(tiny_ckpt, "127.0.0.1:%d" % inf, env=env),
             sa.gateway(tiny_ckpt, http, grpc_port, "127.0.0.1:%d" % tok, "127.0.0.1:%d" % inf, env=env)]
    try:
        sa.wait_ready(http, procs, timeout=180)
        for p in procs[:2]:   # the services the gateway watches and streams to, while it still does
            assert p.stop() == 0, p.log()[-2000:]
        time.sleep(1.0)
    finally:
        for p in reversed(procs):
            p.stop()
    for p in procs:
        raw = [line for line in p.log().splitlines() if line.strip() and not line.startswith("{")]
        assert not raw, (p.proc.args[3], raw[:5])
        lines = [json.loads(line) for line in p.log().splitlines() if line.strip()]
        assert not [ln for ln in lines if ln["logger"] == "stderr"], (p.proc.args[3], lines[-5:])


def test_with_tracing_on_every_request_line_of_the_three_services_carries_the_trace_id(tiny_ckpt):
    """Spans go to a port nobody listens on (the exporter's failures are not what is checked)."""
    from stack import Stack, free_port
    body = {"state": "hi", "model": "english", "questions": {"q": {"type": "noul", "instructions": "?"}}}
    with Stack({"english": tiny_ckpt}, env={"LAYA_LOG_LEVEL": "DEBUG"},
               extra_args=["--log-format", "json", "--otlp-endpoint", "http://127.0.0.1:%d" % free_port(),
                           "--gateway-workers", "1", "--tokenizer-workers", "1"]) as s:
        assert s.post("/v1/systemone", body, headers={"x-request-id": "traced-1"})[0] == 200
        time.sleep(0.5)
    lines = [json.loads(line) for line in s.full_log().splitlines() if line.startswith("{")]
    ours = [ln for ln in lines if "traced-1" in ln.get("request_id", "").split(",")]
    assert {ln["service"] for ln in ours} == {"gateway", "tokenizer", "inference"}, ours
    assert len({ln.get("trace_id") for ln in ours}) == 1 and ours[0].get("trace_id"), ours
