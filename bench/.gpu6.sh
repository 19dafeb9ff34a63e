#!/usr/bin/env bash
set -u
export OUT=${OUT:-out}; R=$OUT/r; mkdir -p $R
sh .deps/install.sh .deps /opt/deps >/dev/null && . /opt/deps/env.sh
[ -x /tmp/b/ember ] || { cmake -S . -B /tmp/b -G Ninja -DEMBER_CUDA=ON >$OUT/build.log 2>&1 && cmake --build /tmp/b -j16 >>$OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }; }
cmake --build /tmp/b -j16 >>$OUT/build.log 2>&1
E=/tmp/b/ember
t() { local t0=$(date +%s); timeout "$@"; local rc=$?; echo "rc=$rc $(( $(date +%s)-t0 ))s :: ${*:2:5}"; }
t 120 make test-gpu-memcheck BUILD=/tmp/b >$R/memcheck.log 2>&1; grep -E "ERROR SUMMARY|successes" $R/memcheck.log
mkdir -p sweeps
t 150 $E sweep scripts/campaigns/warmup.lua > $R/warmup.log 2>&1; tail -3 $R/warmup.log
t ${MS_SECS:-330} $E sweep scripts/campaigns/model_sizes.lua ${MS_FILTER:-} > $R/model_sizes.log 2>&1; tail -5 $R/model_sizes.log
$E sweep --report scripts/campaigns/model_sizes.lua > /dev/null 2>&1
cp -r sweeps $R/
cd $OUT && tar czf r.tgz r && rm -rf r
