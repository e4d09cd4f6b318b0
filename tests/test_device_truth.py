"""The service never claims a device it is not running on, and never falls back silently."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from stack import ROOT, Stack, free_port

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="these tests need a machine without CUDA")


def _env():
    return {k: v for k, v in os.environ.items() if not k.startswith("LAYA_")}


def test_inference_require_device_exits_with_a_clear_message(tiny_ckpt):
    out = subprocess.run([sys.executable, "-m", "laya_grpc.cli", "inference", "--listen", "127.0.0.1:%d" % free_port(),
                          "--device", "cuda", "--require-device", "--checkpoint", "english=%s" % tiny_ckpt],
                         capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=120)
    assert out.returncode == 3
    assert "CUDA device 0 is not available" in out.stderr and "--require-device" in out.stderr


def test_serve_require_device_stops_instead_of_restarting(tiny_ckpt):
    out = subprocess.run([sys.executable, "-m", "laya_grpc.cli", "serve", "--http", "127.0.0.1:%d" % free_port(),
                          "--grpc", "127.0.0.1:%d" % free_port(), "--device", "mps", "--require-device",
                          "--checkpoint", "english=%s" % tiny_ckpt],
                         capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=180)
    assert out.returncode == 3, out.stderr[-2000:]
    assert "MPS is not available" in out.stderr and "restart #" not in out.stderr


def test_fallback_is_loud_and_visible_in_health(tiny_ckpt):
    with Stack({"english": tiny_ckpt}, extra_args=["--device", "cuda"]) as s:
        c = s.health()["checkpoints"]["english"]
        assert c["device"] == "cpu" and c["device_requested"] == "cuda" and c["device_fallback"] is True
        assert s.health()["device"] == "cpu"
        assert "FALLING BACK TO CPU" in s.full_log()


def test_mlx_backend_reports_where_it_runs(tiny_ckpt):
    pytest.importorskip("mlx.core")
    with Stack({"english": tiny_ckpt}, extra_args=["--backend", "mlx"]) as s:
        h = s.health()
        c = h["checkpoints"]["english"]
        assert c["backend"] == "mlx" and c["device"] in ("mlx:cpu", "mlx:gpu") and c["device_fallback"] is False
        q = {"q": {"type": "noul", "instructions": "greeting?"}}
        status, body, _ = s.post("/v1/systemone", {"state": "hello there, how are you today?", "questions": q,
                                                   "model": "english"})
        assert status == 200 and body["answers"]["q"]["type"] == "noul"
        # auto-routing to a checkpoint this deployment does not serve is a clear 404, not a 500
        status, body, _ = s.post("/v1/systemone", {"state": "hello", "questions": q})
        assert status == 404 and "'multilingual' is not served here" in body["detail"]


@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_require_device_gpu_fails_clearly_without_a_gpu(tiny_ckpt, backend):
    if backend == "mlx":
        pytest.importorskip("mlx.core")
    out = subprocess.run([sys.executable, "-m", "laya_grpc.cli", "inference", "--listen", "127.0.0.1:%d" % free_port(),
                          "--backend", backend, "--require-device", "gpu", "--checkpoint", "english=%s" % tiny_ckpt],
                         capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=120)
    assert out.returncode == 3, out.stderr[-2000:]
    assert ("no GPU is available" if backend == "torch" else "MLX has no GPU here") in out.stderr


def test_mlx_device_cpu_is_honoured(tiny_ckpt):
    pytest.importorskip("mlx.core")
    with Stack({"english": tiny_ckpt}, extra_args=["--backend", "mlx", "--device", "cpu"]) as s:
        c = s.health()["checkpoints"]["english"]
        assert c["device"] == "mlx:cpu" and c["device_requested"] == "cpu" and c["device_fallback"] is False
