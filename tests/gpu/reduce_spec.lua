-- reduce_spec.lua (GPU) — kernels/reduce.cu against engine/ops/reduce.c:
-- sum/mean/var, max/min with indices, argmax/argmin, logsumexp, softmax and
-- log_softmax (forward and the fused backward), over shapes chosen to drive
-- every launch shape: a warp per output (rows <= 1024), a block per output,
-- rows split across blocks (few outputs, long rows), the column kernel
-- (reducing over a strided dim), several dims, non-contiguous inputs; the
-- softmax register kernels (warp and block), the looped kernel (long or
-- unaligned rows, f64) and the column kernel (a non-last dim).
--
-- The reference is the CPU on the same dtype. It accumulates in double; the
-- GPU accumulates in f32 (f64 for f64) in a tree, so float results are
-- compared with compare.lua's tolerance for the result dtype, whose atol term
-- (rtol * max |ref|) absorbs the cancellation in sums of randn values.
-- Integer sums, extreme values, and every index must match exactly: ties go
-- to the first index and a NaN wins over everything (the first NaN).
local ember = require "ember"
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local cmp = dofile(here .. "compare.lua")

assert(ember.cuda.is_available(), "tests/gpu needs a CUDA device (run with EMBER_TEST_GPU=1 on a GPU host)")

local function is_float(dt) return dt == "f32" or dt == "f64" or dt == "bf16" or dt == "f16" end

