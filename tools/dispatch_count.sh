#!/bin/bash
# Instructions per tiny op, exactly: run bench_dispatch's ops N1 and N2 times
# (after a warm-up and a full collection, ending with one, so the GC's share
# of each op is counted) under a counter and divide the difference. The
# counter is callgrind (any machine) or `perf stat -e instructions` (COUNTER=perf:
# includes libcuda's and the kernel's instructions, so on the GPU host it
# shows what a launch costs beside Ember's own path).
#   tools/dispatch_count.sh [build/ember] [cpu|cuda] [ops...]
#   COUNTER=perf tools/dispatch_count.sh build/ember cuda add mulw fill
# ops: add (a + b), iadd (a:add_(b)), mulw (a * w, w requires grad),
# empty (ember.empty(1)), fill (a:fill_(1)). Prints "op instructions/op".
set -euo pipefail
EMBER=${1:-build/ember}; DEV=${2:-cpu}; shift $(( $# < 2 ? $# : 2 ))
OPS=${*:-add iadd mulw empty fill}
N1=${N1:-10000}; N2=${N2:-60000}; COUNTER=${COUNTER:-callgrind}
case "$COUNTER" in callgrind|perf) ;; *) echo "COUNTER must be callgrind or perf, got '$COUNTER'" >&2; exit 2;; esac
LUA=$(mktemp --suffix=.lua); trap 'rm -f "$LUA"' EXIT
cat > "$LUA" <<'EOF'
local ember = require "ember"
local op, n, dev = arg[1], tonumber(arg[2]), arg[3]
local a, b = ember.ones(1, {device = dev}), ember.ones(1, {device = dev})
local w = ember.ones(1, {requires_grad = true, device = dev})
local function run(k)
  if op == "add" then for _ = 1, k do local _ = a + b end
  elseif op == "iadd" then for _ = 1, k do a:add_(b) end
  elseif op == "mulw" then for _ = 1, k do local _ = a * w end
  elseif op == "empty" then for _ = 1, k do local _ = ember.empty(1, {device = dev}) end
  elseif op == "fill" then for _ = 1, k do a:fill_(1) end
  else error("unknown op '" .. tostring(op) .. "' (expected add, iadd, mulw, empty or fill)") end
  if dev == "cuda" then ember.cuda.synchronize() end
end
run(40000)          -- warm: allocator bins and magazines, the collector's pace
collectgarbage()
run(n)
collectgarbage()
EOF
count() {
  if [ "$COUNTER" = perf ]; then
    perf stat -x, -e instructions -- "$EMBER" run "$LUA" "$1" "$2" "$DEV" 2>&1 >/dev/null | awk -F, '/instructions/ {print $1}'
  else
    valgrind --tool=callgrind --callgrind-out-file=/dev/null "$EMBER" run "$LUA" "$1" "$2" "$DEV" 2>&1 |
      sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
  fi
}
for op in $OPS; do
  i1=$(count "$op" "$N1"); i2=$(count "$op" "$N2")
  if ! [[ "$i1" =~ ^[0-9]+$ && "$i2" =~ ^[0-9]+$ ]]; then
    echo "dispatch_count.sh: $COUNTER gave no instruction count for $op (got '$i1', '$i2')" >&2; exit 1
  fi
  echo "$op $(( (i2 - i1) / (N2 - N1) ))"
done
