sh .deps/install.sh .deps /opt/deps >/dev/null && . /opt/deps/env.sh
cmake -S . -B /tmp/b -G Ninja -DEMBER_CUDA=ON > $OUT/build.log 2>&1 && cmake --build /tmp/b -j16 >> $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
E=/tmp/b/ember; BU=$(command -v busted)
timeout 200 $E run $BU -o utfTerminal tests/gpu/flash_spec.lua tests/gpu/lm_spec.lua tests/gpu/rope_spec.lua tests/gpu/norm_spec.lua tests/gpu/elementwise_spec.lua > $OUT/specs.log 2>&1; echo "specs rc=$?"; grep -E "successes|Failure|Error →" -A4 $OUT/specs.log | head -30
bm() { timeout 60 $E run scripts/bench_model.lua --json $OUT/r.jsonl "$@" 2>&1 | grep -E "^(config|time|peak|breakdown|bench|warm|step)" ; }
bm --model small --precision bf16 --graph --quiet
bm --model small --precision bf16 --breakdown --quiet
bm --model 2.7b --precision bf16 --warmup 2 --steps 2 --breakdown
bm --model xl --precision bf16 --graph --quiet
M="--metrics gpu__time_duration.sum --csv --print-units base"
timeout 200 ncu $M --log-file $OUT/ncu_small.csv $E run scripts/bench_model.lua --model small --precision bf16 --mode train --warmup 1 --steps 1 > $OUT/ncu_small.log 2>&1; echo ncu rc=$?
