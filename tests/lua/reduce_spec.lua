-- reduce_spec.lua — the VALUES of the reductions (engine/ops/reduce.c): sum,
-- mean, max/min with indices, argmax/argmin, var/std, logsumexp, softmax and
-- log_softmax, over all dims, one dim, several dims, negative dims, keepdim;
-- the result dtypes; accumulation precision; numerical stability.
-- Gradients live in gradcheck_spec.lua, errors in bad_input_spec.lua.
--
-- Run from the repository root:
--   LUA_PATH="build/lua/?.lua;build/lua/?/init.lua;;" LUA_CPATH="build/lua/?.so;;" \
--     busted tests/lua/reduce_spec.lua
--
-- References are computed here in plain Lua doubles from t:tolist() values.
-- Tolerances, and why:
--   * f64: 1e-13 relative. Our loop and the engine's add in different orders;
--     for the ≤ 60-element O(1) sums here the difference is a few 1e-16.
--   * f32 sum/mean/var: 2 ulps of the result (2^-22 relative): the exact
--     value rounded to f32 is within 0.5 ulp; accumulating in f32 (PyTorch's
--     pairwise order) adds at most about one more ulp on these short rows.
--   * f32 softmax/log_softmax/logsumexp: 8 ulps relative plus 1e-7 absolute:
--     expf/logf are within 1-2 ulps and the normalisation adds a few roundings.

local ember = require "ember"
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")

local F64_RTOL = 1e-13
local F32_SUM_RTOL = 2 ^ -22
local F32_RTOL, F32_ATOL = 8 * 2 ^ -23, 1e-7

local flat, f32, isnan, assert_close = H.flat, H.f32, H.isnan, H.assert_close

-- Split the row-major values of a tensor of `shape` into groups, one per
-- output element (row-major over the kept dims); each group lists its values
-- in row-major order over the reduced dims. `dims` holds 0-based dims (negative
-- ones count from the end); an empty list means every dim.
local function groups(values, shape, dims)
  local nd = #shape
  local red = {}
  if #dims == 0 then for d = 0, nd - 1 do red[d] = true end end
  for _, d in ipairs(dims) do red[d < 0 and d + nd or d] = true end
  local out = {}
  for f = 0, #values - 1 do
    local rem, idx = f, {}
    for d = nd - 1, 0, -1 do idx[d] = rem % shape[d + 1]; rem = rem // shape[d + 1] end
    local o = 0
    for d = 0, nd - 1 do if not red[d] then o = o * shape[d + 1] + idx[d] end end
    out[o + 1] = out[o + 1] or {}
    table.insert(out[o + 1], values[f + 1])
  end
  return out
end

