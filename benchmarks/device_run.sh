#!/usr/bin/env bash
# One scripted GPU session (the device machine starts bare): carried wheels, a CUDA-path check
# on a tiny checkpoint, then the full suite on the large checkpoint. Results go to $OUT.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD:$PWD/protos/gen PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee $OUT/gpu.txt
python3 -c "import torch,grpc,google.protobuf as p,laya,starlette,uvicorn;print(torch.__version__,grpc.__version__,p.__version__,laya.__version__)"
python3 - <<'PY' 2>&1 | tee $OUT/cuda_check.txt
import time, numpy as np
from laya_grpc.make_checkpoint import make_checkpoint
from inference_svc.runners import TorchRunner
from inference_svc.registry import synthetic_rows
ck = make_checkpoint("/tmp/ck/tiny", "tiny")
g = TorchRunner(ck, "cuda", None); c = TorchRunner(ck, "cpu", None)
t = time.perf_counter(); print("graphs", g.warm(), "in %.2fs" % (time.perf_counter() - t))
for r, L, m in [(1, 40, 3), (3, 300, 5), (5, 512, 9), (70, 100, 2)]:
    b = synthetic_rows(r, L, m, g.vocab_size, seed=r).pad(0)
    (a, x), (a2, x2) = g.forward(b), c.forward(b)
    print(r, L, m, "max|dlogit|", float(np.abs(a - a2).max()), "nan", bool(np.isnan(a).any()))
PY
timeout ${BENCH_TIMEOUT:-480} python3 -m laya_grpc.cli bench --out $OUT --work-dir /tmp/lb --stages ${STAGES:-engine,upstream,service} 2>&1 | grep -v '"kind": "latency"' | tail -60
python3 -m benchmarks.report $OUT
