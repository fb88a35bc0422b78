#!/usr/bin/env bash
# The card's runs (issue 18) on however many GPUs the machine has (1, 2, 4 or 8), one command:
#
#   bash bench/gpu/run8.sh [--out DIR] [--stage STAGES] [--smoke]     # in the repo root
#
# Stages (STAGE or --stage, comma-separated; "all" = every one, "data" = gen,plan):
#   gen         Criteo-Kaggle-shape data (hetgmp generate criteo-like; SAMPLES, 45.8M by default)
#               and the all-to-all contenders' workload (bench/gpu/cli.py prepare)
#   plan        python partition/partition.py -n NGPU (metis+refine at the first batch size)
#   train       the CLI (examples/hetuctr.py --device cuda), one epoch with the AUC, per batch
#               (8192, 65536 per GPU): 1 GPU with the whole table (the baseline of the scaling),
#               torchrun --nproc_per_node NGPU and mpirun -np NGPU with --partition --bound 100
#               --store_rate 0.01, and hash placement (the same without --partition)
#   contenders  row-wise and table-wise all-to-all (bench/gpu/cli.py run --modes train)
#   nccl        all-to-all bandwidth of the machine (bench/gpu/alltoall_bw.py)
#   sweeps      staleness (bound 0/10/100) and store rate (0 .. 0.1) at NGPU ranks
#               (hetgmp experiment staleness / store-rate: CSV, PNG, markdown)
# Every call ends with the report: run8.json, run8.md, run8.png (+ the sweeps' files) in
# --out DIR (default ${OUT:-bench/results}/run8). With 1 GPU the N-rank runs (plan, hash,
# sweeps) are skipped with a message; the 1-GPU CLI runs, mpirun -np 1, the contenders and the
# all-to-all run on the one GPU (1 rank: no link crossed; they test the stages).
#
# Time: a device call may take 10 minutes. Each call stops starting runs when its budget
# (BUDGET_S, 540 s) runs low and says what is left; state (data, plan, records, sweep CSVs) is
# kept in WORK, so the same command run again resumes where it stopped. Full size, one stage
# per call: STAGE=data, STAGE=train (twice if needed), STAGE=contenders,nccl, STAGE=sweeps.
# SMOKE=1 (--smoke): every stage on tiny data, < 3 minutes. Exit status: 0 all done, 3 runs left
# for the next call, 1 a step failed (the report is written in every case).
#
# Knobs (environment): DEVICE (cuda | cpu: gloo ranks, mpirun --oversubscribe, a test),
# RANKS (cpu: 8; cuda: the GPU count, or fewer), SAMPLES, CARD_SCALE (1: 33.8M rows), MODEL
# (wdl), EMBED_DIM (128), BATCHES ("8192 65536"), ITERS (0: one epoch), WARMUP (10),
# EVAL_BATCH, STORE_RATE (0.01), BOUND (100), METHOD (metis+refine), ROUNDS (5), BOUNDS
# (0,10,100), STORE_RATES (0,0.001,0.003,0.01,0.03,0.1), SWEEP_ITERS (150), EVAL_EVERY (25),
# CONT_SAMPLES (2M), CONT_STEPS (20), A2A_SIZES_MB, BUDGET_S, CLI_MAX_S, WORK
# (/tmp/hetgmp-run8), FRESH=1 (forget this configuration's records), PYTHON, SKIP_BUILD=1.
set -uo pipefail
cd "$(dirname "$0")/../.."
T0=$(date +%s)
ARGS="$*"
RES_ARG=""
while [ $# -gt 0 ]; do
  case $1 in
    --out) RES_ARG=$2; shift 2 ;;
    --out=*) RES_ARG=${1#--out=}; shift ;;
    --stage) STAGE=$2; shift 2 ;;
    --stage=*) STAGE=${1#--stage=}; shift ;;
    --smoke) SMOKE=1; shift ;;
    -h | --help) sed -n '2,/^[^#]/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run8.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
# The knobs this call was given (the report's record of the command).
KNOBS_SET=$(for k in DEVICE SMOKE STAGE RANKS SAMPLES CARD_SCALE MODEL EMBED_DIM BATCHES ITERS \
  WARMUP EVAL_BATCH STORE_RATE BOUND METHOD ROUNDS BOUNDS STORE_RATES SWEEP_ITERS EVAL_EVERY \
  CONT_SAMPLES CONT_STEPS A2A_SIZES_MB BUDGET_S CLI_MAX_S; do
  if [ -n "${!k+x}" ]; then [[ "${!k}" == *" "* ]] && printf '%s="%s" ' "$k" "${!k}" || printf '%s=%s ' "$k" "${!k}"; fi
done)
PY=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}
SMOKE=${SMOKE:-0}
STAGE=${STAGE:-all}
BUDGET_S=${BUDGET_S:-540}
case $DEVICE in cuda | cpu) ;; *) echo "run8.sh: DEVICE must be cuda or cpu, got '$DEVICE'" >&2; exit 2 ;; esac
STAGES=",${STAGE//all/gen,plan,train,contenders,nccl,sweeps},"
STAGES=${STAGES//,data,/,gen,plan,}
for s in ${STAGES//,/ }; do
  case $s in gen | plan | train | contenders | nccl | sweeps | report) ;;
    *) echo "run8.sh: unknown stage '$s' (gen, plan, train, contenders, nccl, sweeps, data, all)" >&2; exit 2 ;;
  esac
