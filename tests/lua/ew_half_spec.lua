-- ew_half_spec.lua — the CPU elementwise loop's 16-bit fast paths (issue 17,
-- engine/ops/ew_half.c): where/masked_fill into bf16/f16 as a raw 16-bit
-- select, bf16/f16 add/sub/mul/div fused in one loop, f16 loads and stores
-- without branches, and bf16/f16 outputs written with streaming stores. Each must give the bits of the f32 route they
-- replace: widen to f32, compute in f32, round once (ember/half.h). The
-- reference here is that route spelled out with public ops on f32 tensors —
-- x:float(), the f32 op, :to(dtype) — whose loops these paths do not touch
-- (f32 operands are the compute type: no 16-bit path runs), and, for the
-- select, a bit-level model in Lua of what the rounding does to a 16-bit value
-- (nothing, except canonicalising a NaN). Bits are compared, not values, so a
-- NaN's sign and payload count.
--
-- Run: EMBER_BUILD=build-cpu build-cpu/ember run $(command -v busted) tests/lua/ew_half_spec.lua

local ember = require "ember"
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")

---------------------------------------------------------------------------
-- bits in and out
---------------------------------------------------------------------------

local u16s, from_u16 = H.bits, H.from_bits   -- bf16/f16 bit patterns out and in

--- A bool tensor of the given shape from a Lua predicate of the flat index (0-based).
local function mask(shape, pred)
  local n, vals = 1, {}
  for _, d in ipairs(shape) do n = n * d end
  for i = 1, n do vals[i] = pred(i - 1) and 1 or 0 end
  return ember.tensor(vals):reshape(shape):ne(0)
end

--- What rounding a widened 16-bit value back to its dtype does to it:
-- bf16 quiets a NaN (h | 0x40), f16 maps every NaN to sign | 0x7e00.
local function canon(dtype, h)
  if dtype == "bf16" then return (h & 0x7fff) > 0x7f80 and (h | 0x40) or h end
  return (h & 0x7fff) > 0x7c00 and ((h & 0x8000) | 0x7e00) or h
end

