# The stages of bench/gpu/run8.sh (sourced by it: its variables and helpers are in scope).
# Each stage skips what is already done (data and plan files, ok records, sweep CSV rows), so
# a call cut by its budget is resumed by the next one.

R8=(bench/gpu/run8_report.py)
since() { tail -n "+$(($1 + 1))" "$LOGF"; }  # the log's lines after line $1
# done_ok KEY: whether KEY has a record with status ok (records are JSON lines, sorted keys)
done_ok() { grep -F "\"key\": \"$1\"" "$RECORDS" | grep -qF '"status": "ok"'; }

stage_gen() {
  if [ -f "$DS/meta.json" ]; then log "data: $DS (made before)"
  else
    local c; c=$(cap 560)
    if [ "$c" = 0 ]; then pending "generate $DS"; return; fi
    local workers=$(( $(nproc) < 16 ? $(nproc) : 16 ))
    log "generating $SAMPLES samples (scale $CARD_SCALE) into $DS"
    run_logged "$c" generate $PY -m hetgmp generate criteo-like --out "$DS.tmp" \
      --num-samples "$SAMPLES" --scale "$CARD_SCALE" --workers "$workers" --overwrite --no-progress
    [ "$RUN_RC" = 0 ] && mv "$DS.tmp" "$DS"
  fi
  if [ -f "$CW/workload.json" ]; then log "contenders' workload: $CW (made before)"; return; fi
  local c; c=$(cap 300)
  if [ "$c" = 0 ]; then pending "the contenders' workload"; return; fi
  run_logged "$c" "contenders' workload" $PY bench/gpu/cli.py prepare --dir "$CW" --world 1 \
    --samples "$CONT_SAMPLES" --card-scale "$CARD_SCALE" --threads "$(nproc)"
}

stage_plan() {
  if [ "$NR" -lt 2 ]; then log "plan: 1 rank, no plan (the 1-GPU run holds the whole table)"; return; fi
  if [ -f "$PLAN" ]; then log "plan: $PLAN (made before)"; return; fi
  [ -f "$DS/meta.json" ] || { log "plan: no data yet (STAGE=gen first)"; FAILED=$((FAILED + 1)); return; }
  local c; c=$(cap 560)
  if [ "$c" = 0 ]; then pending "partition -n $NR"; return; fi
  local tmp="${PLAN%.npz}.tmp.npz" n0; n0=$(wc -l < "$LOGF")
  log "partitioning for $NR ranks ($METHOD, $ROUNDS rounds, batch $B0)"
  run_logged "$c" partition $PY partition/partition.py -n "$NR" -o "$tmp" --data "$DS" \
    --method "$METHOD" --rounds "$ROUNDS" --batch-size "$B0" --threads "$(nproc)" --no-progress
  [ "$RUN_RC" = 0 ] && [ -f "$tmp" ] && mv "$tmp" "$PLAN"
  since "$n0" | grep -E "^partition (metis|hash|random)" | sed 's/^/    /'
}

