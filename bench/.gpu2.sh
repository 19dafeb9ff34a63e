#!/usr/bin/env bash
set -u
export OUT=${OUT:-out}; mkdir -p $OUT
sh .deps/install.sh .deps /opt/deps >/dev/null && . /opt/deps/env.sh
cmake -S . -B /tmp/b -G Ninja -DEMBER_CUDA=ON >$OUT/build.log 2>&1 && cmake --build /tmp/b -j16 >>$OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
export LUA_PATH="/tmp/b/lua/?.lua;/tmp/b/lua/?/init.lua;${LUA_PATH_5_4:-;}" LUA_CPATH="/tmp/b/lua/?.so;${LUA_CPATH_5_4:-;}"
export LUA_PATH_5_4="$LUA_PATH" LUA_CPATH_5_4="$LUA_CPATH"
timeout 200 /tmp/b/ember run $(command -v busted) -o TAP tests/gpu/norm_spec.lua tests/gpu/rope_spec.lua tests/gpu/amp_spec.lua tests/gpu/lm_spec.lua tests/gpu/op_cases_spec.lua > $OUT/specs.log 2>&1; echo "specs rc=$?"; grep -E "^not ok" -A8 $OUT/specs.log | head -40; grep -c "^ok" $OUT/specs.log
B=/tmp/b; json=$OUT/results.jsonl
eb() { timeout $1 $B/ember run scripts/bench_model.lua --json $json "${@:2}" > $OUT/tmp.log 2>&1; grep -E "^(time|peak)" $OUT/tmp.log; cat $OUT/tmp.log >> $OUT/bench.log; }
eb 40 --model small --precision bf16 --mode train --graph --quiet
eb 40 --model small --precision bf16 --mode train --graph --quiet
timeout 200 ncu --metrics gpu__time_duration.sum --csv --print-units base --log-file $OUT/ncu.csv /tmp/b/ember run scripts/bench_model.lua --model small --precision bf16 --mode train --warmup 1 --steps 2 --quiet > $OUT/ncu_run.log 2>&1; echo ncu rc=$?
