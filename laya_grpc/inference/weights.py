"""model.safetensors -> tensors, checked strictly against the shapes the network expects.

Upstream loads with `load_state_dict(strict=True)`: a missing, unexpected or mis-shaped tensor is
fatal. We keep that contract but say which tensors are wrong, in one error, before anything is
materialised, so a truncated or foreign file fails at load and never at the first request.
"""
from __future__ import annotations

import os
from typing import Mapping

import torch
from safetensors import safe_open

from laya_grpc.core.errors import CheckpointError

_SHOWN = 8  # names listed per problem; the count says how many more there are


def _names(names: list[str]) -> str:
    head = ", ".join(names[:_SHOWN])
    return head + (" ... (+%d more)" % (len(names) - _SHOWN) if len(names) > _SHOWN else "")


def load_weights(path: str, expected: Mapping[str, tuple[int, ...]], dtype: Mapping[str, torch.dtype],
                 device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """Read every tensor of `path`, check names/shapes against `expected`, cast per `dtype[name]`.

    The file stores fp16 (upstream's `save_checkpoint` halves everything); upstream builds fp32
    parameters and upcasts on load, so the cast here is the same value conversion. On CUDA the
    tensors are read straight onto the device and cast there (no host-side copy per tensor).
    """
    if not os.path.isfile(path):
        raise CheckpointError(path, "weights file is missing")
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    try:
        handle = safe_open(path, framework="pt", device=str(dev) if dev.type == "cuda" else "cpu")
    except Exception as e:  # safetensors raises its own error types for a corrupt header
        raise CheckpointError(path, "cannot read safetensors file: %s" % e) from e
    with handle as f:
        stored = list(f.keys())
        missing = sorted(set(expected) - set(stored))
        unexpected = sorted(set(stored) - set(expected))
        wrong = []
        for name in sorted(set(expected) & set(stored)):
            shape = tuple(f.get_slice(name).get_shape())
            if shape != tuple(expected[name]):
                wrong.append("%s %s (expected %s)" % (name, list(shape), list(expected[name])))
        problems = []
        if missing:
            problems.append("missing tensors: " + _names(missing))
        if unexpected:
            problems.append("unexpected tensors: " + _names(unexpected))
        if wrong:
            problems.append("wrong shapes: " + _names(wrong))
        if problems:
            raise CheckpointError(path, "weights do not match the network described by the config; "
                                  + "; ".join(problems))
        return {name: f.get_tensor(name).to(device=dev, dtype=dtype[name]) for name in expected}
