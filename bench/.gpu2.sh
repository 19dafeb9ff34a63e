sh .deps/install.sh .deps /opt/deps >/dev/null && . /opt/deps/env.sh
cmake -S . -B /tmp/b -G Ninja -DEMBER_CUDA=ON > $OUT/build.log 2>&1 && cmake --build /tmp/b -j16 >> $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
E=/tmp/b/ember; BU=$(command -v busted)
timeout 120 $E run $BU -o utfTerminal tests/gpu/flash_spec.lua > $OUT/flash_spec.log 2>&1; echo "flash rc=$?"; grep -E "successes|Failure|Error|expected|got" $OUT/flash_spec.log | head -20
bm() { timeout 60 $E run scripts/bench_model.lua --json $OUT/r.jsonl --quiet "$@" 2>&1 | grep -E "^(config|time|peak|breakdown|bench)" ; }
bm --model 2.7b --precision bf16 --warmup 1 --steps 2 --breakdown
bm --model xl --precision bf16 --breakdown
M="--metrics gpu__time_duration.sum --csv --print-units base"
timeout 200 ncu $M --log-file $OUT/ncu_small.csv $E run scripts/bench_model.lua --model small --precision bf16 --mode train --warmup 1 --steps 1 > $OUT/ncu_small.log 2>&1; echo ncu rc=$?
timeout 250 make test-gpu BUILD=/tmp/b > $OUT/test_gpu.log 2>&1; echo "test-gpu rc=$?"; tail -3 $OUT/test_gpu.log; grep -E "Failure →|Error →" -A3 $OUT/test_gpu.log | head -40
