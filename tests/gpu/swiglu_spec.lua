-- swiglu_spec.lua (GPU) — fused SwiGLU forward/backward on CUDA
-- (kernels/swiglu.cu) against the CPU reference.
--
-- Error measure: ‖got − want‖ / ‖want‖ in f64 on the CPU. Tolerances:
--   * f32: 1e-5 — same formula in f32; expf differs from the CPU's by ~1 ulp.
--   * bf16: 1e-2 — one rounding to bf16 on both sides.
local ember = require "ember"
local F = ember.nn.functional

local C, H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "compare.lua")
local rel, close = C.rel_error, C.assert_rel

local randn = H.seeded(6000, 3).randn

local TOL = {f32 = 1e-5, bf16 = 1e-2, f64 = 1e-12}

local function check(shape, dt, view, what)
  view = view or function(t) return t end
  local a, b = randn(shape, dt), randn(shape, dt)
  local g = randn(view(a).shape, dt)
  local ac, bc = a:clone(), b:clone()
  ac.requires_grad = true; bc.requires_grad = true
  local ag, bg = a:cuda(), b:cuda()
  ag.requires_grad = true; bg.requires_grad = true
  local yc, yg = F.swiglu(view(ac), view(bc)), F.swiglu(view(ag), view(bg))
  assert.equals(dt, yg.dtype)
  close(yg, yc, TOL[dt], what .. " y")
  yc:backward(g)
  yg:backward(g:cuda())
  close(ag.grad, ac.grad, TOL[dt], what .. " da")
  close(bg.grad, bc.grad, TOL[dt], what .. " db")
end

describe("swiglu on CUDA", function()
  assert.is_true(ember.cuda.is_available(), "the GPU specs need a CUDA device")

  for _, dt in ipairs {"f32", "bf16", "f64"} do
    it(dt .. ": (4, 37, 171), odd sizes (vector body + scalar tail)", function() check({4, 37, 171}, dt, nil, dt) end)
    it(dt .. ": (8, 512), whole 16-byte chunks", function() check({8, 512}, dt, nil, dt) end)
  end

  it("f32 and bf16: misaligned views (narrow by 1 element) take the scalar path", function()
    for _, dt in ipairs {"f32", "bf16"} do
      check({1001}, dt, function(t) return t:narrow(0, 1, 999) end, dt .. " narrow")
    end
  end)
end)
