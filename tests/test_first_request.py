"""`serve` says ready only once EVERY gateway worker is warm, not just the one it happened to reach.

Gateway workers share the --http and --grpc ports (SO_REUSEPORT), so a connection reaches one of
them at random; each also serves its own control socket in the run dir, and that is where this test
looks, right when the `laya-grpc: ready` line appears: every worker must already be SERVING and
report a warm-up that went through every tokenizer worker. (Timing is not asserted here: the first-request latency is measured by
`python -m laya_grpc.bench.service first`.)
"""
import os
import re
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from laya_grpc.core.wire import rpc
from laya_proto.v1 import decision_pb2_grpc, status_pb2
from stack import Stack

READY = "laya-grpc: ready"
WARM = re.compile(r"warm-up: (\d+)/(\d+) requests answered, through (\d+) tokenizers, checkpoints (\S+) \+ auto-routed")


def _wait_for_line(stack: Stack, text: str, timeout: float = 180.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert stack.proc.poll() is None, stack.log()
        with open(stack.log_path, "rb") as f:
            log = f.read().decode("utf-8", "replace")
        if text in log:
            return log
        time.sleep(0.02)
    raise TimeoutError("no %r in the log:\n%s" % (text, stack.log()))


def test_every_gateway_worker_is_warm_when_serve_says_ready(tiny_ckpt):
    args = ["--gateway-workers", "2", "--tokenizer-workers", "2"]
    with Stack({"english": tiny_ckpt}, extra_args=args, wait=False) as s:
        log = _wait_for_line(s, READY)
        for i in range(2):
            address = "unix:" + os.path.join(s.run_dir, "gateway-%d.sock" % i)
            with grpc.insecure_channel(address, options=rpc.CHANNEL_OPTIONS) as ch:
                health = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
                assert health.status == health_pb2.HealthCheckResponse.SERVING, "gateway-%d not serving at ready" % i
                ev = decision_pb2_grpc.StatusServiceStub(ch).GetStatus(status_pb2.StatusRequest(), timeout=5)
            assert ev.ready, "gateway-%d not ready at ready" % i
            [gw] = [svc for svc in ev.services if svc.service == "gateway"]
            m = WARM.search(gw.detail)
            assert m, gw.detail
            ok, sent, tokenizers, checkpoints = m.groups()
            # english and auto-routed, each through both tokenizer workers, all answered
            assert (int(ok), int(sent), int(tokenizers)) == (4, 4, 2), gw.detail
            assert checkpoints == "english", gw.detail
        # both workers logged their warm-up before serve's ready line
        before = log[: log.index(READY)]
        assert before.count("gateway warm-up:") == 2, before[-3000:]
        assert "(2 gateway workers)" in log[log.index(READY):]
        # and the stack answers
        q = {"n": {"type": "noul", "instructions": "Is the customer angry?"}}
        status, body, _ = s.post("/v1/systemone", {"state": "My parcel is late again.", "questions": q,
                                                   "model": "english"})
        assert status == 200, body
