-- indexing_spec.lua — the VALUES and ERRORS of the indexing ops
-- (engine/ops/indexing.c, bindings/lua/lua_indexing.c, bindings/ember/indexing.lua):
-- index_select, gather, scatter(_), scatter_add(_), index_add(_),
-- masked_select, nonzero, take_along_dim, one_hot, embedding_bag, t:index and
-- t[idx], each against hand-computed results, for several dtypes and for
-- strided inputs. Gradients live in gradcheck_spec.lua (op_cases/indexing.lua).
--
-- Run from the repository root:
--   LUA_PATH="build/lua/?.lua;build/lua/?/init.lua;;" LUA_CPATH="build/lua/?.so;;" \
--     busted tests/lua/indexing_spec.lua
--
-- Every comparison is exact: these ops move values (adds use small integers).

local ember = require "ember"
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local F = ember.nn.functional

local function long(v) return ember.tensor(v, {dtype = "i64"}) end
local function f64(v) return ember.tensor(v, {dtype = "f64"}) end
-- 0, 1, ..., n-1 in dtype, shaped
local function iota(shape, dtype)
  local n = 1
  for _, s in ipairs(shape) do n = n * s end
  return ember.arange(n):to(dtype or "f64"):view(shape)
end

-- fn must raise an error containing every fragment (plain text).
local function expect_error(fn, ...)
  local ok, err = pcall(fn)
  assert(not ok, "expected an error, but the call succeeded")
  err = H.strip_where(err)
  for _, frag in ipairs({...}) do
    assert(err:find(frag, 1, true), ("error %q does not contain %q"):format(err, frag))
  end
end

describe("index_select", function()
  it("picks rows, repeats included, for every dtype", function()
    for _, dt in ipairs({"f32", "f64", "bf16", "f16", "i32", "i64", "u8", "bool"}) do
      local x = iota({4, 2}):to(dt)
      local r = x:index_select(0, long({3, 0, 3}))
      assert.same(x:to("f64"):index_select(0, long({3, 0, 3})):tolist(), r:to("f64"):tolist(), dt)
      assert.equals(dt, r.dtype)
    end
    assert.same({{6, 7}, {0, 1}, {6, 7}}, iota({4, 2}):index_select(0, long({3, 0, 3})):tolist())
  end)

  it("selects along a negative dim with an i32 index", function()
    local r = iota({2, 3}):index_select(-1, ember.tensor({2, 2, 0}, {dtype = "i32"}))
    assert.same({{2, 2, 0}, {5, 5, 3}}, r:tolist())
  end)

  it("reads a transposed (strided) x in place", function()
    local x = iota({3, 2}):t()                 -- (2, 3): {{0, 2, 4}, {1, 3, 5}}
    assert.same({{4, 0}, {5, 1}}, x:index_select(1, long({2, 0})):tolist())
  end)

  it("takes a 0-d index as a 1-element one (the dim is kept)", function()
    assert.same({{1}, {4}}, iota({2, 3}):index_select(1, ember.tensor(1, {dtype = "i64"})):tolist())
  end)

  it("gives an empty result for an empty index", function()
    assert.same({3, 0}, iota({3, 4}):index_select(1, long({})).shape)
  end)

  it("refuses a float index, a 2-D index, an out-of-range index and a bad dim", function()
    local x = iota({3, 4})
    expect_error(function() x:index_select(0, f64({0})) end, "index_select: expected index of dtype i32 or i64, got f64")
    expect_error(function() x:index_select(0, long({{0}})) end, "index_select: expected a 1-D index, got shape [1, 1]")
    expect_error(function() x:index_select(1, long({1, 4})) end,
      "index_select: index 4 (at flat position 1 of the index) is out of range for dim 1 of size 4 (expected 0..3)")
    expect_error(function() x:index_select(0, long({-1})) end, "index -1", "out of range for dim 0 of size 3")
    expect_error(function() x:index_select(2, long({0})) end, "index_select: dim 2 out of range")
  end)
end)

