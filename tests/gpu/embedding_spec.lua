-- embedding_spec.lua (GPU) — embedding gather and its deterministic backward
-- on CUDA (kernels/embedding.cu) against the CPU reference.
--
-- Tolerance: none. The forward is a copy, so it is bit-exact. The backward
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
end)
