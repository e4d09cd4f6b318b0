"""A wheel built from a clean checkout holds only `laya_grpc` and `laya_proto` at top level (no
stray `gateway/`, `benchmarks/` or `tests/` packages that would shadow others once installed)."""
from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_top_level_is_only_our_two_packages(tmp_path):
    src = tmp_path / "src"
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=ROOT,
                           capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, files):   # the files a clean checkout has, as they are now
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                        "-w", str(tmp_path / "dist"), str(src)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    [wheel] = (tmp_path / "dist").glob("laya_grpc-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"laya_grpc", "laya_proto"}, sorted(top)
    for module in ("laya_grpc/gateway/server.py", "laya_grpc/engine/inprocess.py", "laya_proto/v1/decision_pb2.py"):
        assert module in names, module
