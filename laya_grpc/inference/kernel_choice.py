"""Which encoder kernels and row layout a torch runner takes on its device: the selection policy
behind --cuda-kernels and --pack-rows, kept apart from the runner so it is read (and tested) alone."""
from __future__ import annotations

import logging

from laya_grpc.core.errors import Kind, LayaError

log = logging.getLogger("laya_grpc.inference.kernel_choice")


CUDA_KERNELS = ("auto", "fused", "reference")


def resolve_kernels(requested: str, device_type: str) -> str:
    """The encoder kernels a torch runner on `device_type` runs: "fused" (Triton, CUDA only) or
    "reference". auto takes fused on CUDA when Triton works there, else says loudly why not."""
    if requested not in CUDA_KERNELS:
        raise LayaError(Kind.INVALID, "--cuda-kernels must be one of %s, got %r" % ("|".join(CUDA_KERNELS), requested))
    if requested == "reference" or (requested == "auto" and device_type != "cuda"):
        return "reference"
    if device_type != "cuda":
        raise LayaError(Kind.INVALID, "--cuda-kernels fused needs a CUDA device; this runner is on %s" % device_type)
    from . import cuda_attention, cuda_kernels
    ok, why = cuda_kernels.available()
    if ok:
        ok, why = cuda_attention.available()
    if ok:
        return "fused"
    if requested == "fused":
        raise LayaError(Kind.INVALID, "--cuda-kernels fused: %s" % why)
    log.warning("CUDA encoder falls back to the reference kernels (about 3x the launches): %s", why)
    return "reference"


PACK_ROWS = ("auto", "on", "off")


def resolve_pack_rows(requested: str, cuda_graphs: bool, kernels: str, parallel: bool) -> bool:
    """Whether a torch runner packs rows (packing.py): auto packs wherever it can (CUDA graphs of the
    fused kernels, sequential option layout), on insists and says why it cannot, off keeps padding."""
    if requested not in PACK_ROWS:
        raise LayaError(Kind.INVALID, "--pack-rows must be one of %s, got %r" % ("|".join(PACK_ROWS), requested))
    why = ("it needs the fused CUDA kernels (this runner has %s)" % kernels if kernels != "fused"
           else "the parallel option layout is not packed" if parallel
           else "it needs CUDA graphs" if not cuda_graphs else "")
    if requested == "on" and why:
        raise LayaError(Kind.INVALID, "--pack-rows on: " + why)
    return requested != "off" and not why
