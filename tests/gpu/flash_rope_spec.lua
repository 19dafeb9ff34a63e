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

local function run(fused, q0, k0, v0, causal, pos, theta, g)
  local q, k, v = C.leaf(q0), C.leaf(k0), C.leaf(v0)
  local o, lse
  if fused then
    o, lse = F.flash_attention(q, k, v, causal, {rope = {pos = pos, theta = theta}})
  else
    local qr, kr = F.rope_qk(q, k, pos, theta)
    o, lse = F.flash_attention(qr, kr, v, causal)
  end
  (o * g):sum():backward()
  return {o = o, lse = lse, dq = q.grad, dk = k.grad, dv = v.grad}
end

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

-- A small model (d 768, 12 heads of 64, T 256) trained 3 bf16-autocast steps: gradients of step 1, losses,
-- the final weights and cached logits, saved for C.mode_results
local function train_small_script()
  local script = H.temp(".lua")
  H.spit(script, [==[
local ember = require "ember"
local nn, F = ember.nn, ember.nn.functional
ember.manual_seed(11)
local m = nn.TransformerLM{vocab_size = 101, context_length = 256, d_model = 768, d_ff = 1024, num_layers = 2,
  num_heads = 12, device = "cuda"}
local opt = ember.optim.AdamW(m:parameters(), {lr = 1e-2})
local data = ember.randint(0, 101, {4, 257}):cuda()
local x, y = data:narrow(1, 0, 256):contiguous(), data:narrow(1, 1, 256):contiguous()
local out, losses = {}, {}
for step = 1, 3 do
  opt:zero_grad()
  local loss = ember.autocast("bf16", function() return F.cross_entropy(m(x), y) end)
  loss:backward()
  if step == 1 then for _, np in ipairs(m:named_parameters()) do out["g_" .. np[1]] = np[2].grad:cpu() end end
  opt:step()
  losses[step] = loss:float():cpu():reshape(1)
end
out.losses = ember.cat(losses, 0)
for name, p in pairs(m:state_dict()) do out["p_" .. name] = p:cpu() end
local kv = nn.KVCache(m, {batch = 4, max_len = 256})
out.cached_logits_bf16 = ember.autocast("bf16", function() return m(x:narrow(1, 0, 9):contiguous(), {cache = kv}) end)
  :float():cpu()
ember.save(os.getenv("SCAN_SPEC_OUT"), out)
]==])
  return script
end

describe("EMBER_ATTN_ROPE on CUDA", function()
  it("fused and separate train a small model (bf16 autocast) to the same bits", function()
    local got = C.mode_results(H, train_small_script(), "EMBER_ATTN_ROPE", {"separate", "fused"})
    assert.is_true(C.assert_modes_agree(got, "separate", {"fused"}) > 10)
    H.remove_temps()
  end)
end)
