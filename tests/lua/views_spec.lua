-- views_spec.lua — views share storage with their base exactly where PyTorch's
-- do (a write through one is seen by the other), copies never do; plus
-- split/chunk, cat/stack, copy_/fill_/zero_/set_ and the version counter.
--
-- Run from the repository root:
--   LUA_PATH="build/lua/?.lua;build/lua/?/init.lua;;" LUA_CPATH="build/lua/?.so;;" \
--     busted tests/lua/views_spec.lua
-- Every value here is a small integer, so comparisons are exact.

local ember = require "ember"

-- A fresh (2, 3) f32 tensor {{0, 1, 2}, {3, 4, 5}}.
local function base23() return ember.arange(6):float():view(2, 3):clone() end

-- The first element of t as a (1, 1, ...) view (works for any strides).
local function first_cell(t)
  for d = 0, t:dim() - 1 do t = t:narrow(d, 0, 1) end
  return t
end

-- Whether a and b share memory: a sentinel written through a's first element
-- shows up in b (only used on tensors whose values are < 1000).
local function shares_storage(a, b)
  local before = b:clone():contiguous():view(-1):tolist()
  local cell = first_cell(a)
  local old = cell:item()
  cell:fill_(1000)
  local now = b:contiguous():view(-1):tolist()
  cell:fill_(old)
  for i = 1, #now do if now[i] ~= before[i] then return true end end
  return false
end

