-- rope_spec.lua — the VALUES of F.rope (engine/ops/rope.c), rotary position
-- embedding on ADJACENT pairs of the last dim:
--   angle_j = pos · theta^(−2j/d)
--   y[2j]   = x[2j] cos(angle_j) − x[2j+1] sin(angle_j)
--   y[2j+1] = x[2j] sin(angle_j) + x[2j+1] cos(angle_j)
-- checked against that formula and against the properties that make it RoPE:
-- position 0 is the identity, each pair keeps its norm, and q·k after rotation
-- depends only on the distance between the positions. Gradients live in
-- gradcheck_spec.lua, errors in bad_input_spec.lua.
--
-- Run from the repository root:
--   LUA_PATH="build/lua/?.lua;build/lua/?/init.lua;;" LUA_CPATH="build/lua/?.so;;" \
--     busted tests/lua/rope_spec.lua
--
-- Tolerances, and why:
--   * f64: 1e-13 absolute on O(1) values: a rotation is two products and a sum
--     per output, with cos/sin of angles up to ~10^3 (libm, ≤ 1 ulp).
--   * f32: 2^-21·(|x0| + |x1|) per pair (4 f32 ulps of the pair's magnitude):
--     the angle is computed in double, then cos/sin rounded to f32, then an
--     f32 product-and-sum.
--   * the relative-position property in f64: 1e-12 (angles up to 10^3 rad
--     carry ~1e-13 of absolute error in double).

local ember = require "ember"
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local F = ember.nn.functional

local flat = H.flat

-- rope of flat values of a (..., T, d) tensor; pos_of(row) gives the row's position
local function rope_ref(vals, d, pos_of, theta)
  local out = {}
  for row = 0, #vals // d - 1 do
    local p = pos_of(row)
    for j = 0, d / 2 - 1 do
      local a = p * theta ^ (-2 * j / d)
      local c, s = math.cos(a), math.sin(a)
      local x0, x1 = vals[row * d + 2 * j + 1], vals[row * d + 2 * j + 2]
      out[row * d + 2 * j + 1] = x0 * c - x1 * s
      out[row * d + 2 * j + 2] = x0 * s + x1 * c
    end
  end
  return out
end

local assert_abs = H.assert_abs

local randn = H.randn

local function arange(T) return ember.arange(0, T, 1, {dtype = "i64"}) end

describe("F.rope", function()
  it("matches the formula on (B, H, T, d) = (2, 2, 5, 8) with positions 0..T-1 (f64)", function()
    local x = randn(1, {2, 2, 5, 8})
    local r = F.rope(x, arange(5), 10000)
    assert.same({2, 2, 5, 8}, r.shape)
    assert.equals("f64", r.dtype)
    assert_abs(flat(r), rope_ref(flat(x), 8, function(row) return row % 5 end, 10000), 1e-13, "rope")
  end)

  it("defaults to positions 0..T-1 and theta 10000", function()
    local x = randn(2, {3, 6, 4})
    assert.same(F.rope(x, arange(6), 10000):tolist(), F.rope(x):tolist())
  end)

  it("uses the theta it is given (theta = 100)", function()
    local x = randn(3, {4, 6})
    assert_abs(flat(F.rope(x, arange(4), 100)), rope_ref(flat(x), 6, function(row) return row end, 100),
      1e-13, "theta 100")
  end)

  it("rotates adjacent pairs (x[2j], x[2j+1]), not the two halves", function()
    -- d = 4, position 1, theta 1: every pair rotates by exactly 1 radian.
    -- x = (1, 0, 0, 0): adjacent pairs give (cos 1, sin 1, 0, 0);
    -- a half-split (GPT-NeoX) rope would give (cos 1, 0, sin 1, 0).
    local x = ember.tensor({{0, 0, 0, 0}, {1, 0, 0, 0}}, {dtype = "f64"})
    local r = F.rope(x, arange(2), 1):tolist()
    assert_abs(r[2], {math.cos(1), math.sin(1), 0, 0}, 1e-15, "pairs")
  end)

  it("is the identity at position 0 (exactly)", function()
    local x = randn(4, {3, 1, 16})
    local pos = ember.zeros(1, {dtype = "i64"})
    assert.same(x:tolist(), F.rope(x, pos):tolist())
  end)

  it("preserves the norm of every pair", function()
    local x = randn(5, {7, 10})
    local pos = ember.tensor({0, 3, 17, 100, 1000, 4096, 65535}, {dtype = "i64"})
    local lx, lr = flat(x), flat(F.rope(x, pos))
    for i = 1, #lx, 2 do
      local n0 = lx[i] ^ 2 + lx[i + 1] ^ 2
      local n1 = lr[i] ^ 2 + lr[i + 1] ^ 2
      assert.is_true(math.abs(n0 - n1) <= 1e-13 * n0, string.format("pair %d: %.17g vs %.17g", i, n0, n1))
    end
  end)

  it("arbitrary (non-sequential) positions, incl. large ones, follow the formula", function()
    local x = randn(6, {5, 8})
    local plist = {7, 0, 3, 100000, 12}
    local pos = ember.tensor(plist, {dtype = "i64"})
    assert_abs(flat(F.rope(x, pos)), rope_ref(flat(x), 8, function(row) return plist[row + 1] end, 10000),
      1e-10, "positions")   -- angle 1e5 rad: double carries ~1e-11 absolute
  end)

  it("accepts i32 positions with the same result", function()
    local x = randn(7, {4, 8})
    local pos = ember.tensor({3, 1, 4, 1}, {dtype = "i64"})
    assert.same(F.rope(x, pos):tolist(), F.rope(x, pos:int()):tolist())
  end)

  it("takes per-batch positions (B, 1, T) broadcast over heads", function()
    local x = randn(8, {2, 3, 4, 6})                  -- (B, H, T, d)
    local pos = ember.tensor({{{0, 1, 2, 3}}, {{10, 11, 12, 13}}}, {dtype = "i64"})   -- (2, 1, 4)
    local want = rope_ref(flat(x), 6, function(row)
      local b, t = row // 12, row % 4
      return (b == 0 and 0 or 10) + t
    end, 10000)
    assert_abs(flat(F.rope(x, pos)), want, 1e-13, "per-batch")
  end)

  it("dot(rope(q, m), rope(k, n)) depends only on m - n", function()
    local q, k = randn(9, {1, 16}), randn(10, {1, 16})
    local function score(m, n)
      local rq = flat(F.rope(q, ember.tensor({m}, {dtype = "i64"})))
      local rk = flat(F.rope(k, ember.tensor({n}, {dtype = "i64"})))
      local s = 0.0
      for i = 1, 16 do s = s + rq[i] * rk[i] end
      return s
    end
    local base = score(2, 0)
    for _, mn in ipairs({{3, 1}, {10, 8}, {102, 100}, {1000, 998}}) do
      assert.is_true(math.abs(score(mn[1], mn[2]) - base) < 1e-12,
        string.format("m=%d, n=%d: %.17g vs %.17g", mn[1], mn[2], score(mn[1], mn[2]), base))
    end
    -- and it does change with the distance
    assert.is_true(math.abs(score(5, 0) - base) > 1e-3)
  end)

  it("f32: within 4 ulps of the pair magnitude of the double formula", function()
    local x = randn(11, {2, 8, 32}, "f32")
    local got = flat(F.rope(x))
    local lx = flat(x)
    local want = rope_ref(lx, 32, function(row) return row % 8 end, 10000)
    assert.equals("f32", F.rope(x).dtype)
    for i = 1, #want, 2 do
      local tol = 2 ^ -21 * (math.abs(lx[i]) + math.abs(lx[i + 1]))
      assert.is_true(math.abs(got[i] - want[i]) <= tol and math.abs(got[i + 1] - want[i + 1]) <= tol,
        string.format("pair %d", (i + 1) // 2))
    end
  end)

  it("f32 at position 10^5 computes the angle in double", function()
    -- d = 6, pair j = 1: angle = 1e5 · 10000^(-1/3) ≈ 4641.59 rad. Rounded to f32
    -- (ulp 2^-11 there) the angle alone would be off by up to 2.4e-4 rad; the
    -- tolerance here is 2^-22 (the f32 rounding of cos/sin and the products).
    local x = ember.tensor({{0, 0, 1, 0, 0, 0}})
    local r = flat(F.rope(x, ember.tensor({100000}, {dtype = "i64"})))
    local a = 100000 * 10000 ^ (-2 / 6)
    assert_abs({r[3], r[4]}, {math.cos(a), math.sin(a)}, 2 ^ -22, "big angle")
  end)

  for _, dt in ipairs({"bf16", "f16"}) do
    it(dt .. " is the f32 result rounded once", function()
      local x = randn(12, {2, 6, 16}, dt)
      local r = F.rope(x)
      assert.equals(dt, r.dtype)
      assert.same(flat(F.rope(x:float()):to(dt)), flat(r))
    end)
  end

  it("reads a non-contiguous x ((B, T, H, d) permuted to (B, H, T, d))", function()
    local x = randn(13, {2, 5, 3, 8}):permute(0, 2, 1, 3)
    assert.is_false(x:is_contiguous())
    assert_abs(flat(F.rope(x)), rope_ref(flat(x), 8, function(row) return row % 5 end, 10000), 1e-13, "permuted")
  end)
end)

describe("nn.CausalSelfAttention's rope", function()
  local nn = ember.nn
  it("rotates q and k in one module call, the same values as two F.rope", function()
    ember.manual_seed(5)
    local attn = nn.CausalSelfAttention(16, 2)
    local q, k = ember.randn({2, 2, 7, 8}), ember.randn({2, 2, 7, 8})
    local pos = attn.rope:positions(7)
    local q2, k2 = attn.rope(q, pos, k)
    assert.same(flat(F.rope(q, pos, attn.rope.theta)), flat(q2))
    assert.same(flat(F.rope(k, pos, attn.rope.theta)), flat(k2))
    assert.same(flat(F.rope(q, pos, attn.rope.theta)), flat(attn.rope(q, pos)))
  end)

  it("calls a user's rope module (its own forward) once for q and once for k", function()
    ember.manual_seed(5)
    local attn = nn.CausalSelfAttention(16, 2)
    local x = ember.randn({2, 7, 16})
    local want = attn(x)
    local Mine = nn.RotaryEmbedding:extend("MyRope")
    local seen = 0
    function Mine:forward(t, pos, extra)
      assert.is_nil(extra, "no k argument for a user's forward")
      seen = seen + 1
      return F.rope(t, pos, self.theta)
    end
    local r = Mine(8)
    attn.rope = r
    local got = attn(x)
    assert.equals(2, seen)
    assert.same(flat(want), flat(got))
  end)
end)
