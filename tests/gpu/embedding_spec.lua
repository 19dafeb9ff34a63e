-- embedding_spec.lua (GPU) — embedding gather and its deterministic backward
-- on CUDA (kernels/embedding.cu) against the CPU reference.
--
-- Tolerance: none (embedding_bag's reasons are given above its cases below).
-- The forward is a copy, so it is bit-exact. The backward
-- sums each table row's output gradients in token order in f32 (f64 for
-- f64) and rounds once, exactly as the CPU's sequential scatter-add does, so
-- it is bit-exact against the CPU as well, and bit-identical across runs.
local ember = require "ember"
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "../lua/helpers.lua")
local F = ember.nn.functional

local function max_diff(got, want)
  local g, w = got:cpu():to("f64"), want:cpu():to("f64")
  assert.same(w.shape, g.shape)
  return (g - w):abs():max():item()
end

local R = H.seeded(3000)
local randn = R.randn
local function ids(shape, n, dtype) return R.randint(n, shape, dtype) end

describe("embedding on CUDA", function()
  assert.is_true(ember.cuda.is_available(), "the GPU specs need a CUDA device")

  for _, dt in ipairs {"f32", "bf16", "f64"} do
    for _, idt in ipairs {"i64", "i32"} do
      it(dt .. " table, " .. idt .. " ids (4, 37) into (1003, 67): forward is the exact gather", function()
        local w, i = randn({1003, 67}, dt), ids({4, 37}, 1003, idt)
        local r = F.embedding(i:cuda(), w:cuda())
        assert.same({4, 37, 67}, r.shape)
        assert.equals(dt, r.dtype)
        assert.equals(0, max_diff(r, F.embedding(i, w)))
      end)
    end
  end

  it("f32 rows of 16-byte multiples take the vector path: (512, 64) table", function()
    local w, i = randn({512, 64}), ids({300}, 512)
    assert.equals(0, max_diff(F.embedding(i:cuda(), w:cuda()), F.embedding(i, w)))
  end)

  for _, dt in ipairs {"f32", "bf16"} do
    it(dt .. ": backward with many repeated ids equals the CPU bit for bit", function()
      local w = randn({300, 67}, dt)
      local i = ids({8, 129}, 40)               -- 1032 tokens over 40 ids: ~26 repeats each
      local g = randn({8, 129, 67}, dt)
      local wc = w:clone(); wc.requires_grad = true
      local wg = w:cuda(); wg.requires_grad = true
      F.embedding(i, wc):backward(g)
      F.embedding(i:cuda(), wg):backward(g:cuda())
      assert.equals(dt, wg.grad.dtype)
      assert.equals(0, max_diff(wg.grad, wc.grad))
    end)
  end

  it("backward is bit-identical across two runs (one id repeated 5000 times)", function()
    local w = randn({5000, 96})
    local i = ids({6000}, 5000)
    i:narrow(0, 0, 5000):fill_(7)                -- heavy repeats of row 7
    local ig, g = i:cuda(), randn({6000, 96}):cuda()
    local wg = w:cuda(); wg.requires_grad = true
    F.embedding(ig, wg):backward(g)
    local first = wg.grad:clone()
    wg.grad = nil
    F.embedding(ig, wg):backward(g)
    assert.equals(0, max_diff(wg.grad, first))
    -- and it is the CPU's sum
    local wc = w:clone(); wc.requires_grad = true
    F.embedding(i, wc):backward(g:cpu())
    assert.equals(0, max_diff(first, wc.grad))
  end)

  -- v2 (scatter_rows_kernel): every row written once, no memset. Its
  -- gradient buffer comes from the caching allocator over a NaN-filled block
  -- of the same size, so a row it failed to write shows. The small model's
  -- shape (2048 tokens into 10000 x 768, one pass over the ids) and 8192
  -- tokens (four passes; a bf16 table through an f32 scratch), i64 and i32.
  for _, c in ipairs {{"f32", {4, 512}, "i64"}, {"bf16", {4, 512}, "i32"}, {"f32", {16, 512}, "i32"},
                      {"bf16", {16, 512}, "i64"}} do
    local dt, shape, idt = c[1], c[2], c[3]
    it(("%s (10000, 768) table, %s ids (%d, %d): every row written, the CPU's bits"):format(dt, idt, shape[1],
       shape[2]), function()
      local w, i = randn({10000, 768}, dt), ids(shape, 10000, idt)
      i:narrow(1, 0, 40):fill_(3)                -- a row repeated 40 times a sequence
      local g = randn({shape[1], shape[2], 768}, dt)
      do local junk = ember.full({10000, 768}, 0 / 0, {dtype = dt, device = "cuda"}); junk = nil end
      collectgarbage(); collectgarbage()
      local wg = w:cuda(); wg.requires_grad = true
      F.embedding(i:cuda(), wg):backward(g:cuda())
      local wc = w:clone(); wc.requires_grad = true
      F.embedding(i, wc):backward(g)
      assert.equals(dt, wg.grad.dtype)
      assert.equals(0, max_diff(wg.grad, wc.grad))
    end)
  end

  it("EMBER_EMBEDDING_BWD_OLD=1 (v1: memset + scatter_kernel) gives v2's bits", function()
    local script = H.temp(".lua")
    H.spit(script, [[
local ember = require "ember"
local F = ember.nn.functional
local out = {}
for k, c in ipairs({{"f32", {4, 512}, 768}, {"bf16", {16, 512}, 768}, {"f32", {8, 129}, 67}, {"f64", {3000}, 96}}) do
  ember.manual_seed(90 + k)
  local w = ember.randn({5000, c[3]}, {device = "cuda"}):to(c[1]); w.requires_grad = true
  local i = ember.randint(0, 5000, c[2]):cuda()
  local gshape = {table.unpack(c[2])}
  gshape[#gshape + 1] = c[3]
  F.embedding(i, w):backward(ember.randn(gshape, {device = "cuda"}):to(c[1]))
  out["g" .. k] = w.grad:cpu()
end
ember.save(os.getenv("SCAN_SPEC_OUT"), out)
]])
    local C = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "compare.lua")
    local got = C.mode_results(H, script, "EMBER_EMBEDDING_BWD_OLD", {"0", "1"})
    assert.equals(4, C.assert_modes_agree(got, "0", {"1"}))
    H.remove_temps()
  end)

  it("rows nobody looked up get a zero gradient", function()
    local wg = randn({50, 8}):cuda(); wg.requires_grad = true
    F.embedding(ember.tensor({3, 3, 9}, {dtype = "i64"}):cuda(), wg):sum():backward()
    local gr = wg.grad:cpu()
    assert.equals(0, gr:narrow(0, 0, 3):abs():sum():item())
    assert.equals(2 * 8, gr:select(0, 3):sum():item())
    assert.equals(8, gr:select(0, 9):sum():item())
    assert.equals(3 * 8, gr:abs():sum():item())
  end)

  it("an out-of-range id gives a NaN row (no host-side check on CUDA)", function()
    local r = F.embedding(ember.tensor({1, 99}, {dtype = "i64"}):cuda(), randn({10, 4}):cuda()):cpu()
    local bad = r:select(0, 1):tolist()
    for _, v in ipairs(bad) do assert.is_true(v ~= v, "expected NaN, got " .. tostring(v)) end
    local good = r:select(0, 0):tolist()
    for _, v in ipairs(good) do assert.is_true(v == v) end
  end)

  ---------------------------------------------------------------------------
  -- F.embedding_bag: one fused kernel (kernels/embedding.cu bag_fwd_kernel).
  -- Each bag's rows are added in id order in f32 and rounded once, so the
  -- reference below (f32 tensor adds on the CPU in the same order, then one
  -- rounding to the table's dtype) is bit-exact for "sum"; "mean" divides
  -- that f32 sum by the count (one correctly rounded f32 division) before
  -- rounding: also exact against the reference's f32 division.
  ---------------------------------------------------------------------------
  -- the kernel's order: acc = 0 + r0 + r1 + ... in f32, then / count (mean), then rounded to dt
  local function bag_ref(w, i2d, mode)
    local wf = w:to("f32")
    local B, L = i2d.shape[1], i2d.shape[2]
    local acc = ember.zeros(B, wf.shape[2])
    for l = 0, L - 1 do acc = acc + wf:index_select(0, i2d:select(1, l):contiguous()) end
    if mode == "mean" then acc = acc / ember.full({B, 1}, math.max(L, 1)) end
    return acc:to(w.dtype)
  end

  for _, dt in ipairs {"f32", "bf16"} do
    for _, mode in ipairs {"sum", "mean"} do
      for _, d in ipairs {512, 67} do                -- 67: the element (non-vector) path
        it(("embedding_bag %s %s over (64, 13) ids, d = %d: the id-order f32 sum, bit for bit"):format(dt, mode, d), function()
          local w, i = randn({1000, d}, dt), ids({64, 13}, 1000)
          local got = F.embedding_bag(i:cuda(), w:cuda(), nil, mode)
          assert.equals(dt, got.dtype)
          assert.same({64, d}, got.shape)
          assert.equals(0, max_diff(got, bag_ref(w, i, mode)))
          assert.equals(0, max_diff(F.embedding_bag(i:cuda(), w:cuda(), nil, mode), got))   -- run to run
        end)
      end
    end
  end

  it("embedding_bag with 1-D ids and offsets (an empty bag, i32 ids) matches the CPU's index_add path", function()
    local w = randn({200, 64})
    local i = ids({40}, 200, "i32")
    local offs = ember.tensor({0, 5, 5, 17, 39}, {dtype = "i64"})
    for _, mode in ipairs {"sum", "mean"} do
      local want = F.embedding_bag(i, w, offs, mode)          -- CPU: sequential index_add (f32 adds), / count
      local got = F.embedding_bag(i:cuda(), w:cuda(), offs:cuda(), mode)
      assert.same({5, 64}, got.shape)
      assert.equals(0, max_diff(got, want), mode)
      assert.equals(0, got:select(0, 1):abs():sum():item())   -- the empty bag is zeros
    end
  end)

  for _, mode in ipairs {"sum", "mean"} do
    it("embedding_bag " .. mode .. " backward equals the CPU composition (2-D and offsets)", function()
      local w, i = randn({300, 64}), ids({16, 9}, 40)    -- repeats across bags
      local g = randn({16, 64})
      local wc = w:clone(); wc.requires_grad = true
      local wg = w:cuda(); wg.requires_grad = true
      F.embedding_bag(i, wc, nil, mode):backward(g)
      F.embedding_bag(i:cuda(), wg, nil, mode):backward(g:cuda())
      -- sum: the same f32 adds in token order as embedding's backward; mean: g / count rounded once per id
      -- (the CPU's mean backward divides the same f32 values), then the same adds
      assert.equals(0, max_diff(wg.grad, wc.grad))
      local flat, offs = i:reshape({-1}), ember.tensor({0, 30, 30, 100}, {dtype = "i64"})
      local g2 = randn({4, 64})
      local wc2 = w:clone(); wc2.requires_grad = true
      local wg2 = w:cuda(); wg2.requires_grad = true
      F.embedding_bag(flat, wc2, offs, mode):backward(g2)
      F.embedding_bag(flat:cuda(), wg2, offs:cuda(), mode):backward(g2:cuda())
      -- the CPU: g / count (f32), index_add's backward gathers it per id, embedding's backward adds in token order
      assert.equals(0, max_diff(wg2.grad, wc2.grad), mode)
    end)
  end

  it("embedding_bag: an out-of-range id makes its bag NaN, the others stay exact", function()
    local w = randn({10, 8})
    local i = ember.tensor({{1, 2}, {3, 99}}, {dtype = "i64"})
    local r = F.embedding_bag(i:cuda(), w:cuda(), nil, "sum"):cpu()
    for _, v in ipairs(r:select(0, 1):tolist()) do assert.is_true(v ~= v, "expected NaN, got " .. tostring(v)) end
    assert.equals(0, max_diff(r:select(0, 0), w:select(0, 1) + w:select(0, 2)))
  end)
end)
