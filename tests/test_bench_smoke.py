"""`laya-grpc bench --smoke` end to end on CPU: tiny checkpoint, every stage (our engine, upstream
laya eager, the served stack over gRPC and HTTP, one and two inference replicas on one device),
JSONL + markdown report written."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from stack import ROOT

pytest.importorskip("laya")


def test_bench_smoke(tmp_path):
    out = tmp_path / "results"
    r = subprocess.run([sys.executable, "-m", "laya_grpc.cli", "bench", "--smoke", "--device", "cpu",
                        # --out relative, as a user types it: the stages run in another directory
                        "--out", os.path.relpath(out, ROOT), "--work-dir", str(tmp_path / "work"), "--concurrency", "1,4",
                        "--idle-gaps-seconds", "0.1", "--stages", "engine,upstream,service,replicas", "--replicas", "1,2",
                        "--replica-clients", "2,4"], cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env={k: v for k, v in os.environ.items() if not k.startswith("LAYA_")})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    recs = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    kinds = {(x["target"], x["kind"]) for x in recs}
    for want in [("suite", "environment"), ("engine", "latency"), ("engine", "parity"), ("upstream", "latency"),
                 ("upstream", "ab"), ("grpc", "latency"), ("http", "latency"), ("http", "concurrency"),
                 ("service", "startup"), ("engine", "idle_gap"), ("service", "hops"), ("service", "ab")]:
        assert want in kinds, want
    hops = next(x for x in recs if x["kind"] == "hops" and x["input"] == "short")
    assert hops["transport"] == "ipc" and hops["model"]["n"] > 0 and hops["tokenize_server"]["p50_ms"] > 0
    for x in (x for x in recs if x["kind"] == "concurrency"):   # each load run's forwards, from serve's metrics
        # device_busy is a measured figure (the report prints it); here only that it was measured
        assert x["forwards"] > 0 and x["rows_per_forward"] >= 1 and x["device_busy"] > 0, x
    assert "HTTP - in-process" in r.stdout   # each change to the served path shows its cost in the CI log
    parity = next(x for x in recs if x["kind"] == "parity")
    assert parity["passed"] and parity["max_abs_dp"] == 0.0   # CPU fp32 against itself: exact
    reps = {(x["replicas"], x["clients"]): x for x in recs if x["kind"] == "replicas"}
    assert set(reps) == {(1, 2), (1, 4), (2, 2), (2, 4)}, sorted(reps)
    for x in reps.values():
        assert x["decisions_per_s"] > 0 and x["errors"] == 0 and 0 < x["p50_ms"] <= x["p95_ms"], x
        assert x["inference_processes"] == x["replicas"], x   # serve really ran N inference processes
    report = (out / "report.md").read_text()
    assert "Warm latency" in report and "our HTTP gateway" in report and "per-hop breakdown" in report
    table = report.split("## Inference replicas on one device", 1)[1].split("\n## ", 1)[0]
    assert "| 1 replica dec/s, p95 ms | 2 replicas dec/s, p95 ms | ratio 2/1 |" in table
    assert "| 2 | " in table and "| 4 | " in table and "at 4 clients" in table, table
