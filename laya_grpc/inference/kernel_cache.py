"""Where compiled GPU kernels are kept (`--kernel-cache-dir`).

The CUDA path compiles its Triton kernels for the GPU it runs on the first time they run, which
costs seconds of start-up. Both Triton and TorchInductor keep what they compile in a directory
named by a variable they read when they compile (TRITON_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR), so
pointing those variables at one known directory before anything compiles lets a restart, another
replica, or an image filled by `laya-grpc warm-kernels` read the kernels instead. Entries are keyed
by kernel source, GPU architecture and library versions and written atomically, so several
processes may share one directory, and a cache made for another GPU or version is ignored (its
kernels compile again and are added). Triton's index of a kernel's files holds their absolute
paths, so a cache is read at the path it was filled at: an image's, a volume's and warm-kernels'
directory must be the same path as the service's (a copy elsewhere compiles again).
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Optional

from laya_grpc.core.runtime import flags

log = logging.getLogger("laya_grpc.inference.kernel_cache")

# the library's variable -> the subdirectory of --kernel-cache-dir it is given
SUBDIRS = {"TRITON_CACHE_DIR": "triton", "TORCHINDUCTOR_CACHE_DIR": "inductor"}
# what a compiled kernel is stored as: a CUDA cubin, a ROCm code object
KERNEL_SUFFIXES = (".cubin", ".hsaco")


def use(root: Optional[str]) -> dict:
    """Point Triton's and TorchInductor's caches under `root` for this process and its children;
    returns {variable: directory} (empty when `root` is unset: the libraries' defaults stand).
    Call before the first kernel compiles. A variable the operator set to another directory is
    replaced, with a warning; a directory that cannot be written is used, with a warning that a
    kernel missing from it will fail to compile."""
    if not root:
        return {}
    root = os.path.abspath(os.path.expanduser(root))
    env = flags.environment()
    chosen = {}
    for var, sub in SUBDIRS.items():
        path = os.path.join(root, sub)
        before = flags.external(var)
        if before and os.path.abspath(before) != path:
            log.warning("%s=%s is replaced by the kernel cache directory: %s", var, before, path)
        env[var] = path
        chosen[var] = path
    problem = _unwritable(root)
    if problem:
        log.warning("kernel cache %s is not writable (%s): kernels already there are used, but a kernel "
                    "missing there will fail to compile; give it a writable directory", root, problem)
    else:
        log.info("kernel cache: %s (Triton: %s)", root, chosen["TRITON_CACHE_DIR"])
    return chosen


def _unwritable(root: str) -> str:
    """'' when `root` (made if missing) can be written, else why not."""
    try:
        for sub in SUBDIRS.values():
            os.makedirs(os.path.join(root, sub), exist_ok=True)
    except OSError as e:
        return e.strerror or str(e)
    return "" if os.access(root, os.W_OK | os.X_OK) else "no write permission"


def triton_dir() -> Optional[str]:
    """The directory Triton compiles into now: TRITON_CACHE_DIR, else Triton's own default
    (~/.triton/cache); None without Triton."""
    try:
        from triton import knobs
    except ImportError:
        return None
    return knobs.cache.dir


@dataclass
class Contents:
    kernels: int = 0      # compiled kernels (cubin / hsaco files)
    files: int = 0        # every file: kernels, their metadata and intermediate forms, launchers
    bytes: int = 0


def contents(path: Optional[str]) -> Contents:
    """What a cache directory holds (nothing when it is unset or missing)."""
    out = Contents()
    if not path or not os.path.isdir(path):
        return out
    for base, _, files in os.walk(path):
        for name in files:
            out.files += 1
            out.kernels += name.endswith(KERNEL_SUFFIXES)
            try:
                out.bytes += os.path.getsize(os.path.join(base, name))
            except OSError:   # removed by a concurrent writer's cleanup
                pass
    return out