local function sum(g) local s = 0.0 for _, v in ipairs(g) do s = s + v end return s end
local function mean(g) return sum(g) / #g end
local function var(g, correction)
  local m, s = mean(g), 0.0
  for _, v in ipairs(g) do s = s + (v - m) ^ 2 end
  return s / (#g - correction)
end
local function lse(g)
  local m = -math.huge
  for _, v in ipairs(g) do m = math.max(m, v) end
  local s = 0.0
  for _, v in ipairs(g) do s = s + math.exp(v - m) end
  return m + math.log(s)
end
-- (value, index) of the first maximum / minimum, like torch
local function argbest(g, better)
  local bi = 1
  for i = 2, #g do if better(g[i], g[bi]) then bi = i end end
  return g[bi], bi - 1
end
local function gt(a, b) return a > b end
local function lt(a, b) return a < b end

local map = H.map

local SHAPE = {3, 4, 5}
local function input(seed, dtype)
  ember.manual_seed(seed)
  return ember.randn(SHAPE, {dtype = dtype or "f64"})
end

-- the dims lists every reduction is checked over
local DIMS = {{}, {0}, {1}, {2}, {-1}, {-3}, {0, 2}, {-1, 1}, {0, 1, 2}}
local function dims_name(d) return #d == 0 and "all dims" or "dims {" .. table.concat(d, ", ") .. "}" end

-- expected output shape
local function out_shape(shape, dims, keepdim)
  local nd, red, s = #shape, {}, {}
  if #dims == 0 then for d = 0, nd - 1 do red[d] = true end end
  for _, d in ipairs(dims) do red[d < 0 and d + nd or d] = true end
  for d = 0, nd - 1 do
    if not red[d] then s[#s + 1] = shape[d + 1] elseif keepdim then s[#s + 1] = 1 end
  end
  return s
end

-- call a reduction with a dims list the way a user writes it
local function call(t, name, dims, opts)
  if #dims == 0 then return t[name](t, nil, opts) end
  if #dims == 1 then return t[name](t, dims[1], opts) end
  return t[name](t, dims, opts)
end

---------------------------------------------------------------------------

describe("sum and mean", function()
  for i, dims in ipairs(DIMS) do
    it("sum over " .. dims_name(dims) .. " in f64", function()
      local x = input(10 + i)
      local r = call(x, "sum", dims)
      assert.same(out_shape(SHAPE, dims, false), r.shape)
      assert_close(flat(r), map(groups(flat(x), SHAPE, dims), sum), F64_RTOL, 0, "sum")
    end)

    it("mean over " .. dims_name(dims) .. " in f32, keepdim", function()
      local x = input(30 + i, "f32")
      local r = call(x, "mean", dims, {keepdim = true})
      assert.equals("f32", r.dtype)
      assert.same(out_shape(SHAPE, dims, true), r.shape)
      assert_close(flat(r), map(groups(flat(x), SHAPE, dims), function(g) return f32(mean(g)) end),
        F32_SUM_RTOL, 1e-9, "mean")
    end)
  end

  it("reduces a permuted (non-contiguous) tensor over every dims list", function()
    ember.manual_seed(40)
    local x = ember.randn(4, 5, 3, {dtype = "f64"}):permute(2, 0, 1)     -- (3, 4, 5), not contiguous
    assert.is_false(x:is_contiguous())
    for _, dims in ipairs(DIMS) do
      assert_close(flat(call(x, "sum", dims)), map(groups(flat(x), SHAPE, dims), sum), F64_RTOL, 0,
        "permuted sum over " .. dims_name(dims))
    end
  end)

  it("sums f32 columns (dim 0) eight rows at a time across blocks, odd row counts, equal bits at 1 and 3 threads",
    function()
    -- column mode groups eight rows per accumulator update inside 128-row
    -- blocks: 301 rows = two full blocks and a 45-row one (5 groups + 5 single rows)
    for _, shape in ipairs({{301, 37}, {7, 5}, {8, 3}, {4, 3, 130}}) do
      ember.manual_seed(41)
      local x = ember.randn(shape, {dtype = "f32"})
      local x64 = x:to("f64")
      local want = x64:sum(0)
      local function run(n)
        local pn = ember.get_num_threads()
        local pw = ember.set_parallel_min_work(1)
        ember.set_num_threads(n)
        local ok, r = pcall(function() return x:sum(0), x:mean(0) end)
        ember.set_num_threads(pn)
        ember.set_parallel_min_work(pw)
        assert(ok, r)
        return r
      end
      local r1, r3 = run(1), run(3)
      assert.same(want.shape, r1.shape)
      -- each column: f32 inputs summed in double, then rounded once to f32
      assert_close(flat(r1), map(flat(want), f32), 0, 0, "sum(0) of " .. table.concat(shape, "x"))
      assert.same(flat(r1), flat(r3))
    end
  end)

  it("sum over all dims gives a 0-d tensor", function()
    local r = ember.ones(2, 3):sum()
    assert.equals(0, r:dim())
    assert.equals(6, r:item())
  end)

  it("keepdim keeps reduced dims as size 1 and the values line up", function()
    local x = ember.tensor({{1, 2, 3}, {4, 5, 6}})
    assert.same({{6}, {15}}, x:sum(1, {keepdim = true}):tolist())
    assert.same({{5, 7, 9}}, x:sum(0, {keepdim = true}):tolist())
    assert.same({{2.5, 3.5, 4.5}}, x:mean(-2, {keepdim = true}):tolist())
  end)

  it("reduces a non-contiguous (transposed) tensor by its logical layout", function()
    local x = ember.tensor({{1, 2, 3}, {4, 5, 6}}):t()    -- (3, 2)
    assert.same({5, 7, 9}, x:sum(1):tolist())
    assert.same({6, 15}, x:sum(0):tolist())
  end)

  it("sum of integers is i64 and exact beyond 2^53", function()
    local big = (1 << 53) + 1
    local x = ember.tensor({big, 1, 1}, {dtype = "i64"})
    local r = x:sum()
    assert.equals("i64", r.dtype)
    assert.equals(big + 2, r:item())
  end)

  for _, dt in ipairs({"i32", "u8", "bool", "i64"}) do
    it("sum of " .. dt .. " gives i64", function()
      ember.manual_seed(5)
      local x = ember.randint(0, 2, {4, 6}, {dtype = "i64"}):to(dt)
      local r = x:sum(1)
      assert.equals("i64", r.dtype)
      local want = map(groups(flat(x:long()), {4, 6}, {1}), function(g) return math.tointeger(sum(g)) end)
      assert.same(want, flat(r))
    end)
  end

  it("sum of u8 does not wrap at 256", function()
    assert.equals(600, ember.full({3}, 200, {dtype = "u8"}):sum():item())
  end)

  it("bf16 sum accumulates in f32 or better: 1000 × bf16(0.01) is 10.01, not stuck near 4", function()
    -- bf16(0.01) = 0.010009765625; the exact sum 10.009765625 rounds to bf16 10.0
    -- (bf16 spacing at 10 is 0.0625, so 1 ulp of tolerance is the result's own rounding).
    -- A running bf16 accumulator stalls once 0.01 drops below half an ulp (at 4,
    -- ulp = 0.03125), ending near 4 — we show that below so the test can tell.
    local x = ember.full({1000}, 0.01, {dtype = "bf16"})
    local r = x:sum()
    assert.equals("bf16", r.dtype)
    assert.is_true(math.abs(r:item() - 10.009765625) <= 0.0625, tostring(r:item()))
    local acc = ember.zeros({}, {dtype = "bf16"})
    for _ = 1, 1000 do acc:add_(x:select(0, 0)) end     -- naive bf16 accumulation
    assert.is_true(acc:item() < 5, "naive bf16 accumulation should stall: " .. acc:item())
  end)

  -- The bf16 fast paths (values widened to f32 in SIMD, eight rows at a time
  -- in column sums): a sum of bf16 values in double is exact here (randn's
  -- values span far less than 2^45), so each result is the exact f64 result
  -- of the same values rounded once to bf16, bit for bit.
  for _, c in ipairs({
    {"sum over all of 100003 (blocks, a ragged chunk)", {100003}, function(x) return x:sum() end},
    {"sum over the last dim of (5, 7000)", {5, 7000}, function(x) return x:sum(-1) end},
    {"sum over dim 0 of (300, 70) (column mode: 8-row groups and 4 left over)", {300, 70},
      function(x) return x:sum(0) end},
    {"mean over dim 0 of (37, 5000)", {37, 5000}, function(x) return x:mean(0) end},
    {"amax over the last dim of (3, 9000)", {3, 9000}, function(x) return x:amax(-1) end},
    {"min over all of 70001", {70001}, function(x) return x:min() end},
  }) do
    it("bf16 " .. c[1] .. " is the f64 result of the same values, rounded once", function()
      ember.manual_seed(17)
      local x = ember.randn(c[2]):to("bf16")
      local got, want = c[3](x), c[3](x:to("f64")):to("bf16")
      assert.equals("bf16", got.dtype)
      assert.same(want:to("f64"):tolist(), got:to("f64"):tolist())
    end)
  end

  it("column sums over several bands, row blocks and outer positions equal the row sums (integers: exact)", function()
    -- (3, 300, 5000) over dim 1: 3 outer positions, 2 column bands of <= 4096, 3 row blocks of 128,
    -- combined in tasks of 256 columns; the transposed copy sums each output as one row instead
    ember.manual_seed(19)
    for _, dt in ipairs({"f32", "bf16", "i32"}) do
      local x = ember.randint(-50, 50, {3, 300, 5000}):to(dt)
      local got = x:sum(1)
      local want = x:transpose(1, 2):contiguous():sum(-1)
      assert.same({3, 5000}, got.shape)
      assert.same(want:to("f64"):tolist(), got:to("f64"):tolist())
      assert.is_true(got:abs():sum():item() > 0)
    end
  end)

  it("bf16 max over the last dim gives the first index of the maximum, as f64 does", function()
    ember.manual_seed(18)
    local x = ember.randint(0, 40, {4, 6000}):to("bf16")   -- many ties
    local v, i = x:max(-1)
    local v64, i64 = x:to("f64"):max(-1)
    assert.same(v64:tolist(), v:to("f64"):tolist())
    assert.same(i64:tolist(), i:tolist())
  end)

  -- The bf16 max/min pass also names the 256-value sub-block where the
  -- extreme first lies, and the search for its index starts there: rows
  -- around the 64-value steps, the sub-blocks and the 4096-value passes, the
  -- extreme in one or two places, on -0/+0 ties, behind a NaN; values and
  -- indices as the f64 path (a separate walk) gives them, zeros' signs too.
  it("bf16 max/min over the last dim: first index around the sub-block edges, ties, -0/+0, NaN", function()
    ember.manual_seed(20)
    math.randomseed(20)
    for _, len in ipairs({63, 64, 65, 255, 256, 257, 513, 4095, 4096, 4097, 8300}) do
      local rows = {}
      for r = 1, 24 do
        local row = {}
        for i = 1, len do row[i] = -math.random(1, 100) end
        local p, q = math.random(1, len), math.random(1, len)
        if r % 6 == 1 then row[p] = 5 end
        if r % 6 == 2 then row[p], row[q] = 5, 5 end
        if r % 6 == 3 then                                     -- the same sub-block offset, one block apart
          local b = ((p - 1) // 256 + 1) * 256 + (p - 1) % 16 + 1
          row[p] = 5
          if b <= len then row[b] = 5 end
        end
        if r % 6 == 4 then for i = 1, len do if math.random() < 0.3 then row[i] = math.random() < 0.5 and 0.0 or -0.0 end end end
        if r % 6 == 5 then row[p], row[q] = 5, 0 / 0 end
        if r % 6 == 0 then row[len] = 7; row[p] = 7 end
        rows[r] = row
      end
      local x = ember.tensor(rows):to("bf16")
      for _, f in ipairs({"max", "min"}) do
        local v, i = x[f](x, -1)
        local v64, i64 = x:to("f64")[f](x:to("f64"), -1)
        local what = ("%s over rows of %d"):format(f, len)
        assert.same(i64:tolist(), i:tolist(), what .. ": indices")
        local a, b = v:to("f64"), v64
        assert.same(b:ne(b):tolist(), a:ne(a):tolist(), what .. ": NaNs")
        a, b = a:masked_fill(a:ne(a), 1), b:masked_fill(b:ne(b), 1)
        assert.same(b:tolist(), a:tolist(), what .. ": values")
        assert.same(b:reciprocal():tolist(), a:reciprocal():tolist(), what .. ": signs of zeros")
      end
    end
  end)

  it("bf16 column sums in 16-column steps, an 8-column step and single columns equal the row sums (integers: exact)",
    function()
      ember.manual_seed(21)
      for _, k in ipairs({7, 8, 15, 16, 17, 24, 31, 33, 300, 4100}) do
        local x = ember.randint(-50, 50, {27, k}):to("bf16")   -- 3 groups of 8 rows and 3 rows
        local got, want = x:sum(0), x:t():contiguous():sum(-1)
        assert.same(want:to("f64"):tolist(), got:to("f64"):tolist(), ("%d columns"):format(k))
      end
    end)

  it("a long f32 sum is accurate: 10^6 × 0.1 is within 1e-6 relative of 100000", function()
    -- float(0.1) · 10^6 = 100000.0014901…; naive f32 accumulation drifts by ~1%
    local r = ember.full({1000000}, 0.1):sum():item()
    assert.is_true(math.abs(r - f32(0.1) * 1e6) <= 1e-6 * 1e5, tostring(r))
  end)

  it("sum of an empty tensor is 0; mean of one is nan (as torch)", function()
    local e = ember.zeros(0)
    assert.equals(0, e:sum():item())
    assert.is_true(isnan(e:mean():item()))
  end)

  it("sum over a size-0 dim gives zeros of the kept shape", function()
    local r = ember.zeros(3, 0):sum(1)
    assert.same({3}, r.shape)
    assert.same({0, 0, 0}, r:tolist())
  end)

  it("sum propagates inf and nan", function()
    assert.equals(math.huge, ember.tensor({1, math.huge}):sum():item())
    assert.is_true(isnan(ember.tensor({math.huge, -math.huge}):sum():item()))
    assert.is_true(isnan(ember.tensor({1, 0 / 0, 2}):mean():item()))
  end)
end)

describe("max and min", function()
  for _, d in ipairs({0, 1, 2, -1}) do
    it("max over dim " .. d .. " gives values and first indices (f32)", function()
      local x = input(50 + d, "f32")
      local v, i = x:max(d)
      assert.equals("i64", i.dtype)
      local want_v, want_i = {}, {}
      for k, g in ipairs(groups(flat(x), SHAPE, {d})) do want_v[k], want_i[k] = argbest(g, gt) end
      assert.same(want_v, flat(v))
      assert.same(want_i, flat(i))
    end)

    it("min over dim " .. d .. " gives values and first indices (f64)", function()
      local x = input(60 + d, "f64")
      local v, i = x:min(d)
      local want_v, want_i = {}, {}
      for k, g in ipairs(groups(flat(x), SHAPE, {d})) do want_v[k], want_i[k] = argbest(g, lt) end
      assert.same(want_v, flat(v))
      assert.same(want_i, flat(i))
    end)
  end

  it("finds the extremum and its index in long rows (1000 values, crossing 256-element chunks)", function()
    ember.manual_seed(72)
    local x = ember.randn(3, 1000)
    x:select(0, 1):narrow(0, 777, 1):fill_(100)          -- row 1: maximum at 777
    x:select(0, 2):narrow(0, 300, 1):fill_(-100)         -- row 2: minimum at 300
    local v, i = x:max(1)
    local w, j = x:min(1)
    local want_v, want_i, want_w, want_j = {}, {}, {}, {}
    for k, g in ipairs(groups(flat(x), {3, 1000}, {1})) do
      want_v[k], want_i[k] = argbest(g, gt)
      want_w[k], want_j[k] = argbest(g, lt)
    end
    assert.same(want_v, flat(v)); assert.same(want_i, flat(i))
    assert.same(want_w, flat(w)); assert.same(want_j, flat(j))
    assert.equals(777, want_i[2])
    assert.equals(1000 + 777, x:argmax():item())
    assert.equals(2000 + 300, x:argmin():item())
  end)

  it("returns the first index on ties, like torch", function()
    local x = ember.tensor({{3, 1, 3, 3}, {0, 0, -1, -1}})
    local v, i = x:max(1)
    assert.same({3, 0}, v:tolist())
    assert.same({0, 0}, i:tolist())
    local w, j = x:min(1)
    assert.same({1, -1}, w:tolist())
    assert.same({1, 2}, j:tolist())
  end)

  it("keeps the first tie and the first NaN across a long row (chunks and reduction blocks)", function()
    local n = 70000                                   -- past one 256-element chunk and one 32768 block
    local row = {}
    for k = 1, n do row[k] = (k * 7919) % 1000 end    -- maxima 999 at many places, minima 0
    local x = ember.tensor({row})
    local first999, first0
    for k = 1, n do
      if row[k] == 999 and not first999 then first999 = k - 1 end
      if row[k] == 0 and not first0 then first0 = k - 1 end
    end
    local v, i = x:max(1)
    assert.same({999}, v:tolist())
    assert.same({first999}, i:tolist())
    assert.equals(first0, x:argmin():item())
    row[40001], row[60001] = 0 / 0, 0 / 0              -- NaNs in the second block: the first wins
    local y = ember.tensor({row})
    local _, j = y:max(1)
    assert.same({40000}, j:tolist())
    assert.equals(40000, y:argmin():item())
  end)

  it("keepdim keeps values and indices as (n, 1)", function()
    local v, i = ember.tensor({{1, 5}, {7, 2}}):max(1, {keepdim = true})
    assert.same({{5}, {7}}, v:tolist())
    assert.same({{1}, {0}}, i:tolist())
  end)

  it("max and min over all dims give 0-d values", function()
    local x = input(70, "f32")
    local r = x:max()
    assert.equals(0, r:dim())
    local lx = flat(x)
    assert.equals(math.max(table.unpack(lx)), r:item())
    assert.equals(math.min(table.unpack(lx)), x:min():item())
  end)

  it("works on integer tensors exactly", function()
    local x = ember.tensor({{5, -7, 2}, {9, 9, -1}}, {dtype = "i64"})
    local v, i = x:max(1)
    assert.equals("i64", v.dtype)
    assert.same({5, 9}, v:tolist())
    assert.same({0, 0}, i:tolist())
  end)

  it("NaN wins max and min (torch propagates it) and its index is returned", function()
    local x = ember.tensor({{1, 0 / 0, 3}})
    local v, i = x:max(1)
    assert.is_true(isnan(v:item()))
    assert.equals(1, i:item())
    local w, j = x:min(1)
    assert.is_true(isnan(w:item()))
    assert.equals(1, j:item())
    assert.is_true(isnan(x:max():item()))
  end)

  it("bf16 max is exact (a selection, not arithmetic)", function()
    local x = input(71, "bf16")
    local v = x:max(2)
    assert.equals("bf16", v.dtype)
    assert.same(map(groups(flat(x), SHAPE, {2}), function(g) return (argbest(g, gt)) end), flat(v))
  end)
end)

describe("argmax and argmin", function()
  it("argmax with no dim gives the flat index of the first maximum", function()
    local x = input(80, "f32")
    local _, want = argbest(flat(x), gt)
    local r = x:argmax()
    assert.equals("i64", r.dtype)
    assert.equals(0, r:dim())
    assert.equals(want, r:item())
  end)

  it("argmin with no dim gives the flat index of the first minimum", function()
    local x = input(81, "f32")
    local _, want = argbest(flat(x), lt)
    assert.equals(want, x:argmin():item())
  end)

  it("argmax over all of a transposed tensor counts in its logical order", function()
    local x = ember.tensor({{0, 9}, {1, 2}}):t()     -- logical {{0, 1}, {9, 2}}
    assert.equals(2, x:argmax():item())
  end)

  it("argmax and argmin over a dim match the max/min indices", function()
    local x = input(82, "f64")
    for _, d in ipairs({0, 1, -1}) do
      local _, i = x:max(d)
      assert.same(i:tolist(), x:argmax(d):tolist())
      local _, j = x:min(d)
      assert.same(j:tolist(), x:argmin(d):tolist())
    end
  end)

  it("argmax takes the first of tied maxima and keepdim", function()
    local x = ember.tensor({{2, 7, 7}, {4, 4, 1}})
    assert.same({1, 0}, x:argmax(1):tolist())
    assert.same({{1}, {0}}, x:argmax(1, {keepdim = true}):tolist())
    assert.equals(1, x:argmax():item())
  end)
end)

describe("var and std", function()
  for _, corr in ipairs({0, 1}) do
    for i, dims in ipairs({{}, {1}, {-1}, {0, 2}}) do
      it("var with correction " .. corr .. " over " .. dims_name(dims) .. " (f64)", function()
        local x = input(90 + i + 10 * corr)
        local r = call(x, "var", dims, {correction = corr})
        assert.same(out_shape(SHAPE, dims, false), r.shape)
        assert_close(flat(r), map(groups(flat(x), SHAPE, dims), function(g) return var(g, corr) end),
          F64_RTOL, 0, "var")
      end)
    end
  end

  it("var defaults to the unbiased estimate (correction 1), like torch", function()
    local x = ember.tensor({1, 2, 3, 4}, {dtype = "f64"})
    assert.equals(5 / 3, x:var():item())
    assert.equals(1.25, x:var(0, {correction = 0}):item())
  end)

  it("var in f32 matches the double two-pass value rounded", function()
    local x = input(99, "f32")
    assert_close(flat(x:var(1)), map(groups(flat(x), SHAPE, {1}), function(g) return f32(var(g, 1)) end),
      F32_SUM_RTOL, 0, "var f32")
  end)

  it("var of data with a large offset is not destroyed by cancellation", function()
    -- 1e4 + {0, 1, 2, 3} in f32: a one-pass E[x²] - E[x]² in f32 loses everything
    local x = ember.tensor({10000, 10001, 10002, 10003})
    assert_close({x:var():item()}, {5 / 3}, 1e-6, 0, "var with offset")
  end)

  it("std is the square root of var, with keepdim", function()
    local x = input(100)
    local s = x:std(1, {keepdim = true})
    assert.same({3, 1, 5}, s.shape)
    assert_close(flat(s), map(groups(flat(x), SHAPE, {1}), function(g) return math.sqrt(var(g, 1)) end),
      F64_RTOL, 0, "std")
    assert_close(flat(x:std(nil, {correction = 0})), {math.sqrt(var(flat(x), 0))}, F64_RTOL, 0, "std all")
  end)
end)

describe("logsumexp", function()
  for _, d in ipairs({0, 1, -1}) do
    it("matches log(sum(exp)) over dim " .. d .. " (f64 and f32)", function()
      local x = input(110 + d, "f64")
      assert_close(flat(x:logsumexp(d)), map(groups(flat(x), SHAPE, {d}), lse), F64_RTOL, 0, "lse f64")
      local y = input(120 + d, "f32")
      assert_close(flat(y:logsumexp(d)), map(groups(flat(y), SHAPE, {d}), function(g) return f32(lse(g)) end),
        F32_RTOL, F32_ATOL, "lse f32")
    end)
  end

  it("is stable for large inputs: logsumexp({1000, 1000}) = 1000 + log 2 in f32", function()
    local r = ember.tensor({1000, 1000}):logsumexp(0):item()
    assert.equals(f32(1000 + math.log(2)), r)
    local n = ember.tensor({-1000, -1000}):logsumexp(0):item()
    assert.equals(f32(-1000 + math.log(2)), n)
  end)

  it("keepdim keeps the reduced dim", function()
    assert.same({3, 1, 5}, input(130):logsumexp(1, {keepdim = true}).shape)
  end)

  it("all -inf gives -inf; one +inf gives +inf", function()
    assert.equals(-math.huge, ember.tensor({-math.huge, -math.huge}):logsumexp(0):item())
    assert.equals(math.huge, ember.tensor({1, math.huge}):logsumexp(0):item())
  end)
end)

describe("softmax and log_softmax", function()
  local function softmax_ref(g)
    local l = lse(g)
    return map(g, function(v) return math.exp(v - l) end)
  end

  -- softmax along `d` of x, as a flat row-major list
  local function ref_along(x, d, f)
    local shape = x.shape
    local nd = #shape
    d = d < 0 and d + nd or d
    local vals, out = flat(x), {}
    local stride = 1
    for k = d + 2, nd do stride = stride * shape[k] end
    local n = shape[d + 1]
    for base = 0, #vals - 1 do
      local pos = (base // stride) % n
      if pos == 0 then
        local g = {}
        for k = 0, n - 1 do g[k + 1] = vals[base + k * stride + 1] end
        local s = f(g)
        for k = 0, n - 1 do out[base + k * stride + 1] = s[k + 1] end
      end
    end
    return out
  end

  for _, d in ipairs({0, 1, 2, -1}) do
    it("softmax over dim " .. d .. " matches exp(x - lse) (f64, f32)", function()
      local x = input(140 + d, "f64")
      assert_close(flat(x:softmax(d)), ref_along(x, d, softmax_ref), F64_RTOL, 1e-16, "softmax f64")
      local y = input(150 + d, "f32")
      assert_close(flat(y:softmax(d)), map(ref_along(y, d, softmax_ref), f32), F32_RTOL, F32_ATOL, "softmax f32")
    end)

    it("log_softmax over dim " .. d .. " matches x - lse (f64)", function()
      local x = input(160 + d, "f64")
      local want = ref_along(x, d, function(g)
        local l = lse(g)
        return map(g, function(v) return v - l end)
      end)
      assert_close(flat(x:log_softmax(d)), want, F64_RTOL, 1e-15, "log_softmax")
    end)
  end

  it("softmax rows sum to 1", function()
    local s = input(170, "f32"):softmax(-1)
    for _, row in ipairs(groups(flat(s), SHAPE, {2})) do
      assert.is_true(math.abs(sum(row) - 1) < 5 * 2 ^ -23 * 5, tostring(sum(row)))
    end
  end)

  it("softmax defaults to the last dim", function()
    local x = input(171)
    assert.same(x:softmax(-1):tolist(), x:softmax():tolist())
    assert.same(x:log_softmax(2):tolist(), x:log_softmax():tolist())
  end)

  it("exp(log_softmax) equals softmax", function()
    local x = input(172, "f32")
    assert_close(flat(x:log_softmax(1):exp()), flat(x:softmax(1)), F32_RTOL, F32_ATOL, "exp(log_softmax)")
  end)

  it("large inputs do not overflow: softmax({1000, 999, 998}) in f32", function()
    local s = ember.tensor({1000, 999, 998}):softmax(0):tolist()
    local z = 1 + math.exp(-1) + math.exp(-2)
    assert_close(s, {f32(1 / z), f32(math.exp(-1) / z), f32(math.exp(-2) / z)}, F32_RTOL, 0, "softmax large")
    local l = ember.tensor({1000, 999, 998}):log_softmax(0):tolist()
    assert_close(l, {f32(-math.log(z)), f32(-1 - math.log(z)), f32(-2 - math.log(z))}, F32_RTOL, 0, "log_softmax large")
  end)

  it("masked (-inf) entries get probability 0 and the rest renormalise", function()
    local s = ember.tensor({0, -math.huge, 0}, {dtype = "f64"}):softmax(0):tolist()
    assert.same({0.5, 0, 0.5}, s)
  end)

  it("bf16 softmax equals the f32 softmax rounded to bf16, within 1 bf16 ulp", function()
    -- computed in f32 or better then rounded once; 1 ulp (2^-8 relative) allows
    -- for an f32 result sitting on a bf16 rounding boundary
    local x = input(173, "bf16")
    local got = flat(x:softmax(-1))
    local want = flat(x:float():softmax(-1))
    assert_close(got, want, 2 ^ -8, 0, "bf16 softmax")
    assert.equals("bf16", x:softmax(-1).dtype)
  end)
end)
