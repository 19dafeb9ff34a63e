#!/usr/bin/env bash
# session-3 run 4: all GPU specs + profiler/memory checks
set -u
export OUT=${OUT:-out}; R=$OUT/r; mkdir -p $R
sh .deps/install.sh .deps /opt/deps >/dev/null && . /opt/deps/env.sh
cmake -S . -B /tmp/b -G Ninja -DEMBER_CUDA=ON >$OUT/build.log 2>&1 && cmake --build /tmp/b -j16 >>$OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
E=/tmp/b/ember
t() { local t0=$(date +%s); timeout "$@"; local rc=$?; echo "rc=$rc $(( $(date +%s)-t0 ))s :: ${*:2:5}"; }
t 300 make test-gpu BUILD=/tmp/b >$R/test-gpu.log 2>&1; tail -1 $R/test-gpu.log; grep -E "Failure →|Error →" -A8 $R/test-gpu.log | head -90
t 120 $E run scripts/bench_model.lua --model xl --mode fwd --precision bf16 --profile --quiet > $R/prof_xl_fwd.log 2>&1; grep -E "^profile check|^time:" $R/prof_xl_fwd.log
t 120 $E run scripts/bench_model.lua --model xl --mode train --precision bf16 --profile --profile-trace $R/xl_trace.json --quiet > $R/prof_xl_train.log 2>&1; grep -E "^profile check|^time:" $R/prof_xl_train.log; ls -la $R/xl_trace.json; python3 -c "import json,sys; d=json.load(open('$R/xl_trace.json')); print('trace events', len(d['traceEvents'] if isinstance(d,dict) else d))"; rm -f $R/xl_trace.json
t 60 $E run scripts/bench_model.lua --model small --mode train --precision bf16 --graph --profile --quiet > $R/prof_small_graph.log 2>&1; grep -E "^profile check|^time:|graph replay" $R/prof_small_graph.log | head
t 60 $E run scripts/bench_model.lua --model small --mode train --precision bf16 --profile --quiet > $R/prof_small.log 2>&1; grep -E "^profile check|^time:" $R/prof_small.log
t 60 $E run examples/memory_snapshot.lua --model small --context 512 --out $R/snap > $R/snap.log 2>&1; tail -2 $R/snap.log
t 120 python3 -m torch.cuda._memory_viz trace_plot $R/snap/step.pickle -o $R/snap/torch_trace.html > $R/memviz_torch.log 2>&1; tail -3 $R/memviz_torch.log; ls -la $R/snap
t 60 python3 -m torch.cuda._memory_viz stats $R/snap/step.pickle > $R/memviz_stats.log 2>&1; head -20 $R/memviz_stats.log
t 120 $E run scripts/bench_memory.lua --device cuda --model small --batch 4 --context 512 > $R/bench_memory_small.log 2>&1; tail -12 $R/bench_memory_small.log
t 200 $E run scripts/bench_memory.lua --device cuda --model 2.7b --batch 4 --context 512 --steps 2 > $R/bench_memory_27.log 2>&1; tail -12 $R/bench_memory_27.log
t 60 $E run scripts/mixed_precision.lua --device cuda --json $R/mixed_precision.jsonl --markdown $R/mixed_precision.md > $R/mixed_precision.log 2>&1
cd $OUT && tar czf r.tgz r && rm -rf r
