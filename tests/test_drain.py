"""SIGTERM drains: with 8 HTTP and 8 gRPC batches in flight, the gateway (on its own, and under
`laya-grpc serve`) stops taking new work at once and answers every batch already accepted, then exits.

Each forward pass is held for FORWARD_S by the inference service's test-only fault switch
(inference/faults.py), so the batches are still running when SIGTERM arrives and for longer than 5 s
after it (uvicorn's own graceful-shutdown default, which cut them with 500s before): the first forward
takes only what had arrived when it began, so the 16 batches take at least two, and the last answer
comes at least 2 x FORWARD_S - 1.5 s after the signal; `_check` asserts that it came more than 5 s after.
How many forward passes they take beyond that depends on when each reaches the batcher (a slow or
shared CPU spreads them out), so the drain grace (GRACE_S) is a generous bound: a drain ends when its
work ends, not at the grace.

In the standalone test every forward also costs FIXED_S inside its timing, whatever its rows, as a
loaded host's forwards do: read as work, that cost would have the batcher cut the batches finer and
finer, down to a forward per row, and with FORWARD_S a forward most of them would still be running
at the grace.
"""
from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from laya_grpc.client import LayaClient
from stack import Stack
import standalone as sa

FORWARD_S = 4.0
FIXED_S = 0.1   # two of the batcher's turns (inference/turns.py)
GRACE_S = 120.0
QUESTIONS = {"urgent": {"type": "noul", "instructions": "Is it urgent?"},
             "intent": {"type": "choice", "instructions": "What?", "criteria": ["refund", "info"]}}
STATES = ["The customer wants a refund for a broken phone, today please!", "Where is my parcel?"]


def _in_flight(http: str, grpc_address: str) -> tuple[list, list]:
    """Start 8 HTTP and 8 gRPC batches; returns (threads, results) with results filled as they end:
    (transport, outcome, time.monotonic() at its end)."""
    results, threads = [], []

    def over_http():
        req = urllib.request.Request(http + "/v1/systemone/batch", method="POST",
                                     data=json.dumps({"states": STATES, "questions": QUESTIONS}).encode())
        try:
            with urllib.request.urlopen(req, timeout=GRACE_S + 30) as r:
                body = json.loads(r.read())
                ok = r.status == 200 and len(body["results"]) == len(STATES)
                results.append(("http", 200 if ok else "bad body", time.monotonic()))
        except urllib.error.HTTPError as e:
            results.append(("http", e.code, time.monotonic()))
        except OSError as e:
            results.append(("http", repr(e), time.monotonic()))

    def over_grpc():
        try:
            with LayaClient(grpc_address, timeout=GRACE_S + 30) as c:
                body = c.decide_batch(STATES, QUESTIONS)
            results.append(("grpc", "OK" if len(body["results"]) == len(STATES) else "bad body", time.monotonic()))
        except Exception as e:   # noqa: BLE001 - the outcome is the test's finding
            results.append(("grpc", repr(e)[:300], time.monotonic()))

    for fn in [over_http] * 8 + [over_grpc] * 8:
        threads.append(threading.Thread(target=fn, daemon=True))
        threads[-1].start()
    return threads, results


def _health_watch(grpc_address: str) -> list:
    """A grpc.health.v1 Watch opened before the signal: what a client already connected sees."""
    seen = []

    def watch():
        try:
            with grpc.insecure_channel(grpc_address) as ch:
                for r in health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(service=""), timeout=GRACE_S + 30):
                    seen.append((health_pb2.HealthCheckResponse.ServingStatus.Name(r.status), time.monotonic()))
        except grpc.RpcError:
            pass
    threading.Thread(target=watch, daemon=True).start()
    return seen


