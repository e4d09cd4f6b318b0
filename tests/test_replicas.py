"""Replicas behind one gateway: three inference and two tokenizer processes on TCP, balanced by
gRPC round_robin with health checking. Under a mixed load one inference replica is killed -9 and
restarted, another drained with SIGTERM: every request gets its correct answer, the restarted
replica gets no call before it is SERVING, the draining one finishes its work and exits 0.
Also: `serve --inference-replicas 2`, /ready and /live, endpoint parsing and deadlines."""
from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from laya_grpc.client import LayaClient
from laya_grpc.core.errors import Kind, LayaError
from stack import ROOT, Stack, free_port, free_ports, temp_dir

ME = [sys.executable, "-m", "laya_grpc.cli"]
QUESTIONS = [
    {"intent": {"type": "choice", "instructions": "What does the customer want?",
                "criteria": {"refund": "money back", "exchange": "", "info": None}}},
    {"severity": {"type": "score", "instructions": "How severe?", "criteria": ["none", "minor", "major"]}},
    {"urgent": {"type": "noul", "instructions": "Is it urgent?"},
     "topic": {"type": "choice", "instructions": "Topic?", "criteria": ["billing", "shipping"]}},
]
STATES = ["I want a refund for my broken phone, today please!", "Where is my parcel? " * 20,
          {"ticket": 17, "body": "the invoice is wrong"}, "hello"]


class Procs:
    """Service processes with their logs in a temp dir; all stopped at the end."""

    def __init__(self):
        self.dir = temp_dir("laya-replicas-")
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("LAYA_")}
        self.procs: dict = {}

    def start(self, name: str, argv: list) -> subprocess.Popen:
        log = open(os.path.join(self.dir, name + ".log"), "ab")
        p = subprocess.Popen(ME + argv, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self.procs[name] = p
        return p

    def log(self, name: str) -> str:
        with open(os.path.join(self.dir, name + ".log"), "rb") as f:
            return f.read().decode("utf-8", "replace")[-3000:]

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
        for p in self.procs.values():
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def health_of(address: str) -> str:
    try:
        with grpc.insecure_channel(address) as ch:
            r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
            return health_pb2.HealthCheckResponse.ServingStatus.Name(r.status)
    except grpc.RpcError as e:
        return e.code().name


def calls(metrics_port: int, service: str, serving: str) -> float:
    """laya_<service>_calls_total{serving} read from a replica's /metrics."""
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % metrics_port, timeout=2) as r:
        text = r.read().decode()
    m = re.search(r'laya_%s_calls_total\{serving="%s"\} ([0-9.e+]+)' % (service, serving), text)
    return float(m.group(1)) if m else 0.0


def http_json(url: str, body=None, timeout: float = 30, headers: dict | None = None):
    req = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(),
                                 method="GET" if body is None else "POST", headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def _leaves(a, path="$"):
    """(path, value) for every leaf of a JSON answer."""
    if isinstance(a, dict):
        for k in sorted(a):
            yield from _leaves(a[k], "%s.%s" % (path, k))
    elif isinstance(a, list):
        for i, x in enumerate(a):
            yield from _leaves(x, "%s[%d]" % (path, i))
    else:
        yield path, a


def _distance(a, b) -> float:
    """Largest float difference of two answers of one shape; inf when their shape, labels or
    usage differ."""
    la, lb = list(_leaves(a)), list(_leaves(b))
    if [p for p, _ in la] != [p for p, _ in lb]:
        return math.inf
    d = 0.0
    for (_, x), (_, y) in zip(la, lb):
        if isinstance(x, float) or isinstance(y, float):
            if not (isinstance(x, (int, float)) and isinstance(y, (int, float))):
                return math.inf
            d = max(d, abs(x - y))
        elif x != y:
            return math.inf
    return d


def wrong_answer(got, key, expected: dict) -> str | None:
    """Why `got` is not the answer to `key`, or None. A crossed or corrupted answer is one that is
    farther from its own expected answer than half the distance to the nearest other expected answer
    of the same shape: rows batched with other requests' rows round differently, by an amount no
    fixed bound measured on one CPU describes, but far less than two different texts or questions
    move the probabilities."""
    own = _distance(got, expected[key])
    if own == 0.0:
        return None
    others = [_distance(expected[key], expected[k]) for k in expected if k != key]
    gap = min([d for d in others if d > 0.0] or [math.inf])
    if own < gap / 2:
        return None
    return "%s: %s from its own answer, nearest other %s; got %s" % (key, own, gap, json.dumps(got)[:300])