# cli_run LAUNCHER RANKS PLACEMENT BATCH: one CLI run (placement whole | plan | hash), recorded.
cli_run() {
  local launcher=$1 n=$2 placement=$3 b=$4
  local key="hetgmp-cli|$launcher|$placement|g$n|b$b|$MODEL"
  if done_ok "$key"; then log "$key: done before"; return; fi
  local flags=() variant="whole table, default flags"
  case $placement in
    plan) flags=(--partition "$PLAN" --bound "$BOUND" --store_rate "$STORE_RATE")
          variant="$METHOD plan, store_rate $STORE_RATE, bound $BOUND" ;;
    hash) flags=(--bound "$BOUND" --store_rate "$STORE_RATE")
          variant="hash placement, store_rate $STORE_RATE, bound $BOUND" ;;
  esac
  local add=(--records "$RECORDS" --launcher "$launcher" --placement "$placement" --model "$MODEL"
             --batch "$b" --gpus "$n" --iters "$ITERS" --variant "$variant" --device "$DEVICE"
             --machine "$MACHINE")
  [ "$placement" = whole ] || add+=(--store-rate "$STORE_RATE" --bound "$BOUND")
  if [ "$launcher" = mpirun ] && [ -z "$MPIRUN" ]; then
    $PY "${R8[@]}" add-cli "${add[@]}" --status "skipped: no mpirun on this machine"
    log "$key: skipped (no mpirun)"; return
  fi
  if [ "$placement" = plan ] && [ ! -f "$PLAN" ]; then
    log "$key: no plan yet (STAGE=plan first)"; FAILED=$((FAILED + 1)); return
  fi
  local c; c=$(cap "$CLI_MAX_S")
  if [ "$c" = 0 ]; then pending "$key"; return; fi
  local pre=($PY -m torch.distributed.run --standalone --nproc_per_node "$n")
  [ "$launcher" = mpirun ] && pre=("$MPIRUN" -np "$n" "${MPI_FLAGS[@]}" "$PY_ABS")
  local out="$STATE/runs/cli_${launcher}_${placement}_g${n}_b$b.json" extra=()
  [ "$DEVICE" = cpu ] && extra=(--threads 1)
  rm -f "$out"
  local n0; n0=$(wc -l < "$LOGF")
  local cmd=("${pre[@]}" examples/hetuctr.py --dataset "$DS" --device "$DEVICE" --model "$MODEL"
             --batch_size "$b" --embed_dim "$EMBED_DIM" --iter "$ITERS" --warmup-steps "$WARMUP"
             --eval-batch-size "$EVAL_BATCH" --log_every 50 --no-progress "${flags[@]}"
             "${extra[@]}" --output "$out")
  run_logged "$c" "$key" "${cmd[@]}"
  $PY "${R8[@]}" add-cli "${add[@]}" --result "$out" --wall-s "$RUN_S" --rc "$RUN_RC" \
    --command "bash bench/gpu/run8.sh # ${cmd[*]}"
  since "$n0" | grep -E "^EVAL" | tail -n 1 | cut -c1-160 | sed 's/^/    /'
}

stage_train() {
  [ -f "$DS/meta.json" ] || { log "train: no data yet (STAGE=gen first)"; FAILED=$((FAILED + 1)); return; }
  for b in "${BATCH_LIST[@]}"; do
    cli_run torchrun 1 whole "$b"  # the CLI on 1 GPU: the baseline of the scaling
    if [ "$NR" -ge 2 ]; then
      cli_run torchrun "$NR" plan "$b"
      cli_run mpirun "$NR" plan "$b"
      [ "$b" = "$B0" ] && cli_run torchrun "$NR" hash "$b"  # bytes/sample against hash
    else
      cli_run mpirun 1 whole "$b"  # the mpirun launch path on the one GPU
    fi
  done
}

