--- CPU reductions against a plain read of the same tensor (issue 17): for each
-- case and dtype, ember.stream_read(x) and the reduction of x are timed in
-- alternating reps (the same bytes, the same caches flushed before each rep,
-- the same moment on a shared machine), and each op's time is printed beside
-- the read's, min and median, with the fraction op / read. bench_ops.lua holds
-- a reduction's median to the best read of a separate buffer; this one shows
-- how much of that gap is the op and how much is the protocol.
--
--   ember run scripts/bench_reduce_cpu.lua --threads 16 --reps 30
--   ember run scripts/bench_reduce_cpu.lua --threads 2 --rows 8192 --cols 8192 --dtype bf16
local ember = require "ember"
local argparse = require "argparse"

local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local S = dofile(here .. "lib/study.lua")

local parser = argparse("bench_reduce_cpu.lua", "CPU reductions beside a read of the same tensor.")
parser:option("--rows", "Rows of the input.", "4096"):convert(math.tointeger)
parser:option("--cols", "Columns of the input.", "4096"):convert(math.tointeger)
parser:option("--dtype", "Comma list of dtypes.", "f32,bf16")
parser:option("--op", "Comma list of cases (sum,sum_last,sum_dim0,mean_last,max_last,max,amax_last).",
  "sum,sum_last,sum_dim0,mean_last,max_last,max")
parser:option("--reps", "Timed reps (each: flush, read, flush, op).", "30"):convert(math.tointeger)
parser:option("--warmup", "Untimed rounds first.", "3"):convert(math.tointeger)
S.add_threads_option(parser)
local args = parser:parse()
S.apply_threads(args, function(msg) parser:error(msg) end)

local cases = {
  sum = function(a) return a:sum() end,
  sum_last = function(a) return a:sum(-1) end,
  sum_dim0 = function(a) return a:sum(0) end,
  mean_last = function(a) return a:mean(-1) end,
  max_last = function(a) return (a:max(-1)) end,
  max = function(a) return a:max() end,
  amax_last = function(a) return a:amax(-1) end,
}

local flush, flush_bytes = S.cpu_flusher()

print(("threads %d, input (%d, %d), reps %d, flush %d MiB"):format(ember.get_num_threads(), args.rows, args.cols,
  args.reps, flush_bytes >> 20))
print("| case | dtype | MiB | read min / med ms | op min / med ms | read GB/s (min) | op GB/s (min, med) | op/read min | op/read med |")
print("|---|---|---|---|---|---|---|---|---|")
for dt in args.dtype:gmatch("[^,]+") do
  ember.manual_seed(1)
  local x = ember.randn({args.rows, args.cols}):to(dt)
  local bytes = x:numel() * x:element_size()
  for name in args.op:gmatch("[^,]+") do
    local fn = assert(cases[name], "unknown case " .. name)
    local t = S.time_beside_read(x, function() return fn(x) end, args.reps, args.warmup, flush)
    local rmin, rmed, omin, omed = t.read[1], t.read[2], t.op[1], t.op[2]
    print(("| %s | %s | %d | %.4f / %.4f | %.4f / %.4f | %.1f | %.1f, %.1f | %.0f%% | %.0f%% |"):format(name, dt,
      bytes >> 20, rmin * 1e3, rmed * 1e3, omin * 1e3, omed * 1e3, bytes / rmin / 1e9, bytes / omin / 1e9,
      bytes / omed / 1e9, rmin / omin * 100, rmed / omed * 100))
  end
end
