-- stat_spec.lua (GPU) — kernels/stat.cu, the one-pass var and logsumexp over
-- rows held in registers, against the CPU (engine/ops/reduce.c): a row
-- length for every launch shape (a warp per row with 1, 2, 4 or 8 16-byte
-- packs a lane, a block per row with 2, 4 or 8 packs a thread, and one past
-- the capacity, which falls back to reduce.cu's two passes), row counts that
-- leave the last block part-empty, kept dims that are strided views, keepdim
-- and corrections, f32 / bf16 / f16; -inf, +inf and NaN rows; and the same
-- bits on a second run. Tolerance: compare.lua's for the result dtype.
local ember = require "ember"
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local cmp = dofile(here .. "compare.lua")

assert(ember.cuda.is_available(), "tests/gpu needs a CUDA device (run with EMBER_TEST_GPU=1 on a GPU host)")

local function agree(what, f, a)
  local r, g = f(a), f(a:to("cuda"))
  assert.are.equal("cuda:0", g.device, what .. ": device")
  assert.are.equal(r.dtype, g.dtype, what .. ": dtype")
  cmp.assert_close(g, r, cmp.rtol(r.dtype), what)
end

local function randn(shape, dt, scale) return (ember.randn(shape, {dtype = "f64"}) * (scale or 1)):to(dt) end

-- packs (16 bytes) a row: 1, 32, 64, 250 (warp, N = 1/2/4/8), 257, 512,
-- 1024, 2048 (block, N = 2/2/4/8), 2049 (past the capacity: two passes)
local PACKS = {1, 32, 64, 250, 257, 512, 1024, 2048, 2049}
local VEC = {f32 = 4, bf16 = 8, f16 = 8}

describe("one-pass var and logsumexp on CUDA", function()
  for _, dt in ipairs({"f32", "bf16", "f16"}) do
    it("matches the CPU for every row length's launch shape [" .. dt .. "]", function()
      ember.manual_seed(31)
      for _, p in ipairs(PACKS) do
        local L = p * VEC[dt]
        for _, rows in ipairs({3, 37}) do
          local what = ("(%d,%d) %s"):format(rows, L, dt)
          local a = randn({rows, L}, dt)
          agree("var -1 " .. what, function(x) return x:var(-1) end, a + 3)   -- an offset the centring must remove
          agree("var correction 0 keepdim " .. what, function(x) return x:var(-1, {correction = 0, keepdim = true}) end, a)
          agree("logsumexp -1 " .. what, function(x) return x:logsumexp(-1) end, a * 4)
        end
      end
    end)

    it("reads rows through strided kept dims and keepdim [" .. dt .. "]", function()
      ember.manual_seed(32)
      local a = randn({4, 6, 512}, dt)
      agree("var of a transpose's rows " .. dt, function(x) return x:transpose(0, 1):var(-1) end, a)
      agree("logsumexp of a transpose's rows, keepdim " .. dt,
        function(x) return x:transpose(0, 1):logsumexp(-1, {keepdim = true}) end, a)
      agree("var of every other row " .. dt, function(x) return x:narrow(1, 1, 4):var(2, {correction = 2}) end, a)
      agree("var over everything of 2048 elements " .. dt, function(x) return x:narrow(0, 0, 1):narrow(1, 0, 4):var() end, a)
    end)
  end

  it("keeps -inf, +inf and NaN rows as the CPU does, in both launch shapes", function()
    local inf, nan = math.huge, 0 / 0
    for _, L in ipairs({8, 4096}) do
      for _, dt in ipairs({"f32", "bf16"}) do
        local rows = {}
        for r = 1, 5 do rows[r] = {} for c = 1, L do rows[r][c] = (c % 7) * 0.25 end end
        for c = 1, L do rows[1][c] = -inf end
        rows[2][1] = -inf
        rows[3][2] = inf
        rows[4][3] = nan
        rows[5][L] = inf; rows[5][1] = nan
        local a = ember.tensor(rows, {dtype = "f64"}):to(dt)
        agree(("logsumexp specials (5,%d) %s"):format(L, dt), function(x) return x:logsumexp(1) end, a)
        agree(("var specials (5,%d) %s"):format(L, dt), function(x) return x:var(1) end, a:narrow(0, 2, 3))
      end
    end
  end)

  it("gives the same bits on a second run", function()
    ember.manual_seed(33)
    for _, L in ipairs({1000, 8192}) do
      local a = randn({64, L}, "f32"):to("cuda")
      cmp.assert_close(a:var(-1), a:var(-1), 0, "var repeat " .. L)
      cmp.assert_close(a:logsumexp(-1), a:logsumexp(-1), 0, "logsumexp repeat " .. L)
    end
  end)

  it("gives the same bits on a second run [bf16, f16: the MUFU exp and the two-lane max]", function()
    ember.manual_seed(34)
    for _, dt in ipairs({"bf16", "f16"}) do
      for _, L in ipairs({1000, 8192}) do
        local a = randn({64, L}, dt, 4):to("cuda")
        cmp.assert_close(a:logsumexp(-1), a:logsumexp(-1), 0, "logsumexp repeat " .. dt .. " " .. L)
      end
    end
  end)
end)
