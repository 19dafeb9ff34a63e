-- matmul_tune_spec.lua (GPU) — ember.backends.matmul_tune on CUDA: tuned
-- gemms give the CPU reference's result for several shapes, transposes,
-- dtypes, a bias epilogue, a batch and an accumulating (beta = 1) gradient;
-- each new key is tuned once (the table grows by one, then the cache is
-- hit); a split-K candidate beyond cuBLASLt's list (forced through
-- ember.core.matmul_tune_force_splitk) is right and gives the same bits call
-- after call; nothing is timed while a graph is captured (the key keeps the
-- heuristic's choice, so graph and eager agree bit for bit); tuning off
-- gives the heuristic's bits, in this process and in a fresh one started
-- with EMBER_MATMUL_TUNE=0.
--
-- Tolerances (‖got − want‖ / ‖want‖ against the CPU in the same dtype, as
-- tests/gpu/matmul_spec.lua): f32 1e-5 (f32 accumulation over k <= 1024),
-- bf16/f16 1e-2 (both sides accumulate in f32 and round once; the order
-- flips a few roundings of 2^-8), f64 1e-12. A tuned algorithm may sum in
-- another order than the heuristic's, so tuned vs untuned is held to the
-- same tolerances, not to equal bits.
local ember = require "ember"
local F = ember.nn.functional

local C, H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "compare.lua")
local close = C.assert_rel
local randn = H.seeded(4100).randn
local TOL = {f32 = 1e-5, bf16 = 1e-2, f16 = 1e-2, f64 = 1e-12}

local function count() return #ember.core.matmul_tune_table() end

-- fn() with tuning set to `on`, restoring the previous setting even when fn raises.
local function with_tune(on, fn)
  local prev = ember.backends.matmul_tune(on)
  local res = table.pack(pcall(fn))
  ember.backends.matmul_tune(prev)
  if not res[1] then error(res[2], 0) end
  return table.unpack(res, 2, res.n)
end

-- Each case: CPU operands, and the product computed from any device's copies.
-- Shapes differ from every other spec's so each case is a new key here.
local CASES = {
  {name = "f32 (192, 256) @ (256, 320)", dtype = "f32",
   args = {{192, 256}, {256, 320}}, fn = function(a, b) return a:matmul(b) end},
  {name = "bf16 (512, 768) @ (768, 1152)", dtype = "bf16",
   args = {{512, 768}, {768, 1152}}, fn = function(a, b) return a:matmul(b) end},
  {name = "f16 aᵀ @ b, a stored (384, 208)", dtype = "f16",
   args = {{384, 208}, {384, 272}}, fn = function(a, b) return a:transpose(0, 1):matmul(b) end},
  {name = "bf16 linear x @ wᵀ + bias (epilogue)", dtype = "bf16",
   args = {{264, 640}, {896, 640}, {896}}, fn = function(x, w, bias) return F.linear(x, w, bias) end},
  {name = "bf16 batched (6, 136, 64) @ (6, 64, 136)", dtype = "bf16",
   args = {{6, 136, 64}, {6, 64, 136}}, fn = function(a, b) return a:matmul(b) end},
  {name = "f64 (72, 104) @ (104, 88)", dtype = "f64",
   args = {{72, 104}, {104, 88}}, fn = function(a, b) return a:matmul(b) end},
}

