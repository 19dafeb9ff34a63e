-- rng_spec.lua — Ember's random numbers (engine/rng.c, layout documented in
-- engine/include/ember/rng.h): reproducibility (manual_seed, get/set_rng_state),
-- the distributions' statistics, and a bit-for-bit cross-check of the stream
-- against Philox4x32-10 implemented in plain Lua from its definition
-- (tests/lua/philox_ref.lua; Salmon et al., SC'11; the Random123 reference's
-- known-answer vectors below pin that implementation). The cross-check is what keeps the CPU stream, the
-- CUDA stream and every checkpointed seed meaning the same numbers.
--
-- Run from the repository root:
--   LUA_PATH="build/lua/?.lua;build/lua/?/init.lua;;" LUA_CPATH="build/lua/?.so;;" \
--     busted tests/lua/rng_spec.lua
--
-- Statistical tests draw N = 100 000 values with a fixed seed and allow 6
-- standard errors: for a correct generator a 6σ deviation has probability
-- ~2e-9, while every plausible bug (wrong scaling, a missing sqrt, a biased
-- bit extraction) moves the statistic by tens of σ. With a fixed seed the
-- outcome is deterministic anyway; the 6σ bound is what makes the chosen
-- seed irrelevant.

local ember = require "ember"
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")

local flat, f32 = H.flat, H.f32

---------------------------------------------------------------------------
-- Philox4x32-10 in Lua 5.4 (64-bit integers): tests/lua/philox_ref.lua,
-- pinned below to Random123's known answers
---------------------------------------------------------------------------

local R = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "philox_ref.lua")
local NF = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "normal_f32_ref.lua")
local philox, block, words, u24 = R.philox, R.block, R.words, R.u24
local MASK = 0xffffffff

-- Box-Muller on word pairs (0,1) and (2,3) of each block, as rng.h documents,
-- in double (the f64 draw; normal_f32_ref.lua has the f32 one)
local function normals(seed, ctr0, n)
  local w, out = words(seed, ctr0, n + (4 - n % 4) % 4), {}
  for j = 0, n - 1, 2 do
    local r = math.sqrt(-2 * math.log(1 - u24(w[j + 1])))
    local t = 2 * math.pi * u24(w[j + 2])
    out[j + 1], out[j + 2] = r * math.cos(t), r * math.sin(t)
  end
  out[n + 1] = nil
  return out
end

