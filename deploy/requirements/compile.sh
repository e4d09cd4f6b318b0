#!/usr/bin/env bash
# Regenerates the image lock files (one per Dockerfile target) for Linux x86_64 and Python 3.12,
# with hashes; deploy/Dockerfile installs them with pip --require-hashes. Needs uv
# (pip install uv). Run from anywhere; commit the three .txt files it writes.
#
# cpu.txt locks everything but torch itself: the CPU-only torch wheel lives on torch's own index,
# and the Dockerfile installs it there at the exact version (TORCH_VERSION, +cpu) without a hash.
#
#   deploy/requirements/compile.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
TORCH=torch==2.13.0
compile() {
  local out=$1; shift
  uv pip compile pyproject.toml deploy/requirements/build.in "$@" \
    --python-version 3.12 --python-platform x86_64-manylinux_2_28 --generate-hashes \
    --custom-compile-command deploy/requirements/compile.sh -o "deploy/requirements/$out"
}
echo "$TORCH" > /tmp/laya-torch.txt
# gateway and tokenizer: no torch
compile slim.txt --extra hub --extra otel
# inference on NVIDIA GPUs: PyPI's torch wheel and the CUDA libraries it depends on (the only CUDA in the image)
compile cuda.txt --extra torch --extra hub --extra otel --constraint /tmp/laya-torch.txt
# inference on CPU: torch's dependencies without torch and the CUDA packages of its PyPI build
gpu=$(grep -oE '^(torch|triton|nvidia-[a-z0-9-]+|cuda-[a-z0-9-]+)==' deploy/requirements/cuda.txt | tr -d '=')
compile cpu.txt --extra torch --extra hub --extra otel --constraint /tmp/laya-torch.txt \
  $(printf -- '--no-emit-package %s ' $gpu)
rm -f /tmp/laya-torch.txt
