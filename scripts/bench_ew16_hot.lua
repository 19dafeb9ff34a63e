--- Hot-cache ns per element of the CPU elementwise loop's bf16/f16 paths at one
-- thread (issue 17): operands small enough to stay in L2, each op called
-- `reps` times, the best of 5 rounds. The per-element compute cost these print
-- bounds an op's all-core rate: at T threads and B GB/s an op moving e bytes
-- an element needs at most T * e / B ns an element of a thread.
--   ember run scripts/bench_ew16_hot.lua [n] [reps]
local ember = require "ember"
local n, reps = tonumber(arg[1]) or 32768, tonumber(arg[2]) or 2000
ember.set_num_threads(1)
ember.manual_seed(0)
local rows = n // 256
local function case(name, fn)
  fn()
  local best = math.huge
  for _ = 1, 5 do
    local t0 = os.clock()
    for _ = 1, reps do fn() end
    best = math.min(best, (os.clock() - t0) / reps)
  end
  print(("%-34s %7.3f ns/element  (%.2f us a call)"):format(name, best * 1e9 / n, best * 1e6))
end
for _, dt in ipairs({"f32", "bf16", "f16"}) do
  local a, b = ember.randn({rows, 256}):to(dt), ember.randn({rows, 256}):to(dt)
  local row, m, sq = ember.randn({256}):to(dt), ember.randn({rows, 256}):gt(0), ember.randn({64, 64}):gt(0)
  local o = ember.empty({rows, 256}, {dtype = dt})
  case(dt .. " add", function() a:add(b, {out = o}) end)
  case(dt .. " add row-broadcast", function() a:add(row, {out = o}) end)
  case(dt .. " mul by number", function() a:mul(1.5, {out = o}) end)
  case(dt .. " where", function() return ember.where(m, a, b) end)
  case(dt .. " masked_fill", function() return a:masked_fill(m, -1e4) end)
  case(dt .. " masked_fill (T,T) mask", function() return a:view(n // 4096, 64, 64):masked_fill(sq, -1e4) end)
  case(dt .. " neg", function() a:neg({out = o}) end)
end
