#!/usr/bin/env bash
# Rows in host memory with a device cache (issue 33), one GPU: the same model (WDL, dim 128),
# data and steps with the table all on the GPU against the host tier (--rows-on host) at cache
# budgets of 25 %, 10 % and 5 % of the table: samples/s, cache hit rate, host<->device bytes
# per step, AUC after the same steps; then one run whose table (rows + row-wise Adagrad state)
# is >= FACTOR (1.2) x the GPU's memory (scale from torch.cuda.mem_get_info; the host must
# hold it: 128 GiB on the 1-GPU machines), against the all-on-GPU run's smaller table of the
# same generator (same distribution).
#
#   bash bench/gpu/host_tier.sh              # repo root of a 1-GPU machine, <= ~9 minutes
#   DEVICE=cpu bash bench/gpu/host_tier.sh   # CPU smoke: tiny sizes, the same steps
#
# Runs: device (default flags: CUDA graphs), device-nographs (what the graphs are worth: the
# tier runs without them), tier-0.25/0.10/0.05 (--rows-on host --cache-budget F
# --no-cuda-graphs), with TIERS containing "device" also dtier-F (the tier decided on the
# device, hetgmp.embedding.tier_setup.DEVICE_TIER through bench/gpu/switches.py: default flags,
# its step one CUDA graph),
# big. Output in ${OUT:-bench/results}/gpu/host_tier: <run>.json (the CLI's
# --output), <run>.log, env.txt, summary.md (machine, command, date, the table;
# bench/gpu/host_tier_report.py). A run that fails is listed with its last log line.
# Knobs: BATCH (8192), ITERS (150), EMBED_DIM (128), SAMPLES (2.5M), SCALE (1: 33.8M rows, of
# which the 2.5M samples touch 2.8 %, so no budget >= 5 % ever misses; 0.1: 3.4M rows, 17 %
# touched, so the 10 % and 5 % budgets miss: the tier's fetches measured),
# BUDGETS ("0.25 0.10 0.05"; "": none), NOGRAPHS (1; 0: no device-nographs run), BIG_REF (0; 1:
# also the big set all on the devices of 2 GPUs at bound 0, the AUC reference), TIERS ("host"; "host device": both tiers; with "device" the big
# run takes the device-decided tier), FACTOR (1.2), BIG (1; 0: no big run), BIG_BUDGET (0.10),
# RUN_S (timeout per run, 240), WORK (/tmp/hetgmp-host-tier), PYTHON (python3); on CPU also
# GPU_MEM_BYTES (the memory the big run must exceed, 16 MiB).
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}; DEVICE=${DEVICE:-cuda}
if [ "$DEVICE" = cpu ]; then  # (smoke: every step, tiny)
  : "${BATCH:=64}" "${ITERS:=12}" "${EMBED_DIM:=8}" "${SAMPLES:=3000}" "${SCALE:=0.002}"
  : "${GPU_MEM_BYTES:=16777216}" "${RUN_S:=120}"
