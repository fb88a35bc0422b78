#!/usr/bin/env bash
# Issue 34's last figure on CPU: on a generated criteo-like set with 2 multi-hot fields of mean
# length 20 (--multi-hot 2:20), does WDL (mean pooling, the CLI's defaults otherwise: row-wise
# Adagrad, Adam head) get within 0.01 of the set's planted best AUC, and does bound 0 on two
# gloo ranks equal one process?
#
#   bash bench/multi_hot_auc.sh        # repo root, ~5 minutes on a 2-core box
#
# Runs (each the CLI, `python -m hetgmp train --device cpu --model wdl --pooling mean`):
#   one       1 rank, batch BATCH, shuffled: the AUC figure
#   two-b0    2 ranks (torchrun, gloo) x BATCH/2 (--batch-size is per rank: the same global
#             batch size), a METIS plan (`hetgmp partition -n 2`), --bound 0
#   two-b100  the same at --bound 100 --store_rate 0.01
#   eq-one    1 rank, batch BATCH, --no-shuffle, EQ_EPOCHS
#   eq-two    2 ranks x BATCH/2, --no-shuffle, --bound 0 --store_rate 0.01 (mirrors in use),
#             the METIS plan with its samples
#             interleaved in blocks of BATCH/2 (bench/multi_hot_auc.py interleave): each step's
#             two batches are exactly eq-one's batch, so the runs must agree up to float
#             summation order (DESIGN.md); two-b0's shuffled shards give other global batches
#             (equal in distribution only)
# Also ceiling.json: best_auc recomputed from the planted model (checked against meta.json) and
# the AUC of the planted logit without its pair interactions (bench/multi_hot_auc.py ceiling).
# Output in ${OUT:-bench/results}/multi_hot_auc: <run>.json (--output), <run>.log, <run>.jsonl
# (--log-json), ceiling.json, partition.log, env.txt, summary.md (machine, command, date, table).
# The data set and plans go to WORK (not committed).
# Knobs: SAMPLES (500000), SCALE (0.00005: 1,822 rows, each seen often), MULTI_HOT (2:20),
# EPOCHS (2), EQ_EPOCHS (1), BATCH (2048, global), EMBED_DIM (16), LR (the CLI's default),
# SEED (0), LOG_EVERY (10), RUN_S (timeout per run, 300), WORK (/tmp/hetgmp-multi-hot-auc),
# PYTHON (python3), EXTRA (more train flags for every run).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
SAMPLES=${SAMPLES:-500000}; SCALE=${SCALE:-0.00005}; MULTI_HOT=${MULTI_HOT:-2:20}
EPOCHS=${EPOCHS:-2}; EQ_EPOCHS=${EQ_EPOCHS:-1}; BATCH=${BATCH:-2048}; EMBED_DIM=${EMBED_DIM:-16}
LR=${LR:-}; SEED=${SEED:-0}; LOG_EVERY=${LOG_EVERY:-10}; RUN_S=${RUN_S:-300}
WORK=${WORK:-/tmp/hetgmp-multi-hot-auc}; RES="${OUT:-bench/results}/multi_hot_auc"
[ $((BATCH % 2)) = 0 ] || { echo "BATCH must be even (2 ranks x BATCH/2)"; exit 2; }
HALF=$((BATCH / 2))
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
mkdir -p "$RES" "$WORK"
rm -f "$RES"/*.json "$RES"/*.jsonl "$RES"/*.log "$RES/env.txt" "$RES/summary.md"
T0=$(date +%s)
log() { echo "[multi_hot_auc +$(($(date +%s) - T0))s] $*"; }

COMMON=(--device cpu --model wdl --pooling mean --embed-dim "$EMBED_DIM" --seed "$SEED"
        --log-every "$LOG_EVERY" --no-progress ${LR:+--lr "$LR"} ${EXTRA:-})
run() {  # run NAME RANKS [flags...]: one CLI run (RANKS 2: torchrun, gloo), files in RES
  local name=$1 ranks=$2; shift 2
  local launch=("$PY" -m hetgmp)
  [ "$ranks" = 1 ] || launch=("$PY" -m torch.distributed.run --standalone --nproc_per_node "$ranks" -m hetgmp)
  timeout "$RUN_S" "${launch[@]}" train --dataset "$DS" "${COMMON[@]}" --output "$RES/$name.json" \
    --log-json "$RES/$name.jsonl" "$@" > "$RES/$name.log" 2>&1
  log "$name: exit $? ($*)"
}

DS=$WORK/ds-n$SAMPLES-s$SCALE-m$MULTI_HOT-seed$SEED
[ -f "$DS/meta.json" ] || $PY -m hetgmp generate criteo-like --out "$DS" --num-samples "$SAMPLES" \
  --scale "$SCALE" --multi-hot "$MULTI_HOT" --seed "$SEED" --overwrite --no-progress \
  > "$RES/generate.log" 2>&1 || { log "FAILED: generating $DS (see $RES/generate.log)"; exit 1; }
echo "nproc $(nproc), $($PY -c 'import torch; print("torch", torch.__version__)'), data $(basename "$DS")" > "$RES/env.txt"
log "data $DS ready"
$PY bench/multi_hot_auc.py ceiling "$DS" --out "$RES/ceiling.json" || log "FAILED: ceiling"
PLAN=$WORK/plan2-$(basename "$DS").npz
[ -f "$PLAN" ] || $PY -m hetgmp partition -n 2 --data "$DS" -o "$PLAN" --seed "$SEED" --no-progress \
  > "$RES/partition.log" 2>&1 || { log "FAILED: partition (see $RES/partition.log)"; exit 1; }
$PY bench/multi_hot_auc.py interleave "$PLAN" --half "$HALF" --out "$WORK/interleaved.npz" \
  || { log "FAILED: interleaved plan"; exit 1; }
log "plans ready"

run one 1 --batch-size "$BATCH" --epochs "$EPOCHS"
run two-b0 2 --batch-size "$HALF" --epochs "$EPOCHS" --partition "$PLAN" --bound 0
run two-b100 2 --batch-size "$HALF" --epochs "$EPOCHS" --partition "$PLAN" --bound 100 --store_rate 0.01
run eq-one 1 --batch-size "$BATCH" --epochs "$EQ_EPOCHS" --no-shuffle
run eq-two 2 --batch-size "$HALF" --epochs "$EQ_EPOCHS" --no-shuffle --partition "$WORK/interleaved.npz" \
  --bound 0 --store_rate 0.01

$PY bench/multi_hot_auc.py report "$RES" --command "SAMPLES=$SAMPLES SCALE=$SCALE \
MULTI_HOT=$MULTI_HOT EPOCHS=$EPOCHS EQ_EPOCHS=$EQ_EPOCHS BATCH=$BATCH EMBED_DIM=$EMBED_DIM \
LR=$LR SEED=$SEED${EXTRA:+ EXTRA='$EXTRA'} bash bench/multi_hot_auc.sh"
log "done in $(($(date +%s) - T0)) s: $RES/summary.md"
