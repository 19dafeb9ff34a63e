-- flash_rope_spec.lua (GPU) — F.flash_attention(q, k, v, causal, {rope = {pos,
-- theta}}) on CUDA against F.rope_qk then F.flash_attention on the same
-- inputs: O, the log-sum-exp and dq, dk, dv bit for bit (the op is to compute
-- each rotated value in f32 as kernels/rope.cu does and round it once, so
-- wherever it runs, rotating inside flash's loads or composing the two ops,
-- the bits are the composition's). Cases: the models' path at T 512 (wg2
-- forward, Step 9's dq/dkdv backward; D 64 and 128, bf16 and f16), causal
-- and not, GQA, odd T, B > 1, positions with an offset and per batch (B, 1,
-- T), and the paths that compose: f32 (TF32 kernels), other head dims (32),
-- decode-sized T (<= 16), the long-T fused backward (T 4096); and the model
-- with EMBER_ATTN_ROPE=fused against =separate (a small bf16-autocast model's
-- steps, bit for bit). CPU behaviour and the errors: tests/lua/flash_rope_spec.lua.
local ember = require "ember"
local F = ember.nn.functional

local C, H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "compare.lua")

assert(ember.cuda.is_available(), "tests/gpu needs a CUDA device (run with EMBER_TEST_GPU=1 on a GPU host)")

local randn = H.seeded(12600).randn

-- (B, H, T, D) views of (B, T, H, D) memory: the layout the model's head split makes
local function heads(b, h, t, d, dt)
  return randn({b, t, h, d}, dt):cuda():transpose(1, 2)
end

local run = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "../lua/flash_rope_ref.lua")

local function same(c)
  local q, k, v = heads(c.b, c.h, c.t, c.d, c.dt), heads(c.b, c.hkv, c.t, c.d, c.dt), heads(c.b, c.hkv, c.t, c.d, c.dt)
  local g = heads(c.b, c.h, c.t, c.d, c.dt)
  local pos = c.pos or ember.arange(c.off or 0, (c.off or 0) + c.t, 1, {dtype = "i64", device = "cuda"})
  local a = run(true, q, k, v, c.causal, pos, 10000, g)
  local b = run(false, q, k, v, c.causal, pos, 10000, g)
  for _, name in ipairs({"o", "lse", "dq", "dk", "dv"}) do
    C.assert_same_bits(a[name], b[name], c.name .. " " .. name)
  end
  -- the rotation is not skipped: without it O differs
  local plain = F.flash_attention(q, k, v, c.causal)
  assert.is_true(H.maxdiff(plain, a.o) > 1e-3, c.name .. ": O equals attention without RoPE")
end

describe("F.flash_attention with rope on CUDA: the composition's bits", function()
  local cases = {}
  for _, d in ipairs({64, 128}) do
    for _, dt in ipairs({"bf16", "f16"}) do
      for _, causal in ipairs({true, false}) do
        cases[#cases + 1] = {name = ("B4 H12 T512 d%d %s causal=%s"):format(d, dt, tostring(causal)),
          b = 4, h = 12, hkv = 12, t = 512, d = d, dt = dt, causal = causal}
      end
    end
  end
  local more = {
    {name = "GQA H8 Hkv2 T300 d64", b = 2, h = 8, hkv = 2, t = 300, d = 64, dt = "bf16", causal = true},
    {name = "odd T 333, offset 1000 (generation's positions)", b = 3, h = 4, hkv = 4, t = 333, d = 64,
      dt = "bf16", causal = true, off = 1000},
    {name = "odd T 129 d128 not causal, offset 7", b = 1, h = 3, hkv = 3, t = 129, d = 128, dt = "bf16",
      causal = false, off = 7},
    {name = "f32 (TF32 kernels) T200 d64", b = 2, h = 2, hkv = 2, t = 200, d = 64, dt = "f32", causal = true},
    {name = "head dim 32 T256", b = 2, h = 4, hkv = 4, t = 256, d = 32, dt = "bf16", causal = true},
    {name = "decode-sized T 9", b = 2, h = 4, hkv = 2, t = 9, d = 64, dt = "bf16", causal = true, off = 50},
    {name = "long T 4096 (the fused backward)", b = 1, h = 2, hkv = 2, t = 4096, d = 64, dt = "bf16", causal = true},
  }
  for _, c in ipairs(more) do cases[#cases + 1] = c end
  for _, c in ipairs(cases) do
    it(c.name, function() same(c) end)
  end

  it("per-batch positions (B, 1, T), i32", function()
    local p = ember.cat({ember.arange(0, 200, 1, {dtype = "i32"}), ember.arange(500, 700, 1, {dtype = "i32"})}, 0)
    same({name = "(B, 1, T) positions", b = 2, h = 4, hkv = 4, t = 200, d = 64, dt = "bf16", causal = true,
      pos = p:reshape(2, 1, 200):cuda()})
  end)

  -- where the backward's wg2 kernels rotate dq and dk (T 512: the short-sequence schedule), the rope kernel runs
  -- once (the forward); the composition runs it twice; forced onto other backwards the op rotates after them
  -- with the rope kernel, with the same bits
  it("launches the rope kernel only in the forward at T 512, and composes elsewhere (by kernel name)", function()
    C.need_cupti(pending)
    local q, k, v, g = heads(2, 4, 512, 64, "bf16"), heads(2, 4, 512, 64, "bf16"), heads(2, 4, 512, 64, "bf16"),
      heads(2, 4, 512, 64, "bf16")
    local pos = F.positions(512, "cuda")
    local function calls(fused)
      return C.kernel_calls(function() run(fused, q, k, v, true, pos, 10000, g) end, "rope_kernel")
    end
    assert.are.equal(1, calls(true))
    assert.are.equal(2, calls(false))
    local names = C.kernel_names(function() run(true, q, k, v, true, pos, 10000, g) end)
    assert.truthy(names:find("flash_dq_wg2_kernel", 1, true), names)
    for _, kernel in ipairs({"mma", "wg", "fused"}) do
      local prev = ember.core.flash_bwd_kernel(kernel)
      local ok, err = pcall(function()
        assert.are.equal(2, calls(true), kernel)
        same({name = "backward " .. kernel, b = 2, h = 4, hkv = 2, t = 300, d = 64, dt = "bf16", causal = true})
      end)
      ember.core.flash_bwd_kernel(prev)
      assert(ok, err)
    end
  end)

  it("names positions on another device", function()
    local q = heads(1, 2, 32, 64, "bf16")
    assert.error_matches(function() F.flash_attention(q, q, q, true, {rope = {pos = F.positions(32)}}) end,
      "flash_attention: expected all tensors on the same device, got cuda:0 and cpu", 1, true)
  end)
end)

describe("EMBER_ATTN_ROPE on CUDA", function()
  it("fused and separate train a small model (bf16 autocast) to the same bits", function()
    local got = C.mode_results(H, C.train_small_script(H, 256, 3), "EMBER_ATTN_ROPE", {"separate", "fused"})
    assert.is_true(C.assert_modes_agree(got, "separate", {"fused"}) > 10)
    H.remove_temps()
  end)
end)
