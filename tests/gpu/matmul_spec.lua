-- matmul_spec.lua (GPU) — matmul, linear and composed attention on CUDA
-- (cuBLASLt, kernels/matmul.cu) against the CPU reference, forward and
-- backward, on fresh random inputs.
--
-- Error measure: ‖got − want‖ / ‖want‖ over the whole result, in f64 on the
-- CPU (METHOD.md). Tolerances, and why:
--   * f32 vs an f64 reference: 1e-5 — f32 accumulation over k <= 1024 lands
--     near 1e-7·sqrt(k); TF32 would be ~3e-4, so this also proves TF32 is off.
--   * TF32 on: between 2e-5 and 3e-3 — it must be clearly less accurate than
--     f32 (TF32 really engaged) and still ~1e-3.
--   * bf16/f16 vs the CPU's bf16/f16 result (both f32 accumulation, one
--     rounding): 1e-2 — the two differ by the accumulation order only, which
--     flips a few output roundings (2^-8 relative each).
--   * f64: 1e-12.
local ember = require "ember"
local F = ember.nn.functional

local C, H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "compare.lua")
local rel, close = C.rel_error, C.assert_rel

local randn = H.seeded(1000).randn

-- a (CPU) and its CUDA twin, both leaves that require grad when asked
local function pair(shape, dtype, grad)
  local c = randn(shape, dtype)
  local g = c:cuda()
  if grad then c.requires_grad = true; g.requires_grad = true end
  return c, g
end

local TOL = {f32 = 1e-5, bf16 = 1e-2, f16 = 1e-2, f64 = 1e-12}

