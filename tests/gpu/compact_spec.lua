-- compact_spec.lua (GPU) — the tiled stream compaction of kernels/compact.cu
-- (masked_select, its backward, nonzero) against the CPU: sizes around the
-- 4096-element tile and the 32-element word, every element size (1, 2, 4 and
-- 8 bytes: the 16-byte vector paths), misaligned operands (the scalar path),
-- empty and full tiles, and ranks up to 5. Values are moved, not computed:
-- every comparison is exact. Run once more with EMBER_COMPACT=scan to check
-- the previous path, with EMBER_COMPACT_LATESCAN=1 for the counting mark and
-- its one-block scan (opt-in), and with EMBER_COMPACT_LOOKBACK=0
-- EMBER_COMPACT_VOUT=0 for the tiles' first mark (mark_kernel + scan_tiles) and
-- output stores.
local ember = require "ember"

local function max_diff(got, want)
  local g, w = got:cpu():to("f64"), want:cpu():to("f64")
  assert.same(w.shape, g.shape)
  if g:numel() == 0 then return 0 end
  return (g - w):abs():max():item()
end

-- a mask with a run of empty tiles and a run of full tiles beside random ones
local function mask_of(n, p)
  local m = ember.rand(n):lt(p)
  if n > 3 * 4096 then
    m:narrow(0, 4096, 4096):fill_(false)
    m:narrow(0, 2 * 4096 + 7, 4096):fill_(true)
  end
  return m
end

