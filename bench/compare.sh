#!/usr/bin/env bash
# Ember against PyTorch on the same GPU, one Markdown table.
#   bash bench/compare.sh [MODEL ...]            (default: small)
#   MODE=train PRECISION=bf16 VARIANTS="ember ember-graph torch-compile" bash bench/compare.sh small xl
# Runs scripts/bench_model.lua and bench/pytorch_baseline.py with the same
# flags for each model and variant, appends their JSON lines to $JSON, then
# prints the table (bench/table.py). A variant that fails or runs out of
# memory is a row saying so; the next one still runs.
#   EMBER_BUILD  build directory (default build)
#   MODE         fwd | fwd_bwd | train (default train)
#   PRECISION    fp32 | bf16 (default bf16)
#   CONTEXT, BATCH, WARMUP, STEPS   (defaults 512, 4, 5, 10)
#   VARIANTS     any of: ember ember-graph ember-naive torch-sdpa torch-naive
#                torch-compile torch-graph (default: ember ember-graph
#                torch-sdpa torch-naive torch-compile)
#   JSON         results file (default out/bench-results.jsonl; out/ is git-ignored)
#   EXTRA        more flags for both scripts (e.g. "--optimizer forloop" is torch-only)
set -u
cd "$(dirname "$0")/.."
build=${EMBER_BUILD:-build}
py=${PYTHON:-python3}
json=${JSON:-out/bench-results.jsonl}
mkdir -p "$(dirname "$json")"
models=("$@"); [ ${#models[@]} -eq 0 ] && models=(small)
variants=${VARIANTS:-"ember ember-graph torch-sdpa torch-naive torch-compile"}
common=(--mode "${MODE:-train}" --precision "${PRECISION:-bf16}" --context "${CONTEXT:-512}"
        --batch "${BATCH:-4}" --warmup "${WARMUP:-5}" --steps "${STEPS:-10}" --quiet --json "$json")
start=$(wc -l <"$json" 2>/dev/null || echo 0)

for m in "${models[@]}"; do
  for v in $variants; do
    echo "== $m $v"
    case $v in
      ember)         "$build/ember" run scripts/bench_model.lua --model "$m" "${common[@]}" ${EXTRA:-} ;;
      ember-graph)   "$build/ember" run scripts/bench_model.lua --model "$m" --graph "${common[@]}" ${EXTRA:-} ;;
      ember-naive)   "$build/ember" run scripts/bench_model.lua --model "$m" --attn naive "${common[@]}" ${EXTRA:-} ;;
      torch-sdpa)    "$py" bench/pytorch_baseline.py --model "$m" --attn sdpa "${common[@]}" ${EXTRA:-} ;;
      torch-naive)   "$py" bench/pytorch_baseline.py --model "$m" --attn naive "${common[@]}" ${EXTRA:-} ;;
      torch-compile) "$py" bench/pytorch_baseline.py --model "$m" --attn sdpa --compile "${common[@]}" ${EXTRA:-} ;;
      torch-graph)   "$py" bench/pytorch_baseline.py --model "$m" --attn sdpa --graph "${common[@]}" ${EXTRA:-} ;;
      *) echo "compare.sh: unknown variant $v"; exit 2 ;;
    esac || echo "compare.sh: $m $v exited with status $?"
  done
done

echo
tail -n +"$((start + 1))" "$json" | "$py" bench/table.py
