#!/usr/bin/env bash
# Session 18's two switches for the 2-GPU step's tail (issue 30: owner_update.SPLIT_SUM, the
# rows' gradient sum in two passes; train/product_hold.PRODUCT_AFTER_STAGE, the first layer's
# deferred product after the exchange's first kernel; both exact, off until measured) in one
# call on a 2-GPU machine (<= 9 min): the whole-step CUDA graph against the eager step with both
# on (tests/gpu_whole_step_check.py: "WHOLE STEP CHECK OK"), then the user's command at batch
# 8192 per GPU (the card's flags) in REPEAT rounds of VARIANTS (read_ahead_ab.sh's names).
#
#   source bench/gpu/prelude.sh; bash bench/gpu/tail_order_ab.sh   # results in ${OUT:-bench/results}/gpu/
#
# Any switch of the tail the same way, e.g. session 20's (the pre-sync kernel staging only the
# own rows a push joins):
#   CHECK_SWITCHES=hetgmp.embedding.padded.owner_update.STAGE_PUSHED_ONLY=1 \
#     VARIANTS="early stagepushed pushedcadam cadam abl_exchange-dense_ar-presync" bash bench/gpu/tail_order_ab.sh
#
# Knobs: CHECK_SWITCHES (the check's switches, module.NAME=1 items; both above), VARIANTS ("early splitsum splitcadam splitaftercadam"), REPEAT (2), BATCHES (8192),
# SAMPLES (3300000), ITERS (100), WORK (/tmp/hetgmp-tail), PYTHON (python3).
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}; WORK=${WORK:-/tmp/hetgmp-tail}; RES="${OUT:-bench/results}/gpu/tail_order"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$RES" "$WORK"
rm -rf "$WORK/check"  # (the check writes its data set there and refuses an existing directory)
timeout 240 $PY -m torch.distributed.run --standalone --nproc_per_node 2 bench/gpu/switches.py \
  ${CHECK_SWITCHES:-hetgmp.embedding.padded.owner_update.SPLIT_SUM=1 hetgmp.train.product_hold.PRODUCT_AFTER_STAGE=1} \
  -- tests/gpu_whole_step_check.py "$WORK/check" > "$RES/check.log" 2>&1
echo "whole-step check (both switches on): exit $?, $(grep -c '^WHOLE STEP CHECK OK' "$RES/check.log") OK line(s)"
OUT=${OUT:-bench/results} REPEAT=${REPEAT:-2} BATCHES=${BATCHES:-8192} GPUS=2 BOUND0=0 SAMPLES=${SAMPLES:-3300000} \
  ITERS=${ITERS:-100} WORK=$WORK PYTHON=$PY \
  VARIANTS="${VARIANTS:-early splitsum splitcadam splitaftercadam}" bash bench/gpu/read_ahead_ab.sh
