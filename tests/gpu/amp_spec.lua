-- amp_spec.lua (GPU) — ember.autocast on CUDA tensors: the ToyModel dtype
-- report, bf16 matmuls against the CPU's, the weight-cast cache inside a
-- region, autocast inside a captured graph, and the TF32 switch.
local ember = require "ember"
local F = ember.nn.functional
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local toy = dofile(here .. "../../scripts/lib/amp_toy.lua")

assert(ember.cuda.is_available(), "tests/gpu needs a CUDA device (run with EMBER_TEST_GPU=1 on a GPU host)")

-- ‖a − b‖ / ‖b‖ in f64 on the CPU.
local function rel(a, b)
  a, b = a:to({device = "cpu", dtype = "f64"}), b:to({device = "cpu", dtype = "f64"})
  local d = (a - b):pow(2):sum():sqrt():item()
  local n = b:pow(2):sum():sqrt():item()
  return d / (n > 0 and n or 1)
end

describe("ember.autocast dtype report (CUDA)", function()
  it("gives the ToyModel's parameters f32, fc1 bf16, norm f32, logits bf16, loss f32, grads f32", function()
    assert.are.same(toy.expected_report, toy.dtype_report("cuda", "bf16"))
  end)
end)

describe("ember.autocast numerics (CUDA)", function()
  it("computes a matmul as the CUDA matmul of bf16-rounded inputs, bit for bit", function()
    local a, b = ember.randn({96, 200}, {device = "cuda"}), ember.randn({200, 72}, {device = "cuda"})
    local c = ember.autocast("bf16", function() return a:matmul(b) end)
    assert.are.equal("bf16", c.dtype)
    assert.are.equal("cuda:0", c.device)
    local ref = a:to("bf16"):matmul(b:to("bf16"))
    assert.are.equal(0, (c:float() - ref:float()):abs():max():item())
  end)

  -- cuBLASLt and the CPU path both accumulate in f32 and round once to bf16,
  -- in different orders: outputs differ by at most about one bf16 ulp (2^-8
  -- relative), so 1e-2 norm-wise catches any real error (f32 inputs not
  -- rounded, f16 instead of bf16, a missing transpose) without flaking.
  it("matches the CPU's autocast matmul within bf16 rounding", function()
    local a, b = ember.randn(64, 512), ember.randn(512, 48)
    local cpu = ember.autocast("bf16", function() return a:matmul(b) end)
    local gpu = ember.autocast("bf16", function() return a:cuda():matmul(b:cuda()) end)
    assert.is_true(rel(gpu, cpu) < 1e-2, tostring(rel(gpu, cpu)))
    -- and the inputs really were rounded: the f32 product is further away
    -- than the two bf16 results are from each other
    assert.is_true(rel(gpu, a:matmul(b)) > rel(gpu, cpu) / 4)
  end)

  it("computes F.linear on (B, T, in) x (out, in) like the CPU", function()
    local x, w = ember.randn(3, 17, 64), ember.randn(40, 64)
    local cpu = ember.autocast("bf16", function() return F.linear(x, w) end)
    local gpu = ember.autocast("bf16", function() return F.linear(x:cuda(), w:cuda()) end)
    assert.are.equal("bf16", gpu.dtype)
    assert.are.same({3, 17, 40}, gpu.shape)
    assert.is_true(rel(gpu, cpu) < 1e-2, tostring(rel(gpu, cpu)))
  end)

  it("sends f32 gradients to f32 CUDA weights, matching the CPU's", function()
    local function grad_of(device)
      ember.manual_seed(11)
      local w = ember.randn({32, 64}, {device = device})
      w.requires_grad = true
      local x = ember.randn({16, 64}, {device = device})
      local y = ember.autocast("bf16", function() return F.linear(x, w) end)
      local l = (y:float() * y:float()):sum()
      l:backward()
      return w.grad
    end
    local g_gpu, g_cpu = grad_of("cuda"), grad_of("cpu")
    assert.are.equal("f32", g_gpu.dtype)
    assert.is_true(rel(g_gpu, g_cpu) < 1e-2, tostring(rel(g_gpu, g_cpu)))
  end)

  -- The CUDA autocast linear writes f32 gradients straight from cuBLASLt's
  -- f32 accumulators: they equal the f64 products of the bf16 operands to
  -- f32 accuracy (a bf16-rounded result would be ~4e-3 away).
  it("gives f32 inputs f32 gradients of the bf16 operands, unrounded", function()
    ember.manual_seed(5)
    local x = ember.randn({4, 24, 96}, {device = "cuda", requires_grad = true})
    local w = ember.randn({80, 96}, {device = "cuda", requires_grad = true})
    local go = ember.randn({4, 24, 80}, {device = "cuda"}):to("bf16")
    local y = ember.autocast("bf16", function() return F.linear(x, w) end)
    y:backward(go)
    assert.are.equal("f32", x.grad.dtype)
    assert.are.equal("f32", w.grad.dtype)
    local g64 = go:to({device = "cpu", dtype = "f64"}):reshape({96, 80})
    local x64 = x:to("bf16"):to({device = "cpu", dtype = "f64"}):reshape({96, 96})
    local w64 = w:to("bf16"):to({device = "cpu", dtype = "f64"})
    local gx_ref, gw_ref = g64:matmul(w64):reshape({4, 24, 96}), g64:t():matmul(x64)
    assert.is_true(rel(x.grad, gx_ref) < 1e-5, tostring(rel(x.grad, gx_ref)))
    assert.is_true(rel(w.grad, gw_ref) < 1e-5, tostring(rel(w.grad, gw_ref)))
  end)

  it("gives a bf16 input a bf16 gradient and sums q/k/v-style gradients of one activation", function()
    ember.manual_seed(6)
    local h = ember.randn({32, 64}, {device = "cuda", requires_grad = true})
    local xb = ember.randn({32, 64}, {device = "cuda"}):to("bf16")
    xb.requires_grad = true
    local ws = {}
    for i = 1, 3 do ws[i] = ember.randn({48, 64}, {device = "cuda", requires_grad = true}) end
    local loss = ember.autocast("bf16", function()
      local a = h * 1          -- a non-leaf activation, shared by three projections
      local s = F.linear(xb, ws[1]):float():sum()
      for i = 1, 3 do s = s + (F.linear(a, ws[i]):float() * i):sum() end
      return s
    end)
    loss:backward()
    assert.are.equal("bf16", xb.grad.dtype)
    -- d/dh of sum_i i * sum(h W_iᵀ) = sum_i i * colsum(W_i) on every row (bf16 W)
    local ref = ember.zeros({64}, {dtype = "f64"})
    for i = 1, 3 do ref = ref + ws[i]:to("bf16"):to({device = "cpu", dtype = "f64"}):sum(0) * i end
    local got = h.grad:to({device = "cpu", dtype = "f64"})
    for _, r in ipairs({0, 31}) do
      local row = got:select(0, r)
      assert.is_true(rel(row, ref) < 1e-5, tostring(rel(row, ref)))
    end
  end)

  it("casts an activation again after an in-place update between two linears", function()
    local w = ember.randn({16, 64}, {device = "cuda", requires_grad = true})
    local h = ember.randn({8, 64}, {device = "cuda", requires_grad = true})
    ember.autocast("bf16", function()
      local a = h * 1
      local y1 = F.linear(a, w)
      ember.no_grad(function() a:mul_(2) end)
      local y2 = F.linear(a, w)
      assert.are.equal(0, (y2:float() - y1:float() * 2):abs():max():item())
    end)
  end)

  it("keeps no activation or constant alive through an inference forward (no_grad)", function()
    -- frozen weights (no requires_grad) are cast per use, as in PyTorch
    local ws = {}
    for i = 1, 8 do ws[i] = ember.randn({1024, 1024}, {device = "cuda"}) end
    local x = ember.randn({512, 1024}, {device = "cuda"})
    local function forward()
      return ember.no_grad(function()
        return ember.autocast("bf16", function()
          local h = x:clone()
          for i = 1, 8 do
            -- every intermediate is closed as soon as it is dead: what stays
            -- alive is what the autocast caches hold
            local prev <close> = h
            local y1 <close> = F.linear(prev, ws[i])
            local a <close> = y1:float()              -- a fresh f32 activation per layer
            local y2 <close> = F.linear(a, ws[i])      -- `a` feeds the next layer too
            local y2f <close> = y2:float()
            h = a + y2f
          end
          return h:sum():item()
        end)
      end)
    end
    forward()
    collectgarbage()
    ember.cuda.synchronize()
    ember.cuda.reset_peak_memory_stats()
    local before = ember.cuda.memory_allocated()
    forward()
    local peak = ember.cuda.max_memory_allocated() - before
    -- one f32 activation is 2 MiB: a layer's working set is ~11 MiB, and the
    -- 4 recent-cast slots may hold at most 4 x 3 MiB more (a dead activation
    -- and its bf16 copy each): under 24 MiB. Caching every cast activation
    -- and weight for the region would add ~8 MiB a layer (~70 MiB here).
    assert.is_true(peak < 24 * 2 ^ 20, ("peak above the start: %.1f MiB"):format(peak / 2 ^ 20))
  end)

  it("casts a CUDA weight again after an in-place update inside the region", function()
    local w = ember.randn({64, 64}, {device = "cuda"})
    w.requires_grad = true
    local x = ember.randn({2, 64}, {device = "cuda"})
    ember.autocast("bf16", function()
      local y1 = F.linear(x, w)
      ember.no_grad(function() w:mul_(2) end)
      local y2 = F.linear(x, w)
      assert.are.equal(0, (y2:float() - y1:float() * 2):abs():max():item())
    end)
  end)

  it("captures an autocast forward in a CUDA graph and replays it", function()
    local w = ember.randn({128, 256}, {device = "cuda"})
    w.requires_grad = true
    local x = ember.randn({8, 256}, {device = "cuda"})
    local y
    local g = ember.cuda.graph(function()
      y = ember.autocast("bf16", function() return F.linear(x, w) end)
    end)
    g:replay()
    local first = y:float():clone()
    x:copy_(ember.randn({8, 256}, {device = "cuda"}))
    g:replay()
    local eager = ember.autocast("bf16", function() return F.linear(x, w) end)
    assert.are.equal("bf16", y.dtype)
    assert.are.equal(0, (y:float() - eager:float()):abs():max():item())
    assert.is_true((y:float() - first):abs():max():item() > 0)
  end)
end)

