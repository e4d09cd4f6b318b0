"""Which device the network runs on, and in which precision: one policy for every backend.

`auto` picks CUDA, then MPS, then CPU (MLX: its default device). An explicit device that is not
available is an error with `--require-device`; otherwise the service falls back to CPU loudly:
a WARNING in the log, and `device_fallback: true` with the requested device in /health and the
status stream. Devices reported to users are always read back from the live weights.
"""
from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Optional

from laya_grpc.core.runtime import cpu_quota, flags
from laya_grpc.core.errors import Kind, LayaError

log = logging.getLogger("laya_grpc.inference.devices")


@dataclass
class DevicePick:
    device: str            # what the runner will use
    requested: str         # what the operator asked for
    fallback: bool         # True when requested was unavailable and we fell back (loudly)
    reason: str


def pick_device(requested: str, backend: str, require: bool) -> DevicePick:
    requested = (requested or "auto").strip().lower()
    return _pick_mlx(requested, require) if backend == "mlx" else _pick_torch(requested, require)


def _refuse_or_fall_back(requested: str, why: str, fallback: str, require: bool) -> DevicePick:
    if require:
        raise LayaError(Kind.DEVICE, why + "; refusing to start (--require-device)")
    log.warning("%s; FALLING BACK TO %s (pass --require-device to fail instead)", why, fallback.upper())
    return DevicePick(fallback, requested, True, "%s; fell back to %s" % (why, fallback))


def _pick_mlx(requested: str, require: bool) -> DevicePick:
    import mlx.core as mx
    has_gpu = bool(getattr(mx, "metal", None) and mx.metal.is_available())
    if requested in ("auto", "mlx"):
        return DevicePick("gpu" if has_gpu else "cpu", requested, False, "auto: MLX's default device")
    if requested == "cpu":
        return DevicePick("cpu", requested, False, "requested")
    if requested not in ("gpu", "mps", "metal"):
        raise LayaError(Kind.INVALID, "unknown device %r for the mlx backend; choose auto, gpu or cpu" % requested)
    if has_gpu:
        return DevicePick("gpu", requested, False, "requested")
    return _refuse_or_fall_back(requested, "MLX has no GPU here (Metal is unavailable; MLX runs on the CPU)",
                                "cpu", require)


def _pick_torch(requested: str, require: bool) -> DevicePick:
    configure_cpu_threads()
    import torch
    cuda = torch.cuda.is_available()
    mps = bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())
    if requested == "auto":
        dev = "cuda:0" if cuda else "mps" if mps else "cpu"
        return DevicePick(dev, requested, False, "auto: first available of cuda, mps, cpu")
    if requested == "cpu":
        return DevicePick("cpu", requested, False, "requested")
    if requested == "gpu":   # whichever accelerator this machine has
        if cuda or mps:
            return DevicePick("cuda:0" if cuda else "mps", requested, False, "gpu: the available accelerator")
        return _refuse_or_fall_back(requested, "no GPU is available to torch %s (neither CUDA nor MPS)"
                                    % torch.__version__, "cpu", require)
    if requested == "cuda" or (requested.startswith("cuda:") and requested[5:].isdigit()):
        idx = int(requested[5:]) if ":" in requested else 0
        if cuda and idx < torch.cuda.device_count():
            return DevicePick("cuda:%d" % idx, requested, False, "requested")
        return _refuse_or_fall_back(requested, "CUDA device %d is not available (torch %s, %d CUDA devices)"
                                    % (idx, torch.__version__, torch.cuda.device_count() if cuda else 0), "cpu", require)
    if requested == "mps":
        if mps:
            return DevicePick("mps", requested, False, "requested")
        return _refuse_or_fall_back(requested, "MPS is not available (needs Apple Silicon and a torch build with MPS)",
                                    "cpu", require)
    raise LayaError(Kind.INVALID, "unknown device %r; choose auto, cpu, gpu, cuda, cuda:N or mps" % requested)


