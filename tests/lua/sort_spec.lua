-- sort_spec.lua — the VALUES of the sorting family (engine/ops/sort.c,
-- engine/ops/scan.c): sort/argsort (stable order, NaN as the largest, -0 and
-- +0 equal, every dtype, strided inputs), topk, kthvalue, median (lower,
-- NaN-propagating), cumsum/cumprod (result dtypes, zeros in cumprod's
-- gradient), unique, bincount, searchsorted; and the error messages.
-- Gradients of every differentiable op are also checked by finite
-- differences in gradcheck_spec.lua (registry: op_cases/sort.lua).
--
-- Run from the repository root:
--   LUA_PATH="build/lua/?.lua;build/lua/?/init.lua;;" LUA_CPATH="build/lua/?.so;;" \
--     busted tests/lua/sort_spec.lua
--
-- References are hand-computed, or computed here in plain Lua doubles from
-- t:tolist() values; selections are exact (no arithmetic), so they are
-- compared exactly. Scans compare with 1e-12 relative (f64 sums of <= 50
-- O(1) terms in another order).

local ember = require "ember"
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")

local NAN = 0 / 0

local function isnan(x) return x ~= x end

-- Lua's table.sort is not stable: sort (value, index) pairs with an index tie-break, NaN last.
local function ref_sort(list, descending)
  local pairs_ = {}
  for i, v in ipairs(list) do pairs_[i] = {v = v, i = i - 1} end
  table.sort(pairs_, function(a, b)
    local an, bn = isnan(a.v), isnan(b.v)
    if an or bn then
      if an and bn then return a.i < b.i end
      if descending then return an else return bn end
    end
    if a.v ~= b.v then if descending then return a.v > b.v else return a.v < b.v end end
    return a.i < b.i
  end)
  local v, i = {}, {}
  for k, p in ipairs(pairs_) do v[k] = p.v; i[k] = p.i end
  return v, i
end

