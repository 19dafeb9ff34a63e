-- elementwise_spec.lua — the VALUES of the elementwise ops (engine/ops/elementwise.c):
-- every binary and unary op, clamp, where, masked_fill, triu/tril, broadcasting,
-- numbers on either side of an operator, in-place twins and {out=}, PyTorch's
-- dtype promotion, bf16/f16 "computed in f32, rounded once", and IEEE special
-- values. Gradients live in gradcheck_spec.lua, errors in bad_input_spec.lua.
--
-- Run from the repository root:
--   LUA_PATH="build/lua/?.lua;build/lua/?/init.lua;;" LUA_CPATH="build/lua/?.so;;" \
--     busted tests/lua/elementwise_spec.lua
--
-- References are computed here, in plain Lua doubles, from the inputs' exact
-- values (t:tolist()); f32 rounding is string.pack("f"), an IEEE cast.
-- Tolerances, and why:
--   * + - * / sqrt square reciprocal neg abs floor ceil round sign relu
--     maximum minimum clamp: EXACT. One IEEE operation on f32 inputs done in
--     double and rounded to f32 equals the f32 operation (double has more than
--     2·24+2 bits, so the double rounding is innocuous).
--   * f32 transcendentals (exp log tanh sin cos pow rsqrt sigmoid silu gelu):
--     F32_RTOL = 8 ulps relative + F32_ATOL = 2^-22 absolute. glibc's float
--     functions are within 1-2 ulps; sigmoid/silu/gelu compose 2-4 roundings;
--     the absolute part covers gelu(x) for x ≈ -4, where 1 + erf(x/√2) cancels
--     to ~1e-4 and erff's ulp-of-1 error becomes an absolute ~1e-7.
--   * f64: F64_RTOL = 1e-13 relative + 1e-15 absolute: double libm is within an
--     ulp or two (2e-16); the margin covers the reference's own formulas (erf
--     by series, tanh through expm1).

local ember = require "ember"
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")

local F32_RTOL, F32_ATOL = 8 * 2 ^ -23, 2 ^ -22
local F64_RTOL, F64_ATOL = 1e-13, 1e-15

---------------------------------------------------------------------------
-- reference helpers (plain Lua)
---------------------------------------------------------------------------

local flat, f32, isnan, erf = H.flat, H.f32, H.isnan, H.erf

-- Round half to even (IEEE roundTiesToEven, torch.round).
local function round_half_even(x)
  if isnan(x) or x == math.huge or x == -math.huge then return x end
  local f = math.floor(x) + 0.0
  local d = x - f                      -- exact for doubles
  local r
  if d > 0.5 then r = f + 1
  elseif d < 0.5 then r = f
  else r = (f % 2 == 0) and f or f + 1 end
  if r == 0 and x < 0 then r = -0.0 end
  return r
end

-- x rounded to `bits` significant bits, ties to even (normal range only):
-- bits = 8 is bf16, bits = 11 is f16.
local function round_sig(x, bits)
  if x == 0 or isnan(x) or x == math.huge or x == -math.huge then return x end
  local e = math.floor(math.log(math.abs(x), 2))
  if 2.0 ^ e > math.abs(x) then e = e - 1 elseif 2.0 ^ (e + 1) <= math.abs(x) then e = e + 1 end
  local q = 2.0 ^ (e - bits + 1)
  return round_half_even(x / q) * q
end

-- erfc(z) for z >= 0 without the cancellation of 1 − erf(z): below 2, 1 − erf
-- loses at most 8 bits (erfc(2) ≈ 0.005); from 2 on, the continued fraction
-- erfc(z) = e^(−z²)/√π · 1/(z + (1/2)/(z + 1/(z + (3/2)/(z + ...)))),
-- evaluated bottom-up from 200 levels (far more than it needs at z >= 2).
local function erfc(z)
  if z < 2 then return 1 - erf(z) end
  local t = 0.0
  for k = 200, 1, -1 do t = (k / 2) / (z + t) end
  return math.exp(-z * z) / math.sqrt(math.pi) / (z + t)
end

-- gelu(x) = x Φ(x) = ½ x (1 + erf(x/√2)), through erfc for x < 0 (no cancellation).
local function gelu(x)
  if x >= 0 then return 0.5 * x * (1 + erf(x / math.sqrt(2))) end
  return 0.5 * x * erfc(-x / math.sqrt(2))
end

-- e^y − 1 without cancellation for small y (Taylor series), for tanh.
local function expm1(y)
  if math.abs(y) >= 1 then return math.exp(y) - 1 end
  local term, sum, n = y, y, 1
  repeat
    n = n + 1
    term = term * y / n
    sum = sum + term
  until math.abs(term) < 1e-18 * math.abs(sum)
  return sum
end

local function tanh(x)
  if x > 20 then return 1.0 elseif x < -20 then return -1.0 end
  local e = expm1(2 * x)
  return e / (e + 2)
end

local function sigmoid(x) return 1 / (1 + math.exp(-x)) end

-- Element-by-element comparison; NaN equals NaN, infinities must match exactly.
local assert_close = H.assert_close

local function assert_exact(got, ref, what) assert_close(got, ref, 0, 0, what) end

local map = H.map

local function map2(a, b, f)
  local out = {}
  for i = 1, #a do out[i] = f(a[i], b[i]) end
  return out
