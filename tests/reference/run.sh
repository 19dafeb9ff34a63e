#!/usr/bin/env bash
# make test-parity: Ember writes TransformerLM cases (write_case.lua), PyTorch
# checks them (parity.py). CPU cases always; CUDA cases when a GPU is there.
# Needs python3 with torch and numpy (the GPU host has them). Prints
# "N passed, N failed" last; exits non-zero on any failure.
#   EMBER_BUILD  build directory (default build)
#   PARITY_OUT   where the cases go (default: a fresh temporary directory)
#   PYTHON       python with torch (default python3)
set -u
cd "$(dirname "$0")/../.."
build=${EMBER_BUILD:-build}
py=${PYTHON:-python3}
out=${PARITY_OUT:-$(mktemp -d)}
if ! "$py" -c "import torch, numpy" 2>/dev/null; then
  echo "test-parity: $py has no torch/numpy; run this where PyTorch is installed"
  echo "0 passed, 1 failed"
  exit 1
fi
ember=("$build/ember" run tests/reference/write_case.lua)
cases=() write_failed=0

case_() {   # case_ NAME write_case-args...
  local name=$1; shift
  if "${ember[@]}" --out "$out/$name" "$@"; then cases+=("$out/$name")
  else echo "FAIL $name: write_case.lua failed"; write_failed=$((write_failed + 1)); fi
}

case_ cpu-fp32-naive --device cpu
case_ cpu-bf16-naive --device cpu --precision bf16
if "$build/ember" -e 'os.exit(ember.cuda.is_available() and 0 or 1)'; then
  case_ cuda-fp32-naive --device cuda
  case_ cuda-bf16-naive --device cuda --precision bf16
  # the flash kernels run on CUDA in bf16/f16 (f32 under autocast) only
  case_ cuda-bf16-flash --device cuda --precision bf16 --attn flash
else
  echo "test-parity: no CUDA device here, CPU cases only"
fi

"$py" tests/reference/parity.py "${cases[@]}" | tee "$out/parity.log"
rc=${PIPESTATUS[0]}
line=$(tail -1 "$out/parity.log")
p=$(echo "$line" | sed -nE 's/^([0-9]+) passed, ([0-9]+) failed$/\1/p')
f=$(echo "$line" | sed -nE 's/^([0-9]+) passed, ([0-9]+) failed$/\2/p')
if [ -z "$p" ]; then p=0; f=1; fi
if [ "$write_failed" -gt 0 ]; then
  echo "write_case failures: $write_failed (counted below)"
  echo "$p passed, $((f + write_failed)) failed"
  exit 1
fi
exit "$rc"
