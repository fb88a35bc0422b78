#!/usr/bin/env bash
# Planning and reading one step ahead (hetgmp.embedding.padded.ahead: PLAN_AHEAD and
# EXCHANGE_EARLY, on by default and exact; ENABLED, reading ahead, off: it relaxes --bound by a
# step), A/B in one
# call on a multi-GPU machine (<= 8 minutes at GPUS=2): the user's command (WDL dim 128, the
# card's flags: metis+refine plan, --store_rate 0.01 --bound 100) on 1 GPU, then on each of
# GPUS in each of VARIANTS, at batch 8192 and 65536 per GPU, and at --bound 0 (the AUC
# reference, defaults); with OLD=DIR (a checkout of an older commit, its native extension
# built) the same 1-GPU and first-GPUS runs of that tree first, at the batches OLD_BATCHES
# (8192) (before/after in one call). CPU smoke (gloo ranks): DEVICE=cpu GPUS="2 4"
# BATCHES=256 ITERS=6 SAMPLES=6000 SCALE=0.002 LOG_EVERY=2 (45 s on 2 cores).
#
#   bash bench/gpu/read_ahead_ab.sh        # results in ${OUT:-bench/results}/gpu/read_ahead_ab
#
# Knobs: GPUS ("2": the multi-GPU counts, e.g. "2 4" on a 4-GPU machine, a plan each),
# VARIANTS ("strict early ahead": no planning ahead / the defaults, planned ahead and the next
# exchange right after backward / reading ahead; also "planned": planned ahead only, "noprio":
# early without the streams' priorities (padded.streams.PRIORITIES off), "nolist": early with pack
# scanning every mirror (presync_step.DUE_LIST off), "nodefer": early with the first layer's
# weight gradient in backward (models.deferred_wgrad off), "nvlK_C": early with NCCL's
# peer-to-peer chunks of K KiB over NVLink and at least C channels, "aheadnoprio" / "aheadhigh":
# reading ahead without priorities / with its exchange at the highest, "nofield": early with the
# rows' gradient summed by one atomic per occurrence (kernels.rows.FIELD_RUNS off), "earlyzero":
# early with the gradient buffer zeroed during the forward (padded.exchange.EARLY_ZERO),
# "markfield": early with the plan's leaders marked by field (kernels.prep.MARK_BY_FIELD),
# "zeromark": both, "peer": early with the two payloads written by pack and answer straight
# into the peers' buffers (symmetric memory), a device barrier for each all-to-all
# (padded.peer_payloads.PEER_PAYLOADS), "peerfrom": peer and fromtable, "narrow": early with
# the exchange waiting only for the backward up to the embedding's gradient
# (padded.exchange.NARROW_WAIT), "ownearly": early with the own rows' entries of the owner's
# update written in the counts phase (padded.owner_update.OWN_SLOTS_EARLY), "chain": both and the
# versions moved by the owner's Adagrad launch (padded.owner_update.VERSIONS_IN_UPDATE), "pull":
# early with the replies read by finish from the owners' memory instead of written into the
# querier's (padded.peer_payloads.PULL_REPLIES, on by default since: "push" the former), "dar": early with the dense gradients summed
# in peer memory (hetgmp.comm.peer_allreduce.DENSE_PEER), "pulldar": pull and dar, "alldar":
# pulldar and chain, "ll128" / "simple": early with NCCL_PROTO=LL128 / Simple (the dense
# all-reduce ran as NCCL's LL protocol), "abl_NAME": early with a part of the step left out ("abl_A-B": parts A and B;
# "V+abl_A": variant V with part A left out), "sumfirst": early with the
# backward's rest after the rows' gradient sum (exchange.SUM_FIRST, the default; "sumlast": without), "sumpadam": sumfirst
# and padam (the chain then starts earlier, the dense path is the one to cut), "pushearly":
# early with the pushes' ids sent and mapped in the counts phase (owner_update.PUSH_SLOTS_EARLY),
# "ownsplit": pushearly and the own rows no push joins updated beside the chain
# (owner_update.OWN_SPLIT), "allearly": ownsplit and sumpadam, "allinline": allearly with
# the own rows' update inline (owner_update.OWN_STREAM=0), "earlyrows": early with the first
# layer's last rows all-reduced from inside backward (dense_sync.EARLY_ROWS),
# "besiderows": early with a one-rank whole step's dense sum beside its row update
# (ablations.py beside_rows: only with "abl_replica*", e.g. "besiderows+abl_replica_peer1"), "splitrows":
# ownsplit and earlyrows (both paths after backward shorter), "tierN": early with the owned
# rows on the host tier, an N % cache (--rows-on host --cache-budget 0.N --exchange padded), "bagcompact": early with MULTI_HOT's bags
# handed to the table packed into a fixed capacity (multi_hot.COMPACT), "padam": early with the dense
# gradients summed by the fused Adam in peer memory (peer_allreduce.ADAM_PEER), "cadam": padam
# with every bucket copied into the peers' inboxes first (copy engines; ADAM_COPY), "stage": early
# with the own rows' staging on their update's stream (owner_update.STAGE_BESIDE), "stagepushed":
# early with only the own rows a push joins staged (owner_update.STAGE_PUSHED_ONLY), "pushedcadam":
# and ADAM_COPY (as cadam), "stagecadam":
# stage and cadam (both paths after backward shorter), "tailold": early with the next batch's gathers
# and the loss sums at the end of the step's main stream (inputs_ahead.FILL_BESIDE and
# step.METRICS_BESIDE off)
# (diagnosis only, wrong values: bench/gpu/ablations.py),
# "fromtable": early with the lookup reading the rows stored here from the table, finish_values
# writing only the others (padded.take.TAKE_FROM_TABLE); reading
# ahead applies up to
# 16384 samples per GPU, so "ahead" at larger batches is "early"),
# BATCHES ("8192 65536"), W1V ("early": the 1-GPU runs' variants, each but early named w1V;
# a ratio is to the last 1-GPU run before it; "fixed1": multi-hot bags in fixed shapes,
# "onecompact": one GPU's bags compact, its whole step one graph, the default since 2026-11-27;
# "afterstage": early with the first layer's deferred product after the exchange's pre-sync
# kernel (train/product_hold.py), "afterstagecadam": and ADAM_COPY (as cadam), "splitsum":
# early with the rows' gradient sum in two passes, the own rows' on their update's stream
# (padded.owner_update.SPLIT_SUM), "splitcadam" / "splitafter" / "splitaftercadam": with ADAM_COPY
# / PRODUCT_AFTER_STAGE / both, "shared": cadam with the copies certified by the exchange's second payload barrier, no
# meeting of their own (peer_allreduce.SHARED_BARRIER), "sharedstage": and STAGE_BESIDE, "dil_POINT": early with DIL_US (40) us of delay at POINT (diagnosis: bench/gpu/dilations.py),
# "carveN" / "carveNlt" / "carveNV": early with N SMs left out of cuBLAS's GEMMs (and every
# GEMM through cuBLASLt / and variant V: bench/gpu/switches.py), "onevar": one GPU's bags in the variable layout, the default before), REPEAT (1; N: N rounds of the 1-GPU run and every variant, tagged
# rN, each variant's ratio against its round's 1-GPU run, and their median: ratios differ by
# ~2 % between calls, so a 1 % change needs rounds), ITERS (150), SAMPLES (3.3M, or more: epochs of at least 20 steps for
# the largest GPU count x batch, so that steady intervals exist with LOG_EVERY=10; 5.9M for
# 4 x 65536),
# SCALE (1: 33.8M rows), WORK
# (/tmp/hetgmp-ab), PYTHON (python3), DEVICE (cuda; cpu: a smoke test on 2 gloo ranks), OLD,
# MULTI_HOT (e.g. "2:20": multi-hot fields too, several CUDA ranks taking them in fixed shapes),
# (the summary's "epoch start + ms": what an interval holding an epoch start takes beyond a
# clean one, median: the epoch check, the scan, the last partial batch's eager step), PAIR (1:
# also two 1-GPU jobs at once, one per GPU, each against the lone 1-GPU run: what
# the machine gives two GPUs that do not talk), LOG_EVERY (10: TRAIN intervals, whose median among those without an epoch start is the
# "steady" column; none such: "n/a"), BOUND0
# (1; 0: no --bound 0 runs).
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}; ITERS=${ITERS:-150}
if [ -z "${SAMPLES:-}" ]; then  # (the 90 % training split holds 20 steps of the largest run)
  big=0; for g in ${GPUS:-2}; do for b in ${BATCHES:-8192 65536}; do
    [ $((g * b)) -gt $big ] && big=$((g * b)); done; done
  SAMPLES=$(( (big * 20 * 10 / 9 + 99999) / 100000 * 100000 ))
  [ "$SAMPLES" -lt 3300000 ] && SAMPLES=3300000
