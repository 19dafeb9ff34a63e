#!/usr/bin/env bash
set -u
export OUT=${OUT:-out}; R=$OUT/r; mkdir -p $R
sh .deps/install.sh .deps /opt/deps >/dev/null && . /opt/deps/env.sh
cmake -S . -B /tmp/b -G Ninja -DEMBER_CUDA=ON >$OUT/build.log 2>&1 && cmake --build /tmp/b -j16 >>$OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
E=/tmp/b/ember
t() { local t0=$(date +%s); timeout "$@"; local rc=$?; echo "rc=$rc $(( $(date +%s)-t0 ))s :: ${*:2:5}"; }
t 200 make test-gpu BUILD=/tmp/b >$R/test-gpu.log 2>&1; tail -1 $R/test-gpu.log; grep -E "Failure →|Error →" -A8 $R/test-gpu.log | head -60
t 330 make test-gpu-memcheck BUILD=/tmp/b >$R/memcheck.log 2>&1; tail -3 $R/memcheck.log; grep -E "ERROR SUMMARY|Failure →|Error →" $R/memcheck.log | sort | uniq -c | head
t 40 $E run examples/memory_snapshot.lua --model small --context 512 --out $R/snap > $R/snap.log 2>&1; tail -2 $R/snap.log
cd $OUT && tar czf r.tgz r && rm -rf r