fi
BATCH=${BATCH:-8192}; ITERS=${ITERS:-150}; EMBED_DIM=${EMBED_DIM:-128}
SAMPLES=${SAMPLES:-2500000}; SCALE=${SCALE:-1}; BUDGETS=(${BUDGETS-0.25 0.10 0.05})
FACTOR=${FACTOR:-1.2}; BIG=${BIG:-1}; BIG_BUDGET=${BIG_BUDGET:-0.10}; RUN_S=${RUN_S:-240}
WORK=${WORK:-/tmp/hetgmp-host-tier}; RES="${OUT:-bench/results}/gpu/host_tier"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
mkdir -p "$RES" "$WORK"
rm -f "$RES"/*.json "$RES"/*.log "$RES/env.txt" "$RES/summary.md"
T0=$(date +%s)
log() { echo "[host_tier +$(($(date +%s) - T0))s] $*"; }

gen() {  # gen DIR SCALE: the criteo-like generator (same seed, same samples) at a scale
  [ -f "$1/meta.json" ] || $PY -m hetgmp generate criteo-like --out "$1" --num-samples "$SAMPLES" \
    --scale "$2" --workers 16 --overwrite --no-progress > "$RES/generate-$(basename "$1").log" 2>&1
}
run() {  # run NAME DATASET [flags...]: one CLI run, its JSON and log in RES (SWITCHES: module
  # switches for bench/gpu/switches.py, e.g. the device-decided tier)
  local name=$1 ds=$2; shift 2
  local pre=(); [ -n "${SWITCHES:-}" ] && pre=(bench/gpu/switches.py $SWITCHES --)
  timeout "$RUN_S" $PY "${pre[@]}" examples/hetuctr.py --dataset "$ds" --device "$DEVICE" --model wdl \
    --batch_size "$BATCH" --embed_dim "$EMBED_DIM" --iter "$ITERS" --log_every 50 --no-progress \
    --output "$RES/$name.json" "$@" > "$RES/$name.log" 2>&1
  log "$name: exit $? ($*)"
}

run2() {  # run2 NAME DATASET [flags...]: the same on 2 ranks under torchrun (2 GPUs; on CPU 2
  # gloo ranks), hash placement of rows (no --partition), the later flags winning
  local name=$1 ds=$2; shift 2
  timeout "$RUN_S" $PY -m torch.distributed.run --standalone --nproc_per_node 2 \
    examples/hetuctr.py --dataset "$ds" --device "$DEVICE" --model wdl --batch_size "$BATCH" \
    --embed_dim "$EMBED_DIM" --iter "$ITERS" --log_every 50 --no-progress \
    --output "$RES/$name.json" "$@" > "$RES/$name.log" 2>&1
  log "$name: exit $? ($*)"
}

DS=$WORK/ds-s$SCALE-n$SAMPLES
gen "$DS" "$SCALE" || { log "FAILED: generating $DS (see $RES)"; exit 1; }
$PY - "$DEVICE" >> "$RES/env.txt" <<'PY'
import sys, torch
if sys.argv[1] == "cuda" and torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print(f"GPU: {p.name}, {p.total_memory / 2**30:.1f} GiB")
else:
    print("GPU: none (DEVICE=cpu smoke run: tiny sizes, numbers mean nothing)")
PY
log "data $DS ready"
run device "$DS"
[ "$DEVICE" = cuda ] && [ "${NOGRAPHS:-1}" = 1 ] && run device-nographs "$DS" --no-cuda-graphs
for f in "${BUDGETS[@]}"; do
  [[ " ${TIERS:-host} " == *" host "* ]] && run "tier-$f" "$DS" --rows-on host --cache-budget "$f" \
    --no-cuda-graphs
  [[ " ${TIERS:-host} " == *" device "* ]] && SWITCHES=hetgmp.embedding.tier_setup.DEVICE_TIER=1 \
    run "dtier-$f" "$DS" --rows-on host --cache-budget "$f"
done

if [ "$BIG" = 1 ]; then
  # rows = FACTOR x GPU memory / (row + state bytes); the host also holds ids maps, versions
  # (~40 B a row) and must keep room: capped at 85 % of its available memory, said so
  read -r BIG_SCALE NOTE < <($PY - "$DEVICE" "$FACTOR" "$EMBED_DIM" "${GPU_MEM_BYTES:-0}" <<'PY'
import sys, torch
device, factor, dim, fake = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
gpu = torch.cuda.mem_get_info(0)[1] if device == "cuda" else fake
row = 4 * (dim + 1)
rows = 1.03 * factor * gpu / row  # (3 %: the generator rounds field cardinalities)
avail = next(int(l.split()[1]) * 1024 for l in open("/proc/meminfo") if l.startswith("MemAvailable"))
cap = 0.85 * avail / (row + 40)
note = f"rows+state {rows * row / 2**30:.1f} GiB = {factor}x the GPU's {gpu / 2**30:.1f} GiB"
if rows > cap:
    note = f"CAPPED by host memory: {cap * row / 2**30:.1f} GiB = {cap * row / gpu:.2f}x the GPU's {gpu / 2**30:.1f} GiB"
    rows = cap
print(f"{rows / 33.8e6:.4f} {note.replace(' ', '_')}")
PY
  )
  echo "big run: scale $BIG_SCALE, ${NOTE//_/ }, cache budget $BIG_BUDGET" >> "$RES/env.txt"
  log "big run: scale $BIG_SCALE (${NOTE//_/ })"
  BIG_DS=$WORK/ds-s$BIG_SCALE-n$SAMPLES
  if gen "$BIG_DS" "$BIG_SCALE"; then
    if [[ " ${TIERS:-host} " == *" device "* ]]; then  # (the device-decided tier, graphs on)
      SWITCHES=hetgmp.embedding.tier_setup.DEVICE_TIER=1 run big "$BIG_DS" --rows-on host \
        --cache-budget "$BIG_BUDGET"
    else
      run big "$BIG_DS" --rows-on host --cache-budget "$BIG_BUDGET" --no-cuda-graphs
    fi
    # (BIG_REF=1: the same big set all on the devices of 2 GPUs, bound 0, the same global
    # batch and steps: the AUC the tier must match on one data set)
    [ "${BIG_REF:-0}" = 1 ] && run2 big-2dev "$BIG_DS" --batch_size $((BATCH / 2)) --bound 0
  else
    log "FAILED: generating $BIG_DS"; echo "generation failed" > "$RES/big.log"
  fi
  [ "$DEVICE" = cpu ] || rm -rf "$BIG_DS"  # (tens of GB: not kept)
fi
$PY bench/gpu/host_tier_report.py "$RES" --command "DEVICE=$DEVICE BATCH=$BATCH ITERS=$ITERS \
EMBED_DIM=$EMBED_DIM SAMPLES=$SAMPLES SCALE=$SCALE BUDGETS='${BUDGETS[*]}' FACTOR=$FACTOR \
BIG_BUDGET=$BIG_BUDGET bash bench/gpu/host_tier.sh"
log "done in $(($(date +%s) - T0)) s: $RES/summary.md"