fi
SCALE=${SCALE:-1}; DEVICE=${DEVICE:-cuda}; BATCHES=${BATCHES:-"8192 65536"}; OLD=${OLD:-}
WORK=${WORK:-/tmp/hetgmp-ab}; RES="${OUT:-bench/results}/gpu/read_ahead_ab"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
BASEPATH=${PYTHONPATH:-}
mkdir -p "$RES" "$WORK"
# (MULTI_HOT, e.g. "2:20": that many multi-hot fields of that mean length beside the 26
# single-hot ones; several CUDA ranks then train them in fixed shapes, train/multi_hot.GPU_RANKS)
MH=${MULTI_HOT:-}; MH_TAG=${MH:+-m${MH/:/x}}
DS=$WORK/ds-$SAMPLES-s$SCALE$MH_TAG; GPUS=${GPUS:-2}
export PYTHONPATH=$PWD${BASEPATH:+:$BASEPATH}
[ -f "$DS/meta.json" ] || $PY -m hetgmp generate criteo-like --out "$DS" --num-samples "$SAMPLES" \
  --scale "$SCALE" ${MH:+--multi-hot "$MH"} --workers 16 --overwrite --no-progress \
  > "$RES/generate.log" 2>&1 || exit 1
METHOD=metis+refine; $PY -c "import pymetis" 2> /dev/null || METHOD=refine
plan() { echo "$WORK/part$1-$SAMPLES-s$SCALE$MH_TAG.npz"; }  # (a plan per GPU count)
for g in $GPUS; do
  [ -f "$(plan "$g")" ] || $PY -m hetgmp partition -n "$g" --data "$DS" -o "$(plan "$g")" \
    --method $METHOD --rounds 2 --batch-size 8192 --no-progress > "$RES/partition$g.log" 2>&1 || exit 1
