-- compact_spec.lua (GPU) — the tiled stream compaction of kernels/compact.cu
-- (masked_select, its backward, nonzero) against the CPU: sizes around the
-- 4096-element tile and the 32-element word, every element size (1, 2, 4 and
-- 8 bytes: the 16-byte vector paths), misaligned operands (the scalar path),
-- empty and full tiles, and ranks up to 5. Values are moved, not computed:
-- every comparison is exact. Run once more with EMBER_COMPACT=scan to check
-- the previous path, and with EMBER_COMPACT_LOOKBACK=0
-- EMBER_COMPACT_VOUT=0 for the tiles' first mark (mark_kernel + scan_tiles) and
-- output stores. The thirteenth session's ticket mark (EMBER_COMPACT_TICKET=1)
-- and the count read from mapped host memory (EMBER_COMPACT_MAPPED=1) are the
-- default; the last cases run a script under both values of each switch.
local ember = require "ember"
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "../lua/helpers.lua")

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
      local xh, xhc = xb:to("bf16"):narrow(0, o, n), xb:cuda():to("bf16"):narrow(0, o, n)   -- 2-byte x misaligned
      assert.equals(0, max_diff(xhc:masked_select(mc), xh:masked_select(m)), "bf16 offset " .. o)
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

  -- 2^25 + 12345 elements = 8196 tiles (an odd tile count, a partial last tile, several rounds of the ticket
  -- mark's warps and of its last block's tile scan), with runs of empty and full tiles
  it("masked_select and nonzero over 8196 tiles (an odd tile count, empty and full runs)", function()
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

  -- mark_tk_kernel: a warp a tile over a persistent grid of at most 4 blocks an SM (132 SMs: 4224 warps), the last
  -- block's scan of the tile counts in rounds of 4096. 4225 tiles + 7 elements: two rounds of the grid, two rounds of
  -- the scan, a partial last tile; a misaligned mask (the scalar path a tile) and results taken twice.
  it("masked_select and nonzero past the ticket mark's grid and scan rounds, twice, aligned or not", function()
    ember.manual_seed(28)
    local n = 4225 * 4096 + 7
    local mb = ember.rand(n + 1):lt(0.5)
    mb:narrow(0, 4096 * 4096 - 3, 4096 * 2):fill_(true)    -- full tiles across the scan's round boundary
    mb:narrow(0, 4224 * 4096 + 5, 4096):fill_(false)       -- an empty tile in the grid's second round
    local x = ember.randn(n):to("bf16")
    local xc, mbc = x:cuda(), mb:cuda()
    for _, o in ipairs({0, 1}) do
      local m, mc = mb:narrow(0, o, n), mbc:narrow(0, o, n)
      local want_sel, want_nz = x:masked_select(m), m:nonzero()
      local s1, s2 = xc:masked_select(mc), xc:masked_select(mc)
      assert.equals(0, max_diff(s1, want_sel), "offset " .. o)
      assert.equals(0, max_diff(s2, s1), "offset " .. o .. ": a second run")
      local z1, z2 = mc:nonzero(), mc:nonzero()
      assert.equals(0, max_diff(z1, want_nz), "offset " .. o)
      assert.equals(0, max_diff(z2, z1), "offset " .. o .. ": a second run")
    end
    local m2 = mb:narrow(0, 0, 65 * 8195 * 32):view(65, 8195, 32)   -- 3-D over 4161 tiles
    assert.equals(0, max_diff(m2:cuda():nonzero(), m2:nonzero()), "3-D")
    assert.same({0, 2}, ember.zeros(4099, 4097):cuda():nonzero().shape)
    assert.same({4099 * 4097, 2}, ember.ones(4099, 4097):cuda():nonzero().shape)
  end)

  -- The count read from a mapped host slot must wait for the mark: a stream with milliseconds of work queued
  -- before it (the spin gives up after 500 us and synchronizes the stream), and a side stream.
  it("nonzero and masked_select behind a long queue and on a side stream match the CPU", function()
    ember.manual_seed(29)
    local n = (1 << 20) + 3
    local m = ember.rand(n):lt(0.3)
    local x = ember.randn(n)
    local mc, xc = m:cuda(), x:cuda()
    local a = ember.randn(2048, 2048):cuda()
    for _ = 1, 30 do a = a:matmul(a):mul(1e-3) end   -- queued, not waited for
    assert.equals(0, max_diff(mc:nonzero(), m:nonzero()), "behind a queue")
    for _ = 1, 30 do a = a:matmul(a):mul(1e-3) end
    assert.equals(0, max_diff(xc:masked_select(mc), x:masked_select(m)), "behind a queue")
    local s = ember.cuda.Stream()
    s:wait_stream(ember.cuda.current_stream())
    local z, y = ember.cuda.stream(s, function() return mc:nonzero(), xc:masked_select(mc) end)
    ember.cuda.current_stream():wait_stream(s)
    assert.equals(0, max_diff(z, m:nonzero()), "side stream")
    assert.equals(0, max_diff(y, x:masked_select(m)), "side stream")
  end)

  -- The count is read on the host mid-op: under graph capture both ops fail as before the mapped slot (item's
  -- error), and the capture is discarded.
  it("nonzero and masked_select refuse a CUDA graph capture with item's error", function()
    local m = ember.rand(5000):lt(0.5):cuda()
    local x = ember.randn(5000):cuda()
    for _, fn in ipairs({function() return m:nonzero() end, function() return x:masked_select(m) end}) do
      local ok, err = pcall(ember.cuda.graph, fn, {warmup = 0})
      assert.is_false(ok)
      assert.matches("item: cannot run during CUDA graph capture", err)
      ember.cuda.synchronize()
    end
    assert.equals(0, max_diff(m:nonzero(), m:cpu():nonzero()), "after the refused captures")
  end)

  -- Both values of each thirteenth-session switch: the script compares every result with the CPU (an error: text
  -- on stderr, which switch_agrees refuses) and prints a digest of the results, which must not change.
  it("EMBER_COMPACT_TICKET, _MAPPED and _PF: 0 and 1 give the CPU's results and the same digests", function()
    local script = H.temp(".lua")
    H.spit(script, [[
      local e = require 'ember'
      e.manual_seed(30)
      local function digest(t)
        local v = t:cpu():to('f64'):reshape({-1})
        local k = e.arange(v:numel(), {dtype = 'f64'}):add(1)
        return ('%d:%.17g'):format(v:numel(), v:numel() > 0 and (v * k):sum():item() or 0)
      end
      local function same(got, want, what)
        local g, w = got:cpu():to('f64'), want:to('f64')
        assert(#g.shape == #w.shape and g:numel() == w:numel(), what .. ': shape')
        if g:numel() > 0 then assert((g - w):abs():max():item() == 0, what .. ': values') end
      end
      local out = {}
      for _, n in ipairs({1, 31, 4095, 4096, 4097, 9 * 4096 + 5, (1 << 21) + 333}) do
        for _, p in ipairs({0, 0.5, 1}) do
          local m = e.rand(n):lt(p)
          local mc = m:cuda()
          for _, dt in ipairs({'f32', 'bf16', 'f16', 'i64', 'bool'}) do
            local x = e.randn(n):mul(100):to(dt)
            local got = x:cuda():masked_select(mc)
            same(got, x:masked_select(m), ('masked_select n %d p %g %s'):format(n, p, dt))
            out[#out + 1] = digest(got)
          end
          local z = mc:nonzero()
          same(z, m:nonzero(), ('nonzero n %d p %g'):format(n, p))
          out[#out + 1] = digest(z)
          same(mc:nonzero(), z:cpu(), 'a second nonzero')
        end
      end
      local v = e.randn(3 * 5 * 7 * 4099):masked_fill(e.rand(3 * 5 * 7 * 4099):lt(0.5), 0)
      v:narrow(0, 3, 1):fill_(0 / 0)
      v:narrow(0, 4, 1):fill_(-0.0)
      for _, shape in ipairs({{3 * 5 * 7 * 4099}, {105, 4099}, {15, 7, 4099}, {3, 5, 7, 4099}}) do
        for _, dt in ipairs({'f32', 'bf16'}) do
          local t = v:view(shape):to(dt)
          local z = t:cuda():nonzero()
          same(z, t:nonzero(), ('nonzero %d-D %s'):format(#shape, dt))
          out[#out + 1] = digest(z)
        end
      end
      local x = e.randn(3 * 4096 + 11)
      x.requires_grad = true
      local m = e.rand(3 * 4096 + 11):lt(0.5)
      local xc = x:detach():cuda()
      xc.requires_grad = true
      local g = e.randn(m:sum():item())
      x:masked_select(m):backward(g)
      xc:masked_select(m:cuda()):backward(g:cuda())
      same(xc.grad, x.grad, 'backward')
      out[#out + 1] = digest(xc.grad)
      io.write(table.concat(out, ';'))]])
    H.switch_agrees(script, "EMBER_COMPACT_TICKET", {"1", "0"}, "2", 500)
    H.switch_agrees(script, "EMBER_COMPACT_MAPPED", {"1", "0"}, "2", 500)
    H.remove_temps()
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
