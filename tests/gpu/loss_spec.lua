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

local TOL = {f32 = 1e-5, bf16 = 1e-2, f16 = 2.5e-3}

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

-- issue 12's fused losses (kernels/loss_bce.cu, kernels/loss_nll.cu) against
-- the CPU (which computes in double): f32 1e-5, bf16 1e-2 (compare.lua).
local function leaf(t, device)
  local c = t:detach():to(device)
  c.requires_grad = true
  return c
end

-- the loss and the gradients of every float input, on the CPU and on CUDA
local function both_devices(fn, inputs, g)
  local out = {}
  for k, dev in ipairs({"cpu", "cuda"}) do
    local ins = {}
    for i, x in ipairs(inputs) do
      ins[i] = (x.dtype == "f32" or x.dtype == "bf16" or x.dtype == "f64" or x.dtype == "f16") and leaf(x, dev) or x:to(dev)
    end
    local l = fn(table.unpack(ins))
    if g then l:backward(g:to({dtype = l.dtype, device = dev})) else l:backward() end
    out[k] = {l = l, ins = ins}
  end
  return out[1], out[2]
end

local function check_grads(c, g, rtol)
  for i, x in ipairs(c.ins) do
    if x.requires_grad then
      assert.equals("cuda:0", g.ins[i].grad.device)
      C.assert_close(g.ins[i].grad, x.grad, rtol, "gradient of input " .. i)
    end
  end
end

describe("binary_cross_entropy_with_logits on CUDA", function()
  for _, dt in ipairs {"f32", "bf16"} do
    it(dt .. ": 100003 elements (odd: vector tail), mean, pos_weight row and weight full", function()
      local x, y = randn({7, 14287}, dt, 4), (randn({7, 14287}, "f32") * 0.3 + 0.5):clamp(0, 1):to(dt)
      local pw, w = (randn({14287}, "f32"):abs() + 0.5):to(dt), (randn({7, 14287}, "f32"):abs() + 0.1):to(dt)
      local c, g = both_devices(function(a, b, p, q)
        return F.binary_cross_entropy_with_logits(a, b, {pos_weight = p, weight = q}) end, {x, y, pw, w})
      assert.equals(dt, g.l.dtype)
      C.assert_close(g.l, c.l, TOL[dt], "loss")
      check_grads(c, g, TOL[dt])
    end)
  end

  for _, dt in ipairs {"f32", "bf16"} do
    it(dt .. ": 2^22 + 7 elements (more blocks than stay resident: the occupancy-capped grid), mean and sum, repeatable", function()
      local x, y = randn({(1 << 22) + 7}, dt, 3), randn({(1 << 22) + 7}, "f32"):sigmoid():to(dt)
      for _, r in ipairs({"mean", "sum"}) do
        local c, g = both_devices(function(a, b) return F.binary_cross_entropy_with_logits(a, b, {reduction = r}) end, {x, y})
        C.assert_close(g.l, c.l, TOL[dt], r .. " loss")
        check_grads(c, g, TOL[dt])
        local again = F.binary_cross_entropy_with_logits(x:cuda(), y:cuda(), {reduction = r})
        assert.are.equal(g.l:item(), again:item(), r .. ": the same loss on a second run")
      end
      -- targets that need no gradient and no weights: the backward that computes dx alone
      local dx = {}
      for k, dev in ipairs({"cpu", "cuda"}) do
        local xl = leaf(x, dev)
        F.binary_cross_entropy_with_logits(xl, y:to(dev)):backward()
        dx[k] = xl.grad
      end
      assert.equals("cuda:0", dx[2].device)
      C.assert_close(dx[2], dx[1], TOL[dt], "dx alone")
    end)
  end

  it("f32: reduction none and sum, a scalar weight, upstream gradients", function()
    local x, y = randn({33, 65}, "f32", 10), randn({33, 65}, "f32"):sigmoid()
    local w = ember.tensor({0.7})
    for _, r in ipairs({"none", "sum"}) do
      local gup = r == "none" and randn({33, 65}, "f32") or ember.tensor(2.5)
      local c, g = both_devices(function(a, b, q) return F.binary_cross_entropy_with_logits(a, b, {weight = q, reduction = r}) end,
        {x, y, w}, gup)
      C.assert_close(g.l, c.l, 1e-5, r .. " loss")
      check_grads(c, g, 1e-5)
    end
  end)

  it("f32: views 4 bytes off 16-byte alignment take the element path and agree", function()
    local xb, yb = randn({4099}, "f32", 3):cuda(), randn({4099}, "f32"):sigmoid():cuda()
    local x, y = xb:narrow(0, 1, 4098), yb:narrow(0, 1, 4098)
    local got = F.binary_cross_entropy_with_logits(x, y, {reduction = "none"})
    C.assert_close(got, F.binary_cross_entropy_with_logits(x:cpu(), y:cpu(), {reduction = "none"}), 1e-5, "loss")
  end)

  it("f32: |x| = 1e4 stays finite, gradient sigmoid(x) - y", function()
    local x = ember.tensor({-1e4, -50, 0, 50, 1e4})
    local y = ember.tensor({0.5, 1, 0.25, 0, 0.5})
    local c, g = both_devices(function(a, b) return F.binary_cross_entropy_with_logits(a, b, {reduction = "none"}) end,
      {x, y}, ember.ones(5))
    C.assert_close(g.l, c.l, 1e-5, "loss")
    C.assert_close(g.ins[1].grad, c.ins[1].grad, 1e-5, "dx")
  end)

  it("the mean of no elements is NaN", function()
    local v = F.binary_cross_entropy_with_logits(ember.zeros(0):cuda(), ember.zeros(0):cuda()):item()
    assert.is_true(v ~= v)
  end)
end)