done
card() { echo --partition "$(plan "$1")" --store_rate 0.01 --bound "${2:-100}"; }
switches() {  # variant -> module switches
  local m=hetgmp.embedding.padded.ahead p=hetgmp.embedding.padded
  local early="$m.PLAN_AHEAD=1 $m.EXCHANGE_EARLY=1 $m.ENABLED=0"  # (the default pipelining)
  case $1 in
    strict) echo $m.PLAN_AHEAD=0 $m.ENABLED=0 ;;
    planned) echo $m.PLAN_AHEAD=1 $m.EXCHANGE_EARLY=0 $m.ENABLED=0 ;;
    early|nvl*|ll128|simple) echo $early ;;
    dar) echo $early hetgmp.comm.peer_allreduce.DENSE_PEER=1 ;;
    padam) echo $early hetgmp.comm.peer_allreduce.ADAM_PEER=1 ;;
    cadam) echo $early hetgmp.comm.peer_allreduce.ADAM_PEER=1 hetgmp.comm.peer_allreduce.ADAM_COPY=1 ;;
    shared) echo $(switches cadam) hetgmp.comm.peer_allreduce.SHARED_BARRIER=1 ;;
    sharedstage) echo $(switches shared) $p.owner_update.STAGE_BESIDE=1 ;;
    bagcompact) echo $early hetgmp.train.multi_hot.COMPACT=1 ;;
    bagpadded) echo $early hetgmp.train.multi_hot.COMPACT=0 ;;
    fixed1) echo $early hetgmp.train.multi_hot.FIXED_SHAPE=1 ;;
    onecompact) echo $early hetgmp.train.multi_hot.ONE_RANK_COMPACT=1 ;;
    onevar) echo $early hetgmp.train.multi_hot.ONE_RANK_COMPACT=0 ;;
    earlyrows) echo $early hetgmp.train.dense_sync.EARLY_ROWS=1 ;;
    besiderows) echo $early ablate:beside_rows ;;
    tier*) echo $early ;;  # (its flags: vflags)
    splitrows) echo $early $p.owner_update.PUSH_SLOTS_EARLY=1 $p.owner_update.OWN_SPLIT=1 \
      hetgmp.train.dense_sync.EARLY_ROWS=1 ;;
    sumfirst) echo $early $p.exchange.SUM_FIRST=1 ;;
    sumlast) echo $early $p.exchange.SUM_FIRST=0 ;;
    sumpadam) echo $early $p.exchange.SUM_FIRST=1 hetgmp.comm.peer_allreduce.ADAM_PEER=1 ;;
    pushearly) echo $early $p.owner_update.PUSH_SLOTS_EARLY=1 ;;
    ownsplit) echo $early $p.owner_update.PUSH_SLOTS_EARLY=1 $p.owner_update.OWN_SPLIT=1 ;;
    stage) echo $early $p.owner_update.STAGE_BESIDE=1 ;;
    stagepushed) echo $early $p.owner_update.STAGE_PUSHED_ONLY=1 ;;
    pushedcadam) echo $(switches stagepushed) hetgmp.comm.peer_allreduce.ADAM_PEER=1 \
      hetgmp.comm.peer_allreduce.ADAM_COPY=1 ;;
    afterstage) echo $early hetgmp.train.product_hold.PRODUCT_AFTER_STAGE=1 ;;
    splitsum) echo $early $p.owner_update.SPLIT_SUM=1 ;;
    splitcadam) echo $early $p.owner_update.SPLIT_SUM=1 hetgmp.comm.peer_allreduce.ADAM_PEER=1 \
      hetgmp.comm.peer_allreduce.ADAM_COPY=1 ;;
    splitafter) echo $early $p.owner_update.SPLIT_SUM=1 hetgmp.train.product_hold.PRODUCT_AFTER_STAGE=1 ;;
    splitaftercadam) echo $(switches splitcadam) hetgmp.train.product_hold.PRODUCT_AFTER_STAGE=1 ;;
    afterstagecadam) echo $early hetgmp.train.product_hold.PRODUCT_AFTER_STAGE=1 \
      hetgmp.comm.peer_allreduce.ADAM_PEER=1 hetgmp.comm.peer_allreduce.ADAM_COPY=1 ;;
    stagecadam) echo $early $p.owner_update.STAGE_BESIDE=1 hetgmp.comm.peer_allreduce.ADAM_PEER=1 \
      hetgmp.comm.peer_allreduce.ADAM_COPY=1 ;;
    allearly) echo $early $p.owner_update.PUSH_SLOTS_EARLY=1 $p.owner_update.OWN_SPLIT=1 \
      $p.exchange.SUM_FIRST=1 hetgmp.comm.peer_allreduce.ADAM_PEER=1 ;;
    allinline) echo $(switches allearly) $p.owner_update.OWN_STREAM=0 ;;
    *+abl_*) switches "${1%%+abl_*}"; switches "abl_${1#*+abl_}" | grep ablate ;;  # (V+abl_X)
    abl_*) local a parts; IFS=- read -ra parts <<< "${1#abl_}"; echo $early  # (diagnosis
      for a in "${parts[@]}"; do echo ablate:$a; done ;;  # only: ablations.py; abl_A-B: both)
    pulldar) echo $early $p.peer_payloads.PULL_REPLIES=1 hetgmp.comm.peer_allreduce.DENSE_PEER=1 ;;
    alldar) echo $early $p.peer_payloads.PULL_REPLIES=1 hetgmp.comm.peer_allreduce.DENSE_PEER=1 \
      $p.exchange.NARROW_WAIT=1 $p.owner_update.OWN_SLOTS_EARLY=1 $p.owner_update.VERSIONS_IN_UPDATE=1 ;;
    noprio) echo $early $p.streams.PRIORITIES=0 ;;
    dil_*_r*) local pt=${1#dil_}; echo $early dilate:${pt%_r*}:${DIL_US:-40}:${1##*_r} ;;
    dil_*) echo $early dilate:${1#dil_}:${DIL_US:-40} ;;  # (diagnosis: bench/gpu/dilations.py)
    carve*) local n=${1#carve}; n=${n%%[a-z]*}; local rest=${1#carve$n}  # (carveN[lt|V])
      case $rest in
        '') echo $early carveout:$n ;;
        lt) echo $early carveout:$n blas:cublaslt ;;
        *) switches "$rest"; echo carveout:$n ;;
      esac ;;
    tailold) echo $early hetgmp.train.inputs_ahead.FILL_BESIDE=0 hetgmp.train.step.METRICS_BESIDE=0 ;;
    nodefer) echo $early hetgmp.models.deferred_wgrad.ENABLED=0 ;;
    nolist) echo $early $p.presync_step.DUE_LIST=0 ;;
    ahead) echo $m.PLAN_AHEAD=1 $m.ENABLED=1 ;;
    aheadnoprio) echo $m.PLAN_AHEAD=1 $m.ENABLED=1 $p.streams.PRIORITIES=0 ;;
    aheadhigh) echo $m.PLAN_AHEAD=1 $m.ENABLED=1 $m.AHEAD_HIGH=1 ;;
    earlyzero) echo $early $p.exchange.EARLY_ZERO=1 ;;
    markfield) echo $early hetgmp.embedding.kernels.prep.MARK_BY_FIELD=1 ;;
    fromtable) echo $early $p.take.TAKE_FROM_TABLE=1 ;;
    peer) echo $early $p.peer_payloads.PEER_PAYLOADS=1 ;;
    narrow) echo $early $p.exchange.NARROW_WAIT=1 ;;
    pull) echo $early $p.peer_payloads.PULL_REPLIES=1 ;;
    push) echo $early $p.peer_payloads.PULL_REPLIES=0 ;;
    ownearly) echo $early $p.owner_update.OWN_SLOTS_EARLY=1 ;;
    chain) echo $early $p.exchange.NARROW_WAIT=1 $p.owner_update.OWN_SLOTS_EARLY=1 \
      $p.owner_update.VERSIONS_IN_UPDATE=1 ;;
    peerfrom) echo $early $p.peer_payloads.PEER_PAYLOADS=1 $p.take.TAKE_FROM_TABLE=1 ;;
    zeromark) echo $early $p.exchange.EARLY_ZERO=1 hetgmp.embedding.kernels.prep.MARK_BY_FIELD=1 ;;
    nofield) echo $early hetgmp.embedding.kernels.rows.FIELD_RUNS=0 ;;
    *) echo "unknown variant $1" >&2; exit 2 ;;
  esac
}
vflags() {  # variant -> extra training flags (tierN: owned rows on the host tier, an N % cache,
  # the padded exchange's whole-step graph holding each epoch's rows: issue 33)
  case $1 in
    tier*) echo --rows-on host --cache-budget "0.${1#tier}" --exchange padded ;;
  esac
}
nccl_env() {  # variant -> NCCL settings (nvlK_C: peer-to-peer chunks of K KiB over NVLink, at
  # least C channels: the all-to-alls' payloads are ~1-2 MB per peer at batch 8192)
  case $1 in
    nvl*) local k=${1#nvl}; k=${k%%_*}; local c=${1##*_}; [ "$c" = "$1" ] && c=1
      echo NCCL_P2P_NVL_CHUNKSIZE=$((k * 1024)) NCCL_MIN_P2P_NCHANNELS=$c ;;
    ll128) echo NCCL_PROTO=LL128 ;;
    simple) echo NCCL_PROTO=Simple ;;
  esac
}
run() {  # name tree gpus batch variant [more flags]
  local name=$1 tree=$2 g=$3 b=$4 v=$5; shift 5
  local sw=($(switches "$v")) dir=$PWD
  [ -n "$MH" ] && sw+=(hetgmp.train.multi_hot.GPU_RANKS=1)
  # (an older tree has no such switch: one it has, at its default)
  [ "$tree" = new ] || { dir=$tree; sw=(hetgmp.embedding.padded.whole.TIGHT_PUSHES=1); }
  (cd "$dir" && env $(nccl_env "$v") PYTHONPATH=$dir${BASEPATH:+:$BASEPATH} timeout 170 $PY -m torch.distributed.run \
    --standalone --nproc_per_node "$g" "$OLDPWD/bench/gpu/switches.py" "${sw[@]}" -- \
    examples/hetuctr.py --dataset "$DS" --device "$DEVICE" --model wdl --batch_size "$b" \
    --embed_dim 128 --iter "$ITERS" --log_every "${LOG_EVERY:-10}" --no-progress "$@" \
    --output "$RES/$name.json" > "$RES/$name.log" 2>&1)
  echo "$name: exit $?"
}
NAMES=()
G0=${GPUS%% *}
for b in ${OLD:+${OLD_BATCHES:-8192}}; do
  run old_w1_$b "$OLD" 1 "$b" strict; run old_w${G0}_$b "$OLD" "$G0" "$b" strict $(card "$G0")
  NAMES+=(old_w1_$b old_w${G0}_$b)
