-- reduce_ext_spec.lua (GPU) — max/min, argmax/argmin and amax/amin on CUDA
-- keep the CPU's "first extreme wins" down to the bits where values tie
-- without being identical: -0 and +0 (equal, yet 1/x tells them apart) and
-- NaN (the first one). kernels/reduce.cu compares a whole 16-byte load (the
-- rows kernel) or a trip of rows (the column kernel) against the state with
-- max.NaN / min.NaN and searches the winner only when it beats the state:
-- these inputs make every load tie, so that search and the index merges run
-- all the time. Shapes drive each launch shape: a warp or a block per row,
-- rows split across blocks, everything, the vector column kernel (several
-- column blocks, split down the rows) and the scalar paths (unaligned rows).
local ember = require "ember"
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local cmp = dofile(here .. "compare.lua")

assert(ember.cuda.is_available(), "tests/gpu needs a CUDA device (run with EMBER_TEST_GPU=1 on a GPU host)")

-- f(x) on the CPU input and on its CUDA copy: every result equal, and every
-- float result's reciprocal too (so -0 and +0 must match)
local function agree(what, f, a)
  local r = table.pack(f(a))
  local g = table.pack(f(a:to("cuda")))
  assert.are.equal(r.n, g.n, what .. ": number of results")
  for i = 1, r.n do
    local x, y = g[i], r[i]
    assert.are.equal(y.dtype, x.dtype, what .. ": dtype")
    cmp.assert_close(x, y, 0, ("%s (result %d)"):format(what, i))
    if y.dtype ~= "i64" then
      cmp.assert_close(1 / x:to("cpu"):to("f64"), 1 / y:to("f64"), 0, ("%s (result %d): the sign of zeros"):format(what, i))
    end
  end
end

-- values -0, +0 and two of one sign (s = -1: below the zeros, for max; +1:
-- above them, for min), so the extreme of nearly every load is a zero tie
local function zeros(shape, s, dt)
  local x = ember.randint(0, 4, shape):to("f64")
  return ember.where(x:lt(2), (x * 2 - 1) * 0, (x - 1) * s):to(dt)
end

local LAYOUTS = {
  {"rows, a warp per output", {37, 1000}, -1},
  {"rows, a block per output", {6, 5000}, 1},
  {"rows of 3000, a warp each, many rows", {2200, 3000}, 1},
  {"rows split across blocks", {2, 300000}, 1},
  {"rows, unaligned (scalar loads)", {5, 3001}, 1},
  {"everything, split", {1000003}, nil},
  {"columns, vectors", {3000, 64}, 0},
  {"columns, vectors, wide and split", {700, 4096}, 0},
  {"middle dim, vectors, split", {4, 20000, 24}, 1},
  {"columns, scalar (odd width)", {3000, 70}, 0},
}

describe("max/min and amax/amin on CUDA: ties of -0/+0 and NaN as the CPU", function()
  for _, L in ipairs(LAYOUTS) do
    it("keeps the first zero's sign and index: " .. L[1], function()
      ember.manual_seed(11)
      for _, dt in ipairs({"f32", "bf16", "f16", "f64"}) do
        local d = L[3]
        local lo, hi = zeros(L[2], -1, dt), zeros(L[2], 1, dt)
        if d then
          agree("amax " .. dt, function(x) return x:amax(d) end, lo)
          agree("amin " .. dt, function(x) return x:amin(d) end, hi)
          agree("max " .. dt, function(x) return x:max(d) end, lo)
          agree("min " .. dt, function(x) return x:min(d) end, hi)
        else
          agree("amax all " .. dt, function(x) return x:amax() end, lo)
          agree("max all " .. dt, function(x) return x:max() end, lo)
          agree("argmin all " .. dt, function(x) return x:argmin() end, hi)
        end
      end
    end)
  end

  it("lets the first NaN win in the vector rows and columns", function()
    ember.manual_seed(12)
    for _, dt in ipairs({"f32", "bf16"}) do
      -- rows: NaNs placed in some rows, late and early; columns: the same transposed into place
      local a = ember.randn({64, 2048}, {dtype = "f64"})
      local nan = ember.zeros({64, 2048}, {dtype = "f64"})
      local l = nan:tolist()
      l[3][1500] = 0 / 0; l[3][700] = 0 / 0; l[10][2048] = 0 / 0; l[64][1] = 0 / 0
      a = (a + ember.tensor(l)):to(dt)
      agree("amax rows with NaN " .. dt, function(x) return x:amax(1) end, a)
      agree("max rows with NaN " .. dt, function(x) return x:max(1) end, a)
      local c = a:t():contiguous()
      agree("amin columns with NaN " .. dt, function(x) return x:amin(0) end, c)
      agree("argmax columns with NaN " .. dt, function(x) return x:argmax(0) end, c)
    end
  end)
end)

