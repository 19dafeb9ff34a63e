#!/usr/bin/env bash
# session-3 run 1: build, GPU specs, parity, small/xl/2.7b Ember + PyTorch eager/graph
set -u
export OUT=${OUT:-out}; mkdir -p $OUT
sh .deps/install.sh .deps /opt/deps >/dev/null && . /opt/deps/env.sh
t0=$(date +%s)
cmake -S . -B /tmp/b -G Ninja -DEMBER_CUDA=ON >$OUT/build.log 2>&1 && cmake --build /tmp/b -j16 >>$OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "build $(( $(date +%s)-t0 ))s"
timeout 240 make test-gpu BUILD=/tmp/b >$OUT/test-gpu.log 2>&1; echo "test-gpu rc=$?"; tail -1 $OUT/test-gpu.log
grep -E "Failure ->|Error ->" -A6 $OUT/test-gpu.log | head -60
timeout 120 make test-parity BUILD=/tmp/b >$OUT/parity.log 2>&1; echo "parity rc=$?"; tail -2 $OUT/parity.log
B=/tmp/b; json=$OUT/results.jsonl
eb() { timeout $1 $B/ember run scripts/bench_model.lua --json $json "${@:2}" > $OUT/tmp.log 2>&1; grep -E "^(config|time|peak)" $OUT/tmp.log; cat $OUT/tmp.log >> $OUT/bench.log; }
tb() { timeout $1 python3 bench/pytorch_baseline.py --json $json "${@:2}" > $OUT/tmp.log 2>&1; grep -E "^(config|time|peak)" $OUT/tmp.log; cat $OUT/tmp.log >> $OUT/bench.log; }
eb 40 --model small --precision bf16 --mode train --graph --quiet
eb 40 --model small --precision bf16 --mode train --graph --quiet
eb 40 --model small --precision bf16 --mode train --breakdown --quiet
timeout 200 ncu --metrics gpu__time_duration.sum --csv --print-units base --log-file $OUT/ncu.csv /tmp/b/ember run scripts/bench_model.lua --model small --precision bf16 --mode train --warmup 1 --steps 2 --quiet > $OUT/ncu_run.log 2>&1; echo ncu rc=$?
tb 40 --model small --precision bf16 --mode train --graph --quiet
eb 60 --model xl --precision bf16 --mode train --graph --quiet
eb 60 --model 2.7b --precision bf16 --mode train --warmup 2 --steps 2 --quiet
python3 bench/table.py $json > $OUT/table.md; cat $OUT/table.md