describe("matmul on CUDA", function()
  assert.is_true(ember.cuda.is_available(), "the GPU specs need a CUDA device")

  for _, dt in ipairs {"f32", "bf16", "f16", "f64"} do
    it(dt .. ": (37, 53) @ (53, 29), odd sizes, matches the CPU", function()
      local a, ag = pair({37, 53}, dt)
      local b, bg = pair({53, 29}, dt)
      local r = ag:matmul(bg)
      assert.equals("cuda:0", r.device)
      assert.equals(dt, r.dtype)
      close(r, a:matmul(b), TOL[dt], dt)
    end)
  end

  it("f32 against an f64 reference stays at f32 accuracy (TF32 off by default)", function()
    local a, ag = pair({256, 1024}, "f32")
    local b, bg = pair({1024, 192}, "f32")
    local want = a:to("f64"):matmul(b:to("f64"))
    close(ag:matmul(bg), want, 1e-5, "f32")
  end)

  it("TF32 on gives ~1e-3, clearly coarser than f32; off restores f32", function()
    local a, ag = pair({256, 1024}, "f32")
    local b, bg = pair({1024, 192}, "f32")
    local want = a:to("f64"):matmul(b:to("f64"))
    local prev = ember.backends.tf32(true)
    local ok, r = pcall(function() return ag:matmul(bg) end)
    ember.backends.tf32(prev)
    assert.is_true(ok, tostring(r))
    local e = rel(r, want)
    assert.is_true(e > 2e-5 and e < 3e-3, string.format("TF32 relative error %.3g not in (2e-5, 3e-3)", e))
    close(ag:matmul(bg), want, 1e-5, "f32 after TF32 off")
  end)

  for _, dt in ipairs {"f32", "bf16"} do
    it(dt .. ": transposed views aᵀ @ b, a @ bᵀ, aᵀ @ bᵀ", function()
      local a, ag = pair({53, 37}, dt)
      local b, bg = pair({29, 53}, dt)
      local at, agt = a:transpose(0, 1), ag:transpose(0, 1)
      local bt, bgt = b:transpose(0, 1), bg:transpose(0, 1)
      close(agt:matmul(bg:transpose(0, 1):contiguous()), at:matmul(bt:contiguous()), TOL[dt], "aT @ b")
      local c, cg = pair({37, 53}, dt)
      close(cg:matmul(bgt), c:matmul(bt), TOL[dt], "a @ bT")
      local d, dg = pair({29, 53}, dt)
      close(agt:matmul(dg:transpose(0, 1)), at:matmul(d:transpose(0, 1)), TOL[dt], "aT @ bT")
    end)
  end

  it("reads transposed operands in place: peak memory grows by the output only", function()
    local _, ag = pair({1024, 512}, "f32")        -- 2 MiB
    local _, bg = pair({256, 1024}, "f32")        -- 1 MiB
    ag:transpose(0, 1):matmul(bg:transpose(0, 1)) -- warm-up (workspace, plans)
    ember.cuda.synchronize()
    ember.cuda.reset_peak_memory_stats()
    local before = ember.cuda.memory_allocated()
    local r = ag:transpose(0, 1):matmul(bg:transpose(0, 1))   -- (512, 256) f32 = 512 KiB
    ember.cuda.synchronize()
    local grown = ember.cuda.max_memory_allocated() - before
    assert.same({512, 256}, r.shape)
    assert.is_true(grown <= 512 * 256 * 4 + 4096,
      string.format("peak grew by %d bytes; the output is %d (a copy of an operand would add >= 1 MiB)",
        grown, 512 * 256 * 4))
  end)

  for _, dt in ipairs {"f32", "bf16"} do
    it(dt .. ": batched (4, 3, 37, 53) @ (4, 3, 53, 29)", function()
      local a, ag = pair({4, 3, 37, 53}, dt)
      local b, bg = pair({4, 3, 53, 29}, dt)
      close(ag:matmul(bg), a:matmul(b), TOL[dt], "batched")
    end)

    it(dt .. ": a shared right operand folds into one gemm, (4, 3, 37, 53) @ (53, 29)", function()
      local a, ag = pair({4, 3, 37, 53}, dt)
      local b, bg = pair({53, 29}, dt)
      close(ag:matmul(bg), a:matmul(b), TOL[dt], "folded")
    end)

    it(dt .. ": broadcast batch dims (4, 1, 37, 53) @ (1, 3, 53, 29) and (3, 37, 53) @ (2, 3, 53, 29)", function()
      local a, ag = pair({4, 1, 37, 53}, dt)
      local b, bg = pair({1, 3, 53, 29}, dt)
      local r = ag:matmul(bg)
      assert.same({4, 3, 37, 29}, r.shape)
      close(r, a:matmul(b), TOL[dt], "broadcast")
      local c, cg = pair({3, 37, 53}, dt)
      local d, dg = pair({2, 3, 53, 29}, dt)
      close(cg:matmul(dg), c:matmul(d), TOL[dt], "broadcast 2")
    end)

    it(dt .. ": 1-D operands (53) @ (53, 29), (4, 37, 53) @ (53), (53) @ (53)", function()
      local v, vg = pair({53}, dt)
      local b, bg = pair({53, 29}, dt)
      close(vg:matmul(bg), v:matmul(b), TOL[dt], "vec @ mat")
      local a, ag = pair({4, 37, 53}, dt)
      close(ag:matmul(vg), a:matmul(v), TOL[dt], "batch @ vec")
      local w, wg = pair({53}, dt)
      close(vg:matmul(wg), v:matmul(w), TOL[dt], "dot")
    end)

    it(dt .. ": attention-shaped views q @ kᵀ with heads transposed out of (B, T, H, d)", function()
      local q, qg = pair({2, 17, 3, 8}, dt)
      local k, kg = pair({2, 17, 3, 8}, dt)
      local function scores(x, y) return x:transpose(1, 2):matmul(y:transpose(1, 2):transpose(-1, -2)) end
      close(scores(qg, kg), scores(q, k), TOL[dt], "q @ kT")
    end)
  end

  for _, dt in ipairs {"f32", "bf16"} do
    it(dt .. ": backward of a batched, broadcast matmul matches the CPU", function()
      local a, ag = pair({4, 37, 53}, dt, true)
      local b, bg = pair({53, 29}, dt, true)
      local g = randn({4, 37, 29}, dt)
      a:matmul(b):backward(g)
      ag:matmul(bg):backward(g:cuda())
      close(ag.grad, a.grad, TOL[dt], "grad a")
      close(bg.grad, b.grad, TOL[dt], "grad b")
      local c, cg = pair({2, 3, 37, 53}, dt, true)
      local d, dg = pair({2, 1, 53, 29}, dt, true)
      local g2 = randn({2, 3, 37, 29}, dt)
      c:matmul(d):backward(g2)
      cg:matmul(dg):backward(g2:cuda())
      close(cg.grad, c.grad, TOL[dt], "grad c")
      close(dg.grad, d.grad, TOL[dt], "grad d (summed over the broadcast dim)")
    end)
  end

  it("integer matmul is refused with a clear error", function()
    local a = ember.ones({3, 4}, {dtype = "i64"}):cuda()
    local ok, err = pcall(function() return a:matmul(a:transpose(0, 1)) end)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("integer matmul is not supported on CUDA", 1, true), tostring(err))
  end)
