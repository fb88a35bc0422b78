#!/usr/bin/env bash
# --sync async on GPUs, this checkout against an older commit, side by side in one device call
# (bench/bench_async.py --device cuda: the user's command under torchrun, generated set only).
#
#   here:    mkdir -p bench/work/base && git archive BASE hetgmp examples setup.py src \
#              pyproject.toml CMakeLists.txt | tar -x -C bench/work/base
#            pip download pyzmq --only-binary=:all: --python-version 3.12 --no-deps -d .whl
#   device:  bash bench/gpu/async_ab.sh bench/work/base [RANKS=2] [SAMPLES=400000]
#            (carry .whl and bench/work; results under ${OUT:-bench/results/gpu}/async_ab_*;
#            ROUNDS=1 for one round)
#
# With fewer GPUs than RANKS the ranks share them over gloo (--backend gloo), else one GPU per
# rank (NCCL for lockstep). Two rounds, base then this checkout, so drift shows as such; each
# bench run is cut at 130 s (4 trainings of about 17 s each on 2 H100s), so the call fits 10 min.
set -uo pipefail
cd "$(dirname "$0")/../.."
HERE=$PWD
BASE=${1:?usage: async_ab.sh BASE_TREE [RANKS] [SAMPLES]}
RANKS=${2:-2}
SAMPLES=${3:-400000}
PY=${PYTHON:-python3}
OUT=${OUT:-bench/results/gpu}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)  # (absolute: the builds run in other directories)
log() { echo "[async_ab +${SECONDS}s] $*"; }
source bench/gpu/async_env.sh || exit 2
export PYTHONPATH=${PYTHONPATH#"$PWD:"}  # (bench_async puts each tree first for its runs)
for T in . "$BASE"; do
  if ! (cd "$T" && PYTHONPATH=$PWD:$PYTHONPATH $PY -c "from hetgmp.native import native; native()") 2> /dev/null; then
    log "building the native extension in $T"
    (cd "$T" && $PY setup.py build_ext --inplace > "$OUT/async_ab_build.log" 2>&1) ||
      { log "FAILED: build in $T"; exit 2; }
  fi
done
GPUS=$($PY -c "import torch; print(torch.cuda.device_count())")
BACKEND=auto
[ "$GPUS" -lt "$RANKS" ] && BACKEND=gloo
log "$GPUS GPU(s), $RANKS ranks, backend $BACKEND, base $BASE"
for ROUND in $(seq 1 "${ROUNDS:-2}"); do
  for T in "$BASE" .; do
    NAME=async_ab_$([ "$T" = . ] && echo new || echo base)_$ROUND
    timeout "${RUN_TIMEOUT:-130}" $PY bench/bench_async.py --device cuda --ranks "$RANKS" --samples "$SAMPLES" \
      --factors 1 2 --modes collective async --wait sleep --backend "$BACKEND" --tree "$T" \
      --shared /nonexistent --work /tmp/hetgmp-async-ab --out "$NAME" > "/tmp/$NAME.log" 2>&1
    RC=$?
    log "$NAME: exit $RC, $(grep -c '^{' "/tmp/$NAME.log") runs"
    cp "bench/results/$NAME.md" "$OUT/" 2> /dev/null || cp "/tmp/$NAME.log" "$OUT/"
  done
done
grep -h "| generated" "$OUT"/async_ab_*.md
