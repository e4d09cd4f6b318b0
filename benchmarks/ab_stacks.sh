#!/usr/bin/env bash
# Paired A/B of two builds of the served stack on one machine start (the GPU machine starts bare):
# B is this tree, A a tree at $A_DIR (e.g. `git archive REV | tar -x -C .ab/base`, carried). Both
# serve the same random-weight checkpoint at once; benchmarks.paired_stacks alternates one request
# to each (HTTP short and 512 tokens, gRPC short), then runs 64 HTTP clients on each alone, twice.
#   A_ARGS / B_ARGS   extra `serve` flags per side (e.g. B_ARGS="--dtype float16" to compare the
#                     same dtype when the two builds' defaults differ)
#   A_ENV / B_ENV     extra environment per side (e.g. A_ENV="LAYA_MAX_CONCURRENT=256")
#   PAIRS, LOAD_S     request pairs per case (default 1000) and seconds per load round (default 5)
set -u
OUT=${OUT:-/tmp/out}
A_DIR=$(cd "${A_DIR:?set A_DIR to the tree of build A}" && pwd); B_DIR=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
PYA=/tmp/site:$A_DIR:$A_DIR/protos/gen; PYB=/tmp/site:$B_DIR:$B_DIR/protos/gen
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
PYTHONPATH=$PYB python3 -m laya_grpc.cli make-checkpoint /tmp/lb/large --preset large --force >/dev/null || exit 1
(cd /tmp && exec env PYTHONPATH=$PYA ${A_ENV:-} python3 -m laya_grpc.cli serve --checkpoint english=/tmp/lb/large \
   --http 127.0.0.1:18300 --grpc 127.0.0.1:18310 --run-dir /tmp/run-a ${A_ARGS:-} >"$OUT/a.log" 2>&1) &
PIDA=$!
(cd /tmp && exec env PYTHONPATH=$PYB ${B_ENV:-} python3 -m laya_grpc.cli serve --checkpoint english=/tmp/lb/large \
   --http 127.0.0.1:18301 --grpc 127.0.0.1:18311 --run-dir /tmp/run-b ${B_ARGS:-} >"$OUT/b.log" 2>&1) &
PIDB=$!
# both stacks stop when the script ends (SIGTERM drains them; after 30 s, SIGKILL), so the device call
# ends with the measurements rather than at its time limit
stop() {
  kill -TERM $PIDA $PIDB 2>/dev/null
  for i in $(seq 30); do kill -0 $PIDA 2>/dev/null || kill -0 $PIDB 2>/dev/null || break; sleep 1; done
  kill -KILL $PIDA $PIDB 2>/dev/null; wait 2>/dev/null
}
trap stop EXIT
mkdir -p /tmp/run-a /tmp/run-b
for i in $(seq 240); do
  grep -q "laya-grpc: ready" "$OUT/a.log" && grep -q "laya-grpc: ready" "$OUT/b.log" && break
  sleep 1
done
grep -q "laya-grpc: ready" "$OUT/a.log" && grep -q "laya-grpc: ready" "$OUT/b.log" \
  || { echo "a stack did not get ready"; tail -20 "$OUT/a.log" "$OUT/b.log"; exit 1; }
pair() { PYTHONPATH=$PYB python3 -m benchmarks.paired_stacks "$@" 2>&1 | grep -v '^{'; }
{
  echo "## HTTP short"; pair 127.0.0.1:18300 127.0.0.1:18301 -n "${PAIRS:-1000}" --case short
  echo "## HTTP 512 tokens"; pair 127.0.0.1:18300 127.0.0.1:18301 -n "${PAIRS:-1000}" --case t512
  echo "## gRPC short"; pair 127.0.0.1:18310 127.0.0.1:18311 -n "${PAIRS:-1000}" --case short --grpc
  echo "## HTTP short, then 64 clients on each stack alone, two rounds"
  PYTHONPATH=$PYB python3 -m benchmarks.paired_stacks 127.0.0.1:18300 127.0.0.1:18301 -n 200 --load "${LOAD_S:-5}" --clients 64 2>&1
} | tee "$OUT/pairs.txt"
grep -h "dtype\|ready" "$OUT/a.log" "$OUT/b.log" | head -8
