-- rope_spec.lua (GPU) — fused RoPE forward/backward on CUDA (kernels/rope.cu)
-- against the CPU reference.
--
-- Error measure: ‖got − want‖ / ‖want‖ in f64 on the CPU. Tolerances:
--   * f32: 1e-5 — the angle is formed and reduced mod 2π in double on both
--     sides; the GPU then takes a float sincos of the reduced angle (within
--     ~2 ulps of the CPU's (float)cos(double)), so elements differ by a few
--     ulps, even at positions near 1e5.
--   * bf16: 1e-2 — one rounding to bf16 on both sides.
--   * f16: 2.5e-3 — the same at f16's three more mantissa bits.
--   * f64: 1e-12.
local ember = require "ember"
local F = ember.nn.functional

local C, H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "compare.lua")
local rel, close = C.rel_error, C.assert_rel

local R = H.seeded(5000)
local randn = R.randn

local TOL = {f32 = 1e-5, bf16 = 1e-2, f16 = 2.5e-3, f64 = 1e-12}

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

  -- the kernel shares one sin/cos across up to 4 heads (h = g, g + G, ...):
  -- head counts that leave the last group partly empty, both chunk paths
  -- (16-byte chunks; one pair a thread when rows are not 16-byte aligned)
  for _, dt in ipairs {"bf16", "f16", "f32"} do
    for _, H in ipairs {1, 3, 5, 12, 13} do
      it(dt .. ": " .. H .. " heads as the transposed view of (2, 33, H, 64)", function()
        check(randn({2, 33, H, 64}, dt), ember.arange(0, 33, 1, {dtype = "i64"}), dt,
          function(t) return t:transpose(1, 2) end, dt .. " H=" .. H)
      end)
    end
  end

  it("bf16: rows not 16-byte aligned (a narrow of the last dim's neighbours) take the pair path", function()
    -- (2, 5, 3, 66) narrowed to 64 columns from column 1: rows start 2 bytes off
    check(randn({2, 5, 3, 66}, "bf16"), ember.arange(0, 5, 1, {dtype = "i64"}), "bf16",
      function(t) return t:narrow(3, 1, 64):transpose(1, 2) end, "unaligned")
  end)

  it("f32: d = 1024 (pairs past the 256-entry frequency table)", function()
    check(randn({2, 2, 5, 1024}), ember.arange(0, 5, 1, {dtype = "i64"}), "f32", nil, "d=1024")
  end)

  it("bf16: offsets past 2^31 elements take the 64-bit index path", function()
    -- three rows 2^30 elements apart in one 6 GiB allocation: only 192 are read
    local big = ember.empty({3, 1 << 30}, {dtype = "bf16", device = "cuda"})
    local x = big:narrow(1, 0, 64)
    local src = randn({3, 64}, "bf16")
    x:copy_(src:cuda())
    local pos = ember.tensor({7, 70000, 99999}, {dtype = "i64"})
    local want = F.rope(src, pos, 10000)
    close(F.rope(x, pos:cuda(), 10000), want, TOL.bf16, "64-bit offsets")
    big = nil
    x = nil
    collectgarbage()
  end)
end)

describe("rope_qk on CUDA", function()
  -- q and k in one launch: each the same bits as its own F.rope on the GPU,
  -- and both against the CPU, forward and backward
  for _, dt in ipairs {"f32", "bf16"} do
    it(dt .. ": (2, 12, 33, 64) heads transposed out of (2, 33, 12, 64)", function()
      local q0, k0 = randn({2, 33, 12, 64}, dt), randn({2, 33, 12, 64}, dt)
      local pos = ember.arange(0, 33, 1, {dtype = "i64"})
      local gq, gk = randn({2, 12, 33, 64}, dt), randn({2, 12, 33, 64}, dt)
      local function run(q, k, p, device)
        q = q:to(device):clone(); k = k:to(device):clone()
        q.requires_grad = true; k.requires_grad = true
        local a, b = F.rope_qk(q:transpose(1, 2), k:transpose(1, 2), p:to(device), 10000)
        local loss = (a * gq:to(device)):sum() + (b * gk:to(device)):sum()
        loss:backward()
        return a, b, q.grad, k.grad
      end
      local a, b, dq, dk = run(q0, k0, pos, "cuda")
      local ac, bc, dqc, dkc = run(q0, k0, pos, "cpu")
      close(a, ac, TOL[dt], "q'")
      close(b, bc, TOL[dt], "k'")
      close(dq, dqc, TOL[dt], "dq")
      close(dk, dkc, TOL[dt], "dk")
      local pc = pos:cuda()
      C.assert_same_bits(a, F.rope(q0:cuda():transpose(1, 2), pc, 10000), "q' vs F.rope")
      C.assert_same_bits(b, F.rope(k0:cuda():transpose(1, 2), pc, 10000), "k' vs F.rope")
    end)
  end

  it("f32: k with fewer heads than q (two geometries in one launch)", function()
    local q, k = randn({2, 8, 17, 32}), randn({2, 2, 17, 32})
    local pos = ember.arange(0, 17, 1, {dtype = "i64"})
    local a, b = F.rope_qk(q:cuda(), k:cuda(), pos:cuda())
    close(a, F.rope(q, pos), TOL.f32, "q'")
    close(b, F.rope(k, pos), TOL.f32, "k'")
  end)
end)
