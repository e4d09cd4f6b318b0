"""`laya-grpc bench --smoke --backend mlx` end to end on CPU: the engine in process and the served
stack on the MLX backend (a file of its own, so that the test command's workers run it beside
tests/test_bench_smoke.py rather than after it)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from stack import ROOT

pytest.importorskip("laya")


def test_bench_smoke_mlx_backend(tmp_path):
    """The same suite against the MLX backend (engine in-process and the served stack)."""
    pytest.importorskip("mlx.core")
    out = tmp_path / "results"
    r = subprocess.run([sys.executable, "-m", "laya_grpc.cli", "bench", "--smoke", "--backend", "mlx", "--device", "cpu",
                        "--stages", "engine,service", "--out", str(out), "--work-dir", str(tmp_path / "work"),
                        "--concurrency", "1,4", "--idle-gaps-seconds", "0.1"], cwd=ROOT, capture_output=True, text=True,
                       timeout=600, env={k: v for k, v in os.environ.items() if not k.startswith("LAYA_")})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    recs = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    env = next(x for x in recs if x["kind"] == "environment")
    assert env["backend"] == "mlx"
    kinds = {(x["target"], x["kind"]) for x in recs}
    for want in [("engine", "latency"), ("engine", "parity"), ("grpc", "latency"), ("http", "latency")]:
        assert want in kinds, want
    parity = next(x for x in recs if x["kind"] == "parity")
    assert parity["passed"], parity
