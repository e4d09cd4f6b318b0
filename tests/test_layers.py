"""The package's layers hold (.importlinter), and the check really catches a forbidden import.

Runs import-linter's `lint-imports` on the real tree, then on copies of the package with one
forbidden import planted: an upward import in core, a service importing another service, torch in
the gateway. Each copy must fail, so a contract that silently checks nothing cannot pass here.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).with_name("lint-imports")


def _lint(tree: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree), str(ROOT / "protos" / "gen")]))
    return subprocess.run([str(LINT), "--no-cache", str(ROOT / ".importlinter")], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=120)


def _copy_with(tmp_path: Path, module: str, line: str) -> Path:
    shutil.copytree(ROOT / "laya_grpc", tmp_path / "laya_grpc", ignore=shutil.ignore_patterns("__pycache__"))
    target = tmp_path / module
    target.write_text(target.read_text() + "\n" + line + "\n")
    return tmp_path


def test_real_tree_keeps_every_contract():
    r = _lint(ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "3 kept, 0 broken" in r.stdout, r.stdout


@pytest.mark.parametrize("module,line,broken", [
    ("laya_grpc/core/errors.py", "import laya_grpc.gateway", "laya_grpc.core is not allowed to import laya_grpc.gateway"),
    ("laya_grpc/gateway/http_app.py", "from laya_grpc.inference import batcher",
     "laya_grpc.gateway is not allowed to import laya_grpc.inference"),
    ("laya_grpc/tokenizer/encoding.py", "from laya_grpc.cli import main",
     "laya_grpc.tokenizer is not allowed to import laya_grpc.cli"),
    ("laya_grpc/gateway/http_app.py", "import torch", "laya_grpc.gateway is not allowed to import torch"),
    ("laya_grpc/engine/decider.py", "import laya_grpc.gateway.http_app", "laya_grpc.engine is not allowed to import laya_grpc.gateway"),
    ("laya_grpc/engine/inprocess.py", "from laya_grpc.tokenizer import encoding",
     "laya_grpc.engine is not allowed to import laya_grpc.tokenizer"),
    ("laya_grpc/engine/remote_services.py", "import torch", "laya_grpc.engine is not allowed to import torch"),
    ("laya_grpc/client/client.py", "import mlx.core", "laya_grpc.client is not allowed to import mlx"),
])
def test_planted_forbidden_import_fails(tmp_path, module, line, broken):
    r = _lint(_copy_with(tmp_path, module, line))
    assert r.returncode != 0, r.stdout
    assert broken in " ".join(r.stdout.split()), r.stdout
