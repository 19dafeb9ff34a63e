-- nn.lua — speed of Ember's matmul (cuBLASLt) and fused NN kernels on one GPU,
-- timed with CUDA events: matmul TFLOP/s (bf16 8192³, the xl model's linear
-- shapes), fused cross-entropy, RMSNorm, SwiGLU, embedding and the AdamW step
-- in GB/s against a device-to-device copy (the bandwidth ceiling).
--
--   build/ember run bench/kernels/nn.lua [reps] [out.jsonl]
--
-- Each row is the median of `reps` (default 20) event-timed calls after 3
-- warm-ups. GB/s counts the fewest bytes an op must move (inputs read once,
-- outputs written once). Rows marked "graph" time replays of a CUDA graph of
-- 8 calls over 8 different inputs (no launch gaps, no L2 reuse) per call.
local ember = require "ember"
local F = ember.nn.functional

local reps = tonumber(arg and arg[1]) or 20
local out_path = arg and arg[2]
assert(ember.cuda.is_available(), "needs a CUDA device")

local function randn(shape, dtype, scale)
  local t = ember.randn(shape, {device = "cuda"})
  if scale then t = t * scale end
  return t:to(dtype or "f32")
end

local function median(xs)
  table.sort(xs)
  local n = #xs
  return n % 2 == 1 and xs[(n + 1) // 2] or (xs[n // 2] + xs[n // 2 + 1]) / 2
end

local function time_ms(fn, n)
  for _ = 1, 3 do fn() end
  ember.cuda.synchronize()
  local t0, t1 = ember.cuda.Event{enable_timing = true}, ember.cuda.Event{enable_timing = true}
  local samples = {}
  for i = 1, n or reps do
    t0:record(); fn(); t1:record(); t1:synchronize()
    samples[i] = t0:elapsed_time(t1)
  end
  return median(samples)
end

local rows, json, ceiling = {}, {}, nil
local function report(name, ms, flops, bytes)
  local tf = flops and flops / (ms * 1e-3) / 1e12 or nil
  local gbs = bytes and bytes / (ms * 1e-3) / 1e9 or nil
  ceiling = ceiling or gbs
  local row = string.format("| %-58s | %9.4f | %7s | %7s | %5s |", name, ms, tf and string.format("%.1f", tf) or "",
    gbs and string.format("%.0f", gbs) or "", gbs and string.format("%.0f%%", 100 * gbs / ceiling) or "")
  rows[#rows + 1] = row
  json[#json + 1] = string.format('{"name": "%s", "ms": %.6f, "tflops": %s, "gbs": %s}', name, ms,
    tf and string.format("%.3f", tf) or "null", gbs and string.format("%.1f", gbs) or "null")
  io.stderr:write(row, "\n")
end

local function bench(name, fn, flops, bytes)
  collectgarbage("collect")
  local ok, ms = pcall(time_ms, fn)
  if not ok then io.stderr:write(name, ": FAILED: ", tostring(ms), "\n"); rows[#rows + 1] = "| " .. name .. " | FAILED |"; return end
  report(name, ms, flops, bytes)
end

-- time replays of a graph of 8 calls fn(i), i = 1..8; per call
local function bench_graph(name, fn, flops, bytes)
  collectgarbage("collect")
  local ok, err = pcall(function()
    local g = ember.cuda.graph(function() for i = 1, 8 do fn(i) end end, {warmup = 1})
    local ms = time_ms(function() g:replay() end) / 8
    report(name .. " (graph)", ms, flops, bytes)
  end)
  if not ok then io.stderr:write(name, " (graph): FAILED: ", tostring(err), "\n") end
end

local M = 1024 * 1024

-- accuracy figures (relative to an f64 CPU reference, ‖got − want‖ / ‖want‖)
local acc_lines = {}
do
  local function rel(got, want)
    local g, w = got:cpu():to("f64"), want:cpu():to("f64")
    return math.sqrt(((g - w) ^ 2):sum():item() / (w ^ 2):sum():item())
  end
  ember.manual_seed(7)
  local a, b = ember.randn({256, 1024}, {dtype = "f64"}), ember.randn({1024, 192}, {dtype = "f64"})
  local want = a:matmul(b)
  local ag, bg = a:to("f32"):cuda(), b:to("f32"):cuda()
  acc_lines[#acc_lines + 1] = string.format("matmul f32 (256x1024x192) vs f64: TF32 off %.2e", rel(ag:matmul(bg), want))
  local prev = ember.backends.tf32(true)
  acc_lines[#acc_lines + 1] = string.format("matmul f32 (256x1024x192) vs f64: TF32 on  %.2e", rel(ag:matmul(bg), want))
  ember.backends.tf32(prev)
  local ah, bh = a:to("bf16"), b:to("bf16")
  acc_lines[#acc_lines + 1] = string.format("matmul bf16 (256x1024x192) vs f64 of the bf16 inputs: %.2e; vs the CPU bf16 result: %.2e",
    rel(ah:cuda():matmul(bh:cuda()), ah:to("f64"):matmul(bh:to("f64"))), rel(ah:cuda():matmul(bh:cuda()), ah:matmul(bh)))
  local x, t = ember.randn({512, 10000}) * 2, ember.randint(0, 10000, {512})
  acc_lines[#acc_lines + 1] = string.format("cross_entropy f32 (512x10000) loss vs CPU: %.2e",
    rel(F.cross_entropy(x:cuda(), t:cuda()), F.cross_entropy(x, t)))
  local pc, pg = {}, {}
  for i, n in ipairs {1001, 70001, 37} do
    pc[i] = ember.randn({n}); pc[i].requires_grad = true
    pg[i] = pc[i]:detach():cuda(); pg[i].requires_grad = true
  end
  local oc, og = ember.optim.AdamW(pc, {lr = 1e-2}), ember.optim.AdamW(pg, {lr = 1e-2})
  for _ = 1, 5 do
    for i = 1, #pc do local g = ember.randn(pc[i].shape); pc[i].grad = g; pg[i].grad = g:cuda() end
    oc:step(); og:step()
  end
  local mx = 0
  for i = 1, #pc do mx = math.max(mx, (pg[i]:cpu() - pc[i]):abs():max():item()) end
  acc_lines[#acc_lines + 1] = string.format("AdamW 5 steps f32, CUDA (capturable) vs CPU: max |diff| = %.3g", mx)
  for _, l in ipairs(acc_lines) do io.stderr:write(l, "\n") end
end

-- ceiling
do
  local n = 64 * M
  local a, c = randn({n}), ember.empty({n}, {device = "cuda"})
  bench("copy_ 64M f32 (bandwidth ceiling)", function() c:copy_(a) end, nil, 2 * 4 * n)
end

-- matmul
do
  local n = 8192
  local a, b = randn({n, n}, "bf16"), randn({n, n}, "bf16")
  bench("matmul bf16 8192x8192x8192", function() local _ = a:matmul(b) end, 2 * n ^ 3, nil)
  local a32, b32 = randn({4096, 4096}), randn({4096, 4096})
  bench("matmul f32 4096^3 (TF32 off)", function() local _ = a32:matmul(b32) end, 2 * 4096 ^ 3, nil)
  local prev = ember.backends.tf32(true)
  bench("matmul f32 4096^3 (TF32 on)", function() local _ = a32:matmul(b32) end, 2 * 4096 ^ 3, nil)
  ember.backends.tf32(prev)
end

do  -- the xl model (d 1600, ff 6400) at batch 4 x 512 tokens, bf16
  local T, d, ff = 2048, 1600, 6400
  local x, w1, w2 = randn({T, d}, "bf16"), randn({ff, d}, "bf16", 0.02), randn({d, ff}, "bf16", 0.02)
  local h, gy = randn({T, ff}, "bf16"), randn({T, ff}, "bf16")
  local fl = 2 * T * d * ff
  bench("linear xl w1: (2048,1600) @ (6400,1600)^T", function() local _ = F.linear(x, w1) end, fl)
  bench("linear xl w2: (2048,6400) @ (1600,6400)^T", function() local _ = F.linear(h, w2) end, fl)
  bench("linear xl w1 backward dx: (2048,6400) @ (6400,1600)", function() local _ = gy:matmul(w1) end, fl)
  bench("linear xl w1 backward dw: (2048,6400)^T @ (2048,1600)", function() local _ = gy:transpose(0, 1):matmul(x) end, fl)
  local b1 = randn({ff}, "bf16")
  bench("linear xl w1 + bias (epilogue)", function() local _ = F.linear(x, w1, b1) end, fl)
end

-- fused cross-entropy
for _, V in ipairs {10000, 50257} do
  for _, dt in ipairs {"bf16", "f32"} do
    local N, es = 2048, dt == "f32" and 4 or 2
    local x = randn({N, V}, dt, 2)
    local t = ember.randint(0, V, {N}, {device = "cuda"})
    bench(string.format("cross_entropy fwd (%d x %d) %s", N, V, dt), function() local _ = F.cross_entropy(x, t) end,
      nil, N * V * es)
    local xg = x:detach(); xg.requires_grad = true
    bench(string.format("cross_entropy fwd+bwd (%d x %d) %s", N, V, dt), function()
      xg.grad = nil
      F.cross_entropy(xg, t):backward()
    end, nil, 3 * N * V * es)
  end
end

-- RMSNorm (2048 x 1600), the xl model's rows
for _, dt in ipairs {"bf16", "f32"} do
  local N, D, es = 2048, 1600, dt == "f32" and 4 or 2
  local xs, w = {}, randn({D})
  for i = 1, 8 do xs[i] = randn({N, D}, dt) end
  local wd = w:to(dt)
  bench(string.format("rmsnorm fwd (%d x %d) %s", N, D, dt), function() local _ = F.rmsnorm(xs[1], wd, 1e-5) end,
    nil, 2 * N * D * es)
  bench_graph(string.format("rmsnorm fwd (%d x %d) %s", N, D, dt), function(i) local _ = F.rmsnorm(xs[i], wd, 1e-5) end,
    nil, 2 * N * D * es)
  local xg = xs[1]:detach(); xg.requires_grad = true
  local wg = wd:detach(); wg.requires_grad = true
  local g = randn({N, D}, dt)
  bench(string.format("rmsnorm fwd+bwd (%d x %d) %s", N, D, dt), function()
    xg.grad = nil; wg.grad = nil
    F.rmsnorm(xg, wg, 1e-5):backward(g)
  end, nil, 6 * N * D * es)
end

-- SwiGLU at the xl FFN's (2048 x 6400), bf16
do
  local a, b = randn({2048, 6400}, "bf16"), randn({2048, 6400}, "bf16")
  bench("swiglu fwd (2048 x 6400) bf16", function() local _ = F.swiglu(a, b) end, nil, 3 * 2 * 2048 * 6400)
end

-- embedding: 8192 tokens from a (50257 x 768) f32 table
do
  local w = randn({50257, 768})
  local ids = ember.randint(0, 50257, {8192}, {device = "cuda"})
  bench("embedding fwd 8192 x 768 f32", function() local _ = F.embedding(ids, w) end, nil, 2 * 8192 * 768 * 4)
  local wg = w:detach(); wg.requires_grad = true
  local g = randn({8192, 768})
  bench("embedding fwd+bwd (dense 50257x768 grad) f32", function()
    wg.grad = nil
    F.embedding(ids, wg):backward(g)
  end, nil, (3 * 8192 * 768 + 50257 * 768) * 4)
end

-- AdamW over 124M f32 parameters in 100 tensors (capturable path)
do
  local ps = {}
  for i = 1, 100 do
    local p = randn({1240000}); p.requires_grad = true
    p.grad = randn({1240000})
    ps[i] = p
  end
  local opt = ember.optim.AdamW(ps, {lr = 1e-4})
  bench("AdamW step 124M f32 params (100 tensors)", function() opt:step() end, nil, 28 * 124e6)
  local grads = {}
  for i = 1, 100 do grads[i] = ps[i].grad end
  bench("sum_of_squares 124M f32", function() local _ = ember.core.sum_of_squares(grads) end, nil, 4 * 124e6)
  bench("clip_grad_norm 124M f32 (no host sync)", function() local _ = ember.nn.utils.clip_grad_norm(ps, 1e9) end,
    nil, 4 * 124e6)
end

print("\nAccuracy:")
for _, l in ipairs(acc_lines) do print("  " .. l) end
print(string.format("\nDevice: %s; median of %d calls (ms)\n", ember.cuda.device_name(), reps))
print("| op | ms | TFLOP/s | GB/s | % copy |")
print("|---|---|---|---|---|")
for _, r in ipairs(rows) do print(r) end
if out_path then
  local f = assert(io.open(out_path, "w"))
  for _, j in ipairs(json) do f:write(j, "\n") end
  f:close()
end
