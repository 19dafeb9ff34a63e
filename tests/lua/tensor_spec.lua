-- tensor_spec.lua — creating tensors, their dtypes and conversions, inspecting
-- them, and printing them the way PyTorch does.
--
-- Run from the repository root (after building into build-specs/ or build/):
--   LUA_PATH="build/lua/?.lua;build/lua/?/init.lua;;" LUA_CPATH="build/lua/?.so;;" \
--     busted tests/lua/tensor_spec.lua
--
-- Values that are exactly representable are compared exactly; the few
-- tolerances below say why they are what they are.

local ember = require "ember"
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")

-- The little-endian bytes of t's elements, read back from a safetensors file
-- (the one place a tensor's raw bit patterns are visible from Lua).
local raw_bytes = H.raw_bytes

local function u16_bits(t)
  local b, out = raw_bytes(t), {}
  for i = 1, #b, 2 do out[#out + 1] = string.unpack("<I2", b, i) end
  return out
end

describe("ember.tensor", function()
  it("builds an f32 tensor from nested tables", function()
    local t = ember.tensor({{1, 2, 3}, {4, 5, 6}})
    assert.equals("f32", t.dtype)
    assert.same({2, 3}, t.shape)
    assert.same({{1, 2, 3}, {4, 5, 6}}, t:tolist())
  end)

  it("builds a bool tensor from booleans", function()
    local t = ember.tensor({{true, false}, {false, true}})
    assert.equals("bool", t.dtype)
    assert.same({{true, false}, {false, true}}, t:tolist())
  end)

  it("builds a 0-dim tensor from a number", function()
    local t = ember.tensor(3.5)
    assert.equals(0, t:dim())
    assert.same({}, t.shape)
    assert.equals(3.5, t:item())
  end)

  it("builds an empty 1-dim tensor from {}", function()
    local t = ember.tensor({})
    assert.same({0}, t.shape)
    assert.equals(0, t:numel())
  end)

  it("keeps 64-bit integers exact when dtype is i64 (2^53 + 1 survives)", function()
    local big = (1 << 53) + 1
    local t = ember.tensor({big, -big}, {dtype = "i64"})
    assert.same({big, -big}, t:tolist())
    assert.equals("integer", math.type(t:tolist()[1]))
  end)

  it("applies dtype, device and requires_grad options", function()
    local t = ember.tensor({1, 2}, {dtype = "f64", device = "cpu", requires_grad = true})
    assert.equals("f64", t.dtype)
    assert.equals("cpu", t.device)
    assert.is_true(t.requires_grad)
    assert.is_true(t.is_leaf)
  end)

  it("copies a tensor argument without sharing storage or history", function()
    local src = ember.tensor({1, 2, 3})
    local c = ember.tensor(src)
    c:fill_(7)
    assert.same({1, 2, 3}, src:tolist())
    assert.is_false(c.requires_grad)
  end)
end)

describe("creation functions", function()
  it("zeros takes sizes as varargs or as one table", function()
    assert.same({2, 3}, ember.zeros(2, 3).shape)
    assert.same({2, 3}, ember.zeros({2, 3}).shape)
    assert.same({{0, 0, 0}, {0, 0, 0}}, ember.zeros(2, 3):tolist())
  end)

  it("zeros with no sizes is 0-dim", function()
    local z = ember.zeros({})
    assert.equals(0, z:dim())
    assert.equals(0, z:item())
  end)

  it("ones honours the dtype option", function()
    local t = ember.ones({2, 3}, {dtype = "bf16"})
    assert.equals("bf16", t.dtype)
    assert.same({{1, 1, 1}, {1, 1, 1}}, t:tolist())
  end)

  it("full fills with the value, f32 by default", function()
    local t = ember.full({2, 2}, 7)
    assert.equals("f32", t.dtype)
    assert.same({{7, 7}, {7, 7}}, t:tolist())
  end)

  it("full with a boolean gives a bool tensor", function()
    local t = ember.full({3}, true)
    assert.equals("bool", t.dtype)
    assert.same({true, true, true}, t:tolist())
  end)

  it("full with an integer dtype stores the value exactly", function()
    assert.same({-3, -3}, ember.full({2}, -3, {dtype = "i32"}):tolist())
  end)

  it("empty has the requested shape and dtype", function()
    local t = ember.empty(4, 4, {dtype = "u8"})
    assert.same({4, 4}, t.shape)
    assert.equals("u8", t.dtype)
  end)

  it("arange with integer arguments gives i64", function()
    local t = ember.arange(0, 10, 2)
    assert.equals("i64", t.dtype)
    assert.same({0, 2, 4, 6, 8}, t:tolist())
  end)

  it("arange(n) counts 0..n-1", function()
    assert.same({0, 1, 2, 3, 4}, ember.arange(5):tolist())
  end)

  it("arange with a float argument gives f32", function()
    local t = ember.arange(0, 1, 0.25)
    assert.equals("f32", t.dtype)
    assert.same({0, 0.25, 0.5, 0.75}, t:tolist())
    assert.equals("f32", ember.arange(0.0, 3).dtype)
  end)

  it("arange counts down with a negative step", function()
    assert.same({5, 3, 1}, ember.arange(5, 0, -2):tolist())
  end)

  it("linspace includes both ends", function()
    local t = ember.linspace(0, 1, 5)
    assert.equals("f32", t.dtype)
    assert.same({0, 0.25, 0.5, 0.75, 1}, t:tolist())
  end)

  it("linspace ends exactly at end even when the step is inexact", function()
    -- 0.1 is not representable; PyTorch fills the second half from the end.
    local v = ember.linspace(0, 1, 11, {dtype = "f64"}):tolist()
    assert.equals(1, v[11])
    assert.equals(0, v[1])
  end)

  it("eye(n) is the identity and eye(n, m) is rectangular", function()
    assert.same({{1, 0, 0}, {0, 1, 0}, {0, 0, 1}}, ember.eye(3):tolist())
    assert.same({{1, 0, 0}, {0, 1, 0}}, ember.eye(2, 3):tolist())
  end)

  it("rand draws from [0, 1)", function()
    ember.manual_seed(1)
    local v = ember.rand(1000):tolist()
    for _, x in ipairs(v) do assert(x >= 0 and x < 1, "rand gave " .. x) end
  end)

  it("manual_seed makes rand and randn reproducible", function()
    ember.manual_seed(42)
    local a, b = ember.rand(2, 3):tolist(), ember.randn(4):tolist()
    ember.manual_seed(42)
    assert.same(a, ember.rand(2, 3):tolist())
    assert.same(b, ember.randn(4):tolist())
  end)

  it("successive draws differ", function()
    ember.manual_seed(3)
    assert.are_not.same(ember.randn(8):tolist(), ember.randn(8):tolist())
  end)

  it("randn has mean 0 and std 1", function()
    ember.manual_seed(7)
    local v = ember.randn(20000):tolist()
    local s, s2 = 0, 0
    for _, x in ipairs(v) do s = s + x; s2 = s2 + x * x end
    local mean = s / #v
    local std = math.sqrt(s2 / #v - mean * mean)
    -- standard error of the mean is 1/sqrt(20000) ~ 0.007 and of the std ~0.005: 6 sigma
    assert(math.abs(mean) < 0.042, "mean " .. mean)
    assert(math.abs(std - 1) < 0.03, "std " .. std)
  end)

  it("randint draws i64 integers in [low, high)", function()
    ember.manual_seed(5)
    local t = ember.randint(0, 100, {4, 8})
    assert.equals("i64", t.dtype)
    assert.same({4, 8}, t.shape)
    local seen = {}
    for _, row in ipairs(t:tolist()) do
      for _, x in ipairs(row) do
        assert.equals("integer", math.type(x))
        assert(x >= 0 and x < 100, "randint gave " .. x)
        seen[x] = true
      end
    end
    local distinct = 0
    for _ in pairs(seen) do distinct = distinct + 1 end
    assert(distinct > 10, "32 draws from 100 values gave only " .. distinct .. " distinct values")
  end)

  it("randint honours a negative low and the dtype option", function()
    ember.manual_seed(6)
    local t = ember.randint(-3, 3, {200}, {dtype = "i32"})
    assert.equals("i32", t.dtype)
    local lo, hi = math.huge, -math.huge
    for _, x in ipairs(t:tolist()) do lo = math.min(lo, x); hi = math.max(hi, x) end
    assert.equals(-3, lo)
    assert.equals(2, hi)
  end)

  it("*_like copy shape, dtype and device but not values", function()
    local src = ember.full({2, 3}, 5, {dtype = "f64"})
    for _, name in ipairs {"zeros_like", "ones_like", "empty_like", "rand_like", "randn_like"} do
      local t = ember[name](src)
      assert.same({2, 3}, t.shape, name)
      assert.equals("f64", t.dtype, name)
      assert.equals("cpu", t.device, name)
    end
    assert.same({{0, 0, 0}, {0, 0, 0}}, ember.zeros_like(src):tolist())
    assert.same({{1, 1, 1}, {1, 1, 1}}, ember.ones_like(src):tolist())
  end)

  it("*_like accepts dtype and requires_grad options", function()
    local t = ember.zeros_like(ember.zeros(2), {dtype = "bf16"})
    assert.equals("bf16", t.dtype)
    assert.is_true(ember.ones_like(ember.zeros(2), {requires_grad = true}).requires_grad)
  end)

  it("creation options: requires_grad makes a leaf", function()
    local t = ember.randn(3, {requires_grad = true})
    assert.is_true(t.requires_grad)
    assert.is_true(t.is_leaf)
    assert.is_nil(t.grad_fn)
  end)

  it("accepts PyTorch's dtype names as aliases", function()
    assert.equals("f32", ember.zeros(1, {dtype = "float32"}).dtype)
    assert.equals("bf16", ember.zeros(1, {dtype = "bfloat16"}).dtype)
    assert.equals("i64", ember.zeros(1, {dtype = "long"}).dtype)
  end)
end)

describe("dtypes", function()
  local all = {"f32", "f64", "bf16", "f16", "i32", "i64", "u16", "u8", "bool"}
  local sizes = {f32 = 4, f64 = 8, bf16 = 2, f16 = 2, i32 = 4, i64 = 8, u16 = 2, u8 = 1, bool = 1}

  for _, dt in ipairs(all) do
    it("creates " .. dt .. " and reports its element size", function()
      local t = ember.zeros(3, {dtype = dt})
      assert.equals(dt, t.dtype)
      assert.equals(sizes[dt], t:element_size())
    end)
  end

  it("small integers survive a round trip through every dtype", function()
    for _, dt in ipairs(all) do
      local want = dt == "bool" and {0, 1, 1, 1} or {0, 1, 2, 100}
      local back = ember.tensor({0, 1, 2, 100}):to(dt):to("f64"):tolist()
      assert.same(want, back, dt)
    end
  end)

  it("converts between every pair of dtypes", function()
    for _, a in ipairs(all) do
      for _, b in ipairs(all) do
        local t = ember.tensor({0, 1, 3}, {dtype = a}):to(b)
        assert.equals(b, t.dtype)
        local want = (a == "bool" or b == "bool") and {0, 1, 1} or {0, 1, 3}
        assert.same(want, t:to("i64"):tolist(), a .. " -> " .. b)
      end
    end
  end)

  it("to() returns the same tensor when nothing changes", function()
    local t = ember.zeros(2)
    assert.is_true(rawequal(t, t:to("f32")))
    assert.is_true(rawequal(t, t:to("cpu")))
  end)

  it("to() accepts an options table and another tensor", function()
    assert.equals("f64", ember.zeros(2):to({dtype = "f64"}).dtype)
    assert.equals("i32", ember.zeros(2):to(ember.zeros(1, {dtype = "i32"})).dtype)
  end)

  it("shorthand converters float/double/half/bfloat16/long/int/bool", function()
    local t = ember.tensor({1.5})
    assert.equals("f32", t:double():float().dtype)
    assert.equals("f64", t:double().dtype)
    assert.equals("f16", t:half().dtype)
    assert.equals("bf16", t:bfloat16().dtype)
    assert.equals("i64", t:long().dtype)
    assert.equals("i32", t:int().dtype)
    assert.equals("bool", t:bool().dtype)
  end)

  it("float -> int truncates toward zero", function()
    local t = ember.tensor({-2.7, -1.5, -0.5, 0.5, 1.5, 2.7}, {dtype = "f64"})
    for _, dt in ipairs {"i32", "i64"} do
      assert.same({-2, -1, 0, 0, 1, 2}, t:to(dt):tolist(), dt)
    end
    assert.same({0, 0, 1, 2}, ember.tensor({0.5, 0.99, 1.5, 2.7}):to("u8"):tolist())
  end)

  it("nonzero -> true and zero -> false when converting to bool", function()
    assert.same({false, true, true, true}, ember.tensor({0, 0.25, -3, 1e-30}):to("bool"):tolist())
  end)

  it("bool -> number gives 0 and 1", function()
    assert.same({1, 0}, ember.tensor({true, false}):to("i64"):tolist())
    assert.same({1, 0}, ember.tensor({true, false}):to("f32"):tolist())
  end)

  it("integer narrowing wraps as in C and PyTorch (300 -> u8 44, 2^31 -> i32 -2^31)", function()
    assert.same({44}, ember.tensor({300}, {dtype = "i64"}):to("u8"):tolist())
    assert.same({-(1 << 31)}, ember.tensor({1 << 31}, {dtype = "i64"}):to("i32"):tolist())
    assert.same({65535}, ember.tensor({65535}, {dtype = "i32"}):to("u16"):tolist())
  end)

  it("i64 -> f64 is exact up to 2^53", function()
    local n = 1 << 53
    assert.equals(n, ember.tensor({n}, {dtype = "i64"}):to("f64"):item())
  end)

  it("f64 -> f32 rounds to nearest (1 + 2^-30 becomes 1)", function()
    assert.equals(1, ember.tensor({1 + 2 ^ -30}, {dtype = "f64"}):to("f32"):item())
    assert.equals(1 + 2 ^ -23, ember.tensor({1 + 2 ^ -23}, {dtype = "f64"}):to("f32"):item())
  end)

  describe("bf16 rounds to nearest even", function()
    local function bf16(x) return ember.tensor({x}, {dtype = "f64"}):to("bf16"):item() end

    it("keeps values with 8 significant bits exactly", function()
      assert.equals(1 + 2 ^ -7, bf16(1 + 2 ^ -7))
      assert.equals(-3.5, bf16(-3.5))
      assert.equals(2 ^ -100, bf16(2 ^ -100))
    end)

    it("1 + 2^-8 (a tie) rounds down to the even 1", function()
      assert.equals(1, bf16(1 + 2 ^ -8))
    end)

    it("1 + 3*2^-8 (a tie) rounds up to the even 1 + 2^-6", function()
      assert.equals(1 + 2 ^ -6, bf16(1 + 3 * 2 ^ -8))
    end)

    it("just above a tie rounds up (1 + 2^-8 + 2^-16 -> 1 + 2^-7)", function()
      assert.equals(1 + 2 ^ -7, bf16(1 + 2 ^ -8 + 2 ^ -16))
    end)

    it("is symmetric for negative values", function()
      assert.equals(-1, bf16(-(1 + 2 ^ -8)))
      assert.equals(-(1 + 2 ^ -6), bf16(-(1 + 3 * 2 ^ -8)))
    end)

    it("f32's max overflows to inf, and inf and nan survive", function()
      assert.equals(math.huge, bf16(3.4028234663852886e38))
      assert.equals(-math.huge, bf16(-math.huge))
      local n = bf16(0 / 0)
      assert.is_true(n ~= n)
    end)

    it("stores the exact bit patterns PyTorch stores", function()
      local t = ember.tensor({1, 1 + 2 ^ -8, 1 + 3 * 2 ^ -8, 1 + 2 ^ -7, -2, math.huge, 0.1}, {dtype = "f64"})
      -- 0.1 = 0x3DCCCCCD in f32 -> 0x3DCD in bf16 (round up: 0xCCCD > 0x8000)
      assert.same({0x3F80, 0x3F80, 0x3F82, 0x3F81, 0xC000, 0x7F80, 0x3DCD}, u16_bits(t:to("bf16")))
    end)

    it("bf16 -> f32 is exact (the bits shift left by 16)", function()
      assert.equals(1 + 2 ^ -7, ember.tensor({1 + 2 ^ -7}, {dtype = "bf16"}):to("f32"):item())
    end)
  end)

  describe("f16 rounds to nearest even", function()
    local function f16(x) return ember.tensor({x}, {dtype = "f64"}):to("f16"):item() end

    it("65504 is the largest finite value", function()
      assert.equals(65504, f16(65504))
      assert.equals(65504, f16(65519))
    end)

    it("65520 (the tie with 2^16) rounds to inf", function()
      assert.equals(math.huge, f16(65520))
      assert.equals(-math.huge, f16(-65520))
    end)

    it("1 + 2^-11 (a tie) rounds to 1 and 1 + 3*2^-11 to 1 + 2^-9", function()
      assert.equals(1, f16(1 + 2 ^ -11))
      assert.equals(1 + 2 ^ -9, f16(1 + 3 * 2 ^ -11))
    end)

    it("keeps subnormals and rounds below them to zero (2^-25 is a tie with 0)", function()
      assert.equals(2 ^ -24, f16(2 ^ -24))
      assert.equals(0, f16(2 ^ -25))
      assert.equals(2 ^ -24, f16(1.5 * 2 ^ -25))
      assert.equals(3 * 2 ^ -24, f16(3 * 2 ^ -24))
    end)

    it("stores the exact bit patterns PyTorch stores", function()
      local t = ember.tensor({1, 65504, 65520, -2, 2 ^ -24, 0.1}, {dtype = "f64"})
      -- 0.1 -> 0x2E66 (0x2E66.66.. rounds down)
      assert.same({0x3C00, 0x7BFF, 0x7C00, 0xC000, 0x0001, 0x2E66}, u16_bits(t:to("f16")))
    end)
  end)
end)

describe("inspection", function()
  it("shape is a fresh 1-based Lua table of sizes", function()
    local t = ember.zeros(2, 3, 4)
    local s = t.shape
    assert.same({2, 3, 4}, s)
    s[1] = 99
    assert.same({2, 3, 4}, t.shape)
  end)

  it("size(dim) counts dims from 0, and negative dims from the end", function()
    local t = ember.zeros(2, 3, 4)
    assert.equals(2, t:size(0))
    assert.equals(4, t:size(2))
    assert.equals(4, t:size(-1))
    assert.equals(2, t:size(-3))
    assert.same({2, 3, 4}, t:size())
  end)

  it("dim, ndim and numel", function()
    local t = ember.zeros(2, 3, 4)
    assert.equals(3, t:dim())
    assert.equals(3, t.ndim)
    assert.equals(24, t:numel())
    assert.equals(1, ember.tensor(5):numel())
    assert.equals(0, ember.zeros(3, 0):numel())
  end)

  it("stride is in elements, row-major", function()
    assert.same({12, 4, 1}, ember.zeros(2, 3, 4):stride())
    assert.equals(4, ember.zeros(2, 3, 4):stride(1))
    assert.equals(1, ember.zeros(2, 3, 4):stride(-1))
  end)

  it("is_contiguous is false for a transpose and true for a fresh tensor", function()
    local t = ember.zeros(2, 3)
    assert.is_true(t:is_contiguous())
    assert.is_false(t:transpose(0, 1):is_contiguous())
  end)

  it("item returns a float for float dtypes", function()
    assert.equals(2.5, ember.tensor({{2.5}}):item())
    assert.equals("float", math.type(ember.tensor(2):item()))
  end)

  it("item returns an integer for integer dtypes and a boolean for bool", function()
    local v = ember.tensor({7}, {dtype = "i64"}):item()
    assert.equals(7, v)
    assert.equals("integer", math.type(v))
    assert.equals(true, ember.tensor({true}):item())
  end)

  it("tolist nests like the shape and a 0-dim tensor gives a number", function()
    assert.same({{{1}, {2}}}, ember.tensor({{{1}, {2}}}):tolist())
    assert.equals(4, ember.tensor(4):tolist())
  end)

  it("tolist follows strides (a transpose lists transposed)", function()
    assert.same({{1, 3}, {2, 4}}, ember.tensor({{1, 2}, {3, 4}}):transpose(0, 1):tolist())
  end)

  it("dtype and device are strings", function()
    local t = ember.zeros(1, {dtype = "u16"})
    assert.equals("u16", t.dtype)
    assert.equals("cpu", t.device)
    assert.is_false(t.is_cuda)
  end)

  it("#t is the size of dim 0", function()
    assert.equals(5, #ember.zeros(5, 2))
  end)

  it("is_tensor tells tensors from other values", function()
    assert.is_true(ember.is_tensor(ember.zeros(1)))
    assert.is_false(ember.is_tensor({}))
    assert.is_false(ember.is_tensor(3))
  end)

  it("a userdata of another kind is not a tensor, before and after a tensor was checked", function()
    local f = io.tmpfile()
    local a = ember.ones(2)
    assert.is_false(ember.is_tensor(f))
    assert.is_true(ember.is_tensor(a))                  -- the checked metatable is now the tensors'
    assert.is_false(ember.is_tensor(f))
    local ok, err = pcall(function() return a + f end)
    assert.is_false(ok)
    assert.matches("expected argument 2 to be a tensor or a number, got userdata", err, 1, true)
    f:close()
  end)

  it("the same tensor is the same Lua value every time it is pushed", function()
    local p = ember.zeros(2, {requires_grad = true})
    local g = ember.zeros(2)
    p.grad = g
    assert.is_true(rawequal(p.grad, g))
    assert.is_true(rawequal(p.grad, p.grad))
  end)
end)

describe("printing like PyTorch", function()
  it("prints a 2x2 float matrix", function()
    assert.equals("tensor([[1., 2.],\n        [3., 4.]])", tostring(ember.tensor({{1, 2}, {3, 4}})))
  end)

  it("prints a 0-dim tensor with 4 decimals", function()
    assert.equals("tensor(3.5000)", tostring(ember.tensor(3.5)))
  end)

  it("prints i64 without a dtype suffix", function()
    assert.equals("tensor([1, 2, 3])", tostring(ember.tensor({1, 2, 3}, {dtype = "i64"})))
    assert.equals("tensor([0, 1, 2])", tostring(ember.arange(3)))
  end)

  it("prints other integer dtypes with a suffix", function()
    assert.equals("tensor([1, 2], dtype=i32)", tostring(ember.tensor({1, 2}, {dtype = "i32"})))
  end)

  it("prints bool as True/False, padded to the widest (as PyTorch: ' True')", function()
    assert.equals("tensor([ True, False])", tostring(ember.tensor({true, false})))
    assert.equals("tensor([True, True])", tostring(ember.tensor({true, true})))
  end)

  it("right-aligns values to a common width", function()
    assert.equals("tensor([-1.5000,  2.0000])", tostring(ember.tensor({-1.5, 2})))
  end)

  it("switches to scientific notation when magnitudes span more than 1000x", function()
    assert.equals("tensor([1.0000e-05, 1.0000e+00])", tostring(ember.tensor({1e-5, 1})))
  end)

  it("adds requires_grad=True to a leaf that requires grad", function()
    assert.equals("tensor([1., 2.], requires_grad=True)", tostring(ember.tensor({1, 2}, {requires_grad = true})))
  end)

  it("adds grad_fn=<...> to a result of a recorded op", function()
    local x = ember.tensor({1, 2}, {requires_grad = true})
    local s = tostring(x * 2)
    assert.matches("^tensor%(%[2%., 4%.%], grad_fn=<[%w_]+>%)$", s)
  end)

  it("adds the dtype for bf16 and f64", function()
    assert.equals("tensor([1.5000, 2.0000], dtype=bf16)", tostring(ember.tensor({1.5, 2}, {dtype = "bf16"})))
    assert.equals("tensor([0.5000], dtype=f64)", tostring(ember.tensor({0.5}, {dtype = "f64"})))
  end)

  it("separates the blocks of a 3-dim tensor with a blank line", function()
    assert.equals("tensor([[[0., 0.]],\n\n        [[0., 0.]]])", tostring(ember.zeros(2, 1, 2)))
  end)

  it("prints inf and nan by name, unpadded (PyTorch sizes columns by finite values only)", function()
    assert.equals("tensor([inf, -inf, nan])", tostring(ember.tensor({math.huge, -math.huge, 0 / 0})))
    assert.equals("tensor([1., inf])", tostring(ember.tensor({1, math.huge})))
  end)

  it("prints an empty tensor as tensor([])", function()
    assert.equals("tensor([])", tostring(ember.zeros(0)))
  end)

  it("summarises a large tensor with ... and keeps the output short", function()
    local s = tostring(ember.arange(5000))
    assert.truthy(s:find("...", 1, true))
    assert.matches("^tensor%(%[ *0, +1, +2, +%.%.%., 4997, 4998, 4999%]%)$", s)
    assert(#s < 200, "summary is " .. #s .. " characters")
  end)

  it("prints a non-contiguous view in logical order", function()
    assert.equals("tensor([[1., 3.],\n        [2., 4.]])", tostring(ember.tensor({{1, 2}, {3, 4}}):t()))
  end)
end)

describe("fill_ of large tensors (segments over the threads)", function()
  local prev = {}
  before_each(function()
    prev = {ember.get_num_threads(), ember.set_parallel_min_work(1), ember.set_stream_min(0)}
    ember.set_num_threads(3)
  end)
  after_each(function()
    ember.set_num_threads(prev[1]); ember.set_parallel_min_work(prev[2]); ember.set_stream_min(prev[3])
  end)

  it("sets every element of a long narrowed view and nothing beside it", function()
    local x = ember.zeros({3, 40001}, {dtype = "f64"})
    x:narrow(1, 3, 39000):fill_(2.5)             -- rows of 39000: 3 segments each, off the line
    assert.are.equal(3 * 39000 * 2.5, x:sum():item())
    for r = 0, 2 do
      local row = x:select(0, r)
      assert.are.equal(0, row:select(0, 2):item(), "element before the view, row " .. r)
      assert.are.equal(2.5, row:select(0, 3):item(), "first element of the view, row " .. r)
      assert.are.equal(2.5, row:select(0, 39002):item(), "last element of the view, row " .. r)
      assert.are.equal(0, row:select(0, 39003):item(), "element after the view, row " .. r)
    end
  end)

  for _, dt in ipairs({"i32", "bf16", "u8"}) do
    it("fills a contiguous " .. dt .. " tensor of 100003 elements whole, a ragged end included", function()
      local x = ember.zeros({100003}, {dtype = dt})
      x:narrow(0, 1, 100001):fill_(3)
      local l = x:to("f64")
      assert.are.equal(3 * 100001, l:sum():item())
      assert.are.equal(0, l:select(0, 0):item())
      assert.are.equal(3, l:select(0, 100001):item())
      assert.are.equal(0, l:select(0, 100002):item())
    end)
  end
end)
