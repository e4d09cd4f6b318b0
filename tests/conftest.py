"""Shared fixtures: synthetic checkpoints (made once per test run) and a cached upstream loader.

The checkpoints come from our own `make_checkpoint` (milliseconds each), never from the Hub;
`upstream_agent(path)` is the test-time reference, laya 0.4.15 loaded on CPU.
"""
from __future__ import annotations

import os
import warnings

# CI has no GPU: the CUDA path's Triton kernels run through Triton's interpreter. Set before any
# test module imports triton, since triton's own jit helpers read it at import (collection order
# must not decide whether tests/test_cuda_attention.py can run).
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest

from laya_grpc.cli.make_checkpoint import make_checkpoint


@pytest.fixture(scope="session")
def ckpt_root(tmp_path_factory):
    return tmp_path_factory.mktemp("ckpt")


@pytest.fixture(scope="session")
def tiny_ckpt(ckpt_root) -> str:
    """English-style (ModernBERT-like) tiny checkpoint."""
    return make_checkpoint(str(ckpt_root / "tiny"), "tiny")


@pytest.fixture(scope="session")
def tiny_ml_ckpt(ckpt_root) -> str:
    """Multilingual-style (mmBERT/Gemma-like) tiny checkpoint."""
    return make_checkpoint(str(ckpt_root / "tiny-ml"), "tiny-ml")


@pytest.fixture(scope="session")
def tiny_par_ckpt(ckpt_root) -> str:
    """`tiny` with `"option_layout": "parallel"`."""
    return make_checkpoint(str(ckpt_root / "tiny-par"), "tiny-par")


@pytest.fixture(scope="session")
def upstream_agent():
    """`load(path) -> laya.Agent` on CPU, one Agent per path for the session.

    The path must contain a "/" (laya.load resolves bare words as aliases, gotcha G7); the
    fixture checkpoints above are absolute paths.
    """
    agents = {}

    def load(path: str):
        if path not in agents:
            import laya
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                agents[path] = laya.load(path, device="cpu")
        return agents[path]

    return load


def pytest_addoption(parser):
    parser.addoption("--soak", action="store_true", default=False,
                     help="large counts in the hostile-input, load and kill tests (minutes, not for CI)")


@pytest.fixture(scope="session")
def soak(request) -> bool:
    return bool(request.config.getoption("--soak"))
