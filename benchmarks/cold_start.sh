#!/usr/bin/env bash
# Cold start on the GPU (the machine starts bare, no network): `laya-grpc serve` from process start
# to ready with an empty kernel cache and with one filled by `laya-grpc warm-kernels`, for this tree
# and for the previous release at $A_DIR (default .ab/base: `git archive 5bc85e5 laya_grpc protos
# benchmarks | tar -x -C .ab/base`, carried), the warm-kernels time, and the first requests after
# ready (benchmarks/cold_start.py). Results: $OUT/cold_start.md (the table), cold_start.jsonl, gpu.txt.
#   ROUNDS     rounds of the six runs, interleaved A/B (default 2)
#   BUDGET_S   seconds after which no further run starts (default 360; the whole script stays
#              within about 8 minutes with the large checkpoint)
#   PRESET     checkpoint preset (default large)
set -u
OUT=${OUT:-/tmp/out}
A_DIR=$(cd "${A_DIR:-.ab/base}" && pwd) || { echo "no base tree at ${A_DIR:-.ab/base}"; exit 1; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
# An image carries its packages' bytecode; the wheels above were installed without it. Compile it
# all now, so the first start measures kernels, not bytecode.
python3 -m compileall -q -j 0 /tmp/site "$PWD/laya_grpc" "$PWD/protos/gen" "$A_DIR/laya_grpc" "$A_DIR/protos/gen" >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD:$PWD/protos/gen PYTHONUNBUFFERED=1
# The CUDA libraries read from disk once, before either tree's first start (the same files for both).
python3 -c "import torch; torch.ones(8, device='cuda').sum().item()" || { echo "no usable CUDA device"; exit 1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch,triton;print('torch',torch.__version__,'triton',triton.__version__)" | tee -a "$OUT/gpu.txt"
timeout 420 python3 -m benchmarks.cold_start --base "$A_DIR" --out "$OUT" --site /tmp/site \
  --preset "${PRESET:-large}" --ckpt "/tmp/lb/${PRESET:-large}" --rounds "${ROUNDS:-2}" --budget-s "${BUDGET_S:-360}" \
  2>&1 | grep -v '^{'
