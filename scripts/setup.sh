#!/usr/bin/env bash
# Creates .venv at the repo root and installs laya-grpc into it (console script .venv/bin/laya-grpc).
#   scripts/setup.sh          serving: the base package plus the torch backend (extra "torch")
#   scripts/setup.sh --dev    plus the test references (upstream laya 0.4.15, transformers, grpcio-tools,
#                             pytest, import-linter, mlx[cpu]) and the hub extra
# A host that only runs the gateway or the tokenizer needs no torch: `pip install laya-grpc`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
step() { printf 'setup: %s\n' "$*"; }
t0=$SECONDS
if [ ! -x .venv/bin/python ]; then step "creating .venv with $($PY --version 2>&1)"; "$PY" -m venv .venv; fi
step "upgrading pip"
.venv/bin/python -m pip install -q --upgrade pip
# torch first, pinned: on this platform 2.13.0 is a local CPU build; an open range would pull a multi-GB CUDA build.
# Set LAYA_TORCH_SPEC to install another build (e.g. "torch" on a CUDA host).
step "installing ${LAYA_TORCH_SPEC:-torch==2.13.0} (the inference backend)"
.venv/bin/python -m pip install -q "${LAYA_TORCH_SPEC:-torch==2.13.0}"
extras="torch"
if [ "${1:-}" = "--dev" ]; then
  extras="torch,dev,hub"
  # MLX: Apple Silicon gets the Metal build, Linux the CPU build (used by the parity tests).
  step "installing mlx (Metal build on macOS, CPU build on Linux)"
  if [ "$(uname -s)" = "Darwin" ]; then .venv/bin/python -m pip install -q "mlx>=0.22"; else .venv/bin/python -m pip install -q "mlx[cpu]>=0.22"; fi
fi
step "installing laya-grpc[$extras] (editable)"
.venv/bin/python -m pip install -q -e ".[${extras}]"
if [ "${1:-}" = "--dev" ] && [ -f tests/node/package.json ]; then
  step "installing the Node test client's packages (tests/node)"
  (cd tests/node && npm ci --silent --no-audit --no-fund) || { echo "setup: npm ci failed" >&2; exit 1; }
fi
step "done in $((SECONDS - t0)) s: $(.venv/bin/laya-grpc --version)"
