"""Which device the network runs on, and in which precision.

Upstream falls back to CPU with a warning when the asked device is missing; we do the same
only when the caller allows it, and always hand back a reason that says so, so a service
never lands on CPU without its logs (and /health) saying why.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from laya_grpc.errors import Kind, LayaError

PREFERENCES = ("auto", "cpu", "cuda", "cuda:N", "mps")


def _mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def _unavailable(pref: str) -> str | None:
    """Why `pref` cannot be used here, or None when it can."""
    if pref == "cpu":
        return None
    if pref == "mps":
        return None if _mps_available() else "MPS is not available in this torch build / on this machine"
    if not torch.cuda.is_available():
        return "CUDA is not available (torch %s, no usable GPU)" % torch.__version__
    if pref.startswith("cuda:"):
        index = int(pref[5:])
        if index >= torch.cuda.device_count():
            return "%s does not exist (%d CUDA device(s) visible)" % (pref, torch.cuda.device_count())
    return None


def resolve_device(pref: str, require: bool = False) -> tuple[str, str]:
    """`pref` -> (torch device string, human reason). auto = CUDA, then MPS, then CPU.

    An explicit device that is not available raises LayaError(DEVICE) when `require`, else
    returns "cpu" with a reason that starts with WARNING.
    """
    pref = (pref or "auto").strip().lower()
    valid = pref in ("auto", "cpu", "cuda", "mps") or (pref.startswith("cuda:") and pref[5:].isdigit())
    if not valid:
        raise LayaError(Kind.DEVICE, "unknown device %r; expected one of %s" % (pref, ", ".join(PREFERENCES)))
    if pref == "auto":
        if torch.cuda.is_available():
            return "cuda", "auto: CUDA available (%s)" % torch.cuda.get_device_name(0)
        if _mps_available():
            return "mps", "auto: no CUDA, MPS available"
        return "cpu", "auto: no CUDA or MPS, using CPU"
    why = _unavailable(pref)
    if why is None:
        return pref, "requested %s" % pref
    if require:
        raise LayaError(Kind.DEVICE, "device %r was required but %s" % (pref, why))
    return "cpu", "WARNING: device %r requested but %s; falling back to CPU" % (pref, why)


@dataclass(frozen=True)
class Precision:
    """The dtype to build LayaTorch in; None = upstream's CPU load (see LayaTorch.from_checkpoint)."""
    dtype: torch.dtype | None
    reason: str


def precision_for(device: str, amp_dtype: str | None = None, override: str | None = None) -> Precision:
    """Upstream's autocast policy, as a model dtype.

    CPU: fp32 parameters (encoder in whatever dtype encoder/config.json declares, like upstream).
    CUDA: compute capability >= 8 -> the checkpoint's `amp_dtype` ("bf16" -> bfloat16, anything
    else float16; `override` "fp16"/"bf16" wins, upstream's LAYA_CUDA_AMP); older GPUs -> float16.
    MPS: float16. Weights are stored fp16 either way; bf16 is a conversion from them.
    """
    kind = device.split(":")[0]
    if kind == "cpu":
        return Precision(None, "cpu: fp32 (encoder in the dtype encoder/config.json declares, as upstream)")
    if kind == "mps":
        return Precision(torch.float16, "mps: fp16")
    if kind != "cuda":
        raise LayaError(Kind.DEVICE, "no precision policy for device %r" % device)
    if override is not None and override not in ("fp16", "bf16"):
        raise LayaError(Kind.DEVICE, "CUDA precision override must be 'fp16' or 'bf16', got %r" % override)
    major, _ = torch.cuda.get_device_capability(torch.device(device))
    if major < 8:
        return Precision(torch.float16, "cuda cc %d.x < 8: fp16 (no bf16 support)" % major)
    name = override or amp_dtype
    source = "override" if override else "checkpoint amp_dtype=%r" % (amp_dtype,)
    if name == "bf16":
        return Precision(torch.bfloat16, "cuda: bf16 (%s)" % source)
    return Precision(torch.float16, "cuda: fp16 (%s)" % source)
