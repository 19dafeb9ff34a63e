-- flash_spec.lua (GPU) — the FlashAttention-2 kernels (kernels/flash_fwd.cu,
-- kernels/flash_bwd.cu) and the split-key decode kernels (flash_decode.cu, up
-- to 16 queries) against the naive composition and the CPU's tiled path:
-- every head dim (256 included), grouped-query attention, 3-D inputs, both
-- causal alignments.
--
-- Reference: the naive attention in f64 on the CPU, from the same bf16/f16
-- inputs (so input rounding is not counted), with autograd for the
-- gradients. Error measure: ‖got − ref‖ / ‖ref‖ (compare.lua). Bound, the
-- usual one for flash kernels: no more than twice the error of the naive
-- composition run on the GPU in the same half dtype, plus 1e-4 — and never
-- above an absolute cap (1e-2 bf16, 2e-3 f16), so a broken naive path cannot
-- loosen it. The log-sum-exp is checked against the f64 one within 1e-4
-- relative (it is accumulated in f32).
local ember = require "ember"
local F = ember.nn.functional

local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local C, helpers = dofile(here .. "compare.lua")
local rel = C.rel_error

-- f32 runs on the TF32 tensor cores: operands rounded to 10-bit mantissas
-- (u = 2^-11 ≈ 4.9e-4 with round-to-nearest), f32 accumulation and softmax.
-- The naive composition under ember.backends.tf32(true) was meant as its
-- yardstick, but on the H100 (2026-11-27) it came out exact (1.5e-7: cuBLAS
-- may, not must, use TF32, and these small batched matmuls did not), so f32
-- has a fixed bound instead: 2u = 2^-10. The kernels' roundings replayed in
-- f64 on the CPU (q, k, v, dO, P and dS rounded to 11 significant bits;
-- d 64/128, T 256/1024, causal) give norm-wise errors of 3.6-4.0e-4 for o
-- and 5.2-5.4e-4 for dq, dk, dv (about u: each output is one TF32 matmul
-- deep, its operands each rounded once); the H100 measured 3.5e-4 (o) and
-- 5.0e-4 (dq). A wrong fragment layout (errors O(1)) cannot pass.
local CAP = {bf16 = 1e-2, f16 = 2e-3}
local F32_BOUND = 2 ^ -10
-- the log-sum-exp, relative to f64: f32 accumulation; for f32 inputs also
-- the TF32 rounding of q and k in the scores (replayed: ~1.6e-5)
local LSE_TOL = {bf16 = 1e-4, f16 = 1e-4, f32 = 1e-4}
local randn = helpers.seeded(9100).randn   -- (shape, dtype, scale): seeds 9101, 9102, ...; f64 draws cast
-- leaf copies that require grad, the (B, H, T, D) view of (B, T, H, D) memory, kv heads repeated per group
local leaf, bthd, repeat_kv = C.leaf, C.bthd, C.repeat_kv