describe("view and reshape", function()
  it("view changes the shape and shares storage", function()
    local t = base23()
    local v = t:view(6)
    assert.same({6}, v.shape)
    assert.same({0, 1, 2, 3, 4, 5}, v:tolist())
    v:narrow(0, 4, 1):fill_(40)
    assert.same({{0, 1, 2}, {3, 40, 5}}, t:tolist())
  end)

  it("view accepts a table of sizes", function()
    assert.same({3, 2}, base23():view({3, 2}).shape)
  end)

  it("view infers one -1", function()
    assert.same({3, 2}, base23():view(-1, 2).shape)
    assert.same({1, 6}, base23():view(1, -1).shape)
  end)

  it("view can split and merge dims of a contiguous block of a non-contiguous tensor", function()
    -- (4, 6) narrowed to columns 0..3 is not contiguous, but each row is, so
    -- splitting the last dim is a view (PyTorch's computeStride).
    local t = ember.arange(24):view(4, 6):narrow(1, 0, 4)
    local v = t:view(4, 2, 2)
    assert.same({4, 2, 2}, v.shape)
    assert.same({6, 2, 1}, v:stride())
  end)

  it("view of a transposed tensor errors and reshape copies instead", function()
    local t = base23():t()
    assert.has_error(function() t:view(6) end)
    local r = t:reshape(6)
    assert.same({0, 3, 1, 4, 2, 5}, r:tolist())
    r:fill_(9)
    assert.same({{0, 3}, {1, 4}, {2, 5}}, t:tolist())
  end)

  it("reshape of a contiguous tensor is a view", function()
    local t = base23()
    local r = t:reshape(3, 2)
    assert.equals(t:data_ptr(), r:data_ptr())
    r:select(0, 0):fill_(7)
    assert.same({{7, 7, 2}, {3, 4, 5}}, t:tolist())
  end)

  it("view of a 0-dim tensor as (1) and back", function()
    local s = ember.tensor(5)
    assert.same({1}, s:view(1).shape)
    assert.same({}, s:view(1):view({}).shape)
  end)
end)

describe("transpose, permute and t", function()
  it("transpose swaps sizes and strides and shares storage", function()
    local t = base23()
    local tt = t:transpose(0, 1)
    assert.same({3, 2}, tt.shape)
    assert.same({1, 3}, tt:stride())
    assert.same({{0, 3}, {1, 4}, {2, 5}}, tt:tolist())
    tt:select(0, 2):fill_(-1)
    assert.same({{0, 1, -1}, {3, 4, -1}}, t:tolist())
  end)

  it("transpose accepts negative dims", function()
    assert.same({4, 3, 2}, ember.zeros(2, 3, 4):transpose(0, -1).shape)
  end)

  it("permute reorders dims and shares storage", function()
    local t = ember.arange(24):view(2, 3, 4)
    local p = t:permute(2, 0, 1)
    assert.same({4, 2, 3}, p.shape)
    assert.same({1, 12, 4}, p:stride())
    assert.equals(23, p:select(0, 3):select(0, 1):select(0, 2):item())
    assert.is_true(shares_storage(p, t))
  end)

  it("permute accepts a table and negative dims", function()
    assert.same({4, 2, 3}, ember.zeros(2, 3, 4):permute({-1, 0, 1}).shape)
  end)

  -- contiguous() of a transpose goes through 32 x 32 tiles (engine/tensor.c):
  -- shapes with partial tiles, an outer dim, several dtypes
  for _, dtype in ipairs({"f32", "f64", "bf16", "u8"}) do
    it(("contiguous() of transposed and permuted views holds their elements (%s, tiled copy)"):format(dtype), function()
      local a = (ember.rand({3, 70, 45}) * 100):to(dtype)
      for _, v in ipairs({a:transpose(1, 2), a:permute({2, 0, 1}), a:select(0, 1):t()}) do
        local c = v:contiguous()
        assert.is_true(c:is_contiguous())
        assert.are.same(v:tolist(), c:tolist())
      end
    end)
  end

  it("t() transposes a matrix and leaves a vector alone", function()
    assert.same({{0, 3}, {1, 4}, {2, 5}}, base23():t():tolist())
    assert.same({3}, ember.zeros(3):t().shape)
  end)
end)

describe("narrow, select, squeeze, unsqueeze", function()
  it("narrow takes a window along a dim and shares storage", function()
    local t = base23()
    local n = t:narrow(1, 1, 2)
    assert.same({{1, 2}, {4, 5}}, n:tolist())
    assert.equals(1, n:storage_offset())
    n:fill_(0)
    assert.same({{0, 0, 0}, {3, 0, 0}}, t:tolist())
  end)

  it("narrow accepts a negative start counted from the end", function()
    assert.same({{2}, {5}}, base23():narrow(1, -1, 1):tolist())
  end)

  it("select drops the dim and shares storage", function()
    local t = base23()
    local r = t:select(0, 1)
    assert.same({3, 4, 5}, r:tolist())
    r:fill_(8)
    assert.same({{0, 1, 2}, {8, 8, 8}}, t:tolist())
  end)

  it("select accepts a negative index and a negative dim", function()
    assert.same({2, 5}, base23():select(-1, -1):tolist())
  end)

  it("squeeze() drops every size-1 dim", function()
    assert.same({2, 3}, ember.zeros(1, 2, 1, 3, 1):squeeze().shape)
  end)

  it("squeeze(dim) drops only that dim, and only if it has size 1", function()
    local t = ember.zeros(1, 2, 1)
    assert.same({2, 1}, t:squeeze(0).shape)
    assert.same({1, 2, 1}, t:squeeze(1).shape)
    assert.same({1, 2}, t:squeeze(-1).shape)
  end)

  it("unsqueeze inserts a size-1 dim (negative dims count from the new end)", function()
    local t = ember.zeros(2, 3)
    assert.same({1, 2, 3}, t:unsqueeze(0).shape)
    assert.same({2, 1, 3}, t:unsqueeze(1).shape)
    assert.same({2, 3, 1}, t:unsqueeze(-1).shape)
  end)

  it("squeeze and unsqueeze share storage", function()
    local t = base23()
    assert.is_true(shares_storage(t:unsqueeze(1), t))
    assert.is_true(shares_storage(t:unsqueeze(0):squeeze(0), t))
  end)
end)

describe("expand and flatten", function()
  it("expand adds leading dims with stride 0 and shares storage", function()
    local t = base23()
    local e = t:expand(4, 2, 3)
    assert.same({4, 2, 3}, e.shape)
    assert.same({0, 3, 1}, e:stride())
    assert.same({0, 1, 2}, e:select(0, 3):select(0, 0):tolist())
    t:fill_(2)
    assert.same({2, 2, 2}, e:select(0, 1):select(0, 1):tolist())
  end)

  it("expand stretches size-1 dims and -1 keeps a size", function()
    local e = ember.tensor({{1}, {2}}):expand(-1, 3)
    assert.same({{1, 1, 1}, {2, 2, 2}}, e:tolist())
    assert.same({1, 0}, e:stride())
  end)

  it("flatten merges all dims, or a range of dims", function()
    local t = ember.zeros(2, 3, 4)
    assert.same({24}, t:flatten().shape)
    assert.same({2, 12}, t:flatten(1).shape)
    assert.same({6, 4}, t:flatten(0, 1).shape)
    assert.same({2, 12}, t:flatten(-2, -1).shape)
  end)

  it("flatten of a contiguous tensor is a view", function()
    local t = base23()
    assert.equals(t:data_ptr(), t:flatten():data_ptr())
    assert.is_true(shares_storage(t:flatten(), t))
  end)

  it("flatten of a transposed tensor copies, in logical order", function()
    local t = base23():t()
    local f = t:flatten()
    assert.same({0, 3, 1, 4, 2, 5}, f:tolist())
    assert.is_false(shares_storage(f, t))
  end)

  it("flatten of a 0-dim tensor gives shape (1)", function()
    assert.same({1}, ember.tensor(3):flatten().shape)
  end)
end)

describe("contiguous, clone, detach", function()
  it("contiguous returns the same tensor when it already is contiguous", function()
    local t = base23()
    assert.is_true(rawequal(t, t:contiguous()))
  end)

  it("contiguous of a transpose copies into row-major order", function()
    local t = base23():t()
    local c = t:contiguous()
    assert.is_true(c:is_contiguous())
    assert.same({2, 1}, c:stride())
    assert.same({{0, 3}, {1, 4}, {2, 5}}, c:tolist())
    assert.is_false(shares_storage(c, t))
  end)

  it("clone copies: writing the clone leaves the base alone", function()
    local t = base23()
    local c = t:clone()
    assert.are_not.equals(t:data_ptr(), c:data_ptr())
    c:fill_(0)
    assert.same({{0, 1, 2}, {3, 4, 5}}, t:tolist())
  end)

  it("clone of a view copies only the view", function()
    local c = base23():narrow(1, 1, 1):clone()
    assert.same({{1}, {4}}, c:tolist())
    assert.is_true(c:is_contiguous())
  end)

  it("detach shares storage and drops requires_grad", function()
    local x = ember.tensor({1, 2, 3}, {requires_grad = true})
    local d = x:detach()
    assert.is_false(d.requires_grad)
    assert.equals(x:data_ptr(), d:data_ptr())
    d:fill_(5)
    assert.same({5, 5, 5}, x:tolist())
  end)
end)

describe("split and chunk", function()
  it("split(size) cuts views of at most size, the last one shorter", function()
    local t = ember.arange(5)
    local parts = t:split(2)
    assert.equals(3, #parts)
    assert.same({0, 1}, parts[1]:tolist())
    assert.same({2, 3}, parts[2]:tolist())
    assert.same({4}, parts[3]:tolist())
  end)

  it("split along dim 1 returns views into the base", function()
    local t = base23()
    local parts = t:split(2, 1)
    assert.same({{2}, {5}}, parts[2]:tolist())
    parts[1]:fill_(0)
    assert.same({{0, 0, 2}, {0, 0, 5}}, t:tolist())
  end)

  it("chunk(n) makes n nearly equal pieces", function()
    local parts = ember.arange(6):chunk(3)
    assert.equals(3, #parts)
    assert.same({4, 5}, parts[3]:tolist())
  end)

  it("chunk may return fewer pieces, as torch.chunk (6 into 4 gives 3 of 2)", function()
    local parts = ember.arange(6):chunk(4)
    assert.equals(3, #parts)
    for _, p in ipairs(parts) do assert.equals(2, p:numel()) end
  end)

  it("ember.split and ember.chunk are the same functions", function()
    assert.equals(2, #ember.split(ember.zeros(4), 2))
    assert.equals(2, #ember.chunk(ember.zeros(4, 2), 2, 0))
  end)
end)

describe("cat and stack", function()
  it("cat joins along dim 0 by default", function()
    local c = ember.cat({ember.tensor({{1, 2}}), ember.tensor({{3, 4}, {5, 6}})})
    assert.same({{1, 2}, {3, 4}, {5, 6}}, c:tolist())
  end)

  it("cat joins along dim 1 and along a negative dim", function()
    local a, b = ember.tensor({{1}, {2}}), ember.tensor({{3, 4}, {5, 6}})
    assert.same({{1, 3, 4}, {2, 5, 6}}, ember.cat({a, b}, 1):tolist())
    assert.same({{1, 3, 4}, {2, 5, 6}}, ember.cat({a, b}, -1):tolist())
  end)

  it("cat copies: the result shares storage with no input", function()
    local a = ember.tensor({1, 2})
    local c = ember.cat({a, ember.tensor({3})})
    c:fill_(0)
    assert.same({1, 2}, a:tolist())
  end)

  it("cat reads non-contiguous inputs in logical order", function()
    local t = base23():t()          -- {{0,3},{1,4},{2,5}}
    assert.same({{0, 3}, {1, 4}, {2, 5}, {0, 3}, {1, 4}, {2, 5}}, ember.cat({t, t}, 0):tolist())
  end)

  it("cat of one tensor is a copy of it", function()
    local a = ember.tensor({1, 2})
    assert.same({1, 2}, ember.cat({a}):tolist())
  end)

  it("stack adds a new dim at 0, 1 or -1", function()
    local a, b = ember.tensor({1, 2}), ember.tensor({3, 4})
    assert.same({{1, 2}, {3, 4}}, ember.stack({a, b}):tolist())
    assert.same({{1, 3}, {2, 4}}, ember.stack({a, b}, 1):tolist())
    assert.same({{1, 3}, {2, 4}}, ember.stack({a, b}, -1):tolist())
    assert.same({2, 2}, ember.stack({a, b}, 0).shape)
  end)
end)

describe("copy_, fill_, zero_", function()
  it("copy_ broadcasts the source to the destination and returns it", function()
    local d = ember.zeros(2, 3)
    local r = d:copy_(ember.tensor({1, 2, 3}))
    assert.is_true(rawequal(d, r))
    assert.same({{1, 2, 3}, {1, 2, 3}}, d:tolist())
  end)

  it("copy_ converts dtype (f32 -> i32 truncates toward zero)", function()
    local d = ember.zeros(3, {dtype = "i32"})
    d:copy_(ember.tensor({1.9, -1.9, 2.5}))
    assert.same({1, -1, 2}, d:tolist())
  end)

  it("copy_ into a transposed view writes through to the base", function()
    local t = ember.zeros(2, 3)
    t:t():copy_(ember.tensor({{1, 2}, {3, 4}, {5, 6}}))
    assert.same({{1, 3, 5}, {2, 4, 6}}, t:tolist())
  end)

  it("copy_ from a non-contiguous source", function()
    local d = ember.zeros(3, 2)
    d:copy_(base23():t())
    assert.same({{0, 3}, {1, 4}, {2, 5}}, d:tolist())
  end)

  it("copy_ takes {non_blocking = true} (on the CPU a plain copy) and refuses other options", function()
    local d = ember.zeros(2, {dtype = "i64"})
    assert.is_true(rawequal(d, d:copy_(ember.tensor({3, 4}, {dtype = "u16"}), {non_blocking = true})))
    assert.same({3, 4}, d:tolist())
    assert.error_matches(function() d:copy_(d, {nonblocking = true}) end, "unknown option 'nonblocking'", 1, true)
  end)

  it("copy_ of a 0-dim source fills everything", function()
    local d = ember.zeros(2, 2)
    d:copy_(ember.tensor(4))
    assert.same({{4, 4}, {4, 4}}, d:tolist())
  end)

  it("fill_ on a narrowed view fills only the window", function()
    local t = ember.zeros(4)
    local r = t:narrow(0, 1, 2):fill_(3)
    assert.same({0, 3, 3, 0}, t:tolist())
    assert.same({2}, r.shape)
  end)

  it("fill_ converts the value to the dtype (bool, u8)", function()
    assert.same({true, true}, ember.zeros(2, {dtype = "bool"}):fill_(5):tolist())
    assert.same({7, 7}, ember.zeros(2, {dtype = "u8"}):fill_(7.9):tolist())
  end)

  it("zero_ zeroes in place and returns the tensor", function()
    local t = ember.ones(2, 2)
    assert.is_true(rawequal(t, t:zero_()))
    assert.same({{0, 0}, {0, 0}}, t:tolist())
  end)
end)

describe("set_", function()
  it("rebinds a tensor to a view of a flat buffer", function()
    local flat = ember.arange(10):float()
    local p = ember.zeros(2, 2)
    local r = p:set_(flat:narrow(0, 2, 4):view(2, 2))
    assert.is_true(rawequal(p, r))
    assert.same({2, 2}, p.shape)
    assert.same({{2, 3}, {4, 5}}, p:tolist())
    flat:fill_(1)
    assert.same({{1, 1}, {1, 1}}, p:tolist())
    p:fill_(6)
    assert.same({1, 1, 6, 6, 6, 6, 1, 1, 1, 1}, flat:tolist())
  end)

  it("takes the source's shape, stride and offset", function()
    local flat = ember.zeros(12)
    local p = ember.zeros(1)
    p:set_(flat:view(3, 4):t())
    assert.same({4, 3}, p.shape)
    assert.same({1, 4}, p:stride())
    assert.equals(flat:data_ptr(), p:data_ptr())
  end)
end)

describe("version counter", function()
  it("is unchanged by reads and out-of-place ops", function()
    local t = ember.zeros(3)
    local v = t:_version()
    local _ = t:tolist(), t:clone(), t:view(3), t:contiguous()
    assert.equals(v, t:_version())
  end)

  it("fill_, zero_ and copy_ each bump it", function()
    local t = ember.zeros(3)
    local v = t:_version()
    t:fill_(1)
    assert.equals(v + 1, t:_version())
    t:zero_()
    assert.equals(v + 2, t:_version())
    t:copy_(ember.ones(3))
    assert.equals(v + 3, t:_version())
  end)

  it("an in-place arithmetic op bumps it", function()
    local t = ember.zeros(3)
    local v = t:_version()
    t:add_(1)
    assert(t:_version() > v, "add_ did not bump the version")
  end)

  it("is shared by views: writing a view bumps the base's version", function()
    local t = ember.zeros(2, 3)
    local v = t:_version()
    t:select(0, 1):fill_(1)
    assert.equals(v + 1, t:_version())
    assert.equals(t:_version(), t:t():_version())
  end)

  it("is not shared with a clone", function()
    local t = ember.zeros(3)
    local c = t:clone()
    local v = t:_version()
    c:fill_(1)
    assert.equals(v, t:_version())
  end)
end)
