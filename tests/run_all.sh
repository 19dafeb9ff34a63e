#!/usr/bin/env bash
# Runs every test suite and prints one totals line, exactly
#   N passed, N failed[, N skipped]
# summed over ctest (C unit tests), busted (Lua specs) and the distributed
# specs. Exits non-zero when anything failed.
#   EMBER_BUILD       build directory (default build)
#   EMBER_LUA_RUNNER  "lua" (stock lua5.4, default) or "ember" (the built executable)
#   EMBER_TEST_GPU=1  run tests/gpu instead of the CPU specs
#   EMBER_TEST_DIST=1 run only tests/dist (make test-dist-gpu: with EMBER_DIST_DEVICE=cuda
#                     and EMBER_DIST_NPROCS=<number of GPUs>, over NCCL)
set -u
cd "$(dirname "$0")/.."
build=${EMBER_BUILD:-build}
build=$(cd "$build" && pwd)
export EMBER_BUILD=$build
passed=0 failed=0 skipped=0
log=$(mktemp -d)

# ---- ctest ----
if [ -z "${EMBER_TEST_GPU:-}" ] && [ -z "${EMBER_TEST_DIST:-}" ]; then
  (cd "$build" && ctest --output-on-failure -j 2) >"$log/ctest" 2>&1
  cat "$log/ctest"
  line=$(grep -E 'tests passed, [0-9]+ tests failed out of [0-9]+' "$log/ctest" | tail -1)
  if [ -n "$line" ]; then
    total=$(echo "$line" | sed -E 's/.*out of ([0-9]+).*/\1/')
    nf=$(echo "$line" | sed -E 's/.* ([0-9]+) tests failed.*/\1/')
    passed=$((passed + total - nf)); failed=$((failed + nf))
  elif ! grep -q "No tests were found" "$log/ctest"; then
    echo "run_all: could not read ctest's summary"; failed=$((failed + 1))
  fi
fi

# ---- busted ----
specs=tests/lua
[ -n "${EMBER_TEST_GPU:-}" ] && specs=tests/gpu
# LUA_PATH_5_4 wins over LUA_PATH in lua5.4 (the GPU host's env.sh sets it): set both
export LUA_PATH="$build/lua/?.lua;$build/lua/?/init.lua;${LUA_PATH_5_4:-;}"
export LUA_CPATH="$build/lua/?.so;${LUA_CPATH_5_4:-;}"
export LUA_PATH_5_4="$LUA_PATH" LUA_CPATH_5_4="$LUA_CPATH"
busted_bin=$(command -v busted || echo /usr/bin/busted)
if [ "${EMBER_LUA_RUNNER:-lua}" = ember ]; then
  runner=("$build/ember" run "$busted_bin")
else
  runner=(lua5.4 "$busted_bin")
fi
if [ -z "${EMBER_TEST_DIST:-}" ] && ls $specs/*_spec.lua >/dev/null 2>&1; then
  "${runner[@]}" --output=utfTerminal "$specs" >"$log/busted" 2>&1
  rc=$?
  cat "$log/busted"
  line=$(grep -E '^[0-9]+ success(es)? / [0-9]+ failures? / [0-9]+ errors? / [0-9]+ pending' "$log/busted" | tail -1)
  if [ -n "$line" ]; then
    read -r s f e p <<<"$(echo "$line" | sed -E 's#^([0-9]+) [a-z]+ / ([0-9]+) [a-z]+ / ([0-9]+) [a-z]+ / ([0-9]+).*#\1 \2 \3 \4#')"
    passed=$((passed + s)); failed=$((failed + f + e)); skipped=$((skipped + p))
  else
    echo "run_all: busted exited $rc without a summary"; failed=$((failed + 1))
  fi
fi

# ---- distributed specs (ember launch) ----
# Each tests/dist/*_spec.lua runs as a script on 2 and on 3 ranks (a comment
# "-- nproc: 2" in its first 5 lines restricts that). Rank 0 ends with the
# line "dist: N passed, M failed" (tests/dist/harness.lua); a run that exits
# non-zero counts at least 1 failed, one without that line exactly 1.
dist_nprocs() {
  local line
  line=$(head -n 5 "$1" | grep -E '^--[[:space:]]*nproc:' | head -1)
  if [ -n "${EMBER_DIST_NPROCS:-}" ]; then echo "$EMBER_DIST_NPROCS"
  elif [ -n "$line" ]; then echo "${line#*:}"; else echo "2 3"; fi
}
if { [ -z "${EMBER_TEST_GPU:-}" ] || [ -n "${EMBER_TEST_DIST:-}" ]; } && ls tests/dist/*_spec.lua >/dev/null 2>&1; then
  for spec in tests/dist/*_spec.lua; do
    for np in $(dist_nprocs "$spec"); do
      timeout 600 "$build/ember" launch --nproc "$np" "$spec" >"$log/dist" 2>&1
      rc=$?
      line=$(grep -E '^dist: [0-9]+ passed, [0-9]+ failed' "$log/dist" | tail -1)
      if [ -n "$line" ]; then
        read -r np_pass np_fail <<<"$(echo "$line" | sed -E 's/^dist: ([0-9]+) passed, ([0-9]+) failed.*/\1 \2/')"
        [ "$rc" -ne 0 ] && [ "$np_fail" -eq 0 ] && np_fail=1
      else
        np_pass=0 np_fail=1
      fi
      [ "$np_fail" -gt 0 ] && cat "$log/dist"
      [ "$rc" -eq 124 ] && echo "run_all: $spec on $np ranks timed out after 600 s"
      echo "dist: $spec on $np ranks: $np_pass passed, $np_fail failed (exit $rc)"
      passed=$((passed + np_pass)); failed=$((failed + np_fail))
    done
  done
fi

rm -rf "$log"
if [ "$skipped" -gt 0 ]; then echo "$passed passed, $failed failed, $skipped skipped"
else echo "$passed passed, $failed failed"; fi
[ "$failed" -eq 0 ]
