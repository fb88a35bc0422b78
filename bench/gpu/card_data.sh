# Sourced by the GPU benchmark scripts: the generated data set and its 2-part plan they share,
# and the command line of their timed runs.
#   card_data WORK SAMPLES SCALE BATCH RES   # sets DS and PLAN (made once, kept in WORK)
#   card_cli                                 # sets ITER and CLI from DS, BATCH, SKIP, STEPS
# A generated criteo-like set of SAMPLES samples at SCALE (1: 33.8M rows) and a metis+refine
# plan for 2 parts at BATCH (refine alone where pymetis is missing); logs into RES. Returns 1
# (the caller exits) when either step fails. Needs PY (the Python to run).
card_data() {
  local work=$1 samples=$2 scale=$3 batch=$4 res=$5 method=metis+refine
  DS=$work/ds-$samples-s$scale; PLAN=$work/part2-$samples-s$scale-b$batch.npz
  [ -f "$DS/meta.json" ] || $PY -m hetgmp generate criteo-like --out "$DS" \
    --num-samples "$samples" --scale "$scale" --workers 16 --overwrite --no-progress \
    > "$res/generate.log" 2>&1 || return 1
  $PY -c "import pymetis" 2> /dev/null || method=refine
  [ -f "$PLAN" ] || $PY -m hetgmp partition -n 2 --data "$DS" -o "$PLAN" --method $method \
    --rounds 2 --batch-size "$batch" --no-progress > "$res/partition.log" 2>&1 || return 1
}

# The user's command (WDL dim 128) on DS at BATCH for SKIP + STEPS read steps and 20 more: ITER
# and the CLI array (the card's flags are the caller's: 2 GPUs only).
card_cli() {
  ITER=$((SKIP + STEPS + 20))
  CLI=(--dataset "$DS" --device cuda --model wdl --batch_size "$BATCH" --embed_dim 128
       --iter "$ITER" --log_every 50 --no-progress)
}