describe("gather", function()
  it("reads x[i][index[i][j]] along dim 1", function()
    local r = iota({3, 4}):gather(1, long({{0, 3}, {1, 1}, {2, 0}}))
    assert.same({{0, 3}, {5, 5}, {10, 8}}, r:tolist())
  end)

  it("reads along dim 0 with an index smaller than x in the other dims", function()
    local r = iota({3, 4}):gather(0, long({{2, 0, 1}}))
    assert.same({{8, 1, 6}}, r:tolist())
  end)

  it("works for integer and half dtypes", function()
    for _, dt in ipairs({"i64", "i32", "bf16", "u8"}) do
      local r = iota({2, 3}):to(dt):gather(1, long({{2}, {0}}))
      assert.same({{2}, {3}}, r:to("f64"):tolist(), dt)
    end
  end)

  it("refuses an index with another ndim, too large in a non-gathered dim, or out of range", function()
    local x = iota({3, 4})
    expect_error(function() x:gather(1, long({0, 1})) end, "gather: expected index with x's 2 dims, got index of shape [2]")
    expect_error(function() x:gather(1, long({{0}, {0}, {0}, {0}})) end,
      "gather: expected index.size(0) <= x.size(0) for every dim but 1, got index of shape [4, 1] and x of shape [3, 4]")
    expect_error(function() x:gather(1, long({{4}})) end, "gather: index 4", "out of range for dim 1 of size 4")
  end)
end)

describe("scatter", function()
  it("writes src at index along dim 1 (out of place: x unchanged)", function()
    local x = ember.zeros(2, 4, {dtype = "f64"})
    local r = x:scatter(1, long({{3, 0}, {1, 2}}), f64({{1, 2, 9}, {3, 4, 9}}))
    assert.same({{2, 0, 0, 1}, {0, 3, 4, 0}}, r:tolist())
    assert.same({{0, 0, 0, 0}, {0, 0, 0, 0}}, x:tolist())
  end)

  it("writes a value, and a bool value into a bool tensor", function()
    assert.same({{0, 7}, {7, 0}}, ember.zeros(2, 2, {dtype = "f64"}):scatter(0, long({{1, 0}}), 7):tolist())
    local b = ember.zeros(3, {dtype = "bool"}):scatter(0, long({2}), true)
    assert.same({false, false, true}, b:tolist())
  end)

  it("scatter_ writes x in place and returns x itself", function()
    local x = ember.zeros(3, {dtype = "i32"})
    local v = x:_version()
    local r = x:scatter_(0, long({2, 0}), ember.tensor({5, 6}, {dtype = "i32"}))
    assert.equals(x, r)
    assert.same({6, 0, 5}, x:tolist())
    assert.is_true(x:_version() > v)
  end)

  it("writes into a strided view of its target", function()
    local base = ember.zeros(3, 2, {dtype = "f64"})
    base:t():scatter_(1, long({{2}, {0}}), f64({{1}, {2}}))
    assert.same({{0, 2}, {0, 0}, {1, 0}}, base:tolist())
  end)

  it("refuses a src of another dtype, an out-of-range index (x untouched) and grad-carrying in-place writes", function()
    local x = ember.zeros(2, 3, {dtype = "f64"})
    expect_error(function() x:scatter(1, long({{0}}), ember.ones(1, 1)) end,
      "scatter: expected src of x's dtype f64, got f32")
    expect_error(function() x:scatter_(1, long({{0, 3}}), f64({{1, 1}})) end, "scatter_: index 3", "dim 1 of size 3")
    assert.same({{0, 0, 0}, {0, 0, 0}}, x:tolist())
    expect_error(function() x:scatter(1, long({{0, 1, 2, 0}}), f64({{1, 1, 1}})) end,
      "scatter: expected index.size(1) <= src.size(1) for every dim")
    local p = ember.zeros(3, {dtype = "f64", requires_grad = true})
    expect_error(function() p:scatter_(0, long({0}), 1) end, "scatter_: cannot write in place into a tensor that requires grad")
    local s = ember.ones(1, {dtype = "f64", requires_grad = true})
    expect_error(function() ember.zeros(3, {dtype = "f64"}):scatter_(0, long({0}), s) end, "scatter_: src requires grad")
    expect_error(function() x:scatter(1, long({{0}}), "a") end, "expected argument 4 (src) to be a tensor or a number")
  end)
end)