-- naive attention in f64 on the CPU (autograd through repeat_kv sums a kv
-- head's gradient over its group) and the log-sum-exp of its scores
local function naive64(q, k, v, g, causal, scale)
  local q6, k6, v6 = leaf(q:cpu():to("f64")), leaf(k:cpu():to("f64")), leaf(v:cpu():to("f64"))
  local nd, H = #q.shape, q.shape[2]
  local kr, vr = repeat_kv(k6, H), repeat_kv(v6, H)
  local o = F.scaled_dot_product_attention(q6, kr, vr, {causal = causal, scale = scale, impl = "naive"})
  o:backward(g:cpu():to("f64"))
  local d = q.shape[nd]
  local s = q6:detach():matmul(kr:detach():transpose(-2, -1)) * (scale or 1 / math.sqrt(d))
  if causal then
    local tq, tk = q.shape[nd - 1], k.shape[nd - 1]
    local off = causal == "bottom_right" and tk - tq or 0
    s = s:masked_fill(ember.ones(tq, tk):triu(1 + off):eq(1), -math.huge)
  end
  return o:detach(), q6.grad, k6.grad, v6.grad, s:logsumexp(-1)
end

local function run(fn, q, k, v, g)
  local qq, kk, vv = leaf(q), leaf(k), leaf(v)
  local o, lse = fn(qq, kk, vv)
  o:backward(g)
  return o:detach(), qq.grad, kk.grad, vv.grad, lse
end

-- flash vs the f64 reference, held to twice the naive half error
local function check(shape_q, shape_k, dt, causal, opts)
  opts = opts or {}
  local q, k, v = randn(shape_q, dt), randn(shape_k, dt), randn(shape_k, dt)
  local g = randn(shape_q, dt)
  if opts.layout then q, k, v, g = opts.layout(q), opts.layout(k), opts.layout(v), opts.layout(g) end
  q, k, v, g = q:cuda(), k:cuda(), v:cuda(), g:cuda()
  local ref = {naive64(q, k, v, g, causal, opts.scale)}
  local fl = {run(function(a, b, c) return F.flash_attention(a, b, c, causal, opts.scale) end, q, k, v, g)}
  -- f32: the naive composition with TF32 matmuls is the yardstick (restored after)
  local prev = dt == "f32" and ember.backends.tf32(true)
  local ok, nv = pcall(function()
    return {run(function(a, b, c)
      return F.scaled_dot_product_attention(a, b, c, {causal = causal, scale = opts.scale, impl = "naive",
        enable_gqa = true})
    end, q, k, v, g)}
  end)
  if dt == "f32" then ember.backends.tf32(prev) end
  if not ok then error(nv, 0) end
  local what = string.format("%s q%s k%s causal=%s", dt, table.concat(shape_q, "x"), table.concat(shape_k, "x"),
    tostring(causal))
  for i, name in ipairs({"o", "dq", "dk", "dv"}) do
    assert.are.equal(dt, fl[i].dtype, what .. " " .. name .. " dtype")
    local ef, en = rel(fl[i], ref[i]), rel(nv[i], ref[i])
    local bound = dt == "f32" and F32_BOUND or math.min(2 * en + 1e-4, CAP[dt])
    assert.is_true(ef <= bound, string.format("%s %s: flash error %.3g > %.3g (naive %s error %.3g)", what, name,
      ef, bound, dt, en))
  end
  assert.are.equal("f32", fl[5].dtype)
  local el = rel(fl[5], ref[5])
  assert.is_true(el <= LSE_TOL[dt], string.format("%s lse: relative error %.3g > %.3g", what, el, LSE_TOL[dt]))
  return fl, ref
end

describe("flash attention on CUDA", function()
  it("matches the f64 reference for every supported head dim (bf16, causal, T not a tile multiple)", function()
    for _, d in ipairs({16, 32, 64, 80, 96, 128}) do
      check({2, 3, 130, d}, {2, 3, 130, d}, "bf16", true)
    end
  end)

  it("handles f16, no mask, and Tq ≠ Tk", function()
    check({2, 2, 70, 64}, {2, 2, 150, 64}, "f16", false)
    check({1, 2, 150, 32}, {1, 2, 70, 32}, "bf16", false)
  end)

  it("aligns the causal mask top-left when Tq ≠ Tk (as PyTorch's is_causal)", function()
    check({1, 2, 100, 64}, {1, 2, 40, 64}, "bf16", true)
    check({1, 2, 40, 64}, {1, 2, 100, 64}, "bf16", true)
  end)

  it("covers single rows, exact tiles, one past a tile and long sequences", function()
    check({3, 1, 1, 64}, {3, 1, 1, 64}, "bf16", true)
    check({1, 2, 64, 64}, {1, 2, 64, 64}, "bf16", true)
    check({1, 2, 65, 128}, {1, 2, 65, 128}, "f16", true)
    check({1, 1, 1024, 64}, {1, 1, 1024, 64}, "bf16", true)
  end)

  it("runs head dim 256 (q fragments from shared memory, dk/dv/dq split over two blocks)", function()
    check({2, 2, 130, 256}, {2, 2, 130, 256}, "bf16", true)
    check({1, 2, 70, 256}, {1, 2, 150, 256}, "f16", false)
  end)

  it("runs grouped-query attention: head h reads kv head h // (H / Hkv), dk/dv summed over the group", function()
    check({2, 8, 130, 64}, {2, 2, 130, 64}, "bf16", true)
    check({1, 6, 77, 128}, {1, 3, 100, 128}, "f16", "bottom_right")
    check({1, 4, 65, 32}, {1, 1, 65, 32}, "bf16", false)
    check({1, 4, 40, 256}, {1, 2, 40, 256}, "bf16", true)
  end)

  it("streams many tiles through the double-buffered pipelines (partial tiles at both ends, heads in turn)", function()
    -- forward: 128-query blocks over 9 key tiles; dk/dv: 2 q heads' query tiles in one stream
    check({1, 4, 333, 128}, {1, 2, 517, 128}, "bf16", "bottom_right")
    check({1, 2, 300, 256}, {1, 2, 300, 256}, "f16", true)        -- 16-row backward tiles at D = 256
    check({1, 2, 259, 80}, {1, 2, 259, 80}, "bf16", false)       -- the copies of D = 80 (10 chunks a row)
    check({2, 3, 300, 64}, {2, 1, 20, 64}, "bf16", false)        -- one partial key tile, GQA 3
  end)

  it("aligns causal = 'bottom_right' to the end of the keys (Tq < Tk: queries at the end of a cache)", function()
    check({1, 2, 100, 64}, {1, 2, 230, 64}, "bf16", "bottom_right")
    check({2, 2, 130, 96}, {2, 2, 130, 96}, "f16", "bottom_right")   -- Tq = Tk: the usual mask
  end)

  -- no queries: k and v get zero gradients (the kernels write nothing at Tq 0, so the op fills them), every backward
  it("gives k and v zero gradients with no queries (Tq = 0), every backward kernel", function()
    -- its own seeds: the draws of the cases after it stay the ones they were written against
    local randn = helpers.seeded(9700).randn
    local kernels = {"mma"}   -- and the wgmma backwards where they run (sm_90)
    if not C.sm90_unavailable(function()
      ember.core.flash_bwd_kernel("wg")
      local x = randn({1, 1, 32, 64}, "bf16"):cuda():requires_grad_()
      F.flash_attention(x, x, x, true):sum():backward()
    end) then kernels = {"mma", "wg", "wg2", "fused"} end
    for _, kname in ipairs(kernels) do
      ember.core.flash_bwd_kernel(kname)
      for _, d in ipairs({64, 128}) do
        local q = randn({1, 2, 0, d}, "bf16"):cuda():requires_grad_()
        local k = randn({1, 2, 70, d}, "bf16"):cuda():requires_grad_()
        local v = randn({1, 2, 70, d}, "bf16"):cuda():requires_grad_()
        -- dk and dv from the caching allocator: dirty them first, so uninitialised memory would show
        for _ = 1, 3 do local junk <close> = ember.full({1, 70, 2, d}, 7, {dtype = "bf16", device = "cuda"}) end
        F.flash_attention(q, k, v, false):sum():backward()
        assert.same({1, 2, 0, d}, q.grad.shape)
        assert.are.equal(0, k.grad:to("f32"):abs():sum():item(), kname .. " d " .. d .. ": dk")
        assert.are.equal(0, v.grad:to("f32"):abs():sum():item(), kname .. " d " .. d .. ": dv")
      end
    end
    ember.core.flash_bwd_kernel("auto")
  end)

  it("takes 3-D (B, T, d) inputs as one head (the course's shape)", function()
    local fl = check({3, 100, 64}, {3, 100, 64}, "bf16", true)
    assert.same({3, 100, 64}, fl[1].shape)
    assert.same({3, 100}, fl[5].shape)
    check({2, 9, 128}, {2, 300, 128}, "f16", "bottom_right")   -- 3-D through the decode kernel
  end)

  it("decodes few queries against a long cache with the split-key kernel (splits combined, or one split)", function()
    check({1, 8, 1, 128}, {1, 2, 3000, 128}, "bf16", "bottom_right")   -- one query, GQA, 12 splits
    check({2, 4, 16, 64}, {2, 4, 777, 64}, "f16", "bottom_right")      -- 16 queries: still the decode kernel
    check({2, 4, 17, 64}, {2, 4, 777, 64}, "bf16", "bottom_right")     -- 17: the FlashAttention-2 kernel
    check({1, 2, 5, 256}, {1, 2, 1000, 256}, "bf16", true)             -- top-left: row i sees keys 0..i
    check({33, 8, 1, 32}, {33, 8, 64, 32}, "bf16", false)              -- 264 blocks: one split, o written directly
    for _, d in ipairs({16, 80, 96}) do check({1, 2, 3, d}, {1, 2, 600, d}, "bf16", "bottom_right") end
  end)

  it("gives the decode kernel's result bit for bit on repeat, and the CPU tiled path's within bf16 rounding", function()
    local q, k, v = randn({2, 8, 1, 128}, "bf16"), randn({2, 2, 2048, 128}, "bf16"), randn({2, 2, 2048, 128}, "bf16")
    local a = F.flash_attention(q:cuda(), k:cuda(), v:cuda(), "bottom_right")
    local b = F.flash_attention(q:cuda(), k:cuda(), v:cuda(), "bottom_right")
    C.assert_equal(b, a, "decode repeat")
    local cpu, lse_cpu = F.flash_attention(q:float(), k:float(), v:float(), "bottom_right")
    local _, lse = F.flash_attention(q:cuda(), k:cuda(), v:cuda(), "bottom_right")
    assert.is_true(rel(a, cpu) < 8e-3, "decode vs the CPU tiled path")
    assert.is_true(rel(lse, lse_cpu) < 1e-5, "decode lse vs the CPU tiled path")
  end)

  it("honours a given scale", function()
    check({1, 2, 96, 64}, {1, 2, 96, 64}, "bf16", true, {scale = 0.3})
  end)

  it("reads the (B, T, H, D) head-split layout in place and writes o, dq, dk, dv in it", function()
    local fl = check({2, 4, 77, 64}, {2, 4, 77, 64}, "bf16", true, {layout = bthd})
    assert.is_true(fl[1]:transpose(1, 2):is_contiguous(), "o is (B, T, H, D) memory")
    -- leaves in (B, T, H, D), split into heads by a transpose as the model does:
    -- their gradients arrive contiguous, with no copy on the way back
    local x = {}
    for i = 1, 3 do x[i] = leaf(randn({2, 77, 4, 64}, "bf16"):cuda()) end
    local o = F.flash_attention(x[1]:transpose(1, 2), x[2]:transpose(1, 2), x[3]:transpose(1, 2), true)
    o:backward(randn({2, 4, 77, 64}, "bf16"):cuda())
    for i = 1, 3 do
      assert.is_true(x[i].grad:is_contiguous(), "gradient " .. i .. " layout")
      assert.is_true(x[i].grad:float():abs():sum():item() > 0, "gradient " .. i .. " is not zero")
    end
  end)

  it("is deterministic: two backward passes give bit-identical gradients", function()
    local q, k, v = randn({2, 2, 200, 64}, "bf16"):cuda(), randn({2, 2, 200, 64}, "bf16"):cuda(),
      randn({2, 2, 200, 64}, "bf16"):cuda()
    local g = randn({2, 2, 200, 64}, "bf16"):cuda()
    local f = function(a, b, c) return F.flash_attention(a, b, c, true) end
    local r1, r2 = {run(f, q, k, v, g)}, {run(f, q, k, v, g)}
    for i = 1, 4 do C.assert_equal(r2[i], r1[i], "run 2 vs run 1, output " .. i) end
    -- GQA at D = 128: the group's dk/dv sums in a fixed order across the pipelined tile stream
    q, g = randn({1, 4, 333, 128}, "f16"):cuda(), randn({1, 4, 333, 128}, "f16"):cuda()
    k, v = randn({1, 2, 333, 128}, "f16"):cuda(), randn({1, 2, 333, 128}, "f16"):cuda()
    r1, r2 = {run(f, q, k, v, g)}, {run(f, q, k, v, g)}
    for i = 1, 4 do C.assert_equal(r2[i], r1[i], "GQA D 128, run 2 vs run 1, output " .. i) end
  end)

  it("lowers f32 inputs under autocast and sends f32 gradients to f32 leaves", function()
    local q, k, v = leaf(randn({1, 2, 50, 64}, "f32"):cuda()), leaf(randn({1, 2, 50, 64}, "f32"):cuda()),
      leaf(randn({1, 2, 50, 64}, "f32"):cuda())
    assert.is_false(ember.core.flash_applies(q, k, v))
    local o = ember.autocast("bf16", function()
      assert.is_true(ember.core.flash_applies(q, k, v))
      return F.scaled_dot_product_attention(q, k, v, {causal = true})   -- impl auto
    end)
    assert.are.equal("bf16", o.dtype)
    o:float():sum():backward()
    assert.are.equal("f32", q.grad.dtype)
    local ref = F.scaled_dot_product_attention(q:detach(), k:detach(), v:detach(), {causal = true, impl = "naive"})
    assert.is_true(rel(o, ref) < 1e-2)
  end)

  it("is what TransformerLM uses on CUDA under autocast by default", function()
    ember.manual_seed(3)
    local cfg = {vocab_size = 64, context_length = 32, d_model = 64, num_layers = 2, num_heads = 4, d_ff = 128,
      device = "cuda"}
    local m_auto = ember.nn.TransformerLM(cfg)
    cfg.attn_impl = "naive"
    local m_naive = ember.nn.TransformerLM(cfg)
    m_naive:load_state_dict(m_auto:state_dict())
    local x = ember.randint(0, 64, {2, 32}, {device = "cuda"})
    local la = ember.autocast("bf16", function() return m_auto(x):float() end)
    local ln = ember.autocast("bf16", function() return m_naive(x):float() end)
    assert.is_true(rel(la, ln) < 1e-2)
    -- the default (impl "auto") records a flash_attention node for these shapes
    local seen
    cfg.attn_impl, cfg.attn_fn = nil, function(q, k, v)
      local o = F.scaled_dot_product_attention(q, k, v, {causal = true})
      seen = o.grad_fn
      return o
    end
    local m_probe = ember.nn.TransformerLM(cfg)
    ember.autocast("bf16", function() return m_probe(x) end)
    assert.are.equal("flash_attention", seen)
  end)

  it("rejects what the kernels cannot do, naming it", function()
    local q = ember.randn(1, 2, 8, 64, {device = "cuda", dtype = "bf16"})
    assert.error_matches(function() F.flash_attention(q:double(), q:double(), q:double(), true) end,
      "expected bf16, f16 or f32 q, k and v on CUDA, got f64", 1, true)
    local q48 = ember.randn(1, 2, 8, 48, {device = "cuda", dtype = "bf16"})
    assert.error_matches(function() F.flash_attention(q48, q48, q48, true) end,
      "no kernel for head dim 48", 1, true)
    local k3 = ember.randn(1, 3, 8, 64, {device = "cuda", dtype = "bf16"})
    assert.error_matches(function() F.flash_attention(q, k3, k3, true) end,
      "expected q (B, H, Tq, D), k and v (B, Hkv, Tk, D) with H a multiple of Hkv, got [1, 2, 8, 64], " ..
      "[1, 3, 8, 64] and [1, 3, 8, 64]", 1, true)
    assert.error_matches(function() F.flash_attention(q, q:half(), q, true) end,
      "expected q, k and v to have the same dtype", 1, true)
    assert.error_matches(function() F.flash_attention(q, q:cpu(), q, true) end, "device", 1, true)
    local q2 = q:select(0, 0):select(0, 0)
    assert.error_matches(function() F.flash_attention(q2, q2, q2, true) end,
      "expected q of shape (B, H, T, D) or (B, T, D), got [8, 64]", 1, true)
    local k4 = ember.randn(1, 2, 4, 64, {device = "cuda", dtype = "bf16"})
    assert.error_matches(function() F.flash_attention(q, k4, k4, "bottom_right") end,
      "expected Tq <= Tk for bottom-right causal alignment", 1, true)
  end)
end)

describe("flash attention on CUDA in f32 (TF32 tensor cores)", function()
  it("matches the f64 reference for every head dim, forward and backward (causal, T not a tile multiple)", function()
    for _, d in ipairs({16, 32, 64, 80, 96, 128, 256}) do
      check({2, 3, 130, d}, {2, 3, 130, d}, "f32", true)
    end
  end)

  it("handles no mask, Tq ≠ Tk, both causal alignments, GQA and 3-D inputs", function()
    check({2, 2, 70, 64}, {2, 2, 150, 64}, "f32", false)
    check({1, 2, 150, 32}, {1, 2, 70, 32}, "f32", true)                  -- top-left, Tq > Tk
    check({1, 2, 100, 64}, {1, 2, 230, 64}, "f32", "bottom_right")
    check({2, 8, 130, 64}, {2, 2, 130, 64}, "f32", true)                 -- GQA 4
    check({1, 6, 77, 128}, {1, 3, 100, 128}, "f32", "bottom_right")      -- GQA 2, Tq < Tk
    check({1, 4, 40, 256}, {1, 2, 40, 256}, "f32", true)
    local fl = check({3, 100, 64}, {3, 100, 64}, "f32", true)
    assert.same({3, 100, 64}, fl[1].shape)
    check({1, 4, 333, 128}, {1, 2, 517, 128}, "f32", "bottom_right")     -- many tiles, 16-row bwd tiles
    check({1, 2, 259, 80}, {1, 2, 259, 80}, "f32", false)                 -- D = 80's rolled copies (20 chunks)
    check({1, 2, 96, 64}, {1, 2, 96, 64}, "f32", true, {scale = 0.3})
    check({2, 4, 77, 64}, {2, 4, 77, 64}, "f32", true, {layout = bthd})
  end)

  it("decodes Tq <= 16 in exact f32 (the split-key kernel has no TF32 step)", function()
    for _, c in ipairs({
      {{1, 8, 1, 128}, {1, 2, 3000, 128}, "bottom_right"},   -- GQA, splits combined
      {{2, 4, 16, 64}, {2, 4, 777, 64}, "bottom_right"},
      {{1, 2, 5, 256}, {1, 2, 1000, 256}, true},
      {{33, 8, 1, 32}, {33, 8, 64, 32}, false},              -- one split
      {{2, 9, 128}, {2, 300, 128}, "bottom_right"},          -- 3-D
    }) do
      local fl, ref = check(c[1], c[2], "f32", c[3])
      local e = rel(fl[1], ref[1])
      assert.is_true(e <= 1e-5, string.format("decode f32 o: relative error %.3g > 1e-5 (f32 arithmetic)", e))
    end
  end)

  it("is deterministic: repeated f32 backward passes give bit-identical gradients (GQA, D = 128)", function()
    local f = function(a, b, c) return F.flash_attention(a, b, c, true) end
    local q, g = randn({1, 4, 333, 128}, "f32"):cuda(), randn({1, 4, 333, 128}, "f32"):cuda()
    local k, v = randn({1, 2, 333, 128}, "f32"):cuda(), randn({1, 2, 333, 128}, "f32"):cuda()
    local r1, r2 = {run(f, q, k, v, g)}, {run(f, q, k, v, g)}
    for i = 1, 5 do C.assert_equal(r2[i], r1[i], "f32 run 2 vs run 1, output " .. i) end
  end)

  it("is what impl = 'auto' runs for f32 while TF32 is allowed, the exact naive composition otherwise", function()
    local q = leaf(randn({1, 2, 50, 64}, "f32"):cuda())
    local prev = ember.backends.tf32(false)
    local ok, err = pcall(function()
      assert.is_false(ember.core.flash_applies(q, q, q))
      local o = F.scaled_dot_product_attention(q, q, q, {causal = true})
      assert.are_not.equal("flash_attention", o.grad_fn)
      ember.backends.tf32(true)
      assert.is_true(ember.core.flash_applies(q, q, q))
      o = F.scaled_dot_product_attention(q, q, q, {causal = true})
      assert.are.equal("flash_attention", o.grad_fn)
      assert.are.equal("f32", o.dtype)
      -- autocast still lowers f32 to the region's dtype first, TF32 or not
      o = ember.autocast("bf16", function() return F.scaled_dot_product_attention(q, q, q, {causal = true}) end)
      assert.are.equal("bf16", o.dtype)
    end)
    ember.backends.tf32(prev)
    if not ok then error(err, 0) end
  end)
end)

describe("the attention support matrix on CUDA", function()
  local support = require "ember.flash_support"
  -- every CUDA cell on tiny inputs: the op runs where its row says a kernel
  -- does (forward at Tq 20 and Tq 3, the decode kernel, and backward) and
  -- raises the row's error where it says "error"; impl = "auto" picks what
  -- the row says for both TF32 settings
  it("agrees with what the op does, cell by cell", function()
    local prev = ember.backends.tf32()
    local ok, err = pcall(function()
      for _, tf32 in ipairs({false, true}) do
        ember.backends.tf32(tf32)
        for _, r in ipairs(support.rows({tf32 = tf32})) do
          if r.device == "cuda" then
            local dt = r.dtype == "f32+autocast" and "f32" or r.dtype
            local H, Hkv = r.gqa and 4 or 2, 2
            local causal = r.causal ~= "none" and r.causal or false
            local function go(tq)
              local q = leaf(randn({1, H, tq, r.d}, dt):cuda())
              local k, v = leaf(randn({1, Hkv, 24, r.d}, dt):cuda()), leaf(randn({1, Hkv, 24, r.d}, dt):cuda())
              local function body()
                local applies = ember.core.flash_applies(q, k, v)
                local o = F.flash_attention(q, k, v, causal)
                o:float():sum():backward()
                return applies
              end
              if r.dtype == "f32+autocast" then return ember.autocast("bf16", body) end
              return body()
            end
            for _, tq in ipairs({20, 3}) do
              local what = string.format("%s %s d %d causal %s gqa %s tq %d tf32 %s", r.device, r.dtype, r.d,
                r.causal, tostring(r.gqa), tq, tostring(tf32))
              if r.error then
                assert.error_matches(function() go(tq) end, r.error, 1, true)
              else
                local applies = go(tq)
                assert.are.equal(r.auto == "flash", applies, what .. ": auto")
              end
            end
          end
        end
      end
    end)
    ember.backends.tf32(prev)
    if not ok then error(err, 0) end
  end)
end)
