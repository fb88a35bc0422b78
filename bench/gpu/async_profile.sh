#!/usr/bin/env bash
# A diagnosis (not a benchmark figure): where an async step's time goes on GPUs.
#
#   device:  bash bench/gpu/async_profile.sh [RANKS=2] [SAMPLES=2000000]
#            (carry .whl with the pyzmq and py-spy wheels; outputs under ${OUT:-bench/results/gpu})
#
# 1. bench_async.py --device cuda, lockstep and async without straggler, on a set large enough
#    for steady speeds (and a long run's clean end); 2. py-spy of both ranks of the same async
#    run (every thread, idle included): spy_SYNC.txt in py-spy's "raw" format
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
[ -z "${SKIP_BENCH:-}" ] && timeout 300 $PY bench/bench_async.py --device cuda --ranks "$RANKS" --samples "$SAMPLES" \
  --factors 1 --modes collective async --wait sleep --backend "$BACKEND" \
  --shared /nonexistent --work "$W" --out async_profile > "$OUT/async_profile.log" 2>&1
log "bench_async: exit $?"
cp bench/results/async_profile.md "$OUT/" 2> /dev/null
cp "$W"/failed-*.log "$OUT/" 2> /dev/null
if [ ! -f "$W/criteo-like-$SAMPLES/meta.json" ]; then  # (SKIP_BENCH: the set alone)
  $PY -c "from hetgmp.data.generate import generate_criteo_like as g; g('$W/criteo-like-$SAMPLES', num_samples=$SAMPLES, seed=0, progress=False, overwrite=True)"
fi
SPY=$(command -v py-spy || echo /tmp/site/bin/py-spy)
for SYNC in ${SYNCS:-async}; do
  EXTRA=""
  [ "$SYNC" = async ] && EXTRA="--bound 100 --max-lag 100 --async-host 127.0.0.1"
  # (no --native: py-spy 0.4.3 crashed unwinding the CUDA ranks' native stacks)
  timeout 240 "$SPY" record --subprocesses --threads --idle --rate 250 --format raw \
    -o "$OUT/spy_$SYNC.txt" -- $PY -m torch.distributed.run --standalone \
    --nproc_per_node "$RANKS" examples/hetuctr.py --dataset "$W/criteo-like-$SAMPLES" \
    --epochs 1 --batch_size 1024 --device cuda --backend "$BACKEND" --seed 0 --no-progress \
    --log_every 100000 --timeout 120 --sync "$SYNC" $EXTRA > "$OUT/spy_$SYNC.log" 2>&1
  log "py-spy $SYNC: exit $?"
  $PY bench/spy_summary.py "$OUT/spy_$SYNC.txt" --under "${UNDER:-Trainer.fit}" > "$OUT/spy_$SYNC.summary" 2>&1
done
grep -h "| generated" "$OUT"/async_profile.md
if [ -n "${WITH_TESTS:-}" ]; then  # (the CUDA tests of the async transport, as async_smoke.sh)
  timeout 240 $PY -m pytest -q -x tests/test_async_stage.py tests/test_async_gpu.py \
    -p no:cacheprovider > "$OUT/async_pytest.log" 2>&1
  log "CUDA tests: exit $? ($(tail -1 "$OUT/async_pytest.log"))"
fi
