"""ruff (the rules in pyproject.toml's [tool.ruff]) finds nothing in the package, the tests and the
benchmarks."""
from __future__ import annotations

import subprocess
import sys

from stack import ROOT


def test_ruff_finds_nothing():
    r = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise",
                        "laya_grpc", "tests", "benchmarks"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-2000:]