describe("stream compaction on CUDA", function()
  assert.is_true(ember.cuda.is_available(), "the GPU specs need a CUDA device")

  it("masked_select at sizes around the tile and the word, every element size, matches the CPU exactly", function()
    ember.manual_seed(21)
    for _, n in ipairs({1, 31, 33, 4095, 4096, 4097, 3 * 4096 + 17, 5 * 4096, 262144 + 5}) do
      local x64 = ember.randn(n, {dtype = "f64"}):mul(100)
      for _, p in ipairs({0.5, 0.03, 0.97}) do
        local m = mask_of(n, p)
        for _, dt in ipairs({"f32", "bf16", "f64", "u8", "i64", "f16"}) do
          local x = x64:to(dt)
          local got = x:cuda():masked_select(m:cuda())
          assert.equals(0, max_diff(got, x:masked_select(m)), ("n %d p %g %s"):format(n, p, dt))
          assert.equals(dt, got.dtype)
        end
      end
    end
  end)

  it("masked_select and nonzero of misaligned and broadcast operands (the scalar path)", function()
    ember.manual_seed(22)
    local n = 3 * 4096 + 100
    local xb, mb = ember.randn(n + 3), ember.rand(n + 3):lt(0.4)
    for _, o in ipairs({1, 2, 3}) do
      local x, m = xb:narrow(0, o, n), mb:narrow(0, o, n)
      local xc, mc = xb:cuda():narrow(0, o, n), mb:cuda():narrow(0, o, n)
      assert.equals(0, max_diff(xc:masked_select(mc), x:masked_select(m)), "offset " .. o)
      assert.equals(0, max_diff(xc:masked_select(mb:cuda():narrow(0, 0, n)), x:masked_select(mb:narrow(0, 0, n))))
      assert.equals(0, max_diff(mc:nonzero(), m:nonzero()), "offset " .. o)
      assert.equals(0, max_diff(xc:nonzero(), x:nonzero()), "offset " .. o)
    end
    local x2, m2 = ember.randn(300, 1), ember.rand(1, 4099):lt(0.5)   -- both broadcast
    assert.equals(0, max_diff(x2:cuda():masked_select(m2:cuda()), x2:masked_select(m2)))
  end)

  it("nonzero of ranks 1 to 5 and every dtype, with empty and full tiles, matches the CPU exactly", function()
    ember.manual_seed(23)
    local v = ember.randn(5 * 4096 + 9):masked_fill(mask_of(5 * 4096 + 9, 0.5), 0)
    v:narrow(0, 3, 1):fill_(0 / 0)
    v:narrow(0, 4, 1):fill_(-0.0)
    for _, dt in ipairs({"f32", "bf16", "f16", "f64", "i64", "i32", "u16", "u8", "bool"}) do
      local vd = dt == "bool" and v:ne(0) or (dt:sub(1, 1) == "f" or dt == "bf16") and v:to(dt) or v:mul(3):to(dt)
      assert.equals(0, max_diff(vd:cuda():nonzero(), vd:nonzero()), dt)
    end
    for _, shape in ipairs({{4096 * 3 + 5}, {97, 211}, {7, 33, 65}, {3, 5, 7, 11}, {2, 3, 5, 7, 11}}) do
      local x = ember.randint(-1, 2, shape):to("f32")
      assert.equals(0, max_diff(x:cuda():nonzero(), x:nonzero()), #shape .. "-D")
    end
    assert.same({0, 2}, ember.zeros(4097, 3):cuda():nonzero().shape)
    assert.equals(0, max_diff(ember.ones(4097, 3):cuda():nonzero(), ember.ones(4097, 3):nonzero()))
  end)

  -- unique without inverse/counts marks run heads in the sorted values and
  -- compacts them (engine/ops/sort.c unique_heads_cuda); with them it takes
  -- the run-id path: both must give the CPU's values.
  it("unique's run-head compaction: integer keys narrowed or not, floats with NaN and -0, matches the CPU", function()
    ember.manual_seed(25)
    local cases = {
      ember.randint(0, 100000, {1 << 20}),                -- i32 keys
      ember.randint(-3, 200, {3 * 4096 + 5}),              -- u8 keys
      ember.randint(-(1 << 40), 1 << 40, {70001}),         -- not narrowed
      ember.randint(0, 5000, {70001}):to("i32"),
      ember.randint(0, 300, {50, 401}):to("bf16"),
    }
    local f = ember.randint(-50, 50, {20011}):to("f32"):mul(0.5)
    f:narrow(0, 0, 7):fill_(0 / 0)
    f:narrow(0, 7, 5):fill_(-0.0)
    cases[#cases + 1] = f
    -- equal values, NaN meeting NaN
    local function same(got, want, what)
      local a, b = got:cpu():to("f64"), want:cpu():to("f64")
      assert.same(b.shape, a.shape, what)
      local na, nb = a:ne(a), b:ne(b)
      assert.equals(0, (na:to("f64") - nb:to("f64")):abs():max():item(), what .. ": NaNs in other places")
      assert.equals(0, (a:masked_fill(na, 0) - b:masked_fill(nb, 0)):abs():max():item(), what)
    end
    for k, x in ipairs(cases) do
      local xc = x:cuda()
      local got = xc:unique()
      assert.equals(x.dtype, got.dtype)
      same(got, x:unique(), "case " .. k)
      same(got, xc:unique({return_inverse = true}), "case " .. k .. " against the run-id path")
    end
  end)

  -- mark_lb_kernel (EMBER_COMPACT_LOOKBACK=1): 4 tiles a block for a bool mask, 2 for 2-byte x, 1 for 4- and
  -- 8-byte x; 2^22 + 333 elements = 1025 tiles: hundreds of blocks (look-backs past a window of 32 blocks), a
  -- last block with one tile of its 4 or 2, and survivors' runs starting at every offset within 16 bytes (the
  -- vector stores of select_kernel, EMBER_COMPACT_VOUT=1)
  it("masked_select and nonzero over 1025 tiles (look-backs past 32 blocks, a partial last block)", function()
    ember.manual_seed(26)
    local n = (1 << 22) + 333
    local x64 = ember.randn(n, {dtype = "f64"}):mul(100)
    for _, p in ipairs({0.5, 0.002}) do
      local m = mask_of(n, p)
      local mc = m:cuda()
      for _, dt in ipairs({"f32", "bf16", "f64", "u8"}) do
        local x = x64:to(dt)
        assert.equals(0, max_diff(x:cuda():masked_select(mc), x:masked_select(m)), ("p %g %s"):format(p, dt))
      end
      assert.equals(0, max_diff(mc:nonzero(), m:nonzero()), ("p %g bool nonzero"):format(p))
      -- 2-D: rows shorter than a tile (a division a row) and at least a tile long (one a tile, coords_tiles)
      for _, rc in ipairs({{2053, 2043}, {1023, 4100}, {1024, 4096}, {511, 8193}}) do
        local m2 = m:narrow(0, 0, rc[1] * rc[2]):view(rc[1], rc[2])
        local what = ("p %g 2-D bool nonzero %dx%d"):format(p, rc[1], rc[2])
        assert.equals(0, max_diff(m2:cuda():nonzero(), m2:nonzero()), what)
      end
      local xz = x64:to("bf16"):masked_fill(m, 0)
      assert.equals(0, max_diff(xz:cuda():nonzero(), xz:nonzero()), ("p %g bf16 nonzero"):format(p))
      local xf = x64:to("f32"):masked_fill(m, 0)
      assert.equals(0, max_diff(xf:cuda():nonzero(), xf:nonzero()), ("p %g f32 nonzero"):format(p))
    end
  end)

  -- offsets_kernel (EMBER_COMPACT_LATESCAN=1, over 128 tiles; the 1025-tile case above takes it too): one block
  -- of 512 threads, each a run of per tiles (per even) in
  -- chunks of 8 pairs; 2^25 + 12345 elements = 8196 tiles: per 18, so two chunks a thread, a last pair cut
  -- short (an odd tile count) and threads past the end with nothing
  it("masked_select and nonzero over 8196 tiles (the tile scan's chunks and its odd last run)", function()
    ember.manual_seed(27)
    local n = (1 << 25) + 12345
    local m = ember.rand(n):lt(0.3)
    m:narrow(0, 4096 * 100, 4096 * 3):fill_(false)
    m:narrow(0, 4096 * 5000 + 1, 4096 * 2):fill_(true)
    local mc = m:cuda()
    assert.equals(0, max_diff(mc:nonzero(), m:nonzero()), "bool nonzero")
    local x = ember.randint(0, 250, {n}):to("u8")
    assert.equals(0, max_diff(x:cuda():masked_select(mc), x:masked_select(m)), "u8 masked_select")
    local xb = ember.randn(n):to("bf16")
    assert.equals(0, max_diff(xb:cuda():masked_select(mc), xb:masked_select(m)), "bf16 masked_select")
  end)

  it("masked_select's backward over several tiles and a broadcast x matches the CPU exactly", function()
    ember.manual_seed(24)
    for _, dt in ipairs({"f32", "bf16", "f64"}) do
      for _, case in ipairs({{{3 * 4096 + 11}, {3 * 4096 + 11}}, {{1, 4100}, {2, 4100}}}) do
        local x = ember.randn(case[1]):to(dt)
        local m = ember.rand(case[2]):lt(0.5)
        x.requires_grad = true
        local xc = x:detach():cuda()
        xc.requires_grad = true
        local y = x:masked_select(m)
        local g = ember.randn(y.shape):to(dt)
        y:backward(g)
        xc:masked_select(m:cuda()):backward(g:cuda())
        assert.equals(0, max_diff(xc.grad, x.grad), dt)
      end
    end
  end)
end)
