#!/usr/bin/env bash
# Training speed on GPUs, one command: the real CLI (examples/hetuctr.py) on 1 and 2 GPUs against
# plain PyTorch (bench/gpu/plain_ctr.py) on the same generated data, same GPUs, same step counts.
#
#   bash bench/gpu/train_gpu.sh            # in the repo root of a 2x H200 machine, <= 10 minutes
#
# For each model (WDL, DCN; dim 128) and batch per GPU (8192, 65536), in this priority order:
#   1. plain PyTorch on 1 GPU, variants fp32 eager / bf16 + CUDA graph / bf16 + adagrad /
#      bf16 + compile + CUDA graph (one process, one record per variant; compile last: slowest),
#   2. the CLI on 1 GPU (whole table on the GPU; default flags, --device cuda),
#   3. the CLI on 2 GPUs, and 4 where the machine has them (a metis+refine plan per GPU count,
#      --store_rate 0.01 --bound 100), under torchrun; at 2 GPUs and the first batch size also
#      with --bound 0 (the AUC anchor), with hash placement (no plan) and under mpirun -np 2 (the
#      card's launcher) -- MULTI_VARIANTS, ';'-separated, "hash" and "mpirun" being keywords;
#   4. the CLI on 1 GPU with each of CLI_VARIANTS (';'-separated flag sets; default --amp, bf16
#      autocast of the dense part; CLI_VARIANTS= runs none).
# Every run of a batch size takes the same number of steps (ITERS), so AUCs compare after the same
# steps; the data set is sized so that the largest run (2 GPUs x batch x steps) stays inside ONE
# epoch with 20 % slack for an unbalanced plan. Default steps: 150 at 8192 (10 warm-up + 140
# timed), 24 at 65536 (10 + 14): 2 x 65536 x 24 = 3.15M samples, the largest run -> 4.2M samples
# generated (~40 s on the 32-core host; 65536 x 60 steps would need 10.5M, ~100 s).
# Output, in ${OUT:-bench/results}/gpu: train_cli.json (a list of records), train_cli.md (made by
# bench/gpu/train_report.py), train_records.jsonl (raw, written as runs finish), train_logs.txt.
# A time guard (BUDGET_S, 570 s) skips what no longer fits so the report always lands; a failing
# run is recorded and the others go on.
#
# Knobs (environment): MODELS ("wdl dcn"), BATCHES ("8192 65536"), ITERS ("150 24", one per
# batch), EMBED_DIM (128), PLAIN (1; 0: no plain PyTorch runs), PLAIN_VARIANTS, SAMPLES (derived), CARD_SCALE (1: 33.8M rows), METHOD
# (metis+refine), MAX_GPUS, MULTI_VARIANTS, PROFILE_STEPS (10: passed as --profile-steps when the CLI has it), BUDGET_S,
# WORK (/tmp/hetgmp-train-gpu), PYTHON (python3), SKIP_BUILD=1. CPU smoke test (2 gloo ranks
# stand in for 2 GPUs), see bench/gpu/README.md: DEVICE=cpu SKIP_BUILD=1 SAMPLES=20000 ...
set -uo pipefail
cd "$(dirname "$0")/../.."
T0=$(date +%s)
PY=${PYTHON:-python3}
RES="${OUT:-bench/results}/gpu"
WORK=${WORK:-/tmp/hetgmp-train-gpu}
BUDGET_S=${BUDGET_S:-570}
DEVICE=${DEVICE:-cuda}
MODELS=(${MODELS:-wdl dcn})
BATCHES=(${BATCHES:-8192 65536})
ITERS=(${ITERS:-150 24})
EMBED_DIM=${EMBED_DIM:-128}
IFS=';' read -ra CLI_VARIANT_LIST <<< "${CLI_VARIANTS---amp}"
PLAIN_VARIANTS=${PLAIN_VARIANTS:-fp32,bf16+graph,bf16+adagrad,bf16+compile+graph}
RECORDS="$RES/train_records.jsonl"
LOGF="$RES/train_logs.txt"
mkdir -p "$RES" "$WORK/results"
rm -f "$RECORDS" "$LOGF" "$RES/train_cli.json" "$RES/train_cli.md"
touch "$RECORDS"
log() { echo "[train_gpu +$(($(date +%s) - T0))s] $*" | tee -a "$LOGF"; }
left() { echo $((BUDGET_S - ($(date +%s) - T0))); }
[ ${#ITERS[@]} = ${#BATCHES[@]} ] || { echo "ITERS needs one value per batch in BATCHES"; exit 2; }

# Mandatory on the multi-GPU machine (NVLink multicast / NVLS off), also for torchrun's children.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
if compgen -G ".whl/*.whl" > /dev/null && ! $PY -c "import pymetis" 2> /dev/null; then
  $PY -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl >> "$LOGF" 2>&1 \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} \
    || log "WARNING: the carried wheels do not install here; going on without them"
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
if [ "${SKIP_BUILD:-0}" != 1 ] && ! $PY -c "from hetgmp.native import native; native()" 2> /dev/null; then
  log "building hetgmp's native extension"
  $PY -m pip install -q --no-build-isolation --no-deps -e . >> "$LOGF" 2>&1 \
    || $PY setup.py build_ext --inplace >> "$LOGF" 2>&1
fi
$PY -c "from hetgmp.native import native; native()" || { log "FAILED: hetgmp._native does not import (see $LOGF)"; exit 1; }

if [ "$DEVICE" = cpu ]; then NGPU=2; else
  NGPU=$($PY -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)")
fi
[ "${NGPU:-0}" -ge 1 ] || { log "FAILED: no CUDA GPU visible (DEVICE=cpu for a smoke test)"; exit 1; }
WORLD=$((NGPU >= 4 ? 4 : (NGPU >= 2 ? 2 : 1)))  # the most GPUs a run takes (4 where lent)
[ -n "${MAX_GPUS:-}" ] && [ "$MAX_GPUS" -lt "$WORLD" ] && WORLD=$MAX_GPUS
COUNTS=(1); [ $WORLD -ge 2 ] && COUNTS+=(2); [ $WORLD -ge 4 ] && COUNTS+=(4)
MACHINE=$($PY -c "import platform, os, torch; g = torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'CPU'; print(f'{platform.node()} {os.cpu_count()} cpus, {torch.cuda.device_count()} x {g}, torch {torch.__version__}')")
METHOD=${METHOD:-metis+refine}
if [[ "$METHOD" == metis* ]] && ! $PY -c "import pymetis" 2> /dev/null; then
  log "pymetis is not importable (no .whl/ carried?): partitioning with 'refine' instead of $METHOD"
  METHOD=refine
fi
log "$MACHINE; runs on ${COUNTS[*]} GPU(s)"

# The data: the largest run (WORLD x batch x steps) inside one epoch of the 90 % training split,
# +20 % for an unbalanced plan, rounded up to 100k samples.
need=0
for i in "${!BATCHES[@]}"; do
  n=$((WORLD * BATCHES[i] * ITERS[i])); [ $n -gt $need ] && need=$n
done
SAMPLES=${SAMPLES:-$(( (need * 12 / 9 + 99999) / 100000 * 100000 ))}
CARD_SCALE=${CARD_SCALE:-1}
DS="$WORK/criteo-like-$SAMPLES-s$CARD_SCALE"
GEN_WORKERS=$(( $(nproc) < 16 ? $(nproc) : 16 ))
if [ ! -f "$DS/meta.json" ]; then
  log "generating $SAMPLES samples (scale $CARD_SCALE) into $DS"
  $PY -m hetgmp generate criteo-like --out "$DS" --num-samples "$SAMPLES" --scale "$CARD_SCALE" \
    --workers "$GEN_WORKERS" --overwrite --no-progress >> "$LOGF" 2>&1 || { log "FAILED: generate"; exit 1; }
fi
plan_of() { echo "$WORK/part$1-$(basename "$DS")-$METHOD.npz"; }  # the plan for N GPUs
for g in "${COUNTS[@]}"; do
  PLAN=$(plan_of "$g")
  if [ "$g" -gt 1 ] && [ ! -f "$PLAN" ]; then
    log "partitioning for $g GPUs ($METHOD, 2 rounds)"
    $PY -m hetgmp partition -n "$g" --data "$DS" -o "$PLAN" --method "$METHOD" --rounds 2 \
      --batch-size "${BATCHES[0]}" --no-progress >> "$LOGF" 2>&1 || log "partition FAILED: no $g-GPU runs"
  fi
done
PROFILE=()
if $PY examples/hetuctr.py --help 2> /dev/null | grep -q -- "--profile-steps"; then
  PROFILE=(--profile-steps "${PROFILE_STEPS:-10}")
fi
log "data ready; the CLI $([ ${#PROFILE[@]} -gt 0 ] && echo 'has' || echo 'has no') --profile-steps"

# run_logged CAP NAME CMD...: runs CMD under a time limit, output to the log (RUN_RC, RUN_S).
run_logged() {
  local cap=$1 name=$2; shift 2
  local t=$(date +%s)
  echo "==== $name: $*" >> "$LOGF"
  timeout --signal=TERM --kill-after=10 "$cap" "$@" 2>&1 | tee -a "$LOGF" \
    | grep -E "^(PLAIN|EVAL)|Error|error:|FAILED" | cut -c1-200
  RUN_RC=${PIPESTATUS[0]}
  RUN_S=$(($(date +%s) - t))
  log "$name: exit $RUN_RC after ${RUN_S}s$([ "$RUN_RC" = 124 ] && echo ' (cut at its time limit)')"
}

# cap MAX: seconds a run may take (at most MAX, keeping 25 s for the report), 0 when none left.
cap() { local c=$(( $(left) - 25 )); [ $c -gt "$1" ] && c=$1; [ $c -lt 30 ] && c=0; echo $c; }

skipped() {  # model batch gpus contender variant
  $PY bench/gpu/train_report.py add-failed --records "$RECORDS" --model "$1" --batch "$2" \
    --gpus "$3" --contender "$4" --variant "$5" --status "skipped: out of time" --machine "$MACHINE"
}

run_plain() {  # model batch iters (PLAIN=0: none, e.g. where only the GPU-count ratios are wanted)
  [ "${PLAIN:-1}" = 0 ] && return
  local c; c=$(cap "${PLAIN_MAX_S:-200}")
  [ "$c" = 0 ] && { skipped "$1" "$2" 1 plain-pytorch "$PLAIN_VARIANTS"; return; }
  local cmd=($PY bench/gpu/plain_ctr.py --dataset "$DS" --model "$1" --batch "$2" --iters "$3"
             --warmup 10 --embed-dim "$EMBED_DIM" --variants "$PLAIN_VARIANTS" --device "$DEVICE"
             --output "$RECORDS")
  local before; before=$(wc -l < "$RECORDS" 2> /dev/null || echo 0)
  CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} run_logged "$c" "plain $1 b$2" "${cmd[@]}" \
    --command "bash bench/gpu/train_gpu.sh # ${cmd[*]}"
  # plain_ctr.py records its own failed variants; a crash or the time limit leaves the rest unsaid
  local after; after=$(wc -l < "$RECORDS" 2> /dev/null || echo 0)
  if [ "$RUN_RC" = 124 ] || [ "$RUN_RC" = 137 ] || [ "$after" = "$before" ]; then
    $PY bench/gpu/train_report.py add-failed --records "$RECORDS" --model "$1" --batch "$2" \
      --contender plain-pytorch --variant "not run of: $PLAIN_VARIANTS" --rc "$RUN_RC" \
      --wall-s "$RUN_S" --status "failed (exit $RUN_RC; 124 = time limit)" --machine "$MACHINE" \
      --command "${cmd[*]}"
  fi
}

