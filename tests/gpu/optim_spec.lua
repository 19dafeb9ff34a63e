-- optim_spec.lua (GPU) — the fused multi-tensor AdamW and SGD steps, the
-- capturable AdamW (step and lr in device memory), sum_of_squares and
-- clip_grad_norm on CUDA (kernels/adamw.cu) against the CPU reference.
--
-- Tolerance: 1e-6 relative (‖got − want‖ / ‖want‖, f64 on the CPU). The GPU
-- kernels do the CPU's per-element arithmetic operation for operation with
-- FMA contraction disabled, so the states are expected to agree to the bit;
-- 1e-6 leaves room only for the scalar factors (bias corrections), which the
-- capturable variant forms from pow() on the device instead of the host.
local ember = require "ember"
local nn, optim = ember.nn, ember.optim
local core = ember.core

local C, H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "compare.lua")
local rel, close = C.rel_error, C.assert_rel

local randn = H.seeded(7000).randn

local SHAPES = {{37, 53}, {29}, {70001}, {3, 5, 7}}   -- 70001: two 64Ki chunks, odd tail

-- CPU parameters and CUDA twins
local function twins(dtype)
  local pc, pg = {}, {}
  for i, s in ipairs(SHAPES) do
    local p = randn(s, dtype)
    pc[i] = p:clone(); pc[i].requires_grad = true
    pg[i] = p:cuda(); pg[i].requires_grad = true
  end
  return pc, pg
end

local function fresh_grads(pc, pg)
  for i = 1, #pc do
    local g = randn(pc[i].shape, pc[i].dtype)
    pc[i].grad = g
    pg[i].grad = g:cuda()
  end
end

describe("AdamW on CUDA", function()
  assert.is_true(ember.cuda.is_available(), "the GPU specs need a CUDA device")

  for _, dt in ipairs {"f32", "f64"} do
    it(dt .. ": 5 steps of optim.AdamW match the CPU (weight decay, odd sizes)", function()
      local pc, pg = twins(dt)
      local oc = optim.AdamW(pc, {lr = 1e-2, weight_decay = 0.1, betas = {0.9, 0.95}})
      local og = optim.AdamW(pg, {lr = 1e-2, weight_decay = 0.1, betas = {0.9, 0.95}})
      for _ = 1, 5 do
        fresh_grads(pc, pg)
        oc:step(); og:step()
      end
      for i = 1, #pc do
        close(pg[i], pc[i], 1e-6, "param " .. i)
        close(og.state[pg[i]].exp_avg, oc.state[pc[i]].exp_avg, 1e-6, "exp_avg " .. i)
        close(og.state[pg[i]].exp_avg_sq, oc.state[pc[i]].exp_avg_sq, 1e-6, "exp_avg_sq " .. i)
      end
      local sd = og:state_dict()
      assert.equals(5, sd.state[1].step)
      assert.equals("integer", math.type(sd.state[1].step))
    end)
  end

  it("the capturable kernel (device step and lr) matches the host-step kernel", function()
    local _, pa = twins("f32")
    local pb = {}
    for i = 1, #pa do pb[i] = pa[i]:clone() end
    local function zl(t) local z = {}; for i, x in ipairs(t) do z[i] = ember.zeros_like(x) end; return z end
    local ma, va, mb, vb = zl(pa), zl(pa), zl(pb), zl(pb)
    local steps = {}
    for i = 1, #pa do steps[i] = ember.tensor(0, {dtype = "f32"}):cuda() end
    local lr_t = ember.tensor(3e-3, {dtype = "f64"}):cuda()
    ember.no_grad(function()
      for s = 1, 4 do
        local grads = {}
        for i = 1, #pa do grads[i] = randn(pa[i].shape):cuda() end
        core.adamw_(pb, grads, mb, vb, 3e-3, 0.9, 0.999, 1e-8, 0.01, s)
        core.adamw_capturable_(pa, grads, ma, va, steps, lr_t, 999, 0.9, 0.999, 1e-8, 0.01)
      end
    end)
    for i = 1, #pa do
      assert.equals(4, steps[i]:item())
      close(pa[i], pb[i], 1e-6, "param " .. i)
      close(ma[i], mb[i], 1e-6, "exp_avg " .. i)
      close(va[i], vb[i], 1e-6, "exp_avg_sq " .. i)
    end
  end)

  it("a captured step replays with the right bias corrections (ember.cuda.graph)", function()
    local p0, g0 = randn({1001}), randn({1001})
    local function param(dev)
      local p = dev == "cpu" and p0:clone() or p0:cuda()
      p.requires_grad = true
      p.grad = dev == "cpu" and g0:clone() or g0:cuda()
      return p
    end
    local pa, pb, pc = param("cuda"), param("cuda"), param("cpu")
    local oa = optim.AdamW({pa}, {lr = 1e-2, weight_decay = 0.1})
    local ob = optim.AdamW({pb}, {lr = 1e-2, weight_decay = 0.1})
    local oc = optim.AdamW({pc}, {lr = 1e-2, weight_decay = 0.1})
    local graph = ember.cuda.graph(function() oa:step() end, {warmup = 1})   -- one eager step
    for _ = 1, 3 do graph:replay() end                                       -- three replays
    for _ = 1, 4 do ob:step(); oc:step() end
    ember.cuda.synchronize()
    assert.equals(4, oa:state_dict().state[1].step)
    assert.equals(0, rel(pa, pb))
    close(pa, pc, 1e-6, "captured vs CPU")
  end)
end)

