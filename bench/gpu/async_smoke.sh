#!/usr/bin/env bash
# --sync async on CUDA (issue 17) in one command on a GPU machine (1 GPU is enough), repo root:
#
#   bash bench/gpu/async_smoke.sh            # logs under ${OUT:-bench/results/gpu}/async_*
#
# 1. installs carried wheels from .whl/ (pyzmq, which the GPU image lacks: see README.md) into
#    /tmp/site, 2. builds the native extension if it does not import, 3. runs the CUDA tests of
#    the async transport (tests/test_async_stage.py, tests/test_async_gpu.py: 2-3 ranks on GPU 0
#    over a gloo group, bound 0 == collective, audit invariant, trainer async == collective),
#    4. trains WDL with the CLI on 2 ranks sharing GPU 0 (--device cuda --backend gloo), once
#    --sync collective and once --sync async, on a small generated set (throughput is not the
#    point here: 2 ranks on one GPU). Exit status: that of the tests.
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
OUT=${OUT:-bench/results/gpu}
mkdir -p "$OUT"
log() { echo "[async_smoke +${SECONDS}s] $*"; }
source bench/gpu/async_env.sh || exit 2
if ! $PY -c "from hetgmp.native import native; native()" 2> /dev/null; then
  log "building the native extension"
  $PY setup.py build_ext --inplace > "$OUT/async_build.log" 2>&1 || { log "FAILED: build"; exit 2; }
fi
$PY -c "import torch; print('torch', torch.__version__, 'gpus', torch.cuda.device_count())"

log "CUDA tests of the async transport"
timeout 480 $PY -m pytest tests/test_async_stage.py tests/test_async_gpu.py -v -rs \
  -p no:cacheprovider --junitxml "$OUT/async_pytest.xml" > "$OUT/async_pytest.log" 2>&1
RC=$?
grep -E "PASSED|FAILED|SKIPPED|ERROR|passed|failed" "$OUT/async_pytest.log" | tail -20
log "tests: exit $RC (log: $OUT/async_pytest.log)"

DS=${WORK:-/tmp/hetgmp-async-smoke}/criteo-like-200k
if [ ! -f "$DS/meta.json" ]; then
  $PY -m hetgmp generate criteo-like --out "$DS" --num-samples 200000 --scale 0.01 \
    --overwrite --no-progress > "$OUT/async_cli.log" 2>&1 || log "generate FAILED"
fi
for SYNC in collective async; do
  log "CLI: 2 ranks on GPU 0, --sync $SYNC"
  timeout 240 $PY -m torch.distributed.run --standalone --nproc_per_node 2 examples/hetuctr.py \
    --dataset "$DS" --model wdl --device cuda --backend gloo --sync "$SYNC" --iter 60 \
    --batch_size 2048 --log_every 20 --no-progress --async-host 127.0.0.1 --timeout 120 \
    --output "$OUT/async_cli_$SYNC.json" >> "$OUT/async_cli.log" 2>&1
  log "CLI --sync $SYNC: exit $? ($(grep -E '^EVAL' "$OUT/async_cli.log" | tail -1 | cut -c1-120))"
done
exit $RC
