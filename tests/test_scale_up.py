"""Scale-up: a replica added behind a DNS name gets calls without any connection breaking.

The gateway reaches its inference replicas as `dns://127.0.0.1:DNS/inference.test:PORT`, a name
held by a DNS server on loopback (tests/loopback_dns.py) that first lists one replica
(127.0.0.2) and then, once a second replica on 127.0.0.3 serves, both. Servers end each
connection after LAYA_GRPC_MAX_CONNECTION_AGE_S (1 s here, 30 s by default) and clients then look
the name up again, so the new replica must get calls within a few ages: the test allows 15 s
(ages of at most 1.1 s with gRPC's jitter, plus the channel's reconnect and health check).
"""
from __future__ import annotations

import json
import threading
import time
import urllib.request

import standalone as sa
from loopback_dns import LoopbackDns
from test_replica_health import _metric, _wait_status

BODY = json.dumps({"state": "Where is my parcel?", "model": "english",
                   "questions": {"q": {"type": "noul", "instructions": "urgent?"}}}).encode()
AGE_S = 1.0


def test_a_replica_added_behind_the_name_gets_calls(tiny_ckpt):
    port, tok, http, grpc_port, m_b = sa.free_ports(5)
    env = sa.base_env(LAYA_GRPC_MAX_CONNECTION_AGE_S=str(AGE_S))
    a, b = "127.0.0.2:%d" % port, "127.0.0.3:%d" % port
    with LoopbackDns() as dns:
        dns.records["inference.test"] = ["127.0.0.2"]
        procs = [sa.tokenizer(tiny_ckpt, tok, env=env), sa.inference(tiny_ckpt, a, env=env),
                 sa.gateway(tiny_ckpt, http, grpc_port, "127.0.0.1:%d" % tok,
                            "dns://127.0.0.1:%d/inference.test:%d" % (dns.port, port), env=env)]
        stop, answered = threading.Event(), []

        def load():
            while not stop.is_set():
                req = urllib.request.Request("http://127.0.0.1:%d/v1/systemone" % http, data=BODY, method="POST")
                with urllib.request.urlopen(req, timeout=30) as r:
                    answered.append(r.status)
        try:
            sa.wait_ready(http, procs, timeout=180)
            worker = threading.Thread(target=load, daemon=True)
            worker.start()
            procs.append(sa.inference(tiny_ckpt, b, "--metrics", "127.0.0.1:%d" % m_b, env=env))
            _wait_status(b, "SERVING", 120)
            dns.records["inference.test"] = ["127.0.0.2", "127.0.0.3"]
            t_added, first, n_added = time.monotonic(), None, len(answered)
            while time.monotonic() - t_added < 15 and first is None:
                if _metric(m_b, 'laya_inference_calls_total{serving="yes"}') > 0:
                    first = time.monotonic() - t_added
                time.sleep(0.1)
            print("dns queries from 5 s before the record was added:",
                  [(round(t - t_added, 2), n, q) for t, n, q in dns.queries if t >= t_added - 5][:20])
            assert first is not None, "the added replica got no calls in 15 s (%d requests answered)" % (
                len(answered) - n_added)
            calls_b0, n0 = _metric(m_b, "laya_inference_calls_total"), len(answered)
            time.sleep(3.0)
            share = (_metric(m_b, "laya_inference_calls_total") - calls_b0) / max(1, len(answered) - n0)
            print("first call on the added replica %.2f s after its record; then %.0f%% of %d requests"
                  % (first, 100 * share, len(answered) - n0))
            assert share >= 0.2, share
            assert set(answered) == {200}
        finally:
            stop.set()
            for p in reversed(procs):
                p.stop()
