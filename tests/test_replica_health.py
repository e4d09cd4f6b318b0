"""Health from outcomes, with two real inference replicas behind one gateway: when every forward
of one replica fails (the test-only fault switch, inference/faults.py, fails them as a lost device
would), that replica reports NOT_SERVING within 5 s, the gateway runs the failed calls once more
on the other replica (and counts it), clients see no error from then on, and the replica serves
again once its forwards succeed."""
from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.request

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

import standalone as sa

BODY = json.dumps({"state": "Where is my parcel?", "model": "english",
                   "questions": {"q": {"type": "noul", "instructions": "urgent?"}}}).encode()


def _status(address: str) -> str:
    with grpc.insecure_channel(address) as ch:
        try:
            r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=2)
            return health_pb2.HealthCheckResponse.ServingStatus.Name(r.status)
        except grpc.RpcError as e:
            return e.code().name


def _wait_status(address: str, want: str, timeout: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if _status(address) == want:
            return time.monotonic()
        time.sleep(0.02)
    raise AssertionError("%s not %s after %.0f s (%s)" % (address, want, timeout, _status(address)))


def _metric(port: int, prefix: str) -> float:
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=5) as r:
        return sum(float(line.rsplit(" ", 1)[1]) for line in r.read().decode().splitlines()
                   if line.startswith(prefix))


def test_a_replica_whose_forwards_fail_turns_not_serving_and_clients_see_no_error(tiny_ckpt, tmp_path):
    fault = str(tmp_path / "device-lost")
    tok, inf_a, inf_b, http, grpc_port, m_gw, m_b = sa.free_ports(7)
    a, b = "127.0.0.1:%d" % inf_a, "127.0.0.1:%d" % inf_b
    json_logs = sa.base_env(LAYA_LOG_FORMAT="json", LAYA_LOG_LEVEL="DEBUG")   # DEBUG: a line per internal call
    procs = [sa.tokenizer(tiny_ckpt, tok, env=json_logs), sa.inference(tiny_ckpt, a, env=json_logs),
             sa.inference(tiny_ckpt, b, "--metrics", "127.0.0.1:%d" % m_b,
                          env=dict(json_logs, LAYA_TEST_FAULTS="fail_while=" + fault)),
             sa.gateway(tiny_ckpt, http, grpc_port, "127.0.0.1:%d" % tok, "%s,%s" % (b, a),
                        "--metrics", "127.0.0.1:%d" % m_gw, env=json_logs)]
    outcomes, stop = [], threading.Event()

    def load():   # one request after another: each goes to the first idle replica of the list, the broken one
        while not stop.is_set():
            req = urllib.request.Request("http://127.0.0.1:%d/v1/systemone" % http, data=BODY, method="POST")
            try:
                with urllib.request.urlopen(req, timeout=30) as r:
                    outcomes.append((time.monotonic(), r.status))
            except urllib.error.HTTPError as e:
                outcomes.append((time.monotonic(), e.code))
            except OSError as e:
                outcomes.append((time.monotonic(), repr(e)))
    try:
        sa.wait_ready(http, procs, timeout=180)
        _wait_status(b, "SERVING", 60)
        worker = threading.Thread(target=load, daemon=True)
        worker.start()
        time.sleep(2.0)
        calls_b = _metric(m_b, "laya_inference_calls_total")
        assert calls_b > 0, "replica b got no calls before the fault"
        open(fault, "w").close()
        t_fault = time.monotonic()
        t_down = _wait_status(b, "NOT_SERVING", 5.0)
        time.sleep(3.0)
        after = [o for o in outcomes if o[0] > t_down]
        assert after and all(s == 200 for _, s in after), [o for o in after if o[1] != 200][:5]
        retries = _metric(m_gw, "laya_gateway_backend_retries_total")
        errors_b = _metric(m_b, 'laya_inference_errors_total{kind="internal"')
        assert errors_b >= 1 and retries >= 1, (errors_b, retries)
        before = [o for o in outcomes if t_fault <= o[0] <= t_down]
        os.remove(fault)
        t_fixed = time.monotonic()
        t_up = _wait_status(b, "SERVING", 5.0)
        calls_b = _metric(m_b, "laya_inference_calls_total")
        time.sleep(2.0)
        stop.set()
        worker.join(35)
        assert _metric(m_b, "laya_inference_calls_total") > calls_b, "replica b got no calls after it recovered"
        bad = [o for o in outcomes if o[1] != 200]
        print("NOT_SERVING %.3f s after the fault; SERVING again %.3f s after the fix; %d requests, %d failed "
              "(%d between fault and NOT_SERVING), %d retried on the other replica"
              % (t_down - t_fault, t_up - t_fixed, len(outcomes), len(bad), len(before) - sum(1 for o in before if o[1] == 200),
                 retries))
        assert not bad, bad[:5]
    finally:
        stop.set()
        for p in reversed(procs):
            p.stop()
    _check_logs(procs)


# the lines about one request: the gateway's access log, each internal call, each failure
REQUEST_LINES = ("Tokenize ", "Infer ", "forward failed")


def _check_logs(procs: list) -> None:
    """Every line of every process parses as JSON, nothing reached stderr around the log handler
    (a library's traceback print), and every line about a request carries its request id."""
    for p in procs:
        lines = [json.loads(line) for line in p.log().splitlines() if line.strip()]
        assert not [ln for ln in lines if ln["logger"] == "stderr"], p.proc.args[3]
        about = [ln for ln in lines if ln["logger"] == "laya_grpc.access" or ln["msg"].startswith(REQUEST_LINES)]
        assert about, (p.proc.args[3], lines[-5:])
        assert all(ln.get("request_id") for ln in about), [ln for ln in about if not ln.get("request_id")][:3]
