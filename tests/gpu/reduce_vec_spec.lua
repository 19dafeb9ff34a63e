-- reduce_vec_spec.lua (GPU) — the edges of the reductions' vector paths
-- (kernels/reduce.cu, issue 12: eight 16-byte loads in flight per thread,
-- the last trip predicated, a scalar tail, splits of whole block trips, a
-- block-wide finish) against the CPU: lengths around the vector width (8
-- bf16 / 4 f32 / 2 f64) and around a trip (kUnroll x threads x vector),
-- views one element off 16-byte alignment (the scalar path), dims of 1 and
-- empty dims. Float results with compare.lua's tolerance for the dtype;
-- max/min values and every index exactly (ties to the first index).
local ember = require "ember"
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local cmp = dofile(here .. "compare.lua")

assert(ember.cuda.is_available(), "tests/gpu needs a CUDA device (run with EMBER_TEST_GPU=1 on a GPU host)")

local FLOATS = {"f32", "bf16", "f16", "f64"}

local function agree(what, f, a, exact)
  local r = table.pack(f(a))
  local g = table.pack(f(a:to("cuda")))
  assert.are.equal(r.n, g.n, what .. ": number of results")
  for i = 1, r.n do
    assert.are.equal("cuda:0", g[i].device, what .. ": device")
    assert.are.equal(r[i].dtype, g[i].dtype, what .. ": dtype")
    cmp.assert_close(g[i], r[i], exact and 0 or cmp.rtol(r[i].dtype), ("%s (result %d)"):format(what, i))
  end
end

local function randn(shape, dt) return ember.randn(shape, {dtype = "f64"}):to(dt) end
-- small integers: many ties, so the first-index rule is exercised across vector lanes and trips
local function tied(shape, dt) return ember.randint(0, 5, shape):to(dt) end

-- one row (sum over everything): around the vector width, one trip of a block
-- (8 x 256 x 8 = 16384 bf16, 8192 f32), and several splits
local FLAT = {1, 3, 7, 8, 9, 15, 17, 1023, 1025, 8191, 8192, 8193, 16383, 16385, 65537, 1000003, 4194304 + 5}

-- rows: a warp per row (<= 1024, and <= 16384 with >= 2048 rows), a block per
-- row, rows split over blocks; lengths that leave a tail after the vectors
local ROWS = {{3, 1}, {5, 7}, {9, 1031}, {2049, 1027}, {4, 4099}, {6, 16391}, {2, 300001}, {1, 65543}}

describe("reductions' vector paths on CUDA: odd lengths", function()
  for _, dt in ipairs(FLOATS) do
    it("sums, averages and takes max/argmin over all elements [" .. dt .. "]", function()
      ember.manual_seed(21)
      for _, n in ipairs(FLAT) do
        local a = randn({n}, dt)
        agree(("sum of %d %s"):format(n, dt), function(x) return x:sum() end, a)
        agree(("mean of %d %s"):format(n, dt), function(x) return x:mean() end, a)
        local t = tied({n}, dt)
        agree(("max of %d %s"):format(n, dt), function(x) return x:max() end, t, true)
        agree(("argmin of %d %s"):format(n, dt), function(x) return x:argmin() end, t, true)
      end
    end)

    it("reduces rows of odd lengths over the last dim [" .. dt .. "]", function()
      ember.manual_seed(22)
      for _, s in ipairs(ROWS) do
        local what = ("(%d,%d) %s"):format(s[1], s[2], dt)
        local a = randn(s, dt)
        agree("sum -1 " .. what, function(x) return x:sum(-1) end, a)
        agree("mean -1 keepdim " .. what, function(x) return x:mean(-1, {keepdim = true}) end, a)
        agree("var -1 " .. what, function(x) return x:var(-1) end, a + 2)
        agree("logsumexp -1 " .. what, function(x) return x:logsumexp(-1) end, a)
        local t = tied(s, dt)
        agree("max -1 " .. what, function(x) return x:max(-1) end, t, true)
        agree("min -1 " .. what, function(x) return x:min(-1) end, t, true)
      end
    end)
  end
end)