def wait_for(cond, timeout: float, what: str, procs: Procs | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if cond():
                return
        except OSError:
            pass
        time.sleep(0.1)
    logs = "" if procs is None else "\n".join("== %s\n%s" % (n, procs.log(n)) for n in procs.procs)
    raise TimeoutError("%s not reached in %.0f s\n%s" % (what, timeout, logs))


class Load:
    """Client threads sending a mix of HTTP /v1/systemone, HTTP batch and gRPC Decide requests
    and checking every answer against the one computed before the load."""

    def __init__(self, http: str, grpc_address: str, expected: dict, threads: int = 6):
        self.http, self.grpc_address, self.expected = http, grpc_address, expected
        self.counts = {"ok": 0, "wrong": 0, "error": 0}
        self.errors: list = []
        self.slowest = 0.0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(threads)]

    def __enter__(self) -> "Load":
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=60)

    def _run(self, i: int) -> None:
        keys = sorted(self.expected)
        n = i
        with LayaClient(self.grpc_address, timeout=30) as client:
            while not self._stop.is_set():
                key = keys[n % len(keys)]
                n += 1
                t0 = time.monotonic()
                try:
                    why = wrong_answer(ask(self.http, client, key), key, self.expected)
                    outcome = "ok" if why is None else "wrong"
                    if why is not None:
                        self.errors.append(why)
                except Exception as e:  # noqa: BLE001 - counted and reported
                    outcome = "error"
                    self.errors.append("%s at %s +%.1f s: %s" % (key, time.strftime("%H:%M:%S"),
                                                                 time.monotonic() - t0, e))
                self.slowest = max(self.slowest, time.monotonic() - t0)
                with self._lock:
                    self.counts[outcome] += 1


def ask(http: str, client: LayaClient, key: tuple):
    transport, s, q = key
    if transport == "http":
        status, body = http_json(http + "/v1/systemone", {"state": STATES[s], "questions": QUESTIONS[q],
                                                                "model": "english"})
    elif transport == "batch":
        status, body = http_json(http + "/v1/systemone/batch", {"states": STATES, "questions": QUESTIONS[q],
                                                                      "model": "english"})
    else:
        return client.decide(STATES[s], QUESTIONS[q], model="english")
    if status != 200:
        raise RuntimeError("HTTP %d %s" % (status, body))
    return body