--- got's bits equal the list want; a failure names the first element that differs.
local function assert_bits(got, want, what)
  local g = u16s(got)
  assert.are.equal(#want, #g, what .. ": element count")
  for i = 1, #want do
    if g[i] ~= want[i] then
      error(("%s: element %d is 0x%04x, expected 0x%04x (%d elements)"):format(what, i - 1, g[i], want[i], #want), 2)
    end
  end
end

--- a and b hold the same bits (dtype, shape, every element).
local function assert_same_bits(a, b, what)
  assert.are.equal(b.dtype, a.dtype, what .. ": dtype")
  assert.are.same(b.shape, a.shape, what .. ": shape")
  assert_bits(a, u16s(b), what)
end

--- Every 16-bit pattern once, in an order that pairs each with a different
-- one at the same index in the `k`-th order (k odd: a permutation of 2^16).
local function patterns(k) local t = {} for i = 0, 65535 do t[i + 1] = (i * k + 12345) % 65536 end return t end

--- fn() with n threads, streaming stores for every output (stream_min 0) or
-- none (-1), and ranges split finely; the settings restored.
local function with(n, stream, fn)
  local pn, pw, ps = ember.get_num_threads(), ember.set_parallel_min_work(1), ember.set_stream_min(stream)
  ember.set_num_threads(n)
  local ok, r = pcall(fn)
  ember.set_num_threads(pn); ember.set_parallel_min_work(pw); ember.set_stream_min(ps)
  if not ok then error(r, 0) end
  return r
end

local DTYPES = {"bf16", "f16"}
-- 1 thread with regular stores, 3 threads (more than this VM's cores: ranges
-- still split) with streaming stores for every output size.
local MODES = {{1, -1, "1 thread, regular stores"}, {3, 0, "3 threads, streamed"}}

---------------------------------------------------------------------------
-- where / masked_fill: the raw 16-bit select
---------------------------------------------------------------------------

describe("where into bf16/f16 (raw 16-bit select)", function()
  for _, dt in ipairs(DTYPES) do
    for _, m in ipairs(MODES) do
      it(("passes every %s pattern through, NaNs canonicalised as the f32 route does (%s)"):format(dt, m[3]), function()
        local pa, pb = patterns(1), patterns(40503)
        local a, b = from_u16(dt, {256, 256}, pa), from_u16(dt, {256, 256}, pb)
        local c = mask({256, 256}, function(i) return (i * 7) % 3 ~= 0 end)
        local want = {}
        for i = 1, 65536 do want[i] = canon(dt, ((i - 1) * 7) % 3 ~= 0 and pa[i] or pb[i]) end
        with(m[1], m[2], function()
          local got = ember.where(c, a, b)
          assert_bits(got, want, dt .. " where, bit model")
          assert_same_bits(got, ember.where(c, a:float(), b:float()):to(dt), dt .. " where, f32 route")
        end)
      end)
    end

    it(("keeps signalling and quiet NaN payloads of both signs as the f32 route does (%s)"):format(dt), function()
      local nans = dt == "bf16" and {0x7f81, 0xff81, 0x7fbf, 0xffbf, 0x7fc0, 0xffc1, 0x7fff, 0xffff, 0x7f80, 0xff80}
                                 or {0x7c01, 0xfc01, 0x7dff, 0xfdff, 0x7e00, 0xfe01, 0x7fff, 0xffff, 0x7c00, 0xfc00}
      local want = dt == "bf16" and {0x7fc1, 0xffc1, 0x7fff, 0xffff, 0x7fc0, 0xffc1, 0x7fff, 0xffff, 0x7f80, 0xff80}
                                 or {0x7e00, 0xfe00, 0x7e00, 0xfe00, 0x7e00, 0xfe00, 0x7e00, 0xfe00, 0x7c00, 0xfc00}
      local a, zero = from_u16(dt, {#nans}, nans), ember.zeros({#nans}, {dtype = dt})
      local all, none = mask({#nans}, function() return true end), mask({#nans}, function() return false end)
      assert_bits(ember.where(all, a, zero), want, dt .. " NaNs as a")
      assert_bits(ember.where(none, zero, a), want, dt .. " NaNs as b")
      assert_bits(a:masked_fill(none, 7), want, dt .. " masked_fill keeps")
    end)
  end

  for _, dt in ipairs(DTYPES) do
    it(("broadcasts a (T,T) mask over (B,H,T,T) scores and a per-row condition, as the f32 route (%s)"):format(dt), function()
      local R = H.seeded(1700)
      for _, m in ipairs(MODES) do
        with(m[1], m[2], function()
          local scores = R.randn({2, 3, 33, 33}, dt)
          local tt = mask({33, 33}, function(i) return i % 33 > i // 33 end)            -- causal
          local ref = scores:float():masked_fill(tt, -math.huge):to(dt)
          assert_same_bits(scores:masked_fill(tt, -math.huge), ref, dt .. " causal masked_fill, " .. m[3])
          local col = mask({33, 1}, function(i) return i % 2 == 0 end)                    -- stride 0 along rows
          local row = R.randn({33}, dt)
          local got = ember.where(col, scores, row)
          assert_same_bits(got, ember.where(col, scores:float(), row:float()):to(dt), dt .. " where per-row cond, " .. m[3])
          local one = mask({1}, function() return true end)                               -- one value for all
          assert_same_bits(ember.where(one, row, scores), ember.where(one, row:float(), scores:float()):to(dt),
                           dt .. " where scalar cond, " .. m[3])
        end)
      end
    end)

    it(("takes non-contiguous values and strided outputs (%s)"):format(dt), function()
      local R = H.seeded(1710)
      local a, b = R.randn({40, 24}, dt), R.randn({24, 40}, dt)
      local c = mask({24, 40}, function(i) return (i * 5) % 7 < 3 end)
      local at = a:t()                                         -- (24, 40), strides (1, 40)
      assert_same_bits(ember.where(c, at, b), ember.where(c, at:float(), b:float()):to(dt), dt .. " transposed a")
      assert_same_bits(ember.where(c, b, at:narrow(1, 0, 40)), ember.where(c, b:float(), at:float()):to(dt),
                       dt .. " transposed b")
      -- in place into a transposed view: the output's inner stride is 40
      local ref = at:float():masked_fill(c, 0.1):to(dt)
      local x = a:clone()
      x:t():masked_fill_(c, 0.1)
      assert_same_bits(x:t(), ref, dt .. " masked_fill_ into a transposed view")
    end)

    it(("rounds constants as the f32 route does (%s)"):format(dt), function()
      local pa = {}                                            -- 1 in 16 patterns: every kind, NaNs of both signs
      for i = 0, 4095 do pa[i + 1] = i * 16 + 1 end
      local a = from_u16(dt, {4096}, pa)
      local c = mask({4096}, function(i) return i % 2 == 1 end)
      local consts = {1 / 3, -1 / 3, 1e-40, 2 ^ -25, 3 * 2 ^ -26, 3 * 2 ^ -25, 1 + 2 ^ -8, 1 + 3 * 2 ^ -9, 1 + 3 * 2 ^ -8, 65520, 1e39, -1e39,
                      -0.0, 0 / 0, -(0 / 0), 2049, 1e5}
      for _, v in ipairs(consts) do
        for _, m in ipairs(MODES) do
          with(m[1], m[2], function()
            local got = a:masked_fill(c, v)
            local what = ("%s masked_fill(%.17g), %s"):format(dt, v, m[3])
            assert_same_bits(got, a:float():masked_fill(c, v):to(dt), what)
            local g = u16s(got)
            assert.are.equal(canon(dt, pa[1]), g[1], what .. ": unmasked element")
          end)
        end
      end
      -- a few roundings by hand, so the f32 route is not the only witness
      local want = dt == "bf16" and {[1 / 3] = 0x3eab, [1 + 2 ^ -8] = 0x3f80, [1 + 3 * 2 ^ -9] = 0x3f81, [1 + 3 * 2 ^ -8] = 0x3f82, [1e39] = 0x7f80}
                                 or {[1 / 3] = 0x3555, [65520] = 0x7c00, [2049] = 0x6800, [3 * 2 ^ -26] = 0x0001, [3 * 2 ^ -25] = 0x0002, [2 ^ -25] = 0}
      for v, bits in pairs(want) do
        assert.are.equal(bits, u16s(a:masked_fill(c, v))[2], ("%s constant %.17g"):format(dt, v))
      end
      local nan = u16s(a:masked_fill(c, 0 / 0))[2]
      assert.are.equal(dt == "bf16" and 0x7fc0 or 0x7e00, nan & 0x7fff, dt .. " a NaN constant is the canonical NaN")
    end)
  end
end)

---------------------------------------------------------------------------
-- bf16 add/sub/mul/div: one fused loop
---------------------------------------------------------------------------

describe("bf16/f16 add, sub, mul, div (fused loop)", function()
  for _, dt in ipairs(DTYPES) do
    for _, name in ipairs({"add", "sub", "mul", "div"}) do
      for _, m in ipairs(MODES) do
        it(("%s of every %s pattern with another gives the f32 route's bits (%s)"):format(name, dt, m[3]), function()
          local a, b = from_u16(dt, {256, 256}, patterns(1)), from_u16(dt, {256, 256}, patterns(40503))
          with(m[1], m[2], function()
            local ref = a:float()[name](a:float(), b:float()):to(dt)
            assert_same_bits(a[name](a, b), ref, dt .. " " .. name)
            -- the generic loop (inner stride 2: no fused path) agrees as well
            local a2 = ember.stack({a, a}, 2):select(2, 0)
            assert.are.same({256, 256}, a2.shape)
            assert.is_false(a2:is_contiguous())
            assert_same_bits(a2[name](a2, b), ref, dt .. " " .. name .. ", strided a")
          end)
        end)
      end

      it(("%s broadcasts rows, columns and numbers as the f32 route does (%s)"):format(name, dt), function()
        local R = H.seeded(1720)
        local x, row, col = R.randn({37, 300}, dt), R.randn({300}, dt), R.randn({37, 1}, dt)
        for _, m in ipairs(MODES) do
          with(m[1], m[2], function()
            local xf = x:float()
            assert_same_bits(x[name](x, row), xf[name](xf, row:float()):to(dt), name .. " row, " .. m[3])
            assert_same_bits(row[name](row, x), row:float()[name](row:float(), xf):to(dt), name .. " row first, " .. m[3])
            assert_same_bits(x[name](x, col), xf[name](xf, col:float()):to(dt), name .. " column, " .. m[3])
            assert_same_bits(x[name](x, 2.7), xf[name](xf, 2.7):to(dt), name .. " number, " .. m[3])
            assert_same_bits(ember[name](-0.3, x), ember[name](-0.3, xf):to(dt), name .. " number first, " .. m[3])
            local v = x:narrow(1, 3, 251)                          -- offset rows of odd length
            assert_same_bits(v[name](v, v), v:float()[name](v:float(), v:float()):to(dt), name .. " narrowed, " .. m[3])
          end)
        end
      end)
    end

    it(("takes the generic loop's NaN when both operands are NaN (%s)"):format(dt), function()
      -- x86 keeps the first operand's NaN, and a compiler may swap a + b: the
      -- fused loop hands such pieces back to the generic loop
      local q, s = dt == "bf16" and {0x7fc1, 0xffc2, 0x7f81, 0xff83} or {0x7e01, 0xfe02, 0x7c01, 0xfc03},
                   dt == "bf16" and {0xff85, 0x7fc6, 0xffc7, 0x7f88} or {0xfc05, 0x7e06, 0xfe07, 0x7c08}
      local pa, pb = {}, {}
      for i = 1, 37 do pa[i], pb[i] = q[i % 4 + 1], s[(i * 3) % 4 + 1] end
      local a, b = from_u16(dt, {37}, pa), from_u16(dt, {37}, pb)
      for _, name in ipairs({"add", "sub", "mul", "div"}) do
        local ref = a:float()[name](a:float(), b:float()):to(dt)
        local a2 = ember.stack({a, a}, 1):select(1, 0)            -- inner stride 2: the generic loop
        assert.is_false(a2:is_contiguous())
        assert_same_bits(a[name](a, b), ref, dt .. " " .. name .. " of NaNs")
        assert_same_bits(a2[name](a2, b), ref, dt .. " " .. name .. " of NaNs, generic loop")
        for _, m in ipairs(MODES) do                             -- in place: the recompute reads a as it was
          local c = a:clone()
          with(m[1], m[2], function() c[name .. "_"](c, b) end)
          assert_same_bits(c, ref, dt .. " " .. name .. "_ of NaNs in place, " .. m[3])
        end
      end
    end)

    it(("writes into out= tensors, contiguous or not, as the f32 route does (%s)"):format(dt), function()
      local R = H.seeded(1730)
      local a, b = R.randn({64, 48}, dt), R.randn({64, 48}, dt)
      local ref = (a:float() + b:float()):to(dt)
      local o = ember.empty({64, 48}, {dtype = dt})
      a:add(b, {out = o})
      assert_same_bits(o, ref, "out= contiguous")
      local ot = ember.empty({48, 64}, {dtype = dt})
      a:add(b, {out = ot:t()})
      assert_same_bits(ot:t(), ref, "out= transposed")
      local c = a:clone()
      c:add_(b)
      assert_same_bits(c, ref, "add_ in place")
    end)
  end
end)

---------------------------------------------------------------------------
-- streamed 16-bit outputs of the generic loop; thread counts
---------------------------------------------------------------------------

describe("bf16/f16 outputs at any thread count, streamed or not", function()
  for _, dt in ipairs(DTYPES) do
    it(("give the same bits at 1 and 3 threads, above and below the streaming threshold (%s)"):format(dt), function()
      local R = H.seeded(1740)
      local x, y = R.randn({5, 4, 64, 65}, dt), R.randn({64, 65}, dt)
      local c = mask({64, 65}, function(i) return (i * 11) % 5 < 2 end)
      local cases = {
        {"add", function() return x + y end, function() return (x:float() + y:float()):to(dt) end},
        {"mul", function() return x * y end, function() return (x:float() * y:float()):to(dt) end},
        {"maximum", function() return ember.maximum(x, y) end, function() return ember.maximum(x:float(), y:float()):to(dt) end},
        {"neg", function() return -x end, function() return (-x:float()):to(dt) end},
        {"exp", function() return x:exp() end, function() return x:float():exp():to(dt) end},
        {"masked_fill", function() return x:masked_fill(c, -1e4) end, function() return x:float():masked_fill(c, -1e4):to(dt) end},
        {"where", function() return ember.where(c, y, x) end, function() return ember.where(c, y:float(), x:float()):to(dt) end},
      }
      for _, k in ipairs(cases) do
        local ref = k[3]()
        local one = with(1, -1, k[2])
        local many = with(3, 0, k[2])
        local default = with(3, 16 << 20, k[2])                -- below the default threshold: regular stores
        assert_same_bits(one, ref, dt .. " " .. k[1] .. ", 1 thread")
        assert_same_bits(many, one, dt .. " " .. k[1] .. ", 3 threads streamed vs 1")
        assert_same_bits(default, one, dt .. " " .. k[1] .. ", 3 threads below the threshold vs 1")
      end
    end)
  end
end)
