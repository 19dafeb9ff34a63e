--- ember.bench: time a function like torch.utils.benchmark, minus the ceremony.
-- bench(fn, {warmup=5, reps=10, sync=true}) runs fn `warmup` times untimed,
-- then `reps` timed runs, synchronising the device around each (when CUDA is
-- available) so asynchronous work is counted. Returns seconds:
-- {mean=, std=, median=, min=, max=, samples={...}, reps=, warmup=}.
local core = require "ember.core"
local M = {}

local function sync()
  if core.cuda_is_available() and core.cuda_synchronize then core.cuda_synchronize() end
end

--- Summary statistics of a list of numbers (std is the sample std, n-1).
function M.stats(samples)
  local n, sum = #samples, 0
  for _, s in ipairs(samples) do sum = sum + s end
  local mean = sum / n
  local ss = 0
  for _, s in ipairs(samples) do ss = ss + (s - mean) ^ 2 end
  local sorted = table.move(samples, 1, n, 1, {})
  table.sort(sorted)
  local median = n % 2 == 1 and sorted[(n + 1) // 2] or (sorted[n // 2] + sorted[n // 2 + 1]) / 2
  return {mean = mean, std = n > 1 and math.sqrt(ss / (n - 1)) or 0, median = median,
          min = sorted[1], max = sorted[n], samples = samples}
end

function M.bench(fn, opts)
  opts = opts or {}
  if type(fn) ~= "function" then error("ember.bench: expected a function, got " .. type(fn), 2) end
  local warmup, reps = opts.warmup or 5, opts.reps or 10
  if math.type(warmup) ~= "integer" or warmup < 0 then error("ember.bench: warmup must be an integer >= 0", 2) end
  if math.type(reps) ~= "integer" or reps < 1 then error("ember.bench: reps must be an integer >= 1", 2) end
  local do_sync = opts.sync ~= false
  for _ = 1, warmup do fn() end
  if do_sync then sync() end
  local samples = {}
  for i = 1, reps do
    local t0 = core.clock()
    fn()
    if do_sync then sync() end
    samples[i] = core.clock() - t0
  end
  local r = M.stats(samples)
  r.reps, r.warmup = reps, warmup
  return r
end

setmetatable(M, {__call = function(_, ...) return M.bench(...) end})
return M