end

-- Fresh seeded inputs: standard normal scaled, or uniform in [lo, hi).
local function randn(seed, n, dtype, scale) return H.randn(seed, n, dtype or "f32", scale) end
local function uniform(seed, n, lo, hi, dtype)
  ember.manual_seed(seed)
  return (ember.rand(n, {dtype = "f64"}) * (hi - lo) + lo):to(dtype or "f32")
end

---------------------------------------------------------------------------
-- binary ops
---------------------------------------------------------------------------

local N = 96

-- {name, reference}; flags: b_away_from_zero (div: |b| in [0.5, 2)), a_positive
-- (pow: a in [0.25, 4)), inexact (a libm function: the transcendental tolerance)
local BINARY = {
  {"add", function(a, b) return a + b end},
  {"sub", function(a, b) return a - b end},
  {"mul", function(a, b) return a * b end},
  {"div", function(a, b) return a / b end, b_away_from_zero = true},
  {"pow", function(a, b) return a ^ b end, a_positive = true, inexact = true},
  {"maximum", function(a, b) return math.max(a, b) end},
  {"minimum", function(a, b) return math.min(a, b) end},
}

local function binary_inputs(spec, seed, dtype)
  local a = spec.a_positive and uniform(seed, N, 0.25, 4, dtype) or randn(seed, N, dtype, 3)
  local b
  if spec.b_away_from_zero then
    ember.manual_seed(seed + 1)
    local s = ember.rand(N, {dtype = "f64"})
    b = ((s * 1.5 + 0.5) * ember.where(ember.rand(N):lt(0.5), -1.0, 1.0):double()):to(dtype)
  else
    b = randn(seed + 1, N, dtype, 2)
  end
  return a, b
end

describe("binary ops against Lua references", function()
  for i, spec in ipairs(BINARY) do
    local name, ref = spec[1], spec[2]

    it(name .. " in f64 matches the double computation", function()
      local a, b = binary_inputs(spec, 100 + i, "f64")
      local got = flat(a[name](a, b))
      local want = map2(flat(a), flat(b), ref)
      if spec.inexact then assert_close(got, want, F64_RTOL, F64_ATOL, name)
      else assert_exact(got, want, name) end
    end)

    it(name .. " in f32 matches the double computation rounded to f32", function()
      local a, b = binary_inputs(spec, 200 + i, "f32")
      local r = a[name](a, b)
      assert.equals("f32", r.dtype)
      local want = map2(flat(a), flat(b), function(x, y) return f32(ref(x, y)) end)
      if spec.inexact then assert_close(flat(r), want, F32_RTOL, F32_ATOL, name)
      else assert_exact(flat(r), want, name) end
    end)
  end

  it("i64 arithmetic is exact integer arithmetic (add, sub, mul, maximum, minimum)", function()
    ember.manual_seed(7)
    local a = ember.randint(-1000000, 1000000, {50}, {dtype = "i64"})
    local b = ember.randint(-1000000, 1000000, {50}, {dtype = "i64"})
    local la, lb = flat(a), flat(b)
    assert.same(map2(la, lb, function(x, y) return x + y end), flat(a + b))
    assert.same(map2(la, lb, function(x, y) return x - y end), flat(a - b))
    assert.same(map2(la, lb, function(x, y) return x * y end), flat(a * b))
    assert.same(map2(la, lb, math.max), flat(ember.maximum(a, b)))
    assert.same(map2(la, lb, math.min), flat(ember.minimum(a, b)))
    assert.equals("i64", (a * b).dtype)
  end)

  it("i64 pow with a non-negative exponent is exact", function()
    local a = ember.tensor({2, -3, 7, 0, 1, -1}, {dtype = "i64"})
    local b = ember.tensor({10, 3, 5, 0, 62, 7}, {dtype = "i64"})
    assert.same({1024, -27, 16807, 1, 1, -1}, flat(a:pow(b)))
  end)
end)

