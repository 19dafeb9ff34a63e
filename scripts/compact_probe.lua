--- Where the time of nonzero / masked_select / the bf16 -> f32 cast goes on CUDA
-- (issue 12): each op's time as bench_ops takes it (events, read L2 flush,
-- median of --reps), then the same calls under the CUPTI profiler: each
-- kernel's average µs a call, and the op's time less the kernels' (the host
-- round trip for the count, launches, gaps). nonzero and masked_select read
-- their output's size back mid-op, so a gap the GPU waits for the host counts
-- (a cudaMalloc in it too: the allocator's counts around the timed reps are printed).
--
-- --samples prints each timed rep (events, read flush, as bench_ops) with the Lua
-- collections that ran in it (a finalizer sentinel counts them) and what one full
-- collection costs here: a result of 512 MB (nonzero of (8192, 8192)) is 512 MiB of
-- fresh device memory, and the binding runs a full collection whenever that passes
-- max(1 GiB, reserved / 4) since the last (bindings/lua/lua_tensor.c), inside the
-- call that made it: every second nonzero.
--
--   ember run scripts/compact_probe.lua [--reps 20] [--n 8192] [--samples]
--   EMBER_COMPACT_TICKET=0 ember run scripts/compact_probe.lua   (the twelfth session's default: look-back mark, copy)
--   EMBER_COMPACT_MAPPED=0 ember run scripts/compact_probe.lua   (the ticket mark, the count by a copy + synchronize)
--   EMBER_COMPACT_TICKET=0 ember run scripts/compact_probe.lua   (the eleventh session's look-back mark)
--   EMBER_COMPACT_TICKET=0 EMBER_COMPACT_LOOKBACK=0 EMBER_COMPACT_VOUT=0 EMBER_CAST_WIDE=0 ember run scripts/compact_probe.lua
local ember = require "ember"
local argparse = require "argparse"

local parser = argparse("compact_probe.lua", "Per-kernel split of nonzero, masked_select and the bf16 -> f32 cast.")
parser:option("--reps", "Timed reps (median).", "20"):convert(math.tointeger)
parser:option("--n", "Side of the square input.", "8192"):convert(math.tointeger)
parser:option("--order", "Comma list of cases (nonzero, select_f32, select_bf16, cast), run in this order; a case "
  .. "may repeat (nonzero,nonzero: the same op twice, as bench_ops' two dtype rows).",
  "nonzero,nonzero,select_f32,select_bf16,cast")
parser:flag("--samples", "Print every timed rep with the Lua collections in it.")
local args = parser:parse()
assert(ember.cuda.is_available(), "compact_probe.lua needs a CUDA device")

local n = args.n
local function env(k) return os.getenv(k) or "(unset)" end
print(("n %d x %d; EMBER_COMPACT_TICKET=%s EMBER_COMPACT_MAPPED=%s EMBER_COMPACT_LOOKBACK=%s "
  .. "EMBER_COMPACT_VOUT=%s EMBER_CAST_WIDE=%s EMBER_COMPACT=%s"):format(n, n, env("EMBER_COMPACT_TICKET"),
  env("EMBER_COMPACT_MAPPED"), env("EMBER_COMPACT_LOOKBACK"), env("EMBER_COMPACT_VOUT"),
  env("EMBER_CAST_WIDE"), env("EMBER_COMPACT")))

local mask = ember.rand({n, n}):lt(0.5):to("cuda")
local xf = ember.randn({n, n}):to("cuda")
local xb = xf:to("bf16")
local count = mask:sum():item()
local cases = {
  nonzero = {function() return mask:nonzero() end, n * n + count * 16},
  select_f32 = {function() return xf:masked_select(mask) end, n * n * 5 + count * 4},
  select_bf16 = {function() return xb:masked_select(mask) end, n * n * 3 + count * 2},
  cast = {function() return xb:to("f32") end, n * n * 6},
}

-- collections: a sentinel whose finalizer counts one and makes the next
local gc_cycles = 0
local function sentinel() setmetatable({}, {__gc = function() gc_cycles = gc_cycles + 1; sentinel() end}) end
sentinel()

-- each timed rep as ember.bench's events timer takes it (read flush not waited for), and the collections in it
local function samples(name, call)
  local buf = ember.zeros({ember.bench.default_flush_bytes("cuda") // 4}, {device = "cuda"})
  local e0, e1 = ember.cuda.Event{enable_timing = true}, ember.cuda.Event{enable_timing = true}
  for _ = 1, 2 do ember.no_grad(call) end
  ember.cuda.synchronize()
  local line = {}
  for i = 1, args.reps do
    buf:sum()
    local g0 = gc_cycles
    e0:record()
    ember.no_grad(call)
    e1:record()
    e1:synchronize()
    line[i] = ("%.3f%s"):format(e0:elapsed_time(e1), gc_cycles > g0 and "*" or "")
  end
  print(("   %s reps (ms; * = a Lua collection ran in it): %s"):format(name, table.concat(line, " ")))
end

local rows = {}
for name in args.order:gmatch("[^,]+") do
  local c = assert(cases[name], "unknown case " .. name)
  local fn, bytes = c[1], c[2]
  local function call() local y = fn(); getmetatable(y).__close(y) end
  local m0 = ember.cuda.memory_stats()
  local opts = {warmup = 2, reps = args.reps, device = "cuda", flush_l2 = true, flush = "read", timer = "events"}
  local r = ember.bench(function() ember.no_grad(call) end, opts)
  local m1 = ember.cuda.memory_stats()
  local p = ember.profile(function() for _ = 1, 5 do ember.no_grad(call) end end, {backend = "cupti", print = false})
  local ksum = 0
  print(("\n== %s: %.4f ms (min %.4f, max %.4f), %.0f GB/s, %.0f%% of 4800; cudaMalloc %d, cudaFree %d in it")
    :format(name, r.median * 1e3, r.min * 1e3, r.max * 1e3, bytes / r.median / 1e9, bytes / r.median / 48e9,
    m1.num_cuda_mallocs - m0.num_cuda_mallocs, m1.num_cuda_frees - m0.num_cuda_frees))
  if p:has_kernels() then
    for _, k in ipairs(p:kernels()) do
      local per = k.total_ms / 5 * 1e3
      ksum = ksum + per
      print(("   %8.1f us a call (%d calls)  %s"):format(per, k.calls // 5, k.key:sub(1, 90)))
    end
    print(("   kernels %.1f us a call; the rest of the op's %.1f us: %.1f us (host round trip, launches, gaps)")
      :format(ksum, r.median * 1e6, r.median * 1e6 - ksum))
  else
    print("   (no CUPTI: " .. tostring(p.reason) .. ")")
  end
  if args.samples then samples(name, call) end
  rows[#rows + 1] = ("%-12s %8.4f ms  kernels %7.1f us  rest %7.1f us"):format(name, r.median * 1e3, ksum,
    r.median * 1e6 - ksum)
  p:close()
end
print("\n" .. table.concat(rows, "\n"))
if args.samples then
  local t = {}
  for i = 1, 9 do
    local t0 = ember.clock()
    collectgarbage("collect")
    t[i] = (ember.clock() - t0) * 1e3
  end
  table.sort(t)
  print(("one full Lua collection here: median %.3f ms (min %.3f)"):format(t[5], t[1]))
end