-- unsigned 64-bit u mod s (0 < s < 2^62), as Java's Long.remainderUnsigned
local function umod(u, s)
  local q = ((u >> 1) // s) << 1
  local r = u - q * s
  while not math.ult(r, s) do r = r - s end
  return r
end

-- erf by its all-positive series (no cancellation), and erfinv by Newton on it
local erf = H.erf
local function erfinv(y)
  local x = 0.0
  for _ = 1, 100 do
    local step = (erf(x) - y) / (2 / math.sqrt(math.pi) * math.exp(-x * x))
    x = x - step
    if math.abs(step) <= 1e-16 * math.abs(x) then break end
  end
  return x
end

local function hex(ws)
  local s = {}
  for i, w in ipairs(ws) do s[i] = string.format("%08x", w) end
  return table.concat(s, " ")
end

---------------------------------------------------------------------------

describe("the Lua Philox4x32-10 used as the reference", function()
  -- Random123's kat_vectors for philox4x32 with 10 rounds: counter, key -> output
  it("matches Random123's known answer for counter 0, key 0", function()
    assert.equals("6627e8d5 e169c58d bc57ac4c 9b00dbd8", hex(philox(0, 0, 0, 0, 0, 0)))
  end)

  it("matches Random123's known answer for all-ones counter and key", function()
    assert.equals("408f276d 41c83b0e a20bc7c6 6d5451fd",
      hex(philox(MASK, MASK, MASK, MASK, MASK, MASK)))
  end)

  it("matches Random123's known answer for the pi-digits vector", function()
    assert.equals("d16cfe09 94fdcceb 5001e420 24126ea1",
      hex(philox(0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0)))
  end)
end)

describe("the stream is Philox4x32-10 as rng.h documents", function()
  it("the first 4 rand() f32 values after manual_seed(0) are the counter-0 block's words", function()
    -- block (0, 0, 0, 0) with key (0, 0) is Random123's first known answer, so
    -- these are (0x6627e8d5 >> 8)·2^-24 = 0.399046421..., 0.880520165...,
    -- 0.735712766..., 0.605481803...
    ember.manual_seed(0)
    local got = flat(ember.rand(4))
    local w = philox(0, 0, 0, 0, 0, 0)
    assert.same({u24(w[1]), u24(w[2]), u24(w[3]), u24(w[4])}, got)
    assert.is_true(math.abs(got[1] - 0.3990464210510254) < 1e-16)
  end)

  it("rand(10) takes words 0-3 of blocks 0, 1, 2 in order (last block partly)", function()
    ember.manual_seed(12345)
    local want = {}
    for j, w in ipairs(words(12345, 0, 10)) do want[j] = u24(w) end
    assert.same(want, flat(ember.rand(10)))
  end)

  it("a seed wider than 32 bits fills both key words", function()
    local seed = 0x123456789A
    ember.manual_seed(seed)
    local want = {}
    for j, w in ipairs(words(seed, 0, 4)) do want[j] = u24(w) end
    assert.same(want, flat(ember.rand(4)))
    -- and it differs from the seed's low 32 bits alone
    ember.manual_seed(seed & MASK)
    assert.are_not.same(want, flat(ember.rand(4)))
  end)

  it("each op starts at the next whole block: rand(6) then rand(4) uses counters 0-1 then 2", function()
    ember.manual_seed(7)
    ember.rand(6)
    assert.same({seed = 7, offset = 2}, ember.get_rng_state())
    local want = {}
    for j, w in ipairs(words(7, 2, 4)) do want[j] = u24(w) end
    assert.same(want, flat(ember.rand(4)))
    assert.equals(3, ember.get_rng_state().offset)
  end)

  it("rand in f64 holds the same 24-bit values", function()
    ember.manual_seed(8)
    local want = {}
    for j, w in ipairs(words(8, 0, 8)) do want[j] = u24(w) end
    assert.same(want, flat(ember.rand(8, {dtype = "f64"})))
  end)

  it("uniform_(lo, hi) is lo + (hi - lo)·u, rounded once to f32", function()
    ember.manual_seed(9)
    local t = ember.empty(8):uniform_(-3, 5)
    local want = {}
    for j, w in ipairs(words(9, 0, 8)) do want[j] = f32(-3 + 8 * u24(w)) end
    assert.same(want, flat(t))
  end)

  it("randn is Box-Muller on word pairs (0,1) and (2,3): first 8 values after manual_seed(3)", function()
    -- f32 randn: rng.h's f32 Box-Muller (own logf and sincos of 2 pi u from
    -- IEEE + - * / sqrt), re-derived in Lua: exact equality
    ember.manual_seed(3)
    local got = flat(ember.randn(8))
    assert.same(NF.normals(words(3, 0, 8), 8), got)
  end)

  it("randn and normal_ in f32 match the Lua f32 Box-Muller bit for bit over 4099 values", function()
    ember.manual_seed(31)
    assert.same(NF.normals(words(31, 0, 4100), 4099), flat(ember.randn(4099)))
    ember.manual_seed(32)
    assert.same(NF.normals(words(32, 0, 1000), 1000, 1, 2), flat(ember.empty(1000):normal_(1, 2)))
    -- bf16/f16 are the f32 values rounded once
    ember.manual_seed(33)
    local want = ember.tensor(NF.normals(words(33, 0, 1000), 1000, -0.5, 3), {dtype = "f32"})
    assert.same(flat(want:to("bf16")), flat(ember.empty(1000, {dtype = "bf16"}):normal_(-0.5, 3)))
    ember.manual_seed(33)
    assert.same(flat(want:to("f16")), flat(ember.empty(1000, {dtype = "f16"}):normal_(-0.5, 3)))
  end)

  it("the f32 Box-Muller is within 4 ulp of the double formula (log < 1 ulp, sin/cos < 2 ulp)", function()
    -- every factor is relatively accurate (sin/cos near their zeros too: the
    -- reduction is exact), so the bound is relative: 4 ulp of the f32 value
    ember.manual_seed(34)
    local n = 65536
    local got, want = flat(ember.randn(n)), normals(34, 0, n)
    local worst = 0
    for j = 1, n do
      local ulp = 2.0^(math.floor(math.log(math.abs(want[j]), 2)) - 23)
      worst = math.max(worst, math.abs(got[j] - want[j]) / ulp)
    end
    assert.is_true(worst <= 4, "worst error " .. worst .. " ulp")
    assert.is_true(worst > 0, "identical to the double formula: the f32 path did not run")
  end)

  it("logf and sincos2pi of the reference are accurate on every reduction branch", function()
    -- the Lua reference itself against libm in double: x across the binades
    -- and both sides of sqrt(2)/2, angles in all four quadrants and at their edges
    for _, m in ipairs({0, 1, 2, 1000, 0x3504f3, 0x800000 - 1, 0x800000, 0xb504f3, 0xffffff, 12345678}) do
      local x = f32(1 - m * 2.0^-24)
      local ref = math.log(x)
      local got = NF.logf(x)
      assert.is_true(math.abs(got - ref) <= 2.0^-24 * math.max(math.abs(ref), 2.0^-24), ("logf(%.9g)"):format(x))
    end
    for _, m in ipairs({0, 1, 0x1fffff, 0x200000, 0x200001, 0x400000, 0x5fffff, 0x600000, 0x800000, 0xa00000,
                        0xc00000, 0xdfffff, 0xe00000, 0xffffff, 9766646}) do
      local t = 2 * math.pi * m * 2.0^-24
      local sn, cs = NF.sincos2pi(m)
      assert.is_true(math.abs(sn - math.sin(t)) <= 2 * 2.0^-24 * math.max(math.abs(math.sin(t)), 2.0^-24), "sin " .. m)
      assert.is_true(math.abs(cs - math.cos(t)) <= 2 * 2.0^-24 * math.max(math.abs(math.cos(t)), 2.0^-24), "cos " .. m)
    end
  end)

  it("normal_(mean, std) is mean + std·z (f64, no rounding)", function()
    ember.manual_seed(4)
    local t = ember.empty(6, {dtype = "f64"}):normal_(10, 0.5)
    local z = normals(4, 0, 6)
    for j = 1, 6 do z[j] = 10 + 0.5 * z[j] end
    assert.same(z, flat(t))
  end)

  it("a non-contiguous tensor is filled in its logical row-major order", function()
    ember.manual_seed(5)
    local t = ember.empty(4, 3, {dtype = "f64"}):t()      -- (3, 4) view, strides (1, 3)
    t:uniform_(0, 1)
    local want = {}
    for j, w in ipairs(words(5, 0, 12)) do want[j] = u24(w) end
    assert.same(want, flat(t))
  end)

  it("randint(lo, hi) is lo + (w mod (hi - lo)), one word per element", function()
    ember.manual_seed(6)
    local got = flat(ember.randint(-5, 995, {9}))
    local want = {}
    for j, w in ipairs(words(6, 0, 9)) do want[j] = -5 + w % 1000 end
    assert.same(want, got)
  end)

  it("randint with a span above 2^32 uses two words (low, high) per element, two per block", function()
    local span = 1000000000039                           -- > 2^32, not a power of two
    ember.manual_seed(10)
    local got = flat(ember.randint(7, 7 + span, {5}))
    local want = {}
    for j = 0, 4 do
      local b = block(10, j // 2)
      local lo, hi = b[2 * (j % 2) + 1], b[2 * (j % 2) + 2]
      want[j + 1] = 7 + umod(lo | (hi << 32), span)
    end
    assert.same(want, got)
    assert.equals(3, ember.get_rng_state().offset)       -- ceil(5 / 2) blocks
  end)

  it("trunc_normal_ is the inverse-CDF method: erfinv(v0 + (v1 - v0)·u)·std·√2 + mean", function()
    -- ours: erfinv by Newton on a series erf; the engine's: Giles + Newton on
    -- libm's erf. Both are good to ~1e-15; after rounding to f32 they agree
    -- within one f32 ulp (2^-23 relative, 2^-24 near 0).
    local mean, std, a, b = 1, 2, -2, 3
    ember.manual_seed(11)
    local got = flat(ember.empty(12):trunc_normal_(mean, std, a, b))
    local v0, v1 = erf((a - mean) / std / math.sqrt(2)), erf((b - mean) / std / math.sqrt(2))
    for j, w in ipairs(words(11, 0, 12)) do
      local x = erfinv(v0 + (v1 - v0) * u24(w)) * std * math.sqrt(2) + mean
      x = math.min(math.max(x, a), b)
      assert.is_true(math.abs(got[j] - x) <= 2 ^ -23 * math.abs(x) + 2 ^ -24,
        string.format("element %d: got %.9g, expected %.9g", j, got[j], x))
    end
  end)
end)

describe("reproducibility", function()
  it("manual_seed replays rand, randn and randint", function()
    local function draw()
      return {flat(ember.rand(5)), flat(ember.randn(5)), flat(ember.randint(0, 100, {5}))}
    end
    ember.manual_seed(42)
    local a = draw()
    ember.manual_seed(42)
    assert.same(a, draw())
  end)

  it("get_rng_state / set_rng_state replays the same numbers mid-stream", function()
    ember.manual_seed(43)
    ember.randn(13)                                     -- move somewhere inside the stream
    local state = ember.get_rng_state()
    local a = flat(ember.randn(7))
    local b = flat(ember.rand(3))
    ember.set_rng_state(state)
    assert.same(a, flat(ember.randn(7)))
    assert.same(b, flat(ember.rand(3)))
  end)

  it("the state is {seed, offset} and manual_seed resets the offset to 0", function()
    ember.manual_seed(44)
    assert.same({seed = 44, offset = 0}, ember.get_rng_state())
    ember.rand(9)                                       -- 3 blocks
    assert.same({seed = 44, offset = 3}, ember.get_rng_state())
  end)

  it("different seeds give different numbers", function()
    ember.manual_seed(1)
    local a = flat(ember.rand(8))
    ember.manual_seed(2)
    assert.are_not.same(a, flat(ember.rand(8)))
  end)

  it("consecutive draws differ (the offset advances)", function()
    ember.manual_seed(45)
    assert.are_not.same(flat(ember.rand(4)), flat(ember.rand(4)))
  end)

  it("the dtype does not change which numbers are drawn: f32 and f64 rand agree", function()
    ember.manual_seed(46)
    local a = flat(ember.rand(6))
    ember.manual_seed(46)
    assert.same(a, flat(ember.rand(6, {dtype = "f64"})))
  end)
end)

describe("distributions (N = 100000, 6 standard errors)", function()
  local N = 100000

  local function moments(v)
    local s, s2 = 0.0, 0.0
    for _, x in ipairs(v) do s = s + x; s2 = s2 + x * x end
    local m = s / #v
    return m, s2 / #v - m * m
  end

  it("rand lies in [0, 1) with mean 1/2 and variance 1/12", function()
    ember.manual_seed(100)
    local v = flat(ember.rand(N))
    local lo, hi = math.huge, -math.huge
    for _, x in ipairs(v) do lo = math.min(lo, x); hi = math.max(hi, x) end
    assert.is_true(lo >= 0 and hi < 1, string.format("range [%g, %g]", lo, hi))
    local m, var = moments(v)
    -- SE(mean) = sqrt(1/12 / N) = 9.1e-4; SE(var) = sqrt((1/80 - 1/144) / N) = 2.4e-4
    assert.is_true(math.abs(m - 0.5) < 6 * 9.2e-4, "mean " .. m)
    assert.is_true(math.abs(var - 1 / 12) < 6 * 2.4e-4, "variance " .. var)
  end)

  for _, dt in ipairs({"bf16", "f16"}) do
    it("rand in " .. dt .. " never returns 1 (torch.rand is [0, 1) for every dtype)", function()
      -- u = (w >> 8)·2^-24 rounded to the 16-bit type reaches 1.0 whenever
      -- u >= 1 - 2^-9 (bf16) or 1 - 2^-12 (f16): ~200 (bf16) / ~25 (f16) of 100000
      ember.manual_seed(101)
      local hi = ember.rand(N, {dtype = dt}):max():item()
      assert.is_true(hi < 1, dt .. " rand returned " .. hi)
    end)
  end

  it("randn has mean 0, standard deviation 1 and normal tails", function()
    ember.manual_seed(102)
    local v = flat(ember.randn(N))
    local m, var = moments(v)
    -- SE(mean) = 1/sqrt(N) = 3.2e-3; SE(std) ≈ 1/sqrt(2N) = 2.2e-3
    assert.is_true(math.abs(m) < 6 * 3.2e-3, "mean " .. m)
    assert.is_true(math.abs(math.sqrt(var) - 1) < 6 * 2.3e-3, "std " .. math.sqrt(var))
    -- P(|z| > 2) = 0.0455; SE = sqrt(p (1 - p) / N) = 6.6e-4
    local tail = 0
    for _, x in ipairs(v) do if math.abs(x) > 2 then tail = tail + 1 end end
    assert.is_true(math.abs(tail / N - 0.0455) < 6 * 6.6e-4, "tail fraction " .. tail / N)
  end)

  it("randn (f32 Box-Muller) passes Kolmogorov-Smirnov, mean and std on 2^20 draws", function()
    ember.manual_seed(103)
    local n = 1 << 20
    local x = ember.randn(n)
    local m, sd = x:mean():item(), x:std():item()
    -- SE(mean) = 1/sqrt(n) = 9.8e-4, SE(std) = 1/sqrt(2n) = 6.9e-4
    assert.is_true(math.abs(m) < 6 * 9.8e-4, "mean " .. m)
    assert.is_true(math.abs(sd - 1) < 6 * 6.9e-4, "std " .. sd)
    local v = flat(x:sort())
    local d = 0
    for i = 1, n do
      local phi = (1 + H.erf(v[i] / math.sqrt(2))) / 2
      d = math.max(d, i / n - phi, phi - (i - 1) / n)
    end
    -- the KS statistic's 0.1% critical value is 1.95 / sqrt(n) = 1.9e-3
    assert.is_true(d < 1.95 / math.sqrt(n), "KS statistic " .. d)
  end)

  it("randint stays in [lo, hi) and hits every value", function()
    ember.manual_seed(103)
    local v = flat(ember.randint(-3, 7, {1000}))
    local seen = {}
    for _, x in ipairs(v) do
      assert.is_true(x >= -3 and x < 7, "out of range: " .. x)
      assert.equals("integer", math.type(x))
      seen[x] = true
    end
    -- each of the 10 values is missed by 1000 draws with probability 0.9^1000 ≈ 2e-46
    for x = -3, 6 do assert.is_true(seen[x], "never drew " .. x) end
  end)

  it("randint is uniform: each of 10 values within 6σ of N/10", function()
    ember.manual_seed(104)
    local v = flat(ember.randint(0, 10, {N}, {dtype = "i32"}))
    local count = {}
    for _, x in ipairs(v) do count[x] = (count[x] or 0) + 1 end
    local sd = math.sqrt(N * 0.1 * 0.9)                 -- 95
    for x = 0, 9 do assert.is_true(math.abs(count[x] - N / 10) < 6 * sd, x .. ": " .. count[x]) end
  end)

  it("trunc_normal_ stays within [a, b] (defaults a = -2, b = 2)", function()
    ember.manual_seed(105)
    local v = flat(ember.empty(N):trunc_normal_())
    local lo, hi = math.huge, -math.huge
    for _, x in ipairs(v) do lo = math.min(lo, x); hi = math.max(hi, x) end
    assert.is_true(lo >= -2 and hi <= 2, string.format("range [%g, %g]", lo, hi))
    -- and it is not a clamp of a normal, which would pile 4.55% (4550) of the
    -- values exactly onto ±2; the inverse-CDF method lands there ~never
    local at_bounds = 0
    for _, x in ipairs(v) do if x == -2 or x == 2 then at_bounds = at_bounds + 1 end end
    assert.is_true(at_bounds < 10, at_bounds .. " values sit exactly on the bounds")
    -- the standard normal truncated to [-2, 2] has variance 0.7737; SE(mean) = 2.8e-3, SE(var) = 2.9e-3
    local m, var = moments(v)
    assert.is_true(math.abs(m) < 6 * 2.8e-3, "mean " .. m)
    assert.is_true(math.abs(var - 0.7737) < 6 * 2.9e-3, "variance " .. var)
  end)

  it("trunc_normal_(mean 5, std 2, a 3, b 6) stays within [3, 6]", function()
    ember.manual_seed(106)
    local v = flat(ember.empty(10000):trunc_normal_(5, 2, 3, 6))
    for _, x in ipairs(v) do assert.is_true(x >= 3 and x <= 6, tostring(x)) end
  end)
end)
