#!/usr/bin/env bash
set -u
export OUT=${OUT:-out}; R=$OUT/r; mkdir -p $R
sh .deps/install.sh .deps /opt/deps >/dev/null && . /opt/deps/env.sh
cmake -S . -B /tmp/b -G Ninja -DEMBER_CUDA=ON >$OUT/build.log 2>&1 && cmake --build /tmp/b -j16 >>$OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
E=/tmp/b/ember
t() { local t0=$(date +%s); timeout "$@"; local rc=$?; echo "rc=$rc $(( $(date +%s)-t0 ))s :: ${*:2:6}"; }
t 60 $E run scripts/memory_profile.lua --context 512 --mode train --precision bf16 > $R/mp_plain.log 2>&1; grep -A4 "^| precision" $R/mp_plain.log
t 120 $E run scripts/memory_profile.lua --context 512 --mode train --precision bf16 --snapshot $R/snap27 > $R/mp_snap.log 2>&1; grep -A4 "^| precision" $R/mp_snap.log; ls -la $R/snap27
t 60 $E run scripts/memviz.lua $R/snap27/2.7b_train_bf16_ctx512.json -o $R/snap27/view.html; rm -f $R/snap27/*.json
t 330 $E sweep scripts/campaigns/attention_grid.lua > $R/att.log 2>&1; tail -3 $R/att.log
cp -r sweeps $R/
cd $OUT && tar czf r.tgz r && rm -rf r
