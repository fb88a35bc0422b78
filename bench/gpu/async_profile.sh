#!/usr/bin/env bash
# A diagnosis (not a benchmark figure): where an async step's time goes on GPUs.
#
#   device:  bash bench/gpu/async_profile.sh [RANKS=2] [SAMPLES=2000000]
#            (carry .whl with the pyzmq and py-spy wheels; outputs under ${OUT:-bench/results/gpu})
#
# 1. bench_async.py --device cuda, lockstep and async without straggler, on a set large enough
#    for steady speeds (and a long run's clean end); 2. py-spy of both ranks of the same async
#    run (every thread, idle included, native frames): async_spy.txt in py-spy's "raw" format
#    (collapsed stacks, one line per stack with its sample count), read with
#    bench/spy_summary.py.
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
OUT=${OUT:-bench/results/gpu}
RANKS=${1:-2}
SAMPLES=${2:-2000000}
mkdir -p "$OUT"
log() { echo "[async_profile +${SECONDS}s] $*"; }
source bench/gpu/async_env.sh || exit 2
if ! $PY -c "from hetgmp.native import native; native()" 2> /dev/null; then
  $PY setup.py build_ext --inplace > "$OUT/async_build.log" 2>&1 || { log "FAILED: build"; exit 2; }
fi
W=/tmp/hetgmp-async-profile
GPUS=$($PY -c "import torch; print(torch.cuda.device_count())")
BACKEND=auto
[ "$GPUS" -lt "$RANKS" ] && BACKEND=gloo
log "$GPUS GPU(s), $RANKS ranks, backend $BACKEND"
timeout 300 $PY bench/bench_async.py --device cuda --ranks "$RANKS" --samples "$SAMPLES" \
  --factors 1 --modes collective async --wait sleep --backend "$BACKEND" \
  --shared /nonexistent --work "$W" --out async_profile > "$OUT/async_profile.log" 2>&1
log "bench_async: exit $?"
cp bench/results/async_profile.md "$OUT/" 2> /dev/null
cp "$W"/failed-*.log "$OUT/" 2> /dev/null
SPY=$(command -v py-spy || echo /tmp/site/bin/py-spy)
timeout 240 "$SPY" record --subprocesses --threads --idle --native --rate 250 --format raw \
  -o "$OUT/async_spy.txt" -- $PY -m torch.distributed.run --standalone \
  --nproc_per_node "$RANKS" examples/hetuctr.py --dataset "$W/criteo-like-$SAMPLES" \
  --epochs 1 --batch_size 1024 --device cuda --backend "$BACKEND" --seed 0 --no-progress \
  --log_every 100000 --timeout 120 --sync async --bound 100 --max-lag 100 \
  --async-host 127.0.0.1 --output "$OUT/async_spy.json" > "$OUT/async_spy.log" 2>&1
log "py-spy: exit $?"
grep -h "| generated" "$OUT"/async_profile.md
if [ -n "${WITH_TESTS:-}" ]; then  # (the CUDA tests of the async transport, as async_smoke.sh)
  timeout 240 $PY -m pytest -q -x tests/test_async_stage.py tests/test_async_gpu.py \
    -p no:cacheprovider > "$OUT/async_pytest.log" 2>&1
  log "CUDA tests: exit $? ($(tail -1 "$OUT/async_pytest.log"))"
fi
