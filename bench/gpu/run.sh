#!/usr/bin/env bash
# The whole GPU comparison of issue 7 in one command, from a fresh clone, in the repo root:
#
#   bash bench/gpu/run.sh [extra 'cli.py run' flags, e.g. --steps 10 --batches 8192]
#
# 1. installs carried wheels from .whl/ (pymetis) into /tmp/site, 2. builds hetgmp's native
# extension, 3. generates the Criteo-shaped workload and (2+ GPUs) partitions it, 4. runs every
# measurement with torchrun on 1 GPU and (when there are 2+) on 2 GPUs, 5. writes results.json,
# results.md and logs under ${OUT:-bench/results}/gpu and prints a short table last.
#
# Knobs (environment): OUT, SAMPLES (2000000), CARD_SCALE (1.0), LOCALITY (0.8),
# METHOD (metis+refine), ROUNDS (2), BUDGET_S (540: the runs are cut so the report still lands
# within it), WORK (/tmp/hetgmp-gpu-bench), PYTHON (python3); for a CPU smoke test of this script:
# DEVICE=cpu SKIP_BUILD=1 (2 gloo ranks stand in for 2 GPUs).
set -uo pipefail
cd "$(dirname "$0")/../.."
T0=$(date +%s)
PY=${PYTHON:-python3}
RES="${OUT:-bench/results}/gpu"
LOGS="$RES/logs"
WORK=${WORK:-/tmp/hetgmp-gpu-bench}
BUDGET_S=${BUDGET_S:-540}
mkdir -p "$LOGS" "$WORK"
rm -f "$RES"/results_w*.json "$RES"/raw_w*.jsonl
log() { echo "[run.sh +$(($(date +%s) - T0))s] $*"; }
die() { echo "[run.sh] FAILED: $*" >&2; exit 1; }
left() { echo $((BUDGET_S - ($(date +%s) - T0))); }

# Mandatory on the multi-GPU machine (NVLink multicast / NVLS off).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

# 1. carried wheels (pymetis for cp312)
if compgen -G ".whl/*.whl" > /dev/null; then
  log "installing carried wheels: $(ls .whl/*.whl | xargs -n1 basename | tr '\n' ' ')"
  if $PY -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl > "$LOGS/wheels.log" 2>&1; then
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  else
    log "WARNING: the carried wheels do not install here (see $LOGS/wheels.log); going on without them"
  fi
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

# 2. the native extension
DEVICE=${DEVICE:-cuda}
if [ "${SKIP_BUILD:-0}" = 1 ]; then
  log "SKIP_BUILD=1: using the native extension already built"
else
  log "building hetgmp's native extension"
  if ! $PY -m pip install -q --no-build-isolation --no-deps -e . > "$LOGS/build.log" 2>&1; then
    log "pip install -e . failed (see $LOGS/build.log); trying setup.py build_ext --inplace"
    $PY setup.py build_ext --inplace >> "$LOGS/build.log" 2>&1 || die "native build (see $LOGS/build.log)"
  fi
fi
$PY -c "from hetgmp.native import native; native()" || die "hetgmp._native does not import"

# 3. what the machine has
if [ "$DEVICE" = cpu ]; then
  NGPU=2
else
  NGPU=$($PY -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)") \
    || die "torch does not import"
fi
[ "$NGPU" -ge 1 ] || die "no CUDA GPU visible: this benchmark needs 1 or 2 GPUs (see bench/gpu/cli.py for a CPU smoke run)"
$PY -c "import pymetis" 2> /dev/null && HAVE_METIS=1 || HAVE_METIS=0
METHOD=${METHOD:-metis+refine}
if [ "$HAVE_METIS" = 0 ] && [[ "$METHOD" == metis* ]]; then
  log "pymetis is not importable (no .whl/ carried?): partitioning with 'refine' instead of $METHOD"
  METHOD=refine
fi
WORLD=$((NGPU >= 2 ? 2 : 1))
[ "$DEVICE" = cpu ] && NAME="CPU smoke test" || NAME=$($PY -c 'import torch; print(torch.cuda.get_device_name(0))')
log "$NGPU GPU(s): $NAME; runs on 1$([ $WORLD = 2 ] && echo ' and 2') GPU(s)"

# 4. the workload (+ plan, not counted in samples/s)
WL="$WORK/workload_w$WORLD"
log "preparing the workload in $WL"
$PY bench/gpu/cli.py prepare --dir "$WL" --world "$WORLD" --samples "${SAMPLES:-2000000}" \
  --card-scale "${CARD_SCALE:-1.0}" --locality "${LOCALITY:-0.8}" --method "$METHOD" \
  --rounds "${ROUNDS:-2}" --threads "$(nproc)" 2>&1 | tee "$LOGS/prepare.log"
[ "${PIPESTATUS[0]}" = 0 ] || die "prepare (see $LOGS/prepare.log)"

# 5. the measurements: one torchrun per GPU count, each cut off before the budget runs out
STATUS=0
run_world() {
  local n=$1; shift
  local budget
  budget=$(( $(left) - 25 ))
  [ $n = 1 ] && [ $WORLD = 2 ] && budget=$(( budget * 2 / 5 ))  # leave most to the 2-GPU run
  if [ "$budget" -lt 30 ]; then log "no time left for the $n-GPU run"; STATUS=1; return; fi
  local cmd=($PY -m torch.distributed.run --standalone --nproc_per_node "$n" bench/gpu/cli.py run
             --device "$DEVICE" --workload "$WL" --out "$RES" "$@")
  log "running on $n GPU(s) (limit ${budget}s): ${cmd[*]}"
  OMP_NUM_THREADS=${OMP_NUM_THREADS:-4} timeout --signal=TERM --kill-after=10 "$budget" "${cmd[@]}" --command "bash bench/gpu/run.sh $* # ${cmd[*]}" \
    2>&1 | tee "$LOGS/run_w$n.log"
  local rc=${PIPESTATUS[0]}
  if [ "$rc" != 0 ]; then
    log "the $n-GPU run exited with $rc (124 = cut at the time limit); partial results are kept"
    STATUS=1
  fi
}
run_world 1 "$@"
[ "$WORLD" = 2 ] && run_world 2 "$@"

# 6. the report
log "writing the report"
$PY bench/gpu/cli.py report --out "$RES" --workload "$WL" 2>&1 | tee "$LOGS/report.log"
log "done in $(($(date +%s) - T0)) s; results in $RES"
exit $STATUS