done
for b in $BATCHES; do
  for r in $(seq 1 "${REPEAT:-1}"); do  # (REPEAT > 1: rounds of every run, tagged rN)
    R=; [ "${REPEAT:-1}" -gt 1 ] && R=r$r
    for v1 in ${W1V:-early}; do  # (W1V: the 1-GPU runs' variants; each but early named w1V)
      n1=w1${R}_$b; [ "$v1" = early ] || n1=w1${v1}${R}_$b
      run "$n1" new 1 "$b" "$v1"; NAMES+=("$n1")
    done
    if [ "${PAIR:-0}" = 1 ]; then  # (two 1-GPU jobs at once, one per GPU: the machine's share)
      CUDA_VISIBLE_DEVICES=0 run pair0_$b new 1 "$b" early & CUDA_VISIBLE_DEVICES=1 run pair1_$b new 1 "$b" early &
      wait; NAMES+=(pair0_$b pair1_$b)
    fi
    for g in $GPUS; do
      for v in ${VARIANTS:-strict early ahead}; do
        run w${g}${v}${R}_$b new "$g" "$b" "$v" $(card "$g") $(vflags "$v"); NAMES+=(w${g}${v}${R}_$b)
      done
    done
  done
done
B0=${BATCHES%% *}
[ "${BOUND0:-1}" = 1 ] && for g in $GPUS; do
  run w${g}bound0_$B0 new "$g" "$B0" early $(card "$g" 0); NAMES+=(w${g}bound0_$B0)
