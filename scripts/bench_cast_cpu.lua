--- CPU casts and a clone of (4096, 4096), with and without streaming stores,
-- beside a read of the input (issue 17: at fd5f411 on the GPU host's 16
-- threads the f32 -> bf16 cast took 2.64 ms, 23 % of the copy bandwidth,
-- while bf16 -> f32 took 0.87 ms). Each rep: the cache flush, the read of the
-- input (ember.stream_read), the flush, the op; min and median of each, and
-- the process's minor page faults per op call (from /proc/self/stat: a fresh
-- output faulted in inside the timed call would show here).
--
--   ember run scripts/bench_cast_cpu.lua --threads 16 --reps 30
local ember = require "ember"
local argparse = require "argparse"

local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local S = dofile(here .. "lib/study.lua")

local parser = argparse("bench_cast_cpu.lua", "CPU casts beside a read of the same input.")
parser:option("--reps", "Timed reps.", "30"):convert(math.tointeger)
parser:option("--warmup", "Untimed calls first.", "3"):convert(math.tointeger)
S.add_threads_option(parser)
local args = parser:parse()
S.apply_threads(args, function(msg) parser:error(msg) end)

local function minflt()
  local f = io.open("/proc/self/stat")
  if not f then return 0 end
  local s = f:read("a")
  f:close()
  local rest = s:match("%) (.*)$")   -- past the command name, which may hold spaces
  local fields = {}
  for w in rest:gmatch("%S+") do fields[#fields + 1] = w end
  return tonumber(fields[8]) or 0      -- minflt: field 10 of the line, 8th after the name
end

local MiB = 1 << 20
local flush = S.cpu_flusher(256 * MiB)

ember.manual_seed(1)
local x32 = ember.randn({4096, 4096})
local x16 = x32:to("bf16")
local cases = {
  {"cast f32 -> bf16", x32, function() return x32:to("bf16") end, 64 + 32},
  {"cast bf16 -> f32", x16, function() return x16:to("f32") end, 32 + 64},
  {"clone f32", x32, function() return x32:clone() end, 64 + 64},
}
print(("threads %d, reps %d, flush 256 MiB"):format(ember.get_num_threads(), args.reps))
print("| op | stores | read min / med ms | op min / med ms | op GB/s (min, med) | page faults a call |")
print("|---|---|---|---|---|---|")
for _, stream in ipairs({true, false}) do
  local prev = ember.set_stream_min(stream and 16 * MiB or -1)
  for _, c in ipairs(cases) do
    local faults, f0 = 0, 0
    local t = S.time_beside_read(c[2], c[3], args.reps, args.warmup, flush, function(when, timed)
      if when == "before" then f0 = minflt() elseif timed then faults = faults + minflt() - f0 end
    end)
    local rmin, rmed, omin, omed = t.read[1], t.read[2], t.op[1], t.op[2]
    local bytes = c[4] * MiB
    print(("| %s | %s | %.4f / %.4f | %.4f / %.4f | %.1f, %.1f | %.1f |"):format(c[1], stream and "streaming" or "regular",
      rmin * 1e3, rmed * 1e3, omin * 1e3, omed * 1e3, bytes / omin / 1e9, bytes / omed / 1e9, faults / args.reps))
  end
  ember.set_stream_min(prev)
end