-- issue 12: max/min down columns run reduce_cols_ext (a trip's extreme, its
-- first row by a reverse select, one compare against the state; the winner's
-- bits read again for a zero or a NaN). Few distinct values, so every trip
-- ties and the first row must win; heights that end on a partial trip of
-- rows and on splits of several sizes; K a multiple of the vector width
-- (the scalar kernel takes the rest). EMBER_REDUCE_COLS_EXT=0 runs the
-- previous kernel against the same cases; bf16 takes reduce_cols_bx2
-- (EMBER_REDUCE_COLS_BF16X2=0: reduce_cols_ext).
local COLS = {
  {"one trip, partial", {13, 64}, 0},
  {"partial trips", {1001, 136}, 0},
  {"tall, split", {8193, 264}, 0},
  {"wide, split", {2048, 1024}, 0},
  {"middle dim", {3, 777, 40}, 1},
  {"middle dim, tall", {2, 5000, 16}, 1},
}

describe("max/min down columns on CUDA (reduce_cols_ext)", function()
  for _, L in ipairs(COLS) do
    it("matches the CPU, ties to the first row: " .. L[1], function()
      ember.manual_seed(21)
      for _, dt in ipairs({"f32", "bf16", "f16", "f64"}) do
        local d = L[3]
        local t = (ember.randint(0, 9, L[2]):to("f64") - 4):to(dt)   -- 9 values: ties everywhere
        agree("amax ties " .. dt, function(x) return x:amax(d) end, t)
        agree("amin ties " .. dt, function(x) return x:amin(d) end, t)
        agree("max ties " .. dt, function(x) return x:max(d) end, t)
        agree("min ties " .. dt, function(x) return x:min(d) end, t)
        local r = ember.randn(L[2], {dtype = "f64"}):to(dt)      -- distinct values: the extreme moves late
        agree("max randn " .. dt, function(x) return x:max(d) end, r)
        agree("argmin randn " .. dt, function(x) return x:argmin(d) end, r)
      end
    end)
  end

  it("lets the first NaN of a column win, within a trip and across trips", function()
    ember.manual_seed(22)
    for _, dt in ipairs({"f32", "bf16", "f16", "f64"}) do
      local a = ember.randn({1001, 136}, {dtype = "f64"})
      local l = ember.zeros({1001, 136}, {dtype = "f64"}):tolist()
      -- column 1: rows 41 and 9 share a thread's trip (8 apart); 9 wins
      l[41][1] = 0 / 0; l[9][1] = 0 / 0
      -- column 7: a NaN late (row 990, the last partial trip) and one later
      l[990][7] = 0 / 0; l[1001][7] = 0 / 0
      -- column 136 (the last vector's last lane): a NaN in the first row
      l[1][136] = 0 / 0; l[500][136] = 0 / 0
      a = (a + ember.tensor(l)):to(dt)
      agree("amax columns with NaN " .. dt, function(x) return x:amax(0) end, a)
      agree("min columns with NaN " .. dt, function(x) return x:min(0) end, a)
      agree("argmax columns with NaN " .. dt, function(x) return x:argmax(0) end, a)
    end
  end)

  -- bf16 runs reduce_cols_bx2 (two columns an instruction: max.NaN.bf16x2,
  -- compares into half masks; EMBER_REDUCE_COLS_BF16X2=0: reduce_cols_ext):
  -- subnormals (bf16 instructions must not flush them), both zeros and the
  -- infinities, in neighbouring columns of one pair, ties everywhere
  it("bf16 pairs: subnormals, zeros and infinities tie as the CPU", function()
    ember.manual_seed(23)
    for _, shape in ipairs({{1001, 136}, {8193, 264}, {700, 4096}}) do
      local x = ember.randint(0, 7, shape):to("f64")
      local v = (x - 3) * 2 ^ -130                              -- +-2^-130, 2^-129: subnormal in bf16
      v = ember.where(x:eq(1), v * 0, v)                       -- -0
      v = ember.where(x:eq(0), ember.full(shape, -1 / 0, {dtype = "f64"}), v)
      v = ember.where(x:eq(6), ember.full(shape, 1 / 0, {dtype = "f64"}), v):to("bf16")
      agree("max subnormal bf16", function(t) return t:max(0) end, v)
      agree("min subnormal bf16", function(t) return t:min(0) end, v)
      agree("amax subnormal bf16", function(t) return t:amax(0) end, v)
      local s = (x - 3) * 2 ^ -133                             -- the smallest subnormals, and +0
      agree("argmax tiny bf16", function(t) return t:argmax(0) end, s:to("bf16"))
      agree("argmin tiny bf16", function(t) return t:argmin(0) end, s:to("bf16"))
    end
  end)

  -- split column max/min merge their partials in each column block's last
  -- block (an arrival count; EMBER_REDUCE_COLS_LAST=0: reduce_finish, a
  -- second launch); inside a graph capture there are no counts and
  -- reduce_finish merges. Call after call (each last block leaves its count
  -- at zero for the next), 2 to 103 splits, then the same op replayed.
  it("split columns: the last block's merge call after call, and a captured graph's", function()
    ember.manual_seed(24)
    for _, dt in ipairs({"f32", "bf16", "f16", "f64"}) do
      for _, shape in ipairs({{2048, 1024}, {8193, 264}, {130, 512}, {2048, 1024}}) do
        local t = (ember.randint(0, 9, shape):to("f64") - 4):to(dt)
        agree("max split " .. dt, function(x) return x:max(0) end, t)
        agree("amin split " .. dt, function(x) return x:amin(0) end, t)
      end
    end
    for _, dt in ipairs({"f32", "bf16"}) do
      local x = ember.zeros({4096, 1024}, {dtype = dt, device = "cuda"})
      local g, v, i = ember.cuda.graph(function() return x:max(0) end)
      assert.is_not_nil(g)
      for step = 1, 2 do
        local new = (ember.randint(0, 9, {4096, 1024}):to("f64") - 4):to(dt)
        x:copy_(new)
        g:replay()
        ember.cuda.synchronize()
        local rv, ri = new:max(0)
        cmp.assert_close(v, rv, 0, ("graph max %s, replay %d: values"):format(dt, step))
        cmp.assert_close(i, ri, 0, ("graph max %s, replay %d: indices"):format(dt, step))
      end
      g:close()
      local t = (ember.randint(0, 9, {4096, 1024}):to("f64") - 4):to(dt)
      agree("max after the graph " .. dt, function(y) return y:max(0) end, t)
    end
  end)

  it("keeps -inf/+inf columns (m infinite, every row equal) at the first row", function()
    for _, dt in ipairs({"f32", "bf16"}) do
      local n = ember.full({300, 64}, -1 / 0, {dtype = dt})
      agree("max of -inf " .. dt, function(x) return x:max(0) end, n)
      agree("min of +inf " .. dt, function(x) return x:min(0) end, ember.full({300, 64}, 1 / 0, {dtype = dt}))
    end
  end)
end)

-- issue 12: max/min along rows with vector loads keep each trip's winning
-- load and search it once (reduce_rows' KEEP; EMBER_REDUCE_ROWS_KEEP=0: the
-- search whenever a trip wins). Ties everywhere, a last partial trip, rows
-- that end in scalar elements (a narrowed view: row stride 4104, 4101
-- reduced), rows split over blocks.
describe("max/min along rows on CUDA (reduce_rows, the kept load)", function()
  -- f on a view of the CPU tensor and on the same view of its CUDA copy
  local function agree_view(what, f, a, view)
    local r = table.pack(f(view(a)))
    local g = table.pack(f(view(a:to("cuda"))))
    for i = 1, r.n do
      cmp.assert_close(g[i], r[i], 0, ("%s (result %d)"):format(what, i))
      if r[i].dtype ~= "i64" then
        cmp.assert_close(1 / g[i]:to("cpu"):to("f64"), 1 / r[i]:to("f64"), 0, ("%s (result %d): the sign of zeros"):format(what, i))
      end
    end
  end
  local ROWS = {
    {"a warp a row, partial last trip", {300, 4104}},
    {"a block a row", {5, 20008}},
    {"split rows", {2, 262152}},
  }
  for _, L in ipairs(ROWS) do
    it("matches the CPU, ties to the first element: " .. L[1], function()
      ember.manual_seed(31)
      for _, dt in ipairs({"f32", "bf16", "f16", "f64"}) do
        local t = (ember.randint(0, 9, L[2]):to("f64") - 4):to(dt)
        agree("amax ties " .. dt, function(x) return x:amax(1) end, t)
        agree("min ties " .. dt, function(x) return x:min(1) end, t)
        agree("argmax ties " .. dt, function(x) return x:argmax(1) end, t)
        local r = ember.randn(L[2], {dtype = "f64"}):to(dt)
        agree("max randn " .. dt, function(x) return x:max(1) end, r)
        agree("amin randn " .. dt, function(x) return x:amin(1) end, r)
        local z = zeros(L[2], 1, dt)
        agree("min zeros " .. dt, function(x) return x:min(1) end, z)
      end
    end)
  end

  it("takes the scalar tail after the kept load (rows narrowed to 4101)", function()
    ember.manual_seed(32)
    for _, dt in ipairs({"f32", "bf16"}) do
      local t = (ember.randint(0, 5, {64, 4104}):to("f64") - 2):to(dt)
      local l = t:to("f64"):tolist()
      l[3][4101] = 50; l[4][4100] = 0 / 0; l[5][1] = 0 / 0; l[5][4101] = 0 / 0   -- a tail winner, NaNs
      t = ember.tensor(l):to(dt)
      local nar = function(x) return x:narrow(1, 0, 4101) end
      agree_view("max narrowed " .. dt, function(x) return x:max(1) end, t, nar)
      agree_view("amin narrowed " .. dt, function(x) return x:amin(1) end, t, nar)
    end
  end)
end)