def test_replicas_kill_restart_and_drain_under_load(tiny_ckpt):
    procs = Procs()
    ports = free_ports(12)
    inf = [(ports[2 * k], ports[2 * k + 1]) for k in range(3)]          # (gRPC, metrics) per replica
    tok = [(ports[6 + 2 * k], ports[7 + 2 * k]) for k in range(2)]
    http_port, grpc_port = ports[10], ports[11]
    http, gw_grpc = "http://127.0.0.1:%d" % http_port, "127.0.0.1:%d" % grpc_port
    ck = ["--checkpoint", "english=" + tiny_ckpt]

    def start_inference(k: int) -> subprocess.Popen:
        return procs.start("inference-%d" % k, ["inference", "--listen", "127.0.0.1:%d" % inf[k][0], "--device",
                                                "cpu", "--metrics", "127.0.0.1:%d" % inf[k][1],
                                                "--drain-grace-seconds", "10"] + ck)
    try:
        for k in range(3):
            start_inference(k)
        for k, (port, mport) in enumerate(tok):
            procs.start("tokenizer-%d" % k, ["tokenizer", "--listen", "127.0.0.1:%d" % port,
                                             "--metrics", "127.0.0.1:%d" % mport] + ck)
        procs.start("gateway", ["gateway", "--http", "127.0.0.1:%d" % http_port, "--grpc", gw_grpc,
                                "--tokenizer", ",".join("127.0.0.1:%d" % p for p, _ in tok),
                                "--inference", ",".join("127.0.0.1:%d" % p for p, _ in inf),
                                # shorter than the load: a merged Infer call must not inherit the deadline
                                # of the request that launched the chain (the warm-up's, long expired)
                                "--request-timeout-seconds", "20"] + ck)
        wait_for(lambda: http_json(http + "/ready")[0] == 200, 180, "gateway ready", procs)
        health = http_json(http + "/health")[1]
        assert sorted(k for k in health["services"] if k.startswith("inference@")) == sorted(
            "inference@127.0.0.1:%d" % p for p, _ in inf)

        with LayaClient(gw_grpc, timeout=30) as client:
            expected = {key: ask(http, client, key) for key in
                        [(t, s, q) for t in ("http", "grpc") for s in range(len(STATES)) for q in range(len(QUESTIONS))]
                        + [("batch", 0, q) for q in range(len(QUESTIONS))]}
        before = [calls(m, "inference", "yes") for _, m in inf]

        with Load(http, gw_grpc, expected) as load:
            time.sleep(2.0)
            # 1. kill -9 one replica under load, then start it again on the same port
            events = ["killed %s" % time.strftime("%H:%M:%S")]
            procs.procs["inference-0"].kill()
            procs.procs["inference-0"].wait()
            time.sleep(1.5)
            start_inference(0)
            # a warming replica gets nothing: no call reaches it before it reports SERVING
            addr0 = "127.0.0.1:%d" % inf[0][0]
            seen_not_serving = 0.0
            deadline = time.monotonic() + 120
            while health_of(addr0) != "SERVING":
                assert time.monotonic() < deadline, procs.log("inference-0")
                try:
                    seen_not_serving = max(seen_not_serving, calls(inf[0][1], "inference", "no"))
                except OSError:
                    pass   # its metrics endpoint is not up yet
                time.sleep(0.05)
            events.append("serving again %s" % time.strftime("%H:%M:%S"))
            time.sleep(2.0)
            restarted_after = calls(inf[0][1], "inference", "yes")
            restarted_not_serving = calls(inf[0][1], "inference", "no")
            # 2. SIGTERM another replica under load: it stops taking calls, finishes, exits 0
            draining_calls = {"yes": 0.0, "no": 0.0}
            drained = procs.procs["inference-1"]
            events.append("SIGTERM %s" % time.strftime("%H:%M:%S"))
            drained.send_signal(signal.SIGTERM)
            while drained.poll() is None:
                try:
                    draining_calls = {s: calls(inf[1][1], "inference", s) for s in ("yes", "no")}
                except OSError:
                    pass
                time.sleep(0.02)
            time.sleep(1.5)
        after = [calls(m, "inference", "yes") if procs.procs["inference-%d" % k].poll() is None else None
                 for k, (_, m) in enumerate(inf)]
        tok_calls = [calls(m, "tokenizer", "yes") for _, m in tok]
        total = sum(load.counts.values())
        print("\nreplicas: %d requests under load: %s (slowest %.2f s); inference calls before load %s, after %s "
              "(replica 0 restarted: %d after SERVING, %d while not serving; replica 1 drained: %d calls, %d "
              "arrived while draining); tokenizer calls %s"
              % (total, load.counts, load.slowest, before, after, restarted_after, restarted_not_serving,
                 draining_calls["yes"], draining_calls["no"], tok_calls))
        assert drained.returncode == 0, procs.log("inference-1")
        assert load.counts["wrong"] == 0 and load.counts["error"] == 0, (load.counts, events, load.errors[:8])
        assert total > 0, load.counts   # traffic through each phase: asserted per phase below
        assert seen_not_serving == 0 and restarted_not_serving == 0   # warming: nothing before SERVING
        assert restarted_after > 0                                    # and traffic once it serves
        assert after[2] - before[2] > 0 and draining_calls["yes"] > before[1]   # spread over replicas
        assert all(c > 0 for c in tok_calls)
        # calls picked just before the gateway saw NOT_SERVING may still arrive; new ones do not
        assert draining_calls["no"] <= 6, draining_calls
        assert http_json(http + "/ready")[0] == 200
    finally:
        procs.stop()


def test_ready_and_live_while_backends_are_down(tiny_ckpt):
    """/ready is 503 with the reason while no backend serves; /live stays 200; /health keeps 200.
    With a key set the probes answer without it, and the reason (backend addresses) needs it."""
    procs = Procs()
    procs.env["LAYA_API_KEY"] = "probe-key"
    auth = {"Authorization": "Bearer probe-key"}
    http_port = free_port()
    http = "http://127.0.0.1:%d" % http_port
    try:
        procs.start("gateway", ["gateway", "--http", "127.0.0.1:%d" % http_port, "--grpc",
                                "127.0.0.1:%d" % free_port(), "--tokenizer", "127.0.0.1:%d" % free_port(),
                                "--inference", "127.0.0.1:%d,127.0.0.1:%d" % (free_port(), free_port()),
                                "--checkpoint", "english=" + tiny_ckpt])

        def up():
            try:
                return http_json(http + "/live")[0] == 200
            except OSError:
                return False
        wait_for(up, 60, "gateway /live", procs)
        time.sleep(0.5)
        status, body = http_json(http + "/ready", headers=auth)
        assert status == 503 and body["ready"] is False and "tokenizer" in body["detail"], body
        assert http_json(http + "/ready") == (503, {"ready": False})
        assert http_json(http + "/live") == (200, {"status": "ok"})
        assert http_json(http + "/health") == (200, {"status": "ok"})
        status, body = http_json(http + "/health", headers=auth)
        assert status == 200 and body["ready"] is False
        assert len([k for k in body["services"] if k.startswith("inference@")]) == 2
    finally:
        procs.stop()