run_cli() {  # model batch iters gpus [more CLI flags: a variant of the defaults]
  # (more flags may hold "hash": no plan, no mirrors; "mpirun": launched by mpirun -np N)
  local variant="whole table on the GPU" extra=() more=() launch=torchrun plan
  plan=$(plan_of "$4")
  for f in "${@:5}"; do
    case $f in hash) launch_hash=1 ;; mpirun) launch=mpirun ;; *) more+=("$f") ;; esac
  done
  if [ "$4" -gt 1 ]; then
    variant="$METHOD plan, store_rate 0.01, bound 100"
    extra=(--partition "$plan" --store_rate 0.01 --bound 100)
    if [ "${launch_hash:-0}" = 1 ]; then variant="hash placement, bound 100"; extra=(--bound 100); fi
  fi
  local tag="${more[*]}$([ $launch = mpirun ] && echo ' mpirun')" name
  name="$tag$([ "${launch_hash:-0}" = 1 ] && echo ' hash')"
  launch_hash=0
  tag=${tag# }; name=${name# }
  [ -n "$tag" ] && variant="$variant, $tag"
  local c; c=$(cap "${CLI_MAX_S:-180}")
  if [ "$c" = 0 ] || { [ "$4" -gt 1 ] && [ ! -f "$plan" ]; }; then
    skipped "$1" "$2" "$4" hetgmp-cli "$variant"; return
  fi
  local out="$WORK/results/cli_$1_b$2_w$4$(echo "$name" | tr -dc 'a-z0-9_').json"
  rm -f "$out"
  local run=($PY -m torch.distributed.run --standalone --nproc_per_node "$4")
  [ $launch = mpirun ] && run=(mpirun --allow-run-as-root --oversubscribe -np "$4" -x NCCL_NVLS_ENABLE
    -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x NVSHMEM_DISABLE_NVLS -x PYTHONPATH -x PATH $PY)
  local cmd=("${run[@]}" examples/hetuctr.py
             --dataset "$DS" --device "$DEVICE" --model "$1" --batch_size "$2"
             --embed_dim "$EMBED_DIM" --iter "$3" --log_every 50 --no-progress "${extra[@]}"
             "${PROFILE[@]}" "${more[@]}" --output "$out")
  run_logged "$c" "cli $1 b$2 w$4${name:+ $name}" "${cmd[@]}"
  $PY bench/gpu/train_report.py add-cli --records "$RECORDS" --result "$out" --model "$1" \
    --batch "$2" --gpus "$4" --iters "$3" --wall-s "$RUN_S" --rc "$RUN_RC" --variant "$variant" \
    --machine "$MACHINE" --command "bash bench/gpu/train_gpu.sh # ${cmd[*]}"
}