describe("reductions' vector paths on CUDA: alignment, dims of 1, empty", function()
  it("reads views one element off 16-byte alignment (the scalar path) like aligned ones", function()
    ember.manual_seed(23)
    for _, dt in ipairs(FLOATS) do
      local flat = randn({100003}, dt)
      agree("sum of a 1-element-offset view " .. dt, function(x) return x:narrow(0, 1, 100002):sum() end, flat)
      agree("max of a 1-element-offset view " .. dt, function(x) return x:narrow(0, 1, 100002):max() end,
        tied({100003}, dt), true)
      local m = randn({37, 4104}, dt)
      agree("sum -1 of rows offset by 1 " .. dt, function(x) return x:narrow(1, 1, 4100):sum(-1) end, m)
      agree("argmax -1 of rows offset by 1 " .. dt, function(x) return x:narrow(1, 1, 4100):argmax(-1) end,
        tied({37, 4104}, dt), true)
      -- a whole-row offset keeps alignment only when the row is a multiple of 16 bytes
      agree("sum -1 of rows from row 1 " .. dt, function(x) return x:narrow(0, 1, 36):sum(-1) end, m)
      local c = randn({515, 72}, dt)
      agree("sum 0 of columns offset by 1 " .. dt, function(x) return x:narrow(1, 1, 64):sum(0) end, c)
      agree("max 0 of columns offset by 1 " .. dt, function(x) return x:narrow(1, 1, 64):max(0) end,
        tied({515, 72}, dt), true)
    end
  end)

  it("reduces dims of 1 and over dims of 1", function()
    ember.manual_seed(24)
    for _, dt in ipairs(FLOATS) do
      agree("sum -1 of (1, 4097) " .. dt, function(x) return x:sum(-1) end, randn({1, 4097}, dt))
      agree("sum -1 of (4097, 1) " .. dt, function(x) return x:sum(-1) end, randn({4097, 1}, dt))
      agree("sum 0 of (1, 4097) " .. dt, function(x) return x:sum(0) end, randn({1, 4097}, dt))
      agree("sum 0 of (4097, 1) " .. dt, function(x) return x:sum(0) end, randn({4097, 1}, dt))
      agree("max 0 of (4097, 1) " .. dt, function(x) return x:max(0) end, tied({4097, 1}, dt), true)
      agree("mean of (1, 1) " .. dt, function(x) return x:mean() end, randn({1, 1}, dt))
    end
  end)

  it("sums over empty dims (0 and NaN for mean) and returns empty results for empty kept dims", function()
    for _, dt in ipairs(FLOATS) do
      agree("sum -1 of (16, 0) " .. dt, function(x) return x:sum(-1) end, ember.zeros({16, 0}, {dtype = dt}))
      agree("mean -1 of (16, 0) " .. dt, function(x) return x:mean(-1) end, ember.zeros({16, 0}, {dtype = dt}))
      agree("sum -1 of (0, 16) " .. dt, function(x) return x:sum(-1) end, ember.zeros({0, 16}, {dtype = dt}))
      agree("sum of (0,) " .. dt, function(x) return x:sum() end, ember.zeros({0}, {dtype = dt}))
    end
  end)

  it("sums over dim 0 of wide matrices (the column kernel) at odd heights", function()
    ember.manual_seed(25)
    for _, dt in ipairs(FLOATS) do
      for _, h in ipairs({1, 7, 33, 4097}) do
        agree(("sum 0 of (%d, 4096) %s"):format(h, dt), function(x) return x:sum(0) end, randn({h, 4096}, dt))
      end
      agree("max 0 of (4097, 256) " .. dt, function(x) return x:max(0) end, tied({4097, 256}, dt), true)
    end
  end)

  -- split rows reductions: eagerly the last block of each column merges the
  -- partials (per-stream arrival counts, left zero for the next launch);
  -- inside a graph capture reduce_finish does, in the same order: the same
  -- bits either way, on any stream, run after run
  it("merges split partials in the kernel with reduce_finish's bits, on two streams and in a graph", function()
    ember.manual_seed(27)
    for _, dt in ipairs({"f32", "bf16"}) do
      local a = randn({2, 3000000}, dt):to("cuda")        -- two rows of 256 splits: the last block merges by block
      local b = randn({2048, 9000}, dt):to("cuda")        -- a warp a row, 256 blocks of 8 rows x 2 splits
      local c = tied({5000000}, dt):to("cuda")            -- argmax over all: values and indices merged
      local function all()
        return a:sum(), a:sum(-1), a:amax(-1), b:sum(-1), c:max(0)
      end
      local ref = table.pack(all())
      local g, gs = nil, nil
      do
        local r = table.pack(ember.cuda.graph(function() return all() end))
        g = r[1]
        gs = {table.unpack(r, 2, r.n)}
      end
      g:replay()
      local s2 = ember.cuda.Stream()
      s2:wait_stream(ember.cuda.current_stream())   -- the inputs; then beside the replay
      local other = table.pack(ember.cuda.stream(s2, all))
      ember.cuda.current_stream():wait_stream(s2)
      local again = table.pack(all())
      for i = 1, ref.n do
        local what = ("%s result %d"):format(dt, i)
        cmp.assert_equal(gs[i]:cpu(), ref[i]:cpu(), what .. ": graph (reduce_finish) vs eager (last block)")
        cmp.assert_equal(other[i]:cpu(), ref[i]:cpu(), what .. ": a second stream")
        cmp.assert_equal(again[i]:cpu(), ref[i]:cpu(), what .. ": run again (the counts were left zero)")
      end
      -- and the values against the CPU
      agree("sum over 3e6 " .. dt, function(x) return x:sum(-1) end, a:cpu())
      agree("argmax over all tied " .. dt, function(x) return x:max(0) end, c:cpu(), true)
      g:close()
    end
  end)

  it("gives the same float sum on every run (a fixed partition)", function()
    ember.manual_seed(26)
    for _, dt in ipairs({"f32", "bf16"}) do
      local a = randn({4096, 4096}, dt):to("cuda")
      local s1, r1 = a:sum():to({device = "cpu", dtype = "f64"}):item(), a:sum(-1):to({device = "cpu", dtype = "f64"})
      for _ = 1, 3 do
        assert.are.equal(s1, a:sum():to({device = "cpu", dtype = "f64"}):item(), "sum over all " .. dt)
        cmp.assert_close(a:sum(-1):to({device = "cpu", dtype = "f64"}), r1, 0, "sum -1 " .. dt)
      end
    end
  end)
end)
