#!/usr/bin/env bash
# session-3 run 3: GPU specs + the studies for docs/results.md
set -u
export OUT=${OUT:-out}; mkdir -p $OUT/r
sh .deps/install.sh .deps /opt/deps >/dev/null && . /opt/deps/env.sh
cmake -S . -B /tmp/b -G Ninja -DEMBER_CUDA=ON >$OUT/build.log 2>&1 && cmake --build /tmp/b -j16 >>$OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
E=/tmp/b/ember
t() { local t0=$(date +%s); timeout "$@"; local rc=$?; echo "rc=$rc $(( $(date +%s)-t0 ))s :: ${*:2:4}"; }
t 300 make test-gpu BUILD=/tmp/b >$OUT/test-gpu.log 2>&1; tail -1 $OUT/test-gpu.log; grep -E "Failure →|Error →" -A6 $OUT/test-gpu.log | head -50
t 60 $E run scripts/mixed_precision.lua --device cuda --json $OUT/r/mixed_precision.jsonl --markdown $OUT/r/mixed_precision.md > $OUT/r/mixed_precision.log 2>&1
t 200 $E run scripts/memory_profile.lua --json $OUT/r/memory_profile.jsonl --markdown $OUT/r/memory_profile.md > $OUT/r/memory_profile.log 2>&1
tail -30 $OUT/r/memory_profile.log
t 240 $E run scripts/bench_attention.lua --json $OUT/r/attention.jsonl --markdown $OUT/r/attention.md > $OUT/r/attention.log 2>&1
tail -40 $OUT/r/attention.log
t 150 $E sweep scripts/campaigns/warmup.lua --out $OUT/r/sweeps/warmup > $OUT/r/warmup.log 2>&1
tail -25 $OUT/r/sweeps/warmup/results.md
