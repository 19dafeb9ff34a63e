-- scan_spec.lua (GPU) — kernels/scan.cu's one-row scan (kernels/scan_row.cuh:
-- 4096-element tiles, prefixes summed in a fixed order over 64-tile chunks;
-- split, two passes, by default) against the
-- CPU, at sizes around the tile and the chunk, misaligned (the scalar path)
-- and reversed (cumsum's backward); and its promise: the same bits on every
-- run (CUB's look-back, EMBER_SCAN_ROW=cub, does not promise that for floats).
-- Tolerance: compare.lua's for the dtype (the GPU accumulates in f32 for
-- f32/bf16, the CPU in double); integers exact.
local ember = require "ember"
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local cmp, H = dofile(here .. "compare.lua")
assert(ember.cuda.is_available(), "tests/gpu needs a CUDA device (run with EMBER_TEST_GPU=1 on a GPU host)")

local SIZES = {1, 4095, 4096, 4097, 3 * 4096 + 5, 64 * 4096 - 1, 64 * 4096 + 5, 131 * 4096 + 77}

local function same_bits(a, b, what)
  local d = (a:to("f64") - b:to("f64")):abs():max():item()
  assert.are.equal(0, d, what .. ": two runs differ")
end

describe("one-row cumsum/cumprod on CUDA (tiles, fixed-order look-back)", function()
  for _, dt in ipairs({"f32", "bf16", "f64", "f16"}) do
    it(("cumsum and cumprod of one row match the CPU (%s), forward, misaligned and reversed"):format(dt), function()
      ember.manual_seed(31)
      for _, n in ipairs(SIZES) do
        local x = ember.randn(n + 1, {dtype = "f64"}):to(dt)
        local xc = x:cuda()
        local what = ("%s n %d"):format(dt, n)
        cmp.assert_close(xc:narrow(0, 0, n):cumsum(0), x:narrow(0, 0, n):cumsum(0), cmp.rtol(dt), "cumsum " .. what)
        cmp.assert_close(xc:narrow(0, 1, n):cumsum(0), x:narrow(0, 1, n):cumsum(0), cmp.rtol(dt),
                         "cumsum misaligned " .. what)
        -- every product rounds about sqrt(n) 2^-24 away from the CPU's double: f32 meets 1e-5 only for short rows
        if dt ~= "f32" or n <= 3 * 4096 + 5 then
          local p = (ember.rand(n, {dtype = "f64"}) * 0.002 + 0.999):to(dt)
          cmp.assert_close(p:cuda():cumprod(0), p:cumprod(0), cmp.rtol(dt), "cumprod " .. what)
        end
        local a, ac = x:narrow(0, 0, n):detach(), xc:narrow(0, 0, n):detach()
        a.requires_grad, ac.requires_grad = true, true
        local g = ember.randn(n, {dtype = "f64"}):to(dt)
        a:cumsum(0):backward(g)
        ac:cumsum(0):backward(g:cuda())
        cmp.assert_close(ac.grad, a.grad, cmp.rtol(dt), "cumsum backward (reversed) " .. what)
      end
    end)
  end

  it("integer cumsum of one row is exact", function()
    ember.manual_seed(32)
    local x = ember.randint(-1000, 1000, {131 * 4096 + 77})
    cmp.assert_close(x:cuda():cumsum(0), x:cumsum(0), 0, "i64 cumsum")
  end)

  it("gives the same bits on every run (f32 and bf16, 2^22 + 3 elements)", function()
    ember.manual_seed(33)
    for _, dt in ipairs({"f32", "bf16"}) do
      local x = ember.randn((1 << 22) + 3):to(dt):cuda()
      local first = x:cumsum(0)
      for _ = 1, 5 do same_bits(x:cumsum(0), first, "cumsum " .. dt) end
      local p = (ember.rand((1 << 22) + 3) * 0.002 + 0.999):to(dt):cuda()
      local pf = p:cumprod(0)
      for _ = 1, 3 do same_bits(p:cumprod(0), pf, "cumprod " .. dt) end
    end
  end)
end)

-- The default one-row scan (split: scan_row_sums, then scan_row_apply) evaluates
-- a fixed expression per element whatever the order its apply pass takes the
-- tiles in, so its A/B switch must not change a bit:
-- EMBER_SCAN_ROW_LAST_FIRST=0 (first tile first) against the default (last
-- tile first). The switch is read once a process: each setting runs in a
-- child and saves its results. Sizes: two elements,
-- one tile and a bit, a chunk and a bit, and 301 chunks (> 256: the carry
-- warps each start past 32 chunks, the lane partials' first loop); forward,
-- misaligned (the scalar path), cumprod, reversed (cumsum's backward), each
-- sum run twice.
local BIG = 300 * 64 * 4096 + 4099
local CHILD = [[
local ember = require "ember"
local out = {}
for _, dt in ipairs({"f32", "bf16", "f16", "f64"}) do
  for k, n in ipairs({2, 4097, 64 * 4096 + 5, ]] .. BIG .. [[}) do
    ember.manual_seed(40 + k)
    local x = ember.randn(n, {device = "cuda"}):to(dt)
    local p = (ember.rand(n, {device = "cuda"}) * 0.002 + 0.999):to(dt)
    local key = dt .. "_" .. k
    -- the largest row is sampled every 997th element (several a tile, so every tile's prefix), not saved whole
    local idx = n > 1000000 and ember.arange(0, n, 997, {device = "cuda"}) or nil
    local function keep(t) return (idx and t:index_select(0, idx) or t):cpu() end
    out["in_" .. key] = keep(x)
    out["sum_" .. key] = keep(x:cumsum(0))
    out["again_" .. key] = keep(x:cumsum(0))
    out["prod_" .. key] = keep(p:cumprod(0))
    local xl = x:detach(); xl.requires_grad = true
    xl:cumsum(0):backward(p)   -- the reversed scan of p
    out["rev_" .. key] = keep(xl.grad)
    out["mis_" .. key] = keep(x:narrow(0, 1, n - 1):cumsum(0))
  end
end
ember.save(os.getenv("SCAN_SPEC_OUT"), out)
]]

describe("one-row scan on CUDA: split's switches, cub, graph capture", function()
  after_each(function() H.remove_temps() end)

  it("gives the same bits whatever its switches (f32, bf16, f16, f64; sums, products, reversed, misaligned), "
     .. "and a second run the same bits", function()
    local script = H.temp_file(CHILD, ".lua")
    local order = cmp.mode_results(H, script, "EMBER_SCAN_ROW_LAST_FIRST", {"1", "0"})
    local got = {default = order["1"], first_tile_first = order["0"]}
    assert.are.equal(4 * 4 * 6, cmp.assert_modes_agree(got, "default", {"first_tile_first"}))
    for mode, r in pairs(got) do   -- the second run of each sum: the same bits
      for name, t in pairs(r) do
        local key = name:match("^again_(.*)$")
        if key then
          local d = t:ne(r["sum_" .. key]):sum():item()
          assert(d == 0, ("%s cumsum %s run twice: %d elements differ, expected 0"):format(mode, key, d))
        end
      end
    end
  end)

  it("split matches the CPU across 301 chunks (f32 cumsum)", function()
    ember.manual_seed(41)
    local x = ember.randn(BIG, {dtype = "f64"})
    cmp.assert_close(x:to("f32"):cuda():cumsum(0), x:to("f32"):cumsum(0), cmp.rtol("f32"), "cumsum f32 n " .. BIG)
  end)

  it("gives the same bits inside graph capture as eagerly (f32, bf16; 8 chunks less a bit)", function()
    ember.manual_seed(44)
    for _, dt in ipairs({"f32", "bf16"}) do
      local x = ember.randn(8 * 64 * 4096 - 4093, {device = "cuda"}):to(dt)
      local eager = x:cumsum(0)
      local g, y = ember.cuda.graph(function() return x:cumsum(0) end)
      g:replay()
      cmp.assert_same_bits(y, eager, "graph vs eager cumsum " .. dt)
      local new = ember.randn(x:numel(), {device = "cuda"}):to(dt)
      x:copy_(new)   -- a replay reads the captured input's new values
      g:replay()
      cmp.assert_same_bits(y, new:cumsum(0), "graph replay with new values, cumsum " .. dt)
      g:close()
    end
  end)

  it("EMBER_SCAN_ROW=cub (CUB's scan, not deterministic for floats) matches the CPU; another value is refused",
     function()
    local script = H.temp_file([[
local ember = require "ember"
ember.manual_seed(45)
local out = {}
for k, n in ipairs({4097, 64 * 4096 + 5}) do
  local x = ember.randn(n, {dtype = "f64"}):to("f32")
  out["x" .. k], out["got" .. k] = x, x:cuda():cumsum(0):cpu()
  out["mis" .. k] = x:cuda():narrow(0, 1, n - 1):cumsum(0):cpu()
end
ember.save(os.getenv("SCAN_SPEC_OUT"), out)
]], ".lua")
    local r = cmp.mode_results(H, script, "EMBER_SCAN_ROW", {"cub"}).cub
    for k = 1, 2 do
      local x = r["x" .. k]
      cmp.assert_close(r["got" .. k], x:cumsum(0), cmp.rtol("f32"), "cub cumsum f32 n " .. x:numel())
      cmp.assert_close(r["mis" .. k], x:narrow(0, 1, x:numel() - 1):cumsum(0), cmp.rtol("f32"), "cub misaligned")
    end
    for _, bad in ipairs({"ring", "l2", "tiles"}) do
      local _, err, code = H.ember({"run", script}, {env = {EMBER_SCAN_ROW = bad, SCAN_SPEC_OUT = H.temp(".st")}})
      assert.are_not.equal(0, code, "EMBER_SCAN_ROW=" .. bad .. " should fail")
      assert.matches("expected EMBER_SCAN_ROW to be split or cub, got '" .. bad .. "'", err, 1, true)
    end
  end)
end)

-- Row scans (many rows): the vector path (scan_rows_ring by default, scan_rows
-- with EMBER_SCAN_ROWS=one/ahead) keeps tiles of loads in flight (1024
-- elements a tile); lengths around 8 and 16 tiles, rows of one and two tiles,
-- and a length that is no multiple of 4 (the scalar path), against the CPU,
-- forward and reversed (cumsum's backward).
describe("row scans on CUDA (tiles loaded ahead)", function()
  it("match the CPU (f32, bf16, f64)", function()
    ember.manual_seed(35)
    for _, dt in ipairs({"f32", "bf16", "f64"}) do
      for _, shape in ipairs({{5, 8192}, {3, 8 * 1024 + 4}, {4, 16 * 1024 + 1024 + 8}, {7, 100}, {6, 2048}, {3, 9 * 1024 + 3}}) do
        local x = ember.randn(shape, {dtype = "f64"}):to(dt)
        local what = ("%s (%d, %d)"):format(dt, shape[1], shape[2])
        cmp.assert_close(x:cuda():cumsum(1), x:cumsum(1), cmp.rtol(dt), "cumsum " .. what)
        local p = (ember.rand(shape, {dtype = "f64"}) * 0.002 + 0.999):to(dt)
        -- as above: a long f32 product drifts ~sqrt(L) 2^-24 from the CPU's double, near 1e-5 past ~10^4
        if dt ~= "f32" or shape[2] <= 10000 then
          cmp.assert_close(p:cuda():cumprod(1), p:cumprod(1), cmp.rtol(dt), "cumprod " .. what)
        end
        local a, ac = x:detach(), x:cuda():detach()
        a.requires_grad, ac.requires_grad = true, true
        a:cumsum(1):backward(p)
        ac:cumsum(1):backward(p:cuda())
        cmp.assert_close(ac.grad, a.grad, cmp.rtol(dt), "cumsum backward (reversed) " .. what)
      end
    end
  end)
end)

-- Row scans, the four paths (EMBER_SCAN_ROWS, read once a process: each runs
-- in a child): ring (the default for f32/f64: a block walks rows b, b + G,
-- ... as one stream of tiles, the next ones in flight in a cp.async ring)
-- and pair (the default for bf16/f16: that stream two tiles a step, its own
-- raking scan written out from cub's) must give
-- the bits of one (scan_rows, a row a block, cub::BlockScan) and ahead
-- (gpuscan2's registers).
-- Shapes: more rows than the grid has blocks (several rows a block, the ring
-- crossing row ends), rows of 3 elements and of 1028 (a partial second
-- tile), 8 tiles, rows of 3 tiles (pair's last step half past the row end),
-- 3 tiles the last partial, a length no multiple of 4 and a reversed scan
-- (those two take scan_rows whatever the switch), f32, bf16, f16, f64.
local ROWS_CHILD = [[
local ember = require "ember"
local out = {}
for _, dt in ipairs({"f32", "bf16", "f16", "f64"}) do
  for k, shape in ipairs({{3000, 1028}, {2500, 12}, {300, 8192}, {37, 4 * 1024 + 5}, {2, 4}, {1500, 3 * 1024},
                          {700, 2 * 1024 + 12}}) do
    ember.manual_seed(60 + k)
    local x = ember.randn(shape, {device = "cuda"}):to(dt)
    local p = (ember.rand(shape, {device = "cuda"}) * 0.002 + 0.999):to(dt)
    local key = dt .. "_" .. k
    out["sum_" .. key] = x:cumsum(1):cpu()
    out["prod_" .. key] = p:cumprod(1):cpu()
    local xl = x:detach(); xl.requires_grad = true
    xl:cumsum(1):backward(p)   -- the reversed scan of p
    out["rev_" .. key] = xl.grad:cpu()
  end
end
ember.save(os.getenv("SCAN_SPEC_OUT"), out)
]]

describe("row scan paths on CUDA (EMBER_SCAN_ROWS)", function()
  after_each(function() H.remove_temps() end)

  it("ring and pair (the defaults) give the bits of one and ahead, sums, products and reversed (f32, bf16, f16, f64)",
     function()
    local modes = {"ring", "one", "ahead", "pair"}
    local got = cmp.mode_results(H, H.temp_file(ROWS_CHILD, ".lua"), "EMBER_SCAN_ROWS", modes)
    assert.are.equal(4 * 7 * 3, cmp.assert_modes_agree(got, "one", {"ring", "ahead", "pair"}))
  end)

  it("ring and pair match the CPU with several rows a block ((3000, 1028), (1500, 3072) and f64 (2500, 12))", function()
    ember.manual_seed(36)
    for _, c in ipairs({{"f32", {3000, 1028}}, {"bf16", {3000, 1028}}, {"f64", {2500, 12}}, {"bf16", {1500, 3072}},
                        {"f16", {1500, 3072}}}) do
      local dt, shape = c[1], c[2]
      local x = ember.randn(shape, {dtype = "f64"}):to(dt)
      cmp.assert_close(x:cuda():cumsum(1), x:cumsum(1), cmp.rtol(dt), ("cumsum %s (%d, %d)"):format(dt, shape[1], shape[2]))
    end
  end)
end)

-- Column scans (dim not innermost): scan_strips_flow (the default for
-- bf16/f16) and scan_strips_async (f32/f64), where rows of a strip are
-- 16-byte aligned, and scan_strips (else, or EMBER_SCAN_STRIP=v1) all walk
-- each column in row order in the accumulator, so the bits of a row-by-row
-- walk. 1300 rows: more tiles (128 rows f32, 256 bf16; flow 64 / 128) than
-- the stages of either ring (4; flow 6); 160 columns: flow/async for both
-- dtypes; 100: a partial strip, async for f32, scan_strips for bf16 (200
-- bytes a row); 1030: scan_strips.
describe("column scans on CUDA (cp.async strips and the register-staged strips)", function()
  it("are the bits of the row-by-row walk, forward and reversed (f32, bf16, f64)", function()
    ember.manual_seed(34)
    for _, dt in ipairs({"f32", "bf16", "f64"}) do
      local acc = dt == "bf16" and "f32" or dt
      for _, shape in ipairs({{1300, 160}, {1300, 100}, {1300, 1030}}) do
        local x = (ember.randn(shape, {dtype = "f64"}) * 0.05 + 1):to(dt):cuda()
        local L = shape[1]
        for _, op in ipairs({"cumsum", "cumprod"}) do
          for _, reverse in ipairs({false, true}) do
            local rows, a = {}, nil
            for k = 0, L - 1 do
              local r = reverse and L - 1 - k or k
              local v = x:select(0, r):to(acc)
              a = a == nil and v or (op == "cumsum" and a + v or a * v)
              rows[r + 1] = a:to(dt)
            end
            local got
            if not reverse then got = x[op](x, 0)
            elseif op == "cumsum" then   -- cumsum's backward is the reversed scan
              local xl = x:detach(); xl.requires_grad = true
              xl:cumsum(0):backward(x)
              got = xl.grad
            else
              got = x:flip(0):cumprod(0):flip(0)
            end
            cmp.assert_same_bits(got, ember.stack(rows, 0),
              ("%s %s %s%s"):format(op, dt, table.concat(shape, "x"), reverse and " reversed" or ""))
          end
        end
      end
    end
  end)
end)

-- Column scans, the three paths (EMBER_SCAN_STRIP, read once a process: each
-- runs in a child): flow (the walker apart from the copies, named barriers
-- between them) and async must give the bits of v1 (scan_strips) for every
-- dtype. Shapes: a partial strip (200 columns), several strips and an outer
-- dim ((3, 1000, 96), dim 1), rows past several laps of either ring (2500),
-- a last tile of one row (L = 6 * 128 + 1 for flow's bf16 tiles, 769), sums,
-- products and reversed (cumsum's backward).
local COLS_CHILD = [[
local ember = require "ember"
local out = {}
for _, dt in ipairs({"f32", "bf16", "f16", "f64"}) do
  for k, shape in ipairs({{2500, 200}, {3, 1000, 96}, {769, 64}, {5, 32}}) do
    ember.manual_seed(80 + k)
    local d = #shape - 2
    local x = (ember.randn(shape, {device = "cuda"}) * 0.05 + 1):to(dt)
    local key = dt .. "_" .. k
    out["sum_" .. key] = x:cumsum(d):cpu()
    out["prod_" .. key] = x:cumprod(d):cpu()
    local xl = x:detach(); xl.requires_grad = true
    xl:cumsum(d):backward(x)   -- the reversed scan of x
    out["rev_" .. key] = xl.grad:cpu()
  end
end
ember.save(os.getenv("SCAN_SPEC_OUT"), out)
]]

describe("column scan paths on CUDA (EMBER_SCAN_STRIP)", function()
  after_each(function() H.remove_temps() end)

  it("flow and async give the bits of v1, sums, products and reversed (f32, bf16, f16, f64)", function()
    local got = cmp.mode_results(H, H.temp_file(COLS_CHILD, ".lua"), "EMBER_SCAN_STRIP", {"v1", "async", "flow"})
    assert.are.equal(4 * 4 * 3, cmp.assert_modes_agree(got, "v1", {"async", "flow"}))
  end)
end)