-- kernels/loss_diff.cu: one pass forward, one backward (dx and dy together).
describe("mse_loss and l1_loss on CUDA", function()
  for _, name in ipairs {"mse_loss", "l1_loss"} do
    for _, dt in ipairs {"f32", "bf16", "f16"} do
      it(name .. " " .. dt .. ": 100003 elements (odd: vector tail), mean and sum, both inputs differentiated", function()
        -- small enough that the f16 sum (~3e4 or ~4.5e4) stays below f16's 65504
        local x, y = randn({7, 14287}, dt, 0.5), randn({7, 14287}, dt, 0.25)
        local c, g = both_devices(function(a, b) return F[name](a, b) end, {x, y})
        assert.equals(dt, g.l.dtype)
        C.assert_close(g.l, c.l, TOL[dt], "mean")
        -- the gradients of the sum, 2 (x - y) or sign(x - y), are O(1) (the mean's, / n, would be
        -- below the tolerance's absolute floor)
        c, g = both_devices(function(a, b) return F[name](a, b, {reduction = "sum"}) end, {x, y})
        C.assert_close(g.l, c.l, TOL[dt], "sum")
        check_grads(c, g, TOL[dt])
      end)
    end

    it(name .. " f32: none and sum, target broadcast (C), upstream gradients", function()
      local x, y = randn({33, 65}, "f32", 3), randn({65}, "f32")
      for _, r in ipairs({"none", "sum"}) do
        local gup = r == "none" and randn({33, 65}, "f32") or ember.tensor(2.5)
        local c, g = both_devices(function(a, b) return F[name](a, b, {reduction = r}) end, {x, y}, gup)
        C.assert_close(g.l, c.l, 1e-5, r .. " loss")
        check_grads(c, g, 1e-5)
      end
    end)

    it(name .. " f64: sum of 2^20 elements against the CPU", function()
      local x, y = randn({1024, 1024}, "f64"), randn({1024, 1024}, "f64")
      local c, g = both_devices(function(a, b) return F[name](a, b, {reduction = "sum"}) end, {x, y})
      C.assert_close(g.l, c.l, 1e-12, "loss")
      check_grads(c, g, 1e-12)
    end)

    it(name .. " f32: views 4 bytes off 16-byte alignment take the element path and agree", function()
      local xb, yb = randn({4099}, "f32", 3):cuda(), randn({4099}, "f32"):cuda()
      local x, y = xb:narrow(0, 1, 4098), yb:narrow(0, 1, 4098)
      for _, r in ipairs({"none", "mean"}) do
        C.assert_close(F[name](x, y, {reduction = r}), F[name](x:cpu(), y:cpu(), {reduction = r}), 1e-5, r)
      end
    end)

    it(name .. " f32: the mean of 2^22 elements is the same bits on every call (fixed-order sum)", function()
      local x, y = randn({4096, 1024}, "f32"):cuda(), randn({4096, 1024}, "f32"):cuda()
      local a, b = F[name](x, y):item(), F[name](x, y):item()
      assert.equals(a, b)
    end)

    it(name .. ": the mean of no elements is NaN", function()
      local v = F[name](ember.zeros(0):cuda(), ember.zeros(0):cuda()):item()
      assert.is_true(v ~= v)
    end)
  end

  it("l1_loss: the gradient at x == y is 0, as on the CPU", function()
    local x = ember.tensor({1, -2, 3, 0.5, 7})
    local c, g = both_devices(function(a, b) return F.l1_loss(a, b, {reduction = "sum"}) end,
      {x, ember.tensor({1, 0, 3, 0, 7})})
    C.assert_close(g.ins[1].grad, c.ins[1].grad, 0, "dx")
    assert.same({0, -1, 0, 1, 0}, g.ins[1].grad:tolist())
  end)
end)

describe("nll_loss on CUDA", function()
  for _, dt in ipairs {"f32", "bf16"} do
    it(dt .. ": (8192, 1000) log-probs with weight, ignore_index, mean: loss, d input, d weight", function()
      local x = F.log_softmax(randn({8192, 1000}, "f32"), -1):to(dt)
      local t = targets({8192}, 1000)
      t = t:masked_fill(t:lt(50), -100)
      local w = (randn({1000}, "f32"):abs() + 0.5):to(dt)
      local c, g = both_devices(function(a, q, tt) return F.nll_loss(a, tt, {weight = q}) end, {x, w, t})
      C.assert_close(g.l, c.l, TOL[dt], "loss")
      check_grads(c, g, TOL[dt])
    end)
  end

  it("f32: (N, C, d) input read through the permuted view, i32 targets, none and sum", function()
    local x = randn({3, 5, 7, 2}, "f32")
    local t = targets({3, 7, 2}, 5, "i32")
    for _, r in ipairs({"none", "sum"}) do
      local gup = r == "none" and randn({3, 7, 2}, "f32") or ember.tensor(-1.5)
      local c, g = both_devices(function(a, tt) return F.nll_loss(a, tt, {reduction = r}) end, {x, t}, gup)
      C.assert_close(g.l, c.l, 1e-5, r .. " loss")
      check_grads(c, g, 1e-5)
    end
  end)

  it("f32: 3 classes (narrower than a vector) and a (C) input", function()
    local x, t = randn({5, 3}, "f32"), targets({5}, 3)
    local c, g = both_devices(function(a, tt) return F.nll_loss(a, tt) end, {x, t})
    C.assert_close(g.l, c.l, 1e-5, "loss")
    check_grads(c, g, 1e-5)
    local c1, g1 = both_devices(function(a, tt) return F.nll_loss(a, tt) end, {randn({9}, "f32"), ember.tensor(4, {dtype = "i64"})})
    C.assert_close(g1.l, c1.l, 1e-5, "(C) loss")
    check_grads(c1, g1, 1e-5)
  end)

  it("an out-of-range target makes the loss NaN (no host-side check on CUDA)", function()
    local v = F.nll_loss(randn({3, 4}, "f32"):cuda(), ember.tensor({1, 7, 2}, {dtype = "i64"}):cuda()):item()
    assert.is_true(v ~= v, "expected NaN, got " .. tostring(v))
  end)

  it("under autocast bf16 the loss is computed in f32 and returned in f32", function()
    local x, t = F.log_softmax(randn({16, 40}, "f32"), -1):to("bf16"), targets({16}, 40)
    local l = ember.autocast("bf16", function() return F.nll_loss(x:cuda(), t:cuda()) end)
    assert.equals("f32", l.dtype)
    C.assert_close(l, F.nll_loss(x:to("f32"), t), 1e-5, "autocast loss")
  end)
end)

-- (at the end: R's seeds of the cases above stay what they were)
describe("cross_entropy's mean/sum kernel on CUDA", function()
  -- the mean/sum kernel takes each thread's rows 4 at a time (1024 threads: 4096 rows a batch): 9221 rows
  -- run two full batches and a part-filled third, with ignored rows at every batch position and the
  -- (ignored-row-excluding) count in the mean; label smoothing adds the row sums
  for _, dt in ipairs {"f32", "bf16"} do
    for _, red in ipairs {"mean", "sum"} do
      it(dt .. ": (9221, 37) logits, label smoothing 0.1, ignore_index 3, " .. red .. ": loss matches the CPU, same bits twice", function()
        local N, V = 9221, 37
        local x = randn({N, V}, dt, 3)
        local tl = targets({N}, V):tolist()
        for i = 1, N, 997 do tl[i] = 3 end                        -- ignored rows spread over batches and lanes
        local t = ember.tensor(tl, {dtype = "i64"})
        local opts = {label_smoothing = 0.1, ignore_index = 3, reduction = red}
        local lc = F.cross_entropy(x, t, opts)
        local xg, tg = x:cuda(), t:cuda()
        local lg = F.cross_entropy(xg, tg, opts)
        close(lg, lc, TOL[dt], "loss")
        C.assert_close(F.cross_entropy(xg, tg, opts), lg, 0, "second run")
      end)
    end
  end
end)
