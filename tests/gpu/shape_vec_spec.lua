-- shape_vec_spec.lua (GPU) — the wide paths of kernels/shape_ops.cu (repeat,
-- tile, flip, roll) against the CPU: last dims that are multiples of the
-- 16-byte vector (8 bf16/f16, 4 f32, 16 u8/bool, 4 f64/i64) take wide loads
-- (forward, reversed, or a roll's two vectors funnel-shifted by every
-- remainder 1 .. V-1), other sizes, unaligned views and strided inputs the
-- one-element loads. The gather moves bits without arithmetic: results must
-- be exact, in every dtype.
local ember = require "ember"
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local cmp = dofile(here .. "compare.lua")

assert(ember.cuda.is_available(), "tests/gpu needs a CUDA device (run with EMBER_TEST_GPU=1 on a GPU host)")

local DTYPES = {"f32", "bf16", "f16", "f64", "u8", "i32", "i64", "bool"}
local VEC = {f32 = 4, bf16 = 8, f16 = 8, f64 = 4, u8 = 16, i32 = 4, i64 = 4, bool = 16}
local V16 = {f32 = 4, bf16 = 8, f16 = 8, f64 = 2, u8 = 16, i32 = 4, i64 = 2, bool = 16}   -- elements a 16 B vector

-- Distinct values in every element (integers and bools: their own range), so a misplaced element shows.
local function data(shape, dtype)
  if dtype == "bool" then return ember.rand(shape):lt(0.5) end
  if dtype == "u8" then return ember.randint(0, 256, shape):to("u8") end
  if dtype == "i32" or dtype == "i64" then return ember.randint(-100000, 100000, shape):to(dtype) end
  return ember.randn(shape):to(dtype)
end

-- f(x) on the CPU and on a CUDA copy of x: exactly equal results.
local function agree(what, f, x)
  local ref = f(x)
  local got = f(x:to("cuda"))
  assert.are.equal("cuda:0", got.device, what .. ": device")
  cmp.assert_equal(got, ref, what)
end

for _, dt in ipairs(DTYPES) do
  local V = VEC[dt]
  describe(("shape gathers on CUDA [%s]"):format(dt), function()
    it("repeat and tile with wide rows, narrow rows and odd rows", function()
      ember.manual_seed(11)
      for _, cols in ipairs({V, 4 * V, 4 * V + 4, 4 * V + 1, 3}) do
        local a = data({5, cols}, dt)
        agree(("repeat (5,%d) by (3,1)"):format(cols), function(x) return x:rep(3, 1) end, a)
        agree(("repeat (5,%d) by (2,3)"):format(cols), function(x) return x:rep(2, 3) end, a)
        agree(("tile (1,%d) by {7,1}"):format(cols), function(x) return x:narrow(0, 1, 1):tile({7, 1}) end, a)
      end
    end)

    it("flip the last dim, several dims, and a flattened tensor", function()
      ember.manual_seed(12)
      for _, cols in ipairs({V, 8 * V, 8 * V + 4, 8 * V + 3}) do
        local a = data({3, 4, cols}, dt)
        agree(("flip (3,4,%d) dim -1"):format(cols), function(x) return x:flip(-1) end, a)
        agree(("flip (3,4,%d) dims {0,2}"):format(cols), function(x) return x:flip({0, 2}) end, a)
        agree(("flip (3,4,%d) dim 1"):format(cols), function(x) return x:flip(1) end, a)
      end
      agree("flip of a flat tensor", function(x) return x:reshape({-1}):flip(0) end, data({6, 8 * V}, dt))
    end)

    it("roll along the last dim by every remainder of the vector, both ways", function()
      ember.manual_seed(13)
      local a = data({6, 8 * V}, dt)
      for s = -V - 1, 2 * V + 1 do
        agree(("roll (6,%d) by %d"):format(8 * V, s), function(x) return x:roll(s, 1) end, a)
      end
      agree("roll by the row length minus one", function(x) return x:roll(8 * V - 1, 1) end, a)
      agree("roll two dims", function(x) return x:roll({2, 3}, {0, 1}) end, a)
      agree("roll the flattened tensor by 5", function(x) return x:roll(5) end, a)
      agree("roll a row of one vector by 1", function(x) return x:roll(1, 1) end, data({4, V}, dt))
      agree("roll odd rows by 3", function(x) return x:roll(3, 1) end, data({4, 8 * V + 3}, dt))
    end)

    -- The rows kernel (issue 12): the last dim read as is and >= 128 16-byte vectors a row. Rows of
    -- 128 (one vector a thread, half a block), 600 (two a thread, a partial second block) and 1100
    -- vectors (four a thread, a partial second block); outer dims repeated, flipped, rolled; a
    -- narrowed input (aligned rows) and one whose row stride is not 16 bytes (dimmap_kernel).
    it("whole rows: repeat, tile, flip and roll of outer dims, every thread count", function()
      ember.manual_seed(15)
      for _, nv in ipairs({128, 600, 1100}) do
        local cols = nv * V16[dt]
        local a = data({5, cols}, dt)
        local what = function(s) return ("%s, rows of %d vectors"):format(s, nv) end
        agree(what("repeat (5,c) by (3,1)"), function(x) return x:rep(3, 1) end, a)
        agree(what("tile (1,c) by {7,1}"), function(x) return x:narrow(0, 1, 1):tile({7, 1}) end, a)
        agree(what("repeat (2,2,c) by (2,3,1)"), function(x) return x:narrow(0, 0, 4):reshape({2, 2, cols}):rep(2, 3, 1) end, a)
        agree(what("flip dim 0"), function(x) return x:flip(0) end, a)
        agree(what("roll dim 0 by 2 and -1"), function(x) return x:roll(2, 0):roll(-1, 0) end, a)
        agree(what("repeat of rows 1..3 (an offset view)"), function(x) return x:narrow(0, 1, 3):rep(2, 1) end, a)
        local b = data({3, cols + 1}, dt)
        agree(what("repeat with a row stride off 16 bytes"), function(x) return x:narrow(1, 0, cols):rep(2, 1) end, b)
      end
    end)

    it("unaligned and strided inputs take the one-element loads", function()
      ember.manual_seed(14)
      local a = data({9, 8 * V + 1}, dt)
      local un = function(x) return x:narrow(1, 1, 8 * V) end          -- rows of 8V starting one element in
      agree("roll of an unaligned view", function(x) return un(x):roll(V + 1, 1) end, a)
      agree("flip of an unaligned view", function(x) return un(x):flip(-1) end, a)
      agree("repeat of an unaligned view", function(x) return un(x):rep(2, 1) end, a)
      local b = data({8 * V, 6}, dt)
      agree("roll of a transposed view", function(x) return x:t():roll(3, 1) end, b)
      agree("flip of a transposed view", function(x) return x:t():flip(-1) end, b)
    end)
  end)