def test_serve_inference_replicas_survive_a_kill(tiny_ckpt):
    """`serve --inference-replicas 2`: both replicas serve; one killed -9 fails no request."""
    with Stack({"english": tiny_ckpt}, extra_args=["--inference-replicas", "2", "--device", "cpu",
                                                   "--tokenizer-workers", "1", "--gateway-workers", "1"]) as s:
        infs = [k for k in s.health()["services"] if k.startswith("inference@")]
        assert len(infs) == 2 and all(k.endswith(("inference-0.sock", "inference-1.sock")) for k in infs), infs
        # serve is ready once one replica serves; the other may still be warming up
        wait_for(lambda: all(s.health()["services"][k]["state"] == "ready" for k in infs), 60, "both replicas ready")
        body = {"state": STATES[0], "questions": QUESTIONS[0], "model": "english"}
        status, first, _ = s.post("/v1/systemone", body)
        assert status == 200
        os.kill(child_with(s, "inference-0.sock"), signal.SIGKILL)
        for _ in range(40):
            status, again, _ = s.post("/v1/systemone", body)
            # the same lone request on a replica of the same build and CPU: the same kernels on the same shapes
            assert status == 200 and _distance(again, first) == 0.0, (again, first)


def child_with(stack: Stack, text: str) -> int:
    out = subprocess.run(["ps", "-ww", "-eo", "pid,ppid,args"], capture_output=True, text=True).stdout
    for line in out.splitlines()[1:]:
        pid, ppid, args = line.strip().split(None, 2)
        if int(ppid) == stack.proc.pid and text in args:
            return int(pid)
    raise LookupError(text)


def test_endpoint_lists_and_dns_targets():
    from laya_grpc.engine.endpoints import parse_target
    assert parse_target(["127.0.0.1:5"], "--inference").endpoints == ("127.0.0.1:5",)
    assert parse_target(["unix:/a.sock"], "--x").endpoints == ("unix:/a.sock",)
    many = parse_target(["127.0.0.1:5,localhost:6", "10.0.0.1:7"], "--tokenizer")
    assert many.endpoints == ("127.0.0.1:5", "127.0.0.1:6", "10.0.0.1:7") and many.scheme == "grpc"
    assert parse_target("[::1]:5,[::1]:6", "--x").endpoints == ("[::1]:5", "[::1]:6")
    socks = parse_target("unix:///r/a.sock,/r/b.sock", "--x")
    assert socks.endpoints == ("unix:/r/a.sock", "unix:/r/b.sock")
    dns = parse_target("dns:///laya-inference:50052", "--x")
    assert dns.scheme == "dns" and dns.spec == "dns:///laya-inference:50052" and dns.endpoints == ()
    assert parse_target("ipc:///tmp/a", "--x").scheme == "ipc"   # left to the IPC transport
    for bad in ("dns:///a:1,127.0.0.1:2", "unix:/a,127.0.0.1:2", "ipc:///a,127.0.0.1:2", "nonsense,127.0.0.1:1", ""):
        with pytest.raises(LayaError):
            parse_target(bad, "--x")


def test_deadline_bounds_backend_calls():
    from laya_grpc.engine import deadline
    assert deadline.timeout(30.0) == 30.0
    with deadline.within(5.0):
        assert 4.0 < deadline.timeout(30.0) <= 5.0
        assert deadline.timeout(1.0) == 1.0
        with deadline.within(60.0):   # an outer, earlier deadline wins
            assert deadline.timeout(30.0) <= 5.0
    with deadline.within(0.0):
        with pytest.raises(LayaError) as e:
            deadline.timeout(30.0)
        assert e.value.kind is Kind.TIMEOUT