done
$PY - "$RES" "${NAMES[@]}" <<'PY'
import json, platform, re, statistics, subprocess, sys, time
from pathlib import Path
res, names = Path(sys.argv[1]), sys.argv[2:]
rows, base, rounds = [], {}, {}
for name in names:
    try:
        d = json.loads((res / f"{name}.json").read_text())
    except (OSError, ValueError):
        rows.append(f"| {name} | failed | | | | | | | |")
        continue
    speed = d.get("speed") or 0.0
    group = name.split("_", 1)[0].startswith("old") and "old" or "new"
    key = (group, name.rsplit("_", 1)[-1])
    if "w1" in name:
        base[key] = speed
    ref = base.get(key) or 0.0
    bps = d.get("embedding_train", {}).get("bytes_per_sample", 0)
    # (between epoch starts: the median TRAIN interval after the first that holds no epoch
    # start -- its epoch is the previous interval's -- since the epoch checks and graph
    # captures make the run's mean noisy, and with short epochs many intervals hold one)
    lines = [x for x in (res / f"{name}.log").read_text().splitlines() if x.startswith("TRAIN ")]
    ep = [x.rsplit(" epoch ", 1)[-1].split()[0] if " epoch " in x else "" for x in lines]
    tl = [float(x.split(" speed ")[1].split()[0]) for x in lines]
    # (no clean interval: no steady figure -- every interval's epoch start would taint it,
    # as a 2 x 65536 run with 25-step intervals once showed "1.16x" for a clean 1.80x)
    clean = [v for i, v in enumerate(tl) if i > 0 and ep[i] == ep[i - 1]]
    steady = statistics.median(clean) if clean else 0.0
    # (what an epoch start adds to its interval: its time less a clean interval's, median)
    tt = [float(x.split(" time ")[1].split()[0]) for x in lines]
    calm = [v for i, v in enumerate(tt) if i > 0 and ep[i] == ep[i - 1]]
    extra = [tt[i] - statistics.median(calm) for i in range(2, len(tt)) if ep[i] != ep[i - 1]]
    start_ms = f"{1e3 * statistics.median(extra):.0f}" if extra and calm else "n/a"
    if "w1" in name:
        base[key + ("steady",)] = steady
    sref = base.get(key + ("steady",)) or 0.0
    cols = (f"{steady / 1e6:.2f}M | {steady / sref if sref else 0:.2f}" if steady else
            "n/a: no interval without an epoch start (LOG_EVERY smaller, SAMPLES larger) | n/a")
    if steady and sref:  # (REPEAT: each round's ratio, for the medians below)
        rounds.setdefault((re.sub(r"r[0-9]+$", "", name.rsplit("_", 1)[0]), key[1]), []).append(
            steady / sref)
    rows.append(f"| {name} | {speed / 1e6:.2f}M | {speed / ref if ref else 0:.2f} | {cols} | "
                f"{d.get('val_auc', 0):.4f} | {bps:.0f} | {d.get('graph_replays_ahead', 0)} / "
                f"{d.get('graph_replays_planned_ahead', 0)} / "
                f"{d.get('graph_replays_exchanged_early', 0)} | {start_ms} |")
try:
    gpu = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout.strip()
except OSError:
    gpu = ""
head = [f"machine: {platform.node()} ({gpu or 'no GPU'}); date: {time.strftime('%Y-%m-%d %H:%M')}",
        "command: bash bench/gpu/read_ahead_ab.sh (x 1 GPU: ratio to the same tree's 1-GPU run "
        "at the same batch)", "",
        "| run | samples/s (run) | x 1 GPU | samples/s (steady) | x 1 GPU | val AUC | B/sample "
        "| replays read / planned ahead / exchanged early | epoch start + ms |",
        "|---|---|---|---|---|---|---|---|---|"]
many = {k: v for k, v in rounds.items() if len(v) > 1}
if many:  # (REPEAT > 1: each run's steady ratio over the rounds, against its round's 1 GPU)
    rows += ["", "| run (rounds) | steady x 1 GPU: median | min | max |", "|---|---|---|---|"]
    rows += [f"| {n}_{b} ({len(v)}) | {statistics.median(v):.3f} | {min(v):.3f} | {max(v):.3f} |"
             for (n, b), v in many.items()]
text = "\n".join(head + rows)
(res / "summary.md").write_text(text + "\n")
print(text)
PY
