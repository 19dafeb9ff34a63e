sh .deps/install.sh .deps /opt/deps >/dev/null && . /opt/deps/env.sh
cmake -S . -B /tmp/b -G Ninja -DEMBER_CUDA=ON > $OUT/build.log 2>&1 && cmake --build /tmp/b -j16 >> $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
E=/tmp/b/ember; BU=$(command -v busted)
timeout 120 $E run $BU -o utfTerminal tests/gpu/flash_spec.lua > $OUT/flash_spec.log 2>&1; echo "flash rc=$?"; tail -30 $OUT/flash_spec.log | grep -vE "^\s*$" | tail -25
bm() { timeout 60 $E run scripts/bench_model.lua --json $OUT/r.jsonl --quiet "$@" 2>&1 | grep -E "^(config|time|peak|breakdown|MFU|bench)" ; }
bm --model small --precision bf16 --breakdown
bm --model small --precision bf16 --graph
bm --model small --precision bf16 --graph --attn naive
bm --model xl --precision bf16 --graph
bm --model xl --precision bf16 --breakdown
bm --model 2.7b --precision bf16 --warmup 1 --steps 2 --breakdown
