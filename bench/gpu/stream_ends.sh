#!/usr/bin/env bash
# Which stream ends the step, 1 GPU and 2 GPUs (issue 30, a diagnosis, <= 4 minutes on a 2-GPU
# machine): the user's command (WDL dim 128; 2 GPUs with the card's flags) under
# bench/gpu/stream_ends.py, external CUDA events at each join of the captured step's streams and
# before/after each of dilations.py's points (the rows' gradient sum, pack, finish, the dense
# sum, Adam, ...), read from the step's start on each rank (no CUPTI). Why: a delay after the 2-GPU step's main stream cost
# 28 of 38 us (bench/results/gpu/rank_delays_s19/): what ends after it?
#
#   source bench/gpu/prelude.sh; bash bench/gpu/stream_ends.sh   # results in ${OUT:-bench/results}/gpu/stream_ends
#
# Knobs: BATCH (8192), SAMPLES (1500000), SKIP (40), STEPS (60), VARIANT_SWITCHES (module.NAME=1
# items for the 2-GPU run, through bench/gpu/switches.py), WORK (/tmp/hetgmp-se), PYTHON.
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}; BATCH=${BATCH:-8192}; SAMPLES=${SAMPLES:-1500000}
SKIP=${SKIP:-40}; STEPS=${STEPS:-60}; WORK=${WORK:-/tmp/hetgmp-se}
RES="${OUT:-bench/results}/gpu/stream_ends"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$RES" "$WORK"
source bench/gpu/card_data.sh; card_data "$WORK" "$SAMPLES" 1 "$BATCH" "$RES" || exit 1
ITER=$((SKIP + STEPS + 20))
CLI=(--dataset "$DS" --device cuda --model wdl --batch_size "$BATCH" --embed_dim 128
     --iter "$ITER" --log_every 50 --no-progress)
for n in 1 2; do
  card=(); [ "$n" = 2 ] && card=(--partition "$PLAN" --store_rate 0.01 --bound 100)
  sw=(); [ "$n" = 2 ] && [ -n "${VARIANT_SWITCHES:-}" ] && sw=(bench/gpu/switches.py $VARIANT_SWITCHES --)
  timeout 200 $PY -m torch.distributed.run --standalone --nproc_per_node $n "${sw[@]}" \
    bench/gpu/stream_ends.py --out "$RES/ends_w${n}_RANK.txt" --skip "$SKIP" --every 10 \
    -- "${CLI[@]}" "${card[@]}" > "$RES/w$n.log" 2>&1
  echo "w$n: exit $?"
done
{ echo "machine: $(nvidia-smi -L 2>/dev/null | tr '\n' ' '); date: $(date -u '+%Y-%m-%d %H:%M')"
  echo "command: bash bench/gpu/stream_ends.sh (BATCH=$BATCH SAMPLES=$SAMPLES${VARIANT_SWITCHES:+ VARIANT_SWITCHES=$VARIANT_SWITCHES})"
  for f in "$RES"/ends_w*_*.txt; do echo; echo "## $(basename "$f")"; cat "$f"; done
} > "$RES/summary.md"
cat "$RES/summary.md"
