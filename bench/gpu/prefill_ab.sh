#!/usr/bin/env bash
# The next batch's rows written in the exchange's tail (issue 30: padded.prefill.PREFILL, exact,
# off until measured) in one call on a 2-GPU machine (<= 9 min): its GPU check against the
# lookup at the step's start (tests/gpu_prefill_check.py: "PREFILL CHECK OK"), then the user's
# command at batch 8192 per GPU (the card's flags) in REPEAT rounds of VARIANTS (read_ahead_ab.sh's
# names: prefill, and with the dense copy riding the exchange's barriers, prefillshared).
#
#   source bench/gpu/prelude.sh; bash bench/gpu/prefill_ab.sh   # results in ${OUT:-bench/results}/gpu/
#
# Knobs: VARIANTS ("early prefill shared prefillshared"), REPEAT (2), BATCHES (8192), SAMPLES
# (3300000), ITERS (100), WORK (/tmp/hetgmp-prefill), PYTHON (python3).
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}; WORK=${WORK:-/tmp/hetgmp-prefill}; RES="${OUT:-bench/results}/gpu/prefill"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$RES" "$WORK"
rm -rf "$WORK/check"  # (the check writes its data set there and refuses an existing directory)
timeout 240 $PY -m torch.distributed.run --standalone --nproc_per_node 2 \
  tests/gpu_prefill_check.py "$WORK/check" > "$RES/check.log" 2>&1
echo "prefill check: exit $?, $(grep -c '^PREFILL CHECK OK' "$RES/check.log") OK line(s)"
grep '^rank' "$RES/check.log"
OUT=${OUT:-bench/results} REPEAT=${REPEAT:-2} BATCHES=${BATCHES:-8192} GPUS=2 BOUND0=0 SAMPLES=${SAMPLES:-3300000} \
  ITERS=${ITERS:-100} WORK=$WORK PYTHON=$PY \
  VARIANTS="${VARIANTS:-early prefill shared prefillshared}" bash bench/gpu/read_ahead_ab.sh