stage_contenders() {
  [ -f "$CW/workload.json" ] || { log "contenders: no workload yet (STAGE=gen first)"; FAILED=$((FAILED + 1)); return; }
  local todo=() b
  for b in "${BATCH_LIST[@]}"; do
    for name in rowwise tablewise; do
      if ! done_ok "$name|torchrun|g$NR|b$b|$MODEL"; then
        todo+=("$b"); break
      fi
    done
  done
  if [ ${#todo[@]} = 0 ]; then log "contenders: done before"; return; fi
  local c; c=$(cap 400)
  if [ "$c" = 0 ]; then pending "contenders at batch ${todo[*]}"; return; fi
  local out="$STATE/contenders" batches; batches=$(IFS=,; echo "${todo[*]}")
  local cmd=($PY -m torch.distributed.run --standalone --nproc_per_node "$NR" bench/gpu/cli.py run
             --device "$DEVICE" --workload "$CW" --out "$out" --contenders rowwise,tablewise
             --modes train --models "$MODEL" --batches "$batches" --precisions fp32
             --dim "$EMBED_DIM" --warmup 3 --steps "$CONT_STEPS" --profile-steps 2)
  run_logged "$c" "contenders rowwise,tablewise on $NR rank(s), batch $batches" "${cmd[@]}" \
    --command "bash bench/gpu/run8.sh # ${cmd[*]}"
  $PY "${R8[@]}" add-contenders --records "$RECORDS" --raw "$out/raw_w$NR.jsonl" \
    --device "$DEVICE" --command "bash bench/gpu/run8.sh # ${cmd[*]}"
}

stage_nccl() {
  local out="$STATE/alltoall.json"
  if [ -f "$out" ]; then log "all-to-all bandwidth: measured before ($out)"; return; fi
  local c; c=$(cap 200)
  if [ "$c" = 0 ]; then pending "all-to-all bandwidth"; return; fi
  local n0; n0=$(wc -l < "$LOGF")
  run_logged "$c" "all-to-all bandwidth on $NR rank(s)" $PY -m torch.distributed.run --standalone \
    --nproc_per_node "$NR" bench/gpu/alltoall_bw.py --device "$DEVICE" --sizes-mb "$A2A_SIZES_MB" \
    --out "$out"
  since "$n0" | sed -n '/^all-to-all,/,/^\[run8/p' | grep -v '^\[run8' | sed 's/^/    /'
}

# sweep NAME FLAGS...: one experiment of hetgmp.experiments (resumes from its CSV).
sweep() {
  local name=$1; shift
  local c; c=$(cap 580)
  if [ "$c" = 0 ]; then pending "the $name sweep"; return; fi
  local where=(--gpus "$NR")
  [ "$DEVICE" = cpu ] && where=(--ranks "$NR" --threads 1)
  local n0; n0=$(wc -l < "$LOGF")
  run_logged "$c" "$name sweep on $NR rank(s)" $PY -m hetgmp experiment "$name" --data "$DS" \
    --plan "$PLAN" --out "$STATE/sweeps" "${where[@]}" --batch-size "$B0" \
    --embed-dim "$EMBED_DIM" --iters "$SWEEP_ITERS" --model "$MODEL" --timeout-s "$c" \
    --no-progress "$@"
  [ "$RUN_RC" = 124 ] && { FAILED=$((FAILED - 1)); pending "the rest of the $name sweep"; }
  since "$n0" | grep -E "^(staleness|store_rate)-np|^FAILED" | cut -c1-150 | sed 's/^/    /'
}

stage_sweeps() {
  if [ "$NR" -lt 2 ]; then log "sweeps: skipped (1 rank: no remote rows, the bound has no effect)"; return; fi
  if [ -z "$MPIRUN" ]; then log "sweeps: skipped (no mpirun: hetgmp experiment launches with it)"; FAILED=$((FAILED + 1)); return; fi
  [ -f "$PLAN" ] || { log "sweeps: no plan yet (STAGE=plan first)"; FAILED=$((FAILED + 1)); return; }
  sweep staleness --bounds "$BOUNDS" --store-rate "$STORE_RATE" --eval-every "$EVAL_EVERY"
  sweep store-rate --store-rates "$STORE_RATES" --bound "$BOUND"
}

stage_report() {
  local iters_text="one epoch"
  [ "$ITERS" = 0 ] || iters_text="$ITERS steps"
  local settings
  settings=$(printf '{"dataset": "%s", "method": "%s", "rounds": %s, "plan_batch": %s, "model": "%s", "embed_dim": %s, "batches": "%s", "iters": %s, "iters_text": "%s", "warmup": %s, "store_rate": %s, "bound": %s, "bounds": "%s", "store_rates": "%s", "sweep_iters": %s, "eval_every": %s, "contender_samples": %s, "contender_steps": %s, "smoke": %s, "work": "%s", "commit": "%s"}' \
    "$DS" "$METHOD" "$ROUNDS" "$B0" "$MODEL" "$EMBED_DIM" "${BATCH_LIST[*]}" "$ITERS" "$iters_text" \
    "$WARMUP" "$STORE_RATE" "$BOUND" "$BOUNDS" "$STORE_RATES" "$SWEEP_ITERS" "$EVAL_EVERY" \
    "$CONT_SAMPLES" "$CONT_STEPS" "$SMOKE" "$STATE" "$COMMIT")
  local ds=()
  [ -f "$DS/meta.json" ] && ds=(--dataset "$DS")
  $PY "${R8[@]}" report --work "$STATE" --out "$RES" "${ds[@]}" --ranks "$NR" \
    --device "$DEVICE" --machine "$MACHINE" --settings "$settings" 2>&1 | tee -a "$LOGF"
  [ "${PIPESTATUS[0]}" = 0 ] || FAILED=$((FAILED + 1))
}
