-- embedding_spec.lua — the VALUES of F.embedding (engine/ops/embedding.c): a
-- row gather, out[..., :] = w[ids[...], :], for ids of any shape and integer
-- dtype, repeated ids, every weight dtype (bit-exact: a gather does no
-- arithmetic) and strided weights/ids. Gradients live in gradcheck_spec.lua,
-- errors (out-of-range ids, float ids) in bad_input_spec.lua.
--
-- Run from the repository root:
--   LUA_PATH="build/lua/?.lua;build/lua/?/init.lua;;" LUA_CPATH="build/lua/?.so;;" \
--     busted tests/lua/embedding_spec.lua
--
-- Every comparison is exact: the result must be a copy of rows of w.

local ember = require "ember"
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local F = ember.nn.functional

local flat = H.flat

local function table_w(seed, n, d, dtype)
  ember.manual_seed(seed)
  return ember.randn(n, d, {dtype = "f64"}):to(dtype or "f32")
end

-- out must be (ids.shape..., d) with out[k, :] = w[ids[k], :] for every flat k
local function assert_gathered(out, ids, w)
  local d = w.shape[2]
  local want_shape = {}
  for i, s in ipairs(ids.shape) do want_shape[i] = s end
  want_shape[#want_shape + 1] = d
  assert.same(want_shape, out.shape)
  local wl, il, ol = w:tolist(), flat(ids:long()), flat(out)
  for k, id in ipairs(il) do
    for j = 1, d do
      assert.equals(wl[id + 1][j], ol[(k - 1) * d + j],
        string.format("output row %d (id %d), column %d", k - 1, id, j - 1))
    end
  end
end

describe("F.embedding", function()
  it("gathers rows of w for (2, 3) ids into (2, 3, d)", function()
    local w = table_w(1, 10, 4)
    ember.manual_seed(2)
    local ids = ember.randint(0, 10, {2, 3})
    assert_gathered(F.embedding(ids, w), ids, w)
  end)

  it("gives identical rows for repeated ids", function()
    local w = table_w(3, 5, 6)
    local ids = ember.tensor({4, 1, 4, 4, 0, 1}, {dtype = "i64"})
    local out = F.embedding(ids, w):tolist()
    assert.same(out[1], out[3])
    assert.same(out[1], out[4])
    assert.same(out[2], out[6])
    assert_gathered(F.embedding(ids, w), ids, w)
  end)

  for _, dt in ipairs({"u8", "i32", "i64"}) do
    it("accepts " .. dt .. " ids", function()
      local w = table_w(4, 7, 3)
      local ids = ember.tensor({{6, 0}, {3, 3}}, {dtype = dt})
      local out = F.embedding(ids, w)
      assert_gathered(out, ids, w)
      assert.same(F.embedding(ids:long(), w):tolist(), out:tolist())
    end)
  end

  for _, dt in ipairs({"f32", "f64", "bf16", "f16"}) do
    it("copies " .. dt .. " rows bit for bit and keeps the dtype", function()
      local w = table_w(5, 8, 5, dt)
      local ids = ember.tensor({7, 2, 0}, {dtype = "i64"})
      local out = F.embedding(ids, w)
      assert.equals(dt, out.dtype)
      assert_gathered(out, ids, w)
    end)
  end

  it("a 0-d id gives one (d) row", function()
    local w = table_w(6, 4, 3)
    local out = F.embedding(ember.tensor(2, {dtype = "i64"}), w)
    assert.same({3}, out.shape)
    assert.same(w:tolist()[3], out:tolist())
  end)

  it("1-D ids give (n, d); the first and last rows of w are reachable", function()
    local w = table_w(7, 6, 2)
    local ids = ember.tensor({0, 5}, {dtype = "i64"})
    assert_gathered(F.embedding(ids, w), ids, w)
  end)

  it("empty ids give an empty (0, d) result", function()
    local out = F.embedding(ember.zeros(0, {dtype = "i64"}), table_w(8, 4, 3))
    assert.same({0, 3}, out.shape)
  end)

  it("reads a transposed (non-contiguous) weight by its logical rows", function()
    ember.manual_seed(9)
    local w = ember.randn(4, 10):t()          -- (10, 4), strides (1, 10)
    assert.is_false(w:is_contiguous())
    local ids = ember.tensor({9, 0, 3}, {dtype = "i64"})
    assert_gathered(F.embedding(ids, w), ids, w)
  end)

  it("reads transposed (non-contiguous) ids in their logical order", function()
    local w = table_w(10, 6, 2)
    local ids = ember.tensor({{0, 1, 2}, {3, 4, 5}}, {dtype = "i64"}):t()   -- (3, 2)
    assert_gathered(F.embedding(ids, w), ids, w)
  end)

  it("returns a copy: writing into the result leaves w unchanged", function()
    local w = table_w(11, 3, 2)
    local before = w:tolist()
    F.embedding(ember.tensor({1}, {dtype = "i64"}), w):fill_(99)
    assert.same(before, w:tolist())
  end)
end)