describe("comparisons and logical ops", function()
  -- Small integer values so that ties (eq, le, ge) occur often.
  local function tied(seed, dtype)
    ember.manual_seed(seed)
    return ember.randint(-2, 3, {4, 6}, {dtype = "i64"}):to(dtype)
  end
  local CMP = {
    eq = function(x, y) return x == y end, ne = function(x, y) return x ~= y end,
    lt = function(x, y) return x < y end, le = function(x, y) return x <= y end,
    gt = function(x, y) return x > y end, ge = function(x, y) return x >= y end,
  }
  for _, dt in ipairs({"f32", "f64", "bf16", "i64", "i32", "u8"}) do
    for name, ref in pairs(CMP) do
      it(name .. " on " .. dt .. " gives a bool tensor of the Lua comparison", function()
        local a, b = tied(11, dt), tied(12, dt)
        local r = a[name](a, b)
        assert.equals("bool", r.dtype)
        assert.same(map2(flat(a), flat(b), ref), flat(r))
      end)
    end
  end

  it("compares across dtypes after promotion (i32 vs f32 with fractions)", function()
    local a = ember.tensor({1, 2, 3, 4}, {dtype = "i32"})
    local b = ember.tensor({1.0, 2.5, 2.5, 4.0})
    assert.same({true, false, false, true}, flat(a:eq(b)))
    assert.same({false, true, false, false}, flat(a:lt(b)))
  end)

  it("compares with a number on either side", function()
    local a = ember.tensor({-1.5, 0, 2, 3.5})
    assert.same({false, false, true, true}, flat(a:gt(1)))
    assert.same({true, true, false, false}, flat(ember.gt(1, a)))   -- 1 > a
    assert.same({false, false, true, false}, flat(a:eq(2)))
  end)

  it("compares bf16 with a number as the number is stored in bf16", function()
    -- 0.1 is not a bf16 value; PyTorch compares against the bf16 rounding of 0.1
    local a = ember.tensor({0.1}, {dtype = "bf16"})
    assert.same({true}, flat(a:eq(0.1)))
  end)

  it("logical_and and logical_or treat nonzero as true, on any dtype", function()
    ember.manual_seed(13)
    local a = ember.randint(-1, 2, {30}, {dtype = "i64"}):float()   -- -1, 0, 1
    local b = ember.randint(-1, 2, {30}, {dtype = "i64"})
    local la, lb = flat(a), flat(b)
    local r_and, r_or = a:logical_and(b), a:logical_or(b)
    assert.equals("bool", r_and.dtype)
    assert.equals("bool", r_or.dtype)
    assert.same(map2(la, lb, function(x, y) return x ~= 0 and y ~= 0 end), flat(r_and))
    assert.same(map2(la, lb, function(x, y) return x ~= 0 or y ~= 0 end), flat(r_or))
  end)

  it("logical_not gives bool: true exactly where the input is zero", function()
    local a = ember.tensor({-2, 0, 0.5, 0, 3})
    local r = a:logical_not()
    assert.equals("bool", r.dtype)
    assert.same({false, true, false, true, false}, flat(r))
    assert.same({false, true}, flat(ember.tensor({true, false}):logical_not()))
  end)

  it("NaN compares unequal to everything, itself included", function()
    local a = ember.tensor({0 / 0, 1})
    assert.same({false, true}, flat(a:eq(a)))
    assert.same({true, false}, flat(a:ne(a)))
    assert.same({false, false}, flat(a:lt(0 / 0)))
  end)
end)

---------------------------------------------------------------------------
-- unary ops
---------------------------------------------------------------------------

-- {name, reference}; flags: domain = "pos" (inputs in [0.01, 10)), exact (one
-- IEEE operation or none: compared exactly; otherwise the libm tolerance)
local UNARY = {
  {"neg", function(x) return -x end, exact = true},
  {"abs", math.abs, exact = true},
  {"sqrt", math.sqrt, domain = "pos", exact = true},
  {"rsqrt", function(x) return 1 / math.sqrt(x) end, domain = "pos"},
  {"exp", math.exp},
  {"log", math.log, domain = "pos"},
  {"tanh", tanh},
  {"sigmoid", sigmoid},
  {"silu", function(x) return x * sigmoid(x) end},
  {"relu", function(x) return x > 0 and x or 0.0 end, exact = true},
  {"gelu", gelu},
  {"sin", math.sin},
  {"cos", math.cos},
  {"square", function(x) return x * x end, exact = true},
  {"reciprocal", function(x) return 1 / x end, exact = true},
  {"sign", function(x) return x > 0 and 1.0 or x < 0 and -1.0 or 0.0 end, exact = true},
  {"floor", math.floor, exact = true},
  {"ceil", math.ceil, exact = true},
  {"round", round_half_even, exact = true},
}

local function unary_input(spec, seed, dtype)
  if spec.domain == "pos" then return uniform(seed, N, 0.01, 10, dtype) end
  return randn(seed, N, dtype, 2)
end

describe("erf and erfc, the references behind gelu", function()
  it("match high-precision values", function()
    -- Abramowitz & Stegun table 7.1 / high-precision values
    assert.is_true(math.abs(erf(0.5) - 0.52049987781304654) < 1e-15)
    assert.is_true(math.abs(erf(1.0) - 0.84270079294971487) < 1e-15)
    assert.is_true(math.abs(erf(2.0) - 0.99532226501895273) < 1e-15)
    assert.is_true(math.abs(erf(-1.5) + 0.96610514647531073) < 1e-15)
    -- erfc relative to its (tiny) value: 1e-14
    assert.is_true(math.abs(erfc(3.0) / 2.2090496998585441e-05 - 1) < 1e-14)
    assert.is_true(math.abs(erfc(5.0) / 1.5374597944280349e-12 - 1) < 1e-14)
    assert.is_true(math.abs(erfc(1.0) / 0.15729920705028513 - 1) < 1e-14)
  end)
end)

