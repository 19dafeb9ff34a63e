#!/usr/bin/env bash
# A/B of the CUDA split reductions' block cap (issue 12; docs/perf.md,
# 2026-11-28 "fine splits"): EMBER_REDUCE_SPLIT_KB is read once per process,
# so each setting is its own bench_ops.lua process, on the same card in one
# call. "wide" is the plan before fine splits (512 blocks of up to 256-512 KB);
# 64 is the default. Prints one line per (setting, entry, dtype): ms and % of
# the datasheet, by CUDA events with the L2 flushed.
#
#   bash scripts/bench_reduce_split.sh                  # wide 64 32 128, sums at 2^26 and 2^24 elements
#   KBS="wide 64" MATCHES="(8192,8192)" bash scripts/bench_reduce_split.sh
set -euo pipefail
build=${EMBER_BUILD:-build}
kbs=${KBS:-wide 64 32 128}
matches=${MATCHES:-(8192,8192) (16384,4096) (4096,4096)}
reps=${REPS:-10}
for m in $matches; do
  for kb in $kbs; do
    EMBER_REDUCE_SPLIT_KB=$kb "$build/ember" run scripts/bench_ops.lua --device cuda --timer events --no-backward \
      --op sum,mean,max --dtype bf16,f32 --reps "$reps" --match "$m" |
      awk -F'|' -v kb="$kb" '$2 ~ /^ (sum|mean|max) $/ { printf "%-5s %-40s %-5s %s ms %s\n", kb, $3, $4, $5, $7 }'
  done
done
