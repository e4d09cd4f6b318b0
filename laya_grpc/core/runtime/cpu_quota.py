"""How many CPUs this process may really use, and the thread settings that follow from it.

`os.cpu_count()` is the host's cores. A container limited by a CPU quota (Kubernetes
`resources.limits.cpu`, `docker --cpus`: cgroup v2 `cpu.max`, v1 `cpu.cfs_quota_us`) or pinned to
some cores (`taskset`, cpusets: the affinity mask) gets less, and thread pools sized from the
host's cores then hold more runnable threads than the process gets CPU time for. For OpenMP
(torch's intra-op pool) that is a collapse, not a slowdown: its threads spin-wait at every
barrier for a sibling that is not running. `benchmarks/shared_cpu.py` measured it on a shared
2-core host: 17-31 requests in 8 s at the defaults, 500-1,000 with passive waiting
(docs/performance.md).

`available_cpus()` is the smaller of the affinity mask and the quota (rounded up, at least 1).
`prepare_openmp()` is called before torch is imported: threads that wait sleep instead of
spinning (`OMP_WAIT_POLICY=PASSIVE`) and the pool is sized to `available_cpus()`; both only where
the operator has not set the variable.
"""
from __future__ import annotations

import math
import os
from typing import Callable, MutableMapping, Optional

from laya_grpc.core.runtime import flags

_V1_FILES = ("cpu.cfs_quota_us", "cpu.cfs_period_us")


def parse_cpu_max(text: str) -> Optional[float]:
    """CPUs allowed by a cgroup v2 `cpu.max` ("QUOTA PERIOD" or "max PERIOD"); None: unlimited."""
    parts = text.split()
    if not parts or parts[0] == "max":
        return None
    try:
        quota, period = int(parts[0]), int(parts[1]) if len(parts) > 1 else 100000
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def parse_cfs(quota: str, period: str) -> Optional[float]:
    """CPUs allowed by cgroup v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`; None: unlimited (-1)."""
    try:
        q, p = int(quota.strip()), int(period.strip())
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None


def _read(path: str) -> Optional[str]:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _mounts(fs_root: str) -> list:
    """(mount point, root inside the hierarchy, 'v2' or the v1 controllers) of each cgroup mount."""
    out = []
    for line in (_read(os.path.join(fs_root, "proc/self/mountinfo")) or "").splitlines():
        left, sep, right = line.partition(" - ")
        fields, rest = left.split(), right.split()
        if not sep or len(fields) < 5 or len(rest) < 3:
            continue
        if rest[0] == "cgroup2":
            out.append((fields[4], fields[3], "v2"))
        elif rest[0] == "cgroup":
            out.append((fields[4], fields[3], set(rest[2].split(","))))
    return out


def _levels(mount: str, root: str, path: str) -> list:
    """The directories of our cgroup, from the deepest up to the mount point (each level's limit
    also binds us). A path outside the mount's root (a namespaced view) starts at the mount."""
    rel = os.path.relpath(path, root) if path.startswith(root) else "."
    rel = "" if rel in (".", "/") else rel.strip("/")
    parts = rel.split("/") if rel else []
    return [os.path.join(mount, *parts[:i]) for i in range(len(parts), -1, -1)]


def cgroup_cpu_limit(fs_root: str = "/") -> Optional[float]:
    """The CPU quota of this process's cgroup (the tightest level of cgroup v2 or v1's cpu
    controller) in CPUs, e.g. 0.5 or 2.0; None when there is none or it cannot be read."""
    groups = {}
    for line in (_read(os.path.join(fs_root, "proc/self/cgroup")) or "").splitlines():
        hid, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        groups["v2" if hid == "0" and controllers == "" else controllers] = path or "/"
    limits = []
    for mount, root, kind in _mounts(fs_root):
        if kind == "v2":
            path = groups.get("v2")
            read: Callable[[str], Optional[float]] = lambda d: parse_cpu_max(_read(os.path.join(d, "cpu.max")) or "")
        elif "cpu" in kind:
            path = next((p for c, p in groups.items() if c != "v2" and "cpu" in c.split(",")), None)
            read = lambda d: parse_cfs(*[_read(os.path.join(d, f)) or "" for f in _V1_FILES])
        else:
            continue
        if path is None:
            continue
        for d in _levels(os.path.join(fs_root, mount.lstrip("/")), root, path):
            value = read(d)
            if value is not None:
                limits.append(value)
    return min(limits) if limits else None


def affinity_cpus() -> int:
    """CPUs in this process's affinity mask (the host's count where there is no such call)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:   # not Linux
        return os.cpu_count() or 1


def available_cpus() -> int:
    """Whole CPUs this process can keep busy: min(affinity mask, quota rounded up), at least 1."""
    cpus = affinity_cpus()
    quota = cgroup_cpu_limit()
    if quota is not None:
        cpus = min(cpus, math.ceil(quota - 1e-9))
    return max(1, cpus)


def pool_size(cap: int, per_cpu: float = 1.0) -> int:
    """Threads or processes for a pool that scales with the CPUs, within 1..cap."""
    return max(1, min(cap, int(available_cpus() * per_cpu)))


def prepare_openmp(env: Optional[MutableMapping[str, str]] = None) -> int:
    """Before torch (OpenMP) is loaded: idle pool threads sleep instead of spinning, and the pool
    has `available_cpus()` threads; an operator's own OMP_WAIT_POLICY / OMP_NUM_THREADS wins.
    Returns the intra-op thread count."""
    env = flags.environment() if env is None else env
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    value = env.get("OMP_NUM_THREADS", "")
    first = value.split(",")[0].strip()
    if first.isdigit() and int(first) > 0:
        return int(first)
    n = available_cpus()
    env["OMP_NUM_THREADS"] = str(n)
    return n