def _sigterm_while_batches_run(http: str, grpc_address: str, pid: int) -> tuple[list, float, list]:
    seen = _health_watch(grpc_address)
    threads, results = _in_flight(http, grpc_address)
    time.sleep(1.5)            # every batch accepted and waiting on its forward pass (FORWARD_S)
    assert not results, results
    t_sig = time.monotonic()
    os.kill(pid, signal.SIGTERM)
    time.sleep(0.3)
    try:                       # after the signal: not ready (503), or no longer taking connections
        with urllib.request.urlopen(http + "/ready", timeout=2) as r:
            after = r.status
    except urllib.error.HTTPError as e:
        after = e.code
    except OSError:
        after = "refused"
    assert after in (503, "refused"), after
    for t in threads:
        t.join(GRACE_S + 40)
    return results, t_sig, seen


def _check(results: list, seen: list, t_sig: float, t_exit: float) -> None:
    print("ended this long after SIGTERM (s):", sorted(round(t - t_sig, 2) for _, _, t in results),
          "exit: %.2f" % (t_exit - t_sig))
    assert len(results) == 16, results
    bad = [(api, outcome, round(t - t_sig, 2)) for api, outcome, t in results if outcome not in (200, "OK")]
    assert not bad, "failed after SIGTERM: %s" % bad
    # the drain outlasted uvicorn's own 5 s cut, so the test covers it
    assert max(t for _, _, t in results) - t_sig > 5.5, sorted(round(t - t_sig, 2) for _, _, t in results)
    assert any(s == "NOT_SERVING" and t >= t_sig for s, t in seen), seen
    # the health Watch still open does not hold the exit until the drain grace: it ends once the
    # last batch has been answered (and, under serve, the services behind the gateway have stopped)
    assert t_exit - max(t for _, _, t in results) < 15, (t_exit - t_sig, GRACE_S)


def test_sigterm_of_a_standalone_gateway_finishes_http_and_grpc_batches(tiny_ckpt):
    tok, inf, http, grpc_port = sa.free_ports(4)
    procs = [sa.tokenizer(tiny_ckpt, tok),
             sa.inference(tiny_ckpt, "127.0.0.1:%d" % inf,
                          env=sa.base_env(LAYA_TEST_FAULTS="forward_delay_s=%s,forward_fixed_s=%s" % (FORWARD_S, FIXED_S)))]
    gw = sa.gateway(tiny_ckpt, http, grpc_port, "127.0.0.1:%d" % tok, "127.0.0.1:%d" % inf,
                    "--drain-grace-seconds", str(GRACE_S), env=sa.base_env(LAYA_LOG_FORMAT="json"))
    procs.append(gw)
    try:
        sa.wait_ready(http, procs, timeout=180)
        results, t_sig, seen = _sigterm_while_batches_run("http://127.0.0.1:%d" % http, "127.0.0.1:%d" % grpc_port,
                                                          gw.proc.pid)
        assert gw.proc.wait(timeout=GRACE_S + 10) == 0, gw.log()[-3000:]
        _check(results, seen, t_sig, time.monotonic())
        assert "timeout graceful shutdown exceeded" not in gw.log()
        # the drain's lines are JSON too (uvicorn's own lines go through the service's handler)
        lines = [json.loads(line) for line in gw.log().splitlines() if line.strip()]
        assert not [ln for ln in lines if ln["logger"] == "stderr"], lines[-5:]
    finally:
        for p in reversed(procs):
            p.stop()


def test_sigterm_of_serve_stops_the_gateway_before_what_it_calls(tiny_ckpt):
    with Stack({"english": tiny_ckpt}, env={"LAYA_TEST_FAULTS": "forward_delay_s=%s" % FORWARD_S},
               extra_args=["--drain-grace-seconds", str(GRACE_S), "--gateway-workers", "1", "--tokenizer-workers", "1",
                           "--device", "cpu"]) as s:
        results, t_sig, seen = _sigterm_while_batches_run(s.http, s.grpc, s.proc.pid)
        assert s.proc.wait(timeout=2 * GRACE_S + 15) == 0, s.log()
        _check(results, seen, t_sig, time.monotonic())
    # in order: the gateway finished draining before the services it calls began to
    log = s.full_log()
    gateway_done = log.index("gateway drained in")
    assert gateway_done < log.index("tokenizer drained in") and gateway_done < log.index("inference drained in"), log[-3000:]
