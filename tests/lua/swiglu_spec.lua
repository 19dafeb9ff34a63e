-- swiglu_spec.lua — the VALUES of F.swiglu (engine/ops/swiglu.c):
-- swiglu(a, b) = silu(a) · b = a · sigmoid(a) · b, the gate of the SwiGLU FFN.
-- Gradients live in gradcheck_spec.lua, errors (shape/dtype mismatch) in
-- bad_input_spec.lua.
--
-- Run from the repository root:
--   LUA_PATH="build/lua/?.lua;build/lua/?/init.lua;;" LUA_CPATH="build/lua/?.so;;" \
--     busted tests/lua/swiglu_spec.lua
--
-- Reference: a / (1 + e^(−a)) · b in Lua doubles. Tolerances, and why:
--   * f64: 1e-14 relative: three double operations and exp (≤ 1 ulp each).
--   * f32: 8 ulps relative (2^-20) plus 2^-30 absolute: expf is within 1-2 ulps
--     and the formula rounds 3-4 times in f32; the absolute part is for
--     results that underflow toward 0 (a ≪ 0).
--   * bf16: computed in f32 and rounded once: equal to the f32 swiglu of the
--     same values converted to bf16 (exact), and so within 1 bf16 ulp of Lua's.

local ember = require "ember"
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local F = ember.nn.functional

local flat, f32 = H.flat, H.f32

local function ref(a, b) return a / (1 + math.exp(-a)) * b end

local assert_close = H.assert_close

local function ab(seed, shape, dtype)
  ember.manual_seed(seed)
  local a = (ember.randn(shape, {dtype = "f64"}) * 3):to(dtype)
  local b = (ember.randn(shape, {dtype = "f64"}) * 2):to(dtype)
  return a, b
end

local function reference(a, b)
  local la, lb, out = flat(a), flat(b), {}
  for i = 1, #la do out[i] = ref(la[i], lb[i]) end
  return out
end

describe("F.swiglu", function()
  it("equals silu(a) * b in f64 on a (2, 3, 8) input", function()
    local a, b = ab(1, {2, 3, 8}, "f64")
    local r = F.swiglu(a, b)
    assert.same({2, 3, 8}, r.shape)
    assert.equals("f64", r.dtype)
    assert_close(flat(r), reference(a, b), 1e-14, 0, "f64")
  end)

  it("f32 is within 8 ulps of the double value", function()
    local a, b = ab(2, {64}, "f32")
    local r = F.swiglu(a, b)
    assert.equals("f32", r.dtype)
    local want = reference(a, b)
    for i, v in ipairs(want) do want[i] = f32(v) end
    assert_close(flat(r), want, 2 ^ -20, 2 ^ -30, "f32")
  end)

  it("agrees with the unfused ember.silu(a) * b", function()
    local a, b = ab(3, {4, 16}, "f32")
    assert_close(flat(F.swiglu(a, b)), flat(ember.silu(a) * b), 2 ^ -20, 2 ^ -30, "fused vs unfused")
  end)

  for _, dt in ipairs({"bf16", "f16"}) do
    it(dt .. " is the f32 result rounded once", function()
      local a, b = ab(4, {48}, dt)
      local r = F.swiglu(a, b)
      assert.equals(dt, r.dtype)
      assert.same(flat(F.swiglu(a:float(), b:float()):to(dt)), flat(r))
      local want, got = reference(a, b), flat(r)
      local bits = dt == "bf16" and 8 or 11
      for i = 1, #want do
        local w = want[i]
        local ulp = 2.0 ^ (math.floor(math.log(math.abs(w), 2)) - bits + 1)
        assert.is_true(math.abs(got[i] - w) <= ulp, string.format("%s %d: %.9g vs %.9g", dt, i, got[i], w))
      end
    end)
  end

  it("is a for large positive a (gate open) and 0 for large negative a (gate shut), no NaN", function()
    local a = ember.tensor({50, -50, 1000, -1000, 0})
    local b = ember.tensor({2, 2, 3, 3, 5})
    local r = flat(F.swiglu(a, b))
    assert.equals(100, r[1])
    assert.is_true(math.abs(r[2]) < 1e-18, tostring(r[2]))
    assert.equals(3000, r[3])
    assert.equals(0, r[4])
    assert.equals(0, r[5])
  end)

  it("reads non-contiguous inputs by their logical layout", function()
    local a, b = ab(5, {3, 4}, "f64")
    local at, bt = a:t(), b:t()
    assert_close(flat(F.swiglu(at, bt)), reference(at, bt), 1e-14, 0, "transposed")
  end)

  it("is linear in b: swiglu(a, 2b) = 2 swiglu(a, b) exactly (f64)", function()
    local a, b = ab(6, {16}, "f64")
    assert.same(flat(F.swiglu(a, b) * 2), flat(F.swiglu(a, b * 2)))
  end)
end)