describe("ember.backends.tf32 on CUDA", function()
  after_each(function() ember.backends.tf32(false) end)

  -- K = 4096 random products: exact f32 lands near 1e-7 of the f64 result,
  -- TF32 (10-bit mantissa inputs) near 1e-4..1e-3.
  local function f32_matmul_error()
    local a = ember.randn({256, 4096}, {device = "cuda"})
    local b = ember.randn({4096, 256}, {device = "cuda"})
    local exact = a:to("f64"):matmul(b:to("f64"))
    return rel(a:matmul(b), exact)
  end

  it("keeps f32 matmuls exact f32 by default", function()
    assert.is_false(ember.backends.tf32())
    local e = f32_matmul_error()
    assert.is_true(e < 1e-5, tostring(e))
  end)

  it("uses TF32 tensor cores for f32 matmuls when switched on", function()
    ember.backends.tf32(true)
    local e = f32_matmul_error()
    assert.is_true(e > 1e-5 and e < 5e-3, tostring(e))
  end)
end)

describe("an autocast linear's weight gradient into an existing .grad (CUDA)", function()
  -- the gemm adds into the .grad in place (beta = 1): DDP's bucket views and
  -- accumulated micro-batches need no separate add and no second buffer
  local function setup()
    ember.manual_seed(7)
    local x = ember.randn({6, 40}, {device = "cuda"})
    local w = ember.randn({24, 40}, {device = "cuda", requires_grad = true})
    local function step()
      local y = ember.autocast("bf16", function() return F.linear(x, w) end)
      y:float():pow(2):sum():backward()
    end
    return w, step
  end

  it("adds into a .grad that is a view into a larger buffer, keeping the view", function()
    local w, step = setup()
    step()
    local fresh = w.grad:clone()
    local buf = ember.zeros({2000}, {device = "cuda"})
    local view = buf:narrow(0, 100, 24 * 40):view(24, 40)
    view:copy_(fresh * 0.5)
    w.grad = view
    step()
    assert.are.equal(view:data_ptr(), w.grad:data_ptr(), "the gradient stays the bucket view")
    assert.is_true(rel(w.grad, fresh * 1.5) < 1e-6, tostring(rel(w.grad, fresh * 1.5)))
    assert.are.equal(0, buf:narrow(0, 0, 100):abs():sum():item(), "nothing written before the view")
    assert.are.equal(0, buf:narrow(0, 100 + 24 * 40, 2000 - 100 - 24 * 40):abs():sum():item(),
      "nothing written after the view")
  end)

  it("accumulates micro-batches like separate adds, and leaves other leaves alone", function()
    local w, step = setup()
    step()
    local once = w.grad:clone()
    step(); step()
    assert.is_true(rel(w.grad, once * 3) < 1e-6, tostring(rel(w.grad, once * 3)))
  end)
end)