describe("SGD on CUDA", function()
  for _, o in ipairs {{lr = 0.1}, {lr = 0.05, momentum = 0.9, weight_decay = 0.01}} do
    it(string.format("3 steps (momentum %g) match the CPU", o.momentum or 0), function()
      local pc, pg = twins("f32")
      local oc, og = optim.SGD(pc, o), optim.SGD(pg, o)
      for _ = 1, 3 do
        fresh_grads(pc, pg)
        oc:step(); og:step()
      end
      for i = 1, #pc do close(pg[i], pc[i], 1e-6, "param " .. i) end
    end)
  end
end)

describe("sum_of_squares and clip_grad_norm on CUDA", function()
  for _, dt in ipairs {"f32", "bf16"} do
    it(dt .. ": sum_of_squares over a list matches the CPU, result a 0-d f32 on the device", function()
      local ts, tg = {}, {}
      for i, s in ipairs(SHAPES) do ts[i] = randn(s, dt); tg[i] = ts[i]:cuda() end
      local r = core.sum_of_squares(tg)
      assert.equals("cuda:0", r.device)
      assert.equals("f32", r.dtype)
      close(r, core.sum_of_squares(ts), 1e-6, "sum of squares")
    end)
  end

  it("clip_grad_norm clips like the CPU and returns the norm as a 0-d device tensor", function()
    local pc, pg = twins("f32")
    fresh_grads(pc, pg)
    local nc = nn.utils.clip_grad_norm(pc, 1.0)
    local ng = nn.utils.clip_grad_norm(pg, 1.0)
    assert.equals("number", type(nc))
    assert.equals("cuda:0", ng.device)
    assert.same({}, ng.shape)
    assert.is_true(nc > 1.0)
    assert.is_true(math.abs(ng:item() - nc) <= 1e-6 * nc, string.format("norm %.9g vs %.9g", ng:item(), nc))
    for i = 1, #pc do close(pg[i].grad, pc[i].grad, 1e-6, "clipped grad " .. i) end
    close(core.sum_of_squares({pg[1].grad, pg[2].grad, pg[3].grad, pg[4].grad}):sqrt(),
      ember.tensor(1.0), 1e-5, "norm after clipping")
  end)

  it("clip_grad_norm leaves gradients untouched below max_norm", function()
    local _, pg = twins("f32")
    local before = {}
    for i = 1, #pg do pg[i].grad = randn(pg[i].shape):cuda(); before[i] = pg[i].grad:clone() end
    local n = nn.utils.clip_grad_norm(pg, 1e6)
    assert.is_true(n:item() > 0)
    for i = 1, #pg do assert.equals(0, rel(pg[i].grad, before[i])) end
  end)
end)
