#!/usr/bin/env bash
# The user's command over whole epochs (issue 30; ~5 min on a 2-GPU machine): run-level
# samples/s, which carries every epoch start (the exchange's epoch-start scan, the eager steps
# around the epoch's last, partial batch), next to the steady pace the A/B scripts read
# (read_ahead_ab.sh: intervals without an epoch start). Why: on 2 H200s at batch 8192 the
# steady 2-GPU pace was 1.74x one GPU, but four epochs of the 3.3M-sample set ran at 1.09x:
# each 2-GPU epoch start cost ~50 ms where one GPU's cost ~5 (bench/results/gpu/epoch_boundary/).
#
#   source bench/gpu/prelude.sh; bash bench/gpu/epochs.sh   # results in ${OUT:-bench/results}/gpu/epochs
#
# Runs per batch of BATCHES: 1 GPU, 2 GPUs with the card's flags, and 2 GPUs with each of
# VARIANTS' switches (module.NAME=0|1 items joined by commas, through bench/gpu/switches.py;
# e.g. VARIANTS=hetgmp.embedding.padded.epoch_scan.KERNEL=0: the scan by the torch reference).
# The first batch's runs follow a 2-epoch 2-GPU run that warms Triton's cache (not reported).
# Knobs: BATCHES ("8192 65536"), EPOCHS (4), SAMPLES (3300000), VARIANTS
# (none), RES, WORK (/tmp/hetgmp-ep), PYTHON.
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}; SAMPLES=${SAMPLES:-3300000}; WORK=${WORK:-/tmp/hetgmp-ep}
BATCHES=${BATCHES:-8192 65536}
RES=${RES:-"${OUT:-bench/results}/gpu/epochs"}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$RES" "$WORK"
source bench/gpu/card_data.sh; card_data "$WORK" "$SAMPLES" 1 8192 "$RES" || exit 1
VARIANTS=${VARIANTS:-}
run() {  # name gpus batch switches(comma-joined, or -) [flags]
  local name=$1 g=$2 b=$3 sw=${4//,/ }; shift 4
  # (at least one switch: torchrun drops a "--" right after the script's name)
  [ "$sw" = - ] && sw=hetgmp.embedding.padded.epoch_scan.KERNEL=1  # (the default)
  timeout 200 $PY -m torch.distributed.run --standalone --nproc_per_node "$g" \
    bench/gpu/switches.py $sw -- examples/hetuctr.py --dataset "$DS" --device cuda --model wdl \
    --batch_size "$b" --embed_dim 128 --epochs "${EPOCHS:-4}" --log_every 20 --no-progress "$@" \
    --output "$RES/$name.json" > "$RES/$name.log" 2>&1
  echo "$name: exit $?"
}
CARD=(--partition "$PLAN" --store_rate 0.01 --bound 100)
for b in $BATCHES; do
  # (Triton's cache warmed first by a 2-epoch run, not reported: else the first 2-GPU run
  # alone compiles the kernels of the epoch's end, ~1 s on its first epoch start)
  [ "$b" = "${BATCHES%% *}" ] && EPOCHS=2 run "cache_$b" 2 "$b" - "${CARD[@]}"
  run "w1_$b" 1 "$b" -; run "w2_$b" 2 "$b" - "${CARD[@]}"
  i=0; for v in $VARIANTS; do i=$((i + 1)); run "w2v${i}_$b" 2 "$b" "$v" "${CARD[@]}"; done
done
{ echo "machine: $(nvidia-smi -L | head -2 | tr '\n' ' '); date: $(date -u '+%Y-%m-%d %H:%M')"
  echo "command: bash bench/gpu/epochs.sh (EPOCHS=${EPOCHS:-4} SAMPLES=$SAMPLES; variants v1.. = $VARIANTS)"
  echo; $PY bench/gpu/epochs_report.py "$RES"; } > "$RES/summary.md"
cat "$RES/summary.md"
