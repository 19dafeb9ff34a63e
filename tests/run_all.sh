#!/usr/bin/env bash
# Runs every test suite and prints one totals line, exactly
#   N passed, N failed[, N skipped]
# summed over ctest (C unit tests), busted (Lua specs) and the distributed
# specs. Exits non-zero when anything failed.
#   EMBER_BUILD       build directory (default build)
#   EMBER_LUA_RUNNER  "lua" (stock lua5.4, default) or "ember" (the built executable)
#   EMBER_TEST_GPU=1  run tests/gpu instead of the CPU specs
set -u
cd "$(dirname "$0")/.."
build=${EMBER_BUILD:-build}
build=$(cd "$build" && pwd)
export EMBER_BUILD=$build
passed=0 failed=0 skipped=0
log=$(mktemp -d)

# ---- ctest ----
if [ -z "${EMBER_TEST_GPU:-}" ]; then
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
if ls $specs/*_spec.lua >/dev/null 2>&1; then
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
if [ -z "${EMBER_TEST_GPU:-}" ] && ls tests/dist/*_spec.lua >/dev/null 2>&1; then
  for spec in tests/dist/*_spec.lua; do
    if "$build/ember" launch --nproc 2 "$spec" >"$log/dist" 2>&1; then passed=$((passed + 1))
    else cat "$log/dist"; failed=$((failed + 1)); fi
  done
fi

rm -rf "$log"
if [ "$skipped" -gt 0 ]; then echo "$passed passed, $failed failed, $skipped skipped"
else echo "$passed passed, $failed failed"; fi
[ "$failed" -eq 0 ]