@functools.lru_cache(maxsize=None)
def configure_cpu_threads() -> int:
    """torch's CPU thread pools sized to the CPUs this process may use (affinity mask and cgroup
    quota, core/runtime/cpu_quota.py), not the host's cores, with OpenMP threads that sleep while they
    wait instead of spinning. The OpenMP settings take effect only when torch is not imported yet
    (here: the first device pick of a service); OMP_NUM_THREADS / OMP_WAIT_POLICY set by the
    operator win. Returns the intra-op thread count."""
    import sys
    late = "torch" in sys.modules
    n = cpu_quota.prepare_openmp()
    import torch
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    try:
        torch.set_num_interop_threads(n)
    except RuntimeError:   # inter-op work already ran in this process: its pool keeps its size
        pass
    log.info("torch CPU threads: %d (%d CPUs in the affinity mask, cgroup CPU quota %s; OpenMP wait policy %s%s)",
             n, cpu_quota.affinity_cpus(), cpu_quota.cgroup_cpu_limit() or "none",
             flags.external("OMP_WAIT_POLICY"), ", set after torch was loaded" if late else "")
    return n


_TORCH_DTYPES = {"float32": "float32", "fp32": "float32", "float16": "float16", "fp16": "float16",
                 "bfloat16": "bfloat16", "bf16": "bfloat16"}


# what `--dtype auto` builds per device type (docs/precision.md); CPU: None, upstream's own load.
# CUDA: the exact mode. 16-bit GEMM inputs move answers by an amount that grows with how sharp a
# checkpoint's logits are (0.005 on one random checkpoint, 0.10 on a sharper one of the same shape,
# H200), so no 16-bit setting holds a tolerance on every checkpoint; float16 stays available by name.
AUTO_DTYPE = {"cuda": "float32", "mps": "float16"}


def torch_dtype(name: Optional[str], device: str):
    """The dtype to build LayaTorch in.

    auto (AUTO_DTYPE): on CPU None, which is upstream's CPU load (encoder in the dtype
    encoder/config.json declares, fp32 for every published config; head fp32), so CPU stays exact
    to upstream; on CUDA float32, the exact mode (split-fp16 tensor-core GEMMs, precision.py); on
    MPS float16, the checkpoint's stored precision. On CUDA float16 is the fast mode by name
    (bfloat16 moved probabilities twice to five times as much as float16: docs/precision.md)."""
    import torch
    if name and name != "auto":
        if name not in _TORCH_DTYPES:
            raise LayaError(Kind.INVALID, "unknown dtype %r; choose auto, float32, float16 or bfloat16" % name)
        return getattr(torch, _TORCH_DTYPES[name])
    auto = AUTO_DTYPE.get(device.split(":")[0])
    return None if auto is None else getattr(torch, auto)


def mlx_dtype(name: Optional[str], device: str) -> str:
    """float32 on the CPU (exact to upstream); float16 on the Apple GPU (the MLX ports' convention)."""
    if not name or name == "auto":
        return "float16" if device == "gpu" else "float32"
    if name in ("float32", "fp32"):
        return "float32"
    if name in ("float16", "fp16"):
        return "float16"
    raise LayaError(Kind.INVALID, "the mlx backend runs float32 or float16, not %r" % name)


def init_device(device: str, backend: str) -> float:
    """Create the device's context now (seconds taken), so the first checkpoint load does not pay
    for it: on CUDA the context and a cuBLAS handle (0.29 s on the H200 once torch is imported),
    overlapping the checkpoint's validation and digest. Runs on the device thread; CPU, MPS and MLX
    need nothing here."""
    import time
    t0 = time.perf_counter()
    if backend == "torch" and device.startswith("cuda"):
        import torch
        dev = torch.device(device)
        a = torch.ones(8, 8, device=dev, dtype=torch.float16)
        (a @ a).sum().item()   # context, allocator and a cuBLAS handle
    return time.perf_counter() - t0
