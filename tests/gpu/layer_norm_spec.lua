-- layer_norm_spec.lua (GPU) — layer_norm on CUDA (kernels/norm.cu) against
-- the CPU reference: the register forward (ln_fwd_reg_kernel) at a D for
-- every launch shape (a warp per row with 1, 2, 4 or 8 16-byte packs a lane;
-- 4 warps a row with 4 packs; 8 warps a row with 4 or 8 packs) and the loop
-- kernel it falls back to (D past 2048 packs, D not a whole number of packs,
-- f64); the register backward (2 packs a thread over 32-256 threads a row,
-- or 4 packs of f32 over 256) up to D 4096 and its loop fallback for odd D
-- and f64; row counts that leave the last block part-empty; weight and bias of
-- x's dtype, f32 weights beside bf16 x, neither. The backward reads the
-- forward's saved mean and rstd, so dx, dw and db are checked too.
--
-- Error measure and tolerances as norm_spec.lua: ‖got − want‖ / ‖want‖ in
-- f64, 1e-5 for f32 (f32 trees against the CPU's double sums), 1e-2 for
-- bf16 (one rounding to bf16 on each side).
local ember = require "ember"
local F = ember.nn.functional
assert(ember.cuda.is_available(), "tests/gpu needs a CUDA device (run with EMBER_TEST_GPU=1 on a GPU host)")

local C, H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "compare.lua")
local close = C.assert_rel

local randn = H.seeded(4100).randn

local TOL = {f32 = 1e-5, bf16 = 1e-2, f64 = 1e-12}

local function grad_copy(t, dev)
  local c = dev == "cuda" and t:cuda() or t:clone()
  c.requires_grad = true
  return c
end

-- fwd_only: the forward alone (rows past the register backward's 4096 go to
-- the loop backward with over 48 KiB of shared memory, which this change
-- does not touch)
local function check(shape, dt, wdt, what, fwd_only)
  local D = shape[#shape]
  local x = randn(shape, dt, 2) + 1                     -- an offset the centring must remove
  local w = wdt and randn({D}, wdt) or nil
  local b = wdt and randn({D}, wdt) or nil
  local g = randn(shape, dt)
  local xc, xg = grad_copy(x, "cpu"), grad_copy(x, "cuda")
  local wc, wg = w and grad_copy(w, "cpu"), w and grad_copy(w, "cuda")
  local bc, bg = b and grad_copy(b, "cpu"), b and grad_copy(b, "cuda")
  local yc, yg = F.layer_norm(xc, D, wc, bc, 1e-5), F.layer_norm(xg, D, wg, bg, 1e-5)
  assert.equals(dt, yg.dtype)
  close(yg, yc, TOL[dt], what .. " y")
  if fwd_only then return end
  yc:backward(g)
  yg:backward(g:cuda())
  close(xg.grad, xc.grad, TOL[dt], what .. " dx")
  if w then
    close(wg.grad, wc.grad, TOL[wdt] or TOL[dt], what .. " dw")
    close(bg.grad, bc.grad, TOL[wdt] or TOL[dt], what .. " db")
  end
end

-- D for f32 (4 a pack) and bf16 (8 a pack): packs 2, 32, 64, 96, 192, 250,
-- 400, 1024, 2048 (each register launch shape, forward and backward), 2049
-- and an odd D (the loop kernels)
local DS = {f32 = {8, 128, 256, 384, 768, 1000, 1600, 4096, 8192, 8196, 37},
            bf16 = {16, 256, 512, 768, 1536, 2000, 3200, 8192, 16384, 16392, 37}}

describe("layer_norm on CUDA", function()
  for _, dt in ipairs({"f32", "bf16"}) do
    for _, D in ipairs(DS[dt]) do
      local fwd_only = D > 4096
      it(("%s: D %d, weight and bias, forward%s"):format(dt, D, fwd_only and "" or " and backward"), function()
        for _, rows in ipairs({3, 37}) do check({rows, D}, dt, dt, ("(%d, %d) %s"):format(rows, D, dt), fwd_only) end
      end)
    end
    it(dt .. ": without weight or bias, 3-D input", function() check({2, 5, 1600}, dt, nil, "no affine " .. dt) end)
  end
  it("bf16 activations with f32 weight and bias", function() check({37, 1600}, "bf16", "f32", "bf16 x, f32 w") end)
  it("f64 computes in f64 (the loop kernel)", function() check({5, 64}, "f64", "f64", "f64") end)

  it("gives the same bits on a second run", function()
    local x, w, b = randn({64, 1600}, "f32"):cuda(), randn({1600}, "f32"):cuda(), randn({1600}, "f32"):cuda()
    C.assert_close(F.layer_norm(x, 1600, w, b), F.layer_norm(x, 1600, w, b), 0, "layer_norm repeat")
  end)
end)
