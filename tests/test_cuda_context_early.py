"""The early CUDA context (devices.start_cuda_context) is a hint that decides nothing: it aims at the
device `pick_device` would pick, and does nothing where torch, the driver or CUDA is missing."""
from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import pytest

from laya_grpc.inference import devices


@pytest.mark.parametrize("requested,backend,index", [
    ("auto", "torch", 0), ("gpu", "torch", 0), ("cuda", "torch", 0), ("CUDA:3", "torch", 3), (" cuda:1 ", "torch", 1),
    ("cpu", "torch", None), ("mps", "torch", None), ("cuda:x", "torch", None), ("", "torch", 0),
    ("auto", "mlx", None), ("gpu", "mlx", None),
])
def test_cuda_index_is_the_ordinal_the_device_pick_would_choose(requested, backend, index):
    assert devices.cuda_index(requested, backend) == index


def _fake_torch(root, with_cuda: bool) -> str:
    pkg = os.path.join(root, "torch")
    os.makedirs(os.path.join(pkg, "lib"))
    open(os.path.join(pkg, "__init__.py"), "w").close()
    if with_cuda:
        open(os.path.join(pkg, "lib", "libtorch_cuda.so"), "w").close()
    return root


@pytest.mark.parametrize("with_cuda", [True, False])
def test_a_cuda_build_of_torch_is_read_from_its_files_without_importing_it(tmp_path, with_cuda):
    root = _fake_torch(str(tmp_path), with_cuda)
    code = ("import sys; from laya_grpc.inference import devices; "
            "print(devices._torch_has_cuda(), 'torch' in sys.modules)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.getcwd()]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(with_cuda), "False"]


def test_no_thread_where_torch_is_not_a_cuda_build():
    if devices._torch_has_cuda():
        pytest.skip("this torch is a CUDA build")
    assert devices.start_cuda_context("auto", "torch") is None
    assert devices.start_cuda_context("cuda:0", "torch") is None


def test_no_thread_for_a_device_that_cannot_be_cuda(monkeypatch):
    monkeypatch.setattr(devices, "_torch_has_cuda", lambda: True)
    for requested, backend in (("cpu", "torch"), ("mps", "torch"), ("gpu", "mlx")):
        assert devices.start_cuda_context(requested, backend) is None


def test_without_a_driver_the_thread_ends_and_leaves_everything_to_torch(monkeypatch):
    try:
        ctypes.CDLL("libcuda.so.1")
        pytest.skip("this machine has the CUDA driver")
    except OSError:
        pass
    monkeypatch.delenv("CUDA_MODULE_LOADING", raising=False)
    monkeypatch.setattr(devices, "_torch_has_cuda", lambda: True)
    t = devices.start_cuda_context("auto", "torch")
    assert t is not None and t.daemon
    t.join(10)
    assert not t.is_alive()
    assert devices._retain_primary_context(0) == -1
    # torch's own choice of module loading, set before the driver could read it
    assert os.environ["CUDA_MODULE_LOADING"] == "LAZY"
