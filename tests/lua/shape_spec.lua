-- shape_spec.lua — the VALUES of cat and stack (engine/ops/shape.c) and of
-- split/chunk (bindings/ember/init.lua, views over narrow): where every input
-- element lands, for every dim incl. negative ones, dtype promotion in cat,
-- non-contiguous inputs, and the sizes split/chunk produce (torch's rules).
-- Gradients live in gradcheck_spec.lua, storage sharing in views_spec.lua,
-- errors in bad_input_spec.lua.
--
-- Run from the repository root:
--   LUA_PATH="build/lua/?.lua;build/lua/?/init.lua;;" LUA_CPATH="build/lua/?.so;;" \
--     busted tests/lua/shape_spec.lua
--
-- Every comparison is exact: these ops move values, they do no arithmetic
-- (conversions in cat are exact for the small integers used there).

local ember = require "ember"
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")

local function randn(seed, shape, dtype) return H.randn(seed, shape, dtype or "f32") end

-- element at 0-based multi-index idx of a nested list
local function at(list, idx)
  for _, i in ipairs(idx) do list = list[i + 1] end
  return list
end

-- every 0-based multi-index of shape, row-major
local function indices(shape)
  local out, idx = {}, {}
  local function rec(d)
    if d > #shape then out[#out + 1] = {table.unpack(idx)}; return end
    for i = 0, shape[d] - 1 do idx[d] = i; rec(d + 1) end
  end
  rec(1)
  return out
end

describe("cat", function()
  -- out[..., o + i, ...] = ts[k][..., i, ...] with o the sizes before k along dim
  local function check_cat(ts, dim)
    local r = ember.cat(ts, dim)
    local nd = #ts[1].shape
    local d = dim < 0 and dim + nd or dim
    local want_shape = {table.unpack(ts[1].shape)}
    want_shape[d + 1] = 0
    for _, t in ipairs(ts) do want_shape[d + 1] = want_shape[d + 1] + t.shape[d + 1] end
    assert.same(want_shape, r.shape)
    local lr, off = r:tolist(), 0
    for k, t in ipairs(ts) do
      local lt = t:tolist()
      for _, idx in ipairs(indices(t.shape)) do
        local ridx = {table.unpack(idx)}
        ridx[d + 1] = ridx[d + 1] + off
        assert.equals(at(lt, idx), at(lr, ridx), string.format("input %d at dim %d", k, d))
      end
      off = off + t.shape[d + 1]
    end
  end

  for _, dim in ipairs({0, 1, 2, -1, -3}) do
    it("concatenates three (2, 3, 4)-like tensors along dim " .. dim, function()
      local nd = dim < 0 and dim + 3 or dim
      local shapes = {{2, 3, 4}, {2, 3, 4}, {2, 3, 4}}
      shapes[2][nd + 1], shapes[3][nd + 1] = 1, 5           -- unequal sizes along the cat dim
      check_cat({randn(1, shapes[1]), randn(2, shapes[2]), randn(3, shapes[3])}, dim)
    end)
  end

  it("defaults to dim 0", function()
    local a, b = ember.tensor({{1, 2}}), ember.tensor({{3, 4}, {5, 6}})
    assert.same({{1, 2}, {3, 4}, {5, 6}}, ember.cat({a, b}):tolist())
  end)

  it("reads non-contiguous inputs by their logical layout", function()
    local a = randn(4, {3, 2}):t()          -- (2, 3) transposed view
    local b = randn(5, {2, 3})
    check_cat({a, b}, 1)
    check_cat({a, b}, 0)
  end)

  it("promotes dtypes like torch.cat: i64 with f32 gives f32", function()
    local r = ember.cat({ember.tensor({1, 2}, {dtype = "i64"}), ember.tensor({0.5})})
    assert.equals("f32", r.dtype)
    assert.same({1, 2, 0.5}, r:tolist())
  end)

  it("promotes bf16 with f16 to f32 and i32 with i64 to i64", function()
    local r = ember.cat({ember.tensor({1.5}, {dtype = "bf16"}), ember.tensor({2.25}, {dtype = "f16"})})
    assert.equals("f32", r.dtype)
    assert.same({1.5, 2.25}, r:tolist())
    local big = (1 << 40) + 1
    local q = ember.cat({ember.tensor({7}, {dtype = "i32"}), ember.tensor({big}, {dtype = "i64"})})
    assert.equals("i64", q.dtype)
    assert.same({7, big}, q:tolist())
  end)

  it("promotes bool with u8 to u8", function()
    local r = ember.cat({ember.tensor({true, false}), ember.tensor({7}, {dtype = "u8"})})
    assert.equals("u8", r.dtype)
    assert.same({1, 0, 7}, r:tolist())
  end)

  it("skips 1-D empty tensors (torch's legacy rule), whatever their dtype", function()
    local x = randn(6, {2, 3})
    local r = ember.cat({ember.zeros(0), x, ember.zeros(0)}, 1)
    assert.same(x:tolist(), r:tolist())
  end)

  it("a single tensor gives a copy with equal values", function()
    local x = randn(7, {2, 2})
    local r = ember.cat({x}, 0)
    assert.same(x:tolist(), r:tolist())
    r:fill_(0)
    assert.are_not.same(x:tolist(), r:tolist())
  end)

  it("cat of bf16 tensors stays bf16, bit for bit", function()
    local a, b = randn(8, {3}, "bf16"), randn(9, {2}, "bf16")
    local r = ember.cat({a, b})
    assert.equals("bf16", r.dtype)
    local want = a:tolist()
    for _, v in ipairs(b:tolist()) do want[#want + 1] = v end
    assert.same(want, r:tolist())
  end)
end)

describe("stack", function()
  -- out index = input index with k inserted at dim d
  local function check_stack(ts, dim)
    local r = ember.stack(ts, dim)
    local nd = #ts[1].shape + 1
    local d = dim < 0 and dim + nd or dim
    local want_shape = {table.unpack(ts[1].shape)}
    table.insert(want_shape, d + 1, #ts)
    assert.same(want_shape, r.shape)
    local lr = r:tolist()
    for k, t in ipairs(ts) do
      local lt = t:tolist()
      for _, idx in ipairs(indices(t.shape)) do
        local ridx = {table.unpack(idx)}
        table.insert(ridx, d + 1, k - 1)
        assert.equals(at(lt, idx), at(lr, ridx))
      end
    end
  end

  for _, dim in ipairs({0, 1, 2, -1, -2}) do
    it("stacks three (2, 3) tensors along dim " .. dim, function()
      check_stack({randn(10, {2, 3}), randn(11, {2, 3}), randn(12, {2, 3})}, dim)
    end)
  end

  it("stacking 1-D tensors along dim 0 gives the rows, along dim 1 the columns", function()
    local a, b = ember.tensor({1, 2, 3}), ember.tensor({4, 5, 6})
    assert.same({{1, 2, 3}, {4, 5, 6}}, ember.stack({a, b}, 0):tolist())
    assert.same({{1, 4}, {2, 5}, {3, 6}}, ember.stack({a, b}, 1):tolist())
  end)

  it("stacks 0-d tensors into a vector", function()
    assert.same({1, 2}, ember.stack({ember.tensor(1), ember.tensor(2)}):tolist())
  end)

  it("reads non-contiguous inputs", function()
    check_stack({randn(13, {3, 2}):t(), randn(14, {2, 3})}, 1)
  end)

  it("promotes dtypes like cat", function()
    local r = ember.stack({ember.tensor({1}, {dtype = "i64"}), ember.tensor({2.5}, {dtype = "f64"})})
    assert.equals("f64", r.dtype)
    assert.same({{1}, {2.5}}, r:tolist())
  end)
end)

describe("split and chunk", function()
  local function sizes(parts, dim)
    local s = {}
    for i, p in ipairs(parts) do s[i] = p:size(dim) end
    return s
  end

  -- the parts, concatenated back along dim, give the original
  local function assert_reassembles(parts, x, dim)
    assert.same(x:tolist(), ember.cat(parts, dim):tolist())
  end

  it("split(3) of 7 rows gives sizes 3, 3, 1 in order", function()
    local x = randn(20, {7, 2})
    local parts = x:split(3)
    assert.same({3, 3, 1}, sizes(parts, 0))
    assert.same(x:narrow(0, 3, 3):tolist(), parts[2]:tolist())
    assert_reassembles(parts, x, 0)
  end)

  it("split along dim 1 and along a negative dim", function()
    local x = randn(21, {2, 5})
    assert.same({2, 2, 1}, sizes(x:split(2, 1), 1))
    assert.same({2, 2, 1}, sizes(x:split(2, -1), 1))
    assert_reassembles(x:split(2, -1), x, 1)
  end)

  it("split with a size at least the dim gives one part", function()
    local x = randn(22, {4})
    assert.same({4}, sizes(x:split(4), 0))
    assert.same({4}, sizes(x:split(10), 0))
  end)

  it("chunk(3) of 7 gives 3, 3, 1 (torch: ceil(7/3) per chunk)", function()
    local x = randn(23, {7})
    local parts = x:chunk(3)
    assert.same({3, 3, 1}, sizes(parts, 0))
    assert_reassembles(parts, x, 0)
  end)

  it("chunk(4) of 6 gives 3 chunks of 2 (fewer than asked, like torch)", function()
    assert.same({2, 2, 2}, sizes(randn(24, {6}):chunk(4), 0))
  end)

  it("chunk(5) of 5 gives five of 1; chunk(2) of 1 gives one", function()
    assert.same({1, 1, 1, 1, 1}, sizes(randn(25, {5}):chunk(5), 0))
    assert.same({1}, sizes(randn(26, {1}):chunk(2), 0))
  end)

  it("chunk along dim 1 splits the columns: q, k, v from a fused (T, 3d) projection", function()
    local x = randn(27, {4, 9})
    local q, k, v = table.unpack(x:chunk(3, 1))
    assert.same(x:narrow(1, 0, 3):tolist(), q:tolist())
    assert.same(x:narrow(1, 3, 3):tolist(), k:tolist())
    assert.same(x:narrow(1, 6, 3):tolist(), v:tolist())
  end)
end)
