"""The kernel cache directory (`--kernel-cache-dir`, inference/kernel_cache.py) and `laya-grpc
warm-kernels` (cli/warm_kernels.py): the setting reaches Triton's and TorchInductor's variables
before the first checkpoint loads, and warm-kernels runs the service's own warm-up. CI has no GPU:
on the CPU the warm-up runs and nothing is compiled, which the command must say."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from laya_grpc.cli.warm_kernels import WarmKernelsSettings
from laya_grpc.core.runtime import flags
from laya_grpc.inference import kernel_cache
from laya_grpc.inference.settings import InferenceSettings
from stack import ROOT

ENV = {k: v for k, v in os.environ.items()
       if not k.startswith("LAYA_") and k not in kernel_cache.SUBDIRS}


def resolve(cls, argv: list, env: dict):
    p = flags.Parser(prog="t")
    flags.add_settings(p, cls)
    return flags.finish(p, p.parse_args(argv), env=env).settings


def cli(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "laya_grpc.cli", *argv], capture_output=True, text=True,
                          env=dict(ENV, **(env or {})), cwd=ROOT, timeout=120)


@pytest.mark.parametrize("cls", [InferenceSettings, WarmKernelsSettings], ids=lambda c: c.__name__)
def test_setting_from_flag_and_environment(cls):
    assert resolve(cls, [], {}).kernel_cache_dir is None   # unset: the libraries' defaults
    assert resolve(cls, [], {"LAYA_KERNEL_CACHE_DIR": "/from/env"}).kernel_cache_dir == "/from/env"
    got = resolve(cls, ["--kernel-cache-dir", "/from/flag"], {"LAYA_KERNEL_CACHE_DIR": "/from/env"})
    assert got.kernel_cache_dir == "/from/flag"   # the flag wins over the variable


def test_serve_hands_the_setting_to_its_inference_replicas():
    from laya_grpc.cli.settings import ServeSettings
    s = resolve(ServeSettings, ["--kernel-cache-dir", "/k"], {})
    assert flags.to_env(s)["LAYA_KERNEL_CACHE_DIR"] == "/k"


def test_use_points_both_libraries_under_the_directory(tmp_path, monkeypatch):
    for var in kernel_cache.SUBDIRS:
        monkeypatch.delenv(var, raising=False)
    assert kernel_cache.use(None) == {} and "TRITON_CACHE_DIR" not in os.environ   # unset: nothing changes
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "elsewhere"))   # replaced (with a warning)
    got = kernel_cache.use(str(tmp_path / "kc"))
    assert got == {"TRITON_CACHE_DIR": str(tmp_path / "kc" / "triton"),
                   "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "kc" / "inductor")}
    for var, path in got.items():
        assert os.environ[var] == path and os.path.isdir(path)


def test_contents_counts_compiled_kernels(tmp_path):
    key = tmp_path / "triton" / "KEY"
    key.mkdir(parents=True)
    for name in ("k.cubin", "k.json", "k.ptx", "__grp__k.json"):
        (key / name).write_bytes(b"x" * 10)
    c = kernel_cache.contents(str(tmp_path / "triton"))
    assert (c.kernels, c.files, c.bytes) == (1, 4, 40)
    assert kernel_cache.contents(str(tmp_path / "missing")).files == 0


# The inference command with its runner loader replaced by one that reports the two variables as
# the first checkpoint starts to load (before anything could compile) and exits.
SPY = """
import os, sys
from laya_grpc.inference import registry
def spy(*a, **k):
    print("LOADING", os.environ.get("TRITON_CACHE_DIR"), os.environ.get("TORCHINDUCTOR_CACHE_DIR"), flush=True)
    os._exit(0)
registry.load_runner = spy
from laya_grpc.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def test_inference_sets_the_variables_before_the_first_load(tiny_ckpt, tmp_path):
    r = subprocess.run([sys.executable, "-c", SPY, "inference", "--checkpoint", "tiny=" + tiny_ckpt,
                        "--listen", "127.0.0.1:0", "--device", "cpu"], capture_output=True, text=True,
                       env=dict(ENV, LAYA_KERNEL_CACHE_DIR=str(tmp_path / "kc")), cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("LOADING"))
    assert line.split()[1:] == [str(tmp_path / "kc" / "triton"), str(tmp_path / "kc" / "inductor")], r.stdout


def test_warm_kernels_on_cpu_runs_the_warmup_and_says_nothing_compiled(tiny_ckpt, tmp_path):
    cache = tmp_path / "kc"
    r = cli("warm-kernels", "--checkpoint", "tiny=" + tiny_ckpt, "--kernel-cache-dir", str(cache), "--device", "cpu")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "Triton cache %s: 0 kernels before" % (cache / "triton") in out, out
    assert "tiny: cpu/float32" in out and "warm-up" in out, out            # the service's warm-up ran
    assert "1 of 1 checkpoints warmed in" in out and "0 kernels (+0)" in out, out
    assert "only CUDA compiles kernels into this cache; on cpu" in out and "kernel cache is unchanged" in out, out
    assert (cache / "triton").is_dir() and (cache / "inductor").is_dir()


@pytest.mark.parametrize("spec", ["tiny={missing}", "tiny"])
def test_warm_kernels_refuses_a_missing_checkpoint_in_one_line(spec, tmp_path):
    missing = str(tmp_path / "no-such-checkpoint")
    r = cli("warm-kernels", "--checkpoint", spec.format(missing=missing), "--kernel-cache-dir", str(tmp_path / "kc"))
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("laya-grpc warm-kernels: "), r.stderr
    assert (missing in lines[0]) if "=" in spec else ("NAME=SOURCE" in lines[0]), lines[0]
    assert r.stdout == ""   # nothing was loaded or warmed


def test_warm_kernels_without_its_backend_is_one_clear_line(tiny_ckpt):
    from tests.test_base_install import no_backends
    r = no_backends("warm-kernels", "--checkpoint", "tiny=" + tiny_ckpt)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0].startswith("laya-grpc warm-kernels: the torch backend is not installed"), lines[0]