describe("unary ops against Lua references", function()
  for i, spec in ipairs(UNARY) do
    local name, ref = spec[1], spec[2]

    it(name .. " in f64", function()
      local x = unary_input(spec, 300 + i, "f64")
      local want = map(flat(x), function(v) return ref(v) + 0.0 end)
      local got = flat(x[name](x))
      if spec.exact then assert_exact(got, want, name)
      else assert_close(got, want, F64_RTOL, F64_ATOL, name) end
    end)

    it(name .. " in f32", function()
      local x = unary_input(spec, 400 + i, "f32")
      local r = x[name](x)
      assert.equals("f32", r.dtype)
      local want = map(flat(x), function(v) return f32(ref(v)) end)
      if spec.exact then assert_exact(flat(r), want, name)
      else assert_close(flat(r), want, F32_RTOL, F32_ATOL, name) end
    end)
  end

  it("round sends halves to the even neighbour, like torch.round", function()
    local x = ember.tensor({-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5, 2.4999, -3.5001})
    assert.same({-2, -2, 0, 0, 2, 2, 4, 2, -4}, flat(x:round()))
  end)

  it("gelu is the exact erf form, not the tanh approximation", function()
    -- at x = 1: erf form 0.841344746..., tanh form 0.841191990...: 1.5e-4 apart
    local g = ember.tensor({1.0}, {dtype = "f64"}):gelu():item()
    assert.is_true(math.abs(g - 0.8413447460685429) < 1e-15, tostring(g))
  end)

  it("float-only ops on integer tensors give f32 values", function()
    local x = ember.tensor({1, 4, 9}, {dtype = "i64"})
    local s = x:sqrt()
    assert.equals("f32", s.dtype)
    assert.same({1, 2, 3}, flat(s))
    local e = ember.tensor({0, 1}, {dtype = "i32"}):exp()
    assert.equals("f32", e.dtype)
    assert_close(flat(e), {1, f32(math.exp(1))}, F32_RTOL, 0, "exp(i32)")
    assert.equals("f32", ember.tensor({1, 2}, {dtype = "u8"}):reciprocal().dtype)
  end)

  it("integer-preserving ops keep the integer dtype and are exact", function()
    local x = ember.tensor({-3, 0, 5}, {dtype = "i32"})
    local cases = {
      {"neg", {3, 0, -5}}, {"abs", {3, 0, 5}}, {"square", {9, 0, 25}},
      {"sign", {-1, 0, 1}}, {"relu", {0, 0, 5}}, {"floor", {-3, 0, 5}},
    }
    for _, c in ipairs(cases) do
      local r = x[c[1]](x)
      assert.equals("i32", r.dtype, c[1])
      assert.same(c[2], flat(r), c[1])
    end
  end)
end)

---------------------------------------------------------------------------
-- clamp, where, masked_fill, triu/tril
---------------------------------------------------------------------------

describe("clamp", function()
  it("clamps to [lo, hi] elementwise (f32, exact)", function()
    local x = randn(501, N, "f32", 2)
    local want = map(flat(x), function(v) return math.min(math.max(v, -0.5), 1.25) end)
    assert_exact(flat(x:clamp(-0.5, 1.25)), want, "clamp")
  end)

  it("takes only a lower or only an upper bound", function()
    local x = ember.tensor({-2, -0.5, 0.5, 2})
    assert.same({0, 0, 0.5, 2}, flat(x:clamp(0)))
    assert.same({-2, -0.5, 0, 0}, flat(x:clamp(nil, 0)))
  end)

  it("keeps an integer dtype for integer bounds and gives f32 for fractional ones", function()
    local x = ember.tensor({-5, 0, 5}, {dtype = "i64"})
    local r = x:clamp(-2, 3)
    assert.equals("i64", r.dtype)
    assert.same({-2, 0, 3}, flat(r))
    local q = x:clamp(-2.5, 2.5)
    assert.equals("f32", q.dtype)
    assert.same({-2.5, 0, 2.5}, flat(q))
  end)

  it("propagates NaN", function()
    assert.is_true(isnan(ember.tensor({0 / 0}):clamp(0, 1):item()))
  end)

  it("clamp_ works in place and returns self", function()
    local x = ember.tensor({-3, 0.5, 3})
    local r = x:clamp_(-1, 1)
    assert.is_true(rawequal(r, x))
    assert.same({-1, 0.5, 1}, flat(x))
  end)
end)

describe("where", function()
  it("picks a where cond is true and b elsewhere, with broadcasting", function()
    ember.manual_seed(21)
    local cond = ember.rand(2, 3):lt(0.5)               -- (2, 3)
    local a = ember.randn(3)                            -- (3)
    local b = ember.randn(2, 1)                         -- (2, 1)
    local r = ember.where(cond, a, b)
    assert.same({2, 3}, r.shape)
    local c, la, lb, lr = cond:tolist(), a:tolist(), b:tolist(), r:tolist()
    for i = 1, 2 do
      for j = 1, 3 do
        assert.equals(c[i][j] and la[j] or lb[i][1], lr[i][j])
      end
    end
  end)

  it("accepts numbers for either branch", function()
    local cond = ember.tensor({true, false, true})
    local x = ember.tensor({1, 2, 3})
    assert.same({1, 0, 3}, flat(ember.where(cond, x, 0)))
    assert.same({-1, 2, -1}, flat(ember.where(cond, -1, x)))
  end)

  it("promotes the two branches (f32 with f64 gives f64; i64 with 2.5 gives f32)", function()
    local cond = ember.tensor({true, false})
    assert.equals("f64", ember.where(cond, ember.ones(2), ember.zeros(2, {dtype = "f64"})).dtype)
    local r = ember.where(cond, ember.tensor({1, 2}, {dtype = "i64"}), 2.5)
    assert.equals("f32", r.dtype)
    assert.same({1, 2.5}, flat(r))
  end)
end)

