#!/usr/bin/env bash
# Issue 15 item 4: why WDL with SGD reached lower AUC than a plain-PyTorch WDL. Runs the hetgmp
# CLI and an independent plain WDL (plain_wdl.py) on movielens-100k, batch 1024, 3 epochs, dim 16,
# SGD lr 0.1, seeds 0-2, changing one thing at a time; prints mean AUCs (results: results.md).
#   bash bench/sgd_quality/run.sh        # from the repo root; ~25 min on 2 cores
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
WORK=${WORK:-/tmp/hetgmp-sgd-quality}
mkdir -p "$WORK/runs"
[ -f "$WORK/ml/meta.json" ] || $PY -m hetgmp preprocess movielens ../shared/datasets/movielens-100k --out "$WORK/ml"
het() { local name=$1 seed=$2; shift 2; local out="$WORK/runs/het_${name}_s$seed.json"
  [ -f "$out" ] || OMP_NUM_THREADS=1 $PY examples/hetuctr.py --dataset "$WORK/ml" --model wdl \
    --batch_size 1024 --epochs 3 --embed_dim 16 --seed "$seed" --no-progress --threads 1 \
    --output "$out" "$@" > "$WORK/runs/het_${name}_s$seed.log" 2>&1; }
plain() { local name=$1 seed=$2; shift 2; local out="$WORK/runs/plain_${name}_s$seed.json"
  [ -f "$out" ] || OMP_NUM_THREADS=1 $PY -W ignore bench/sgd_quality/plain_wdl.py --data "$WORK/ml" \
    --seed "$seed" --out "$out" "$@" > /dev/null; }
SGD=(--optimizer sgd --dense-optimizer sgd --lr 0.1)
for s in 0 1 2; do
  het sgd $s "${SGD[@]}"; het sgd_init1.732 $s "${SGD[@]}" --init-scale 1.7320508
  het sgd_rowlr10 $s --optimizer sgd --dense-optimizer sgd --lr 10 --dense-lr 0.1
  plain base $s; plain unif0.01 $s --init uniform --scale 0.01
  plain unif1.732 $s --init uniform --scale 1.7320508; plain fusedwide $s --wide fused
  plain nowide $s --wide none
done
het default 0; het default_init1.732 0 --init-scale 1.7320508
$PY - "$WORK/runs" <<'PYEOF'
import json, pathlib, statistics, sys
runs = {}
for p in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    r = json.loads(p.read_text()); name = p.stem.rsplit("_s", 1)[0]
    runs.setdefault(name, []).append(r.get("val_auc", r.get("auc")))
for name, v in runs.items():
    print(f"{name:28s} n={len(v)} mean={statistics.mean(v):.4f} {[round(x, 4) for x in v]}")
PYEOF
