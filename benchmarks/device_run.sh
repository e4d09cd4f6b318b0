#!/usr/bin/env bash
# One scripted GPU run (the GPU machine starts bare, no network): carried wheels (.whl),
# then the phases named in PHASES (default: check,model,bench). Results go to $OUT.
#   check  kernels and tiny checkpoints on CUDA against CPU fp32 (benchmarks/cuda_check.py); stops on failure
#   profile  kernel time per name in one forward (benchmarks/gpu_profile.py; STUDIES=kernels,hops,gemms;
#          DTYPE=float32, the served default, or float16; LAYOUTS=packed,padded, default packed; with
#          A_DIR, the kernel study again on the tree there, its lines prefixed "A: ");
#          start-up with an empty and a filled kernel cache is benchmarks/cold_start.sh
#   startup  an inference process's start-up phase by phase, three ways to capture the warm set, empty and
#          filled Triton cache (benchmarks/startup_phases.py; DTYPE=float32, the served default)
#   model  model time per encoder mode, warm-set capture, parity (benchmarks/model_speed.py, large preset;
#          MODEL_DTYPE=float16, or float32 with MODES=packed,fused)
#   engine  our engine alone at its defaults (`laya-grpc bench --stages engine`, short soak): one request's
#          model and end-to-end time per input, predict_batch of 64 and 256 states; with A_DIR, the tree there
#          first (its own bench), into $OUT/engine-a-results.jsonl and -report.md, this tree into engine-b-*
#   bench  the side-by-side suite: upstream eager, our engine, gRPC, HTTP (`laya-grpc bench`);
#          STAGES=...,replicas adds serve --inference-replicas N on the one GPU for N in REPLICAS (default 1,2),
#          at 8 and 64 HTTP clients: decisions/s and p95 side by side
#   stacked  the exact mode's model per STACKED_MAX_TOKENS limit of the Wo GEMMs on stacked halves, LIMITS
#          (default 0,512,2048,16384), captured in one process and replayed in turn (benchmarks/stacked_halves.py)
#   precision  accuracy and time per float32 part of the fused forward (benchmarks/precision_study.py), on the
#          large checkpoint and the conditionings in STUDY_CKPTS (default: sharp,heavy); ONLY= limits the variants
#   wait   64 HTTP clients on one stack per --max-wait-ms value in WAITS (default 0,1,2,4), each alone in
#          turn: decisions/s, p95, rows per forward, device busy share (benchmarks/batch_wait.py; large checkpoint)
#   parity  the served path against upstream CPU fp32, per served dtype (laya_grpc/bench/parity.py), on the
#          stage's checkpoints: large in the conditionings of CONDITIONINGS (default: default,flat,sharp,heavy)
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD:$PWD/protos/gen PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
PHASES=${PHASES:-check,model,bench}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee $OUT/gpu.txt
python3 -c "import torch,triton,grpc,google.protobuf as p,laya,starlette,uvicorn;print(torch.__version__,triton.__version__,grpc.__version__,p.__version__,laya.__version__)"
case ",$PHASES," in *,check,*)
  python3 -m benchmarks.cuda_check --work-dir /tmp/ck 2>&1 | tee $OUT/cuda_check.txt
  [ "${PIPESTATUS[0]}" = 0 ] || { echo "cuda_check failed: stopping"; exit 1; } ;;
esac
case ",$PHASES," in *,precision,*|*,parity,*)   # the stage's checkpoints, made side by side
  python3 -c "
import sys; from concurrent.futures import ProcessPoolExecutor as P; from laya_grpc.bench.parity import stage_checkpoints
with P(4) as ex: print(list(ex.map(stage_checkpoints, ['/tmp/lb'] * 4, ['large'] * 4, [[c] for c in sys.argv[1].split(',')])))
" ${CONDITIONINGS:-default,flat,sharp,heavy} ;;
esac
case ",$PHASES," in *,stacked,*)
  [ -d /tmp/lb/large ] || python3 -m laya_grpc.cli make-checkpoint /tmp/lb/large --preset large --force >/dev/null
  timeout ${STACKED_TIMEOUT:-300} python3 -m benchmarks.stacked_halves --ckpt /tmp/lb/large --limits ${LIMITS:-0,512,2048,16384} \
    --rounds ${ROUNDS:-7} 2>&1 | tee $OUT/stacked_halves.txt | grep -v '^{' ;;
esac
case ",$PHASES," in *,precision,*)
  CK="--ckpt large=/tmp/lb/large"; for c in $(echo ${STUDY_CKPTS:-sharp,heavy} | tr , ' '); do CK="$CK --ckpt $c=/tmp/lb/large-$c"; done
  timeout ${PRECISION_TIMEOUT:-300} python3 -m benchmarks.precision_study $CK --out $OUT \
    --iters ${ITERS:-100} ${ONLY:+--only "$ONLY"} 2>&1 | grep -v '^{' | tee $OUT/precision_study.txt ;;
