-- elementwise_reduce.lua — effective bandwidth of Ember's elementwise,
-- reduction and softmax kernels (kernels/elementwise.cu, kernels/reduce.cu)
-- on one GPU, timed with CUDA events; elementwise_reduce_torch.py times the
-- same ops in PyTorch the same way.
--
--   build/ember run bench/kernels/elementwise_reduce.lua [reps]
--
-- Each row: the median of `reps` (default 20) event-timed calls after 3
-- warm-ups; GB/s counts the fewest bytes the op must move (every input read
-- once, every output written once); "% copy" compares with a device-to-device
-- copy of 64M f32 measured in the same run (the bandwidth ceiling).
local ember = require "ember"

local reps = tonumber(arg and arg[1]) or 20
assert(ember.cuda.is_available(), "needs a CUDA device")

local function randn(shape, dtype)
  return ember.randn(shape, {device = "cuda"}):to(dtype or "f32")
end

local function median(xs)
  table.sort(xs)
  local n = #xs
  return n % 2 == 1 and xs[(n + 1) // 2] or (xs[n // 2] + xs[n // 2 + 1]) / 2
end

local function time_ms(fn)
  for _ = 1, 3 do fn() end
  ember.cuda.synchronize()
  local t0, t1 = ember.cuda.Event{enable_timing = true}, ember.cuda.Event{enable_timing = true}
  local samples = {}
  for i = 1, reps do
    t0:record(); fn(); t1:record(); t1:synchronize()
    samples[i] = t0:elapsed_time(t1)
  end
  return median(samples)
end

local M = 1024 * 1024
local rows = {}
local ceiling
local function bench(name, bytes, fn)
  collectgarbage("collect")
  local ms = time_ms(fn)
  local gbs = bytes / (ms * 1e-3) / 1e9
  ceiling = ceiling or gbs
  rows[#rows + 1] = string.format("| %-52s | %9.3f | %7.0f | %5.0f%% |", name, ms, gbs, 100 * gbs / ceiling)
  io.stderr:write(rows[#rows], "\n")
end

local n = 64 * M
local a, b, c = randn({n}), randn({n}), ember.empty({n}, {device = "cuda"})
bench("copy_ 64M f32 (the ceiling)", 2 * 4 * n, function() c:copy_(a) end)
bench("add 64M f32, out=", 3 * 4 * n, function() ember.add(a, b, {out = c}) end)
bench("add 64M f32, allocating", 3 * 4 * n, function() local _ = a + b end)
bench("mul by a number 64M f32, out=", 2 * 4 * n, function() ember.mul(a, 0.5, {out = c}) end)
local ah, bh, ch = a:to("bf16"), b:to("bf16"), ember.empty({n}, {device = "cuda", dtype = "bf16"})
bench("add 64M bf16, out=", 3 * 2 * n, function() ember.add(ah, bh, {out = ch}) end)
bench("gelu 64M bf16, out=", 2 * 2 * n, function() ember.gelu(ah, {out = ch}) end)
local x2, bias = a:view(8192, 8192), randn({8192})
bench("add (8192,8192) + (8192) broadcast f32, out=", (2 * 4 * n) + 4 * 8192,
  function() ember.add(x2, bias, {out = c:view(8192, 8192)}) end)
bench("lt 64M f32 -> bool", (2 * 4 + 1) * n, function() local _ = a:lt(b) end)
ah, bh, ch, b, x2 = nil, nil, nil, nil, nil
collectgarbage("collect")

local s = randn({8192, 10000})
local e = 8192 * 10000
bench("softmax (8192, 10000) f32", 2 * 4 * e, function() local _ = s:softmax(-1) end)
bench("log_softmax (8192, 10000) f32", 2 * 4 * e, function() local _ = s:log_softmax(-1) end)
bench("softmax (8192, 10000) f32, again (order check)", 2 * 4 * e, function() local _ = s:softmax(-1) end)
local sh = s:to("bf16")
bench("softmax (8192, 10000) bf16", 2 * 2 * e, function() local _ = sh:softmax(-1) end)
sh = nil
local att = randn({32768, 1024})
bench("softmax (32768, 1024) f32", 2 * 4 * 32768 * 1024, function() local _ = att:softmax(-1) end)
att = nil
do
  local x = s:clone(); x.requires_grad = true
  local y = x:softmax(-1)
  local g = randn({8192, 10000})
  bench("softmax backward (8192, 10000) f32, via autograd", 3 * 4 * e, function()
    x.grad = nil
    y:backward(g, {retain_graph = true})
  end)
end
s = nil
collectgarbage("collect")

local m = randn({4096, 4096})
local me = 4096 * 4096
bench("sum over the last dim (4096, 4096) f32", 4 * me, function() local _ = m:sum(-1) end)
bench("sum over dim 0 (4096, 4096) f32 (columns)", 4 * me, function() local _ = m:sum(0) end)
bench("max + indices over the last dim (4096, 4096) f32", 4 * me, function() local _ = m:max(-1) end)
bench("sum of all 64M f32", 4 * n, function() local _ = a:sum() end)
local mh = a:view(8192, 8192):to("bf16")
bench("mean over the last dim (8192, 8192) bf16", 2 * n, function() local _ = mh:mean(-1) end)

local ok, dev = pcall(ember.cuda.get_device_name)
print(("device: %s; %d reps, median"):format(ok and tostring(dev) or "?", reps))
print("| op | ms | GB/s | % copy |")
print("|---|---|---|---|")
for _, r in ipairs(rows) do print(r) end
