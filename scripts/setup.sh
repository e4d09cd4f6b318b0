#!/usr/bin/env bash
# Creates .venv at the repo root and installs laya-grpc into it (console script .venv/bin/laya-grpc).
#   scripts/setup.sh          runtime only (serving)
#   scripts/setup.sh --dev    plus test references (upstream laya 0.4.15, transformers, grpcio-tools, pytest, mlx[cpu])
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# torch first, pinned: on this platform 2.13.0 is a local CPU build; an open range would pull a multi-GB CUDA build.
# Set LAYA_TORCH_SPEC to install another build (e.g. "torch" on a CUDA host).
.venv/bin/python -m pip install -q "${LAYA_TORCH_SPEC:-torch==2.13.0}"
extras=""
if [ "${1:-}" = "--dev" ]; then
  extras="[dev,hub]"
  # MLX: Apple Silicon gets the Metal build, Linux the CPU build (used by the parity tests).
  if [ "$(uname -s)" = "Darwin" ]; then .venv/bin/python -m pip install -q "mlx>=0.22"; else .venv/bin/python -m pip install -q "mlx[cpu]>=0.22"; fi
fi
.venv/bin/python -m pip install -q -e ".${extras}"
echo "ok: $(.venv/bin/laya-grpc --version)"