describe("scatter_add and index_add", function()
  it("scatter_add accumulates duplicates", function()
    local r = ember.zeros(3, {dtype = "f64"}):scatter_add(0, long({0, 2, 0, 0}), f64({1, 2, 3, 4}))
    assert.same({8, 0, 2}, r:tolist())
  end)

  it("scatter_add_ works on i64, i32 and bf16, in place", function()
    for _, dt in ipairs({"i64", "i32", "bf16", "f16", "u8"}) do
      local x = ember.ones(2, 2):to(dt)
      x:scatter_add_(1, long({{1, 1}, {0, 1}}), ember.ones(2, 2):to(dt))
      assert.same({{1, 3}, {2, 2}}, x:to("f64"):tolist(), dt)
    end
  end)

  it("index_add adds alpha * src rows, duplicates accumulating", function()
    local x = ember.zeros(3, 2, {dtype = "f64"})
    local r = x:index_add(0, long({2, 0, 2}), f64({{1, 2}, {3, 4}, {5, 6}}), 2)
    assert.same({{6, 8}, {0, 0}, {12, 16}}, r:tolist())
    local r2 = x:index_add(1, long({1}), f64({{1}, {2}, {3}}), {alpha = -1})
    assert.same({{0, -1}, {0, -2}, {0, -3}}, r2:tolist())
    assert.same({{0, 0}, {0, 0}, {0, 0}}, x:tolist())
  end)

  it("index_add_ writes in place for integer tensors", function()
    local x = ember.zeros(4, {dtype = "i64"})
    assert.equals(x, x:index_add_(0, ember.tensor({3, 3}, {dtype = "i32"}), long({5, 6})))
    assert.same({0, 0, 0, 11}, x:tolist())
  end)

  it("refuses bool targets, mismatched src shapes and fractional alpha on integers", function()
    expect_error(function() ember.zeros(2, {dtype = "bool"}):scatter_add(0, long({0}), ember.ones(1, {dtype = "bool"})) end,
      "scatter_add: expected a numeric x (adds need one), got bool")
    expect_error(function() ember.zeros(3, 2):index_add(0, long({0, 1}), ember.ones(3, 2)) end,
      "index_add: expected src of x's shape [3, 2] with dim 0 of size numel(index) = 2, got src of shape [3, 2]")
    expect_error(function() ember.zeros(3, {dtype = "i64"}):index_add(0, long({0}), long({1}), 0.5) end,
      "index_add: expected an integer alpha for x of dtype i64, got 0.5")
    expect_error(function() ember.zeros(3):index_add(0, long({5}), ember.ones(1)) end,
      "index_add: index 5", "dim 0 of size 3")
  end)
end)

