#!/usr/bin/env bash
# The multi-GPU whole-step graph's switches, A/B in one call on a 2-GPU machine (<= 6 minutes):
# the user's command (WDL dim 128, the card's flags: metis+refine plan, --store_rate 0.01
# --bound 100) on 1 GPU, then on 2 GPUs with each switch that is off until measured
# (hetgmp.embedding.padded.owner_update.FUSED_OWNER_UPDATE, hetgmp.embedding.padded.whole.TIGHT_PUSHES),
# then the default 2-GPU run's GPU time per step, kernel by kernel (bench/gpu/profile_steps.py).
#
#   bash bench/gpu/whole_step_ab.sh        # results in ${OUT:-bench/results}/gpu/whole_step_ab
#
# Knobs: BATCH (8192), ITERS (150), SAMPLES (3.3M), SCALE (1: 33.8M rows), WORK (/tmp/hetgmp-ab),
# PYTHON (python3), DEVICE (cuda; cpu: a smoke test on 2 gloo ranks).
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}; BATCH=${BATCH:-8192}; ITERS=${ITERS:-150}; SAMPLES=${SAMPLES:-3300000}
SCALE=${SCALE:-1}; DEVICE=${DEVICE:-cuda}
WORK=${WORK:-/tmp/hetgmp-ab}; RES="${OUT:-bench/results}/gpu/whole_step_ab"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
mkdir -p "$RES" "$WORK"
source bench/gpu/card_data.sh; card_data "$WORK" "$SAMPLES" "$SCALE" "$BATCH" "$RES" || exit 1
CLI=(--dataset "$DS" --device "$DEVICE" --model wdl --batch_size "$BATCH" --embed_dim 128
     --iter "$ITERS" --log_every 50 --no-progress)
CARD=(--partition "$PLAN" --store_rate 0.01 --bound 100)
SW=(hetgmp.embedding.padded.owner_update.FUSED_OWNER_UPDATE hetgmp.embedding.padded.whole.TIGHT_PUSHES)
run() {  # name gpus switch-values(2 digits) [more flags]
  local name=$1 g=$2 s=$3; shift 3
  timeout 150 $PY -m torch.distributed.run --standalone --nproc_per_node "$g" \
    bench/gpu/switches.py "${SW[0]}=${s:0:1}" "${SW[1]}=${s:1:1}" -- examples/hetuctr.py \
    "${CLI[@]}" "$@" --output "$RES/$name.json" > "$RES/$name.log" 2>&1
  echo "$name: exit $?"
}
run w1 1 00
run w2 2 00 "${CARD[@]}"
run w2_owner 2 10 "${CARD[@]}"
run w2_tight 2 01 "${CARD[@]}"
run w2_both 2 11 "${CARD[@]}"
timeout 150 $PY -m torch.distributed.run --standalone --nproc_per_node 2 bench/gpu/profile_steps.py \
  --out "$RES/profile_w2_RANK.txt" --skip 40 --steps 20 -- "${CLI[@]}" "${CARD[@]}" \
  > "$RES/profile.log" 2>&1; echo "profile: exit $?"
$PY - "$RES" <<'PY'
import json, sys
from pathlib import Path
res = Path(sys.argv[1])
rows, base = [], None
for name in ("w1", "w2", "w2_owner", "w2_tight", "w2_both"):
    try:
        d = json.loads((res / f"{name}.json").read_text())
    except (OSError, ValueError):
        rows.append(f"| {name} | failed | | | | |")
        continue
    speed = d.get("speed") or 0.0  # (None: every step was a warm-up step)
    base = speed if name == "w1" else base
    c = d.get("embedding_train_counters", {})
    ratio = speed / base if base else 0.0
    rows.append(f"| {name} | {speed / 1e6:.2f}M | {ratio:.2f} | "
                f"{d.get('val_auc', 0):.4f} | {d.get('embedding_train', {}).get('bytes_per_sample', 0):.0f} | "
                f"{int(c.get('pushes_capacity_deferred', 0))} |")
head = ["| run | samples/s | x 1 GPU | val AUC | B/sample | pushes waited |", "|---|---|---|---|---|---|"]
text = "\n".join(head + rows)
(res / "summary.md").write_text(text + "\n")
print(text)
PY