end)

describe("linear on CUDA", function()
  for _, dt in ipairs {"f32", "bf16", "f16"} do
    it(dt .. ": x (4, 37, 53) @ wᵀ (29, 53) + b, fused bias, forward and backward", function()
      local x, xg = pair({4, 37, 53}, dt, true)
      local w, wg = pair({29, 53}, dt, true)
      local b, bg = pair({29}, dt, true)
      local y, yg = F.linear(x, w, b), F.linear(xg, wg, bg)
      assert.equals(dt, yg.dtype)
      close(yg, y, TOL[dt], "y")
      local g = randn({4, 37, 29}, dt)
      y:backward(g)
      yg:backward(g:cuda())
      close(xg.grad, x.grad, TOL[dt], "grad x")
      close(wg.grad, w.grad, TOL[dt], "grad w")
      close(bg.grad, b.grad, TOL[dt], "grad bias")
    end)
  end

  it("f32 without bias, and with a strided (non-contiguous) x", function()
    local x, xg = pair({53, 40}, "f32")
    local w, wg = pair({29, 53}, "f32")
    close(F.linear(xg:transpose(0, 1), wg), F.linear(x:transpose(0, 1), w), 1e-5, "xT")
  end)

  it("bias gradient is bit-identical across runs (fixed-order column sums)", function()
    local _, xg = pair({300, 64}, "f32", true)
    local _, wg = pair({96, 64}, "f32", true)
    local _, bg = pair({96}, "f32", true)
    local g = randn({300, 96}, "f32"):cuda()
    F.linear(xg, wg, bg):backward(g)
    local first = bg.grad:clone()
    bg.grad = nil
    F.linear(xg, wg, bg):backward(g)
    assert.equals(0, rel(bg.grad, first))
  end)

  it("under autocast bf16: f32 inputs compute in bf16, grads reach the f32 weights", function()
    local x, xg = pair({8, 53}, "f32", true)
    local w, wg = pair({29, 53}, "f32", true)
    local y = ember.autocast("bf16", function() return F.linear(xg, wg) end)
    assert.equals("bf16", y.dtype)
    close(y, F.linear(x:to("bf16"), w:to("bf16")), 1e-2, "autocast y")
    y:float():sum():backward()
    assert.equals("f32", wg.grad.dtype)
    local ref = F.linear(x, w)
    ref:sum():backward()
    close(wg.grad, w.grad, 1e-2, "autocast grad w")
  end)
end)

describe("naive attention on CUDA (composed of matmul, softmax, masked_fill)", function()
  for _, dt in ipairs {"f32", "bf16"} do
    it(dt .. ": causal (2, 3, 17, 8), forward and backward match the CPU", function()
      local q, qg = pair({2, 3, 17, 8}, dt, true)
      local k, kg = pair({2, 3, 17, 8}, dt, true)
      local v, vg = pair({2, 3, 17, 8}, dt, true)
      local o = F.scaled_dot_product_attention(q, k, v, {causal = true})
      local og = F.scaled_dot_product_attention(qg, kg, vg, {causal = true})
      close(og, o, TOL[dt], "out")
      local g = randn({2, 3, 17, 8}, dt)
      o:backward(g)
      og:backward(g:cuda())
      close(qg.grad, q.grad, dt == "f32" and 1e-5 or 2e-2, "grad q")
      close(kg.grad, k.grad, dt == "f32" and 1e-5 or 2e-2, "grad k")
      close(vg.grad, v.grad, TOL[dt], "grad v")
    end)
  end
end)