describe("masked_fill", function()
  it("fills where the mask is true, broadcasting a (3) mask over (2, 3)", function()
    local x = ember.tensor({{1, 2, 3}, {4, 5, 6}})
    local m = ember.tensor({true, false, true})
    assert.same({{-1, 2, -1}, {-1, 5, -1}}, x:masked_fill(m, -1):tolist())
    assert.same({{1, 2, 3}, {4, 5, 6}}, x:tolist())       -- out of place
  end)

  it("fills with -inf (the attention mask use)", function()
    local x = ember.zeros(2, 2)
    local m = ember.tensor({{false, true}, {false, false}})
    assert.same({{0, -math.huge}, {0, 0}}, x:masked_fill(m, -math.huge):tolist())
  end)

  it("masked_fill_ writes in place, returns self and bumps the version", function()
    local x = ember.tensor({1, 2, 3})
    local v = x:_version()
    local r = x:masked_fill_(ember.tensor({false, true, false}), 9)
    assert.is_true(rawequal(r, x))
    assert.same({1, 9, 3}, flat(x))
    assert.is_true(x:_version() > v)
  end)
end)

describe("triu and tril", function()
  local function check(name, keep, k, shape)
    ember.manual_seed(31)
    local x = ember.randn(shape)
    local r = x[name](x, k)
    assert.same(shape, r.shape)
    local rows, cols = shape[#shape - 1], shape[#shape]
    local lx, lr = flat(x), flat(r)
    for idx = 1, #lx do
      local within = (idx - 1) % (rows * cols)
      local i, j = within // cols, within % cols
      local want = keep(j - i, k) and lx[idx] or 0
      assert.equals(want, lr[idx], string.format("%s(k=%d) at (%d, %d)", name, k, i, j))
    end
  end
  local up = function(d, k) return d >= k end
  local lo = function(d, k) return d <= k end
  for _, k in ipairs({0, 1, -1, 5}) do
    it("triu keeps j - i >= " .. k .. " on a (3, 4) matrix", function() check("triu", up, k, {3, 4}) end)
    it("tril keeps j - i <= " .. k .. " on a (3, 4) matrix", function() check("tril", lo, k, {3, 4}) end)
  end
  it("triu applies to every matrix of a batch (2, 3, 3)", function() check("triu", up, 0, {2, 3, 3}) end)
  it("tril applies to every matrix of a batch (2, 3, 3)", function() check("tril", lo, -1, {2, 3, 3}) end)
  it("defaults to the main diagonal", function()
    local x = ember.ones(2, 2)
    assert.same({{1, 1}, {0, 1}}, x:triu():tolist())
    assert.same({{1, 0}, {1, 1}}, x:tril():tolist())
  end)
end)

---------------------------------------------------------------------------
-- broadcasting and numbers as operands
---------------------------------------------------------------------------

describe("broadcasting", function()
  it("broadcasts (2, 3) + (3)", function()
    ember.manual_seed(41)
    local a, b = ember.randn(2, 3, {dtype = "f64"}), ember.randn(3, {dtype = "f64"})
    local r = a + b
    assert.same({2, 3}, r.shape)
    local la, lb, lr = a:tolist(), b:tolist(), r:tolist()
    for i = 1, 2 do for j = 1, 3 do assert.equals(la[i][j] + lb[j], lr[i][j]) end end
  end)

  it("broadcasts (2, 1, 3) * (4, 1) to (2, 4, 3)", function()
    ember.manual_seed(42)
    local a, b = ember.randn(2, 1, 3, {dtype = "f64"}), ember.randn(4, 1, {dtype = "f64"})
    local r = a * b
    assert.same({2, 4, 3}, r.shape)
    local la, lb, lr = a:tolist(), b:tolist(), r:tolist()
    for i = 1, 2 do for j = 1, 4 do for k = 1, 3 do
      assert.equals(la[i][1][k] * lb[j][1], lr[i][j][k])
    end end end
  end)

  it("broadcasts a 0-d tensor against anything", function()
    local a = ember.tensor({{1, 2}, {3, 4}})
    assert.same({{10, 20}, {30, 40}}, (a * ember.tensor(10)):tolist())
  end)

  it("reads non-contiguous (transposed) operands by their strides", function()
    ember.manual_seed(43)
    local a = ember.randn(3, 2, {dtype = "f64"}):t()      -- (2, 3) view, strides (1, 2)
    local b = ember.randn(2, 3, {dtype = "f64"})
    local la, lb, lr = a:tolist(), b:tolist(), (a - b):tolist()
    for i = 1, 2 do for j = 1, 3 do assert.equals(la[i][j] - lb[i][j], lr[i][j]) end end
  end)
end)

describe("long operands (crossing the engine's 256-element inner chunks)", function()
  it("(3, 1000) + (1000) with a transposed (1000, 3)ᵀ third operand, f64", function()
    ember.manual_seed(44)
    local a = ember.randn(3, 1000, {dtype = "f64"})
    local b = ember.randn(1000, {dtype = "f64"})
    local c = ember.randn(1000, 3, {dtype = "f64"}):t()            -- (3, 1000), strides (1, 3)
    local r = (a + b) * c
    local la, lb, lc, lr = a:tolist(), b:tolist(), c:tolist(), r:tolist()
    for i = 1, 3 do for j = 1, 1000 do
      assert.equals((la[i][j] + lb[j]) * lc[i][j], lr[i][j], string.format("(%d, %d)", i, j))
    end end
  end)

  it("bf16 over 1000 elements (converted through the chunk buffers) rounds once", function()
    local a, b = randn(45, 1000, "bf16"), randn(46, 1000, "bf16")
    assert_exact(flat(a * b), map2(flat(a), flat(b), function(x, y) return round_sig(x * y, 8) end), "bf16 long")
  end)

  it("writes into a non-contiguous out and a non-contiguous in-place self", function()
    local a, b = randn(47, 600, "f64"), randn(48, 600, "f64")
    local out = ember.zeros(300, 2, {dtype = "f64"}):t()           -- (2, 300) view, strides (1, 2)
    ember.mul(a:view(2, 300), b:view(2, 300), {out = out})
    assert_exact(flat(out), map2(flat(a), flat(b), function(x, y) return x * y end), "strided out")
    local s = a:clone():view(300, 2):t()                            -- (2, 300) non-contiguous self
    s:sub_(b:view(2, 300))
    local la, lb, ls = a:view(300, 2):t():tolist(), b:view(2, 300):tolist(), s:tolist()
    for i = 1, 2 do for j = 1, 300 do assert.equals(la[i][j] - lb[i][j], ls[i][j]) end end
  end)
end)

describe("numbers as operands and the operators", function()
  local x                                     -- f64 so the references are exact
  before_each(function() x = randn(51, 12, "f64", 2) end)

  local function check(got, f)
    assert_exact(flat(got), map(flat(x), f), "operator")
  end

  it("t + 2 and 2 + t", function()
    check(x + 2, function(v) return v + 2 end)
    check(2 + x, function(v) return 2 + v end)
  end)
  it("t - 2 and 2 - t (the number is the left operand)", function()
    check(x - 2, function(v) return v - 2 end)
    check(2 - x, function(v) return 2 - v end)
  end)
  it("t * 3 and 3 * t", function()
    check(x * 3, function(v) return v * 3 end)
    check(3 * x, function(v) return 3 * v end)
  end)
  it("t / 4 and 4 / t", function()
    check(x / 4, function(v) return v / 4 end)
    check(4 / x, function(v) return 4 / v end)
  end)
  it("t ^ 2 squares and 2 ^ t exponentiates", function()
    check(x ^ 2, function(v) return v * v end)
    assert_close(flat(2 ^ x), map(flat(x), function(v) return 2 ^ v end), F64_RTOL, 0, "2 ^ t")
  end)
  it("unary minus negates", function()
    check(-x, function(v) return -v end)
  end)
  it("tensor OP tensor through the operators", function()
    local y = randn(52, 12, "f64", 2)
    assert_exact(flat(x + y), map2(flat(x), flat(y), function(a, b) return a + b end), "+")
    assert_exact(flat(x / y), map2(flat(x), flat(y), function(a, b) return a / b end), "/")
  end)
  it("the functional forms take a number first: ember.sub(2, t) = 2 - t", function()
    check(ember.sub(2, x), function(v) return 2 - v end)
    check(ember.div(1, x), function(v) return 1 / v end)
  end)
  it("an f32 tensor times a number rounds once to f32", function()
    local t = randn(53, 12, "f32")
    assert_exact(flat(t * 0.5), map(flat(t), function(v) return f32(v * 0.5) end), "t * 0.5")
    assert_exact(flat(1 - t), map(flat(t), function(v) return f32(1 - v) end), "1 - t")
  end)
end)

---------------------------------------------------------------------------
-- in-place twins and out=
---------------------------------------------------------------------------

describe("in-place twins", function()
  it("add_ writes into self, returns self and bumps the version", function()
    local a = randn(61, 6, "f64")
    local b = randn(62, 6, "f64")
    local want = map2(flat(a), flat(b), function(x, y) return x + y end)
    local v = a:_version()
    local r = a:add_(b)
    assert.is_true(rawequal(r, a))
    assert_exact(flat(a), want, "add_")
    assert.is_true(a:_version() > v)
  end)

  it("mul_ broadcasts the other operand into self's shape", function()
    local a = ember.tensor({{1, 2, 3}, {4, 5, 6}})
    a:mul_(ember.tensor({10, 0, -1}))
    assert.same({{10, 0, -3}, {40, 0, -6}}, a:tolist())
  end)

  it("sub_ and div_ with numbers", function()
    local a = ember.tensor({2, 4, 8}, {dtype = "f64"})
    a:sub_(1):div_(2)
    assert.same({0.5, 1.5, 3.5}, flat(a))
  end)

  it("unary twins (exp_, neg_, round_) write into self", function()
    local a = ember.tensor({0, 1}, {dtype = "f64"})
    local r = a:exp_()
    assert.is_true(rawequal(r, a))
    assert.same({1, math.exp(1)}, flat(a))
    local b = ember.tensor({0.5, 1.5, -2.5})
    b:round_()
    assert.same({0, 2, -2}, flat(b))
    b:neg_()
    assert.same({0, -2, 2}, flat(b))
  end)

  it("an in-place op on a view writes through to the base", function()
    local base = ember.zeros(2, 3)
    base:select(0, 1):add_(5)
    assert.same({{0, 0, 0}, {5, 5, 5}}, base:tolist())
  end)

  it("an in-place op whose other operand aliases self (shifted view) reads the old values", function()
    local a = ember.tensor({1, 2, 3, 4}, {dtype = "f64"})
    local head, tail = a:narrow(0, 1, 3), a:narrow(0, 0, 3)   -- head[i] = a[i+1], tail[i] = a[i]
    head:add_(tail)
    assert.same({1, 3, 5, 7}, flat(a))
  end)
end)

describe("out=", function()
  it("ember.add(a, b, {out=c}) writes c, returns c and bumps its version", function()
    local a, b = randn(71, 8, "f32"), randn(72, 8, "f32")
    local c = ember.empty(8)
    local v = c:_version()
    local r = ember.add(a, b, {out = c})
    assert.is_true(rawequal(r, c))
    assert_exact(flat(c), map2(flat(a), flat(b), function(x, y) return f32(x + y) end), "out")
    assert.is_true(c:_version() > v)
  end)

  it("a unary op writes into out", function()
    local a = ember.tensor({1, 4, 9})
    local c = ember.zeros(3)
    local r = ember.sqrt(a, {out = c})
    assert.is_true(rawequal(r, c))
    assert.same({1, 2, 3}, flat(c))
  end)

  it("converts the f32 result into an f64 out (same kind), computed in f32", function()
    local a, b = ember.tensor({0.1}), ember.tensor({0.2})
    local c = ember.zeros(1, {dtype = "f64"})
    ember.add(a, b, {out = c})
    assert.equals("f64", c.dtype)
    assert.equals(f32(f32(0.1) + f32(0.2)), c:item())
  end)

  it("a comparison writes bools into a bool out", function()
    local c = ember.zeros(3, {dtype = "bool"})
    ember.lt(ember.tensor({1, 2, 3}), 2, {out = c})
    assert.same({true, false, false}, flat(c))
  end)
end)

---------------------------------------------------------------------------
-- dtype promotion (PyTorch's table)
---------------------------------------------------------------------------

describe("result dtypes", function()
  local function t(dt) return ember.ones(2, {dtype = dt}) end
  local cases = {
    {"i64", "f32", "f32"}, {"bf16", "f16", "f32"}, {"u8", "i32", "i32"}, {"i32", "i64", "i64"},
    {"f32", "f64", "f64"}, {"bf16", "f32", "f32"}, {"bool", "u8", "u8"}, {"bool", "f16", "f16"},
    {"u8", "bf16", "bf16"}, {"i64", "f64", "f64"}, {"bf16", "bf16", "bf16"},
  }
  for _, c in ipairs(cases) do
    it(c[1] .. " + " .. c[2] .. " gives " .. c[3], function()
      assert.equals(c[3], (t(c[1]) + t(c[2])).dtype)
      assert.equals(c[3], (t(c[2]) + t(c[1])).dtype)
    end)
  end

  it("an integer tensor divided by an integer number is true division in f32", function()
    local r = ember.tensor({7, -3}, {dtype = "i64"}) / 2
    assert.equals("f32", r.dtype)
    assert.same({3.5, -1.5}, flat(r))
  end)

  it("int / int is true division in f32", function()
    local r = ember.tensor({7, -7, 1}, {dtype = "i64"}) / ember.tensor({2, 2, 3}, {dtype = "i32"})
    assert.equals("f32", r.dtype)
    assert.same({3.5, -3.5, f32(1 / 3)}, flat(r))
  end)

  it("comparisons give bool whatever the operands", function()
    assert.equals("bool", t("f32"):lt(t("i64")).dtype)
    assert.equals("bool", t("bf16"):eq(1).dtype)
  end)

  it("an integer tensor plus 2.5 gives f32 with the right values", function()
    local r = ember.tensor({1, 2}, {dtype = "i64"}) + 2.5
    assert.equals("f32", r.dtype)
    assert.same({3.5, 4.5}, flat(r))
  end)

  it("an integer tensor plus an integral number keeps its dtype", function()
    local r = ember.tensor({1, 2}, {dtype = "i32"}) + 2
    assert.equals("i32", r.dtype)
    assert.same({3, 4}, flat(r))
  end)

  it("a bf16 tensor times a number stays bf16", function()
    assert.equals("bf16", (t("bf16") * 2.5).dtype)
  end)

  it("a 0-d f64 tensor does not widen an f32 tensor, but does decide for an integer one", function()
    assert.equals("f32", (t("f32") + ember.tensor(1.5, {dtype = "f64"})).dtype)
    assert.equals("f64", (t("i32") + ember.tensor(1.5, {dtype = "f64"})).dtype)
  end)

  it("the computation follows the promoted dtype: u8 + i32 does not wrap at 256", function()
    local r = ember.tensor({200}, {dtype = "u8"}) + ember.tensor({100}, {dtype = "i32"})
    assert.same({300}, flat(r))
  end)
end)

---------------------------------------------------------------------------
-- bf16 / f16: computed in f32, rounded once
---------------------------------------------------------------------------

describe("bf16 and f16 results equal the f32 result rounded once", function()
  for _, dt in ipairs({"bf16", "f16"}) do
    for i, spec in ipairs(BINARY) do
      local name = spec[1]
      it(dt .. " " .. name, function()
        local a, b = binary_inputs(spec, 600 + i, dt)
        local got = a[name](a, b)
        assert.equals(dt, got.dtype)
        local want = a:float()[name](a:float(), b:float()):to(dt)
        assert_exact(flat(got), flat(want), dt .. " " .. name)
      end)
    end
    for i, spec in ipairs(UNARY) do
      local name = spec[1]
      it(dt .. " " .. name, function()
        local x = unary_input(spec, 700 + i, dt)
        local got = x[name](x)
        assert.equals(dt, got.dtype)
        assert_exact(flat(got), flat(x:float()[name](x:float()):to(dt)), dt .. " " .. name)
      end)
    end
  end

  -- An independent check of the rounding itself: round to 8 (bf16) or 11
  -- (f16) significant bits, ties to even, computed here in Lua.
  it("bf16 mul equals the exact product rounded to 8 significant bits", function()
    local a, b = randn(801, N, "bf16", 3), randn(802, N, "bf16", 3)
    -- the product of two 8-bit significands has at most 16 bits: exact in f32
    local want = map2(flat(a), flat(b), function(x, y) return round_sig(x * y, 8) end)
    assert_exact(flat(a * b), want, "bf16 mul")
  end)

  it("f16 add equals the exact sum rounded to 11 significant bits", function()
    local a, b = randn(803, N, "f16", 3), randn(804, N, "f16", 3)
    local want = map2(flat(a), flat(b), function(x, y)
      local s = f32(x + y)
      return math.abs(s) >= 2 ^ -14 and round_sig(s, 11) or s   -- normal range (subnormal f16 sums are exact)
    end)
    assert_exact(flat(a + b), want, "f16 add")
  end)
end)

---------------------------------------------------------------------------
-- special values
---------------------------------------------------------------------------

describe("special values (IEEE)", function()
  local inf, nan = math.huge, 0 / 0
  local function one(op, x, dt)
    local t = ember.tensor({x}, {dtype = dt or "f32"})
    return t[op](t):item()
  end

  for _, dt in ipairs({"f32", "f64", "bf16"}) do
    it("log(0) = -inf, log(-1) = nan, sqrt(-1) = nan in " .. dt, function()
      assert.equals(-inf, one("log", 0, dt))
      assert.is_true(isnan(one("log", -1, dt)))
      assert.is_true(isnan(one("sqrt", -1, dt)))
    end)
  end

  it("exp(inf) = inf, exp(-inf) = 0, exp(100) overflows f32 to inf", function()
    assert.equals(inf, one("exp", inf))
    assert.equals(0, one("exp", -inf))
    assert.equals(inf, one("exp", 100))
    assert.is_true(one("exp", 100, "f64") < inf)
  end)

  it("sigmoid and tanh saturate at ±inf; relu(-inf) = 0", function()
    assert.equals(1, one("sigmoid", inf))
    assert.equals(0, one("sigmoid", -inf))
    assert.equals(1, one("tanh", inf))
    assert.equals(-1, one("tanh", -inf))
    assert.equals(0, one("relu", -inf))
  end)

  it("reciprocal(±0) = ±inf and rsqrt(0) = inf", function()
    assert.equals(inf, one("reciprocal", 0))
    assert.equals(-inf, one("reciprocal", -0.0))
    assert.equals(inf, one("rsqrt", 0))
  end)

  it("1 / 0 = inf, -1 / 0 = -inf, 0 / 0 = nan", function()
    local r = flat(ember.tensor({1, -1, 0}) / ember.tensor({0, 0, 0}))
    assert.equals(inf, r[1])
    assert.equals(-inf, r[2])
    assert.is_true(isnan(r[3]))
  end)

  it("inf - inf = nan and inf * 0 = nan", function()
    assert.is_true(isnan((ember.tensor({inf}) - ember.tensor({inf})):item()))
    assert.is_true(isnan((ember.tensor({inf}) * 0):item()))
  end)

  it("NaN propagates through arithmetic and unary ops", function()
    local x = ember.tensor({nan})
    for _, op in ipairs({"exp", "log", "tanh", "sigmoid", "silu", "gelu", "abs", "neg", "sqrt",
                         "relu", "floor", "ceil", "round", "square", "sin"}) do
      assert.is_true(isnan(x[op](x):item()), op .. "(nan)")
    end
    assert.is_true(isnan((x + 1):item()))
    assert.is_true(isnan((2 * x):item()))
  end)

  it("maximum and minimum propagate NaN from either side (torch.maximum)", function()
    local a, b = ember.tensor({nan, 1}), ember.tensor({1, nan})
    for _, r in ipairs({flat(ember.maximum(a, b)), flat(ember.minimum(a, b))}) do
      assert.is_true(isnan(r[1]))
      assert.is_true(isnan(r[2]))
    end
  end)

  it("pow: 0^0 = 1, x^0 = 1 for nan, a negative base to a fractional power is nan", function()
    local r = flat(ember.tensor({0, nan, -8}) ^ ember.tensor({0, 0, 1 / 3}))
    assert.equals(1, r[1])
    assert.equals(1, r[2])
    assert.is_true(isnan(r[3]))
  end)

  it("abs(-inf) = inf and sign(-inf) = -1", function()
    assert.equals(inf, one("abs", -inf))
    assert.equals(-1, one("sign", -inf))
  end)
end)