local function same_floats(got, want, what)
  assert.are.equal(#want, #got, what)
  for k = 1, #want do
    if isnan(want[k]) then assert(isnan(got[k]), ("%s: element %d: expected nan, got %s"):format(what, k, got[k]))
    else assert.are.equal(want[k], got[k], ("%s: element %d"):format(what, k)) end
  end
end

local function err(fn, ...)
  local ok, msg = pcall(fn, ...)
  assert.is_false(ok, "expected an error")
  return H.strip_where(msg)
end

describe("sort", function()
  it("sorts rows ascending with NaN last and ties in input order", function()
    local x = ember.tensor({{3, 1, 2, NAN, 1, -5}, {2, 2, 0, 2, -1, 2}})
    local v, i = x:sort(1)
    for r, row in ipairs(x:tolist()) do
      local rv, ri = ref_sort(row)
      same_floats(v:tolist()[r], rv, "values")
      assert.same(ri, i:tolist()[r])
    end
    assert.are.equal("i64", i.dtype)
  end)

  it("sorts descending with NaN first and ties in input order", function()
    local x = ember.tensor({4, NAN, 4, -1, 7, 4})
    local v, i = x:sort(0, {descending = true})
    local rv, ri = ref_sort(x:tolist(), true)
    same_floats(v:tolist(), rv, "values")
    assert.same(ri, i:tolist())
    assert.same({1, 4, 0, 2, 5, 3}, i:tolist())
  end)

  it("treats -0 and +0 as equal (stable) and returns the values bit for bit", function()
    local v, i = ember.tensor({0.0, -0.0, -1, 0.0}):sort()
    assert.same({2, 0, 1, 3}, i:tolist())
    assert.are.equal(1 / 0, 1 / v:tolist()[2])    -- +0 first: it came first
    assert.are.equal(-1 / 0, 1 / v:tolist()[3])   -- then the -0
  end)

  it("sorts along dim 0, a middle dim and a negative dim", function()
    local x = ember.randn({3, 4, 5}, {dtype = "f64"})
    local vals = x:tolist()
    for _, dim in ipairs({0, 1, -1}) do
      local v, i = x:sort(dim)
      local vl, il = v:tolist(), i:tolist()
      local d = dim % 3
      for a = 1, 3 do for b = 1, 4 do for c = 1, 5 do
        local row = {}
        local n = ({3, 4, 5})[d + 1]
        for k = 1, n do
          local p = {a, b, c}; p[d + 1] = k
          row[k] = vals[p[1]][p[2]][p[3]]
        end
        local rv, ri = ref_sort(row)
        local p = {a, b, c}
        local k = p[d + 1]
        assert.are.equal(rv[k], vl[p[1]][p[2]][p[3]])
        assert.are.equal(ri[k], il[p[1]][p[2]][p[3]])
      end end end
    end
  end)

  it("reads strided views (a transpose) like their contiguous copies", function()
    local x = ember.randn({6, 5}, {dtype = "f64"}):t()
    local v1, i1 = x:sort(1)
    local v2, i2 = x:contiguous():sort(1)
    assert.same(v2:tolist(), v1:tolist())
    assert.same(i2:tolist(), i1:tolist())
  end)

  it("sorts every dtype, keeping it", function()
    for _, dt in ipairs({"f32", "f64", "bf16", "f16", "i32", "i64", "u8", "u16"}) do
      local x = ember.tensor({5, 0, 3, 3, 1, 200}, {dtype = dt})
      local v, i = x:sort(0, {descending = true})
      assert.are.equal(dt, v.dtype)
      assert.same({200, 5, 3, 3, 1, 0}, v:tolist(), dt)
      assert.same({5, 0, 2, 3, 4, 1}, i:tolist(), dt)
    end
    local v = ember.tensor({-3, 7, -9, 0}, {dtype = "i64"}):sort()
    assert.same({-9, -3, 0, 7}, v:tolist())
    local b, bi = ember.tensor({true, false, true, false}):sort()
    assert.same({false, false, true, true}, b:tolist())
    assert.same({1, 3, 0, 2}, bi:tolist())
  end)

  it("sorts a 0-d tensor and empty dims", function()
    local v, i = ember.tensor(2.5):sort()
    assert.are.equal(2.5, v:item())
    assert.are.equal(0, i:item())
    local e, ei = ember.zeros(3, 0):sort(1)
    assert.same({3, 0}, e.shape)
    assert.same({3, 0}, ei.shape)
  end)

  it("argsort gives sort's indices", function()
    local x = ember.randn({4, 7})
    local _, i = x:sort(-1, {descending = true})
    assert.same(i:tolist(), x:argsort(-1, {descending = true}):tolist())
    assert.same(select(2, x:sort({stable = true})):tolist(), ember.argsort(x, {stable = true}):tolist())
  end)

  it("scatters the gradient of the values back through the indices", function()
    local x = ember.tensor({3, 1, 2}, {dtype = "f64", requires_grad = true})
    local v = x:sort()
    v:backward(ember.tensor({10, 20, 30}, {dtype = "f64"}))
    assert.same({30, 10, 20}, x.grad:tolist())
  end)
end)

describe("topk", function()
  it("gives the k largest in descending order, NaN counted as the largest", function()
    local v, i = ember.tensor({{1, 9, NAN, 4}, {5, 5, 2, 8}}):topk(2)
    same_floats(v:tolist()[1], {NAN, 9}, "row 1")
    assert.same({{2, 1}, {3, 0}}, i:tolist())
    assert.same({8, 5}, v:tolist()[2])
  end)

  it("gives the k smallest with largest = false, along dim 0", function()
    local v, i = ember.tensor({{4, 1}, {2, 3}, {0, 7}}):topk(2, 0, {largest = false})
    assert.same({{0, 1}, {2, 3}}, v:tolist())
    assert.same({{2, 0}, {1, 1}}, i:tolist())
  end)

  it("takes k = 0 and k = the size", function()
    local x = ember.randn({2, 5})
    assert.same({2, 0}, x:topk(0).shape)
    local v = x:topk(5)
    assert.same(x:sort(1, {descending = true}):tolist(), v:tolist())
  end)

  it("sends the gradient to the chosen positions only", function()
    local x = ember.tensor({0.5, 3, -1, 2}, {dtype = "f64", requires_grad = true})
    local v = x:topk(2)
    v:sum():backward()
    assert.same({0, 1, 0, 1}, x.grad:tolist())
  end)
end)

describe("kthvalue and median", function()
  it("kthvalue gives the k-th smallest (k from 1) and its index", function()
    local v, i = ember.tensor({{7, 1, 5, 3}, {0, -2, 9, 4}}):kthvalue(2)
    assert.same({3, 0}, v:tolist())
    assert.same({3, 0}, i:tolist())
    local kv = ember.tensor({{7, 1}, {5, 3}}):kthvalue(1, 0, {keepdim = true})
    assert.same({{5, 1}}, kv:tolist())
  end)

  it("median over all elements is the lower median", function()
    assert.are.equal(2, ember.tensor({4, 1, 3, 2}):median():item())
    assert.are.equal(3, ember.tensor({{5, 3}, {1, 9}, {4, 0}}):median():item())   -- sorted 0 1 3 4 5 9
  end)

  it("median along a dim gives values and indices, NaN when the row has one", function()
    local v, i = ember.tensor({{4, 1, 3, 2}, {1, NAN, 0, NAN}}):median(1)
    local vl = v:tolist()
    assert.are.equal(2, vl[1])
    assert(isnan(vl[2]), "a row with NaN has a NaN median")
    assert.same({3, 1}, i:tolist())   -- the first NaN, as PyTorch
    assert(isnan(ember.tensor({1, NAN, 2}):median():item()))
    local kv, ki = ember.tensor({{4, 1}, {3, 2}}):median(0, {keepdim = true})
    assert.same({{3, 1}}, kv:tolist())
    assert.same({{1, 0}}, ki:tolist())
  end)

  it("median over all elements shares the gradient among ties", function()
    local x = ember.tensor({2, 1, 2, 3, 2}, {dtype = "f64", requires_grad = true})
    x:median():backward()
    local g = x.grad:tolist()
    for k, want in ipairs({1 / 3, 0, 1 / 3, 0, 1 / 3}) do assert.is_true(math.abs(g[k] - want) < 1e-15) end
  end)
end)

describe("cumsum and cumprod", function()
  it("cumsum adds along the dim; integers and bool give i64", function()
    local x = ember.tensor({{1, 2, 3}, {4, 5, 6}}, {dtype = "f64"})
    assert.same({{1, 3, 6}, {4, 9, 15}}, x:cumsum(1):tolist())
    assert.same({{1, 2, 3}, {5, 7, 9}}, x:cumsum(0):tolist())
    local c = ember.tensor({3, -1, 4}, {dtype = "i32"}):cumsum(0)
    assert.are.equal("i64", c.dtype)
    assert.same({3, 2, 6}, c:tolist())
    assert.same({1, 1, 2}, ember.tensor({true, false, true}):cumsum(0):tolist())
    assert.are.equal("bf16", ember.ones(4, {dtype = "bf16"}):cumsum(0).dtype)
  end)

  it("cumsum and cumprod are on autocast's f32 list", function()
    local x = ember.tensor({1, 2, 3}, {dtype = "bf16"})
    ember.autocast("bf16", function()
      assert.are.equal("f32", x:cumsum(0).dtype)
      assert.are.equal("f32", x:cumprod(0).dtype)
    end)
    assert.are.equal("bf16", x:cumsum(0).dtype)
  end)

  it("cumsum of a long f32 row accumulates in double", function()
    local n = 100000
    local c = ember.full({n}, 0.1, {dtype = "f32"}):cumsum(0)
    local want = H.f32(0.1) * n
    assert.is_true(math.abs(c:tolist()[n] - want) / want < 2 ^ -23)
  end)

  it("cumprod multiplies along the dim (strided input too)", function()
    local x = ember.tensor({{1, 2}, {3, 4}, {5, 6}}, {dtype = "f64"})
    assert.same({{1, 2}, {3, 8}, {15, 48}}, x:cumprod(0):tolist())
    assert.same({{1, 3, 15}, {2, 8, 48}}, x:t():cumprod(1):tolist())
    assert.same({2, 6, 24}, ember.tensor({2, 3, 4}, {dtype = "i64"}):cumprod(0):tolist())
  end)

  it("cumprod's gradient is exact with zeros in the row", function()
    -- y = cumprod(x); d sum(y) / dx_i = sum over j >= i of prod_{k <= j, k != i} x_k
    local xs = {2, 0, 3, 0, 5}
    local x = ember.tensor(xs, {dtype = "f64", requires_grad = true})
    x:cumprod(0):sum():backward()
    local want = {}
    for i = 1, #xs do
      local s = 0
      for j = i, #xs do
        local p = 1
        for k = 1, j do if k ~= i then p = p * xs[k] end end
        s = s + p
      end
      want[i] = s
    end
    assert.same(want, x.grad:tolist())   -- {1, 2, 0, 0, 0}
  end)

  it("cumsum's gradient is the reversed cumsum", function()
    local x = ember.tensor({1, 2, 3, 4}, {dtype = "f64", requires_grad = true})
    x:cumsum(0):backward(ember.tensor({1, 10, 100, 1000}, {dtype = "f64"}))
    assert.same({1111, 1110, 1100, 1000}, x.grad:tolist())
  end)
end)

describe("unique", function()
  it("gives the sorted distinct values, inverse indices and counts", function()
    local x = ember.tensor({{3, 1, 3}, {2, 1, 3}})
    local u, inv, c = x:unique({return_inverse = true, return_counts = true})
    assert.same({1, 2, 3}, u:tolist())
    assert.same({{2, 0, 2}, {1, 0, 2}}, inv:tolist())
    assert.same({2, 1, 3}, c:tolist())
    local u2, c2 = ember.unique(x, {return_counts = true})
    assert.same({1, 2, 3}, u2:tolist())
    assert.same({2, 1, 3}, c2:tolist())
  end)

  it("keeps the dtype and treats every NaN as distinct", function()
    local u = ember.tensor({5, -3, 5, 0}, {dtype = "i32"}):unique()
    assert.are.equal("i32", u.dtype)
    assert.same({-3, 0, 5}, u:tolist())
    local n = ember.tensor({NAN, 1, NAN, 1}):unique():tolist()
    assert.are.equal(3, #n)
    assert.are.equal(1, n[1])
    assert(isnan(n[2]) and isnan(n[3]))
  end)

  it("gives empty results for an empty tensor", function()
    local u, inv, c = ember.zeros(0):unique({return_inverse = true, return_counts = true})
    assert.same({0}, u.shape)
    assert.same({0}, inv.shape)
    assert.same({0}, c.shape)
  end)
end)

describe("bincount", function()
  it("counts each value, with minlength and weights", function()
    local x = ember.tensor({1, 4, 1, 0}, {dtype = "i64"})
    local c = x:bincount()
    assert.are.equal("i64", c.dtype)
    assert.same({1, 2, 0, 0, 1}, c:tolist())
    assert.same({1, 2, 0, 0, 1, 0, 0}, x:bincount(nil, 7):tolist())
    local w = x:bincount(ember.tensor({0.5, 2, 0.25, 1}))
    assert.are.equal("f32", w.dtype)
    assert.same({1, 0.75, 0, 0, 2}, w:tolist())
    assert.are.equal("f64", x:bincount({weights = ember.tensor({1, 1, 1, 1}, {dtype = "f64"}), minlength = 2}).dtype)
    assert.same({0, 0, 0}, ember.tensor({}, {dtype = "i64"}):bincount(nil, 3):tolist())
  end)
end)

describe("searchsorted", function()
  local seq = ember.tensor({1, 3, 5, 7, 9})
  it("finds left and right insertion points", function()
    local v = ember.tensor({{3, 6, 9}, {0, 10, 5}})
    assert.same({{1, 3, 4}, {0, 5, 2}}, ember.searchsorted(seq, v):tolist())
    assert.same({{2, 3, 5}, {0, 5, 3}}, ember.searchsorted(seq, v, {right = true}):tolist())
    assert.same({{2, 3, 5}, {0, 5, 3}}, ember.searchsorted(seq, v, {side = "right"}):tolist())
    assert.are.equal(2, ember.searchsorted(seq, 4):item())
    assert.are.equal(5, ember.searchsorted(seq, NAN):item())   -- PyTorch: a NaN lands at the end
  end)
  it("searches row by row in an N-D sequence", function()
    local s = ember.tensor({{1, 3, 5}, {2, 4, 6}})
    local v = ember.tensor({{3, 6}, {3, 6}})
    assert.same({{1, 3}, {1, 2}}, ember.searchsorted(s, v):tolist())
  end)
end)

describe("errors", function()
  local x = ember.randn({3, 5})
  it("name the op, what was expected and what came", function()
    assert.are.equal("ember.topk: expected k in [0, 5] for dim 1 of size 5, got 7", err(x.topk, x, 7))
    assert.matches("topk: expected k in %[0, 3%] for dim 0 of size 3, got %-1", err(x.topk, x, -1, 0))
    assert.matches("kthvalue: expected k in %[1, 5%] for dim 1 of size 5, got 0", err(x.kthvalue, x, 0))
    assert.matches("sort: dim 2 out of range for a tensor with 2 dims", err(x.sort, x, 2))
    assert.matches("cumsum: dim %-3 out of range", err(x.cumsum, x, -3))
    assert.matches("median: expected a non%-empty tensor", err(ember.median, ember.zeros(0)))
    assert.matches("median: expected dim 1 to have a nonzero size, got 0", err(ember.median, ember.zeros(2, 0), 1))
    assert.matches("unknown option 'descend'", err(x.sort, x, 0, {descend = true}))
  end)
  it("bincount refuses floats, 2-D, negatives, a bad minlength and mismatched weights", function()
    assert.matches("bincount: expected a 1%-D integer tensor .*, got a 1%-D f32 tensor", err(ember.bincount, ember.zeros(3)))
    assert.matches("got a 2%-D i64 tensor", err(ember.bincount, ember.zeros({2, 2}, {dtype = "i64"})))
    assert.matches("bincount: expected non%-negative values, got %-2",
      err(ember.bincount, ember.tensor({1, -2}, {dtype = "i64"})))
    assert.matches("bincount: expected minlength >= 0, got %-1",
      err(ember.bincount, ember.tensor({1}, {dtype = "i64"}), nil, -1))
    assert.matches("bincount: expected weights of shape %[2%] %(the input's%), got %[3%]",
      err(ember.bincount, ember.tensor({1, 0}, {dtype = "i64"}), ember.zeros(3)))
  end)
  it("searchsorted refuses mismatched leading dims and a bad side", function()
    assert.matches("searchsorted: expected sorted_sequence to be 1%-D or to share all but the last dim with values, "
      .. "got sorted_sequence %[2, 3%] and values %[3, 2%]",
      err(ember.searchsorted, ember.zeros(2, 3), ember.zeros(3, 2)))
    assert.matches("searchsorted: expected option 'side' to be \"left\" or \"right\", got \"up\"",
      err(ember.searchsorted, ember.zeros(3), ember.zeros(2), {side = "up"}))
    assert.matches("searchsorted: expected sorted_sequence with at least 1 dim",
      err(ember.searchsorted, ember.tensor(1), ember.zeros(2)))
  end)
end)