describe("masked_select and nonzero", function()
  it("masked_select returns the selected elements in row-major order, broadcasting the mask", function()
    local x = iota({2, 3})
    local m = ember.tensor({true, false, true}, {dtype = "bool"})
    assert.same({0, 2, 3, 5}, x:masked_select(m):tolist())
    assert.same({0}, x:masked_select(x:eq(0)):tolist())
    assert.same({0}, x:masked_select(ember.zeros(2, 3, {dtype = "bool"})).shape)
  end)

  it("masked_select broadcasts x to the mask", function()
    local x = f64({{1, 2}})
    local m = ember.tensor({{true, false}, {true, true}}, {dtype = "bool"})
    assert.same({1, 1, 2}, ember.masked_select(x, m):tolist())
  end)

  it("masked_select refuses a non-bool mask and shapes that do not broadcast", function()
    expect_error(function() iota({2, 3}):masked_select(long({1, 0, 1})) end,
      "masked_select: expected mask of dtype bool, got i64")
    expect_error(function() iota({2, 3}):masked_select(ember.ones(2, {dtype = "bool"})) end, "masked_select")
  end)

  it("nonzero gives (N, ndim) i64 coordinates in row-major order", function()
    local x = f64({{0, 1.5, 0}, {-2, 0, 0}})
    local nz = x:nonzero()
    assert.equals("i64", nz.dtype)
    assert.same({{0, 1}, {1, 0}}, nz:tolist())
    assert.same({0, 2}, ember.zeros(2, 2):nonzero().shape)
    assert.same({{0}, {2}}, ember.tensor({true, false, true}, {dtype = "bool"}):nonzero():tolist())
  end)

  it("nonzero counts NaN and not -0.0, and as_tuple gives one column per dim", function()
    assert.same({{0}}, f64({0 / 0, -0.0}):nonzero():tolist())
    local cols = f64({{0, 1}, {1, 0}}):nonzero({as_tuple = true})
    assert.equals(2, #cols)
    assert.same({0, 1}, cols[1]:tolist())
    assert.same({1, 0}, cols[2]:tolist())
  end)
end)

describe("masked_select and nonzero over many blocks (engine/ops/compact_cpu.c: 65536 elements a block)", function()
  -- a reference from the flat values: the kept positions in row-major order
  local function ref_positions(flat, keep)
    local pos = {}
    for i, v in ipairs(flat) do if keep(v) then pos[#pos + 1] = i - 1 end end
    return pos
  end
  local function coords(p, shape)
    local c = {}
    for d = #shape, 1, -1 do c[d] = p % shape[d]; p = p // shape[d] end
    return c
  end
  -- x with zeros, -0.0 and NaN sprinkled (floats), over blocks whose kept counts differ
  local function sample(shape, dtype)
    local x = ember.randn(shape, {dtype = "f64"})
    x = x:masked_fill(ember.rand(shape):lt(0.45), 0)
    if dtype == "f64" or dtype == "f32" or dtype == "bf16" or dtype == "f16" then
      x = x:masked_fill(ember.rand(shape):lt(0.01), -0.0):masked_fill(ember.rand(shape):lt(0.01), 0 / 0)
    else
      x = x:abs() * 3   -- nonnegative: the integer dtypes take its integer part
    end
    return x:to(dtype)
  end

  for _, dt in ipairs({"f64", "f32", "bf16", "f16", "i64", "i32", "u8", "bool"}) do
    it("nonzero of " .. dt .. " (3, 70001) and (5, 300, 151), also transposed, at 1 and 2 threads", function()
      for _, shape in ipairs({{3, 70001}, {5, 300, 151}}) do
        local x = dt == "bool" and ember.rand(shape):lt(0.5) or sample(shape, dt)
        for _, view in ipairs({x, x:transpose(0, #shape - 1)}) do
          local flat = view:contiguous():view(-1):to("f64"):tolist()
          local pos = ref_positions(flat, function(v) return v ~= 0 end)   -- NaN ~= 0, -0.0 == 0
          local nz = view:nonzero()
          assert.same({#pos, #shape}, nz.shape)
          local got = nz:tolist()
          for k = 1, #pos, 997 do   -- a sample of rows, every block's among them
            assert.same(coords(pos[k], view.shape), {table.unpack(got[k])})
          end
          assert.same(coords(pos[#pos], view.shape), {table.unpack(got[#pos])})
          local prev = ember.get_num_threads()
          ember.set_num_threads(prev == 1 and 2 or 1)
          local again = view:nonzero()
          ember.set_num_threads(prev)
          assert.equals(0, again:ne(nz):sum():item(), "nonzero moved with the thread count")
        end
      end
    end)
  end

  it("masked_select over many blocks: every dtype width, a broadcast mask, a transposed x", function()
    local shape = {3, 70001}
    local m = ember.rand(shape):lt(0.3)
    for _, dt in ipairs({"f64", "f32", "bf16", "u8"}) do
      local x = sample(shape, dt)
      local xs = x:to("f64"):view(-1):tolist()
      local ms = m:view(-1):tolist()
      local want = {}
      for i, keep in ipairs(ms) do if keep then want[#want + 1] = xs[i] end end
      local got = x:masked_select(m)
      assert.equals(dt, got.dtype)
      assert.equals(#want, got:numel())
      local g = got:to("f64"):tolist()
      for k = 1, #want do
        if g[k] ~= want[k] and not (g[k] ~= g[k] and want[k] ~= want[k]) then
          error(("masked_select %s: element %d is %s, expected %s"):format(dt, k, g[k], want[k]))
        end
      end
    end
    -- a row mask broadcast over 3 rows, and x transposed (not contiguous)
    local x = ember.randn({70001, 3}, {dtype = "f64"}):t()
    local row = ember.rand({70001}):lt(0.5)
    local got = x:masked_select(row)
    local want = x:contiguous():masked_select(row:view(1, -1):expand(3, 70001):contiguous())
    assert.equals(0, got:ne(want):sum():item())
    assert.equals(3 * row:sum():item(), got:numel())
  end)

  it("nonzero of empty and 0-d tensors", function()
    assert.same({0, 3}, ember.zeros(2, 0, 4):nonzero().shape)
    assert.same({1, 0}, ember.tensor(5.0):nonzero().shape)
    assert.same({0, 0}, ember.tensor(0.0):nonzero().shape)
    assert.same({0}, ember.zeros(0):masked_select(ember.zeros(0, {dtype = "bool"})).shape)
  end)
end)

describe("take_along_dim", function()
  it("gathers along dim with the indices broadcast over the other dims", function()
    local x = iota({2, 3})
    assert.same({{2, 0}, {5, 3}}, x:take_along_dim(long({{2, 0}}), 1):tolist())
    assert.same({{3, 1, 5}}, x:take_along_dim(long({{1, 0, 1}}), 0):tolist())
  end)

  it("matches argmax's picks (the common use)", function()
    local x = f64({{1, 5, 2}, {7, 0, 3}})
    local i = x:argmax(1, {keepdim = true})
    assert.same({{5}, {7}}, x:take_along_dim(i, 1):tolist())
  end)

  it("flattens both without a dim", function()
    assert.same({5, 0}, iota({2, 3}):take_along_dim(long({5, 0})):tolist())
  end)

  it("refuses shapes that do not broadcast and another ndim", function()
    expect_error(function() iota({2, 3}):take_along_dim(long({{0}, {0}, {0}}), 1) end,
      "take_along_dim: x of shape [2, 3] and indices of shape [3, 1] do not broadcast in dim 0")
    expect_error(function() iota({2, 3}):take_along_dim(long({0}), 1) end,
      "take_along_dim: expected indices with x's 2 dims")
  end)
end)

describe("F.one_hot", function()
  it("encodes ids as i64 rows", function()
    local r = F.one_hot(long({{0, 2}, {1, 1}}), 3)
    assert.equals("i64", r.dtype)
    assert.same({{{1, 0, 0}, {0, 0, 1}}, {{0, 1, 0}, {0, 1, 0}}}, r:tolist())
  end)

  it("infers num_classes as max + 1 and accepts i32 ids", function()
    assert.same({{0, 0, 1}, {1, 0, 0}}, F.one_hot(ember.tensor({2, 0}, {dtype = "i32"})):tolist())
  end)

  it("refuses out-of-range classes, float ids and an empty tensor to infer from", function()
    expect_error(function() F.one_hot(long({0, 3}), 3) end,
      "one_hot: class value 3 (at flat position 1) is out of range for num_classes 3 (expected 0..2)")
    expect_error(function() F.one_hot(long({-1}), 3) end, "one_hot: class value -1")
    expect_error(function() F.one_hot(f64({1}), 3) end, "one_hot: expected ids of dtype i32 or i64, got f64")
    expect_error(function() F.one_hot(long({}), -1) end, "one_hot: cannot infer num_classes from an empty tensor")
  end)
end)

describe("F.embedding_bag", function()
  local w = f64({{1, 2}, {3, 4}, {5, 6}, {7, 8}})

  it("sums and averages bags given by offsets (an empty bag gives zeros)", function()
    local ids, offs = long({0, 3, 1, 1, 2}), long({0, 2, 2})
    assert.same({{8, 10}, {0, 0}, {11, 14}}, F.embedding_bag(ids, w, offs, "sum"):tolist())
    local mean = F.embedding_bag(ids, w, offs):tolist()
    assert.same({{4, 5}, {0, 0}}, {mean[1], mean[2]})
    assert.same({11 / 3, 14 / 3}, mean[3])
  end)

  it("treats each row of 2-D ids as a bag", function()
    assert.same({{4, 6}, {12, 14}}, F.embedding_bag(long({{0, 1}, {2, 3}}), w, nil, {mode = "sum"}):tolist())
  end)

  it("refuses mode 'max' and bad offsets", function()
    expect_error(function() F.embedding_bag(long({0}), w, long({0}), "max") end,
      "embedding_bag: expected mode 'sum' or 'mean', got max ('max' is not implemented)")
    expect_error(function() F.embedding_bag(long({0, 1}), w, long({1})) end,
      "embedding_bag: expected offsets to start at 0")
    expect_error(function() F.embedding_bag(long({0, 1}), w) end, "embedding_bag: expected 1-D offsets with 1-D ids")
  end)
end)

describe("t:index and t[idx]", function()
  local x = iota({2, 3, 4})

  it("t[ids] with an i64 tensor is index_select on dim 0, shaped like ids", function()
    local r = x[long({{1}, {0}})]
    assert.same({2, 1, 3, 4}, r.shape)
    assert.same(x:select(0, 1):tolist(), r:select(0, 0):select(0, 0):tolist())
  end)

  it("keeps methods and fields working beside tensor keys", function()
    assert.same({2, 3, 4}, x.shape)
    assert.equals("f64", x.dtype)
    assert.equals(3, x:size(1))
    expect_error(function() return x[1] end, "t:select(0, i)")
    expect_error(function() return x.no_such_field end, "no field or method 'no_such_field'")
  end)

  it("integers and nils alone give a view (select)", function()
    local r = x:index({1, nil, -1})
    assert.same({15, 19, 23}, r:tolist())
    assert.equals(15, r:storage_offset())
  end)

  it("puts the index dims in place when the indexed dims are adjacent", function()
    local r = x:index({nil, long({2, 0}), long({1, 3})})
    assert.same({{9, 3}, {21, 15}}, r:tolist())
    assert.same({{{7, 4}}, {{19, 16}}}, x:index({nil, 1, long({{3, 0}})}):tolist())
  end)

  it("puts the index dims first when the indexed dims are not adjacent", function()
    local r = x:index({long({1, 0}), nil, long({-1, 0})})
    assert.same({2, 3}, r.shape)
    assert.same({{15, 19, 23}, {0, 4, 8}}, r:tolist())
  end)

  it("takes a bool mask over the dims it covers", function()
    local m = ember.tensor({{true, false, false, true}, {false, false, false, false}, {false, true, false, false}},
                           {dtype = "bool"})
    assert.same({{0, 3, 9}, {12, 15, 21}}, x:index({nil, m}):tolist())
    assert.same({20, 21, 22, 23}, x[x:ge(20)]:tolist())
  end)

  it("refuses out-of-range indices, too many entries, float tensors and masks of the wrong shape", function()
    expect_error(function() return x:index({nil, long({3})}) end, "index: index 3 is out of range for dim 1 of size 3")
    expect_error(function() return x:index({long({0}), nil, long({-5})}) end, "index: index -5 is out of range for dim 2 of size 4")
    expect_error(function() return x:index({0, 0, 0, 0}) end, "index: too many indices for a tensor of 3 dims: got 4")
    expect_error(function() return x:index({f64({0})}) end, "index: expected index tensors of dtype i64, i32 or bool, got f64")
    expect_error(function() return x:index({ember.ones(3, {dtype = "bool"})}) end,
      "index: mask of shape [3] does not match the indexed dims [2]")
    expect_error(function() return x:index({0.5}) end, "index: expected nil, an integer or a tensor as entry 1, got a float")
  end)

  it("is differentiable w.r.t. t", function()
    local t = ember.zeros(3, 2, {dtype = "f64", requires_grad = true})
    t:index({long({2, 2, 0})}):sum():backward()
    assert.same({{1, 1}, {0, 0}, {2, 2}}, t.grad:tolist())
  end)
end)

-- The C ops behind t:index's and F.embedding_bag's CUDA paths (bindings/ember/indexing.lua
-- calls them on CUDA only; these check the CPU side of the same entry points).
describe("ember._index_wrap and ember._embedding_bag", function()
  it("_index_wrap is index_select with negatives counting from the end; the index is not written", function()
    local x = iota({4, 3})
    local i = long({3, -1, -4, 0})
    assert.same({{9, 10, 11}, {9, 10, 11}, {0, 1, 2}, {0, 1, 2}}, ember._index_wrap(x, 0, i):tolist())
    assert.same({3, -1, -4, 0}, i:tolist())
    assert.same({{2, 0}, {5, 3}, {8, 6}, {11, 9}}, ember._index_wrap(x, 1, long({-1, -3}):int()):tolist())
    expect_error(function() return ember._index_wrap(x, 0, long({0, 4})) end,
      "index: index 4 (at flat position 1 of the index) is out of range for dim 0 of size 4 (expected -4..3)")
    expect_error(function() return ember._index_wrap(x, 1, long({-4})) end, "index -4", "(expected -3..2)")
  end)

  it("_index_wrap is differentiable: repeated and negative indices accumulate at the wrapped rows", function()
    local t = ember.zeros(3, 2, {dtype = "f64", requires_grad = true})
    ember._index_wrap(t, 0, long({-1, 2, 0, -3})):sum():backward()
    assert.same({{2, 2}, {0, 0}, {2, 2}}, t.grad:tolist())
  end)

  it("_index_wrap with a shape flattens an N-D index and reshapes the rows in C (t:index's CUDA call)", function()
    local x = iota({4, 3})
    local i = long({{3, -1}, {-4, 0}})
    local r = ember._index_wrap(x, 0, i, {2, 2, 3})
    assert.same({{{9, 10, 11}, {9, 10, 11}}, {{0, 1, 2}, {0, 1, 2}}}, r:tolist())
    assert.same({{3, -1}, {-4, 0}}, i:tolist())
    assert.same({{{2}, {0}}, {{5}, {3}}}, ember._index_wrap(x:narrow(0, 0, 2), 1, long({-1, -3}), {2, 2, 1}):tolist())
    expect_error(function() return ember._index_wrap(x, 0, i, {3, 3}) end, "reshape", "[3, 3]", "[4, 3]")
    local t = ember.zeros(3, 2, {dtype = "f64", requires_grad = true})
    ember._index_wrap(t, 0, long({{-1, 2}, {0, -3}}), {2, 2, 2}):sum():backward()
    assert.same({{2, 2}, {0, 0}, {2, 2}}, t.grad:tolist())
  end)

  it("_embedding_bag is the CUDA kernel's entry point: on the CPU it says so", function()
    expect_error(function() return ember._embedding_bag(long({{0}}), ember.ones(2, 3), nil, true) end,
      "embedding_bag: the fused op runs on CUDA only")
  end)
end)