done
want() { [[ "$STAGES" == *",$1,"* ]]; }

# Sizes: the card's by default; SMOKE=1 tiny (the env still wins over both).
if [ "$SMOKE" = 1 ] && [ "$DEVICE" = cpu ]; then
  : "${SAMPLES:=16000}" "${CARD_SCALE:=0.001}" "${EMBED_DIM:=8}" "${BATCHES:=128}"
  : "${SWEEP_ITERS:=12}" "${EVAL_EVERY:=4}" "${STORE_RATES:=0,0.01,0.1}" "${CONT_SAMPLES:=16000}"
  : "${CONT_STEPS:=3}" "${A2A_SIZES_MB:=0.25,1}" "${WARMUP:=2}" "${ROUNDS:=2}" "${CLI_MAX_S:=120}"
elif [ "$SMOKE" = 1 ]; then
  : "${SAMPLES:=400000}" "${CARD_SCALE:=0.01}" "${EMBED_DIM:=32}" "${BATCHES:=2048}"
  : "${SWEEP_ITERS:=20}" "${EVAL_EVERY:=5}" "${STORE_RATES:=0,0.01,0.1}" "${CONT_SAMPLES:=400000}"
  : "${CONT_STEPS:=5}" "${A2A_SIZES_MB:=1,16}" "${WARMUP:=2}" "${ROUNDS:=2}" "${CLI_MAX_S:=120}"
fi
SAMPLES=${SAMPLES:-45840617} CARD_SCALE=${CARD_SCALE:-1} EMBED_DIM=${EMBED_DIM:-128}
MODEL=${MODEL:-wdl} ITERS=${ITERS:-0} WARMUP=${WARMUP:-10} STORE_RATE=${STORE_RATE:-0.01}
BOUND=${BOUND:-100} METHOD=${METHOD:-metis+refine} ROUNDS=${ROUNDS:-5} BOUNDS=${BOUNDS:-0,10,100}
STORE_RATES=${STORE_RATES:-0,0.001,0.003,0.01,0.03,0.1} SWEEP_ITERS=${SWEEP_ITERS:-150}
EVAL_EVERY=${EVAL_EVERY:-25} CONT_SAMPLES=${CONT_SAMPLES:-2000000} CONT_STEPS=${CONT_STEPS:-20}
A2A_SIZES_MB=${A2A_SIZES_MB:-1,4,16,64,256} CLI_MAX_S=${CLI_MAX_S:-300}
read -ra BATCH_LIST <<< "${BATCHES:-8192 65536}"
B0=${BATCH_LIST[0]}
[ "$DEVICE" = cuda ] && EVAL_BATCH=${EVAL_BATCH:-65536} || EVAL_BATCH=${EVAL_BATCH:-4096}

# Mandatory on the multi-GPU machines (NVLink multicast / NVLS off), also for the children.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
[ "$DEVICE" = cpu ] && export OMP_NUM_THREADS=1 || export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
if compgen -G ".whl/*.whl" > /dev/null && ! $PY -c "import pymetis" 2> /dev/null; then
  $PY -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl > /dev/null 2>&1 \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
if [ "${SKIP_BUILD:-0}" != 1 ] && ! $PY -c "from hetgmp.native import native; native()" 2> /dev/null; then
  echo "[run8] building hetgmp's native extension"
  $PY -m pip install -q --no-build-isolation --no-deps -e . > /tmp/run8-build.log 2>&1 \
    || $PY setup.py build_ext --inplace >> /tmp/run8-build.log 2>&1
fi
$PY -c "from hetgmp.native import native; native()" || { echo "[run8] FAILED: hetgmp._native does not import" >&2; exit 1; }

# The machine: ranks of the N-rank runs, mpirun, the partition method.
if [ "$DEVICE" = cpu ]; then NR=${RANKS:-8}; else
  NGPU=$($PY -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)")
  [ "${NGPU:-0}" -ge 1 ] || { echo "[run8] FAILED: no CUDA GPU visible (DEVICE=cpu for a test on CPU ranks)" >&2; exit 1; }
  NR=${RANKS:-$NGPU}
  [ "$NR" -le "$NGPU" ] || { echo "[run8] RANKS=$NR but only $NGPU GPU(s)" >&2; exit 2; }