describe("matmul tuning on CUDA", function()
  assert.is_true(ember.cuda.is_available(), "the GPU specs need a CUDA device")

  for _, case in ipairs(CASES) do
    it(case.name .. ": tuned matches the CPU and the untuned result; tuned once", function()
      local cpu, gpu = {}, {}
      for i, shape in ipairs(case.args) do
        cpu[i] = randn(shape, case.dtype)
        gpu[i] = cpu[i]:cuda()
      end
      local want = case.fn(table.unpack(cpu))
      local untuned = with_tune(false, function() return case.fn(table.unpack(gpu)) end)
      local before = count()
      local tuned = with_tune(true, function() return case.fn(table.unpack(gpu)) end)
      assert.equals(before + 1, count(), "one new key tuned")
      close(untuned, want, TOL[case.dtype], "untuned vs CPU")
      close(tuned, want, TOL[case.dtype], "tuned vs CPU")
      close(tuned, untuned, TOL[case.dtype], "tuned vs untuned")
      -- the cached choice on fresh inputs of the same shape: no new row, still right
      for i, shape in ipairs(case.args) do
        cpu[i] = randn(shape, case.dtype)
        gpu[i] = cpu[i]:cuda()
      end
      local again = with_tune(true, function() return case.fn(table.unpack(gpu)) end)
      assert.equals(before + 1, count(), "the second call hits the cache")
      close(again, case.fn(table.unpack(cpu)), TOL[case.dtype], "cached choice vs CPU")
    end)
  end

  it("records the key and the times: the winner is never slower than the heuristic's first", function()
    local a, b = randn({200, 136}, "bf16"):cuda(), randn({136, 328}, "bf16"):cuda()
    local before = count()
    with_tune(true, function() return a:matmul(b) end)
    local rows = ember.core.matmul_tune_table()
    assert.equals(before + 1, #rows)
    local r = rows[#rows]
    -- row-major terms: C (n x m) = A (n x k) @ B (k x m)
    assert.are.same({200, 328, 136, 1, "bf16", false, false, false, 0, false},
      {r.n, r.m, r.k, r.batch, r.dtype, r.a_trans, r.b_trans, r.bias, r.beta, r.in_capture})
    -- cuBLASLt's list (the heuristic's first and up to 16 more) and up to 24 extra configurations
    assert.is_true(r.extra >= 0 and r.extra <= 24, "extra " .. tostring(r.extra))
    assert.is_true(r.skipped >= 0, "skipped " .. tostring(r.skipped))
    assert.is_true(r.candidates - r.extra >= 1 and r.candidates - r.extra <= 17,
      ("candidates %d, extra %d"):format(r.candidates, r.extra))
    assert.is_true(r.chosen >= 0 and r.chosen < 17 + r.extra, "chosen " .. tostring(r.chosen))
    assert.is_false(r.forced)
    assert.is_true(r.time_us > 0 and r.heuristic_time_us > 0,
      ("times %s / %s us"):format(tostring(r.time_us), tostring(r.heuristic_time_us)))
    assert.is_true(r.time_us <= r.heuristic_time_us,
      ("tuned %.2f us > heuristic %.2f us"):format(r.time_us, r.heuristic_time_us))
    if r.chosen == 0 then assert.equals(r.heuristic_algo, r.algo) end
    -- calls that ran the choice: the tuning call, one more with tuning on, none with it off
    assert.equals(1, r.calls)
    with_tune(true, function() return a:matmul(b) end)
    with_tune(false, function() return a:matmul(b) end)
    assert.equals(2, ember.core.matmul_tune_table()[#rows].calls)
  end)

  -- with_tune, with ember.core.matmul_tune_force_splitk(k) set (restored even when fn raises)
  local function with_splitk(k, fn)
    local prev = ember.core.matmul_tune_force_splitk(k)
    local res = table.pack(pcall(with_tune, true, fn))
    ember.core.matmul_tune_force_splitk(prev)
    if not res[1] then error(res[2], 0) end
    return table.unpack(res, 2, res.n)
  end

  -- the newest row of (n, m, k, beta), and what the failure message should say about it
  local function row_of(n, m, k, beta)
    local rows = ember.core.matmul_tune_table()
    for i = #rows, 1, -1 do
      local r = rows[i]
      if r.n == n and r.m == m and r.k == k and r.beta == beta then
        return r, ("%d x %d x %d beta %g: %d timed (%d extra), %d refused by the check, chosen %d, split-K %d")
          :format(n, m, k, beta, r.candidates, r.extra, r.skipped, r.chosen, r.splitk)
      end
    end
    error(("no tuned row of %d x %d x %d beta %g"):format(n, m, k, beta))
  end

  it("a split-K candidate (forced: 2 slices) is within the gemm tolerance of the CPU; repeat calls the same bits",
    function()
    -- a small output over a long k: split-K's shape (a deterministic reduction in f32, one rounding)
    local a, b = randn({256, 2048}, "bf16"), randn({2048, 320}, "bf16")
    local ag, bg = a:cuda(), b:cuda()
    local before = count()
    local first, second = with_splitk(2, function() return ag:matmul(bg), ag:matmul(bg) end)
    assert.equals(before + 1, count(), "one new key tuned")
    local r, what = row_of(256, 320, 2048, 0)
    assert.is_true(r.forced, "a split-K 2 candidate ran: " .. what)
    assert.equals(2, r.splitk, what)
    close(first, a:matmul(b), TOL.bf16, "split-K 2 vs CPU")
    C.assert_same_bits(second, first, "the second call")
    -- a later call, the hook reset: the key keeps its split-K choice and its bits
    local third = with_tune(true, function() return ag:matmul(bg) end)
    C.assert_same_bits(third, first, "a third call")
  end)

  it("split-K (forced: 3 slices) on the autocast linear's f32 weight gradients, accumulated: right, repeatable",
    function()
    local function grads(device, R)
      local x = R.randn({1024, 256}, "f32"):to(device)
      local w = R.randn({192, 256}, "f32"):to(device)
      w.requires_grad = true
      for _ = 1, 2 do   -- the second backward adds into w.grad (beta = 1)
        local y = ember.autocast("bf16", function() return F.linear(x, w) end)
        y:float():sum():backward()
      end
      return w.grad
    end
    local want = grads("cpu", H.seeded(4300))
    local got = with_splitk(3, function() return grads("cuda", H.seeded(4300)) end)
    for _, beta in ipairs({0, 1}) do
      local r, what = row_of(192, 256, 1024, beta)
      assert.is_true(r.c_f32 and r.forced, "a split-K 3 candidate ran on the f32 gradient: " .. what)
      assert.equals(3, r.splitk, what)
    end
    assert.equals("f32", got.dtype)
    close(got, want, TOL.bf16, "w.grad after two backwards")
    -- the same keys again (their choices cached): the same bits
    local again = with_tune(true, function() return grads("cuda", H.seeded(4300)) end)
    C.assert_same_bits(again, got, "w.grad, a second run")
  end)

  it("an accumulating weight gradient (beta = 1) is tuned on a scratch copy: the sum stays right", function()
    -- the autocast linear's backward adds a second backward's weight
    -- gradient into .grad with beta = 1; tuning that gemm on .grad itself
    -- would add the product once per timed run
    local function grads(device, R)
      local x = R.randn({320, 576}, "f32"):to(device)
      local w = R.randn({448, 576}, "f32"):to(device)
      w.requires_grad = true
      for _ = 1, 2 do
        local y = ember.autocast("bf16", function() return F.linear(x, w) end)
        y:float():sum():backward()
      end
      return w.grad
    end
    local want = grads("cpu", H.seeded(4200))
    local before = count()
    local got = with_tune(true, function() return grads("cuda", H.seeded(4200)) end)
    assert.is_true(count() > before, "the backward's gemms were tuned")
    local beta1 = false
    for _, r in ipairs(ember.core.matmul_tune_table()) do
      if r.beta == 1 and r.n == 448 and r.m == 576 and r.k == 320 then beta1 = true end
    end
    assert.is_true(beta1, "the accumulating (448 x 576, k 320) gemm is in the table")
    assert.equals("f32", got.dtype)
    close(got, want, TOL.bf16, "w.grad after two backwards")
  end)

  it("times nothing inside graph capture: the key keeps the heuristic's choice, in the graph and after", function()
    local a, b = randn({232, 184}, "bf16"), randn({184, 152}, "bf16")
    local ag, bg = a:cuda(), b:cuda()
    -- the heuristic's bits for this key, before anything tunes it
    local heuristic = with_tune(false, function() return ag:matmul(bg) end)
    local before = count()
    local g, out = with_tune(true, function()
      return ember.cuda.graph(function() return ag:matmul(bg) end, {warmup = 0})
    end)
    assert.equals(before + 1, count(), "the key is recorded once, during capture")
    local r = ember.core.matmul_tune_table()[count()]
    assert.are.same({232, 152, 184, true, 0, 0}, {r.n, r.m, r.k, r.in_capture, r.candidates, r.chosen})
    assert.is_nil(r.time_us)
    g:replay()
    C.assert_same_bits(out, heuristic, "replay vs the heuristic's bits")
    for _ = 1, 2 do
      local a2, b2 = randn({232, 184}, "bf16"), randn({184, 152}, "bf16")
      ag:copy_(a2:cuda()); bg:copy_(b2:cuda())
      g:replay()
      close(out, a2:matmul(b2), TOL.bf16, "graph replay")
    end
    local eager = with_tune(true, function() return ag:matmul(bg) end)
    assert.equals(before + 1, count(), "an eager call after capture does not tune the key")
    C.assert_same_bits(eager, out, "eager after capture vs the last replay")
    g:close()
  end)

  it("tuning off gives the heuristic's bits, also after the key was tuned", function()
    local a, b = randn({168, 248}, "f32"):cuda(), randn({248, 120}, "f32"):cuda()
    local heuristic = with_tune(false, function() return a:matmul(b) end)
    local before = count()
    local tuned = with_tune(true, function() return a:matmul(b) end)
    assert.equals(before + 1, count())
    close(tuned, heuristic, TOL.f32, "tuned vs heuristic")
    local off = with_tune(false, function() return a:matmul(b) end)
    C.assert_same_bits(off, heuristic, "tuning off after tuning")
    assert.equals(before + 1, count(), "tuning off records nothing")
  end)

  it("EMBER_MATMUL_TUNE=0 in a fresh process gives the heuristic's bits and tunes nothing", function()
    local body = [[
      local ember = require "ember"
      ember.manual_seed(77)
      local a, b = ember.randn({96, 160}):cuda(), ember.randn({160, 112}):cuda()
      local r = a:matmul(b):cpu():reshape(-1):tolist()
      for i = 1, #r do r[i] = string.format("%a", r[i]) end
      print(tostring(ember.backends.matmul_tune()) .. " " .. #ember.core.matmul_tune_table())
      print(table.concat(r, " "))
    ]]
    local script = H.temp_file(body, ".lua")
    -- the child needs device memory for its own context: hand back what this process caches
    collectgarbage(); collectgarbage()
    ember.cuda.empty_cache()
    local function run(value)
      local out, err, status = H.ember({"run", script}, {env = {EMBER_MATMUL_TUNE = value}})
      assert.equals(0, status, err)
      local head, bits = out:match("^(.-)\n(.-)\n$")
      assert.is_truthy(head, "output: " .. out)
      return head, bits
    end
    local head0, bits0 = run("0")
    local head1, bits1 = run("1")
    os.remove(script)
    assert.equals("false 0", head0)
    assert.equals("true 1", head1)
    ember.manual_seed(77)
    local a, b = ember.randn({96, 160}):cuda(), ember.randn({160, 112}):cuda()
    local r = with_tune(false, function() return a:matmul(b) end):cpu():reshape(-1):tolist()
    for i = 1, #r do r[i] = string.format("%a", r[i]) end
    assert.equals(table.concat(r, " "), bits0, "EMBER_MATMUL_TUNE=0 vs the heuristic here")
    -- the tuned process: right to f32 accuracy, bits free to differ
    local got = {}
    for v in bits1:gmatch("%S+") do got[#got + 1] = tonumber(v) end
    local want = a:cpu():matmul(b:cpu())
    close(ember.tensor(got):reshape({96, 112}), want, TOL.f32, "EMBER_MATMUL_TUNE=1 vs CPU")
  end)
end)
