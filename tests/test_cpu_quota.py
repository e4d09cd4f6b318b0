"""Thread pools follow the CPUs a process may use (cgroup CPU quota, affinity mask), not the
host's core count, and torch's OpenMP threads wait passively (core/runtime/cpu_quota.py)."""
import os
import subprocess
import sys

import pytest

from cpu_cgroup import make_cpu_cgroup, remove_cgroup
from laya_grpc.core.runtime import cpu_quota

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_quota_files_parse():
    assert cpu_quota.parse_cpu_max("max 100000\n") is None
    assert cpu_quota.parse_cpu_max("150000 100000\n") == 1.5
    assert cpu_quota.parse_cpu_max("") is None
    assert cpu_quota.parse_cfs("-1\n", "100000\n") is None
    assert cpu_quota.parse_cfs("50000\n", "100000\n") == 0.5
    assert cpu_quota.parse_cfs("", "") is None


def _tree(tmp_path, files: dict) -> str:
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(tmp_path)


def test_cgroup_v2_takes_the_tightest_level(tmp_path):
    root = _tree(tmp_path, {
        "proc/self/cgroup": "0::/kubepods/pod1/ctr\n",
        "proc/self/mountinfo": "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n",
        "sys/fs/cgroup/kubepods/pod1/ctr/cpu.max": "max 100000\n",
        "sys/fs/cgroup/kubepods/pod1/cpu.max": "250000 100000\n",
        "sys/fs/cgroup/kubepods/cpu.max": "400000 100000\n",
    })
    assert cpu_quota.cgroup_cpu_limit(root) == 2.5


def test_cgroup_v1_cpu_controller_and_namespaced_root(tmp_path):
    # inside a container the mount's root is the container's own cgroup: its files sit at the mount
    root = _tree(tmp_path, {
        "proc/self/cgroup": "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n",
        "proc/self/mountinfo": ("32 31 0:29 /docker/abc /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n"
                                "33 31 0:30 /docker/abc /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"),
        "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "50000\n",
        "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000\n",
    })
    assert cpu_quota.cgroup_cpu_limit(root) == 0.5


def test_no_cgroup_files_means_no_quota(tmp_path):
    assert cpu_quota.cgroup_cpu_limit(str(tmp_path)) is None


def test_operator_settings_win():
    env = {"OMP_NUM_THREADS": "3", "OMP_WAIT_POLICY": "ACTIVE"}
    assert cpu_quota.prepare_openmp(env) == 3
    assert env == {"OMP_NUM_THREADS": "3", "OMP_WAIT_POLICY": "ACTIVE"}
    env = {}
    n = cpu_quota.prepare_openmp(env)
    assert env == {"OMP_NUM_THREADS": str(n), "OMP_WAIT_POLICY": "PASSIVE"} and n == cpu_quota.available_cpus()


_CHILD = """
import os, sys
from laya_grpc.core.runtime import cpu_quota
from laya_grpc.inference.devices import pick_device
from laya_grpc.tokenizer.split_encode import rayon_threads
pick_device("cpu", "torch", False)
import torch
print(cpu_quota.available_cpus(), torch.get_num_threads(), rayon_threads(), os.environ["OMP_WAIT_POLICY"])
"""


def _child_env() -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "RAYON_NUM_THREADS", "RAYON_RS_NUM_CPUS",
                        "TOKENIZERS_PARALLELISM")}
    env["PYTHONPATH"] = os.pathsep.join([ROOT, os.path.join(ROOT, "protos", "gen"), env.get("PYTHONPATH", "")])
    return env


def _run_child(argv_prefix=(), preexec=None) -> list:
    out = subprocess.run(list(argv_prefix) + [sys.executable, "-c", _CHILD], env=_child_env(), cwd=ROOT,
                         preexec_fn=preexec, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


needs_two = pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
                               reason="needs Linux and 2+ CPUs in the affinity mask")


@needs_two
def test_affinity_mask_sizes_the_pools():
    cpu = min(os.sched_getaffinity(0))
    assert _run_child(preexec=lambda: os.sched_setaffinity(0, {cpu})) == ["1", "1", "1", "PASSIVE"]


@needs_two
def test_cgroup_quota_sizes_the_pools():
    """Half a CPU of quota with every CPU in the affinity mask: one thread per pool, where the
    host's core count (and torch's own default) gives two or more."""
    made = make_cpu_cgroup("laya-test-quota", 0.5)
    if made is None:
        pytest.skip("cannot create a cgroup with a CPU quota here")
    group, prefix = made
    try:
        assert _run_child(prefix) == ["1", "1", "1", "PASSIVE"]
    finally:
        remove_cgroup(group)
