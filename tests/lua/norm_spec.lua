-- norm_spec.lua — the VALUES of F.rmsnorm (engine/ops/norm.c):
--   y = x / sqrt(mean(x², −1) + eps) · w,
-- per row of the last dim, with and without a weight, the effect of eps, and
-- low-precision inputs computed in f32. Gradients live in gradcheck_spec.lua,
-- errors in bad_input_spec.lua.
--
-- Run from the repository root:
--   LUA_PATH="build/lua/?.lua;build/lua/?/init.lua;;" LUA_CPATH="build/lua/?.so;;" \
--     busted tests/lua/norm_spec.lua
--
-- The reference is the formula in Lua doubles. Tolerances, and why:
--   * f64: 1e-14 relative (a D-term sum, a sqrt, a divide, two products).
--   * f32: 2^-20 (8 ulps) relative plus 2^-24 absolute: the engine's f32 path
--     rounds the inputs' products and the scale a few times; the absolute
--     part covers outputs near 0.
--   * bf16/f16: computed in f32 and rounded once, so exactly the f32 rmsnorm
--     of the widened values converted back, and within 1 ulp of the formula.

local ember = require "ember"
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local F = ember.nn.functional

local flat = H.flat

-- rmsnorm over the last dim of a tensor of `shape`, on flat values
local function rms_ref(vals, D, w, eps)
  local out = {}
  for base = 0, #vals - 1, D do
    local ss = 0.0
    for j = 1, D do ss = ss + vals[base + j] ^ 2 end
    local rstd = 1 / math.sqrt(ss / D + eps)
    for j = 1, D do out[base + j] = vals[base + j] * rstd * (w and w[j] or 1) end
  end
  return out
end

local assert_close = H.assert_close

local randn = H.randn

describe("F.rmsnorm", function()
  it("matches x / sqrt(mean(x²) + eps) · w per row (f64, (2, 3, 16))", function()
    local x, w = randn(1, {2, 3, 16}, "f64", 2), randn(2, {16}, "f64")
    local r = F.rmsnorm(x, w, 1e-5)
    assert.same({2, 3, 16}, r.shape)
    assert.equals("f64", r.dtype)
    assert_close(flat(r), rms_ref(flat(x), 16, flat(w), 1e-5), 1e-14, 0, "f64")
  end)

  it("f32: within 8 ulps of the double formula", function()
    local x, w = randn(3, {5, 32}, "f32", 3), randn(4, {32}, "f32")
    local r = F.rmsnorm(x, w, 1e-5)
    assert.equals("f32", r.dtype)
    assert_close(flat(r), rms_ref(flat(x), 32, flat(w), 1e-5), 2 ^ -20, 2 ^ -24, "f32")
  end)

  it("without a weight is the plain normalisation (w = 1)", function()
    local x = randn(5, {4, 8}, "f64")
    assert_close(flat(F.rmsnorm(x)), rms_ref(flat(x), 8, nil, 1e-5), 1e-14, 0, "no weight")
    assert_close(flat(F.rmsnorm(x, nil, 0.1)), rms_ref(flat(x), 8, nil, 0.1), 1e-14, 0, "no weight, eps 0.1")
  end)

  it("defaults eps to 1e-5", function()
    local x = randn(6, {2, 4}, "f64", 0.01)          -- mean(x²) ~ 1e-4: eps matters at 10%
    assert.same(F.rmsnorm(x, nil, 1e-5):tolist(), F.rmsnorm(x):tolist())
    assert.are_not.same(F.rmsnorm(x, nil, 0):tolist(), F.rmsnorm(x):tolist())
  end)

  it("eps changes the result as the formula says: small rows are damped", function()
    local x = randn(7, {3, 8}, "f64", 1e-3)          -- mean(x²) ~ 1e-6
    for _, eps in ipairs({0, 1e-6, 1e-5, 1}) do
      assert_close(flat(F.rmsnorm(x, nil, eps)), rms_ref(flat(x), 8, nil, eps), 1e-14, 0, "eps " .. eps)
    end
    -- with eps = 0 every row has rms exactly 1
    local y = F.rmsnorm(x, nil, 0):tolist()
    for _, row in ipairs(y) do
      local ss = 0.0
      for _, v in ipairs(row) do ss = ss + v * v end
      assert.is_true(math.abs(ss / 8 - 1) < 1e-14)
    end
  end)

  it("is invariant to scaling a row when eps = 0", function()
    local x = randn(8, {2, 16}, "f64")
    assert_close(flat(F.rmsnorm(x * 1000, nil, 0)), flat(F.rmsnorm(x, nil, 0)), 1e-14, 0, "scaled")
  end)

  it("a row of zeros gives zeros, not NaN (eps > 0)", function()
    assert.same({{0, 0, 0, 0}}, F.rmsnorm(ember.zeros(1, 4), nil, 1e-5):tolist())
  end)

  it("handles large f32 inputs (1e18, whose sum of squares 4e36 is near the f32 limit)", function()
    local x = ember.tensor({{1e18, -1e18, 1e18, -1e18}})
    local r = flat(F.rmsnorm(x))
    assert_close(r, {1, -1, 1, -1}, 2 ^ -20, 0, "large")
  end)

  for _, dt in ipairs({"bf16", "f16"}) do
    it(dt .. " input is computed in f32 and rounded once to " .. dt, function()
      local x, w = randn(9, {4, 24}, dt, 2), randn(10, {24}, dt)
      local r = F.rmsnorm(x, w)
      assert.equals(dt, r.dtype)
      assert.same(flat(F.rmsnorm(x:float(), w:float()):to(dt)), flat(r))
      local want, got = rms_ref(flat(x), 24, flat(w), 1e-5), flat(r)
      local bits = dt == "bf16" and 8 or 11
      for i = 1, #want do
        local ulp = want[i] == 0 and 0 or 2.0 ^ (math.floor(math.log(math.abs(want[i]), 2)) - bits + 1)
        assert.is_true(math.abs(got[i] - want[i]) <= ulp,
          string.format("%s %d: %.9g vs %.9g", dt, i, got[i], want[i]))
      end
    end)
  end

  it("bf16 input with an f32 weight (master weights) gives bf16", function()
    local x, w = randn(11, {3, 8}, "bf16"), randn(12, {8}, "f32")
    local r = F.rmsnorm(x, w)
    assert.equals("bf16", r.dtype)
    assert.same(flat(F.rmsnorm(x:float(), w):to("bf16")), flat(r))
  end)

  it("reads a non-contiguous input by its logical rows", function()
    local x = randn(13, {8, 3}, "f64"):t()            -- (3, 8), strides (1, 3)
    assert_close(flat(F.rmsnorm(x, nil, 1e-5)), rms_ref(flat(x), 8, nil, 1e-5), 1e-14, 0, "transposed")
  end)

  it("a 1-D input is one row", function()
    local x = ember.tensor({3, 4}, {dtype = "f64"})     -- rms = sqrt(12.5)
    assert_close(flat(F.rmsnorm(x, nil, 0)), {3 / math.sqrt(12.5), 4 / math.sqrt(12.5)}, 1e-15, 0, "1-D")
  end)
end)
