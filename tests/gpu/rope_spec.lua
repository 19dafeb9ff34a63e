-- rope_spec.lua (GPU) — fused RoPE forward/backward on CUDA (kernels/rope.cu)
-- against the CPU reference.
--
-- Error measure: ‖got − want‖ / ‖want‖ in f64 on the CPU. Tolerances:
--   * f32: 1e-5 — the angle is formed and reduced mod 2π in double on both
--     sides; the GPU then takes a float sincos of the reduced angle (within
--     ~2 ulps of the CPU's (float)cos(double)), so elements differ by a few
--     ulps, even at positions near 1e5.
--   * bf16: 1e-2 — one rounding to bf16 on both sides.
--   * f64: 1e-12.
local ember = require "ember"
local F = ember.nn.functional

local C, H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "compare.lua")
local rel, close = C.rel_error, C.assert_rel

local R = H.seeded(5000)
local randn = R.randn

local TOL = {f32 = 1e-5, bf16 = 1e-2, f64 = 1e-12}

-- forward and backward of F.rope(view(x), pos) on both devices
local function check(x, pos, dt, view, what)
  view = view or function(t) return t end
  local g = randn(view(x).shape, dt)
  local xc = x:clone(); xc.requires_grad = true
  local xg = x:cuda(); xg.requires_grad = true
  local yc = F.rope(view(xc), pos, 10000)
  local yg = F.rope(view(xg), pos:cuda(), 10000)
  assert.equals(dt, yg.dtype)
  close(yg, yc, TOL[dt], what .. " y")
  yc:backward(g)
  yg:backward(g:cuda())
  close(xg.grad, xc.grad, TOL[dt], what .. " dx")
end

describe("rope on CUDA", function()
  assert.is_true(ember.cuda.is_available(), "the GPU specs need a CUDA device")

  for _, dt in ipairs {"f32", "bf16", "f64"} do
    it(dt .. ": (2, 3, 17, 64), positions 0..16", function()
      check(randn({2, 3, 17, 64}, dt), ember.arange(0, 17, 1, {dtype = "i64"}), dt, nil, dt)
    end)
  end

  it("f32: heads transposed out of (B, T, H, d) are read in place", function()
    check(randn({2, 17, 3, 16}), ember.arange(0, 17, 1, {dtype = "i64"}), "f32",
      function(t) return t:transpose(1, 2) end, "transposed")
  end)

  it("f32: per-batch positions (2, 1, 17) broadcast over heads, i32, up to 1e5", function()
    local pos = R.randint(100000, {2, 1, 17}, "i32")
    check(randn({2, 3, 17, 32}), pos, "f32", nil, "positions 1e5")
  end)

  it("f32: odd number of pairs (d = 10) and a single row", function()
    check(randn({1, 10}), ember.tensor({12345}, {dtype = "i64"}), "f32", nil, "d=10")
  end)
end)
