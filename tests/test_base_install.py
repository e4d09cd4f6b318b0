"""The base install (no torch, no mlx) runs the gateway, tokenizer, clients and `decide`; the
inference service without its backend stops with one line naming the extra; `serve` started from
a folder holding unrelated `gateway/`, `clients/` and `benchmarks/` packages still comes up.

"Without torch" is a subprocess whose import system refuses torch and mlx (a meta-path finder
that raises ModuleNotFoundError, as a missing package does), so the check runs in the test venv.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

from stack import ROOT, Stack

NO_BACKENDS = r'''
import sys
class NoBackends:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "mlx"):
            raise ModuleNotFoundError("No module named %r" % name, name=name)
sys.meta_path.insert(0, NoBackends())
sys.argv = ["laya-grpc"] + sys.argv[1:]
if sys.argv[1:] == ["--import"]:
    import laya_grpc.client, laya_grpc.gateway.server, laya_grpc.tokenizer.server  # noqa: F401
    print("imported")
    sys.exit(0)
from laya_grpc.cli import main
sys.exit(main())
'''


def no_backends(*argv: str, cwd: str = ROOT, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAYA_")}
    return subprocess.run([sys.executable, "-P", "-c", NO_BACKENDS, *argv], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=timeout)


def test_the_refusal_is_real():
    r = subprocess.run([sys.executable, "-c", NO_BACKENDS.replace("from laya_grpc.cli import main", "import torch"),
                        "x"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "No module named 'torch'" in r.stderr


def test_gateway_tokenizer_and_clients_need_no_backend():
    r = no_backends("--import")
    assert r.returncode == 0 and r.stdout.strip() == "imported", r.stderr
    for command in ("gateway", "tokenizer", "decide", "watch", "serve", "make-checkpoint"):
        r = no_backends(command, "--help")
        assert r.returncode == 0 and "usage: laya-grpc %s" % command in r.stdout, (command, r.stderr)


def test_inference_without_its_backend_is_one_clear_line(tiny_ckpt):
    for backend in ("torch", "mlx"):
        r = no_backends("inference", "--listen", "127.0.0.1:0", "--backend", backend,
                        "--checkpoint", "english=%s" % tiny_ckpt)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2, r.stderr
        assert len(lines) == 1 and "pip install 'laya-grpc[%s]'" % backend in lines[0], r.stderr
        assert lines[0].startswith("laya-grpc inference: the %s backend is not installed" % backend)


def test_serve_from_a_folder_with_shadowing_packages_then_decide_without_torch(tmp_path, tiny_ckpt):
    # the old layout's top-level names, and our own: a child that put the cwd on sys.path would import these
    for name in ("gateway", "clients", "benchmarks", "tokenizer", "inference", "core", "laya_grpc", "laya_proto"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text("raise SystemExit('the unrelated %s package was imported')\n"
                                                     % name)
    questions = tmp_path / "q.json"
    questions.write_text(json.dumps({"intent": {"type": "choice", "instructions": "What is wanted?",
                                                "criteria": ["refund", "exchange"]}}))
    # started as the `laya-grpc` console script starts it: the cwd is not on the supervisor's own sys.path
    with Stack({"english": tiny_ckpt}, cwd=str(tmp_path), python=[sys.executable, "-P"]) as s:
        assert "unrelated" not in s.full_log()
        r = no_backends("decide", "I want my money back.", "--questions", str(questions), "--address", s.grpc,
                        "--json", cwd=str(tmp_path))
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert list(out["answers"]) == ["intent"] and out["routing"]["model"] == "english"
