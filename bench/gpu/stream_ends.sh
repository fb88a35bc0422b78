#!/usr/bin/env bash
# Which stream ends the step (issue 30, a diagnosis, ~5 minutes on a 2-GPU machine): the
# user's command (WDL dim 128; 2 GPUs with the card's flags) on 1 GPU, on 2, and on 2 with
# VARIANT_SWITCHES (default: the dense gradients copied by the copy engines), each under bench/gpu/stream_ends.py: external CUDA
# events at each join of the captured step's streams and before/after each of dilations.py's
# points (the rows' gradient sum, pack, finish, the dense sum, Adam, ...), read from the step's
# start on each rank (no CUPTI). Why: a delay after the 2-GPU step's main stream cost 28 of
# 38 us (bench/results/gpu/rank_delays_s19/): what ends after it, and what the step starts with.
#
#   source bench/gpu/prelude.sh; bash bench/gpu/stream_ends.sh   # results in ${OUT:-bench/results}/gpu/stream_ends
#
# Knobs: BATCH (8192), SAMPLES (1500000), SKIP (40), STEPS (60), VARIANT_SWITCHES (module.NAME=1
# items for a third run, 2 GPUs through bench/gpu/switches.py; default "cadam",
# hetgmp.comm.peer_allreduce.ADAM_PEER=1 hetgmp.comm.peer_allreduce.ADAM_COPY=1; empty: none), RUNS ("1 2 2v": which of the three),
# RES (the results' folder), WORK (/tmp/hetgmp-se), PYTHON.
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}; BATCH=${BATCH:-8192}; SAMPLES=${SAMPLES:-1500000}
SKIP=${SKIP:-40}; STEPS=${STEPS:-60}; WORK=${WORK:-/tmp/hetgmp-se}
RES=${RES:-"${OUT:-bench/results}/gpu/stream_ends"}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$RES" "$WORK"
source bench/gpu/card_data.sh; card_data "$WORK" "$SAMPLES" 1 "$BATCH" "$RES" || exit 1
card_cli
VARIANT_SWITCHES=${VARIANT_SWITCHES-hetgmp.comm.peer_allreduce.ADAM_PEER=1 hetgmp.comm.peer_allreduce.ADAM_COPY=1}
for run in ${RUNS:-1 2 2v}; do  # (2v: 2 GPUs with VARIANT_SWITCHES, when set)
  n=${run%v}; card=(); sw=()
  [ "$n" = 2 ] && card=(--partition "$PLAN" --store_rate 0.01 --bound 100)
  if [ "$run" = 2v ]; then
    [ -n "$VARIANT_SWITCHES" ] || continue
    sw=(bench/gpu/switches.py $VARIANT_SWITCHES --)
  fi
  timeout 200 $PY -m torch.distributed.run --standalone --nproc_per_node $n "${sw[@]}" \
    bench/gpu/stream_ends.py --out "$RES/ends_w${run}_RANK.txt" --skip "$SKIP" --every 10 \
    -- "${CLI[@]}" "${card[@]}" > "$RES/w$run.log" 2>&1
  echo "w$run: exit $?"
done
{ echo "machine: $(nvidia-smi -L 2>/dev/null | tr '\n' ' '); date: $(date -u '+%Y-%m-%d %H:%M')"
  echo "command: bash bench/gpu/stream_ends.sh (BATCH=$BATCH SAMPLES=$SAMPLES${VARIANT_SWITCHES:+ VARIANT_SWITCHES=$VARIANT_SWITCHES})"
  for f in "$RES"/ends_w*_*.txt; do echo; echo "## $(basename "$f")"; cat "$f"; done
} > "$RES/summary.md"
cat "$RES/summary.md"