for model in "${MODELS[@]}"; do
  for i in "${!BATCHES[@]}"; do
    b=${BATCHES[i]} it=${ITERS[i]}
    run_plain "$model" "$b" "$it"
    run_cli "$model" "$b" "$it" 1
    for g in "${COUNTS[@]:1}"; do run_cli "$model" "$b" "$it" "$g"; done
    # at 2 GPUs and the first batch size: the bound-0 anchor, hash placement, the card's launcher
    if [ $WORLD -ge 2 ] && [ "$i" = 0 ]; then
      IFS=';' read -ra MV <<< "${MULTI_VARIANTS---bound 0;hash;mpirun}"
      for v in "${MV[@]}"; do [ -n "$v" ] && run_cli "$model" "$b" "$it" 2 $v; done
    fi
    # variants of the defaults on 1 GPU, e.g. --amp (bf16 autocast: could it be the GPU
    # default? AUC after the same steps) or --no-cuda-graphs (what the whole-step graph gives)
    for v in "${CLI_VARIANT_LIST[@]}"; do
      [ -n "$v" ] && run_cli "$model" "$b" "$it" 1 $v
    done
  done
done

log "writing the report"
$PY bench/gpu/train_report.py report --records "$RECORDS" --dataset "$DS" --out "$RES" \
  --steps "$(for i in "${!BATCHES[@]}"; do printf '%s at %s; ' "${ITERS[i]}" "${BATCHES[i]}"; done)" \
  --command "bash bench/gpu/train_gpu.sh (MODELS='${MODELS[*]}' BATCHES='${BATCHES[*]}' ITERS='${ITERS[*]}' EMBED_DIM=$EMBED_DIM)" \
  2>&1 | tee -a "$LOGF"
log "done in $(($(date +%s) - T0)) s; results in $RES/train_cli.md"
