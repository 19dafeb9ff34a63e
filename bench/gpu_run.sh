#!/usr/bin/env bash
# One GPU-host session for the integration checks and the Ember-vs-PyTorch
# numbers, fitted to a short lease: build once, then each item under its own
# timeout (a slow item cannot starve the rest), logs and JSON lines into $OUT.
#   bash bench/gpu_run.sh check     specs (amp, lm), parity, small: Ember eager/graph, PyTorch eager/compile
#   bash bench/gpu_run.sh final     small, xl, 2.7b (memory): Ember eager/graph, PyTorch eager/graph/compile
# Assumes the carried Debian packages in .deps (see bench/README.md).
# DEADLINE (epoch seconds) shortens the last items so the table still prints.
set -u
phase=${1:-check}
out=${OUT:-out}
mkdir -p "$out"
B=${EMBER_BUILD:-/tmp/b}
json="$out/results.jsonl"
log() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$out/summary.txt"; }

if [ ! -x "$B/ember" ]; then
  sh .deps/install.sh .deps /opt/deps >/dev/null && . /opt/deps/env.sh
  t0=$(date +%s)
  cmake -S . -B "$B" -G Ninja -DEMBER_CUDA=ON >"$out/build.log" 2>&1 &&
    cmake --build "$B" -j 16 >>"$out/build.log" 2>&1
  rc=$?
  log "build rc=$rc in $(( $(date +%s) - t0 )) s"
  [ $rc -eq 0 ] || { tail -30 "$out/build.log"; exit 1; }
fi
. /opt/deps/env.sh 2>/dev/null || true
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$out/summary.txt"
busted_bin=$(command -v busted)

deadline=${DEADLINE:-$(( $(date +%s) + 100000 ))}   # epoch seconds: leave time for the table
item() {   # item SECONDS LOGNAME cmd...
  local secs=$1 name=$2; shift 2
  local t0; t0=$(date +%s)
  local left=$(( deadline - t0 - 8 ))
  if [ "$left" -lt 5 ]; then log "$name: skipped (lease deadline) :: $*"; return 124; fi
  [ "$secs" -gt "$left" ] && secs=$left
  timeout "$secs" "$@" >>"$out/$name" 2>&1
  local rc=$?
  log "$name: rc=$rc $(( $(date +%s) - t0 ))s :: $*"
  return $rc
}
ember_bench() { item "$1" bench.log "$B/ember" run scripts/bench_model.lua --json "$json" "${@:2}"; }
torch_bench() { item "$1" bench.log python3 bench/pytorch_baseline.py --json "$json" "${@:2}"; }

if [ "$phase" = check ]; then
  item 90 specs.log "$B/ember" run "$busted_bin" -o utfTerminal tests/gpu/amp_spec.lua tests/gpu/lm_spec.lua
  grep -E "success|Failure ->|Error ->" "$out/specs.log" | head -20 | tee -a "$out/summary.txt"
  item 60 parity.log env EMBER_BUILD="$B" PARITY_OUT=/tmp/parity bash tests/reference/run.sh
  grep -vE "^PASS" "$out/parity.log" | tail -12 | tee -a "$out/summary.txt"
  ember_bench 40 --model small --precision bf16 --mode train
  ember_bench 40 --model small --precision bf16 --mode train --graph
  torch_bench 40 --model small --precision bf16 --mode train
  torch_bench 120 --model small --precision bf16 --mode train --compile
else
  # (specs, memcheck and parity run before this: make test-gpu, test-gpu-memcheck, test-parity)
  # small: Ember eager (phases) / graph / graph with naive attention / forward; PyTorch eager, graph, compile
  ember_bench 40 --model small --precision bf16 --mode train --breakdown
  ember_bench 40 --model small --precision bf16 --mode train --graph
  ember_bench 40 --model small --precision bf16 --mode train --graph --attn naive
  ember_bench 30 --model small --precision bf16 --mode fwd --breakdown
  torch_bench 40 --model small --precision bf16 --mode train --breakdown
  torch_bench 40 --model small --precision bf16 --mode train --graph
  torch_bench 120 --model small --precision bf16 --mode train --compile
  # xl
  ember_bench 60 --model xl --precision bf16 --mode train --breakdown
  ember_bench 60 --model xl --precision bf16 --mode train --graph
  torch_bench 60 --model xl --precision bf16 --mode train
  # 2.7b: memory (two warm-up steps: AdamW state exists before the timed steps)
  ember_bench 60 --model 2.7b --precision bf16 --mode train --warmup 2 --steps 2 --breakdown
  torch_bench 60 --model 2.7b --precision bf16 --mode train --warmup 2 --steps 2 --optimizer forloop --breakdown
  torch_bench 170 --model xl --precision bf16 --mode train --compile
fi
grep -E "^(time|peak memory|result|config):" "$out/bench.log" | tee -a "$out/summary.txt" >/dev/null
python3 bench/table.py "$json" | tee "$out/table.md"