fi
PY_ABS=$($PY -c 'import sys; print(sys.executable)')
# (mpirun's children get Open MPI's PATH first: a bare python3 there can be another interpreter)
MPIRUN=$(dirname "$PY_ABS")/mpirun
[ -x "$MPIRUN" ] || MPIRUN=$(command -v mpirun || true)
MPI_FLAGS=(--bind-to none)
# Open MPI refuses to start as root unless told (GPU machines' containers run as root); the
# experiments' launcher does the same (hetgmp/experiments/launch.py)
if [ "$(id -u)" = 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-1}
  export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}
fi
{ [ "$DEVICE" = cpu ] || [ "$NR" -gt "$(nproc)" ]; } && MPI_FLAGS+=(--oversubscribe)
if [[ "$METHOD" == metis* ]] && ! $PY -c "import pymetis" 2> /dev/null; then
  echo "[run8] pymetis is not importable: partitioning with 'refine' instead of $METHOD"
  METHOD=refine
fi
MACHINE=$($PY -c "import platform, os, torch; c = torch.cuda.is_available(); print(f'{platform.node()} {os.cpu_count()} cpus, ' + (f'{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}' if c else 'no GPU') + f', torch {torch.__version__}')")

# Where things live: data and plans are shared, the records belong to one configuration.
WORK=${WORK:-/tmp/hetgmp-run8}
DS="$WORK/data/criteo-like-$SAMPLES-s$CARD_SCALE"
CW="$WORK/data/contenders-$CONT_SAMPLES-s$CARD_SCALE"
PLAN="$WORK/data/part$NR-$(basename "$DS")-${METHOD//+/_}-b$B0-r$ROUNDS.npz"
STATE="$WORK/state-$DEVICE-r$NR-$(basename "$DS")-$MODEL-d$EMBED_DIM-i$ITERS-s$STORE_RATE-b$BOUND"
[ "${FRESH:-0}" = 1 ] && rm -rf "$STATE"
RES=${RES_ARG:-${OUT:-bench/results}/run8}
mkdir -p "$STATE/runs" "$WORK/data" "$RES"
RECORDS="$STATE/records.jsonl" LOGF="$STATE/logs.txt"
touch "$RECORDS"
COMMIT=$(git rev-parse --short HEAD 2> /dev/null || echo unknown)
[ "$COMMIT" != unknown ] && [ -n "$(git status --porcelain --untracked-files=no -- hetgmp bench examples partition 2> /dev/null)" ] && COMMIT="$COMMIT+edits"
echo "$(date -u +%FT%TZ) (commit $COMMIT, $NR ranks) ${KNOBS_SET}bash bench/gpu/run8.sh $ARGS" >> "$STATE/calls.txt"
log() { echo "[run8 +$(($(date +%s) - T0))s] $*" | tee -a "$LOGF"; }
left() { echo $((BUDGET_S - ($(date +%s) - T0))); }
cap() { local c=$(( $(left) - 20 )); [ "$c" -gt "$1" ] && c=$1; [ "$c" -lt 20 ] && c=0; echo "$c"; }
PENDING=0 FAILED=0
pending() { PENDING=$((PENDING + 1)); log "NOT RUN (out of time in this call): $*; run the same command again to continue"; }
log "$MACHINE; device $DEVICE, $NR rank(s); stages ${STAGES//,/ }; state in $STATE"
[ "$NR" -ge 2 ] || log "1 rank: the N-rank runs (plan, hash placement) and the sweeps are skipped; the 1-rank CLI runs, mpirun -np 1, the contenders and the all-to-all run on 1 rank (no link crossed: a test of the stages)"

# run_logged CAP NAME CMD...: CMD under a time limit, its output to the log (RUN_RC, RUN_S).
run_logged() {
  local c=$1 name=$2; shift 2
  local t; t=$(date +%s)
  echo "==== $name: $*" >> "$LOGF"
  timeout --signal=TERM --kill-after=15 "$c" "$@" >> "$LOGF" 2>&1
  RUN_RC=$?
  RUN_S=$(($(date +%s) - t))
  log "$name: exit $RUN_RC after ${RUN_S}s$([ "$RUN_RC" = 124 ] && echo ' (cut at its time limit)')"
  [ "$RUN_RC" = 0 ] || { FAILED=$((FAILED + 1)); tail -n 5 "$LOGF" | sed 's/^/    /'; }
}

source bench/gpu/run8_stages.sh
want gen && stage_gen
want plan && stage_plan
want train && stage_train
want contenders && stage_contenders
want nccl && stage_nccl
want sweeps && stage_sweeps
stage_report
cp "$LOGF" "$RES/run8_logs.txt" 2> /dev/null
if [ "$PENDING" -gt 0 ]; then log "$PENDING run(s) left for the next call (same command)"; exit 3; fi
[ "$FAILED" = 0 ] || { log "$FAILED step(s) failed (see $RES/run8_logs.txt)"; exit 1; }
log "done in $(($(date +%s) - T0)) s; results in $RES/run8.md"
