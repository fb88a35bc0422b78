#!/usr/bin/env bash
# Is the 2-GPU step at batch 8192 bound by the host, by the GPU, or by the other rank? A
# diagnosis for issue 30 (<= 5 minutes on a 2-GPU machine): the user's command (WDL dim 128)
# on 1 GPU and on 2 GPUs with the card's flags, each under bench/gpu/host_profile.py (no CUDA
# profiler: CUPTI slows graph launches several times over, and in a kernel trace a rank whose
# launch came late makes the other wait at the first barrier), recording per step the host's
# time, the GPU's time and whether the GPU had caught up with the host; then the 2-GPU run with
# the time each rank spends inside each meeting with the other (bench/gpu/barrier_waits.py).
#
# Why: in session 17 cutting both paths after backward (the exchange's chain ~10 us, the dense
# path ~20 us: read_ahead_ab.sh variant stagecadam) moved the 2-GPU step by nothing, though a
# kernel timeline under CUPTI placed them on its critical path (docs/scaling_plan.md). If the
# host now takes as long per step as the GPU, no GPU-side cut can show.
#
#   source bench/gpu/prelude.sh; bash bench/gpu/step_bound.sh   # results in ${OUT:-bench/results}/gpu/step_bound
#
# Knobs: BATCH (8192), SAMPLES (1500000), SKIP (40), STEPS (60), WORK (/tmp/hetgmp-sb), PYTHON.
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}; BATCH=${BATCH:-8192}; SAMPLES=${SAMPLES:-1500000}
SKIP=${SKIP:-40}; STEPS=${STEPS:-60}; WORK=${WORK:-/tmp/hetgmp-sb}
RES="${OUT:-bench/results}/gpu/step_bound"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$RES" "$WORK"
source bench/gpu/card_data.sh; card_data "$WORK" "$SAMPLES" 1 "$BATCH" "$RES" || exit 1
card_cli
for n in 1 2; do
  card=(); [ "$n" = 2 ] && card=(--partition "$PLAN" --store_rate 0.01 --bound 100)
  timeout 200 $PY -m torch.distributed.run --standalone --nproc_per_node $n \
    bench/gpu/host_profile.py --out "$RES/host_w${n}_RANK.txt" --skip "$SKIP" --steps "$STEPS" \
    -- "${CLI[@]}" "${card[@]}" > "$RES/w$n.log" 2>&1
  echo "w$n: exit $?"
done
# (the 2-GPU run again, each meeting with the other rank timed: bench/gpu/barrier_waits.py)
timeout 200 $PY -m torch.distributed.run --standalone --nproc_per_node 2 \
  bench/gpu/barrier_waits.py --out "$RES/waits_w2_RANK.txt" --skip "$SKIP" --every 10 \
  -- "${CLI[@]}" --partition "$PLAN" --store_rate 0.01 --bound 100 > "$RES/waits.log" 2>&1
echo "waits: exit $?"
{ echo "machine: $(nvidia-smi -L 2>/dev/null | tr '\n' ' '); date: $(date -u '+%Y-%m-%d %H:%M')"
  echo "command: bash bench/gpu/step_bound.sh (BATCH=$BATCH SAMPLES=$SAMPLES)"
  for f in "$RES"/host_w*_*.txt; do echo; echo "## $(basename "$f")"; head -4 "$f"; done
  for f in "$RES"/waits_w2_*.txt; do echo; echo "## $(basename "$f")"; cat "$f"; done
} > "$RES/summary.md"
cat "$RES/summary.md"
