#!/usr/bin/env bash
# One scripted H200 session: the model-speed comparison of the CUDA encoders (reference, fused,
# fused-compiled), then the full side-by-side suite with the fastest encoder that passed parity.
# Needs the wheels of benchmarks/device_run.sh in .whl. At most 8 files come back under $OUT.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD:$PWD/protos/gen PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $OUT/gpu.txt
python3 -m laya_grpc.cli make-checkpoint /tmp/lb/large --preset large --force > /dev/null
timeout ${MS_TIMEOUT:-170} python3 -m benchmarks.model_speed --ckpt /tmp/lb/large --out $OUT/ms --iters 200 \
    --parity-rows 48 --modes reference,fused-eager,fused-compiled 2>&1 | tail -25
ENC=$(python3 - "$OUT/ms/model_speed.jsonl" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
ok = {r["mode"] for r in recs if r.get("kind") == "parity" and r.get("passed")}
ok -= {r["mode"] for r in recs if r.get("kind") == "error"}
t = {r["mode"]: r["replay_ms"] for r in recs if r.get("kind") == "time" and r["rows"] == 1 and r["tokens"] == 132}
best = min((m for m in ok if m in t), key=lambda m: t[m], default="reference")
print({"fused-eager": "fused"}.get(best, best))
PY
)
echo "encoder for the suite: $ENC"
timeout ${BENCH_TIMEOUT:-330} python3 -m laya_grpc.cli bench --out $OUT/bench --work-dir /tmp/lb \
    --stages engine,upstream,service --cuda-encoder $ENC --iters 150 --ab-pairs 40 --idle-gaps 1,5 --duration 4 \
    2>&1 | grep -v '"kind": "latency"' | tail -30
python3 -m benchmarks.report $OUT/bench > /dev/null
ls -R $OUT
