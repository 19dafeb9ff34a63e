-- loss_spec.lua (GPU) — fused softmax cross-entropy on CUDA
-- (kernels/softmax_xent.cu) against the CPU reference, forward and backward.
--
-- Error measure: ‖got − want‖ / ‖want‖ in f64 on the CPU. Tolerances:
--   * f32: 1e-5 — both compute in f32 with exp/log accurate to ~1 ulp; the
--     sums run in other orders (GPU: tree; CPU: sequential in double).
--   * bf16 logits: 1e-2 for dlogits (rounded once to bf16 on both sides, a
--     few roundings flip) and the loss (a bf16 scalar: 2^-8 relative).
local ember = require "ember"
local F = ember.nn.functional

local C, H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "compare.lua")
local rel, close = C.rel_error, C.assert_rel

local R = H.seeded(2000)
local randn = R.randn
local function targets(shape, V, dtype) return R.randint(V, shape, dtype) end

local TOL = {f32 = 1e-5, bf16 = 1e-2}

-- loss and dlogits on the CPU and on CUDA for the same logits/targets
local function both(logits, t, g)
  local xc = logits:clone(); xc.requires_grad = true
  local xg = logits:cuda(); xg.requires_grad = true
  local lc, lg = F.cross_entropy(xc, t), F.cross_entropy(xg, t:cuda())
  if g then lc:backward(ember.tensor(g, {dtype = lc.dtype})); lg:backward(ember.tensor(g, {dtype = lg.dtype}):cuda())
  else lc:backward(); lg:backward() end
  return lc, lg, xc.grad, xg.grad
end

describe("cross_entropy on CUDA", function()
  assert.is_true(ember.cuda.is_available(), "the GPU specs need a CUDA device")

  for _, dt in ipairs {"f32", "bf16"} do
    it(dt .. ": (67, 1003) logits, odd V: loss and dlogits match the CPU", function()
      local lc, lg, gc, gg = both(randn({67, 1003}, dt, 3), targets({67}, 1003))
      assert.equals("cuda:0", lg.device)
      assert.equals(dt, lg.dtype)
      assert.same({}, lg.shape)
      close(lg, lc, TOL[dt], "loss")
      assert.equals(dt, gg.dtype)
      close(gg, gc, TOL[dt], "dlogits")
    end)

    it(dt .. ": (8, 50257) logits (GPT-2 vocabulary: rows not 16-byte aligned)", function()
      local lc, lg, gc, gg = both(randn({8, 50257}, dt, 2), targets({8}, 50257))
      close(lg, lc, TOL[dt], "loss")
      close(gg, gc, TOL[dt], "dlogits")
    end)
  end

  it("f32: (2, 33, 517) logits with i32 targets, upstream gradient 2.5", function()
    local lc, lg, gc, gg = both(randn({2, 33, 517}, "f32", 4), targets({2, 33}, 517, "i32"), 2.5)
    close(lg, lc, 1e-5, "loss")
    close(gg, gc, 1e-5, "dlogits")
  end)

  it("f64 logits compute in f64", function()
    local lc, lg, gc, gg = both(randn({19, 77}, "f64", 3), targets({19}, 77))
    assert.equals("f64", lg.dtype)
    close(lg, lc, 1e-12, "loss")
    close(gg, gc, 1e-12, "dlogits")
  end)

  it("large logits (scale 1e3) stay finite: the max is subtracted", function()
    local lc, lg = both(randn({16, 300}, "f32", 1e3), targets({16}, 300))
    assert.is_true(lg:item() == lg:item() and math.abs(lg:item()) < math.huge)
    close(lg, lc, 1e-5, "loss")
  end)

  it("an out-of-range target makes the loss NaN (no host-side check on CUDA)", function()
    local t = ember.tensor({1, 5, 2}, {dtype = "i64"})
    local l = F.cross_entropy(randn({3, 5}, "f32"):cuda(), t:cuda())
    local v = l:item()
    assert.is_true(v ~= v, "expected NaN, got " .. tostring(v))
  end)

  it("under autocast bf16 the loss is computed in f32 and returned in f32", function()
    local x = randn({33, 211}, "bf16", 3)
    local t = targets({33}, 211)
    local l = ember.autocast("bf16", function() return F.cross_entropy(x:cuda(), t:cuda()) end)
    assert.equals("f32", l.dtype)
    close(l, F.cross_entropy(x:to("f32"), t), 1e-5, "autocast loss")
  end)
end)