esac
case ",$PHASES," in *,parity,*)
  timeout ${PARITY_TIMEOUT:-300} python3 -m laya_grpc.bench.parity --work-dir /tmp/lb --preset large \
    --conditionings ${CONDITIONINGS:-default,flat,sharp,heavy} --dtypes ${DTYPES:-auto,float16} \
    --latency-n ${LATENCY_N:-50} --out $OUT/parity.jsonl 2>&1 | grep -v '"kind": "parity_served' | tail -c 6000 ;;
esac
case ",$PHASES," in *,startup,*)
  timeout ${STARTUP_TIMEOUT:-300} python3 -m benchmarks.startup_phases --ckpt /tmp/lb/large --out $OUT \
    --dtype ${DTYPE:-float32} 2>&1 | grep -v '^{' ;;
esac
case ",$PHASES," in *,wait,*)
  [ -d /tmp/lb/large ] || python3 -m laya_grpc.cli make-checkpoint /tmp/lb/large --preset large --force >/dev/null
  timeout ${WAIT_TIMEOUT:-300} python3 -m benchmarks.batch_wait --ckpt /tmp/lb/large --waits ${WAITS:-0,1,2,4} \
    --load-s ${LOAD_S:-5} --rounds ${ROUNDS:-2} 2>&1 | tee $OUT/batch_wait.txt ;;
esac
case ",$PHASES," in *,profile,*)
  timeout ${PROFILE_TIMEOUT:-420} python3 -m benchmarks.gpu_profile --ckpt /tmp/lb/large --out $OUT \
    --studies ${STUDIES:-kernels} --dtype ${DTYPE:-float32} --layouts ${LAYOUTS:-packed} --hops-n ${HOPS_N:-300} 2>&1 | grep -v '^{'
  if [ -n "${A_DIR:-}" ]; then   # the same study of the tree in A_DIR (its laya_grpc, this gpu_profile.py)
    mkdir -p $OUT/a; cp benchmarks/gpu_profile.py $A_DIR/benchmarks/
    (cd $A_DIR && PYTHONPATH=/tmp/site:$PWD:$PWD/protos/gen timeout ${PROFILE_TIMEOUT:-420} python3 -m benchmarks.gpu_profile \
      --ckpt /tmp/lb/large --out $OUT/a --studies kernels --dtype ${DTYPE:-float32} --layouts ${LAYOUTS:-packed} 2>&1 \
      | grep -v '^{' | sed 's/^/A: /')
  fi ;;
esac
case ",$PHASES," in *,model,*)
  timeout ${MODEL_TIMEOUT:-300} python3 -m benchmarks.model_speed --ckpt /tmp/lb/large --out $OUT \
    --iters ${ITERS:-200} --parity-rows ${PARITY_ROWS:-48} --modes ${MODES:-packed,fused,reference} --dtype ${MODEL_DTYPE:-float16} ${WARM_SET:+--warm-set} 2>&1 \
    | grep -v '^{' ;;
esac
case ",$PHASES," in *,engine,*)
  EA="--work-dir /tmp/lb --stages engine --soak ${SOAK:-300} --idle-gaps 0.2 --concurrency 1"
  if [ -n "${A_DIR:-}" ]; then
    (cd $A_DIR && PYTHONPATH=/tmp/site:$PWD:$PWD/protos/gen timeout ${ENGINE_TIMEOUT:-240} python3 -m laya_grpc.cli bench \
      --out $OUT/engine-a $EA >$OUT/engine-a.log 2>&1) || echo "engine stage of $A_DIR failed: $OUT/engine-a.log"
  fi
  timeout ${ENGINE_TIMEOUT:-240} python3 -m laya_grpc.cli bench --out $OUT/engine-b $EA >$OUT/engine-b.log 2>&1 \
    || echo "engine stage failed: $OUT/engine-b.log"
  for s in a b; do [ -f $OUT/engine-$s/results.jsonl ] && python3 -c "
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r['kind'] == 'latency':
        print(sys.argv[2], r['input'], '%d rows x %d tokens' % (r['rows'], r['tokens']), 'end to end p50 %.3f ms' % r['e2e']['p50_ms'],
              'model p50 %.3f ms' % r['model']['p50_ms'])
    elif r['kind'] == 'batch':
        print(sys.argv[2], 'predict_batch', r['states'], 'states: %.0f decisions/s' % r['decisions_per_s'])
    elif r['kind'] == 'startup':
        print(sys.argv[2], r['device'], r['dtype'])
" $OUT/engine-$s/results.jsonl $s; done
  # at most 8 files come back from $OUT: keep each side's results and report, not its plots
  for s in a b; do [ -d $OUT/engine-$s ] || continue
    for f in results.jsonl report.md; do [ -f $OUT/engine-$s/$f ] && mv $OUT/engine-$s/$f $OUT/engine-$s-$f; done
    rm -rf $OUT/engine-$s; done ;;
esac
case ",$PHASES," in *,bench,*)
  timeout ${BENCH_TIMEOUT:-480} python3 -m laya_grpc.cli bench --out $OUT --work-dir /tmp/lb --stages ${STAGES:-engine,upstream,service} --replicas ${REPLICAS:-1,2} 2>&1 | grep -v '"kind": "latency"' | tail -60
  python3 -m laya_grpc.bench.report $OUT ;;
esac