-- Run f on the CPU input and on its CUDA copy; compare every returned tensor
-- (values with the dtype's tolerance, or exactly when exact is set).
local function agree(what, f, a, exact)
  local r = table.pack(f(a))
  local g = table.pack(f(a:to("cuda")))
  assert.are.equal(r.n, g.n, what .. ": number of results")
  for i = 1, r.n do
    local x, y = g[i], r[i]
    assert.are.equal("cuda:0", x.device, what .. ": device")
    assert.are.equal(y.dtype, x.dtype, what .. ": dtype")
    cmp.assert_close(x, y, exact and 0 or cmp.rtol(y.dtype), ("%s (result %d)"):format(what, i))
  end
end

-- shapes and the reductions that send them through each launch shape
local LAYOUTS = {
  {"rows, a warp per output", {37, 1000}, {-1}},
  {"rows, a block per output", {6, 5000}, {1}},
  {"rows of 3000, a warp per output (enough rows to fill the GPU)", {2200, 3000}, {1}},
  {"rows split across blocks", {2, 300007}, {1}},
  {"everything, split", {1000003}, {}},
  {"columns (dim 0)", {3000, 70}, {0}},
  {"columns split (tall, narrow)", {200000, 3}, {0}},
  {"columns over the middle dim", {16, 300, 5}, {1}},
  {"columns, 16-byte vectors of outputs", {3000, 64}, {0}},
  {"columns over the middle dim, vectors, split", {4, 20000, 24}, {1}},
  {"two dims {0, 2}", {7, 9, 11}, {0, 2}},
}

local function maker(dt, shape)
  if is_float(dt) then return ember.randn(shape, {dtype = "f64"}):to(dt) end
  if dt == "bool" then return ember.rand(shape):lt(0.3) end
  return ember.randint(-100, 101, shape):to(dt)
end

describe("sum and mean on CUDA", function()
  for _, L in ipairs(LAYOUTS) do
    it("sums and averages: " .. L[1], function()
      ember.manual_seed(1)
      for _, dt in ipairs({"f32", "bf16", "f16", "f64"}) do
        local a = maker(dt, L[2])
        agree("sum " .. dt, function(x) return x:sum(L[3]) end, a)
        agree("mean keepdim " .. dt, function(x) return x:mean(L[3], {keepdim = true}) end, a)
      end
    end)
  end

  it("sums integers and bools exactly into i64", function()
    ember.manual_seed(2)
    for _, dt in ipairs({"i32", "i64", "u8", "bool"}) do
      for _, L in ipairs(LAYOUTS) do agree("sum " .. dt .. " " .. L[1], function(x) return x:sum(L[3]) end, maker(dt, L[2]), true) end
    end
  end)

  it("reduces transposed and narrowed inputs", function()
    ember.manual_seed(3)
    local a = ember.randn(700, 90)
    agree("sum of a transpose over dim 1", function(x) return x:t():sum(1) end, a)
    agree("sum of a transpose over dim 0", function(x) return x:t():sum(0) end, a)
    agree("mean of a narrow, unaligned rows", function(x) return x:narrow(1, 1, 77):mean(-1) end, a)
    agree("sum over all of a transpose", function(x) return x:t():sum() end, a)
  end)

  it("handles empty reductions (sum 0, mean NaN) and 0-d inputs", function()
    agree("sum over an empty dim", function(x) return x:sum(1) end, ember.zeros({4, 0}))
    agree("mean over an empty dim", function(x) return x:mean(1) end, ember.zeros({4, 0}))
    agree("sum of a 0-d", function(x) return x:sum() end, ember.tensor(2.5))
  end)
end)

describe("var on CUDA", function()
  it("computes unbiased and biased variance over each layout", function()
    ember.manual_seed(4)
    for _, L in ipairs(LAYOUTS) do
      for _, dt in ipairs({"f32", "bf16", "f64"}) do
        local a = maker(dt, L[2]) + 3   -- an offset: the two-pass form must not lose it
        agree("var " .. L[1] .. " " .. dt, function(x) return x:var(L[3]) end, a)
        agree("var correction 0 " .. L[1] .. " " .. dt, function(x) return x:var(L[3], {correction = 0}) end, a)
      end
    end
  end)
end)

describe("max, min, argmax, argmin on CUDA", function()
  -- small integer values: many ties, so the first-index rule is exercised
  local function tied(dt, shape) return ember.randint(0, 4, shape):to(dt) end
  local ONE_DIM = {{"warp rows", {37, 1000}, 1}, {"block rows", {6, 5000}, -1}, {"split rows", {2, 300007}, 1},
                   {"many rows of 3001, a warp each", {2200, 3001}, 1},
                   {"columns", {3000, 70}, 0}, {"tall columns", {200000, 3}, 0}, {"middle dim", {16, 300, 5}, 1},
                   {"columns, vectors", {3000, 64}, 0}, {"middle dim, vectors", {3, 5000, 32}, 1}}
  for _, L in ipairs(ONE_DIM) do
    it("returns the values and first indices: " .. L[1], function()
      ember.manual_seed(5)
      for _, dt in ipairs({"f32", "bf16", "f64", "i32", "u8"}) do
        local a = tied(dt, L[2])
        agree("max " .. dt, function(x) return x:max(L[3]) end, a, true)
        agree("min keepdim " .. dt, function(x) return x:min(L[3], {keepdim = true}) end, a, true)
        agree("argmax " .. dt, function(x) return x:argmax(L[3]) end, a, true)
        agree("argmin " .. dt, function(x) return x:argmin(L[3]) end, a, true)
      end
    end)
  end

  it("reduces over all elements: values, and the flat first index", function()
    ember.manual_seed(6)
    for _, dt in ipairs({"f32", "bf16", "i64", "bool"}) do
      local a = dt == "bool" and ember.rand({1000003}):lt(0.5) or tied(dt, {1000003})
      agree("max all " .. dt, function(x) return x:max() end, a, true)
      agree("argmin all " .. dt, function(x) return x:argmin() end, a, true)
      local m = dt == "bool" and ember.rand({1009, 991}):lt(0.5) or tied(dt, {1009, 991})
      agree("argmax all of a transpose " .. dt, function(x) return x:t():argmax() end, m, true)
    end
  end)

  it("lets the first NaN win, as the CPU does", function()
    ember.manual_seed(7)
    local v = ember.randn(4, 3000):tolist()
    v[2][101] = 0 / 0; v[2][2001] = 0 / 0   -- row 1: two NaNs (Lua lists are 1-based)
    v[4][3000] = 0 / 0                      -- row 3: a NaN last
    local a = ember.tensor(v)
    agree("max with NaN", function(x) return x:max(1) end, a, true)
    agree("argmin with NaN", function(x) return x:argmin(1) end, a, true)
    agree("max of all with NaN", function(x) return x:max() end, a, true)
  end)

  it("scatters the gradient of max over a dim to the winning positions", function()
    ember.manual_seed(8)
    for _, dt in ipairs({"f32", "bf16"}) do
      local a = ember.randn({64, 333}, {dtype = "f64"}):to(dt)
      local w = ember.randn({333}, {dtype = "f64"}):to(dt)
      local function grad(device)
        local x = a:to(device):clone(); x.requires_grad = true
        local v = x:max(0)
        local loss = (v * w:to(device)):sum()
        loss:backward()
        return x.grad
      end
      cmp.assert_close(grad("cuda"), grad("cpu"), 0, "max gradient " .. dt)
    end
  end)
end)

describe("logsumexp on CUDA", function()
  it("matches the CPU over rows, columns and all elements", function()
    ember.manual_seed(9)
    for _, dt in ipairs({"f32", "bf16", "f64"}) do
      local a = (ember.randn({300, 2000}, {dtype = "f64"}) * 4):to(dt)
      agree("logsumexp -1 " .. dt, function(x) return x:logsumexp(-1) end, a)
      agree("logsumexp 0 keepdim " .. dt, function(x) return x:logsumexp(0, {keepdim = true}) end, a)
    end
    agree("logsumexp of ints gives f32", function(x) return x:logsumexp(1) end, ember.randint(-5, 5, {7, 9}))
  end)

  it("keeps -inf, +inf and NaN rows as the CPU does", function()
    local inf = math.huge
    local a = ember.tensor({{-inf, -inf, -inf}, {1, -inf, 2}, {inf, 1, 2}, {0 / 0, 1, 2}})
    agree("logsumexp specials", function(x) return x:logsumexp(1) end, a)
  end)
end)

describe("softmax and log_softmax on CUDA", function()
  local LENGTHS = {1, 5, 33, 256, 1000, 1024, 2048, 4100, 10000, 20000, 50001, 70000}
  for _, dt in ipairs({"f32", "bf16", "f16", "f64"}) do
    it("normalises rows of every length class [" .. dt .. "]", function()
      ember.manual_seed(10)
      for _, len in ipairs(LENGTHS) do
        local rows = math.max(1, 50000 // len)
        local a = (ember.randn({rows, len}, {dtype = "f64"}) * 3):to(dt)
        agree("softmax L=" .. len, function(x) return x:softmax(-1) end, a)
        agree("log_softmax L=" .. len, function(x) return x:log_softmax(-1) end, a)
      end
    end)
  end

  it("works along a non-last dim and on non-contiguous inputs", function()
    ember.manual_seed(11)
    for _, dt in ipairs({"f32", "bf16", "f64"}) do
      local a = ember.randn({4, 9, 33}, {dtype = "f64"}):to(dt)
      agree("softmax dim 1 " .. dt, function(x) return x:softmax(1) end, a)
      agree("log_softmax dim 0 " .. dt, function(x) return x:log_softmax(0) end, a)
      agree("softmax of a transpose " .. dt, function(x) return x:transpose(1, 2):softmax(-1) end, a)
    end
  end)

  it("handles masked (-inf) entries and fully masked rows like the CPU", function()
    local causal = ember.ones(6, 40):triu(1):ne(0)
    local last_row = ember.arange(6):eq(5):view(6, 1)        -- row 5 fully masked
    local a = ember.randn(6, 40):masked_fill(causal:logical_or(last_row), -math.huge)
    agree("causal-masked softmax", function(x) return x:softmax(-1) end, a)
    agree("causal-masked log_softmax", function(x) return x:log_softmax(-1) end, a)
  end)

  for _, log in ipairs({false, true}) do
    local name = log and "log_softmax" or "softmax"
    it("backward of " .. name .. " (one fused kernel) matches the CPU's formula", function()
      ember.manual_seed(12)
      for _, dt in ipairs({"f32", "bf16", "f64"}) do
        for _, shape in ipairs({{64, 7}, {16, 1000}, {4, 3000}, {5, 40, 3}}) do
          local dim = #shape == 3 and 1 or -1
          local a = ember.randn(shape, {dtype = "f64"}):to(dt)
          local w = ember.randn(shape, {dtype = "f64"}):to(dt)
          local function grad(device)
            local x = a:to(device):clone(); x.requires_grad = true
            local y = log and x:log_softmax(dim) or x:softmax(dim)
            local loss = (y * w:to(device)):sum()
            loss:backward()
            return x.grad
          end
          local g, r = grad("cuda"), grad("cpu")
          assert.are.equal(r.dtype, g.dtype)
          cmp.assert_close(g, r, cmp.rtol(dt), name .. " gradient " .. dt .. " " .. table.concat(shape, "x"))
        end
      end
    end)
  end
end)
