#!/usr/bin/env bash
# The case one GPU cannot do (issue 30): a table whose rows and optimizer state exceed one GPU's
# memory, trained on 2 GPUs with the card's command; on one GPU the same run must stop before
# training with what it needs, what there is, and what to do.
#
#   bash bench/gpu/big_table.sh      # in the repo root of a 2-GPU machine, <= 8 minutes
#
# The card scale is picked from the first GPU's memory: rows (WDL dim 128 float32 values,
# version, row-wise Adagrad state: ~536 bytes with the id maps) at least FACTOR (1.2) x the
# card's memory; 33.8M rows per unit of scale. Output in ${OUT:-bench/results}/gpu/big_table:
# w1.log (the refusal), w2.json / w2.log (the 2-GPU run), summary.md.
# Knobs: FACTOR (1.2), SAMPLES (3.3M), BATCH (8192), ITERS (150), WORK (/tmp/hetgmp-big),
# PYTHON (python3).
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}; FACTOR=${FACTOR:-1.2}; SAMPLES=${SAMPLES:-3300000}
BATCH=${BATCH:-8192}; ITERS=${ITERS:-150}; WORK=${WORK:-/tmp/hetgmp-big}
RES="${OUT:-bench/results}/gpu/big_table"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
mkdir -p "$RES" "$WORK"
T0=$(date +%s)
read -r GIB SCALE < <($PY - "$FACTOR" <<'PY'
import sys, torch
total = torch.cuda.get_device_properties(0).total_memory
rows = float(sys.argv[1]) * total / 536
print(f"{total / 2**30:.1f} {rows / 33.8e6:.2f}")
PY
)
echo "GPU memory ${GIB} GiB -> card scale ${SCALE} ($(date -u +%F))" | tee "$RES/summary.md"
DS=$WORK/ds-s$SCALE; PLAN=$WORK/part2-s$SCALE.npz
[ -f "$DS/meta.json" ] || $PY -m hetgmp generate criteo-like --out "$DS" --num-samples "$SAMPLES" \
  --scale "$SCALE" --workers 16 --overwrite --no-progress > "$RES/generate.log" 2>&1 || exit 1
[ -f "$PLAN" ] || $PY -m hetgmp partition -n 2 --data "$DS" -o "$PLAN" --method metis+refine \
  --rounds 2 --batch-size "$BATCH" --no-progress > "$RES/partition.log" 2>&1 || exit 1
echo "data and plan in $(($(date +%s) - T0)) s" | tee -a "$RES/summary.md"
CLI=(examples/hetuctr.py --dataset "$DS" --device cuda --model wdl --batch_size "$BATCH"
     --embed_dim 128 --iter "$ITERS" --log_every 50 --no-progress)
timeout 120 $PY "${CLI[@]}" --output "$RES/w1.json" > "$RES/w1.log" 2>&1
echo "1 GPU: exit $? in $(($(date +%s) - T0)) s: $(grep -m1 -o 'need.*GiB free' "$RES/w1.log")" \
  | tee -a "$RES/summary.md"
timeout 300 $PY -m torch.distributed.run --standalone --nproc_per_node 2 "${CLI[@]}" \
  --partition "$PLAN" --store_rate 0.01 --bound 100 --output "$RES/w2.json" > "$RES/w2.log" 2>&1
echo "2 GPUs: exit $? in $(($(date +%s) - T0)) s" | tee -a "$RES/summary.md"
$PY - "$RES/w2.json" <<'PY' | tee -a "$RES/summary.md"
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except (OSError, ValueError) as e:
    print(f"no result: {e}")
    raise SystemExit(0)
e = d.get("embedding_train", {})
print(f"2 GPUs: {d.get('speed', 0) / 1e6:.2f}M samples/s, val AUC {d.get('val_auc', 0):.4f}, "
      f"{e.get('bytes_per_sample', 0):.0f} B/sample, rows {d.get('num_rows', '?')}")
PY