end

-- Repeats of the outermost dim load a source row once and store it to up to 8 of its copies
-- (launch_rows: `per` copies a block, fewer while the grid would be small). Enough rows that per > 1,
-- with a partial last group of copies (5 = 3 + 2, 7 = 4 + 3), an inner repeated dim and an offset view.
describe("shape gathers on CUDA, the rows kernel storing several copies a block", function()
  for _, dt in ipairs(DTYPES) do
    it(("repeat with per > 1 copies a block [%s]"):format(dt), function()
      ember.manual_seed(17)
      local cols = 128 * V16[dt]
      local a = data({1101, cols}, dt)
      agree("repeat (1100,c) by (5,1)", function(x) return x:narrow(0, 1, 1100):rep(5, 1) end, a)
      agree("repeat (300,2,c) by (7,3,1)", function(x) return x:narrow(0, 0, 600):reshape({300, 2, cols}):rep(7, 3, 1) end, a)
      agree("repeat (1101,c/2) by (3,2)", function(x) return x:narrow(1, 0, cols // 2):contiguous():rep(3, 2) end, a)
    end)
  end
end)

describe("shape gathers on CUDA, the rows kernel past the grid's 65535 rows", function()
  it("repeat (3, 2048) u8 by (22000, 1): 66000 rows, each block walking rows", function()
    ember.manual_seed(16)
    local a = ember.randint(0, 256, {3, 2048}):to("u8")
    local ref = a:rep(22000, 1)
    local got = a:cuda():rep(22000, 1):cpu()
    assert.same(ref.shape, got.shape)
    assert.are.equal(0, got:ne(ref):sum():item(), "elements differing from the CPU")
  end)

  -- (the case above now stores 8 copies a block over only 3 block rows: a repeat of an inner dim keeps
  -- one copy a block, 66000 rows of blocks)
  it("repeat (11000, 3, 2048) u8 by (1, 2, 1): 66000 rows, one copy a block", function()
    ember.manual_seed(18)
    local a = ember.randint(0, 256, {11000, 3, 2048}):to("u8")
    local ref = a:rep(1, 2, 1)
    local got = a:cuda():rep(1, 2, 1):cpu()
    assert.same(ref.shape, got.shape)
    assert.are.equal(0, got:ne(ref):sum():item(), "elements differing from the CPU")
  end)
end)
